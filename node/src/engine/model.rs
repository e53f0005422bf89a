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

use std::time::Duration;

use ulid::Ulid;

use crate::agent::mcp::{McpTools, ToolResult};
use crate::config::BotSettings;
use crate::engine::metered::{LlmCall, MeteredLlm};
use crate::engine::Reply;
use crate::llm::{ChatMessage, Completion, Endpoint, Purpose, ToolSpec};
use crate::wire::envelope::Envelope;

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
