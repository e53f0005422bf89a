//! A node's lifecycle. [`start`] builds the [`Node`] from its configuration (data
//! folders, transcripts and the outbox log, the peers' outboxes, the relay and the
//! Redis stream, the platform adapter) and starts its two listeners and its outboxes;
//! [`RunningNode::shutdown`] stops it; [`run`] does both around a signal and reloads
//! the configuration on `SIGHUP`.
//!
//! Shutdown has three steps, as in linkerd2-proxy: the signal cancels `accepting`
//! (listeners stop, pending turns are abandoned), outboxes get a grace period to
//! drain, then everything stops and the transcript writer flushes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::node::{Node, SEEN_TTL, STREAM_OUTBOX};
use super::ports::NodeSink;
use crate::config::NodeConfig;
use crate::egress::acks::AckTracker;
use crate::egress::outbox::{Outbox, RetryPolicy};
use crate::egress::relay::Relay;
use crate::egress::stream::StreamLink;
use crate::ingress::ingest::Ingest;
use crate::ingress::limiter::RateLimiter;
use crate::ingress::seen::SeenCache;
use crate::ingress::server::{self, Body, Limits};
use crate::ingress::verify_pool::VerifyPool;
use crate::llm::LlmClient;
use crate::store::transcript::Transcripts;
use crate::telemetry::events::EventBus;
use crate::telemetry::metrics::Metrics;
use crate::turn::Brain;

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
