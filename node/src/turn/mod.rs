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
//! - [`control`] — people's control of the bots in the chat: `/quiet`, `/resume`,
//!   `/stop`, `/why`, `/allow`, `/deny` parsed, and the state they act on (the quiet
//!   switches, the groups' stop tokens, the decision trail `/why` reads); the node
//!   carries them out (`app::commands`).
//! - [`shared_judge`] — `[mesh] judge = "shared"`: one bot per message asks the judge
//!   for the whole mesh and broadcasts the verdicts; the others wait for theirs.
//! - [`pipeline`] — `triage` and `act`: the pipeline for one message; its writing step
//!   has the bot's reply engine (`crate::engine::ReplyEngine`: the model, a sidecar,
//!   an ACP agent, a remote A2A agent) write the reply through its one `write`, and
//!   drives the rest (the record, the claim, the status message, `/stop`).
//! - [`engine_host`] — what a turn offers its engine (`engine::context::TurnHost`):
//!   the transcript, the group tools' turn, the permission questions' requester, the
//!   page's progress line, the model's prompt.
//! - [`outcome`] — how an agent's turn ended: the line the chat shows ("stopped by
//!   Alice"), and what the agent is told at its next turn.
//! - [`approval`] — an ACP agent's permission questions in the chat: which `/allow`
//!   or `/deny` answers which question, and who may answer.
//! - [`typing`] — the platform's typing signal, kept on while the reply is written.
//! - [`status`] — a long turn's one status message, edited in place as the work goes
//!   on and ended with how it went.
//! - [`tuning`] — `Tuning`: what a reload may change (the bot, its colleagues, the
//!   LLM endpoints, the mesh's rules, the budget), one snapshot per decision step.
//! - [`record`] — a decision recorded the one way (metrics, trail, log, page).
//! - [`context`] — the group's transcript as a turn reads it.
//! - [`heard_verdicts`] — the shared judge's verdicts heard, by trigger.
//! - [`mod@explain`] — the dry-run of a decision.
//! - [`ports`] — `Ports`, the turn code's view of the node (and of the simulator).
//!
//! The reply engines, the LLM handle they share (`Llm`, `MeteredLlm`) and the daily LLM
//! budget live one layer down, in [`crate::engine`]; `Brain` holds the bot's engine and
//! budget, and lends the engines only what they need.

pub(crate) mod approval;
pub(crate) mod asks;
pub(crate) mod brain;
#[cfg(test)]
mod budget_day;
pub(crate) mod context;
pub(crate) mod control;
pub(crate) mod engine_host;
pub(crate) mod explain;
pub(crate) mod heard_verdicts;
pub(crate) mod judge;
pub(crate) mod mention;
pub(crate) mod outcome;
pub(crate) mod pipeline;
pub(crate) mod policy;
pub(crate) mod ports;
pub(crate) mod record;
pub(crate) mod reply;
pub(crate) mod scheduler;
pub(crate) mod shared_judge;
pub(crate) mod status;
#[cfg(test)]
pub(crate) mod test_ports;
pub(crate) mod tuning;
pub(crate) mod typing;

pub(crate) use crate::engine::Llm;
pub use brain::Brain;
pub(crate) use brain::{roster, roster_with, Provider};
pub use explain::{explain, ExplainRequest, Explanation};
pub(crate) use pipeline::on_message;
pub(crate) use ports::Ports;
