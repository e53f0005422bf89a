//! `[bots.slack]`: a Slack bot's identity, where it talks, and the two tokens it
//! reads from the environment (docs/slack.md).
//!
//! This file belongs to the config layer (node/tests/layers.rs): `config` holds the
//! table as a `BotSettings` field, calls [`SlackSettings::validate`] while it checks
//! peers.toml and [`SlackSettings::secrets`] when it reads a node's secrets. It uses
//! nothing above config.

use serde::Deserialize;

use crate::config::SecretSource;

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

/// A problem with `[bots.slack]`: the key it is about and what is wrong (config wraps
/// it into its own error with the file name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsProblem {
    /// The full key, e.g. `bots[1].slack.user_id`.
    pub key: String,
    /// What is wrong, in words an operator can act on.
    pub problem: String,
}

/// A Slack bot's two secrets, read from the variables `[bots.slack]` names.
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

    /// Checks the table of `bots[i]` (`is_slack`: its platform is slack, so it needs
    /// everything; otherwise only what it holds must be well formed).
    pub fn validate(&self, i: usize, is_slack: bool) -> Result<(), SettingsProblem> {
        let problem = |k: &str, p: String| SettingsProblem {
            key: format!("bots[{i}].slack.{k}"),
            problem: p,
        };
        if let Some(url) = &self.api_base_url {
            let ok = reqwest::Url::parse(url).is_ok_and(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.host_str().is_some_and(|h| !h.is_empty())
            });
            if !ok {
                return Err(problem(
                    "api_base_url",
                    format!("{url:?} must be an http:// or https:// URL with a host (Slack's is {SLACK_API_BASE_URL})"),
                ));
            }
        }
        if let Some(v) = &self.channel_id {
            if !is_slack_id(v.trim(), CHANNEL_ID_KINDS) {
                return Err(problem(
                    "channel_id",
                    format!("{v:?} is not a Slack channel id (like C0123ABCD: the channel's details → About, at the bottom)"),
                ));
            }
        }
        if let Some(v) = &self.user_id {
            if !is_slack_id(v.trim(), USER_ID_KINDS) {
                return Err(problem(
                    "user_id",
                    format!("{v:?} is not a Slack user id (like U0123ABCD: the bot's profile → ⋮ → Copy member ID, or auth.test's user_id)"),
                ));
            }
        }
        for (key, var) in [
            ("bot_token_env", &self.bot_token_env),
            ("app_token_env", &self.app_token_env),
        ] {
            if var.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(problem(key, "must name an environment variable".into()));
            }
        }
        if !is_slack {
            return Ok(());
        }
        let blank = |v: &Option<String>| v.as_deref().is_none_or(|v| v.trim().is_empty());
        if blank(&self.bot_token_env) {
            return Err(problem(
                "bot_token_env",
                "a slack bot needs the env var holding its bot token (xoxb-…)".into(),
            ));
        }
        if blank(&self.app_token_env) {
            return Err(problem(
                "app_token_env",
                "a slack bot needs the env var holding its app-level token (xapp-…, scope connections:write) for Socket Mode".into(),
            ));
        }
        if blank(&self.channel_id) {
            return Err(problem(
                "channel_id",
                "a slack bot needs the id of the channel that is [mesh].group".into(),
            ));
        }
        if blank(&self.user_id) {
            return Err(problem(
                "user_id",
                "a slack bot needs its own user id (the app's bot user: auth.test's user_id)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Reads the two tokens of `bots[i]` from `env`: an unset or empty variable, or a
    /// token of the wrong kind (a bot token where the app token belongs), is a problem
    /// naming the key.
    pub fn secrets(
        &self,
        i: usize,
        env: &dyn SecretSource,
    ) -> Result<SlackSecrets, SettingsProblem> {
        let read = |key: &str, var: &Option<String>, prefix: &str, what: &str| {
            let var = var.clone().unwrap_or_default();
            let problem = |p: String| SettingsProblem {
                key: format!("bots[{i}].slack.{key}"),
                problem: p,
            };
            let value = env
                .var(&var)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| {
                    problem(format!(
                        "environment variable {var} is not set (it must hold the {what})"
                    ))
                })?;
            if !value.starts_with(prefix) {
                return Err(problem(format!(
                    "environment variable {var} does not hold the {what}: Slack's start with {prefix}"
                )));
            }
            Ok(value)
        };
        Ok(SlackSecrets {
            bot_token: read("bot_token_env", &self.bot_token_env, "xoxb-", "bot token")?,
            app_token: read(
                "app_token_env",
                &self.app_token_env,
                "xapp-",
                "app-level token",
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn full() -> SlackSettings {
        SlackSettings {
            bot_token_env: Some("ADA_BOT_TOKEN".into()),
            app_token_env: Some("ADA_APP_TOKEN".into()),
            channel_id: Some("C0700".into()),
            user_id: Some("U1001".into()),
            api_base_url: None,
        }
    }

    #[test]
    fn each_missing_or_malformed_key_is_named() {
        assert_eq!(full().validate(1, true), Ok(()));
        assert_eq!(full().api_base_url(), SLACK_API_BASE_URL);
        let cases: Vec<(SlackSettings, &str)> = vec![
            (
                SlackSettings {
                    bot_token_env: None,
                    ..full()
                },
                "bots[1].slack.bot_token_env",
            ),
            (
                SlackSettings {
                    app_token_env: Some(" ".into()),
                    ..full()
                },
                "bots[1].slack.app_token_env",
            ),
            (
                SlackSettings {
                    channel_id: None,
                    ..full()
                },
                "bots[1].slack.channel_id",
            ),
            (
                SlackSettings {
                    channel_id: Some("#general".into()),
                    ..full()
                },
                "bots[1].slack.channel_id",
            ),
            (
                SlackSettings {
                    user_id: Some("<@U1001>".into()),
                    ..full()
                },
                "bots[1].slack.user_id",
            ),
            (
                SlackSettings {
                    user_id: None,
                    ..full()
                },
                "bots[1].slack.user_id",
            ),
            (
                SlackSettings {
                    api_base_url: Some("slack.com/api".into()),
                    ..full()
                },
                "bots[1].slack.api_base_url",
            ),
        ];
        for (s, key) in cases {
            assert_eq!(s.validate(1, true).unwrap_err().key, key, "{s:?}");
        }
        let id_only = SlackSettings {
            user_id: Some("U2002".into()),
            ..Default::default()
        };
        assert_eq!(id_only.validate(0, false), Ok(()), "a colleague's id alone");
        assert_eq!(
            SlackSettings {
                api_base_url: Some("http://127.0.0.1:9/api".into()),
                ..full()
            }
            .api_base_url(),
            "http://127.0.0.1:9/api/"
        );
    }

    #[test]
    fn tokens_are_read_checked_for_their_kind_and_never_shown() {
        let env: HashMap<String, String> = [
            ("ADA_BOT_TOKEN", "xoxb-1-secret"),
            ("ADA_APP_TOKEN", "xapp-1-secret"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let s = full().secrets(0, &env).unwrap();
        assert_eq!(
            (s.bot_token.as_str(), s.app_token.as_str()),
            ("xoxb-1-secret", "xapp-1-secret")
        );
        assert!(!format!("{s:?}").contains("secret"));
        let swapped = SlackSettings {
            app_token_env: Some("ADA_BOT_TOKEN".into()),
            ..full()
        };
        let e = swapped.secrets(0, &env).unwrap_err();
        assert_eq!(e.key, "bots[0].slack.app_token_env");
        assert!(e.problem.contains("xapp-"), "{}", e.problem);
        let e = SlackSettings {
            bot_token_env: Some("NOPE".into()),
            ..full()
        }
        .secrets(0, &env)
        .unwrap_err();
        assert_eq!(e.key, "bots[0].slack.bot_token_env");
        assert!(e.problem.contains("NOPE is not set"));
    }
}
