//! peers.toml: the one file that describes the whole mesh.
//!
//! Loading is layered like zero-to-production's settings: the TOML file first, then
//! environment variables `BOTMESH__SECTION__KEY` (for example
//! `BOTMESH__MESH__MAX_DEPTH=5`), then validation. Every mistake is reported as a
//! [`ConfigError`] that names the key and the problem, before any port is bound.
//!
//! Secrets never live in the file: it names the environment variables or key files
//! that hold them, and [`NodeConfig::resolve`] reads them for the one bot being run.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use platform::{Platform, PlatformTables};

use crate::wire::signing::{HmacSecret, PairwiseKey, PublicKey, Signer, SigningKey, Verifier};

pub mod acp;
pub(crate) mod names;
pub(crate) mod pacing;
pub(crate) mod platform;
pub(crate) mod reload;

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

/// The whole of peers.toml, as written.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Mesh-wide settings.
    #[serde(default)]
    pub mesh: MeshSettings,
    /// The OpenAI-compatible endpoint; absent means the offline provider.
    #[serde(default)]
    pub(crate) llm: Option<LlmSettings>,
    /// The Redis server behind `transport = "redis"` (see [`RedisSettings`]).
    #[serde(default)]
    pub(crate) redis: RedisSettings,
    /// Every bot of the mesh, in the same order on every host.
    #[serde(default)]
    pub bots: Vec<BotSettings>,
    /// Where the file was read from; relative paths in it are relative to its folder.
    #[serde(skip)]
    pub(crate) path: PathBuf,
}

/// `[mesh]`: what every node of the mesh agrees on.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeshSettings {
    /// The default group for the local platform.
    pub(crate) group: String,
    /// Env var holding the mesh-wide HMAC secret (`whsec_…`).
    pub(crate) secret_env: Option<String>,
    /// File holding the mesh-wide HMAC secret, as an alternative to `secret_env`.
    pub(crate) secret_file: Option<PathBuf>,
    /// Env var holding the previous secret during a rotation (may be unset).
    pub(crate) secret_prev_env: Option<String>,
    /// Never reply to a message of this depth or more.
    pub max_depth: u32,
    /// Above this depth the judge must also agree before a bot replies.
    pub(crate) llm_threshold: u32,
    /// Per group: bot messages allowed per minute with no human message in between.
    pub(crate) bot_messages_per_minute: u32,
    /// Folder for transcripts and state; each bot uses `<data_dir>/<name>`.
    pub(crate) data_dir: PathBuf,
    /// Env var holding the operator's bearer token for the local API: every endpoint.
    /// Required for an API bound to a non-loopback address; named but unset, the node
    /// does not start.
    pub api_token_env: Option<String>,
    /// Envelopes held in memory for one peer; durable ones beyond that wait only in the
    /// outbox log on disk (spilled) and claims are refused (logged and counted).
    pub(crate) outbox_capacity: usize,
    /// Envelopes sent to a peer in one `POST /bridge/v1/batch` when more than one
    /// waits (one at a time otherwise); 1 turns batching off. At most 256.
    pub(crate) batch_max: usize,
    /// First retry delay for a failed delivery; doubles up to `retry_max_ms`.
    pub(crate) retry_base_ms: u64,
    /// The longest delay between two delivery attempts.
    pub(crate) retry_max_ms: u64,
    /// A delivery still failing after this long is given up (logged and counted).
    pub(crate) give_up_after_secs: u64,
    /// Timeout for one delivery attempt to a peer.
    pub(crate) peer_timeout_ms: u64,
    /// Envelopes per second one peer may send before getting 429.
    pub(crate) peer_rate_limit: u32,
    /// Seconds to drain outboxes on shutdown.
    pub(crate) shutdown_grace_secs: u64,
    /// Time a client has to send a request's headers (slowloris guard), per listener.
    pub(crate) header_timeout_ms: u64,
    /// Open connections per listener; more wait in the kernel's backlog.
    pub(crate) max_connections: usize,
    /// Time a client has to send a request's whole body, per request, on either
    /// listener; a slower one is answered 408 and its connection closed (slow-body guard).
    pub(crate) body_timeout_ms: u64,
    /// Open connections one source address may hold on the bridge listener (no more
    /// than `max_connections` in any case); more are refused at once, so slow clients
    /// from a few addresses cannot fill `max_connections` and lock the peers out.
    pub(crate) max_connections_per_source: usize,
    /// When the direct link to a peer has failed for this long, envelopes for it are
    /// also handed to another reachable peer to relay (still signed by this node, so
    /// the relay cannot alter them). 0 disables relaying this node's envelopes.
    pub(crate) relay_after_ms: u64,
    /// Relay hops an envelope may take; this node refuses to relay beyond it, and 0
    /// means it relays nothing for others.
    pub(crate) max_relay_hops: u32,
    /// How envelopes travel between bots by default: `http` (every peer directly,
    /// the default) or `redis` (one Redis Stream per group). A bot may override it.
    pub(crate) transport: Transport,
    /// A message older than this when it reaches the node (a catch-up after downtime)
    /// is recorded but never answered: the conversation has moved on.
    pub(crate) stale_after_secs: u64,
    /// Who asks the judge LLM about a message: every bot for itself (`own`, the
    /// default: per-bot `judge_prompt` applies), or one bot for all of them (`shared`:
    /// chosen from the message id, it broadcasts a signed `verdict`).
    pub(crate) judge: JudgeMode,
    /// In `shared` mode: how long a bot waits for the chosen bot's verdict before it
    /// asks its own judge (the chosen bot is down, slow, or saw the message late).
    pub(crate) verdict_timeout_ms: u64,
    /// The people whose `/quiet`, `/resume` and `/stop` in the chat are carried out,
    /// as `platform:id` (`local:Boss`, `feishu:ou_…`, `discord:5005`,
    /// `dingtalk:<staff id>`); anyone else's is ordinary text. Absent: everyone may
    /// command (logged as a warning at start). `/why` is open to everyone.
    pub(crate) operators: Option<Vec<String>>,
    /// Groups a node keeps: a message that would start one more is refused (the API
    /// answers 507, a peer 400 `too_many_groups`) and the other groups carry on.
    pub(crate) max_groups: usize,
    /// Transcript files held open at once; past it the least recently written is
    /// closed (and opened again when its group next speaks). Keep it well below the
    /// process's open-file limit (`ulimit -n`), which sockets share.
    pub(crate) max_open_transcripts: usize,
    /// The group tools (docs/agents.md, "Working together"): how many `ask`s an agent
    /// may make in one turn; one more is refused (an `isError` result, nothing posted).
    pub(crate) max_asks_per_turn: u32,
    /// How long an `ask` waits for the colleague's answer when the agent names no
    /// `timeout_secs`, and the longest it may name (also `wait_for_message`'s longest).
    pub(crate) ask_timeout_secs: u64,
    /// The `botmesh` executable a hosted agent starts as its `mesh` MCP server
    /// (`botmesh mcp`); absent: this node's own executable.
    pub(crate) mcp_command: Option<PathBuf>,
}

/// `[mesh] judge`: who asks the judge LLM whether a bot should interject.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JudgeMode {
    /// Every bot asks its own judge about every message (its own `judge_prompt`).
    #[default]
    Own,
    /// One bot per message, chosen from the message id, asks once for every bot and
    /// broadcasts the answers as a signed `verdict` envelope; the others wait for it
    /// (at most `verdict_timeout_ms`) and judge themselves only if it does not come.
    Shared,
}

/// How a bot's envelopes travel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Signed POSTs to every peer's bridge, one outbox per peer.
    #[default]
    Http,
    /// One XADD per envelope to the group's Redis Stream; every Redis bot reads the
    /// stream with its own persisted cursor. Peers on `http` are still posted to.
    Redis,
}

/// `[redis]`: the server carrying `transport = "redis"`, the same for every bot.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// `redis://host:port/db` (no password here: use `url_env` for one).
    pub(crate) url: String,
    /// Env var holding the whole URL instead, when it carries a password.
    pub(crate) url_env: Option<String>,
    /// Prefix of every key botmesh writes: streams are `{prefix}group:{group}`.
    pub(crate) key_prefix: String,
    /// Each group's stream is trimmed to about this many entries; a bot down for
    /// longer than that many messages misses the oldest (logged and counted).
    pub(crate) max_len: u64,
    /// How long one blocking read waits for new entries.
    pub(crate) block_ms: u64,
    /// Entries fetched per read.
    pub(crate) batch: usize,
}

impl Default for RedisSettings {
    fn default() -> Self {
        RedisSettings {
            url: "redis://127.0.0.1:6379".into(),
            url_env: None,
            key_prefix: "botmesh:".into(),
            max_len: 100_000,
            block_ms: 1_000,
            batch: 256,
        }
    }
}

impl Default for MeshSettings {
    fn default() -> Self {
        MeshSettings {
            group: "demo".into(),
            secret_env: None,
            secret_file: None,
            secret_prev_env: None,
            max_depth: 3,
            llm_threshold: 1,
            bot_messages_per_minute: 6,
            data_dir: PathBuf::from("data"),
            api_token_env: None,
            outbox_capacity: 10_000,
            batch_max: 64,
            retry_base_ms: 200,
            retry_max_ms: 30_000,
            give_up_after_secs: 24 * 3600,
            peer_timeout_ms: 5_000,
            peer_rate_limit: 200,
            shutdown_grace_secs: 5,
            header_timeout_ms: 10_000,
            max_connections: 1024,
            body_timeout_ms: 10_000,
            max_connections_per_source: 64,
            relay_after_ms: 3_000,
            max_relay_hops: 1,
            transport: Transport::Http,
            stale_after_secs: 600,
            judge: JudgeMode::Own,
            verdict_timeout_ms: 4_000,
            operators: None,
            max_groups: 10_000,
            max_open_transcripts: 256,
            max_asks_per_turn: 3,
            ask_timeout_secs: 300,
            mcp_command: None,
        }
    }
}

/// `[llm]`: an OpenAI-compatible endpoint, with optional per-purpose overrides.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct LlmSettings {
    /// Base URL; requests go to `{base_url}/chat/completions`.
    pub(crate) base_url: String,
    /// Model name.
    pub(crate) model: String,
    /// Env var holding the API key (optional for local servers).
    #[serde(default)]
    pub(crate) api_key_env: Option<String>,
    /// Timeout for one request.
    #[serde(default = "default_llm_timeout_ms")]
    pub(crate) timeout_ms: u64,
    /// Output cap for replies.
    #[serde(default = "default_reply_tokens")]
    pub(crate) max_tokens: u32,
    /// Sampling temperature, if the server should not use its default.
    #[serde(default)]
    pub(crate) temperature: Option<f32>,
    /// Ask the judge for structured output (`response_format` json_schema).
    #[serde(default = "yes")]
    pub(crate) json_schema: bool,
    /// Overrides for the judge call (a cheaper model, a shorter timeout).
    #[serde(default)]
    pub(crate) judge: Option<LlmOverride>,
    /// Overrides for the reply call.
    #[serde(default)]
    pub(crate) reply: Option<LlmOverride>,
    /// LLM calls (judge and reply) this bot may make per day; past it, see
    /// `over_budget`. Absent: no limit. Each node counts its own bot's calls.
    #[serde(default)]
    pub(crate) daily_calls: Option<u64>,
    /// Tokens (prompt + completion, judge and reply) this bot may spend per day.
    #[serde(default)]
    pub(crate) daily_tokens: Option<u64>,
    /// What a bot past its daily budget still does: answer `mentions` (the default)
    /// or stay `silent`.
    #[serde(default)]
    pub(crate) over_budget: OverBudget,
    /// The time zone whose midnight starts a new budget day, as a fixed UTC offset
    /// (`"+08:00"`, `"-05:00"`, `"Z"`); default UTC.
    #[serde(default = "utc")]
    pub(crate) budget_utc_offset: String,
}

/// What a bot past its daily LLM budget does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OverBudget {
    /// Stops judging, still answers @mentions (those replies are still counted).
    #[default]
    Mentions,
    /// Takes no turns at all until the next day.
    Silent,
}

fn utc() -> String {
    "+00:00".into()
}

/// Minutes east of UTC for a `budget_utc_offset` (`+08:00`, `-05:30`, `Z`, `UTC`).
pub(crate) fn parse_utc_offset(s: &str) -> Result<i64, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("z") || t.eq_ignore_ascii_case("utc") {
        return Ok(0);
    }
    let bad = || format!("{s:?} is not a UTC offset like \"+08:00\" or \"-05:00\"");
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'+') => (1, &t[1..]),
        Some(b'-') => (-1, &t[1..]),
        _ => return Err(bad()),
    };
    let (h, m) = rest.split_once(':').ok_or_else(bad)?;
    let (h, m): (i64, i64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if !(0..=14).contains(&h) || !(0..60).contains(&m) {
        return Err(bad());
    }
    Ok(sign * (h * 60 + m))
}

/// Per-purpose changes to `[llm]`.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct LlmOverride {
    /// Another endpoint.
    pub(crate) base_url: Option<String>,
    /// Another model.
    pub(crate) model: Option<String>,
    /// Another key variable.
    pub(crate) api_key_env: Option<String>,
    /// Another timeout.
    pub(crate) timeout_ms: Option<u64>,
    /// Another output cap.
    pub(crate) max_tokens: Option<u32>,
    /// Another temperature.
    pub(crate) temperature: Option<f32>,
}

fn default_llm_timeout_ms() -> u64 {
    20_000
}
fn default_reply_tokens() -> u32 {
    400
}
fn yes() -> bool {
    true
}

/// When a bot takes part in a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Participation {
    /// Only when @mentioned.
    Mentions,
    /// When mentioned, or when the judge finds the message relevant.
    #[default]
    Judge,
    /// Answers every human message (an "expert" on call), and judges bot messages.
    Always,
}

/// Whose messages a bot may answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReplyTo {
    /// Humans and bots.
    #[default]
    All,
    /// Humans only (a review-panel bot ignores other bots).
    Humans,
}

/// Sidecar mode: hand each turn to an external bot instead of the built-in reply.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSettings {
    /// Where turns are POSTed.
    pub(crate) webhook: String,
    /// How long the agent may take to answer in its response.
    #[serde(default = "default_agent_timeout")]
    pub(crate) timeout_ms: u64,
}

fn default_agent_timeout() -> u64 {
    60_000
}

/// `agent = { external = true }`: the bot's turns are taken by an agent outside the
/// mesh through `botmesh mcp` (docs/agents.md, "Working together").
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalAgent {
    /// Always true (`false` is refused: leave `agent` out for the built-in model).
    pub(crate) external: bool,
}

/// `[[bots]] agent`: what writes the bot's replies instead of the built-in model.
/// Each form is one table; which one is told by its key (`webhook`, `acp` or
/// `external`), and a table with more than one or none is refused naming
/// `bots[i].agent`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
// One per bot, read once: the ACP settings' size (its sandbox, bounds) is no cost.
#[allow(clippy::large_enum_variant)]
pub enum AgentEngine {
    /// The sidecar webhook (`agent = { webhook = … }`, docs/sidecar.md).
    Webhook(AgentSettings),
    /// A coding agent hosted over ACP (`agent = { acp = [...] , … }`, docs/agents.md).
    Acp(acp::AcpSettings),
    /// An agent outside the mesh (`agent = { external = true }`): mentions of the bot
    /// wait for its `wait_for_message`; the node never answers by itself.
    External(ExternalAgent),
}

impl<'de> Deserialize<'de> for AgentEngine {
    /// Reads the table once, then as the form its key names: the form's own errors
    /// (an unknown key, a wrong type) keep their words.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let table = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        let form = |e: serde_json::Error| D::Error::custom(e.to_string());
        let forms = ["webhook", "acp", "external"]
            .into_iter()
            .filter(|k| table.contains_key(*k))
            .collect::<Vec<_>>();
        let value = serde_json::Value::Object(table);
        match forms.as_slice() {
            ["webhook"] => serde_json::from_value(value)
                .map(AgentEngine::Webhook)
                .map_err(form),
            ["acp"] => serde_json::from_value(value)
                .map(AgentEngine::Acp)
                .map_err(form),
            ["external"] => match serde_json::from_value(value).map_err(form)? {
                ExternalAgent { external: true } => Ok(AgentEngine::External(ExternalAgent { external: true })),
                ExternalAgent { external: false } => Err(D::Error::custom(
                    "`external = false` is no agent: leave `agent` out for the built-in model",
                )),
            },
            [] => Err(D::Error::custom(
                "needs `webhook = \"http://…\"` (a sidecar), `acp = [\"command\", …]` (an ACP agent) or `external = true` (an agent through `botmesh mcp`)",
            )),
            _ => Err(D::Error::custom(format!(
                "has both {}: give one of them (`webhook` a sidecar, `acp` an ACP agent, `external` an agent through `botmesh mcp`)",
                forms
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ))),
        }
    }
}

impl AgentEngine {
    /// The ACP form's settings, if this is one.
    pub(crate) fn acp(&self) -> Option<&acp::AcpSettings> {
        match self {
            AgentEngine::Acp(a) => Some(a),
            AgentEngine::Webhook(_) | AgentEngine::External(_) => None,
        }
    }
}

fn default_max_tool_rounds() -> u32 {
    8
}
fn default_tool_timeout() -> u64 {
    30_000
}
fn default_tool_result_chars() -> usize {
    16_000
}

/// One MCP tool server of a bot (`[[bots.mcp]]`): a child process spoken to over
/// stdio (`command`), or a streamable-HTTP endpoint (`url`). Exists so a bot's reply
/// model can call tools (docs/tools.md).
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServerSettings {
    /// Its name, unique among the bot's servers: labels logs, metrics and `/why`.
    pub(crate) name: String,
    /// Program and arguments of a stdio server.
    #[serde(default)]
    pub(crate) command: Vec<String>,
    /// Environment of a stdio server beyond PATH, HOME and LANG (it gets nothing else
    /// of the node's): literal values.
    #[serde(default)]
    pub(crate) env: std::collections::BTreeMap<String, String>,
    /// Endpoint of a streamable-HTTP server.
    #[serde(default)]
    pub(crate) url: Option<String>,
    /// Headers sent to an HTTP server, by header name: the environment variable of the
    /// node holding each value (a token stays out of the file).
    #[serde(default)]
    pub(crate) headers_env: std::collections::BTreeMap<String, String>,
    /// A stdio server's box (`agent::boxing`), as an agent's: `{ read = [...], write =
    /// [...] }` widens it, `"off"` runs it unboxed. Exists so a tool server, like an
    /// agent, never reaches the node's data, config, key or secret files.
    #[serde(default)]
    pub(crate) sandbox: crate::config::acp::SandboxSetting,
}

/// One `[[bots]]` entry.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct BotSettings {
    /// Canonical name, unique in the mesh; what `@Name` matches.
    pub name: String,
    /// Other names that mention this bot (`小八`, `xiaoba`).
    #[serde(default)]
    pub(crate) aliases: Vec<String>,
    /// Its job, shown to colleagues' LLMs.
    #[serde(default)]
    pub(crate) role: String,
    /// What it is good at; feeds the judge and the colleague profiles.
    #[serde(default)]
    pub(crate) skills: Vec<String>,
    /// Peer-facing listener address (`host:port`).
    pub(crate) bridge: String,
    /// How peers reach the bridge when not at `http://{bridge}`.
    #[serde(default)]
    pub bridge_url: Option<String>,
    /// Local API and web page address.
    pub(crate) api: String,
    /// The host name browsers reach this bot's local API by when it is not the listen
    /// address or `localhost` (a reverse proxy's name): the API answers requests whose
    /// `Host` names it; every other name is refused (DNS rebinding, docs/security.md).
    #[serde(default)]
    pub(crate) api_public_host: Option<String>,
    /// Env var holding this bot's sidecar token for the local API: it may post as this
    /// bot and read, but not switch quiet or reload (that is the operator's
    /// `mesh.api_token_env`, which it needs).
    #[serde(default)]
    pub(crate) api_token_env: Option<String>,
    /// Ed25519 public key (`whpk_…` or bare base64).
    #[serde(default)]
    pub(crate) public_key: Option<String>,
    /// Further valid public keys during a rotation.
    #[serde(default)]
    pub(crate) previous_public_keys: Vec<String>,
    /// Env var holding this bot's private key (`whsk_…`).
    #[serde(default)]
    pub(crate) private_key_env: Option<String>,
    /// File holding this bot's private key, as an alternative.
    #[serde(default)]
    pub(crate) private_key_file: Option<PathBuf>,
    /// The chat platform its humans use.
    #[serde(default)]
    pub(crate) platform: Platform,
    /// Its platform tables as written (`[bots.discord]`, …): its own platform's, and
    /// others' that give its ids there; each platform's adapter reads its own
    /// (`platform::registry`). Taken out of the file before the rest is read
    /// ([`platform::take_tables`]), so never deserialized with the other keys.
    #[serde(flatten, skip_deserializing)]
    pub(crate) tables: PlatformTables,
    /// When it takes part.
    #[serde(default)]
    pub(crate) participation: Participation,
    /// Whose messages it may answer.
    #[serde(default)]
    pub(crate) reply_to: ReplyTo,
    /// Shortest interjection delay (relevance 1).
    #[serde(default = "default_min_delay")]
    pub(crate) min_delay_ms: u64,
    /// Longest interjection delay (relevance 0).
    #[serde(default = "default_max_delay")]
    pub(crate) max_delay_ms: u64,
    /// Random extra delay, up to this, so equal relevances do not collide exactly.
    #[serde(default = "default_jitter")]
    pub(crate) jitter_ms: u64,
    /// How long, at most, an interjection waits (once its reply is written) for its
    /// claim to be acknowledged by every peer, so that a claim delayed in transit
    /// cannot reach a peer after that peer has answered too. Past it the bot posts
    /// anyway, logged and counted (`post/claim_unacked`). 0 = do not wait.
    #[serde(default = "default_claim_ack_timeout")]
    pub(crate) claim_ack_timeout_ms: u64,
    /// How long, at most, an interjection waits (once its reply is written) for the
    /// word of a peer that answered its claim `judging` — that peer's judge was still
    /// out, and it may be the more relevant bot. Its word comes when its judge
    /// answers or times out, so this bound only matters when that peer dies meanwhile.
    /// Past it the bot posts anyway (`post/judge_word_missing`).
    #[serde(default = "default_judge_word_timeout")]
    pub(crate) judge_word_timeout_ms: u64,
    /// Whether the bot writes its reply while its delay runs (when no better claim
    /// is known), so it posts at the later of the delay and the reply; `false` writes
    /// only once the wait is over: slower, but no reply is ever written and then
    /// thrown away.
    #[serde(default = "yes")]
    pub(crate) write_early: bool,
    /// Whether the bot's judge call also drafts its reply: one streamed call to the
    /// reply endpoint whose first line is the verdict and whose rest is the reply, so
    /// the reply is written from the moment the message arrives instead of from the
    /// verdict. Fewer calls and a quicker first answer, for a longer (reply-sized)
    /// prompt on every judged message and the reply model doing the judging.
    #[serde(default)]
    pub(crate) judge_drafts: bool,
    /// Whether the built-in reply model is offered the group tools `read_group`,
    /// `members` and `ask` (docs/agents.md, "Working together"), through the `mesh`
    /// MCP server the node starts for it. Needs `write_early = false` (an ask posts at
    /// once) and no `agent` (an agent gets every group tool anyway).
    #[serde(default)]
    pub(crate) group_tools: bool,
    /// This bot's own daily LLM call limit, instead of `[llm] daily_calls` (bots
    /// on one endpoint may have different allowances).
    #[serde(default)]
    pub(crate) daily_calls: Option<u64>,
    /// This bot's own daily LLM token limit, instead of `[llm] daily_tokens`.
    #[serde(default)]
    pub(crate) daily_tokens: Option<u64>,
    /// Messages of context for the judge.
    #[serde(default = "default_context")]
    pub(crate) context_messages: usize,
    /// Characters kept of each context message.
    #[serde(default = "default_trim")]
    pub(crate) context_chars: usize,
    /// Judge relevance below which the bot stays silent even if the judge says speak.
    #[serde(default = "default_min_relevance")]
    pub(crate) min_relevance: f64,
    /// Replaces the built-in judge prompt template (see docs).
    #[serde(default)]
    pub(crate) judge_prompt: Option<String>,
    /// The bot's persona for replies; default built from role and skills.
    #[serde(default)]
    pub(crate) persona: Option<String>,
    /// What writes the replies instead of the model: a sidecar webhook or an ACP
    /// agent.
    #[serde(default)]
    pub(crate) agent: Option<AgentEngine>,
    /// The bot's MCP tool servers (`[[bots.mcp]]`, docs/tools.md): their tools are
    /// offered to the bot's reply model.
    #[serde(default)]
    pub(crate) mcp: Vec<McpServerSettings>,
    /// Most LLM calls a reply may make because the model asked for tools: past it the
    /// model writes its answer without tools.
    #[serde(default = "default_max_tool_rounds")]
    pub(crate) max_tool_rounds: u32,
    /// How long one tool call may take before the model is told it timed out.
    #[serde(default = "default_tool_timeout")]
    pub(crate) tool_timeout_ms: u64,
    /// Most characters of one tool result handed to the model (the rest is cut, and
    /// the model is told so).
    #[serde(default = "default_tool_result_chars")]
    pub(crate) tool_result_chars: usize,
    /// This bot's transport when it differs from `mesh.transport` (a mixed mesh).
    #[serde(default)]
    pub(crate) transport: Option<Transport>,
    /// Start quiet (the operator switch of `POST /v1/quiet`); a reload that changes
    /// it sets the switch, an unchanged value leaves the operator's switch alone.
    #[serde(default)]
    pub quiet: bool,
}

fn default_min_delay() -> u64 {
    1_000
}
fn default_max_delay() -> u64 {
    3_000
}
fn default_jitter() -> u64 {
    150
}
fn default_judge_word_timeout() -> u64 {
    12_000
}

fn default_claim_ack_timeout() -> u64 {
    3_000
}
fn default_context() -> usize {
    8
}
fn default_trim() -> usize {
    240
}
fn default_min_relevance() -> f64 {
    0.3
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

    /// The URL peers post envelopes to.
    pub(crate) fn bridge_base_url(&self) -> String {
        self.bridge_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.bridge))
            .trim_end_matches('/')
            .to_string()
    }
    /// Its `[bots.<platform>]` table read as `T`, when it has one (checked at start by
    /// `platform::registry`, so unreadable only if it was never checked: then `None`).
    pub(crate) fn table<T: serde::de::DeserializeOwned>(&self, platform: Platform) -> Option<T> {
        platform::read_table(self.tables.get(platform.as_str())?).ok()
    }

    /// This bot's open_id on Feishu, if configured: Feishu's mentions name bots by it,
    /// and the mention matcher knows every member by it (the one platform id the turn
    /// code reads).
    pub(crate) fn open_id(&self) -> Option<String> {
        let config::ValueKind::Table(t) = &self.tables.get("feishu")?.kind else {
            return None;
        };
        t.get("open_id")?.clone().into_string().ok()
    }
}

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

    pub(crate) fn err(&self, key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.path.display().to_string(),
            key: key.into(),
            problem: problem.into(),
        }
    }

    /// Checks everything that can be checked without secrets.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let m = &self.mesh;
        if self.bots.is_empty() {
            return Err(self.err(
                "bots",
                "no [[bots]] entries: the mesh needs at least one bot",
            ));
        }
        if m.group.trim().is_empty() {
            return Err(self.err("mesh.group", "must not be empty"));
        }
        self.validate_redis()?;
        self.validate_api()?;
        for (i, entry) in m.operators.iter().flatten().enumerate() {
            names::check_operator(entry)
                .map_err(|problem| self.err(format!("mesh.operators[{i}]"), problem))?;
        }
        if m.max_depth == 0 {
            return Err(self.err(
                "mesh.max_depth",
                "must be at least 1 (0 would silence every bot)",
            ));
        }
        if m.max_depth > crate::wire::limits::MAX_DEPTH {
            return Err(self.err(
                "mesh.max_depth",
                format!(
                    "must be at most {} (peers refuse deeper envelopes)",
                    crate::wire::limits::MAX_DEPTH
                ),
            ));
        }
        if m.llm_threshold >= m.max_depth {
            return Err(self.err(
                "mesh.llm_threshold",
                format!(
                    "{} must be below mesh.max_depth ({})",
                    m.llm_threshold, m.max_depth
                ),
            ));
        }
        if m.outbox_capacity == 0 {
            return Err(self.err("mesh.outbox_capacity", "must be at least 1"));
        }
        if m.batch_max == 0 || m.batch_max > crate::wire::batch::MAX_ITEMS {
            return Err(self.err(
                "mesh.batch_max",
                format!("must be 1 to {}", crate::wire::batch::MAX_ITEMS),
            ));
        }
        if m.max_relay_hops > crate::wire::limits::MAX_HOPS_LIMIT {
            return Err(self.err(
                "mesh.max_relay_hops",
                format!("must be at most {}", crate::wire::limits::MAX_HOPS_LIMIT),
            ));
        }
        if m.retry_base_ms == 0 || m.retry_max_ms < m.retry_base_ms {
            return Err(self.err(
                "mesh.retry_max_ms",
                "needs 0 < retry_base_ms <= retry_max_ms",
            ));
        }
        if m.max_connections == 0 || m.header_timeout_ms == 0 {
            return Err(self.err(
                "mesh.max_connections",
                "max_connections and header_timeout_ms must be at least 1",
            ));
        }
        for (key, value) in [
            ("max_groups", m.max_groups),
            ("max_open_transcripts", m.max_open_transcripts),
        ] {
            if value == 0 {
                return Err(self.err(format!("mesh.{key}"), "must be at least 1"));
            }
        }
        if m.body_timeout_ms == 0 {
            return Err(self.err(
                "mesh.body_timeout_ms",
                "must be at least 1 (the time a client has to send a request's body)",
            ));
        }
        if m.max_connections_per_source == 0 {
            return Err(self.err(
                "mesh.max_connections_per_source",
                "must be at least 1 (open connections one address may hold on the bridge)",
            ));
        }
        if m.peer_rate_limit == 0 {
            return Err(self.err("mesh.peer_rate_limit", "must be at least 1"));
        }
        if m.max_asks_per_turn > 20 {
            return Err(self.err(
                "mesh.max_asks_per_turn",
                "must be at most 20 (each ask is a message everyone in the group reads)",
            ));
        }
        if !(1..=3600).contains(&m.ask_timeout_secs) {
            return Err(self.err(
                "mesh.ask_timeout_secs",
                "must be 1 to 3600 (how long an ask may wait for a colleague's answer)",
            ));
        }
        if m.judge == JudgeMode::Shared && !(100..=60_000).contains(&m.verdict_timeout_ms) {
            return Err(self.err(
                "mesh.verdict_timeout_ms",
                "must be 100 to 60000 with judge = \"shared\" (how long a bot waits for the shared verdict)",
            ));
        }
        if m.secret_env.is_some() && m.secret_file.is_some() {
            return Err(self.err(
                "mesh.secret_file",
                "set either mesh.secret_env or mesh.secret_file, not both",
            ));
        }
        if let Some(llm) = &self.llm {
            check_url(&llm.base_url).map_err(|p| self.err("llm.base_url", p))?;
            if llm.model.trim().is_empty() {
                return Err(self.err("llm.model", "must not be empty"));
            }
            parse_utc_offset(&llm.budget_utc_offset)
                .map_err(|p| self.err("llm.budget_utc_offset", p))?;
            for (key, limit) in [
                ("daily_calls", llm.daily_calls),
                ("daily_tokens", llm.daily_tokens),
            ] {
                if limit == Some(0) {
                    return Err(self.err(
                        format!("llm.{key}"),
                        "must be at least 1 (leave it out for no limit; quiet silences a bot)",
                    ));
                }
            }
            for (name, o) in [("judge", &llm.judge), ("reply", &llm.reply)] {
                if let Some(url) = o.as_ref().and_then(|o| o.base_url.as_ref()) {
                    check_url(url).map_err(|p| self.err(format!("llm.{name}.base_url"), p))?;
                }
            }
        }
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut addrs: HashMap<SocketAddr, String> = HashMap::new();
        let hmac = m.secret_env.is_some() || m.secret_file.is_some();
        for (i, b) in self.bots.iter().enumerate() {
            let at = |k: &str| format!("bots[{i}].{k}");
            for (key, limit) in [
                ("daily_calls", b.daily_calls),
                ("daily_tokens", b.daily_tokens),
            ] {
                if limit == Some(0) {
                    return Err(self.err(
                        at(key),
                        "must be at least 1 (leave it out for [llm]'s limit; quiet silences a bot)",
                    ));
                }
            }
            if b.name.trim().is_empty() || b.name.trim() != b.name {
                return Err(self.err(at("name"), "must be non-empty without surrounding spaces"));
            }
            if b.name.len() > crate::wire::limits::MAX_NAME_BYTES {
                return Err(self.err(
                    at("name"),
                    format!(
                        "{} bytes, over {} (peers refuse longer author names)",
                        b.name.len(),
                        crate::wire::limits::MAX_NAME_BYTES
                    ),
                ));
            }
            if b.name.starts_with('@') || b.name.contains(['<', '>', '"']) {
                return Err(self.err(
                    at("name"),
                    format!("{:?} may not start with @ or contain <, >, \"", b.name),
                ));
            }
            for (j, handle) in std::iter::once(&b.name).chain(b.aliases.iter()).enumerate() {
                let key = if j == 0 {
                    at("name")
                } else {
                    at(&format!("aliases[{}]", j - 1))
                };
                if handle.trim().is_empty() {
                    return Err(self.err(key, "must not be empty"));
                }
                if let Some(&other) = names.get(&handle.to_lowercase()) {
                    if other != i {
                        return Err(self.err(
                            key,
                            format!(
                                "{handle:?} is already a name or alias of bots[{other}] ({})",
                                self.bots[other].name
                            ),
                        ));
                    }
                }
                names.insert(handle.to_lowercase(), i);
            }
            for (key, value) in [("bridge", &b.bridge), ("api", &b.api)] {
                let addr: SocketAddr = value.parse().map_err(|_| {
                    self.err(
                        at(key),
                        format!("{value:?} is not an address like 127.0.0.1:7101"),
                    )
                })?;
                if addr.port() != 0 {
                    if let Some(owner) = addrs.insert(addr, at(key)) {
                        return Err(self.err(at(key), format!("{addr} is already used by {owner}")));
                    }
                }
            }
            if let Some(url) = &b.bridge_url {
                check_url(url).map_err(|p| self.err(at("bridge_url"), p))?;
            }
            if b.min_delay_ms > b.max_delay_ms {
                return Err(self.err(
                    at("min_delay_ms"),
                    format!(
                        "{} is above max_delay_ms ({})",
                        b.min_delay_ms, b.max_delay_ms
                    ),
                ));
            }
            if b.max_delay_ms > 600_000 {
                return Err(self.err(
                    at("max_delay_ms"),
                    "above 10 minutes; the conversation will have moved on",
                ));
            }
            if !(0.0..=1.0).contains(&b.min_relevance) {
                return Err(self.err(at("min_relevance"), "must be within 0..1"));
            }
            if b.context_messages > 200 {
                return Err(self.err(at("context_messages"), "at most 200"));
            }
            if b.judge_drafts && !b.write_early {
                return Err(self.err(
                    at("judge_drafts"),
                    "a drafting judge writes the reply while the bot waits, which needs write_early = true",
                ));
            }
            if b.group_tools && b.agent.is_some() {
                return Err(self.err(
                    at("group_tools"),
                    "is for the built-in model: this bot's agent is offered the group tools (the mesh server) anyway",
                ));
            }
            if b.group_tools && b.write_early {
                return Err(self.err(
                    at("group_tools"),
                    "needs write_early = false: an ask posts to the group at once, so the reply may be written only once the bot has the turn",
                ));
            }
            if b.judge_drafts && b.agent.is_some() {
                return Err(self.err(
                    at("judge_drafts"),
                    "this bot's replies come from its agent (a sidecar agent or an ACP agent), so its judge has nothing to draft",
                ));
            }
            if let Some(t) = &b.judge_prompt {
                if !t.contains("{message}") {
                    return Err(self.err(at("judge_prompt"), "the template must contain {message}"));
                }
            }
            for (k, key) in b.public_key.iter().map(|k| (k, at("public_key"))).chain(
                b.previous_public_keys
                    .iter()
                    .enumerate()
                    .map(|(j, k)| (k, at(&format!("previous_public_keys[{j}]")))),
            ) {
                PublicKey::parse(k)
                    .map_err(|e| self.err(key, format!("not a valid Ed25519 public key: {e}")))?;
            }
            if b.private_key_env.is_some() && b.private_key_file.is_some() {
                return Err(self.err(
                    at("private_key_file"),
                    "set either private_key_env or private_key_file, not both",
                ));
            }
            if b.public_key.is_none() && !hmac {
                return Err(self.err(
                    at("public_key"),
                    format!("{} has no public_key and neither mesh.secret_env nor mesh.secret_file is set: its envelopes could never be verified", b.name),
                ));
            }
            match &b.agent {
                Some(AgentEngine::Webhook(a)) => {
                    check_url(&a.webhook).map_err(|p| self.err(at("agent.webhook"), p))?;
                }
                Some(AgentEngine::Acp(a)) => {
                    if let Err(problems) = a.validate() {
                        let first = &problems[0];
                        return Err(self.err(at(&format!("agent.{}", first.key)), &first.problem));
                    }
                }
                Some(AgentEngine::External(_)) | None => {}
            }
            self.validate_mcp(i, b)?;
        }
        Ok(())
    }

    /// `bots[i].feishu`: the app settings a feishu bot needs, and well-formed peer ids.
    /// A bot's `[[bots.mcp]]` servers and tool limits.
    fn validate_mcp(&self, i: usize, b: &BotSettings) -> Result<(), ConfigError> {
        let at = |k: &str| format!("bots[{i}].{k}");
        if b.max_tool_rounds > 64 {
            return Err(self.err(at("max_tool_rounds"), "at most 64"));
        }
        if b.tool_timeout_ms == 0 || b.tool_timeout_ms > 600_000 {
            return Err(self.err(at("tool_timeout_ms"), "must be within 1..=600000"));
        }
        if b.tool_result_chars < 100 {
            return Err(self.err(at("tool_result_chars"), "at least 100"));
        }
        let mut names = std::collections::HashSet::new();
        for (j, m) in b.mcp.iter().enumerate() {
            let at = |k: &str| format!("bots[{i}].mcp[{j}].{k}");
            if m.name.trim().is_empty() {
                return Err(self.err(at("name"), "an MCP server needs a name"));
            }
            if !names.insert(m.name.as_str()) {
                return Err(self.err(
                    at("name"),
                    format!("{:?} names two of this bot's MCP servers", m.name),
                ));
            }
            match (m.command.is_empty(), &m.url) {
                (true, None) => {
                    return Err(self.err(
                        at("command"),
                        "set command (a stdio server) or url (a streamable-HTTP server)",
                    ))
                }
                (false, Some(_)) => {
                    return Err(self.err(at("url"), "set either command or url, not both"))
                }
                (false, None) => {
                    if m.command[0].trim().is_empty() {
                        return Err(self.err(at("command"), "the program name is empty"));
                    }
                    if !m.headers_env.is_empty() {
                        return Err(self.err(
                            at("headers_env"),
                            "headers are for a url server; a stdio server gets env",
                        ));
                    }
                    if let Some((key, problem)) = m.sandbox.problems().into_iter().next() {
                        return Err(self.err(at(&key), problem));
                    }
                }
                (true, Some(url)) => {
                    check_url(url).map_err(|p| self.err(at("url"), p))?;
                    if url.starts_with("https://") {
                        return Err(self.err(
                            at("url"),
                            "https MCP servers are not supported by this build (plain http only, e.g. a local gateway)",
                        ));
                    }
                    if !m.env.is_empty() {
                        return Err(self.err(
                            at("env"),
                            "env is for a stdio server; a url server gets headers_env",
                        ));
                    }
                    if m.sandbox != crate::config::acp::SandboxSetting::default() {
                        return Err(self.err(
                            at("sandbox"),
                            "a url server is not a process of the node's: sandbox is for a stdio server",
                        ));
                    }
                    for h in m.headers_env.keys() {
                        if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                            return Err(self.err(
                                at("headers_env"),
                                format!("{h:?} is not a valid header name"),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A bot's transport: its own `transport`, else the mesh's.
    pub(crate) fn transport_of(&self, b: &BotSettings) -> Transport {
        b.transport.unwrap_or(self.mesh.transport)
    }

    /// The local API's keys of every bot: `api_public_host` is a bare host name, and a
    /// sidecar token (`api_token_env`) comes with the operator's (`mesh.api_token_env`).
    fn validate_api(&self) -> Result<(), ConfigError> {
        for (i, b) in self.bots.iter().enumerate() {
            if let Some(h) = &b.api_public_host {
                let ok = !h.is_empty()
                    && h.len() <= 253
                    && !h.starts_with(['-', '.'])
                    && h.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
                if !ok {
                    return Err(self.err(
                        format!("bots[{i}].api_public_host"),
                        format!("{h:?} is not a host name: letters, digits, '-' and '.' only, no scheme, port or path (e.g. \"botmesh.example.com\")"),
                    ));
                }
            }
            if b.api_token_env.is_some() && self.mesh.api_token_env.is_none() {
                return Err(self.err(
                    format!("bots[{i}].api_token_env"),
                    "a sidecar token needs the operator's too: set mesh.api_token_env (else nobody could quiet or reload this bot through its API)",
                ));
            }
        }
        Ok(())
    }

    /// `[redis]`, checked when any bot uses it.
    fn validate_redis(&self) -> Result<(), ConfigError> {
        if !self
            .bots
            .iter()
            .any(|b| self.transport_of(b) == Transport::Redis)
        {
            return Ok(());
        }
        let r = &self.redis;
        if r.url_env.is_none() {
            redis::Client::open(r.url.as_str()).map_err(|e| {
                self.err(
                    "redis.url",
                    format!("{:?} is not a redis:// URL: {e}", r.url),
                )
            })?;
            if r.url.contains('@') {
                return Err(self.err(
                    "redis.url",
                    "holds a password: put the URL in an env var and name it in redis.url_env",
                ));
            }
        }
        if r.key_prefix.is_empty() || r.key_prefix.contains(char::is_whitespace) {
            return Err(self.err("redis.key_prefix", "must be non-empty, without spaces"));
        }
        if r.max_len < 100 {
            return Err(self.err(
                "redis.max_len",
                "at least 100: a shorter stream loses messages while a bot restarts",
            ));
        }
        if r.block_ms == 0 || r.block_ms > 60_000 {
            return Err(self.err("redis.block_ms", "must be within 1..=60000"));
        }
        if r.batch == 0 || r.batch > 10_000 {
            return Err(self.err("redis.batch", "must be within 1..=10000"));
        }
        Ok(())
    }

    /// The bot called `name` (exact, then case-insensitive) and its index.
    pub(crate) fn bot(&self, name: &str) -> Option<(usize, &BotSettings)> {
        self.bots
            .iter()
            .enumerate()
            .find(|(_, b)| b.name == name)
            .or_else(|| {
                self.bots
                    .iter()
                    .enumerate()
                    .find(|(_, b)| b.name.eq_ignore_ascii_case(name))
            })
    }

    /// Resolves a path written in the file relative to the file's folder.
    pub(crate) fn relative(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.path.parent().unwrap_or(Path::new(".")).join(p)
        }
    }
}

pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} must start with http:// or https://"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("{url:?} has no host"));
    }
    reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    Ok(())
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
    /// variable (`token_env` → the token): see [`platform`].
    pub(crate) platform_secrets: PlatformSecrets,
    /// The Redis server's URL, when this bot's transport is `redis`.
    pub(crate) redis_url: Option<String>,
    /// The headers of this bot's HTTP MCP servers, by server name: `(header, value)`
    /// read from the variables `headers_env` names.
    pub(crate) mcp_headers: HashMap<String, Vec<(String, String)>>,
    /// The ACP agent's variables taken from the node's environment (`agent.env_from`),
    /// by the agent's name for them.
    pub(crate) agent_env: std::collections::BTreeMap<String, String>,
}

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
fn platform_secrets(
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
        let data_dir =
            data_dir.unwrap_or_else(|| settings.relative(&settings.mesh.data_dir).join(&bot.name));
        Ok(NodeConfig {
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

    /// The bot called exactly `name`.
    pub(crate) fn member(&self, name: &str) -> Option<&BotSettings> {
        self.settings.bots.iter().find(|b| b.name == name)
    }

    /// The bot whose name or one of whose aliases `name` reads as (compared by
    /// [`names::name_key`]: case, width and invisible characters aside): a person may
    /// not post under it.
    pub(crate) fn bot_named_like(&self, name: &str) -> Option<&BotSettings> {
        self.settings.bots.iter().find(|b| {
            names::names_collide(
                name,
                std::iter::once(&b.name)
                    .chain(&b.aliases)
                    .map(String::as_str),
            )
        })
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
fn pick_bot(settings: &Settings, name: &str) -> Result<(usize, BotSettings), ConfigError> {
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

/// The signer and verifier of a [`NodeConfig::build`]: the HMAC secrets, this bot's
/// own key, every bot's listed public keys, and the pairwise keys with every other
/// key-holding bot (signing.rs): this bot's key for what it sends to each, and one per
/// listed key of each for what it receives.
fn signer_and_verifier(
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
fn agent_env(
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

/// The local API's tokens of a [`NodeConfig::build`]. With `secrets` (a running node)
/// a variable that is named must be set, and the operator's token is required when
/// the API listens on anything but loopback; without, the ones set are read.
fn api_tokens(
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
fn mcp_headers(
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

/// The LLM API keys of a [`NodeConfig::build`], by variable name: every variable
/// `[llm]` names must be set (with `secrets`; without, the ones set are read).
fn llm_keys(
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

/// The Redis URL of a [`NodeConfig::build`], when the bot's transport is `redis`: from
/// `redis.url_env` (which must be set, with `secrets`) or `redis.url`, checked to be a
/// redis:// URL.
fn redis_url(
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

/// The mesh-wide HMAC secrets of a [`NodeConfig::build`]: the ones this node signs
/// with, and the ones it accepts (those plus the previous secret, during a rotation).
/// Without `secrets` (explain-only) there are none.
fn hmac_secrets(
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

/// This bot's Ed25519 signing key of a [`NodeConfig::build`], checked against its
/// `public_key` (none when it has no public key, or without `secrets`).
fn own_signing_key(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_are_platform_qualified_person_ids() {
        let toml = |ops: &str| {
            format!(
                "[mesh]\nsecret_env = \"BOTMESH_SECRET\"\noperators = {ops}\n[[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:1\"\napi = \"127.0.0.1:2\"\n"
            )
        };
        let ok = Settings::from_toml(
            &toml(r#"["local:Boss", "discord:5005", "feishu:ou_1", "dingtalk:m1"]"#),
            Path::new("peers.toml"),
        )
        .expect("valid");
        assert_eq!(ok.mesh.operators.as_ref().map(Vec::len), Some(4));
        let e = Settings::from_toml(&toml(r#"["Boss"]"#), Path::new("peers.toml")).unwrap_err();
        assert!(e.problem.contains("platform:id"), "{e}");
        let e = Settings::from_toml(&toml(r#"["discord:"]"#), Path::new("peers.toml")).unwrap_err();
        assert!(e.problem.contains("empty"), "{e}");
    }

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
