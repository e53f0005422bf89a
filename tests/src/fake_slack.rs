//! A stand-in for Slack: the Web API (`/api/{method}`) and Socket Mode (WebSocket),
//! each on its own 127.0.0.1 port, with one workspace whose channels every app is in.
//!
//! Payloads follow Slack's documentation ("Using Socket Mode", the Events API's
//! `message` and `app_mention` events, the methods `auth.test`,
//! `apps.connections.open`, `chat.postMessage`, `chat.update`, `users.info`): every method answers
//! HTTP 200 `{"ok": true, …}` or `{"ok": false, "error": …}`, a rate limit is HTTP 429
//! with `Retry-After`; bodies are read as slack_sdk sends them (form, query string or
//! JSON; the token as `Authorization: Bearer` or a `token` field). Socket Mode: a URL
//! from apps.connections.open is good for one connection, which gets `hello`, then
//! `events_api` envelopes that must be acknowledged (`{"envelope_id": …}`); an
//! envelope not acknowledged when its connection ends is delivered again, with
//! `retry_attempt` + 1, on the app's next connection, as Slack does. Each event goes
//! to the app's newest connection. The same stand-in is driven by slack_sdk in
//! `tests/tests/slack.rs`, which proves it faithful.
//!
//! What tests control: people posting ([`FakeSlack::say`], in threads too), edits and
//! deletions, `disconnect` frames ([`FakeSlack::disconnect`]), dropped connections,
//! redelivery of an event ([`FakeSlack::redeliver`]) and 429s on chat.postMessage.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::serve::{read_request, serve_http, HttpServer, Reply};

/// The workspace.
pub const TEAM_ID: &str = "T0001";
/// How soon Slack wants an envelope acknowledged before it delivers it again.
pub const ACK_WITHIN: Duration = Duration::from_secs(3);

/// An app of the stand-in, with its bot user.
#[derive(Debug, Clone)]
pub struct SlackApp {
    /// The bot user's name.
    pub name: String,
    /// The bot user's id (`U…`).
    pub user_id: String,
    /// The bot's id (`B…`), on its messages.
    pub bot_id: String,
    /// The app's id (`A…`).
    pub app_id: String,
    /// Its bot token (`xoxb-…`).
    pub bot_token: String,
    /// Its app-level token (`xapp-…`).
    pub app_token: String,
}

/// A person in the workspace.
#[derive(Debug, Clone)]
pub struct Person {
    /// `U…`.
    pub id: String,
    /// Handle.
    pub name: String,
    /// Display name ("" when unset).
    pub display_name: String,
    /// Full name.
    pub real_name: String,
}

/// One message the stand-in holds.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its `ts`.
    pub ts: String,
    /// Channel.
    pub channel: String,
    /// Author's user id.
    pub user: String,
    /// Text, in Slack's markup.
    pub text: String,
    /// The thread it is in.
    pub thread_ts: Option<String>,
    /// The chat.postMessage parameters, for messages posted through the API.
    pub request: Option<Value>,
    /// When the stand-in took it.
    pub at: std::time::Instant,
    /// Times its author edited it through `chat.update`.
    pub edits: u32,
}

/// What a connection's task is told to do.
#[derive(Debug)]
enum Out {
    /// Send a text frame.
    Text(String),
    /// Drop the TCP connection without a close frame.
    Drop,
}

/// One open Socket Mode connection.
struct Conn {
    /// Which app.
    app: usize,
    /// Its number (for the log).
    id: u64,
    /// Frames to it.
    tx: mpsc::UnboundedSender<Out>,
}

/// An envelope sent and not acknowledged yet.
#[derive(Debug, Clone)]
struct Unacked {
    /// Which app.
    app: usize,
    /// The connection it went to (none: waiting for one).
    conn: Option<u64>,
    /// The envelope as sent.
    envelope: Value,
    /// When it was sent (Slack redelivers what is not acknowledged within 3 s).
    sent_at: std::time::Instant,
}

/// Everything the stand-in knows.
#[derive(Default)]
struct Inner {
    /// The apps.
    apps: Vec<SlackApp>,
    /// People.
    people: Vec<Person>,
    /// Channels (every app is in every one).
    channels: Vec<String>,
    /// Every message, oldest first.
    messages: Vec<Stored>,
    /// Open connections, oldest first.
    conns: Vec<Conn>,
    /// Socket Mode tickets issued and not used yet → app.
    tickets: HashMap<String, usize>,
    /// Counter for ids.
    next: u64,
    /// The last `ts` given out, in microseconds.
    last_ts: u64,
    /// Retry-After seconds of the 429s still to answer on chat.postMessage.
    limits: VecDeque<u64>,
    /// `(method, HTTP status, ok)` of every Web API request.
    requests: Vec<(String, u16, bool)>,
    /// What happened, in order: `deliver {app} {envelope_id} {event_id} {retry}`,
    /// `ack {app} {envelope_id}`, `late {app} {envelope_id}` (not acknowledged in
    /// time), `post {app} {ts}`, `hello {app} {conn}`.
    log: Vec<String>,
    /// Envelopes not acknowledged yet, by envelope id.
    unacked: HashMap<String, Unacked>,
    /// Every envelope sent, by event id: `(app, envelope)` (for redelivery).
    sent: HashMap<String, Vec<(usize, Value)>>,
    /// apps.connections.open answered.
    opens: usize,
    /// The Socket Mode URL's base (`ws://127.0.0.1:port`).
    ws_url: String,
}

/// The stand-in; stops when dropped.
pub struct FakeSlack {
    /// Web API base, ending in `/` (`http://127.0.0.1:5000/api/`).
    pub api_base_url: String,
    /// The shared state.
    inner: Arc<Mutex<Inner>>,
    /// The Web API server (stops when dropped).
    _http: HttpServer,
    /// The Socket Mode accept loop.
    sockets: JoinHandle<()>,
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        self.sockets.abort();
    }
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Inner {
    fn id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{:08X}", self.next)
    }

    /// A new `ts`, later than every earlier one.
    fn ts(&mut self) -> String {
        self.last_ts = now_micros().max(self.last_ts + 1);
        format!(
            "{}.{:06}",
            self.last_ts / 1_000_000,
            self.last_ts % 1_000_000
        )
    }

    fn app_by_user(&self, user: &str) -> Option<usize> {
        self.apps.iter().position(|a| a.user_id == user)
    }

    /// The `message` event of `m`.
    /// Tells every app that `m` (its text was `previous`) was edited:
    /// `message_changed`.
    fn changed(&mut self, m: &Stored, previous: String) {
        let mut now = self.message_event(m);
        now["edited"] = json!({"user": m.user, "ts": self.ts()});
        let event_ts = self.ts();
        let event = json!({
            "type": "message", "subtype": "message_changed", "hidden": true, "channel": m.channel,
            "ts": event_ts, "event_ts": event_ts, "channel_type": "channel",
            "message": now, "previous_message": {"type": "message", "user": m.user, "text": previous, "ts": m.ts},
        });
        for app in 0..self.apps.len() {
            self.deliver(app, event.clone());
        }
    }

    fn message_event(&self, m: &Stored) -> Value {
        let mut e = json!({
            "type": "message", "text": m.text, "user": m.user, "ts": m.ts,
            "team": TEAM_ID, "channel": m.channel, "event_ts": m.ts, "channel_type": "channel",
            "blocks": [],
        });
        if let Some(t) = &m.thread_ts {
            e["thread_ts"] = json!(t);
            if let Some(parent) = self.messages.iter().find(|p| &p.ts == t) {
                e["parent_user_id"] = json!(parent.user);
            }
        }
        match self.app_by_user(&m.user) {
            Some(i) => {
                let a = &self.apps[i];
                e["bot_id"] = json!(a.bot_id);
                e["app_id"] = json!(a.app_id);
                e["bot_profile"] = json!({
                    "id": a.bot_id, "app_id": a.app_id, "name": a.name, "icons": {},
                    "deleted": false, "updated": 1_700_000_000u64, "team_id": TEAM_ID,
                });
            }
            None => e["client_msg_id"] = json!(format!("{:032x}", rand::random::<u128>())),
        }
        e
    }

    /// Sends `event` to app `app` in a fresh envelope.
    fn deliver(&mut self, app: usize, event: Value) {
        let event_id = self.id("Ev");
        let envelope_id = format!("{:08x}-fake-{}", rand::random::<u32>(), self.next);
        let a = &self.apps[app];
        let envelope = json!({
            "envelope_id": envelope_id,
            "payload": {
                "token": "verification-token-unused", "team_id": TEAM_ID, "context_team_id": TEAM_ID,
                "api_app_id": a.app_id, "event": event, "type": "event_callback",
                "event_id": event_id, "event_time": now_micros() / 1_000_000,
                "authorizations": [{"enterprise_id": null, "team_id": TEAM_ID, "user_id": a.user_id,
                    "is_bot": true, "is_enterprise_install": false}],
                "is_ext_shared_channel": false, "event_context": format!("4-{event_id}"),
            },
            "type": "events_api", "accepts_response_payload": false,
            "retry_attempt": 0, "retry_reason": "",
        });
        self.sent
            .entry(event_id)
            .or_default()
            .push((app, envelope.clone()));
        self.send_envelope(app, envelope);
    }

    /// Sends an envelope to the app's newest connection (or keeps it for the next).
    fn send_envelope(&mut self, app: usize, envelope: Value) {
        let envelope_id = envelope["envelope_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let conn = self.conns.iter().rev().find(|c| c.app == app);
        let conn_id = conn.map(|c| c.id);
        if let Some(c) = conn {
            let _ = c.tx.send(Out::Text(envelope.to_string()));
            self.log.push(format!(
                "deliver {app} {envelope_id} {} {}",
                envelope["payload"]["event_id"].as_str().unwrap_or_default(),
                envelope["retry_attempt"]
            ));
        }
        self.unacked.insert(
            envelope_id,
            Unacked {
                app,
                conn: conn_id,
                envelope,
                sent_at: std::time::Instant::now(),
            },
        );
    }

    /// A new message: stored, and its event sent to every app (an `app_mention` too to
    /// each app whose bot user it mentions, other than the author).
    fn post(&mut self, m: Stored) {
        let event = self.message_event(&m);
        self.messages.push(m.clone());
        for app in 0..self.apps.len() {
            self.deliver(app, event.clone());
            let me = self.apps[app].user_id.clone();
            if m.user != me && m.text.contains(&format!("<@{me}>")) {
                let mut mention = json!({
                    "type": "app_mention", "user": m.user, "text": m.text, "ts": m.ts,
                    "team": TEAM_ID, "channel": m.channel, "event_ts": m.ts,
                });
                if let Some(t) = &m.thread_ts {
                    mention["thread_ts"] = json!(t);
                }
                self.deliver(app, mention);
            }
        }
    }

    /// Slack's rule for slow clients: an envelope on an open connection that is not
    /// acknowledged within [`ACK_WITHIN`] is delivered again, `retry_attempt` + 1,
    /// reason `timeout`.
    fn redeliver_late(&mut self) {
        let live: Vec<u64> = self.conns.iter().map(|c| c.id).collect();
        let late: Vec<String> = self
            .unacked
            .iter()
            .filter(|(_, u)| {
                u.conn.is_some_and(|c| live.contains(&c)) && u.sent_at.elapsed() >= ACK_WITHIN
            })
            .map(|(k, _)| k.clone())
            .collect();
        for id in late {
            let Some(u) = self.unacked.remove(&id) else {
                continue;
            };
            self.log.push(format!("late {} {id}", u.app));
            let mut envelope = u.envelope;
            let attempt = envelope["retry_attempt"].as_u64().unwrap_or(0) + 1;
            envelope["retry_attempt"] = json!(attempt);
            envelope["retry_reason"] = json!("timeout");
            self.send_envelope(u.app, envelope);
        }
    }

    /// A connection of `app` said hello: what was waiting for the app goes to it,
    /// redelivered (`retry_attempt` + 1) when it had gone to a connection that ended.
    fn resend_waiting(&mut self, app: usize) {
        let live: Vec<u64> = self.conns.iter().map(|c| c.id).collect();
        let waiting: Vec<(String, Unacked)> = self
            .unacked
            .iter()
            .filter(|(_, u)| u.app == app && u.conn.is_none_or(|c| !live.contains(&c)))
            .map(|(k, u)| (k.clone(), u.clone()))
            .collect();
        for (id, u) in waiting {
            self.unacked.remove(&id);
            let mut envelope = u.envelope;
            if u.conn.is_some() {
                let attempt = envelope["retry_attempt"].as_u64().unwrap_or(0) + 1;
                envelope["retry_attempt"] = json!(attempt);
                envelope["retry_reason"] = json!("timeout");
            }
            self.send_envelope(app, envelope);
        }
    }
}

impl FakeSlack {
    /// Starts the stand-in with these apps, people and channels.
    pub async fn start(apps: Vec<SlackApp>, people: Vec<Person>, channels: &[&str]) -> FakeSlack {
        let ws = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind socket mode");
        let inner = Arc::new(Mutex::new(Inner {
            apps,
            people,
            channels: channels.iter().map(|c| c.to_string()).collect(),
            ws_url: format!("ws://{}", ws.local_addr().unwrap()),
            ..Default::default()
        }));
        let state = inner.clone();
        let http = serve_http(move |req| handle(state.clone(), req)).await;
        let api_base_url = format!("{}/api/", http.url());
        let sockets = tokio::spawn(accept_loop(ws, inner.clone()));
        FakeSlack {
            api_base_url,
            inner,
            _http: http,
            sockets,
        }
    }

    /// A person posts `text` (Slack markup) in `channel`; returns its `ts`.
    pub fn say(&self, channel: &str, user: &str, text: &str) -> String {
        self.say_in_thread(channel, user, text, None)
    }

    /// A person posts `text` in `channel`, in the thread of `thread_ts` if given.
    pub fn say_in_thread(
        &self,
        channel: &str,
        user: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> String {
        let mut g = self.inner.lock().unwrap();
        let ts = g.ts();
        g.post(Stored {
            ts: ts.clone(),
            channel: channel.into(),
            user: user.into(),
            text: text.into(),
            thread_ts: thread_ts.map(str::to_string),
            request: None,
            at: std::time::Instant::now(),
            edits: 0,
        });
        ts
    }

    /// The author edits a message (`message_changed`).
    pub fn edit(&self, channel: &str, ts: &str, text: &str) {
        let mut g = self.inner.lock().unwrap();
        let Some(m) = g
            .messages
            .iter_mut()
            .find(|m| m.ts == ts && m.channel == channel)
        else {
            return;
        };
        let previous = std::mem::replace(&mut m.text, text.into());
        let m = m.clone();
        g.changed(&m, previous);
    }

    /// A message is deleted (`message_deleted`).
    pub fn delete(&self, channel: &str, ts: &str) {
        let mut g = self.inner.lock().unwrap();
        let event_ts = g.ts();
        let event = json!({
            "type": "message", "subtype": "message_deleted", "hidden": true, "channel": channel,
            "ts": event_ts, "deleted_ts": ts, "event_ts": event_ts, "channel_type": "channel",
        });
        for app in 0..g.apps.len() {
            g.deliver(app, event.clone());
        }
    }

    /// Slack's retry of an event it already delivered (as after a late ack): the same
    /// envelope to each app that got it, `retry_attempt` 1, reason `timeout`.
    pub fn redeliver(&self, event_id: &str) {
        let mut g = self.inner.lock().unwrap();
        for (app, mut envelope) in g.sent.get(event_id).cloned().unwrap_or_default() {
            envelope["envelope_id"] = json!(format!("{:08x}-retry", rand::random::<u32>()));
            envelope["retry_attempt"] = json!(1);
            envelope["retry_reason"] = json!("timeout");
            g.send_envelope(app, envelope);
        }
    }

    /// Sends `{"type": "disconnect", "reason": reason}` on every open connection (which
    /// stays open until the client closes it, as Slack's does for a while).
    pub fn disconnect(&self, reason: &str) {
        let g = self.inner.lock().unwrap();
        let frame =
            json!({"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}});
        for c in &g.conns {
            let _ = c.tx.send(Out::Text(frame.to_string()));
        }
    }

    /// Drops every connection without a close frame.
    pub fn drop_connections(&self) {
        let g = self.inner.lock().unwrap();
        for c in &g.conns {
            let _ = c.tx.send(Out::Drop);
        }
    }

    /// The next `n` chat.postMessage calls answer 429 with `Retry-After: secs`.
    pub fn rate_limit(&self, n: usize, secs: u64) {
        let mut g = self.inner.lock().unwrap();
        for _ in 0..n {
            g.limits.push_back(secs);
        }
    }

    /// Every message in `channel`, oldest first.
    pub fn messages(&self, channel: &str) -> Vec<Stored> {
        let g = self.inner.lock().unwrap();
        g.messages
            .iter()
            .filter(|m| m.channel == channel)
            .cloned()
            .collect()
    }

    /// Messages posted through chat.postMessage by the bot user `user`.
    pub fn posted_by(&self, user: &str) -> Vec<Stored> {
        let g = self.inner.lock().unwrap();
        g.messages
            .iter()
            .filter(|m| m.user == user && m.request.is_some())
            .cloned()
            .collect()
    }

    /// `(method, HTTP status, ok)` of every Web API request so far.
    pub fn requests(&self) -> Vec<(String, u16, bool)> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// What happened, in order (see `Inner::log`).
    pub fn log(&self) -> Vec<String> {
        self.inner.lock().unwrap().log.clone()
    }

    /// Envelopes sent and not acknowledged.
    pub fn unacked(&self) -> usize {
        let g = self.inner.lock().unwrap();
        g.unacked.values().filter(|u| u.conn.is_some()).count()
    }

    /// The event ids sent to the app of bot user `user`, in order.
    pub fn events_for(&self, user: &str) -> Vec<String> {
        let g = self.inner.lock().unwrap();
        let Some(app) = g.app_by_user(user) else {
            return Vec::new();
        };
        g.log
            .iter()
            .filter_map(|l| {
                let parts: Vec<&str> = l.split(' ').collect();
                (parts[0] == "deliver" && parts[1] == app.to_string()).then(|| parts[3].to_string())
            })
            .collect()
    }

    /// apps.connections.open answered so far.
    pub fn opens(&self) -> usize {
        self.inner.lock().unwrap().opens
    }

    /// Apps with an open connection.
    pub fn connected(&self) -> usize {
        let g = self.inner.lock().unwrap();
        let mut apps: Vec<usize> = g.conns.iter().map(|c| c.app).collect();
        apps.sort();
        apps.dedup();
        apps.len()
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.inner.lock().unwrap().conns.len()
    }

    /// Waits (bounded) until `cond` holds of the stand-in.
    pub async fn wait(&self, what: &str, cond: impl Fn(&FakeSlack) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !cond(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "fake slack: timed out waiting for {what}; log: {:#?}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// ---------------------------------------------------------------------------------
// Web API
// ---------------------------------------------------------------------------------

/// An answer: HTTP status, body, `Retry-After`.
type Answer = (u16, Value, Option<u64>);

fn answer(status: u16, body: Value, retry_after: Option<u64>) -> Answer {
    (status, body, retry_after)
}

fn reply((status, body, retry_after): Answer) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    if let Some(s) = retry_after {
        r.headers_mut()
            .insert("retry-after", hyper::header::HeaderValue::from(s));
    }
    r
}

fn fail(error: &str) -> Answer {
    answer(200, json!({"ok": false, "error": error}), None)
}

/// `key=value&…` pairs.
fn form_pairs(s: &str) -> Vec<(String, String)> {
    reqwest::Url::parse(&format!("http://x/?{s}"))
        .map(|u| {
            u.query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

async fn handle(inner: Arc<Mutex<Inner>>, req: Request<Incoming>) -> Reply {
    let (parts, body) = read_request(req).await;
    let method = parts
        .uri
        .path()
        .strip_prefix("/api/")
        .unwrap_or_default()
        .to_string();
    let mut params: serde_json::Map<String, Value> = serde_json::Map::new();
    for (k, v) in form_pairs(parts.uri.query().unwrap_or("")) {
        params.insert(k, json!(v));
    }
    let content_type = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if content_type.starts_with("application/json") && !body.trim_ascii().is_empty() {
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(m)) => params.extend(m),
            _ => return reply(fail("invalid_json")),
        }
    } else if !body.is_empty() {
        for (k, v) in form_pairs(&String::from_utf8_lossy(&body)) {
            params.insert(k, json!(v));
        }
    }
    let token = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string)
        .or_else(|| {
            params
                .get("token")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default();
    let (status, body, retry_after) = route(&inner, &method, &token, &params);
    let ok = body["ok"] == json!(true);
    inner.lock().unwrap().requests.push((method, status, ok));
    reply((status, body, retry_after))
}

fn route(
    inner: &Mutex<Inner>,
    method: &str,
    token: &str,
    p: &serde_json::Map<String, Value>,
) -> Answer {
    let mut g = inner.lock().unwrap();
    let by_bot = g.apps.iter().position(|a| a.bot_token == token);
    let by_app = g.apps.iter().position(|a| a.app_token == token);
    let param = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    match method {
        "apps.connections.open" => {
            let Some(app) = by_app else {
                return fail(if by_bot.is_some() {
                    "not_allowed_token_type"
                } else {
                    "invalid_auth"
                });
            };
            g.opens += 1;
            let ticket = format!("{:032x}", rand::random::<u128>());
            g.tickets.insert(ticket.clone(), app);
            let url = format!(
                "{}/link/?ticket={ticket}&app_id={}",
                g.ws_url, g.apps[app].app_id
            );
            answer(200, json!({"ok": true, "url": url}), None)
        }
        "auth.test" => {
            let Some(app) = by_bot else {
                return fail(if by_app.is_some() {
                    "not_allowed_token_type"
                } else {
                    "invalid_auth"
                });
            };
            let a = &g.apps[app];
            answer(
                200,
                json!({"ok": true, "url": "https://fake-workspace.slack.com/", "team": "Fake Workspace",
                    "user": a.name, "team_id": TEAM_ID, "user_id": a.user_id, "bot_id": a.bot_id,
                    "is_enterprise_install": false}),
                None,
            )
        }
        "users.info" => {
            if by_bot.is_none() {
                return fail("invalid_auth");
            }
            let id = param("user");
            if let Some(person) = g.people.iter().find(|x| x.id == id) {
                return answer(
                    200,
                    json!({"ok": true, "user": {
                        "id": person.id, "team_id": TEAM_ID, "name": person.name, "deleted": false,
                        "real_name": person.real_name, "tz": "Europe/Berlin", "is_admin": false,
                        "is_owner": false, "is_bot": false, "is_app_user": false, "updated": 1_700_000_000u64,
                        "profile": {"display_name": person.display_name, "real_name": person.real_name,
                            "display_name_normalized": person.display_name, "real_name_normalized": person.real_name,
                            "team": TEAM_ID},
                    }}),
                    None,
                );
            }
            if let Some(a) = g.apps.iter().find(|a| a.user_id == id) {
                return answer(
                    200,
                    json!({"ok": true, "user": {"id": a.user_id, "team_id": TEAM_ID, "name": a.name,
                        "deleted": false, "real_name": a.name, "is_bot": true, "is_app_user": false,
                        "updated": 1_700_000_000u64,
                        "profile": {"display_name": "", "real_name": a.name, "bot_id": a.bot_id, "team": TEAM_ID}}}),
                    None,
                );
            }
            fail("user_not_found")
        }
        "chat.postMessage" => {
            let Some(app) = by_bot else {
                return fail(if by_app.is_some() {
                    "not_allowed_token_type"
                } else {
                    "invalid_auth"
                });
            };
            let channel = param("channel");
            if !g.channels.contains(&channel) {
                return fail("channel_not_found");
            }
            if let Some(secs) = g.limits.pop_front() {
                return answer(
                    429,
                    json!({"ok": false, "error": "ratelimited"}),
                    Some(secs),
                );
            }
            let text = param("text");
            if text.trim().is_empty() {
                return fail("no_text");
            }
            if text.chars().count() > 40_000 {
                return fail("msg_too_long");
            }
            let thread_ts = Some(param("thread_ts")).filter(|t| !t.is_empty());
            let ts = g.ts();
            let user = g.apps[app].user_id.clone();
            let m = Stored {
                ts: ts.clone(),
                channel: channel.clone(),
                user,
                text,
                thread_ts,
                request: Some(Value::Object(p.clone())),
                at: std::time::Instant::now(),
                edits: 0,
            };
            let message = g.message_event(&m);
            g.log.push(format!("post {app} {ts}"));
            g.post(m);
            answer(
                200,
                json!({"ok": true, "channel": channel, "ts": ts, "message": message}),
                None,
            )
        }
        "chat.update" => {
            // api.slack.com/methods/chat.update: the bot edits its own message
            // (`message_not_found`, `cant_update_message` for anyone else's); the
            // channel's members get `message_changed`.
            let Some(app) = by_bot else {
                return fail(if by_app.is_some() {
                    "not_allowed_token_type"
                } else {
                    "invalid_auth"
                });
            };
            let (channel, ts, text) = (param("channel"), param("ts"), param("text"));
            if !g.channels.contains(&channel) {
                return fail("channel_not_found");
            }
            if text.trim().is_empty() {
                return fail("no_text");
            }
            if text.chars().count() > 40_000 {
                return fail("msg_too_long");
            }
            let user = g.apps[app].user_id.clone();
            let Some(m) = g
                .messages
                .iter_mut()
                .find(|m| m.ts == ts && m.channel == channel)
            else {
                return fail("message_not_found");
            };
            if m.user != user {
                return fail("cant_update_message");
            }
            let previous = std::mem::replace(&mut m.text, text.clone());
            m.edits += 1;
            let m = m.clone();
            g.changed(&m, previous);
            g.log.push(format!("update {app} {ts}"));
            answer(
                200,
                json!({"ok": true, "channel": channel, "ts": ts, "text": text, "message": {"type": "message", "user": m.user, "text": m.text}}),
                None,
            )
        }
        _ => fail("unknown_method"),
    }
}

// ---------------------------------------------------------------------------------
// Socket Mode
// ---------------------------------------------------------------------------------

// tungstenite's handshake callback must return its large `ErrorResponse` type.
#[allow(clippy::result_large_err)]
async fn accept_loop(listener: TcpListener, inner: Arc<Mutex<Inner>>) {
    let mut connections = JoinSet::new();
    let mut check = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = check.tick() => inner.lock().unwrap().redeliver_late(),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let inner = inner.clone();
                    connections.spawn(async move {
                        let mut query = String::new();
                        let capture = |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
                                       resp: tokio_tungstenite::tungstenite::handshake::server::Response| {
                            query = req.uri().query().unwrap_or("").to_string();
                            Ok(resp)
                        };
                        if let Ok(ws) = tokio_tungstenite::accept_hdr_async(stream, capture).await {
                            connection(ws, inner, query).await;
                        }
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn connection(
    mut ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    inner: Arc<Mutex<Inner>>,
    query: String,
) {
    let ticket = form_pairs(&query)
        .into_iter()
        .find(|(k, _)| k == "ticket")
        .map(|(_, v)| v)
        .unwrap_or_default();
    let (tx, mut rx) = mpsc::unbounded_channel::<Out>();
    let accepted = {
        let mut g = inner.lock().unwrap();
        g.tickets.remove(&ticket).map(|app| {
        g.next += 1;
        let id = g.next;
        g.conns.push(Conn {
            app,
            id,
            tx: tx.clone(),
        });
        let n = g.conns.iter().filter(|c| c.app == app).count();
        g.log.push(format!("hello {app} {id}"));
        let hello = json!({"type": "hello", "num_connections": n,
            "debug_info": {"host": "applink-fake", "build_number": 1, "approximate_connection_time": 18060},
            "connection_info": {"app_id": g.apps[app].app_id}});
        (app, id, hello)
        })
    };
    let Some((app, conn_id, hello)) = accepted else {
        // A URL is good for one connection: an unknown or used ticket is refused.
        let _ = ws.close(None).await;
        return;
    };
    if ws.send(WsMessage::text(hello.to_string())).await.is_ok() {
        inner.lock().unwrap().resend_waiting(app);
        loop {
            tokio::select! {
                out = rx.recv() => match out {
                    Some(Out::Text(t)) => {
                        if ws.send(WsMessage::text(t)).await.is_err() {
                            break;
                        }
                    }
                    Some(Out::Drop) | None => break,
                },
                frame = ws.next() => {
                    let text = match frame {
                        Some(Ok(WsMessage::Text(t))) => t.as_str().to_string(),
                        Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
                        Some(Ok(_)) => continue, // pings are answered by tungstenite
                    };
                    let Ok(v) = serde_json::from_str::<Value>(&text) else { continue };
                    if let Some(id) = v["envelope_id"].as_str() {
                        let mut g = inner.lock().unwrap();
                        if g.unacked.remove(id).is_some() {
                            g.log.push(format!("ack {app} {id}"));
                        }
                    }
                }
            }
        }
    }
    let mut g = inner.lock().unwrap();
    g.conns.retain(|c| c.id != conn_id);
    // What this connection did not acknowledge goes to the app's next one.
    let others: Vec<u64> = g
        .conns
        .iter()
        .filter(|c| c.app == app)
        .map(|c| c.id)
        .collect();
    if !others.is_empty() {
        g.resend_waiting(app);
    }
}
