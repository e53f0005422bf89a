//! The smart robot's long connection: login, heartbeats, requests matched to their
//! acks by req_id, callbacks handed to the adapter, drops and reconnects.
//!
//! One session ([`session`]):
//!
//! - connect to `ws_url`, send `aibot_subscribe` with the Bot ID and Secret (the only
//!   frame that holds the secret; it is never logged) and wait for its ack. `errcode
//!   0` is a live session; 853000 (a wrong Bot ID or Secret) or 93019 ends it as
//!   `Ended::Fatal`: WeCom leaves such a socket open and retrying cannot fix it. Any
//!   other refusal (45009, a busy server) is a drop, retried on the backoff.
//! - every `heartbeat_interval` a `ping`; its ack (matched by req_id alone, as the
//!   SDKs do) clears the count of unanswered pings. Two unanswered in a row end the
//!   session as `Ended::Dropped`, like a close frame or a read error.
//! - a request ([`Link::call`]) goes out with its req_id; its ack goes back to the
//!   caller. Requests on one req_id (the frames of a reply on one callback) go one at
//!   a time, each after the previous one's ack, as the SDKs send them.
//! - `aibot_msg_callback` and `aibot_event_callback` go to the adapter in order,
//!   except `disconnected_event`: another client logged in as this robot, and WeCom
//!   allows one. The session ends as `Ended::Fatal`, because a client that reconnects
//!   then kicks the other one, which kicks it back, forever.
//!
//! [`run`] keeps sessions going on the kit's reconnect loop
//! ([`crate::platform::kit::reconnect`]). A request made while no session is up fails
//! at once with [`SendError::NotConnected`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::config::pacing::{Backoff, Jitter};
use crate::platform::kit::reconnect::{Ended, Next, Reconnect, Reconnects};
use crate::platform::kit::requests::{fail_queued, Inbox, Pending, Requests};

use super::frames::{self, code};

/// How long to wait for the connection to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the login may wait for its ack.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a request may wait for its ack (counted from when it is asked, so a
/// request queued behind others on its req_id waits for them too).
pub const ACK_TIMEOUT: Duration = Duration::from_secs(15);
/// The backoff after a dropped or failed connection (the SDKs': 1 s doubling to 30 s).
pub(crate) const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
/// Pings in a row without an ack that end the session (the SDKs' two).
pub const PINGS_MISSED: u32 = 2;

/// Why a request did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SendError {
    /// No session is up: the request was never sent.
    #[error("not connected to wecom")]
    NotConnected,
    /// Sent, but no ack came (in time, or before the connection ended): it may have
    /// been carried out.
    #[error("no ack to {0} (it may have been carried out)")]
    NoAnswer(String),
    /// WeCom answered with an error code.
    #[error("{cmd} refused: errcode {errcode}{}", if errmsg.is_empty() { String::new() } else { format!(" ({errmsg})") })]
    Refused {
        /// The request's cmd.
        cmd: String,
        /// WeCom's code (docs/wecom.md lists those seen).
        errcode: i64,
        /// WeCom's words.
        errmsg: String,
    },
}

impl SendError {
    /// WeCom's error code, when it refused.
    pub fn errcode(&self) -> Option<i64> {
        match self {
            SendError::Refused { errcode, .. } => Some(*errcode),
            _ => None,
        }
    }
}

/// A request for the current session to send.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// Its cmd.
    cmd: String,
    /// Its req_id: a callback's for an answer on it, else a fresh one.
    req_id: String,
    /// Its body.
    body: Value,
}

/// A request with where its ack goes.
type Call = Pending<Request, Value, SendError>;

/// What the sessions share with the adapter.
#[derive(Debug, Default)]
pub struct LinkState {
    /// Whether a session is up (logged in), for `/healthz` and for requests.
    pub connected: AtomicBool,
    /// Sessions logged in so far: the number of the current one. A callback's req_id
    /// is good only on the session that received it.
    pub sessions: AtomicU64,
    /// Pings sent so far.
    pub pings: AtomicU64,
    /// Pings acked so far.
    pub pongs: AtomicU64,
    /// Requests acked so far (with or without an error).
    pub acked: AtomicU64,
}

/// The adapter's end of the connection: sends requests on whichever session is up.
#[derive(Debug, Default)]
pub struct Link {
    /// Requests to the session (the kit's one way to ask a long connection).
    requests: Requests<Request, Value, SendError>,
    /// Shared state.
    pub state: Arc<LinkState>,
}

impl Link {
    /// Sends `cmd` with `body` on `req_id` once: the ack when its `errcode` is 0.
    pub async fn call(&self, cmd: &str, req_id: &str, body: Value) -> Result<Value, SendError> {
        let request = Request {
            cmd: cmd.to_string(),
            req_id: req_id.to_string(),
            body,
        };
        self.requests
            .ask(
                request,
                self.state.connected.load(Ordering::Relaxed),
                ACK_TIMEOUT,
                SendError::NotConnected,
                || SendError::NoAnswer(cmd.to_string()),
            )
            .await
    }

    /// The number of the session up now (`None` when none is).
    pub fn session(&self) -> Option<u64> {
        self.state
            .connected
            .load(Ordering::Relaxed)
            .then(|| self.state.sessions.load(Ordering::Relaxed))
    }
}

/// An ack, read: the frame when its errcode is 0.
pub fn acked(cmd: &str, frame: Value) -> Result<Value, SendError> {
    match frames::errcode(&frame) {
        0 => Ok(frame),
        errcode => Err(SendError::Refused {
            cmd: cmd.to_string(),
            errcode,
            errmsg: frame["errmsg"].as_str().unwrap_or_default().to_string(),
        }),
    }
}

/// What one session needs.
pub(crate) struct Session<'a> {
    /// The long connection's URL.
    pub(crate) url: &'a str,
    /// The robot's Bot ID.
    pub(crate) bot_id: &'a str,
    /// The robot's Secret.
    pub(crate) secret: &'a str,
    /// The time between pings.
    pub(crate) heartbeat: Duration,
    /// Where callbacks go, with the number of the session that received them (a
    /// callback's req_id is good on that session only).
    pub(crate) callbacks: &'a mpsc::UnboundedSender<(u64, Value)>,
    /// Shared state.
    pub(crate) state: &'a LinkState,
    /// The node's stop.
    pub(crate) stop: &'a CancellationToken,
}

/// The client end of the WebSocket.
type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One session (see the module docs).
async fn session(s: &Session<'_>, calls: &mut Inbox<Request, Value, SendError>) -> Ended<String> {
    let connected = tokio::select! {
        _ = s.stop.cancelled() => return Ended::Stopped,
        c = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(s.url)) => c,
    };
    let mut ws = match connected {
        Err(_) => {
            return Ended::Dropped {
                why: "connect timed out".into(),
                established: false,
            }
        }
        Ok(Err(e)) => {
            return Ended::Dropped {
                why: format!("connect failed: {e}"),
                established: false,
            }
        }
        Ok(Ok((ws, _))) => ws,
    };
    tracing::info!(url = %s.url, bot_id = %s.bot_id, "wecom: connected; logging in (aibot_subscribe)");
    let ended = match login(&mut ws, s).await {
        Ok(()) => serve(&mut ws, s, calls).await,
        Err(ended) => ended,
    };
    s.state.connected.store(false, Ordering::Relaxed);
    if !matches!(ended, Ended::Dropped { .. }) {
        let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
    }
    ended
}

/// Sends the login and waits for its ack (frames before it are not expected; they
/// are logged and dropped).
async fn login(ws: &mut Ws, s: &Session<'_>) -> Result<(), Ended<String>> {
    let req_id = frames::req_id(frames::SUBSCRIBE);
    let frame = frames::subscribe(&req_id, s.bot_id, s.secret);
    if let Err(e) = ws.send(Message::text(frame)).await {
        return Err(Ended::Dropped {
            why: format!("send failed: {e}"),
            established: false,
        });
    }
    let deadline = tokio::time::Instant::now() + LOGIN_TIMEOUT;
    loop {
        let frame = tokio::select! {
            _ = s.stop.cancelled() => return Err(Ended::Stopped),
            _ = tokio::time::sleep_until(deadline) => {
                return Err(Ended::Dropped { why: "no answer to the login".into(), established: false });
            }
            f = ws.next() => f,
        };
        let v = match read(frame) {
            Ok(Some(v)) => v,
            Ok(None) => continue,
            Err(why) => {
                return Err(Ended::Dropped {
                    why,
                    established: false,
                })
            }
        };
        if frames::req_id_of(&v) != req_id {
            tracing::debug!(cmd = ?v["cmd"].as_str(), "wecom: a frame before the login's ack; dropped");
            continue;
        }
        return match frames::errcode(&v) {
            0 => {
                let n = s.state.sessions.fetch_add(1, Ordering::Relaxed) + 1;
                s.state.connected.store(true, Ordering::Relaxed);
                tracing::info!(bot_id = %s.bot_id, session = n, "wecom: logged in");
                Ok(())
            }
            e @ (code::INVALID_CREDENTIALS | code::INVALID_BOT_ID) => Err(Ended::Fatal(format!(
                "wecom refused the robot's Bot ID or Secret (errcode {e}: {}): check wecom.bot_id ({}) and the Secret in the variable wecom.secret_env names, then restart the node",
                v["errmsg"].as_str().unwrap_or_default(),
                s.bot_id
            ))),
            e => Err(Ended::Dropped {
                why: format!(
                    "login refused: errcode {e} ({})",
                    v["errmsg"].as_str().unwrap_or_default()
                ),
                established: false,
            }),
        };
    }
}

/// A frame read from the socket: `Ok(Some(json))`, `Ok(None)` for one to skip, or why
/// the connection ended.
fn read(
    frame: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
) -> Result<Option<Value>, String> {
    let text = match frame {
        Some(Ok(Message::Text(t))) => t.as_str().to_string(),
        Some(Ok(Message::Binary(b))) => String::from_utf8_lossy(&b).into_owned(),
        Some(Ok(Message::Close(c))) => {
            let why = c.map_or("no code".to_string(), |c| {
                format!("{} {}", u16::from(c.code), c.reason)
            });
            return Err(format!("wecom closed the connection ({why})"));
        }
        Some(Ok(_)) => return Ok(None),
        Some(Err(e)) => return Err(format!("connection lost: {e}")),
        None => return Err("connection closed".into()),
    };
    match serde_json::from_str::<Value>(&text) {
        Ok(v) => Ok(Some(v)),
        Err(_) => {
            tracing::warn!("wecom: a frame that is not JSON; ignored");
            Ok(None)
        }
    }
}

/// Requests in flight and queued, by req_id: the front of each queue is sent and
/// waits for its ack.
#[derive(Default)]
struct InFlight(HashMap<String, VecDeque<Call>>);

impl InFlight {
    /// Queues `call`; returns its request when its req_id has nothing in flight (to
    /// send now).
    fn admit(&mut self, call: Call) -> Option<Request> {
        let queue = self.0.entry(call.request.req_id.clone()).or_default();
        let now = queue.is_empty().then(|| call.request.clone());
        queue.push_back(call);
        now
    }

    /// Hands `ack` to the request in flight on its req_id; returns the next one to
    /// send on it, if any. `None` when nothing waited for it.
    fn ack(&mut self, ack: Value) -> Option<Option<Request>> {
        let req_id = frames::req_id_of(&ack).to_string();
        let queue = self.0.get_mut(&req_id)?;
        let call = queue.pop_front()?;
        let _ = call.reply.send(acked(&call.request.cmd, ack));
        let next = queue.front().map(|c| c.request.clone());
        if queue.is_empty() {
            self.0.remove(&req_id);
        }
        Some(next)
    }

    /// Fails every request (the session ended).
    fn fail_all(&mut self) {
        for (_, queue) in self.0.drain() {
            for call in queue {
                let _ = call.reply.send(Err(SendError::NoAnswer(call.request.cmd)));
            }
        }
    }
}

/// Reads the connection until it ends (see the module docs).
async fn serve(
    ws: &mut Ws,
    s: &Session<'_>,
    calls: &mut Inbox<Request, Value, SendError>,
) -> Ended<String> {
    let session = s.state.sessions.load(Ordering::Relaxed);
    let mut in_flight = InFlight::default();
    let mut pings: HashSet<String> = HashSet::new();
    let mut ticks =
        tokio::time::interval_at(tokio::time::Instant::now() + s.heartbeat, s.heartbeat);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let dropped = |why: String| Ended::Dropped {
        why,
        established: true,
    };
    let ended = loop {
        let mut to_send = None;
        tokio::select! {
            _ = s.stop.cancelled() => break Ended::Stopped,
            _ = ticks.tick() => {
                if pings.len() as u32 >= PINGS_MISSED {
                    break dropped(format!("no ack to {PINGS_MISSED} pings in a row"));
                }
                let req_id = frames::req_id(frames::PING);
                let frame = frames::request(frames::PING, &req_id, None);
                if let Err(e) = ws.send(Message::text(frame.to_string())).await {
                    break dropped(format!("send failed: {e}"));
                }
                s.state.pings.fetch_add(1, Ordering::Relaxed);
                pings.insert(req_id);
                continue;
            }
            call = calls.recv() => {
                let Some(call) = call else { break Ended::Stopped };
                if call.reply.is_closed() {
                    continue; // its caller gave up before it was sent
                }
                to_send = in_flight.admit(call);
            }
            f = ws.next() => {
                let v = match read(f) {
                    Ok(Some(v)) => v,
                    Ok(None) => continue,
                    Err(why) => break dropped(why),
                };
                // Its cmd and req_id only: a frame's body is people's text.
                tracing::trace!(cmd = v["cmd"].as_str().unwrap_or("ack"), req_id = frames::req_id_of(&v), errcode = frames::errcode(&v), "wecom: frame received");
                match v["cmd"].as_str() {
                    Some(frames::MSG_CALLBACK) => {
                        if s.callbacks.send((session, v)).is_err() {
                            break Ended::Stopped;
                        }
                    }
                    Some(frames::EVENT_CALLBACK) => {
                        if v["body"]["event"]["eventtype"].as_str() == Some(frames::DISCONNECTED_EVENT) {
                            break Ended::Fatal(format!(
                                "another client logged in as this robot (bot_id {}) and wecom keeps one connection per robot (disconnected_event): stop the other client (another node or an SDK script with this Bot ID), then restart this node; botmesh does not reconnect, which would take the robot back and forth forever",
                                s.bot_id
                            ));
                        }
                        if s.callbacks.send((session, v)).is_err() {
                            break Ended::Stopped;
                        }
                    }
                    Some(other) => {
                        tracing::debug!(cmd = other, "wecom: a frame the mesh does not use");
                    }
                    None => {
                        let req_id = frames::req_id_of(&v).to_string();
                        if pings.contains(&req_id) {
                            if frames::errcode(&v) == 0 {
                                s.state.pongs.fetch_add(1, Ordering::Relaxed);
                                pings.clear();
                            } else {
                                tracing::warn!(errcode = frames::errcode(&v), errmsg = v["errmsg"].as_str().unwrap_or_default(), "wecom: a ping was refused");
                            }
                            continue;
                        }
                        s.state.acked.fetch_add(1, Ordering::Relaxed);
                        match in_flight.ack(v) {
                            Some(next) => to_send = next,
                            None => tracing::info!(%req_id, "wecom: an ack nobody waits for (its caller gave up)"),
                        }
                    }
                }
            }
        }
        if let Some(Request { cmd, req_id, body }) = to_send {
            let frame = frames::request(&cmd, &req_id, Some(body));
            if let Err(e) = ws.send(Message::text(frame.to_string())).await {
                break dropped(format!("send failed: {e}"));
            }
            tracing::debug!(%cmd, %req_id, "wecom: request sent");
        }
    };
    in_flight.fail_all();
    ended
}

/// Runs sessions on the kit's reconnect loop until `stop` or a fatal end, which it
/// returns.
pub(crate) async fn run(link: &Link, s: Session<'_>) -> Option<String> {
    let Some(mut calls) = link.requests.take_inbox() else {
        return Some("the wecom connection was started twice".into());
    };
    let schedule = |attempt: u32| BACKOFF.delay(attempt + 1, Jitter::Scale(0.5..=1.0));
    let mut reconnects = Reconnects::new(Reconnect {
        platform: "wecom",
        what: "long connection",
        schedule: &schedule,
        asked_pause: Duration::from_millis(200),
    });
    loop {
        let ended = session(&s, &mut calls).await;
        // Requests queued for the ended session are not sent later.
        fail_queued(&mut calls, || SendError::NotConnected);
        match reconnects.after(ended, s.stop, |_| {}).await {
            Next::Again => {}
            Next::Stop(fatal) => return fatal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::wecom::outbound::ReplyStream;
    use serde_json::json;

    /// A server that acks the login and every request, and records what it was sent.
    /// Before acking a request it waits 100 ms for another frame: one that comes then
    /// on the same req_id was sent before its predecessor's ack, and is recorded as
    /// `{"overtook": req_id}`.
    async fn server(listener: tokio::net::TcpListener, seen: mpsc::UnboundedSender<Value>) {
        let (stream, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
        let mut early: Option<Message> = None;
        loop {
            let msg = match early.take() {
                Some(m) => m,
                None => match ws.next().await {
                    Some(Ok(m)) => m,
                    _ => return,
                },
            };
            let Message::Text(t) = msg else { continue };
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            let req_id = v["headers"]["req_id"].clone();
            let ack = json!({"headers": {"req_id": req_id}, "errcode": 0, "errmsg": "ok"});
            let login = v["cmd"] == "aibot_subscribe";
            let _ = seen.send(v);
            if !login {
                if let Ok(Some(Ok(m))) =
                    tokio::time::timeout(Duration::from_millis(100), ws.next()).await
                {
                    if let Message::Text(t) = &m {
                        let w: Value = serde_json::from_str(t.as_str()).unwrap();
                        if w["headers"]["req_id"] == req_id {
                            let _ = seen.send(json!({"overtook": req_id}));
                        }
                    }
                    early = Some(m);
                }
            }
            ws.send(Message::text(ack.to_string())).await.unwrap();
        }
    }

    /// Requests on one req_id go one at a time, each after the last one's ack; a
    /// streamed answer's frames each hold the whole text so far; no frame for empty
    /// text, and a finish without text ends on the last text shown.
    #[tokio::test]
    async fn a_stream_goes_frame_by_frame_and_never_shows_an_empty_bubble() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        tokio::spawn(server(listener, seen_tx));
        let link = Arc::new(Link::default());
        let stop = CancellationToken::new();
        let (callbacks, _rx) = mpsc::unbounded_channel();
        let client = {
            let (link, stop) = (link.clone(), stop.clone());
            tokio::spawn(async move {
                let s = Session {
                    url: &url,
                    bot_id: "aibX",
                    secret: "s3cr3t",
                    heartbeat: Duration::from_secs(30),
                    callbacks: &callbacks,
                    state: &link.state,
                    stop: &stop,
                };
                run(&link, s).await
            })
        };
        let login = seen.recv().await.unwrap();
        assert_eq!(login["body"], json!({"bot_id": "aibX", "secret": "s3cr3t"}));
        for _ in 0..100 {
            if link.session().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(link.session(), Some(1));

        // Nothing shown, nothing to finish: no frame at all.
        ReplyStream::new(&link, "cb-0").finish("  ").await.unwrap();

        // Two frames on one req_id at once: the second waits for the first's ack.
        let (a, b) = tokio::join!(
            link.call(
                frames::RESPOND,
                "cb-2",
                frames::stream_body("s2", "一", false)
            ),
            link.call(
                frames::RESPOND,
                "cb-2",
                frames::stream_body("s2", "一二", true)
            )
        );
        a.unwrap();
        b.unwrap();
        let first = seen.recv().await.unwrap();
        let second = seen.recv().await.unwrap();
        assert_eq!(
            (
                &first["body"]["stream"]["content"],
                &second["body"]["stream"]["content"]
            ),
            (&json!("一"), &json!("一二")),
            "in order, neither overtaking: {second}"
        );

        let mut stream = ReplyStream::new(&link, "cb-1");
        stream.update("").await.unwrap();
        let (a, b) = tokio::join!(
            stream.update("思考中…"),
            link.call(frames::SEND, "send-1", frames::send_body("wrkC", "other"))
        );
        a.unwrap();
        b.unwrap();
        stream.finish("").await.unwrap();
        let mut frames = Vec::new();
        while frames.len() < 3 {
            frames.push(seen.recv().await.unwrap());
        }
        let streamed: Vec<(String, bool)> = frames
            .iter()
            .filter(|f| f["cmd"] == "aibot_respond_msg")
            .map(|f| {
                assert_eq!(f["headers"]["req_id"], "cb-1");
                let s = &f["body"]["stream"];
                (
                    s["content"].as_str().unwrap().to_string(),
                    s["finish"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            streamed,
            [
                ("思考中…".to_string(), false),
                ("思考中…".to_string(), true)
            ],
            "no empty frame; the finish shows the last text"
        );
        assert!(frames.iter().any(|f| f["cmd"] == "aibot_send_msg"));
        assert!(
            tokio::time::timeout(Duration::from_millis(200), seen.recv())
                .await
                .is_err(),
            "nothing else was sent"
        );
        stop.cancel();
        assert_eq!(client.await.unwrap(), None, "stopped, not failed");
    }
}
