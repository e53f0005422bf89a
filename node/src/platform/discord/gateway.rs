//! Discord's Gateway (v10, JSON, no compression) over a WebSocket: one session,
//! kept alive across drops.
//!
//! 1. Connect to `{url}/?v=10&encoding=json` and wait for HELLO (op 10).
//! 2. Heartbeat (op 1, `d` = the last sequence number) every `heartbeat_interval`,
//!    the first one after `interval × jitter` (jitter in 0..1), as the docs ask so a
//!    fleet of reconnecting clients does not beat in step. Every beat must be
//!    acknowledged (op 11) before the next one is due: a missing ACK means a zombie
//!    connection, which is closed (with a code other than 1000/1001, so the session
//!    survives) and resumed. A HEARTBEAT request from Discord (op 1) is answered at once.
//! 3. IDENTIFY (op 2) with the token and [`INTENTS`] on a new session; RESUME
//!    (op 6: token, `session_id`, `seq`) at READY's `resume_gateway_url` after a
//!    drop, and Discord replays what was missed, then sends RESUMED.
//! 4. RECONNECT (op 7): close and resume. INVALID_SESSION (op 9): `d = true` resume,
//!    `d = false` start a new session after 1–5 s.
//! 5. A close code decides ([`close_action`]): resume, identify anew, or stop with a
//!    [`GatewayError`] saying what to fix (4004: the token; 4014: the privileged
//!    MESSAGE CONTENT intent is not enabled in the developer portal).
//!
//! Dispatches (op 0) go to the adapter in order through a channel; nothing here knows
//! what a message is. The socket is behind [`Connector`]/[`Conn`], so the session
//! logic runs against an in-memory socket under tokio's paused clock in the tests.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::pacing::Backoff;
use crate::platform::kit::reconnect::{self as kit, Next, Reconnect, Reconnects};

/// Gateway version in the connection URL.
pub const GATEWAY_VERSION: u32 = 10;
/// GUILDS (1 << 0): guild and channel events.
pub const INTENT_GUILDS: u64 = 1 << 0;
/// GUILD_MESSAGES (1 << 9): messages in guild channels.
pub const INTENT_GUILD_MESSAGES: u64 = 1 << 9;
/// MESSAGE_CONTENT (1 << 15), privileged: message text. Without it enabled in the
/// developer portal the gateway closes with 4014.
pub const INTENT_MESSAGE_CONTENT: u64 = 1 << 15;
/// What a bot of the mesh asks for.
pub const INTENTS: u64 = INTENT_GUILDS | INTENT_GUILD_MESSAGES | INTENT_MESSAGE_CONTENT;
/// The code this client closes with when it means to resume (not 1000/1001, which
/// end the session).
pub const RESUME_CLOSE_CODE: u16 = 4000;
/// How long to wait for HELLO after connecting.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest wait between two connection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Opcodes (Discord's "Gateway Opcodes" table).
pub mod op {
    /// An event was dispatched.
    pub const DISPATCH: u64 = 0;
    /// Keep-alive, either way.
    pub const HEARTBEAT: u64 = 1;
    /// Start a new session.
    pub const IDENTIFY: u64 = 2;
    /// Resume a dropped session.
    pub const RESUME: u64 = 6;
    /// Reconnect and resume.
    pub const RECONNECT: u64 = 7;
    /// The session is invalid; `d` says whether it can be resumed.
    pub const INVALID_SESSION: u64 = 9;
    /// First message: the heartbeat interval.
    pub const HELLO: u64 = 10;
    /// A heartbeat was received.
    pub const HEARTBEAT_ACK: u64 = 11;
}

/// Why the gateway stopped for good: a close code that retrying cannot fix.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum GatewayError {
    /// 4004.
    #[error("discord gateway closed with 4004 (authentication failed): the bot token in discord.token_env is wrong or was reset; copy a new one from the developer portal (Bot → Reset Token)")]
    AuthenticationFailed,
    /// 4014.
    #[error("discord gateway closed with 4014 (disallowed intents): enable MESSAGE CONTENT INTENT for this bot in the developer portal (Bot → Privileged Gateway Intents), then restart the node")]
    DisallowedIntents,
    /// 4013.
    #[error(
        "discord gateway closed with 4013 (invalid intents): this build asks for intents {INTENTS}"
    )]
    InvalidIntents,
    /// 4010 / 4011.
    #[error("discord gateway closed with {0} (sharding): the bot is in too many guilds for one connection")]
    Sharding(u16),
    /// 4012.
    #[error("discord gateway closed with 4012 (invalid API version): this build speaks gateway v{GATEWAY_VERSION}")]
    ApiVersion,
}

/// What to do after the connection closed with a code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseAction {
    /// Reconnect and RESUME the session.
    Resume,
    /// Reconnect and IDENTIFY a new session (the old one is gone).
    Reidentify,
    /// Stop: retrying cannot succeed.
    Stop(GatewayError),
}

/// The action for every close code ("Gateway Close Event Codes"): 4000–4003, 4005,
/// 4008 resume; 4007 (invalid seq) and 4009 (session timed out) identify anew;
/// 4004, 4010–4014 stop; anything else (1000, 1001, 1006, unknown) resumes, and a
/// session Discord no longer knows comes back as INVALID_SESSION, then a new one.
pub fn close_action(code: u16) -> CloseAction {
    match code {
        4007 | 4009 => CloseAction::Reidentify,
        4004 => CloseAction::Stop(GatewayError::AuthenticationFailed),
        4010 | 4011 => CloseAction::Stop(GatewayError::Sharding(code)),
        4012 => CloseAction::Stop(GatewayError::ApiVersion),
        4013 => CloseAction::Stop(GatewayError::InvalidIntents),
        4014 => CloseAction::Stop(GatewayError::DisallowedIntents),
        _ => CloseAction::Resume,
    }
}

/// One frame from the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A text frame (a JSON payload).
    Text(String),
    /// The peer closed, with its code when it gave one.
    Close(Option<u16>),
}

/// An open gateway socket.
pub trait Conn: Send {
    /// Sends a text frame.
    fn send(&mut self, text: String) -> BoxFuture<'_, Result<(), String>>;
    /// The next frame; `None` when the connection is gone. Cancel-safe.
    fn recv(&mut self) -> BoxFuture<'_, Option<Frame>>;
    /// Closes with `code` (best effort).
    fn close(&mut self, code: u16) -> BoxFuture<'_, ()>;
}

/// Opens gateway sockets.
pub trait Connector: Send + Sync + 'static {
    /// Connects to `url`.
    fn connect<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<Box<dyn Conn>, String>>;
}

/// The real socket: tokio-tungstenite (TLS for `wss://` by rustls).
#[derive(Debug, Default, Clone, Copy)]
pub struct WsConnector;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A tungstenite socket as a [`Conn`].
struct WsConn(Ws);

impl Conn for WsConn {
    fn send(&mut self, text: String) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.0
                .send(tokio_tungstenite::tungstenite::Message::text(text))
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn recv(&mut self) -> BoxFuture<'_, Option<Frame>> {
        use tokio_tungstenite::tungstenite::Message;
        Box::pin(async move {
            loop {
                return match self.0.next().await? {
                    Ok(Message::Text(t)) => Some(Frame::Text(t.as_str().to_string())),
                    Ok(Message::Binary(b)) => match String::from_utf8(b.to_vec()) {
                        Ok(t) => Some(Frame::Text(t)),
                        Err(_) => {
                            tracing::warn!("discord gateway sent a binary frame that is not UTF-8 (compression is not requested); ignoring it");
                            continue;
                        }
                    },
                    Ok(Message::Close(c)) => Some(Frame::Close(c.map(|c| u16::from(c.code)))),
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::info!(error = %e, "discord gateway connection lost");
                        None
                    }
                };
            }
        })
    }

    fn close(&mut self, code: u16) -> BoxFuture<'_, ()> {
        use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame};
        Box::pin(async move {
            let frame = CloseFrame {
                code: CloseCode::from(code),
                reason: "".into(),
            };
            let _ = tokio::time::timeout(Duration::from_secs(2), self.0.close(Some(frame))).await;
        })
    }
}

impl Connector for WsConnector {
    fn connect<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<Box<dyn Conn>, String>> {
        Box::pin(async move {
            let (ws, _) = tokio::time::timeout(
                Duration::from_secs(20),
                tokio_tungstenite::connect_async(url),
            )
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| e.to_string())?;
            Ok(Box::new(WsConn(ws)) as Box<dyn Conn>)
        })
    }
}

/// One dispatched event (op 0), in the order the gateway sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// The event name (`READY`, `MESSAGE_CREATE`, …).
    pub t: String,
    /// Its sequence number.
    pub s: Option<u64>,
    /// Its data.
    pub d: Value,
}

/// The session to resume after a drop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// READY's `session_id`.
    pub session_id: String,
    /// READY's `resume_gateway_url`.
    pub resume_url: String,
}

/// The gateway client's settings.
pub struct Gateway {
    /// Opens sockets.
    pub connector: Arc<dyn Connector>,
    /// The URL from `GET /gateway/bot` (or the configured override).
    pub url: String,
    /// The bot token.
    pub token: String,
    /// The intents sent in IDENTIFY.
    pub intents: u64,
    /// True while a session is established (set at READY/RESUMED, cleared when the
    /// connection ends), for `/healthz`.
    pub connected: Arc<std::sync::atomic::AtomicBool>,
    /// A number in 0..1 for the first heartbeat's delay and the re-identify pause
    /// (random in production; fixed in tests).
    pub jitter: Arc<dyn Fn() -> f64 + Send + Sync>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("url", &self.url)
            .field("intents", &self.intents)
            .finish_non_exhaustive()
    }
}

/// How one connection ended.
#[derive(Debug)]
enum Ended {
    /// Reconnect and resume (or identify when there is no session).
    Resume,
    /// Reconnect with a new session.
    Reidentify,
    /// Stop for good.
    Stop(GatewayError),
    /// The node is shutting down.
    Cancelled,
}

/// `url` with the version and encoding query Discord asks for.
pub fn connect_url(url: &str) -> String {
    let base = url.split('?').next().unwrap_or(url).trim_end_matches('/');
    format!("{base}/?v={GATEWAY_VERSION}&encoding=json")
}

/// What the connection loop keeps between connections.
#[derive(Debug, Default)]
struct State {
    /// The session to resume, once READY gave one.
    session: Option<Session>,
    /// The last sequence number received (sent in heartbeats and RESUME).
    seq: Option<u64>,
}

impl Gateway {
    /// A gateway client with random jitter.
    pub fn new(connector: Arc<dyn Connector>, url: String, token: String) -> Gateway {
        Gateway {
            connector,
            url,
            token,
            intents: INTENTS,
            connected: Default::default(),
            jitter: Arc::new(|| {
                use rand::Rng;
                rand::thread_rng().gen_range(0.0..1.0)
            }),
        }
    }

    /// Runs the session until `cancel`, sending dispatches to `events` in order.
    /// Returns an error only for a close code that retrying cannot fix.
    pub async fn run(
        &self,
        events: mpsc::UnboundedSender<Dispatch>,
        cancel: CancellationToken,
    ) -> Result<(), GatewayError> {
        let mut state = State::default();
        let jitter = self.jitter.clone();
        // Straight back after a session that got going (to resume it), else the one
        // backoff from 1 s, spread by half.
        let schedule = move |attempt: u32| {
            if attempt == 0 {
                return Duration::ZERO;
            }
            let nominal = Backoff::new(Duration::from_secs(1), MAX_BACKOFF).nominal(attempt);
            nominal.mul_f64(0.5 + jitter() * 0.5)
        };
        let mut reconnects = Reconnects::new(Reconnect {
            platform: "discord",
            what: "gateway",
            schedule: &schedule,
            asked_pause: Duration::ZERO,
        });
        loop {
            let (ended, established) = self.connect_once(&mut state, &events, &cancel).await;
            self.connected
                .store(false, std::sync::atomic::Ordering::Relaxed);
            let ended = match ended {
                Ended::Cancelled => kit::Ended::Stopped,
                Ended::Stop(e) => kit::Ended::Fatal(e),
                Ended::Resume => kit::Ended::Dropped {
                    why: "closed; resuming".into(),
                    established,
                },
                Ended::Reidentify => {
                    state.session = None;
                    state.seq = None;
                    kit::Ended::Dropped {
                        why: "closed; identifying anew".into(),
                        established,
                    }
                }
            };
            match reconnects.after(ended, &cancel, |_| {}).await {
                Next::Again => continue,
                Next::Stop(None) => return Ok(()),
                Next::Stop(Some(e)) => return Err(e),
            }
        }
    }

    /// One connection: HELLO, IDENTIFY or RESUME, then heartbeats and dispatches until
    /// it ends. The flag says whether the session got going (READY or RESUMED), which
    /// resets the reconnect backoff.
    async fn connect_once(
        &self,
        state: &mut State,
        events: &mpsc::UnboundedSender<Dispatch>,
        cancel: &CancellationToken,
    ) -> (Ended, bool) {
        let resuming = state.session.clone().filter(|_| state.seq.is_some());
        let url = connect_url(resuming.as_ref().map_or(&self.url, |s| &s.resume_url));
        let mut conn = tokio::select! {
            _ = cancel.cancelled() => return (Ended::Cancelled, false),
            c = self.connector.connect(&url) => match c {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%url, error = %e, "discord gateway: could not connect");
                    return (Ended::Resume, false);
                }
            }
        };
        // HELLO.
        let interval = tokio::select! {
            _ = cancel.cancelled() => return (Ended::Cancelled, false),
            hello = tokio::time::timeout(HELLO_TIMEOUT, conn.recv()) => match hello {
                Ok(Some(Frame::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
                    match (v["op"].as_u64(), v["d"]["heartbeat_interval"].as_u64()) {
                        (Some(op::HELLO), Some(ms)) if ms > 0 => Duration::from_millis(ms),
                        _ => {
                            tracing::warn!(payload = %t.chars().take(200).collect::<String>(), "discord gateway: expected HELLO");
                            conn.close(RESUME_CLOSE_CODE).await;
                            return (Ended::Resume, false);
                        }
                    }
                }
                Ok(Some(Frame::Close(code))) => return (self.on_close(code), false),
                Ok(None) => return (Ended::Resume, false),
                Err(_) => {
                    tracing::warn!("discord gateway: no HELLO in time");
                    conn.close(RESUME_CLOSE_CODE).await;
                    return (Ended::Resume, false);
                }
            }
        };
        let jitter = (self.jitter)().clamp(0.0, 1.0);
        let mut next_beat = Instant::now() + interval.mul_f64(jitter);
        let mut acked = true;
        let hello_payload = match &resuming {
            Some(s) => {
                tracing::info!(session_id = %s.session_id, seq = ?state.seq, "discord gateway: resuming");
                json!({"op": op::RESUME, "d": {
                    "token": self.token, "session_id": s.session_id, "seq": state.seq
                }})
            }
            None => {
                tracing::info!(intents = self.intents, "discord gateway: identifying");
                json!({"op": op::IDENTIFY, "d": {
                    "token": self.token,
                    "intents": self.intents,
                    "properties": {"os": std::env::consts::OS, "browser": "botmesh", "device": "botmesh"},
                }})
            }
        };
        if let Err(e) = conn.send(hello_payload.to_string()).await {
            tracing::warn!(error = %e, "discord gateway: could not send IDENTIFY/RESUME");
            return (Ended::Resume, false);
        }
        let mut established = false;
        loop {
            let frame = tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    conn.close(1000).await;
                    return (Ended::Cancelled, established);
                }
                _ = tokio::time::sleep_until(next_beat) => {
                    if !acked {
                        tracing::warn!(interval_ms = interval.as_millis() as u64, "discord gateway: no HEARTBEAT_ACK since the last beat (zombie connection); reconnecting to resume");
                        conn.close(RESUME_CLOSE_CODE).await;
                        return (Ended::Resume, established);
                    }
                    let beat = json!({"op": op::HEARTBEAT, "d": state.seq}).to_string();
                    if let Err(e) = conn.send(beat).await {
                        tracing::info!(error = %e, "discord gateway: heartbeat not sent; reconnecting");
                        return (Ended::Resume, established);
                    }
                    acked = false;
                    next_beat += interval;
                    continue;
                }
                f = conn.recv() => f,
            };
            let text = match frame {
                None => return (Ended::Resume, established),
                Some(Frame::Close(code)) => return (self.on_close(code), established),
                Some(Frame::Text(t)) => t,
            };
            let v: Value = match serde_json::from_str(&text) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "discord gateway: a payload that is not JSON; ignoring it");
                    continue;
                }
            };
            if let Some(s) = v["s"].as_u64() {
                state.seq = Some(state.seq.map_or(s, |old| old.max(s)));
            }
            match v["op"].as_u64() {
                Some(op::DISPATCH) => {
                    let t = v["t"].as_str().unwrap_or_default().to_string();
                    let d = v.get("d").cloned().unwrap_or(Value::Null);
                    if t == "READY" {
                        let session_id = d["session_id"].as_str().unwrap_or_default();
                        let resume_url = d["resume_gateway_url"].as_str().unwrap_or(&self.url);
                        state.session = Some(Session {
                            session_id: session_id.to_string(),
                            resume_url: resume_url.to_string(),
                        });
                        established = true;
                        self.connected
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        tracing::info!(%session_id, "discord gateway: READY");
                    } else if t == "RESUMED" {
                        established = true;
                        self.connected
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        tracing::info!(seq = ?state.seq, "discord gateway: RESUMED");
                    }
                    let _ = events.send(Dispatch {
                        t,
                        s: v["s"].as_u64(),
                        d,
                    });
                }
                Some(op::HEARTBEAT) => {
                    let beat = json!({"op": op::HEARTBEAT, "d": state.seq}).to_string();
                    if conn.send(beat).await.is_err() {
                        return (Ended::Resume, established);
                    }
                }
                Some(op::HEARTBEAT_ACK) => acked = true,
                Some(op::RECONNECT) => {
                    tracing::info!("discord gateway: RECONNECT requested; resuming");
                    conn.close(RESUME_CLOSE_CODE).await;
                    return (Ended::Resume, established);
                }
                Some(op::INVALID_SESSION) => {
                    let resumable = v["d"].as_bool().unwrap_or(false);
                    tracing::info!(resumable, "discord gateway: INVALID_SESSION");
                    conn.close(RESUME_CLOSE_CODE).await;
                    if resumable {
                        return (Ended::Resume, established);
                    }
                    // The docs ask for a random 1–5 s before identifying again.
                    let wait = Duration::from_secs_f64(1.0 + 4.0 * (self.jitter)());
                    tokio::select! {
                        _ = cancel.cancelled() => return (Ended::Cancelled, established),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    return (Ended::Reidentify, true);
                }
                Some(op::HELLO) => {}
                other => tracing::debug!(op = ?other, "discord gateway: unknown opcode"),
            }
        }
    }

    fn on_close(&self, code: Option<u16>) -> Ended {
        let Some(code) = code else {
            tracing::info!("discord gateway closed without a code; resuming");
            return Ended::Resume;
        };
        match close_action(code) {
            CloseAction::Resume => {
                tracing::info!(code, "discord gateway closed; resuming");
                Ended::Resume
            }
            CloseAction::Reidentify => {
                tracing::info!(
                    code,
                    "discord gateway closed; the session is gone, identifying anew"
                );
                Ended::Reidentify
            }
            CloseAction::Stop(e) => Ended::Stop(e),
        }
    }
}

/// An in-memory socket pair, for tests of the session logic under a paused clock.
pub mod memory {
    use super::*;

    /// What the client did on its side of one connection.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum ClientFrame {
        /// A text frame.
        Text(String),
        /// A close with its code.
        Close(u16),
    }

    /// The test's side of one connection the client opened.
    pub struct ServerSide {
        /// The URL the client connected to.
        pub url: String,
        /// Frames to the client.
        pub to_client: mpsc::UnboundedSender<Frame>,
        /// Frames from the client.
        pub from_client: mpsc::UnboundedReceiver<ClientFrame>,
    }

    impl ServerSide {
        /// Sends a JSON payload to the client.
        pub fn send(&self, v: Value) {
            let _ = self.to_client.send(Frame::Text(v.to_string()));
        }

        /// The next payload from the client, parsed (`Err(code)` for a close).
        pub async fn next(&mut self) -> Option<Result<Value, u16>> {
            match self.from_client.recv().await? {
                ClientFrame::Text(t) => {
                    Some(Ok(serde_json::from_str(&t).expect("client sends JSON")))
                }
                ClientFrame::Close(c) => Some(Err(c)),
            }
        }
    }

    /// Hands each connection's [`ServerSide`] to the test.
    pub struct MemoryConnector {
        /// Where new connections go.
        pub accepted: mpsc::UnboundedSender<ServerSide>,
    }

    /// The client's side of an in-memory connection.
    struct MemoryConn {
        /// Frames to the test.
        to_server: mpsc::UnboundedSender<ClientFrame>,
        /// Frames from the test.
        from_server: mpsc::UnboundedReceiver<Frame>,
    }

    impl Conn for MemoryConn {
        fn send(&mut self, text: String) -> BoxFuture<'_, Result<(), String>> {
            let r = self
                .to_server
                .send(ClientFrame::Text(text))
                .map_err(|_| "closed".to_string());
            Box::pin(async move { r })
        }
        fn recv(&mut self) -> BoxFuture<'_, Option<Frame>> {
            Box::pin(self.from_server.recv())
        }
        fn close(&mut self, code: u16) -> BoxFuture<'_, ()> {
            let _ = self.to_server.send(ClientFrame::Close(code));
            self.from_server.close();
            Box::pin(async {})
        }
    }

    impl Connector for MemoryConnector {
        fn connect<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<Box<dyn Conn>, String>> {
            let (to_client, from_server) = mpsc::unbounded_channel();
            let (to_server, from_client) = mpsc::unbounded_channel();
            let r = self
                .accepted
                .send(ServerSide {
                    url: url.to_string(),
                    to_client,
                    from_client,
                })
                .map(|_| {
                    Box::new(MemoryConn {
                        to_server,
                        from_server,
                    }) as Box<dyn Conn>
                })
                .map_err(|_| "refused".to_string());
            Box::pin(async move { r })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::memory::*;
    use super::*;

    fn gateway(jitter: f64) -> (Gateway, mpsc::UnboundedReceiver<ServerSide>) {
        let (accepted, rx) = mpsc::unbounded_channel();
        let g = Gateway {
            connector: Arc::new(MemoryConnector { accepted }),
            url: "wss://gateway.example".into(),
            token: "tok".into(),
            intents: INTENTS,
            connected: Default::default(),
            jitter: Arc::new(move || jitter),
        };
        (g, rx)
    }

    fn hello(ms: u64) -> Value {
        json!({"op": 10, "d": {"heartbeat_interval": ms}, "s": null, "t": null})
    }

    fn ready(seq: u64) -> Value {
        json!({"op": 0, "s": seq, "t": "READY", "d": {
            "v": 10, "session_id": "sess-1", "resume_gateway_url": "wss://resume.example",
            "user": {"id": "1", "username": "bot", "discriminator": "0", "global_name": null, "avatar": null, "bot": true},
            "guilds": [], "application": {"id": "1", "flags": 0}
        }})
    }

    #[test]
    fn intents_and_close_codes() {
        assert_eq!(INTENTS, 33281);
        for code in [4000, 4001, 4002, 4003, 4005, 4008, 1000, 1001, 1006] {
            assert_eq!(close_action(code), CloseAction::Resume, "{code}");
        }
        assert_eq!(close_action(4007), CloseAction::Reidentify);
        assert_eq!(close_action(4009), CloseAction::Reidentify);
        assert_eq!(
            close_action(4004),
            CloseAction::Stop(GatewayError::AuthenticationFailed)
        );
        assert_eq!(
            close_action(4014),
            CloseAction::Stop(GatewayError::DisallowedIntents)
        );
        for code in [4010, 4011, 4012, 4013] {
            assert!(matches!(close_action(code), CloseAction::Stop(_)), "{code}");
        }
        assert!(GatewayError::DisallowedIntents
            .to_string()
            .contains("MESSAGE CONTENT"));
        assert_eq!(
            connect_url("wss://gateway.discord.gg"),
            "wss://gateway.discord.gg/?v=10&encoding=json"
        );
        assert_eq!(
            connect_url("ws://127.0.0.1:5/?v=9"),
            "ws://127.0.0.1:5/?v=10&encoding=json"
        );
    }

    /// HELLO → the first beat after interval × jitter, then one per interval while
    /// acknowledged; a beat not acknowledged by the next one is a zombie connection:
    /// closed with a resumable code and RESUMEd at READY's resume URL with the last seq.
    #[tokio::test(start_paused = true)]
    async fn heartbeats_are_jittered_acked_and_a_zombie_is_resumed() {
        let (g, mut conns) = gateway(0.25);
        let (tx, mut events) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        let task = tokio::spawn(async move { g.run(tx, c).await });
        let mut s = conns.recv().await.unwrap();
        assert_eq!(s.url, "wss://gateway.example/?v=10&encoding=json");
        s.send(hello(40_000));
        let t0 = Instant::now();
        let identify = s.next().await.unwrap().unwrap();
        assert_eq!(identify["op"], 2);
        assert_eq!(identify["d"]["token"], "tok");
        assert_eq!(identify["d"]["intents"], 33281);
        s.send(ready(1));
        assert_eq!(events.recv().await.unwrap().t, "READY");
        let beat = s.next().await.unwrap().unwrap();
        assert_eq!(beat, json!({"op": 1, "d": 1}));
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(10),
            "first beat at 40 s × 0.25"
        );
        s.send(json!({"op": 11}));
        s.send(json!({"op": 0, "s": 2, "t": "MESSAGE_CREATE", "d": {"id": "m"}}));
        assert_eq!(events.recv().await.unwrap().s, Some(2));
        let beat = s.next().await.unwrap().unwrap();
        assert_eq!(beat, json!({"op": 1, "d": 2}));
        assert_eq!(t0.elapsed(), Duration::from_secs(50));
        // A beat on request is answered at once.
        s.send(json!({"op": 1, "d": null}));
        assert_eq!(s.next().await.unwrap().unwrap()["op"], 1);
        assert_eq!(t0.elapsed(), Duration::from_secs(50));
        // No ACK this time: at the next beat the connection is declared dead.
        let closed = s.next().await.unwrap();
        assert_eq!(
            closed,
            Err(RESUME_CLOSE_CODE),
            "not 1000: the session must survive"
        );
        assert_eq!(t0.elapsed(), Duration::from_secs(90));
        let mut s2 = conns.recv().await.unwrap();
        assert_eq!(s2.url, "wss://resume.example/?v=10&encoding=json");
        s2.send(hello(40_000));
        let resume = s2.next().await.unwrap().unwrap();
        assert_eq!(
            resume,
            json!({"op": 6, "d": {"token": "tok", "session_id": "sess-1", "seq": 2}})
        );
        s2.send(json!({"op": 0, "s": 3, "t": "RESUMED", "d": null}));
        assert_eq!(events.recv().await.unwrap().t, "RESUMED");
        cancel.cancel();
        assert_eq!(task.await.unwrap(), Ok(()));
        assert_eq!(
            s2.next().await.unwrap(),
            Err(1000),
            "a shutdown closes normally"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reconnect_invalid_session_and_fatal_close_codes() {
        let (g, mut conns) = gateway(0.0);
        let (tx, _events) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move { g.run(tx, CancellationToken::new()).await });
        let mut s = conns.recv().await.unwrap();
        s.send(hello(40_000));
        assert_eq!(s.next().await.unwrap().unwrap()["op"], 2);
        s.send(ready(5));
        // RECONNECT: close (resumable) and RESUME.
        s.send(json!({"op": 7, "d": null}));
        assert!(matches!(s.next().await, Some(Ok(_)) | Some(Err(_))));
        let mut s = conns.recv().await.unwrap();
        s.send(hello(40_000));
        let mut first = s.next().await.unwrap().unwrap();
        if first["op"] == 1 {
            first = s.next().await.unwrap().unwrap();
        }
        assert_eq!(first["op"], 6);
        assert_eq!(first["d"]["seq"], 5);
        // INVALID_SESSION false: a new session, identified after 1–5 s.
        s.send(json!({"op": 9, "d": false}));
        let mut s = conns.recv().await.unwrap();
        assert_eq!(s.url, "wss://gateway.example/?v=10&encoding=json");
        s.send(hello(40_000));
        let mut first = s.next().await.unwrap().unwrap();
        if first["op"] == 1 {
            first = s.next().await.unwrap().unwrap();
        }
        assert_eq!(first["op"], 2, "identify, not resume");
        // 4004: stop with the token error.
        let _ = s.to_client.send(Frame::Close(Some(4004)));
        assert_eq!(task.await.unwrap(), Err(GatewayError::AuthenticationFailed));
        assert!(conns.try_recv().is_err(), "no reconnect after 4004");
    }

    /// `wss://` goes through rustls (webpki roots): against a server that is not TLS
    /// the handshake fails with an error, and building the TLS client does not panic.
    #[tokio::test]
    async fn wss_urls_use_tls() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let (mut s, _) = l.accept().await.unwrap();
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        });
        let r = WsConnector
            .connect(&format!(
                "wss://127.0.0.1:{}/?v=10&encoding=json",
                addr.port()
            ))
            .await;
        assert!(r.is_err());
        server.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_drop_resumes_and_4014_stops_with_the_intent_advice() {
        let (g, mut conns) = gateway(0.5);
        let (tx, _events) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move { g.run(tx, CancellationToken::new()).await });
        let mut s = conns.recv().await.unwrap();
        s.send(hello(40_000));
        s.next().await.unwrap().unwrap();
        s.send(ready(9));
        drop(s); // the connection vanishes
        let mut s = conns.recv().await.unwrap();
        s.send(hello(40_000));
        let resume = s.next().await.unwrap().unwrap();
        assert_eq!(resume["op"], 6);
        assert_eq!(resume["d"]["seq"], 9);
        let _ = s.to_client.send(Frame::Close(Some(4014)));
        let e = task.await.unwrap().unwrap_err();
        assert_eq!(e, GatewayError::DisallowedIntents);
        assert!(e.to_string().contains("Privileged Gateway Intents"));
    }
}
