//! The forward WebSocket to the OneBot implementation: events in, actions out, on one
//! connection (the implementation's universal endpoint).
//!
//! One session ([`session`]): connect with `Authorization: Bearer <access token>`,
//! ask `get_login_info` and check its `user_id` against `onebot.self_id` (another
//! account is `Ended::Fatal`, with what to fix), then serve until the connection ends:
//!
//! - an action is a JSON object `{action, params, echo}`; the answer carrying the same
//!   `echo` goes to the caller that is waiting for it ([`Link::call`]); answers nobody
//!   waits for any more are logged;
//! - `meta_event`s: `lifecycle` (`connect`) is logged; `heartbeat` carries its
//!   `interval` (ms) — when none has come for twice the last interval the
//!   implementation (or QQ behind it) is taken for gone and the session ends as
//!   `Ended::Dropped`;
//! - every other event (`message`, `message_sent`, `notice`, …) is handed to the
//!   adapter through a channel, in order;
//! - a refused handshake (401/403: a wrong token) is `Ended::Fatal`; a close frame,
//!   a read error or a missed heartbeat is `Ended::Dropped`.
//!
//! [`run`] keeps sessions going on the kit's one reconnect loop
//! ([`crate::platform::kit::reconnect`]). Actions asked while no session is up fail
//! at once with [`ActionError::NotConnected`] (the kit's retry loop waits and tries
//! again).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::config::pacing::{Backoff, Jitter};
use crate::platform::kit::reconnect::{Ended, Next, Reconnect, Reconnects};
use crate::platform::kit::requests::{fail_queued, Inbox, Requests};

/// How long to wait for the connection to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an action may wait for its answer.
pub const ACTION_TIMEOUT: Duration = Duration::from_secs(15);
/// The backoff after a dropped or failed connection.
pub(crate) const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// Missed heartbeats: none for this many intervals ends the session.
pub const HEARTBEATS_MISSED: u32 = 2;

/// Why an action did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ActionError {
    /// No session is up: the action was never sent.
    #[error("not connected to the OneBot implementation")]
    NotConnected,
    /// Sent, but no answer came (in time, or before the connection ended): it may
    /// have been carried out.
    #[error("no answer to {0} (it may have been carried out)")]
    NoAnswer(String),
    /// The implementation answered `status: failed`.
    #[error("{action} failed: retcode {retcode}{}", if message.is_empty() { String::new() } else { format!(" ({message})") })]
    Failed {
        /// The action.
        action: String,
        /// OneBot's retcode (1400 bad request, 1401/1403 refused, 1404 unsupported,
        /// others the implementation's own).
        retcode: i64,
        /// The implementation's `message`/`wording`, if any.
        message: String,
    },
}

/// An action for the current session to send.
#[derive(Debug)]
pub(crate) struct Action {
    /// The action's name.
    action: String,
    /// Its parameters.
    params: Value,
}

/// Actions on their way to the session, with where their answers go.
type Calls = Inbox<Action, Value, ActionError>;

/// What the sessions share with the adapter.
#[derive(Debug, Default)]
pub struct LinkState {
    /// Whether a session is up (connected and `get_login_info` answered), for `/healthz`.
    pub connected: AtomicBool,
    /// Sessions opened so far.
    pub sessions: AtomicU64,
    /// Heartbeats received so far.
    pub heartbeats: AtomicU64,
    /// Actions answered so far.
    pub answered: AtomicU64,
}

/// The adapter's end of the connection: calls actions on whichever session is up.
#[derive(Debug, Default)]
pub struct Link {
    /// Actions to the session (the kit's one way to ask a long connection).
    requests: Requests<Action, Value, ActionError>,
    /// Shared state.
    pub state: Arc<LinkState>,
}

impl Link {
    /// Calls `action` once: its `data` when it answers `ok` (or `async`).
    pub async fn call(&self, action: &str, params: Value) -> Result<Value, ActionError> {
        let request = Action {
            action: action.to_string(),
            params,
        };
        self.requests
            .ask(
                request,
                self.state.connected.load(Ordering::Relaxed),
                ACTION_TIMEOUT,
                ActionError::NotConnected,
                || ActionError::NoAnswer(action.to_string()),
            )
            .await
    }
}

/// The answer to an action, read.
pub fn answer(action: &str, v: &Value) -> Result<Value, ActionError> {
    match v["status"].as_str() {
        Some("ok") | Some("async") => Ok(v["data"].clone()),
        _ => Err(ActionError::Failed {
            action: action.to_string(),
            retcode: v["retcode"].as_i64().unwrap_or(-1),
            message: v["wording"]
                .as_str()
                .or(v["message"].as_str())
                .or(v["msg"].as_str())
                .unwrap_or_default()
                .to_string(),
        }),
    }
}

/// What one session needs.
pub(crate) struct Session<'a> {
    /// The forward WebSocket URL.
    pub(crate) url: &'a str,
    /// The access token.
    pub(crate) token: &'a str,
    /// The QQ number the account must be.
    pub(crate) self_id: &'a str,
    /// Where events go.
    pub(crate) events: &'a mpsc::UnboundedSender<Value>,
    /// Shared state.
    pub(crate) state: &'a LinkState,
    /// The node's stop.
    pub(crate) stop: &'a CancellationToken,
}

/// The client end of the WebSocket.
type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One session (see the module docs).
async fn session(s: &Session<'_>, calls: &mut Calls) -> Ended<String> {
    let mut req = match s.url.into_client_request() {
        Ok(r) => r,
        Err(e) => return Ended::Fatal(format!("onebot.ws_url {:?} is unusable: {e}", s.url)),
    };
    match format!("Bearer {}", s.token).parse() {
        Ok(h) => {
            req.headers_mut().insert("Authorization", h);
        }
        Err(_) => {
            return Ended::Fatal(
                "the access token holds characters a header cannot carry".to_string(),
            )
        }
    }
    let connected = tokio::select! {
        _ = s.stop.cancelled() => return Ended::Stopped,
        c = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(req)) => c,
    };
    let mut ws = match connected {
        Err(_) => {
            return Ended::Dropped {
                why: "connect timed out".into(),
                established: false,
            }
        }
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(r)))
            if r.status() == 401 || r.status() == 403 =>
        {
            return Ended::Fatal(format!(
                "the OneBot implementation refused the access token ({}): set onebot.access_token_env's variable to the token of its WebSocket server",
                r.status()
            ));
        }
        Ok(Err(e)) => {
            return Ended::Dropped {
                why: format!("connect failed: {e}"),
                established: false,
            }
        }
        Ok(Ok((ws, _))) => ws,
    };
    s.state.sessions.fetch_add(1, Ordering::Relaxed);
    tracing::info!(url = %s.url, "onebot: connected; asking get_login_info");
    let ended = serve(&mut ws, s, calls).await;
    s.state.connected.store(false, Ordering::Relaxed);
    if !matches!(ended, Ended::Dropped { .. }) {
        let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
    }
    ended
}

/// Reads the connection until it ends (see the module docs).
async fn serve(ws: &mut Ws, s: &Session<'_>, calls: &mut Calls) -> Ended<String> {
    let mut established = false;
    let mut pending: HashMap<String, (String, oneshot::Sender<Result<Value, ActionError>>)> =
        HashMap::new();
    let mut next_echo = 0u64;
    let login_echo = "botmesh-login".to_string();
    let login = json!({"action": "get_login_info", "params": {}, "echo": login_echo});
    if let Err(e) = ws.send(Message::text(login.to_string())).await {
        return Ended::Dropped {
            why: format!("send failed: {e}"),
            established,
        };
    }
    let mut heartbeat_deadline: Option<Instant> = None;
    let dropped = |why: String, established: bool| Ended::Dropped { why, established };
    let ended = loop {
        let deadline = heartbeat_deadline;
        let frame = tokio::select! {
            _ = s.stop.cancelled() => break Ended::Stopped,
            _ = async { tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)).await }, if deadline.is_some() => {
                break dropped("no heartbeat for two intervals".into(), established);
            }
            call = calls.recv(), if established => {
                let Some(call) = call else { break Ended::Stopped };
                if call.reply.is_closed() {
                    continue; // its caller gave up before it was sent
                }
                next_echo += 1;
                let echo = format!("botmesh-{next_echo}");
                let Action { action, params } = call.request;
                let frame = json!({"action": action, "params": params, "echo": echo});
                if let Err(e) = ws.send(Message::text(frame.to_string())).await {
                    let _ = call.reply.send(Err(ActionError::NoAnswer(action)));
                    break dropped(format!("send failed: {e}"), established);
                }
                tracing::debug!(%action, %echo, "onebot: action sent");
                pending.insert(echo, (action, call.reply));
                continue;
            }
            f = ws.next() => f,
        };
        let text = match frame {
            Some(Ok(Message::Text(t))) => t.as_str().to_string(),
            Some(Ok(Message::Close(c))) => {
                let why = c.map_or("no code".to_string(), |c| {
                    format!("{} {}", u16::from(c.code), c.reason)
                });
                break dropped(
                    format!("the implementation closed the connection ({why})"),
                    established,
                );
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => break dropped(format!("connection lost: {e}"), established),
            None => break dropped("connection closed".into(), established),
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            tracing::warn!("onebot: a frame that is not JSON; ignored");
            continue;
        };
        if let Some(echo) = v
            .get("echo")
            .and_then(Value::as_str)
            .filter(|_| v.get("status").is_some())
        {
            s.state.answered.fetch_add(1, Ordering::Relaxed);
            if echo == login_echo {
                match answer("get_login_info", &v) {
                    Ok(data) => {
                        let id = match &data["user_id"] {
                            Value::Number(n) => n.to_string(),
                            Value::String(s) => s.clone(),
                            _ => String::new(),
                        };
                        if id != s.self_id {
                            break Ended::Fatal(format!(
                                "onebot.self_id in peers.toml is {} but the OneBot implementation is logged in as {id} ({}, get_login_info): this bot would misread its own messages and mentions of it; set onebot.self_id to {id}",
                                s.self_id,
                                data["nickname"].as_str().unwrap_or("")
                            ));
                        }
                        tracing::info!(self_id = %id, nickname = data["nickname"].as_str().unwrap_or(""), "onebot identity confirmed");
                        established = true;
                        s.state.connected.store(true, Ordering::Relaxed);
                    }
                    Err(e) => {
                        break dropped(format!("get_login_info: {e}"), established);
                    }
                }
                continue;
            }
            match pending.remove(echo) {
                Some((action, reply)) => {
                    let _ = reply.send(answer(&action, &v));
                }
                None => {
                    tracing::info!(%echo, "onebot: an answer nobody waits for (its caller gave up)")
                }
            }
            continue;
        }
        match v["post_type"].as_str() {
            Some("meta_event") => match v["meta_event_type"].as_str() {
                Some("heartbeat") => {
                    s.state.heartbeats.fetch_add(1, Ordering::Relaxed);
                    let interval = v["interval"].as_u64().unwrap_or(0);
                    heartbeat_deadline = (interval > 0).then(|| {
                        Instant::now() + Duration::from_millis(interval) * HEARTBEATS_MISSED
                    });
                    let online = v["status"]["online"].as_bool();
                    if online == Some(false) {
                        tracing::warn!("onebot heartbeat: the QQ account is offline");
                    }
                }
                Some("lifecycle") => {
                    tracing::info!(
                        sub_type = v["sub_type"].as_str().unwrap_or(""),
                        "onebot lifecycle event"
                    );
                }
                other => {
                    tracing::debug!(kind = ?other, "onebot: a meta event the mesh does not use")
                }
            },
            Some(_) => {
                if s.events.send(v).is_err() {
                    break Ended::Stopped;
                }
            }
            None => tracing::debug!("onebot: a frame that is neither an answer nor an event"),
        }
    };
    for (_, (action, reply)) in pending.drain() {
        let _ = reply.send(Err(ActionError::NoAnswer(action)));
    }
    ended
}

/// Runs sessions on the kit's reconnect loop until `stop` or a fatal end, which it
/// returns.
pub(crate) async fn run(link: &Link, s: Session<'_>) -> Option<String> {
    let Some(mut calls) = link.requests.take_inbox() else {
        return Some("the onebot connection was started twice".into());
    };
    let schedule = |attempt: u32| BACKOFF.delay(attempt + 1, Jitter::Scale(0.5..=1.0));
    let mut reconnects = Reconnects::new(Reconnect {
        platform: "onebot",
        what: "websocket",
        schedule: &schedule,
        asked_pause: Duration::from_millis(200),
    });
    loop {
        let ended = session(&s, &mut calls).await;
        // Actions queued for the ended session are not sent later.
        fail_queued(&mut calls, || ActionError::NotConnected);
        match reconnects.after(ended, s.stop, |_| {}).await {
            Next::Again => {}
            Next::Stop(fatal) => return fatal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read() {
        let ok = json!({"status": "ok", "retcode": 0, "data": {"message_id": 5}, "echo": "e"});
        assert_eq!(answer("send_group_msg", &ok).unwrap()["message_id"], 5);
        let failed = json!({"status": "failed", "retcode": 1200, "wording": "busy", "data": null, "echo": "e"});
        let e = answer("send_group_msg", &failed).unwrap_err();
        assert_eq!(e.to_string(), "send_group_msg failed: retcode 1200 (busy)");
    }

    /// A OneBot server that answers `get_login_info`, then the next two actions in
    /// the reverse order: each caller still gets its own answer (by `echo`).
    #[tokio::test]
    #[allow(clippy::result_large_err)] // the handshake callback's error is tungstenite's own
    async fn answers_reach_their_callers_by_echo_in_any_order() {
        use tokio_tungstenite::tungstenite::handshake::server::Request;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/", listener.local_addr().unwrap());
        let (auth_tx, auth_rx) = oneshot::channel();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut auth = String::new();
            let mut ws = tokio_tungstenite::accept_hdr_async(stream, |req: &Request, resp| {
                auth = req
                    .headers()
                    .get("authorization")
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                Ok(resp)
            })
            .await
            .unwrap();
            let _ = auth_tx.send(auth);
            let mut frames = Vec::new();
            while frames.len() < 3 {
                if let Some(Ok(Message::Text(t))) = ws.next().await {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    let answer = |data: Value| {
                        Message::text(
                            json!({"status": "ok", "retcode": 0, "data": data, "echo": v["echo"]})
                                .to_string(),
                        )
                    };
                    if frames.is_empty() {
                        ws.send(answer(json!({"user_id": 10001, "nickname": "ada"})))
                            .await
                            .unwrap();
                    }
                    frames.push(v);
                }
            }
            // The two actions, answered last first.
            for v in [&frames[2], &frames[1]] {
                let a = json!({"status": "ok", "retcode": 0, "data": {"n": v["params"]["n"]}, "echo": v["echo"]});
                ws.send(Message::text(a.to_string())).await.unwrap();
            }
            let _ = ws.next().await; // until the client goes
        });
        let link = Arc::new(Link::default());
        let stop = CancellationToken::new();
        let (tx, _rx) = mpsc::unbounded_channel();
        let client = {
            let (link, stop) = (link.clone(), stop.clone());
            tokio::spawn(async move {
                let s = Session {
                    url: &url,
                    token: "tok",
                    self_id: "10001",
                    events: &tx,
                    state: &link.state,
                    stop: &stop,
                };
                run(&link, s).await
            })
        };
        for _ in 0..200 {
            if link.state.connected.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (a, b) = tokio::join!(
            link.call("first", json!({"n": 1})),
            link.call("second", json!({"n": 2}))
        );
        assert_eq!(
            (a.unwrap()["n"].clone(), b.unwrap()["n"].clone()),
            (json!(1), json!(2))
        );
        assert_eq!(auth_rx.await.unwrap(), "Bearer tok");
        stop.cancel();
        assert_eq!(client.await.unwrap(), None, "stopped, not failed");
        server.abort();
    }
}
