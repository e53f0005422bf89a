//! Relaying around a broken link, with a hop limit.
//!
//! When a node's direct deliveries to peer B have failed for `relay_after_ms`, its
//! outbox also hands each envelope for B to another peer C whose link is healthy:
//! the same body and the same `webhook-*` signature headers, signed by the original
//! sender A, plus `botmesh-relay-to: B` and `botmesh-hops: 1`. Nothing is re-signed:
//!
//! - C runs the full gauntlet on the copy ([`crate::ingress::bridge::admit_many`]): it must verify as
//!   A's (the signature covers `id.timestamp.body`, so C cannot alter it, and C cannot
//!   sign as A), and C records it if new. Only then does C forward the untouched
//!   headers and body to B, and only while `hops <= max_relay_hops`; otherwise it
//!   refuses with a reason. C never relays onward itself, so a copy takes one hop.
//! - B verifies A's signature exactly as for a direct delivery and dedups by id. Because
//!   the copy came through a third party, B answers with a *receipt* signed with its own
//!   key (`webhook-id: receipt-<envelope id>`); C passes it back unchanged.
//! - A counts the envelope delivered only on a receipt that verifies as B's, for that
//!   envelope id. A relay that drops the copy or lies about delivery gains nothing: A
//!   keeps retrying, directly and through relays. So order holds (the outbox still
//!   relays one envelope at a time, and batches only while the direct link is
//!   healthy) and, when the link heals, nothing is doubled.
//!
//! While the link is down the outbox probes it directly on its backoff schedule and
//! sends everything else through a relay, so a black-holed link costs one timeout per
//! probe, not one per envelope. A relayed copy older than the ±300 s window is
//! refused by B like any stale request; the direct path keeps retrying.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use tokio::time::Instant;

use crate::telemetry::metrics::Metrics;
use crate::wire::limits::ENVELOPES_PATH;
use crate::wire::limits::{HEADER_HOPS, HEADER_RELAY_TO};
use crate::wire::signing::{Verifier, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};

/// Health of the direct link to one peer, shared by its outbox and the relay.
#[derive(Debug, Default)]
pub struct LinkHealth {
    /// When the current run of failed direct attempts began; None while healthy.
    failing_since: Mutex<Option<Instant>>,
}

impl LinkHealth {
    /// Records a failed direct attempt; true when the link was healthy until now.
    pub fn failed(&self) -> bool {
        let mut f = self.failing_since.lock();
        let fresh = f.is_none();
        f.get_or_insert_with(Instant::now);
        fresh
    }

    /// Records a direct attempt the peer answered; returns how long it had been failing.
    pub fn ok(&self) -> Option<Duration> {
        self.failing_since.lock().take().map(|t| t.elapsed())
    }

    /// How long direct attempts have been failing, if they are.
    pub fn failing_for(&self) -> Option<Duration> {
        self.failing_since.lock().map(|t| t.elapsed())
    }
}

/// One peer as a relay candidate.
struct RelayPeer {
    /// Its bot name.
    name: String,
    /// Full URL of its envelope endpoint.
    url: String,
    /// This node's direct link to it (only healthy links are used as relays).
    link: Arc<LinkHealth>,
}

/// The sending side of relaying: used by the outboxes of a node.
pub struct Relay {
    /// Direct failures for this long switch an outbox to relaying; zero disables it.
    after: Duration,
    /// Every peer, as a possible relay.
    peers: Vec<RelayPeer>,
    /// The node's peer HTTP client.
    http: reqwest::Client,
    /// Checks the destination's receipts.
    verifier: Verifier,
    /// Counts relay outcomes.
    metrics: Arc<Metrics>,
    /// One relayed attempt's timeout: the relay waits on the destination in between.
    timeout: Duration,
    /// Rotates which relay is tried first, to spread the load.
    next: AtomicUsize,
}

impl Relay {
    /// The envelope URL of peer `to` and the health of this node's direct link to it,
    /// for forwarding a copy this node relays (None: not a peer reached over HTTP).
    pub fn direct(&self, to: &str) -> Option<(&str, &Arc<LinkHealth>)> {
        self.peers
            .iter()
            .find(|p| p.name == to)
            .map(|p| (p.url.as_str(), &p.link))
    }

    /// The node's peer HTTP client, shared with the forwarding of relayed copies.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A relay over `peers` (name, base URL, direct-link health).
    pub fn new(
        after: Duration,
        peers: Vec<(String, String, Arc<LinkHealth>)>,
        http: reqwest::Client,
        verifier: Verifier,
        metrics: Arc<Metrics>,
        peer_timeout: Duration,
    ) -> Relay {
        Relay {
            after,
            peers: peers
                .into_iter()
                .map(|(name, base, link)| RelayPeer {
                    name,
                    url: format!("{}{}", base.trim_end_matches('/'), ENVELOPES_PATH),
                    link,
                })
                .collect(),
            http,
            verifier,
            metrics,
            timeout: peer_timeout.saturating_mul(2),
            next: AtomicUsize::new(0),
        }
    }

    /// Whether envelopes over `link` should go through a relay now.
    pub fn due(&self, link: &LinkHealth) -> bool {
        !self.after.is_zero() && link.failing_for().is_some_and(|d| d >= self.after)
    }

    /// Hands one envelope for `to`, with its original signature, to each healthy peer in
    /// turn until one returns `to`'s signed receipt. True when `to` has it.
    pub async fn deliver(
        &self,
        to: &str,
        id: &str,
        ts: i64,
        signature: &str,
        body: &Bytes,
    ) -> bool {
        let candidates: Vec<&RelayPeer> = self
            .peers
            .iter()
            .filter(|p| p.name != to && p.link.failing_for().is_none())
            .collect();
        if candidates.is_empty() {
            tracing::debug!(to, id, "no peer with a healthy link to relay through");
            return false;
        }
        let first = self.next.fetch_add(1, Ordering::Relaxed) % candidates.len();
        for k in 0..candidates.len() {
            let via = candidates[(first + k) % candidates.len()];
            match self.via(via, to, id, ts, signature, body).await {
                Ok(result) => {
                    self.metrics.relayed("origin", to, "delivered");
                    tracing::debug!(to, via = %via.name, id, result, "delivered through a relay (receipt verified)");
                    return true;
                }
                Err(why) => {
                    self.metrics.relayed("origin", to, "failed");
                    tracing::warn!(to, via = %via.name, id, reason = %why, "relay attempt failed");
                }
            }
        }
        false
    }

    async fn via(
        &self,
        via: &RelayPeer,
        to: &str,
        id: &str,
        ts: i64,
        signature: &str,
        body: &Bytes,
    ) -> Result<&'static str, String> {
        let resp = self
            .http
            .post(&via.url)
            .timeout(self.timeout)
            .header(HEADER_ID, id)
            .header(HEADER_TIMESTAMP, ts.to_string())
            .header(HEADER_SIGNATURE, signature)
            .header(HEADER_RELAY_TO, to)
            .header(HEADER_HOPS, "1")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .map_err(|e| format!("transport: {e}"))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(|e| format!("transport: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "{status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            ));
        }
        verify_receipt(
            &self.verifier,
            to,
            id,
            &headers,
            &bytes,
            crate::wire::signing::unix_now(),
        )
    }
}

/// The `webhook-id` of the receipt for envelope `id`.
pub(crate) fn receipt_id(id: &str) -> String {
    format!("receipt-{id}")
}

/// Checks that `body` is `from`'s signed receipt for envelope `id`; returns its result
/// (`accepted` or `duplicate`).
pub(crate) fn verify_receipt(
    verifier: &Verifier,
    from: &str,
    id: &str,
    headers: &HeaderMap,
    body: &[u8],
    now: i64,
) -> Result<&'static str, String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header(HEADER_ID) != Some(receipt_id(id).as_str()) {
        return Err("answer carries no receipt for this envelope".into());
    }
    verifier
        .verify(
            from,
            header(HEADER_ID),
            header(HEADER_TIMESTAMP),
            header(HEADER_SIGNATURE),
            body,
            now,
        )
        .map_err(|e| format!("receipt does not verify as {from}'s: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("receipt is not JSON: {e}"))?;
    let r = &v["receipt"];
    if r["for"] != id || r["by"] != from {
        return Err("receipt names another envelope or bot".into());
    }
    match r["result"].as_str() {
        Some("accepted") => Ok("accepted"),
        Some("duplicate") => Ok("duplicate"),
        other => Err(format!("receipt result {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::signing::{Signer, SigningKey};

    #[tokio::test(start_paused = true)]
    async fn link_health_tracks_a_failing_run() {
        let l = LinkHealth::default();
        assert!(l.failing_for().is_none());
        assert!(l.failed());
        assert!(!l.failed(), "still the same run of failures");
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(l.failing_for(), Some(Duration::from_secs(4)));
        assert_eq!(l.ok(), Some(Duration::from_secs(4)));
        assert!(l.failing_for().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn relaying_starts_after_relay_after_and_zero_disables_it() {
        let relay = |after_ms| {
            Relay::new(
                Duration::from_millis(after_ms),
                Vec::new(),
                reqwest::Client::new(),
                Verifier::default(),
                Arc::new(Metrics::new()),
                Duration::from_secs(1),
            )
        };
        let (on, off) = (relay(3_000), relay(0));
        let l = LinkHealth::default();
        assert!(!on.due(&l), "a healthy link is used directly");
        l.failed();
        tokio::time::advance(Duration::from_millis(2_999)).await;
        assert!(!on.due(&l));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(on.due(&l));
        assert!(!off.due(&l), "relay_after_ms = 0 never relays");
        l.ok();
        assert!(!on.due(&l));
    }

    #[test]
    fn receipts_verify_only_as_the_destinations_for_that_envelope() {
        let b = SigningKey::generate();
        let c = SigningKey::generate();
        let mut verifier = Verifier::default();
        verifier.ed25519.insert("B".into(), vec![b.public_key()]);
        verifier.ed25519.insert("C".into(), vec![c.public_key()]);
        let sign = |key: &SigningKey, id: &str, by: &str| {
            let body = serde_json::to_vec(&serde_json::json!({
                "accepted": true,
                "receipt": {"for": id, "by": by, "result": "accepted"},
            }))
            .unwrap();
            let signer = Signer {
                pairwise: Default::default(),
                hmac: vec![],
                ed25519: vec![key.clone()],
            };
            let ts = 1_000;
            let mut h = HeaderMap::new();
            h.insert(HEADER_ID, receipt_id(id).parse().unwrap());
            h.insert(HEADER_TIMESTAMP, ts.to_string().parse().unwrap());
            h.insert(
                HEADER_SIGNATURE,
                signer.sign(&receipt_id(id), ts, &body).parse().unwrap(),
            );
            (h, body)
        };
        let (h, body) = sign(&b, "01A", "B");
        assert_eq!(
            verify_receipt(&verifier, "B", "01A", &h, &body, 1_000),
            Ok("accepted")
        );
        assert!(verify_receipt(&verifier, "B", "01B", &h, &body, 1_000).is_err());
        // The relay C cannot make up B's receipt.
        let (h, body) = sign(&c, "01A", "B");
        assert!(verify_receipt(&verifier, "B", "01A", &h, &body, 1_000).is_err());
        // Nor alter a real one.
        let (h, mut body) = sign(&b, "01A", "B");
        body[2] ^= 1;
        assert!(verify_receipt(&verifier, "B", "01A", &h, &body, 1_000).is_err());
    }
}
