//! A stand-in DingTalk for tests: the Stream gateway, the token, session-webhook and
//! group-send APIs, and a group chat whose people @-mention robots.
//!
//! [`FakeDingTalk::start`] binds two listeners on `127.0.0.1:0`:
//!
//! - the open API (`base_url`):
//!   - `POST /v1.0/gateway/connections/open` `{clientId, clientSecret, subscriptions}`
//!     → `{endpoint: "ws://…/connect", ticket}` (401 `InvalidAuthentication` for a
//!     wrong secret); each ticket opens one connection;
//!   - `POST /v1.0/oauth2/accessToken` `{appKey, appSecret}` → `{accessToken, expireIn}`;
//!   - `POST /v1.0/robot/groupMessages/send` with `x-acs-dingtalk-access-token` →
//!     `{processQueryKey}` (401 for a token it did not issue);
//!   - `POST /robot/sendBySession?session=…` (the session webhook a message carries) →
//!     `{errcode: 0, errmsg: "ok"}`;
//! - the Stream gateway (`ws://…/connect?ticket=…`): JSON frames as DingTalk sends
//!   them (`specVersion`, `type`, `headers` with `messageId`/`topic`, `data` as a JSON
//!   string). A robot message is a `CALLBACK` on `/v1.0/im/bot/messages/get` and stays
//!   pending until the client acknowledges its `messageId`; whatever is pending is
//!   delivered again on the robot's next connection, as DingTalk retries.
//!
//! [`FakeDingTalk::post`] is a person writing in a group: only the robots the message
//! @-mentions receive it (with the receiving robot's own @ left out of the text, as
//! DingTalk does), all with the same `msgId`. The tests can ping, say `disconnect`,
//! cut a socket, or cut it right after the next frame before its acknowledgement.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::serve::{read_request, serve_http, HttpServer};

/// The robot-message callback topic.
pub const TOPIC_ROBOT: &str = "/v1.0/im/bot/messages/get";

/// One robot (an app with its robot) the fake knows.
#[derive(Debug, Clone)]
pub struct FakeRobot {
    /// Client ID (AppKey).
    pub client_id: String,
    /// Client Secret.
    pub client_secret: String,
    /// Robot code (for the group-send API).
    pub robot_code: String,
    /// The robot's display name in the group (what a person types after `@`).
    pub name: String,
    /// The robot's id in `atUsers`.
    pub dingtalk_id: String,
}

/// A person's message in a group.
#[derive(Debug, Clone)]
pub struct PersonMessage<'a> {
    /// The group's conversation id.
    pub conversation: &'a str,
    /// Display name.
    pub sender_nick: &'a str,
    /// Staff id.
    pub sender_staff_id: &'a str,
    /// What they typed, `@RobotName` included.
    pub text: &'a str,
    /// The robots (by client id) they @-mentioned: the only ones that receive it.
    pub at_robots: &'a [&'a str],
}

/// How a robot sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The session webhook of a message it received.
    Session,
    /// `/v1.0/robot/groupMessages/send`.
    GroupSend,
}

/// A message a robot sent into a group.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The sending robot's client id.
    pub robot: String,
    /// The group.
    pub conversation: String,
    /// How.
    pub via: Via,
    /// Its text.
    pub text: String,
    /// `at.atUserIds` (session webhook only).
    pub at_user_ids: Vec<String>,
    /// When it arrived (tokio time).
    pub at: tokio::time::Instant,
}

enum Cmd {
    Send(String),
    SendThenCut(String),
    Cut,
}

#[derive(Default)]
struct RobotConn {
    /// The live connection's command channel and its generation.
    live: Option<(u64, mpsc::UnboundedSender<Cmd>)>,
    /// Frames sent and not yet acknowledged, in order: (messageId, frame).
    pending: Vec<(String, String)>,
    /// Every acknowledgement received.
    acks: Vec<Value>,
    /// Connections opened.
    connections: usize,
    /// Subscriptions of the last `connections/open`.
    subscriptions: Value,
    /// Cut the socket right after the next robot message, before its ack.
    cut_after_next: bool,
    /// Robot-message frames written to its sockets (redeliveries included).
    frames_sent: usize,
}

struct State {
    robots: Vec<FakeRobot>,
    ws_url: String,
    base_url: String,
    next: AtomicU64,
    tickets: Mutex<HashMap<String, String>>,
    tokens: Mutex<HashMap<String, String>>,
    conns: Mutex<HashMap<String, RobotConn>>,
    sessions: Mutex<HashMap<String, (String, String)>>,
    sent: Mutex<Vec<Sent>>,
    token_requests: AtomicU64,
    session_ttl_ms: Mutex<i64>,
}

impl State {
    fn robot(&self, client_id: &str) -> Option<&FakeRobot> {
        self.robots.iter().find(|r| r.client_id == client_id)
    }

    fn id(&self, prefix: &str) -> String {
        format!("{prefix}{:08}", self.next.fetch_add(1, Ordering::SeqCst))
    }

    /// Queues a frame for `client_id` and sends it if connected.
    fn deliver(&self, client_id: &str, message_id: String, frame: String) {
        let mut conns = self.conns.lock().unwrap();
        let c = conns.entry(client_id.to_string()).or_default();
        let robot_message = frame.contains(TOPIC_ROBOT);
        if robot_message {
            c.pending.push((message_id, frame.clone()));
        }
        if let Some((_, tx)) = &c.live {
            let cmd = if robot_message && c.cut_after_next {
                c.cut_after_next = false;
                Cmd::SendThenCut(frame)
            } else {
                Cmd::Send(frame)
            };
            let _ = tx.send(cmd);
        }
    }
}

/// A running stand-in; stops when dropped.
pub struct FakeDingTalk {
    /// `dingtalk.api_base_url`: `http://127.0.0.1:PORT`.
    pub base_url: String,
    state: Arc<State>,
    /// The open API.
    _api: HttpServer,
    /// The Stream gateway's accept loop.
    gateway: JoinHandle<()>,
}

fn frame(kind: &str, topic: &str, message_id: &str, data: &Value) -> String {
    json!({
        "specVersion": "1.0",
        "type": kind,
        "headers": {
            "appId": "fake-app",
            "connectionId": "fake-conn",
            "contentType": "application/json",
            "messageId": message_id,
            "time": "1700000000000",
            "topic": topic,
        },
        "data": data.to_string(),
    })
    .to_string()
}

impl FakeDingTalk {
    /// Starts the stand-in for `robots`.
    pub async fn start(robots: Vec<FakeRobot>) -> FakeDingTalk {
        let ws = TcpListener::bind("127.0.0.1:0").await.expect("bind ws");
        let ws_url = format!("ws://{}/connect", ws.local_addr().unwrap());
        // The state needs the API's address (for the session webhooks it hands out),
        // known only once the API is bound: the handler finds the state in this slot.
        let slot: Arc<std::sync::OnceLock<Arc<State>>> = Arc::default();
        let handler_slot = slot.clone();
        let api = serve_http(move |req| {
            let state = handler_slot.get().cloned();
            async move {
                match state {
                    Some(state) => handle(state, req).await,
                    None => reply(503, json!({"code": "NotReady", "message": "starting"})),
                }
            }
        })
        .await;
        let base_url = api.url();
        let state = Arc::new(State {
            robots,
            ws_url,
            base_url: base_url.clone(),
            next: AtomicU64::new(1),
            tickets: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            sent: Mutex::new(Vec::new()),
            token_requests: AtomicU64::new(0),
            session_ttl_ms: Mutex::new(3_600_000),
        });
        let _ = slot.set(state.clone());
        let gateway = tokio::spawn(ws_loop(ws, state.clone()));
        FakeDingTalk {
            base_url,
            state,
            _api: api,
            gateway,
        }
    }

    /// How long the session webhooks of the next messages stay valid (negative:
    /// already expired, so robots must use the group-send API).
    pub fn set_session_ttl(&self, ttl_ms: i64) {
        *self.state.session_ttl_ms.lock().unwrap() = ttl_ms;
    }

    /// Forgets every access token it issued (as when they expire): the next
    /// group send with one is refused with 401.
    pub fn revoke_tokens(&self) {
        self.state.tokens.lock().unwrap().clear();
    }

    /// A person writes in a group; returns the message's `msgId`.
    pub fn post(&self, m: &PersonMessage<'_>) -> String {
        let msg_id = self.state.id("msg");
        self.deliver_message(m, &msg_id);
        msg_id
    }

    /// Delivers `m` (with an existing `msgId`) to the robots it @-mentions.
    pub fn deliver_message(&self, m: &PersonMessage<'_>, msg_id: &str) {
        let at_users: Vec<Value> = m
            .at_robots
            .iter()
            .filter_map(|c| self.state.robot(c))
            .map(|r| json!({"dingtalkId": r.dingtalk_id}))
            .collect();
        let ttl = *self.state.session_ttl_ms.lock().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        for client_id in m.at_robots {
            let Some(robot) = self.state.robot(client_id) else {
                continue;
            };
            // DingTalk leaves the receiving robot's own @ out of the text.
            let content = m.text.replace(&format!("@{}", robot.name), "");
            let session = self.state.id("sess");
            self.state.sessions.lock().unwrap().insert(
                session.clone(),
                (robot.client_id.clone(), m.conversation.to_string()),
            );
            let data = json!({
                "conversationId": m.conversation,
                "atUsers": at_users,
                "chatbotCorpId": "dingcorp",
                "chatbotUserId": robot.dingtalk_id,
                "msgId": msg_id,
                "senderNick": m.sender_nick,
                "isAdmin": false,
                "senderStaffId": m.sender_staff_id,
                "sessionWebhookExpiredTime": now + ttl,
                "createAt": now,
                "senderCorpId": "dingcorp",
                "conversationType": "2",
                "senderId": format!("$:LWCP_v1:${}", m.sender_staff_id),
                "conversationTitle": "botmesh test group",
                "isInAtList": true,
                "sessionWebhook": format!("{}/robot/sendBySession?session={session}", self.state.base_url),
                "text": {"content": content},
                "robotCode": robot.robot_code,
                "msgtype": "text",
            });
            self.push_callback(client_id, &data);
        }
    }

    /// Pushes a robot-message callback with `data` to `client_id`; returns the
    /// frame's `messageId`.
    pub fn push_callback(&self, client_id: &str, data: &Value) -> String {
        let message_id = self.state.id("frame-");
        let f = frame("CALLBACK", TOPIC_ROBOT, &message_id, data);
        self.state.deliver(client_id, message_id.clone(), f);
        message_id
    }

    /// Sends a `SYSTEM` `ping` with `opaque`; returns its `messageId`.
    pub fn ping(&self, client_id: &str, opaque: &str) -> String {
        let message_id = self.state.id("ping-");
        let f = frame("SYSTEM", "ping", &message_id, &json!({"opaque": opaque}));
        self.state.deliver(client_id, message_id.clone(), f);
        message_id
    }

    /// Sends a `SYSTEM` `disconnect`.
    pub fn say_disconnect(&self, client_id: &str) {
        let message_id = self.state.id("bye-");
        let f = frame(
            "SYSTEM",
            "disconnect",
            &message_id,
            &json!({"reason": "test"}),
        );
        self.state.deliver(client_id, message_id, f);
    }

    /// Cuts `client_id`'s socket now, without a close handshake.
    pub fn cut(&self, client_id: &str) {
        let mut conns = self.state.conns.lock().unwrap();
        if let Some((_, tx)) = conns.get_mut(client_id).and_then(|c| c.live.take()) {
            let _ = tx.send(Cmd::Cut);
        }
    }

    /// Cuts `client_id`'s socket right after its next robot message is sent, before
    /// the acknowledgement can arrive.
    pub fn cut_after_next(&self, client_id: &str) {
        self.state
            .conns
            .lock()
            .unwrap()
            .entry(client_id.to_string())
            .or_default()
            .cut_after_next = true;
    }

    /// Acknowledgements `client_id` sent, in order.
    pub fn acks(&self, client_id: &str) -> Vec<Value> {
        self.state
            .conns
            .lock()
            .unwrap()
            .get(client_id)
            .map(|c| c.acks.clone())
            .unwrap_or_default()
    }

    /// Robot messages sent to `client_id` and not acknowledged.
    pub fn pending(&self, client_id: &str) -> usize {
        self.state
            .conns
            .lock()
            .unwrap()
            .get(client_id)
            .map_or(0, |c| c.pending.len())
    }

    /// Robot-message frames written to `client_id`'s sockets, redeliveries included.
    pub fn frames_sent(&self, client_id: &str) -> usize {
        self.state
            .conns
            .lock()
            .unwrap()
            .get(client_id)
            .map_or(0, |c| c.frames_sent)
    }

    /// Connections `client_id` opened.
    pub fn connections(&self, client_id: &str) -> usize {
        self.state
            .conns
            .lock()
            .unwrap()
            .get(client_id)
            .map_or(0, |c| c.connections)
    }

    /// Whether `client_id` is connected now.
    pub fn connected(&self, client_id: &str) -> bool {
        self.state
            .conns
            .lock()
            .unwrap()
            .get(client_id)
            .is_some_and(|c| c.live.is_some())
    }

    /// The subscriptions `client_id` asked for when it last opened a connection.
    pub fn subscriptions(&self, client_id: &str) -> Value {
        self.state
            .conns
            .lock()
            .unwrap()
            .get(client_id)
            .map(|c| c.subscriptions.clone())
            .unwrap_or(Value::Null)
    }

    /// Access-token requests received.
    pub fn token_requests(&self) -> u64 {
        self.state.token_requests.load(Ordering::SeqCst)
    }

    /// Messages robots sent, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.state.sent.lock().unwrap().clone()
    }

    /// Waits up to `timeout` until `cond` holds ([`crate::wait_for`], every 20 ms).
    pub async fn wait_for(&self, timeout: Duration, cond: impl Fn(&FakeDingTalk) -> bool) -> bool {
        crate::wait_for(
            timeout,
            Duration::from_millis(20),
            || async { cond(self) },
            |done| *done,
        )
        .await
    }
}

impl Drop for FakeDingTalk {
    fn drop(&mut self) {
        self.gateway.abort();
    }
}

async fn ws_loop(listener: TcpListener, state: Arc<State>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(ws_conn(stream, state.clone()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

// The handshake callback's error type is tungstenite's, large by its design.
#[allow(clippy::result_large_err)]
async fn ws_conn(stream: tokio::net::TcpStream, state: Arc<State>) {
    let uri: Arc<Mutex<String>> = Arc::default();
    let seen = uri.clone();
    let callback =
        move |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
              resp: tokio_tungstenite::tungstenite::handshake::server::Response| {
            *seen.lock().unwrap() = req.uri().to_string();
            Ok(resp)
        };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
        return;
    };
    let uri = uri.lock().unwrap().clone();
    let ticket = uri
        .split_once("ticket=")
        .map(|(_, t)| t.split('&').next().unwrap_or_default().to_string())
        .map(|t| form_urlencoded_decode(&t))
        .unwrap_or_default();
    let Some(client_id) = state.tickets.lock().unwrap().remove(&ticket) else {
        let _ = ws.close(None).await;
        return;
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let generation = state.next.fetch_add(1, Ordering::SeqCst);
    {
        let mut conns = state.conns.lock().unwrap();
        let c = conns.entry(client_id.clone()).or_default();
        c.connections += 1;
        for (_, f) in &c.pending {
            let _ = tx.send(Cmd::Send(f.clone()));
        }
        c.live = Some((generation, tx));
    }
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(Cmd::Send(f)) => {
                    count_frame(&state, &client_id, &f);
                    if ws.send(WsMessage::Text(f.into())).await.is_err() {
                        break;
                    }
                }
                Some(Cmd::SendThenCut(f)) => {
                    count_frame(&state, &client_id, &f);
                    let _ = ws.send(WsMessage::Text(f.into())).await;
                    break;
                }
                Some(Cmd::Cut) | None => break,
            },
            msg = ws.next() => match msg {
                Some(Ok(WsMessage::Text(t))) => {
                    let Ok(ack) = serde_json::from_str::<Value>(t.as_str()) else { continue };
                    let id = ack["headers"]["messageId"].as_str().unwrap_or_default().to_string();
                    let mut conns = state.conns.lock().unwrap();
                    let c = conns.entry(client_id.clone()).or_default();
                    if ack["code"] == 200 {
                        c.pending.retain(|(m, _)| *m != id);
                    }
                    c.acks.push(ack);
                }
                Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    // Dropping the socket without a close frame: a cut, as a network failure looks.
    let mut conns = state.conns.lock().unwrap();
    if let Some(c) = conns.get_mut(&client_id) {
        if c.live.as_ref().is_some_and(|(g, _)| *g == generation) {
            c.live = None;
        }
    }
}

fn count_frame(state: &State, client_id: &str, frame: &str) {
    if frame.contains(TOPIC_ROBOT) {
        let mut conns = state.conns.lock().unwrap();
        conns.entry(client_id.to_string()).or_default().frames_sent += 1;
    }
}

fn form_urlencoded_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

type Reply = Response<Full<Bytes>>;

fn reply(status: u16, body: Value) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json;charset=utf-8"),
    );
    r
}

fn unauthorized() -> Reply {
    reply(
        401,
        json!({"code": "InvalidAuthentication", "message": "不合法的access_token", "requestid": "fake"}),
    )
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Reply {
    let (parts, bytes) = read_request(req).await;
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    let method = parts.method.clone();
    let token = parts
        .headers
        .get("x-acs-dingtalk-access-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let r = match (method, path.as_str()) {
        (Method::POST, "/v1.0/gateway/connections/open") => {
            let client_id = s(&body["clientId"]);
            match state.robot(&client_id) {
                Some(r) if r.client_secret == s(&body["clientSecret"]) => {
                    let ticket = format!("{}/{}", state.id("ticket-"), "a+b=c");
                    state
                        .tickets
                        .lock()
                        .unwrap()
                        .insert(ticket.clone(), client_id.clone());
                    state
                        .conns
                        .lock()
                        .unwrap()
                        .entry(client_id)
                        .or_default()
                        .subscriptions = body["subscriptions"].clone();
                    reply(200, json!({"endpoint": state.ws_url, "ticket": ticket}))
                }
                _ => reply(
                    401,
                    json!({"code": "InvalidAuthentication", "message": "clientId or clientSecret is wrong"}),
                ),
            }
        }
        (Method::POST, "/v1.0/oauth2/accessToken") => {
            state.token_requests.fetch_add(1, Ordering::SeqCst);
            let app_key = s(&body["appKey"]);
            match state.robot(&app_key) {
                Some(r) if r.client_secret == s(&body["appSecret"]) => {
                    let token = state.id("tok");
                    state.tokens.lock().unwrap().insert(token.clone(), app_key);
                    reply(200, json!({"accessToken": token, "expireIn": 7200}))
                }
                _ => reply(
                    400,
                    json!({"code": "invalidClientIdOrSecret", "message": "无效的clientId或者clientSecret"}),
                ),
            }
        }
        (Method::POST, "/v1.0/robot/groupMessages/send") => {
            let app = token.and_then(|t| state.tokens.lock().unwrap().get(&t).cloned());
            let Some(app) = app else {
                return unauthorized();
            };
            let robot_ok = state
                .robot(&app)
                .is_some_and(|r| r.robot_code == s(&body["robotCode"]));
            let content = serde_json::from_str::<Value>(&s(&body["msgParam"]))
                .ok()
                .and_then(|p| p["content"].as_str().map(str::to_string));
            match (robot_ok, s(&body["msgKey"]).as_str(), content) {
                (true, "sampleText", Some(text)) if !s(&body["openConversationId"]).is_empty() => {
                    state.sent.lock().unwrap().push(Sent {
                        robot: app,
                        conversation: s(&body["openConversationId"]),
                        via: Via::GroupSend,
                        text,
                        at_user_ids: Vec::new(),
                        at: tokio::time::Instant::now(),
                    });
                    reply(200, json!({"processQueryKey": state.id("pqk")}))
                }
                _ => reply(
                    400,
                    json!({"code": "param.invalid", "message": "robotCode, msgKey, msgParam or openConversationId invalid"}),
                ),
            }
        }
        (Method::POST, "/robot/sendBySession") => {
            let session = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("session="))
                .unwrap_or_default()
                .to_string();
            let target = state.sessions.lock().unwrap().get(&session).cloned();
            match (
                target,
                body["msgtype"].as_str(),
                body["text"]["content"].as_str(),
            ) {
                (Some((robot, conversation)), Some("text"), Some(text)) => {
                    let at_user_ids = body["at"]["atUserIds"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default();
                    state.sent.lock().unwrap().push(Sent {
                        robot,
                        conversation,
                        via: Via::Session,
                        text: text.to_string(),
                        at_user_ids,
                        at: tokio::time::Instant::now(),
                    });
                    reply(200, json!({"errcode": 0, "errmsg": "ok"}))
                }
                (None, _, _) => reply(200, json!({"errcode": 300001, "errmsg": "session 不存在"})),
                _ => reply(200, json!({"errcode": 40035, "errmsg": "缺少参数 json"})),
            }
        }
        _ => reply(404, json!({"code": "NotFound", "message": "not found"})),
    };
    r
}
