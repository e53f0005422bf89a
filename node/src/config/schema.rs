//! The typed settings of peers.toml, as written: every section and key with what it
//! is for and its default. Reading them is `load.rs`, checking them `validate.rs`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::platform::{self, Platform, PlatformTables};
use super::{a2a, acp};

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
    /// A remote A2A agent (`agent = { a2a = "http://…", token_env = … }`, docs/a2a.md).
    A2a(a2a::A2aAgentSettings),
}

impl<'de> Deserialize<'de> for AgentEngine {
    /// Reads the table once, then as the form its key names: the form's own errors
    /// (an unknown key, a wrong type) keep their words.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let table = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
        let form = |e: serde_json::Error| D::Error::custom(e.to_string());
        let forms = ["webhook", "acp", "external", "a2a"]
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
            ["a2a"] => serde_json::from_value(value)
                .map(AgentEngine::A2a)
                .map_err(form),
            ["external"] => match serde_json::from_value(value).map_err(form)? {
                ExternalAgent { external: true } => Ok(AgentEngine::External(ExternalAgent { external: true })),
                ExternalAgent { external: false } => Err(D::Error::custom(
                    "`external = false` is no agent: leave `agent` out for the built-in model",
                )),
            },
            [] => Err(D::Error::custom(
                "needs `webhook = \"http://…\"` (a sidecar), `acp = [\"command\", …]` (an ACP agent), `a2a = \"http://…\"` (a remote A2A agent) or `external = true` (an agent through `botmesh mcp`)",
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
            AgentEngine::Webhook(_) | AgentEngine::External(_) | AgentEngine::A2a(_) => None,
        }
    }
}

fn default_status_after() -> u64 {
    8
}

fn default_status_every() -> u64 {
    3
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
    /// Seconds a turn runs (an ACP agent, the model's tool loop) before the bot posts
    /// one status message in the chat and keeps it up to date while the work goes on
    /// ("Coder is working (1m 10s): cargo test"); 0: no status message.
    #[serde(default = "default_status_after")]
    pub(crate) status_after_secs: u64,
    /// The least time between two edits of a status message: progress that comes
    /// faster is shown in the next edit (the platforms limit edits too).
    #[serde(default = "default_status_every")]
    pub(crate) status_every_secs: u64,
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
    /// The bot served as an A2A agent at its local API (`a2a = { serve = true, … }`,
    /// docs/a2a.md): outside agents' tasks become messages in its group.
    #[serde(default)]
    pub(crate) a2a: Option<a2a::A2aServe>,
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
}

impl Settings {
    /// A bot's transport: its own `transport`, else the mesh's.
    pub(crate) fn transport_of(&self, b: &BotSettings) -> Transport {
        b.transport.unwrap_or(self.mesh.transport)
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
