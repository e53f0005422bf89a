//! `Ingest`: the narrow handle every inbound path holds — the bridge's HTTP handlers,
//! the stream reader and relayed copies (a platform adapter holds less still: its
//! `platform::AdapterContext`, the sink, metrics, stop signal and tasks). It carries what the
//! admission checks need (configuration, replay cache, rate limiter, signature pool,
//! metrics) and hands admitted traffic to a [`Sink`], which the node implements in
//! `app/`. Nothing in ingress or a platform adapter ever holds the whole node.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::NodeConfig;
use crate::egress::relay::Relay;
use crate::ingress::limiter::RateLimiter;
use crate::ingress::seen::SeenCache;
use crate::ingress::verify_pool::VerifyPool;
use crate::store::transcript::{platform_ids, Appended, Received, TranscriptError};
use crate::telemetry::events::Event;
use crate::telemetry::metrics::Metrics;
use crate::turn::mention::PlatformMention;
use crate::wire::batch::ClaimReply;
use crate::wire::envelope::Envelope;

/// What a node's message arrived through, as counted in
/// `botmesh_transcript_appends_total{result}` and logged.
pub(crate) type Source = &'static str;

/// One message from a chat platform, ready for the transcript: the envelope (with the
/// platform's message id, the author by display name) and the platform's own mention
/// list, already resolved to roster names where the platform names people by id.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The message as the mesh records it.
    pub env: Envelope,
    /// Mentions the platform resolved itself (Feishu `mentions[]`); empty elsewhere.
    pub mentions: Vec<PlatformMention>,
    /// Where it came from (`feishu`, ...).
    pub source: Source,
}

/// Where admitted traffic goes: the node, behind the narrowest interface that lets
/// ingress record, forward claims and answer the claimant.
pub trait Sink: Send + Sync + 'static {
    /// Records messages in order, in one durable write where possible, and hands each
    /// new one to the turn-taking pipeline. One result per message, in order.
    fn record_many(
        &self,
        envs: Vec<Received>,
        source: Source,
    ) -> BoxFuture<'_, Vec<Result<Appended, TranscriptError>>>;

    /// Records one platform message with its platform mentions. A person's message
    /// from a platform that does not show people to every bot (DingTalk: only the
    /// @-mentioned robots) is also queued for every peer in the same durable write:
    /// this node carries it to its colleagues as a human envelope.
    fn arrive(&self, arrival: Arrival) -> BoxFuture<'_, Result<Appended, TranscriptError>>;

    /// A peer's claim (or its withdrawal), or a shared judge's verdict, for the scheduler.
    fn on_claim(&self, env: Arc<Envelope>);

    /// For a claim already handed over: the answer to the claimant — this bot's name
    /// when it has committed to answer (or answered) the claim's trigger, or that its
    /// own judge about it is still out.
    fn answer_claim(&self, env: &Envelope) -> ClaimReply;

    /// Whether `group` already holds the message with this platform message id (a
    /// colleague's message seen on the platform after its bridge copy).
    fn has_platform_msg(&self, group: &str, platform_msg_id: &str) -> bool;

    /// Waits up to `within` until `group` has recorded a message with the platform id
    /// `platform_msg_id` (at once when it already has); true once it has. The
    /// transcript says when it records a message ([`recorded_within`]): nothing polls.
    fn await_platform_msg<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        within: std::time::Duration,
    ) -> BoxFuture<'a, bool>;

    /// One recorded message of `group` by id (what an adapter needs to answer it on
    /// its platform: the platform's id of the message answered).
    fn message(&self, group: &str, id: &ulid::Ulid) -> Option<Arc<Envelope>>;
}

/// Who may carry human messages over the bridge, and whether this node ignores
/// bridge copies of them: the platforms' declarations ([`crate::platform`]), resolved
/// for this mesh by the node at start.
#[derive(Debug, Clone, Default)]
pub(crate) struct HumanRules {
    /// This node's platform shows every human message to every bot itself, so a
    /// bridge copy would be a second one.
    pub platform_delivers_humans: bool,
    /// Peers whose platform does not show humans to every bot: only they may send
    /// human envelopes (a human envelope resets depth, so it is the one thing a
    /// compromised bot would forge to restart a loop).
    pub carriers: std::collections::HashSet<String>,
}

/// The narrow handle of every inbound path (cheap to clone).
#[derive(Clone)]
pub(crate) struct Ingest {
    /// The validated configuration and keys.
    pub cfg: Arc<NodeConfig>,
    /// Counts every admission and rejection.
    pub metrics: Arc<Metrics>,
    /// Recently seen envelope ids (replay protection).
    pub seen: Arc<SeenCache>,
    /// Per-peer rate limit of pushed traffic.
    pub limiter: Arc<RateLimiter>,
    /// Signature verification off the async workers.
    pub verify: Arc<VerifyPool>,
    /// Forwards relayed copies on to their destination (absent: relaying refused).
    pub relay: Option<Arc<Relay>>,
    /// Who may carry humans over the bridge.
    pub humans: Arc<HumanRules>,
    /// Cancelled when the node stops accepting work.
    pub accepting: CancellationToken,
    /// Tracks work an adapter starts after answering its platform (so shutdown waits).
    pub tasks: TaskTracker,
    /// Where admitted traffic goes.
    pub sink: Arc<dyn Sink>,
}

/// Waits up to `within` for a message of `group` carrying `platform_msg_id`: true
/// once `has()` says so or `events` announces one. Subscribed before the first
/// look, so a message recorded between the look and the wait is not missed; a
/// receiver that fell behind looks again.
pub(crate) async fn recorded_within(
    mut events: broadcast::Receiver<Event>,
    has: impl Fn() -> bool,
    group: &str,
    platform_msg_id: &str,
    within: std::time::Duration,
) -> bool {
    if has() {
        return true;
    }
    let carries = |env: &Envelope| {
        env.group == group
            && env
                .platform_msg_id
                .as_deref()
                .is_some_and(|p| platform_ids(p).any(|p| p == platform_msg_id))
    };
    let waiting = async {
        loop {
            match events.recv().await {
                Ok(Event::Message { envelope }) if carries(&envelope) => return true,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if has() {
                        return true;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return has(),
            }
        }
    };
    tokio::time::timeout(within, waiting)
        .await
        .unwrap_or_else(|_| has())
}
