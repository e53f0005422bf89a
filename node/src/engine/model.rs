//! The built-in model engine: the bot's LLM writes the reply, with the tools of its
//! MCP servers (`[[bots.mcp]]`, and the node's `mesh` server with `group_tools`) when
//! it has some.
//!
//! The tool loop ([`ToolLoop::run`]): the reply call offers the tools of the servers
//! that are up; each tool call the model asks for runs on its server (bounded in time
//! and size, see `agent::mcp`) and its result goes back as a `tool` message; then the
//! model is called again. After `max_tool_rounds` rounds of tool calls, one last call
//! offers no tools, so the model answers with what it has. Every call is a reply call
//! made through the bot's [`MeteredLlm`]: counted against the daily budget and in
//! `botmesh_llm_calls_total{purpose="reply"}`. Each tool call is logged, counted in
//! `botmesh_tool_calls_total`, noted in the trail `/why` reads ([`ToolTrail`]) and
//! shown on the running turn's status message ([`ShowTool`]).
//!
//! The engine ([`Model`]) is the bot's when it has no `agent`: it starts the bot's
//! tool servers, may write while the bot waits its turn, and a turn with tools ends
//! visibly as an agent's does (stopped, or without an answer: `turn::outcome`). The
//! prompt is the turn code's (it owns the bot's persona, [`ModelPrompt`]); the call,
//! the tool loop and their counting are here ([`ReplyEngine::write`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use ulid::Ulid;

use crate::agent::mcp::{McpTools, ToolResult};
use crate::config::{BotSettings, NodeConfig};
use crate::engine::context::{Ended, ModelPrompt, Starting, TurnContext, Written};
use crate::engine::metered::{LlmCall, MeteredLlm};
use crate::engine::{Reply, ReplyEngine};
use crate::llm::{ChatMessage, Completion, Endpoint, Purpose, ToolSpec};
use crate::telemetry::metrics::Metrics;
use crate::wire::envelope::Envelope;

/// The built-in model (or the offline provider), with the bot's MCP tool servers once
/// the running node has started them.
#[derive(Default)]
pub(crate) struct Model {
    /// The bot's tool servers (`None`: none, or not started: `botmesh explain`).
    tools: Option<Arc<McpTools>>,
}

/// The engine of a bot without `agent`: the built-in model.
pub(crate) fn pick(
    cfg: &NodeConfig,
    _metrics: &Arc<Metrics>,
) -> Option<anyhow::Result<Box<dyn ReplyEngine>>> {
    cfg.bot()
        .agent
        .is_none()
        .then(|| Ok(Box::new(Model::default()) as Box<dyn ReplyEngine>))
}

impl ReplyEngine for Model {
    fn name(&self) -> &'static str {
        "model"
    }

    fn writes_early(&self) -> bool {
        true
    }

    fn tools(&self) -> Option<&Arc<McpTools>> {
        self.tools.as_ref().filter(|t| !t.is_empty())
    }

    fn start<'a>(&'a mut self, starting: Starting<'a>) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(self.start_tools(starting))
    }

    fn write<'a>(&'a self, turn: &'a TurnContext<'a>) -> BoxFuture<'a, Written> {
        Box::pin(self.take_turn(turn))
    }
}

impl Model {
    /// Starts the bot's MCP tool servers (`[[bots.mcp]]`, then the node's own `mesh`
    /// server with `group_tools = true`), whose tools the model is offered from now
    /// on. A stdio server runs boxed unless its `sandbox = "off"` (a warning, at every
    /// start); a kernel or launcher that cannot box it is an error, before the node
    /// serves.
    async fn start_tools(&mut self, starting: Starting<'_>) -> anyhow::Result<()> {
        use crate::config::acp::SandboxSetting;
        let cfg = starting.cfg;
        let bot = cfg.bot();
        let servers: Vec<_> = bot
            .mcp
            .iter()
            .cloned()
            .chain(starting.model_mesh)
            .collect();
        if servers.is_empty() {
            return Ok(());
        }
        let stdio = servers.iter().filter(|m| m.url.is_none());
        for m in stdio.clone().filter(|m| m.sandbox == SandboxSetting::Off) {
            tracing::warn!(bot = %bot.name, server = %m.name, "sandbox = \"off\": the MCP server runs unboxed, and can read and write whatever the node's user can (its data dir, config and key files)");
        }
        let boxing = match stdio.clone().find(|m| m.sandbox != SandboxSetting::Off) {
            None => crate::agent::boxing::Boxing::default(),
            Some(m) => {
                let deny = crate::engine::acp::private_paths(cfg);
                let (boxing, answer) = crate::agent::boxing::Boxing::prepare(None, deny)
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "bot {}'s MCP server {:?} cannot be boxed: {e}",
                            bot.name,
                            m.name
                        )
                    })?;
                tracing::info!(bot = %bot.name, launcher = ?boxing.launcher, %answer, deny = ?boxing.deny, "the bot's stdio MCP servers run boxed");
                boxing
            }
        };
        self.tools = Some(McpTools::start(
            &bot.name,
            &servers,
            &cfg.mcp_headers,
            boxing,
            starting.metrics,
        ));
        Ok(())
    }

    /// The model's turn: the reply written from the turn's prompt (with the tools, in
    /// their loop). With tools, the turn's outcome says how it ended; a plain reply's
    /// failure stays a silence (`silent/reply_failed`).
    async fn take_turn(&self, turn: &TurnContext<'_>) -> Written {
        let msg = turn.msg;
        let context = turn.host.before(turn.me.context_messages.max(12));
        // The model's group tools (`group_tools`) know the turn in flight: an ask
        // continues it and is counted in it.
        let _turn = turn.host.mark_turn();
        let prompt = turn.host.model_prompt(&context);
        // A model with tools works in a loop, as an agent does: its turn ends visibly
        // as an agent's does (stopped, or without an answer), where a plain reply's
        // failure stays a silence.
        let tool_loop = self.tools().is_some() && matches!(prompt, ModelPrompt::Remote { .. });
        if tool_loop {
            turn.outcome.set(Ended::NoAnswer, Vec::new());
        }
        let tools = self.tools().map(|tools| ToolLoop {
            me: turn.me,
            ask_timeout_secs: turn.ask_timeout_secs,
            llm: turn.llm,
            tools,
            trail: turn.trail,
            show: turn.status,
        });
        let reply = write(turn.llm, tools, prompt, msg).await;
        if tool_loop {
            let ended = if reply.is_some() {
                Ended::Answered
            } else {
                Ended::NoAnswer
            };
            turn.outcome.set(ended, Vec::new());
        }
        match reply {
            Some(reply) => Written::Reply(reply),
            None => Written::silent("reply_failed", "", "reply failed"),
        }
    }
}

/// The model's reply to `prompt` about `msg`: the offline placeholder as it is, else
/// the reply call through `llm`, or with `tools` their loop ([`ToolLoop::run`]).
/// `None`: the call failed or wrote nothing (logged and counted).
pub(crate) async fn write(
    llm: MeteredLlm<'_>,
    tools: Option<ToolLoop<'_>>,
    prompt: ModelPrompt,
    msg: &Envelope,
) -> Option<Reply> {
    let (ep, messages) = match prompt {
        ModelPrompt::Offline(text) => return Some(Reply { text, tokens: 0 }),
        ModelPrompt::Remote { ep, messages } => (ep, messages),
    };
    if let Some(model) = tools {
        let specs = model.offered(msg).await;
        return model.run(&ep, messages, &specs, msg, None).await;
    }
    let c = llm
        .complete(LlmCall::new(&ep, Purpose::Reply, &messages, msg))
        .await
        .ok()?;
    let text = c.text.trim().to_string();
    (!text.is_empty()).then_some(Reply {
        text,
        tokens: c.usage.completion_tokens,
    })
}

/// The group tools the built-in model is offered with `[[bots]] group_tools = true`
/// (through the node's `mesh` server): each call names the turn's group.
pub(crate) const MODEL_GROUP_TOOLS: [&str; 3] = ["read_group", "members", "ask"];

/// A tool call's arguments as sent: for a group tool of a bot with `group_tools`, the
/// turn's `group` added (the model never names it; its `mesh` server serves every
/// group of the bot), and an `ask`'s wait kept within `ask_secs` (the tool call's own
/// time limit, less a second): an ask still waiting when the tool call gave up would
/// take the colleague's answer from the bot's next turn.
fn call_arguments(
    me: &BotSettings,
    tool: &str,
    arguments: &str,
    group: &str,
    ask_secs: u64,
) -> String {
    if !me.group_tools || !MODEL_GROUP_TOOLS.contains(&tool) {
        return arguments.to_string();
    }
    let mut args = match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(serde_json::Value::Object(m)) => m,
        // Not an object: sent as it is, for the server to refuse.
        _ if !arguments.trim().is_empty() => return arguments.to_string(),
        _ => serde_json::Map::new(),
    };
    args.insert("group".into(), serde_json::json!(group));
    if tool == "ask" {
        let asked = args.get("timeout_secs").and_then(serde_json::Value::as_u64);
        let secs = asked.map_or(ask_secs, |a| a.min(ask_secs));
        args.insert("timeout_secs".into(), serde_json::json!(secs));
    }
    serde_json::Value::Object(args).to_string()
}

/// How long a turn waits for tool servers still making their first connection.
const FIRST_CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Where the tool loop notes what it did for `/why`: the bot's decision trail (the
/// turn code's `Trail`), which this layer cannot name.
pub(crate) trait ToolTrail: Sync {
    /// Notes `action`/`reason` with `detail` about the turn on `trigger`.
    fn note_tool(&self, trigger: Ulid, action: &'static str, reason: &'static str, detail: &str);
}

/// Where the tool loop shows its tool calls while the turn runs: the running turn's
/// status message (the turn code's `StatusFeed`), which this layer cannot name.
pub(crate) trait ShowTool: Sync {
    /// Shows tool call `id` as `shown` ("cargo test", "cargo test ✓"); nothing when
    /// the turn shows no status.
    fn show_tool(&self, id: &str, shown: &str);
}

/// The built-in model with the bot's tool servers, for one turn: what the tool loop
/// needs and nothing more (never the whole `Brain`).
pub(crate) struct ToolLoop<'a> {
    /// The bot's settings as the turn took them (its tool rounds, time and size limits).
    pub(crate) me: &'a BotSettings,
    /// `[mesh] ask_timeout_secs`: an `ask` tool call waits no longer.
    pub(crate) ask_timeout_secs: u64,
    /// The LLM, counted against the bot's budget and in the metrics.
    pub(crate) llm: MeteredLlm<'a>,
    /// The bot's tool servers.
    pub(crate) tools: &'a McpTools,
    /// The trail `/why` reads.
    pub(crate) trail: &'a dyn ToolTrail,
    /// The running turn's status message.
    pub(crate) show: &'a dyn ShowTool,
}

/// The tool's result as the model reads it: its text, or for any other outcome than
/// ok, `[tool {outcome}] ` before it (an `isError` result is `[tool error] …`).
pub(crate) fn tool_message_text(r: &ToolResult) -> String {
    if r.is_error() {
        format!("[tool {}] {}", r.outcome, r.text)
    } else {
        r.text.clone()
    }
}

/// The tools to offer the model for a turn about `msg`: those of the servers that are
/// up (waiting for any still making their first connection); each server that is not
/// is logged and noted for `/why`. None when `max_tool_rounds` is 0.
pub(crate) async fn offered_tools(
    me: &BotSettings,
    tools: &McpTools,
    trail: &dyn ToolTrail,
    msg: &Envelope,
) -> Vec<ToolSpec> {
    if me.max_tool_rounds == 0 {
        return Vec::new();
    }
    let (offered, down) = tools.tools(FIRST_CONNECT_WAIT).await;
    for (server, why) in &down {
        tracing::warn!(bot = %me.name, server = %server, why = %why, trigger = %msg.id, "answering without this MCP server's tools");
        trail.note_tool(
            msg.id,
            "tools",
            "server_unavailable",
            &format!("{server}: {why}"),
        );
    }
    offered
        .iter()
        .map(|t| ToolSpec {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: t.parameters.clone(),
        })
        .collect()
}

impl ToolLoop<'_> {
    /// The tools to offer the model for a turn about `msg` ([`offered_tools`]).
    pub(crate) async fn offered(&self, msg: &Envelope) -> Vec<ToolSpec> {
        offered_tools(self.me, self.tools, self.trail, msg).await
    }

    /// The model's reply with tools: see the module documentation.
    pub(crate) async fn run(
        &self,
        ep: &Endpoint,
        messages: Vec<ChatMessage>,
        specs: &[ToolSpec],
        msg: &Envelope,
        first: Option<Completion>,
    ) -> Option<Reply> {
        tool_loop(self, ep, messages, specs, msg, first).await
    }
}

/// The model's reply with tools ([`ToolLoop::run`]). `first`: the answer of
/// a call already made with `messages` and `specs` (a drafting judge's rest), which
/// is the first round. `None`: a call failed or the final answer is empty (logged
/// and counted).
async fn tool_loop(
    run: &ToolLoop<'_>,
    ep: &Endpoint,
    mut messages: Vec<ChatMessage>,
    specs: &[ToolSpec],
    msg: &Envelope,
    first: Option<Completion>,
) -> Option<Reply> {
    let me = run.me;
    let timeout = Duration::from_millis(me.tool_timeout_ms);
    let ask_secs = (me.tool_timeout_ms / 1000)
        .saturating_sub(1)
        .clamp(1, run.ask_timeout_secs.max(1));
    let mut tokens = 0;
    let mut rounds = 0;
    let mut first = first;
    loop {
        let offer: &[ToolSpec] = if rounds < me.max_tool_rounds {
            specs
        } else {
            &[]
        };
        let c = match first.take() {
            Some(c) => c,
            None => {
                let call = LlmCall::new(ep, Purpose::Reply, &messages, msg).offering(offer);
                run.llm.complete(call).await.ok()?
            }
        };
        tokens += c.usage.completion_tokens;
        if c.tool_calls.is_empty() || offer.is_empty() {
            let text = c.text.trim().to_string();
            return (!text.is_empty()).then_some(Reply { text, tokens });
        }
        rounds += 1;
        messages.push(ChatMessage::assistant_calls(
            c.text.clone(),
            c.tool_calls.clone(),
        ));
        for call in &c.tool_calls {
            let arguments = call_arguments(
                me,
                &call.function.name,
                &call.function.arguments,
                &msg.group,
                ask_secs,
            );
            run.show.show_tool(&call.id, &call.function.name);
            let r = run
                .tools
                .call(
                    &call.function.name,
                    &arguments,
                    timeout,
                    me.tool_result_chars,
                )
                .await;
            run.trail.note_tool(
                msg.id,
                "tool",
                r.outcome,
                &format!(
                    "{}{} {} ms{}",
                    if r.server.is_empty() {
                        String::new()
                    } else {
                        format!("{}/", r.server)
                    },
                    r.tool,
                    r.ms,
                    if r.capped { ", cut" } else { "" }
                ),
            );
            run.show.show_tool(
                &call.id,
                &format!(
                    "{} {}",
                    call.function.name,
                    if r.outcome == "ok" { "✓" } else { "✗" }
                ),
            );
            messages.push(ChatMessage::tool(call.id.clone(), tool_message_text(&r)));
        }
        if rounds == me.max_tool_rounds {
            tracing::warn!(bot = %me.name, trigger = %msg.id, max_tool_rounds = me.max_tool_rounds, "max_tool_rounds reached: the model answers without tools now");
            run.trail.note_tool(
                msg.id,
                "tools",
                "max_tool_rounds",
                &format!("{rounds} rounds; the last call offered no tools"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn args(me: &BotSettings, tool: &str, arguments: &str) -> Value {
        let sent = call_arguments(me, tool, arguments, "room", 29);
        serde_json::from_str(&sent).unwrap_or(Value::String(sent))
    }

    #[test]
    fn a_group_tool_call_names_the_turns_group_and_an_ask_waits_within_the_tool_call() {
        let me = BotSettings::from_toml("group_tools = true\nwrite_early = false").unwrap();
        assert_eq!(args(&me, "members", ""), json!({"group": "room"}));
        assert_eq!(
            args(&me, "read_group", r#"{"limit": 5, "group": "elsewhere"}"#),
            json!({"limit": 5, "group": "room"})
        );
        assert_eq!(
            args(&me, "ask", r#"{"colleague": "Bob", "question": "?"}"#),
            json!({"colleague": "Bob", "question": "?", "group": "room", "timeout_secs": 29})
        );
        let shorter = args(
            &me,
            "ask",
            r#"{"colleague": "Bob", "question": "?", "timeout_secs": 5}"#,
        );
        assert_eq!(shorter["timeout_secs"], 5);
        let longer = args(
            &me,
            "ask",
            r#"{"colleague": "Bob", "question": "?", "timeout_secs": 500}"#,
        );
        assert_eq!(longer["timeout_secs"], 29);
        // Not a group tool, not an object, or a bot without group tools: as given.
        assert_eq!(
            args(&me, "get_time", r#"{"tz": "UTC"}"#),
            json!({"tz": "UTC"})
        );
        assert_eq!(args(&me, "ask", "[1]"), json!([1]));
        let plain = BotSettings::from_toml("").unwrap();
        assert_eq!(
            args(&plain, "ask", r#"{"colleague": "Bob"}"#),
            json!({"colleague": "Bob"})
        );
    }
}
