//! A stand-in for Discord: the REST API (`/api/v10/...`) on one port and the gateway
//! (v10, JSON, text frames) on another, both on 127.0.0.1, with one guild whose
//! channels every bot account can read.
//!
//! Payloads follow Discord's API documentation (discord/discord-api-docs: "Gateway",
//! "Gateway Events", "Message", "User", "Rate Limits"): HELLO, READY (with
//! `session_id` and `resume_gateway_url`), GUILD_CREATE, MESSAGE_CREATE with `member`
//! and `mentions[].member`, HEARTBEAT_ACK, RESUMED, INVALID_SESSION, close codes 4004
//! (bad token) and 4014 (privileged intent not enabled); REST answers carry
//! `X-RateLimit-*` headers and a 429 carries `retry_after`. The same stand-in is
//! driven by discord.py in `tests/tests/discord.rs`, which proves it faithful.
//!
//! What tests control: people posting ([`FakeDiscord::say`]), edits and deletions,
//! dropping every gateway connection (sessions survive; what happens meanwhile is
//! replayed on RESUME, as Discord does), 429 bursts ([`FakeDiscord::rate_limit`]),
//! and whether the MESSAGE CONTENT intent is enabled. A bot edits its own messages
//! (`PATCH /channels/{id}/messages/{id}`, MESSAGE_UPDATE). What tests read: the messages,
//! every REST request, and every typing indicator a bot triggered
//! ([`FakeDiscord::typing`], `POST /channels/{id}/typing`).

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
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::serve::{read_request, serve_http, HttpServer, Reply};

/// The guild every account is in.
pub const GUILD_ID: &str = "1100000000000000001";
/// Discord's epoch in unix milliseconds.
const EPOCH_MS: u64 = 1_420_070_400_000;

/// A bot account of the stand-in.
#[derive(Debug, Clone)]
pub struct BotAccount {
    /// Its token.
    pub token: String,
    /// Its user id.
    pub user_id: String,
    /// Its username.
    pub username: String,
}

/// A person in the guild.
#[derive(Debug, Clone)]
pub struct Person {
    /// User id.
    pub id: String,
    /// Username.
    pub username: String,
    /// Display name.
    pub global_name: Option<String>,
    /// Server nickname.
    pub nick: Option<String>,
}

/// One message the stand-in holds.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its id.
    pub id: String,
    /// Channel.
    pub channel_id: String,
    /// Author's user id.
    pub author_id: String,
    /// Text.
    pub content: String,
    /// The POST body, for messages posted through the REST API.
    pub request: Option<Value>,
    /// When the stand-in took it.
    pub at: std::time::Instant,
    /// Times its author edited it (`PATCH /channels/{id}/messages/{id}`).
    pub edits: u32,
}

/// One `POST /channels/{id}/typing` the stand-in took.
#[derive(Debug, Clone)]
pub struct Typed {
    /// The channel typed in.
    pub channel_id: String,
    /// The bot's user id.
    pub user_id: String,
    /// How many messages the stand-in held then (all channels): a typing call with
    /// `messages_before > i` came after message `i` (in [`FakeDiscord::all_messages`]).
    pub messages_before: usize,
}

/// A 429 to answer.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    /// Seconds in `retry_after`.
    pub retry_after: f64,
    /// The global limit (else the route's).
    pub global: bool,
}

/// An instruction for one gateway connection.
#[derive(Debug)]
enum Out {
    /// Send a text frame.
    Text(String),
    /// Close with this code.
    Close(u16),
    /// Drop the TCP connection without a close frame.
    Drop,
}

/// A gateway session, kept across connections so it can be resumed.
struct Session {
    /// The bot's token (a RESUME must carry the same).
    token: String,
    /// The last sequence number given out.
    seq: u64,
    /// Every dispatch with its seq (what a RESUME replays).
    backlog: Vec<(u64, Value)>,
    /// The connection it is on now, if any.
    conn: Option<mpsc::UnboundedSender<Out>>,
}

/// Everything the stand-in knows.
#[derive(Default)]
struct Inner {
    /// Bot accounts (tokens).
    bots: Vec<BotAccount>,
    /// People in the guild.
    people: Vec<Person>,
    /// The guild's text channels.
    channels: Vec<String>,
    /// Every message, oldest first.
    messages: Vec<Stored>,
    /// Gateway sessions by id.
    sessions: HashMap<String, Session>,
    /// Counter in the low bits of new snowflakes.
    next_id: u64,
    /// 429s still to answer.
    limits: VecDeque<Limit>,
    /// (author, nonce) → message id, for `enforce_nonce`.
    nonces: HashMap<(String, String), String>,
    /// `(method path, status)` of every REST request.
    requests: Vec<(String, u16)>,
    /// Every typing indicator triggered, in order.
    typing: Vec<Typed>,
    /// IDENTIFYs received.
    identifies: usize,
    /// RESUMEs received.
    resumes: usize,
    /// Heartbeats received.
    heartbeats: usize,
    /// Gateway connections accepted.
    connections: usize,
    /// Whether bots may ask for MESSAGE_CONTENT (else 4014).
    message_content_enabled: bool,
    /// When set, every accepted post empties its bucket for this many seconds.
    bucket_reset_after: Option<f64>,
    /// HELLO's interval.
    heartbeat_interval: u64,
    /// What `GET /gateway/bot` and READY's `resume_gateway_url` say.
    gateway_url: String,
}

/// The stand-in; stops when dropped.
pub struct FakeDiscord {
    /// REST base, e.g. `http://127.0.0.1:5000/api/v10`.
    pub api_base_url: String,
    /// Gateway URL, e.g. `ws://127.0.0.1:5001`.
    pub gateway_url: String,
    /// The shared state.
    inner: Arc<Mutex<Inner>>,
    /// The REST server (stops when dropped).
    _rest: HttpServer,
    /// The gateway's accept loop.
    gateway: JoinHandle<()>,
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.gateway.abort();
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A user object as the API shows it (discord.py rejects one without `avatar`).
fn user_json(id: &str, username: &str, global_name: Option<&str>, bot: bool) -> Value {
    let mut u = json!({
        "id": id, "username": username, "discriminator": "0",
        "global_name": global_name, "avatar": null, "public_flags": 0, "flags": 0,
        "banner": null, "accent_color": null, "avatar_decoration_data": null,
    });
    if bot {
        u["bot"] = json!(true);
    }
    u
}

/// A guild member object without its user (as in MESSAGE_CREATE).
fn member_json(nick: Option<&str>) -> Value {
    json!({
        "nick": nick, "roles": [], "joined_at": "2024-01-01T00:00:00.000000+00:00",
        "premium_since": null, "deaf": false, "mute": false, "flags": 0,
        "pending": false, "avatar": null, "banner": null, "communication_disabled_until": null,
    })
}

fn timestamp() -> String {
    // ISO8601 with a fixed date: nothing in the mesh reads it.
    "2026-01-01T00:00:00.000000+00:00".to_string()
}

impl Inner {
    fn snowflake(&mut self) -> String {
        self.next_id += 1;
        (((now_ms() - EPOCH_MS) << 22) | (self.next_id & 0x3f_ffff)).to_string()
    }

    fn user_of(&self, id: &str) -> Option<(Value, Value)> {
        if let Some(b) = self.bots.iter().find(|b| b.user_id == id) {
            return Some((
                user_json(&b.user_id, &b.username, None, true),
                member_json(None),
            ));
        }
        self.people.iter().find(|p| p.id == id).map(|p| {
            (
                user_json(&p.id, &p.username, p.global_name.as_deref(), false),
                member_json(p.nick.as_deref()),
            )
        })
    }

    /// MESSAGE_CREATE's data for a message by `author_id`.
    fn message_json(
        &self,
        id: &str,
        channel_id: &str,
        author_id: &str,
        content: &str,
        reference: Option<&Value>,
    ) -> Value {
        let (author, member) = self.user_of(author_id).unwrap_or_else(|| {
            (
                user_json(author_id, "unknown", None, false),
                member_json(None),
            )
        });
        let mut mentions = Vec::new();
        let mut roles = Vec::new();
        let mut rest = content;
        while let Some(i) = rest.find("<@") {
            let after = &rest[i + 2..];
            let (role, after) = match after.strip_prefix('&') {
                Some(a) => (true, a),
                None => (false, after.strip_prefix('!').unwrap_or(after)),
            };
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            if !digits.is_empty() && after[digits.len()..].starts_with('>') {
                if role {
                    roles.push(json!(digits));
                } else if let Some((mut u, m)) = self.user_of(&digits) {
                    u["member"] = m;
                    if !mentions.iter().any(|x: &Value| x["id"] == u["id"]) {
                        mentions.push(u);
                    }
                }
            }
            rest = &rest[i + 2..];
        }
        let mut msg = json!({
            "id": id, "channel_id": channel_id, "guild_id": GUILD_ID,
            "author": author, "member": member, "content": content,
            "timestamp": timestamp(), "edited_timestamp": null, "tts": false,
            "mention_everyone": content.contains("@everyone") || content.contains("@here"),
            "mentions": mentions, "mention_roles": roles, "attachments": [], "embeds": [],
            "pinned": false, "type": if reference.is_some() { 19 } else { 0 }, "flags": 0,
            "components": [],
        });
        if let Some(r) = reference {
            // Clients may send the id as a number (discord.py does); Discord answers strings.
            let id = match &r["message_id"] {
                Value::Number(n) => n.to_string(),
                other => other.as_str().unwrap_or_default().to_string(),
            };
            msg["message_reference"] = json!({
                "type": 0, "message_id": id, "channel_id": channel_id, "guild_id": GUILD_ID,
            });
            msg["referenced_message"] = Value::Null;
        }
        msg
    }

    /// Sends a dispatch to every session (buffered for those not connected).
    fn dispatch(&mut self, t: &str, d: Value) {
        for s in self.sessions.values_mut() {
            s.seq += 1;
            let payload = json!({"op": 0, "s": s.seq, "t": t, "d": d});
            s.backlog.push((s.seq, payload.clone()));
            if let Some(c) = &s.conn {
                let _ = c.send(Out::Text(payload.to_string()));
            }
        }
    }

    fn guild_create(&self) -> Value {
        let channels: Vec<Value> = self
            .channels
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "id": c, "type": 0, "guild_id": GUILD_ID, "name": format!("channel-{i}"),
                    "position": i, "permission_overwrites": [], "nsfw": false, "topic": null,
                    "last_message_id": null, "rate_limit_per_user": 0, "parent_id": null,
                })
            })
            .collect();
        let mut g = json!({
            "id": GUILD_ID, "name": "botmesh test guild", "icon": null, "splash": null,
            "discovery_splash": null,
            "owner_id": self.people.first().map(|p| p.id.clone()).unwrap_or_default(),
            "afk_channel_id": null, "afk_timeout": 300, "verification_level": 0,
            "default_message_notifications": 0, "explicit_content_filter": 0,
            "emojis": [], "features": [], "mfa_level": 0, "application_id": null,
            "system_channel_id": null, "system_channel_flags": 0, "rules_channel_id": null,
        });
        let more = json!({
            "max_members": 500000, "vanity_url_code": null, "description": null, "banner": null,
            "premium_tier": 0, "premium_subscription_count": 0, "preferred_locale": "en-US",
            "public_updates_channel_id": null, "nsfw_level": 0, "stickers": [],
            "premium_progress_bar_enabled": false, "safety_alerts_channel_id": null,
        });
        let gateway_fields = json!({
            "joined_at": "2024-01-01T00:00:00.000000+00:00", "large": false, "unavailable": false,
            "member_count": self.people.len() + self.bots.len(), "voice_states": [], "members": [],
            "channels": channels, "threads": [], "presences": [], "stage_instances": [],
            "guild_scheduled_events": [], "soundboard_sounds": [],
        });
        g["roles"] = json!([{"id": GUILD_ID, "name": "@everyone", "color": 0, "hoist": false,
            "icon": null, "unicode_emoji": null, "position": 0, "permissions": "0",
            "managed": false, "mentionable": false, "flags": 0}]);
        for part in [more, gateway_fields] {
            if let (Some(g), Value::Object(p)) = (g.as_object_mut(), part) {
                g.extend(p);
            }
        }
        g
    }
}

impl FakeDiscord {
    /// Starts the stand-in with these bot accounts, people and channels.
    pub async fn start(
        bots: Vec<BotAccount>,
        people: Vec<Person>,
        channels: &[&str],
    ) -> FakeDiscord {
        let gw = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind gateway");
        let gateway_url = format!("ws://{}", gw.local_addr().unwrap());
        let inner = Arc::new(Mutex::new(Inner {
            bots,
            people,
            channels: channels.iter().map(|c| c.to_string()).collect(),
            message_content_enabled: true,
            heartbeat_interval: 41_250,
            gateway_url: gateway_url.clone(),
            ..Default::default()
        }));
        let state = inner.clone();
        let rest = serve_http(move |req| handle(state.clone(), req)).await;
        let api_base_url = format!("{}/api/v10", rest.url());
        let gateway = tokio::spawn(gateway_loop(gw, inner.clone()));
        FakeDiscord {
            api_base_url,
            gateway_url,
            inner,
            _rest: rest,
            gateway,
        }
    }

    /// Whether the bots' MESSAGE CONTENT intent is enabled (off: IDENTIFY gets 4014).
    pub fn set_message_content_enabled(&self, on: bool) {
        self.inner.lock().unwrap().message_content_enabled = on;
    }

    /// HELLO's heartbeat interval for new connections.
    pub fn set_heartbeat_interval(&self, ms: u64) {
        self.inner.lock().unwrap().heartbeat_interval = ms;
    }

    /// A person posts `content` in `channel`; returns the message id.
    pub fn say(&self, channel: &str, person_id: &str, content: &str) -> String {
        let mut g = self.inner.lock().unwrap();
        let id = g.snowflake();
        let d = g.message_json(&id, channel, person_id, content, None);
        g.messages.push(Stored {
            id: id.clone(),
            channel_id: channel.into(),
            author_id: person_id.into(),
            content: content.into(),
            request: None,
            at: std::time::Instant::now(),
            edits: 0,
        });
        g.dispatch("MESSAGE_CREATE", d);
        id
    }

    /// The author edits a message (MESSAGE_UPDATE).
    pub fn edit(&self, message_id: &str, content: &str) {
        let mut g = self.inner.lock().unwrap();
        let Some(m) = g.messages.iter_mut().find(|m| m.id == message_id) else {
            return;
        };
        m.content = content.into();
        let m = m.clone();
        let mut d = g.message_json(&m.id, &m.channel_id, &m.author_id, content, None);
        d["edited_timestamp"] = json!(timestamp());
        g.dispatch("MESSAGE_UPDATE", d);
    }

    /// A message is deleted (MESSAGE_DELETE).
    pub fn delete(&self, message_id: &str) {
        let mut g = self.inner.lock().unwrap();
        let Some(m) = g.messages.iter().find(|m| m.id == message_id).cloned() else {
            return;
        };
        g.dispatch(
            "MESSAGE_DELETE",
            json!({"id": m.id, "channel_id": m.channel_id, "guild_id": GUILD_ID}),
        );
    }

    /// Drops every gateway connection without a close frame; sessions stay resumable
    /// and keep collecting what happens meanwhile.
    pub fn drop_connections(&self) {
        let mut g = self.inner.lock().unwrap();
        for s in g.sessions.values_mut() {
            if let Some(c) = s.conn.take() {
                let _ = c.send(Out::Drop);
            }
        }
    }

    /// Closes every gateway connection with `code`.
    pub fn close_connections(&self, code: u16) {
        let mut g = self.inner.lock().unwrap();
        for s in g.sessions.values_mut() {
            if let Some(c) = s.conn.take() {
                let _ = c.send(Out::Close(code));
            }
        }
    }

    /// The next `n` message posts answer 429 with these settings.
    pub fn rate_limit(&self, n: usize, limit: Limit) {
        let mut g = self.inner.lock().unwrap();
        for _ in 0..n {
            g.limits.push_back(limit);
        }
    }

    /// From now on every accepted post answers `X-RateLimit-Remaining: 0` with this
    /// `X-RateLimit-Reset-After`, so a client that obeys waits that long between posts.
    pub fn empty_bucket_after_each_post(&self, reset_after: f64) {
        self.inner.lock().unwrap().bucket_reset_after = Some(reset_after);
    }

    /// Every message in `channel`, oldest first.
    pub fn messages(&self, channel: &str) -> Vec<Stored> {
        self.inner
            .lock()
            .unwrap()
            .messages
            .iter()
            .filter(|m| m.channel_id == channel)
            .cloned()
            .collect()
    }

    /// Every message in every channel, in the order the stand-in took them.
    pub fn all_messages(&self) -> Vec<Stored> {
        self.inner.lock().unwrap().messages.clone()
    }

    /// Every typing indicator triggered (`POST /channels/{id}/typing`), in order.
    pub fn typing(&self) -> Vec<Typed> {
        self.inner.lock().unwrap().typing.clone()
    }

    /// Messages posted by the bot `user_id` (through REST).
    pub fn posted_by(&self, user_id: &str) -> Vec<Stored> {
        self.inner
            .lock()
            .unwrap()
            .messages
            .iter()
            .filter(|m| m.author_id == user_id && m.request.is_some())
            .cloned()
            .collect()
    }

    /// `(method path, status)` of every REST request so far.
    pub fn requests(&self) -> Vec<(String, u16)> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// IDENTIFYs, RESUMEs, heartbeats and connections seen so far.
    pub fn gateway_counts(&self) -> (usize, usize, usize, usize) {
        let g = self.inner.lock().unwrap();
        (g.identifies, g.resumes, g.heartbeats, g.connections)
    }

    /// Gateway sessions currently connected.
    pub fn connected(&self) -> usize {
        self.inner
            .lock()
            .unwrap()
            .sessions
            .values()
            .filter(|s| s.conn.is_some())
            .count()
    }

    /// Waits (bounded) until `cond` holds of the stand-in.
    pub async fn wait(&self, what: &str, cond: impl Fn(&FakeDiscord) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !cond(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "fake discord: timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// ---------------------------------------------------------------------------------
// REST
// ---------------------------------------------------------------------------------

fn reply(status: u16, body: Value, headers: &[(&str, String)]) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    for (k, v) in headers {
        h.insert(
            hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            hyper::header::HeaderValue::from_str(v).unwrap(),
        );
    }
    r
}

/// The bucket headers Discord sends with every answer on a route.
fn bucket_headers(bucket: &str, remaining: u32) -> Vec<(&'static str, String)> {
    let reset = now_ms() as f64 / 1000.0 + 5.0;
    vec![
        ("x-ratelimit-limit", "5".into()),
        ("x-ratelimit-remaining", remaining.to_string()),
        ("x-ratelimit-reset", format!("{reset:.3}")),
        ("x-ratelimit-reset-after", "5.000".into()),
        ("x-ratelimit-bucket", bucket.into()),
    ]
}

async fn handle(inner: Arc<Mutex<Inner>>, req: Request<Incoming>) -> Reply {
    let (parts, body) = read_request(req).await;
    let path = parts.uri.path().to_string();
    let auth = parts
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let r = route(&inner, &parts.method, &path, &auth, &body);
    inner
        .lock()
        .unwrap()
        .requests
        .push((format!("{} {path}", parts.method), r.status().as_u16()));
    r
}

fn unauthorized() -> Reply {
    reply(401, json!({"message": "401: Unauthorized", "code": 0}), &[])
}

fn route(
    inner: &Mutex<Inner>,
    method: &hyper::Method,
    path: &str,
    auth: &str,
    body: &[u8],
) -> Reply {
    let mut g = inner.lock().unwrap();
    let Some(bot) = auth
        .strip_prefix("Bot ")
        .and_then(|t| g.bots.iter().find(|b| b.token == t).cloned())
    else {
        return unauthorized();
    };
    let Some(path) = path.strip_prefix("/api/v10") else {
        return reply(404, json!({"message": "404: Not Found", "code": 0}), &[]);
    };
    match (method.as_str(), path) {
        ("GET", "/users/@me") => {
            let mut u = user_json(&bot.user_id, &bot.username, None, true);
            u["mfa_enabled"] = json!(false);
            u["locale"] = json!("en-US");
            u["verified"] = json!(true);
            u["email"] = Value::Null;
            reply(200, u, &bucket_headers("users-me", 4))
        }
        ("GET", "/oauth2/applications/@me") => {
            let owner = g
                .people
                .first()
                .map(|p| user_json(&p.id, &p.username, p.global_name.as_deref(), false));
            reply(
                200,
                json!({
                    "id": bot.user_id, "name": bot.username, "icon": null,
                    "description": "", "summary": "", "type": null, "bot_public": true,
                    "bot_require_code_grant": false, "verify_key": "0".repeat(64),
                    "flags": 1 << 19, "owner": owner, "team": null,
                    "bot": user_json(&bot.user_id, &bot.username, None, true),
                    "redirect_uris": [], "interactions_endpoint_url": null,
                }),
                &bucket_headers("applications-me", 4),
            )
        }
        ("GET", "/gateway/bot") => reply(
            200,
            json!({"url": g.gateway_url, "shards": 1, "session_start_limit": {
                "total": 1000, "remaining": 999, "reset_after": 14_400_000, "max_concurrency": 1
            }}),
            &bucket_headers("gateway-bot", 4),
        ),
        ("POST", p) if p.starts_with("/channels/") && p.ends_with("/typing") => {
            // Discord shows "… is typing" for about 10 s (or until the bot posts) and
            // answers 204 with no body. TYPING_START goes to clients with the
            // GUILD_MESSAGE_TYPING intent, which no bot of the mesh asks for.
            let channel = p["/channels/".len()..p.len() - "/typing".len()].to_string();
            if !g.channels.contains(&channel) {
                return reply(
                    404,
                    json!({"message": "Unknown Channel", "code": 10003}),
                    &[],
                );
            }
            let messages_before = g.messages.len();
            g.typing.push(Typed {
                channel_id: channel,
                user_id: bot.user_id.clone(),
                messages_before,
            });
            let mut r = reply(204, json!(null), &bucket_headers("channel-typing", 4));
            *r.body_mut() = Full::new(Bytes::new());
            r.headers_mut().remove(hyper::header::CONTENT_TYPE);
            r
        }
        ("POST", p) if p.starts_with("/channels/") && p.ends_with("/messages") => {
            let channel = p["/channels/".len()..p.len() - "/messages".len()].to_string();
            if !g.channels.contains(&channel) {
                return reply(
                    404,
                    json!({"message": "Unknown Channel", "code": 10003}),
                    &[],
                );
            }
            if let Some(limit) = g.limits.pop_front() {
                let mut h = bucket_headers("channel-messages", 0);
                h.push((
                    "retry-after",
                    format!("{}", limit.retry_after.ceil() as u64),
                ));
                if limit.global {
                    h.push(("x-ratelimit-global", "true".into()));
                    h.push(("x-ratelimit-scope", "global".into()));
                } else {
                    h.push(("x-ratelimit-scope", "user".into()));
                }
                return reply(
                    429,
                    json!({"message": "You are being rate limited.", "retry_after": limit.retry_after, "global": limit.global}),
                    &h,
                );
            }
            let Ok(req) = serde_json::from_slice::<Value>(body) else {
                return reply(400, json!({"message": "400: Bad Request", "code": 0}), &[]);
            };
            let content = req["content"].as_str().unwrap_or_default().to_string();
            if content.chars().count() > 2000 {
                return reply(
                    400,
                    json!({"message": "Invalid Form Body", "code": 50035, "errors": {"content": {"_errors": [
                        {"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}]}}}),
                    &[],
                );
            }
            if req["enforce_nonce"] == json!(true) {
                if let Some(n) = req["nonce"].as_str() {
                    if n.len() > 25 {
                        return reply(
                            400,
                            json!({"message": "Invalid Form Body", "code": 50035}),
                            &[],
                        );
                    }
                    if let Some(existing) =
                        g.nonces.get(&(bot.user_id.clone(), n.to_string())).cloned()
                    {
                        let m = g
                            .messages
                            .iter()
                            .find(|m| m.id == existing)
                            .cloned()
                            .unwrap();
                        let d =
                            g.message_json(&m.id, &m.channel_id, &m.author_id, &m.content, None);
                        return reply(200, d, &bucket_headers("channel-messages", 4));
                    }
                }
            }
            let id = g.snowflake();
            if let Some(n) = req["nonce"].as_str() {
                g.nonces
                    .insert((bot.user_id.clone(), n.to_string()), id.clone());
            }
            let reference = req
                .get("message_reference")
                .filter(|r| !r.is_null())
                .cloned();
            let d = g.message_json(&id, &channel, &bot.user_id, &content, reference.as_ref());
            g.messages.push(Stored {
                id: id.clone(),
                channel_id: channel,
                author_id: bot.user_id.clone(),
                content,
                request: Some(req),
                at: std::time::Instant::now(),
                edits: 0,
            });
            g.dispatch("MESSAGE_CREATE", d.clone());
            let mut h = bucket_headers("channel-messages", 4);
            if let Some(after) = g.bucket_reset_after {
                h = bucket_headers("channel-messages", 0);
                h.retain(|(k, _)| *k != "x-ratelimit-reset-after");
                h.push(("x-ratelimit-reset-after", format!("{after:.3}")));
            }
            reply(200, d, &h)
        }
        ("PATCH", p) if p.starts_with("/channels/") && p.contains("/messages/") => {
            // Edit Message: only the author may change the content (50005 "Cannot edit a
            // message authored by another user"); the edited message comes back, with
            // `edited_timestamp`, and MESSAGE_UPDATE goes to the gateway.
            let rest = &p["/channels/".len()..];
            let Some((channel, id)) = rest.split_once("/messages/") else {
                return reply(404, json!({"message": "404: Not Found", "code": 0}), &[]);
            };
            let (channel, id) = (channel.to_string(), id.to_string());
            let Ok(req) = serde_json::from_slice::<Value>(body) else {
                return reply(400, json!({"message": "400: Bad Request", "code": 0}), &[]);
            };
            let Some(m) = g
                .messages
                .iter_mut()
                .find(|m| m.id == id && m.channel_id == channel)
            else {
                return reply(
                    404,
                    json!({"message": "Unknown Message", "code": 10008}),
                    &[],
                );
            };
            if m.author_id != bot.user_id {
                return reply(
                    403,
                    json!({"message": "Cannot edit a message authored by another user", "code": 50005}),
                    &[],
                );
            }
            if let Some(content) = req.get("content").and_then(Value::as_str) {
                if content.chars().count() > 2000 {
                    return reply(
                        400,
                        json!({"message": "Invalid Form Body", "code": 50035}),
                        &[],
                    );
                }
                m.content = content.to_string();
            }
            m.edits += 1;
            let m = m.clone();
            let mut d = g.message_json(&m.id, &m.channel_id, &m.author_id, &m.content, None);
            d["edited_timestamp"] = json!(timestamp());
            g.dispatch("MESSAGE_UPDATE", d.clone());
            reply(200, d, &bucket_headers("channel-message-edit", 4))
        }
        _ => reply(404, json!({"message": "404: Not Found", "code": 0}), &[]),
    }
}

// ---------------------------------------------------------------------------------
// Gateway
// ---------------------------------------------------------------------------------

async fn gateway_loop(listener: TcpListener, inner: Arc<Mutex<Inner>>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let inner = inner.clone();
                    connections.spawn(async move {
                        if let Ok(ws) = tokio_tungstenite::accept_async(stream).await {
                            connection(ws, inner).await;
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
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Out>();
    let interval = {
        let mut g = inner.lock().unwrap();
        g.connections += 1;
        g.heartbeat_interval
    };
    let hello = json!({"op": 10, "d": {"heartbeat_interval": interval}, "s": null, "t": null});
    if ws.send(WsMessage::text(hello.to_string())).await.is_err() {
        return;
    }
    let mut session_id: Option<String> = None;
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(Out::Text(t)) => {
                    if ws.send(WsMessage::text(t)).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close(code)) => {
                    let _ = ws.close(Some(CloseFrame { code: CloseCode::from(code), reason: "".into() })).await;
                    break;
                }
                Some(Out::Drop) | None => break,
            },
            frame = ws.next() => {
                let text = match frame {
                    Some(Ok(WsMessage::Text(t))) => t.as_str().to_string(),
                    Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    let _ = ws.close(Some(CloseFrame { code: CloseCode::from(4002), reason: "Error while decoding payload.".into() })).await;
                    break;
                };
                match v["op"].as_u64() {
                    Some(1) => {
                        inner.lock().unwrap().heartbeats += 1;
                        if ws.send(WsMessage::text(json!({"op": 11}).to_string())).await.is_err() {
                            break;
                        }
                    }
                    Some(2) => match identify(&inner, &v["d"], tx.clone()) {
                        Ok(id) => session_id = Some(id),
                        Err(code) => {
                            let reason = match code {
                                4004 => "Authentication failed.",
                                4014 => "Disallowed intent(s).",
                                _ => "",
                            };
                            let _ = ws.close(Some(CloseFrame { code: CloseCode::from(code), reason: reason.into() })).await;
                            break;
                        }
                    },
                    Some(6) => match resume(&inner, &v["d"], tx.clone()) {
                        Some(id) => session_id = Some(id),
                        None => {
                            let _ = ws.send(WsMessage::text(json!({"op": 9, "d": false, "s": null, "t": null}).to_string())).await;
                        }
                    },
                    _ => {}
                }
            }
        }
    }
    if let Some(id) = session_id {
        let mut g = inner.lock().unwrap();
        if let Some(s) = g.sessions.get_mut(&id) {
            // Only forget this connection, not a newer one of the same session.
            if s.conn.as_ref().is_some_and(|c| c.same_channel(&tx)) {
                s.conn = None;
            }
        }
    }
}

/// IDENTIFY: a new session (READY, then GUILD_CREATE), or a close code.
fn identify(
    inner: &Mutex<Inner>,
    d: &Value,
    tx: mpsc::UnboundedSender<Out>,
) -> Result<String, u16> {
    let mut g = inner.lock().unwrap();
    g.identifies += 1;
    let token = d["token"].as_str().unwrap_or_default();
    let Some(bot) = g.bots.iter().find(|b| b.token == token).cloned() else {
        return Err(4004);
    };
    let intents = d["intents"].as_u64().unwrap_or(0);
    if intents & (1 << 15) != 0 && !g.message_content_enabled {
        return Err(4014);
    }
    let session_id = format!("{:032x}", rand::random::<u128>());
    let ready = json!({
        "v": 10,
        "user": user_json(&bot.user_id, &bot.username, None, true),
        "guilds": [{"id": GUILD_ID, "unavailable": true}],
        "session_id": session_id,
        "resume_gateway_url": g.gateway_url,
        "shard": [0, 1],
        "application": {"id": bot.user_id, "flags": 0},
    });
    let guild = g.guild_create();
    let mut s = Session {
        token: token.to_string(),
        seq: 0,
        backlog: Vec::new(),
        conn: Some(tx.clone()),
    };
    for (t, d) in [("READY", ready), ("GUILD_CREATE", guild)] {
        s.seq += 1;
        let payload = json!({"op": 0, "s": s.seq, "t": t, "d": d});
        s.backlog.push((s.seq, payload.clone()));
        let _ = tx.send(Out::Text(payload.to_string()));
    }
    g.sessions.insert(session_id.clone(), s);
    Ok(session_id)
}

/// RESUME: replays what the session missed, then RESUMED; `None` when it cannot.
fn resume(inner: &Mutex<Inner>, d: &Value, tx: mpsc::UnboundedSender<Out>) -> Option<String> {
    let mut g = inner.lock().unwrap();
    g.resumes += 1;
    let id = d["session_id"].as_str()?.to_string();
    let seq = d["seq"].as_u64().unwrap_or(0);
    let token = d["token"].as_str().unwrap_or_default().to_string();
    let s = g.sessions.get_mut(&id).filter(|s| s.token == token)?;
    for (n, p) in &s.backlog {
        if *n > seq {
            let _ = tx.send(Out::Text(p.to_string()));
        }
    }
    s.seq += 1;
    let resumed = json!({"op": 0, "s": s.seq, "t": "RESUMED", "d": {"_trace": ["fake-discord"]}});
    s.backlog.push((s.seq, resumed.clone()));
    let _ = tx.send(Out::Text(resumed.to_string()));
    s.conn = Some(tx);
    Some(id)
}
