//! Reading one bot's secrets: the file names the environment variables or key files
//! that hold them (`*_env`, `*_file`), never the values. With `secrets` (a running
//! node) every one named must be there; without (`botmesh explain`) the ones set are
//! read. A missing or malformed secret is a [`ConfigError`] naming its key.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;

use super::{AgentEngine, BotSettings, ConfigError, Settings, Transport};
use crate::wire::signing::{HmacSecret, PairwiseKey, PublicKey, Signer, SigningKey, Verifier};

/// The secrets of a node's own platform, read at start from the variables its
/// `[bots.<platform>]` table names (every key ending in `_env`), by that key.
#[derive(Clone, Default)]
pub struct PlatformSecrets(BTreeMap<String, String>);

impl PlatformSecrets {
    /// The value of the variable that table key `key` names, if it names one.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

impl std::fmt::Debug for PlatformSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys only: never a secret's value.
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// Reads the secrets of bot `me`'s own platform (none without `secrets`): each
/// string under a key ending in `_env` of its `[bots.<platform>]` table names a
/// variable, which must be set.
pub(super) fn platform_secrets(
    settings: &Settings,
    me: usize,
    bot: &BotSettings,
    env: &dyn SecretSource,
    secrets: bool,
) -> Result<PlatformSecrets, ConfigError> {
    let mut out = BTreeMap::new();
    let table = bot.tables.get(bot.platform.as_str());
    let Some(config::ValueKind::Table(keys)) = table.map(|t| &t.kind) else {
        return Ok(PlatformSecrets(out));
    };
    if !secrets {
        return Ok(PlatformSecrets(out));
    }
    for (key, value) in keys {
        if !key.ends_with("_env") {
            continue;
        }
        let Ok(var) = value.clone().into_string() else {
            continue;
        };
        if var.trim().is_empty() {
            continue;
        }
        let value = env.var(var.trim()).ok_or_else(|| {
            settings.err(
                format!("bots[{me}].{}.{key}", bot.platform),
                format!("environment variable {var} is not set"),
            )
        })?;
        out.insert(key.clone(), value);
    }
    Ok(PlatformSecrets(out))
}

/// Where to read a secret's value from.
pub trait SecretSource {
    /// The value of an environment variable, if set.
    fn var(&self, name: &str) -> Option<String>;
}

/// Reads secrets from the process environment.
pub struct ProcessEnv;

impl SecretSource for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }
}

impl SecretSource for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// The signer and verifier of a [`crate::config::NodeConfig::build`]: the HMAC secrets, this bot's
/// own key, every bot's listed public keys, and the pairwise keys with every other
/// key-holding bot (signing.rs): this bot's key for what it sends to each, and one per
/// listed key of each for what it receives.
pub(super) fn signer_and_verifier(
    settings: &Settings,
    bot: &BotSettings,
    own: Vec<SigningKey>,
    hmac: Vec<HmacSecret>,
    verify_hmac: Vec<HmacSecret>,
) -> (Signer, Verifier) {
    let mut sending = HashMap::new();
    let mut receiving = HashMap::new();
    let mut ed = HashMap::new();
    for b in &settings.bots {
        let keys: Vec<PublicKey> = b
            .public_key
            .iter()
            .chain(b.previous_public_keys.iter())
            .map(|k| PublicKey::parse(k).expect("validated"))
            .collect();
        if let (Some(mine), false) = (own.first(), b.name == bot.name) {
            // `keys` starts with the current `public_key`, when there is one.
            let current = keys.first().filter(|_| b.public_key.is_some());
            if let Some(k) =
                current.and_then(|pk| PairwiseKey::sending(mine, &bot.name, pk, &b.name))
            {
                sending.insert(b.name.clone(), k);
            }
            let from: Vec<PairwiseKey> = keys
                .iter()
                .filter_map(|pk| PairwiseKey::receiving(mine, &bot.name, pk, &b.name))
                .collect();
            if !from.is_empty() {
                receiving.insert(b.name.clone(), from);
            }
        }
        if !keys.is_empty() {
            ed.insert(b.name.clone(), keys);
        }
    }
    let signer = Signer {
        hmac,
        ed25519: own,
        pairwise: sending,
    };
    let verifier = Verifier {
        hmac: verify_hmac,
        ed25519: ed,
        pairwise: receiving,
    };
    (signer, verifier)
}

/// The local API's bearer tokens: the operator's (`[mesh] api_token_env`, every
/// endpoint) and this bot's sidecar's (`[[bots]] api_token_env`, posts as the bot and
/// reads). Holds no token when none is configured; then the API is open, which
/// [`api_tokens`] allows on loopback only.
#[derive(Clone, Default)]
pub struct ApiTokens {
    /// The operator's token: every endpoint.
    pub(crate) operator: Option<String>,
    /// The sidecar's token: post as this bot and read; not quiet or reload.
    pub(crate) sidecar: Option<String>,
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTokens")
            .field("operator", &self.operator.is_some())
            .field("sidecar", &self.sidecar.is_some())
            .finish()
    }
}

/// The ACP agent's `env_from` variables, read from the node's environment: with
/// `secrets` (a running node) each one named must be set.
pub(super) fn agent_env(
    settings: &Settings,
    me: usize,
    bot: &BotSettings,
    env: &dyn SecretSource,
    secrets: bool,
) -> Result<std::collections::BTreeMap<String, String>, ConfigError> {
    let mut out = std::collections::BTreeMap::new();
    let Some(a) = bot.agent.as_ref().and_then(AgentEngine::acp) else {
        return Ok(out);
    };
    for (name, var) in &a.env_from {
        match env.var(var) {
            Some(v) => {
                out.insert(name.clone(), v);
            }
            None if secrets => {
                return Err(settings.err(
                    format!("bots[{me}].agent.env_from.{name}"),
                    format!(
                    "environment variable {var} is not set (the agent's {name} is read from it)"
                ),
                ))
            }
            None => {}
        }
    }
    Ok(out)
}

/// The local API's tokens of a [`crate::config::NodeConfig::build`]. With `secrets` (a running node)
/// a variable that is named must be set, and the operator's token is required when
/// the API listens on anything but loopback; without, the ones set are read.
pub(super) fn api_tokens(
    settings: &Settings,
    bot: &BotSettings,
    api_addr: SocketAddr,
    at: &dyn Fn(&str) -> String,
    env: &dyn SecretSource,
    secrets: bool,
) -> Result<ApiTokens, ConfigError> {
    let read = |key: String, var: Option<&String>| -> Result<Option<String>, ConfigError> {
        let Some(var) = var else { return Ok(None) };
        match env.var(var) {
            Some(v) => Ok(Some(v)),
            None if secrets => Err(settings.err(
                key,
                format!("environment variable {var} is not set (it would leave the local API without this token; unset the key to run without one)"),
            )),
            None => Ok(None),
        }
    };
    let operator = read(
        "mesh.api_token_env".into(),
        settings.mesh.api_token_env.as_ref(),
    )?;
    let sidecar = read(at("api_token_env"), bot.api_token_env.as_ref())?;
    if secrets && !api_addr.ip().is_loopback() && operator.is_none() {
        return Err(settings.err(
            at("api"),
            format!("{api_addr} is not loopback, so the local API needs a bearer token: set mesh.api_token_env and that variable"),
        ));
    }
    if sidecar.is_some() && sidecar == operator {
        return Err(settings.err(
            at("api_token_env"),
            "holds the same token as mesh.api_token_env: a sidecar's token must be its own, or it could quiet and reload",
        ));
    }
    Ok(ApiTokens { operator, sidecar })
}

/// The headers of the bot's HTTP MCP servers, by server name: every variable a
/// `headers_env` names must be set (with `secrets`; without, the ones set are read).
pub(super) fn mcp_headers(
    settings: &Settings,
    me: usize,
    bot: &BotSettings,
    env: &dyn SecretSource,
    secrets: bool,
) -> Result<HashMap<String, Vec<(String, String)>>, ConfigError> {
    let mut out = HashMap::new();
    for (j, m) in bot.mcp.iter().enumerate() {
        let mut headers = Vec::new();
        for (header, var) in &m.headers_env {
            match env.var(var) {
                Some(value) => {
                    if http::HeaderValue::from_str(&value).is_err() {
                        return Err(settings.err(
                            format!("bots[{me}].mcp[{j}].headers_env.{header}"),
                            format!(
                                "environment variable {var} does not hold a valid header value"
                            ),
                        ));
                    }
                    headers.push((header.clone(), value));
                }
                None if secrets => {
                    return Err(settings.err(
                        format!("bots[{me}].mcp[{j}].headers_env.{header}"),
                        format!("environment variable {var} is not set"),
                    ))
                }
                None => {}
            }
        }
        out.insert(m.name.clone(), headers);
    }
    Ok(out)
}

/// The LLM API keys of a [`crate::config::NodeConfig::build`], by variable name: every variable
/// `[llm]` names must be set (with `secrets`; without, the ones set are read).
pub(super) fn llm_keys(
    settings: &Settings,
    env: &dyn SecretSource,
    secrets: bool,
) -> Result<HashMap<String, String>, ConfigError> {
    let mut llm_keys = HashMap::new();
    if let Some(llm) = &settings.llm {
        let vars = [
            ("llm.api_key_env", llm.api_key_env.as_ref()),
            (
                "llm.judge.api_key_env",
                llm.judge.as_ref().and_then(|o| o.api_key_env.as_ref()),
            ),
            (
                "llm.reply.api_key_env",
                llm.reply.as_ref().and_then(|o| o.api_key_env.as_ref()),
            ),
        ];
        for (key, var) in vars {
            if let Some(var) = var {
                match env.var(var) {
                    Some(value) => {
                        llm_keys.insert(var.clone(), value);
                    }
                    None if secrets => {
                        return Err(settings.err(
                            key,
                            format!(
                                "environment variable {var} is not set (it must hold the API key)"
                            ),
                        ));
                    }
                    None => {}
                }
            }
        }
    }
    Ok(llm_keys)
}

/// The Redis URL of a [`crate::config::NodeConfig::build`], when the bot's transport is `redis`: from
/// `redis.url_env` (which must be set, with `secrets`) or `redis.url`, checked to be a
/// redis:// URL.
pub(super) fn redis_url(
    settings: &Settings,
    bot: &BotSettings,
    env: &dyn SecretSource,
    secrets: bool,
) -> Result<Option<String>, ConfigError> {
    if settings.transport_of(bot) != Transport::Redis {
        return Ok(None);
    }
    let url = match &settings.redis.url_env {
        Some(var) => match env.var(var) {
            Some(v) => v,
            None if secrets => {
                return Err(settings.err(
                    "redis.url_env",
                    format!(
                        "environment variable {var} is not set (it must hold the redis:// URL)"
                    ),
                ));
            }
            None => settings.redis.url.clone(),
        },
        None => settings.redis.url.clone(),
    };
    redis::Client::open(url.as_str()).map_err(|e| {
        settings.err(
            "redis.url_env",
            format!("not a redis:// URL: {}", e.category()),
        )
    })?;
    Ok(Some(url))
}

fn parse_secret(
    s: &Settings,
    key: &str,
    source: &str,
    value: &str,
) -> Result<HmacSecret, ConfigError> {
    let secret = HmacSecret::parse(value.trim()).map_err(|e| {
        s.err(
            key,
            format!("{source} does not hold a valid whsec_ secret: {e}"),
        )
    })?;
    secret
        .validate_strength()
        .map_err(|e| s.err(key, format!("{source}: secret too weak: {e}")))?;
    Ok(secret)
}

fn read_secret_file(s: &Settings, key: &str, file: &Path) -> Result<String, ConfigError> {
    let path = s.relative(file);
    std::fs::read_to_string(&path)
        .map(|v| v.trim().to_string())
        .map_err(|e| s.err(key, format!("cannot read {}: {e}", path.display())))
}

/// The mesh-wide HMAC secrets of a [`crate::config::NodeConfig::build`]: the ones this node signs
/// with, and the ones it accepts (those plus the previous secret, during a rotation).
/// Without `secrets` (explain-only) there are none.
pub(super) fn hmac_secrets(
    settings: &Settings,
    env: &dyn SecretSource,
    secrets: bool,
) -> Result<(Vec<HmacSecret>, Vec<HmacSecret>), ConfigError> {
    let m = &settings.mesh;
    let mut hmac = Vec::new();
    if !secrets {
        // Explain-only: no keys, and LLM keys only when present.
    } else if let Some(var) = &m.secret_env {
        let value = env.var(var).ok_or_else(|| {
            settings.err(
                "mesh.secret_env",
                format!("environment variable {var} is not set (it must hold whsec_…)"),
            )
        })?;
        hmac.push(parse_secret(settings, "mesh.secret_env", var, &value)?);
    }
    if let Some(file) = m.secret_file.as_ref().filter(|_| secrets) {
        let value = read_secret_file(settings, "mesh.secret_file", file)?;
        hmac.push(parse_secret(
            settings,
            "mesh.secret_file",
            &file.display().to_string(),
            &value,
        )?);
    }
    let mut verify_hmac = hmac.clone();
    if let Some(var) = m.secret_prev_env.as_ref().filter(|_| secrets) {
        if let Some(value) = env.var(var) {
            verify_hmac.push(parse_secret(settings, "mesh.secret_prev_env", var, &value)?);
        }
    }
    Ok((hmac, verify_hmac))
}

/// This bot's Ed25519 signing key of a [`crate::config::NodeConfig::build`], checked against its
/// `public_key` (none when it has no public key, or without `secrets`).
pub(super) fn own_signing_key(
    settings: &Settings,
    bot: &BotSettings,
    at: &dyn Fn(&str) -> String,
    env: &dyn SecretSource,
    secrets: bool,
) -> Result<Vec<SigningKey>, ConfigError> {
    let mut own = Vec::new();
    if let Some(pk) = bot.public_key.as_ref().filter(|_| secrets) {
        let value = if let Some(var) = &bot.private_key_env {
            env.var(var).ok_or_else(|| {
                settings.err(
                    at("private_key_env"),
                    format!("environment variable {var} is not set (it must hold whsk_…)"),
                )
            })?
        } else if let Some(file) = &bot.private_key_file {
            read_secret_file(settings, &at("private_key_file"), file)?
        } else {
            return Err(settings.err(
                at("private_key_env"),
                "this bot has a public_key, so it needs private_key_env or private_key_file",
            ));
        };
        let key = SigningKey::parse(value.trim()).map_err(|e| {
            settings.err(
                at("private_key"),
                format!("not a valid whsk_ private key: {e}"),
            )
        })?;
        let want = PublicKey::parse(pk).expect("validated");
        if key.public_key() != want {
            return Err(settings.err(at("private_key"), "does not match this bot's public_key"));
        }
        own.push(key);
    }
    Ok(own)
}
