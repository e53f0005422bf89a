//! Reply engines beyond the built-in model, and what they use: a bot's MCP tool
//! servers ([`mcp`]), the sidecar webhook ([`sidecar`]), and a coding agent hosted
//! over ACP ([`acp`]), and the `mesh` MCP server, the group as tools for an agent
//! ([`mesh`], `botmesh mcp`); agents and stdio MCP servers run in a Landlock box
//! ([`sandbox`]), started the one way [`boxing`] says. The turn code chooses among them behind one boundary
//! (`turn::engine::ReplyEngine`), where the ACP client is the `Acp` variant.
//!
//! This folder sits below `llm/` and above `config/`: it speaks its own protocols
//! (MCP, ACP, HTTP webhooks) and knows nothing of chat messages or the model's wire
//! shape.

pub mod acp;
pub(crate) mod boxing;
pub(crate) mod mcp;
pub mod mesh;
pub mod sandbox;
pub(crate) mod sidecar;
pub(crate) mod stderr;
