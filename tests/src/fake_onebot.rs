//! A stand-in OneBot v11 implementation (what NapCat, LLOneBot or Lagrange are to a
//! framework): a forward WebSocket server per QQ account at `{ws_base}/{self_id}/`,
//! checking `Authorization: Bearer <token>`, sending a `lifecycle` `connect` event and
//! `heartbeat`s, group `message` events (array form, or the CQ-string form for an
//! account that asks for it) to every account in the group, `message_sent` to the
//! author's own account, and answering the actions botmesh and NoneBot use
//! (`get_login_info`, `send_group_msg`, `get_group_member_info`, `get_msg`) by `echo`.
//! Proven faithful by NoneBot's OneBot v11 adapter in tests/tests/onebot.rs.
//!
//! Faults for tests: [`FakeOnebot::fail_sends`] (the next sends answer `status:
//! failed`), [`FakeOnebot::drop_connections`] (abrupt drops),
//! [`FakeOnebot::pause_heartbeats`] (the connection stays open but silent).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::Message;

/// One QQ account the stand-in runs (a bot's).
#[derive(Debug, Clone)]
pub struct Account {
    /// Its QQ number.
    pub self_id: i64,
    /// Its nickname.
    pub nickname: String,
    /// The access token its WebSocket wants.
    pub token: String,
    /// Whether its events carry messages in the CQ-string form.
    pub string_form: bool,
}

/// A person in the group.
#[derive(Debug, Clone)]
pub struct Person {
    /// Their QQ number.
    pub user_id: i64,
    /// Their nickname.
    pub nickname: String,
    /// Their group card (may be empty).
    pub card: String,
    /// Whether events leave `sender` empty (the adapter must ask
    /// `get_group_member_info`).
    pub hidden: bool,
}

/// A message in the group.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its id.
    pub message_id: i64,
    /// Its author's QQ number.
    pub user_id: i64,
    /// Its segments (array form).
    pub message: Value,
    /// The CQ-string form.
    pub raw: String,
    /// When, unix seconds.
    pub time: u64,
    /// When the stand-in stored it (for the pace of a bot's sends).
    pub at: std::time::Instant,
}

/// One open connection.
struct Conn {
    /// Its number, to forget it when it ends.
    id: u64,
    /// The account.
    self_id: i64,
    /// Frames to it; dropping it ends the connection.
    tx: mpsc::UnboundedSender<Message>,
}

/// The stand-in's state.
struct Inner {
    /// The group every account and person is in.
    group_id: i64,
    /// The accounts.
    accounts: Vec<Account>,
    /// The people.
    people: Vec<Person>,
    /// The group's messages.
    messages: Vec<Stored>,
    /// The last message id.
    next_id: i64,
    /// Open connections.
    conns: Vec<Conn>,
    /// The next N `send_group_msg` fail.
    fail_sends: usize,
    /// Heartbeat interval, ms.
    heartbeat_ms: u64,
    /// Whether heartbeats are paused.
    paused: bool,
    /// Every action: (account, action, status).
    actions: Vec<(i64, String, String)>,
    /// Connections accepted so far, per account.
    accepted: HashMap<i64, usize>,
    /// Handshakes refused (a wrong token or path).
    refused: usize,
    /// The last connection number.
    next_conn: u64,
}

/// The stand-in.
#[derive(Clone)]
pub struct FakeOnebot {
    /// `ws://127.0.0.1:<port>`.
    pub ws_base: String,
    /// Shared state.
    inner: Arc<Mutex<Inner>>,
}

/// Unix seconds, as OneBot events carry them.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// Text escaped for the CQ-string form.
pub fn escape(s: &str, in_code: bool) -> String {
    let s = s
        .replace('&', "&amp;")
        .replace('[', "&#91;")
        .replace(']', "&#93;");
    if in_code {
        s.replace(',', "&#44;")
    } else {
        s
    }
}

/// The CQ-string form of an array of segments.
pub fn to_cq(segments: &Value) -> String {
    let mut out = String::new();
    for seg in segments.as_array().into_iter().flatten() {
        let kind = seg["type"].as_str().unwrap_or_default();
        if kind == "text" {
            out.push_str(&escape(
                seg["data"]["text"].as_str().unwrap_or_default(),
                false,
            ));
            continue;
        }
        out.push_str("[CQ:");
        out.push_str(kind);
        if let Some(data) = seg["data"].as_object() {
            for (k, v) in data {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                out.push_str(&format!(",{k}={}", escape(&v, true)));
            }
        }
        out.push(']');
    }
    out
}

/// A segment `data` value as a string.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

impl Inner {
    fn sender_of(&self, user_id: i64) -> Value {
        if let Some(a) = self.accounts.iter().find(|a| a.self_id == user_id) {
            return json!({"user_id": user_id, "nickname": a.nickname, "card": "", "role": "member"});
        }
        match self.people.iter().find(|p| p.user_id == user_id) {
            Some(p) if p.hidden => json!({"user_id": user_id}),
            Some(p) => {
                json!({"user_id": user_id, "nickname": p.nickname, "card": p.card, "role": "member"})
            }
            None => json!({"user_id": user_id, "nickname": "", "card": ""}),
        }
    }

    /// Stores a message and sends its events; returns its id.
    fn post(&mut self, user_id: i64, message: Value) -> i64 {
        self.next_id += 1;
        let id = self.next_id;
        let raw = to_cq(&message);
        let time = now_secs();
        self.messages.push(Stored {
            message_id: id,
            user_id,
            message: message.clone(),
            raw: raw.clone(),
            time,
            at: std::time::Instant::now(),
        });
        let sender = self.sender_of(user_id);
        for c in &self.conns {
            let Some(acc) = self.accounts.iter().find(|a| a.self_id == c.self_id) else {
                continue;
            };
            let post_type = if c.self_id == user_id {
                "message_sent"
            } else {
                "message"
            };
            let body = if acc.string_form {
                json!(raw)
            } else {
                message.clone()
            };
            let ev = json!({
                "time": time, "self_id": c.self_id, "post_type": post_type,
                "message_type": "group", "sub_type": "normal", "message_id": id,
                "group_id": self.group_id, "user_id": user_id, "anonymous": null,
                "message": body, "raw_message": raw, "font": 0, "sender": sender,
                "message_format": if acc.string_form { "string" } else { "array" },
            });
            let _ = c.tx.send(Message::text(ev.to_string()));
        }
        id
    }

    fn action(&mut self, self_id: i64, v: &Value) -> Value {
        let action = v["action"].as_str().unwrap_or_default().to_string();
        let params = &v["params"];
        let ok = |data: Value| json!({"status": "ok", "retcode": 0, "data": data, "message": "", "wording": ""});
        let failed = |retcode: i64, why: &str| json!({"status": "failed", "retcode": retcode, "data": null, "message": why, "wording": why});
        let mut answer = match action.as_str() {
            "get_login_info" => {
                let nick = self
                    .accounts
                    .iter()
                    .find(|a| a.self_id == self_id)
                    .map(|a| a.nickname.clone())
                    .unwrap_or_default();
                ok(json!({"user_id": self_id, "nickname": nick}))
            }
            "send_group_msg" | "send_msg" => {
                let group: i64 = text_of(&params["group_id"]).parse().unwrap_or_default();
                let message = match &params["message"] {
                    Value::Array(a) => Some(Value::Array(a.clone())),
                    Value::String(s)
                        if params["auto_escape"].as_bool() == Some(true) || !s.contains("[CQ:") =>
                    {
                        Some(json!([{"type": "text", "data": {"text": s}}]))
                    }
                    _ => None,
                };
                if group != self.group_id {
                    failed(1400, "not in that group")
                } else if self.fail_sends > 0 {
                    self.fail_sends -= 1;
                    failed(1200, "send failed: timeout talking to the QQ server")
                } else if let Some(m) = message {
                    ok(json!({"message_id": self.post(self_id, m)}))
                } else {
                    failed(1400, "the stand-in reads only the array form of CQ codes")
                }
            }
            "get_group_member_info" => {
                let user: i64 = text_of(&params["user_id"]).parse().unwrap_or_default();
                match self.people.iter().find(|p| p.user_id == user) {
                    Some(p) => ok(
                        json!({"group_id": self.group_id, "user_id": user, "nickname": p.nickname, "card": p.card, "role": "member"}),
                    ),
                    None => failed(1400, "no such member"),
                }
            }
            "get_msg" => {
                let id: i64 = text_of(&params["message_id"]).parse().unwrap_or_default();
                match self.messages.iter().find(|m| m.message_id == id) {
                    Some(m) => ok(
                        json!({"time": m.time, "message_type": "group", "message_id": id, "real_id": id, "sender": self.sender_of(m.user_id), "message": m.message}),
                    ),
                    None => failed(1400, "no such message"),
                }
            }
            _ => failed(1404, "unsupported action"),
        };
        self.actions.push((
            self_id,
            action,
            answer["status"].as_str().unwrap_or_default().to_string(),
        ));
        if let Some(echo) = v.get("echo") {
            answer["echo"] = echo.clone();
        }
        answer
    }
}

impl FakeOnebot {
    /// Starts the stand-in with these accounts and people in group `group_id`.
    pub async fn start(group_id: i64, accounts: Vec<Account>, people: Vec<Person>) -> FakeOnebot {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let inner = Arc::new(Mutex::new(Inner {
            group_id,
            accounts,
            people,
            messages: Vec::new(),
            next_id: 1000,
            conns: Vec::new(),
            fail_sends: 0,
            heartbeat_ms: 1000,
            paused: false,
            actions: Vec::new(),
            accepted: HashMap::new(),
            refused: 0,
            next_conn: 0,
        }));
        crate::serve::accept_each(listener, inner.clone(), connection);
        FakeOnebot {
            ws_base: format!("ws://{addr}"),
            inner,
        }
    }

    /// The forward WebSocket URL of an account.
    pub fn ws_url(&self, self_id: i64) -> String {
        format!("{}/{self_id}/", self.ws_base)
    }

    /// A person (or anyone) says `message` (segments) in the group; returns its id.
    pub fn say_segments(&self, user_id: i64, message: Value) -> i64 {
        self.inner.lock().unwrap().post(user_id, message)
    }

    /// A person says plain `text`; returns its id.
    pub fn say(&self, user_id: i64, text: &str) -> i64 {
        self.say_segments(user_id, json!([{"type": "text", "data": {"text": text}}]))
    }

    /// The next `n` sends answer `status: failed` (retcode 1200).
    pub fn fail_sends(&self, n: usize) {
        self.inner.lock().unwrap().fail_sends = n;
    }

    /// Ends every connection abruptly.
    pub fn drop_connections(&self) {
        self.inner.lock().unwrap().conns.clear();
    }

    /// Stops (or resumes) heartbeats: connections stay open but silent.
    pub fn pause_heartbeats(&self, paused: bool) {
        self.inner.lock().unwrap().paused = paused;
    }

    /// The group's messages.
    pub fn messages(&self) -> Vec<Stored> {
        self.inner.lock().unwrap().messages.clone()
    }

    /// The messages an account sent.
    pub fn sent_by(&self, user_id: i64) -> Vec<Stored> {
        self.messages()
            .into_iter()
            .filter(|m| m.user_id == user_id)
            .collect()
    }

    /// Every action: (account, action, status).
    pub fn actions(&self) -> Vec<(i64, String, String)> {
        self.inner.lock().unwrap().actions.clone()
    }

    /// Open connections.
    pub fn connected(&self) -> usize {
        self.inner.lock().unwrap().conns.len()
    }

    /// Connections accepted so far for an account.
    pub fn accepted(&self, self_id: i64) -> usize {
        self.inner
            .lock()
            .unwrap()
            .accepted
            .get(&self_id)
            .copied()
            .unwrap_or(0)
    }

    /// Handshakes refused.
    pub fn refused(&self) -> usize {
        self.inner.lock().unwrap().refused
    }

    /// Waits (bounded: 30 s) until `cond` holds.
    pub async fn wait(&self, what: &str, cond: impl Fn(&FakeOnebot) -> bool) {
        for _ in 0..600 {
            if cond(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "onebot stand-in: {what} did not happen in time; messages: {:#?}; actions: {:?}",
            self.messages()
                .iter()
                .map(|m| (m.user_id, m.raw.clone()))
                .collect::<Vec<_>>(),
            self.actions()
        );
    }
}

// The handshake callback's error type is tungstenite's own.
#[allow(clippy::result_large_err)]
async fn connection(stream: tokio::net::TcpStream, inner: Arc<Mutex<Inner>>) {
    let mut who: Option<i64> = None;
    let check = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let g = inner.lock().unwrap();
        let id: i64 = req
            .uri()
            .path()
            .trim_matches('/')
            .parse()
            .unwrap_or_default();
        let auth = req
            .headers()
            .get("authorization")
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .to_string();
        match g.accounts.iter().find(|a| a.self_id == id) {
            Some(a) if auth == format!("Bearer {}", a.token) => {
                who = Some(id);
                Ok(resp)
            }
            _ => {
                let mut r = ErrorResponse::new(Some("unauthorized".into()));
                *r.status_mut() = tokio_tungstenite::tungstenite::http::StatusCode::UNAUTHORIZED;
                Err(r)
            }
        }
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, check).await else {
        inner.lock().unwrap().refused += 1;
        return;
    };
    let Some(self_id) = who else { return };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (conn_id, heartbeat_ms) = {
        let mut g = inner.lock().unwrap();
        *g.accepted.entry(self_id).or_default() += 1;
        g.next_conn += 1;
        let id = g.next_conn;
        g.conns.push(Conn {
            id,
            self_id,
            tx: tx.clone(),
        });
        (id, g.heartbeat_ms)
    };
    drop(tx);
    let connect = json!({"time": now_secs(), "self_id": self_id, "post_type": "meta_event", "meta_event_type": "lifecycle", "sub_type": "connect"});
    if ws.send(Message::text(connect.to_string())).await.is_err() {
        return;
    }
    let mut beat = tokio::time::interval(Duration::from_millis(heartbeat_ms));
    loop {
        tokio::select! {
            _ = beat.tick() => {
                if inner.lock().unwrap().paused {
                    continue;
                }
                let hb = json!({"time": now_secs(), "self_id": self_id, "post_type": "meta_event", "meta_event_type": "heartbeat", "status": {"online": true, "good": true}, "interval": heartbeat_ms});
                if ws.send(Message::text(hb.to_string())).await.is_err() { break; }
            }
            out = rx.recv() => match out {
                Some(m) => if ws.send(m).await.is_err() { break; },
                // Dropped by the test: end without a close frame.
                None => break,
            },
            frame = ws.next() => match frame {
                Some(Ok(Message::Text(t))) => {
                    let Ok(v) = serde_json::from_str::<Value>(t.as_str()) else { continue };
                    let answer = inner.lock().unwrap().action(self_id, &v);
                    if ws.send(Message::text(answer.to_string())).await.is_err() { break; }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    inner.lock().unwrap().conns.retain(|c| c.id != conn_id);
}
