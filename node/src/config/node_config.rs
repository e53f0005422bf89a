//! [`NodeConfig`]: the one bot a node runs, picked from the validated file, with its
//! secrets read (`secrets.rs`) and its signer and verifier built.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::secrets::{
    agent_env, api_tokens, hmac_secrets, llm_keys, mcp_headers, own_signing_key, platform_secrets,
    redis_url, signer_and_verifier,
};
use super::{
    a2a, names, AgentEngine, ApiTokens, BotSettings, ConfigError, MeshSettings, PlatformSecrets,
    SecretSource, Settings, Transport,
};
use crate::wire::signing::{Signer, Verifier};

/// Everything one running node needs: the validated file plus its own secrets.
#[derive(Clone)]
pub struct NodeConfig {
    /// The validated peers.toml.
    pub settings: Settings,
    /// Index of this node's bot in `settings.bots`.
    pub(crate) me: usize,
    /// Signs what this node sends.
    pub(crate) signer: Signer,
    /// Verifies what peers send.
    pub(crate) verifier: Verifier,
    /// This node's data folder.
    pub(crate) data_dir: PathBuf,
    /// The local API's bearer tokens (none configured: open, on loopback only).
    pub(crate) api_tokens: ApiTokens,
    /// Peer-facing listener address.
    pub bridge_addr: SocketAddr,
    /// Local API listener address.
    pub api_addr: SocketAddr,
    /// LLM API keys read from the variables `[llm]` names, by variable name.
    pub(crate) llm_keys: HashMap<String, String>,
    /// The secrets of this bot's platform, by the key of its table that names each
    /// variable (`token_env` → the token): see [`PlatformSecrets`].
    pub(crate) platform_secrets: PlatformSecrets,
    /// The Redis server's URL, when this bot's transport is `redis`.
    pub(crate) redis_url: Option<String>,
    /// The headers of this bot's HTTP MCP servers, by server name: `(header, value)`
    /// read from the variables `headers_env` names.
    pub(crate) mcp_headers: HashMap<String, Vec<(String, String)>>,
    /// The ACP agent's variables taken from the node's environment (`agent.env_from`),
    /// by the agent's name for them.
    pub(crate) agent_env: std::collections::BTreeMap<String, String>,
    /// The A2A callers of this bot (`a2a.callers`) with their tokens, read at start.
    pub(crate) a2a_callers: Vec<a2a::A2aCaller>,
    /// The token this bot presents to its remote A2A agent (`agent.token_env`).
    pub(crate) a2a_agent_token: Option<String>,
    /// `settings.bots` by name and by what each name and alias reads as: every
    /// received envelope looks its sender up, and a person's its author, so the
    /// lookups must not walk the roster (nor normalise every bot's name) each time.
    names: BotNames,
}

/// The roster's indexes (see [`NodeConfig::set_settings`] for keeping them current).
#[derive(Debug, Clone, Default)]
struct BotNames {
    /// Exact name → index in `settings.bots`.
    exact: HashMap<String, usize>,
    /// [`names::name_key`] of every name and alias → the first bot (in file order)
    /// that has it; empty keys are left out (they read as nobody).
    keys: HashMap<String, usize>,
}

impl BotNames {
    fn of(bots: &[BotSettings]) -> BotNames {
        let mut n = BotNames::default();
        for (i, b) in bots.iter().enumerate() {
            n.exact.entry(b.name.clone()).or_insert(i);
            for handle in std::iter::once(&b.name).chain(&b.aliases) {
                let key = names::name_key(handle);
                if !key.is_empty() {
                    n.keys.entry(key).or_insert(i);
                }
            }
        }
        n
    }
}
impl std::fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConfig")
            .field("bot", &self.bot().name)
            .field("data_dir", &self.data_dir)
            .field("bridge_addr", &self.bridge_addr)
            .field("api_addr", &self.api_addr)
            .finish_non_exhaustive()
    }
}
impl NodeConfig {
    /// Picks bot `name`, reads its secrets and builds its signer and verifier.
    pub fn resolve(
        settings: Settings,
        name: &str,
        data_dir: Option<PathBuf>,
        env: &dyn SecretSource,
    ) -> Result<NodeConfig, ConfigError> {
        Self::build(settings, name, data_dir, env, true)
    }

    /// Like [`NodeConfig::resolve`] but without reading signing secrets: for tools that
    /// only reason about the configuration (`botmesh explain`), never for a running node.
    pub fn without_secrets(
        settings: Settings,
        name: &str,
        env: &dyn SecretSource,
    ) -> Result<NodeConfig, ConfigError> {
        Self::build(settings, name, None, env, false)
    }

    /// The one constructor behind [`NodeConfig::resolve`] and
    /// [`NodeConfig::without_secrets`]: every secret is read, and every missing one is
    /// an error, only with `secrets`.
    fn build(
        settings: Settings,
        name: &str,
        data_dir: Option<PathBuf>,
        env: &dyn SecretSource,
        secrets: bool,
    ) -> Result<NodeConfig, ConfigError> {
        let (me, bot) = pick_bot(&settings, name)?;
        let at = |k: &str| format!("bots[{me}].{k}");
        let (hmac, verify_hmac) = hmac_secrets(&settings, env, secrets)?;
        let own = own_signing_key(&settings, &bot, &at, env, secrets)?;
        let (signer, verifier) = signer_and_verifier(&settings, &bot, own, hmac, verify_hmac);
        let api_addr: SocketAddr = bot.api.parse().expect("validated");
        let bridge_addr: SocketAddr = bot.bridge.parse().expect("validated");
        let api_tokens = api_tokens(&settings, &bot, api_addr, &at, env, secrets)?;
        let llm_keys = llm_keys(&settings, env, secrets)?;
        let platform_secrets = platform_secrets(&settings, me, &bot, env, secrets)?;
        let redis_url = redis_url(&settings, &bot, env, secrets)?;
        let mcp_headers = mcp_headers(&settings, me, &bot, env, secrets)?;
        let agent_env = agent_env(&settings, me, &bot, env, secrets)?;
        let a2a_callers = match &bot.a2a {
            Some(serve) => a2a::read_callers(serve, &|v| env.var(v), secrets)
                .map_err(|(key, problem)| settings.err(at(&format!("a2a.{key}")), problem))?,
            None => Vec::new(),
        };
        let a2a_agent_token = match &bot.agent {
            Some(AgentEngine::A2a(a)) => match &a.token_env {
                Some(var) => match env.var(var).filter(|t| !t.trim().is_empty()) {
                    Some(t) => Some(t),
                    None if secrets => {
                        return Err(settings.err(
                            at("agent.token_env"),
                            format!("environment variable {var} is not set or empty (the remote agent's bearer token is read from it)"),
                        ))
                    }
                    None => None,
                },
                None => None,
            },
            _ => None,
        };
        let data_dir =
            data_dir.unwrap_or_else(|| settings.relative(&settings.mesh.data_dir).join(&bot.name));
        Ok(NodeConfig {
            names: BotNames::of(&settings.bots),
            a2a_callers,
            a2a_agent_token,
            redis_url,
            mcp_headers,
            agent_env,
            settings,
            me,
            signer,
            verifier,
            data_dir,
            api_tokens,
            bridge_addr,
            api_addr,
            llm_keys,
            platform_secrets,
        })
    }

    /// The value of the secret variable that key `key` (`token_env`) of this bot's
    /// platform table names, read at start.
    pub(crate) fn platform_secret(&self, key: &str) -> Option<&str> {
        self.platform_secrets.get(key)
    }

    /// This node's own bot entry.
    pub fn bot(&self) -> &BotSettings {
        &self.settings.bots[self.me]
    }

    /// Every other bot of the mesh.
    pub(crate) fn peers(&self) -> impl Iterator<Item = &BotSettings> {
        self.settings
            .bots
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != self.me)
            .map(|(_, b)| b)
    }

    /// How this node's envelopes travel.
    pub(crate) fn transport(&self) -> Transport {
        self.settings.transport_of(self.bot())
    }

    /// Whether `peer` is reached through the Redis stream rather than by HTTP: only
    /// when both ends are on `redis`.
    pub(crate) fn via_stream(&self, peer: &BotSettings) -> bool {
        self.transport() == Transport::Redis && self.settings.transport_of(peer) == Transport::Redis
    }

    /// Replaces the settings (a reload) and the roster's indexes with them.
    pub(crate) fn set_settings(&mut self, settings: Settings) {
        self.names = BotNames::of(&settings.bots);
        self.settings = settings;
    }

    /// The bot called exactly `name`.
    pub(crate) fn member(&self, name: &str) -> Option<&BotSettings> {
        let i = *self.names.exact.get(name)?;
        self.settings.bots.get(i)
    }

    /// The bot whose name or one of whose aliases `name` reads as (compared by
    /// [`names::name_key`]: case, width and invisible characters aside): a person may
    /// not post under it.
    pub(crate) fn bot_named_like(&self, name: &str) -> Option<&BotSettings> {
        let i = *self.names.keys.get(&names::name_key(name))?;
        self.settings.bots.get(i)
    }

    /// Mesh settings shortcut.
    pub(crate) fn mesh(&self) -> &MeshSettings {
        &self.settings.mesh
    }

    /// Delay before the first retry.
    pub(crate) fn retry_base(&self) -> Duration {
        Duration::from_millis(self.mesh().retry_base_ms)
    }
}

/// Bot `name`'s index and entry of a [`NodeConfig::build`]; an unknown name is an
/// error listing the file's bots.
pub(crate) fn pick_bot(
    settings: &Settings,
    name: &str,
) -> Result<(usize, BotSettings), ConfigError> {
    let (me, bot) = settings.bot(name).ok_or_else(|| {
        let known: Vec<&str> = settings.bots.iter().map(|b| b.name.as_str()).collect();
        settings.err(
            "--bot",
            format!(
                "unknown bot {name:?}; this file lists: {}",
                known.join(", ")
            ),
        )
    })?;
    Ok((me, bot.clone()))
}

#[cfg(test)]
mod tests {
    use super::{NodeConfig, Settings};
    use std::collections::HashMap;

    /// A two-bot peers.toml (shared secret) with these `aliases` lines.
    fn settings(xiaoba: &str, mira: &str) -> Settings {
        let text = format!(
            "[mesh]\ngroup = \"team\"\nsecret_env = \"S\"\n\n\
             [[bots]]\nname = \"XiaoBa\"\nbridge = \"127.0.0.1:7101\"\napi = \"127.0.0.1:8101\"\n{xiaoba}\n\n\
             [[bots]]\nname = \"Mira\"\nbridge = \"127.0.0.1:7102\"\napi = \"127.0.0.1:8102\"\n{mira}\n"
        );
        Settings::from_toml(&text, std::path::Path::new("peers.toml")).unwrap()
    }

    #[test]
    fn the_roster_is_looked_up_by_name_and_by_what_a_name_reads_as_and_follows_a_reload() {
        let env: HashMap<String, String> = [(
            "S".to_string(),
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string(),
        )]
        .into();
        let mut cfg = NodeConfig::resolve(
            settings("aliases = [\"小八\", \"eight\"]", "aliases = [\"Mi\"]"),
            "Mira",
            None,
            &env,
        )
        .unwrap();
        assert_eq!(
            cfg.member("XiaoBa").map(|b| b.name.as_str()),
            Some("XiaoBa")
        );
        assert!(cfg.member("xiaoba").is_none(), "a sender is named exactly");
        let like = |cfg: &NodeConfig, n: &str| cfg.bot_named_like(n).map(|b| b.name.clone());
        // Case, full width and an invisible joiner aside.
        assert_eq!(like(&cfg, "ｘｉａｏｂａ").as_deref(), Some("XiaoBa"));
        assert_eq!(like(&cfg, "Xiao\u{200d}Ba").as_deref(), Some("XiaoBa"));
        assert_eq!(like(&cfg, "Eight").as_deref(), Some("XiaoBa"));
        assert_eq!(like(&cfg, " 小八 ").as_deref(), Some("XiaoBa"));
        assert_eq!(like(&cfg, "mira").as_deref(), Some("Mira"));
        assert_eq!(like(&cfg, "MI").as_deref(), Some("Mira"));
        assert_eq!(like(&cfg, "alice"), None);
        assert_eq!(
            like(&cfg, "\u{200b}"),
            None,
            "a name that reads as nothing is nobody's"
        );
        // A reload's new aliases are what the lookups see.
        cfg.set_settings(settings("", "aliases = [\"EIGHT\"]"));
        assert_eq!(like(&cfg, "eight").as_deref(), Some("Mira"));
        assert_eq!(like(&cfg, "小八"), None);
    }
}
