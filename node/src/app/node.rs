//! `Node`: one bot's bridge node's shared state, and the one way a message is
//! recorded ([`Node::record_many`] and the rest) or published by the node itself
//! ([`Node::publish_own`]).
//!
//! Data takes one path through a node: ingress (bridge or local API) → transcript
//! (durable, deduplicated) → the turn-taking pipeline (`turn`) → reply → egress (the
//! peers' outboxes). A node is built, started and stopped by [`super::lifecycle`]; the
//! layers below see it through the narrow handles of [`super::ports`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::config::NodeConfig;
use crate::egress::outbox::Outbox;
use crate::ingress::limiter::RateLimiter;
use crate::ingress::seen::SeenCache;
use crate::ingress::verify_pool::VerifyPool;
use crate::llm::LlmClient;
use crate::platform::ChatPlatform;
use crate::store::transcript::{Appended, Received, TranscriptError, Transcripts};
use crate::telemetry::events::{Event, EventBus};
use crate::telemetry::metrics::Metrics;
use crate::turn::Brain;
use crate::wire::envelope::Envelope;

/// The outbox that appends to the Redis Streams transport (not a bot name: bot names
/// cannot contain `@`).
pub(crate) const STREAM_OUTBOX: &str = "@redis";

/// How long ids stay in the replay cache: more than twice the ±300 s window.
pub(crate) const SEEN_TTL: Duration = Duration::from_secs(900);

/// A running bot's shared state.
pub struct Node {
    /// The validated configuration and keys.
    pub(crate) cfg: Arc<NodeConfig>,
    /// Prometheus metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// Live events for the page and SSE.
    pub events: EventBus,
    /// Every group's messages.
    pub(crate) transcripts: Transcripts,
    /// Every judge answer and what the bot did with it, for `botmesh replay`.
    pub(crate) verdicts: crate::store::verdicts::VerdictLog,
    /// Recently seen envelope ids (replay protection).
    pub(crate) seen: Arc<SeenCache>,
    /// One outbox per peer.
    pub outboxes: Vec<Arc<Outbox>>,
    /// Per-peer ingress rate limit.
    pub(crate) limiter: Arc<RateLimiter>,
    /// Verifies envelope signatures off the async workers, coalescing concurrent ones.
    pub(crate) verify: Arc<VerifyPool>,
    /// The LLM client shared by the judge and the reply (idle without `[llm]`).
    pub(crate) llm: LlmClient,
    /// The turn-taking pipeline.
    pub brain: Brain,
    /// The quiet switches, node-wide and per group: while one is on for a group, the
    /// bot takes no turns there.
    pub(crate) quiet: crate::turn::control::Quiet,
    /// Cancelled when the node stops accepting work.
    pub(crate) accepting: CancellationToken,
    /// Tracks the background turn tasks so shutdown can wait for them.
    pub(crate) turns: tokio_util::task::TaskTracker,
    /// This bot's chat platform.
    pub(crate) platform: Arc<dyn ChatPlatform>,
    /// The Redis Streams transport, when this bot's transport is `redis`.
    pub(crate) stream: Option<Arc<crate::egress::stream::StreamLink>>,
    /// Relaying around broken links (its HTTP client also forwards others' copies).
    pub(crate) relay: Option<Arc<crate::egress::relay::Relay>>,
    /// Claims this node waits on: each outbox reports how they fared with its peer.
    pub acks: Arc<crate::egress::acks::AckTracker>,
    /// Configuration reloads: what runs now, the last outcome.
    pub(crate) reloader: crate::app::reload::Reloader,
    /// The credentials of the agent's `mesh` server: one bot, one group, the group
    /// tools only.
    pub(crate) tool_tokens: Arc<crate::app::group_tools::ToolTokens>,
    /// The node itself, for the owned handles it gives out from `&self` (a long
    /// turn's status, [`crate::app::status`], outlives the turn's borrow).
    pub(crate) me: std::sync::Weak<Node>,
    /// The bot served as an A2A agent (`[[bots]] a2a`), with its tasks; `None`: not
    /// served.
    pub(crate) a2a: Option<Arc<crate::a2a::server::A2aServer>>,
}

impl Node {
    /// Records a message in its group's transcript and, when new, hands it to the
    /// turn-taking pipeline; a platform message's `@_user_N` placeholders resolve
    /// through the mention list the platform sent with it. With `forward` it
    /// is also queued for every peer in the same durable write (a person's message
    /// that the platform showed to this bot only). Returns once it is on disk.
    pub(crate) async fn record_with_mentions(
        self: &Arc<Self>,
        env: Envelope,
        source: &str,
        mentions: Vec<crate::turn::mention::PlatformMention>,
        forward: bool,
    ) -> Result<Appended, TranscriptError> {
        self.record_inner(env, source, mentions, forward).await
    }

    /// The one way into a transcript. `outbound`: also queue the message for every
    /// peer in the same durable write.
    pub(crate) async fn record_inner(
        self: &Arc<Self>,
        env: Envelope,
        source: &str,
        mentions: Vec<crate::turn::mention::PlatformMention>,
        outbound: bool,
    ) -> Result<Appended, TranscriptError> {
        let env = Arc::new(env);
        let outcome = self.transcripts.append_with(env.clone(), outbound).await;
        self.after_append(&env, source, mentions, &outcome);
        outcome
    }

    /// [`Node::record_with_mentions`] for several messages (no platform mentions), in order, in one durable write where
    /// possible (a batch from a peer): one result per message, in the same order.
    pub(crate) async fn record_many(
        self: &Arc<Self>,
        envs: Vec<Received>,
        source: &str,
    ) -> Vec<Result<Appended, TranscriptError>> {
        let recorded: Vec<Arc<Envelope>> = envs.iter().map(|r| r.env.clone()).collect();
        let outcomes = self.transcripts.append_many(envs).await;
        for (env, outcome) in recorded.iter().zip(&outcomes) {
            self.after_append(env, source, Vec::new(), outcome);
        }
        outcomes
    }

    /// What follows an append: metrics and, for a new message, the turn-taking pipeline.
    fn after_append(
        self: &Arc<Self>,
        env: &Arc<Envelope>,
        source: &str,
        mentions: Vec<crate::turn::mention::PlatformMention>,
        outcome: &Result<Appended, TranscriptError>,
    ) {
        match outcome {
            Ok(Appended::New) => {
                self.metrics.transcript_append(source);
                self.brain.observe(env);
                // An answer to this bot's ask goes to the tool call waiting on it and
                // takes no turn; a message addressed to the bot waits for its agent's
                // `wait_for_message` too.
                if crate::app::group_tools::first_look(self, env, &mentions) {
                    return;
                }
                // The local rules at once: silence (most of what a busy node receives)
                // needs no task; a turn (or a shared verdict to ask for) gets one. A
                // person's command is carried out here and takes no turn.
                if !self.accepting.is_cancelled()
                    && !crate::app::commands::handle(self, env, &mentions)
                {
                    if let Some(turn) = crate::turn::on_message(self, env, mentions) {
                        self.turns.spawn(turn);
                    }
                }
            }
            Ok(Appended::Duplicate) => {}
            Err(e) => {
                self.metrics.transcript_append("error");
                tracing::error!(id = %env.id, error = %e, "could not record message");
            }
        }
    }

    /// A claim or a shared verdict from a peer: tell the scheduler and (claims) the
    /// watchers.
    pub(crate) fn on_claim(&self, env: Arc<Envelope>) {
        self.brain.on_claim(&env);
        if env.kind == crate::wire::envelope::Kind::Claim {
            self.events.publish(Event::Claim { envelope: env });
        }
    }

    /// Queues an ephemeral envelope (a claim) for every peer, in memory only: a claim
    /// that arrives after a restart would be stale anyway. Returns the peers whose
    /// outbox refused it (full: logged and counted there).
    pub(crate) fn broadcast(&self, env: &Envelope) -> Vec<&str> {
        let body = Bytes::from(env.to_bytes());
        let id = env.id.to_string();
        self.outboxes
            .iter()
            .filter(|o| o.push(&id, body.clone(), None, &self.metrics).is_err())
            .map(|o| o.peer())
            .collect()
    }

    /// [`Node::broadcast`], tracking the envelope's delivery to every peer: the handle
    /// settles once each peer acknowledged it (with its `answered` value) or its
    /// delivery was given up (a peer whose outbox refuses it counts as given up at once).
    pub(crate) fn broadcast_tracked(&self, env: &Envelope) -> crate::egress::acks::ClaimAcks {
        let id = env.id.to_string();
        let peers = self.outboxes.iter().map(|o| o.peer().to_string()).collect();
        // Tracked before it is queued, so no report can come before the entry.
        let acks = self.acks.track(&id, peers);
        for peer in self.broadcast(env) {
            self.acks
                .report(&id, peer, crate::egress::acks::PeerOutcome::GivenUp);
        }
        acks
    }

    /// Records this node's own message (human via the API, or the bot's reply) and,
    /// in the same durable write, queues it for every peer (see `outbox_log::Fanout`).
    /// On a platform the bot's own message is posted to the chat first, so the
    /// envelope carries the platform's id (`platform_msg_id`) to the peers.
    pub(crate) async fn publish(
        self: &Arc<Self>,
        env: Envelope,
        source: &str,
    ) -> Result<Appended, TranscriptError> {
        self.publish_own(env, source, RecordAnyway, &|_| {})
            .await
            .map(|published| published.appended)
    }

    /// The one way the node's own envelope goes out: refused if the group may not be
    /// started here, posted to the chat first when the platform shows it (the
    /// envelope then carries the platform's id to the peers), then recorded and, in
    /// the same durable write, queued for every peer. `not_posted` says what a
    /// refused platform post means, and so what publishing can fail with: a message
    /// is recorded anyway ([`RecordAnyway`]), a status message (only worth showing on
    /// the platform, where it is edited) is not ([`OnlyIfPosted`]). `accepted` is
    /// told the node's clock (ms) once the platform accepted the post (its 429s waited
    /// out) and before it is recorded, so nothing that saw the record (the page, a
    /// peer, a person answering it) can come before that moment.
    pub(crate) async fn publish_own<W: WhenNotPosted>(
        self: &Arc<Self>,
        mut env: Envelope,
        source: &str,
        not_posted: W,
        accepted: &(dyn Fn(u64) + Sync),
    ) -> Result<Published, W::Error> {
        // A group the node may not start is refused before anything is posted anywhere.
        self.transcripts.admits(&env.group)?;
        let on_platform = self.platform.should_post(&env)
            && !self.transcripts.contains(&env.group, &env.id, None);
        if on_platform {
            match self.platform.post(&env).await {
                Ok(id) => env.platform_msg_id = Some(id),
                // Logged by the adapter.
                Err(e) => not_posted.refused(e)?,
            }
        }
        let accepted_at = crate::wire::envelope::now_millis();
        accepted(accepted_at);
        let platform_msg_id = env.platform_msg_id.clone();
        // A direct chat has no peers in it: nothing to queue for them.
        let outbound = !crate::wire::envelope::is_direct_group(&env.group);
        let appended = self.record_inner(env, source, Vec::new(), outbound).await?;
        Ok(Published {
            appended,
            on_platform,
            platform_msg_id,
            accepted_at,
        })
    }
}

/// What a refused platform post means for the node's own envelope
/// ([`Node::publish_own`]), and so the error publishing it can end in: the type
/// says whether a refused post can be one.
pub(crate) trait WhenNotPosted {
    /// Why publishing can fail.
    type Error: From<TranscriptError>;
    /// The platform refused the post (`e`): go on to record it (`Ok`), or stop.
    fn refused(&self, e: crate::platform::PostError) -> Result<(), Self::Error>;
}

/// Recorded anyway: the mesh and the page still get the message, so publishing
/// fails only where the transcript refuses it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordAnyway;

impl WhenNotPosted for RecordAnyway {
    type Error = TranscriptError;
    fn refused(&self, _e: crate::platform::PostError) -> Result<(), TranscriptError> {
        Ok(())
    }
}

/// Not recorded: it is only worth having on the platform (a status message).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OnlyIfPosted;

impl WhenNotPosted for OnlyIfPosted {
    type Error = PublishError;
    fn refused(&self, e: crate::platform::PostError) -> Result<(), PublishError> {
        Err(PublishError::NotPosted(e))
    }
}

/// Why a status message was not published ([`Node::publish_own`] with
/// [`OnlyIfPosted`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PublishError {
    /// The group may not be started here, or the transcript could not record it.
    #[error(transparent)]
    Transcript(#[from] TranscriptError),
    /// The platform refused the post, and the envelope is not recorded without it.
    #[error("the platform refused the post: {0}")]
    NotPosted(crate::platform::PostError),
}

/// The node's own envelope as published ([`Node::publish_own`]).
#[derive(Debug)]
pub(crate) struct Published {
    /// Where it went in the transcript.
    pub(crate) appended: Appended,
    /// Whether it was posted to the platform (else it is the page's own: local).
    pub(crate) on_platform: bool,
    /// The platform's id of it, when posted there.
    pub(crate) platform_msg_id: Option<String>,
    /// The node's clock (ms) when the platform accepted it (its 429s waited out),
    /// or when it was recorded without a post: what "said after it" counts from.
    pub(crate) accepted_at: u64,
}
