//! `[bots.matrix]`: a Matrix bot user, its homeserver, the room it serves and the
//! access token it reads from the environment (the config layer's part of the Matrix
//! adapter; see docs/matrix.md).

use serde::Deserialize;

use crate::config::platform::{TableCheck, TableProblem};
use crate::config::{NodeConfig, Platform};

/// The platform, as peers.toml names it.
pub const MATRIX: Platform = Platform::named("matrix");

/// `[bots.matrix]` (see docs/matrix.md). A bot on another platform may hold one with
/// only `user_id`, so that Matrix colleagues recognise its account.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixSettings {
    /// The homeserver's client-server API base, `https://matrix.example.org` (the
    /// `/_matrix/client/v3/…` paths go below it).
    #[serde(default)]
    pub homeserver: Option<String>,
    /// The bot's Matrix user id, `@ada:example.org`: checked against `whoami` at
    /// start, and how colleagues, pills and `m.mentions` name this bot.
    #[serde(default)]
    pub user_id: Option<String>,
    /// Env var holding the bot user's access token, sent as `Authorization: Bearer`.
    /// Never the token itself: secrets stay out of the file.
    #[serde(default)]
    pub access_token_env: Option<String>,
    /// The room this bot serves (`!abc:example.org`); its group in the mesh is the
    /// room id. Joined at start when the bot is invited.
    #[serde(default)]
    pub room_id: Option<String>,
}

/// Whether `s` is a Matrix user id: `@localpart:server`, nothing blank.
pub fn is_user_id(s: &str) -> bool {
    s.strip_prefix('@')
        .and_then(|r| r.split_once(':'))
        .is_some_and(|(l, h)| !l.is_empty() && !h.is_empty() && !s.contains(char::is_whitespace))
}

/// Whether `s` is a room id: `!opaque:server`, or `!opaque` alone (room version 12
/// ids name no server); an alias, `#room:server`, is not one.
pub fn is_room_id(s: &str) -> bool {
    s.strip_prefix('!')
        .is_some_and(|r| !r.is_empty() && !r.starts_with(':') && !s.contains(char::is_whitespace))
}

/// This node's access token (read at start: `NodeConfig::platform_secret`).
pub(crate) fn access_token(cfg: &NodeConfig) -> anyhow::Result<String> {
    let token = crate::platform::kit::settings::secret(
        cfg,
        MATRIX,
        "access_token_env",
        "set it to the bot user's access token (like syt_…: see docs/matrix.md)",
    )?;
    if token.contains(char::is_whitespace) {
        anyhow::bail!(
            "bots[{}].matrix.access_token_env: the variable it names does not hold an access token (one word, like syt_…: see docs/matrix.md)",
            cfg.me
        );
    }
    Ok(token)
}

/// Checks bot `cx.bot`'s `[bots.matrix]`: well-formed ids and URL, and a user id no
/// earlier bot has, always; the homeserver, token variable, user and room when the
/// bot is on Matrix.
pub(crate) fn check(cx: &TableCheck<'_>) -> Result<(), TableProblem> {
    let s: MatrixSettings = crate::platform::kit::settings::read_table(
        cx,
        "homeserver, user_id, access_token_env, room_id",
    )?;
    if let Some(url) = &s.homeserver {
        crate::config::check_url(url.trim()).map_err(|p| cx.problem("homeserver", p))?;
    }
    if let Some(u) = &s.user_id {
        if !is_user_id(u.trim()) {
            return Err(cx.problem(
                "user_id",
                format!("{u:?} is not a Matrix user id (like \"@ada:example.org\")"),
            ));
        }
        let earlier = cx.settings.bots[..cx.index].iter().find(|o| {
            o.table::<MatrixSettings>(MATRIX)
                .and_then(|t| t.user_id)
                .as_deref()
                .map(str::trim)
                == Some(u.trim())
        });
        if let Some(other) = earlier {
            return Err(cx.problem(
                "user_id",
                format!("{u} is already the matrix.user_id of {}", other.name),
            ));
        }
    }
    if let Some(r) = &s.room_id {
        if !is_room_id(r.trim()) {
            return Err(cx.problem(
                "room_id",
                format!("{r:?} is not a room id (like \"!abc:example.org\" or \"!abc\"; an alias #room:… is not one: the room's settings show its id)"),
            ));
        }
    }
    if !cx.own() {
        return Ok(());
    }
    let blank = |v: &Option<String>| v.as_deref().is_none_or(|v| v.trim().is_empty());
    for (key, value, why) in [
        (
            "homeserver",
            &s.homeserver,
            "the homeserver's URL (https://matrix.example.org)",
        ),
        (
            "user_id",
            &s.user_id,
            "the bot's Matrix user id (checked against whoami at start)",
        ),
        (
            "access_token_env",
            &s.access_token_env,
            "the env var holding the bot user's access token",
        ),
        (
            "room_id",
            &s.room_id,
            "the id of the room it serves (its group in the mesh)",
        ),
    ] {
        if blank(value) {
            return Err(cx.problem(key, format!("a matrix bot needs {why}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(is_user_id("@ada:localhost"));
        assert!(is_user_id("@ada:example.org:8448"));
        assert!(!is_user_id("ada:localhost"));
        assert!(!is_user_id("@ada"));
        assert!(!is_user_id("@:x"));
        assert!(is_room_id("!abc:localhost"));
        assert!(!is_room_id("#room:localhost"));
        assert!(
            is_room_id("!8JVtag9M0vL4OXR2lADwMzhjSVVrzkoZJTMkZxFOJlo"),
            "room version 12"
        );
        assert!(!is_room_id("!"));
        assert!(!is_room_id("!a b:hs"));
    }
}
