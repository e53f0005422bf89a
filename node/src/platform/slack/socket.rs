//! Slack's Socket Mode: one WebSocket per session, opened at a URL that
//! `apps.connections.open` (app-level token) issues for one connection.
//!
//! One session ([`session`]): ask for a URL, connect, wait for `hello`, then read
//! envelopes until the connection ends, and say how it ended (the kit's `Ended`):
//!
//! - every envelope (`events_api`, `slash_commands`, `interactive`) is acknowledged
//!   at once with `{"envelope_id": …}` — before anything is done with it, since Slack
//!   wants the ack within 3 s and redelivers (`retry_attempt` > 0) otherwise — and
//!   then handed to the adapter through a channel, in order;
//! - `disconnect` with reason `refresh_requested` or `warning` (Slack is about to
//!   close this connection) ends the session as `Ended::Asked`: a new URL, a new
//!   connection; `link_disabled` (Socket Mode was turned off for the app) is
//!   `Ended::Fatal`, with what to fix;
//! - a close frame, a read error or silence (no frame, not even a pong to this
//!   client's pings, for [`SILENCE`]) is `Ended::Dropped`;
//! - a refused app token at `apps.connections.open` is `Ended::Fatal`.
//!
//! [`run`] keeps sessions going on the kit's one reconnect loop
//! ([`crate::platform::kit::reconnect`]): the one backoff (`config::pacing::Backoff`)
//! after drops, a short pause after a requested reconnect, until the node stops or a
//! session ends fatally.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::config::pacing::{Backoff, Jitter};
use crate::platform::kit::reconnect::{Ended, Next, Reconnect, Reconnects};

use super::api::WebApi;

/// How long to wait for the connection and for `hello`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// How often this client pings Slack (Slack pings too; either keeps the link warm).
pub const PING_EVERY: Duration = Duration::from_secs(10);
/// A connection that sent nothing at all (no event, no ping, no pong) for this long
/// is taken for dead and replaced.
pub const SILENCE: Duration = Duration::from_secs(45);
/// The pause before reconnecting when Slack asked for it (`disconnect`).
pub const ASKED_PAUSE: Duration = Duration::from_millis(200);
/// The backoff after a dropped or failed connection.
pub(crate) const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

/// One envelope from Slack, acknowledged already.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// `events_api`, `slash_commands`, `interactive`.
    pub kind: String,
    /// The envelope's payload (for `events_api`: the event callback, with `event_id`
    /// and `event`).
    pub payload: Value,
    /// 0 for a first delivery; more for Slack's redeliveries of an event it thinks
    /// was not acknowledged.
    pub retry_attempt: u64,
    /// Why Slack redelivered (`timeout`, …), empty for a first delivery.
    pub retry_reason: String,
}

/// What a session shares with the adapter.
#[derive(Debug, Default)]
pub struct SocketState {
    /// Whether a connection is up (`hello` received), for `/healthz`.
    pub connected: AtomicBool,
    /// Envelopes acknowledged so far.
    pub acked: AtomicU64,
    /// Sessions opened so far (apps.connections.open answered).
    pub sessions: AtomicU64,
}

/// The ack Slack expects for an envelope.
pub fn ack(envelope_id: &str) -> String {
    serde_json::json!({ "envelope_id": envelope_id }).to_string()
}

/// What one text frame asks of the session.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `hello`: the connection is ready.
    Hello {
        /// Slack's count of this app's open connections.
        num_connections: u64,
    },
    /// `disconnect`, with its reason.
    Disconnect(String),
    /// An envelope to acknowledge (`envelope_id`) and hand on.
    Envelope(String, Delivery),
    /// Anything else (logged).
    Other(String),
}

/// Reads one text frame.
pub fn parse(text: &str) -> Frame {
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => return Frame::Other("not JSON".into()),
    };
    let kind = v["type"].as_str().unwrap_or_default().to_string();
    match kind.as_str() {
        "hello" => Frame::Hello {
            num_connections: v["num_connections"].as_u64().unwrap_or(0),
        },
        "disconnect" => Frame::Disconnect(v["reason"].as_str().unwrap_or("").to_string()),
        _ => match v["envelope_id"].as_str() {
            Some(id) => Frame::Envelope(
                id.to_string(),
                Delivery {
                    kind,
                    payload: v["payload"].clone(),
                    retry_attempt: v["retry_attempt"].as_u64().unwrap_or(0),
                    retry_reason: v["retry_reason"].as_str().unwrap_or("").to_string(),
                },
            ),
            None => Frame::Other(kind),
        },
    }
}

/// What a `disconnect` reason means.
pub(crate) fn on_disconnect(reason: &str) -> Ended<String> {
    match reason {
        "link_disabled" => Ended::Fatal(
            "slack closed the Socket Mode connection with link_disabled: Socket Mode is turned off for this app; turn it on (app settings → Socket Mode) and restart the node".into(),
        ),
        _ => Ended::Asked,
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One session: a URL from `apps.connections.open`, the connection, `hello`, then
/// envelopes acknowledged and sent to `deliveries` until it ends, saying how.
pub(crate) async fn session(
    api: &WebApi,
    deliveries: &mpsc::UnboundedSender<Delivery>,
    state: &SocketState,
    stop: &CancellationToken,
) -> Ended<String> {
    let url = tokio::select! {
        _ = stop.cancelled() => return Ended::Stopped,
        url = api.connections_open() => match url {
            Ok(u) => u,
            Err(e) if e.is_auth() => {
                return Ended::Fatal(format!(
                    "slack refused the app-level token ({e}): set slack.app_token_env to the app's xapp- token with the connections:write scope (app settings → Basic Information → App-Level Tokens)"
                ));
            }
            Err(e) => {
                return Ended::Dropped {
                    why: format!("apps.connections.open failed: {e}"),
                    established: false,
                }
            }
        }
    };
    state.sessions.fetch_add(1, Ordering::Relaxed);
    let mut ws: Ws = tokio::select! {
        _ = stop.cancelled() => return Ended::Stopped,
        c = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(url.as_str())) => match c {
            Ok(Ok((ws, _))) => ws,
            Ok(Err(e)) => return Ended::Dropped { why: format!("could not connect: {e}"), established: false },
            Err(_) => return Ended::Dropped { why: "connecting timed out".into(), established: false },
        }
    };
    let ended = serve(&mut ws, deliveries, state, stop).await;
    state.connected.store(false, Ordering::Relaxed);
    if !matches!(ended, Ended::Dropped { .. }) {
        // Close the way Slack expects; a dropped link has nothing to close.
        let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
    }
    ended
}

/// Reads the connection until it ends (see the module docs).
async fn serve(
    ws: &mut Ws,
    deliveries: &mpsc::UnboundedSender<Delivery>,
    state: &SocketState,
    stop: &CancellationToken,
) -> Ended<String> {
    let mut established = false;
    let started = Instant::now();
    let mut last_heard = Instant::now();
    let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
    let dropped = |why: String, established: bool| Ended::Dropped { why, established };
    loop {
        let deadline = if established {
            last_heard + SILENCE
        } else {
            started + CONNECT_TIMEOUT
        };
        let frame = tokio::select! {
            _ = stop.cancelled() => return Ended::Stopped,
            _ = tokio::time::sleep_until(deadline) => {
                let why = if established { format!("nothing heard for {} s", SILENCE.as_secs()) } else { "no hello in time".to_string() };
                return dropped(why, established);
            }
            _ = ping.tick() => {
                if let Err(e) = ws.send(Message::Ping(Vec::new().into())).await {
                    return dropped(format!("ping failed: {e}"), established);
                }
                continue;
            }
            f = ws.next() => f,
        };
        last_heard = Instant::now();
        let text = match frame {
            Some(Ok(Message::Text(t))) => t.as_str().to_string(),
            Some(Ok(Message::Close(c))) => {
                let why = c.map_or("no code".to_string(), |c| {
                    format!("{} {}", u16::from(c.code), c.reason)
                });
                return dropped(format!("slack closed the connection ({why})"), established);
            }
            Some(Ok(_)) => continue, // pings are answered by the library; pongs just count as heard
            Some(Err(e)) => return dropped(format!("connection lost: {e}"), established),
            None => return dropped("connection closed".into(), established),
        };
        match parse(&text) {
            Frame::Hello { num_connections } => {
                established = true;
                state.connected.store(true, Ordering::Relaxed);
                tracing::info!(num_connections, "slack socket: hello");
            }
            Frame::Disconnect(reason) => {
                tracing::info!(%reason, "slack socket: disconnect");
                return on_disconnect(&reason);
            }
            Frame::Envelope(id, delivery) => {
                // Ack first: whatever the event needs happens after Slack has its answer.
                if let Err(e) = ws.send(Message::text(ack(&id))).await {
                    return dropped(format!("ack failed: {e}"), established);
                }
                state.acked.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(envelope_id = %id, kind = %delivery.kind, retry_attempt = delivery.retry_attempt, "slack socket: envelope acknowledged");
                if deliveries.send(delivery).is_err() {
                    return Ended::Stopped;
                }
            }
            Frame::Other(kind) => {
                tracing::debug!(%kind, "slack socket: a frame the mesh does not use");
            }
        }
    }
}

/// Runs sessions on the kit's reconnect loop until `stop` or a fatal end, which it
/// returns: after a drop it waits by [`BACKOFF`] (half to all of the nominal wait),
/// after Slack's `disconnect` [`ASKED_PAUSE`].
pub(crate) async fn run(
    api: &WebApi,
    deliveries: mpsc::UnboundedSender<Delivery>,
    state: Arc<SocketState>,
    stop: CancellationToken,
) -> Option<String> {
    let schedule = |attempt: u32| BACKOFF.delay(attempt + 1, Jitter::Scale(0.5..=1.0));
    let mut reconnects = Reconnects::new(Reconnect {
        platform: "slack",
        what: "socket",
        schedule: &schedule,
        asked_pause: ASKED_PAUSE,
    });
    loop {
        let ended = session(api, &deliveries, &state, &stop).await;
        match reconnects.after(ended, &stop, |_| {}).await {
            Next::Again => {}
            Next::Stop(fatal) => return fatal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_read_as_socket_mode_sends_them() {
        assert_eq!(
            parse(
                r#"{"type":"hello","num_connections":2,"debug_info":{"host":"applink-1"},"connection_info":{"app_id":"A1"}}"#
            ),
            Frame::Hello { num_connections: 2 }
        );
        assert_eq!(
            parse(
                r#"{"type":"disconnect","reason":"refresh_requested","debug_info":{"host":"applink-1"}}"#
            ),
            Frame::Disconnect("refresh_requested".into())
        );
        let Frame::Envelope(id, d) = parse(
            r#"{"envelope_id":"e-1","type":"events_api","accepts_response_payload":false,"retry_attempt":1,"retry_reason":"timeout","payload":{"event_id":"Ev1","event":{"type":"message"}}}"#,
        ) else {
            panic!("an envelope");
        };
        assert_eq!(id, "e-1");
        assert_eq!(
            (d.kind.as_str(), d.retry_attempt, d.retry_reason.as_str()),
            ("events_api", 1, "timeout")
        );
        assert_eq!(d.payload["event_id"], "Ev1");
        assert_eq!(ack("e-1"), r#"{"envelope_id":"e-1"}"#);
        assert_eq!(parse("nope"), Frame::Other("not JSON".into()));
    }

    #[test]
    fn disconnect_reasons() {
        assert!(matches!(on_disconnect("refresh_requested"), Ended::Asked));
        assert!(matches!(on_disconnect("warning"), Ended::Asked));
        match on_disconnect("link_disabled") {
            Ended::Fatal(why) => assert!(why.contains("Socket Mode"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
