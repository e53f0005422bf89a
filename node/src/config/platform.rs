//! Chat platforms as the configuration sees them: by name, and each bot's
//! `[bots.<platform>]` tables as written, unread.
//!
//! The configuration knows no platform but `local` (the mesh itself). Every other
//! platform is an adapter that describes itself in its own folder — its table's
//! fields, their checks, its secrets (`platform/<name>/settings.rs`) — and is
//! registered with one line in `platform::registry`, which checks every bot's tables
//! against their adapters before anything binds. So that the one rule for the rest
//! of a bot's keys stays (an unknown key is an error naming it), a bot's tables are
//! taken out of the file before the typed read: a key of `[[bots]]` that is no field
//! of [`super::BotSettings`] and holds a table is a platform's table ([`take_tables`]).
//!
//! Secrets follow one convention for every platform: a table key ending in `_env`
//! names the environment variable holding a secret, which a node reads at start for
//! its own bot's platform (a variable that is named but not set is an error naming
//! the key) and hands to its adapter ([`super::NodeConfig::platform_secret`]).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::OnceLock;

use parking_lot::Mutex;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A chat platform, by the name peers.toml spells it with (`local`, `discord`, …):
/// also the prefix of a person's id in `[mesh] operators` and the name of a bot's
/// `[bots.<name>]` table. Whether an adapter by that name exists is
/// `platform::registry`'s to say.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Platform(&'static str);

impl Platform {
    /// The mesh is the chat: people post through the page or the local API.
    pub const LOCAL: Platform = Platform("local");

    /// The platform named `name` (adapters name their own as a constant).
    pub const fn named(name: &'static str) -> Platform {
        Platform(name)
    }

    /// The platform spelled `s`, from a file: its name kept for the node's life (one
    /// copy per distinct name, however often the file is read).
    pub(crate) fn parse(s: &str) -> Platform {
        static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
        let mut names = NAMES.get_or_init(Default::default).lock();
        if let Some(n) = names.get(s) {
            return Platform(n);
        }
        let n: &'static str = Box::leak(s.to_string().into_boxed_str());
        names.insert(n);
        Platform(n)
    }

    /// The name as written in peers.toml.
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl Default for Platform {
    fn default() -> Self {
        Platform::LOCAL
    }
}

impl fmt::Debug for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for Platform {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for Platform {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl Visitor<'_> for Name {
            type Value = Platform;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a platform name (local, feishu, discord, …)")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Platform, E> {
                let s = s.trim();
                if s.is_empty() || !s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                    return Err(E::custom(format!(
                        "{s:?} is not a platform name (lowercase letters, like \"discord\")"
                    )));
                }
                Ok(Platform::parse(s))
            }
        }
        d.deserialize_str(Name)
    }
}

/// A bot's platform tables as written (`[bots.discord]`, …), by platform name: read
/// by each platform's adapter, which knows their fields.
#[derive(Clone, Default)]
pub struct PlatformTables(pub(crate) BTreeMap<String, config::Value>);

impl PlatformTables {
    /// The table of `platform`, if the bot has one.
    pub(crate) fn get(&self, platform: &str) -> Option<&config::Value> {
        self.0.get(platform)
    }

    /// The platforms the bot has tables for.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

impl fmt::Debug for PlatformTables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// As written: so that `botmesh reload` compares a platform's keys like any other.
impl Serialize for PlatformTables {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, table) in &self.0 {
            let json = serde_json::Value::deserialize(table.clone())
                .map_err(|e| serde::ser::Error::custom(e.to_string()))?;
            map.serialize_entry(name, &json)?;
        }
        map.end()
    }
}

/// What an adapter's check of one bot's `[bots.<platform>]` table sees
/// (`platform::registry` runs every check before anything binds).
pub(crate) struct TableCheck<'a> {
    /// The whole file (colleagues' names and tables).
    pub(crate) settings: &'a super::Settings,
    /// The bot's index in `[[bots]]`.
    pub(crate) index: usize,
    /// The bot.
    pub(crate) bot: &'a super::BotSettings,
    /// The platform whose table this is.
    pub(crate) platform: Platform,
    /// The table as written; `None` when the bot is on this platform without one.
    pub(crate) table: Option<&'a config::Value>,
}

/// What is wrong with a platform table: the key below the table (`""`: the table
/// itself) and the problem, in words that say what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableProblem {
    /// The key below `bots[i].<platform>`.
    pub(crate) key: String,
    /// What is wrong.
    pub(crate) problem: String,
}

impl TableCheck<'_> {
    /// Whether the bot is on this table's platform (then the table must say
    /// everything its adapter needs; else it only gives the bot's ids there).
    pub(crate) fn own(&self) -> bool {
        self.bot.platform == self.platform
    }

    /// A problem at `key` of this table.
    pub(crate) fn problem(&self, key: &str, problem: impl Into<String>) -> TableProblem {
        TableProblem {
            key: key.to_string(),
            problem: problem.into(),
        }
    }

    /// The table read as `T` (its default when the bot has none); a value of the
    /// wrong type or an unknown key is a problem naming the key.
    pub(crate) fn read<T: serde::de::DeserializeOwned + Default>(&self) -> Result<T, TableProblem> {
        match self.table {
            None => Ok(T::default()),
            Some(t) => read_table(t),
        }
    }
}

/// `bots[i].<platform>.<key>` (or the table's own key when `key` is empty).
pub(crate) fn full_key(index: usize, platform: Platform, key: &str) -> String {
    if key.is_empty() {
        format!("bots[{index}].{platform}")
    } else {
        format!("bots[{index}].{platform}.{key}")
    }
}

/// A platform table read as `T`: the config crate's error, with the key it names
/// (relative to the table) lifted out.
pub(crate) fn read_table<T: serde::de::DeserializeOwned>(
    table: &config::Value,
) -> Result<T, TableProblem> {
    table.clone().try_deserialize().map_err(|e| {
        let text = e.to_string();
        let key = text
            .split("key `")
            .nth(1)
            .and_then(|s| s.split('`').next())
            .map(super::dotted_key)
            .unwrap_or_default();
        TableProblem { key, problem: text }
    })
}

/// The fields `T` reads (its `#[derive(Deserialize)]` names them): asked of a
/// deserializer that answers nothing but this question.
pub(crate) fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Ask(Option<&'static [&'static str]>);
    #[derive(Debug)]
    struct Answered;
    impl fmt::Display for Answered {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("field names asked")
        }
    }
    impl std::error::Error for Answered {}
    impl de::Error for Answered {
        fn custom<M: fmt::Display>(_: M) -> Self {
            Answered
        }
    }
    impl<'de> Deserializer<'de> for &mut Ask {
        type Error = Answered;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Answered> {
            Err(Answered)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Answered> {
            self.0 = Some(fields);
            Err(Answered)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut ask = Ask(None);
    let _ = T::deserialize(&mut ask);
    ask.0.unwrap_or(&[])
}

/// Takes every bot's platform tables out of `root` (the file with the environment
/// applied): in each `[[bots]]` entry, a key that is none of `fields` and holds a
/// table. Returns them by bot, in file order.
pub(crate) fn take_tables(
    root: &mut config::Value,
    fields: &[&str],
) -> Vec<BTreeMap<String, config::Value>> {
    let config::ValueKind::Table(top) = &mut root.kind else {
        return Vec::new();
    };
    let Some(config::Value {
        kind: config::ValueKind::Array(bots),
        ..
    }) = top.get_mut("bots")
    else {
        return Vec::new();
    };
    bots.iter_mut()
        .map(|bot| take_bot_tables(bot, fields))
        .collect()
}

/// Takes the platform tables out of one `[[bots]]` entry (see [`take_tables`]).
pub(crate) fn take_bot_tables(
    bot: &mut config::Value,
    fields: &[&str],
) -> BTreeMap<String, config::Value> {
    let config::ValueKind::Table(keys) = &mut bot.kind else {
        return BTreeMap::new();
    };
    let platform_keys: Vec<String> = keys
        .iter()
        .filter(|(k, v)| {
            !fields.contains(&k.as_str()) && matches!(v.kind, config::ValueKind::Table(_))
        })
        .map(|(k, _)| k.clone())
        .collect();
    platform_keys
        .into_iter()
        .filter_map(|k| keys.remove(&k).map(|v| (k, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Two {
        a: u32,
        #[serde(default)]
        b: Option<String>,
    }

    #[test]
    fn field_names_are_what_serde_derives() {
        assert_eq!(field_names::<Two>(), ["a", "b"]);
        assert!(field_names::<super::super::BotSettings>().contains(&"min_delay_ms"));
    }

    #[test]
    fn platform_tables_are_taken_out_and_other_keys_stay() {
        let text =
            "[[bots]]\nname = \"A\"\nplatform = \"discord\"\nagent = { webhook = \"http://x\" }\n\
                    [bots.discord]\nuser_id = \"1\"\n[bots.slack]\nuser_id = \"U1\"\n\
                    [[bots]]\nname = \"B\"\n";
        let mut root: config::Value = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .unwrap()
            .try_deserialize()
            .unwrap();
        let tables = take_tables(&mut root, &["name", "platform", "agent"]);
        assert_eq!(tables.len(), 2);
        assert_eq!(
            tables[0].keys().collect::<Vec<_>>(),
            ["discord", "slack"],
            "the agent table is a field"
        );
        assert!(tables[1].is_empty());
        let left = serde_json::Value::deserialize(root).unwrap();
        assert_eq!(left["bots"][0]["agent"]["webhook"], "http://x");
        assert!(left["bots"][0].get("discord").is_none());
    }

    #[test]
    fn names_are_kept_once_and_compare_by_name() {
        let a = Platform::parse("discord");
        let b = Platform::parse("discord");
        assert_eq!(a, b);
        assert!(std::ptr::eq(a.as_str(), b.as_str()), "one copy per name");
        assert_eq!(a, Platform::named("discord"));
        assert_eq!(Platform::default(), Platform::LOCAL);
    }
}
