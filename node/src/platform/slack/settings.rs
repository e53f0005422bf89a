//! `[bots.slack]`: a Slack bot's identity, where it talks, its checks and the two
//! tokens it reads from the environment (the config layer's part of the Slack
//! adapter; see docs/slack.md).
//!
//! [`check`] runs, through `platform::registry`, over every bot's table before
//! anything binds; the tokens are read at start by the one `_env` convention
//! (`NodeConfig::platform_secret`) and checked for their kind by [`SlackSecrets::of`].

use serde::Deserialize;

use crate::config::platform::{TableCheck, TableProblem};
use crate::config::{NodeConfig, Platform};

/// The platform, as peers.toml names it.
pub const SLACK: Platform = Platform::named("slack");

/// Slack's Web API base URL: methods are `{base}{method}` (`…/api/chat.postMessage`).
pub const SLACK_API_BASE_URL: &str = "https://slack.com/api/";

/// `[bots.slack]` (see docs/slack.md). A bot on another platform may hold one with
/// only `user_id`, so that Slack colleagues recognise it.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SlackSettings {
    /// Env var holding the bot token (`xoxb-…`): Web API calls (auth.test,
    /// chat.postMessage, users.info). Never the token itself: secrets stay out of the file.
    #[serde(default)]
    pub bot_token_env: Option<String>,
    /// Env var holding the app-level token (`xapp-…`, scope `connections:write`): opens
    /// the Socket Mode connection (apps.connections.open).
    #[serde(default)]
    pub app_token_env: Option<String>,
    /// The channel (`C…`, or `G…` for an old private one) that is `[mesh].group`;
    /// messages in other channels the app is in become groups named by the channel id.
    #[serde(default)]
    pub channel_id: Option<String>,
    /// The bot's own user id (`U…`/`W…`), checked against auth.test at start: how its
    /// own messages, people's `<@U…>` of it and colleagues' messages are recognised.
    #[serde(default)]
    pub user_id: Option<String>,
    /// Web API base URL, Slack's unless a test points it at a stand-in.
    #[serde(default)]
    pub api_base_url: Option<String>,
}

/// A Slack bot's two secrets, read at start from the variables `[bots.slack]` names.
#[derive(Clone)]
pub struct SlackSecrets {
    /// The bot token (`xoxb-…`), sent as `Authorization: Bearer` to Web API methods.
    pub bot_token: String,
    /// The app-level token (`xapp-…`), only for apps.connections.open.
    pub app_token: String,
}

impl std::fmt::Debug for SlackSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackSecrets").finish_non_exhaustive()
    }
}

impl SlackSecrets {
    /// This node's two tokens (read at start: `NodeConfig::platform_secret`), each
    /// checked for its kind: a bot token where the app token belongs (or the other way
    /// round) is an error naming the key.
    pub(crate) fn of(cfg: &NodeConfig) -> anyhow::Result<SlackSecrets> {
        let read = |key: &str, prefix: &str, what: &str| -> anyhow::Result<String> {
            let value = cfg
                .platform_secret(key)
                .unwrap_or_default()
                .trim()
                .to_string();
            if !value.starts_with(prefix) {
                anyhow::bail!(
                    "bots[{}].slack.{key}: the variable it names does not hold the {what}: Slack's start with {prefix}",
                    cfg.me
                );
            }
            Ok(value)
        };
        Ok(SlackSecrets {
            bot_token: read("bot_token_env", "xoxb-", "bot token")?,
            app_token: read("app_token_env", "xapp-", "app-level token")?,
        })
    }
}

/// Whether `s` reads as a Slack id of the given kinds: a capital first letter among
/// `kinds` and 2–30 more capitals and digits (`U0123ABCD`, `C0700`).
pub fn is_slack_id(s: &str, kinds: &[char]) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| kinds.contains(&c))
        && (3..=31).contains(&s.len())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
}

/// First letters of a user id (`W` for Enterprise Grid users).
pub const USER_ID_KINDS: &[char] = &['U', 'W', 'B'];
/// First letters of a conversation id a bot of the mesh talks in.
pub const CHANNEL_ID_KINDS: &[char] = &['C', 'G'];

impl SlackSettings {
    /// The Web API base URL, ending in `/`.
    pub fn api_base_url(&self) -> String {
        let base = self.api_base_url.as_deref().unwrap_or(SLACK_API_BASE_URL);
        format!("{}/", base.trim_end_matches('/'))
    }
}

/// Checks bot `cx.bot`'s `[bots.slack]`: well-formed ids and URL always; the two
/// token variables, the channel and its own user id when the bot is on Slack.
pub(crate) fn check(cx: &TableCheck<'_>) -> Result<(), TableProblem> {
    let s: SlackSettings = crate::platform::kit::settings::read_table(
        cx,
        "bot_token_env, app_token_env, channel_id, user_id",
    )?;
    if let Some(url) = &s.api_base_url {
        crate::config::check_url(url).map_err(|p| cx.problem("api_base_url", p))?;
    }
    if let Some(v) = &s.channel_id {
        if !is_slack_id(v.trim(), CHANNEL_ID_KINDS) {
            return Err(cx.problem(
                "channel_id",
                format!("{v:?} is not a Slack channel id (like C0123ABCD: the channel's details → About, at the bottom)"),
            ));
        }
    }
    if let Some(v) = &s.user_id {
        if !is_slack_id(v.trim(), USER_ID_KINDS) {
            return Err(cx.problem(
                "user_id",
                format!("{v:?} is not a Slack user id (like U0123ABCD: the bot's profile → ⋮ → Copy member ID, or auth.test's user_id)"),
            ));
        }
        // A second bot with the same id: the later one is named.
        for (j, other) in cx.settings.bots.iter().enumerate() {
            let theirs = other.table::<SlackSettings>(SLACK).and_then(|t| t.user_id);
            if j < cx.index && theirs.as_deref().map(str::trim) == Some(v.trim()) {
                return Err(cx.problem(
                    "user_id",
                    format!("{v} is already the slack.user_id of {}", other.name),
                ));
            }
        }
    }
    if !cx.own() {
        return Ok(());
    }
    let blank = |v: &Option<String>| v.as_deref().is_none_or(|v| v.trim().is_empty());
    if blank(&s.bot_token_env) {
        return Err(cx.problem(
            "bot_token_env",
            "a slack bot needs the env var holding its bot token (xoxb-…)",
        ));
    }
    if blank(&s.app_token_env) {
        return Err(cx.problem(
            "app_token_env",
            "a slack bot needs the env var holding its app-level token (xapp-…, scope connections:write) for Socket Mode",
        ));
    }
    if blank(&s.channel_id) {
        return Err(cx.problem(
            "channel_id",
            "a slack bot needs the id of the channel that is [mesh].group",
        ));
    }
    if blank(&s.user_id) {
        return Err(cx.problem(
            "user_id",
            "a slack bot needs its own user id (the app's bot user: auth.test's user_id)",
        ));
    }
    Ok(())
}
