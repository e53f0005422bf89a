//! Feishu/Lark long connection: events over an outbound WebSocket, no public address.
//!
//! The protocol, as Feishu's official SDKs speak it (written here from their
//! behaviour, not copied):
//!
//! 1. `POST {base_url}/callback/ws/endpoint` with `{"AppID", "AppSecret"}` answers
//!    `{code, msg, data: {URL, ClientConfig}}`. `URL` is a `wss://` address whose
//!    query holds `device_id` (the connection's id) and `service_id` (echoed in every
//!    ping); `ClientConfig` holds `ReconnectCount`, `ReconnectInterval`,
//!    `ReconnectNonce` and `PingInterval`, in seconds.
//! 2. A WebSocket to `URL`. A refused handshake carries `handshake-status`,
//!    `handshake-msg` and, for status 514, `handshake-autherrcode` headers
//!    ([`HandshakeRefusal`]).
//! 3. Every binary message is a protobuf `pbbp2.Frame` ([`Frame`]): method 0 is
//!    control (`type` header `ping`/`pong`), method 1 is data (`type` `event` or
//!    `card`, with `message_id`, `sum`, `seq` and `trace_id` headers).
//! 4. The client sends a ping frame every `PingInterval`; a pong may carry a new
//!    `ClientConfig` as its JSON payload.
//! 5. A data frame whose `sum` is above 1 is one fragment (`seq` of `sum`) of a
//!    payload, reassembled by `message_id` ([`Reassembly`]).
//! 6. Every (complete) data frame is answered with the same frame, an added
//!    `biz_rt` header (handling time in ms) and the payload `{"code":200}` — or
//!    `{"code":500}` when the node could not take the event, and then Feishu
//!    delivers it again later. An event is acknowledged with 200 only once it is in
//!    the transcript (or deliberately ignored), so a dropped connection never loses
//!    an acknowledged event.
//! 7. When the connection drops, the client waits a random part of
//!    `ReconnectNonce`, then tries again every `ReconnectInterval`, forever (the
//!    SDKs' `ReconnectCount` is logged, not obeyed: a bot must come back). This is
//!    Feishu's schedule (jitter, then a constant interval it sets), not an exponential
//!    one, so it is [`ClientConfig::reconnect_delay`] rather than
//!    [`crate::config::pacing::Backoff`], the schedule of the kit's one reconnect
//!    loop ([`crate::platform::kit::reconnect`]).

use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite;
use tokio_util::sync::CancellationToken;

use crate::platform::kit::reconnect::{Ended, Next, Reconnect, Reconnects};
use crate::telemetry::metrics::Metrics;

mod endpoint;
mod frame;
mod reassembly;

pub use endpoint::{
    endpoint_meaning, fetch_endpoint, parse_endpoint, refusal_of, ClientConfig, ClientConfigUpdate,
    Endpoint, HandshakeRefusal, WsError,
};
pub use frame::{Frame, Header};
pub use reassembly::Reassembly;

/// Where the connection's address is asked for, under the open platform base URL.
pub const ENDPOINT_PATH: &str = "/callback/ws/endpoint";
/// `Frame::method` of control frames (ping, pong).
pub const METHOD_CONTROL: i32 = 0;
/// `Frame::method` of data frames (events, card callbacks).
pub const METHOD_DATA: i32 = 1;
/// Header naming what a frame carries: `ping`, `pong`, `event`, `card`.
pub const HEADER_TYPE: &str = "type";
/// Header naming a data message (the fragments of one payload share it).
pub const HEADER_MESSAGE_ID: &str = "message_id";
/// Header giving how many fragments the payload has.
pub const HEADER_SUM: &str = "sum";
/// Header giving this fragment's index (from 0).
pub const HEADER_SEQ: &str = "seq";
/// Header giving Feishu's trace id, for logs.
pub const HEADER_TRACE_ID: &str = "trace_id";
/// Header the client adds to an acknowledgement: handling time in milliseconds.
pub const HEADER_BIZ_RT: &str = "biz_rt";
/// Handshake refusal header: Feishu's status code.
pub const HEADER_HANDSHAKE_STATUS: &str = "handshake-status";
/// Handshake refusal header: Feishu's message.
pub const HEADER_HANDSHAKE_MSG: &str = "handshake-msg";
/// Handshake refusal header: the authentication error code (with status 514).
pub const HEADER_HANDSHAKE_AUTH_ERRCODE: &str = "handshake-autherrcode";
/// Handshake status: the connection was refused for the app.
pub const STATUS_FORBIDDEN: i64 = 403;
/// Handshake status: authentication failed (see the auth error code).
pub const STATUS_AUTH_FAILED: i64 = 514;
/// Auth error code: the app already holds as many connections as Feishu allows.
pub const EXCEED_CONN_LIMIT: i64 = 1000040350;
/// Endpoint code: Feishu is busy (try again).
pub const SYSTEM_BUSY: i64 = 1;
/// Endpoint code: Feishu's internal error (try again).
pub const INTERNAL_ERROR: i64 = 1000040343;
/// Endpoint code: no credentials were sent.
pub const NO_CREDENTIAL: i64 = 1000040344;
/// How long the fragments of an incomplete payload are kept (the SDKs keep 5 s).
pub const FRAGMENT_TTL: Duration = Duration::from_secs(5);
/// At most this many payloads are being reassembled at once (more are dropped:
/// unacknowledged, so Feishu sends them again).
pub const MAX_PARTIAL_PAYLOADS: usize = 64;
/// At most this many fragments per payload.
pub const MAX_FRAGMENTS: usize = 256;
/// A connection that has not received anything for this many ping intervals (plus
/// [`SILENCE_SLACK`]) is treated as dead.
pub const SILENT_PINGS: u32 = 3;
/// Added to the silence limit so a short ping interval does not drop a slow link.
pub const SILENCE_SLACK: Duration = Duration::from_secs(10);
/// The longest a WebSocket handshake (TCP, TLS, upgrade) may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------

/// Where the connection is, for `/healthz` and `botmesh_feishu_connection{state}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnState {
    /// Asking for an endpoint or opening the socket.
    Connecting,
    /// The socket is open.
    Connected,
    /// Waiting before the next attempt.
    Reconnecting,
    /// The node is stopping.
    Stopped,
}

impl ConnState {
    /// Every state, for the gauge.
    pub const ALL: [ConnState; 4] = [
        ConnState::Connecting,
        ConnState::Connected,
        ConnState::Reconnecting,
        ConnState::Stopped,
    ];

    /// The label.
    pub fn label(self) -> &'static str {
        match self {
            ConnState::Connecting => "connecting",
            ConnState::Connected => "connected",
            ConnState::Reconnecting => "reconnecting",
            ConnState::Stopped => "stopped",
        }
    }
}

/// What health shows of the long connection.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WsHealth {
    /// Where the connection is.
    pub state: ConnState,
    /// The connection's `device_id`, while connected.
    pub device_id: Option<String>,
    /// Successful connections since start.
    pub connects: u64,
    /// The last failure, with its meaning.
    pub last_error: Option<String>,
    /// Events acknowledged with 200 since start.
    pub acked: u64,
    /// Events answered 500 (Feishu delivers them again).
    pub refused: u64,
}

/// The live status, shared by the connection task and health.
pub struct WsStatus {
    inner: Mutex<WsHealth>,
    metrics: Arc<Metrics>,
}

impl WsStatus {
    /// A status that starts out connecting.
    pub fn new(metrics: Arc<Metrics>) -> WsStatus {
        let s = WsStatus {
            inner: Mutex::new(WsHealth {
                state: ConnState::Connecting,
                device_id: None,
                connects: 0,
                last_error: None,
                acked: 0,
                refused: 0,
            }),
            metrics,
        };
        s.set_gauge(ConnState::Connecting);
        s
    }

    fn set_gauge(&self, state: ConnState) {
        for s in ConnState::ALL {
            super::metrics::set_connection(&self.metrics, s.label(), i64::from(s == state));
        }
    }

    fn update(&self, f: impl FnOnce(&mut WsHealth)) {
        let state = {
            let mut h = self.inner.lock();
            f(&mut h);
            h.state
        };
        self.set_gauge(state);
    }

    /// A snapshot for health.
    pub fn health(&self) -> WsHealth {
        self.inner.lock().clone()
    }

    fn set_state(&self, state: ConnState) {
        self.update(|h| {
            h.state = state;
            if state != ConnState::Connected {
                h.device_id = None;
            }
        });
    }

    fn connected(&self, device_id: &str) {
        super::metrics::connect(&self.metrics, "connected");
        self.update(|h| {
            h.state = ConnState::Connected;
            h.device_id = Some(device_id.to_string());
            h.connects += 1;
        });
    }

    fn failed(&self, e: &WsError) {
        super::metrics::connect(&self.metrics, e.label());
        let text = e.to_string();
        self.update(|h| h.last_error = Some(text));
    }

    fn answered(&self, code: u16) {
        self.update(|h| {
            if code == 200 {
                h.acked += 1
            } else {
                h.refused += 1
            }
        });
    }
}

// ---------------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------------

/// Takes events off the connection: answers 200 once an event is recorded (or
/// deliberately ignored), 500 when it could not be taken.
pub trait EventHandler: Send + Sync + 'static {
    /// Handles one whole event payload (schema 2.0 JSON).
    fn handle(&self, payload: Vec<u8>) -> BoxFuture<'_, u16>;
}

/// What the connection needs to know.
#[derive(Clone)]
pub struct WsSettings {
    /// The open platform base URL.
    pub base_url: String,
    /// The App ID.
    pub app_id: String,
    /// The App Secret.
    pub app_secret: String,
}

impl std::fmt::Debug for WsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsSettings")
            .field("base_url", &self.base_url)
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

/// Runs the long connection until `stop` is cancelled: connect, serve, and after
/// any failure wait (nonce jitter, then the interval) and connect again, in the kit's
/// one reconnect loop ([`crate::platform::kit::reconnect`]).
pub async fn run(
    settings: WsSettings,
    handler: Arc<dyn EventHandler>,
    status: Arc<WsStatus>,
    stop: CancellationToken,
) {
    let timeouts = crate::platform::kit::http::Timeouts {
        connect: Duration::from_secs(5),
        whole: Duration::from_secs(15),
    };
    let http = match crate::platform::kit::http::client(&settings.base_url, timeouts, None) {
        Ok(h) => h,
        Err(e) => {
            tracing::error!(error = %e, "feishu long connection: cannot build an HTTP client");
            return;
        }
    };
    // Feishu's timing, updated by each endpoint answer and pong, read by the schedule.
    let config = Mutex::new(ClientConfig::default());
    let schedule = |attempt| {
        config
            .lock()
            .reconnect_delay(attempt, rand::random::<f64>())
    };
    let mut reconnects = Reconnects::new(Reconnect {
        platform: "feishu",
        what: "long connection",
        schedule: &schedule,
        asked_pause: Duration::ZERO,
    });
    loop {
        status.set_state(ConnState::Connecting);
        let mut timing = *config.lock();
        let result =
            connect_and_serve(&settings, &http, &handler, &status, &mut timing, &stop).await;
        *config.lock() = timing;
        // Feishu refusing is never final: its answer may change once the app is fixed.
        let ended: Ended<WsError> = match result {
            Ok(()) => Ended::Stopped,
            Err(Served {
                error,
                was_connected,
            }) => {
                status.failed(&error);
                if let WsError::Handshake(_) | WsError::Endpoint { .. } = &error {
                    tracing::error!(app_id = %settings.app_id, error = %error, reconnect_count = timing.reconnect_count, "feishu long connection refused");
                }
                Ended::Dropped {
                    why: error.to_string(),
                    established: was_connected,
                }
            }
        };
        let waiting = |_| status.set_state(ConnState::Reconnecting);
        if let Next::Stop(_) = reconnects.after(ended, &stop, waiting).await {
            break;
        }
    }
    status.set_state(ConnState::Stopped);
    tracing::info!(app_id = %settings.app_id, "feishu long connection stopped");
}

/// How one connection ended (an error always: a stop returns `Ok`).
struct Served {
    error: WsError,
    was_connected: bool,
}

async fn connect_and_serve(
    settings: &WsSettings,
    http: &reqwest::Client,
    handler: &Arc<dyn EventHandler>,
    status: &WsStatus,
    config: &mut ClientConfig,
    stop: &CancellationToken,
) -> Result<(), Served> {
    let not_yet = |error| Served {
        error,
        was_connected: false,
    };
    let opening = async {
        let endpoint = fetch_endpoint(
            http,
            &settings.base_url,
            &settings.app_id,
            &settings.app_secret,
            Some(&status.metrics),
        )
        .await?;
        // Feishu's timing applies from now on, to a refused handshake's retry too.
        if let Some(u) = &endpoint.config {
            config.apply(u);
        }
        let connecting = tokio_tungstenite::connect_async(endpoint.url.as_str());
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting).await {
            Err(_) => Err(WsError::Connect(format!(
                "no handshake within {HANDSHAKE_TIMEOUT:?}"
            ))),
            Ok(Ok((ws, _))) => Ok((endpoint, ws)),
            Ok(Err(tungstenite::Error::Http(resp))) => Err(WsError::Handshake(refusal_of(&resp))),
            Ok(Err(e)) => Err(WsError::Connect(e.to_string())),
        }
    };
    // A node that stops while Feishu is slow to answer does not wait for it.
    let (endpoint, ws) = tokio::select! {
        _ = stop.cancelled() => return Ok(()),
        opened = opening => opened.map_err(not_yet)?,
    };
    status.connected(&endpoint.device_id);
    tracing::info!(app_id = %settings.app_id, device_id = %endpoint.device_id, ping_every = ?config.ping_every(), "feishu long connection open");
    serve(ws, &endpoint, handler, status, config, stop)
        .await
        .map_err(|error| Served {
            error,
            was_connected: true,
        })
}

async fn serve<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    endpoint: &Endpoint,
    handler: &Arc<dyn EventHandler>,
    status: &WsStatus,
    config: &mut ClientConfig,
    stop: &CancellationToken,
) -> Result<(), WsError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut tx, mut rx) = ws.split();
    let mut reassembly = Reassembly::default();
    let mut next_ping = Instant::now();
    let mut last_rx = Instant::now();
    let closed = |e: tungstenite::Error| WsError::Closed(e.to_string());
    loop {
        let silent_at = last_rx + config.silence_limit();
        tokio::select! {
            _ = stop.cancelled() => {
                let _ = tx.send(tungstenite::Message::Close(None)).await;
                return Ok(());
            }
            _ = tokio::time::sleep_until(next_ping) => {
                tx.send(tungstenite::Message::Binary(Frame::ping(endpoint.service_id).to_bytes().into()))
                    .await
                    .map_err(closed)?;
                next_ping = Instant::now() + config.ping_every();
            }
            _ = tokio::time::sleep_until(silent_at) => {
                return Err(WsError::Silent(config.silence_limit()));
            }
            msg = rx.next() => {
                last_rx = Instant::now();
                let bytes = match msg {
                    None => return Err(WsError::Closed("the server closed the socket".into())),
                    Some(Err(e)) => return Err(closed(e)),
                    Some(Ok(tungstenite::Message::Binary(b))) => b,
                    Some(Ok(tungstenite::Message::Close(c))) => {
                        return Err(WsError::Closed(format!("close frame {c:?}")))
                    }
                    Some(Ok(_)) => continue,
                };
                let frame = match Frame::from_bytes(&bytes) {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!(error = %e, "feishu long connection: undecodable message ignored");
                        continue;
                    }
                };
                if frame.method == METHOD_CONTROL {
                    if frame.header(HEADER_TYPE) == Some("pong") {
                        if let Some(u) = frame.payload.as_deref().filter(|p| !p.is_empty()).and_then(|p| serde_json::from_slice::<ClientConfigUpdate>(p).ok()) {
                            let before = *config;
                            config.apply(&u);
                            if before.ping_interval != config.ping_interval {
                                next_ping = Instant::now() + config.ping_every();
                            }
                            tracing::debug!(?config, "feishu long connection config updated by a pong");
                        }
                    }
                    continue;
                }
                if frame.method != METHOD_DATA {
                    continue;
                }
                if let Some(ack) = take_data(frame, &mut reassembly, handler, status).await {
                    tx.send(tungstenite::Message::Binary(ack.to_bytes().into()))
                        .await
                        .map_err(closed)?;
                }
            }
        }
    }
}

/// Handles one data frame: the acknowledgement to send, if any (a fragment that
/// does not complete its payload is not answered).
async fn take_data(
    mut frame: Frame,
    reassembly: &mut Reassembly,
    handler: &Arc<dyn EventHandler>,
    status: &WsStatus,
) -> Option<Frame> {
    let started = Instant::now();
    let message_id = frame
        .header(HEADER_MESSAGE_ID)
        .unwrap_or_default()
        .to_string();
    let trace_id = frame
        .header(HEADER_TRACE_ID)
        .unwrap_or_default()
        .to_string();
    let kind = frame.header(HEADER_TYPE).unwrap_or_default().to_string();
    let num = |k: &str, d: usize| {
        frame
            .header(k)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(d)
    };
    let (sum, seq) = (num(HEADER_SUM, 1), num(HEADER_SEQ, 0));
    let data = frame.payload.take().unwrap_or_default();
    let payload = reassembly.add(&message_id, sum, seq, data)?;
    let code = match kind.as_str() {
        "event" => handler.handle(payload).await,
        other => {
            tracing::debug!(%message_id, kind = other, "feishu long connection: not an event; acknowledged");
            200
        }
    };
    status.answered(code);
    tracing::debug!(%message_id, %trace_id, code, sum, "feishu frame answered");
    Some(frame.ack(code, started.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes the official Python SDK's generated `pbbp2_pb2.Frame` produces for a
    /// data frame (SeqID 7, LogID 9, service 33554678, five headers, payload
    /// `{"a":1}`) and for its ping frame (service 5).
    const SDK_DATA_FRAME: &str = "0807100918f681801020012a0d0a047479706512056576656e742a100a0a6d6573736167655f696412026d312a080a0373756d1201312a080a037365711201302a0e0a0874726163655f69641202743142077b2261223a317d";
    const SDK_PING_FRAME: &str = "08001000180520002a0c0a0474797065120470696e67";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn frames_match_the_official_sdk_bytes() {
        let f = Frame::from_bytes(&hex(SDK_DATA_FRAME)).unwrap();
        assert_eq!(
            (f.seq_id, f.log_id, f.service, f.method),
            (7, 9, 33554678, 1)
        );
        assert_eq!(f.header(HEADER_TYPE), Some("event"));
        assert_eq!(f.header(HEADER_MESSAGE_ID), Some("m1"));
        assert_eq!(f.header(HEADER_TRACE_ID), Some("t1"));
        assert_eq!(f.payload.as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(
            f.to_bytes(),
            hex(SDK_DATA_FRAME),
            "re-encodes byte for byte"
        );
        assert_eq!(Frame::ping(5).to_bytes(), hex(SDK_PING_FRAME));
        assert!(Frame::from_bytes(b"\xff\xff").is_err());
    }

    #[test]
    fn an_ack_is_the_same_frame_with_biz_rt_and_a_code() {
        let f = Frame::from_bytes(&hex(SDK_DATA_FRAME)).unwrap();
        let a = f.ack(500, Duration::from_millis(12));
        assert_eq!(a.header(HEADER_BIZ_RT), Some("12"));
        assert_eq!(a.payload.as_deref(), Some(&b"{\"code\":500}"[..]));
        assert_eq!(
            (a.seq_id, a.log_id, a.service, a.method),
            (7, 9, 33554678, 1)
        );
        assert_eq!(a.headers.len(), f.headers.len() + 1);
        let again = a.ack(200, Duration::from_millis(3));
        assert_eq!(again.headers.len(), a.headers.len(), "biz_rt is replaced");
    }

    #[test]
    fn endpoint_url_and_config_are_read() {
        let e = parse_endpoint(
            "wss://msg-frontier.feishu.cn/ws/v2?fpid=493&aid=552564&device_id=7000&access_key=x&service_id=33554678&ticket=y",
            Some(ClientConfigUpdate {
                ping_interval: Some(90),
                ..Default::default()
            }),
        )
        .unwrap();
        assert_eq!((e.device_id.as_str(), e.service_id), ("7000", 33554678));
        assert!(parse_endpoint("https://x/ws?service_id=1", None).is_err());
        assert!(parse_endpoint("wss://x/ws?device_id=1", None).is_err());
        let mut c = ClientConfig::default();
        let u: ClientConfigUpdate = serde_json::from_str(
            r#"{"ReconnectCount":-1,"ReconnectInterval":120,"ReconnectNonce":30,"PingInterval":90}"#,
        )
        .unwrap();
        c.apply(&u);
        assert_eq!(c.ping_every(), Duration::from_secs(90));
        c.apply(&serde_json::from_str(r#"{"PingInterval":0,"ReconnectNonce":2}"#).unwrap());
        assert_eq!(c.ping_interval, 90, "a zero ping interval is ignored");
        assert_eq!(c.reconnect_nonce, 2);
    }

    #[test]
    fn reconnect_waits_jitter_then_the_interval() {
        let c = ClientConfig {
            reconnect_count: -1,
            reconnect_interval: 120,
            reconnect_nonce: 30,
            ping_interval: 120,
        };
        assert_eq!(c.reconnect_delay(0, 0.5), Duration::from_secs(15));
        assert_eq!(c.reconnect_delay(0, 7.0), Duration::from_secs(30));
        assert_eq!(c.reconnect_delay(1, 0.5), Duration::from_secs(120));
        assert_eq!(c.reconnect_delay(50, 0.0), Duration::from_secs(120));
        assert_eq!(c.silence_limit(), Duration::from_secs(370));
    }

    #[test]
    fn refusals_say_what_they_mean() {
        let mut resp = http::Response::new(None);
        *resp.status_mut() = http::StatusCode::FORBIDDEN;
        let h = resp.headers_mut();
        h.insert(HEADER_HANDSHAKE_STATUS, "514".parse().unwrap());
        h.insert(HEADER_HANDSHAKE_MSG, "exceed limit".parse().unwrap());
        h.insert(HEADER_HANDSHAKE_AUTH_ERRCODE, "1000040350".parse().unwrap());
        let r = refusal_of(&resp);
        assert_eq!(r.auth_code, Some(EXCEED_CONN_LIMIT));
        assert!(r.meaning().contains("too many connections"));
        assert!(WsError::Handshake(r).to_string().contains("exceed limit"));
        let plain = refusal_of(&http::Response::new(None));
        assert!(plain
            .meaning()
            .contains("without Feishu's handshake headers"));
        assert!(WsError::Endpoint {
            code: 1,
            msg: "busy".into()
        }
        .to_string()
        .contains("retrying"));
    }

    struct Never;
    impl EventHandler for Never {
        fn handle(&self, _payload: Vec<u8>) -> BoxFuture<'_, u16> {
            Box::pin(async { 500 })
        }
    }

    /// With Feishu unreachable the client tries again forever: once at once, once
    /// after the jitter, then every reconnect interval (virtual time).
    #[tokio::test(start_paused = true)]
    async fn an_unreachable_feishu_is_retried_every_interval_forever() {
        let metrics = Arc::new(Metrics::new());
        let status = Arc::new(WsStatus::new(metrics.clone()));
        let stop = CancellationToken::new();
        // A closed loopback port: every endpoint call fails at once.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base_url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let task = tokio::spawn(run(
            WsSettings {
                base_url,
                app_id: "cli_x".into(),
                app_secret: "s".into(),
            },
            Arc::new(Never),
            status.clone(),
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let failures = metrics
            .own::<super::super::metrics::FeishuMetrics>()
            .connects
            .get_or_create(&crate::telemetry::metrics::ResultLabel {
                result: "endpoint_unreachable".into(),
            })
            .get();
        // t=0, t=jitter (< 30 s), then every 120 s: 31 or 32 attempts in an hour.
        assert!((31..=32).contains(&failures), "{failures}");
        assert_eq!(status.health().state, ConnState::Reconnecting);
        assert!(status
            .health()
            .last_error
            .unwrap()
            .contains("endpoint request failed"));
        stop.cancel();
        task.await.unwrap();
        assert_eq!(status.health().state, ConnState::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn fragments_reassemble_in_any_order_and_expire() {
        let mut r = Reassembly::default();
        assert_eq!(
            r.add("solo", 1, 0, b"whole".to_vec()),
            Some(b"whole".to_vec())
        );
        assert_eq!(r.add("m", 3, 2, b"c".to_vec()), None);
        assert_eq!(r.add("m", 3, 0, b"a".to_vec()), None);
        assert_eq!(r.add("m", 3, 1, b"b".to_vec()), Some(b"abc".to_vec()));
        assert!(r.is_empty());
        assert_eq!(r.add("late", 2, 0, b"x".to_vec()), None);
        tokio::time::advance(FRAGMENT_TTL).await;
        assert_eq!(
            r.add("late", 2, 1, b"y".to_vec()),
            None,
            "the first half expired"
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r.add("bad", 2, 2, b"z".to_vec()), None, "seq out of range");
        for i in 0..MAX_PARTIAL_PAYLOADS + 5 {
            r.add(&format!("p{i}"), 2, 0, vec![1]);
        }
        assert_eq!(r.len(), MAX_PARTIAL_PAYLOADS, "bounded");
    }
}
