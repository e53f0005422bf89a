//! `Outbox`: one bounded, ordered, retrying queue per peer.
//!
//! Each peer has its own queue and its own delivery task, so a dead peer never delays
//! the others. Envelopes go out in order: when more than one waits, up to `batch_max`
//! in one `POST /bridge/v1/batch` (each signed on its own, see [`crate::wire::batch`]),
//! otherwise one at a time. A failed attempt is retried one envelope at a time with
//! exponential backoff and jitter, and signed afresh each time (the signature's
//! timestamp must stay inside the receiver's ±300 s window). Nothing is dropped
//! silently: a final give-up is logged and counted.
//!
//! Memory stays bounded: at most `capacity` envelopes wait in memory per peer. Durable
//! envelopes beyond that are already in the node's outbox log (written in the same
//! durable write as the transcript), so the outbox *spills*: it remembers only where in
//! the log its backlog starts and re-reads it, in sequence order, as the queue drains.
//! Nothing durable is refused or lost however long a peer is away; only ephemeral
//! claims are refused when the queue is full or spilling (they would be stale anyway).
//!
//! Claims a bot waits on are tracked ([`crate::egress::acks`]): for every ephemeral envelope
//! the outbox reports its final outcome for this peer (delivered, with the `answered`
//! value of the peer's answer, or given up) to the node's [`AckTracker`].

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::pacing::{Backoff, Jitter};
use crate::egress::acks::{AckTracker, PeerOutcome};
use crate::egress::transport::{Attempt, BatchOutcome, HttpPeer, SendContext, Transport};
use crate::store::cursor::DeliveryCursor;
use crate::store::outbox_log::{parse_outbox_line, LoggedOutbound};
use crate::telemetry::metrics::Metrics;
use crate::wire::batch::ClaimReply;
use crate::wire::signing::Signer;

/// One envelope waiting for one peer.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// Envelope id (the `webhook-id`).
    pub(crate) id: String,
    /// The serialized envelope, shared by every peer's outbox.
    pub(crate) body: Bytes,
    /// When it was queued, for the give-up deadline.
    queued_at: Instant,
    /// Position in the node's outbox log, for durable messages (claims have none).
    pub(crate) seq: Option<u64>,
}

/// Why a push of an ephemeral envelope (a claim) was refused.
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
        Backoff::new(self.base, self.max).delay(attempt, Jitter::Scale(0.5..=1.0))
    }
}

/// The part of a peer's backlog that lives only in the outbox log: every durable
/// envelope from `next_seq` through `last_seq`, the first one at byte `next_offset`.
#[derive(Debug, Clone, Copy)]
struct Spill {
    /// The first sequence not in memory.
    next_seq: u64,
    /// Where that sequence's line starts in the outbox log.
    next_offset: u64,
    /// The newest sequence handed to this outbox (it is on disk).
    last_seq: u64,
}

impl Spill {
    fn len(&self) -> usize {
        (self.last_seq + 1).saturating_sub(self.next_seq) as usize
    }
}

/// What waits for one peer: in memory, plus (when spilling) a range of the outbox log.
#[derive(Default)]
struct Queue {
    /// Envelopes in memory, in send order; never more than the capacity.
    items: VecDeque<Pending>,
    /// The backlog kept only on disk, when the memory queue filled up.
    spill: Option<Spill>,
}

/// A peer's queue.
pub struct Outbox {
    /// The peer's bot name.
    peer: String,
    /// Where deliveries go: the peer's HTTP bridge or the Redis stream.
    dest: Arc<dyn Transport>,
    /// The memory queue and the spilled range.
    queue: Mutex<Queue>,
    /// Wakes the delivery task when something is queued.
    notify: Notify,
    /// The most envelopes held in memory for this peer.
    capacity: usize,
    /// The most envelopes ever held in memory at once (to prove the bound).
    peak: AtomicUsize,
    /// The node's outbox log, which spilled envelopes are re-read from.
    log_path: OnceLock<PathBuf>,
    /// Health of the direct link to the peer (shared with the relay).
    link: Arc<crate::egress::relay::LinkHealth>,
    /// Relays envelopes through other peers while the direct link is down.
    relay: OnceLock<Arc<crate::egress::relay::Relay>>,
    /// The highest log sequence delivered to (or given up on for) this peer, and its
    /// copy on disk for restarts.
    cursor: Arc<DeliveryCursor>,
    /// Envelopes per batch at most; 1 = one envelope per request.
    batch_max: AtomicUsize,
    /// Where the final outcome of each ephemeral envelope (a claim) is reported, so
    /// a bot can wait until its claim has reached every peer.
    acks: OnceLock<Arc<AckTracker>>,
    /// Whether this peer's refusal of a status envelope was logged: a peer older than
    /// statuses refuses every one (400), which is said once, not once per status.
    status_refusal_logged: std::sync::atomic::AtomicBool,
}

/// Envelopes per batch unless configured (`mesh.batch_max`).
pub(crate) const DEFAULT_BATCH_MAX: usize = 64;

/// After a peer answered 404 to a batch (it predates batches), single posts are used
/// for this long before batching is tried again (the peer may have been upgraded).
const BATCH_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The node's signer plus the signatures its outboxes share.
pub struct SharedSigner {
    /// The node's keys.
    pub signer: Signer,
    /// Signatures already computed this second.
    pub cache: SignatureCache,
}

impl SharedSigner {
    /// The `webhook-signature` value of an envelope for `peer`: the entries every
    /// peer gets (computed once, cached) plus the pairwise entry for `peer` (an HMAC,
    /// about a microsecond), which lets `peer` skip the Ed25519 verification.
    pub fn sign_for(&self, peer: &str, id: &str, ts: i64, body: &[u8]) -> String {
        let shared = self.cache.get_or_sign(&self.signer, id, ts, body);
        self.signer.add_pairwise(peer, shared, id, ts, body)
    }
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
        if let Some((t, sig)) = self.entries.lock().get(id) {
            if *t == ts {
                return sig.clone();
            }
        }
        let sig = signer.sign(id, ts, body);
        let mut e = self.entries.lock();
        if e.len() >= SIGNATURE_CACHE_ENTRIES {
            e.retain(|_, (t, _)| *t >= ts - 1);
            if e.len() >= SIGNATURE_CACHE_ENTRIES / 2 {
                // Still full of this second's signatures (a burst): start over rather
                // than walk the whole table again on every signature that follows.
                e.clear();
            }
        }
        e.insert(id.to_string(), (ts, sig.clone()));
        sig
    }

    /// Signatures kept (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

/// At most this many signatures are kept: a miss costs one more signature, never memory.
const SIGNATURE_CACHE_ENTRIES: usize = 4096;

impl Outbox {
    /// An empty outbox for `peer` at `base_url`; `cursor_path` keeps its delivery
    /// position in the outbox log across restarts.
    pub fn new(
        peer: &str,
        base_url: &str,
        capacity: usize,
        cursor_path: Option<PathBuf>,
    ) -> Arc<Outbox> {
        Outbox::with_transport(
            peer,
            Arc::new(HttpPeer::new(base_url)),
            capacity,
            cursor_path,
        )
    }

    /// An empty outbox named `name` delivering through `dest`.
    pub(crate) fn with_transport(
        name: &str,
        dest: Arc<dyn Transport>,
        capacity: usize,
        cursor_path: Option<PathBuf>,
    ) -> Arc<Outbox> {
        Arc::new(Outbox {
            acks: OnceLock::new(),
            batch_max: AtomicUsize::new(DEFAULT_BATCH_MAX),
            status_refusal_logged: Default::default(),
            peer: name.to_string(),
            dest,
            queue: Mutex::new(Queue::default()),
            notify: Notify::new(),
            capacity,
            peak: AtomicUsize::new(0),
            log_path: OnceLock::new(),
            link: Arc::default(),
            relay: OnceLock::new(),
            cursor: DeliveryCursor::new(name, cursor_path),
        })
    }

    /// The saved delivery position, if this peer has one.
    pub fn saved_cursor(&self) -> Option<u64> {
        self.cursor.read_saved()
    }

    /// Sets the delivery position at start: the saved cursor (`saved`), or where a
    /// peer new to this node starts (its cursor is then written soon).
    pub fn set_handled(&self, seq: u64, saved: bool) {
        self.cursor.set(seq, saved);
    }

    /// The highest log sequence delivered to or given up on for this peer.
    pub fn handled(&self) -> u64 {
        self.cursor.handled()
    }

    /// Writes the delivery position to disk now (at shutdown, after any write under way).
    pub fn save_cursor(&self) {
        self.cursor.save_now();
    }

    /// Sends at most `max` envelopes per request (1: one at a time).
    pub fn set_batch_max(&self, max: usize) {
        self.batch_max.store(
            max.clamp(1, crate::wire::batch::MAX_ITEMS),
            Ordering::Relaxed,
        );
    }

    /// The peer's name.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Names the outbox log that durable envelopes beyond the capacity are re-read
    /// from. Without it, an outbox cannot spill and refuses like a claim when full.
    pub fn set_log_path(&self, path: PathBuf) {
        let _ = self.log_path.set(path);
    }

    /// Lets this outbox relay through other peers while its direct link is down.
    pub fn set_relay(&self, relay: Arc<crate::egress::relay::Relay>) {
        let _ = self.relay.set(relay);
    }

    /// Reports the final outcome of every ephemeral envelope (claim) to `acks`.
    pub fn set_acks(&self, acks: Arc<AckTracker>) {
        let _ = self.acks.set(acks);
    }

    /// Tells the ack tracker how claim `p` fared with this peer (durable messages are
    /// never tracked, so they skip the lookup).
    fn report(&self, p: &Pending, outcome: PeerOutcome) {
        if p.seq.is_none() {
            if let Some(acks) = self.acks.get() {
                acks.report(&p.id, &self.peer, outcome);
            }
        }
    }

    /// Health of the direct link to the peer.
    pub fn link(&self) -> &Arc<crate::egress::relay::LinkHealth> {
        &self.link
    }

    /// Full URL of the peer's envelope endpoint (None for the Redis stream).
    pub fn url(&self) -> Option<&str> {
        self.dest.url()
    }

    /// Envelopes waiting in memory (never more than the capacity).
    pub fn len(&self) -> usize {
        self.queue.lock().items.len()
    }

    /// Durable envelopes waiting only in the outbox log (spilled).
    pub fn spilled(&self) -> usize {
        self.queue.lock().spill.map_or(0, |s| s.len())
    }

    /// The most envelopes this outbox ever held in memory at once.
    pub fn peak_len(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// True when nothing waits, in memory or spilled.
    pub fn is_empty(&self) -> bool {
        let q = self.queue.lock();
        q.items.is_empty() && q.spill.is_none()
    }

    fn publish_depth(&self, q: &Queue, metrics: &Metrics) {
        self.peak.fetch_max(q.items.len(), Ordering::SeqCst);
        metrics.set_outbox_depth(&self.peer, q.items.len());
        metrics.set_outbox_spilled(&self.peer, q.spill.map_or(0, |s| s.len()));
    }

    /// Queues an ephemeral envelope (`seq` None, a claim) or, without an outbox log,
    /// any envelope; refuses (never silently drops) when the queue is full or when
    /// durable envelopes are spilled (the peer is far behind: a claim would arrive
    /// stale and out of order).
    pub fn push(
        &self,
        id: &str,
        body: Bytes,
        seq: Option<u64>,
        metrics: &Metrics,
    ) -> Result<(), OutboxFull> {
        {
            let mut q = self.queue.lock();
            if q.items.len() >= self.capacity || q.spill.is_some() {
                metrics.envelope_out(&self.peer, "refused_full");
                let spilled = q.spill.map_or(0, |s| s.len());
                drop(q);
                tracing::warn!(peer = %self.peer, id, capacity = self.capacity, spilled, durable = seq.is_some(), "outbox full: envelope NOT queued for this peer");
                return Err(OutboxFull {
                    peer: self.peer.clone(),
                    capacity: self.capacity,
                });
            }
            q.items.push_back(Pending {
                id: id.to_string(),
                body,
                queued_at: Instant::now(),
                seq,
            });
            self.publish_depth(&q, metrics);
        }
        self.notify.notify_one();
        Ok(())
    }

    /// Queues a durable envelope that is already in the outbox log. Never refused:
    /// beyond the capacity it stays only on disk and is re-read in order later.
    pub fn push_logged(&self, e: &LoggedOutbound, metrics: &Metrics) {
        if self.log_path.get().is_none() {
            let _ = self.push(&e.id, e.body.clone(), Some(e.seq), metrics);
            return;
        }
        {
            let mut q = self.queue.lock();
            if let Some(s) = q.spill.as_mut() {
                s.last_seq = e.seq;
            } else if q.items.len() >= self.capacity {
                q.spill = Some(Spill {
                    next_seq: e.seq,
                    next_offset: e.offset,
                    last_seq: e.seq,
                });
                tracing::warn!(peer = %self.peer, capacity = self.capacity, from_seq = e.seq, "outbox memory queue full: further envelopes for this peer wait in the outbox log on disk (memory stays bounded)");
            } else {
                q.items.push_back(Pending {
                    id: e.id.clone(),
                    body: e.body.clone(),
                    queued_at: Instant::now(),
                    seq: Some(e.seq),
                });
            }
            self.publish_depth(&q, metrics);
        }
        self.notify.notify_one();
    }

    /// Moves spilled envelopes back into memory once the queue has drained to half
    /// its capacity. Returns false when reading the log failed (retry later).
    async fn refill(&self, metrics: &Metrics) -> bool {
        let (spill, room) = {
            let q = self.queue.lock();
            match q.spill {
                Some(s) if q.items.len() <= self.capacity / 2 => (s, self.capacity - q.items.len()),
                _ => return true,
            }
        };
        let Some(path) = self.log_path.get().cloned() else {
            return true;
        };
        let read = tokio::task::spawn_blocking(move || read_log_range(&path, spill, room)).await;
        let (entries, next_offset) = match read {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::error!(peer = %self.peer, error = %e, from_seq = spill.next_seq, "could not re-read spilled envelopes from the outbox log; will retry");
                return false;
            }
            Err(e) => {
                tracing::error!(peer = %self.peer, error = %e, "outbox log reader failed; will retry");
                return false;
            }
        };
        let Some(last) = entries.last().map(|e| e.seq) else {
            tracing::error!(peer = %self.peer, from_seq = spill.next_seq, last_seq = spill.last_seq, "spilled envelopes not found in the outbox log; will retry");
            return false;
        };
        let mut q = self.queue.lock();
        let now = Instant::now();
        for e in entries {
            q.items.push_back(Pending {
                id: e.id,
                body: e.body,
                queued_at: now,
                seq: Some(e.seq),
            });
        }
        let s = q.spill.as_mut().expect("only this task ends a spill");
        s.next_seq = last + 1;
        s.next_offset = next_offset;
        if s.next_seq > s.last_seq {
            q.spill = None;
            tracing::info!(peer = %self.peer, through_seq = last, "spilled backlog back in memory; outbox no longer spilling");
        } else {
            tracing::debug!(peer = %self.peer, through_seq = last, still_spilled = s.len(), "re-read spilled envelopes from the outbox log");
        }
        self.publish_depth(&q, metrics);
        true
    }

    fn front(&self) -> Option<Pending> {
        self.queue.lock().items.front().cloned()
    }

    /// Up to `max` envelopes from the front of the memory queue, in order.
    fn front_batch(&self, max: usize) -> Vec<Pending> {
        self.queue.lock().items.iter().take(max).cloned().collect()
    }

    fn pop(&self, id: &str, metrics: &Metrics) {
        let seq = {
            let mut q = self.queue.lock();
            let seq = if q.items.front().is_some_and(|p| p.id == id) {
                q.items.pop_front().and_then(|p| p.seq)
            } else {
                None
            };
            self.publish_depth(&q, metrics);
            seq
        };
        if let Some(seq) = seq {
            self.cursor.advance(seq);
        }
    }

    /// Delivers until `stop` fires, in order: a batch when more than one envelope
    /// waits and the direct link is healthy, otherwise one envelope at a time.
    pub async fn run(
        self: Arc<Self>,
        http: reqwest::Client,
        signer: Arc<SharedSigner>,
        metrics: Arc<Metrics>,
        policy: RetryPolicy,
        stop: CancellationToken,
    ) {
        let cx = RunContext {
            http,
            signer,
            metrics,
            policy,
            stop,
        };
        let mut state = LinkState {
            failures: 0,
            next_probe: Instant::now(),
            relay_logged: false,
            batch_off_until: None,
        };
        loop {
            let refilled = self.refill(&cx.metrics).await;
            let Some(next) = self.front() else {
                if self.idle(refilled, &cx).await {
                    continue;
                }
                return;
            };
            let (next, first) = match self.try_batch(&cx, &mut state, next).await {
                AfterBatch::Done => continue,
                AfterBatch::OneAtATime(next, first) => (next, first),
            };
            if !self.deliver_one(&cx, &mut state, &next, first).await {
                return;
            }
            self.pop(&next.id, &cx.metrics);
        }
    }

    /// Waits, with nothing queued, for a push or a pause (true), or for `stop`
    /// (false). A failed re-read of the spill is retried after a pause, not on the
    /// next push; a cursor left behind is written once things stay quiet.
    async fn idle(&self, refilled: bool, cx: &RunContext) -> bool {
        // A failed re-read of the spill is retried after a pause, not on the next push.
        let mut pause = if refilled {
            Duration::MAX
        } else {
            cx.policy.max
        };
        // Caught up with the cursor behind: write it once things stay quiet.
        if self.cursor.behind() {
            pause = pause.min(crate::store::cursor::SAVE_EVERY);
        }
        tokio::select! {
            _ = cx.stop.cancelled() => false,
            _ = self.notify.notified() => true,
            _ = tokio::time::sleep(pause.min(Duration::from_secs(3600))) => {
                self.cursor.save_soon();
                true
            }
        }
    }

    /// More than one waiting, the direct link healthy and the peer known to take
    /// batches (or not known not to): sends a batch, over HTTP or on the stream. Its
    /// first retryable result becomes the first attempt of the one-at-a-time path
    /// ([`Outbox::deliver_one`]), which owns backoff, relaying and giving up.
    async fn try_batch(&self, cx: &RunContext, state: &mut LinkState, next: Pending) -> AfterBatch {
        let batch_max = self.batch_max.load(Ordering::Relaxed);
        let relaying = self.relay.get().is_some_and(|r| r.due(&self.link));
        if state.batch_off_until.is_some_and(|t| Instant::now() >= t) {
            state.batch_off_until = None;
        }
        if batch_max <= 1 || relaying || state.batch_off_until.is_some() {
            return AfterBatch::OneAtATime(next, None);
        }
        self.send_batch(cx, state, batch_max, next).await
    }

    /// A batch over the transport: the envelopes it answers for are handled up to the
    /// first retryable one, which goes on alone.
    async fn send_batch(
        &self,
        cx: &RunContext,
        state: &mut LinkState,
        batch_max: usize,
        mut next: Pending,
    ) -> AfterBatch {
        let batch = self.front_batch(batch_max);
        if batch.len() <= 1 {
            return AfterBatch::OneAtATime(next, None);
        }
        let outcome = self
            .dest
            .send_batch(&cx.send_context(&self.peer), &batch)
            .await;
        let results = match outcome {
            BatchOutcome::TooSmall => return AfterBatch::OneAtATime(next, None),
            BatchOutcome::Unsupported(why) => {
                tracing::info!(peer = %self.peer, reason = %why, "peer does not take batches (older version?): sending one envelope per request");
                state.batch_off_until = Some(Instant::now() + BATCH_RETRY_AFTER);
                return AfterBatch::OneAtATime(next, None);
            }
            BatchOutcome::Failed(why) => {
                return AfterBatch::OneAtATime(next, Some(Attempt::Retry(why)))
            }
            BatchOutcome::Answered(results) => results,
        };
        self.link_ok(&mut state.failures);
        state.relay_logged = false;
        let mut first = None;
        for (p, r) in batch.iter().zip(results) {
            match r {
                Attempt::Delivered(answered) => {
                    cx.metrics.envelope_out(&self.peer, "delivered");
                    self.report(p, PeerOutcome::Delivered(answered));
                }
                Attempt::Permanent(why) => {
                    cx.metrics.envelope_out(&self.peer, "given_up");
                    self.report(p, PeerOutcome::GivenUp);
                    self.refused(p, 1, &why);
                }
                Attempt::Retry(why) => {
                    if self.front().is_some_and(|f| f.id == p.id) {
                        // The envelopes before it are popped.
                        next = p.clone();
                        first = Some(Attempt::Retry(why));
                    }
                    break;
                }
            }
            self.pop(&p.id, &cx.metrics);
        }
        match first {
            None => AfterBatch::Done,
            first => AfterBatch::OneAtATime(next, first),
        }
    }

    /// Logs the peer's permanent refusal of `p` (given up on, counted by the caller).
    /// A status refused is no lost conversation: a peer older than statuses refuses
    /// each one (400), so the first is logged (WARN) and the rest only at DEBUG.
    fn refused(&self, p: &Pending, attempt: u32, why: &str) {
        /// Just the kind of a queued envelope.
        #[derive(serde::Deserialize)]
        struct KindOf {
            /// The envelope's kind.
            kind: crate::wire::envelope::Kind,
        }
        let status = serde_json::from_slice::<KindOf>(&p.body)
            .is_ok_and(|k| k.kind == crate::wire::envelope::Kind::Status);
        if !status {
            tracing::error!(peer = %self.peer, id = %p.id, attempt, reason = %why, "peer refused envelope permanently; giving up on it");
        } else if !self
            .status_refusal_logged
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(peer = %self.peer, id = %p.id, reason = %why, "peer refused a status message (an older version?): it sees statuses only on the platform; further refusals of statuses by this peer are logged at debug");
        } else {
            tracing::debug!(peer = %self.peer, id = %p.id, reason = %why, "peer refused a status message");
        }
    }

    /// Delivers `next` alone, `first` being the attempt a batch already made for it:
    /// direct attempts with backoff (while relaying, only on the probe schedule), the
    /// relay while the direct link is down, giving up on a permanent refusal or after
    /// `give_up_after`. True once it is handled (delivered or given up); false when
    /// `stop` fires first.
    async fn deliver_one(
        &self,
        cx: &RunContext,
        state: &mut LinkState,
        next: &Pending,
        mut first: Option<Attempt>,
    ) -> bool {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            let sig = cx.signer.sign_for(&self.peer, &next.id, ts, &next.body);
            // While relaying, the direct link is only probed on its backoff schedule.
            let relaying = self.relay.get().is_some_and(|r| r.due(&self.link));
            let direct = first.is_some() || !relaying || Instant::now() >= state.next_probe;
            let outcome = if let Some(o) = first.take() {
                o
            } else if direct {
                self.dest
                    .send_one(&cx.send_context(&self.peer), next, ts, &sig)
                    .await
            } else {
                Attempt::Retry("direct link down (relaying until the next probe)".into())
            };
            match outcome {
                Attempt::Delivered(answered) => {
                    self.link_ok(&mut state.failures);
                    state.relay_logged = false;
                    cx.metrics.envelope_out(&self.peer, "delivered");
                    self.report(next, PeerOutcome::Delivered(answered));
                    tracing::debug!(peer = %self.peer, id = %next.id, attempt, "delivered");
                    return true;
                }
                Attempt::Permanent(why) => {
                    self.link_ok(&mut state.failures);
                    state.relay_logged = false;
                    cx.metrics.envelope_out(&self.peer, "given_up");
                    self.report(next, PeerOutcome::GivenUp);
                    self.refused(next, attempt, &why);
                    return true;
                }
                Attempt::Retry(why) => {
                    if direct {
                        tracing::debug!(peer = %self.peer, id = %next.id, reason = %why, relaying, "direct attempt failed");
                        state.failures += 1;
                        self.link.failed();
                        state.next_probe = Instant::now() + cx.policy.backoff(state.failures);
                    }
                    if self.relayed(cx, state, next, ts, &sig).await {
                        return true;
                    }
                    if next.queued_at.elapsed() >= cx.policy.give_up_after {
                        cx.metrics.envelope_out(&self.peer, "given_up");
                        self.report(next, PeerOutcome::GivenUp);
                        tracing::error!(peer = %self.peer, id = %next.id, attempt, reason = %why, waited_s = next.queued_at.elapsed().as_secs(), "delivery deadline passed; giving up on envelope");
                        return true;
                    }
                    cx.metrics.envelope_out(&self.peer, "retry");
                    let wait = cx.policy.backoff(attempt);
                    tracing::warn!(peer = %self.peer, id = %next.id, attempt, reason = %why, retry_in_ms = wait.as_millis() as u64, "delivery failed; will retry");
                    tokio::select! {
                        _ = cx.stop.cancelled() => return false,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// While the direct link is down (the relay says it is due), hands `next` to the
    /// relay, announcing relaying once; true when the relay delivered it.
    async fn relayed(
        &self,
        cx: &RunContext,
        state: &mut LinkState,
        next: &Pending,
        ts: i64,
        sig: &str,
    ) -> bool {
        let Some(relay) = self.relay.get().filter(|r| r.due(&self.link)) else {
            return false;
        };
        if !state.relay_logged {
            state.relay_logged = true;
            tracing::warn!(peer = %self.peer, down_ms = self.link.failing_for().unwrap_or_default().as_millis() as u64, "direct link failing: relaying envelopes for this peer through other peers (still probing it directly)");
        }
        if relay
            .deliver(&self.peer, &next.id, ts, sig, &next.body)
            .await
        {
            // The relay's receipt proves delivery but carries no `answered`.
            cx.metrics.envelope_out(&self.peer, "relayed");
            self.report(next, PeerOutcome::Delivered(ClaimReply::default()));
            return true;
        }
        false
    }

    /// A direct attempt the peer answered: the link works.
    fn link_ok(&self, failures: &mut u32) {
        *failures = 0;
        if let Some(down) = self.link.ok() {
            tracing::info!(peer = %self.peer, down_ms = down.as_millis() as u64, "direct link to peer works again");
        }
    }
}

/// Reads up to `max` outbox log entries of `spill`'s range, starting at its offset
/// (checked: the line there must hold `next_seq`; otherwise the log is scanned from
/// the start). Returns the entries and the offset after the last one.
fn read_log_range(
    path: &Path,
    spill: Spill,
    max: usize,
) -> std::io::Result<(Vec<LoggedOutbound>, u64)> {
    let mut file = std::fs::File::open(path)?;
    let mut start = spill.next_offset;
    for pass in 0..2 {
        file.seek(SeekFrom::Start(start))?;
        let mut reader = BufReader::new(&mut file);
        let mut offset = start;
        let mut out = Vec::new();
        let mut buf = Vec::new();
        let mut misplaced = false;
        while out.len() < max {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf)?;
            if n == 0 || buf.last() != Some(&b'\n') {
                break;
            }
            let line_start = offset;
            offset += n as u64;
            let Some(e) = parse_outbox_line(&buf[..n - 1], line_start) else {
                continue;
            };
            if e.seq < spill.next_seq {
                if pass == 0 {
                    misplaced = true;
                    break;
                }
                continue;
            }
            if pass == 0 && out.is_empty() && e.seq != spill.next_seq {
                misplaced = true;
                break;
            }
            if e.seq > spill.last_seq {
                offset = line_start;
                break;
            }
            out.push(e);
        }
        if !misplaced {
            return Ok((out, offset));
        }
        tracing::warn!(file = %path.display(), offset = start, seq = spill.next_seq, "outbox log offset did not match; scanning the log from the start");
        start = 0;
    }
    Ok((Vec::new(), spill.next_offset))
}

/// What [`Outbox::run`] delivers with, shared by its steps.
struct RunContext {
    http: reqwest::Client,
    signer: Arc<SharedSigner>,
    metrics: Arc<Metrics>,
    policy: RetryPolicy,
    stop: CancellationToken,
}

impl RunContext {
    /// What a transport needs for one request to `peer`.
    fn send_context<'a>(&'a self, peer: &'a str) -> SendContext<'a> {
        SendContext {
            peer,
            http: &self.http,
            signer: &self.signer,
            metrics: &self.metrics,
            timeout: self.policy.attempt_timeout,
        }
    }
}

/// The direct link's state across envelopes, in [`Outbox::run`].
struct LinkState {
    /// Consecutive failed direct attempts.
    failures: u32,
    /// When to probe the direct link next while relaying.
    next_probe: Instant,
    /// Whether relaying was announced.
    relay_logged: bool,
    /// Set while the peer answers batches with 404 (an older version).
    batch_off_until: Option<Instant>,
}

/// What [`Outbox::try_batch`] leaves for the one-at-a-time path.
enum AfterBatch {
    /// Every envelope the batch held is handled: look at the queue again.
    Done,
    /// Deliver this envelope alone, starting from the batch's attempt when it made one.
    OneAtATime(Pending, Option<Attempt>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::limits::ENVELOPES_PATH;
    use crate::wire::signing::HEADER_ID;

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

    /// A signer with a mesh secret only: HMAC, cheap enough to sign thousands of times.
    fn hmac_signer() -> Signer {
        Signer {
            pairwise: Default::default(),
            hmac: vec![crate::wire::signing::HmacSecret::generate()],
            ed25519: vec![],
        }
    }

    #[test]
    fn one_signature_per_envelope_and_second_is_shared() {
        let signer = hmac_signer();
        let cache = SignatureCache::default();
        let a = cache.get_or_sign(&signer, "01J", 100, b"{}");
        assert_eq!(a, signer.sign("01J", 100, b"{}"));
        assert_eq!(cache.get_or_sign(&signer, "01J", 100, b"{}"), a);
        let later = cache.get_or_sign(&signer, "01J", 101, b"{}");
        assert_ne!(later, a, "a new second gets a fresh signature");
        assert_eq!(later, signer.sign("01J", 101, b"{}"));
    }

    #[test]
    fn a_burst_of_signatures_in_one_second_keeps_the_cache_bounded() {
        let signer = hmac_signer();
        let cache = SignatureCache::default();
        for i in 0..3 * SIGNATURE_CACHE_ENTRIES {
            cache.get_or_sign(&signer, &format!("e{i}"), 100, b"{}");
            assert!(cache.len() <= SIGNATURE_CACHE_ENTRIES, "{}", cache.len());
        }
        // The latest ones are still there (a second outbox in the same second hits).
        let last = format!("e{}", 3 * SIGNATURE_CACHE_ENTRIES - 1);
        assert_eq!(
            cache.get_or_sign(&signer, &last, 100, b"{}"),
            signer.sign(&last, 100, b"{}")
        );
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

    /// Writes `n` entries in the outbox log format; returns them with their offsets.
    fn write_log(path: &Path, seqs: std::ops::RangeInclusive<u64>) -> Vec<LoggedOutbound> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        let mut offset = f.metadata().unwrap().len();
        let mut out = Vec::new();
        for seq in seqs {
            let body = format!("{{\"n\":{seq}}}");
            let line = format!("{seq}\tid{seq}\t{body}\n");
            f.write_all(line.as_bytes()).unwrap();
            out.push(LoggedOutbound {
                seq,
                id: format!("id{seq}"),
                body: Bytes::from(body),
                offset,
            });
            offset += line.len() as u64;
        }
        out
    }

    #[tokio::test]
    async fn spills_beyond_capacity_and_refills_in_order_from_the_log() {
        let m = Metrics::new();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("outbox.log");
        let o = Outbox::new("B", "http://127.0.0.1:1", 4, None);
        o.set_log_path(log.clone());
        for e in write_log(&log, 1..=10) {
            o.push_logged(&e, &m);
        }
        assert_eq!((o.len(), o.spilled()), (4, 6));
        assert!(
            o.push("claim", Bytes::from_static(b"{}"), None, &m)
                .is_err(),
            "a claim is refused while durable envelopes are spilled"
        );
        // More arrive while spilling (the log grows), then the queue drains.
        for e in write_log(&log, 11..=13) {
            o.push_logged(&e, &m);
        }
        assert_eq!(o.spilled(), 9);
        let mut seen = Vec::new();
        for _ in 0..100 {
            assert!(o.refill(&m).await);
            let Some(p) = o.front() else { break };
            assert!(o.len() <= 4);
            seen.push(p.id.clone());
            o.pop(&p.id, &m);
        }
        let want: Vec<String> = (1..=13).map(|n| format!("id{n}")).collect();
        assert_eq!(seen, want);
        assert!(o.is_empty());
        assert_eq!(o.peak_len(), 4);
        assert_eq!(o.handled(), 13);
        assert!(m.render().contains(r#"botmesh_outbox_spilled{peer="B"} 0"#));
    }

    /// A fake peer: `answer(path, body, request number)` gives status and body; every
    /// request's path and envelope ids are recorded.
    type Answer = dyn Fn(&str, &[u8], usize) -> (u16, String) + Send + Sync;
    type Seen = Arc<Mutex<Vec<(String, Vec<String>)>>>;

    async fn fake_peer(answer: Arc<Answer>) -> (String, Seen) {
        use http_body_util::BodyExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen: Seen = Arc::default();
        let s = seen.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (answer, seen) = (answer.clone(), s.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let (answer, seen) = (answer.clone(), seen.clone());
                            async move {
                                let path = req.uri().path().to_string();
                                let header_id = req
                                    .headers()
                                    .get(HEADER_ID)
                                    .map(|v| v.to_str().unwrap().to_string());
                                let body = req.into_body().collect().await.unwrap().to_bytes();
                                let ids = match header_id {
                                    Some(id) => vec![id],
                                    None => crate::wire::batch::parse(&body).map_or(vec![], |b| {
                                        b.items.iter().map(|i| i.id.to_string()).collect()
                                    }),
                                };
                                let n = {
                                    let mut s = seen.lock();
                                    s.push((path.clone(), ids));
                                    s.len()
                                };
                                let (status, text) = answer(&path, &body, n);
                                let mut r = http::Response::new(http_body_util::Full::new(
                                    Bytes::from(text),
                                ));
                                *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
                                Ok::<_, std::convert::Infallible>(r)
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (url, seen)
    }

    /// Batch results: `accepted` for every item except those `special` names.
    fn results(body: &[u8], special: impl Fn(&str) -> Option<(u16, &'static str)>) -> String {
        let b = crate::wire::batch::parse(body).unwrap();
        let mut stop = false;
        let rs: Vec<crate::wire::batch::ItemResult> = b
            .items
            .iter()
            .map(|i| {
                let (status, result) = if stop {
                    (503, "not_processed")
                } else {
                    special(&i.id).unwrap_or((200, "accepted"))
                };
                stop |= status == 429;
                crate::wire::batch::ItemResult {
                    status,
                    result: result.into(),
                    detail: None,
                    answered: None,
                    judging: false,
                }
            })
            .collect();
        serde_json::to_string(&crate::wire::batch::Response { results: rs }).unwrap()
    }

    /// Queues `n` envelopes `e0…`, runs the outbox against `url` until it is empty.
    async fn deliver(url: &str, n: usize, batch_max: usize) -> (Arc<Outbox>, Arc<Metrics>) {
        let m = Arc::new(Metrics::new());
        let o = Outbox::new("B", url, 1000, None);
        o.set_batch_max(batch_max);
        for i in 0..n {
            o.push(
                &format!("e{i}"),
                Bytes::from(format!("{{\"n\":{i}}}")),
                Some(i as u64 + 1),
                &m,
            )
            .unwrap();
        }
        let signer = Arc::new(SharedSigner {
            signer: Signer {
                pairwise: Default::default(),
                hmac: vec![crate::wire::signing::HmacSecret::generate()],
                ed25519: vec![],
            },
            cache: Default::default(),
        });
        let policy = RetryPolicy {
            base: Duration::from_millis(5),
            max: Duration::from_millis(20),
            give_up_after: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(5),
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(o.clone().run(
            reqwest::Client::builder().no_proxy().build().unwrap(),
            signer,
            m.clone(),
            policy,
            stop.clone(),
        ));
        for _ in 0..500 {
            if o.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        task.await.unwrap();
        assert!(o.is_empty(), "{} still queued", o.len());
        (o, m)
    }

    fn ids(range: std::ops::Range<usize>) -> Vec<String> {
        range.map(|i| format!("e{i}")).collect()
    }

    #[tokio::test]
    async fn a_backlog_goes_in_batches_and_a_refused_item_is_given_up_alone() {
        let (url, seen) = fake_peer(Arc::new(|path: &str, body: &[u8], _| {
            assert_eq!(
                path,
                crate::wire::batch::BATCH_PATH,
                "a backlog goes as batches"
            );
            (
                200,
                results(body, |id| (id == "e3").then_some((400, "malformed"))),
            )
        }))
        .await;
        let (o, m) = deliver(&url, 100, 64).await;
        let seen = seen.lock().clone();
        assert_eq!(seen.len(), 2, "100 envelopes in 64 + 36: {seen:?}");
        assert_eq!(seen[0].1, ids(0..64));
        assert_eq!(seen[1].1, ids(64..100));
        let r = m.render();
        assert!(r.contains(r#"botmesh_envelopes_out_total{peer="B",result="delivered"} 99"#));
        assert!(r.contains(r#"botmesh_envelopes_out_total{peer="B",result="given_up"} 1"#));
        assert!(
            r.contains(r#"botmesh_peer_requests_total{peer="B",kind="batch"} 2"#),
            "{r}"
        );
        assert_eq!(o.handled(), 100);
    }

    #[tokio::test]
    async fn a_retryable_item_stops_the_batch_and_the_rest_follow_in_order() {
        // e5 is rate-limited on the first batch only.
        let (url, seen) = fake_peer(Arc::new(|path: &str, body: &[u8], n| {
            if path == ENVELOPES_PATH {
                return (200, r#"{"accepted":true}"#.into());
            }
            (
                200,
                results(body, |id| {
                    (id == "e5" && n == 1).then_some((429, "rate_limited"))
                }),
            )
        }))
        .await;
        let (o, m) = deliver(&url, 10, 64).await;
        let seen = seen.lock().clone();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0].1, ids(0..10));
        // The held-back item is retried after a backoff, alone (the one-at-a-time path
        // owns backoff, relaying and giving up), then batching resumes.
        assert_eq!(seen[1], (ENVELOPES_PATH.to_string(), ids(5..6)));
        assert_eq!(
            seen[2],
            (crate::wire::batch::BATCH_PATH.to_string(), ids(6..10))
        );
        let r = m.render();
        assert!(r.contains(r#"botmesh_envelopes_out_total{peer="B",result="delivered"} 10"#));
        assert!(
            r.contains(r#"botmesh_envelopes_out_total{peer="B",result="retry"} 1"#),
            "{r}"
        );
        assert_eq!(o.handled(), 10);
    }

    #[tokio::test]
    async fn a_peer_without_batches_gets_single_posts_and_one_envelope_goes_alone() {
        let (url, seen) = fake_peer(Arc::new(|path: &str, _: &[u8], _| {
            if path == crate::wire::batch::BATCH_PATH {
                (404, r#"{"error":"no such endpoint"}"#.into())
            } else {
                (200, r#"{"accepted":true}"#.into())
            }
        }))
        .await;
        let (_, m) = deliver(&url, 5, 64).await;
        let seen = seen.lock().clone();
        assert_eq!(seen[0].0, crate::wire::batch::BATCH_PATH);
        let singles: Vec<String> = seen[1..]
            .iter()
            .map(|(p, ids)| {
                assert_eq!(p, ENVELOPES_PATH);
                ids[0].clone()
            })
            .collect();
        assert_eq!(singles, ids(0..5), "after the 404, one at a time, in order");
        let r = m.render();
        assert!(r.contains(r#"botmesh_envelopes_out_total{peer="B",result="delivered"} 5"#));

        // A queue of one never waits for a batch.
        let (url, seen) = fake_peer(Arc::new(|_: &str, _: &[u8], _| {
            (200, r#"{"accepted":true}"#.into())
        }))
        .await;
        deliver(&url, 1, 64).await;
        assert_eq!(seen.lock()[0].0, ENVELOPES_PATH);
        // batch_max 1 turns batching off.
        let (url, seen) = fake_peer(Arc::new(|_: &str, _: &[u8], _| {
            (200, r#"{"accepted":true}"#.into())
        }))
        .await;
        deliver(&url, 3, 1).await;
        assert!(seen.lock().iter().all(|(p, _)| p == ENVELOPES_PATH));
    }

    #[test]
    fn a_wrong_offset_falls_back_to_a_scan() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("outbox.log");
        write_log(&log, 1..=5);
        let spill = Spill {
            next_seq: 3,
            next_offset: 0,
            last_seq: 4,
        };
        let (got, _) = read_log_range(&log, spill, 10).unwrap();
        let seqs: Vec<u64> = got.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![3, 4]);
    }
}
