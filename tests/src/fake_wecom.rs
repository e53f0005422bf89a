//! A stand-in of WeCom's smart-robot long connection (`wss://openws.work.weixin.qq.com`,
//! here `ws://127.0.0.1:<port>`), speaking the frames WeCom's SDKs speak
//! (`wecom-aibot-python-sdk` 1.0.2 and docs/wecom.md):
//!
//! - the first frame must be `aibot_subscribe` with a robot's `bot_id` and `secret`;
//!   the ack (no cmd, the same req_id) says `errcode: 0`, or 853000 with WeCom's
//!   `errmsg` for a wrong pair, and the socket is left open then, as WeCom does. A
//!   second login of one robot pushes `aibot_event_callback` `disconnected_event` to
//!   the older connection, which gets no more callbacks.
//! - `ping` is acked `{headers: {req_id}, errcode: 0, errmsg: "ok"}`.
//! - a person's message ([`FakeWecom::say`]) reaches only the robots it names, each as
//!   an `aibot_msg_callback` with its own req_id and the same `msgid`; a robot's
//!   message reaches nobody.
//! - `aibot_respond_msg` must carry a callback's req_id received on the same
//!   connection (else 846605); a `stream` frame replaces its bubble's text (one bubble
//!   per stream id), `finish: true` ends it; `markdown` shows once.
//! - `aibot_send_msg` shows `markdown.content` in the chat `chatid`.
//! - content over 20,480 UTF-8 bytes is refused whole with 45002.
//!
//! Faults for tests: [`FakeWecom::fail_next`] (the next requests answer these
//! errcodes, showing nothing), [`FakeWecom::drop_connections`] (abrupt drops),
//! [`FakeWecom::pause_pongs`] (pings go unanswered), [`FakeWecom::kick`] (another
//! client took a robot). Proven faithful by the SDK in tests/tests/wecom.rs.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// The most a message holds, in UTF-8 bytes.
pub const MAX_BYTES: usize = 20_480;

/// One smart robot the stand-in knows.
#[derive(Debug, Clone)]
pub struct Robot {
    /// Its name in the group (what people type after `@`).
    pub name: String,
    /// Its Bot ID.
    pub bot_id: String,
    /// Its Secret.
    pub secret: String,
}

impl Robot {
    /// Bot `name`'s robot as the tests make them: Bot ID [`Robot::id_of`], secret
    /// `<name>-robot-secret`.
    pub fn named(name: &str) -> Robot {
        Robot {
            name: name.into(),
            bot_id: Robot::id_of(name),
            secret: format!("{}-robot-secret", name.to_lowercase()),
        }
    }

    /// The Bot ID of [`Robot::named`]`(name)`.
    pub fn id_of(name: &str) -> String {
        format!("aib{name}0123456789abcdef")
    }

    /// Bot `name`'s `[bots]` settings for a robot of `fake` serving `chat_id`, its
    /// secret in `<NAME>_WECOM_SECRET`.
    pub fn settings(fake: &FakeWecom, name: &str, chat_id: &str) -> String {
        format!(
            "platform = \"wecom\"\nwecom = {{ bot_id = \"{}\", secret_env = \"{}_WECOM_SECRET\", ws_url = \"{}\", chat_id = \"{chat_id}\", heartbeat_interval_ms = 300 }}",
            Robot::id_of(name),
            name.to_uppercase(),
            fake.ws_url,
        )
    }
}

/// How a robot's message was shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// A stream (or markdown) answer on a callback's req_id.
    Reply {
        /// The callback's req_id.
        req_id: String,
        /// The stream's id (empty for markdown).
        stream_id: String,
    },
    /// A proactive `aibot_send_msg`.
    Send,
}

/// A message a robot showed in a chat (a stream's bubble is one, updated in place).
#[derive(Debug, Clone)]
pub struct Shown {
    /// The robot's Bot ID.
    pub bot_id: String,
    /// The chat.
    pub chatid: String,
    /// How.
    pub via: Via,
    /// What the bubble shows now.
    pub content: String,
    /// Every frame's content, in order (one for a send).
    pub frames: Vec<String>,
    /// Whether it is finished (a send always is).
    pub finished: bool,
    /// When it was first shown.
    pub at: std::time::Instant,
}

/// A request a robot made (after logging in), and the errcode it was answered.
#[derive(Debug, Clone)]
pub struct Request {
    /// The robot's Bot ID.
    pub bot_id: String,
    /// Its cmd.
    pub cmd: String,
    /// Its req_id.
    pub req_id: String,
    /// The answer's errcode.
    pub errcode: i64,
}

/// A person's message.
#[derive(Debug, Clone)]
pub struct Said {
    /// Its msgid.
    pub msgid: String,
    /// The robots it reached (by Bot ID).
    pub reached: Vec<String>,
}

/// One open connection.
struct Conn {
    /// Its number.
    id: u64,
    /// The robot it logged in as (`None` before, or after another client took it).
    bot_id: Option<String>,
    /// Frames to it; dropping it ends the connection.
    tx: mpsc::UnboundedSender<Message>,
}

/// The stand-in's state.
#[derive(Default)]
struct Inner {
    /// The robots.
    robots: Vec<Robot>,
    /// Open connections.
    conns: Vec<Conn>,
    /// Callback req_id → (connection, Bot ID, chat).
    callbacks: HashMap<String, (u64, String, String)>,
    /// What robots showed.
    shown: Vec<Shown>,
    /// Requests after login.
    requests: Vec<Request>,
    /// Logins: (Bot ID, errcode).
    logins: Vec<(String, i64)>,
    /// Pings per Bot ID.
    pings: HashMap<String, usize>,
    /// Errcodes the next requests get.
    fail: VecDeque<i64>,
    /// Whether pings go unanswered.
    paused: bool,
    /// People's messages.
    said: Vec<Said>,
    /// Numbers for ids.
    next: u64,
    /// Connections opened.
    opened: usize,
    /// Every frame a client sent, as text (to prove what went over the wire).
    wire: Vec<String>,
}

/// The stand-in.
#[derive(Clone)]
pub struct FakeWecom {
    /// `ws://127.0.0.1:<port>`.
    pub ws_url: String,
    /// Shared state.
    inner: Arc<Mutex<Inner>>,
}

fn ack(req_id: &str, errcode: i64, errmsg: &str) -> Message {
    Message::text(
        json!({"headers": {"req_id": req_id}, "errcode": errcode, "errmsg": errmsg}).to_string(),
    )
}

/// WeCom's words for an errcode.
fn errmsg(code: i64) -> String {
    match code {
        0 => "ok".into(),
        853000 => "invalid bot_id or secret, hint: [1764201600123456789012], from ip: 127.0.0.1, more info at https://open.work.weixin.qq.com/devtool/query?e=853000".into(),
        846605 => "invalid req_id".into(),
        846608 => "stream message update expired".into(),
        45002 => "content size out of limit".into(),
        45009 => "api freq out of limit".into(),
        45033 => "api concurrency out of limit".into(),
        -1 => "system busy".into(),
        _ => format!("error {code}"),
    }
}

impl Inner {
    fn robot_of(&self, bot_id: &str) -> Option<&Robot> {
        self.robots.iter().find(|r| r.bot_id == bot_id)
    }

    /// Handles one frame of connection `conn`; returns the answer, if any.
    fn frame(&mut self, conn: u64, v: &Value) -> Option<Message> {
        let cmd = v["cmd"].as_str().unwrap_or_default().to_string();
        let req_id = v["headers"]["req_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let me = self
            .conns
            .iter()
            .find(|c| c.id == conn)
            .and_then(|c| c.bot_id.clone());
        if cmd == "aibot_subscribe" {
            let bot_id = v["body"]["bot_id"].as_str().unwrap_or_default().to_string();
            let secret = v["body"]["secret"].as_str().unwrap_or_default();
            let ok = self
                .robot_of(&bot_id)
                .is_some_and(|r| r.secret == secret && !secret.is_empty());
            let code = if ok { 0 } else { 853000 };
            self.logins.push((bot_id.clone(), code));
            if ok {
                for c in &mut self.conns {
                    if c.id != conn && c.bot_id.as_deref() == Some(&bot_id) {
                        self.next += 1;
                        let ev = json!({"cmd": "aibot_event_callback", "headers": {"req_id": format!("evt_{}", self.next)},
                            "body": {"msgid": format!("evtmsg{}", self.next), "create_time": now_secs(), "aibotid": bot_id,
                                     "msgtype": "event", "event": {"eventtype": "disconnected_event"}}});
                        let _ = c.tx.send(Message::text(ev.to_string()));
                        c.bot_id = None;
                    }
                }
                if let Some(c) = self.conns.iter_mut().find(|c| c.id == conn) {
                    c.bot_id = Some(bot_id);
                }
            }
            return Some(ack(&req_id, code, &errmsg(code)));
        }
        let Some(bot_id) = me else {
            return Some(ack(
                &req_id,
                40058,
                "invalid Request Parameter: not subscribed",
            ));
        };
        if cmd == "ping" {
            *self.pings.entry(bot_id).or_default() += 1;
            return (!self.paused).then(|| ack(&req_id, 0, "ok"));
        }
        let code = self.request(conn, &bot_id, &cmd, &req_id, &v["body"]);
        self.requests.push(Request {
            bot_id,
            cmd,
            req_id: req_id.clone(),
            errcode: code,
        });
        Some(ack(&req_id, code, &errmsg(code)))
    }

    /// Carries out a request; returns its errcode.
    fn request(&mut self, conn: u64, bot_id: &str, cmd: &str, req_id: &str, body: &Value) -> i64 {
        let (content, chatid, via) = match cmd {
            "aibot_respond_msg" => {
                let Some((c, owner, chatid)) = self.callbacks.get(req_id).cloned() else {
                    return 846605;
                };
                if c != conn || owner != bot_id {
                    return 846605;
                }
                match body["msgtype"].as_str() {
                    Some("stream") => (
                        string_at(&body["stream"]["content"]),
                        chatid,
                        Via::Reply {
                            req_id: req_id.to_string(),
                            stream_id: string_at(&body["stream"]["id"]),
                        },
                    ),
                    Some("markdown") => (
                        string_at(&body["markdown"]["content"]),
                        chatid,
                        Via::Reply {
                            req_id: req_id.to_string(),
                            stream_id: String::new(),
                        },
                    ),
                    _ => return 40058,
                }
            }
            "aibot_send_msg" => {
                if body["msgtype"].as_str() != Some("markdown") {
                    return 40058;
                }
                (
                    string_at(&body["markdown"]["content"]),
                    string_at(&body["chatid"]),
                    Via::Send,
                )
            }
            _ => return 40058,
        };
        if let Some(code) = self.fail.pop_front() {
            return code;
        }
        if content.len() > MAX_BYTES {
            return 45002;
        }
        let finish = cmd != "aibot_respond_msg"
            || body["msgtype"] == "markdown"
            || body["stream"]["finish"].as_bool() == Some(true);
        if let Some(s) = self.shown.iter_mut().find(|s| {
            s.bot_id == bot_id
                && s.via == via
                && matches!(&via, Via::Reply { stream_id, .. } if !stream_id.is_empty())
        }) {
            if s.finished {
                return 846608;
            }
            s.content = content.clone();
            s.frames.push(content);
            s.finished = finish;
            return 0;
        }
        self.shown.push(Shown {
            bot_id: bot_id.to_string(),
            chatid,
            via,
            content: content.clone(),
            frames: vec![content],
            finished: finish,
            at: std::time::Instant::now(),
        });
        0
    }
}

/// The string at `v` (a request body's field), empty when it is absent or no string.
fn string_at(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Unix seconds.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

impl FakeWecom {
    /// Starts the stand-in with these robots.
    pub async fn start(robots: Vec<Robot>) -> FakeWecom {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let inner = Arc::new(Mutex::new(Inner {
            robots,
            ..Inner::default()
        }));
        crate::serve::accept_each(listener, inner.clone(), connection);
        FakeWecom {
            ws_url: format!("ws://{addr}"),
            inner,
        }
    }

    /// Person `userid` says `text` in chat `chatid`, @-ing the robots named in `to`
    /// (their names should be in `text`, as WeCom keeps them); returns the msgid.
    pub fn say(&self, userid: &str, chatid: &str, text: &str, to: &[&str]) -> String {
        let mut g = self.inner.lock().unwrap();
        g.next += 1;
        let msgid = format!("msg{:016x}", 0x5eed_0000_0000u64 + g.next);
        let create_time = now_secs();
        let mut reached = Vec::new();
        let targets: Vec<String> = to
            .iter()
            .filter_map(|n| {
                g.robots
                    .iter()
                    .find(|r| r.name == *n)
                    .map(|r| r.bot_id.clone())
            })
            .collect();
        for bot_id in targets {
            let Some(conn) = g
                .conns
                .iter()
                .find(|c| c.bot_id.as_deref() == Some(&bot_id))
            else {
                continue;
            };
            let (conn_id, tx) = (conn.id, conn.tx.clone());
            g.next += 1;
            let req_id = format!("cbreq{:08x}{}", g.next, bot_id.len());
            let frame = json!({"cmd": "aibot_msg_callback", "headers": {"req_id": req_id},
                "body": {"msgid": msgid, "create_time": create_time, "aibotid": bot_id, "chatid": chatid, "chattype": "group",
                         "from": {"userid": userid}, "response_url": "https://qyapi.weixin.qq.com/cgi-bin/aibot/response?response_code=x",
                         "msgtype": "text", "text": {"content": text}}});
            g.callbacks
                .insert(req_id, (conn_id, bot_id.clone(), chatid.to_string()));
            let _ = tx.send(Message::text(frame.to_string()));
            reached.push(bot_id);
        }
        g.said.push(Said {
            msgid: msgid.clone(),
            reached,
        });
        msgid
    }

    /// The next requests (respond or send) answer these errcodes, showing nothing.
    pub fn fail_next(&self, codes: &[i64]) {
        self.inner
            .lock()
            .unwrap()
            .fail
            .extend(codes.iter().copied());
    }

    /// Ends every connection abruptly.
    pub fn drop_connections(&self) {
        self.inner.lock().unwrap().conns.clear();
    }

    /// Stops (or resumes) answering pings.
    pub fn pause_pongs(&self, paused: bool) {
        self.inner.lock().unwrap().paused = paused;
    }

    /// Another client took robot `bot_id`: its connection gets `disconnected_event`.
    pub fn kick(&self, bot_id: &str) {
        let mut g = self.inner.lock().unwrap();
        g.next += 1;
        let n = g.next;
        for c in &mut g.conns {
            if c.bot_id.as_deref() == Some(bot_id) {
                let ev = json!({"cmd": "aibot_event_callback", "headers": {"req_id": format!("evt_{n}")},
                    "body": {"msgid": format!("evtmsg{n}"), "create_time": now_secs(), "aibotid": bot_id,
                             "msgtype": "event", "event": {"eventtype": "disconnected_event"}}});
                let _ = c.tx.send(Message::text(ev.to_string()));
                c.bot_id = None;
            }
        }
    }

    /// What robot `bot_id` showed, in order.
    pub fn shown_by(&self, bot_id: &str) -> Vec<Shown> {
        self.inner
            .lock()
            .unwrap()
            .shown
            .iter()
            .filter(|s| s.bot_id == bot_id)
            .cloned()
            .collect()
    }

    /// Everything robots showed.
    pub fn shown(&self) -> Vec<Shown> {
        self.inner.lock().unwrap().shown.clone()
    }

    /// Requests after login.
    pub fn requests(&self) -> Vec<Request> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// Logins: (Bot ID, errcode).
    pub fn logins(&self) -> Vec<(String, i64)> {
        self.inner.lock().unwrap().logins.clone()
    }

    /// Pings from robot `bot_id`.
    pub fn pings(&self, bot_id: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .pings
            .get(bot_id)
            .copied()
            .unwrap_or(0)
    }

    /// Connections logged in as robot `bot_id` now.
    pub fn connected(&self, bot_id: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .conns
            .iter()
            .filter(|c| c.bot_id.as_deref() == Some(bot_id))
            .count()
    }

    /// Open connections (logged in or not).
    pub fn open(&self) -> usize {
        self.inner.lock().unwrap().conns.len()
    }

    /// Connections opened so far.
    pub fn opened(&self) -> usize {
        self.inner.lock().unwrap().opened
    }

    /// People's messages.
    pub fn said(&self) -> Vec<Said> {
        self.inner.lock().unwrap().said.clone()
    }

    /// Every frame clients sent, as text.
    pub fn wire(&self) -> Vec<String> {
        self.inner.lock().unwrap().wire.clone()
    }

    /// Waits (bounded: 30 s) until `cond` holds.
    pub async fn wait(&self, what: &str, cond: impl Fn(&FakeWecom) -> bool) {
        for _ in 0..600 {
            if cond(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "wecom stand-in: {what} did not happen in time; shown: {:#?}; requests: {:#?}; logins: {:?}",
            self.shown()
                .iter()
                .map(|s| (s.bot_id.clone(), s.via.clone(), s.content.chars().take(80).collect::<String>(), s.finished))
                .collect::<Vec<_>>(),
            self.requests(),
            self.logins()
        );
    }
}

async fn connection(stream: tokio::net::TcpStream, inner: Arc<Mutex<Inner>>) {
    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let conn_id = {
        let mut g = inner.lock().unwrap();
        g.opened += 1;
        g.next += 1;
        let id = g.next;
        g.conns.push(Conn {
            id,
            bot_id: None,
            tx: tx.clone(),
        });
        id
    };
    drop(tx);
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(m) => if ws.send(m).await.is_err() { break; },
                // Dropped by the test: end without a close frame.
                None => break,
            },
            frame = ws.next() => match frame {
                Some(Ok(Message::Text(t))) => {
                    let answer = {
                        let mut g = inner.lock().unwrap();
                        g.wire.push(t.as_str().to_string());
                        match serde_json::from_str::<Value>(t.as_str()) {
                            Ok(v) => g.frame(conn_id, &v),
                            Err(_) => None,
                        }
                    };
                    if let Some(a) = answer {
                        if ws.send(a).await.is_err() { break; }
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    inner.lock().unwrap().conns.retain(|c| c.id != conn_id);
}
