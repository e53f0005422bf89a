//! peers.toml: the one file that describes the whole mesh.
//!
//! Loading is layered like zero-to-production's settings: the TOML file first, then
//! environment variables `BOTMESH__SECTION__KEY` (for example
//! `BOTMESH__MESH__MAX_DEPTH=5`), then validation. Every mistake is reported as a
//! [`ConfigError`] that names the key and the problem, before any port is bound.
//!
//! Secrets never live in the file: it names the environment variables or key files
//! that hold them, and [`NodeConfig::resolve`] reads them for the one bot being run.
//!
//! One file per concern: `schema` (the typed settings and what each is for), `load`
//! (file → environment → overrides), `validate` (the checks, naming the key),
//! `secrets` (reading the variables and key files the file names), `node_config`
//! (the one bot a node runs, with its secrets); `platform` (each bot's platform
//! tables, checked by their adapters), `names`, `pacing`, `reload`, and the agents'
//! settings (`acp`, `a2a`).

pub(crate) use load::dotted_key;
pub(crate) use node_config::pick_bot;
pub use node_config::NodeConfig;
pub use platform::{Platform, PlatformTables};
pub use schema::{
    AgentEngine, AgentSettings, BotSettings, ExternalAgent, JudgeMode, LlmOverride, LlmSettings,
    McpServerSettings, MeshSettings, OverBudget, Participation, RedisSettings, ReplyTo, Settings,
    Transport,
};
pub use secrets::{ApiTokens, PlatformSecrets, ProcessEnv, SecretSource};
pub(crate) use validate::{check_url, parse_utc_offset};

pub mod a2a;
pub mod acp;
mod load;
pub(crate) mod names;
mod node_config;
pub(crate) mod pacing;
pub(crate) mod platform;
pub(crate) mod reload;
mod schema;
mod secrets;
mod validate;

/// A configuration problem, always naming the key it is about.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{file}: {key}: {problem}")]
pub struct ConfigError {
    /// The file the problem was found in (or "environment").
    pub(crate) file: String,
    /// The key, e.g. `bots[1].bridge` or `mesh.secret_env`.
    pub(crate) key: String,
    /// What is wrong, in words an operator can act on.
    pub(crate) problem: String,
}
