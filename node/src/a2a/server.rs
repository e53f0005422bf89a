//! The served bot's A2A endpoint (`POST <api>/a2a`, JSON-RPC): `SendMessage`,
//! `SendStreamingMessage`, `GetTask` and `CancelTask`, as the official SDK's clients
//! call them (docs/a2a.md).
//!
//! A caller's message becomes a message in the bot's group from the person
//! `a2a:<caller>`, addressed to the bot (`@Bot …`): everyone in the group sees it and
//! the answer, and the bot's turn runs as for any mention (no judge; the depth rules,
//! quiet and budgets apply). The task follows that turn through the node's live events
//! ([`A2aHost::events`]):
//! - the agent's progress → `WORKING` with the progress line as the status message;
//! - a permission question of its agent posted in the chat → `INPUT_REQUIRED` until the
//!   agent goes on (answered with `/allow` or `/deny` in the chat, or by the caller
//!   sending `/allow` with the task's id);
//! - the bot's reply → `COMPLETED`, the reply the task's artifact;
//! - the bot staying silent or its turn failing → `FAILED`, why as the status message;
//! - a person's `/stop`, or `CancelTask` (which stops the group's turn as `/stop`
//!   does) → `CANCELED`.
//!
//! The node's side is behind [`A2aHost`], so this file knows nothing of the node's
//! state: it is handed the host with each request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::a2a::rpc::{self, RpcError, SendParams, TaskIdParams, TaskState};
use crate::a2a::tasks::{TaskRecord, TaskStore};
use crate::telemetry::events::Event;
use crate::wire::envelope::{AuthorKind, Envelope, Why};

/// The most a served task waits for the bot's turn to end; past it the task fails.
pub(crate) const TASK_DEADLINE: Duration = Duration::from_secs(3_600);

/// What the node does for the A2A endpoint: the narrow handle it is given.
pub(crate) trait A2aHost: Send + Sync + 'static {
    /// The bot's name.
    fn bot(&self) -> String;
    /// Posts `text` in `group` as the person `a2a:<caller>`, replying to `reply_to`;
    /// the message's id, or why it could not be posted.
    fn post(
        &self,
        group: String,
        caller: String,
        text: String,
        reply_to: Option<Ulid>,
    ) -> BoxFuture<'_, Result<Ulid, String>>;
    /// The node's live events (messages, decisions, an agent's progress and questions).
    fn events(&self) -> broadcast::Receiver<Event>;
    /// Stops the bot's turns in flight in `group`, as a person's `/stop` does, said by
    /// `caller` (named as the person `a2a:<caller>` in the turn's end line).
    fn stop_turn(&self, group: &str, caller: &str);
    /// The bot's answer to `trigger` in `group`, if it is in the transcript (read after
    /// the event stream lagged).
    fn answer_to(&self, group: &str, trigger: Ulid) -> Option<Arc<Envelope>>;
    /// Counts a served task reaching `state`.
    fn counted(&self, state: TaskState);
    /// Cancelled when the node stops serving.
    fn stopping(&self) -> CancellationToken;
}

/// What the endpoint answers: one JSON-RPC response, or (a stream that started) an
/// SSE stream of them.
pub(crate) enum A2aAnswer {
    /// One JSON-RPC response (HTTP 200, `application/json`).
    Json(Value),
    /// JSON-RPC responses, one SSE event each (`text/event-stream`).
    Stream(BoxStream<'static, Value>),
}

/// The served bot's tasks and the endpoint that works on them.
pub(crate) struct A2aServer {
    /// The group callers' messages go to.
    group: String,
    /// The tasks.
    pub(crate) tasks: Arc<TaskStore>,
    /// The follower of each running task, to stop when it is cancelled.
    running: Mutex<HashMap<String, CancellationToken>>,
    /// How long a task may run.
    deadline: Duration,
}

/// What happened to a task's turn.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// Working; the agent's progress line, if any.
    Working(Option<String>),
    /// Its agent's question waits in the chat.
    InputRequired(String),
    /// The bot answered: the answer's id and text.
    Answered(Ulid, String),
    /// The turn ended without an answer: why.
    Failed(String),
    /// A person stopped it.
    Canceled(String),
    /// The turn was handed to a sidecar, which answers later through the local API (a
    /// message `Posted` as the bot, replying to the trigger).
    Handed,
}

impl A2aServer {
    /// A server posting in `group`, keeping its tasks in `tasks`.
    pub(crate) fn new(group: String, tasks: Arc<TaskStore>) -> A2aServer {
        A2aServer {
            group,
            tasks,
            running: Mutex::new(HashMap::new()),
            deadline: TASK_DEADLINE,
        }
    }

    /// Answers one JSON-RPC request of `caller` (its name, without `a2a:`), who sent
    /// `A2A-Version: version`.
    pub(crate) async fn handle(
        self: &Arc<Self>,
        host: Arc<dyn A2aHost>,
        caller: &str,
        version: Option<&str>,
        body: &[u8],
    ) -> A2aAnswer {
        let req: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return A2aAnswer::Json(rpc::error(
                    &Value::Null,
                    &RpcError::parse(format!("not JSON: {e}")),
                ))
            }
        };
        let id = req.get("id").cloned().unwrap_or(Value::Null);
        let fail = |e: RpcError| A2aAnswer::Json(rpc::error(&id, &e));
        let method = match (req.get("jsonrpc"), req.get("method")) {
            (Some(Value::String(v)), Some(Value::String(m))) if v == "2.0" => m.clone(),
            _ => {
                return fail(RpcError::invalid_request(
                    "not a JSON-RPC 2.0 request: needs \"jsonrpc\": \"2.0\" and a \"method\"",
                ))
            }
        };
        if !rpc::version_ok(version) {
            tracing::info!(%caller, %method, version = %rpc::version_of(version), "A2A request refused: not A2A-Version 1.0 (none sent counts as 0.3, as the SDK's server counts it)");
            return fail(RpcError::version(rpc::version_of(version)));
        }
        let params = req.get("params").cloned().unwrap_or_else(|| json!({}));
        tracing::debug!(%caller, %method, "A2A request");
        match method.as_str() {
            "SendMessage" => {
                let immediately = params
                    .pointer("/configuration/returnImmediately")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let task = match self.send(&host, caller, params).await {
                    Ok(t) => t,
                    Err(e) => return fail(e),
                };
                let task = if immediately {
                    task
                } else {
                    self.settled(&task, &host.stopping()).await
                };
                A2aAnswer::Json(rpc::result(&id, json!({"task": task.to_wire()})))
            }
            "SendStreamingMessage" => {
                // Watching before the task exists: no change is missed.
                let watch = self.tasks.watch();
                match self.send(&host, caller, params).await {
                    Ok(t) => A2aAnswer::Stream(self.stream(id.clone(), t, watch, host.stopping())),
                    Err(e) => fail(e),
                }
            }
            "GetTask" => match self.own_task(caller, params) {
                Ok(t) => A2aAnswer::Json(rpc::result(&id, t.to_wire())),
                Err(e) => fail(e),
            },
            "CancelTask" => match self.cancel(&host, caller, params) {
                Ok(t) => A2aAnswer::Json(rpc::result(&id, t.to_wire())),
                Err(e) => fail(e),
            },
            "CreateTaskPushNotificationConfig"
            | "GetTaskPushNotificationConfig"
            | "ListTaskPushNotificationConfigs"
            | "DeleteTaskPushNotificationConfig" => fail(RpcError::push_not_supported()),
            "ListTasks" | "SubscribeToTask" | "GetExtendedAgentCard" => fail(
                RpcError::unsupported(format!("{method} is not offered: use SendMessage, SendStreamingMessage, GetTask or CancelTask")),
            ),
            _ => fail(RpcError::method_not_found(format!(
                "no method {method:?} (A2A 1.0 names: SendMessage, SendStreamingMessage, GetTask, CancelTask)"
            ))),
        }
    }

    /// The task `params` names, if `caller` gave it (another caller's is not found).
    fn own_task(&self, caller: &str, params: Value) -> Result<TaskRecord, RpcError> {
        let p: TaskIdParams = serde_json::from_value(params)
            .map_err(|e| RpcError::invalid_params(format!("bad params: {e}")))?;
        self.tasks
            .get(&p.id)
            .filter(|t| t.caller == caller)
            .ok_or_else(|| RpcError::task_not_found(&p.id))
    }

    /// `SendMessage`'s work: posts the message and starts following its task (a new
    /// one, or, naming a task still running, that task, which the message answers).
    async fn send(
        self: &Arc<Self>,
        host: &Arc<dyn A2aHost>,
        caller: &str,
        params: Value,
    ) -> Result<TaskRecord, RpcError> {
        let p: SendParams = serde_json::from_value(params)
            .map_err(|e| RpcError::invalid_params(format!("bad params: {e}")))?;
        let text = p.message.text();
        if text.is_empty() {
            return Err(RpcError::content_type(
                "the message has no text part: this agent reads text",
            ));
        }
        if text.len() > crate::wire::envelope::MAX_TEXT_BYTES - 256 {
            return Err(RpcError::invalid_params(format!(
                "the message's text is over {} bytes",
                crate::wire::envelope::MAX_TEXT_BYTES - 256
            )));
        }
        if let Some(task_id) = &p.message.task_id {
            return self.answer_task(host, caller, task_id, &p, text).await;
        }
        let context_id = p
            .message
            .context_id
            .clone()
            .filter(|c| !c.trim().is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        // A follow-up in a conversation continues its thread: it replies to the last
        // answer (or question) in it.
        let reply_to = match self.tasks.last_in_context(&context_id) {
            Some(last) if last.caller != caller => {
                return Err(RpcError::invalid_params(format!(
                    "contextId {context_id} is another caller's conversation"
                )))
            }
            Some(last) => last
                .answer
                .as_ref()
                .map_or(&last.trigger, |(id, _)| id)
                .parse::<Ulid>()
                .ok(),
            None => None,
        };
        let events = host.events();
        let me = host.bot();
        let trigger = host
            .post(
                self.group.clone(),
                caller.to_string(),
                format!("@{me} {text}"),
                reply_to,
            )
            .await
            .map_err(|e| {
                RpcError::internal(format!("the message could not be posted in the group: {e}"))
            })?;
        let task = TaskRecord {
            id: uuid::Uuid::new_v4().to_string(),
            context_id,
            group: self.group.clone(),
            caller: caller.to_string(),
            trigger: trigger.to_string(),
            state: TaskState::Working,
            status_text: None,
            answer: None,
            request: (p.message.message_id.clone(), text),
        };
        self.tasks.put(task.clone());
        tracing::info!(bot = %me, caller = %caller, task = %task.id, context = %task.context_id, trigger = %trigger, group = %self.group, "A2A task: the caller's message is in the group");
        let stop = CancellationToken::new();
        self.running.lock().insert(task.id.clone(), stop.clone());
        let server = self.clone();
        let (host, id) = (host.clone(), task.id.clone());
        tokio::spawn(async move { server.follow(host, events, id, trigger, stop).await });
        Ok(task)
    }

    /// A message naming a running task of the caller's: its text goes into the group as
    /// it is, replying to the task's trigger (a `/allow` answers the agent's question,
    /// the caller being who the turn is for); the task is answered as it stands.
    async fn answer_task(
        &self,
        host: &Arc<dyn A2aHost>,
        caller: &str,
        task_id: &str,
        p: &SendParams,
        text: String,
    ) -> Result<TaskRecord, RpcError> {
        let task = self
            .tasks
            .get(task_id)
            .filter(|t| t.caller == caller)
            .ok_or_else(|| RpcError::task_not_found(task_id))?;
        if task.state.is_terminal() {
            return Err(RpcError::unsupported(format!(
                "Task {task_id} is in terminal state: {}",
                task.state.label()
            )));
        }
        if p.message
            .context_id
            .as_ref()
            .is_some_and(|c| *c != task.context_id)
        {
            return Err(RpcError::invalid_params(format!(
                "the message's contextId is not task {task_id}'s"
            )));
        }
        let trigger = task.trigger.parse::<Ulid>().ok();
        host.post(task.group.clone(), caller.to_string(), text, trigger)
            .await
            .map_err(|e| {
                RpcError::internal(format!("the message could not be posted in the group: {e}"))
            })?;
        Ok(self.tasks.get(task_id).unwrap_or(task))
    }

    /// Follows task `id`'s turn (the bot's answer to `trigger`) through the node's
    /// events until it is over, the task is cancelled (`stop`) or the deadline passes.
    async fn follow(
        self: Arc<Self>,
        host: Arc<dyn A2aHost>,
        mut events: broadcast::Receiver<Event>,
        id: String,
        trigger: Ulid,
        stop: CancellationToken,
    ) {
        let me = host.bot();
        let deadline = tokio::time::sleep(self.deadline);
        tokio::pin!(deadline);
        let stopping = host.stopping();
        // Whether the bot's posted message (a sidecar's later answer) is the answer.
        let mut handed = false;
        loop {
            let step = tokio::select! {
                _ = stop.cancelled() => break,
                _ = stopping.cancelled() => Some(Step::Failed("the node stopped before the bot answered".into())),
                _ = &mut deadline => Some(Step::Failed(format!("no answer within {} s", self.deadline.as_secs()))),
                ev = events.recv() => match ev {
                    Ok(ev) => step_of(&ev, &self.group, trigger, &me, handed),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(task = %id, missed = n, "the A2A task's follower lagged behind the node's events: reading the transcript");
                        host.answer_to(&self.group, trigger)
                            .map(|a| Step::Answered(a.id, a.text.clone()))
                    }
                    Err(broadcast::error::RecvError::Closed) => Some(Step::Failed("the node stopped before the bot answered".into())),
                },
            };
            let Some(step) = step else { continue };
            if step == Step::Handed {
                handed = true;
                continue;
            }
            if self.apply(&host, &id, step) {
                break;
            }
        }
        self.running.lock().remove(&id);
    }

    /// Applies `step` to task `id`; `true` when the task is over.
    fn apply(&self, host: &Arc<dyn A2aHost>, id: &str, step: Step) -> bool {
        let Some(mut t) = self.tasks.get(id) else {
            return true;
        };
        if t.state.is_terminal() {
            return true;
        }
        match step {
            Step::Working(text) => {
                t.state = TaskState::Working;
                t.status_text = text.or(t.status_text);
            }
            Step::InputRequired(q) => {
                t.state = TaskState::InputRequired;
                t.status_text = Some(q);
            }
            Step::Answered(msg, text) => {
                t.state = TaskState::Completed;
                t.status_text = None;
                t.answer = Some((msg.to_string(), text));
            }
            Step::Failed(why) => {
                t.state = TaskState::Failed;
                t.status_text = Some(why);
            }
            Step::Canceled(why) => {
                t.state = TaskState::Canceled;
                t.status_text = Some(why);
            }
            Step::Handed => return false,
        }
        let state = t.state;
        let why = t.status_text.clone().unwrap_or_default();
        if self.tasks.put(t) && (state.is_terminal() || state == TaskState::InputRequired) {
            tracing::info!(task = %id, state = state.label(), why = %why, "A2A task");
            host.counted(state);
        }
        state.is_terminal()
    }

    /// `CancelTask`: stops the group's turn as `/stop` does; the task is `CANCELED`.
    fn cancel(
        &self,
        host: &Arc<dyn A2aHost>,
        caller: &str,
        params: Value,
    ) -> Result<TaskRecord, RpcError> {
        let t = self.own_task(caller, params)?;
        if t.state.is_terminal() {
            return Err(RpcError::not_cancelable(format!(
                "Task {} is {} and cannot be canceled",
                t.id,
                t.state.label()
            )));
        }
        host.stop_turn(&t.group, caller);
        if let Some(follower) = self.running.lock().remove(&t.id) {
            follower.cancel();
        }
        self.apply(
            host,
            &t.id,
            Step::Canceled(format!("canceled by a2a:{caller}")),
        );
        Ok(self.tasks.get(&t.id).unwrap_or(t))
    }

    /// Task `task` once it is over or waits for input (or the node stops).
    async fn settled(&self, task: &TaskRecord, stopping: &CancellationToken) -> TaskRecord {
        let mut watch = self.tasks.watch();
        loop {
            let now = self.tasks.get(&task.id).unwrap_or_else(|| task.clone());
            if now.state.is_interrupted() {
                return now;
            }
            tokio::select! {
                r = watch.recv() => if let Err(broadcast::error::RecvError::Closed) = r { return now },
                _ = stopping.cancelled() => return now,
            }
        }
    }

    /// `SendStreamingMessage`'s events: the task first, then each change of it (the
    /// answer as an `artifactUpdate` before the `statusUpdate` that completes it) until
    /// it is over, when the stream ends.
    fn stream(
        &self,
        rpc_id: Value,
        task: TaskRecord,
        watch: broadcast::Receiver<TaskRecord>,
        stopping: CancellationToken,
    ) -> BoxStream<'static, Value> {
        let first = self.tasks.get(&task.id).unwrap_or(task);
        let store = self.tasks.clone();
        let head =
            futures_util::stream::iter([rpc::result(&rpc_id, json!({"task": first.to_wire()}))]);
        struct Follow {
            watch: broadcast::Receiver<TaskRecord>,
            last: TaskRecord,
            done: bool,
            store: Arc<TaskStore>,
            stopping: CancellationToken,
            rpc_id: Value,
        }
        let state = Follow {
            done: first.state.is_terminal(),
            watch,
            last: first,
            store,
            stopping,
            rpc_id,
        };
        let rest = futures_util::stream::unfold(state, |mut s| async move {
            loop {
                if s.done {
                    return None;
                }
                let next = tokio::select! {
                    r = s.watch.recv() => match r {
                        Ok(t) if t.id == s.last.id => t,
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Lagged(_)) => match s.store.get(&s.last.id) {
                            Some(t) => t,
                            None => return None,
                        },
                        Err(broadcast::error::RecvError::Closed) => return None,
                    },
                    _ = s.stopping.cancelled() => return None,
                };
                if next == s.last {
                    continue;
                }
                let mut out = Vec::new();
                if next.answer.is_some() && next.answer != s.last.answer {
                    let (aid, text) = next.answer.clone().unwrap_or_default();
                    out.push(rpc::result(
                        &s.rpc_id,
                        json!({"artifactUpdate": {
                            "taskId": next.id,
                            "contextId": next.context_id,
                            "artifact": {"artifactId": aid, "name": "answer", "parts": [{"text": text}]},
                            "lastChunk": true,
                        }}),
                    ));
                }
                let wire = next.to_wire();
                out.push(rpc::result(
                    &s.rpc_id,
                    json!({"statusUpdate": {
                        "taskId": next.id,
                        "contextId": next.context_id,
                        "status": wire["status"],
                    }}),
                ));
                s.done = next.state.is_terminal();
                s.last = next;
                return Some((futures_util::stream::iter(out), s));
            }
        })
        .flatten();
        head.chain(rest).boxed()
    }
}

/// What event `ev` says about the bot's (`me`) turn on `trigger` in `group`, if
/// anything. `handed`: the turn went to a sidecar, whose answer is posted.
fn step_of(ev: &Event, group: &str, trigger: Ulid, me: &str, handed: bool) -> Option<Step> {
    match ev {
        Event::Message { envelope: e } => {
            let answer = e.group == group
                && e.author.kind == AuthorKind::Bot
                && e.author.name == me
                && e.reply_to == Some(trigger)
                // A group tool's post mid-turn is not the turn's answer; a sidecar's
                // later answer is.
                && e.why.as_ref().is_some_and(|w| handed || *w != Why::Posted);
            answer.then(|| Step::Answered(e.id, e.text.clone()))
        }
        Event::Decision {
            group: g,
            trigger: t,
            action,
            reason,
        } if g == group && *t == trigger.to_string() => match (action.as_str(), reason.as_str()) {
            ("silent", "stopped") => Some(Step::Canceled("stopped by a person's /stop".into())),
            ("reply", "handed_to_agent") => Some(Step::Handed),
            ("silent" | "yield" | "yield_writing", _) => Some(Step::Failed(format!(
                "the bot did not answer ({action}: {reason})"
            ))),
            _ => None,
        },
        Event::Progress {
            group: g,
            trigger: t,
            text,
            ..
        } if g == group && *t == trigger.to_string() => Some(Step::Working(Some(text.clone()))),
        Event::Question {
            group: g,
            trigger: t,
            text,
            ..
        } if g == group && *t == trigger.to_string() => Some(Step::InputRequired(text.clone())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::envelope::Author;

    #[test]
    fn the_turns_events_become_the_tasks_steps() {
        let trigger = Ulid::new();
        let mut answer = Envelope::message(Ulid::new(), 1, "g", "Bot", Author::bot("Bot"), "42");
        answer.reply_to = Some(trigger);
        answer.why = Some(Why::Mentioned);
        let msg = |e: &Envelope| Event::Message {
            envelope: Arc::new(e.clone()),
        };
        let decision = |action: &str, reason: &str| Event::Decision {
            group: "g".into(),
            trigger: trigger.to_string(),
            action: action.into(),
            reason: reason.into(),
        };
        assert_eq!(
            step_of(&msg(&answer), "g", trigger, "Bot", false),
            Some(Step::Answered(answer.id, "42".into()))
        );
        // Another group, another bot, a tool's post: not the answer.
        assert_eq!(step_of(&msg(&answer), "h", trigger, "Bot", false), None);
        assert_eq!(step_of(&msg(&answer), "g", trigger, "Other", false), None);
        let mut posted = answer.clone();
        posted.why = Some(Why::Posted);
        assert_eq!(step_of(&msg(&posted), "g", trigger, "Bot", false), None);
        // Once the turn went to a sidecar, its posted answer is the answer.
        assert_eq!(
            step_of(
                &decision("reply", "handed_to_agent"),
                "g",
                trigger,
                "Bot",
                false
            ),
            Some(Step::Handed)
        );
        assert_eq!(
            step_of(&msg(&posted), "g", trigger, "Bot", true),
            Some(Step::Answered(posted.id, "42".into()))
        );
        assert!(matches!(
            step_of(&decision("silent", "stopped"), "g", trigger, "Bot", false),
            Some(Step::Canceled(_))
        ));
        assert!(matches!(
            step_of(&decision("silent", "reply_failed"), "g", trigger, "Bot", false),
            Some(Step::Failed(w)) if w.contains("reply_failed")
        ));
        assert_eq!(
            step_of(&decision("reply", "mentioned"), "g", trigger, "Bot", false),
            None
        );
        let progress = Event::Progress {
            group: "g".into(),
            trigger: trigger.to_string(),
            bot: "Bot".into(),
            text: "working: cargo test".into(),
        };
        assert_eq!(
            step_of(&progress, "g", trigger, "Bot", false),
            Some(Step::Working(Some("working: cargo test".into())))
        );
    }
}
