//! `A2aClient`: the node as an A2A caller of a remote agent (`[[bots]] agent = { a2a =
//! "http://…" }`, docs/a2a.md "A remote agent as a colleague"): its card fetched from the
//! agent's base URL, the JSON-RPC endpoint the card names, one task per turn streamed
//! (`SendStreamingMessage`, or `SendMessage` when the card says it does not stream), and
//! `CancelTask`. Every request carries `A2A-Version: 1.0`, without which an SDK-built
//! agent answers nothing but -32009, and the configured bearer token; nothing else of
//! the node's.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::a2a::card::CARD_PATH;
use crate::a2a::rpc::{self, TaskState, PROTOCOL_VERSION, VERSION_HEADER};

/// Largest SSE event or JSON answer read from the agent.
const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Why a call to the remote agent failed.
#[derive(Debug, thiserror::Error)]
pub enum A2aClientError {
    /// It could not be reached or answered with an HTTP error.
    #[error("the A2A agent at {url}: {why}")]
    Http {
        /// What was called.
        url: String,
        /// What went wrong.
        why: String,
    },
    /// Its card has no JSON-RPC interface on A2A 1.x.
    #[error("the A2A agent's card at {0} offers no JSON-RPC interface on protocol 1.x")]
    NoInterface(String),
    /// It answered with a JSON-RPC error.
    #[error("the A2A agent refused: {0}")]
    Rpc(rpc::RpcError),
    /// Its answer did not parse as A2A.
    #[error("the A2A agent's answer is not A2A 1.0: {0}")]
    Invalid(String),
}

/// What the client learned from the agent's card.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteCard {
    /// The agent's name.
    pub name: String,
    /// The JSON-RPC endpoint.
    pub url: String,
    /// Whether it streams.
    pub streaming: bool,
}

/// Something a running task said, as it comes.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEvent {
    /// The task's id, once known (what `CancelTask` names).
    Started(String),
    /// A status message while it works.
    Progress(String),
}

/// How a task ended (or paused).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEnd {
    /// Its id (empty when the agent answered with a plain message, no task).
    pub task_id: String,
    /// Where it ended: COMPLETED, INPUT_REQUIRED, FAILED, …
    pub state: TaskState,
    /// Its text: the artifacts' text, else the last status message's.
    pub text: String,
}

/// See the module documentation.
pub struct A2aClient {
    /// The HTTP client (its own timeouts).
    http: reqwest::Client,
    /// The agent's base URL (its card is at `<base>/.well-known/agent-card.json`).
    base: String,
    /// The bearer token, if one is configured.
    token: Option<String>,
}

impl A2aClient {
    /// A client of the agent at `base`, presenting `token`.
    pub fn new(base: &str, token: Option<String>) -> reqwest::Result<A2aClient> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        Ok(A2aClient {
            http,
            base: base.trim_end_matches('/').to_string(),
            token,
        })
    }

    fn authorized(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let r = r.header(VERSION_HEADER, PROTOCOL_VERSION);
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Fetches the agent's card and picks its JSON-RPC interface on 1.x.
    pub async fn card(&self) -> Result<RemoteCard, A2aClientError> {
        let url = format!("{}{CARD_PATH}", self.base);
        let http = |why: String| A2aClientError::Http {
            url: url.clone(),
            why,
        };
        let resp = self
            .authorized(self.http.get(&url))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| http(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(http(format!("HTTP {}", resp.status())));
        }
        let card: Value = resp.json().await.map_err(|e| http(e.to_string()))?;
        let interface = card["supportedInterfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| {
                i["protocolBinding"] == "JSONRPC"
                    && i["protocolVersion"]
                        .as_str()
                        .is_some_and(|v| rpc::version_ok(Some(v)))
            })
            .and_then(|i| i["url"].as_str())
            .ok_or_else(|| A2aClientError::NoInterface(url.clone()))?;
        Ok(RemoteCard {
            name: card["name"].as_str().unwrap_or_default().to_string(),
            url: interface.to_string(),
            streaming: card["capabilities"]["streaming"].as_bool().unwrap_or(false),
        })
    }

    /// Sends `text` as a new message of conversation `context_id` (continuing task
    /// `task_id`, one waiting for input) and follows the task to its end or a pause;
    /// what it says meanwhile goes to `events`.
    pub async fn send(
        &self,
        card: &RemoteCard,
        text: &str,
        context_id: &str,
        task_id: Option<&str>,
        events: &mpsc::Sender<TaskEvent>,
    ) -> Result<TaskEnd, A2aClientError> {
        let message = rpc::text_message(
            &uuid::Uuid::new_v4().to_string(),
            "ROLE_USER",
            text,
            Some(context_id),
            task_id,
        );
        let params = json!({"message": message, "configuration": {}});
        let method = if card.streaming {
            "SendStreamingMessage"
        } else {
            "SendMessage"
        };
        let mut req = self
            .authorized(self.http.post(&card.url))
            .json(&rpc::request(method, params));
        if card.streaming {
            req = req
                .header(reqwest::header::ACCEPT, "text/event-stream")
                .header(reqwest::header::CACHE_CONTROL, "no-store");
        }
        let http = |why: String| A2aClientError::Http {
            url: card.url.clone(),
            why,
        };
        let resp = req.send().await.map_err(|e| http(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(http(format!("HTTP {}", resp.status())));
        }
        let sse = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut follow = Follow::default();
        if !sse {
            // SendMessage's answer, or an error a server sends before any stream.
            let body = resp.bytes().await.map_err(|e| http(e.to_string()))?;
            let v: Value = serde_json::from_slice(&body)
                .map_err(|e| A2aClientError::Invalid(e.to_string()))?;
            follow.take(&v, events).await?;
            return follow.end();
        }
        let mut stream = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| http(e.to_string()))?;
            buf.extend_from_slice(&chunk);
            while let Some((event, rest)) = split_event(&buf) {
                let data = event_data(&event);
                buf = rest;
                if data.trim().is_empty() {
                    continue;
                }
                let v: Value = serde_json::from_str(&data)
                    .map_err(|e| A2aClientError::Invalid(format!("an event: {e}")))?;
                follow.take(&v, events).await?;
                if follow.over() {
                    return follow.end();
                }
            }
            if buf.len() > MAX_EVENT_BYTES {
                return Err(A2aClientError::Invalid(format!(
                    "an event over {MAX_EVENT_BYTES} bytes"
                )));
            }
        }
        follow.end()
    }

    /// Cancels task `task_id` at the agent.
    pub async fn cancel(&self, card: &RemoteCard, task_id: &str) -> Result<(), A2aClientError> {
        let resp = self
            .authorized(self.http.post(&card.url))
            .timeout(Duration::from_secs(30))
            .json(&rpc::request("CancelTask", json!({"id": task_id})))
            .send()
            .await
            .map_err(|e| A2aClientError::Http {
                url: card.url.clone(),
                why: e.to_string(),
            })?;
        let v: Value = resp
            .json()
            .await
            .map_err(|e| A2aClientError::Invalid(e.to_string()))?;
        match rpc_error(&v) {
            Some(e) => Err(A2aClientError::Rpc(e)),
            None => Ok(()),
        }
    }
}

/// The JSON-RPC error in response `v`, if it is one.
fn rpc_error(v: &Value) -> Option<rpc::RpcError> {
    let e = v.get("error")?;
    Some(rpc::RpcError {
        code: e["code"].as_i64().unwrap_or(-32603),
        message: e["message"].as_str().unwrap_or("").to_string(),
        reason: "",
    })
}

/// The first whole SSE event in `buf` (up to a blank line, `\n\n` or `\r\n\r\n`) and
/// what follows it.
fn split_event(buf: &[u8]) -> Option<(String, Vec<u8>)> {
    let text = std::str::from_utf8(buf).ok().or_else(|| {
        // A multi-byte character cut at the chunk's end: read up to it.
        std::str::from_utf8(&buf[..buf.len().saturating_sub(3)]).ok()
    })?;
    let (end, sep) = [("\r\n\r\n", 4), ("\n\n", 2)]
        .iter()
        .filter_map(|(s, n)| text.find(s).map(|i| (i, *n)))
        .min_by_key(|(i, _)| *i)?;
    Some((text[..end].to_string(), buf[end + sep..].to_vec()))
}

/// The data of an SSE event: its `data:` lines joined by `\n` (comments and other
/// fields left out).
fn event_data(event: &str) -> String {
    event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text parts of a message or artifact, joined.
fn text_of(parts: &Value) -> String {
    parts
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("")
}

/// A task followed through its events.
#[derive(Default)]
struct Follow {
    /// Its id.
    task_id: String,
    /// Its state now.
    state: Option<TaskState>,
    /// Its artifacts' text, by artifact id, in order.
    artifacts: Vec<(String, String)>,
    /// The last status message's text.
    status_text: String,
    /// Whether the agent answered with a message (no task).
    message: Option<String>,
}

impl Follow {
    /// Takes one JSON-RPC response (a SendMessage answer or a stream event).
    async fn take(
        &mut self,
        v: &Value,
        events: &mpsc::Sender<TaskEvent>,
    ) -> Result<(), A2aClientError> {
        if let Some(e) = rpc_error(v) {
            return Err(A2aClientError::Rpc(e));
        }
        let r = v
            .get("result")
            .ok_or_else(|| A2aClientError::Invalid("a response with no result".into()))?;
        if let Some(task) = r.get("task") {
            self.started(task["id"].as_str().unwrap_or(""), events)
                .await;
            for a in task["artifacts"].as_array().into_iter().flatten() {
                self.artifact(a, false);
            }
            self.status(&task["status"], events).await;
        } else if let Some(m) = r.get("message") {
            self.message = Some(text_of(&m["parts"]));
        } else if let Some(u) = r.get("statusUpdate") {
            self.started(u["taskId"].as_str().unwrap_or(""), events)
                .await;
            self.status(&u["status"], events).await;
        } else if let Some(u) = r.get("artifactUpdate") {
            self.started(u["taskId"].as_str().unwrap_or(""), events)
                .await;
            self.artifact(&u["artifact"], u["append"].as_bool().unwrap_or(false));
        } else {
            return Err(A2aClientError::Invalid(format!(
                "a result that is none of task, message, statusUpdate, artifactUpdate: {r}"
            )));
        }
        Ok(())
    }

    async fn started(&mut self, id: &str, events: &mpsc::Sender<TaskEvent>) {
        if self.task_id.is_empty() && !id.is_empty() {
            self.task_id = id.to_string();
            let _ = events.send(TaskEvent::Started(id.to_string())).await;
        }
    }

    async fn status(&mut self, status: &Value, events: &mpsc::Sender<TaskEvent>) {
        let state = serde_json::from_value::<TaskState>(status["state"].clone())
            .unwrap_or(TaskState::Unspecified);
        self.state = Some(state);
        let text = text_of(&status["message"]["parts"]);
        if !text.trim().is_empty() {
            self.status_text = text.clone();
            if !state.is_interrupted() {
                let _ = events.send(TaskEvent::Progress(text)).await;
            }
        }
    }

    fn artifact(&mut self, a: &Value, append: bool) {
        let id = a["artifactId"].as_str().unwrap_or("").to_string();
        let text = text_of(&a["parts"]);
        match self.artifacts.iter_mut().find(|(i, _)| *i == id) {
            Some((_, t)) if append => t.push_str(&text),
            Some((_, t)) => *t = text,
            None => self.artifacts.push((id, text)),
        }
    }

    /// Whether the task is over or waits for input.
    fn over(&self) -> bool {
        self.message.is_some() || self.state.is_some_and(TaskState::is_interrupted)
    }

    /// How it ended.
    fn end(self) -> Result<TaskEnd, A2aClientError> {
        if let Some(text) = self.message {
            return Ok(TaskEnd {
                task_id: self.task_id,
                state: TaskState::Completed,
                text,
            });
        }
        let state = self.state.ok_or_else(|| {
            A2aClientError::Invalid("the stream ended before the task had a state".into())
        })?;
        let artifacts = self
            .artifacts
            .into_iter()
            .map(|(_, t)| t)
            .filter(|t| !t.trim().is_empty())
            .collect::<Vec<_>>()
            .join("\n\n");
        let text = if state == TaskState::Completed && !artifacts.is_empty() {
            artifacts
        } else {
            self.status_text
        };
        Ok(TaskEnd {
            task_id: self.task_id,
            state,
            text,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_on_either_blank_line_and_join_their_data() {
        let buf = b": ping\r\n\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\ndata: x\n\nrest".to_vec();
        let (first, rest) = split_event(&buf).unwrap();
        assert_eq!(event_data(&first), "");
        let (second, rest) = split_event(&rest).unwrap();
        assert_eq!(event_data(&second), "{\"a\":\n1}");
        let (third, rest) = split_event(&rest).unwrap();
        assert_eq!(event_data(&third), "x");
        assert_eq!(rest, b"rest");
        assert!(split_event(&rest).is_none());
    }

    #[tokio::test]
    async fn a_stream_of_task_events_ends_with_the_artifacts_text() {
        let (tx, mut rx) = mpsc::channel(8);
        let mut f = Follow::default();
        let events = [
            json!({"result": {"task": {"id": "t1", "status": {"state": "TASK_STATE_SUBMITTED"}}}}),
            json!({"result": {"statusUpdate": {"taskId": "t1", "status": {"state": "TASK_STATE_WORKING", "message": {"parts": [{"text": "reading"}]}}}}}),
            json!({"result": {"artifactUpdate": {"taskId": "t1", "artifact": {"artifactId": "a", "parts": [{"text": "4"}]}}}}),
            json!({"result": {"artifactUpdate": {"taskId": "t1", "append": true, "artifact": {"artifactId": "a", "parts": [{"text": "2"}]}}}}),
            json!({"result": {"statusUpdate": {"taskId": "t1", "status": {"state": "TASK_STATE_COMPLETED"}}}}),
        ];
        for e in &events {
            assert!(!f.over());
            f.take(e, &tx).await.unwrap();
        }
        assert!(f.over());
        let end = f.end().unwrap();
        assert_eq!(end.text, "42");
        assert_eq!(end.task_id, "t1");
        assert_eq!(rx.recv().await, Some(TaskEvent::Started("t1".into())));
        assert_eq!(rx.recv().await, Some(TaskEvent::Progress("reading".into())));
        let mut f = Follow::default();
        let err = f
            .take(
                &json!({"error": {"code": -32009, "message": "version"}}),
                &tx,
            )
            .await
            .unwrap_err();
        assert!(matches!(err, A2aClientError::Rpc(e) if e.code == -32009));
    }
}
