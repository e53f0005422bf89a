//! The reply engines: what writes a bot's reply once it has the turn. This layer sits
//! below `turn/` and above `llm/`, `agent/` and `a2a/`. Every engine is a
//! [`ReplyEngine`] trait object, picked from the config by [`of`]: the turn code asks
//! it what kind of turn it takes (written early, won before the work, none at all) and
//! has it write the reply through one call, [`ReplyEngine::write`], handing in a
//! [`TurnContext`]; it drives the rest (the claim, the status message, `/stop`, the
//! decision record). An engine never sees `turn::Brain` or `turn::Ports`, only the
//! narrow handles the context holds.
//!
//! - [`context`] — what the turn hands an engine ([`TurnContext`]: the trigger, the
//!   metered LLM, handles on the status message, the trail, how an agent's turn ended,
//!   the node stopping, and `TurnHost`: the transcript, the group tools' turn, the
//!   permission questions' requester, the page's progress line, the model's prompt),
//!   what it hands back ([`Written`]), and what a running node hands it to start
//!   ([`Starting`]).
//! - [`metered`] — [`Llm`], the completion the judge and the engines ask for (the
//!   node's client or the simulator's script), and [`MeteredLlm`], the narrow handle
//!   an engine calls it through: the LLM, the bot's daily budget and the metrics.
//! - [`budget`] — the daily LLM budget (`[llm] daily_calls`, `daily_tokens`) that
//!   every call counts against.
//! - [`model`] — the built-in model (a bot without `agent`), with its MCP tools' loop
//!   (`ToolLoop`, over a `MeteredLlm`); it starts the bot's tool servers.
//! - [`sidecar`] — a sidecar webhook takes the turn (`[[bots]] agent = { webhook }`):
//!   its answer now, or later through `POST /v1/messages`.
//! - [`acp`] — a coding agent hosted over ACP (`agent::acp` runs its process): its
//!   start, its prompt, its turn (permission questions, progress, `agent_busy`), its
//!   progress line.
//! - [`external`] — an agent outside the mesh (`agent = { external = true }`) takes
//!   the turns through `botmesh mcp`: the node takes none.
//! - [`a2a`] — a remote A2A agent: each turn is one task there.
//!
//! A new engine is one file (or folder) here and one line in the `engines!` list
//! below: its file declares `pick` (the engine, when the bot's config names it: its
//! variant of `config::AgentEngine`) and implements [`ReplyEngine`].
//!
//! MCP itself (the tool servers' clients, `agent::mcp`) and ACP's process and protocol
//! (`agent::acp`) stay in `agent/`, a lower layer: they speak their protocols and know
//! nothing of turns. (Before this layer the engines lived in `turn/engine.rs`, which
//! called back into `turn::brain` for every reply call, a circle inside `turn/`.)

pub(crate) mod budget;
pub(crate) mod context;
pub(crate) mod metered;

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::agent::mcp::McpTools;
use crate::config::NodeConfig;
use crate::telemetry::metrics::Metrics;

pub(crate) use context::{Starting, TurnContext, Written};
pub(crate) use metered::{Llm, MeteredLlm};

/// A reply an engine wrote, with its completion tokens (counted when it is thrown
/// away).
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    /// The text to post.
    pub text: String,
    /// Completion tokens it cost.
    pub tokens: u64,
}

/// What writes the bot's replies: one per node, picked from the config by [`of`].
/// The defaults describe an engine that takes its turns once the bot is to speak,
/// starts nothing and has no tools.
pub(crate) trait ReplyEngine: Send + Sync {
    /// Its name, for logs.
    fn name(&self) -> &'static str;

    /// Whether the reply may be written while the bot waits its turn (the built-in
    /// model's may; an agent is handed the turn only once the bot is to speak).
    fn writes_early(&self) -> bool {
        false
    }

    /// Whether the node takes the bot's turns at all (not when an agent outside the
    /// mesh takes them through `botmesh mcp`).
    fn takes_turns(&self) -> bool {
        true
    }

    /// Whether an interjecting bot wins the turn (its claim settled and committed)
    /// before the work starts: an agent's turn takes minutes, and must not be lost
    /// while the agent works (docs/agents.md).
    fn wins_turn_first(&self) -> bool {
        false
    }

    /// The built-in model's tool servers, if it has any (a drafting judge offers
    /// their tools too).
    fn tools(&self) -> Option<&Arc<McpTools>> {
        None
    }

    /// Whether its agent asks permission for tool calls in the chat: the node then
    /// hands [`Starting::asker`] in, and posts the questions.
    fn asks_permission(&self) -> bool {
        false
    }

    /// Starts what the engine runs (tool servers, an agent's process): what a running
    /// node does before it serves. An error names what could not start.
    fn start<'a>(&'a mut self, starting: Starting<'a>) -> BoxFuture<'a, anyhow::Result<()>> {
        let _ = starting;
        Box::pin(async { Ok(()) })
    }

    /// Stops what the engine runs, as the node stops.
    fn stop(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Why the engine cannot take a turn now (its agent down), for `/healthz`.
    fn not_ready(&self) -> Option<String> {
        None
    }

    /// Writes the reply to the turn `turn` describes (see [`Written`]). Dropping the
    /// future (a person's `/stop`) abandons the work.
    fn write<'a>(&'a self, turn: &'a TurnContext<'a>) -> BoxFuture<'a, Written>;
}

/// Builds the engine `cfg` names, if it is this one's (`None`: another's).
type Pick = fn(&NodeConfig, &Arc<Metrics>) -> Option<anyhow::Result<Box<dyn ReplyEngine>>>;

/// The engines, one line each: declares each one's module and lists its `pick` in
/// [`ENGINES`].
macro_rules! engines {
    ($($engine:ident,)*) => {
        $(pub(crate) mod $engine;)*
        /// Every engine's `pick`, asked in turn by [`of`].
        static ENGINES: &[Pick] = &[$($engine::pick),*];
    };
}

engines! {
    model,
    sidecar,
    acp,
    external,
    a2a,
}

/// The engine `cfg` gives this node's bot (nothing started yet). An engine that
/// cannot be built (its client) is an error naming the bot.
pub(crate) fn of(cfg: &NodeConfig, metrics: &Arc<Metrics>) -> anyhow::Result<Box<dyn ReplyEngine>> {
    ENGINES
        .iter()
        .find_map(|pick| pick(cfg, metrics))
        .unwrap_or_else(|| {
            Err(anyhow::anyhow!(
                "bot {}: no reply engine takes its `agent` setting",
                cfg.bot().name
            ))
        })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use super::*;
    use crate::config::Settings;

    /// What the turn code asks of an engine before it writes: its name, and whether
    /// it writes early, takes turns, wins the turn before the work, asks permission.
    fn shape(e: &dyn ReplyEngine) -> (&'static str, bool, bool, bool, bool) {
        (
            e.name(),
            e.writes_early(),
            e.takes_turns(),
            e.wins_turn_first(),
            e.asks_permission(),
        )
    }

    /// Each `agent` setting picks its own engine (its file's `pick`, one line in
    /// `engines!`), and the engine says the kind of turn it takes: the same turns the
    /// enum's arms took before the engines became trait objects.
    #[test]
    fn each_agent_setting_picks_its_engine_and_the_turn_it_takes() {
        let data = tempfile::tempdir().expect("tempdir");
        let env: HashMap<String, String> = [(
            "S".to_string(),
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string(),
        )]
        .into();
        let cases = [
            ("", ("model", true, true, false, false)),
            (
                "agent = { webhook = \"http://127.0.0.1:9/turn\" }",
                ("sidecar", false, true, false, false),
            ),
            (
                "agent = { acp = [\"codex-acp\"], cwd = \"/tmp\" }",
                ("acp", false, true, true, true),
            ),
            (
                "agent = { external = true }",
                ("external", false, false, false, false),
            ),
            (
                "agent = { a2a = \"http://127.0.0.1:9\" }",
                ("a2a", false, true, true, false),
            ),
        ];
        for (agent, expected) in cases {
            let text = format!(
                "[mesh]\nsecret_env = \"S\"\n\
                 [[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:1\"\napi = \"127.0.0.1:2\"\n{agent}\n\
                 [[bots]]\nname = \"B\"\nbridge = \"127.0.0.1:3\"\napi = \"127.0.0.1:4\"\n"
            );
            let settings = Settings::from_toml(&text, Path::new("peers.toml")).expect(agent);
            let cfg = NodeConfig::resolve(settings, "A", Some(data.path().to_path_buf()), &env)
                .expect(agent);
            let engine = of(&cfg, &Arc::new(Metrics::new())).expect(agent);
            assert_eq!(shape(&*engine), expected, "{agent}");
            // Nothing is started yet: no tools, and nothing is down.
            assert!(engine.tools().is_none(), "{agent}");
            assert_eq!(engine.not_ready(), None, "{agent}");
        }
    }
}
