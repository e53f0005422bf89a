//! `[bots.telegram]`: a Telegram bot's identity, its group, where the Bot API is, and
//! how updates arrive, its checks and its secrets (the config layer's part of the
//! Telegram adapter: it uses only `wire` and `config`; see docs/telegram.md).

use serde::Deserialize;

use crate::config::platform::{TableCheck, TableProblem};
use crate::config::{NodeConfig, Platform};

/// The platform, as peers.toml names it.
pub const TELEGRAM: Platform = Platform::named("telegram");

/// The Bot API's base URL: requests go to `{api_base_url}/bot{token}/{method}`.
pub const TELEGRAM_API_BASE_URL: &str = "https://api.telegram.org";

/// `[bots.telegram]`, as written in peers.toml.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TelegramSettings {
    /// Env var holding the bot token from @BotFather (never the token itself: secrets
    /// stay out of the file). Needed for a bot whose platform is `telegram`.
    #[serde(default)]
    pub token_env: Option<String>,
    /// The group (a number such as `-1001234567890`) that is the mesh's `[mesh].group`;
    /// other groups the bot is in become groups named by their chat id.
    #[serde(default)]
    pub chat_id: Option<String>,
    /// The bot's @handle without the `@` (`alpha_bot`): checked against `getMe` at
    /// start, and how every node of the mesh maps a person's `@alpha_bot` to this bot
    /// (so a colleague on another platform may carry the table with only this key).
    #[serde(default)]
    pub username: Option<String>,
    /// The Bot API's base URL (default [`TELEGRAM_API_BASE_URL`]; a local Bot API
    /// server, or a test's stand-in).
    #[serde(default)]
    pub api_base_url: Option<String>,
    /// Webhook mode: the public HTTPS URL Telegram posts updates to, reaching
    /// [`WEBHOOK_PATH`] on the bridge listener. The node registers it with `setWebhook`
    /// at start. Absent: long polling with `getUpdates` (the default: no public
    /// address needed).
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// Env var holding the webhook's secret token (1–256 of `A-Z a-z 0-9 _ -`), which
    /// Telegram sends in `X-Telegram-Bot-Api-Secret-Token`; required with `webhook_url`.
    #[serde(default)]
    pub secret_token_env: Option<String>,
}

/// Where Telegram's webhook posts land on the bridge listener.
pub const WEBHOOK_PATH: &str = "/telegram/v1/updates";

impl TelegramSettings {
    /// The base URL without a trailing `/`.
    pub fn api_base_url(&self) -> String {
        self.api_base_url
            .as_deref()
            .unwrap_or(TELEGRAM_API_BASE_URL)
            .trim_end_matches('/')
            .to_string()
    }

    /// The configured handle, without spaces, lower-cased (Telegram's handles are
    /// case-insensitive).
    pub fn handle(&self) -> Option<String> {
        self.username
            .as_deref()
            .map(|u| u.trim().to_ascii_lowercase())
            .filter(|u| !u.is_empty())
    }

    /// The group's chat id as a number.
    pub fn chat(&self) -> Option<i64> {
        self.chat_id.as_deref()?.trim().parse().ok()
    }
}

/// A telegram bot's secrets, read at start from the variables its table names
/// ([`NodeConfig::platform_secret`]).
#[derive(Clone)]
pub struct TelegramSecrets {
    /// The bot token (`123456:ABC-…`): part of every request's URL.
    pub(crate) token: String,
    /// The webhook's secret token, in webhook mode.
    pub(crate) secret_token: Option<String>,
}

impl TelegramSecrets {
    /// This node's Telegram secrets, checked: a token that cannot be part of a URL
    /// or a secret token Telegram would refuse is an error naming its key.
    pub(crate) fn of(cfg: &NodeConfig) -> anyhow::Result<TelegramSecrets> {
        let token = cfg
            .platform_secret("token_env")
            .unwrap_or_default()
            .trim()
            .to_string();
        if token.is_empty() || token.contains(['/', '?', '#', ' ']) {
            anyhow::bail!("telegram.token_env: the variable does not hold a bot token (123456:ABC-…, from @BotFather)");
        }
        let secret_token = cfg
            .platform_secret("secret_token_env")
            .map(|s| s.trim().to_string());
        if let Some(s) = &secret_token {
            let ok = (1..=256).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok {
                anyhow::bail!("telegram.secret_token_env: the variable must hold 1–256 of A-Z a-z 0-9 _ - (Telegram's rule for secret_token)");
            }
        }
        Ok(TelegramSecrets {
            token,
            secret_token,
        })
    }
}

impl std::fmt::Debug for TelegramSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramSecrets")
            .field("secret_token", &self.secret_token.is_some())
            .finish_non_exhaustive()
    }
}

/// Whether `s` is a Telegram bot's handle: 5–32 of `A-Z a-z 0-9 _`, ending in `bot`.
pub(crate) fn is_bot_handle(s: &str) -> bool {
    (5..=32).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && s.to_ascii_lowercase().ends_with("bot")
}

/// Checks bot `cx.bot`'s `[bots.telegram]`: well-formed values and a handle no
/// earlier bot has, always; the token variable, group and handle when the bot is on
/// Telegram.
pub(crate) fn check(cx: &TableCheck<'_>) -> Result<(), TableProblem> {
    let t: TelegramSettings =
        crate::platform::kit::settings::read_table(cx, "token_env, chat_id, username")?;
    if let Some(u) = &t.username {
        let u = u.trim();
        if let Some(bare) = u.strip_prefix('@') {
            return Err(cx.problem(
                "username",
                format!("write the handle without the @ ({bare:?})"),
            ));
        }
        if !is_bot_handle(u) {
            return Err(cx.problem("username",
                format!("{u:?} is not a bot's @handle (5–32 letters, digits or _, ending in \"bot\", as @BotFather gave it)"),
            ));
        }
        let lower = u.to_ascii_lowercase();
        let earlier = cx.settings.bots[..cx.index].iter().find(|o| {
            o.table::<TelegramSettings>(TELEGRAM)
                .and_then(|t| t.handle())
                .as_deref()
                == Some(lower.as_str())
        });
        if let Some(other) = earlier {
            return Err(cx.problem(
                "username",
                format!("@{u} is already the handle of {}", other.name),
            ));
        }
    }
    if let Some(c) = &t.chat_id {
        if t.chat().is_none() {
            return Err(cx.problem("chat_id",
                format!("{c:?} is not a Telegram chat id (a number such as \"-1001234567890\": see docs/telegram.md, \"Finding the chat id\")"),
            ));
        }
    }
    for (key, url) in [
        ("api_base_url", &t.api_base_url),
        ("webhook_url", &t.webhook_url),
    ] {
        if let Some(url) = url {
            crate::config::check_url(url).map_err(|p| cx.problem(key, p))?;
        }
    }
    if t.webhook_url.is_some() && blank(&t.secret_token_env) {
        return Err(cx.problem("secret_token_env",
            "webhook mode needs the env var holding the webhook's secret token (every update is checked against it)",
        ));
    }
    if t.webhook_url.is_none() && !blank(&t.secret_token_env) {
        return Err(cx.problem(
            "secret_token_env",
            "only used in webhook mode: set webhook_url too, or remove it",
        ));
    }
    if !cx.own() {
        return Ok(());
    }
    if blank(&t.token_env) {
        return Err(cx.problem(
            "token_env",
            "a telegram bot needs the env var holding its bot token (from @BotFather)",
        ));
    }
    if blank(&t.chat_id) {
        return Err(cx.problem(
            "chat_id",
            "a telegram bot needs the id of the group that is [mesh].group",
        ));
    }
    if blank(&t.username) {
        return Err(cx.problem(
            "username",
            "a telegram bot needs its @handle without the @ (checked against getMe at start)",
        ));
    }
    Ok(())
}

fn blank(v: &Option<String>) -> bool {
    v.as_deref().is_none_or(|v| v.trim().is_empty())
}
