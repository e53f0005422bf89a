//! The bots' manners: everything between a recorded message and a reply, talking to
//! the rest of the node only through [`Ports`].
//!
//! - [`mention`] — `MentionMatcher`: @mentions with real Latin and CJK boundaries.
//! - [`policy`] — depth, quiet, caps, participation: the rules no prompt can bend.
//! - [`judge`] — the short "should I interject?" prompt and the offline judge.
//! - [`scheduler`] — relevance-scaled delays, claims and yielding (`ClaimBoard`).
//! - [`reply`] — the reply prompt and the offline reply.
//! - [`brain`] — `Brain`: a bot's turn-taking state, its tuning (what a reload
//!   changes) and its LLM questions.
//! - [`asks`] — the group tools' state: questions to colleagues waiting for their
//!   answer, each group's turn in flight, the messages addressed to the bot.
//! - [`budget`] — the daily LLM budget (`[llm] daily_calls`, `daily_tokens`).
//! - [`control`] — people's control of the bots in the chat: `/quiet`, `/resume`,
//!   `/stop`, `/why`, `/allow`, `/deny` parsed, and the state they act on (the quiet
//!   switches, the groups' stop tokens, the decision trail `/why` reads); the node
//!   carries them out (`app::commands`).
//! - [`shared_judge`] — `[mesh] judge = "shared"`: one bot per message asks the judge
//!   for the whole mesh and broadcasts the verdicts; the others wait for theirs.
//! - [`engine`] — `ReplyEngine`: the model (with its MCP tools' loop) or a sidecar
//!   webhook writes the reply.
//! - [`a2a_engine`] — `RemoteAgent`: a remote A2A agent writes the reply, one task a
//!   turn.
//! - [`pipeline`] — `triage` and `act`: the pipeline for one message.
//! - [`outcome`] — how an agent's turn ended: the line the chat shows ("stopped by
//!   Alice"), and what the agent is told at its next turn.
//! - [`approval`] — an ACP agent's permission questions in the chat: which `/allow`
//!   or `/deny` answers which question, and who may answer.
//! - [`typing`] — the platform's typing signal, kept on while the reply is written.
//! - [`status`] — a long turn's one status message, edited in place as the work goes
//!   on and ended with how it went.
//! - [`explain`] — the dry-run of a decision.
//! - [`ports`] — `Ports`, the turn code's view of the node (and of the simulator).

pub(crate) mod a2a_engine;
pub(crate) mod approval;
pub(crate) mod asks;
pub(crate) mod brain;
pub(crate) mod budget;
pub(crate) mod control;
pub(crate) mod engine;
pub(crate) mod explain;
pub(crate) mod judge;
pub(crate) mod mention;
pub(crate) mod outcome;
pub(crate) mod pipeline;
pub(crate) mod policy;
pub(crate) mod ports;
pub(crate) mod reply;
pub(crate) mod scheduler;
pub(crate) mod shared_judge;
pub(crate) mod status;
#[cfg(test)]
pub(crate) mod test_ports;
pub(crate) mod typing;

pub use brain::Brain;
pub(crate) use brain::{roster, Provider};
pub use explain::{explain, ExplainRequest, Explanation};
pub(crate) use pipeline::on_message;
pub(crate) use ports::{Llm, Ports};
