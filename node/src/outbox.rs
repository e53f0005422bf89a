//! `Outbox`: one bounded, ordered, retrying queue per peer.
//!
//! Each peer has its own queue and its own delivery task, so a dead peer never delays
//! the others. Envelopes go out one at a time, in order; a failed attempt is retried
//! with exponential backoff and jitter, and signed afresh each time (the signature's
//! timestamp must stay inside the receiver's ±300 s window). Nothing is dropped
//! silently: a refused push (queue full) and a final give-up are logged and counted.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::signing::{Signer, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};

/// The bridge path envelopes are posted to.
pub const ENVELOPES_PATH: &str = "/bridge/v1/envelopes";

/// One envelope waiting for one peer.
#[derive(Debug, Clone)]
struct Pending {
    /// Envelope id (the `webhook-id`).
    id: String,
    /// The serialized envelope, shared by every peer's outbox.
    body: Bytes,
    /// When it was queued, for the give-up deadline.
    queued_at: Instant,
    /// Position in the node's outbox log, for durable messages (claims have none).
    seq: Option<u64>,
}

/// Why a push was refused.
#[derive(Debug, thiserror::Error)]
#[error("outbox for {peer} is full ({capacity} envelopes waiting)")]
pub struct OutboxFull {
    /// The peer.
    pub peer: String,
    /// The configured capacity.
    pub capacity: usize,
}

/// How deliveries are retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// First retry delay.
    pub base: Duration,
    /// Largest retry delay.
    pub max: Duration,
    /// Give up on an envelope this long after it was queued.
    pub give_up_after: Duration,
    /// One attempt's timeout.
    pub attempt_timeout: Duration,
}

impl RetryPolicy {
    /// Delay before retry number `attempt` (1-based): exponential, capped, with jitter
    /// in [d/2, d] so that many senders do not retry in lockstep.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let d = exp.min(self.max);
        let half = d / 2;
        half + rand::thread_rng().gen_range(Duration::ZERO..=half)
    }
}

/// A peer's queue.
pub struct Outbox {
    /// The peer's bot name.
    peer: String,
    /// Where deliveries go.
    link: Link,
    queue: Mutex<VecDeque<Pending>>,
    notify: Notify,
    capacity: usize,
    /// The highest log sequence delivered to (or given up on for) this peer.
    handled: AtomicU64,
    /// Where `handled` is kept across restarts.
    cursor_path: Option<PathBuf>,
    /// When the cursor was last written.
    cursor_saved_at: Mutex<Instant>,
}

/// Where an outbox delivers.
pub enum Link {
    /// A peer's bridge: the full URL of its envelope endpoint.
    Http(String),
    /// The Redis Streams transport: one XADD reaches every Redis peer.
    Stream(Arc<crate::streams::StreamLink>),
}

/// How often, at most, a busy outbox saves its cursor.
const CURSOR_EVERY: Duration = Duration::from_millis(100);

/// The node's signer plus the signatures its outboxes share.
pub struct SharedSigner {
    /// The node's keys.
    pub signer: Signer,
    /// Signatures already computed this second.
    pub cache: SignatureCache,
}

/// Signatures shared by every peer's outbox: the same envelope in the same second
/// has the same signature, so it is computed once, not once per peer.
#[derive(Default)]
pub struct SignatureCache {
    entries: Mutex<std::collections::HashMap<String, (i64, String)>>,
}

impl SignatureCache {
    /// The `webhook-signature` value for `id` at `ts`, signing only on a miss.
    pub fn get_or_sign(&self, signer: &Signer, id: &str, ts: i64, body: &[u8]) -> String {
        if let Some((t, sig)) = self.entries.lock().expect("sig cache lock").get(id) {
            if *t == ts {
                return sig.clone();
            }
        }
        let sig = signer.sign(id, ts, body);
        let mut e = self.entries.lock().expect("sig cache lock");
        if e.len() >= 4096 {
            e.retain(|_, (t, _)| *t >= ts - 1);
        }
        e.insert(id.to_string(), (ts, sig.clone()));
        sig
    }
}

impl Outbox {
    /// An empty outbox for `peer` at `base_url`; `cursor_path` keeps its delivery
    /// position in the outbox log across restarts.
    pub fn new(
        peer: &str,
        base_url: &str,
        capacity: usize,
        cursor_path: Option<PathBuf>,
    ) -> Arc<Outbox> {
        let url = format!("{}{}", base_url.trim_end_matches('/'), ENVELOPES_PATH);
        Outbox::with_link(peer, Link::Http(url), capacity, cursor_path)
    }

    /// An empty outbox named `name` delivering through `link`.
    pub fn with_link(
        name: &str,
        link: Link,
        capacity: usize,
        cursor_path: Option<PathBuf>,
    ) -> Arc<Outbox> {
        Arc::new(Outbox {
            peer: name.to_string(),
            link,
            queue: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            capacity,
            handled: AtomicU64::new(0),
            cursor_path,
            cursor_saved_at: Mutex::new(
                Instant::now()
                    .checked_sub(CURSOR_EVERY)
                    .unwrap_or_else(Instant::now),
            ),
        })
    }

    /// The saved delivery position, if this peer has one.
    pub fn saved_cursor(&self) -> Option<u64> {
        let path = self.cursor_path.as_ref()?;
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// Sets the delivery position (at start, from the saved cursor).
    pub fn set_handled(&self, seq: u64) {
        self.handled.store(seq, Ordering::SeqCst);
    }

    /// The highest log sequence delivered to or given up on for this peer.
    pub fn handled(&self) -> u64 {
        self.handled.load(Ordering::SeqCst)
    }

    fn mark_handled(&self, seq: u64) {
        self.handled.fetch_max(seq, Ordering::SeqCst);
        // Saving the cursor costs a file write; do it at most every CURSOR_EVERY, or
        // when the queue runs dry. A cursor that lags only means re-sends after a
        // crash, which peers answer with `duplicate`.
        let due = {
            let mut last = self.cursor_saved_at.lock().expect("cursor lock");
            let due = self.is_empty() || last.elapsed() >= CURSOR_EVERY;
            if due {
                *last = Instant::now();
            }
            due
        };
        if due {
            self.save_cursor();
        }
    }

    /// Writes the delivery position to disk now (also called at shutdown).
    pub fn save_cursor(&self) {
        if let Some(path) = &self.cursor_path {
            if let Err(e) = write_cursor(path, self.handled()) {
                tracing::warn!(peer = %self.peer, error = %e, "could not save the outbox cursor (a restart may re-send; peers deduplicate)");
            }
        }
    }

    /// The peer's name.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Envelopes waiting.
    pub fn len(&self) -> usize {
        self.queue.lock().expect("outbox lock").len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues an envelope; refuses (never silently drops) when full. `seq` is its
    /// position in the outbox log for durable messages.
    pub fn push(
        &self,
        id: &str,
        body: Bytes,
        seq: Option<u64>,
        metrics: &Metrics,
    ) -> Result<(), OutboxFull> {
        let depth = {
            let mut q = self.queue.lock().expect("outbox lock");
            if q.len() >= self.capacity {
                metrics.envelope_out(&self.peer, "refused_full");
                tracing::error!(peer = %self.peer, id, capacity = self.capacity, "outbox full: envelope NOT queued for this peer");
                let nothing_durable_waits = q.iter().all(|p| p.seq.is_none());
                drop(q);
                if let Some(seq) = seq.filter(|_| nothing_durable_waits) {
                    self.mark_handled(seq);
                }
                return Err(OutboxFull {
                    peer: self.peer.clone(),
                    capacity: self.capacity,
                });
            }
            q.push_back(Pending {
                id: id.to_string(),
                body,
                queued_at: Instant::now(),
                seq,
            });
            q.len()
        };
        metrics.set_outbox_depth(&self.peer, depth);
        self.notify.notify_one();
        Ok(())
    }

    fn front(&self) -> Option<Pending> {
        self.queue.lock().expect("outbox lock").front().cloned()
    }

    fn pop(&self, id: &str, metrics: &Metrics) {
        let (depth, seq) = {
            let mut q = self.queue.lock().expect("outbox lock");
            let seq = if q.front().is_some_and(|p| p.id == id) {
                q.pop_front().and_then(|p| p.seq)
            } else {
                None
            };
            (q.len(), seq)
        };
        if let Some(seq) = seq {
            self.mark_handled(seq);
        }
        metrics.set_outbox_depth(&self.peer, depth);
    }

    /// Delivers until `stop` fires: one envelope at a time, in order.
    pub async fn run(
        self: Arc<Self>,
        http: reqwest::Client,
        signer: Arc<SharedSigner>,
        metrics: Arc<Metrics>,
        policy: RetryPolicy,
        stop: CancellationToken,
    ) {
        loop {
            let Some(next) = self.front() else {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = self.notify.notified() => continue,
                }
            };
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                let outcome = self
                    .attempt(&http, &signer, &next, policy.attempt_timeout)
                    .await;
                match outcome {
                    Attempt::Delivered => {
                        metrics.envelope_out(&self.peer, "delivered");
                        tracing::debug!(peer = %self.peer, id = %next.id, attempt, "delivered");
                        break;
                    }
                    Attempt::Permanent(why) => {
                        metrics.envelope_out(&self.peer, "given_up");
                        tracing::error!(peer = %self.peer, id = %next.id, attempt, reason = %why, "peer refused envelope permanently; giving up on it");
                        break;
                    }
                    Attempt::Retry(why) => {
                        if next.queued_at.elapsed() >= policy.give_up_after {
                            metrics.envelope_out(&self.peer, "given_up");
                            tracing::error!(peer = %self.peer, id = %next.id, attempt, reason = %why, waited_s = next.queued_at.elapsed().as_secs(), "delivery deadline passed; giving up on envelope");
                            break;
                        }
                        metrics.envelope_out(&self.peer, "retry");
                        let wait = policy.backoff(attempt);
                        tracing::warn!(peer = %self.peer, id = %next.id, attempt, reason = %why, retry_in_ms = wait.as_millis() as u64, "delivery failed; will retry");
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                }
            }
            self.pop(&next.id, &metrics);
        }
    }

    async fn attempt(
        &self,
        http: &reqwest::Client,
        signer: &SharedSigner,
        p: &Pending,
        timeout: Duration,
    ) -> Attempt {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let sig = signer.cache.get_or_sign(&signer.signer, &p.id, ts, &p.body);
        let url = match &self.link {
            Link::Http(url) => url,
            Link::Stream(link) => {
                return match link.append(&p.id, ts, &sig, &p.body).await {
                    Ok(()) => Attempt::Delivered,
                    Err(crate::streams::AppendError::Permanent(why)) => Attempt::Permanent(why),
                    Err(crate::streams::AppendError::Retry(why)) => Attempt::Retry(why),
                };
            }
        };
        let sent = http
            .post(url)
            .timeout(timeout)
            .header(HEADER_ID, &p.id)
            .header(HEADER_TIMESTAMP, ts.to_string())
            .header(HEADER_SIGNATURE, sig)
            .header("content-type", "application/json")
            .body(p.body.clone())
            .send()
            .await;
        match sent {
            Ok(resp) => {
                let status = resp.status();
                // Read the body to the end so the connection can be reused.
                let body = resp.bytes().await.unwrap_or_default();
                if status.is_success() {
                    Attempt::Delivered
                } else if status == 400 || status == 413 {
                    Attempt::Permanent(format!(
                        "{status}: {}",
                        String::from_utf8_lossy(&body[..body.len().min(200)])
                    ))
                } else {
                    Attempt::Retry(format!(
                        "{status}: {}",
                        String::from_utf8_lossy(&body[..body.len().min(200)])
                    ))
                }
            }
            Err(e) if e.is_timeout() => Attempt::Retry("timeout".into()),
            Err(e) if e.is_connect() => Attempt::Retry("connect failed".into()),
            Err(e) => Attempt::Retry(format!("transport: {e}")),
        }
    }
}

fn write_cursor(path: &Path, seq: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, seq.to_string())?;
    std::fs::rename(tmp, path)
}

enum Attempt {
    Delivered,
    Permanent(String),
    Retry(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
            give_up_after: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let d1 = p.backoff(1);
            assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
            let d3 = p.backoff(3);
            assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400));
            let d30 = p.backoff(30);
            assert!(d30 >= Duration::from_secs(1) && d30 <= Duration::from_secs(2));
        }
    }

    #[test]
    fn one_signature_per_envelope_and_second_is_shared() {
        let signer = Signer {
            hmac: vec![crate::signing::HmacSecret::generate()],
            ed25519: vec![],
        };
        let cache = SignatureCache::default();
        let a = cache.get_or_sign(&signer, "01J", 100, b"{}");
        assert_eq!(a, signer.sign("01J", 100, b"{}"));
        assert_eq!(cache.get_or_sign(&signer, "01J", 100, b"{}"), a);
        let later = cache.get_or_sign(&signer, "01J", 101, b"{}");
        assert_ne!(later, a, "a new second gets a fresh signature");
        assert_eq!(later, signer.sign("01J", 101, b"{}"));
    }

    #[test]
    fn refuses_when_full_and_counts_it() {
        let m = Metrics::new();
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::new(
            "B",
            "http://127.0.0.1:1",
            2,
            Some(dir.path().join("B.cursor")),
        );
        o.push("1", Bytes::from_static(b"{}"), Some(1), &m).unwrap();
        o.push("2", Bytes::from_static(b"{}"), None, &m).unwrap();
        assert!(o.push("3", Bytes::from_static(b"{}"), Some(3), &m).is_err());
        assert_eq!(o.len(), 2);
        assert!(m
            .render()
            .contains(r#"botmesh_envelopes_out_total{peer="B",result="refused_full"} 1"#));
        assert_eq!(
            o.handled(),
            0,
            "seq 1 still waits, so refusing 3 cannot advance the cursor"
        );
        o.pop("1", &m);
        assert_eq!(o.front().unwrap().id, "2");
        assert_eq!((o.handled(), o.saved_cursor()), (1, Some(1)));
    }
}
