//! An agent outside the mesh takes the bot's turns (`[[bots]] agent = { external =
//! true }`, docs/agents.md): it reads the group and answers through `botmesh mcp`
//! (`wait_for_message`, `post`), so the node takes none of the bot's turns itself
//! (`silent/external_agent`).

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::config::{AgentEngine, NodeConfig};
use crate::engine::context::{TurnContext, Written};
use crate::engine::ReplyEngine;
use crate::telemetry::metrics::Metrics;

/// The engine of a bot whose turns an outside agent takes: it takes none.
pub(crate) struct External;

/// The engine of a bot with `agent = { external = true }`.
pub(crate) fn pick(
    cfg: &NodeConfig,
    _metrics: &Arc<Metrics>,
) -> Option<anyhow::Result<Box<dyn ReplyEngine>>> {
    matches!(cfg.bot().agent, Some(AgentEngine::External(_)))
        .then(|| Ok(Box::new(External) as Box<dyn ReplyEngine>))
}

impl ReplyEngine for External {
    fn name(&self) -> &'static str {
        "external"
    }

    fn takes_turns(&self) -> bool {
        false
    }

    /// Never asked (the turn code takes no turn of this bot's); should it be, the
    /// turn posts nothing and says why.
    fn write<'a>(&'a self, _turn: &'a TurnContext<'a>) -> BoxFuture<'a, Written> {
        Box::pin(async {
            Written::silent(
                "external_agent",
                "an outside agent takes this bot's turns",
                "external agent",
            )
        })
    }
}
