//! [`AcpAgent`]: one agent process per bot, its sessions (one per group), its turns,
//! its permission answers and the supervisor that restarts it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::action::{tool_action, ToolObject};
use super::messages::{self, schema, PROTOCOL_VERSION};
use super::process::{self, AgentProcess};
use super::rpc::{CallError, Connection, Handler, RpcError};
use super::{
    AcpError, AcpOptions, AcpProgress, AcpPrompt, AcpSettings, Decision, PermissionQuestion,
    PlanStep, Rejection, StopReason, ToolKind, ToolRejection, TurnOutcome,
};
use crate::agent::boxing::Boxing;
use crate::config::pacing::{Backoff, Jitter};

/// How long a timed-out turn waits for the agent's `cancelled` answer.
const CANCEL_WAIT: Duration = Duration::from_secs(2);
/// Restarts after a death: from half a second, doubling, up to a minute.
const RESTART: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
/// A process that lived this long counts as healthy: the next restart starts the
/// backoff over.
const HEALTHY: Duration = Duration::from_secs(60);

/// A live agent: its process and connection, numbered so sessions opened on an
/// earlier process are known to be gone.
#[derive(Clone)]
struct Live {
    conn: Arc<Connection>,
    process: Arc<AgentProcess>,
    generation: u64,
    started: Instant,
}

/// Whether there is an agent to talk to.
#[derive(Clone)]
enum Link {
    /// Running and initialized.
    Up(Live),
    /// Starting, or dead and about to be restarted: a prompt waits for it.
    Restarting,
    /// The last restart failed (why); another follows with the backoff. A prompt fails
    /// at once rather than wait for an agent that may not come back.
    Failed(String),
    /// Stopped for good.
    Stopped,
}

/// A turn in flight, found by its session id when the agent's updates and questions
/// come.
struct Turn {
    group: String,
    text: String,
    /// Characters in `text`, which stops growing at `max_reply_chars`.
    chars: usize,
    /// True once a chunk went past `max_reply_chars` (the rest was dropped).
    cut: bool,
    progress: Option<mpsc::Sender<AcpProgress>>,
    cancel: CancellationToken,
    /// Tool calls seen in this turn, by id, to fill in updates and permission
    /// questions that leave things out.
    tools: HashMap<String, SeenTool>,
    /// The tool calls rejected in this turn, in order ([`TurnOutcome::rejected`]).
    rejected: Vec<ToolRejection>,
}

/// What a turn's updates said of one tool call so far.
#[derive(Clone)]
struct SeenTool {
    /// Its title, bounded.
    title: String,
    /// Its kind.
    kind: ToolKind,
    /// Its `locations` and `rawInput`, as last given (for [`tool_action`]).
    object: ToolObject,
}

impl Default for SeenTool {
    fn default() -> Self {
        SeenTool {
            title: String::new(),
            kind: ToolKind::Other,
            object: ToolObject::default(),
        }
    }
}

impl SeenTool {
    /// Takes what a `tool_call`, `tool_call_update` or permission request says of the
    /// call, over what was said before; `None` fields leave it as it was.
    fn update(&mut self, shared: &Shared, fields: &schema::ToolCallUpdateFields) {
        if let Some(title) = &fields.title {
            self.title = bounded_title(shared, title);
        }
        if let Some(kind) = fields.kind {
            self.kind = messages::tool_kind(kind);
        }
        if let Some(locations) = &fields.locations {
            self.object.locations = locations.clone();
        }
        if let Some(input) = fields.raw_input.as_ref().filter(|v| !v.is_null()) {
            self.object.raw_input = Some(input.clone());
        }
    }
}

/// One group's session on one process.
#[derive(Clone)]
struct Session {
    id: String,
    generation: u64,
}

/// Everything the agent's handle, its connection's handler and its supervisor share.
struct Shared {
    settings: AcpSettings,
    bot: String,
    options: AcpOptions,
    link: watch::Sender<Link>,
    sessions: Mutex<HashMap<String, Session>>,
    /// Turns in flight by session id.
    turns: Mutex<HashMap<String, Turn>>,
    /// Groups with a turn in flight.
    busy: Mutex<HashSet<String>>,
    shutdown: CancellationToken,
    /// How every start of the process is boxed (checked once, in [`AcpAgent::start`]).
    boxing: Boxing,
}

/// A bot's ACP agent: one process (restarted when it dies), one session per group.
pub struct AcpAgent {
    shared: Arc<Shared>,
    /// The supervisor task, awaited by [`AcpAgent::stop`]: on shutdown the supervisor
    /// and `stop` race for the live agent, and whichever takes it stops it; `stop`
    /// returns only once that is done.
    supervisor: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for AcpAgent {
    fn drop(&mut self) {
        // The supervisor sees it and stops the process.
        self.shared.shutdown.cancel();
    }
}

impl std::fmt::Debug for AcpAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcpAgent")
            .field("bot", &self.shared.bot)
            .field("command", &self.shared.settings.acp)
            .finish()
    }
}

impl AcpAgent {
    /// Starts the agent's process for `bot` and initializes it. Fails with
    /// [`AcpError::Sandbox`] when it is to be boxed and cannot be (no Landlock, no
    /// launcher), [`AcpError::Spawn`] when the command cannot start, or the error of
    /// `initialize`.
    pub async fn start(
        settings: AcpSettings,
        bot: &str,
        options: AcpOptions,
    ) -> Result<AcpAgent, AcpError> {
        let boxing = boxing(&settings, bot, &options).await?;
        let shared = Arc::new(Shared {
            boxing,
            settings,
            bot: bot.to_string(),
            options,
            link: watch::Sender::new(Link::Restarting),
            sessions: Mutex::new(HashMap::new()),
            turns: Mutex::new(HashMap::new()),
            busy: Mutex::new(HashSet::new()),
            shutdown: CancellationToken::new(),
        });
        let first = match launch(&shared, 1).await {
            Ok(live) => {
                shared.link.send_replace(Link::Up(live.clone()));
                Some(live)
            }
            // The command or the box is wrong: a configuration error, for the node to
            // stop on.
            Err(e @ (AcpError::Spawn { .. } | AcpError::Sandbox(_))) => return Err(e),
            // It started but did not initialize (hung, died, spoke garbage): the node
            // serves on while the supervisor starts it again with backoff.
            Err(e) => {
                tracing::warn!(bot, error = %e, "the ACP agent did not initialize; starting it again with backoff while the node serves");
                shared.link.send_replace(Link::Failed(e.to_string()));
                None
            }
        };
        let supervisor = tokio::spawn(supervise(shared.clone(), first));
        Ok(AcpAgent {
            shared,
            supervisor: Mutex::new(Some(supervisor)),
        })
    }

    /// Why the agent cannot take a turn now (starting again after it died or did not
    /// initialize, or stopped); `None` when it is up. What `/healthz` shows.
    pub fn not_ready(&self) -> Option<String> {
        match &*self.shared.link.borrow() {
            Link::Up(_) => None,
            Link::Restarting => Some("the agent is being started again".into()),
            Link::Failed(why) => Some(format!("the agent could not be started: {why}")),
            Link::Stopped => Some("the agent is stopped".into()),
        }
    }

    /// The running process's id (also its process group's), if it is running.
    pub fn pid(&self) -> Option<u32> {
        match &*self.shared.link.borrow() {
            Link::Up(live) => Some(live.process.pid),
            _ => None,
        }
    }

    /// Whether the next prompt for `group` will open a new session (no turn yet, or
    /// the agent was restarted since): the caller may send the recent transcript as
    /// [`AcpPrompt::context`].
    pub fn needs_context(&self, group: &str) -> bool {
        let generation = match &*self.shared.link.borrow() {
            Link::Up(live) => live.generation,
            _ => return true,
        };
        self.shared
            .sessions
            .lock()
            .get(group)
            .is_none_or(|s| s.generation != generation)
    }

    /// Runs one turn for `group`: opens its session if needed, sends the prompt and
    /// returns the reply. Progress (tool calls, plan) goes to `progress` when given
    /// (dropped, not waited for, when the receiver lags). Dropping the future cancels
    /// the turn at the agent (`session/cancel`).
    pub async fn prompt(
        &self,
        group: &str,
        prompt: impl Into<AcpPrompt>,
        progress: Option<mpsc::Sender<AcpProgress>>,
    ) -> Result<TurnOutcome, AcpError> {
        let shared = &self.shared;
        let prompt = prompt.into();
        let result = self.turn(group, prompt, progress).await;
        let outcome = match &result {
            Ok(o) => o.stop_reason.label(),
            Err(e) => e.label(),
        };
        if let Some(m) = &shared.options.metrics {
            m.agent_turn(&shared.bot, outcome);
        }
        tracing::info!(bot = %shared.bot, group, outcome, "ACP turn ended");
        result
    }

    async fn turn(
        &self,
        group: &str,
        prompt: AcpPrompt,
        progress: Option<mpsc::Sender<AcpProgress>>,
    ) -> Result<TurnOutcome, AcpError> {
        let shared = &self.shared;
        let timeout = Duration::from_secs(shared.settings.turn_timeout_secs);
        let deadline = Instant::now() + timeout;
        if !shared.busy.lock().insert(group.to_string()) {
            return Err(AcpError::Busy(group.to_string()));
        }
        let mut guard = TurnGuard {
            shared: shared.clone(),
            group: group.to_string(),
            sent: None,
            in_flight: false,
        };
        let opened = tokio::time::timeout_at(deadline, async {
            let live = self.live().await?;
            let (session, new_session) = self.session(&live, group).await?;
            Ok::<_, AcpError>((live, session, new_session))
        })
        .await;
        let (live, session, new_session) = match opened {
            Ok(opened) => opened?,
            Err(_) => return Err(AcpError::TimedOut(timeout)),
        };
        let cancel = CancellationToken::new();
        shared.turns.lock().insert(
            session.clone(),
            Turn {
                group: group.to_string(),
                text: String::new(),
                chars: 0,
                cut: false,
                progress,
                cancel: cancel.clone(),
                tools: HashMap::new(),
                rejected: Vec::new(),
            },
        );
        guard.sent = Some((live.conn.clone(), session.clone(), cancel.clone()));
        guard.in_flight = true;
        let mut blocks = Vec::new();
        if let Some(context) = prompt.context.filter(|_| new_session) {
            blocks.push(text_block(context));
        }
        blocks.push(text_block(prompt.text));
        let request = schema::PromptRequest::new(session.clone(), blocks);
        let call = live
            .conn
            .call(METHODS.session_prompt, messages::to_json(&request));
        tokio::pin!(call);
        let answer = tokio::select! {
            answer = &mut call => answer,
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(bot = %shared.bot, group, ?timeout, "ACP turn timed out: session/cancel");
                guard.cancel();
                let _ = tokio::time::timeout(CANCEL_WAIT, &mut call).await;
                guard.in_flight = false;
                return Err(AcpError::TimedOut(timeout));
            }
        };
        guard.in_flight = false;
        let (mut text, cut, rejected) = shared
            .turns
            .lock()
            .remove(&session)
            .map(|t| (t.text, t.cut, t.rejected))
            .unwrap_or_default();
        if cut {
            let max = shared.settings.max_reply_chars;
            tracing::warn!(bot = %shared.bot, group, max_reply_chars = max, "the ACP agent's reply was longer than max_reply_chars: cut");
            if let Some(m) = &shared.options.metrics {
                m.agent_output_cut(&shared.bot, "reply");
            }
            text.push_str(&format!(
                "\n\n[cut: the answer was longer than {max} characters]"
            ));
        }
        let result = answer.map_err(|e| call_error(METHODS.session_prompt, e))?;
        let stop_reason = messages::read_stop_reason(result)?;
        let text = if stop_reason == StopReason::Cancelled || cancel.is_cancelled() {
            String::new()
        } else {
            text
        };
        Ok(TurnOutcome {
            stop_reason,
            text,
            new_session,
            rejected,
        })
    }

    /// Cancels `group`'s turn in flight, if any (`/stop`): the agent gets
    /// `session/cancel`, pending permission questions are answered `cancelled`, and
    /// the turn returns [`StopReason::Cancelled`] once the agent stops. True when there
    /// was a turn to cancel.
    pub fn cancel(&self, group: &str) -> bool {
        let found = {
            let turns = self.shared.turns.lock();
            turns
                .iter()
                .find(|(_, t)| t.group == group)
                .map(|(session, t)| (session.clone(), t.cancel.clone()))
        };
        let Some((session, cancel)) = found else {
            return false;
        };
        if let Link::Up(live) = &*self.shared.link.borrow() {
            send_cancel(&self.shared, &live.conn, &session, &cancel);
        }
        true
    }

    /// Stops the agent for good: no more restarts; its stdin is closed, then its
    /// process group gets SIGTERM, then SIGKILL. Returns once the processes are gone.
    pub async fn stop(&self) {
        self.shared.shutdown.cancel();
        let old = self.shared.link.send_replace(Link::Stopped);
        if let Link::Up(live) = old {
            stop_live(&self.shared, &live).await;
        }
        // The supervisor may have taken the live agent first (it sees the same
        // cancellation): it stops it, and the processes are gone once it returns.
        let supervisor = self.supervisor.lock().take();
        if let Some(task) = supervisor {
            if let Err(e) = task.await {
                tracing::error!(bot = %self.shared.bot, error = %e, "the ACP agent's supervisor failed");
            }
        }
    }

    /// The live agent, waiting while it is being restarted.
    async fn live(&self) -> Result<Live, AcpError> {
        let mut rx = self.shared.link.subscribe();
        loop {
            match rx.borrow_and_update().clone() {
                Link::Up(live) => return Ok(live),
                Link::Stopped => return Err(AcpError::Stopped),
                Link::Failed(reason) => {
                    return Err(AcpError::Died {
                        reason: format!("it could not be restarted: {reason}"),
                        status: None,
                    })
                }
                Link::Restarting => {}
            }
            if rx.changed().await.is_err() {
                return Err(AcpError::Stopped);
            }
        }
    }

    /// `group`'s session on `live`, opened if it has none there: (id, new).
    async fn session(&self, live: &Live, group: &str) -> Result<(String, bool), AcpError> {
        let known = self.shared.sessions.lock().get(group).cloned();
        if let Some(s) = known.filter(|s| s.generation == live.generation) {
            return Ok((s.id, false));
        }
        let mut servers = self.shared.options.mcp_servers.clone();
        if let Some(group_servers) = &self.shared.options.group_servers {
            servers.extend(group_servers.of_group(group));
        }
        let request =
            schema::NewSessionRequest::new(&self.shared.settings.cwd).mcp_servers(servers);
        let method = METHODS.session_new;
        let answer = live
            .conn
            .call(method, messages::to_json(&request))
            .await
            .map_err(|e| call_error(method, e))?;
        let opened: schema::NewSessionResponse = messages::read_answer(method, answer)?;
        let id = opened.session_id.0.to_string();
        tracing::info!(bot = %self.shared.bot, group, session = %id, "opened an ACP session");
        self.shared.sessions.lock().insert(
            group.to_string(),
            Session {
                id: id.clone(),
                generation: live.generation,
            },
        );
        Ok((id, true))
    }
}

/// Ends a turn whatever way it ends: frees the group, forgets the turn and, when the
/// prompt is still in flight (the future dropped: a lost turn, `/stop`), cancels it at
/// the agent.
struct TurnGuard {
    shared: Arc<Shared>,
    group: String,
    /// Set once `session/prompt` is sent: the connection, the session, the turn's
    /// cancellation.
    sent: Option<(Arc<Connection>, String, CancellationToken)>,
    /// True while the prompt's answer has not come.
    in_flight: bool,
}

impl TurnGuard {
    fn cancel(&self) {
        if let Some((conn, session, cancel)) = &self.sent {
            send_cancel(&self.shared, conn, session, cancel);
        }
    }
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        if self.in_flight {
            tracing::info!(bot = %self.shared.bot, group = %self.group, "ACP turn dropped in flight: session/cancel");
            self.cancel();
        }
        if let Some((_, session, _)) = &self.sent {
            self.shared.turns.lock().remove(session);
        }
        self.shared.busy.lock().remove(&self.group);
    }
}

/// Sends `session/cancel` for `session` once, and marks its turn cancelled.
fn send_cancel(shared: &Shared, conn: &Connection, session: &str, cancel: &CancellationToken) {
    if cancel.is_cancelled() {
        return;
    }
    cancel.cancel();
    tracing::info!(bot = %shared.bot, session, "session/cancel");
    let notice = schema::CancelNotification::new(session.to_string());
    conn.notify(METHODS.session_cancel, messages::to_json(&notice));
}

/// The ACP methods this client calls, by their names in the protocol crate.
const METHODS: schema::AgentMethodNames = schema::AGENT_METHOD_NAMES;

/// A prompt's text as an ACP content block.
fn text_block(text: String) -> schema::ContentBlock {
    schema::ContentBlock::Text(schema::TextContent::new(text))
}

/// An [`AcpError`] for a failed call.
fn call_error(method: &str, e: CallError) -> AcpError {
    match e {
        CallError::Rpc(RpcError { code, message }) => AcpError::Refused {
            method: method.to_string(),
            code,
            message,
        },
        CallError::Dead(d) => AcpError::Died {
            reason: d.reason,
            status: d.status,
        },
    }
}

/// How `bot`'s agent is boxed: with the sandbox on, the launcher, proven to be a
/// botmesh binary on a kernel that enforces Landlock; with `sandbox = "off"`, not at
/// all (a warning, at every start).
async fn boxing(
    settings: &AcpSettings,
    bot: &str,
    options: &AcpOptions,
) -> Result<Boxing, AcpError> {
    if settings.sandbox == crate::config::acp::SandboxSetting::Off {
        tracing::warn!(bot, "sandbox = \"off\": the ACP agent runs unboxed, and can read and write whatever the node's user can (its data dir, config and key files)");
        return Ok(Boxing::default());
    }
    let (boxing, answer) = Boxing::prepare(
        options.sandbox_launcher.clone(),
        options.sandbox_deny.clone(),
    )
    .await?;
    tracing::info!(bot, launcher = ?boxing.launcher, %answer, deny = ?boxing.deny, "the ACP agent runs boxed");
    Ok(boxing)
}

/// Spawns the process and initializes it.
async fn launch(shared: &Arc<Shared>, generation: u64) -> Result<Live, AcpError> {
    let (process, pipes) = process::spawn(&shared.settings, &shared.bot, &shared.boxing)?;
    let handler = Arc::new(Incoming {
        shared: Arc::downgrade(shared),
    });
    let conn = Connection::start(
        pipes.stdout,
        pipes.stdin,
        handler,
        process.exit.clone(),
        format!("{}/{}", shared.bot, process.pid),
    );
    let live = Live {
        conn,
        process: Arc::new(process),
        generation,
        started: Instant::now(),
    };
    let method = METHODS.initialize;
    let request = messages::to_json(&messages::initialize_request());
    let limit = Duration::from_secs(shared.settings.init_timeout_secs);
    // A shutdown does not wait for an agent that is slow to initialize: it is stopped.
    let answer = tokio::select! {
        answer = tokio::time::timeout(limit, live.conn.call(method, request)) => answer,
        _ = shared.shutdown.cancelled() => {
            stop_live(shared, &live).await;
            return Err(AcpError::Stopped);
        }
    };
    let initialized = match answer {
        Ok(answer) => answer.map_err(|e| call_error(method, e)),
        Err(_) => Err(AcpError::Protocol {
            method: method.into(),
            problem: format!("no answer within init_timeout_secs ({limit:?})"),
        }),
    }
    .and_then(|answer| messages::read_answer::<schema::InitializeResponse>(method, answer))
    .and_then(|answer| {
        let version = answer.protocol_version;
        if version == PROTOCOL_VERSION {
            Ok(answer)
        } else {
            Err(AcpError::Protocol {
                method: method.into(),
                problem: format!(
                    "it speaks protocol version {version}, this client {PROTOCOL_VERSION}"
                ),
            })
        }
    });
    match initialized {
        Ok(answer) => {
            let (name, version) = answer
                .agent_info
                .map(|i| (i.name, i.version))
                .unwrap_or_default();
            tracing::info!(bot = %shared.bot, agent = %name, version = %version, "the ACP agent is initialized");
            Ok(live)
        }
        Err(e) => {
            stop_live(shared, &live).await;
            Err(e)
        }
    }
}

/// Closes the agent's input and stops its process group, then lets the connection's
/// reader see the output end and say how the connection ended (a shutdown that
/// returned first would cut that line off the log), for at most [`READER_AFTER_STOP`].
async fn stop_live(shared: &Shared, live: &Live) {
    tracing::info!(bot = %shared.bot, pid = live.process.pid, "stopping the ACP agent");
    live.conn.close_input();
    live.process.stop().await;
    if tokio::time::timeout(READER_AFTER_STOP, live.conn.dead())
        .await
        .is_err()
    {
        tracing::warn!(bot = %shared.bot, "the ACP agent's output is still open after its process group ended (a process outside the group holds it?)");
    }
}

/// How long [`stop_live`] waits for the connection's reader once the process is gone:
/// its output ends with it, and the exit status is known, so the reader ends at once.
const READER_AFTER_STOP: Duration = Duration::from_secs(2);

/// Watches the live agent; when it dies (or, `first` being `None`, never came up),
/// restarts it with [`RESTART`] until it is up again or the agent is stopped.
async fn supervise(shared: Arc<Shared>, first: Option<Live>) {
    let mut attempt = 0u32;
    let mut generation = 1;
    let mut current = first;
    loop {
        if let Some(live) = current.take() {
            let death = tokio::select! {
                biased;
                _ = shared.shutdown.cancelled() => {
                    if let Link::Up(live) = shared.link.send_replace(Link::Stopped) {
                        stop_live(&shared, &live).await;
                    }
                    return;
                }
                death = live.conn.dead() => death,
            };
            if shared.shutdown.is_cancelled() {
                current = Some(live);
                continue; // the shutdown branch above ends it
            }
            let reason = match &death.status {
                Some(status) => format!("{} ({status})", death.reason),
                None => death.reason.clone(),
            };
            tracing::warn!(bot = %shared.bot, reason = %reason, "the ACP agent died; restarting it");
            if !matches!(&*shared.link.borrow(), Link::Stopped) {
                shared.link.send_replace(Link::Restarting);
            }
            // A connection that died of garbage leaves a live process: stop it.
            stop_live(&shared, &live).await;
            if live.started.elapsed() >= HEALTHY {
                attempt = 0;
            }
            generation = live.generation;
        }
        generation += 1;
        let live = loop {
            attempt += 1;
            let delay = RESTART.delay(attempt, Jitter::Scale(1.0..=1.2));
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shared.shutdown.cancelled() => {
                    shared.link.send_replace(Link::Stopped);
                    return;
                }
            }
            if let Some(m) = &shared.options.metrics {
                m.agent_restart(&shared.bot);
            }
            match launch(&shared, generation).await {
                Ok(new) => break new,
                Err(AcpError::Stopped) => {
                    shared.link.send_replace(Link::Stopped);
                    return;
                }
                Err(e) => {
                    tracing::warn!(bot = %shared.bot, attempt, error = %e, "restarting the ACP agent failed");
                    shared.link.send_replace(Link::Failed(e.to_string()));
                }
            }
        };
        if shared.shutdown.is_cancelled() {
            stop_live(&shared, &live).await;
            shared.link.send_replace(Link::Stopped);
            return;
        }
        tracing::info!(bot = %shared.bot, pid = live.process.pid, "the ACP agent was restarted; sessions reopen on the next prompt");
        shared.link.send_replace(Link::Up(live.clone()));
        current = Some(live);
    }
}

/// The client's side of the agent's requests and notifications.
struct Incoming {
    shared: Weak<Shared>,
}

/// The ACP methods an agent calls on this client, by their names in the protocol crate.
const CLIENT_METHODS: schema::ClientMethodNames = schema::CLIENT_METHOD_NAMES;

impl Handler for Incoming {
    fn request(&self, method: &str, params: Value) -> BoxFuture<'static, Result<Value, RpcError>> {
        let shared = self.shared.upgrade();
        let method = method.to_string();
        Box::pin(async move {
            if method != CLIENT_METHODS.session_request_permission {
                return Err(RpcError::method_not_found(&method));
            }
            let Some(shared) = shared else {
                return Ok(cancelled());
            };
            let answer = match messages::read_permission(&shared.bot, params) {
                Ok(request) => answer_permission(&shared, &request).await,
                Err(problem) => {
                    tracing::warn!(bot = %shared.bot, %problem, "a permission question this client cannot read: cancelled");
                    cancelled_outcome()
                }
            };
            Ok(messages::to_json(&schema::RequestPermissionResponse::new(
                answer,
            )))
        })
    }

    fn notification(&self, method: &str, params: Value) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        if method != CLIENT_METHODS.session_update {
            tracing::debug!(bot = %shared.bot, method, "ignoring an ACP notification");
        } else if let Some((kind, update)) = messages::read_update(&shared.bot, params) {
            session_update(&shared, &kind, update);
        }
    }
}

/// Takes one `session/update`: message chunks into the turn's text, tool calls and
/// plans to its progress; other kinds are ignored.
fn session_update(shared: &Shared, kind: &str, notice: schema::SessionNotification) {
    let session = notice.session_id.0.as_ref();
    let mut turns = shared.turns.lock();
    let Some(turn) = turns.get_mut(session) else {
        tracing::debug!(bot = %shared.bot, session, kind, "an ACP update for no turn in flight");
        return;
    };
    let event = match notice.update {
        schema::SessionUpdate::AgentMessageChunk(chunk) => 'chunk: {
            if let schema::ContentBlock::Text(schema::TextContent { text, .. }) = &chunk.content {
                let first = turn.chars == 0 && !turn.cut;
                let room = shared.settings.max_reply_chars.saturating_sub(turn.chars);
                let kept = cut_at(text, room);
                turn.chars += kept.chars().count();
                turn.text.push_str(kept);
                turn.cut |= kept.len() < text.len();
                if first && turn.chars > 0 {
                    break 'chunk Some(AcpProgress::Writing);
                }
            }
            None
        }
        schema::SessionUpdate::ToolCall(call) => {
            let status = messages::status_name(call.status);
            let update = schema::ToolCallUpdate::from(call);
            Some(tool_progress(shared, turn, &update, status))
        }
        schema::SessionUpdate::ToolCallUpdate(update) => {
            let status = update
                .fields
                .status
                .map(messages::status_name)
                .unwrap_or_default();
            Some(tool_progress(shared, turn, &update, status))
        }
        schema::SessionUpdate::Plan(plan) => Some(AcpProgress::Plan(
            plan.entries
                .iter()
                .map(|e| PlanStep {
                    content: bounded_title(shared, &e.content),
                    status: messages::plan_status_name(&e.status),
                })
                .collect(),
        )),
        _ => {
            tracing::debug!(bot = %shared.bot, kind, "ignoring an ACP session update");
            None
        }
    };
    if let (Some(event), Some(tx)) = (event, &turn.progress) {
        if tx.try_send(event).is_err() {
            tracing::debug!(bot = %shared.bot, "ACP progress dropped: the receiver is full or gone");
        }
    }
}

/// Notes what a `tool_call` or `tool_call_update` says of a call in `turn`, and the
/// progress it makes (`status`: empty when an update leaves it out).
fn tool_progress(
    shared: &Shared,
    turn: &mut Turn,
    update: &schema::ToolCallUpdate,
    status: String,
) -> AcpProgress {
    let id = update.tool_call_id.0.to_string();
    let entry = turn.tools.entry(id.clone()).or_default();
    entry.update(shared, &update.fields);
    AcpProgress::ToolCall {
        id,
        title: entry.title.clone(),
        kind: entry.kind,
        status,
    }
}

/// The longest prefix of `text` of at most `max` characters.
fn cut_at(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// A tool call's title (or a plan step) as shown: at most `max_title_chars`
/// characters, a cut one ending in `…` and counted.
fn bounded_title(shared: &Shared, title: &str) -> String {
    let max = shared.settings.max_title_chars;
    let kept = cut_at(title, max);
    if kept.len() == title.len() {
        return title.to_string();
    }
    if let Some(m) = &shared.options.metrics {
        m.agent_output_cut(&shared.bot, "title");
    }
    tracing::debug!(bot = %shared.bot, chars = title.chars().count(), max_title_chars = max, "a tool call's title was cut");
    format!("{}…", cut_at(kept, max.saturating_sub(1)))
}

/// The answer `{outcome: {outcome: "cancelled"}}`, whole.
fn cancelled() -> Value {
    messages::to_json(&schema::RequestPermissionResponse::new(cancelled_outcome()))
}

/// The outcome `cancelled`: the call does not run, and no option was chosen.
fn cancelled_outcome() -> schema::RequestPermissionOutcome {
    schema::RequestPermissionOutcome::Cancelled
}

/// Answers `session/request_permission` by the tool call's kind: `allow` → the
/// option of kind `allow_once`; `ask` → the people in the chat, within
/// `ask_timeout_secs`; anything else, a refusal or no answer → `reject_once`. The
/// option is chosen by its kind, never its id; without one of the wanted kind, or for
/// a turn cancelled or gone, the answer is `cancelled`.
async fn answer_permission(
    shared: &Arc<Shared>,
    request: &schema::RequestPermissionRequest,
) -> schema::RequestPermissionOutcome {
    let session = request.session_id.0.as_ref();
    let call = &request.tool_call;
    let id = call.tool_call_id.0.as_ref();
    let found = shared.turns.lock().get(session).map(|t| {
        let known = t.tools.get(id).cloned();
        (t.group.clone(), t.cancel.clone(), known)
    });
    let Some((group, cancel, known)) = found else {
        tracing::info!(bot = %shared.bot, session, "a permission question for no turn in flight: cancelled");
        return cancelled_outcome();
    };
    if cancel.is_cancelled() {
        return cancelled_outcome();
    }
    // What the request says of the call, over what its updates said; an empty title
    // keeps the one they gave.
    let mut seen = known.unwrap_or_default();
    let known_title = seen.title.clone();
    seen.update(shared, &call.fields);
    let kind = seen.kind;
    let title = Some(seen.title)
        .filter(|t| !t.is_empty())
        .or(Some(known_title).filter(|t| !t.is_empty()))
        .unwrap_or_else(|| "(untitled tool call)".into());
    let action = tool_action(kind, &title, &seen.object, &shared.settings.cwd);
    let settings = &shared.settings;
    let (allow, why) = if settings.allow.contains(&kind) {
        (true, Ok("its kind is allowed"))
    } else if settings.ask.contains(&kind) {
        match shared.options.asker.clone() {
            None => {
                tracing::warn!(bot = %shared.bot, %group, %kind, "a permission question with no one to ask: rejected");
                (false, Err(Rejection::NoOneToAsk))
            }
            Some(asker) => {
                let question = PermissionQuestion {
                    bot: shared.bot.clone(),
                    group: group.clone(),
                    title: title.clone(),
                    kind,
                    action: action.clone(),
                };
                let limit = Duration::from_secs(settings.ask_timeout_secs);
                let decision = tokio::select! {
                    d = tokio::time::timeout(limit, asker.ask(question)) => d.unwrap_or(Decision::TimedOut),
                    _ = cancel.cancelled() => {
                        tracing::info!(bot = %shared.bot, %group, %title, "the turn was cancelled while asking: cancelled");
                        return cancelled_outcome();
                    }
                };
                match decision {
                    Decision::Allow => (true, Ok("the chat allowed it")),
                    Decision::Deny { by } => (false, Err(Rejection::Denied { by })),
                    Decision::TimedOut => (false, Err(Rejection::Unanswered)),
                }
            }
        }
    } else {
        (false, Err(Rejection::NotAllowed))
    };
    let why = match why {
        Ok(why) => why,
        Err(rejection) => {
            let said = rejection_words(&rejection);
            if let Some(turn) = shared.turns.lock().get_mut(session) {
                turn.rejected.push(ToolRejection {
                    action,
                    kind,
                    why: rejection,
                });
            }
            said
        }
    };
    pick(shared, &request.options, allow, why, &title, kind)
}

/// Why a call was rejected, for the log.
fn rejection_words(r: &Rejection) -> &'static str {
    match r {
        Rejection::NotAllowed => "its kind is neither allowed nor asked about",
        Rejection::NoOneToAsk => "no one to ask",
        Rejection::Denied { by: Some(_) } => "the chat denied it",
        Rejection::Denied { by: None } => "the question could not be put",
        Rejection::Unanswered => "no one answered in time",
    }
}

/// The outcome selecting the option of kind `allow_once` or `reject_once`.
fn pick(
    shared: &Shared,
    options: &[schema::PermissionOption],
    allow: bool,
    why: &str,
    title: &str,
    kind: ToolKind,
) -> schema::RequestPermissionOutcome {
    let (wanted, name) = if allow {
        (schema::PermissionOptionKind::AllowOnce, "allow_once")
    } else {
        (schema::PermissionOptionKind::RejectOnce, "reject_once")
    };
    match options.iter().find(|o| o.kind == wanted) {
        Some(option) => {
            tracing::info!(bot = %shared.bot, %title, %kind, decision = name, why, "answered an ACP permission question");
            schema::RequestPermissionOutcome::Selected(schema::SelectedPermissionOutcome::new(
                option.option_id.clone(),
            ))
        }
        None => {
            tracing::warn!(bot = %shared.bot, %title, %kind, wanted = name, why, "no permission option of the wanted kind: cancelled");
            cancelled_outcome()
        }
    }
}
