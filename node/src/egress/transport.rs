//! `Transport`: how an outbox's envelopes reach their destination. The outbox owns
//! order, retry, backoff, relaying and giving up; a transport only makes one attempt
//! (one envelope, or a batch) and says how it went.
//!
//! - [`HttpPeer`] — a peer's bridge: `POST /bridge/v1/envelopes`, and
//!   `POST /bridge/v1/batch` for a backlog; the answer to a claim says whether the
//!   peer answers its trigger or is still judging it.
//! - [`StreamTransport`] — the Redis stream: one XADD (or one MULTI/EXEC for a batch)
//!   reaches every stream peer; a stored entry counts as delivered.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::egress::outbox::{Pending, SharedSigner};
use crate::egress::stream::{AppendError, StreamLink};
use crate::telemetry::metrics::Metrics;
use crate::wire::batch::{ClaimReply, ItemResult, BATCH_PATH, MAX_BATCH_BYTES};
use crate::wire::limits::ENVELOPES_PATH;
use crate::wire::signing::{HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};

/// How one delivery attempt went.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Accepted (or a duplicate); for a claim, the peer's answer to it.
    Delivered(ClaimReply),
    /// Refused for good (malformed, too large): retrying cannot help.
    Permanent(String),
    /// Not delivered this time (transport error, timeout, 429, 5xx): try again.
    Retry(String),
}

/// How a batch attempt went.
#[derive(Debug)]
pub(crate) enum BatchOutcome {
    /// Fewer than two envelopes fit (size, encoding), or the transport wants this one
    /// alone: send one at a time.
    TooSmall,
    /// The peer does not take batches (404/405, or refused the batch as a whole).
    Unsupported(String),
    /// No per-item answer (transport error, timeout, 5xx): retry.
    Failed(String),
    /// One result per envelope sent, in order (the batch may hold fewer envelopes
    /// than were offered).
    Answered(Vec<Attempt>),
}

/// What a transport needs for one attempt, lent by the outbox's delivery task.
pub(crate) struct SendContext<'a> {
    /// The outbox's name (the peer's bot name, or the stream's).
    pub(crate) peer: &'a str,
    /// The node's peer HTTP client (no proxy, timeouts set).
    pub(crate) http: &'a reqwest::Client,
    /// Signs (and caches signatures) for every outbox.
    pub(crate) signer: &'a SharedSigner,
    /// Counts requests.
    pub(crate) metrics: &'a Metrics,
    /// One attempt's timeout.
    pub(crate) timeout: Duration,
}

/// Where an outbox delivers.
pub(crate) trait Transport: Send + Sync {
    /// The peer's envelope URL, when the destination is a bridge (relaying needs it).
    fn url(&self) -> Option<&str> {
        None
    }

    /// One attempt to deliver `p`, signed `sig` at `ts`.
    fn send_one<'a>(
        &'a self,
        cx: &'a SendContext<'a>,
        p: &'a Pending,
        ts: i64,
        sig: &'a str,
    ) -> BoxFuture<'a, Attempt>;

    /// One attempt to deliver the front of the queue (more than one envelope) at once.
    fn send_batch<'a>(
        &'a self,
        cx: &'a SendContext<'a>,
        batch: &'a [Pending],
    ) -> BoxFuture<'a, BatchOutcome>;
}

/// Unix seconds now, the `webhook-timestamp` of an attempt.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A peer's HTTP bridge.
pub(crate) struct HttpPeer {
    /// Full URL of its envelope endpoint.
    url: String,
    /// Full URL of its batch endpoint.
    batch_url: String,
}

impl HttpPeer {
    /// The bridge at `base_url` (`http://host:port`).
    pub(crate) fn new(base_url: &str) -> HttpPeer {
        let base = base_url.trim_end_matches('/');
        HttpPeer {
            url: format!("{base}{ENVELOPES_PATH}"),
            batch_url: format!("{base}{BATCH_PATH}"),
        }
    }
}

impl Transport for HttpPeer {
    fn url(&self) -> Option<&str> {
        Some(&self.url)
    }

    fn send_one<'a>(
        &'a self,
        cx: &'a SendContext<'a>,
        p: &'a Pending,
        ts: i64,
        sig: &'a str,
    ) -> BoxFuture<'a, Attempt> {
        Box::pin(async move {
            cx.metrics.peer_request(cx.peer, "single");
            let sent = cx
                .http
                .post(&self.url)
                .timeout(cx.timeout)
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
                    let text =
                        || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                    if status.is_success() {
                        // Only a claim's answer can name who answered its trigger.
                        let answer = if p.seq.is_none() {
                            claim_reply(&body)
                        } else {
                            ClaimReply::default()
                        };
                        Attempt::Delivered(answer)
                    } else if status == 400 || status == 413 {
                        Attempt::Permanent(format!("{status}: {}", text()))
                    } else {
                        Attempt::Retry(format!("{status}: {}", text()))
                    }
                }
                Err(e) if e.is_timeout() => Attempt::Retry("timeout".into()),
                Err(e) if e.is_connect() => Attempt::Retry("connect failed".into()),
                Err(e) => Attempt::Retry(format!("transport: {e}")),
            }
        })
    }

    /// Sends the batch: each envelope signed as for a single post, as many as fit
    /// under [`MAX_BATCH_BYTES`].
    fn send_batch<'a>(
        &'a self,
        cx: &'a SendContext<'a>,
        batch: &'a [Pending],
    ) -> BoxFuture<'a, BatchOutcome> {
        Box::pin(async move {
            let ts = unix_now();
            let mut enc = crate::wire::batch::Encoder::new(MAX_BATCH_BYTES);
            for p in batch {
                let sig = cx.signer.sign_for(cx.peer, &p.id, ts, &p.body);
                if !enc.push(&p.id, ts, &sig, &p.body) {
                    break;
                }
            }
            let sent = enc.len();
            if sent < 2 {
                return BatchOutcome::TooSmall;
            }
            cx.metrics.peer_request(cx.peer, "batch");
            let resp = cx
                .http
                .post(&self.batch_url)
                .timeout(cx.timeout)
                .header("content-type", "application/json")
                .body(enc.finish())
                .send()
                .await;
            let resp = match resp {
                Ok(r) => r,
                Err(e) if e.is_timeout() => return BatchOutcome::Failed("timeout".into()),
                Err(e) if e.is_connect() => return BatchOutcome::Failed("connect failed".into()),
                Err(e) => return BatchOutcome::Failed(format!("transport: {e}")),
            };
            let status = resp.status();
            let body = resp.bytes().await.unwrap_or_default();
            let text = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            if status == 404 || status == 405 || status == 400 || status == 413 {
                return BatchOutcome::Unsupported(format!("{status}: {}", text()));
            }
            if !status.is_success() {
                return BatchOutcome::Failed(format!("{status}: {}", text()));
            }
            match serde_json::from_slice::<crate::wire::batch::Response>(&body) {
                Ok(r) if r.results.len() == sent => {
                    BatchOutcome::Answered(r.results.into_iter().map(item_outcome).collect())
                }
                Ok(r) => BatchOutcome::Failed(format!(
                    "batch answer has {} results for {sent} envelopes",
                    r.results.len()
                )),
                Err(e) => BatchOutcome::Failed(format!("unreadable batch answer: {e}")),
            }
        })
    }
}

/// The Redis stream as an outbox's destination.
pub(crate) struct StreamTransport(pub(crate) Arc<StreamLink>);

impl Transport for StreamTransport {
    fn send_one<'a>(
        &'a self,
        _cx: &'a SendContext<'a>,
        p: &'a Pending,
        ts: i64,
        sig: &'a str,
    ) -> BoxFuture<'a, Attempt> {
        Box::pin(async move {
            match self.0.append(&p.id, ts, sig, &p.body).await {
                // The stream has no per-peer answer: a stored entry counts as delivered.
                Ok(()) => Attempt::Delivered(ClaimReply::default()),
                Err(AppendError::Permanent(why)) => Attempt::Permanent(why),
                Err(AppendError::Retry(why)) => Attempt::Retry(why),
            }
        })
    }

    /// One MULTI/EXEC round trip appends the whole batch, in order, all or nothing.
    fn send_batch<'a>(
        &'a self,
        cx: &'a SendContext<'a>,
        batch: &'a [Pending],
    ) -> BoxFuture<'a, BatchOutcome> {
        Box::pin(async move {
            let ts = unix_now();
            let items: Vec<(&str, String, &[u8])> = batch
                .iter()
                .map(|p| {
                    let sig = cx
                        .signer
                        .cache
                        .get_or_sign(&cx.signer.signer, &p.id, ts, &p.body);
                    (p.id.as_str(), sig, &p.body[..])
                })
                .collect();
            cx.metrics.peer_request(cx.peer, "batch");
            match self.0.append_many(ts, &items).await {
                Ok(()) => BatchOutcome::Answered(
                    batch
                        .iter()
                        .map(|_| Attempt::Delivered(ClaimReply::default()))
                        .collect(),
                ),
                // An envelope without a group: the one-at-a-time path gives up on it.
                Err(AppendError::Permanent(_)) => BatchOutcome::TooSmall,
                Err(AppendError::Retry(why)) => BatchOutcome::Failed(why),
            }
        })
    }
}

/// The claim fields of a peer's answer to a single post (`answered`, `judging`).
fn claim_reply(body: &[u8]) -> ClaimReply {
    /// The fields read from `{"accepted": true, "answered": "…", "judging": true}`.
    #[derive(serde::Deserialize)]
    struct Answer {
        answered: Option<String>,
        #[serde(default)]
        judging: bool,
    }
    serde_json::from_slice::<Answer>(body)
        .map(|a| ClaimReply {
            answered: a.answered,
            judging: a.judging,
        })
        .unwrap_or_default()
}

/// The outcome of one batch item, by the status a single post would have got.
fn item_outcome(r: ItemResult) -> Attempt {
    let why = || match &r.detail {
        Some(d) => format!("{} {}: {d}", r.status, r.result),
        None => format!("{} {}", r.status, r.result),
    };
    match r.status {
        200..=299 => Attempt::Delivered(ClaimReply {
            answered: r.answered,
            judging: r.judging,
        }),
        400 | 413 => Attempt::Permanent(why()),
        _ => Attempt::Retry(why()),
    }
}
