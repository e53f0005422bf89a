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
//!   returns the same message (Feishu's idempotency).
//!
//! Both API calls need `Authorization: Bearer <a token it issued>`, else code 99991663.
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

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::{json, Value};

use crate::serve::{read_request, serve_http, HttpServer, Reply};

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
}

struct State {
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
}

impl FakeFeishu {
    /// Starts the fake for `app`.
    pub async fn start(app: FakeApp) -> FakeFeishu {
        let state = Arc::new(State {
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
        FakeFeishu {
            base_url: server.url(),
            state,
            _server: server,
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
    match (method, path.as_str()) {
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
        _ => reply(404, json!({"code": 404, "msg": "not found"})),
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
