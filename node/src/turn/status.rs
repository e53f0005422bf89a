//! The status message of a long turn: what people see while a bot works.
//!
//! When a turn (an ACP agent's, the built-in model's tool loop) still runs after the
//! bot's `status_after_secs`, the bot posts ONE status message in the chat ("Coder is
//! working (1m 10s): cargo test, Read src/lib.rs") and edits it in place as the work
//! reports progress, at most every `status_every_secs`. When the turn ends the status
//! says how ("Coder: done in 2m 13s", "Coder: stopped by Boss after 40s", "Coder:
//! failed after 1m 2s: the agent exited"), and the answer comes as a normal new message.
//!
//! - The status is not conversation: it is a [`Kind::Status`] envelope, recorded once
//!   (as it is first posted) and shown as status; the turn code never reads it.
//! - Where the platform cannot edit (QQ, a WeCom or DingTalk send), the status is
//!   posted once and never changed: no stream of notes.
//! - An edit that fails leaves the last text standing; nothing is posted again.
//! - The work reports progress through the [`StatusFeed`] that [`with_status`] hands
//!   it: the writing step passes it on to the engines (as their
//!   [`crate::engine::model::ShowTool`]), so progress takes a visible path to the
//!   status task.
//! - The status runs in its own task, so a turn dropped by `/stop` still ends its
//!   status ("stopped by Boss": the turn's [`StopSignal`] says who), and a post in flight when the turn ends is finished, then
//!   edited, never cut off half-way.
//! - How the turn ended is said once: by the status, once it is up and can be edited
//!   (its final edit takes the turn's [`Outcome`] from the [`OutcomeSlot`]: "Coder:
//!   done in 2m 13s; denied by Alice: edit notes.txt"), else by the turn's short line
//!   (`turn::outcome::announce`, which finds the slot still full). The status's final
//!   version is recorded too (a status that [`Envelope::replaces`] it, carrying the
//!   agent's [`Envelope::turn_end`]): the transcript keeps how the turn went, and the
//!   agent's next prompt begins with it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::turn::control::StopSignal;
use crate::turn::outcome::{Outcome, OutcomeSlot};
use crate::wire::envelope::{Envelope, Kind};

/// How long a final edit may take before the answer is posted anyway (a platform
/// that keeps refusing: the status keeps its last text).
const FINAL_EDIT_WAIT: Duration = Duration::from_secs(15);

/// How many progress items the status names, the latest last.
const SHOWN_ITEMS: usize = 3;

/// When the status of a turn appears and how often it may change: the bot's
/// `status_after_secs` and `status_every_secs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StatusTiming {
    /// How long a turn runs before its status is posted.
    pub(crate) after: Duration,
    /// The least time between two edits.
    pub(crate) every: Duration,
}

impl StatusTiming {
    /// The bot's timing; `None` when its status messages are off
    /// (`status_after_secs = 0`).
    pub(crate) fn of(bot: &crate::config::BotSettings) -> Option<StatusTiming> {
        (bot.status_after_secs > 0).then(|| StatusTiming {
            after: Duration::from_secs(bot.status_after_secs),
            every: Duration::from_secs(bot.status_every_secs.max(1)),
        })
    }
}

/// A status message as posted: what its edits need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Posted {
    /// The group it is in.
    pub(crate) group: String,
    /// Its envelope id (the page's handle on it).
    pub(crate) id: ulid::Ulid,
    /// The platform's id of it (`None` on the local page, or when the platform post
    /// failed).
    pub(crate) platform_msg_id: Option<String>,
    /// Whether it can be edited: the platform edits (or it is the page's own).
    pub(crate) editable: bool,
}

/// What the turn code needs of the node to show a status: post and record it once,
/// edit it in place. Owned (`'static`), so a status outlives a dropped turn.
pub(crate) trait StatusPort: Send + Sync + 'static {
    /// Posts `env` (a [`Kind::Status`] envelope; its `sent_at` is set at posting) to
    /// the platform and records it; `None` when nothing could be posted or recorded
    /// (logged): the turn goes on without a status.
    fn post(&self, env: Envelope) -> BoxFuture<'static, Option<Posted>>;
    /// Replaces the status's text in place (the page at once, the platform with its
    /// own call); `false` when the platform refused (logged and counted: the last
    /// text stays).
    fn edit(&self, posted: &Posted, text: String) -> BoxFuture<'static, bool>;
    /// Records the status's final version: a status envelope built from `status` (as
    /// posted) that [`Envelope::replaces`] it with `text` and carries `turn_end` (what
    /// the agent is told of this turn at its next one). Never posted to the platform
    /// (the status was edited there); a failure is logged.
    fn record_end(
        &self,
        status: &Envelope,
        text: String,
        turn_end: Option<String>,
    ) -> BoxFuture<'static, ()>;
}

/// Who says how the turn ended, shared by the turn and its status task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    /// The status is not up yet: if the turn ends now, its line says it.
    #[default]
    Waiting,
    /// The status is being posted, or is up and editable: it says the end.
    Up,
    /// The status is up but cannot be edited (or could not be posted): the line says
    /// the end.
    Fixed,
    /// The turn ended.
    Ended,
}

/// How a turn ended, as its status says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// An answer was written (it comes next, as a message).
    Done,
    /// The turn ended without an answer (the agent said nothing, or was busy).
    NoAnswer,
    /// Stopped by a person's `/stop` (dropping the turn): who said it, when known.
    Stopped(Option<String>),
    /// Stopped because the node is shutting down.
    ShutDown,
    /// The work failed: why, in a few words.
    Failed(String),
}

/// What the work reports while it runs, for its status, shared by the
/// [`StatusFeed`] the work holds and the status task that reads it.
#[derive(Debug, Default)]
struct Feed {
    /// The progress items so far, the latest last (a tool call's title and state).
    items: parking_lot::Mutex<Vec<(String, String)>>,
    /// How the work says it ended, when it says (else: answered or not).
    ending: parking_lot::Mutex<Option<Ending>>,
    /// Counts the changes of `items`: an edit shows the version it read, so a wake-up
    /// for a change already shown edits nothing.
    version: std::sync::atomic::AtomicU64,
    /// Woken at each change of `items`.
    changed: Notify,
}

impl Feed {
    /// The items now and their version.
    fn snapshot(&self) -> (Vec<(String, String)>, u64) {
        let items = self.items.lock();
        (
            items.clone(),
            self.version.load(std::sync::atomic::Ordering::SeqCst),
        )
    }
}

/// The running turn's handle on its status: what the work (the writing step and
/// the engines it calls) reports while it runs. [`with_status`] hands one to the
/// work; [`StatusFeed::off`] (a turn whose bot shows no status, or writing ahead
/// of the turn, before any status) reports nowhere.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatusFeed {
    /// The feed the status task reads; `None`: no status to report to.
    feed: Option<Arc<Feed>>,
}

impl StatusFeed {
    /// A feed that reports nowhere: no status is shown.
    pub(crate) fn off() -> StatusFeed {
        StatusFeed::default()
    }

    /// Reports progress to the status: item `key` (a tool call's id) is now `shown`
    /// ("cargo test", "cargo test ✓").
    pub(crate) fn note(&self, key: &str, shown: &str) {
        let Some(feed) = &self.feed else {
            return;
        };
        let mut items = feed.items.lock();
        match items.iter_mut().find(|(k, _)| k == key) {
            Some((_, s)) if s == shown => return,
            Some((_, s)) => *s = shown.to_string(),
            None => items.push((key.to_string(), shown.to_string())),
        }
        feed.version
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        drop(items);
        feed.changed.notify_one();
    }

    /// Reports an ACP agent's progress to the status: a tool call by its title
    /// (`cargo test`, then `cargo test ✓` or `cargo test ✗` once it ended); a plan by
    /// its step in progress.
    pub(crate) fn note_acp(&self, update: &crate::agent::acp::AcpProgress) {
        use crate::agent::acp::AcpProgress;
        match update {
            AcpProgress::ToolCall {
                id, title, status, ..
            } => {
                let shown = match status.as_str() {
                    "completed" => format!("{title} ✓"),
                    "failed" => format!("{title} ✗"),
                    _ => title.clone(),
                };
                self.note(id, &shown);
            }
            AcpProgress::Plan(steps) => {
                if let Some(step) = steps.iter().find(|s| s.status == "in_progress") {
                    self.note("plan", &step.content);
                }
            }
            // The answer's words are coming: the status's time line says it is alive.
            AcpProgress::Writing => {}
        }
    }

    /// Tells the status how the work ended, when it knows better than "answered or
    /// not" (a failure, a stop).
    pub(crate) fn ended(&self, ending: Ending) {
        if let Some(feed) = &self.feed {
            *feed.ending.lock() = Some(ending);
        }
    }
}

impl crate::engine::model::ShowTool for StatusFeed {
    fn show_tool(&self, id: &str, shown: &str) {
        self.note(id, shown);
    }
}

/// An engine reports to the turn's status through this (`engine::context::ShowWork`).
impl crate::engine::context::ShowWork for StatusFeed {
    fn show_agent(&self, update: &crate::agent::acp::AcpProgress) {
        self.note_acp(update);
    }

    fn work_ended(&self, how: crate::engine::context::WorkEnded) {
        self.ended(match how {
            crate::engine::context::WorkEnded::ShutDown => Ending::ShutDown,
            crate::engine::context::WorkEnded::Failed(why) => Ending::Failed(why),
        });
    }
}

/// How long, as people read it: `8s`, `1m 10s`, `1h 2m`.
pub(crate) fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3_599 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3_600, (s % 3_600) / 60),
    }
}

/// The status while the work goes on.
pub(crate) fn working_text(bot: &str, took: Duration, items: &[(String, String)]) -> String {
    let shown: Vec<&str> = items
        .iter()
        .rev()
        .take(SHOWN_ITEMS)
        .rev()
        .map(|(_, s)| s.as_str())
        .collect();
    if shown.is_empty() {
        format!("{bot} is working ({})", elapsed(took))
    } else {
        format!("{bot} is working ({}): {}", elapsed(took), shown.join(", "))
    }
}

/// The status once the turn ended.
pub(crate) fn final_text(bot: &str, took: Duration, ending: &Ending) -> String {
    let took = elapsed(took);
    match ending {
        Ending::Done => format!("{bot}: done in {took}"),
        Ending::NoAnswer => format!("{bot}: finished in {took} without an answer"),
        Ending::Stopped(None) => format!("{bot}: stopped after {took}"),
        Ending::Stopped(Some(by)) => format!("{bot}: stopped by {by} after {took}"),
        Ending::ShutDown => format!("{bot}: stopped after {took} (the node is stopping)"),
        Ending::Failed(why) => format!("{bot}: failed after {took}: {why}"),
    }
}

/// A turn longer than this mentions the person who asked in its answer: they may
/// have turned to something else meanwhile.
pub(crate) const MENTION_AFTER: Duration = Duration::from_secs(60);

/// `reply` to `msg` after a turn of `took`: past [`MENTION_AFTER`] it mentions the
/// person who asked (`@Name` first), unless it already does. A bot that asked is not
/// mentioned: a mention is a bot's trigger.
pub(crate) fn mention_asker(
    msg: &Envelope,
    mut reply: crate::turn::brain::Reply,
    took: Duration,
) -> crate::turn::brain::Reply {
    if took > MENTION_AFTER && msg.is_human() {
        let at = format!("@{}", msg.author.name);
        if !reply.text.contains(&at) {
            reply.text = format!("{at} {}", reply.text);
        }
    }
    reply
}

/// What the status task is told at the end of the turn: how it ended, how long it
/// took, and the turn's outcome when the status is to say it (taken from the slot).
type End = (Ending, Duration, Option<Outcome>);

/// The running status of one turn: ends it when dropped (the turn was dropped:
/// stopped) or told how it ended ([`Shown::finish`]).
struct Shown<'a> {
    /// Tells the status task how the turn ended.
    end: Option<oneshot::Sender<End>>,
    /// When the turn started.
    started: Instant,
    /// The turn's stop signal: who stopped a dropped turn.
    stop: StopSignal,
    /// Where the turn's outcome waits to be said (by the status, or by the line).
    slot: &'a OutcomeSlot,
    /// Whether the status is up, shared with the task.
    phase: Arc<parking_lot::Mutex<Phase>>,
    /// The status task: done once its last edit is made.
    task: tokio::task::JoinHandle<()>,
}

impl Shown<'_> {
    /// Ends the status with `ending` and waits (boundedly) for its last edit, so the
    /// answer comes after it.
    async fn finish(mut self, ending: Ending) {
        self.end(ending, None);
        let _ = tokio::time::timeout(FINAL_EDIT_WAIT, &mut self.task).await;
    }

    /// Tells the task the turn ended as `ending` (once). When the status is up, it
    /// takes the turn's outcome from the slot (`stopped_by`: a dropped turn's, stopped
    /// by them) to say it; else the slot keeps it for the line.
    fn end(&mut self, ending: Ending, stopped_by: Option<String>) {
        let Some(end) = self.end.take() else {
            return;
        };
        let was = std::mem::replace(&mut *self.phase.lock(), Phase::Ended);
        let outcome = (was == Phase::Up).then(|| {
            if let Some(by) = stopped_by {
                self.slot.stopped(by);
            }
            self.slot.take()
        });
        let _ = end.send((ending, self.started.elapsed(), outcome.flatten()));
    }
}

impl Drop for Shown<'_> {
    fn drop(&mut self) {
        // Dropped without `finish`: the turn was dropped (a person's `/stop`, named
        // when the signal says who); the task goes on by itself to say so.
        let by = self.stop.by();
        let said_by = by.clone().unwrap_or_else(|| "a person".into());
        self.end(Ending::Stopped(by), Some(said_by));
    }
}

/// Runs `work` (the writing of a turn's reply) with its status shown per `timing`
/// through `port`: posted once the work has run `timing.after`, edited as it reports
/// progress, ended with how it went (`done` when `answered` says so of its output,
/// with the outcome `slot` holds then, which the status then takes: see the module).
/// Returns the work's output and how long it ran. `work` is given the
/// [`StatusFeed`] it reports through. `status` is the envelope to post
/// (its text is set here); `stop` is the turn's stop signal, naming who stopped a
/// dropped turn. Without a port or timing, `work` alone (its feed reports nowhere).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn with_status<T, W: Future<Output = T>>(
    port: Option<Arc<dyn StatusPort>>,
    timing: Option<StatusTiming>,
    status: Envelope,
    stop: StopSignal,
    slot: &OutcomeSlot,
    work: impl FnOnce(StatusFeed) -> W,
    answered: impl Fn(&T) -> bool,
) -> (T, Duration) {
    let started = Instant::now();
    let (Some(port), Some(timing)) = (port, timing) else {
        let out = work(StatusFeed::off()).await;
        return (out, started.elapsed());
    };
    let feed = Arc::new(Feed::default());
    let phase = Arc::new(parking_lot::Mutex::new(Phase::Waiting));
    let (end, ending) = oneshot::channel();
    let shown = Shown {
        end: Some(end),
        started,
        stop,
        slot,
        phase: phase.clone(),
        task: tokio::spawn(run(
            port,
            timing,
            status,
            feed.clone(),
            phase,
            started,
            ending,
        )),
    };
    let out = work(StatusFeed {
        feed: Some(feed.clone()),
    })
    .await;
    let took = started.elapsed();
    let said = feed.ending.lock().take();
    let ending = match said {
        Some(e) => e,
        None if answered(&out) => Ending::Done,
        None => Ending::NoAnswer,
    };
    shown.finish(ending).await;
    (out, took)
}

/// The status task: waits `timing.after` (or the end), posts, edits on progress at
/// most every `timing.every`, makes the final edit and records the status's final
/// version.
async fn run(
    port: Arc<dyn StatusPort>,
    timing: StatusTiming,
    mut status: Envelope,
    feed: Arc<Feed>,
    phase: Arc<parking_lot::Mutex<Phase>>,
    started: Instant,
    mut ending: oneshot::Receiver<End>,
) {
    let bot = status.author.name.clone();
    tokio::select! {
        // A short turn: no status at all.
        _ = &mut ending => return,
        _ = tokio::time::sleep_until(started + timing.after) => {}
    }
    {
        let mut phase = phase.lock();
        if *phase == Phase::Ended {
            // Ended as the delay ran out: a short turn after all.
            return;
        }
        *phase = Phase::Up;
    }
    let (items, mut shown) = feed.snapshot();
    status.kind = Kind::Status;
    // A status says nothing of why the bot speaks: its answer will.
    status.why = None;
    status.text = working_text(&bot, started.elapsed(), &items);
    let mut last = status.text.clone();
    // Posted whole even if the turn ends meanwhile: then edited to its end.
    let posted = port.post(status.clone()).await;
    if let Some(p) = &posted {
        status.platform_msg_id = p.platform_msg_id.clone();
        tracing::info!(bot, group = %p.group, id = %p.id, editable = p.editable, "status message posted: the turn runs long");
    }
    if !posted.as_ref().is_some_and(|p| p.editable) {
        let mut phase = phase.lock();
        if *phase != Phase::Ended {
            // The turn's line will say how it ended: this status never changes.
            *phase = Phase::Fixed;
            return;
        }
    }
    // The sender is dropped only with the task's owner gone: stopped.
    let stopped = || (Ending::Stopped(None), started.elapsed(), None);
    let Some(posted) = posted else {
        // The turn ended while the post failed: it had handed its outcome over.
        let (_, _, outcome) = ending.await.unwrap_or_else(|_| stopped());
        if let Some(line) = outcome.and_then(|o| o.line()) {
            tracing::warn!(bot, group = %status.group, line, "the status message could not be posted, and the turn ended meanwhile: how it ended is not said");
        }
        return;
    };
    let mut last_edit = Instant::now();
    let (how, took, outcome) = if !posted.editable {
        // Ended while posting a status that cannot change: it is recorded as ended.
        ending.await.unwrap_or_else(|_| stopped())
    } else {
        loop {
            // Progress not shown yet, or the end.
            if feed.snapshot().1 == shown {
                tokio::select! {
                    how = &mut ending => break how.unwrap_or_else(|_| stopped()),
                    // Looked at again: a wake-up may be for a change already shown.
                    _ = feed.changed.notified() => continue,
                }
            }
            // No sooner than `every` after the last edit; progress meanwhile joins this one.
            tokio::select! {
                how = &mut ending => break how.unwrap_or_else(|_| stopped()),
                _ = tokio::time::sleep_until(last_edit + timing.every) => {}
            }
            let (items, version) = feed.snapshot();
            shown = version;
            let text = working_text(&bot, started.elapsed(), &items);
            if text != last && port.edit(&posted, text.clone()).await {
                last = text;
            }
            last_edit = Instant::now();
        }
    };
    let mut text = final_text(&bot, took, &how);
    if let Some(rejected) = outcome.as_ref().and_then(Outcome::rejections) {
        text = format!("{text}; {rejected}");
    }
    if posted.editable {
        // The final edit, too, keeps the pace.
        tokio::time::sleep_until(last_edit + timing.every).await;
        if text != last {
            port.edit(&posted, text.clone()).await;
        }
    }
    port.record_end(&status, text, outcome.and_then(|o| o.for_agent()))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::envelope::Author;

    /// What a port was asked to do, and when (since the start).
    #[derive(Debug, Clone, PartialEq)]
    enum Did {
        Post(Duration, String),
        Edit(Duration, String),
    }

    /// A port that records its calls; `editable` as a platform that edits or not;
    /// `refuse_edits`: every edit fails.
    struct Recorder {
        start: Instant,
        did: parking_lot::Mutex<Vec<Did>>,
        /// The final versions recorded: (replaced id, text, turn_end).
        ends: parking_lot::Mutex<Vec<(ulid::Ulid, String, Option<String>)>>,
        editable: bool,
        refuse_edits: bool,
        post_takes: Duration,
    }

    impl Recorder {
        fn new(editable: bool) -> Arc<Recorder> {
            Arc::new(Recorder {
                start: Instant::now(),
                did: Default::default(),
                ends: Default::default(),
                editable,
                refuse_edits: false,
                post_takes: Duration::ZERO,
            })
        }
        fn did(&self) -> Vec<Did> {
            self.did.lock().clone()
        }
    }

    impl StatusPort for Recorder {
        fn post(&self, env: Envelope) -> BoxFuture<'static, Option<Posted>> {
            assert_eq!(env.kind, Kind::Status);
            self.did
                .lock()
                .push(Did::Post(self.start.elapsed(), env.text.clone()));
            let (takes, editable) = (self.post_takes, self.editable);
            Box::pin(async move {
                tokio::time::sleep(takes).await;
                Some(Posted {
                    group: env.group,
                    id: env.id,
                    platform_msg_id: Some("m1".into()),
                    editable,
                })
            })
        }
        fn edit(&self, _posted: &Posted, text: String) -> BoxFuture<'static, bool> {
            self.did.lock().push(Did::Edit(self.start.elapsed(), text));
            let ok = !self.refuse_edits;
            Box::pin(async move { ok })
        }
        fn record_end(
            &self,
            status: &Envelope,
            text: String,
            turn_end: Option<String>,
        ) -> BoxFuture<'static, ()> {
            assert_eq!(status.kind, Kind::Status);
            self.ends.lock().push((status.id, text, turn_end));
            Box::pin(async {})
        }
    }

    fn status() -> Envelope {
        Envelope::message(ulid::Ulid::new(), 0, "g", "Coder", Author::bot("Coder"), "")
    }

    /// [`with_status`] as these tests call it: the recorder shows a fresh status
    /// message, and an answer is `Some`.
    async fn shown<T, W: Future<Output = Option<T>>>(
        port: &Arc<Recorder>,
        timing: Option<StatusTiming>,
        stop: StopSignal,
        slot: &OutcomeSlot,
        work: impl FnOnce(StatusFeed) -> W,
    ) -> (Option<T>, Duration) {
        let port = Some(port.clone() as Arc<dyn StatusPort>);
        with_status(port, timing, status(), stop, slot, work, Option::is_some).await
    }

    fn timing(after: u64, every: u64) -> Option<StatusTiming> {
        Some(StatusTiming {
            after: Duration::from_secs(after),
            every: Duration::from_secs(every),
        })
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// Work that reports `steps` (at these seconds from its start, with these
    /// titles), then answers at `end`.
    async fn work(
        feed: StatusFeed,
        steps: Vec<(u64, &'static str)>,
        end: u64,
    ) -> Option<&'static str> {
        let start = Instant::now();
        for (i, (at, title)) in steps.into_iter().enumerate() {
            tokio::time::sleep_until(start + secs(at)).await;
            feed.note(&i.to_string(), title);
        }
        tokio::time::sleep_until(start + secs(end)).await;
        Some("the answer")
    }

    /// Work that ends after `after` seconds with `answer`, leaving `outcome` in
    /// `slot` as the agent step does.
    async fn ends(
        slot: &OutcomeSlot,
        after: u64,
        outcome: Outcome,
        answer: Option<&'static str>,
    ) -> Option<&'static str> {
        tokio::time::sleep(secs(after)).await;
        slot.set(outcome);
        answer
    }

    /// Runs the turn `start` makes of a stop signal (600 s of work) until Boss
    /// says `/stop` in its group at 40 s.
    async fn boss_stops_at_40s<T: Future>(start: impl FnOnce(StopSignal) -> T) {
        let stops = crate::turn::control::GroupStops::default();
        let stop = stops.token("g");
        let turn = start(stop.clone());
        let stopping = async {
            tokio::time::sleep(secs(40)).await;
            stops.stop("g", "Boss");
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = turn => unreachable!("the turn runs 600 s"),
            _ = stopping => {}
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_turn_posts_once_after_the_delay_edits_on_progress_at_the_pace_and_ends_done() {
        let port = Recorder::new(true);
        let (out, took) = shown(
            &port,
            timing(8, 3),
            StopSignal::default(),
            &OutcomeSlot::default(),
            |feed| {
                work(
                    feed,
                    vec![
                        (2, "read notes"),
                        (10, "cargo build"),
                        (10, "cargo test"),
                        (20, "edit src/lib.rs"),
                    ],
                    70,
                )
            },
        )
        .await;
        assert_eq!(out, Some("the answer"));
        assert_eq!(took, secs(70));
        assert_eq!(
            port.did(),
            vec![
                // After 8 s, with what was done before.
                Did::Post(secs(8), "Coder is working (8s): read notes".into()),
                // Progress at 10 s: an edit no sooner than 3 s after the post.
                Did::Edit(
                    secs(11),
                    "Coder is working (11s): read notes, cargo build, cargo test".into()
                ),
                Did::Edit(
                    secs(20),
                    "Coder is working (20s): cargo build, cargo test, edit src/lib.rs".into()
                ),
                // The end, and nothing after it.
                Did::Edit(secs(70), "Coder: done in 1m 10s".into()),
            ]
        );
        tokio::time::sleep(secs(60)).await;
        assert_eq!(port.did().len(), 4, "nothing once the turn is over");
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_turn_shows_no_status_and_none_is_shown_when_off() {
        let port = Recorder::new(true);
        let (out, _) = shown(
            &port,
            timing(8, 3),
            StopSignal::default(),
            &OutcomeSlot::default(),
            |feed| work(feed, vec![(1, "cargo test")], 7),
        )
        .await;
        assert_eq!(out, Some("the answer"));
        tokio::time::sleep(secs(60)).await;
        assert!(port.did().is_empty(), "{:?}", port.did());
        let (out, _) = shown(
            &port,
            None,
            StopSignal::default(),
            &OutcomeSlot::default(),
            |feed| work(feed, vec![(1, "cargo test")], 70),
        )
        .await;
        assert_eq!(out, Some("the answer"));
        assert!(port.did().is_empty(), "status_after_secs = 0: off");
    }

    #[tokio::test(start_paused = true)]
    async fn a_platform_without_edits_gets_one_message_and_a_refused_edit_keeps_the_last_text() {
        let port = Recorder::new(false);
        shown(
            &port,
            timing(2, 1),
            StopSignal::default(),
            &OutcomeSlot::default(),
            |feed| work(feed, vec![(3, "a"), (5, "b"), (7, "c")], 30),
        )
        .await;
        assert_eq!(
            port.did(),
            vec![Did::Post(secs(2), "Coder is working (2s)".into())],
            "one working message, never edited"
        );
        let port = Arc::new(Recorder {
            refuse_edits: true,
            ..Arc::into_inner(Recorder::new(true)).unwrap()
        });
        shown(
            &port,
            timing(2, 1),
            StopSignal::default(),
            &OutcomeSlot::default(),
            |feed| work(feed, vec![(3, "a")], 10),
        )
        .await;
        let did = port.did();
        assert_eq!(did.len(), 3, "{did:?}");
        assert!(
            matches!(&did[0], Did::Post(..)),
            "posted once, never again: {did:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_turn_says_stopped_by_whom_and_a_failure_says_why() {
        let port = Recorder::new(true);
        let slot = OutcomeSlot::default();
        let turn = shown(&port, timing(2, 1), StopSignal::default(), &slot, |feed| {
            work(feed, vec![], 600)
        });
        // `/stop` drops the turn at 40 s.
        let _ = tokio::time::timeout(secs(40), turn).await;
        tokio::time::sleep(secs(5)).await;
        assert_eq!(
            port.did(),
            vec![
                Did::Post(secs(2), "Coder is working (2s)".into()),
                Did::Edit(secs(40), "Coder: stopped after 40s".into()),
            ]
        );
        // A person's `/stop`: the turn's signal names them, as the pipeline's turn
        // drops on it.
        let port = Recorder::new(true);
        let slot = OutcomeSlot::default();
        boss_stops_at_40s(|stop| {
            shown(&port, timing(2, 1), stop, &slot, |feed| {
                work(feed, vec![], 600)
            })
        })
        .await;
        tokio::time::sleep(secs(5)).await;
        assert_eq!(
            port.did(),
            vec![
                Did::Post(secs(2), "Coder is working (2s)".into()),
                Did::Edit(secs(40), "Coder: stopped by Boss after 40s".into()),
            ]
        );
        let port = Recorder::new(true);
        let (out, _) = shown(
            &port,
            timing(2, 1),
            StopSignal::default(),
            &OutcomeSlot::default(),
            |feed| async move {
                tokio::time::sleep(secs(5)).await;
                feed.ended(Ending::Failed("the agent exited".into()));
                None::<&str>
            },
        )
        .await;
        assert_eq!(out, None);
        assert_eq!(
            port.did().last(),
            Some(&Did::Edit(
                secs(5),
                "Coder: failed after 5s: the agent exited".into()
            ))
        );
    }

    /// A rejected tool call, as the agent step leaves it in the slot.
    fn denied() -> crate::agent::acp::ToolRejection {
        crate::agent::acp::ToolRejection {
            action: "edit notes.txt".into(),
            kind: crate::agent::acp::ToolKind::Edit,
            why: crate::agent::acp::Rejection::Denied {
                by: Some("Alice".into()),
            },
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_that_is_up_says_how_the_turn_ended_once_and_a_short_turn_leaves_it_to_the_line(
    ) {
        use crate::turn::outcome::Ended;
        // Up, and answered with a tool denied: the final edit says both, the line
        // has nothing left to say, the final version carries the agent's words.
        let port = Recorder::new(true);
        let slot = OutcomeSlot::default();
        let first = status();
        let id = first.id;
        with_status(
            Some(port.clone() as Arc<dyn StatusPort>),
            timing(2, 1),
            first,
            StopSignal::default(),
            &slot,
            |_| {
                ends(
                    &slot,
                    5,
                    Outcome::new(Ended::Answered, vec![denied()]),
                    Some("the answer"),
                )
            },
            Option::is_some,
        )
        .await;
        let said = "Coder: done in 5s; denied by Alice: edit notes.txt";
        assert_eq!(port.did().last(), Some(&Did::Edit(secs(5), said.into())));
        assert!(slot.take().is_none(), "the status said it: no line");
        assert_eq!(
            *port.ends.lock(),
            vec![(
                id,
                said.to_string(),
                Some("Your request to edit notes.txt was denied by Alice.".into())
            )]
        );
        // Short: no status, the outcome stays for the line.
        let port = Recorder::new(true);
        let slot = OutcomeSlot::default();
        shown(&port, timing(8, 1), StopSignal::default(), &slot, |_| {
            ends(
                &slot,
                1,
                Outcome::new(Ended::NoAnswer, vec![denied()]),
                None,
            )
        })
        .await;
        assert!(slot.take().is_some(), "the line says it");
        assert!(port.did().is_empty() && port.ends.lock().is_empty());
        // Up on a platform that cannot edit: the line says it too.
        let port = Recorder::new(false);
        let slot = OutcomeSlot::default();
        shown(&port, timing(2, 1), StopSignal::default(), &slot, |_| {
            ends(&slot, 5, Outcome::new(Ended::NoAnswer, vec![]), None)
        })
        .await;
        assert!(slot.take().is_some(), "the line says it");
        assert!(port.ends.lock().is_empty());
        // Up, and stopped by a person: said once, by the status.
        let port = Recorder::new(true);
        let slot = OutcomeSlot::default();
        boss_stops_at_40s(|stop| {
            shown(&port, timing(2, 1), stop, &slot, {
                let slot = &slot;
                move |_| async move {
                    slot.set(Outcome::new(Ended::NoAnswer, vec![]));
                    tokio::time::sleep(secs(600)).await;
                    None::<&str>
                }
            })
        })
        .await;
        assert_eq!(
            slot.stopped("Boss".into()),
            None,
            "no line: the status says it"
        );
        tokio::time::sleep(secs(5)).await;
        let ends = port.ends.lock().clone();
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!(ends[0].1, "Coder: stopped by Boss after 40s");
        assert_eq!(
            ends[0].2.as_deref(),
            Some("Your last turn was stopped by Boss.")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_post_in_flight_when_the_turn_ends_is_finished_then_ended() {
        let port = Arc::new(Recorder {
            post_takes: secs(4),
            ..Arc::into_inner(Recorder::new(true)).unwrap()
        });
        let (_, took) = shown(
            &port,
            timing(2, 1),
            StopSignal::default(),
            &OutcomeSlot::default(),
            |feed| work(feed, vec![], 3),
        )
        .await;
        assert_eq!(took, secs(3));
        assert_eq!(
            port.did(),
            vec![
                Did::Post(secs(2), "Coder is working (2s)".into()),
                Did::Edit(secs(7), "Coder: done in 3s".into()),
            ],
            "the post finished (at 6 s), then the end at the pace (1 s later)"
        );
    }

    #[test]
    fn an_answer_after_a_minute_mentions_the_person_who_asked_once() {
        use crate::turn::brain::Reply;
        let asked = Envelope::message(
            ulid::Ulid::new(),
            0,
            "g",
            "Coder",
            Author::human("Alice"),
            "@Coder build it",
        );
        let reply = |t: &str| Reply {
            text: t.into(),
            tokens: 0,
        };
        let text = |r: Reply| r.text;
        assert_eq!(
            text(mention_asker(&asked, reply("built"), secs(61))),
            "@Alice built"
        );
        assert_eq!(
            text(mention_asker(&asked, reply("built"), secs(59))),
            "built"
        );
        assert_eq!(
            text(mention_asker(&asked, reply("@Alice built"), secs(90))),
            "@Alice built"
        );
        let mut by_bot = asked.clone();
        by_bot.author = Author::bot("Ada");
        assert_eq!(
            text(mention_asker(&by_bot, reply("built"), secs(90))),
            "built"
        );
    }

    #[test]
    fn times_read_as_people_say_them() {
        assert_eq!(elapsed(secs(8)), "8s");
        assert_eq!(elapsed(secs(70)), "1m 10s");
        assert_eq!(elapsed(secs(133)), "2m 13s");
        assert_eq!(elapsed(secs(3_720)), "1h 2m");
        assert_eq!(
            final_text("Coder", secs(133), &Ending::Done),
            "Coder: done in 2m 13s"
        );
    }
}
