//! The reply engine of a bot whose brain is a remote A2A agent (`[[bots]] agent = { a2a
//! = "http://…", token_env = … }`, docs/a2a.md "A remote agent as a colleague").
//!
//! Each turn is one task at the agent: its card is fetched once (again after a failed
//! turn), each group is one conversation (`contextId`, kept in the bot's data folder by
//! `a2a::conversations`, so a restart goes on with it), and
//! the message is what was said in the group since the bot's last turn, the trigger last
//! (the same delta an ACP agent gets, `engine::acp::acp_prompt`). The task's status messages
//! are the turn's progress (the page's live line); its artifacts' text is the reply. A
//! task that asks for input (`INPUT_REQUIRED`) puts its question to the chat as the bot's
//! reply, and the group's next turn continues that task with what was said since.
//! Dropping the turn (`/stop`, the node stopping, the turn's time limit) cancels the task
//! at the agent (`CancelTask`). The agent gets the group's messages and the token
//! configured for it, nothing else of the node's.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::a2a::client::{A2aClient, A2aClientError, RemoteCard, TaskEnd, TaskEvent};
use crate::a2a::conversations::Conversations;
use crate::a2a::rpc::TaskState;
use crate::config::a2a::A2aAgentSettings;
use crate::config::{AgentEngine, NodeConfig};
use crate::engine::context::{TurnContext, Written};
use crate::engine::{Reply, ReplyEngine};
use crate::telemetry::metrics::Metrics;

/// The engine of a bot with `agent = { a2a = … }`: its conversations kept in the
/// node's data folder.
pub(crate) fn pick(
    cfg: &NodeConfig,
    metrics: &Arc<Metrics>,
) -> Option<anyhow::Result<Box<dyn ReplyEngine>>> {
    let Some(AgentEngine::A2a(settings)) = &cfg.bot().agent else {
        return None;
    };
    let agent = RemoteAgent::new(
        settings,
        cfg.a2a_agent_token.clone(),
        &cfg.bot().name,
        Some(&cfg.data_dir),
        metrics.clone(),
    );
    Some(
        agent
            .map(|a| Box::new(a) as Box<dyn ReplyEngine>)
            .map_err(|e| anyhow::anyhow!("bot {}'s A2A agent client: {e}", cfg.bot().name)),
    )
}

impl ReplyEngine for RemoteAgent {
    fn name(&self) -> &'static str {
        "a2a"
    }

    fn wins_turn_first(&self) -> bool {
        true
    }

    fn write<'a>(&'a self, turn: &'a TurnContext<'a>) -> BoxFuture<'a, Written> {
        Box::pin(self.take_turn(turn))
    }
}

/// A bot's remote A2A agent.
pub(crate) struct RemoteAgent {
    /// The client of the agent.
    client: Arc<A2aClient>,
    /// The agent's card, once fetched.
    card: tokio::sync::Mutex<Option<RemoteCard>>,
    /// Each group's conversation (`contextId`) and task waiting for the chat's input,
    /// kept on disk.
    conversations: Conversations,
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

/// How long a dropped turn keeps following its send for the task's id, when the agent
/// had not named its task yet: past this (or when the stream ends) there is nothing to
/// cancel.
const NAME_WAIT: Duration = Duration::from_secs(30);

/// Cancels the turn's task at the agent when the turn is dropped before it ended. It
/// owns the send (running as its own task) and the events it reports, so a turn dropped
/// before the agent named its task (`/stop` right after the message went out) is
/// followed until the name arrives, then cancelled: the remote task is never left
/// running.
struct CancelOnDrop {
    /// The client.
    client: Arc<A2aClient>,
    /// The card of the agent.
    card: RemoteCard,
    /// The task, once the agent named it.
    task: Option<String>,
    /// The send, running: stopped once the task is cancelled (or the turn ends).
    sending: tokio::task::JoinHandle<Result<TaskEnd, A2aClientError>>,
    /// What the send reports: the task's name, its progress.
    heard: mpsc::Receiver<TaskEvent>,
    /// Whether the turn is still running.
    armed: bool,
    /// The bot, for the log.
    bot: String,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            self.sending.abort();
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.sending.abort();
            return;
        };
        let (client, card, bot) = (self.client.clone(), self.card.clone(), self.bot.clone());
        let known = self.task.take();
        let sending = self.sending.abort_handle();
        // The send goes on until the cleanup below stops it; its events go with it.
        let heard = std::mem::replace(&mut self.heard, mpsc::channel(1).1);
        rt.spawn(async move {
            let task = match known {
                Some(task) => Some(task),
                None => {
                    tracing::info!(bot = %bot, "the turn was dropped before the A2A agent named its task: following the send for its name, to cancel it");
                    named(heard).await
                }
            };
            match task {
                None => tracing::info!(bot = %bot, "the dropped turn's send ended (or waited {} s) without a task: nothing to cancel at the agent", NAME_WAIT.as_secs()),
                Some(task) => match client.cancel(&card, &task).await {
                    Ok(()) => tracing::info!(bot = %bot, %task, "the turn was dropped: its A2A task is cancelled at the agent"),
                    Err(e) => tracing::warn!(bot = %bot, %task, error = %e, "the turn was dropped, but its A2A task could not be cancelled at the agent"),
                },
            }
            sending.abort();
        });
    }
}

/// The task's name from a send's events, once the agent says it: `None` when the send
/// ends first, or after [`NAME_WAIT`].
async fn named(mut heard: mpsc::Receiver<TaskEvent>) -> Option<String> {
    let wait = async {
        while let Some(ev) = heard.recv().await {
            if let TaskEvent::Started(id) = ev {
                return Some(id);
            }
        }
        None
    };
    tokio::time::timeout(NAME_WAIT, wait).await.ok().flatten()
}

impl RemoteAgent {
    /// The engine `settings` describe, presenting `token`, its conversations kept in
    /// the data folder `dir` (`None`: in memory).
    pub(crate) fn new(
        settings: &A2aAgentSettings,
        token: Option<String>,
        bot: &str,
        dir: Option<&Path>,
        metrics: Arc<Metrics>,
    ) -> reqwest::Result<RemoteAgent> {
        Ok(RemoteAgent {
            client: Arc::new(A2aClient::new(&settings.a2a, token)?),
            card: tokio::sync::Mutex::new(None),
            conversations: Conversations::open(dir),
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
        let context = self.conversations.context(group);
        let continues = self.conversations.take_waiting(group);
        let (events, heard) = mpsc::channel(32);
        let sending = tokio::spawn({
            let (client, card, text, context, continues) = (
                self.client.clone(),
                card.clone(),
                text.to_string(),
                context.clone(),
                continues.clone(),
            );
            async move {
                client
                    .send(&card, &text, &context, continues.as_deref(), &events)
                    .await
            }
        });
        let mut guard = CancelOnDrop {
            client: self.client.clone(),
            card: card.clone(),
            task: continues,
            sending,
            heard,
            armed: true,
            bot: self.bot.clone(),
        };
        let deadline = tokio::time::sleep(self.turn_timeout);
        tokio::pin!(deadline);
        let ended = loop {
            tokio::select! {
                r = &mut guard.sending => break r.unwrap_or_else(|e| Err(A2aClientError::Invalid(format!("the send to the agent stopped: {e}")))),
                Some(ev) = guard.heard.recv() => match ev {
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
        while let Ok(ev) = guard.heard.try_recv() {
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
                    self.conversations.wait(group, &end.task_id);
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
        self.conversations.knows(group)
    }

    /// The turn on the trigger written by the remote agent: the text to post, or
    /// why not (`agent_silent`, `agent_failed`, `shutting_down`) for the decision
    /// record. The message is what was said since the bot's last turn, the trigger
    /// last (the recent transcript first, when the group's conversation with the
    /// agent is new); one call of the daily budget. Its task's status messages are
    /// the page's progress line.
    async fn take_turn(&self, turn: &TurnContext<'_>) -> Written {
        let (msg, me) = (turn.msg, turn.me);
        let before = turn.host.before(me.context_messages.max(50));
        let prompt = crate::engine::acp::acp_prompt(&me.name, &before, msg, |id| {
            turn.host.consumed(id)
        });
        let text = match prompt.context.filter(|_| !self.knows(&msg.group)) {
            Some(context) => format!("{context}\n\nNow:\n{}", prompt.text),
            None => prompt.text,
        };
        let _turn = turn
            .host
            .prompted(&format!("A2A task, {} lines", text.lines().count()));
        turn.llm.budget.spend(0);
        let (progress, mut lines) = mpsc::channel(32);
        let task = self.turn(&msg.group, &text, progress);
        tokio::pin!(task);
        let outcome = loop {
            tokio::select! {
                biased;
                // Returning drops the turn, which cancels the task at the agent.
                _ = turn.stopping.cancelled() => {
                    return Written::silent("shutting_down", "the node is stopping: the agent's task is cancelled", "shutting_down");
                }
                Some(line) = lines.recv() => turn.host.progress(line),
                r = &mut task => break r,
            }
        };
        while let Ok(line) = lines.try_recv() {
            turn.host.progress(line);
        }
        match outcome {
            Ok(Outcome::Post(text)) => Written::Reply(Reply { text, tokens: 0 }),
            Ok(Outcome::Silent(why)) => Written::silent("agent_silent", why, "agent_silent"),
            Err(why) => Written::silent("agent_failed", why, "agent_failed"),
        }
    }
}
