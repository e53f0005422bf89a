//! `[bots.onebot]`: a QQ bot reached through a OneBot v11 implementation (NapCat,
//! LLOneBot, Lagrange), its checks and the access token it reads from the environment
//! (the config layer's part of the OneBot adapter; see docs/qq.md).

use serde::Deserialize;

use crate::config::platform::{TableCheck, TableProblem};
use crate::config::{NodeConfig, Platform};

/// The platform, as peers.toml names it.
pub const ONEBOT: Platform = Platform::named("onebot");

/// The pause between two sends to one group unless `send_interval_ms` says otherwise:
/// QQ watches for accounts that post like machines.
pub const DEFAULT_SEND_INTERVAL_MS: u64 = 1_000;

/// `[bots.onebot]` (see docs/qq.md). A bot on another platform may hold one with only
/// `self_id`, so that QQ colleagues recognise its account.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct OnebotSettings {
    /// The implementation's forward WebSocket (its universal endpoint: events and
    /// actions on one connection), `ws://…` or `wss://…`.
    #[serde(default)]
    pub ws_url: Option<String>,
    /// Env var holding the access token, sent as `Authorization: Bearer …`. Never the
    /// token itself: secrets stay out of the file.
    #[serde(default)]
    pub access_token_env: Option<String>,
    /// The QQ group that is `[mesh].group`.
    #[serde(default)]
    pub group_id: Option<String>,
    /// This bot's QQ number, checked against `get_login_info` at start: how its own
    /// messages, people's at-segments for it and colleagues' messages are recognised.
    #[serde(default)]
    pub self_id: Option<String>,
    /// The least time between two sends to one group, in ms (default 1,000).
    #[serde(default)]
    pub send_interval_ms: Option<u64>,
}

impl OnebotSettings {
    /// The pause between two sends to one group.
    pub fn send_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.send_interval_ms.unwrap_or(DEFAULT_SEND_INTERVAL_MS))
    }
}

/// Whether `s` is a QQ number (a user's or a group's): 5 to 12 digits, no leading 0.
pub fn is_qq_number(s: &str) -> bool {
    (5..=12).contains(&s.len()) && !s.starts_with('0') && s.chars().all(|c| c.is_ascii_digit())
}

/// This node's access token (read at start: `NodeConfig::platform_secret`).
pub(crate) fn access_token(cfg: &NodeConfig) -> anyhow::Result<String> {
    crate::platform::kit::settings::secret(
        cfg,
        ONEBOT,
        "access_token_env",
        "set it to the access token configured in the OneBot implementation's WebSocket server",
    )
}

/// Checks bot `cx.bot`'s `[bots.onebot]`: well-formed numbers and URL always; the
/// URL, the token variable, the group and its own number when the bot is on QQ.
pub(crate) fn check(cx: &TableCheck<'_>) -> Result<(), TableProblem> {
    let s: OnebotSettings = crate::platform::kit::settings::read_table(
        cx,
        "ws_url, access_token_env, group_id, self_id",
    )?;
    if let Some(url) = &s.ws_url {
        let u = url.trim();
        if !(u.starts_with("ws://") || u.starts_with("wss://")) || reqwest::Url::parse(u).is_err() {
            return Err(cx.problem(
                "ws_url",
                format!("{url:?} is not a WebSocket URL (like ws://127.0.0.1:3001/: the implementation's forward WebSocket server)"),
            ));
        }
    }
    if let Some(v) = &s.group_id {
        if !is_qq_number(v.trim()) {
            return Err(cx.problem(
                "group_id",
                format!("{v:?} is not a QQ group number (5 to 12 digits)"),
            ));
        }
    }
    if s.send_interval_ms == Some(0) {
        return Err(cx.problem(
            "send_interval_ms",
            "0 would let the bot post as fast as it can, which QQ punishes; leave it out for 1000",
        ));
    }
    if let Some(v) = &s.self_id {
        if !is_qq_number(v.trim()) {
            return Err(cx.problem(
                "self_id",
                format!("{v:?} is not a QQ number (5 to 12 digits: the bot account's)"),
            ));
        }
        for (j, other) in cx.settings.bots.iter().enumerate() {
            let theirs = other
                .table::<OnebotSettings>(ONEBOT)
                .and_then(|t| t.self_id);
            if j < cx.index && theirs.as_deref().map(str::trim) == Some(v.trim()) {
                return Err(cx.problem(
                    "self_id",
                    format!("{v} is already the onebot.self_id of {}", other.name),
                ));
            }
        }
    }
    if !cx.own() {
        return Ok(());
    }
    let blank = |v: &Option<String>| v.as_deref().is_none_or(|v| v.trim().is_empty());
    if blank(&s.ws_url) {
        return Err(cx.problem(
            "ws_url",
            "a onebot bot needs the implementation's forward WebSocket URL",
        ));
    }
    if blank(&s.access_token_env) {
        return Err(cx.problem(
            "access_token_env",
            "a onebot bot needs the env var holding the WebSocket's access token",
        ));
    }
    if blank(&s.group_id) {
        return Err(cx.problem(
            "group_id",
            "a onebot bot needs the QQ group that is [mesh].group",
        ));
    }
    if blank(&s.self_id) {
        return Err(cx.problem(
            "self_id",
            "a onebot bot needs its own QQ number (get_login_info's user_id)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qq_numbers() {
        assert!(is_qq_number("10001"));
        assert!(is_qq_number("700100"));
        assert!(!is_qq_number("0123456"));
        assert!(!is_qq_number("12a45"));
        assert!(!is_qq_number("1234"));
    }
}
