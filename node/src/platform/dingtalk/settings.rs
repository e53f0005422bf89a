//! `[bots.dingtalk]`: a DingTalk bot's app and robot, their checks and its secret
//! (the config layer's part of the DingTalk adapter; see docs/dingtalk.md).

use std::collections::HashMap;

use serde::Deserialize;

use crate::config::platform::{TableCheck, TableProblem};
use crate::config::{NodeConfig, Platform};

/// The platform, as peers.toml names it.
pub(crate) const DINGTALK: Platform = Platform::named("dingtalk");

/// A DingTalk bot's app and robot (see docs/dingtalk.md).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DingTalkIds {
    /// The app's Client ID (formerly AppKey): opens the Stream connection and gets
    /// access tokens.
    #[serde(default)]
    pub(crate) client_id: Option<String>,
    /// Env var holding the app's Client Secret (formerly AppSecret).
    #[serde(default)]
    pub(crate) client_secret_env: Option<String>,
    /// The robot's code (usually equal to the Client ID): the group-send API names the
    /// robot by it.
    #[serde(default)]
    pub(crate) robot_code: Option<String>,
    /// The group conversation (`cid…`) that is the mesh's `[mesh].group`; messages of
    /// other groups go to groups named by their conversation id.
    #[serde(default)]
    pub(crate) conversation_id: Option<String>,
    /// Colleagues' ids as they appear in this robot's `atUsers` (`dingtalkId`, or
    /// `staffId`): bot name → id, so a person's @ of a colleague robot is recognised.
    #[serde(default)]
    pub(crate) peer_user_ids: HashMap<String, String>,
    /// Open API base URL (default `https://api.dingtalk.com`); tests point it at a
    /// stand-in.
    #[serde(default)]
    pub(crate) api_base_url: Option<String>,
}

/// DingTalk's open API base URL.
pub(crate) const DINGTALK_BASE_URL: &str = "https://api.dingtalk.com";

impl DingTalkIds {
    /// The configured base URL without a trailing `/`, or DingTalk's.
    pub(crate) fn api_base_url(&self) -> String {
        self.api_base_url
            .as_deref()
            .unwrap_or(DINGTALK_BASE_URL)
            .trim_end_matches('/')
            .to_string()
    }
}

/// Checks bot `cx.bot`'s `[bots.dingtalk]`: colleagues' ids always; the app and
/// robot when the bot is on DingTalk.
pub(crate) fn check(cx: &TableCheck<'_>) -> Result<(), TableProblem> {
    let d: DingTalkIds = crate::platform::kit::settings::read_table(
        cx,
        "client_id, client_secret_env, robot_code, conversation_id",
    )?;
    if let Some(url) = &d.api_base_url {
        crate::config::check_url(url).map_err(|p| cx.problem("api_base_url", p))?;
    }
    for (peer, id) in &d.peer_user_ids {
        let key = format!("peer_user_ids.{peer}");
        match cx.settings.bot(peer) {
            None => {
                return Err(cx.problem(&key, format!("{peer:?} is not a bot of this mesh")));
            }
            Some((j, _)) if j == cx.index => {
                return Err(cx.problem(&key, "a bot does not list itself among its peers"));
            }
            _ => {}
        }
        if id.trim().is_empty() || id.chars().any(char::is_whitespace) {
            return Err(cx.problem(
                &key,
                "must be the colleague's id in atUsers (dingtalkId or staffId), without spaces",
            ));
        }
    }
    if !cx.own() {
        return Ok(());
    }
    let blank = |v: &Option<String>| v.as_deref().is_none_or(|v| v.trim().is_empty());
    if blank(&d.client_id) {
        return Err(cx.problem(
            "client_id",
            "a dingtalk bot needs its app's Client ID (formerly AppKey, ding…)",
        ));
    }
    if blank(&d.client_secret_env) {
        return Err(cx.problem(
            "client_secret_env",
            "a dingtalk bot needs the env var holding its app's Client Secret",
        ));
    }
    if blank(&d.robot_code) {
        return Err(cx.problem(
            "robot_code",
            "a dingtalk bot needs its robot's code (usually the Client ID)",
        ));
    }
    if blank(&d.conversation_id) {
        return Err(cx.problem(
            "conversation_id",
            "a dingtalk bot needs the group's conversation id (cid…) that is [mesh].group",
        ));
    }
    Ok(())
}

/// A dingtalk bot's secret, read at start from the variable `client_secret_env` names.
#[derive(Clone)]
pub(crate) struct DingTalkSecrets {
    /// Client Secret: opens the Stream connection and gets access tokens.
    pub(crate) client_secret: String,
}

impl DingTalkSecrets {
    /// This node's DingTalk secret (read at start: [`NodeConfig::platform_secret`]).
    pub(crate) fn of(cfg: &NodeConfig) -> DingTalkSecrets {
        DingTalkSecrets {
            client_secret: cfg
                .platform_secret("client_secret_env")
                .unwrap_or_default()
                .to_string(),
        }
    }
}

impl std::fmt::Debug for DingTalkSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DingTalkSecrets").finish_non_exhaustive()
    }
}
