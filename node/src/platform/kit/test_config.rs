//! For adapters' unit tests: a peers.toml loaded as a node loads it, the environment
//! its secrets resolve from, and the check that every mistake in an adapter's table
//! is refused naming its key, and the peers.toml around an adapter's own tables. One
//! copy for every adapter's tests.

use std::collections::HashMap;
use std::path::Path;

use crate::config::{ConfigError, NodeConfig, Settings};

/// The mesh secret every test file's `[mesh] secret_env` names, and a valid value.
pub(crate) const MESH_SECRET: (&str, &str) =
    ("BOTMESH_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");

/// A peers.toml of mesh group `team` (its secret in [`MESH_SECRET`]) with one
/// `[[bots]]` table per `(name, rest)` of `bots`, in order: bridge on 127.0.0.1:7101,
/// 7102, …, local API on 8101, 8102, …, then `rest` (its `aliases`, `platform` and
/// platform table, as peers.toml lines; empty for a local bot). What a test writes is
/// then only what its adapter reads.
pub(crate) fn peers_toml(bots: &[(&str, &str)]) -> String {
    let mut toml = String::from("[mesh]\ngroup = \"team\"\nsecret_env = \"BOTMESH_SECRET\"\n");
    for (i, (name, rest)) in bots.iter().enumerate() {
        let (bridge, api) = (7101 + i, 8101 + i);
        toml.push_str(&format!(
            "\n[[bots]]\nname = \"{name}\"\nbridge = \"127.0.0.1:{bridge}\"\napi = \"127.0.0.1:{api}\"\n{}\n",
            rest.trim_matches('\n')
        ));
    }
    toml
}

/// `text` resolved for bot `bot` under `env` with its data in `data_dir` (both must be
/// valid): for an adapter that keeps a file there.
pub(crate) fn node_config_in(
    text: &str,
    bot: &str,
    data_dir: &Path,
    env: &HashMap<String, String>,
) -> NodeConfig {
    NodeConfig::resolve(
        settings(text).unwrap(),
        bot,
        Some(data_dir.to_path_buf()),
        env,
    )
    .unwrap()
}

/// `text` with the file's own checks, then the platforms' (as a node loads it).
pub(crate) fn settings(text: &str) -> Result<Settings, ConfigError> {
    Settings::from_toml(text, Path::new("peers.toml"))
        .and_then(|s| crate::platform::registry::check(&s).map(|()| s))
}

/// An environment holding the mesh secret and `vars`.
pub(crate) fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
    std::iter::once(&MESH_SECRET)
        .chain(vars)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `text` resolved for bot `bot` under `env` (both must be valid).
pub(crate) fn node_config(text: &str, bot: &str, env: &HashMap<String, String>) -> NodeConfig {
    NodeConfig::resolve(settings(text).unwrap(), bot, None, env).unwrap()
}

/// Asserts that each mistake — `from` (which `text` must contain) replaced once by
/// `to` — is refused with `key` as the error's key and named in its message.
#[track_caller]
pub(crate) fn assert_mistakes_named(text: &str, mistakes: &[(&str, &str, &str)]) {
    for (from, to, key) in mistakes {
        assert!(text.contains(from), "{from}");
        let e = settings(&text.replacen(from, to, 1)).unwrap_err();
        assert_eq!(e.key, *key, "{from:?} → {to:?}: {e}");
        assert!(e.to_string().contains(key), "the error names the key: {e}");
    }
}

/// What goes wrong when bot `bot` of `text` starts with only the mesh secret set: the
/// resolving error, or else `build`'s (an adapter that reads its secret itself).
pub(crate) fn error_without_secrets<T>(
    text: &str,
    bot: &str,
    build: impl FnOnce(&NodeConfig) -> anyhow::Result<T>,
) -> String {
    match NodeConfig::resolve(settings(text).unwrap(), bot, None, &env(&[])) {
        Ok(cfg) => match build(&cfg) {
            Ok(_) => panic!("{bot} started without its secrets"),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    }
}
