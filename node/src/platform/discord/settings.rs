//! `[bots.discord]`: a Discord bot's identity and where it talks, its checks and its
//! secret (the config layer's part of the Discord adapter; see docs/discord.md).

use std::collections::HashMap;

use serde::Deserialize;

use crate::config::platform::{TableCheck, TableProblem};
use crate::config::{NodeConfig, Platform};

/// The platform, as peers.toml names it.
pub const DISCORD: Platform = Platform::named("discord");

/// Discord's REST API base URL (v10).
pub const DISCORD_API_BASE_URL: &str = "https://discord.com/api/v10";

/// `[bots.discord]`: a Discord bot's identity and where it talks (see docs/discord.md).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct DiscordSettings {
    /// Env var holding the bot token (never the token itself: secrets stay out of the file).
    #[serde(default)]
    pub token_env: Option<String>,
    /// The channel that is the mesh's `[mesh].group`; messages in other channels the
    /// bot can read become groups named by the channel id.
    #[serde(default)]
    pub channel_id: Option<String>,
    /// The bot's own user id (a snowflake), checked against `GET /users/@me` at start:
    /// how its own messages and mentions of it are recognised.
    #[serde(default)]
    pub user_id: Option<String>,
    /// Colleagues' user ids, bot name → snowflake, for real `<@id>` mentions and to
    /// recognise their messages (else a colleague's own `[bots.discord].user_id`).
    #[serde(default)]
    pub peer_user_ids: HashMap<String, String>,
    /// REST base URL; Discord's v10 API unless a test points it at a stand-in.
    #[serde(default)]
    pub api_base_url: Option<String>,
    /// Gateway URL used instead of the one `GET /gateway/bot` returns (a stand-in).
    #[serde(default)]
    pub gateway_url: Option<String>,
}

impl DiscordSettings {
    /// The REST base URL without a trailing `/`.
    pub fn api_base_url(&self) -> String {
        self.api_base_url
            .as_deref()
            .unwrap_or(DISCORD_API_BASE_URL)
            .trim_end_matches('/')
            .to_string()
    }
}

/// Whether `s` looks like a Discord snowflake: 1 to 20 ASCII digits.
pub fn is_snowflake(s: &str) -> bool {
    !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())
}

/// Checks bot `cx.bot`'s `[bots.discord]`: well-formed ids and URLs always; the
/// token variable, channel and own user id when the bot is on Discord.
pub(crate) fn check(cx: &TableCheck<'_>) -> Result<(), TableProblem> {
    let d: DiscordSettings =
        crate::platform::kit::settings::read_table(cx, "token_env, channel_id, user_id")?;
    if let Some(url) = &d.api_base_url {
        crate::config::check_url(url).map_err(|p| cx.problem("api_base_url", p))?;
    }
    if let Some(url) = &d.gateway_url {
        let rest = url
            .strip_prefix("ws://")
            .or_else(|| url.strip_prefix("wss://"))
            .filter(|r| !r.is_empty() && !r.starts_with('/'));
        if rest.is_none() || reqwest::Url::parse(url).is_err() {
            return Err(cx.problem(
                "gateway_url",
                format!("{url:?} must be a ws:// or wss:// URL with a host"),
            ));
        }
    }
    for (key, value) in [("channel_id", &d.channel_id), ("user_id", &d.user_id)] {
        if let Some(v) = value {
            if !is_snowflake(v.trim()) {
                return Err(cx.problem(
                    key,
                    format!("{v:?} is not a Discord id (digits only: Developer Mode → Copy ID)"),
                ));
            }
        }
    }
    let mut seen: HashMap<&str, &str> = HashMap::new();
    if let Some(own) = &d.user_id {
        seen.insert(own.trim(), cx.bot.name.as_str());
    }
    let mut peers: Vec<(&String, &String)> = d.peer_user_ids.iter().collect();
    peers.sort();
    for (peer, id) in peers {
        let key = format!("peer_user_ids.{peer}");
        match cx.settings.bot(peer) {
            None => return Err(cx.problem(&key, format!("{peer:?} is not a bot of this mesh"))),
            Some((j, _)) if j == cx.index => {
                return Err(cx.problem(&key, "a bot's own id goes in discord.user_id"));
            }
            _ => {}
        }
        if !is_snowflake(id.trim()) {
            return Err(cx.problem(
                &key,
                format!("{id:?} is not a Discord user id (digits only)"),
            ));
        }
        if let Some(other) = seen.insert(id.trim(), peer.as_str()) {
            return Err(cx.problem(&key, format!("{id} is already the id of {other}")));
        }
    }
    if !cx.own() {
        return Ok(());
    }
    let blank = |v: &Option<String>| v.as_deref().is_none_or(|v| v.trim().is_empty());
    if blank(&d.token_env) {
        return Err(cx.problem(
            "token_env",
            "a discord bot needs the env var holding its bot token",
        ));
    }
    if blank(&d.channel_id) {
        return Err(cx.problem(
            "channel_id",
            "a discord bot needs the id of the channel that is [mesh].group",
        ));
    }
    if blank(&d.user_id) {
        return Err(cx.problem(
            "user_id",
            "a discord bot needs its own user id (the application's bot user)",
        ));
    }
    Ok(())
}

/// A discord bot's secret, read at start from the variable `token_env` names.
#[derive(Clone)]
pub struct DiscordSecrets {
    /// The bot token (sent as `Authorization: Bot …` and in IDENTIFY).
    pub token: String,
}

impl DiscordSecrets {
    /// This node's Discord token (read at start: [`NodeConfig::platform_secret`]).
    pub(crate) fn of(cfg: &NodeConfig) -> DiscordSecrets {
        DiscordSecrets {
            token: cfg
                .platform_secret("token_env")
                .unwrap_or_default()
                .trim()
                .to_string(),
        }
    }
}

impl std::fmt::Debug for DiscordSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordSecrets").finish_non_exhaustive()
    }
}
