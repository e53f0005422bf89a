//! What Feishu tells the client before and during a connection: the endpoint answer
//! (the `wss://` address and the [`ClientConfig`] timing), a pong's config update, why
//! an endpoint or a handshake was refused ([`WsError`], [`HandshakeRefusal`]).

use std::time::Duration;

use serde::Deserialize;

use super::{
    ENDPOINT_PATH, EXCEED_CONN_LIMIT, HEADER_HANDSHAKE_AUTH_ERRCODE, HEADER_HANDSHAKE_MSG,
    HEADER_HANDSHAKE_STATUS, INTERNAL_ERROR, NO_CREDENTIAL, SILENCE_SLACK, SILENT_PINGS,
    STATUS_AUTH_FAILED, STATUS_FORBIDDEN, SYSTEM_BUSY,
};
use crate::platform::feishu::metrics as feishu_metrics;
use crate::telemetry::metrics::Metrics;

/// The connection's timing, as Feishu sets it (endpoint answer and pongs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// Feishu's advice on how many reconnects to try (-1: forever). Logged only:
    /// this client always tries again.
    pub reconnect_count: i64,
    /// Seconds between reconnect attempts.
    pub reconnect_interval: u64,
    /// Upper bound, in seconds, of the random wait before the first reconnect (so a
    /// fleet does not reconnect at the same instant).
    pub reconnect_nonce: u64,
    /// Seconds between pings.
    pub ping_interval: u64,
}

impl Default for ClientConfig {
    /// The SDKs' defaults until Feishu says otherwise.
    fn default() -> Self {
        ClientConfig {
            reconnect_count: -1,
            reconnect_interval: 120,
            reconnect_nonce: 30,
            ping_interval: 120,
        }
    }
}

/// `ClientConfig` as JSON: any field may be missing (then it is left as it was).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub struct ClientConfigUpdate {
    /// See [`ClientConfig::reconnect_count`].
    #[serde(rename = "ReconnectCount", default)]
    pub reconnect_count: Option<i64>,
    /// See [`ClientConfig::reconnect_interval`].
    #[serde(rename = "ReconnectInterval", default)]
    pub reconnect_interval: Option<u64>,
    /// See [`ClientConfig::reconnect_nonce`].
    #[serde(rename = "ReconnectNonce", default)]
    pub reconnect_nonce: Option<u64>,
    /// See [`ClientConfig::ping_interval`].
    #[serde(rename = "PingInterval", default)]
    pub ping_interval: Option<u64>,
}

impl ClientConfig {
    /// Applies the fields an update carries.
    pub fn apply(&mut self, u: &ClientConfigUpdate) {
        if let Some(v) = u.reconnect_count {
            self.reconnect_count = v;
        }
        if let Some(v) = u.reconnect_interval {
            self.reconnect_interval = v;
        }
        if let Some(v) = u.reconnect_nonce {
            self.reconnect_nonce = v;
        }
        if let Some(v) = u.ping_interval.filter(|p| *p > 0) {
            self.ping_interval = v;
        }
    }

    /// The ping period (at least a second).
    pub fn ping_every(&self) -> Duration {
        Duration::from_secs(self.ping_interval.max(1))
    }

    /// How long a connection may stay silent before it is treated as dead.
    pub fn silence_limit(&self) -> Duration {
        self.ping_every() * SILENT_PINGS + SILENCE_SLACK
    }

    /// The wait before reconnect attempt `attempt` (0 = the first after a drop):
    /// `jitter` (in 0..1) of the nonce first, then the interval.
    pub fn reconnect_delay(&self, attempt: u32, jitter: f64) -> Duration {
        if attempt == 0 {
            Duration::from_secs_f64(self.reconnect_nonce as f64 * jitter.clamp(0.0, 1.0))
        } else {
            Duration::from_secs(self.reconnect_interval)
        }
    }
}

/// What the endpoint call gives: where to connect and how to behave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The WebSocket URL.
    pub url: String,
    /// Its `device_id` (the connection id, for logs).
    pub device_id: String,
    /// Its `service_id` (pings carry it).
    pub service_id: i32,
    /// Feishu's settings for this connection, when it sent them.
    pub config: Option<ClientConfigUpdate>,
}

#[derive(Deserialize)]
struct EndpointReply {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    data: Option<EndpointData>,
}

#[derive(Deserialize)]
struct EndpointData {
    #[serde(rename = "URL", default)]
    url: String,
    #[serde(rename = "ClientConfig", default)]
    client_config: Option<ClientConfigUpdate>,
}

/// Why connecting failed or a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    /// The endpoint call did not get an answer.
    #[error("endpoint request failed: {0}")]
    Http(String),
    /// The endpoint answered an HTTP error.
    #[error("endpoint answered HTTP {status}: {msg}")]
    EndpointStatus {
        /// The HTTP status.
        status: u16,
        /// Feishu's message, when it sent one.
        msg: String,
    },
    /// The endpoint answered a Feishu error code.
    #[error("endpoint refused: code {code} ({msg}): {}", endpoint_meaning(*code))]
    Endpoint {
        /// Feishu's code.
        code: i64,
        /// Feishu's message.
        msg: String,
    },
    /// The endpoint's URL is unusable.
    #[error("endpoint gave an unusable URL: {0}")]
    BadUrl(String),
    /// The WebSocket handshake was refused.
    #[error("{0}")]
    Handshake(HandshakeRefusal),
    /// The WebSocket could not be opened (network, TLS, …).
    #[error("could not connect: {0}")]
    Connect(String),
    /// The connection broke or was closed.
    #[error("connection lost: {0}")]
    Closed(String),
    /// Nothing came for too long.
    #[error("no frame for {0:?}: connection presumed dead")]
    Silent(Duration),
    /// A frame that is not the protocol's.
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl WsError {
    /// A short label for metrics and health.
    pub fn label(&self) -> &'static str {
        match self {
            WsError::Http(_) | WsError::EndpointStatus { .. } => "endpoint_unreachable",
            WsError::Endpoint { .. } | WsError::BadUrl(_) => "endpoint_refused",
            WsError::Handshake(_) => "handshake_refused",
            WsError::Connect(_) => "connect_failed",
            WsError::Closed(_) | WsError::Silent(_) => "dropped",
            WsError::Protocol(_) => "protocol_error",
        }
    }
}

/// What an endpoint error code means for the operator.
pub fn endpoint_meaning(code: i64) -> &'static str {
    match code {
        SYSTEM_BUSY => "Feishu is busy; retrying",
        INTERNAL_ERROR => "Feishu internal error; retrying",
        NO_CREDENTIAL => "no App ID or App Secret was sent",
        _ => "check the App ID and App Secret, and that the app is enabled",
    }
}

/// A refused handshake, from its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeRefusal {
    /// The HTTP status of the refusal.
    pub http_status: u16,
    /// `handshake-status`, when present.
    pub status: Option<i64>,
    /// `handshake-msg`, when present.
    pub msg: Option<String>,
    /// `handshake-autherrcode`, when present.
    pub auth_code: Option<i64>,
}

impl HandshakeRefusal {
    /// What the refusal means, for the log line.
    pub fn meaning(&self) -> &'static str {
        match (self.status, self.auth_code) {
            (Some(STATUS_AUTH_FAILED), Some(EXCEED_CONN_LIMIT)) => {
                "too many connections for this app: another process (an old node, a second copy of this bot) holds Feishu's long connections; stop it"
            }
            (Some(STATUS_AUTH_FAILED), _) => {
                "authentication failed: the connection URL expired or the app's credentials changed; a new endpoint is requested"
            }
            (Some(STATUS_FORBIDDEN), _) => {
                "forbidden: the app may not use the long connection (a self-built app with events subscribed in long-connection mode is needed)"
            }
            (Some(_), _) => "Feishu refused the connection (server side); retrying",
            (None, _) => "refused without Feishu's handshake headers (a proxy or the wrong URL?)",
        }
    }
}

impl std::fmt::Display for HandshakeRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "handshake refused: HTTP {}, handshake-status {:?}, handshake-autherrcode {:?}, handshake-msg {:?}: {}",
            self.http_status,
            self.status,
            self.auth_code,
            self.msg.as_deref().unwrap_or(""),
            self.meaning()
        )
    }
}

/// Asks Feishu where to connect.
pub async fn fetch_endpoint(
    http: &reqwest::Client,
    base_url: &str,
    app_id: &str,
    app_secret: &str,
    metrics: Option<&Metrics>,
) -> Result<Endpoint, WsError> {
    let url = format!("{}{ENDPOINT_PATH}", base_url.trim_end_matches('/'));
    if let Some(m) = metrics {
        feishu_metrics::api_call(m, &format!("POST {ENDPOINT_PATH}"));
    }
    let resp = http
        .post(&url)
        .header("locale", "zh")
        .json(&serde_json::json!({"AppID": app_id, "AppSecret": app_secret}))
        .send()
        .await
        .map_err(|e| WsError::Http(e.to_string()))?;
    let status = resp.status();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| WsError::Http(e.to_string()))?;
    let reply: Option<EndpointReply> = serde_json::from_slice(&bytes).ok();
    if !status.is_success() {
        return Err(WsError::EndpointStatus {
            status: status.as_u16(),
            msg: reply.map(|r| r.msg).unwrap_or_default(),
        });
    }
    let reply = reply.ok_or_else(|| WsError::BadUrl("the endpoint answer is not JSON".into()))?;
    if reply.code != 0 {
        return Err(WsError::Endpoint {
            code: reply.code,
            msg: reply.msg,
        });
    }
    let data = reply
        .data
        .ok_or_else(|| WsError::BadUrl("no data in the endpoint answer".into()))?;
    parse_endpoint(&data.url, data.client_config)
}

/// Reads `device_id` and `service_id` from the connection URL.
pub fn parse_endpoint(url: &str, config: Option<ClientConfigUpdate>) -> Result<Endpoint, WsError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| WsError::BadUrl(format!("{url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "ws" | "wss") {
        return Err(WsError::BadUrl(format!(
            "{} is not ws/wss",
            parsed.scheme()
        )));
    }
    let q = |k: &str| {
        parsed
            .query_pairs()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.into_owned())
    };
    let device_id = q("device_id").unwrap_or_default();
    let service_id = q("service_id")
        .and_then(|s| s.parse::<i32>().ok())
        .ok_or_else(|| WsError::BadUrl("no numeric service_id in the URL".into()))?;
    Ok(Endpoint {
        url: url.to_string(),
        device_id,
        service_id,
        config,
    })
}

/// Reads the refusal out of a failed handshake's response.
pub fn refusal_of(resp: &http::Response<Option<Vec<u8>>>) -> HandshakeRefusal {
    let h = |k: &str| {
        resp.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_string())
    };
    HandshakeRefusal {
        http_status: resp.status().as_u16(),
        status: h(HEADER_HANDSHAKE_STATUS).and_then(|s| s.parse().ok()),
        msg: h(HEADER_HANDSHAKE_MSG),
        auth_code: h(HEADER_HANDSHAKE_AUTH_ERRCODE).and_then(|s| s.parse().ok()),
    }
}
