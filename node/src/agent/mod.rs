//! Reply engines beyond the built-in model, and what they use: a bot's MCP tool
//! servers ([`mcp`]) and the sidecar webhook ([`sidecar`]). The turn code chooses
//! among them behind one boundary (`turn::engine::ReplyEngine`); an ACP agent process
//! is meant to be one more module here and one more variant there.
//!
//! This folder sits below `llm/` and above `config/`: it speaks its own protocols
//! (MCP, HTTP webhooks) and knows nothing of chat messages or the model's wire shape.

pub(crate) mod mcp;
pub(crate) mod sidecar;
