//! A2A 1.0 over JSON-RPC, on the wire as the official SDK (`a2a-sdk` 1.x) speaks it:
//! method names, task states, roles, error codes and the shapes of messages, tasks
//! and stream events (docs/a2a.md; what was read from the SDK is in its "Wire" part).
//!
//! Incoming requests are parsed into typed params (unknown fields ignored, as the
//! SDK's lenient parser does); what the node sends is built as JSON here, so that
//! every field name and enum string is written in one place.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The protocol version the node speaks (the `A2A-Version` header, the card's
/// interface).
pub const PROTOCOL_VERSION: &str = "1.0";

/// The header carrying the protocol version on every request.
pub const VERSION_HEADER: &str = "A2A-Version";

/// A task's state, as the wire names it (`TASK_STATE_WORKING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Accepted, not started.
    #[serde(rename = "TASK_STATE_SUBMITTED")]
    Submitted,
    /// The bot is on it.
    #[serde(rename = "TASK_STATE_WORKING")]
    Working,
    /// Answered: the answer is the task's artifact.
    #[serde(rename = "TASK_STATE_COMPLETED")]
    Completed,
    /// The turn failed or the bot stayed silent (why: the status message).
    #[serde(rename = "TASK_STATE_FAILED")]
    Failed,
    /// Cancelled (CancelTask, or a person's `/stop`).
    #[serde(rename = "TASK_STATE_CANCELED")]
    Canceled,
    /// The agent asked the chat a permission question that waits for its answer.
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED")]
    InputRequired,
    /// The agent refused the task.
    #[serde(rename = "TASK_STATE_REJECTED")]
    Rejected,
    /// The agent needs authentication.
    #[serde(rename = "TASK_STATE_AUTH_REQUIRED")]
    AuthRequired,
    /// A state the sender did not name (`TASK_STATE_UNSPECIFIED`, or one unknown).
    #[serde(rename = "TASK_STATE_UNSPECIFIED", other)]
    Unspecified,
}

impl TaskState {
    /// Whether the task is over: nothing changes it any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected
        )
    }

    /// Whether a blocking SendMessage answers now: over, or waiting for someone.
    pub fn is_interrupted(self) -> bool {
        self.is_terminal() || matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }

    /// The short label of logs and metrics (`completed`, `input_required`).
    pub fn label(self) -> &'static str {
        match self {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Canceled => "canceled",
            TaskState::InputRequired => "input_required",
            TaskState::Rejected => "rejected",
            TaskState::AuthRequired => "auth_required",
            TaskState::Unspecified => "unspecified",
        }
    }
}

/// One part of a message; only text parts are read (a file or data part has no text).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WirePart {
    /// The text of a text part.
    #[serde(default)]
    pub text: Option<String>,
}

/// A message as a caller sends it (`params.message`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireMessage {
    /// The sender's id for the message.
    #[serde(default)]
    pub message_id: String,
    /// The conversation it belongs to, when it continues one.
    #[serde(default)]
    pub context_id: Option<String>,
    /// The task it continues (an answer to a task waiting for input).
    #[serde(default)]
    pub task_id: Option<String>,
    /// `ROLE_USER` from a caller.
    #[serde(default)]
    pub role: String,
    /// Its content.
    #[serde(default)]
    pub parts: Vec<WirePart>,
}

impl WireMessage {
    /// The text of its text parts, joined by a blank line; empty when it has none.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| p.text.as_deref())
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n\n")
    }
}

/// `SendMessage` / `SendStreamingMessage` params.
#[derive(Debug, Clone, Deserialize)]
pub struct SendParams {
    /// The message.
    pub message: WireMessage,
    /// How the caller wants the answer (may be `{}`).
    #[serde(default)]
    pub configuration: Option<SendConfiguration>,
}

/// `params.configuration`: what of it the node honours.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendConfiguration {
    /// Answer with the task at once instead of when it is done or waits for input.
    #[serde(default)]
    pub return_immediately: bool,
}

/// `GetTask` / `CancelTask` params.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskIdParams {
    /// The task.
    pub id: String,
}

/// A JSON-RPC error with the A2A error's reason (the `ErrorInfo` the SDK maps back
/// to its exception).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code})")]
pub struct RpcError {
    /// The JSON-RPC code (-32001 TaskNotFound, …).
    pub code: i64,
    /// What went wrong, for the caller to read.
    pub message: String,
    /// The A2A reason (`TASK_NOT_FOUND`), empty for JSON-RPC's own errors.
    pub reason: &'static str,
}

impl RpcError {
    fn new(code: i64, reason: &'static str, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            reason,
        }
    }
    /// -32700: the body is not JSON.
    pub fn parse(m: impl Into<String>) -> RpcError {
        RpcError::new(-32700, "", m)
    }
    /// -32600: not a JSON-RPC request.
    pub fn invalid_request(m: impl Into<String>) -> RpcError {
        RpcError::new(-32600, "", m)
    }
    /// -32601: no such method.
    pub fn method_not_found(m: impl Into<String>) -> RpcError {
        RpcError::new(-32601, "", m)
    }
    /// -32602: the params do not parse or do not fit.
    pub fn invalid_params(m: impl Into<String>) -> RpcError {
        RpcError::new(-32602, "", m)
    }
    /// -32603: the node could not do it.
    pub fn internal(m: impl Into<String>) -> RpcError {
        RpcError::new(-32603, "", m)
    }
    /// -32001: no such task.
    pub fn task_not_found(id: &str) -> RpcError {
        RpcError::new(-32001, "TASK_NOT_FOUND", format!("Task {id} not found"))
    }
    /// -32002: the task is over already.
    pub fn not_cancelable(m: impl Into<String>) -> RpcError {
        RpcError::new(-32002, "TASK_NOT_CANCELABLE", m)
    }
    /// -32003: no push notifications here.
    pub fn push_not_supported() -> RpcError {
        RpcError::new(
            -32003,
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
            "push notifications are not supported: stream or poll with GetTask",
        )
    }
    /// -32004: a method or use the node does not offer.
    pub fn unsupported(m: impl Into<String>) -> RpcError {
        RpcError::new(-32004, "UNSUPPORTED_OPERATION", m)
    }
    /// -32005: the message has no text.
    pub fn content_type(m: impl Into<String>) -> RpcError {
        RpcError::new(-32005, "CONTENT_TYPE_NOT_SUPPORTED", m)
    }
    /// -32006: the remote agent's answer does not parse.
    pub fn invalid_agent_response(m: impl Into<String>) -> RpcError {
        RpcError::new(-32006, "INVALID_AGENT_RESPONSE", m)
    }
    /// -32009: a protocol version the node does not speak (`given`: what the caller
    /// sent, or 0.3 when it sent none), worded as the SDK's server words it.
    pub fn version(given: &str) -> RpcError {
        RpcError::new(
            -32009,
            "VERSION_NOT_SUPPORTED",
            format!("A2A version '{given}' is not supported by this handler. Expected version '{PROTOCOL_VERSION}'."),
        )
    }

    /// The error object of a JSON-RPC response.
    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if !self.reason.is_empty() {
            e["data"] = json!([{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": self.reason,
                "domain": "a2a-protocol.org",
                "metadata": {},
            }]);
        }
        e
    }
}

/// A JSON-RPC success response to request `id`.
pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC error response to request `id` (`null` when it could not be read).
pub fn error(id: &Value, e: &RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": e.to_json()})
}

/// A JSON-RPC request the node sends (as a client): `method` with `params`, a UUID id.
pub fn request(method: &str, params: Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": uuid::Uuid::new_v4().to_string(),
        "method": method,
        "params": params,
    })
}

/// A text message on the wire: `role` is `ROLE_USER` or `ROLE_AGENT`; the context and
/// task are named when known.
pub fn text_message(
    message_id: &str,
    role: &str,
    text: &str,
    context_id: Option<&str>,
    task_id: Option<&str>,
) -> Value {
    let mut m = json!({"messageId": message_id, "role": role, "parts": [{"text": text}]});
    if let Some(c) = context_id {
        m["contextId"] = json!(c);
    }
    if let Some(t) = task_id {
        m["taskId"] = json!(t);
    }
    m
}

/// The version a request without an `A2A-Version` (header or query parameter) is taken
/// to speak: 0.3, as the SDK's server takes it (`a2a/utils/version_validator.py`), so
/// such a request is refused with -32009.
pub const VERSION_WHEN_MISSING: &str = "0.3";

/// The version a caller speaks, from the `A2A-Version` it sent (`None` or empty:
/// [`VERSION_WHEN_MISSING`]).
pub fn version_of(given: Option<&str>) -> &str {
    match given.map(str::trim) {
        None | Some("") => VERSION_WHEN_MISSING,
        Some(v) => v,
    }
}

/// Whether `A2A-Version: given` is one the node speaks: the same major and minor version
/// as [`PROTOCOL_VERSION`] (`1.0`, `1.0.2`; not `1.1`, `2.0`, `0.3`), the patch ignored,
/// as the SDK's server compares them; none sent is 0.3, refused.
pub fn version_ok(given: Option<&str>) -> bool {
    let major_minor = |v: &str| {
        let mut parts = v.split('.');
        let major = parts.next()?.parse::<u64>().ok()?;
        let minor = match parts.next() {
            None => 0,
            Some(m) => {
                let digits: String = m.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u64>().ok()?
            }
        };
        Some((major, minor))
    };
    let given = major_minor(version_of(given));
    given.is_some() && given == major_minor(PROTOCOL_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_errors_are_spelled_as_the_sdk_spells_them() {
        let s: TaskState = serde_json::from_value(json!("TASK_STATE_INPUT_REQUIRED")).unwrap();
        assert_eq!(s, TaskState::InputRequired);
        assert!(s.is_interrupted() && !s.is_terminal());
        let odd: TaskState = serde_json::from_value(json!("working")).unwrap();
        assert_eq!(odd, TaskState::Unspecified);
        assert_eq!(
            serde_json::to_value(TaskState::Canceled).unwrap(),
            json!("TASK_STATE_CANCELED")
        );
        let e = error(&json!("x"), &RpcError::task_not_found("t1"));
        assert_eq!(e["error"]["code"], -32001);
        assert_eq!(e["error"]["data"][0]["reason"], "TASK_NOT_FOUND");
        let e = error(&Value::Null, &RpcError::parse("bad"));
        assert!(e["error"].get("data").is_none());
        assert!(version_ok(Some("1.0")) && version_ok(Some("1.0.2")) && version_ok(Some("1")));
        for refused in [
            None,
            Some(""),
            Some("0.3"),
            Some("1.1"),
            Some("2.0"),
            Some("one"),
        ] {
            assert!(!version_ok(refused), "{refused:?}");
        }
        assert_eq!(version_of(None), "0.3");
    }

    #[test]
    fn a_message_with_an_empty_configuration_and_several_parts_reads() {
        let p: SendParams = serde_json::from_value(json!({
            "message": {"messageId": "m", "role": "ROLE_USER",
                        "parts": [{"text": "one"}, {"data": {"a": 1}}, {"text": " two "}]},
            "configuration": {}
        }))
        .unwrap();
        assert_eq!(p.message.text(), "one\n\ntwo");
        assert!(!p.configuration.unwrap().return_immediately);
    }
}
