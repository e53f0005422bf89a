//! ACP's messages, typed by the spec maintainers' own crate
//! (`agent-client-protocol-schema`, protocol version 1), and this client's tolerance of
//! what real agents send beyond it.
//!
//! Every request this client sends (`initialize`, `session/new` with its MCP servers,
//! `session/prompt`, the `session/cancel` notification) is built from the crate's types,
//! and every answer and message the agent sends (`session/update`,
//! `session/request_permission`) is read into them, so the wire follows the spec as
//! the crate follows it. The crate's types already skip fields they do not know and
//! default a bad optional field; what they would still refuse, and what an agent newer
//! than the crate may well send, is taken here rather than made fatal:
//! - a `session/update` of a kind the crate does not know (or that does not read):
//!   logged and ignored ([`read_update`]), as before any typing;
//! - a permission option of a kind the crate does not know: dropped, logged, and the
//!   question answered from the others ([`read_permission`]);
//! - a `stopReason` the crate does not know: [`StopReason::Other`] ([`read_stop_reason`]).
//!
//! The transport stays the node's own (`rpc`): the maintainers' connection
//! (`agent-client-protocol`'s `ClientSideConnection`) runs its handlers as `!Send`
//! futures spawned on a local executor, while the node answers permission questions
//! from tasks on its multi-threaded runtime and watches the process's exit, line bounds
//! and death itself.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use agent_client_protocol_schema::v1 as schema;
use agent_client_protocol_schema::ProtocolVersion;

use super::{AcpError, StopReason, ToolKind};

/// The ACP protocol version this client speaks.
pub(crate) const PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V1;

/// The `initialize` request: protocol version 1, botmesh as the client, and no client
/// capabilities (no `fs`, no `terminal`: the agent works on its own files itself).
pub(crate) fn initialize_request() -> schema::InitializeRequest {
    schema::InitializeRequest::new(PROTOCOL_VERSION)
        .client_capabilities(
            schema::ClientCapabilities::new()
                .fs(schema::FileSystemCapabilities::new())
                .terminal(false),
        )
        .client_info(
            schema::Implementation::new("botmesh", env!("CARGO_PKG_VERSION")).title("botmesh"),
        )
}

/// `message` as the JSON the transport sends.
pub(crate) fn to_json(message: &impl Serialize) -> Value {
    // The crate's messages are plain data: serializing them cannot fail.
    serde_json::to_value(message).unwrap_or_else(|e| {
        tracing::error!(error = %e, "an ACP message did not serialize");
        Value::Null
    })
}

/// `method`'s answer read as its ACP type, or a protocol error naming what is wrong.
pub(crate) fn read_answer<T: DeserializeOwned>(method: &str, answer: Value) -> Result<T, AcpError> {
    let shown = shorten(&answer);
    serde_json::from_value(answer).map_err(|e| AcpError::Protocol {
        method: method.to_string(),
        problem: format!("{e} in {shown}"),
    })
}

/// The answer to `session/prompt`: why the turn ended. A `stopReason` this client
/// does not know (an agent newer than the crate) is [`StopReason::Other`], not an error.
pub(crate) fn read_stop_reason(answer: Value) -> Result<StopReason, AcpError> {
    let method = "session/prompt";
    let name = match answer.get("stopReason") {
        Some(Value::String(name)) => name.clone(),
        _ => {
            return Err(AcpError::Protocol {
                method: method.into(),
                problem: format!("no stopReason in {}", shorten(&answer)),
            })
        }
    };
    match serde_json::from_value::<schema::PromptResponse>(answer) {
        Ok(read) => Ok(match read.stop_reason {
            schema::StopReason::EndTurn => StopReason::EndTurn,
            schema::StopReason::MaxTokens => StopReason::MaxTokens,
            schema::StopReason::MaxTurnRequests => StopReason::MaxTurnRequests,
            schema::StopReason::Refusal => StopReason::Refusal,
            schema::StopReason::Cancelled => StopReason::Cancelled,
            _ => StopReason::Other(name),
        }),
        Err(e) => {
            tracing::warn!(stop_reason = %name, error = %e, "a stopReason this client does not know: counted as `other`");
            Ok(StopReason::Other(name))
        }
    }
}

/// A `session/update` notification read, with its kind's name (`sessionUpdate`, for
/// the log), or `None` (logged) when it is of a kind the crate does not know or does
/// not read: such an update is ignored, never fatal.
pub(crate) fn read_update(
    bot: &str,
    params: Value,
) -> Option<(String, schema::SessionNotification)> {
    let kind = params["update"]["sessionUpdate"]
        .as_str()
        .unwrap_or("(none)")
        .to_string();
    match serde_json::from_value(params) {
        Ok(update) => Some((kind, update)),
        Err(e) => {
            tracing::info!(bot, kind = %kind, error = %e, "ignoring an ACP session update this client cannot read (a kind or shape newer than its protocol crate)");
            None
        }
    }
}

/// A `session/request_permission` request read. Options of a kind the crate does not
/// know are dropped (logged) and the rest kept, so a question is answered from the
/// kinds this client chooses by; `Err` says why a request could not be read at all.
pub(crate) fn read_permission(
    bot: &str,
    mut params: Value,
) -> Result<schema::RequestPermissionRequest, String> {
    let offered = match params.get_mut("options").map(Value::take) {
        Some(Value::Array(options)) => options,
        Some(other) => return Err(format!("its options are not a list: {}", shorten(&other))),
        None => Vec::new(),
    };
    params["options"] = Value::Array(Vec::new());
    let mut request: schema::RequestPermissionRequest =
        serde_json::from_value(params).map_err(|e| e.to_string())?;
    for option in offered {
        match serde_json::from_value::<schema::PermissionOption>(option.clone()) {
            Ok(option) => request.options.push(option),
            Err(e) => {
                tracing::info!(bot, option = %shorten(&option), error = %e, "dropping a permission option this client cannot read");
            }
        }
    }
    Ok(request)
}

/// The node's [`ToolKind`] (what `allow` and `ask` name) of an ACP tool kind; a kind the
/// node does not decide by (`switch_mode`, or one newer than the crate) is `other`.
pub(crate) fn tool_kind(kind: schema::ToolKind) -> ToolKind {
    match kind {
        schema::ToolKind::Read => ToolKind::Read,
        schema::ToolKind::Edit => ToolKind::Edit,
        schema::ToolKind::Delete => ToolKind::Delete,
        schema::ToolKind::Move => ToolKind::Move,
        schema::ToolKind::Search => ToolKind::Search,
        schema::ToolKind::Execute => ToolKind::Execute,
        schema::ToolKind::Think => ToolKind::Think,
        schema::ToolKind::Fetch => ToolKind::Fetch,
        _ => ToolKind::Other,
    }
}

/// A tool call's status as [`super::AcpProgress::ToolCall`] shows it (`pending`,
/// `in_progress`, `completed`, `failed`).
pub(crate) fn status_name(status: schema::ToolCallStatus) -> String {
    name_of(&status)
}

/// A plan entry's status as [`super::PlanStep`] shows it.
pub(crate) fn plan_status_name(status: &schema::PlanEntryStatus) -> String {
    name_of(status)
}

/// The wire name of a unit enum value (`in_progress`).
fn name_of(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        _ => String::new(),
    }
}

/// `value` for a log line or an error: at most 300 characters of its JSON.
fn shorten(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn initialize_asks_for_version_1_with_no_client_capabilities() {
        let sent = to_json(&initialize_request());
        assert_eq!(sent["protocolVersion"], json!(1));
        let offered = &sent["clientCapabilities"];
        assert_eq!(
            offered["fs"],
            json!({"readTextFile": false, "writeTextFile": false})
        );
        assert_eq!(offered["terminal"], json!(false));
        // Whatever else the spec's capabilities hold (e.g. `auth`), none is offered.
        assert!(!offers_any(offered), "{offered}");
        assert_eq!(sent["clientInfo"]["name"], json!("botmesh"));
    }

    /// Whether a capabilities object says `true` anywhere.
    fn offers_any(v: &Value) -> bool {
        match v {
            Value::Bool(b) => *b,
            Value::Object(o) => o.values().any(offers_any),
            _ => false,
        }
    }

    #[test]
    fn updates_of_kinds_and_fields_beyond_the_crate_are_ignored_or_skipped_not_fatal() {
        // An update kind no spec names yet: ignored.
        let unknown =
            json!({"sessionId": "s", "update": {"sessionUpdate": "teleport_update", "x": 1}});
        assert!(read_update("b", unknown).is_none());
        // A kind codex-acp sends, with fields the crate does not know: read.
        let usage = json!({"sessionId": "s", "update": {"sessionUpdate": "usage_update",
            "used": 10, "size": 100, "brandNew": true}});
        assert!(read_update("b", usage).is_some());
        // A tool call with an unknown kind and extra fields: read, kind `other`.
        let call = json!({"sessionId": "s", "update": {"sessionUpdate": "tool_call",
            "toolCallId": "t1", "title": "cargo test", "kind": "teleport", "status": "in_progress",
            "rawInput": {"command": "cargo test"}, "somethingNew": [1, 2]}});
        let (kind, read) = read_update("b", call).expect("a tool call");
        assert_eq!(kind, "tool_call");
        let schema::SessionUpdate::ToolCall(call) = read.update else {
            panic!("a tool call: {read:?}")
        };
        assert_eq!(tool_kind(call.kind), ToolKind::Other);
        assert_eq!(status_name(call.status), "in_progress");
        assert_eq!(call.raw_input, Some(json!({"command": "cargo test"})));
    }

    #[test]
    fn a_permission_option_of_an_unknown_kind_is_dropped_and_the_rest_kept() {
        let params = json!({"sessionId": "s",
        "toolCall": {"toolCallId": "c1", "title": "look", "kind": "read"},
        "options": [
            {"optionId": "ok", "name": "OK", "kind": "allow_once"},
            {"optionId": "sess", "name": "For this session", "kind": "allow_for_session"},
            {"optionId": "no", "name": "No", "kind": "reject_once"},
        ]});
        let read = read_permission("b", params).expect("read");
        let ids: Vec<String> = read
            .options
            .iter()
            .map(|o| o.option_id.to_string())
            .collect();
        assert_eq!(ids, ["ok", "no"]);
        assert_eq!(read.tool_call.fields.title.as_deref(), Some("look"));
        let bad = json!({"sessionId": "s", "toolCall": {"toolCallId": "c1"}, "options": "all"});
        assert!(read_permission("b", bad).is_err());
    }

    #[test]
    fn an_unknown_stop_reason_is_other_and_a_missing_one_an_error() {
        assert_eq!(
            read_stop_reason(json!({"stopReason": "end_turn", "usage": {"x": 1}})),
            Ok(StopReason::EndTurn)
        );
        assert_eq!(
            read_stop_reason(json!({"stopReason": "paused"})),
            Ok(StopReason::Other("paused".into()))
        );
        assert!(matches!(
            read_stop_reason(json!({})),
            Err(AcpError::Protocol { .. })
        ));
    }
}
