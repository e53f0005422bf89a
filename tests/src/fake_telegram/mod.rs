//! A stand-in for the Telegram Bot API on 127.0.0.1: `POST|GET /bot{token}/{method}`
//! answered `{"ok": true, "result": …}` or `{"ok": false, "error_code", "description",
//! "parameters"}`, with one or more groups every bot account is in.
//!
//! Payloads follow the Bot API documentation (core.telegram.org/bots/api: "Making
//! requests", "getUpdates", "Update", "Message", "MessageEntity", "Formatting options",
//! "ResponseParameters"): parameters as JSON, as a form or in the query string;
//! `getUpdates` long polls (`timeout`) and forgets every update below `offset` (the
//! confirmation); `getMe`, `getWebhookInfo`, `deleteWebhook`, `setWebhook` (then
//! updates are posted to the webhook with `X-Telegram-Bot-Api-Secret-Token` and
//! `getUpdates` answers 409), `sendMessage` (HTML parsed into text and entities the
//! way Telegram does: an unsupported tag is a 400, the 4,096-character limit counted
//! in UTF-16 units after parsing), `sendChatAction`, `editMessageText`. Entity offsets
//! and lengths are UTF-16 code units; `@handle`s in any text become `mention`
//! entities. A person's message reaches every bot whose privacy mode is off; a bot's
//! message reaches only bots in bot-to-bot mode. python-telegram-bot drives the same
//! stand-in in `tests/tests/telegram.rs`, which proves it faithful.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::serve::{read_request, serve_http, HttpServer, Reply};

mod html;
pub use html::parse_html;
use html::{detect_entities, utf16};

/// A bot account of the stand-in.
#[derive(Debug, Clone)]
pub struct BotAccount {
    /// Its token (`123:abc`).
    pub token: String,
    /// Its user id.
    pub id: i64,
    /// Its @handle without `@`.
    pub username: String,
    /// Its display name.
    pub first_name: String,
}

/// A person in the groups.
#[derive(Debug, Clone)]
pub struct Person {
    /// User id.
    pub id: i64,
    /// First name.
    pub first_name: String,
    /// Last name.
    pub last_name: Option<String>,
    /// @handle, if they have one.
    pub username: Option<String>,
}

/// One message the stand-in holds.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Chat.
    pub chat_id: i64,
    /// Its id within the chat.
    pub message_id: i64,
    /// Author's user id.
    pub from_id: i64,
    /// The text as shown (entities parsed).
    pub text: String,
    /// Its entities.
    pub entities: Vec<Value>,
    /// The message it answers.
    pub reply_to: Option<i64>,
    /// When it was sent, unix seconds.
    pub date: i64,
    /// The request's parameters, for messages posted through the API.
    pub request: Option<Map<String, Value>>,
    /// When the stand-in took it.
    pub at: std::time::Instant,
    /// Times it was edited.
    pub edits: u32,
}

/// One request the stand-in answered.
#[derive(Debug, Clone)]
pub struct Call {
    /// The method, lower-cased (`sendmessage`).
    pub method: String,
    /// The bot's username (empty for an unknown token).
    pub bot: String,
    /// The HTTP status answered.
    pub status: u16,
    /// When it was answered.
    pub at: std::time::Instant,
}

/// A bot's side: its queue of updates and how Telegram treats it.
struct BotState {
    account: BotAccount,
    /// Updates not yet confirmed, oldest first.
    pending: VecDeque<(i64, Value)>,
    /// Every update ever queued (to replay: [`FakeTelegram::forget_confirmations`]).
    all: Vec<(i64, Value)>,
    /// The next update id.
    next_update: i64,
    /// Privacy mode on: only messages that mention it, command it or answer it.
    privacy: bool,
    /// Bot-to-bot mode: it receives other bots' group messages.
    bot_to_bot: bool,
    /// The webhook and its secret, when set.
    webhook: Option<(String, String)>,
}

/// Everything the stand-in knows.
#[derive(Default)]
struct Inner {
    bots: Vec<BotState>,
    people: Vec<Person>,
    /// Group chat id → title.
    chats: Vec<(i64, String)>,
    messages: Vec<Stored>,
    /// Per chat: the last message id given out.
    last_id: HashMap<i64, i64>,
    /// `retry_after` of the 429s still to answer to `sendMessage`.
    limits: VecDeque<u64>,
    /// While `Some`: people's messages are in the chat (dated when said) but reach no
    /// bot yet, as when Telegram delivers updates late; in the order said.
    held: Option<Vec<Stored>>,
    /// Every request answered.
    requests: Vec<Call>,
    /// `(bot username, chat id, action)` of every `sendChatAction`.
    actions: Vec<(String, i64, String)>,
    /// For each action: how many messages its chat held then (so a test can tell
    /// which messages it came between).
    action_positions: Vec<usize>,
    /// Webhook deliveries `(bot username, update id, status)`.
    deliveries: Vec<(String, i64, u16)>,
}

/// The stand-in; stops when dropped.
pub struct FakeTelegram {
    /// What `api_base_url` points at: requests go to `{api_base_url}/bot{token}/…`.
    pub api_base_url: String,
    inner: Arc<Mutex<Inner>>,
    /// Woken on every new update (long polls and the webhook sender wait on it).
    notify: Arc<Notify>,
    _server: HttpServer,
    hooks: JoinHandle<()>,
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.hooks.abort();
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn answer(status: u16, body: Value) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn ok(result: Value) -> (u16, Value) {
    (200, json!({"ok": true, "result": result}))
}

fn refused(code: u16, description: &str) -> (u16, Value) {
    (
        code,
        json!({"ok": false, "error_code": code, "description": description}),
    )
}

/// A parameter as an integer (sent as a number, or a string in a form).
fn int(p: &Map<String, Value>, key: &str) -> Option<i64> {
    match p.get(key)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A parameter as a string.
fn string(p: &Map<String, Value>, key: &str) -> Option<String> {
    match p.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        v => Some(v.to_string()),
    }
}

/// A structured parameter (a JSON object, or JSON text in a form).
fn structured(p: &Map<String, Value>, key: &str) -> Option<Value> {
    match p.get(key)? {
        Value::String(s) => serde_json::from_str(s).ok(),
        Value::Null => None,
        v => Some(v.clone()),
    }
}

impl Inner {
    fn user_json(&self, id: i64) -> Value {
        if let Some(b) = self.bots.iter().find(|b| b.account.id == id) {
            return json!({"id": id, "is_bot": true, "first_name": b.account.first_name, "username": b.account.username});
        }
        match self.people.iter().find(|p| p.id == id) {
            Some(p) => {
                let mut u = json!({"id": id, "is_bot": false, "first_name": p.first_name, "language_code": "en"});
                if let Some(l) = &p.last_name {
                    u["last_name"] = json!(l);
                }
                if let Some(n) = &p.username {
                    u["username"] = json!(n);
                }
                u
            }
            None => json!({"id": id, "is_bot": false, "first_name": "Unknown"}),
        }
    }

    fn chat_json(&self, chat_id: i64) -> Value {
        let title = self
            .chats
            .iter()
            .find(|(c, _)| *c == chat_id)
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        json!({"id": chat_id, "type": "supergroup", "title": title})
    }

    fn message_json(&self, m: &Stored, nested: bool) -> Value {
        let mut v = json!({
            "message_id": m.message_id, "from": self.user_json(m.from_id),
            "chat": self.chat_json(m.chat_id), "date": m.date, "text": m.text,
        });
        if !m.entities.is_empty() {
            v["entities"] = json!(m.entities);
        }
        if m.edits > 0 {
            v["edit_date"] = json!(now_secs());
        }
        if let (Some(r), false) = (m.reply_to, nested) {
            if let Some(orig) = self
                .messages
                .iter()
                .find(|o| o.chat_id == m.chat_id && o.message_id == r)
            {
                v["reply_to_message"] = self.message_json(orig, true);
            }
        }
        v
    }

    fn next_message_id(&mut self, chat_id: i64) -> i64 {
        let n = self.last_id.entry(chat_id).or_insert(0);
        *n += 1;
        *n
    }

    /// Queues `m` for every bot that Telegram shows it to.
    fn deliver(&mut self, m: &Stored) {
        let author_is_bot = self.bots.iter().any(|b| b.account.id == m.from_id);
        let replied_author = m.reply_to.and_then(|r| {
            self.messages
                .iter()
                .find(|o| o.chat_id == m.chat_id && o.message_id == r)
                .map(|o| o.from_id)
        });
        let msg = self.message_json(m, false);
        let lower = m.text.to_ascii_lowercase();
        for b in &mut self.bots {
            if b.account.id == m.from_id {
                continue;
            }
            let handle = format!("@{}", b.account.username.to_ascii_lowercase());
            let addressed = lower.contains(&handle) || replied_author == Some(b.account.id);
            let sees = if author_is_bot {
                b.bot_to_bot && (!b.privacy || addressed)
            } else {
                !b.privacy || addressed
            };
            if sees {
                let id = b.next_update;
                b.next_update += 1;
                let u = json!({"update_id": id, "message": msg});
                b.pending.push_back((id, u.clone()));
                b.all.push((id, u));
            }
        }
    }

    fn bot_by_token(&self, token: &str) -> Option<usize> {
        self.bots.iter().position(|b| b.account.token == token)
    }
}

impl FakeTelegram {
    /// Starts the stand-in with these bots, people and group chats (id, title). Every
    /// bot starts with privacy mode off and bot-to-bot mode off.
    pub async fn start(
        bots: Vec<BotAccount>,
        people: Vec<Person>,
        chats: &[(i64, &str)],
    ) -> FakeTelegram {
        let inner = Arc::new(Mutex::new(Inner {
            bots: bots
                .into_iter()
                .map(|account| BotState {
                    account,
                    pending: VecDeque::new(),
                    all: Vec::new(),
                    next_update: 100_001,
                    privacy: false,
                    bot_to_bot: false,
                    webhook: None,
                })
                .collect(),
            people,
            chats: chats.iter().map(|(c, t)| (*c, t.to_string())).collect(),
            ..Default::default()
        }));
        let notify = Arc::new(Notify::new());
        let (state, n) = (inner.clone(), notify.clone());
        let server = serve_http(move |req| handle(state.clone(), n.clone(), req)).await;
        let hooks = tokio::spawn(webhook_sender(inner.clone(), notify.clone()));
        FakeTelegram {
            api_base_url: server.url(),
            inner,
            notify,
            _server: server,
            hooks,
        }
    }

    fn bot_mut<R>(&self, username: &str, f: impl FnOnce(&mut BotState) -> R) -> R {
        let mut g = self.inner.lock().unwrap();
        let b = g
            .bots
            .iter_mut()
            .find(|b| b.account.username == username)
            .expect("a bot of the stand-in");
        f(b)
    }

    /// Turns bot-to-bot mode on or off for `username` (it then receives bots' messages).
    pub fn set_bot_to_bot(&self, username: &str, on: bool) {
        self.bot_mut(username, |b| b.bot_to_bot = on);
    }

    /// Turns privacy mode on or off for `username`.
    pub fn set_privacy(&self, username: &str, on: bool) {
        self.bot_mut(username, |b| b.privacy = on);
    }

    /// Sets a webhook for `username`, as if done earlier by another program.
    pub fn set_webhook(&self, username: &str, url: &str) {
        self.bot_mut(username, |b| b.webhook = Some((url.into(), String::new())));
    }

    /// The webhook URL set for `username`, if any.
    pub fn webhook(&self, username: &str) -> Option<String> {
        self.bot_mut(username, |b| b.webhook.as_ref().map(|w| w.0.clone()))
    }

    /// A person posts `text` in `chat` (mentions detected as Telegram does); returns
    /// the message id.
    pub fn say(&self, chat: i64, person: i64, text: &str) -> i64 {
        self.say_with(chat, person, text, detect_entities(text), None)
    }

    /// A person posts `text` with these entities, answering `reply_to` if given (it
    /// reaches the bots later while deliveries are held).
    pub fn say_with(
        &self,
        chat: i64,
        person: i64,
        text: &str,
        entities: Vec<Value>,
        reply_to: Option<i64>,
    ) -> i64 {
        let mut g = self.inner.lock().unwrap();
        let id = g.next_message_id(chat);
        let m = Stored {
            chat_id: chat,
            message_id: id,
            from_id: person,
            text: text.into(),
            entities,
            reply_to,
            date: now_secs(),
            request: None,
            at: std::time::Instant::now(),
            edits: 0,
        };
        match &mut g.held {
            Some(held) => held.push(m.clone()),
            None => g.deliver(&m),
        }
        g.messages.push(m);
        drop(g);
        self.notify.notify_waiters();
        id
    }

    /// From now on people's messages reach no bot until [`FakeTelegram::deliver_held`]
    /// (Telegram delivering updates late).
    pub fn hold_deliveries(&self) {
        self.inner.lock().unwrap().held.get_or_insert_with(Vec::new);
    }

    /// Delivers the messages held since [`FakeTelegram::hold_deliveries`], in order,
    /// and delivers again as they come.
    pub fn deliver_held(&self) {
        let mut g = self.inner.lock().unwrap();
        for m in g.held.take().unwrap_or_default() {
            g.deliver(&m);
        }
        drop(g);
        self.notify.notify_waiters();
    }

    /// The next `n` `sendMessage` calls answer 429 with `retry_after` seconds.
    pub fn rate_limit(&self, n: usize, retry_after: u64) {
        let mut g = self.inner.lock().unwrap();
        for _ in 0..n {
            g.limits.push_back(retry_after);
        }
    }

    /// Puts back every update `username` ever got, as if it had confirmed none (a
    /// node that recorded them but stopped before confirming).
    pub fn forget_confirmations(&self, username: &str) {
        self.bot_mut(username, |b| b.pending = b.all.iter().cloned().collect());
        self.notify.notify_waiters();
    }

    /// Every update ever queued for `username`, oldest first.
    pub fn updates(&self, username: &str) -> Vec<Value> {
        self.bot_mut(username, |b| b.all.iter().map(|(_, u)| u.clone()).collect())
    }

    /// Updates of `username` not yet confirmed.
    pub fn pending(&self, username: &str) -> usize {
        self.bot_mut(username, |b| b.pending.len())
    }

    /// Every message in `chat`, oldest first.
    pub fn messages(&self, chat: i64) -> Vec<Stored> {
        let g = self.inner.lock().unwrap();
        g.messages
            .iter()
            .filter(|m| m.chat_id == chat)
            .cloned()
            .collect()
    }

    /// Messages posted through the API by the bot with user id `id`.
    pub fn posted_by(&self, id: i64) -> Vec<Stored> {
        let g = self.inner.lock().unwrap();
        g.messages
            .iter()
            .filter(|m| m.from_id == id && m.request.is_some())
            .cloned()
            .collect()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Call> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// `(bot username, chat, action)` of every `sendChatAction`.
    pub fn actions(&self) -> Vec<(String, i64, String)> {
        self.inner.lock().unwrap().actions.clone()
    }

    /// For each `sendChatAction` so far (in [`FakeTelegram::actions`]' order): how
    /// many messages its chat held when it came.
    pub fn action_positions(&self) -> Vec<usize> {
        self.inner.lock().unwrap().action_positions.clone()
    }

    /// `(bot username, update id, status)` of every webhook delivery.
    pub fn deliveries(&self) -> Vec<(String, i64, u16)> {
        self.inner.lock().unwrap().deliveries.clone()
    }

    /// Waits (bounded) until `cond` holds of the stand-in.
    pub async fn wait(&self, what: &str, cond: impl Fn(&FakeTelegram) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !cond(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "fake telegram: timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The request's parameters: the query string, then a JSON or form body.
fn parameters(parts: &hyper::http::request::Parts, body: &[u8]) -> Map<String, Value> {
    let mut p = Map::new();
    let mut add_pairs = |q: &str| {
        if let Ok(u) = reqwest::Url::parse(&format!("http://x/?{q}")) {
            for (k, v) in u.query_pairs() {
                p.insert(k.into_owned(), Value::String(v.into_owned()));
            }
        }
    };
    if let Some(q) = parts.uri.query() {
        add_pairs(q);
    }
    let ct = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if ct.starts_with("application/json") {
        if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(body) {
            p.extend(o);
        }
    } else if !body.is_empty() {
        add_pairs(&String::from_utf8_lossy(body));
    }
    p
}

async fn handle(inner: Arc<Mutex<Inner>>, notify: Arc<Notify>, req: Request<Incoming>) -> Reply {
    let (parts, body) = read_request(req).await;
    let path = parts.uri.path().to_string();
    let Some((token, method)) = path
        .strip_prefix("/bot")
        .and_then(|r| r.split_once('/'))
        .map(|(t, m)| (t.to_string(), m.to_ascii_lowercase()))
    else {
        let (s, v) = refused(404, "Not Found");
        return answer(s, v);
    };
    let p = parameters(&parts, &body);
    let bot = inner.lock().unwrap().bot_by_token(&token);
    let Some(bot) = bot else {
        inner.lock().unwrap().requests.push(Call {
            method,
            bot: String::new(),
            status: 401,
            at: std::time::Instant::now(),
        });
        let (s, v) = refused(401, "Unauthorized");
        return answer(s, v);
    };
    let (status, value) = if method == "getupdates" {
        get_updates(&inner, &notify, bot, &p).await
    } else {
        let r = call(&mut inner.lock().unwrap(), bot, &method, &p);
        notify.notify_waiters();
        r
    };
    let mut g = inner.lock().unwrap();
    let name = g.bots[bot].account.username.clone();
    g.requests.push(Call {
        method,
        bot: name,
        status,
        at: std::time::Instant::now(),
    });
    answer(status, value)
}

async fn get_updates(
    inner: &Mutex<Inner>,
    notify: &Notify,
    bot: usize,
    p: &Map<String, Value>,
) -> (u16, Value) {
    let timeout = int(p, "timeout").unwrap_or(0).clamp(0, 50) as u64;
    let limit = int(p, "limit").unwrap_or(100).clamp(1, 100) as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    {
        let mut g = inner.lock().unwrap();
        let b = &mut g.bots[bot];
        if b.webhook.is_some() {
            return refused(409, "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first");
        }
        if let Some(offset) = int(p, "offset") {
            while b.pending.front().is_some_and(|(id, _)| *id < offset) {
                b.pending.pop_front();
            }
        }
    }
    loop {
        let wake = notify.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        {
            let g = inner.lock().unwrap();
            let b = &g.bots[bot];
            if !b.pending.is_empty() || tokio::time::Instant::now() >= deadline {
                let ups: Vec<Value> = b
                    .pending
                    .iter()
                    .take(limit)
                    .map(|(_, u)| u.clone())
                    .collect();
                return ok(json!(ups));
            }
        }
        tokio::select! {
            _ = &mut wake => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
}

fn call(g: &mut Inner, bot: usize, method: &str, p: &Map<String, Value>) -> (u16, Value) {
    let me = g.bots[bot].account.clone();
    match method {
        "getme" => ok(json!({
            "id": me.id, "is_bot": true, "first_name": me.first_name, "username": me.username,
            "can_join_groups": true, "can_read_all_group_messages": !g.bots[bot].privacy,
            "supports_inline_queries": false, "can_connect_to_business": false, "has_main_web_app": false,
        })),
        "getwebhookinfo" => {
            let b = &g.bots[bot];
            ok(json!({
                "url": b.webhook.as_ref().map(|w| w.0.clone()).unwrap_or_default(),
                "has_custom_certificate": false, "pending_update_count": b.pending.len(),
                "max_connections": 40,
            }))
        }
        "deletewebhook" => {
            let b = &mut g.bots[bot];
            b.webhook = None;
            if string(p, "drop_pending_updates").as_deref() == Some("true") {
                b.pending.clear();
            }
            (
                200,
                json!({"ok": true, "result": true, "description": "Webhook was deleted"}),
            )
        }
        "setwebhook" => {
            let Some(url) = string(p, "url").filter(|u| !u.is_empty()) else {
                return refused(
                    400,
                    "Bad Request: bad webhook: An HTTPS URL must be provided for webhook",
                );
            };
            let secret = string(p, "secret_token").unwrap_or_default();
            g.bots[bot].webhook = Some((url, secret));
            (
                200,
                json!({"ok": true, "result": true, "description": "Webhook was set"}),
            )
        }
        "sendchataction" => {
            let (Some(chat), Some(action)) = (int(p, "chat_id"), string(p, "action")) else {
                return refused(400, "Bad Request: chat_id and action are required");
            };
            if !g.chats.iter().any(|(c, _)| *c == chat) {
                return refused(400, "Bad Request: chat not found");
            }
            g.actions.push((me.username.clone(), chat, action));
            let before = g.messages.iter().filter(|m| m.chat_id == chat).count();
            g.action_positions.push(before);
            ok(json!(true))
        }
        "sendmessage" => send_message(g, &me, p),
        "editmessagetext" => {
            let (Some(chat), Some(id)) = (int(p, "chat_id"), int(p, "message_id")) else {
                return refused(400, "Bad Request: message identifier is not specified");
            };
            let text = string(p, "text").unwrap_or_default();
            let (text, entities) = match parse(&text, p) {
                Ok(t) => t,
                Err(e) => return refused(400, &format!("Bad Request: can't parse entities: {e}")),
            };
            let Some(i) = g
                .messages
                .iter()
                .position(|m| m.chat_id == chat && m.message_id == id)
            else {
                return refused(400, "Bad Request: message to edit not found");
            };
            if g.messages[i].from_id != me.id {
                return refused(400, "Bad Request: message can't be edited");
            }
            if g.messages[i].text == text && g.messages[i].entities == entities {
                return refused(400, "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message");
            }
            g.messages[i].text = text;
            g.messages[i].entities = entities;
            g.messages[i].edits += 1;
            let m = g.messages[i].clone();
            ok(g.message_json(&m, false))
        }
        _ => refused(404, "Not Found: method not found"),
    }
}

/// The text shown and its entities, as the request's `parse_mode` says.
fn parse(text: &str, p: &Map<String, Value>) -> Result<(String, Vec<Value>), String> {
    match string(p, "parse_mode").as_deref() {
        Some(m) if m.eq_ignore_ascii_case("html") => parse_html(text),
        Some(m) if !m.is_empty() => Err(format!("unsupported parse_mode {m} in this stand-in")),
        _ => Ok((text.to_string(), detect_entities(text))),
    }
}

fn send_message(g: &mut Inner, me: &BotAccount, p: &Map<String, Value>) -> (u16, Value) {
    let Some(chat) = int(p, "chat_id") else {
        return refused(400, "Bad Request: chat_id is empty");
    };
    if !g.chats.iter().any(|(c, _)| *c == chat) {
        return refused(400, "Bad Request: chat not found");
    }
    if let Some(secs) = g.limits.pop_front() {
        return (
            429,
            json!({"ok": false, "error_code": 429,
                "description": format!("Too Many Requests: retry after {secs}"),
                "parameters": {"retry_after": secs}}),
        );
    }
    let raw = string(p, "text").unwrap_or_default();
    let (text, entities) = match parse(&raw, p) {
        Ok(t) => t,
        Err(e) => return refused(400, &format!("Bad Request: can't parse entities: {e}")),
    };
    if text.trim().is_empty() {
        return refused(400, "Bad Request: message text is empty");
    }
    if utf16(&text) > 4096 {
        return refused(400, "Bad Request: message is too long");
    }
    let reply = structured(p, "reply_parameters");
    let reply_to = reply.as_ref().and_then(|r| r["message_id"].as_i64());
    if let Some(r) = reply_to {
        let exists = g
            .messages
            .iter()
            .any(|m| m.chat_id == chat && m.message_id == r);
        let lenient = reply
            .as_ref()
            .is_some_and(|r| r["allow_sending_without_reply"] == json!(true));
        if !exists && !lenient {
            return refused(400, "Bad Request: message to be replied not found");
        }
    }
    let id = g.next_message_id(chat);
    let m = Stored {
        chat_id: chat,
        message_id: id,
        from_id: me.id,
        text,
        entities,
        reply_to,
        date: now_secs(),
        request: Some(p.clone()),
        at: std::time::Instant::now(),
        edits: 0,
    };
    g.deliver(&m);
    let v = g.message_json(&m, false);
    g.messages.push(m);
    ok(v)
}

/// Posts each bot's pending updates to its webhook, one at a time, oldest first, with
/// its secret token; an update answered 2xx is done, any other answer is tried again.
async fn webhook_sender(inner: Arc<Mutex<Inner>>, notify: Arc<Notify>) {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    loop {
        let wake = notify.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        let jobs: Vec<(usize, String, String, i64, Value)> = {
            let g = inner.lock().unwrap();
            g.bots
                .iter()
                .enumerate()
                .filter_map(|(i, b)| {
                    let (url, secret) = b.webhook.clone()?;
                    let (id, u) = b.pending.front()?.clone();
                    Some((i, url, secret, id, u))
                })
                .collect()
        };
        let mut failed = false;
        for (i, url, secret, id, u) in jobs {
            let mut req = http.post(&url).json(&u);
            if !secret.is_empty() {
                req = req.header("X-Telegram-Bot-Api-Secret-Token", secret);
            }
            let status = req.send().await.map(|r| r.status().as_u16()).unwrap_or(0);
            let mut g = inner.lock().unwrap();
            let name = g.bots[i].account.username.clone();
            g.deliveries.push((name, id, status));
            if (200..300).contains(&status) {
                let b = &mut g.bots[i];
                if b.pending.front().is_some_and(|(p, _)| *p == id) {
                    b.pending.pop_front();
                }
            } else {
                failed = true;
            }
        }
        let more = inner
            .lock()
            .unwrap()
            .bots
            .iter()
            .any(|b| b.webhook.is_some() && !b.pending.is_empty());
        if failed {
            tokio::time::sleep(Duration::from_millis(100)).await;
        } else if !more {
            tokio::select! {
                _ = &mut wake => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
}
