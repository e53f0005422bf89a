//! The reply engine of a bot whose brain is a remote A2A agent (`[[bots]] agent = { a2a
//! = "http://…", token_env = … }`, docs/a2a.md "A remote agent as a colleague").
//!
//! Each turn is one task at the agent: its card is fetched once (again after a failed
//! turn), each group is one conversation (`contextId`, kept while the node runs), and
//! the message is what was said in the group since the bot's last turn, the trigger last
//! (the same delta an ACP agent gets, `engine::acp::acp_prompt`). The task's status messages
//! are the turn's progress (the page's live line); its artifacts' text is the reply. A
//! task that asks for input (`INPUT_REQUIRED`) puts its question to the chat as the bot's
//! reply, and the group's next turn continues that task with what was said since.
//! Dropping the turn (`/stop`, the node stopping, the turn's time limit) cancels the task
//! at the agent (`CancelTask`). The agent gets the group's messages and the token
//! configured for it, nothing else of the node's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::a2a::client::{A2aClient, A2aClientError, RemoteCard, TaskEvent};
use crate::a2a::rpc::TaskState;
use crate::config::a2a::A2aAgentSettings;
use crate::telemetry::metrics::Metrics;

/// A bot's remote A2A agent.
pub(crate) struct RemoteAgent {
    /// The client of the agent.
    client: Arc<A2aClient>,
    /// The agent's card, once fetched.
    card: tokio::sync::Mutex<Option<RemoteCard>>,
    /// Each group's conversation (`contextId`).
    contexts: Mutex<HashMap<String, String>>,
    /// Each group's task waiting for the chat's input, which its next turn continues.
    waiting: Mutex<HashMap<String, String>>,
    /// How long one turn may take.
    turn_timeout: Duration,
    /// The bot (for logs and metrics).
    bot: String,
    /// Where `botmesh_a2a_tasks_total{direction="sent"}` is counted.
    metrics: Arc<Metrics>,
}

/// What a turn came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The text to post as the bot's reply: the agent's answer, or its question to the
    /// chat.
    Post(String),
    /// Nothing to post, and why (a cancelled task, an empty answer).
    Silent(String),
}

/// Cancels the turn's task at the agent when the turn is dropped before it ended.
struct CancelOnDrop {
    /// The client.
    client: Arc<A2aClient>,
    /// The card of the agent.
    card: RemoteCard,
    /// The task, once the agent named it.
    task: Option<String>,
    /// Whether the turn is still running.
    armed: bool,
    /// The bot, for the log.
    bot: String,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let (true, Some(task)) = (self.armed, self.task.take()) else {
            return;
        };
        let (client, card, bot) = (self.client.clone(), self.card.clone(), self.bot.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                match client.cancel(&card, &task).await {
                    Ok(()) => tracing::info!(bot = %bot, %task, "the turn was dropped: its A2A task is cancelled at the agent"),
                    Err(e) => tracing::warn!(bot = %bot, %task, error = %e, "the turn was dropped, but its A2A task could not be cancelled at the agent"),
                }
            });
        }
    }
}

impl RemoteAgent {
    /// The engine `settings` describe, presenting `token`.
    pub(crate) fn new(
        settings: &A2aAgentSettings,
        token: Option<String>,
        bot: &str,
        metrics: Arc<Metrics>,
    ) -> reqwest::Result<RemoteAgent> {
        Ok(RemoteAgent {
            client: Arc::new(A2aClient::new(&settings.a2a, token)?),
            card: tokio::sync::Mutex::new(None),
            contexts: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            turn_timeout: Duration::from_secs(settings.turn_timeout_secs),
            bot: bot.to_string(),
            metrics,
        })
    }

    /// The agent's card, fetched on first use.
    async fn card(&self) -> Result<RemoteCard, A2aClientError> {
        let mut card = self.card.lock().await;
        if let Some(c) = card.as_ref() {
            return Ok(c.clone());
        }
        let fetched = self.client.card().await?;
        tracing::info!(bot = %self.bot, agent = %fetched.name, endpoint = %fetched.url, streaming = fetched.streaming, "A2A agent's card read");
        *card = Some(fetched.clone());
        Ok(fetched)
    }

    /// One turn in `group`: `text` sent to the agent, its progress lines to `progress`.
    /// `Err`: the turn failed (the agent unreachable, refusing, failing the task, or past
    /// the time limit), why in words.
    pub(crate) async fn turn(
        &self,
        group: &str,
        text: &str,
        progress: mpsc::Sender<String>,
    ) -> Result<Outcome, String> {
        let started = Instant::now();
        let card = match self.card().await {
            Ok(c) => c,
            Err(e) => {
                self.count("failed", started);
                return Err(e.to_string());
            }
        };
        let context = self
            .contexts
            .lock()
            .entry(group.to_string())
            .or_insert_with(|| uuid::Uuid::new_v4().to_string())
            .clone();
        let continues = self.waiting.lock().remove(group);
        let mut guard = CancelOnDrop {
            client: self.client.clone(),
            card: card.clone(),
            task: continues.clone(),
            armed: true,
            bot: self.bot.clone(),
        };
        let (events, mut heard) = mpsc::channel(32);
        let sending = self
            .client
            .send(&card, text, &context, continues.as_deref(), &events);
        tokio::pin!(sending);
        let deadline = tokio::time::sleep(self.turn_timeout);
        tokio::pin!(deadline);
        let ended = loop {
            tokio::select! {
                r = &mut sending => break r,
                Some(ev) = heard.recv() => match ev {
                    TaskEvent::Started(id) => guard.task = Some(id),
                    TaskEvent::Progress(line) => { let _ = progress.try_send(line); }
                },
                _ = &mut deadline => {
                    self.count("timed_out", started);
                    // Dropping the guard cancels the task at the agent.
                    return Err(format!("the A2A agent's task took over {} s (turn_timeout_secs)", self.turn_timeout.as_secs()));
                }
            }
        };
        while let Ok(ev) = heard.try_recv() {
            match ev {
                TaskEvent::Started(id) => guard.task = Some(id),
                TaskEvent::Progress(line) => {
                    let _ = progress.try_send(line);
                }
            }
        }
        guard.armed = false;
        let end = match ended {
            Ok(end) => end,
            Err(e) => {
                // Read the card again next time: the agent may have moved.
                *self.card.lock().await = None;
                self.count("failed", started);
                return Err(e.to_string());
            }
        };
        self.count(end.state.label(), started);
        let text = end.text.trim().to_string();
        match end.state {
            TaskState::Completed if text.is_empty() => Ok(Outcome::Silent(
                "the agent's task completed without text".into(),
            )),
            TaskState::Completed => Ok(Outcome::Post(text)),
            TaskState::InputRequired | TaskState::AuthRequired => {
                if !end.task_id.is_empty() {
                    self.waiting
                        .lock()
                        .insert(group.to_string(), end.task_id.clone());
                }
                tracing::info!(bot = %self.bot, %group, task = %end.task_id, "the A2A agent asks the chat: its next turn here continues the task");
                if text.is_empty() {
                    Ok(Outcome::Post("(the agent needs input to go on)".into()))
                } else {
                    Ok(Outcome::Post(text))
                }
            }
            TaskState::Canceled => Ok(Outcome::Silent("the agent's task was cancelled".into())),
            state => Err(format!(
                "the A2A agent's task ended {}{}",
                state.label(),
                if text.is_empty() {
                    String::new()
                } else {
                    format!(": {text}")
                }
            )),
        }
    }

    /// Counts a sent task reaching `state` (and the call, as the `agent` purpose).
    fn count(&self, state: &str, started: Instant) {
        self.metrics.a2a_task(&self.bot, "sent", state);
        let label = if state == "completed" || state == "input_required" {
            "ok"
        } else {
            "failed"
        };
        self.metrics
            .llm_call("agent", label, started.elapsed().as_secs_f64(), 0, 0);
    }
}

impl RemoteAgent {
    /// Whether the group's conversation with the agent has begun.
    pub(crate) fn knows(&self, group: &str) -> bool {
        self.contexts.lock().contains_key(group)
    }
}
