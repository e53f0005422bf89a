//! An ACP client: a bot's reply written by a coding agent (Codex, Claude Code, Gemini
//! CLI, opencode, …) run as a child process and spoken to in the Agent Client Protocol
//! (JSON-RPC 2.0 over its stdio).
//!
//! [`AcpAgent::start`] spawns the agent ([`process`]: clean environment, own process
//! group) and initializes it; [`AcpAgent::prompt`] runs one turn for a group in that
//! group's session (opened on first use and kept), collecting the agent's message
//! chunks into the reply and reporting its tool calls and plan as [`AcpProgress`].
//! The agent's permission questions are answered by the tool call's kind
//! ([`AcpSettings::allow`], [`AcpSettings::ask`] through a [`PermissionAsker`], anything
//! else rejected). A turn that runs past `turn_timeout_secs`, is [`cancelled`]
//! (`/stop`) or whose future is dropped sends `session/cancel`. When the process dies
//! the turn in flight fails with [`AcpError::Died`] and a supervisor restarts it with
//! [`Backoff`]; sessions are reopened on the next prompt, which says so
//! ([`TurnOutcome::new_session`]) and sends the caller's context first.
//!
//! ACP's messages are the spec maintainers' types ([`schema`], the
//! `agent-client-protocol-schema` crate), read tolerantly ([`messages`]); the
//! transport is this module's own ([`rpc`]).
//!
//! This is the library layer: the ACP reply engine (`engine::acp::AcpEngine`) wires
//! it to `[[bots]] agent = { acp = … }`.
//!
//! [`cancelled`]: AcpAgent::cancel
//! [`Backoff`]: crate::config::pacing::Backoff

mod action;
mod client;
mod messages;
pub(crate) mod process;
pub(crate) mod rpc;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

pub use crate::config::acp::{AcpSettings, ToolKind};
pub use action::{tool_action, ToolObject};
pub use client::AcpAgent;
pub use messages::schema;

/// Why an ACP turn or start failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcpError {
    /// The agent's process could not be started: the command or `cwd` is wrong.
    #[error("cannot start the ACP agent `{command}`: {reason}")]
    Spawn {
        /// The command line, as configured.
        command: String,
        /// Why (the operating system's words, or the missing directory).
        reason: String,
    },
    /// The agent's process died or spoke garbage; it is being restarted.
    #[error("the ACP agent died: {reason}{}", status.as_ref().map(|s| format!(" ({s})")).unwrap_or_default())]
    Died {
        /// What was seen (its output ended, a line that was not JSON, …).
        reason: String,
        /// Its exit status, when it had exited.
        status: Option<String>,
    },
    /// The agent answered a request with a JSON-RPC error.
    #[error("the ACP agent refused `{method}`: {message} (code {code})")]
    Refused {
        /// The request it refused.
        method: String,
        /// The JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// The agent's answer did not have the shape ACP gives it.
    #[error("the ACP agent answered `{method}` with something unexpected: {problem}")]
    Protocol {
        /// The request answered.
        method: String,
        /// What was wrong with the answer.
        problem: String,
    },
    /// The turn ran past `turn_timeout_secs` and was cancelled.
    #[error("the ACP agent's turn took longer than {0:?} and was cancelled")]
    TimedOut(Duration),
    /// The group already has a turn in flight (one at a time per session).
    #[error("group {0:?} already has an ACP turn in flight")]
    Busy(String),
    /// [`AcpAgent::stop`] was called.
    #[error("the ACP agent is stopped")]
    Stopped,
    /// The agent cannot be boxed: no Landlock, or no launcher (`agent::sandbox`).
    #[error(transparent)]
    Sandbox(#[from] crate::agent::sandbox::SandboxError),
}

impl AcpError {
    /// A stable snake_case label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            AcpError::Spawn { .. } => "spawn_failed",
            AcpError::Died { .. } => "died",
            AcpError::Refused { .. } => "refused",
            AcpError::Protocol { .. } => "protocol_error",
            AcpError::TimedOut(_) => "timed_out",
            AcpError::Busy(_) => "busy",
            AcpError::Stopped => "stopped",
            AcpError::Sandbox(_) => "sandbox",
        }
    }
}

/// Why the agent ended a turn (ACP's `StopReason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// It finished.
    EndTurn,
    /// It ran out of tokens: the text is cut.
    MaxTokens,
    /// It made as many model requests as it may in one turn.
    MaxTurnRequests,
    /// It refused to go on.
    Refusal,
    /// The turn was cancelled (`session/cancel`): no text.
    Cancelled,
    /// A reason this client does not know (a newer agent).
    Other(String),
}

impl StopReason {
    /// A stable snake_case label for metrics and logs (`other` for unknown reasons).
    pub fn label(&self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::MaxTurnRequests => "max_turn_requests",
            StopReason::Refusal => "refusal",
            StopReason::Cancelled => "cancelled",
            StopReason::Other(_) => "other",
        }
    }
}

/// What a turn came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnOutcome {
    /// Why the agent stopped.
    pub stop_reason: StopReason,
    /// The reply: the agent's message chunks in order (empty when cancelled; what came
    /// before the cut for `max_tokens` and `refusal`).
    pub text: String,
    /// This turn opened the group's session (first turn, or the agent was restarted):
    /// the agent saw only this prompt and the context sent with it.
    pub new_session: bool,
    /// The tool calls rejected in this turn, in order: the chat is told, and so is
    /// the agent at its next turn (`turn::outcome`).
    pub rejected: Vec<ToolRejection>,
}

/// A tool call the agent was not let run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRejection {
    /// What it would have done, in words ([`tool_action`]: `fetch https://…`).
    pub action: String,
    /// Its kind.
    pub kind: ToolKind,
    /// Why it was rejected.
    pub why: Rejection,
}

/// Why a tool call was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Its kind is neither in `allow` nor in `ask`: rejected without asking.
    NotAllowed,
    /// Its kind is asked about, but the agent has no one to ask.
    NoOneToAsk,
    /// The chat said no: `/deny` by this person, or (`None`) the question could not be
    /// put (another one waits, or the loop brake held it).
    Denied {
        /// Who said `/deny`, when a person did.
        by: Option<String>,
    },
    /// No one answered within `ask_timeout_secs`.
    Unanswered,
}

/// What to send as one turn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcpPrompt {
    /// The turn's text (what was said since the bot's last turn).
    pub text: String,
    /// Sent before `text` only when the turn opens a new session (the recent
    /// transcript), so an agent restarted in the middle of a conversation is not lost.
    pub context: Option<String>,
}

impl From<&str> for AcpPrompt {
    fn from(text: &str) -> Self {
        AcpPrompt {
            text: text.to_string(),
            context: None,
        }
    }
}

/// Something the agent is doing, for the chat to show ("working: cargo test…").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcpProgress {
    /// A tool call started or changed (`tool_call`, `tool_call_update`).
    ToolCall {
        /// The agent's id for the call.
        id: String,
        /// Its title (`cargo test`, `Read src/main.rs`), the last one given.
        title: String,
        /// Its kind.
        kind: ToolKind,
        /// `pending`, `in_progress`, `completed`, `failed` (empty when not given yet).
        status: String,
    },
    /// The agent's plan, whole (each `plan` update replaces it).
    Plan(Vec<PlanStep>),
    /// The agent began writing its answer (its first message chunk of the turn), so
    /// a turn without tool calls shows it is alive too.
    Writing,
}

/// One entry of an agent's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanStep {
    /// What the step does.
    pub content: String,
    /// `pending`, `in_progress` or `completed`.
    pub status: String,
}

/// A permission question put to the people in the chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionQuestion {
    /// The bot whose agent asks.
    pub bot: String,
    /// The group the turn is for.
    pub group: String,
    /// The tool call's title (`rm -rf target`, `Edit src/lib.rs`).
    pub title: String,
    /// The tool call's kind.
    pub kind: ToolKind,
    /// What it would do, in words ([`tool_action`]: `edit notes.txt`, ``run `cargo
    /// test` ``): the question says "Coder wants to edit notes.txt".
    pub action: String,
}

/// What the people in the chat answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allow this one call.
    Allow,
    /// Reject it.
    Deny {
        /// The person who said `/deny`; `None`: rejected without a person's word (the
        /// question could not be put).
        by: Option<String>,
    },
    /// No one answered in time: rejected.
    TimedOut,
}

/// Asks the people in the chat about a tool call whose kind is in `ask`. The answer is
/// awaited at most `ask_timeout_secs` (then the call is rejected), and not at all once
/// the turn is cancelled.
pub trait PermissionAsker: Send + Sync {
    /// Puts the question and waits for the answer.
    fn ask(&self, question: PermissionQuestion) -> BoxFuture<'static, Decision>;
}

/// Makes one group's MCP servers.
type ServersOfGroup = dyn Fn(&str) -> Vec<schema::McpServer> + Send + Sync;

/// MCP servers for one group's session, by group (the node's `mesh` server, scoped
/// to the bot and that group), and the programs they run.
#[derive(Clone)]
pub struct GroupServers {
    /// The programs of these stdio servers, the same in every group: what the agent's
    /// box must let them read, known without making any group's servers (and so
    /// without minting a group's credential).
    programs: Vec<String>,
    /// The servers of one group, each with that group's credential.
    of_group: Arc<ServersOfGroup>,
}

impl GroupServers {
    /// Servers made by `of_group` for each group, running `programs`.
    pub fn new(
        programs: Vec<String>,
        of_group: impl Fn(&str) -> Vec<schema::McpServer> + Send + Sync + 'static,
    ) -> GroupServers {
        GroupServers {
            programs,
            of_group: Arc::new(of_group),
        }
    }

    /// The servers for `group`'s session.
    pub(crate) fn of_group(&self, group: &str) -> Vec<schema::McpServer> {
        (self.of_group)(group)
    }

    /// The programs the servers run, in every group.
    pub(crate) fn programs(&self) -> &[String] {
        &self.programs
    }
}

/// What a caller gives the agent besides its settings.
#[derive(Clone, Default)]
pub struct AcpOptions {
    /// MCP servers handed to every `session/new` (stdio: `{name, command, args, env}`,
    /// or `{type: "http", name, url, headers}` on the wire).
    pub mcp_servers: Vec<schema::McpServer>,
    /// MCP servers added to a session for its group only, after `mcp_servers`.
    pub group_servers: Option<GroupServers>,
    /// Who answers questions about kinds in `ask`; without one they are rejected.
    pub asker: Option<Arc<dyn PermissionAsker>>,
    /// Where turns and restarts are counted (`botmesh_agent_turns_total`,
    /// `botmesh_agent_restarts_total`), when the node has metrics.
    pub metrics: Option<Arc<crate::telemetry::metrics::Metrics>>,
    /// The botmesh binary that boxes the agent (`None`:
    /// [`crate::agent::sandbox::launcher_path`]); unused with `sandbox = "off"`.
    pub sandbox_launcher: Option<std::path::PathBuf>,
    /// Paths the agent's box never reaches: the node's data dir, config, key and
    /// secret files.
    pub sandbox_deny: Vec<std::path::PathBuf>,
}

impl std::fmt::Debug for AcpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcpOptions")
            .field("mcp_servers", &self.mcp_servers)
            .field("group_servers", &self.group_servers.is_some())
            .field("asker", &self.asker.is_some())
            .field("metrics", &self.metrics.is_some())
            .field("sandbox_launcher", &self.sandbox_launcher)
            .field("sandbox_deny", &self.sandbox_deny)
            .finish()
    }
}
