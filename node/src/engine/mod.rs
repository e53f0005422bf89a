//! The reply engines: what writes a bot's reply once it has the turn. This layer sits
//! below `turn/` and above `llm/`, `agent/` and `a2a/`: the turn code chooses an
//! engine through one enum, [`ReplyEngine`], and drives it (the claim, the status
//! message, `/stop`, the decision record); an engine never sees `turn::Brain` or
//! `turn::Ports`, only what it needs.
//!
//! - [`metered`] — [`Llm`], the completion the judge and the engines ask for (the
//!   node's client or the simulator's script), and [`MeteredLlm`], the narrow handle
//!   an engine calls it through: the LLM, the bot's daily budget and the metrics.
//! - [`budget`] — the daily LLM budget (`[llm] daily_calls`, `daily_tokens`) that
//!   every call counts against.
//! - [`model`] — the built-in model with its MCP tools' loop (`ToolLoop`, over a
//!   `MeteredLlm`; the trail and status message it writes to come in as narrow
//!   handles, `ToolTrail` and `ShowTool`).
//! - [`sidecar`] — a sidecar webhook takes the turn (`[[bots]] agent = { webhook }`).
//! - [`acp`] — a coding agent hosted over ACP (`agent::acp` runs its process): its
//!   start, its prompt, its turn, its progress line.
//! - [`a2a`] — a remote A2A agent: each turn is one task there.
//!
//! MCP itself (the tool servers' clients, `agent::mcp`) and ACP's process and protocol
//! (`agent::acp`) stay in `agent/`, a lower layer: they speak their protocols and know
//! nothing of turns.
//!
//! Before this layer the engines lived in `turn/engine.rs`, which called back into
//! `turn::brain` for every reply call (`engine` → `brain::call_reply` → `engine`, a
//! circle inside `turn/`); the tool loop now makes its calls through [`MeteredLlm`].
//!
//! A new engine is one file (or folder) here, its `mod` line below, and its variant of
//! [`ReplyEngine`]: the arm of [`ReplyEngine::of`] that picks it from the config, and
//! the arm of `turn::pipeline`'s writing step that drives it (the engines' turns differ
//! too much — an answer later over HTTP, a permission question, a remote task's
//! progress — for one `write` method to carry them all without hiding what each does).

pub(crate) mod a2a;
pub(crate) mod acp;
pub(crate) mod budget;
pub(crate) mod metered;
pub(crate) mod model;
pub(crate) mod sidecar;

use std::sync::Arc;

use crate::agent::acp::AcpAgent;
use crate::agent::mcp::McpTools;
use crate::config::{AgentEngine, NodeConfig};
use crate::telemetry::metrics::Metrics;

pub(crate) use metered::{Llm, MeteredLlm};

/// A reply an engine wrote, with its completion tokens (counted when it is thrown
/// away).
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    /// The text to post.
    pub text: String,
    /// Completion tokens it cost.
    pub tokens: u64,
}

/// What writes the bot's replies. (One per node, so the variants' size difference
/// is moot.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum ReplyEngine {
    /// The built-in model (or the offline provider), with the bot's MCP tool servers
    /// when it has some (`None`: no tools; started by `turn::Brain::start_tools`).
    Model {
        /// The bot's tool servers.
        tools: Option<Arc<McpTools>>,
    },
    /// A sidecar webhook (`[[bots]] agent`): the turn is handed to an external bot.
    Sidecar(sidecar::Webhook),
    /// A coding agent hosted over ACP (`[[bots]] agent = { acp = … }`): `None` until
    /// the running node starts it (`turn::Brain::start_agent`; `botmesh explain` never
    /// does).
    Acp(Option<Arc<AcpAgent>>),
    /// An agent outside the mesh (`[[bots]] agent = { external = true }`) takes the
    /// turns through `botmesh mcp`: the node takes none itself.
    External,
    /// A remote A2A agent (`[[bots]] agent = { a2a = … }`): each turn is a task there.
    A2a(Arc<a2a::RemoteAgent>),
}

impl ReplyEngine {
    /// The engine `cfg` gives this node's bot (tool servers not started yet).
    pub(crate) fn of(cfg: &NodeConfig, metrics: &Arc<Metrics>) -> reqwest::Result<ReplyEngine> {
        Ok(match &cfg.bot().agent {
            Some(AgentEngine::Webhook(a)) => ReplyEngine::Sidecar(sidecar::Webhook::new(a)?),
            Some(AgentEngine::A2a(a)) => ReplyEngine::A2a(Arc::new(a2a::RemoteAgent::new(
                a,
                cfg.a2a_agent_token.clone(),
                &cfg.bot().name,
                Some(&cfg.data_dir),
                metrics.clone(),
            )?)),
            Some(AgentEngine::Acp(_)) => ReplyEngine::Acp(None),
            Some(AgentEngine::External(_)) => ReplyEngine::External,
            None => ReplyEngine::Model { tools: None },
        })
    }

    /// Whether the reply may be written while the bot waits its turn: the model's
    /// may; a sidecar or an ACP agent is handed the turn only once the bot is to speak.
    pub(crate) fn writes_early(&self) -> bool {
        matches!(self, ReplyEngine::Model { .. })
    }

    /// The model's tool servers, if it has any.
    pub(crate) fn tools(&self) -> Option<&Arc<McpTools>> {
        match self {
            ReplyEngine::Model { tools } => tools.as_ref().filter(|t| !t.is_empty()),
            ReplyEngine::Sidecar(_)
            | ReplyEngine::Acp(_)
            | ReplyEngine::External
            | ReplyEngine::A2a(_) => None,
        }
    }
}
