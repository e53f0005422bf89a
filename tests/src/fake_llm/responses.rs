//! OpenAI's Responses API as the scripted server speaks it (`POST /v1/responses`), for
//! coding agents that use it (Codex, `wire_api = "responses"`).
//!
//! A request has `instructions` (the system prompt) and `input`: items of `type`
//! `message` (`role`, `content: [{type: "input_text" | "output_text", text}]`),
//! `function_call` (a call the model asked for earlier) and `function_call_output`
//! (`call_id`, `output`: a tool's result). The answer, when `stream` is true, is
//! `text/event-stream` with an `event:` line naming each event and its JSON (with
//! `type` and `sequence_number`) as `data:`, as OpenAI sends it:
//! `response.created` → `response.in_progress` → per output item
//! `response.output_item.added`, then for a message `response.content_part.added`,
//! `response.output_text.delta` (one per word), `response.output_text.done`,
//! `response.content_part.done`, or for a function call
//! `response.function_call_arguments.delta` (two halves) and `…arguments.done`;
//! `response.output_item.done` → and last `response.completed` with the whole
//! response and its `usage` (input, output and total tokens, [`approx_tokens`]).
//! Without `stream` the answer is that response object as JSON.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::Response;
use serde_json::{json, Value};

use super::{
    approx_tokens, event_stream, flatten_content, json_response, whole, LlmBody, Seen, State,
};

/// `(role, text)` of the request: `instructions` as `system`, then each `message`
/// input item (a plain string `input` is one `user` message).
pub(crate) fn messages(body: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(i) = body.get("instructions").and_then(Value::as_str) {
        out.push(("system".to_string(), i.to_string()));
    }
    match body.get("input") {
        Some(Value::String(s)) => out.push(("user".to_string(), s.clone())),
        Some(Value::Array(items)) => {
            for item in items {
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                if kind == "message" {
                    let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                    out.push((role.to_string(), flatten_content(item.get("content"))));
                }
            }
        }
        _ => {}
    }
    out
}

/// `(call_id, output)` of each `function_call_output` input item, in order.
pub(crate) fn tool_results(body: &Value) -> Vec<(String, String)> {
    body.get("input")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter(|i| i.get("type").and_then(Value::as_str) == Some("function_call_output"))
                .map(|i| {
                    let output = match i.get("output") {
                        Some(Value::String(s)) => s.clone(),
                        other => flatten_content(other),
                    };
                    (
                        i.get("call_id")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                        output,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One output item of a scripted answer.
pub(crate) enum Output {
    /// An assistant message with this text.
    Message {
        /// The item's id (`msg_…`).
        id: String,
        /// Its text.
        text: String,
    },
    /// A function call the model asks for.
    Call {
        /// The item's id (`fc_…`).
        id: String,
        /// The id its `function_call_output` answers (unique per call).
        call_id: String,
        /// The function's name.
        name: String,
        /// The namespace tool it is in, when the request offered it in one (Codex
        /// offers an MCP server's tools as a namespace, `mcp__<server>`).
        namespace: Option<String>,
        /// Its arguments, JSON text.
        arguments: String,
    },
}

impl Output {
    /// A message answer with `text`, for response number `n`.
    pub(crate) fn text(n: u64, text: &str) -> Vec<Output> {
        vec![Output::Message {
            id: format!("msg_fake_{n}"),
            text: text.to_string(),
        }]
    }

    /// `text` (when not empty) then `calls` `(call_id, name, arguments)`, for
    /// response number `n` to `request`. A name `<namespace>__<tool>` whose namespace
    /// the request offered as a `namespace` tool is called as that namespace's tool.
    pub(crate) fn calls(
        n: u64,
        request: &Value,
        text: &str,
        calls: &[(String, String, String)],
    ) -> Vec<Output> {
        let mut out = if text.is_empty() {
            Vec::new()
        } else {
            Output::text(n, text)
        };
        let namespaces: Vec<&str> = request["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["type"] == "namespace")
            .filter_map(|t| t["name"].as_str())
            .collect();
        for (i, (call_id, name, arguments)) in calls.iter().enumerate() {
            let (namespace, name) = namespaces
                .iter()
                .find_map(|ns| {
                    let tool = name.strip_prefix(ns)?.strip_prefix("__")?;
                    Some((Some(ns.to_string()), tool.to_string()))
                })
                .unwrap_or((None, name.clone()));
            out.push(Output::Call {
                id: format!("fc_fake_{n}_{i}"),
                call_id: call_id.clone(),
                name,
                namespace,
                arguments: arguments.clone(),
            });
        }
        out
    }

    /// The item as it is when done.
    fn done(&self) -> Value {
        match self {
            Output::Message { id, text } => json!({
                "id": id, "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }),
            Output::Call {
                id,
                call_id,
                name,
                namespace,
                arguments,
            } => {
                let mut call = json!({
                    "id": id, "type": "function_call", "status": "completed",
                    "call_id": call_id, "name": name, "arguments": arguments,
                });
                if let Some(ns) = namespace {
                    call["namespace"] = json!(ns);
                }
                call
            }
        }
    }

    /// The item as `response.output_item.added` shows it (nothing written yet).
    fn added(&self) -> Value {
        let mut v = self.done();
        v["status"] = json!("in_progress");
        match self {
            Output::Message { .. } => v["content"] = json!([]),
            Output::Call { .. } => v["arguments"] = json!(""),
        }
        v
    }

    /// The tokens the fake counts for it.
    fn tokens(&self) -> u64 {
        match self {
            Output::Message { text, .. } => approx_tokens(text),
            Output::Call { arguments, .. } => approx_tokens(arguments) + 1,
        }
    }
}

/// The response object of answer `n` to `seen` with `items`, in `status`.
fn response_object(seen: &Seen, n: u64, items: &[Output], status: &str) -> Value {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let input_tokens: u64 = seen.messages.iter().map(|(_, c)| approx_tokens(c)).sum();
    let output_tokens: u64 = items.iter().map(Output::tokens).sum();
    let done = status == "completed";
    json!({
        "id": format!("resp_fake_{n}"),
        "object": "response",
        "created_at": created,
        "status": status,
        "model": seen.model,
        "output": if done { items.iter().map(Output::done).collect() } else { Vec::new() },
        "usage": if done {
            json!({
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens,
            })
        } else {
            Value::Null
        },
        "error": null,
        "incomplete_details": null,
    })
}

/// The answer to `seen` with `items`: streamed as the module docs say, or whole.
pub(crate) fn answer(state: &State, seen: &Seen, n: u64, items: Vec<Output>) -> Response<LlmBody> {
    if !seen.stream {
        let body = response_object(seen, n, &items, "completed");
        return whole(json_response(200, body.to_string()));
    }
    let mut events = VecDeque::new();
    let mut sequence = 0u64;
    let mut push = |mut value: Value| {
        value["sequence_number"] = json!(sequence);
        sequence += 1;
        let kind = value["type"].as_str().unwrap_or_default().to_string();
        events.push_back((
            Duration::ZERO,
            Bytes::from(format!("event: {kind}\ndata: {value}\n\n")),
        ));
    };
    let started = response_object(seen, n, &items, "in_progress");
    push(json!({"type": "response.created", "response": started}));
    push(json!({"type": "response.in_progress", "response": started}));
    for (index, item) in items.iter().enumerate() {
        push(
            json!({"type": "response.output_item.added", "output_index": index, "item": item.added()}),
        );
        match item {
            Output::Message { id, text } => {
                let part = |t: &str| json!({"type": "output_text", "text": t, "annotations": []});
                push(json!({"type": "response.content_part.added", "item_id": id,
                    "output_index": index, "content_index": 0, "part": part("")}));
                for word in text.split_inclusive(char::is_whitespace) {
                    push(json!({"type": "response.output_text.delta", "item_id": id,
                        "output_index": index, "content_index": 0, "delta": word, "logprobs": []}));
                }
                push(json!({"type": "response.output_text.done", "item_id": id,
                    "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
                push(json!({"type": "response.content_part.done", "item_id": id,
                    "output_index": index, "content_index": 0, "part": part(text)}));
            }
            Output::Call { id, arguments, .. } => {
                let half = arguments
                    .char_indices()
                    .nth(arguments.chars().count() / 2)
                    .map_or(arguments.len(), |(at, _)| at);
                for delta in [&arguments[..half], &arguments[half..]] {
                    push(json!({"type": "response.function_call_arguments.delta",
                        "item_id": id, "output_index": index, "delta": delta}));
                }
                push(json!({"type": "response.function_call_arguments.done",
                    "item_id": id, "output_index": index, "arguments": arguments}));
            }
        }
        push(
            json!({"type": "response.output_item.done", "output_index": index, "item": item.done()}),
        );
    }
    push(json!({"type": "response.completed",
        "response": response_object(seen, n, &items, "completed")}));
    event_stream(state, events)
}
