//! Loading peers.toml, layered like zero-to-production's settings: the TOML file
//! first, then environment variables `BOTMESH__SECTION__KEY` (for example
//! `BOTMESH__MESH__MAX_DEPTH=5`), then `botmesh replay --set` overrides, then
//! validation (`validate.rs`). The config crate's errors are turned into a
//! [`ConfigError`] naming the key as the file writes it.

use std::collections::HashMap;
use std::path::Path;

use super::platform::{self, PlatformTables};
use super::{pick_bot, BotSettings, ConfigError, Settings};

impl Settings {
    /// Reads `path`, applies `BOTMESH__…` overrides from the process environment and validates.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        Self::load_with_env(path, &env)
    }

    /// Like [`Settings::load`] with an explicit environment (tests, no global state).
    pub fn load_with_env(path: &Path, env: &[(String, String)]) -> Result<Settings, ConfigError> {
        Self::load_layered(path, env, &[])
    }

    /// [`Settings::load_with_env`] with `KEY=VALUE` settings for bot `bot` on top
    /// (`botmesh replay --set`), read and validated exactly as the file is: a key
    /// without a dot is one of the bot's own (`min_relevance`), one with a dot a
    /// path from the top (`mesh.max_depth`). A value in `[…]` is a JSON list of
    /// strings (`skills=["rust","review"]`). An unknown key or a bad value is a
    /// [`ConfigError`] naming it.
    pub fn load_with_sets(
        path: &Path,
        env: &[(String, String)],
        bot: &str,
        sets: &[String],
    ) -> Result<Settings, ConfigError> {
        let plain = Self::load_layered(path, env, &[])?;
        if sets.is_empty() {
            return Ok(plain);
        }
        let (me, _) = pick_bot(&plain, bot)?;
        let mut overrides = Vec::new();
        for set in sets {
            let bad = |problem: &str| ConfigError {
                file: "--set".into(),
                key: set.clone(),
                problem: problem.into(),
            };
            let (key, value) = set
                .split_once('=')
                .ok_or_else(|| bad("expected KEY=VALUE"))?;
            let key = key.trim();
            if key.is_empty() || key.contains(['[', ']', ' ']) {
                return Err(bad("expected KEY=VALUE with a plain key"));
            }
            let path = if key.contains('.') {
                key.to_string()
            } else {
                format!("bots[{me}].{key}")
            };
            let value = if value.trim_start().starts_with('[') {
                let list: Vec<String> = serde_json::from_str(value)
                    .map_err(|e| bad(&format!("not a JSON list of strings: {e}")))?;
                config::Value::from(list)
            } else {
                config::Value::from(value)
            };
            overrides.push((path, value));
        }
        Self::load_layered(path, env, &overrides)
    }

    /// The file, then the environment, then `overrides` (config paths), validated.
    fn load_layered(
        path: &Path,
        env: &[(String, String)],
        overrides: &[(String, config::Value)],
    ) -> Result<Settings, ConfigError> {
        let file = path.display().to_string();
        if !path.exists() {
            return Err(ConfigError {
                file,
                key: "(file)".into(),
                problem: "file not found (pass --config PATH)".into(),
            });
        }
        let source: HashMap<String, String> = env
            .iter()
            .filter(|(k, _)| k.starts_with("BOTMESH__"))
            .cloned()
            .collect();
        // Read the text here rather than handing the config crate the path: it names
        // the file in its messages relative to the current directory (`in ../peers.toml`),
        // while every error of ours names the path the node was started with.
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            key: "(file)".into(),
            problem: format!("cannot read the file: {e}"),
        })?;
        let mut builder = config::Config::builder()
            .add_source(config::File::from_str(&text, config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix("BOTMESH")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true)
                    .source(Some(source)),
            );
        for (key, value) in overrides {
            builder = builder
                .set_override(key.as_str(), value.clone())
                .map_err(|e| from_config_error(&file, e))?;
        }
        let built = builder.build().map_err(|e| from_config_error(&file, e))?;
        let mut settings = Self::read(built, &file)?;
        settings.path = path.to_path_buf();
        settings.validate()?;
        Ok(settings)
    }

    /// Parses settings from a TOML string (tests and `explain` on inline configs).
    #[cfg(test)]
    pub(crate) fn from_toml(text: &str, path: &Path) -> Result<Settings, ConfigError> {
        let file = path.display().to_string();
        let built = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .map_err(|e| from_config_error(&file, e))?;
        let mut settings = Self::read(built, &file)?;
        settings.path = path.to_path_buf();
        settings.validate()?;
        Ok(settings)
    }

    /// The typed settings of `built`, each bot's platform tables kept as written
    /// ([`platform::take_tables`]).
    fn read(built: config::Config, file: &str) -> Result<Settings, ConfigError> {
        let mut root: config::Value = built
            .try_deserialize()
            .map_err(|e| from_config_error(file, e))?;
        let tables = platform::take_tables(&mut root, platform::field_names::<BotSettings>());
        let mut settings: Settings = root
            .try_deserialize()
            .map_err(|e| from_config_error(file, e))?;
        for (bot, tables) in settings.bots.iter_mut().zip(tables) {
            bot.tables = PlatformTables(tables);
        }
        Ok(settings)
    }
}

impl BotSettings {
    /// A bot entry from TOML lines (`name`, `bridge` and `api` are filled in when
    /// missing), with every default applied: for tests and tools.
    #[cfg(test)]
    pub(crate) fn from_toml(extra: &str) -> Result<BotSettings, config::ConfigError> {
        let mut text = String::from(extra);
        for (key, value) in [
            ("name", "\"A\""),
            ("bridge", "\"127.0.0.1:1\""),
            ("api", "\"127.0.0.1:2\""),
        ] {
            if !extra
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{key} ")))
            {
                text.push_str(&format!("\n{key} = {value}"));
            }
        }
        let mut value: config::Value = config::Config::builder()
            .add_source(config::File::from_str(&text, config::FileFormat::Toml))
            .build()?
            .try_deserialize()?;
        let tables = platform::take_bot_tables(&mut value, platform::field_names::<BotSettings>());
        let mut bot: BotSettings = value.try_deserialize()?;
        bot.tables = PlatformTables(tables);
        Ok(bot)
    }
}

fn from_config_error(file: &str, e: config::ConfigError) -> ConfigError {
    let mut text = e.to_string();
    // The config crate writes "... for key `mesh.max_depth` in ...": lift the key out.
    let raw_key = text
        .split("key `")
        .nth(1)
        .and_then(|s| s.split('`').next())
        .map(str::to_string);
    let key = match raw_key {
        Some(raw) => {
            let key = dotted_key(&raw);
            text = text.replace(&format!("`{raw}`"), &format!("`{key}`"));
            key
        }
        None => text
            .split("unknown field `")
            .nth(1)
            .and_then(|s| s.split('`').next())
            .map(|f| format!("{f} (unknown key)"))
            .unwrap_or_else(|| "(file)".into()),
    };
    ConfigError {
        file: file.into(),
        key,
        problem: text,
    }
}

/// The config crate joins an array index to the key after it without a dot
/// (`bots[1]feishu.app_id`); the key as written in the file is `bots[1].feishu.app_id`.
pub(crate) fn dotted_key(raw: &str) -> String {
    let mut key = String::with_capacity(raw.len() + 2);
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        key.push(c);
        if c == ']' && chars.peek().is_some_and(|&n| n != '.' && n != '[') {
            key.push('.');
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_key_leaves_well_formed_keys_alone() {
        assert_eq!(dotted_key("bots[1]feishu.app_id"), "bots[1].feishu.app_id");
        assert_eq!(dotted_key("bots[1].bridge"), "bots[1].bridge");
        assert_eq!(dotted_key("bots[0]aliases[2]"), "bots[0].aliases[2]");
        assert_eq!(dotted_key("a[0][1]b"), "a[0][1].b");
        assert_eq!(dotted_key("mesh.max_depth"), "mesh.max_depth");
        assert_eq!(dotted_key("bots[3]"), "bots[3]");
    }
}
