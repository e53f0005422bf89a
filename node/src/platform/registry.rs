//! The adapters, one line each: what every platform is called, what it shows to
//! whom, how its `[bots.<name>]` tables are checked and how its adapter is built.
//!
//! An adapter describes itself in its own folder — its settings, their checks and
//! its secrets in `settings.rs` (the config layer's part), its [`Adapter`] entry next
//! to its code — and is registered here with one line. [`check`] runs every
//! platform's checks over a file before anything binds: the configuration itself
//! knows no platform but `local` (`config::platform`).

use std::sync::Arc;
use std::time::Duration;

use crate::config::platform::{full_key, TableCheck, TableProblem};
use crate::config::{BotSettings, ConfigError, NodeConfig, Platform, Settings};
use crate::platform::{ChatPlatform, Visibility};

/// One platform's adapter, as the node knows it before building it.
pub struct Adapter {
    /// Its name in peers.toml (`platform = "…"`, `[bots.…]`, operators' prefix).
    pub(crate) platform: Platform,
    /// What it shows to whom (DESIGN.md's table).
    pub(crate) visibility: Visibility,
    /// What it can do besides posting (edit a post, show typing).
    pub(crate) abilities: Abilities,
    /// Checks one bot's table: that of a bot on this platform (`cx.table` is `None`
    /// when it has none) or a colleague's, which gives its ids here.
    pub(crate) check: fn(&TableCheck<'_>) -> Result<(), TableProblem>,
    /// The ids this platform's mentions name a bot by (Feishu: its open_id), from the
    /// bot's table: the mention matcher knows every member by them.
    /// [`no_member_ids`] for a platform whose mentions the adapter resolves itself.
    pub(crate) member_ids: fn(&BotSettings) -> Vec<String>,
    /// Builds the adapter for this node's bot (its table checked, its secrets read).
    pub(crate) build: fn(&NodeConfig) -> anyhow::Result<Arc<dyn ChatPlatform>>,
}

/// What a platform can do besides posting, for a long turn's status message and its
/// typing signal ([`ChatPlatform::edits`], [`ChatPlatform::typing_every`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abilities {
    /// A posted message can be changed ([`ChatPlatform::edit`]): a status message is
    /// then edited in place; where not, one is posted at most and never changed.
    pub(crate) edits: bool,
    /// How often the typing signal must be sent again to stay on ([`ChatPlatform::typing`]
    /// shows it once; it fades by itself); `None` when the platform has none.
    pub(crate) typing_every: Option<Duration>,
}

impl Abilities {
    /// Posts only: no edit, no typing signal (local, DingTalk, QQ, WeCom).
    pub(crate) const POSTS_ONLY: Abilities = Abilities {
        edits: false,
        typing_every: None,
    };
    /// Edits its posts; no typing signal (Slack, Feishu).
    pub(crate) const EDITS: Abilities = Abilities {
        edits: true,
        typing_every: None,
    };

    /// Edits its posts and shows typing, sent again every `every` (Discord, Telegram,
    /// Matrix).
    pub(crate) const fn edits_and_typing_every(every: Duration) -> Abilities {
        Abilities {
            edits: true,
            typing_every: Some(every),
        }
    }
}

/// Every platform a bot may be on.
static ADAPTERS: &[&Adapter] = &[
    &super::local::ADAPTER,
    &super::feishu::ADAPTER,
    &super::discord::ADAPTER,
    &super::dingtalk::ADAPTER,
    &super::slack::ADAPTER,
    &super::telegram::ADAPTER,
    &super::onebot::ADAPTER,
    &super::wecom::ADAPTER,
    &super::matrix::ADAPTER,
];

/// The adapter of `platform`, if there is one.
pub(crate) fn adapter(platform: Platform) -> Option<&'static Adapter> {
    ADAPTERS.iter().copied().find(|a| a.platform == platform)
}

/// The platforms' names, for errors.
fn names() -> String {
    ADAPTERS
        .iter()
        .map(|a| a.platform.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks what of `settings` only the platforms know: every bot's platform exists,
/// every `[bots.<name>]` table names a platform and passes its adapter's check, and
/// every `[mesh] operators` entry names a platform. The first problem is the error,
/// naming its key.
pub fn check(settings: &Settings) -> Result<(), ConfigError> {
    for (i, entry) in settings.mesh.operators.iter().flatten().enumerate() {
        let platform = entry.split_once(':').map_or("", |(p, _)| p);
        // `a2a:<caller>`: an A2A caller of a served bot (docs/a2a.md), not a platform.
        let a2a_caller = entry.starts_with(crate::config::a2a::CALLER_PREFIX);
        if !a2a_caller && adapter(Platform::parse(platform)).is_none() {
            return Err(settings.err(
                format!("mesh.operators[{i}]"),
                format!(
                    "{entry:?}: unknown platform {platform:?} (one of {})",
                    names()
                ),
            ));
        }
    }
    for (i, bot) in settings.bots.iter().enumerate() {
        if adapter(bot.platform).is_none() {
            return Err(settings.err(
                format!("bots[{i}].platform"),
                format!(
                    "unknown platform {:?} (one of {})",
                    bot.platform.as_str(),
                    names()
                ),
            ));
        }
        for name in bot.tables.names() {
            if adapter(Platform::parse(name)).is_none() {
                return Err(settings.err(
                    format!("bots[{i}].{name}"),
                    format!(
                        "unknown key: neither a bot setting nor a platform's table (platforms: {})",
                        names()
                    ),
                ));
            }
        }
        for a in ADAPTERS {
            let table = bot.tables.get(a.platform.as_str());
            if table.is_none() && bot.platform != a.platform {
                continue;
            }
            let cx = TableCheck {
                settings,
                index: i,
                bot,
                platform: a.platform,
                table,
            };
            (a.check)(&cx).map_err(|p| {
                let key = full_key(i, a.platform, &p.key);
                let problem = if p.key.is_empty() {
                    p.problem
                } else {
                    p.problem
                        .replace(&format!("`{}`", p.key), &format!("`{key}`"))
                };
                settings.err(key, problem)
            })?;
        }
    }
    Ok(())
}

/// What a platform of this kind shows to whom, without building its adapter (for the
/// peers' platforms). An unknown platform (never past [`check`]) shows nothing.
pub(crate) fn visibility_of(platform: Platform) -> Visibility {
    adapter(platform).map_or(
        Visibility {
            humans_reach_every_bot: false,
            bots_see_bots: false,
        },
        |a| a.visibility,
    )
}

/// A platform whose mentions name bots by no id of their own table.
pub(crate) fn no_member_ids(_bot: &BotSettings) -> Vec<String> {
    Vec::new()
}

/// The ids every platform's mentions name `bot` by ([`Adapter::member_ids`]).
pub fn member_ids(bot: &BotSettings) -> Vec<String> {
    ADAPTERS.iter().flat_map(|a| (a.member_ids)(bot)).collect()
}

/// The mesh's bots as the mention matcher knows them: names, aliases and every
/// platform's ids ([`member_ids`]).
pub(crate) fn roster(bots: &[BotSettings]) -> Vec<crate::turn::mention::Member> {
    crate::turn::roster_with(bots, member_ids)
}

/// The adapter for this node's bot.
pub(crate) fn build(cfg: &NodeConfig) -> anyhow::Result<Arc<dyn ChatPlatform>> {
    check(&cfg.settings)?;
    let platform = cfg.bot().platform;
    let a = adapter(platform).ok_or_else(|| anyhow::anyhow!("unknown platform {platform}"))?;
    (a.build)(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The file's own checks, then the platforms'.
    fn load(text: &str) -> Result<Settings, ConfigError> {
        Settings::from_toml(text, Path::new("peers.toml")).and_then(|s| check(&s).map(|()| s))
    }

    const TWO: &str = "[mesh]\nsecret_env = \"BOTMESH_SECRET\"\n\
                       [[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:1\"\napi = \"127.0.0.1:2\"\n\
                       [[bots]]\nname = \"B\"\nbridge = \"127.0.0.1:3\"\napi = \"127.0.0.1:4\"\n";

    #[test]
    fn errors_in_a_platform_table_name_the_key_with_its_dots() {
        let toml = format!("{TWO}[bots.feishu]\napp_id = [\"cli_x\"]\n");
        let e = load(&toml).unwrap_err();
        assert_eq!(e.key, "bots[1].feishu.app_id", "{e}");
        assert!(e.problem.contains("`bots[1].feishu.app_id`"), "{e}");
        assert!(!e.to_string().contains("]feishu"), "{e}");

        let unknown = toml.replace("app_id = [\"cli_x\"]", "app_idd = \"cli_x\"");
        let e = load(&unknown).unwrap_err();
        assert_eq!(e.key, "bots[1].feishu", "{e}");
        assert!(e.problem.contains("unknown field `app_idd`"), "{e}");
    }

    /// The ids a platform's mentions name a bot by come from that platform's entry:
    /// Feishu's open_id from the bot's `[bots.feishu]`, nothing for a bot without one.
    #[test]
    fn member_ids_come_from_each_platforms_table() {
        let settings = load(&format!("{TWO}[bots.feishu]\nopen_id = \"ou_b\"\n")).unwrap();
        assert_eq!(member_ids(&settings.bots[1]), ["ou_b"]);
        assert!(member_ids(&settings.bots[0]).is_empty());
        let members = roster(&settings.bots);
        assert_eq!(members[1].open_ids, ["ou_b"]);
        assert!(members[0].open_ids.is_empty());
    }

    #[test]
    fn unknown_platforms_and_tables_are_named() {
        let e = load(&TWO.replace("name = \"B\"", "name = \"B\"\nplatform = \"irc\"")).unwrap_err();
        assert_eq!(e.key, "bots[1].platform", "{e}");
        assert!(e.problem.contains("unknown platform \"irc\""), "{e}");
        for a in ADAPTERS {
            assert!(e.problem.contains(a.platform.as_str()), "{e}");
        }

        let e = load(&format!("{TWO}[bots.discrod]\nuser_id = \"1\"\n")).unwrap_err();
        assert_eq!(e.key, "bots[1].discrod", "{e}");
        assert!(
            e.problem.contains("neither a bot setting nor a platform"),
            "{e}"
        );

        // A scalar typo is still the file's own error.
        let e = load(&TWO.replace("name = \"B\"", "name = \"B\"\nmin_dalay_ms = 5")).unwrap_err();
        assert!(e.problem.contains("unknown field `min_dalay_ms`"), "{e}");

        let e = load(&format!("{TWO}[bots.local]\nx = 1\n")).unwrap_err();
        assert_eq!(e.key, "bots[1].local", "{e}");
    }

    #[test]
    fn operators_name_a_platform() {
        let ops = |list: &str| TWO.replace("[mesh]\n", &format!("[mesh]\noperators = {list}\n"));
        let ok = load(&ops(
            r#"["local:Boss", "discord:5005", "feishu:ou_1", "dingtalk:m1"]"#,
        ))
        .expect("valid");
        assert_eq!(ok.mesh.operators.as_ref().map(Vec::len), Some(4));
        let e = load(&ops(r#"["local:Boss", "irc:U1"]"#)).unwrap_err();
        assert_eq!(e.key, "mesh.operators[1]", "{e}");
        assert!(e.problem.contains("unknown platform \"irc\""), "{e}");
    }

    #[test]
    fn every_adapter_is_registered_once_and_local_is_one() {
        let mut names: Vec<&str> = ADAPTERS.iter().map(|a| a.platform.as_str()).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a platform registered twice");
        assert!(adapter(Platform::LOCAL).is_some());
        assert!(!visibility_of(Platform::LOCAL).humans_reach_every_bot);
    }

    /// Every registered platform is found by its name, with what it declares.
    #[test]
    fn every_adapter_is_found_by_its_platform() {
        for a in ADAPTERS {
            let found = adapter(Platform::parse(a.platform.as_str())).expect("registered");
            assert!(std::ptr::eq(found, *a), "{}", a.platform);
            assert_eq!(visibility_of(a.platform), a.visibility, "{}", a.platform);
        }
    }
}
