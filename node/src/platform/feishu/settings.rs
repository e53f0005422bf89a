//! `[bots.feishu]`: a Feishu bot's app and ids, their checks and its secrets (the
//! config layer's part of the Feishu adapter; see docs/feishu.md).

use std::collections::HashMap;

use serde::Deserialize;

use crate::config::platform::{TableCheck, TableProblem};
use crate::config::{NodeConfig, Platform};

/// The platform, as peers.toml names it.
pub(crate) const FEISHU: Platform = Platform::named("feishu");

/// How a feishu bot receives its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FeishuMode {
    /// The node opens an outbound WebSocket to Feishu (no public address, no
    /// Verification Token or Encrypt Key needed).
    #[default]
    LongConnection,
    /// Feishu POSTs signed callbacks to the node's bridge listener.
    Webhook,
}

/// Feishu ids of a bot and, for a bot whose platform is `feishu`, its app (see docs/feishu.md).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FeishuIds {
    /// How events arrive: `long_connection` (default) or `webhook`.
    #[serde(default)]
    pub(crate) mode: FeishuMode,
    /// The bot's open_id (as seen by this bot's own app).
    #[serde(default)]
    pub(crate) open_id: Option<String>,
    /// The app's App ID (`cli_…`).
    #[serde(default)]
    pub(crate) app_id: Option<String>,
    /// Env var holding the app's App Secret.
    #[serde(default)]
    pub(crate) app_secret_env: Option<String>,
    /// Env var holding the event subscription's Verification Token.
    #[serde(default)]
    pub(crate) verification_token_env: Option<String>,
    /// Env var holding the event subscription's Encrypt Key (recommended: signed, encrypted events).
    #[serde(default)]
    pub(crate) encrypt_key_env: Option<String>,
    /// Open platform base URL: `https://open.feishu.cn` (default) or `https://open.larksuite.com`.
    #[serde(default)]
    pub(crate) base_url: Option<String>,
    /// The group chat (`oc_…`) that is the mesh's `[mesh].group`.
    #[serde(default)]
    pub(crate) chat_id: Option<String>,
    /// Colleagues' open_ids as seen by THIS bot's app (open_ids differ per app): bot name → `ou_…`.
    #[serde(default)]
    pub(crate) peer_open_ids: HashMap<String, String>,
}

/// The Feishu open platform's default base URL.
pub(crate) const FEISHU_BASE_URL: &str = "https://open.feishu.cn";

impl FeishuIds {
    /// The configured base URL without a trailing `/`, or Feishu's.
    pub(crate) fn base_url(&self) -> String {
        self.base_url
            .as_deref()
            .unwrap_or(FEISHU_BASE_URL)
            .trim_end_matches('/')
            .to_string()
    }
}

/// The ids Feishu's mentions name `bot` by, for the mention matcher: its open_id in
/// its own app (`[bots.feishu] open_id`), when it has one.
pub(crate) fn member_ids(bot: &crate::config::BotSettings) -> Vec<String> {
    bot.table::<FeishuIds>(FEISHU)
        .and_then(|ids| ids.open_id)
        .into_iter()
        .collect()
}

/// Checks bot `cx.bot`'s `[bots.feishu]`: well-formed URLs and colleagues' open_ids
/// always; the app and its open_id when the bot is on Feishu.
pub(crate) fn check(cx: &TableCheck<'_>) -> Result<(), TableProblem> {
    let f: FeishuIds = cx.read()?;
    if cx.own() && f.open_id.as_deref().is_none_or(|o| o.trim().is_empty()) {
        return Err(cx.problem("open_id", "a feishu bot needs its open_id"));
    }
    if let Some(url) = &f.base_url {
        crate::config::check_url(url).map_err(|p| cx.problem("base_url", p))?;
    }
    for (peer, open_id) in &f.peer_open_ids {
        let key = format!("peer_open_ids.{peer}");
        match cx.settings.bot(peer) {
            None => {
                return Err(cx.problem(&key, format!("{peer:?} is not a bot of this mesh")));
            }
            Some((j, _)) if j == cx.index => {
                return Err(cx.problem(&key, "a bot's own open_id goes in feishu.open_id"));
            }
            _ => {}
        }
        if open_id.trim().is_empty() || open_id.contains(['<', '>', '"']) {
            return Err(cx.problem(&key, "must be an open_id like ou_…"));
        }
    }
    if !cx.own() {
        return Ok(());
    }
    let blank = |v: &Option<String>| v.as_deref().is_none_or(|v| v.trim().is_empty());
    if blank(&f.app_id) {
        return Err(cx.problem("app_id", "a feishu bot needs its app's App ID (cli_…)"));
    }
    if blank(&f.app_secret_env) {
        return Err(cx.problem(
            "app_secret_env",
            "a feishu bot needs the env var holding its App Secret",
        ));
    }
    if f.mode == FeishuMode::Webhook
        && blank(&f.verification_token_env)
        && blank(&f.encrypt_key_env)
    {
        return Err(cx.problem("encrypt_key_env",
            "set encrypt_key_env (recommended) or verification_token_env: webhook events must be authenticated (or use mode = \"long_connection\", which needs neither)",
        ));
    }
    if f.chat_id.as_deref().is_some_and(|c| c.trim().is_empty()) {
        return Err(cx.problem("chat_id", "must not be empty (a chat_id like oc_…)"));
    }
    Ok(())
}

/// A feishu bot's secrets, read at start from the variables its table names.
#[derive(Clone)]
pub(crate) struct FeishuSecrets {
    /// App Secret (for the tenant access token).
    pub(crate) app_secret: String,
    /// Verification Token, when configured.
    pub(crate) verification_token: Option<String>,
    /// Encrypt Key, when configured.
    pub(crate) encrypt_key: Option<String>,
}

impl FeishuSecrets {
    /// This node's Feishu secrets (read at start: [`NodeConfig::platform_secret`]).
    pub(crate) fn of(cfg: &NodeConfig) -> FeishuSecrets {
        FeishuSecrets {
            app_secret: cfg
                .platform_secret("app_secret_env")
                .unwrap_or_default()
                .to_string(),
            verification_token: cfg
                .platform_secret("verification_token_env")
                .map(str::to_string),
            encrypt_key: cfg.platform_secret("encrypt_key_env").map(str::to_string),
        }
    }
}

impl std::fmt::Debug for FeishuSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeishuSecrets")
            .field("verification_token", &self.verification_token.is_some())
            .field("encrypt_key", &self.encrypt_key.is_some())
            .finish_non_exhaustive()
    }
}
