//! What the turn code hands a reply engine, and what the engine hands back: the one
//! interface between `turn/` (which owns the claim, the decision record, the status
//! message and `/stop`) and the engines below it.
//!
//! - [`TurnContext`] — the turn an engine writes the reply of: the trigger and why the
//!   bot speaks, the metered LLM, and narrow handles on what the turn owns: the status
//!   message ([`ShowWork`]), the trail `/why` reads ([`ToolTrail`]), how an agent's
//!   turn ended ([`TurnOutcome`]), the node stopping, and the rest of what a turn
//!   offers ([`TurnHost`]: the transcript, the group tools' turn, the permission
//!   questions' requester, the page's progress line, the model's prompt). The turn
//!   code implements each (`turn::pipeline`, `turn::status`, `turn::outcome`).
//! - [`Written`] — what the engine made of the turn: a reply, an answer to come later,
//!   or why nothing is posted; the turn code records it and settles the claim.
//! - [`Starting`] — what a running node hands an engine to start what it runs.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::agent::acp::{AcpProgress, GroupServers, PermissionAsker, ToolRejection};
use crate::config::{BotSettings, McpServerSettings, NodeConfig};
use crate::engine::metered::MeteredLlm;
use crate::engine::model::{ShowTool, ToolTrail};
use crate::engine::Reply;
use crate::llm::{ChatMessage, Endpoint};
use crate::telemetry::metrics::Metrics;
use crate::wire::envelope::Envelope;

/// The turn an engine writes the reply of ([`crate::engine::ReplyEngine::write`]).
/// Borrowed for the turn; never `turn::Brain` or `turn::Ports`.
pub(crate) struct TurnContext<'a> {
    /// The message to answer.
    pub(crate) msg: &'a Envelope,
    /// Why the bot speaks: `mentioned`, `interjected`, `always_answers`.
    pub(crate) why: &'a str,
    /// The judge's relevance, for an interjection.
    pub(crate) relevance: Option<f64>,
    /// The bot's settings as the turn took them (a reload applies from the next).
    pub(crate) me: &'a BotSettings,
    /// `[mesh] ask_timeout_secs`: a model's `ask` tool call waits no longer.
    pub(crate) ask_timeout_secs: u64,
    /// The LLM, counted against the bot's daily budget and in the metrics.
    pub(crate) llm: MeteredLlm<'a>,
    /// The turn's status message: the work's progress and, when the engine knows
    /// better than "answered or not", how it ended.
    pub(crate) status: &'a dyn ShowWork,
    /// The decision trail a person's `/why` reads.
    pub(crate) trail: &'a dyn ToolTrail,
    /// How an agent's turn ended, said in the chat once it has (`turn::outcome`).
    pub(crate) outcome: &'a dyn TurnOutcome,
    /// Cancelled when the node stops taking turns: a long turn gives up (its future
    /// dropped, which cancels the work at the agent).
    pub(crate) stopping: &'a CancellationToken,
    /// The rest of what the turn offers.
    pub(crate) host: &'a dyn TurnHost,
}

/// What the turn code offers an engine beyond the LLM and the status: its reads of
/// the group and the turn-side state an agent's turn touches. Implemented by the
/// pipeline's writing step for the trigger it is about.
pub(crate) trait TurnHost: Sync {
    /// Up to `n` messages before the trigger in its group, oldest first (people's
    /// commands left out).
    fn before(&self, n: usize) -> Vec<Arc<Envelope>>;
    /// The final versions of the bots' status messages among the group's last `n`
    /// records, oldest first (what an agent's last turn ended with).
    fn status_ends(&self, n: usize) -> Vec<Arc<Envelope>>;
    /// Whether a group tool already handed message `id` to the bot's agent.
    fn consumed(&self, id: &Ulid) -> bool;
    /// Marks the turn in flight for the group tools (an `ask` continues it and is
    /// counted in it) until the returned mark is dropped.
    fn mark_turn(&self) -> Box<dyn Send + '_>;
    /// An agent is prompted with what was said up to the trigger (`detail`, for
    /// `/why`): what was addressed to the bot up to it is handed out, and the turn is
    /// marked in flight ([`TurnHost::mark_turn`]) until the returned mark is dropped.
    fn prompted(&self, detail: &str) -> Box<dyn Send + '_>;
    /// The permission questions asked in this turn are answered by whoever started
    /// it (followed back through `before`), or an operator.
    fn permissions_from(&self, before: &[Arc<Envelope>]);
    /// An agent's progress on the turn (a tool call, a remote task's status): the
    /// page's live line under the trigger.
    fn progress(&self, text: String);
    /// Notes a tool call the agent was not let run, for `/why`.
    fn rejected(&self, rejection: &ToolRejection);
    /// The built-in model's prompt for this turn over `context`.
    fn model_prompt(&self, context: &[Arc<Envelope>]) -> ModelPrompt;
}

/// The built-in model's prompt for a turn, as the turn code (which owns the bot's
/// persona) writes it.
pub(crate) enum ModelPrompt {
    /// No LLM is configured: the placeholder answer to post.
    Offline(String),
    /// The reply call: its endpoint and messages.
    Remote {
        /// The reply endpoint.
        ep: Endpoint,
        /// The messages to complete.
        messages: Vec<ChatMessage>,
    },
}

/// The running turn's status message as an engine reports to it (the turn code's
/// `StatusFeed`, which this layer cannot name): tool calls ([`ShowTool`]), an
/// agent's progress, and how the work ended.
pub(crate) trait ShowWork: ShowTool {
    /// Shows an ACP agent's progress (a tool call by its title, a plan's step).
    fn show_agent(&self, update: &AcpProgress);
    /// Tells the status how the work ended, when it knows better than "answered or
    /// not".
    fn work_ended(&self, how: WorkEnded);
}

/// How the work ended, as an engine tells the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WorkEnded {
    /// The node is shutting down.
    ShutDown,
    /// The work failed: why.
    Failed(String),
}

/// How an agent's turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The agent answered: its answer was posted.
    Answered,
    /// A person's `/stop` ended it.
    Stopped {
        /// Who said `/stop`.
        by: String,
    },
    /// The agent ended its turn with nothing to post (or was cancelled by itself).
    NoAnswer,
    /// The turn failed: timed out, the agent crashed or broke the protocol.
    Failed {
        /// Why, in a few words.
        why: String,
    },
}

/// Where an engine leaves how its turn ended (the turn code's `OutcomeSlot`): set
/// when the agent is handed the turn (so a `/stop` from then on is said), replaced
/// when the turn ends, cleared when nothing is to be said.
pub(crate) trait TurnOutcome: Sync {
    /// The turn now ends (or, until replaced, would end) as `ended`, with the tool
    /// calls `rejected` in it.
    fn set(&self, ended: Ended, rejected: Vec<ToolRejection>);
    /// Nothing is to be said of this turn.
    fn clear(&self);
}

/// What an engine made of a turn.
#[derive(Debug)]
pub(crate) enum Written {
    /// The reply to post.
    Reply(Reply),
    /// The engine answers later on its own (a sidecar through `POST /v1/messages`):
    /// recorded as `reply/handed_to_agent` with `detail`; the claim stands.
    Later {
        /// How the answer comes, for the record.
        detail: &'static str,
    },
    /// Nothing to post: recorded as `silent/{reason}`, and the claim withdrawn.
    Silent(Silence),
}

/// Why a turn posts nothing, for the decision record and the claim's withdrawal.
#[derive(Debug)]
pub(crate) struct Silence {
    /// The record's reason (`agent_failed`, `agent_silent`, `reply_failed`…).
    pub(crate) reason: &'static str,
    /// The record's detail.
    pub(crate) detail: String,
    /// Why the claim is withdrawn, for its log line.
    pub(crate) withdraw: &'static str,
}

impl Written {
    /// Nothing to post: `silent/{reason}` with `detail`, the claim withdrawn for
    /// `withdraw`.
    pub(crate) fn silent(
        reason: &'static str,
        detail: impl Into<String>,
        withdraw: &'static str,
    ) -> Written {
        Written::Silent(Silence {
            reason,
            detail: detail.into(),
            withdraw,
        })
    }
}

/// What a running node hands an engine to start what it runs
/// ([`crate::engine::ReplyEngine::start`]; `botmesh explain` starts nothing).
pub(crate) struct Starting<'a> {
    /// The node's configuration.
    pub(crate) cfg: &'a NodeConfig,
    /// The node's `mesh` MCP server for the built-in model (`group_tools = true`).
    pub(crate) model_mesh: Option<McpServerSettings>,
    /// The `mesh` MCP server for each group's session of a coding agent.
    pub(crate) group_servers: Option<GroupServers>,
    /// Where the engine's work is counted.
    pub(crate) metrics: Arc<Metrics>,
    /// Where an agent's permission questions go (the chat's `/allow`, `/deny`), for an
    /// engine that [asks](crate::engine::ReplyEngine::asks_permission).
    pub(crate) asker: Option<Arc<dyn PermissionAsker>>,
}
