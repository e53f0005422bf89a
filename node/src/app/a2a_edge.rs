//! The node as an A2A agent (`[[bots]] a2a = { serve = true, … }`, docs/a2a.md): the
//! two routes on the local API — the Agent Card (`GET /.well-known/agent-card.json`,
//! public) and the JSON-RPC endpoint (`POST /a2a`, a caller's bearer token) — and the
//! node's side of `a2a::server`, the [`A2aHost`] it is handed: posting a caller's
//! message into the group, the live events, `/stop`.
//!
//! Who may call: with `callers` set, each caller presents its own token (a missing or
//! wrong one is 401 and nothing is posted); without, anyone who reaches the API, which
//! config allows on loopback only, as the caller `a2a:local`. The local API's own
//! checks (`Host`, `Origin`) apply first, as to every route (`app::gate`).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::a2a::rpc::TaskState;
use crate::a2a::server::{A2aAnswer, A2aHost, A2aServer};
use crate::a2a::tasks::TaskStore;
use crate::app::node::Node;
use crate::config::a2a::{CALLER_PREFIX, LOCAL_CALLER};
use crate::config::NodeConfig;
use crate::ingress::server::{self, Body, BodyError};
use crate::wire::envelope::{now_millis, Author, AuthorKind, Envelope};

/// Whether `path` is one of the A2A routes (served or not: the route says which).
pub(crate) fn is_a2a_path(path: &str) -> bool {
    path == crate::a2a::card::CARD_PATH || path == crate::a2a::card::RPC_PATH
}

/// Largest JSON-RPC request body.
const MAX_RPC_BODY: usize = 256 * 1024;

/// The A2A server of `cfg`'s bot, when it is served (its tasks read back from the
/// data folder).
pub(crate) fn server_of(cfg: &NodeConfig) -> anyhow::Result<Option<Arc<A2aServer>>> {
    let Some(serve) = cfg.bot().a2a.as_ref().filter(|s| s.serve) else {
        return Ok(None);
    };
    let tasks = TaskStore::open(&cfg.data_dir)
        .map_err(|e| anyhow::anyhow!("reading the A2A tasks in {}: {e}", cfg.data_dir.display()))?;
    let group = serve
        .group
        .clone()
        .unwrap_or_else(|| cfg.mesh().group.clone());
    tracing::info!(bot = %cfg.bot().name, %group, callers = cfg.a2a_callers.len(), tasks = tasks.len(), "served as an A2A agent at /a2a");
    Ok(Some(Arc::new(A2aServer::new(group, Arc::new(tasks)))))
}

/// The caller a request's bearer token names: `Some(name)` for a caller's token (or
/// `local` when no callers are set), `None` for a missing or wrong one.
fn caller_of(cfg: &NodeConfig, req: &Request<Incoming>) -> Option<String> {
    if cfg.a2a_callers.is_empty() {
        return Some(LOCAL_CALLER.to_string());
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))?;
    cfg.a2a_callers
        .iter()
        .find(|c| crate::wire::signing::constant_time_eq(given.as_bytes(), c.token.as_bytes()))
        .map(|c| c.name.clone())
}

/// `GET /.well-known/agent-card.json`: the card, its endpoint under `public_url` when
/// one is set, else at the address the caller reached (`http://` and its `Host`, which
/// the gate checked).
pub(crate) fn card(node: &Node, req: &Request<Incoming>) -> Response<Body> {
    if node.a2a.is_none() {
        return server::error(StatusCode::NOT_FOUND, "this bot is not served over A2A");
    }
    let public = node
        .cfg
        .bot()
        .a2a
        .as_ref()
        .and_then(|s| s.public_url.clone());
    let base = public.unwrap_or_else(|| {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map_or_else(|| node.cfg.api_addr.to_string(), str::to_string);
        format!("http://{host}")
    });
    let card =
        crate::a2a::card::agent_card(node.cfg.bot(), &base, !node.cfg.a2a_callers.is_empty());
    server::json(StatusCode::OK, &card)
}

/// `POST /a2a`: one JSON-RPC request from a caller.
pub(crate) async fn rpc(node: &Arc<Node>, req: Request<Incoming>) -> Response<Body> {
    let Some(a2a) = node.a2a.clone() else {
        return server::error(StatusCode::NOT_FOUND, "this bot is not served over A2A");
    };
    let Some(caller) = caller_of(&node.cfg, &req) else {
        tracing::info!(bot = %node.cfg.bot().name, "A2A request refused: missing or wrong bearer token");
        let mut r = server::error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return r;
    };
    if node.accepting.is_cancelled() {
        return server::error(StatusCode::SERVICE_UNAVAILABLE, "node is shutting down");
    }
    // The header, else the query parameter of the same name, as the SDK's server reads it.
    let version = req
        .headers()
        .get(crate::a2a::rpc::VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.trim().is_empty())
        .map(str::to_string)
        .or_else(|| {
            form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
                .find(|(k, _)| k == crate::a2a::rpc::VERSION_HEADER)
                .map(|(_, v)| v.into_owned())
        });
    let body = match server::read_body(req, MAX_RPC_BODY).await {
        Ok((_, body)) => body,
        Err(e @ BodyError::TooLarge { .. }) => {
            return server::error(StatusCode::PAYLOAD_TOO_LARGE, e)
        }
        Err(e @ BodyError::Read(_)) => return server::error(StatusCode::BAD_REQUEST, e),
    };
    let host: Arc<dyn A2aHost> = Arc::new(NodeHost(node.clone()));
    match a2a.handle(host, &caller, version.as_deref(), &body).await {
        A2aAnswer::Json(v) => server::json(StatusCode::OK, &v),
        A2aAnswer::Stream(events) => {
            let frames = events
                .map(|v| Ok::<_, Infallible>(Frame::data(Bytes::from(format!("data: {v}\n\n")))));
            let mut r = Response::new(StreamBody::new(frames).boxed_unsync());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream; charset=utf-8"),
            );
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
    }
}

/// Shows a caller's message `env` in the chat of the bot's platform (Telegram, Slack,
/// …), where people see only what bots post: the bot posts it as the platform shows a
/// relayed speaker, `a2a:hermes: <text>`, in the thread of what it follows up. The
/// platform's id goes on the caller's envelope, so the message is recorded once (the
/// platform's copy is the caller's message, not the bot's) and the bot's answer is
/// posted as a reply to it. `None` on the local platform (the page shows the caller as
/// it is) or when the post failed (logged by the adapter; the group still gets it).
async fn show_in_chat(node: &Node, env: &Envelope) -> Option<String> {
    let me = node.cfg.bot().name.clone();
    let mut shown = Envelope::message(
        env.id,
        env.sent_at,
        env.group.clone(),
        me.clone(),
        Author {
            name: me,
            kind: AuthorKind::Bot,
        },
        format!("{}: {}", env.author.name, env.text),
    );
    shown.reply_to = env.reply_to;
    if !node.platform.should_post(&shown) {
        return None;
    }
    let posted = node.platform.post(&shown).await.ok()?;
    tracing::info!(bot = %node.cfg.bot().name, caller = %env.author.name, id = %env.id, platform = node.platform.name(), "an A2A caller's message shown in the chat, posted by the bot in the caller's name");
    Some(posted)
}

/// The node's side of the A2A endpoint.
struct NodeHost(Arc<Node>);

impl A2aHost for NodeHost {
    fn bot(&self) -> String {
        self.0.cfg.bot().name.clone()
    }

    fn post(
        &self,
        group: String,
        caller: String,
        text: String,
        reply_to: Option<Ulid>,
    ) -> BoxFuture<'_, Result<Ulid, String>> {
        Box::pin(async move {
            let node = &self.0;
            let me = node.cfg.bot().name.clone();
            let id = Ulid::new();
            let author = Author {
                name: format!("{CALLER_PREFIX}{caller}"),
                kind: AuthorKind::Human,
            };
            let mut env = Envelope::message(id, now_millis(), group.clone(), me, author, text);
            // A person's message: depth 0, the root of its exchange; in a thread when it
            // follows up an earlier task of its conversation.
            env.depth = 0;
            env.root = Some(id);
            env.reply_to = reply_to.filter(|r| node.transcripts.get(&group, r).is_some());
            if let Some(posted) = show_in_chat(node, &env).await {
                env.platform_msg_id = Some(posted);
            }
            node.publish(env, "a2a")
                .await
                .map(|_| id)
                .map_err(|e| e.to_string())
        })
    }

    fn events(&self) -> tokio::sync::broadcast::Receiver<crate::telemetry::events::Event> {
        self.0.events.subscribe()
    }

    fn stop_turn(&self, group: &str, caller: &str) {
        self.0
            .brain
            .stops
            .stop(group, &format!("{CALLER_PREFIX}{caller}"));
        tracing::info!(bot = %self.0.cfg.bot().name, %group, %caller, "an A2A CancelTask: dropping this bot's turns in flight for the group, as /stop does");
    }

    fn answer_to(&self, group: &str, trigger: Ulid) -> Option<Arc<Envelope>> {
        let me = &self.0.cfg.bot().name;
        self.0
            .transcripts
            .since(group, &trigger)
            .into_iter()
            .find(|e| {
                e.author.kind == AuthorKind::Bot
                    && &e.author.name == me
                    && e.reply_to == Some(trigger)
                    && e.why
                        .as_ref()
                        .is_some_and(|w| *w != crate::wire::envelope::Why::Posted)
            })
    }

    fn counted(&self, state: TaskState) {
        self.0
            .metrics
            .a2a_task(&self.0.cfg.bot().name, "served", state.label());
    }

    fn stopping(&self) -> CancellationToken {
        self.0.accepting.clone()
    }
}
