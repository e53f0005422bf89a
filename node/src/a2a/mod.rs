//! A2A (Agent2Agent 1.0) at the mesh's edge (docs/a2a.md): a bot served as an A2A
//! agent, so that agents outside the group chat can hand it tasks that everyone in the
//! group sees.
//!
//! - [`rpc`] — the wire: JSON-RPC requests and errors, task states, messages, as the
//!   official SDK (`a2a-sdk` 1.x) speaks them.
//! - [`card`] — the served bot's Agent Card.
//! - [`tasks`] — `TaskStore`: the served tasks, bounded and on disk beside the
//!   transcripts.
//! - [`client`] — `A2aClient`: the node calling a remote agent (a bot's reply
//!   engine, `engine::a2a`).
//! - [`conversations`] — a remote agent's conversations with the bot's groups
//!   (`contextId`, a task waiting for input), on disk so a restart goes on with them.
//! - [`server`] — the JSON-RPC endpoint: a caller's message into the group, the bot's
//!   turn followed to the task's end, behind the narrow `A2aHost` handle the node gives.

pub mod card;
pub mod client;
pub(crate) mod conversations;
pub mod rpc;
pub(crate) mod server;
pub(crate) mod tasks;
