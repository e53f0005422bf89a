//! What the reply engines (`crate::engine`) run: a bot's MCP tool servers ([`mcp`]),
//! a coding agent hosted over ACP ([`acp`]: its process and protocol), and the `mesh`
//! MCP server, the group as tools for an agent ([`mesh`], `botmesh mcp`); agents and
//! stdio MCP servers run in a Landlock box ([`sandbox`]), started the one way
//! [`boxing`] says. The engines layer above chooses among them behind one boundary
//! (`engine::ReplyEngine`), where the ACP client is `engine::acp::AcpEngine`.
//!
//! This folder sits below `llm/` and above `config/`: it speaks its own protocols
//! (MCP, ACP) and knows nothing of chat messages or the model's wire
//! shape.

pub mod acp;
pub(crate) mod boxing;
pub(crate) mod mcp;
pub mod mesh;
pub mod sandbox;
pub(crate) mod stderr;
