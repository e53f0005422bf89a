//! The local API: the page, `POST /v1/messages`, transcript, events, health, metrics,
//! explain, quiet, reload and replay (the page's "what if" panel), and the group tools
//! (`/v1/tools/…`, `app::group_tools`). Bound to 127.0.0.1 by default; when bound elsewhere every request
//! needs `Authorization: Bearer <token>` (or `?token=` for the page and its stream).
//! Every request passes [`crate::app::gate`] first (`Host`, `Origin`, token and scope).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use serde::Deserialize;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use ulid::Ulid;

use crate::app::gate::{self, Scope};
use crate::app::node::Node;
use crate::config::Platform;
use crate::ingress::server::{self, Body, BodyError};
use crate::store::transcript::{Appended, TranscriptError, MEMORY_MESSAGES};
use crate::wire::envelope::{
    next_depth, now_millis, Author, AuthorKind, Envelope, Why, MAX_TEXT_BYTES,
};
use crate::wire::limits::MAX_NAME_BYTES;

/// Largest request body on the local API.
const MAX_API_BODY: usize = 256 * 1024;

/// The embedded group-chat page.
pub(crate) const PAGE: &str = include_str!("page.html");

/// Brings the cache-size gauges and outbox depths up to date. Read at scrape time
/// rather than on every change: each is one lock and a length, and scrapes are rare.
fn refresh_cache_sizes(node: &Node) {
    let m = &node.metrics;
    m.set_cache_entries("seen_ids", node.seen.len());
    m.set_cache_entries("transcript_ids", node.transcripts.indexed_ids());
    m.set_cache_entries("transcript_groups", node.transcripts.groups());
    m.set_cache_entries("transcript_files_open", node.transcripts.open_files());
    m.set_cache_entries("rate_limiter_buckets", node.limiter.buckets());
    m.set_cache_entries("claim_triggers", node.brain.board.len());
    m.set_cache_entries("decision_trail", node.brain.trail.len());
    m.set_cache_entries("stop_tokens", node.brain.stops.len());
    for (cache, entries) in node.platform.cache_sizes() {
        m.set_cache_entries(cache, entries);
    }
    for o in &node.outboxes {
        m.set_outbox_depth(o.peer(), o.len());
    }
    if let Some(b) = budget(node) {
        for (kind, n) in [("calls", b.calls), ("tokens", b.tokens)] {
            m.budget_spent
                .get_or_create(&crate::telemetry::metrics::KindLabel { kind: kind.into() })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

/// Routes a local API request.
pub(crate) async fn handle(
    node: Arc<Node>,
    req: Request<Incoming>,
    _remote: SocketAddr,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let scope = match gate::admit(&node.cfg, &node.metrics, &node.tool_tokens, &req) {
        Ok(scope) => scope,
        Err(refusal) => {
            let mut answer = refusal.answer();
            gate::harden(&mut answer);
            return answer;
        }
    };
    if method == Method::POST {
        if let Some(mut refusal) = gate::content_type_refusal(req.headers(), &method, &path, false)
        {
            gate::harden(&mut refusal);
            return count(&node, refusal);
        }
    }
    let resp = match (&method, path.as_str()) {
        (&Method::GET, "/") => server::text(StatusCode::OK, "text/html; charset=utf-8", PAGE),
        (&Method::GET, crate::a2a::card::CARD_PATH) => crate::app::a2a_edge::card(&node, &req),
        (&Method::POST, crate::a2a::card::RPC_PATH) => crate::app::a2a_edge::rpc(&node, req).await,
        (&Method::POST, "/v1/messages") => post_message(&node, req, scope).await,
        (&Method::POST, p) if p.starts_with("/v1/tools/") => {
            let tool = p["/v1/tools/".len()..].to_string();
            crate::app::group_tools::handle(&node, &tool, req, &scope).await
        }
        (&Method::GET, "/v1/transcript") => transcript(&node, &req),
        (&Method::GET, "/v1/events") => events(&node, &req),
        (&Method::GET, "/v1/info") => info(&node),
        (&Method::POST, "/v1/explain") => explain(&node, req).await,
        (&Method::POST, "/v1/quiet") => quiet(&node, req).await,
        (&Method::POST, "/v1/reload") => reload(&node),
        (&Method::POST, "/v1/replay") => replay(&node, req).await,
        (&Method::GET, "/healthz") => health(&node),
        (&Method::GET, "/metrics") => {
            refresh_cache_sizes(&node);
            // prometheus-client's text encoder writes OpenMetrics 1.0 (`# EOF`, counter
            // families named without `_total`): say so, or scrapers parse it as 0.0.4.
            server::text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                node.metrics.render(),
            )
        }
        (
            _,
            "/"
            | "/v1/messages"
            | "/v1/transcript"
            | "/v1/events"
            | "/v1/explain"
            | "/v1/quiet"
            | "/v1/reload"
            | "/v1/replay"
            | "/healthz"
            | "/metrics"
            | crate::a2a::card::CARD_PATH
            | crate::a2a::card::RPC_PATH,
        ) => server::error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}"),
        ),
        _ => server::error(StatusCode::NOT_FOUND, "no such endpoint"),
    };
    let mut resp = resp;
    gate::harden(&mut resp);
    count(&node, resp)
}

/// Counts an answer in `botmesh_api_requests` by its status code.
fn count(node: &Node, resp: Response<Body>) -> Response<Body> {
    let code = resp.status().as_u16().to_string();
    node.metrics
        .api_requests
        .get_or_create(&crate::telemetry::metrics::ResultLabel { result: code })
        .inc();
    resp
}

/// Reads a JSON body; one not declared `application/json` is refused (415, see
/// [`gate::content_type_refusal`]).
pub(crate) async fn read_json<T: for<'de> Deserialize<'de>>(
    req: Request<Incoming>,
) -> Result<T, Response<Body>> {
    if let Some(refusal) =
        gate::content_type_refusal(req.headers(), req.method(), req.uri().path(), true)
    {
        return Err(refusal);
    }
    let (_, body) = server::read_body(req, MAX_API_BODY)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { .. } => server::error(StatusCode::PAYLOAD_TOO_LARGE, e),
            BodyError::Read(_) => server::error(StatusCode::BAD_REQUEST, e),
        })?;
    serde_json::from_slice(&body)
        .map_err(|e| server::error(StatusCode::BAD_REQUEST, format!("bad JSON: {e}")))
}

/// `POST /v1/messages` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostMessage {
    /// Defaults to `[mesh].group`.
    group: Option<String>,
    /// The message.
    text: String,
    /// A human's name, or this bot's own name (sidecar posting as the bot).
    from: Option<String>,
    /// The message this answers (sidecar replies); sets the depth.
    reply_to: Option<Ulid>,
    /// Platform message id, when the text also exists on a platform.
    platform_msg_id: Option<String>,
}

async fn post_message(node: &Arc<Node>, req: Request<Incoming>, scope: Scope) -> Response<Body> {
    let p: PostMessage = match read_json(req).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let me = &node.cfg.bot().name;
    if scope == Scope::Sidecar && p.from.as_deref().map(str::trim) != Some(me.as_str()) {
        return server::error(
            StatusCode::FORBIDDEN,
            format!("a sidecar's token posts only as its bot: \"from\" must be {me:?}"),
        );
    }
    if node.accepting.is_cancelled() {
        return server::error(StatusCode::SERVICE_UNAVAILABLE, "node is shutting down");
    }
    match build_local_message(node, p) {
        Ok(env) => match node.publish(env.clone(), "api").await {
            Ok(Appended::New) => server::json(
                StatusCode::OK,
                &serde_json::json!({"id": env.id.to_string(), "group": env.group, "depth": env.depth}),
            ),
            Ok(Appended::Duplicate) => server::json(
                StatusCode::OK,
                &serde_json::json!({"duplicate": true, "group": env.group}),
            ),
            // The node is full of groups: retrying will not help, raising max_groups will.
            Err(e @ TranscriptError::TooManyGroups { .. }) => {
                server::error(StatusCode::INSUFFICIENT_STORAGE, e)
            }
            Err(e) => server::error(StatusCode::SERVICE_UNAVAILABLE, e),
        },
        Err((status, why)) => server::error(status, why),
    }
}

/// Turns a local post into an envelope, enforcing who may post what.
fn build_local_message(node: &Node, p: PostMessage) -> Result<Envelope, (StatusCode, String)> {
    let cfg = &node.cfg;
    let me = cfg.bot();
    if p.text.trim().is_empty() {
        return Err((StatusCode::BAD_REQUEST, "text must not be empty".into()));
    }
    if p.text.len() > MAX_TEXT_BYTES {
        return Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("text over {MAX_TEXT_BYTES} bytes"),
        ));
    }
    let group = p.group.unwrap_or_else(|| cfg.mesh().group.clone());
    if group.is_empty() || group.len() > 256 {
        return Err((
            StatusCode::BAD_REQUEST,
            "group must be 1..=256 bytes".into(),
        ));
    }
    let from = p
        .from
        .map(|f| f.trim().to_string())
        .filter(|f| !f.is_empty());
    let as_bot = from.as_deref().is_some_and(|f| f == me.name);
    if let Some(f) = &from {
        if f.starts_with(crate::config::a2a::CALLER_PREFIX) {
            return Err((
                StatusCode::FORBIDDEN,
                format!("{f:?}: names starting with {:?} are A2A callers', which only the A2A endpoint posts as", crate::config::a2a::CALLER_PREFIX),
            ));
        }
        if let Some(bot) = cfg.bot_named_like(f).filter(|_| !as_bot) {
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "{f:?} reads as bot {:?}'s name (case, width and invisible characters aside): a node may only post as itself or a human",
                    bot.name
                ),
            ));
        }
        if f.len() > MAX_NAME_BYTES {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("from must be at most {MAX_NAME_BYTES} bytes"),
            ));
        }
    }
    let parent = match p.reply_to {
        Some(id) => Some(node.transcripts.get(&group, &id).ok_or((
            StatusCode::BAD_REQUEST,
            format!("reply_to {id} is not in group {group:?}"),
        ))?),
        None => None,
    };
    let (author, depth, why) = if as_bot {
        // A bot's own message continues the exchange: one deeper than what it answers,
        // or than the latest message when it answers nothing in particular.
        let base = parent
            .clone()
            .or_else(|| node.transcripts.recent(&group, 1).pop());
        let depth = base.map_or(1, |e| next_depth(e.depth));
        (
            Author {
                name: me.name.clone(),
                kind: AuthorKind::Bot,
            },
            depth,
            Some(Why::Posted),
        )
    } else {
        if me.platform != Platform::LOCAL {
            return Err((
                StatusCode::FORBIDDEN,
                "this bot's humans are on its platform; post there".into(),
            ));
        }
        (
            Author {
                name: from.unwrap_or_else(|| "human".into()),
                kind: AuthorKind::Human,
            },
            0,
            None,
        )
    };
    let id = Ulid::new();
    let root = match (&author.kind, &parent) {
        (AuthorKind::Human, _) => Some(id),
        (_, Some(p)) => p.root.or(Some(p.id)),
        _ => None,
    };
    let mut env = Envelope::message(id, now_millis(), group, me.name.clone(), author, p.text);
    env.depth = depth;
    env.reply_to = parent.map(|p| p.id);
    env.root = root;
    env.platform_msg_id = p.platform_msg_id;
    env.why = why;
    Ok(env)
}

fn transcript(node: &Node, req: &Request<Incoming>) -> Response<Body> {
    let group =
        server::query_param(req.uri(), "group").unwrap_or_else(|| node.cfg.mesh().group.clone());
    let limit = match server::query_param(req.uri(), "limit").map(|l| l.parse::<usize>()) {
        None => 50,
        Some(Ok(l)) if (1..=MEMORY_MESSAGES).contains(&l) => l,
        Some(_) => {
            return server::error(
                StatusCode::BAD_REQUEST,
                format!("limit must be 1..={MEMORY_MESSAGES}"),
            )
        }
    };
    // A status as it reads now: its final version folded onto it.
    let messages = crate::app::status::latest_versions(node.transcripts.recent(&group, limit));
    // The agents' latest progress on these messages: the page shows it after a reload.
    let progress: Vec<_> = node
        .events
        .progress(&group)
        .into_iter()
        .filter(|p| messages.iter().any(|m| m.id.to_string() == p.trigger))
        .collect();
    server::json(
        StatusCode::OK,
        &serde_json::json!({"group": group, "messages": messages, "progress": progress}),
    )
}

fn info(node: &Node) -> Response<Body> {
    // As running now: colleague profiles and depth rules may have been reloaded.
    let cfg = &node.reloader.running();
    let bots: Vec<serde_json::Value> = cfg
        .settings
        .bots
        .iter()
        .map(|b| serde_json::json!({"name": b.name, "aliases": b.aliases, "role": b.role, "skills": b.skills}))
        .collect();
    server::json(
        StatusCode::OK,
        &serde_json::json!({"bot": cfg.bot().name, "group": cfg.mesh().group, "bots": bots, "quiet": node.quiet.node(), "quiet_groups": node.quiet.groups(), "max_depth": cfg.mesh().max_depth, "budget": budget(node)}),
    )
}

fn events(node: &Node, req: &Request<Incoming>) -> Response<Body> {
    let group = server::query_param(req.uri(), "group");
    let stop = node.accepting.clone();
    let stream = BroadcastStream::new(node.events.subscribe()).filter_map(move |item| {
        let group = group.clone();
        async move {
            match item {
                Ok(ev) if group.as_deref().is_none_or(|g| g == ev.group()) => {
                    let data = serde_json::to_string(&ev).expect("event serializes");
                    Some(format!("event: {}\ndata: {}\n\n", ev.name(), data))
                }
                Ok(_) => None,
                Err(BroadcastStreamRecvError::Lagged(n)) => {
                    Some(format!("event: lagged\ndata: {{\"missed\":{n}}}\n\n"))
                }
            }
        }
    });
    let keepalive =
        tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(Duration::from_secs(15)))
            .map(|_| ": keep-alive\n\n".to_string());
    let merged = futures_util::stream::select(stream, keepalive)
        .take_until(async move { stop.cancelled().await })
        .map(|s| Ok::<_, Infallible>(Frame::data(Bytes::from(s))));
    let mut r = Response::new(StreamBody::new(merged).boxed_unsync());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// `GET /healthz` on either listener: 200 when serving normally, 503 when degraded
/// (storage, Redis, the platform, or the bot's ACP agent not ready: `agent_not_ready`
/// says why).
pub(crate) fn health(node: &Node) -> Response<Body> {
    let outboxes: serde_json::Map<String, serde_json::Value> = node
        .outboxes
        .iter()
        .map(|o| (o.peer().to_string(), serde_json::json!(o.len())))
        .collect();
    let storage = node.transcripts.health_error();
    let redis = node.stream.as_ref().map(|l| l.health());
    let platform_stopped = node.platform.stopped();
    // A bot whose ACP agent is down (starting again, or never initialized) takes no turns.
    let agent_not_ready = node.brain.engine.not_ready();
    let degraded = storage.is_some()
        || redis.as_ref().is_some_and(|r| !r.connected)
        || platform_stopped.is_some()
        || agent_not_ready.is_some();
    let status = if degraded { "degraded" } else { "ok" };
    let code = if degraded {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    server::json(
        code,
        &serde_json::json!({
            "status": status,
            "bot": node.cfg.bot().name,
            "storage_error": storage,
            "transport": node.cfg.transport(),
            "redis": redis,
            "platform_stopped": platform_stopped,
            "agent_not_ready": agent_not_ready,
            "outboxes": outboxes,
            "quiet": node.quiet.node(),
            "quiet_groups": node.quiet.groups(),
            "seen_cache": node.seen.len(),
            "platform": node.platform.health(),
            "config_reload": node.reloader.last(),
            "budget": budget(node),
            "agent": external_agent(node),
        }),
    )
}

/// For a bot whose turns an outside agent takes (`agent = { external = true }`):
/// whether one is attached (waiting in `wait_for_message`, or was lately) and how
/// many messages addressed to the bot wait for it. `null` for any other bot.
fn external_agent(node: &Node) -> Option<serde_json::Value> {
    (!node.brain.engine.takes_turns()).then(|| {
        serde_json::json!({
            "external": true,
            "attached": node.brain.asks.attached(),
            "waiting_messages": node.brain.asks.waiting_total(),
        })
    })
}

/// Today's LLM use against the daily budget (`null` without limits).
fn budget(node: &Node) -> Option<crate::engine::budget::BudgetStatus> {
    let limits = node.brain.tuning().budget;
    (limits.calls.is_some() || limits.tokens.is_some())
        .then(|| node.brain.budget.status(&limits, now_millis()))
}

/// `POST /v1/reload`: reads the configuration file again (as `SIGHUP` does). 200
/// with what was applied and what waits for a restart; 422 when the file was refused
/// (the running configuration stays).
fn reload(node: &Node) -> Response<Body> {
    match node.reload("api") {
        Ok(r) => server::json(StatusCode::OK, &serde_json::json!(r)),
        Err(r) => server::json(StatusCode::UNPROCESSABLE_ENTITY, &serde_json::json!(r)),
    }
}

async fn explain(node: &Arc<Node>, req: Request<Incoming>) -> Response<Body> {
    let q: crate::turn::ExplainRequest = match read_json(req).await {
        Ok(q) => q,
        Err(r) => return r,
    };
    match crate::app::ports::explain_live(node, q).await {
        Ok(v) => server::json(StatusCode::OK, &v),
        Err(e) => server::error(StatusCode::BAD_REQUEST, e),
    }
}

async fn replay(node: &Arc<Node>, req: Request<Incoming>) -> Response<Body> {
    let q: crate::app::replay::ReplayQuery = match read_json(req).await {
        Ok(q) => q,
        Err(r) => return r,
    };
    match crate::app::replay::replay_live(&node.cfg, q).await {
        Ok(report) => server::json(
            StatusCode::OK,
            &serde_json::to_value(report).expect("a replay report serializes"),
        ),
        Err(e) => server::error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

/// `POST /v1/quiet` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Quiet {
    /// On or off.
    quiet: bool,
    /// Only this group's switch (as a person's `/quiet` there); absent: the
    /// node-wide switch.
    group: Option<String>,
}

async fn quiet(node: &Arc<Node>, req: Request<Incoming>) -> Response<Body> {
    let q: Quiet = match read_json(req).await {
        Ok(q) => q,
        Err(r) => return r,
    };
    let before = match &q.group {
        Some(g) if g.is_empty() || g.len() > 256 => {
            return server::error(StatusCode::BAD_REQUEST, "group must be 1..=256 bytes")
        }
        Some(g) => node.quiet.set_group(g, q.quiet),
        None => node.quiet.set_node(q.quiet),
    };
    tracing::warn!(quiet = q.quiet, was = before, group = ?q.group, "operator quiet switch");
    server::json(
        StatusCode::OK,
        &serde_json::json!({"quiet": q.quiet, "was": before, "group": q.group}),
    )
}
