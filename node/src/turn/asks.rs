//! `Asks`: the state behind the group tools `ask` and `wait_for_message` (docs/agents.md,
//! "Working together") — the questions this bot's agent put to a colleague and waits on,
//! the answers those questions consumed, each group's turn in flight with the asks it
//! made, and the messages addressed to the bot not yet handed to its agent.
//!
//! Everything here goes through the group: an ask is a message everyone sees and its
//! answer is one too. What this state adds is only who waits for which message:
//! - [`Asks::offer`] sees every new message first; the colleague's answer to a pending
//!   question is handed to the tool call waiting on it, and is then *consumed*: it
//!   starts no turn of the asker, and the next prompt of its agent leaves it out
//!   ([`Asks::consumed`]), though it stays in the transcript.
//! - [`Asks::turn_started`] marks the group's turn in flight while it runs, so
//!   an ask continues it (its `reply_to` and depth) and is counted against
//!   `[mesh] max_asks_per_turn`.
//! - The inbox ([`Asks::addressed`], [`Asks::next_addressed`]) keeps, per group and
//!   bounded, the messages addressed to the bot (mentions, replies) that no prompt or
//!   `wait_for_message` handed out yet.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{oneshot, Notify};
use ulid::Ulid;

use crate::wire::envelope::{AuthorKind, Envelope, Kind};
use crate::wire::ids::IdSet;

/// Answers remembered as consumed (older ones are long out of any prompt's window).
const CONSUMED_KEPT: usize = 4_096;

/// Messages kept per group for `wait_for_message`; past it the oldest is dropped
/// (logged): an agent that never waits must not grow the node.
pub(crate) const INBOX_PER_GROUP: usize = 64;

/// A question this bot's agent asked a colleague and waits on.
struct Pending {
    /// The question's message id.
    question: Ulid,
    /// Its group.
    group: String,
    /// The colleague asked (its roster name).
    colleague: String,
    /// Where the answer goes (closed when the tool call gave up).
    answer: oneshot::Sender<Arc<Envelope>>,
}

/// The group's turn in flight, as the group tools see it.
#[derive(Debug, Clone, Copy)]
struct TurnInFlight {
    /// The message the turn answers (nil: asks made before any turn).
    trigger: Ulid,
    /// Asks made in this turn so far.
    asks: u32,
    /// A hosted agent's turn, held by a [`TurnMark`] until it ends; else an outside
    /// agent's, which lasts until `wait_for_message` hands out the next message.
    held: bool,
}

/// Why an ask may not be made now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AsksSpent {
    /// The bound it hit (`[mesh] max_asks_per_turn`).
    pub(crate) max: u32,
}

/// A group's turn in flight ([`Asks::turn_started`]); dropping it ends the turn.
pub(crate) struct TurnMark<'a> {
    /// Whose turns.
    asks: &'a Asks,
    /// The group.
    group: &'a str,
    /// The message the turn answers.
    trigger: Ulid,
}

impl Drop for TurnMark<'_> {
    fn drop(&mut self) {
        self.asks.turn_ended(self.group, self.trigger);
    }
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct Asks {
    /// Questions waiting for their answer.
    pending: Mutex<Vec<Pending>>,
    /// Answers handed to a tool call (oldest first, bounded by [`CONSUMED_KEPT`]) and
    /// the same ids as a set for the look-up.
    consumed: Mutex<(VecDeque<Ulid>, IdSet)>,
    /// Each group's turn in flight.
    turns: Mutex<HashMap<String, TurnInFlight>>,
    /// Per group, messages addressed to the bot not handed out yet, oldest first.
    inbox: Mutex<HashMap<String, VecDeque<Arc<Envelope>>>>,
    /// Woken when a message joins an inbox.
    arrived: Notify,
    /// `wait_for_message` calls waiting now.
    waiters: std::sync::atomic::AtomicUsize,
    /// When the last `wait_for_message` call ended.
    last_waited: Mutex<Option<tokio::time::Instant>>,
}

/// How long after its last `wait_for_message` an outside agent still counts as
/// attached (between two calls it is working on what it was handed).
pub(crate) const ATTACHED_FOR: Duration = Duration::from_secs(120);

/// Counts a `wait_for_message` call as waiting while it lives.
struct Waiter<'a>(&'a Asks);

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.0
            .waiters
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        *self.0.last_waited.lock() = Some(tokio::time::Instant::now());
    }
}

impl Asks {
    /// Marks `trigger` as the turn in flight in `group` (its ask count from zero) until
    /// the mark is dropped, however the turn ends (answered, failed, dropped by
    /// `/stop`). `None` when the group has a turn in flight already (the agent takes one
    /// at a time: this message waits for its next prompt).
    pub(crate) fn turn_started<'a>(
        &'a self,
        group: &'a str,
        trigger: Ulid,
    ) -> Option<TurnMark<'a>> {
        let mut turns = self.turns.lock();
        if turns.get(group).is_some_and(|t| t.held) {
            return None;
        }
        turns.insert(
            group.to_string(),
            TurnInFlight {
                trigger,
                asks: 0,
                held: true,
            },
        );
        Some(TurnMark {
            asks: self,
            group,
            trigger,
        })
    }

    /// Ends `group`'s turn for `trigger` (a later turn's mark stays).
    fn turn_ended(&self, group: &str, trigger: Ulid) {
        let mut turns = self.turns.lock();
        if turns
            .get(group)
            .is_some_and(|t| t.held && t.trigger == trigger)
        {
            turns.remove(group);
        }
    }

    /// The message `group`'s turn in flight answers, if one is.
    pub(crate) fn turn_trigger(&self, group: &str) -> Option<Ulid> {
        self.turns
            .lock()
            .get(group)
            .map(|t| t.trigger)
            .filter(|t| !t.is_nil())
    }

    /// Counts one ask in `group`'s turn: refused once `max` were made. An outside
    /// agent's turn begins with each message `wait_for_message` hands it (asks before
    /// the first count together).
    pub(crate) fn count_ask(&self, group: &str, max: u32) -> Result<(), AsksSpent> {
        let mut turns = self.turns.lock();
        let turn = turns.entry(group.to_string()).or_insert(TurnInFlight {
            trigger: Ulid::nil(),
            asks: 0,
            held: false,
        });
        if turn.asks >= max {
            return Err(AsksSpent { max });
        }
        turn.asks += 1;
        Ok(())
    }

    /// Waits for `colleague`'s answer to the question `question` in `group`: call
    /// before the question is posted, so no answer can come first.
    pub(crate) fn expect(
        &self,
        group: &str,
        question: Ulid,
        colleague: &str,
    ) -> oneshot::Receiver<Arc<Envelope>> {
        let (answer, rx) = oneshot::channel();
        let mut pending = self.pending.lock();
        pending.retain(|p| !p.answer.is_closed());
        pending.push(Pending {
            question,
            group: group.to_string(),
            colleague: colleague.to_string(),
            answer,
        });
        rx
    }

    /// A new message, before anything else looks at it: `true` when it answers a
    /// pending question (any message recorded after [`Asks::expect`] is after the
    /// question, which is posted only then) (handed to the waiting tool call and consumed, so it starts no
    /// turn). The answer is the colleague's first message after the question that
    /// replies to it or mentions the asker (`mentions_me`), else its next message that
    /// replies to nothing else.
    pub(crate) fn offer(&self, env: &Arc<Envelope>, mentions_me: bool) -> bool {
        if env.kind != Kind::Message || env.author.kind != AuthorKind::Bot {
            return false;
        }
        let mut pending = self.pending.lock();
        pending.retain(|p| !p.answer.is_closed());
        let found = pending.iter().position(|p| {
            p.group == env.group
                && p.colleague == env.author.name
                && (env.reply_to == Some(p.question) || mentions_me || env.reply_to.is_none())
        });
        let Some(i) = found else {
            return false;
        };
        let p = pending.swap_remove(i);
        drop(pending);
        if p.answer.send(env.clone()).is_err() {
            // The tool call gave up just now: the message is news after all.
            return false;
        }
        self.consume(env.id);
        true
    }

    /// Remembers `id` as handled by a tool — an answer or a waited message handed to
    /// the agent, or a message the agent posted mid-turn: its next prompt neither
    /// counts it as news nor as the end of a turn.
    pub(crate) fn consume(&self, id: Ulid) {
        let mut c = self.consumed.lock();
        if c.1.insert(id) {
            c.0.push_back(id);
            if c.0.len() > CONSUMED_KEPT {
                if let Some(old) = c.0.pop_front() {
                    c.1.remove(&old);
                }
            }
        }
    }

    /// Whether an ask of this bot waits on `colleague` in `group`.
    pub(crate) fn waiting_on(&self, group: &str, colleague: &str) -> bool {
        self.pending
            .lock()
            .iter()
            .any(|p| p.group == group && p.colleague == colleague && !p.answer.is_closed())
    }

    /// Whether a tool already handed `id` to the agent.
    pub(crate) fn consumed(&self, id: &Ulid) -> bool {
        self.consumed.lock().1.contains(id)
    }

    /// Keeps `env`, addressed to the bot, for `wait_for_message` (the oldest dropped,
    /// logged, past [`INBOX_PER_GROUP`]).
    pub(crate) fn addressed(&self, env: Arc<Envelope>) {
        let dropped = {
            let mut inbox = self.inbox.lock();
            let queue = inbox.entry(env.group.clone()).or_default();
            queue.push_back(env);
            if queue.len() > INBOX_PER_GROUP {
                queue.pop_front()
            } else {
                None
            }
        };
        if let Some(old) = dropped {
            // Asked only when one is dropped, and outside the inbox's lock.
            if self.attached() {
                // An agent reads this queue and fell behind: it missed a message.
                tracing::warn!(group = %old.group, id = %old.id, kept = INBOX_PER_GROUP, "the outside agent did not take this message in time: dropped from the wait_for_message queue (it stays in the transcript)");
            } else {
                // No agent reads it (a plain LLM bot, or none attached yet): dropping
                // the oldest is the queue working as meant, not news.
                tracing::debug!(group = %old.group, id = %old.id, kept = INBOX_PER_GROUP, "no agent attached: oldest message dropped from the wait_for_message queue (it stays in the transcript)");
            }
        }
        self.arrived.notify_waiters();
    }

    /// Drops from `group`'s inbox what a prompt handed out: every message up to
    /// `through` (ids are ordered by time).
    pub(crate) fn handed_out(&self, group: &str, through: Ulid) {
        if let Some(queue) = self.inbox.lock().get_mut(group) {
            queue.retain(|m| m.id > through);
        }
    }

    /// Whether an outside agent is attached: a `wait_for_message` call waits now or
    /// ended less than [`ATTACHED_FOR`] ago.
    pub(crate) fn attached(&self) -> bool {
        self.waiters.load(std::sync::atomic::Ordering::Relaxed) > 0
            || self
                .last_waited
                .lock()
                .is_some_and(|t| t.elapsed() < ATTACHED_FOR)
    }

    /// Messages waiting in every group's inbox.
    pub(crate) fn waiting_total(&self) -> usize {
        self.inbox.lock().values().map(VecDeque::len).sum()
    }

    /// Messages waiting in `group`'s inbox.
    #[cfg(test)]
    pub(crate) fn waiting(&self, group: &str) -> usize {
        self.inbox.lock().get(group).map_or(0, VecDeque::len)
    }

    /// The oldest message addressed to the bot in `group` not handed out yet, waiting
    /// for one at most `timeout`; consumed once handed out. `None`: none came.
    pub(crate) async fn next_addressed(
        &self,
        group: &str,
        timeout: Duration,
    ) -> Option<Arc<Envelope>> {
        self.waiters
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _waiter = Waiter(self);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let next = self
                .inbox
                .lock()
                .get_mut(group)
                .and_then(VecDeque::pop_front);
            if let Some(env) = next {
                self.consume(env.id);
                // An outside agent's next turn: its asks count from zero (a hosted
                // agent's turn in flight stays as it is).
                let mut turns = self.turns.lock();
                if !turns.get(group).is_some_and(|t| t.held) {
                    turns.insert(
                        group.to_string(),
                        TurnInFlight {
                            trigger: env.id,
                            asks: 0,
                            held: false,
                        },
                    );
                }
                return Some(env);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::envelope::Author;

    fn msg(group: &str, from: &str, kind: AuthorKind, reply_to: Option<Ulid>) -> Arc<Envelope> {
        let mut e = Envelope::message(
            Ulid::new(),
            0,
            group,
            from,
            Author {
                name: from.into(),
                kind,
            },
            "text",
        );
        e.reply_to = reply_to;
        Arc::new(e)
    }

    #[tokio::test]
    async fn the_answer_that_replies_to_the_question_is_handed_over_and_consumed() {
        let asks = Asks::default();
        let question = Ulid::new();
        let rx = asks.expect("g", question, "Reviewer");
        // Another bot, a person, the colleague answering someone else: not the answer.
        assert!(!asks.offer(&msg("g", "Other", AuthorKind::Bot, Some(question)), true));
        assert!(!asks.offer(&msg("g", "Reviewer", AuthorKind::Human, None), true));
        assert!(!asks.offer(
            &msg("g", "Reviewer", AuthorKind::Bot, Some(Ulid::new())),
            false
        ));
        assert!(!asks.offer(&msg("h", "Reviewer", AuthorKind::Bot, Some(question)), true));
        let answer = msg("g", "Reviewer", AuthorKind::Bot, Some(question));
        assert!(asks.offer(&answer, false));
        assert_eq!(rx.await.unwrap().id, answer.id);
        assert!(asks.consumed(&answer.id));
        // Once answered, the colleague's next message is news again.
        assert!(!asks.offer(&msg("g", "Reviewer", AuthorKind::Bot, None), true));
    }

    #[tokio::test]
    async fn a_mention_of_the_asker_or_a_plain_next_message_answers_too() {
        let asks = Asks::default();
        let q = Ulid::new();
        let _rx = asks.expect("g", q, "Reviewer");
        assert!(asks.offer(
            &msg("g", "Reviewer", AuthorKind::Bot, Some(Ulid::new())),
            true
        ));
        let q2 = Ulid::new();
        let _rx2 = asks.expect("g", q2, "Reviewer");
        assert!(asks.offer(&msg("g", "Reviewer", AuthorKind::Bot, None), false));
    }

    #[tokio::test]
    async fn an_answer_after_the_tool_gave_up_is_news() {
        let asks = Asks::default();
        let q = Ulid::new();
        drop(asks.expect("g", q, "Reviewer"));
        let answer = msg("g", "Reviewer", AuthorKind::Bot, Some(q));
        assert!(!asks.offer(&answer, true));
        assert!(!asks.consumed(&answer.id));
    }

    #[test]
    fn asks_are_bounded_per_turn_and_a_new_turn_starts_from_zero() {
        let asks = Asks::default();
        let t1 = Ulid::new();
        let mark = asks.turn_started("g", t1).expect("no turn in flight");
        assert_eq!(asks.turn_trigger("g"), Some(t1));
        // A second message while the turn runs waits for the next prompt: no mark.
        assert!(asks.turn_started("g", Ulid::new()).is_none());
        assert!(asks.count_ask("g", 2).is_ok());
        assert!(asks.count_ask("g", 2).is_ok());
        assert_eq!(asks.count_ask("g", 2), Err(AsksSpent { max: 2 }));
        // Another group's turn is its own.
        let _h = asks.turn_started("h", Ulid::new());
        assert!(asks.count_ask("h", 2).is_ok());
        drop(mark);
        assert_eq!(asks.turn_trigger("g"), None);
        let t2 = Ulid::new();
        let _mark = asks.turn_started("g", t2).expect("the last turn ended");
        assert!(asks.count_ask("g", 2).is_ok());
        assert_eq!(asks.turn_trigger("g"), Some(t2));
        assert_eq!(asks.count_ask("x", 0), Err(AsksSpent { max: 0 }));
    }

    #[tokio::test]
    async fn an_outside_agents_turn_begins_with_each_message_it_is_handed() {
        let asks = Asks::default();
        assert!(asks.count_ask("g", 1).is_ok());
        assert!(asks.count_ask("g", 1).is_err());
        assert_eq!(asks.turn_trigger("g"), None);
        let m = msg("g", "alice", AuthorKind::Human, None);
        asks.addressed(m.clone());
        assert!(asks.next_addressed("g", Duration::ZERO).await.is_some());
        assert_eq!(asks.turn_trigger("g"), Some(m.id));
        assert!(asks.count_ask("g", 1).is_ok());
        // A hosted turn replaces it and is not replaced by a handed-out message.
        let t = Ulid::new();
        let _mark = asks
            .turn_started("g", t)
            .expect("an outside turn is not held");
        asks.addressed(msg("g", "bob", AuthorKind::Human, None));
        assert!(asks.next_addressed("g", Duration::ZERO).await.is_some());
        assert_eq!(asks.turn_trigger("g"), Some(t));
    }

    #[tokio::test(start_paused = true)]
    async fn wait_for_message_hands_out_the_oldest_once_or_times_out() {
        let asks = Arc::new(Asks::default());
        assert!(asks
            .next_addressed("g", Duration::from_secs(5))
            .await
            .is_none());
        let (a, b) = (
            msg("g", "alice", AuthorKind::Human, None),
            msg("g", "bob", AuthorKind::Human, None),
        );
        asks.addressed(a.clone());
        asks.addressed(b.clone());
        assert_eq!(
            asks.next_addressed("g", Duration::ZERO).await.unwrap().id,
            a.id
        );
        assert!(asks.consumed(&a.id));
        assert_eq!(asks.waiting("g"), 1);
        asks.handed_out("g", b.id);
        assert_eq!(asks.waiting("g"), 0);
        // One that arrives while it waits.
        let waiter = {
            let asks = asks.clone();
            tokio::spawn(async move { asks.next_addressed("g", Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let c = msg("g", "carol", AuthorKind::Human, None);
        asks.addressed(c.clone());
        assert_eq!(waiter.await.unwrap().unwrap().id, c.id);
    }

    #[tokio::test(start_paused = true)]
    async fn an_agent_is_attached_while_it_waits_and_a_while_after() {
        let asks = Arc::new(Asks::default());
        assert!(!asks.attached());
        let waiter = {
            let asks = asks.clone();
            tokio::spawn(async move { asks.next_addressed("g", Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(asks.attached());
        assert!(waiter.await.unwrap().is_none());
        tokio::time::sleep(ATTACHED_FOR - Duration::from_secs(1)).await;
        assert!(asks.attached());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!asks.attached());
    }

    #[test]
    fn a_dropped_message_is_a_warning_only_when_an_agent_reads_the_queue() {
        let asks = Asks::default();
        // The lines about dropped messages while `INBOX_PER_GROUP + 1` arrive.
        let fill = |asks: &Asks| {
            let lines = crate::telemetry::test_log::logged(|| {
                for _ in 0..=INBOX_PER_GROUP {
                    asks.addressed(msg("g", "alice", AuthorKind::Human, None));
                }
            });
            let drops: Vec<_> = lines
                .iter()
                .filter(|(_, m)| m.contains("dropped"))
                .cloned()
                .collect();
            (drops, lines)
        };
        // A plain LLM bot: nobody reads the queue, so dropping its oldest is routine.
        let (drops, lines) = fill(&asks);
        assert_eq!(drops.len(), 1, "{lines:?}");
        assert_eq!(drops[0].0, tracing::Level::DEBUG, "{lines:?}");
        // An outside agent waited a moment ago: a message it never took is a warning.
        *asks.last_waited.lock() = Some(tokio::time::Instant::now());
        assert!(asks.attached());
        let (drops, lines) = fill(&asks);
        assert_eq!(
            drops.len(),
            INBOX_PER_GROUP + 1,
            "every message pushed one out"
        );
        assert!(
            drops.iter().all(|(l, _)| *l == tracing::Level::WARN),
            "{lines:?}"
        );
    }

    #[test]
    fn the_inbox_is_bounded() {
        let asks = Asks::default();
        let first = msg("g", "alice", AuthorKind::Human, None);
        asks.addressed(first.clone());
        for _ in 0..INBOX_PER_GROUP {
            asks.addressed(msg("g", "alice", AuthorKind::Human, None));
        }
        assert_eq!(asks.waiting("g"), INBOX_PER_GROUP);
        let held = asks.inbox.lock();
        assert!(held["g"].iter().all(|m| m.id != first.id));
    }
}
