//! `[bots.wecom]`: a WeCom smart robot (企业微信智能机器人) reached over its long
//! connection, its checks and the secret it reads from the environment (the config
//! layer's part of the WeCom adapter; see docs/wecom.md).

use std::time::Duration;

use serde::Deserialize;

use crate::config::platform::{TableCheck, TableProblem};
use crate::config::{NodeConfig, Platform};

/// The platform, as peers.toml names it.
pub const WECOM: Platform = Platform::named("wecom");

/// WeCom's long-connection endpoint (the SDKs' `DEFAULT_WS_URL`).
pub const DEFAULT_WS_URL: &str = "wss://openws.work.weixin.qq.com";

/// The heartbeat interval unless `heartbeat_interval_ms` says otherwise: the SDKs'.
pub const DEFAULT_HEARTBEAT_MS: u64 = 30_000;

/// `[bots.wecom]` (see docs/wecom.md).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct WecomSettings {
    /// The smart robot's Bot ID (`aib…`), sent in `aibot_subscribe`.
    #[serde(default)]
    pub bot_id: Option<String>,
    /// Env var holding the robot's Secret. Never the secret itself: secrets stay out
    /// of the file.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// The long connection's URL (default `wss://openws.work.weixin.qq.com`); tests
    /// point it at a stand-in (`ws://` is accepted).
    #[serde(default)]
    pub ws_url: Option<String>,
    /// The group chat (`chatid`) that is `[mesh].group`; other groups are groups named
    /// by their chatid. Absent: every group is named by its chatid.
    #[serde(default)]
    pub chat_id: Option<String>,
    /// How often a `ping` goes, in ms (default 30,000, the SDKs'); two unanswered in a
    /// row end the connection.
    #[serde(default)]
    pub heartbeat_interval_ms: Option<u64>,
}

impl WecomSettings {
    /// The URL to connect to.
    pub fn ws_url(&self) -> String {
        self.ws_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .unwrap_or(DEFAULT_WS_URL)
            .to_string()
    }

    /// The heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms.unwrap_or(DEFAULT_HEARTBEAT_MS))
    }
}

/// This node's robot secret (read at start: `NodeConfig::platform_secret`).
pub(crate) fn secret(cfg: &NodeConfig) -> anyhow::Result<String> {
    crate::platform::kit::settings::secret(
        cfg,
        WECOM,
        "secret_env",
        "set it to the smart robot's Secret (WeCom admin console, the robot's API mode: long connection)",
    )
}

/// Checks bot `cx.bot`'s `[bots.wecom]`: a well-formed URL and interval always; the
/// Bot ID (unique in the mesh) and the secret's variable when the bot is on WeCom.
pub(crate) fn check(cx: &TableCheck<'_>) -> Result<(), TableProblem> {
    let s: WecomSettings = crate::platform::kit::settings::read_table(cx, "bot_id, secret_env")?;
    if let Some(url) = &s.ws_url {
        let u = url.trim();
        if !(u.starts_with("ws://") || u.starts_with("wss://")) || reqwest::Url::parse(u).is_err() {
            return Err(cx.problem(
                "ws_url",
                format!("{url:?} is not a WebSocket URL (leave it out for {DEFAULT_WS_URL})"),
            ));
        }
    }
    if let Some(ms) = s.heartbeat_interval_ms {
        if !(100..=120_000).contains(&ms) {
            return Err(cx.problem(
                "heartbeat_interval_ms",
                format!("{ms} is outside 100..=120000 (leave it out for {DEFAULT_HEARTBEAT_MS}, the SDKs' interval)"),
            ));
        }
    }
    if let Some(id) = &s.bot_id {
        if id.trim().is_empty() || id.trim().chars().any(char::is_whitespace) {
            return Err(cx.problem(
                "bot_id",
                format!("{id:?} is not a Bot ID (like aibXXXX, from the robot's API settings)"),
            ));
        }
        for (j, other) in cx.settings.bots.iter().enumerate() {
            let theirs = other.table::<WecomSettings>(WECOM).and_then(|t| t.bot_id);
            if j < cx.index && theirs.as_deref().map(str::trim) == Some(id.trim()) {
                return Err(cx.problem(
                    "bot_id",
                    format!(
                        "{id} is already the wecom.bot_id of {}: WeCom keeps one connection per robot, so two nodes would take it from each other",
                        other.name
                    ),
                ));
            }
        }
    }
    if !cx.own() {
        return Ok(());
    }
    let blank = |v: &Option<String>| v.as_deref().is_none_or(|v| v.trim().is_empty());
    if blank(&s.bot_id) {
        return Err(cx.problem("bot_id", "a wecom bot needs its smart robot's Bot ID"));
    }
    if blank(&s.secret_env) {
        return Err(cx.problem(
            "secret_env",
            "a wecom bot needs the env var holding its smart robot's Secret",
        ));
    }
    Ok(())
}
