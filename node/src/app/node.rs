//! `Node`: one bot's bridge node — its state, its listeners, its lifecycle.
//!
//! Data takes one path through a node: ingress (bridge or local API) → transcript
//! (durable, deduplicated) → the turn-taking pipeline (`turn`) → reply → egress (the
//! peers' outboxes). Shutdown has three steps, as in linkerd2-proxy: the signal
//! cancels `accepting` (listeners stop, pending turns are abandoned), outboxes get a
//! grace period to drain, then everything stops and the transcript writer flushes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::NodeConfig;
use crate::egress::acks::{AckTracker, ClaimAcks};
use crate::egress::outbox::{Outbox, RetryPolicy};
use crate::egress::relay::Relay;
use crate::egress::stream::StreamLink;
use crate::ingress::ingest::{Arrival, Ingest, Sink, Source};
use crate::ingress::limiter::RateLimiter;
use crate::ingress::seen::SeenCache;
use crate::ingress::server::{self, Body, Limits};
use crate::ingress::verify_pool::VerifyPool;
use crate::llm::LlmClient;
use crate::platform::ChatPlatform;
use crate::store::transcript::{Appended, Received, TranscriptError, Transcripts};
use crate::store::turn_queries::RateCount;
use crate::telemetry::events::{Event, EventBus};
use crate::telemetry::metrics::Metrics;
use crate::turn::ports::GroupLog;
use crate::turn::{Brain, Llm, Ports};
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

/// Hands durable outbound messages to every peer's outbox, in log order.
struct PeerFanout {
    outboxes: Vec<Arc<Outbox>>,
    metrics: Arc<Metrics>,
}

impl crate::store::outbox_log::Fanout for PeerFanout {
    fn push(&self, entry: crate::store::outbox_log::LoggedOutbound) {
        for o in &self.outboxes {
            o.push_logged(&entry, &self.metrics);
        }
    }
    fn delivered_through(&self) -> u64 {
        self.outboxes
            .iter()
            .map(|o| o.handled())
            .min()
            .unwrap_or(u64::MAX - 1)
    }
}

/// A started node: its addresses and the handle to stop it.
pub struct RunningNode {
    /// The shared state (for tests and embedding).
    pub node: Arc<Node>,
    /// Where the peer-facing listener is bound.
    pub(crate) bridge_addr: std::net::SocketAddr,
    /// Where the local API is bound.
    pub api_addr: std::net::SocketAddr,
    stop_outboxes: CancellationToken,
    servers: JoinSet<()>,
    outbox_tasks: JoinSet<()>,
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

/// Builds the node and starts its listeners and outboxes.
pub async fn start(
    cfg: NodeConfig,
    bridge: TcpListener,
    api: TcpListener,
) -> anyhow::Result<RunningNode> {
    let cfg = Arc::new(cfg);
    let metrics = Arc::new(Metrics::new());
    let events = EventBus::new(1024);
    let outbox_dir = create_data_dirs(&cfg)?;
    let stream = open_stream(&cfg, &metrics)?;
    let acks = Arc::new(AckTracker::default());
    let outboxes = open_outboxes(&cfg, &outbox_dir, stream.as_ref(), &acks);
    let transcripts = resume_from_log(&cfg, &outboxes, &metrics, &events)?;
    let http = peer_http_client(&cfg)?;
    let relay = build_relay(&cfg, &outboxes, &http, &metrics);
    let mut brain = Brain::new(&cfg, metrics.clone(), crate::platform::registry::member_ids)?;
    let tool_tokens = Arc::new(crate::app::group_tools::ToolTokens::new(&cfg.bot().name));
    let model_mesh =
        crate::app::group_tools::model_mesh_server(&cfg, api.local_addr()?, &tool_tokens);
    let mesh_server =
        crate::app::group_tools::mesh_server(&cfg, api.local_addr()?, tool_tokens.clone());
    let questions = brain.start_engine(&cfg, model_mesh, mesh_server).await?;
    let verdicts = crate::store::verdicts::VerdictLog::open(&cfg.data_dir, metrics.clone())
        .with_context(|| format!("opening the verdict log in {}", cfg.data_dir.display()))?;
    let platform = crate::platform::build(&cfg)?;
    let verify = Arc::new(
        VerifyPool::start(&cfg.bot().name).context("starting the signature verification thread")?,
    );
    let llm = LlmClient::new(
        LlmClient::build_http(Duration::from_secs(3)).context("building the LLM client")?,
    );
    let a2a = crate::app::a2a_edge::server_of(&cfg)?;
    let node = Arc::new_cyclic(|me| Node {
        me: me.clone(),
        a2a,
        limiter: Arc::new(RateLimiter::new(cfg.mesh().peer_rate_limit)),
        seen: Arc::new(SeenCache::new(SEEN_TTL, 1_000_000)),
        verify,
        llm,
        quiet: crate::turn::control::Quiet::new(cfg.bot().quiet),
        reloader: crate::app::reload::Reloader::new(cfg.clone()),
        accepting: CancellationToken::new(),
        turns: tokio_util::task::TaskTracker::new(),
        outboxes,
        transcripts,
        verdicts,
        events,
        metrics,
        brain,
        platform,
        stream,
        relay: Some(relay),
        acks,
        tool_tokens,
        cfg,
    });
    if let Some(questions) = questions {
        tokio::spawn(crate::app::commands::post_questions(
            node.clone(),
            questions,
        ));
    }
    let ingest = ingest_for(&node);
    let (stop_outboxes, outbox_tasks) = spawn_outboxes(&node, &http);
    let bridge_addr = bridge.local_addr()?;
    let api_addr = api.local_addr()?;
    let servers = spawn_listeners(&node, ingest, bridge, api);
    tracing::info!(bot = %node.cfg.bot().name, transport = ?node.cfg.transport(), %bridge_addr, %api_addr, peers = node.outboxes.len(), data_dir = %node.cfg.data_dir.display(), "node started");
    match &node.cfg.mesh().operators {
        None => {
            tracing::warn!(bot = %node.cfg.bot().name, "[mesh] operators is not set: anyone in any group may /quiet, /resume and /stop this bot, and only the person whose message started an agent's turn may /allow or /deny its tool calls")
        }
        Some(ops) => {
            tracing::info!(bot = %node.cfg.bot().name, operators = ?ops, "only these people's /quiet, /resume and /stop are carried out; they, and the person whose message started an agent's turn, may /allow or /deny its tool calls")
        }
    }
    Ok(RunningNode {
        node,
        bridge_addr,
        api_addr,
        stop_outboxes,
        servers,
        outbox_tasks,
    })
}

/// Creates the data folder and its `outbox` folder (the peers' cursors); returns the
/// latter.
fn create_data_dirs(cfg: &NodeConfig) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("creating data folder {}", cfg.data_dir.display()))?;
    let outbox_dir = cfg.data_dir.join("outbox");
    std::fs::create_dir_all(&outbox_dir)
        .with_context(|| format!("creating {}", outbox_dir.display()))?;
    Ok(outbox_dir)
}

/// The Redis Streams link, when this bot's transport is `redis`.
fn open_stream(
    cfg: &NodeConfig,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<Arc<StreamLink>>> {
    Ok(match &cfg.redis_url {
        Some(url) => Some(StreamLink::new(
            url,
            cfg.settings.redis.clone(),
            metrics.clone(),
        )?),
        None => None,
    })
}

/// One outbox per HTTP peer, plus one for the stream when there is one (peers on the
/// stream are reached by one append), each with its cursor file, the claim tracker,
/// the outbox log and the batch size.
fn open_outboxes(
    cfg: &NodeConfig,
    outbox_dir: &Path,
    stream: Option<&Arc<StreamLink>>,
    acks: &Arc<AckTracker>,
) -> Vec<Arc<Outbox>> {
    let mut outboxes: Vec<Arc<Outbox>> = cfg
        .peers()
        .filter(|p| !cfg.via_stream(p))
        .map(|p| {
            // An older version's cursor under a long readable name is kept (stored_path):
            // a missing cursor would take the peer for new and skip what it is owed.
            let cursor = crate::store::file_names::stored_path(outbox_dir, &p.name, "cursor");
            Outbox::new(
                &p.name,
                &p.bridge_base_url(),
                cfg.mesh().outbox_capacity,
                Some(cursor),
            )
        })
        .collect();
    if let Some(link) = stream {
        outboxes.push(Outbox::with_transport(
            STREAM_OUTBOX,
            Arc::new(crate::egress::transport::StreamTransport(link.clone())),
            cfg.mesh().outbox_capacity,
            Some(crate::store::file_names::stored_path(
                outbox_dir,
                STREAM_OUTBOX,
                "cursor",
            )),
        ));
    }
    for o in &outboxes {
        o.set_acks(acks.clone());
        o.set_log_path(cfg.data_dir.join(crate::store::outbox_log::OUTBOX_LOG));
        o.set_batch_max(cfg.mesh().batch_max);
    }
    outboxes
}

/// Opens the transcripts (their writer fans durable outbound messages out to the
/// outboxes) and hands each outbox what the outbox log holds past its saved cursor.
fn resume_from_log(
    cfg: &NodeConfig,
    outboxes: &[Arc<Outbox>],
    metrics: &Arc<Metrics>,
    events: &EventBus,
) -> anyhow::Result<Transcripts> {
    let cursors: Vec<Option<u64>> = outboxes.iter().map(|o| o.saved_cursor()).collect();
    let min_next_seq = cursors.iter().flatten().max().map(|c| c + 1).unwrap_or(1);
    let fanout = Arc::new(PeerFanout {
        outboxes: outboxes.to_vec(),
        metrics: metrics.clone(),
    });
    let (transcripts, report, logged) = Transcripts::open(
        &cfg.data_dir,
        events.clone(),
        true,
        fanout,
        min_next_seq,
        crate::store::transcript::TranscriptLimits {
            max_groups: cfg.mesh().max_groups,
            max_open_files: cfg.mesh().max_open_transcripts,
        },
    )
    .with_context(|| format!("opening transcripts in {}", cfg.data_dir.display()))?;
    tracing::info!(
        groups = report.groups,
        messages = report.messages,
        dropped_lines = report.dropped_lines,
        "transcripts restored"
    );
    for (o, cursor) in outboxes.iter().zip(cursors) {
        // A peer without a cursor is new to this node: it starts from now, not from history.
        let saved = cursor.is_some();
        let cursor =
            cursor.unwrap_or_else(|| logged.last().map(|e| e.seq).unwrap_or(min_next_seq - 1));
        o.set_handled(cursor, saved);
        if !saved {
            // Written before anything is accepted, not at the first delivery: were the
            // node killed before that, the next start would take the peer for new
            // again and skip what it is owed.
            o.save_cursor();
        }
        let resend: Vec<_> = logged.iter().filter(|e| e.seq > cursor).collect();
        if !resend.is_empty() {
            tracing::info!(peer = %o.peer(), envelopes = resend.len(), "resuming undelivered envelopes from the outbox log");
        }
        for e in resend {
            o.push_logged(e, metrics);
        }
    }
    Ok(transcripts)
}

/// The HTTP client every outbox and the relay send to peers with.
fn peer_http_client(cfg: &NodeConfig) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_millis(cfg.mesh().peer_timeout_ms))
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .context("building the peer HTTP client")
}

/// The relay around broken links, over every HTTP peer, set on their outboxes (the
/// stream has no relay: Redis is the relay).
fn build_relay(
    cfg: &NodeConfig,
    outboxes: &[Arc<Outbox>],
    http: &reqwest::Client,
    metrics: &Arc<Metrics>,
) -> Arc<Relay> {
    let relay = Arc::new(Relay::new(
        Duration::from_millis(cfg.mesh().relay_after_ms),
        outboxes
            .iter()
            .filter_map(|o| {
                let p = cfg.member(o.peer())?;
                o.url()?;
                Some((p.name.clone(), p.bridge_base_url(), o.link().clone()))
            })
            .collect(),
        http.clone(),
        cfg.verifier.clone(),
        metrics.clone(),
        Duration::from_millis(cfg.mesh().peer_timeout_ms),
    ));
    for o in outboxes.iter().filter(|o| o.url().is_some()) {
        o.set_relay(relay.clone());
    }
    relay
}

/// The narrow handle every inbound path (bridge, stream reader, platform) admits
/// messages through.
fn ingest_for(node: &Arc<Node>) -> Ingest {
    Ingest {
        cfg: node.cfg.clone(),
        metrics: node.metrics.clone(),
        seen: node.seen.clone(),
        limiter: node.limiter.clone(),
        verify: node.verify.clone(),
        relay: node.relay.clone(),
        humans: Arc::new(crate::platform::human_rules(&node.cfg)),
        accepting: node.accepting.clone(),
        tasks: node.turns.clone(),
        sink: Arc::new(NodeSink(node.clone())),
    }
}

/// Starts every outbox's delivery task; returns the token that stops them and the
/// tasks.
fn spawn_outboxes(node: &Arc<Node>, http: &reqwest::Client) -> (CancellationToken, JoinSet<()>) {
    let policy = RetryPolicy {
        base: node.cfg.retry_base(),
        max: Duration::from_millis(node.cfg.mesh().retry_max_ms),
        give_up_after: Duration::from_secs(node.cfg.mesh().give_up_after_secs),
        attempt_timeout: Duration::from_millis(node.cfg.mesh().peer_timeout_ms),
    };
    let stop_outboxes = CancellationToken::new();
    let mut outbox_tasks = JoinSet::new();
    let shared_signer = Arc::new(crate::egress::outbox::SharedSigner {
        signer: node.cfg.signer.clone(),
        cache: Default::default(),
    });
    for o in &node.outboxes {
        node.metrics.set_outbox_depth(o.peer(), 0);
        outbox_tasks.spawn(o.clone().run(
            http.clone(),
            shared_signer.clone(),
            node.metrics.clone(),
            policy,
            stop_outboxes.clone(),
        ));
    }
    (stop_outboxes, outbox_tasks)
}

/// Serves the peer-facing listener and the local API, and starts the stream reader
/// and the platform's own task when there are any.
fn spawn_listeners(
    node: &Arc<Node>,
    ingest: Ingest,
    bridge: TcpListener,
    api: TcpListener,
) -> JoinSet<()> {
    let grace = Duration::from_secs(node.cfg.mesh().shutdown_grace_secs);
    let mesh = node.cfg.mesh();
    let limits = Limits {
        max_connections: mesh.max_connections,
        header_timeout: Duration::from_millis(mesh.header_timeout_ms),
        body_timeout: Duration::from_millis(mesh.body_timeout_ms),
        per_source: None,
    };
    let mut servers = JoinSet::new();
    let (n, i) = (node.clone(), ingest.clone());
    servers.spawn(server::serve(
        "bridge",
        bridge,
        Limits {
            // Peers and platforms each come from their own address; the local API's
            // clients all come from the host itself.
            per_source: Some(mesh.max_connections_per_source.min(mesh.max_connections)),
            ..limits
        },
        node.metrics.clone(),
        node.accepting.clone(),
        grace,
        move |req, remote| peer_listener(n.clone(), i.clone(), req, remote),
    ));
    let n = node.clone();
    servers.spawn(server::serve(
        "api",
        api,
        limits,
        node.metrics.clone(),
        node.accepting.clone(),
        grace,
        move |req, remote| crate::app::api::handle(n.clone(), req, remote),
    ));
    if let Some(link) = node.stream.clone() {
        servers.spawn(crate::ingress::stream::run_reader(
            ingest.clone(),
            link,
            node.accepting.clone(),
        ));
    }
    if let Some(task) = node
        .platform
        .clone()
        .start(crate::platform::AdapterContext::of(&ingest))
    {
        servers.spawn(task);
    }
    servers
}

impl RunningNode {
    /// Stops the node: stop accepting, drain outboxes within the grace period, flush.
    pub async fn shutdown(mut self) {
        let grace = Duration::from_secs(self.node.cfg.mesh().shutdown_grace_secs);
        tracing::info!("shutting down: no longer accepting messages");
        self.node.accepting.cancel();
        self.node.turns.close();
        let _ = tokio::time::timeout(grace, self.node.turns.wait()).await;
        self.node.brain.engine.stop().await;
        let deadline = tokio::time::Instant::now() + grace;
        while self.node.outboxes.iter().any(|o| !o.is_empty())
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for o in &self.node.outboxes {
            if !o.is_empty() {
                tracing::error!(peer = %o.peer(), undelivered = o.len(), "shutdown grace over: envelopes still undelivered to this peer");
            }
        }
        self.stop_outboxes.cancel();
        while self.outbox_tasks.join_next().await.is_some() {}
        for o in &self.node.outboxes {
            o.save_cursor();
        }
        while self.servers.join_next().await.is_some() {}
        self.node.transcripts.close();
        self.node.verdicts.close();
        tracing::info!("stopped");
    }
}

/// Runs a node until `signal` completes, then shuts it down gracefully. `SIGHUP`
/// reloads the configuration file; with `watch`, so does a change of the file
/// (checked that often).
pub async fn run(
    cfg: NodeConfig,
    bridge: TcpListener,
    api: TcpListener,
    signal: impl std::future::Future<Output = ()>,
    watch: Option<Duration>,
) -> anyhow::Result<()> {
    // Listening for SIGHUP before the listeners open, so that no SIGHUP sent to a
    // node that answers can end it (the signal's default action).
    #[cfg(unix)]
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    let running = start(cfg, bridge, api).await?;
    #[cfg(unix)]
    match hup {
        Ok(hup) => {
            tokio::spawn(crate::app::reload::on_sighup(running.node.clone(), hup));
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; reload with POST /v1/reload")
        }
    }
    if let Some(every) = watch {
        tokio::spawn(crate::app::reload::watch(running.node.clone(), every));
    }
    eprintln!(
        "botmesh: {} is up — page http://{}/  bridge http://{}",
        running.node.cfg.bot().name,
        running.api_addr,
        running.bridge_addr
    );
    signal.await;
    running.shutdown().await;
    Ok(())
}

/// Routes a request on the peer-facing listener: the bridge, the platform's
/// callbacks, and `/healthz`.
async fn peer_listener(
    node: Arc<Node>,
    ingest: Ingest,
    req: Request<Incoming>,
    remote: std::net::SocketAddr,
) -> Response<Body> {
    use crate::ingress::bridge;
    use crate::wire::batch::BATCH_PATH;
    use crate::wire::limits::ENVELOPES_PATH;
    let path = req.uri().path();
    if req.method() == Method::POST && node.platform.webhook_path() == Some(path) {
        return node.platform.clone().webhook(req, remote).await;
    }
    if let Some(refused) =
        crate::platform::callback_elsewhere(req.method(), path, &node.metrics, remote)
    {
        return refused;
    }
    match (req.method(), path) {
        (&Method::POST, ENVELOPES_PATH) => bridge::receive(ingest, req, remote).await,
        (&Method::POST, BATCH_PATH) => bridge::receive_batch(ingest, req, remote).await,
        (&Method::GET, "/healthz") => crate::app::api::health(&node),
        (_, ENVELOPES_PATH | BATCH_PATH) => {
            server::error(StatusCode::METHOD_NOT_ALLOWED, "use POST")
        }
        _ => server::error(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

/// The node as ingress sees it ([`Sink`]): it records, and starts turns.
struct NodeSink(Arc<Node>);

impl Sink for NodeSink {
    fn record_many(
        &self,
        envs: Vec<Received>,
        source: Source,
    ) -> BoxFuture<'_, Vec<Result<Appended, TranscriptError>>> {
        Box::pin(self.0.record_many(envs, source))
    }

    fn arrive(&self, arrival: Arrival) -> BoxFuture<'_, Result<Appended, TranscriptError>> {
        // The platform's own declaration decides: only where people's messages do not
        // reach every bot does this node carry them (see `platform::human_rules`).
        let forward =
            arrival.env.is_human() && !self.0.platform.visibility().humans_reach_every_bot;
        Box::pin(self.0.record_with_mentions(
            arrival.env,
            arrival.source,
            arrival.mentions,
            forward,
        ))
    }

    fn on_claim(&self, env: Arc<Envelope>) {
        self.0.on_claim(env);
    }

    fn answer_claim(&self, env: &Envelope) -> crate::wire::batch::ClaimReply {
        // A claim on a person's message (depth 0) from a platform whose people never
        // reach this node: this node will never judge it, so it is not "judging" (the
        // claimant would wait judge_word_timeout_ms for a word that never comes).
        let claimant = self.0.cfg.member(&env.sender).map(|b| b.platform);
        if env.depth == 0
            && claimant
                .is_some_and(|c| !crate::platform::sees_humans_of(self.0.cfg.bot().platform, c))
        {
            return crate::wire::batch::ClaimReply::default();
        }
        self.0.brain.answer_claim(env)
    }

    fn has_platform_msg(&self, group: &str, platform_msg_id: &str) -> bool {
        self.0
            .transcripts
            .contains(group, &ulid::Ulid::nil(), Some(platform_msg_id))
    }

    fn await_platform_msg<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        within: std::time::Duration,
    ) -> BoxFuture<'a, bool> {
        let events = self.0.events.subscribe();
        Box::pin(crate::ingress::ingest::recorded_within(
            events,
            move || self.has_platform_msg(group, platform_msg_id),
            group,
            platform_msg_id,
            within,
        ))
    }

    fn message(&self, group: &str, id: &ulid::Ulid) -> Option<Arc<Envelope>> {
        self.0.transcripts.get(group, id)
    }
}

/// The node's transcript store as the turn code reads it.
impl GroupLog for Node {
    fn recent(&self, group: &str, limit: usize) -> Vec<Arc<Envelope>> {
        conversation(self.transcripts.recent(group, limit))
    }

    fn since(&self, group: &str, id: &ulid::Ulid) -> Vec<Arc<Envelope>> {
        conversation(self.transcripts.since(group, id))
    }

    fn status_ends(&self, group: &str, limit: usize) -> Vec<Arc<Envelope>> {
        let mut recent = self.transcripts.recent(group, limit);
        recent.retain(|e| e.replaces.is_some());
        recent
    }

    fn rate_count(&self, group: &str, count: &RateCount<'_>) -> (usize, usize) {
        self.transcripts.rate_count(group, count)
    }
}

/// The node as the turn code sees it ([`Ports`]).
impl Ports for Node {
    fn brain(&self) -> &Brain {
        &self.brain
    }

    fn mesh(&self) -> Arc<crate::config::MeshSettings> {
        self.brain.tuning().mesh.clone()
    }

    fn llm(&self) -> &dyn Llm {
        &self.llm
    }

    fn now_millis(&self) -> u64 {
        crate::wire::envelope::now_millis()
    }

    fn new_id(&self) -> ulid::Ulid {
        ulid::Ulid::new()
    }

    fn jitter_ms(&self, max_ms: u64) -> u64 {
        use rand::Rng;
        if max_ms == 0 {
            0
        } else {
            rand::thread_rng().gen_range(0..=max_ms)
        }
    }

    fn link_failing_for(&self, peer: &str) -> Option<Duration> {
        self.outboxes
            .iter()
            .find(|o| o.peer() == peer)
            .and_then(|o| o.link().failing_for())
    }

    fn quiet(&self, group: &str) -> bool {
        self.quiet.in_group(group)
    }

    fn stopping(&self) -> &CancellationToken {
        &self.accepting
    }

    fn broadcast(&self, env: &Envelope) {
        Node::broadcast(self, env);
    }

    fn send_to(&self, peers: &[String], env: &Envelope) {
        let body = Bytes::from(env.to_bytes());
        let id = env.id.to_string();
        // A peer on the Redis stream has no outbox of its own: the stream carries the
        // envelope to every stream peer.
        let mut via_stream = false;
        for peer in peers {
            match self.outboxes.iter().find(|o| o.peer() == peer.as_str()) {
                Some(o) => {
                    let _ = o.push(&id, body.clone(), None, &self.metrics);
                }
                None => via_stream = true,
            }
        }
        if via_stream {
            if let Some(o) = self.outboxes.iter().find(|o| o.peer() == STREAM_OUTBOX) {
                let _ = o.push(&id, body, None, &self.metrics);
            }
        }
    }

    fn broadcast_tracked(&self, env: &Envelope) -> ClaimAcks {
        Node::broadcast_tracked(self, env)
    }

    fn publish(self: Arc<Self>, env: Envelope) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async move {
            Node::publish(&self, env, "self")
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    fn event(&self, event: Event) {
        self.events.publish(event);
    }

    fn watched(&self) -> bool {
        self.events.watched()
    }

    fn typing<'a>(&'a self, group: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.platform.typing(group).await {
                tracing::warn!(bot = %self.cfg.bot().name, group, error = %e, "could not show the typing signal");
            }
        })
    }

    fn typing_every(&self) -> Option<Duration> {
        self.platform.typing_every()
    }

    fn sees_my_humans(&self, bot: &crate::config::BotSettings) -> bool {
        crate::platform::sees_humans_of(bot.platform, self.cfg.bot().platform)
    }

    fn judged(&self, record: crate::store::verdicts::VerdictRecord) {
        self.verdicts.append(record);
    }

    fn status_port(&self) -> Option<Arc<dyn crate::turn::status::StatusPort>> {
        let node = self.me.upgrade()?;
        Some(Arc::new(crate::app::status::NodeStatus(node)))
    }
}

/// What the turn code reads of a transcript: its conversation, without the bots'
/// status messages (never put in a prompt, judged or answered).
fn conversation(mut messages: Vec<Arc<Envelope>>) -> Vec<Arc<Envelope>> {
    messages.retain(|e| e.kind != crate::wire::envelope::Kind::Status);
    messages
}

/// Explain against a running node's live transcript.
pub(crate) async fn explain_live(
    node: &Node,
    req: crate::turn::ExplainRequest,
) -> Result<serde_json::Value, String> {
    let group = req
        .group
        .clone()
        .unwrap_or_else(|| node.cfg.mesh().group.clone());
    let recent = node.transcripts.recent(&group, 64);
    let e = crate::turn::explain(
        &node.brain,
        &node.llm,
        &node.cfg,
        req,
        &recent,
        node.quiet.in_group(&group),
    )
    .await?;
    Ok(serde_json::to_value(e).expect("serializes"))
}
