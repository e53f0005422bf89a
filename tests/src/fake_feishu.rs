//! A fake Feishu open platform for tests, and the callbacks Feishu would send.
//!
//! [`FakeFeishu::start`] binds a real HTTP server on `127.0.0.1:0` that serves the
//! three calls a botmesh node makes, in the shapes of Feishu's documentation:
//!
//! - `POST /open-apis/auth/v3/tenant_access_token/internal` `{app_id, app_secret}` →
//!   `{code: 0, msg: "ok", tenant_access_token: "t-…", expire: 7200}` (code 10014 for
//!   a wrong secret);
//! - `GET /open-apis/bot/v3/info` → `{code: 0, bot: {open_id, app_name, …}}`;
//! - `POST /open-apis/im/v1/messages?receive_id_type=chat_id` `{receive_id, msg_type,
//!   content, uuid}` → `{code: 0, data: {message_id: "om_…", …}}`; the same `uuid`
//!   returns the same message (Feishu's idempotency);
//! - `PUT /open-apis/im/v1/messages/:message_id` `{msg_type, content}` → the edited
//!   message (`updated: true`), for text and post messages it sent.
//!
//! Both API calls need `Authorization: Bearer <a token it issued>`, else code 99991663.
//!
//! The long connection, as Feishu serves it to its official SDKs (the test
//! `official_sdk_receives_events_from_the_fake` runs the `lark-oapi` Python SDK's
//! `lark.ws.Client` against this fake):
//!
//! - `POST /callback/ws/endpoint` `{AppID, AppSecret}` → `{code: 0, data: {URL,
//!   ClientConfig}}`, the URL on a second listener with `device_id` and `service_id`
//!   in its query (code 10014 for a wrong secret);
//! - the WebSocket there: refused handshakes can be queued ([`Refusal`], with
//!   Feishu's `handshake-*` headers); pings (control frames) are answered with a pong
//!   carrying the `ClientConfig`; events are pushed as data frames
//!   ([`FakeFeishu::push_event`], optionally in fragments); every answer is recorded
//!   ([`Ack`]). Whatever was not acknowledged with code 200 is delivered again on the
//!   next connection, as Feishu does.
//!
//! Failures can be queued for the next message sends ([`Fail`]): 429, 5xx, an
//! expired token, a Feishu error code. Every request is recorded for assertions.
//!
//! [`message_event`] and [`url_verification`] build callback bodies shaped like the
//! documented `im.message.receive_v1` event and request-URL check; [`Callback`]
//! encrypts and signs them as Feishu does (with botmesh's own `feishu::encrypt` and
//! `feishu::signature`, which the unit tests pin to Feishu's published vectors).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use botmesh::platform::feishu_ws::{self, Frame, Header};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::tungstenite;

use crate::serve::{read_request, serve_http, HttpServer, Reply};

/// The `service_id` the fake puts in its connection URLs.
pub const SERVICE_ID: i32 = 33554678;

/// The app the fake serves.
#[derive(Debug, Clone)]
pub struct FakeApp {
    /// App ID (`cli_…`).
    pub app_id: String,
    /// App Secret.
    pub app_secret: String,
    /// The app's bot open_id (what `/bot/v3/info` returns).
    pub bot_open_id: String,
    /// The app's name.
    pub app_name: String,
    /// Token lifetime in seconds.
    pub expire: u64,
}

/// A failure to play for one message send, in queue order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    /// This HTTP status; 429 comes with Feishu's rate-limit body, others with none.
    Status(u16),
    /// Invalidate every issued token and answer code 99991663.
    TokenExpired,
    /// HTTP 400 with this Feishu code (e.g. 230020, a frequency limit).
    Code(i64),
}

/// One message-send request the fake accepted.
#[derive(Debug, Clone)]
pub struct Sent {
    /// `receive_id_type` from the query.
    pub receive_id_type: String,
    /// `receive_id` (the chat).
    pub receive_id: String,
    /// `msg_type`.
    pub msg_type: String,
    /// `content` as sent (a JSON string).
    pub content: String,
    /// `content`'s `text`.
    pub text: String,
    /// `uuid`, the idempotency key.
    pub uuid: Option<String>,
    /// The message id answered.
    pub message_id: String,
    /// Times it was edited (`PUT /open-apis/im/v1/messages/:message_id`); `text` and
    /// `content` are then the latest.
    pub edits: u32,
}

/// A handshake refusal to play for the next connection attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status of the refusal.
    pub http_status: u16,
    /// `handshake-status` (514 auth failed, 403 forbidden, …).
    pub status: i64,
    /// `handshake-autherrcode` (1000040350: too many connections).
    pub auth_code: Option<i64>,
    /// `handshake-msg`.
    pub msg: String,
}

impl Refusal {
    /// What Feishu answers when the app already holds all its connections.
    pub fn too_many_connections() -> Refusal {
        Refusal {
            http_status: 403,
            status: feishu_ws::STATUS_AUTH_FAILED,
            auth_code: Some(feishu_ws::EXCEED_CONN_LIMIT),
            msg: "exceed connection limit".into(),
        }
    }
}

/// One answer the fake received to a data frame.
#[derive(Debug, Clone)]
pub struct Ack {
    /// The frame's `message_id` header.
    pub message_id: String,
    /// `code` of the JSON payload (200 taken, 500 not).
    pub code: i64,
    /// The `biz_rt` header, when sent.
    pub biz_rt: Option<String>,
    /// The echoed SeqID.
    pub seq_id: u64,
    /// The echoed `sum` header.
    pub sum: Option<String>,
}

/// Something to do to the current connection.
enum WsCmd {
    /// Send these frames.
    Send(Vec<Vec<u8>>),
    /// Send these frames, then drop the socket without waiting for answers.
    SendThenDrop(Vec<Vec<u8>>),
    /// Drop the socket (no close frame: like a network failure).
    Drop,
}

#[derive(Default)]
struct WsState {
    url_base: String,
    client_config: Value,
    refusals: VecDeque<Refusal>,
    devices: HashSet<String>,
    current: Option<mpsc::UnboundedSender<WsCmd>>,
    connections: usize,
    handshakes_refused: usize,
    endpoint_requests: usize,
    events: HashMap<String, Vec<Vec<u8>>>,
    unacked: Vec<String>,
    acks: Vec<Ack>,
    pings: usize,
    drop_after_next_push: bool,
}

/// The directory the fake answers from: people, chat members, scopes, history.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    /// The app has `contact:user.base:readonly`.
    pub contact_scope: bool,
    /// The app has `im:chat.members:read`.
    pub members_scope: bool,
    /// People the contact API knows: open_id → name.
    pub users: HashMap<String, String>,
    /// Chat members (any chat): (open_id, name).
    pub members: Vec<(String, String)>,
    /// Mentions in the chat's history, newest first: (open_id, name).
    pub history_mentions: Vec<(String, String)>,
}

fn no_scope(scope: &str) -> Reply {
    reply(
        400,
        json!({"code": 99991672, "msg": format!("Access denied. One of the following scopes is required: [{scope}]")}),
    )
}

struct State {
    directory: Mutex<Directory>,
    calls: Mutex<Vec<String>>,
    ws: Mutex<WsState>,
    app: FakeApp,
    token_requests: AtomicUsize,
    send_attempts: AtomicUsize,
    info_requests: AtomicUsize,
    next: AtomicU64,
    valid: Mutex<HashSet<String>>,
    failures: Mutex<VecDeque<Fail>>,
    sent: Mutex<Vec<Sent>>,
    by_uuid: Mutex<HashMap<String, String>>,
}

/// A running fake; stops when dropped.
pub struct FakeFeishu {
    /// Base URL for `feishu.base_url`: `http://127.0.0.1:PORT`.
    pub base_url: String,
    state: Arc<State>,
    _server: HttpServer,
    /// Accepts long connections; aborted (with every connection) when dropped.
    ws_task: JoinHandle<()>,
}

impl Drop for FakeFeishu {
    fn drop(&mut self) {
        self.ws_task.abort();
    }
}

impl FakeFeishu {
    /// Starts the fake for `app`.
    pub async fn start(app: FakeApp) -> FakeFeishu {
        let ws_listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake_feishu: bind ws");
        let ws = WsState {
            url_base: format!("ws://{}/ws/v2", ws_listener.local_addr().expect("ws addr")),
            client_config: json!({"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 120}),
            ..WsState::default()
        };
        let state = Arc::new(State {
            directory: Mutex::new(Directory::default()),
            calls: Mutex::new(Vec::new()),
            ws: Mutex::new(ws),
            app,
            token_requests: AtomicUsize::new(0),
            send_attempts: AtomicUsize::new(0),
            info_requests: AtomicUsize::new(0),
            next: AtomicU64::new(1),
            valid: Mutex::new(HashSet::new()),
            failures: Mutex::new(VecDeque::new()),
            sent: Mutex::new(Vec::new()),
            by_uuid: Mutex::new(HashMap::new()),
        });
        let handler_state = state.clone();
        let server = serve_http(move |req| handle(handler_state.clone(), req)).await;
        let ws_task = tokio::spawn(ws_accept_loop(ws_listener, state.clone()));
        FakeFeishu {
            base_url: server.url(),
            state,
            _server: server,
            ws_task,
        }
    }

    /// Sets what the contact, chat members and message list APIs answer.
    pub fn set_directory(&self, d: Directory) {
        *self.state.directory.lock().unwrap() = d;
    }

    /// Every request so far as `METHOD /path`, in order.
    pub fn calls(&self) -> Vec<String> {
        self.state.calls.lock().unwrap().clone()
    }

    /// How many requests went to paths starting with `prefix`.
    pub fn calls_to(&self, prefix: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }

    /// Sets the `ClientConfig` the endpoint and pongs give (seconds).
    pub fn set_client_config(&self, config: Value) {
        self.state.ws.lock().unwrap().client_config = config;
    }

    /// Queues handshake refusals for the next connection attempts.
    pub fn refuse_next_handshakes(&self, refusals: impl IntoIterator<Item = Refusal>) {
        self.state.ws.lock().unwrap().refusals.extend(refusals);
    }

    /// WebSocket connections accepted so far.
    pub fn ws_connections(&self) -> usize {
        self.state.ws.lock().unwrap().connections
    }

    /// Handshakes refused so far.
    pub fn handshakes_refused(&self) -> usize {
        self.state.ws.lock().unwrap().handshakes_refused
    }

    /// Endpoint requests received.
    pub fn endpoint_requests(&self) -> usize {
        self.state.ws.lock().unwrap().endpoint_requests
    }

    /// Ping frames received.
    pub fn pings(&self) -> usize {
        self.state.ws.lock().unwrap().pings
    }

    /// Answers to data frames, in arrival order.
    pub fn acks(&self) -> Vec<Ack> {
        self.state.ws.lock().unwrap().acks.clone()
    }

    /// Frame message ids pushed but not yet acknowledged with 200.
    pub fn unacked(&self) -> Vec<String> {
        self.state.ws.lock().unwrap().unacked.clone()
    }

    /// Pushes an event (schema 2.0 JSON) as data frames: one, or `parts` fragments
    /// (sent last fragment first, so reassembly must go by `seq`). Delivered now if
    /// a client is connected, else on its next connection. Returns the frames'
    /// `message_id`.
    pub fn push_event(&self, payload: &Value, parts: usize) -> String {
        let n = self.state.next.fetch_add(1, Ordering::SeqCst);
        let message_id = format!("msg_fake{n:06}");
        let bytes = payload.to_string().into_bytes();
        let parts = parts.clamp(1, bytes.len().max(1));
        let chunk = bytes.len().div_ceil(parts);
        let mut frames: Vec<Vec<u8>> = bytes
            .chunks(chunk.max(1))
            .enumerate()
            .map(|(seq, data)| {
                let header = |k: &str, v: String| Header {
                    key: k.into(),
                    value: v,
                };
                Frame {
                    seq_id: n,
                    log_id: n,
                    service: SERVICE_ID,
                    method: feishu_ws::METHOD_DATA,
                    headers: vec![
                        header("type", "event".into()),
                        header("message_id", message_id.clone()),
                        header("sum", parts.to_string()),
                        header("seq", seq.to_string()),
                        header("trace_id", format!("trace-{n}")),
                    ],
                    payload: Some(data.to_vec()),
                    ..Frame::default()
                }
                .to_bytes()
            })
            .collect();
        frames.reverse();
        let mut ws = self.state.ws.lock().unwrap();
        ws.events.insert(message_id.clone(), frames.clone());
        ws.unacked.push(message_id.clone());
        let drop_after = std::mem::take(&mut ws.drop_after_next_push);
        if let Some(tx) = &ws.current {
            let _ = tx.send(if drop_after {
                WsCmd::SendThenDrop(frames)
            } else {
                WsCmd::Send(frames)
            });
        }
        message_id
    }

    /// Sends an already pushed event again (as Feishu does when it did not see the
    /// answer), acknowledged or not.
    pub fn redeliver(&self, message_id: &str) {
        let mut ws = self.state.ws.lock().unwrap();
        let Some(frames) = ws.events.get(message_id).cloned() else {
            return;
        };
        if !ws.unacked.iter().any(|m| m == message_id) {
            ws.unacked.push(message_id.to_string());
        }
        if let Some(tx) = &ws.current {
            let _ = tx.send(WsCmd::Send(frames));
        }
    }

    /// Drops the current connection's socket (no close frame).
    pub fn drop_connection(&self) {
        let mut ws = self.state.ws.lock().unwrap();
        if let Some(tx) = ws.current.take() {
            let _ = tx.send(WsCmd::Drop);
        }
    }

    /// The next pushed event is sent, then the socket is dropped before any answer
    /// can be read: the event is left unacknowledged.
    pub fn drop_after_next_push(&self) {
        self.state.ws.lock().unwrap().drop_after_next_push = true;
    }

    /// Waits up to `timeout` until `cond` holds for the answers received.
    pub async fn wait_acks(&self, timeout: Duration, cond: impl Fn(&[Ack]) -> bool) -> Vec<Ack> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let a = self.acks();
            if cond(&a) || tokio::time::Instant::now() >= deadline {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits up to `timeout` until at least `n` connections were accepted.
    pub async fn wait_connections(&self, n: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let c = self.ws_connections();
            let live = self.state.ws.lock().unwrap().current.is_some();
            if (c >= n && live) || tokio::time::Instant::now() >= deadline {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Queues failures for the next message sends.
    pub fn fail_next(&self, fails: impl IntoIterator<Item = Fail>) {
        self.state.failures.lock().unwrap().extend(fails);
    }

    /// Tenant token requests received.
    pub fn token_requests(&self) -> usize {
        self.state.token_requests.load(Ordering::SeqCst)
    }

    /// Message-send requests received (failed ones included).
    pub fn send_attempts(&self) -> usize {
        self.state.send_attempts.load(Ordering::SeqCst)
    }

    /// Bot info requests received.
    pub fn info_requests(&self) -> usize {
        self.state.info_requests.load(Ordering::SeqCst)
    }

    /// Accepted message sends, in order (a repeated uuid appears again).
    pub fn sent(&self) -> Vec<Sent> {
        self.state.sent.lock().unwrap().clone()
    }

    /// Waits up to `timeout` until at least `n` sends were accepted.
    pub async fn wait_sent(&self, n: usize, timeout: Duration) -> Vec<Sent> {
        crate::wait_for(
            timeout,
            Duration::from_millis(20),
            || async { self.sent() },
            |s| s.len() >= n,
        )
        .await
    }
}

fn reply(status: u16, body: Value) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    r
}

fn invalid_token() -> Reply {
    reply(
        400,
        json!({"code": 99991663, "msg": "Invalid access token for authorization. Please make a request with token attached."}),
    )
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Reply {
    let (parts, bytes) = read_request(req).await;
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    let method = parts.method.clone();
    let bearer = parts
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let authorised = bearer.is_some_and(|t| state.valid.lock().unwrap().contains(&t));
    state.calls.lock().unwrap().push(format!("{method} {path}"));
    match (method, path.as_str()) {
        (Method::GET, p) if p.starts_with("/open-apis/contact/v3/users/") => {
            let d = state.directory.lock().unwrap().clone();
            let id = p.trim_start_matches("/open-apis/contact/v3/users/");
            if !authorised {
                invalid_token()
            } else if !d.contact_scope {
                no_scope("contact:user.base:readonly")
            } else {
                match d.users.get(id) {
                    Some(name) => reply(
                        200,
                        json!({"code": 0, "msg": "success", "data": {"user": {"open_id": id, "name": name}}}),
                    ),
                    None => reply(
                        400,
                        json!({"code": 41050, "msg": "no user authority error"}),
                    ),
                }
            }
        }
        (Method::GET, p) if p.starts_with("/open-apis/im/v1/chats/") && p.ends_with("/members") => {
            let d = state.directory.lock().unwrap().clone();
            if !authorised {
                invalid_token()
            } else if !d.members_scope {
                no_scope("im:chat.members:read")
            } else {
                let items: Vec<Value> = d
                    .members
                    .iter()
                    .map(|(id, name)| json!({"member_id_type": "open_id", "member_id": id, "name": name, "tenant_key": "t"}))
                    .collect();
                reply(
                    200,
                    json!({"code": 0, "msg": "success", "data": {"items": items, "has_more": false, "page_token": "", "member_total": items.len()}}),
                )
            }
        }
        (Method::GET, "/open-apis/im/v1/messages") => {
            let d = state.directory.lock().unwrap().clone();
            if !authorised {
                invalid_token()
            } else {
                let items: Vec<Value> = d
                    .history_mentions
                    .iter()
                    .enumerate()
                    .map(|(i, (id, name))| json!({
                        "message_id": format!("om_hist{i}"), "msg_type": "text",
                        "body": {"content": json!({"text": "@_user_1 hi"}).to_string()},
                        "mentions": [{"key": "@_user_1", "id": id, "id_type": "open_id", "name": name, "tenant_key": "t"}]
                    }))
                    .collect();
                reply(
                    200,
                    json!({"code": 0, "msg": "success", "data": {"items": items, "has_more": false}}),
                )
            }
        }
        (Method::POST, "/open-apis/auth/v3/tenant_access_token/internal") => {
            state.token_requests.fetch_add(1, Ordering::SeqCst);
            if body["app_id"] != state.app.app_id.as_str()
                || body["app_secret"] != state.app.app_secret.as_str()
            {
                reply(400, json!({"code": 10014, "msg": "app secret invalid"}))
            } else {
                let n = state.next.fetch_add(1, Ordering::SeqCst);
                let token = format!("t-fake{n:04}");
                state.valid.lock().unwrap().insert(token.clone());
                reply(
                    200,
                    json!({"code": 0, "msg": "ok", "tenant_access_token": token, "expire": state.app.expire}),
                )
            }
        }
        (Method::POST, feishu_ws::ENDPOINT_PATH) => endpoint(&state, &body),
        (Method::GET, "/open-apis/bot/v3/info") => {
            state.info_requests.fetch_add(1, Ordering::SeqCst);
            if !authorised {
                invalid_token()
            } else {
                reply(
                    200,
                    json!({"code": 0, "msg": "ok", "bot": {"activate_status": 2, "app_name": state.app.app_name, "avatar_url": "", "ip_white_list": [], "open_id": state.app.bot_open_id}}),
                )
            }
        }
        (Method::POST, "/open-apis/im/v1/messages") => {
            state.send_attempts.fetch_add(1, Ordering::SeqCst);
            let fail = state.failures.lock().unwrap().pop_front();
            match fail {
                Some(Fail::Status(429)) => {
                    let mut r = reply(
                        429,
                        json!({"code": 99991400, "msg": "request trigger frequency limit"}),
                    );
                    r.headers_mut().insert(
                        "x-ogw-ratelimit-reset",
                        hyper::header::HeaderValue::from_static("0"),
                    );
                    r
                }
                Some(Fail::Status(s)) => {
                    let mut r = Response::new(Full::new(Bytes::from_static(b"upstream error")));
                    *r.status_mut() = hyper::StatusCode::from_u16(s)
                        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
                    r
                }
                Some(Fail::TokenExpired) => {
                    state.valid.lock().unwrap().clear();
                    invalid_token()
                }
                Some(Fail::Code(code)) => {
                    reply(400, json!({"code": code, "msg": "scripted failure"}))
                }
                None if !authorised => invalid_token(),
                None => send(&state, &query, &body),
            }
        }
        (Method::PUT, p) if p.starts_with("/open-apis/im/v1/messages/") => {
            if !authorised {
                return invalid_token();
            }
            let id = p.trim_start_matches("/open-apis/im/v1/messages/");
            edit(&state, id, &body)
        }
        _ => reply(404, json!({"code": 404, "msg": "not found"})),
    }
}

/// "Edit message" (`PUT /open-apis/im/v1/messages/:message_id`): text and post
/// messages the app sent, with the new `msg_type` and `content`; an unknown id is
/// code 230001, another type code 230071 ("message type not supported").
fn edit(state: &State, id: &str, body: &Value) -> Reply {
    let msg_type = body["msg_type"].as_str().unwrap_or_default();
    let content = body["content"].as_str().unwrap_or_default().to_string();
    if !matches!(msg_type, "text" | "post") {
        return reply(
            400,
            json!({"code": 230071, "msg": "this message type does not support editing"}),
        );
    }
    let text = serde_json::from_str::<Value>(&content)
        .ok()
        .and_then(|c| c["text"].as_str().map(str::to_string));
    let Some(text) = text else {
        return reply(400, json!({"code": 230001, "msg": "invalid content"}));
    };
    let mut sent = state.sent.lock().unwrap();
    let Some(m) = sent.iter_mut().find(|m| m.message_id == id) else {
        return reply(400, json!({"code": 230001, "msg": "invalid message_id"}));
    };
    m.text = text;
    m.content = content.clone();
    m.msg_type = msg_type.to_string();
    m.edits += 1;
    let now = botmesh::wire::envelope::now_millis().to_string();
    reply(
        200,
        json!({"code": 0, "msg": "success", "data": {
            "message_id": id, "root_id": "", "parent_id": "", "msg_type": msg_type,
            "create_time": now, "update_time": now, "deleted": false, "updated": true,
            "chat_id": m.receive_id,
            "sender": {"id": state.app.app_id, "id_type": "app_id", "sender_type": "app", "tenant_key": "736588c9260f175e"},
            "body": {"content": content}
        }}),
    )
}

fn endpoint(state: &State, body: &Value) -> Reply {
    let mut ws = state.ws.lock().unwrap();
    ws.endpoint_requests += 1;
    if body["AppID"] != state.app.app_id.as_str()
        || body["AppSecret"] != state.app.app_secret.as_str()
    {
        return reply(
            200,
            json!({"code": 10014, "msg": "app secret invalid", "data": null}),
        );
    }
    let device = format!("{}", 7_000_000 + state.next.fetch_add(1, Ordering::SeqCst));
    ws.devices.insert(device.clone());
    let url = format!(
        "{}?fpid=493&aid=552564&device_id={device}&access_key=fake&service_id={SERVICE_ID}&ticket=fake-{device}",
        ws.url_base
    );
    reply(
        200,
        json!({"code": 0, "msg": "ok", "data": {"URL": url, "ClientConfig": ws.client_config.clone()}}),
    )
}

async fn ws_accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(ws_connection(stream, state.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

type HsRequest = tungstenite::handshake::server::Request;
type HsResponse = tungstenite::handshake::server::Response;
type HsError = tungstenite::handshake::server::ErrorResponse;

fn refuse(r: &Refusal) -> HsError {
    let mut resp = tungstenite::http::Response::new(Some(r.msg.clone()));
    *resp.status_mut() = tungstenite::http::StatusCode::from_u16(r.http_status)
        .unwrap_or(tungstenite::http::StatusCode::FORBIDDEN);
    let h = resp.headers_mut();
    let v = |s: String| tungstenite::http::HeaderValue::from_str(&s).expect("header value");
    h.insert(feishu_ws::HEADER_HANDSHAKE_STATUS, v(r.status.to_string()));
    h.insert(feishu_ws::HEADER_HANDSHAKE_MSG, v(r.msg.clone()));
    if let Some(code) = r.auth_code {
        h.insert(
            feishu_ws::HEADER_HANDSHAKE_AUTH_ERRCODE,
            v(code.to_string()),
        );
    }
    resp
}

/// Forgets the connection as the current one when its task ends.
struct ClearCurrent {
    state: Arc<State>,
    tx: mpsc::UnboundedSender<WsCmd>,
}

impl Drop for ClearCurrent {
    fn drop(&mut self) {
        let mut s = self.state.ws.lock().unwrap();
        if s.current.as_ref().is_some_and(|c| c.same_channel(&self.tx)) {
            s.current = None;
        }
    }
}

async fn ws_connection(stream: TcpStream, state: Arc<State>) {
    let st = state.clone();
    // The handshake callback's signature is tungstenite's.
    #[allow(clippy::result_large_err)]
    let check = move |req: &HsRequest, resp: HsResponse| -> Result<HsResponse, HsError> {
        let mut ws = st.ws.lock().unwrap();
        let device = req
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .find_map(|kv| kv.strip_prefix("device_id="))
            .unwrap_or_default()
            .to_string();
        if let Some(r) = ws.refusals.pop_front() {
            ws.handshakes_refused += 1;
            return Err(refuse(&r));
        }
        if !ws.devices.contains(&device) {
            ws.handshakes_refused += 1;
            return Err(refuse(&Refusal {
                http_status: 403,
                status: feishu_ws::STATUS_AUTH_FAILED,
                auth_code: Some(1000040351),
                msg: "unknown device_id: ask /callback/ws/endpoint first".into(),
            }));
        }
        Ok(resp)
    };
    let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, check).await else {
        return;
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _current = ClearCurrent {
        state: state.clone(),
        tx: tx.clone(),
    };
    let backlog: Vec<Vec<u8>> = {
        let mut s = state.ws.lock().unwrap();
        s.connections += 1;
        s.current = Some(tx);
        let unacked = s.unacked.clone();
        unacked
            .iter()
            .filter_map(|m| s.events.get(m).cloned())
            .flatten()
            .collect()
    };
    let (mut sink, mut source) = ws.split();
    for f in backlog {
        if sink
            .send(tungstenite::Message::Binary(f.into()))
            .await
            .is_err()
        {
            return;
        }
    }
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None | Some(WsCmd::Drop) => return,
                Some(WsCmd::Send(frames)) => {
                    for f in frames {
                        if sink.send(tungstenite::Message::Binary(f.into())).await.is_err() {
                            return;
                        }
                    }
                }
                Some(WsCmd::SendThenDrop(frames)) => {
                    for f in frames {
                        let _ = sink.send(tungstenite::Message::Binary(f.into())).await;
                    }
                    let mut s = state.ws.lock().unwrap();
                    s.current = None;
                    return;
                }
            },
            msg = source.next() => {
                let bytes = match msg {
                    Some(Ok(tungstenite::Message::Binary(b))) => b,
                    Some(Ok(tungstenite::Message::Close(_))) | None | Some(Err(_)) => return,
                    Some(Ok(_)) => continue,
                };
                let Ok(frame) = Frame::from_bytes(&bytes) else {
                    continue;
                };
                if frame.method == feishu_ws::METHOD_CONTROL {
                    if frame.header(feishu_ws::HEADER_TYPE) == Some("ping") {
                        let config = {
                            let mut s = state.ws.lock().unwrap();
                            s.pings += 1;
                            s.client_config.to_string()
                        };
                        let pong = Frame {
                            service: frame.service,
                            method: feishu_ws::METHOD_CONTROL,
                            headers: vec![Header { key: "type".into(), value: "pong".into() }],
                            payload: Some(config.into_bytes()),
                            ..Frame::default()
                        };
                        if sink.send(tungstenite::Message::Binary(pong.to_bytes().into())).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                let code = frame
                    .payload
                    .as_deref()
                    .and_then(|p| serde_json::from_slice::<Value>(p).ok())
                    .and_then(|v| v["code"].as_i64())
                    .unwrap_or(-1);
                let ack = Ack {
                    message_id: frame.header(feishu_ws::HEADER_MESSAGE_ID).unwrap_or_default().to_string(),
                    code,
                    biz_rt: frame.header(feishu_ws::HEADER_BIZ_RT).map(str::to_string),
                    seq_id: frame.seq_id,
                    sum: frame.header(feishu_ws::HEADER_SUM).map(str::to_string),
                };
                let mut s = state.ws.lock().unwrap();
                if code == 200 {
                    s.unacked.retain(|m| *m != ack.message_id);
                }
                s.acks.push(ack);
            }
        }
    }
}

fn send(state: &State, query: &str, body: &Value) -> Reply {
    let receive_id_type = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("receive_id_type="))
        .unwrap_or_default()
        .to_string();
    let s = |k: &str| body[k].as_str().unwrap_or_default().to_string();
    let content = s("content");
    let text = serde_json::from_str::<Value>(&content)
        .ok()
        .and_then(|c| c["text"].as_str().map(str::to_string));
    let (Some(text), false) = (text, s("receive_id").is_empty()) else {
        return reply(
            400,
            json!({"code": 230001, "msg": "invalid content or receive_id"}),
        );
    };
    let uuid = body["uuid"].as_str().map(str::to_string);
    let message_id = {
        let mut by_uuid = state.by_uuid.lock().unwrap();
        match uuid.as_ref().and_then(|u| by_uuid.get(u)) {
            Some(id) => id.clone(),
            None => {
                let n = state.next.fetch_add(1, Ordering::SeqCst);
                let id = format!("om_fake{n:08}");
                if let Some(u) = &uuid {
                    by_uuid.insert(u.clone(), id.clone());
                }
                id
            }
        }
    };
    let sent = Sent {
        receive_id_type,
        receive_id: s("receive_id"),
        msg_type: s("msg_type"),
        content: content.clone(),
        text,
        uuid,
        message_id: message_id.clone(),
        edits: 0,
    };
    state.sent.lock().unwrap().push(sent.clone());
    reply(
        200,
        json!({"code": 0, "msg": "success", "data": {
            "message_id": message_id, "root_id": "", "parent_id": "",
            "msg_type": sent.msg_type, "create_time": botmesh::wire::envelope::now_millis().to_string(),
            "update_time": botmesh::wire::envelope::now_millis().to_string(), "deleted": false, "updated": false,
            "chat_id": sent.receive_id,
            "sender": {"id": state.app.app_id, "id_type": "app_id", "sender_type": "app", "tenant_key": "736588c9260f175e"},
            "body": {"content": content}, "mentions": []
        }}),
    )
}

/// One `mentions[]` entry: placeholder key, open_id, display name.
pub type MentionSpec<'a> = (&'a str, &'a str, &'a str);

/// What a message event says.
#[derive(Debug, Clone)]
pub struct MessageSpec<'a> {
    /// `header.app_id`.
    pub app_id: &'a str,
    /// `header.token` (the Verification Token).
    pub token: &'a str,
    /// `header.event_id`.
    pub event_id: &'a str,
    /// `message.message_id` (`om_…`).
    pub message_id: &'a str,
    /// `message.chat_id` (`oc_…`).
    pub chat_id: &'a str,
    /// The sender's open_id.
    pub sender_open_id: &'a str,
    /// `user` or `app`.
    pub sender_type: &'a str,
    /// The text, with `@_user_N` placeholders.
    pub text: &'a str,
    /// The mentions.
    pub mentions: &'a [MentionSpec<'a>],
}

impl<'a> MessageSpec<'a> {
    /// A person's (`sender_type` `user`) message with no mentions, in `chat_id` of
    /// app `app_id` (`token`: its Verification Token, empty on the long connection).
    pub fn person(
        (app_id, token, chat_id): (&'a str, &'a str, &'a str),
        sender_open_id: &'a str,
        (event_id, message_id): (&'a str, &'a str),
        text: &'a str,
    ) -> Self {
        MessageSpec {
            app_id,
            token,
            event_id,
            message_id,
            chat_id,
            sender_open_id,
            sender_type: "user",
            text,
            mentions: &[],
        }
    }
}

/// An `im.message.receive_v1` callback body, shaped like Feishu's documented example.
pub fn message_event(m: &MessageSpec<'_>) -> Value {
    let now = botmesh::wire::envelope::now_millis();
    let mentions: Vec<Value> = m
        .mentions
        .iter()
        .map(|(key, open_id, name)| {
            json!({"key": key, "id": {"union_id": "on_8ed6aa67826108097d9ee143816345", "user_id": "e33ggbyz", "open_id": open_id}, "name": name, "tenant_key": "736588c9260f175e"})
        })
        .collect();
    json!({
        "schema": "2.0",
        "header": {
            "event_id": m.event_id,
            "event_type": "im.message.receive_v1",
            "create_time": now.to_string(),
            "token": m.token,
            "app_id": m.app_id,
            "tenant_key": "2ca1d211f64f6438"
        },
        "event": {
            "sender": {
                "sender_id": {"union_id": "on_8ed6aa67826108097d9ee143816345", "user_id": "e33ggbyz", "open_id": m.sender_open_id},
                "sender_type": m.sender_type,
                "tenant_key": "736588c9260f175e"
            },
            "message": {
                "message_id": m.message_id,
                "create_time": now.to_string(),
                "update_time": now.to_string(),
                "chat_id": m.chat_id,
                "chat_type": "group",
                "message_type": "text",
                "content": json!({"text": m.text}).to_string(),
                "mentions": mentions,
                "user_agent": "Mozilla/5.0 (test)"
            }
        }
    })
}

/// A request-URL check body.
pub fn url_verification(token: &str, challenge: &str) -> Value {
    json!({"challenge": challenge, "token": token, "type": "url_verification"})
}

/// A callback as Feishu sends it: body and signature headers.
#[derive(Debug, Clone)]
pub struct Callback {
    /// `X-Lark-Request-Timestamp`, when signed.
    pub timestamp: Option<String>,
    /// `X-Lark-Request-Nonce`, when signed.
    pub nonce: Option<String>,
    /// `X-Lark-Signature`, when signed.
    pub signature: Option<String>,
    /// The raw body.
    pub body: Vec<u8>,
}

impl Callback {
    /// `{"encrypt": …}` of `payload` under `encrypt_key`, signed at now + `skew_secs`.
    pub fn encrypted_signed(payload: &Value, encrypt_key: &str, skew_secs: i64) -> Callback {
        let mut c = Callback::encrypted_unsigned(payload, encrypt_key);
        c.sign(encrypt_key, skew_secs);
        c
    }

    /// `{"encrypt": …}` of `payload` under `encrypt_key`, without signature headers.
    pub fn encrypted_unsigned(payload: &Value, encrypt_key: &str) -> Callback {
        let iv: [u8; 16] = rand::random();
        let enc =
            botmesh::platform::feishu::encrypt(encrypt_key, payload.to_string().as_bytes(), iv);
        Callback {
            timestamp: None,
            nonce: None,
            signature: None,
            body: json!({ "encrypt": enc }).to_string().into_bytes(),
        }
    }

    /// A plaintext body, unsigned.
    pub fn plain(payload: &Value) -> Callback {
        Callback {
            timestamp: None,
            nonce: None,
            signature: None,
            body: payload.to_string().into_bytes(),
        }
    }

    /// (Re-)signs the body at now + `skew_secs` with a fresh nonce.
    pub fn sign(&mut self, encrypt_key: &str, skew_secs: i64) {
        let ts = (botmesh::wire::signing::unix_now() + skew_secs).to_string();
        let nonce = format!("{:016x}", rand::random::<u64>());
        self.signature = Some(botmesh::platform::feishu::signature(
            &ts,
            &nonce,
            encrypt_key,
            &self.body,
        ));
        self.timestamp = Some(ts);
        self.nonce = Some(nonce);
    }

    /// POSTs it to a node's bridge (`http://host:port`); returns status and JSON.
    pub async fn send(&self, http: &reqwest::Client, bridge: &str) -> (u16, Value) {
        let mut req = http
            .post(format!(
                "{bridge}{}",
                botmesh::platform::feishu::EVENTS_PATH
            ))
            .header("content-type", "application/json; charset=utf-8")
            .body(self.body.clone());
        for (name, value) in [
            (botmesh::platform::feishu::HEADER_TIMESTAMP, &self.timestamp),
            (botmesh::platform::feishu::HEADER_NONCE, &self.nonce),
            (botmesh::platform::feishu::HEADER_SIGNATURE, &self.signature),
        ] {
            if let Some(v) = value {
                req = req.header(name, v);
            }
        }
        let r = req.send().await.expect("send callback");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }
}

/// The ids of the people and the group the Feishu tests (tests/tests/feishu.rs,
/// feishu_ws.rs) play out their chats with, shaped as Feishu's own: one set, so
/// both tests speak of the same chat.
pub mod ids {
    /// The bot Xiaoba's open_id in its own app.
    pub const XIAOBA_OPEN_ID: &str = "ou_84aad35d084aa403a838cf73ee18467";
    /// The bot Ergoz as Xiaoba's app sees it (open_ids are per app).
    pub const ERGOZ_IN_XIAOBAS_APP: &str = "ou_7dab8a3d3cdcc9da365777c7ad535d62";
    /// The group chat.
    pub const CHAT: &str = "oc_5ce6d572455d361153b7xx51da133945";
    /// A person in the chat.
    pub const ALICE: &str = "ou_c99c5f35d542efc7ee492afe11af19ef";
}
