//! The bots' manners: everything between a recorded message and a reply, talking to
//! the rest of the node only through [`Ports`].
//!
//! - [`mention`] — `MentionMatcher`: @mentions with real Latin and CJK boundaries.
//! - [`policy`] — depth, quiet, caps, participation: the rules no prompt can bend.
//! - [`judge`] — the short "should I interject?" prompt and the offline judge.
//! - [`scheduler`] — relevance-scaled delays, claims and yielding (`ClaimBoard`).
//! - [`reply`] — the reply prompt and the offline reply.
//! - [`brain`] — `Brain`: a bot's turn-taking state and its LLM questions.
//! - [`pipeline`] — `triage` and `act`: the pipeline for one message.
//! - [`explain`] — the dry-run of a decision.
//! - [`ports`] — `Ports`, the turn code's view of the node (and of the simulator).

pub mod brain;
pub mod explain;
pub mod judge;
pub mod mention;
pub mod pipeline;
pub mod policy;
pub mod ports;
pub mod reply;
pub mod scheduler;

pub use brain::{endpoints, roster, Brain, Provider};
pub use explain::{explain, ExplainRequest, Explanation};
pub use pipeline::{consider, triage, RATE_WINDOW_MS};
pub use ports::{Llm, Ports};
