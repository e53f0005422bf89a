//! The Stream mode client: how a robot receives its messages without a public URL.
//!
//! 1. `POST {api}/v1.0/gateway/connections/open` with the app's `clientId`,
//!    `clientSecret` and `subscriptions` (`CALLBACK` on the robot topic) →
//!    `{"endpoint": "wss://…", "ticket": "…"}`;
//! 2. a WebSocket to `endpoint?ticket=…`;
//! 3. JSON text frames ([`super::frames`]): a `SYSTEM` `ping` is answered with its own
//!    data, a `SYSTEM` `disconnect` is acknowledged and followed by a new connection,
//!    a `CALLBACK` robot message is handed to the [`StreamHandler`] and acknowledged
//!    only once the handler has recorded it (a message it could not record stays
//!    unacknowledged, so DingTalk delivers it again); every other frame is
//!    acknowledged and ignored;
//! 4. the client pings the gateway every [`KEEPALIVE`]; a socket that drops, a failed
//!    open or a gateway silent for [`IDLE_TIMEOUT`] (not even a pong) leads
//!    to a new connection after a backoff that doubles up to [`BACKOFF_MAX`] (with
//!    jitter) and starts over once a connection delivered something.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_util::sync::CancellationToken;

use crate::config::pacing::{Backoff, Jitter};
use crate::platform::kit::reconnect::{self as kit, Next, Reconnect, Reconnects};

use super::frames::{Frame, FrameKind, RobotMessage, TOPIC_ROBOT};

/// The endpoint that opens a Stream connection.
pub(crate) const OPEN_PATH: &str = "/v1.0/gateway/connections/open";
/// First reconnection delay.
pub(crate) const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// Longest reconnection delay.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A connection that delivers nothing (no frame, no pong to our pings) for this long
/// is taken for dead.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// The longest wait for the WebSocket handshake.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause before reconnecting after the gateway's `disconnect`.
pub(crate) const DISCONNECT_PAUSE: Duration = Duration::from_millis(100);
/// How often the client pings the gateway (WebSocket ping), so a quiet group's
/// connection still proves itself alive within [`IDLE_TIMEOUT`].
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(30);

/// What the stream hands a robot message to.
pub(crate) trait StreamHandler: Send + Sync + 'static {
    /// Records a robot message. `true` once it is recorded (or never will be: a
    /// direct message, a duplicate), which acknowledges it; `false` leaves it
    /// unacknowledged for DingTalk to deliver again.
    fn robot_message(&self, msg: RobotMessage) -> BoxFuture<'_, bool>;

    /// Counts a stream event (`ping`, `disconnect`, `other`, `unreadable`,
    /// `connected`, `connect_failed`, `closed`).
    fn event(&self, result: &'static str) {
        let _ = result;
    }
}

/// Why a connection ended badly.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    /// `connections/open` failed.
    #[error("opening the stream connection: {0}")]
    Open(String),
    /// The WebSocket could not be opened or broke.
    #[error("websocket: {0}")]
    Socket(String),
    /// No frame within [`IDLE_TIMEOUT`].
    #[error("no frame for {0:?}")]
    Idle(Duration),
}

/// How a connection that worked ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The gateway said `disconnect`: reconnect at once.
    Disconnect,
    /// The socket closed; `delivered` tells whether it carried any frame.
    Closed {
        /// At least one frame came over it.
        delivered: bool,
    },
    /// The node is stopping.
    Stopped,
}

/// `connections/open`'s answer.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Connection {
    /// The WebSocket URL.
    pub(crate) endpoint: String,
    /// The one-time ticket for it.
    pub(crate) ticket: String,
}

/// One app's Stream connection.
pub(crate) struct StreamClient {
    http: reqwest::Client,
    base_url: String,
    client_id: String,
    client_secret: String,
    /// Counts connections opened (for logs and tests).
    pub(crate) connections: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for StreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamClient")
            .field("base_url", &self.base_url)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// The delay before reconnection attempt `failures` (1-based), with up to 20 % jitter
/// (capped at [`BACKOFF_MAX`]).
pub(crate) fn backoff(failures: u32) -> Duration {
    RECONNECT.delay(failures, Jitter::Scale(1.0..=1.2))
}

/// The reconnection schedule.
const RECONNECT: Backoff = Backoff::new(BACKOFF_BASE, BACKOFF_MAX);

impl StreamClient {
    /// A client of the gateway at `base_url` for the app `client_id`.
    pub(crate) fn new(
        base_url: &str,
        client_id: &str,
        client_secret: &str,
    ) -> anyhow::Result<StreamClient> {
        let base_url = base_url.trim_end_matches('/').to_string();
        Ok(StreamClient {
            http: super::api::http_client(&base_url)?,
            base_url,
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            connections: Default::default(),
        })
    }

    /// Asks the gateway for an endpoint and a ticket.
    pub(crate) async fn open(&self) -> Result<Connection, StreamError> {
        let body = serde_json::json!({
            "clientId": self.client_id,
            "clientSecret": self.client_secret,
            "subscriptions": [{"type": "CALLBACK", "topic": TOPIC_ROBOT}],
            "ua": concat!("botmesh/", env!("CARGO_PKG_VERSION")),
        });
        let resp = self
            .http
            .post(format!("{}{OPEN_PATH}", self.base_url))
            .json(&body)
            .send()
            .await
            .map_err(|e| StreamError::Open(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            let text: String = text.chars().take(300).collect();
            return Err(StreamError::Open(format!("HTTP {status}: {text}")));
        }
        resp.json::<Connection>()
            .await
            .map_err(|e| StreamError::Open(format!("answer: {e}")))
    }

    /// Keeps a connection open until `stop`, reconnecting with backoff in the kit's one
    /// reconnect loop ([`crate::platform::kit::reconnect`]).
    pub(crate) async fn run(&self, handler: Arc<dyn StreamHandler>, stop: CancellationToken) {
        // Attempt 0 (the first, or after a connection that delivered) waits the
        // backoff's first step: the gateway is not asked again at once.
        let schedule = |attempt: u32| backoff(attempt + 1);
        let mut reconnects = Reconnects::new(Reconnect {
            platform: "dingtalk",
            what: "stream",
            schedule: &schedule,
            asked_pause: DISCONNECT_PAUSE,
        });
        loop {
            let ended = tokio::select! {
                _ = stop.cancelled() => Ok(Ended::Stopped),
                r = self.session(&*handler, &stop) => r,
            };
            let ended = match ended {
                Ok(Ended::Stopped) => kit::Ended::Stopped,
                Ok(Ended::Disconnect) => {
                    handler.event("disconnect");
                    kit::Ended::Asked
                }
                Ok(Ended::Closed { delivered }) => {
                    handler.event("closed");
                    kit::Ended::Dropped {
                        why: "connection closed".into(),
                        established: delivered,
                    }
                }
                Err(e) => {
                    handler.event("connect_failed");
                    kit::Ended::Dropped {
                        why: e.to_string(),
                        established: false,
                    }
                }
            };
            // Nothing DingTalk says is final: a stopped node is the only way out.
            let next: Next<StreamError> = reconnects.after(ended, &stop, |_| {}).await;
            if let Next::Stop(_) = next {
                break;
            }
        }
        tracing::info!("dingtalk stream stopped");
    }

    /// One connection, from `connections/open` to its end.
    async fn session(
        &self,
        handler: &dyn StreamHandler,
        stop: &CancellationToken,
    ) -> Result<Ended, StreamError> {
        let conn = self.open().await?;
        let ticket: String = form_urlencoded::byte_serialize(conn.ticket.as_bytes()).collect();
        let sep = if conn.endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        let url = format!("{}{sep}ticket={ticket}", conn.endpoint);
        let (ws, _) = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio_tungstenite::connect_async(url.as_str()),
        )
        .await
        .map_err(|_| StreamError::Socket(format!("no handshake within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| StreamError::Socket(e.to_string()))?;
        self.connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(endpoint = %conn.endpoint, "dingtalk stream connected");
        handler.event("connected");
        let (mut tx, mut rx) = ws.split();
        let mut delivered = false;
        let mut last_heard = tokio::time::Instant::now();
        let mut keepalive =
            tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => {
                    let _ = tx.close().await;
                    return Ok(Ended::Stopped);
                }
                _ = tokio::time::sleep_until(last_heard + IDLE_TIMEOUT) => {
                    return Err(StreamError::Idle(IDLE_TIMEOUT));
                }
                _ = keepalive.tick() => {
                    // Our own ping: its pong (or anything else) proves the link alive.
                    tx.send(WsMessage::Ping(Default::default()))
                        .await
                        .map_err(|e| StreamError::Socket(e.to_string()))?;
                    continue;
                }
                n = rx.next() => n,
            };
            let msg = match next {
                None => return Ok(Ended::Closed { delivered }),
                Some(Err(e)) if delivered => {
                    tracing::warn!(error = %e, "dingtalk stream: socket error");
                    return Ok(Ended::Closed { delivered });
                }
                Some(Err(e)) => return Err(StreamError::Socket(e.to_string())),
                Some(Ok(m)) => m,
            };
            last_heard = tokio::time::Instant::now();
            let text = match msg {
                WsMessage::Text(t) => t,
                WsMessage::Close(_) => return Ok(Ended::Closed { delivered }),
                // Pings are answered by the socket itself, pongs only prove the link.
                _ => continue,
            };
            delivered = true;
            let frame = match Frame::parse(text.as_str()) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(error = %e, "dingtalk stream: unreadable frame ignored");
                    handler.event("unreadable");
                    continue;
                }
            };
            let ack = match frame.classify() {
                FrameKind::Ping => {
                    handler.event("ping");
                    Some(frame.ack(200, "OK", &frame.data))
                }
                FrameKind::Disconnect => {
                    let ack = frame.ack(200, "OK", &frame.data);
                    let _ = tx.send(WsMessage::Text(ack.into())).await;
                    let _ = tx.close().await;
                    return Ok(Ended::Disconnect);
                }
                FrameKind::RobotMessage => match RobotMessage::parse(&frame.data) {
                    Ok(m) => {
                        let msg_id = m.msg_id.clone();
                        if handler.robot_message(m).await {
                            Some(frame.ack(200, "OK", r#"{"response":"OK"}"#))
                        } else {
                            tracing::warn!(%msg_id, "dingtalk message not recorded: left unacknowledged for redelivery");
                            None
                        }
                    }
                    Err(e) => {
                        // It will never read better: acknowledged, so it is not redelivered forever.
                        tracing::warn!(error = %e, frame = frame.message_id(), "dingtalk stream: unreadable robot message acknowledged and dropped");
                        handler.event("unreadable");
                        Some(frame.ack(200, "OK", r#"{"response":"unreadable"}"#))
                    }
                },
                FrameKind::Other(kind) => {
                    tracing::debug!(%kind, "dingtalk stream: frame acknowledged and ignored");
                    handler.event("other");
                    Some(frame.ack(200, "OK", &frame.data))
                }
            };
            if let Some(ack) = ack {
                tx.send(WsMessage::Text(ack.into()))
                    .await
                    .map_err(|e| StreamError::Socket(e.to_string()))?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// DingTalk's endpoints are `wss://`: the client must build a TLS connection (a
    /// missing TLS provider would panic here, not fail).
    #[tokio::test]
    async fn a_wss_endpoint_is_dialled_over_tls() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            // Not TLS: the client's handshake must fail on it.
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        });
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_tungstenite::connect_async(format!("wss://127.0.0.1:{port}/connect?ticket=t")),
        )
        .await
        .expect("an answer within 10 s");
        let Err(e) = r else {
            panic!("a plain-text server is no TLS peer");
        };
        // rustls read the plain-text answer and refused it as a TLS record.
        assert!(format!("{e:?}").contains("InvalidContentType"), "{e:?}");
        server.await.unwrap();
    }

    #[test]
    fn reconnect_delays_grow_and_stay_capped() {
        assert!(backoff(1) >= BACKOFF_BASE && backoff(1) <= BACKOFF_BASE.mul_f64(1.2));
        assert!(backoff(3) >= BACKOFF_BASE * 4);
        assert!(backoff(40) <= BACKOFF_MAX);
    }
}
