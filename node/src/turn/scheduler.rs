//! `Scheduler`: relevance-scaled delays and claims, so the most relevant bot speaks
//! first and the others yield.
//!
//! A bot that will interject waits `min + (1 − relevance) × (max − min)` plus a little
//! jitter, and broadcasts a claim at once. While it waits it yields to a better claim
//! (higher relevance; ties go to the smaller name, so every node agrees) or to a bot
//! message that already answers the trigger.
//!
//! A yield to a better claim is not final: the yielding bot *stands by* until the
//! trigger is answered. If the better claimant withdraws instead (its reply call
//! failed, its re-judge declined, a hard rule stopped it, it shut down), the bots
//! that stood by re-enter: the best remaining claimant goes after a short grace
//! ([`grace_for`]), not after a whole new delay. On the wire a withdrawal is a claim
//! at relevance 0 ([`WITHDRAWN`]): no bot claims at 0 (claims are floored at
//! [`MIN_CLAIM`]), and a node that predates withdrawals reads it as a claim that
//! beats nobody, so versions can mix.
//!
//! Right before it posts an interjection a bot *commits* ([`ClaimBoard::commit`]):
//! under the board's lock it checks its standing one last time and, if clear, marks
//! itself as answering the trigger. A peer's claim admitted after that is answered
//! "already answered by me" ([`ClaimBoard::answering`], the `answered` field of the
//! bridge's answer), so the claimant, which waits for its claim's acknowledgements
//! before it posts (`turn.rs`), yields. A claim admitted before the commit is on the
//! board when the commit checks it. Either way no claim slips between the last check
//! and the post, however late it arrives.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use ulid::Ulid;

use crate::config::BotSettings;
pub(crate) use crate::wire::batch::ClaimReply;
use crate::wire::ids::{IdMap, IdSet};

/// How long the board remembers a trigger.
const TRIGGER_TTL: Duration = Duration::from_secs(900);

/// The relevance a withdrawal claim carries on the wire.
pub(crate) const WITHDRAWN: f64 = 0.0;

/// The smallest relevance a real claim carries (so it is never read as a withdrawal).
pub(crate) const MIN_CLAIM: f64 = 0.001;

/// How long a bot stands by behind a better claim, after its own deadline, before it
/// gives up for good (a claimant that vanished without withdrawing: killed, or cut
/// off from the mesh).
pub(crate) const STANDBY_MAX: Duration = Duration::from_secs(120);

/// The wait before interjecting at `relevance`, plus `jitter_ms` (drawn by the caller
/// in `0..=me.jitter_ms`, so the simulator can draw it from its seeded generator).
pub(crate) fn delay_for(me: &BotSettings, relevance: f64, jitter_ms: u64) -> Duration {
    let r = relevance.clamp(0.0, 1.0);
    let span = me.max_delay_ms.saturating_sub(me.min_delay_ms) as f64;
    let base = me.min_delay_ms as f64 + (1.0 - r) * span;
    Duration::from_millis(base.round() as u64 + jitter_ms.min(me.jitter_ms))
}

/// The short wait before a bot that stood by behind a withdrawn claim goes ahead:
/// a quarter of its relevance-scaled delay (without jitter), so that the remaining
/// claimants still go in order of relevance but nobody starts from scratch.
pub(crate) fn grace_for(me: &BotSettings, relevance: f64) -> Duration {
    let r = relevance.clamp(0.0, 1.0);
    let span = me.max_delay_ms.saturating_sub(me.min_delay_ms) as f64;
    Duration::from_millis(((me.min_delay_ms as f64 + (1.0 - r) * span) / 4.0).round() as u64)
}

/// Whether claim `a` beats claim `b`: higher relevance, then the smaller name.
pub(crate) fn beats(a: (&str, f64), b: (&str, f64)) -> bool {
    a.1 > b.1 || (a.1 == b.1 && a.0 < b.0)
}

/// What is known about one trigger message.
#[derive(Default)]
struct Trigger {
    /// bot → relevance.
    claims: HashMap<String, f64>,
    /// Bots that withdrew their claim (a claim of theirs arriving later is stale).
    withdrawn: HashSet<String>,
    /// This node's bot stands by behind a better claim: an answer to the trigger
    /// then means it passed on it (recorded at once, before that answer is judged).
    standing_by: bool,
    /// This node's bot re-entered after a withdrawal (for the decision log).
    resumed: bool,
    /// Bots that have posted a reply to it.
    answered_by: Vec<String>,
    /// The bot (this node's) that committed to answer it ([`ClaimBoard::commit`]): a
    /// peer's claim admitted from now on is told so.
    committed: Option<String>,
    /// This node's bot passed on the trigger (judge declined, yielded, re-judged silent).
    passed: bool,
    /// Claimants this node told it was still judging: it owes each a word (its claim,
    /// or a withdrawal sent to them alone when it declines).
    owes_word: HashSet<String>,
    /// Peers that said they were still judging the trigger when this node's claim
    /// reached them: this node waits for their word (claim, withdrawal or answer)
    /// before it commits.
    awaiting_word: HashSet<String>,
    /// Woken on every change.
    notify: Arc<Notify>,
    /// For eviction.
    seen_at: Option<Instant>,
}

impl Trigger {
    /// Reason to yield for `me` holding `relevance`: another bot's answer, else the
    /// best claim that beats it.
    fn yield_reason(&self, me: &str, relevance: f64) -> Option<Yield> {
        if let Some(bot) = self.answered_by.iter().find(|b| b.as_str() != me) {
            return Some(Yield::Answered { bot: bot.clone() });
        }
        self.claims
            .iter()
            .filter(|(b, _)| b.as_str() != me)
            .filter(|(b, r)| beats((b.as_str(), **r), (me, relevance)))
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(b, r)| Yield::BetterClaim {
                bot: b.clone(),
                relevance: *r,
            })
    }
}

/// Where a claimant stands on a trigger right now.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Nothing better claimed, nobody answered: it may go at its deadline.
    Clear,
    /// A better claim stands: wait behind it (it may still be withdrawn).
    Behind {
        /// The best claimant.
        bot: String,
        /// Its relevance.
        relevance: f64,
    },
    /// Someone else replied to the trigger: pass for good.
    Answered {
        /// Who.
        bot: String,
    },
}

/// Why a waiting bot gave up its turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Yield {
    /// Someone claimed the trigger with a better relevance.
    BetterClaim {
        /// The winner.
        bot: String,
        /// Its relevance.
        relevance: f64,
    },
    /// Someone already replied to the trigger.
    Answered {
        /// Who.
        bot: String,
    },
}

impl Yield {
    /// Stable reason code.
    pub fn reason(&self) -> &'static str {
        match self {
            Yield::BetterClaim { .. } => "better_claim",
            Yield::Answered { .. } => "already_answered",
        }
    }
}

/// Claims and replies per trigger, shared by the bridge (writers) and waiting turns.
#[derive(Default)]
pub struct ClaimBoard {
    triggers: Mutex<Triggers>,
    /// The messages this node applied its local rules to, most recent last: a peer's
    /// claim on one of them is answered from the board, on any other `judging`.
    /// Bounded, and apart from `triggers` so that the silent majority of messages
    /// costs no trigger entry.
    decided: Mutex<RecentIds>,
    /// Triggers whose judge call is out on this node: a claim on one is answered
    /// `judging`. Apart from `triggers` too, for the same reason.
    judging: Mutex<IdSet>,
    /// How long each colleague's turn may run once it has the turn, beyond a model's
    /// reply (a coding agent's `turn_timeout_secs`): standing by behind its claim
    /// lasts that much longer than [`STANDBY_MAX`], so a colleague whose agent works
    /// for minutes is not given up on, and if its agent dies the bots behind it are
    /// still there to answer.
    turn_limits: HashMap<String, Duration>,
}

impl ClaimBoard {
    /// An empty board that knows how long each colleague's turn may run
    /// ([`ClaimBoard::turn_limits`]; a colleague not named: a model's reply).
    pub(crate) fn with_turn_limits(turn_limits: HashMap<String, Duration>) -> ClaimBoard {
        ClaimBoard {
            turn_limits,
            ..ClaimBoard::default()
        }
    }
}

/// The triggers and when expired ones were last swept.
#[derive(Default)]
struct Triggers {
    map: IdMap<Trigger>,
    swept_at: Option<Instant>,
}

/// A bounded set of ids, oldest dropped first.
#[derive(Default)]
struct RecentIds {
    order: std::collections::VecDeque<Ulid>,
    ids: IdSet,
}

/// How many decided message ids the board remembers.
const DECIDED_CAPACITY: usize = 8192;

impl RecentIds {
    fn insert(&mut self, id: Ulid) {
        if self.ids.insert(id) {
            self.order.push_back(id);
            if self.order.len() > DECIDED_CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.ids.remove(&old);
                }
            }
        }
    }
}

impl ClaimBoard {
    fn with<R>(&self, trigger: Ulid, f: impl FnOnce(&mut Trigger) -> R) -> R {
        let mut triggers = self.triggers.lock();
        let now = Instant::now();
        // Expired triggers go at most once a second, not on every call (a sweep is a
        // pass over the whole map).
        if triggers.map.len() > 1024
            && triggers
                .swept_at
                .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
        {
            triggers.swept_at = Some(now);
            triggers.map.retain(|_, t| {
                t.seen_at
                    .is_some_and(|s| now.duration_since(s) < TRIGGER_TTL)
            });
        }
        let t = triggers.map.entry(trigger).or_default();
        t.seen_at.get_or_insert(now);
        f(t)
    }

    /// Triggers currently tracked (for metrics and soak checks).
    pub fn len(&self) -> usize {
        self.triggers.lock().map.len()
    }

    /// True when no trigger is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records `bot`'s claim on `trigger`; a claim at [`WITHDRAWN`] relevance (or
    /// below) withdraws its earlier claim.
    pub fn claim(&self, trigger: Ulid, bot: &str, relevance: f64) {
        if relevance <= WITHDRAWN {
            return self.withdraw(trigger, bot);
        }
        self.with(trigger, |t| {
            if t.withdrawn.contains(bot) {
                return;
            }
            t.claims.insert(bot.to_string(), relevance);
            t.awaiting_word.remove(bot);
            t.notify.notify_waiters();
        });
    }

    /// Records that `bot` withdrew its claim on `trigger` (and, when it is this node's
    /// bot, its commit to answer it): bots standing by behind it re-enter.
    pub fn withdraw(&self, trigger: Ulid, bot: &str) {
        self.with(trigger, |t| {
            if t.committed.as_deref() == Some(bot) {
                // Committed, then nothing to post (an ACP agent's turn that failed):
                // the peers' claims from now on are no longer told it is answered.
                t.committed = None;
            }
            t.claims.remove(bot);
            t.withdrawn.insert(bot.to_string());
            t.awaiting_word.remove(bot);
            t.notify.notify_waiters();
        });
    }

    /// Whether a bot other than `me` replied to `trigger`.
    pub fn answered_by_other(&self, trigger: Ulid, me: &str) -> bool {
        self.with(trigger, |t| t.answered_by.iter().any(|b| b != me))
    }

    /// Whether `bot` has a live claim on `trigger`.
    pub fn has_claim(&self, trigger: Ulid, bot: &str) -> bool {
        self.with(trigger, |t| t.claims.contains_key(bot))
    }

    /// The bots whose live claims on `trigger` beat `me`'s at `relevance`. In a round
    /// to everyone nobody yields, so these are the bots that answer before `me`.
    pub fn claims_ahead(&self, trigger: Ulid, me: &str, relevance: f64) -> Vec<String> {
        self.with(trigger, |t| {
            t.claims
                .iter()
                .filter(|(b, r)| b.as_str() != me && beats((b.as_str(), **r), (me, relevance)))
                .map(|(b, _)| b.clone())
                .collect()
        })
    }

    /// Whether this node's bot re-entered `trigger` after a better claim was withdrawn.
    pub fn resumed(&self, trigger: Ulid) -> bool {
        self.with(trigger, |t| t.resumed)
    }

    /// Marks whether this node's bot stands by behind a better claim on `trigger`.
    pub fn set_standing_by(&self, trigger: Ulid, on: bool) {
        self.with(trigger, |t| t.standing_by = on);
    }

    /// Records that this node's bot passed on `trigger`: replies to it are then not
    /// worth a judge call of their own (see `policy::decide`, `passed_on_thread`).
    pub fn pass(&self, trigger: Ulid) {
        self.with(trigger, |t| t.passed = true);
    }

    /// Whether this node's bot passed on `trigger`.
    pub fn passed(&self, trigger: Ulid) -> bool {
        self.triggers
            .lock()
            .map
            .get(&trigger)
            .is_some_and(|t| t.passed)
    }

    /// Records that `bot` replied to `trigger`.
    pub fn answered(&self, trigger: Ulid, bot: &str) {
        self.with(trigger, |t| {
            t.answered_by.push(bot.to_string());
            t.awaiting_word.remove(bot);
            if t.standing_by {
                t.passed = true;
            }
            t.notify.notify_waiters();
        });
    }

    /// The atomic last step before `me` posts an interjection on `trigger`: unless a
    /// better claim stands or someone else answered (then the reason to yield), marks
    /// this node's bot as answering, in one critical section with the check. From then
    /// on [`ClaimBoard::answering`] is true, so every peer claim admitted later is told
    /// the trigger is answered; every claim admitted earlier was seen by the check.
    pub fn commit(&self, trigger: Ulid, me: &str, relevance: f64) -> Result<(), Yield> {
        self.with(trigger, |t| {
            if let Some(y) = t.yield_reason(me, relevance) {
                return Err(y);
            }
            t.committed = Some(me.to_string());
            Ok(())
        })
    }

    /// Whether this node's bot `me` has committed to answer `trigger` or posted an
    /// answer to it: what the bridge tells a peer whose claim on it arrives.
    pub fn answering(&self, trigger: Ulid, me: &str) -> bool {
        self.triggers.lock().map.get(&trigger).is_some_and(|t| {
            t.committed.as_deref() == Some(me) || t.answered_by.iter().any(|b| b == me)
        })
    }

    /// Records that this node applied its local rules to `trigger`; `judging`: they
    /// sent it to the judge, whose call is now out (only then does the trigger get an
    /// entry on the board).
    pub fn decided(&self, trigger: Ulid, judging: bool) {
        self.decided.lock().insert(trigger);
        if judging {
            self.judging.lock().insert(trigger);
        }
    }

    /// Marks this node's judge call about `trigger` as in flight (`true`) or done.
    pub fn set_judging(&self, trigger: Ulid, on: bool) {
        let mut judging = self.judging.lock();
        if on {
            judging.insert(trigger);
        } else {
            judging.remove(&trigger);
        }
    }

    /// What the bridge answers a peer's claim on `trigger` (already on the board):
    /// `answered` when `me` committed to or posted an answer; `judging` when `me`'s
    /// judge is still out, in which case `me` now owes the peers its word.
    pub fn answer_claim(&self, trigger: Ulid, me: &str, claimant: &str) -> ClaimReply {
        self.with(trigger, |t| {
            let answered =
                t.committed.as_deref() == Some(me) || t.answered_by.iter().any(|b| b == me);
            // Until this node applied its rules to the trigger (it may still be on its
            // way here), a claim on it is answered `judging` too, and a word is owed.
            let decided = self.decided.lock().ids.contains(&trigger);
            let out = self.judging.lock().contains(&trigger);
            let judging = !answered && (out || !decided) && !t.claims.contains_key(me);
            if judging {
                t.owes_word.insert(claimant.to_string());
            }
            ClaimReply {
                answered: answered.then(|| me.to_string()),
                judging,
            }
        })
    }

    /// The claimants this node told it was judging `trigger` and has not given its
    /// word yet; taken once: the caller now gives it (a withdrawal, to them).
    pub fn take_owed_word(&self, trigger: Ulid) -> Vec<String> {
        // No entry, no claim ever asked: nothing owed (and no entry made for it).
        let mut triggers = self.triggers.lock();
        let Some(t) = triggers.map.get_mut(&trigger) else {
            return Vec::new();
        };
        let mut owed: Vec<String> = t.owes_word.drain().collect();
        owed.sort();
        owed
    }

    /// Waits (at most until `until`) for the word of every peer in `judging` that
    /// said it was still judging `trigger`: its claim, its withdrawal or its answer.
    /// Returns the peers still silent at the end.
    pub async fn await_words(
        &self,
        trigger: Ulid,
        judging: &[String],
        until: Instant,
    ) -> Vec<String> {
        let notify = self.with(trigger, |t| {
            for p in judging {
                let heard = t.claims.contains_key(p)
                    || t.withdrawn.contains(p)
                    || t.answered_by.iter().any(|b| b == p);
                if !heard {
                    t.awaiting_word.insert(p.clone());
                }
            }
            t.notify.clone()
        });
        loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let waiting: Vec<String> = self.with(trigger, |t| {
                let mut w: Vec<String> = t.awaiting_word.iter().cloned().collect();
                w.sort();
                w
            });
            if waiting.is_empty() || Instant::now() >= until {
                self.with(trigger, |t| t.awaiting_word.clear());
                return waiting;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = &mut notified => {}
            }
        }
    }

    /// Where `me`, claiming at `relevance`, stands on `trigger`.
    pub fn standing(&self, trigger: Ulid, me: &str, relevance: f64) -> Standing {
        match self.should_yield(trigger, me, relevance) {
            None => Standing::Clear,
            Some(Yield::Answered { bot }) => Standing::Answered { bot },
            Some(Yield::BetterClaim { bot, relevance }) => Standing::Behind { bot, relevance },
        }
    }

    /// Reason to yield now, if any, for `me` holding `relevance`.
    pub fn should_yield(&self, trigger: Ulid, me: &str, relevance: f64) -> Option<Yield> {
        self.with(trigger, |t| t.yield_reason(me, relevance))
    }

    /// Waits for `me`'s turn on `trigger` until `deadline`. Behind a better claim it
    /// stands by: until the trigger is answered (a final yield), until that claim is
    /// withdrawn (then it goes at `max(deadline, now + grace)`, or stands by behind the
    /// next better claim), or until `deadline + STANDBY_MAX` plus the claimant's turn
    /// limit, if it is an agent (a final yield). `None` means: go ahead.
    pub async fn wait(
        &self,
        trigger: Ulid,
        me: &str,
        relevance: f64,
        deadline: Instant,
        grace: Duration,
    ) -> Option<Yield> {
        let notify = self.with(trigger, |t| t.notify.clone());
        let mut deadline = deadline;
        let give_up = deadline + STANDBY_MAX;
        let mut behind: Option<Yield> = None;
        let out = loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let until = match self.standing(trigger, me, relevance) {
                Standing::Answered { bot } => {
                    // Stood behind the claim that answered: it was the better claim.
                    break Some(behind.take().unwrap_or(Yield::Answered { bot }));
                }
                Standing::Behind { bot, relevance } => {
                    if behind.is_none() {
                        self.set_standing_by(trigger, true);
                    }
                    let give_up = give_up + self.turn_limits.get(&bot).copied().unwrap_or_default();
                    behind = Some(Yield::BetterClaim { bot, relevance });
                    if Instant::now() >= give_up {
                        break behind.take();
                    }
                    give_up
                }
                Standing::Clear => {
                    if behind.take().is_some() {
                        // The better claim was withdrawn: re-enter after a short grace.
                        self.with(trigger, |t| {
                            t.standing_by = false;
                            t.resumed = true;
                        });
                        deadline = deadline.max(Instant::now() + grace);
                    }
                    if Instant::now() >= deadline {
                        break None;
                    }
                    deadline
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = &mut notified => {}
            }
        };
        self.set_standing_by(trigger, false);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bot(min: u64, max: u64, jitter: u64) -> BotSettings {
        BotSettings::from_toml(&format!(
            "min_delay_ms = {min}\nmax_delay_ms = {max}\njitter_ms = {jitter}"
        ))
        .unwrap()
    }

    #[test]
    fn delay_shrinks_with_relevance() {
        let b = bot(1000, 3000, 0);
        assert_eq!(delay_for(&b, 1.0, 0), Duration::from_millis(1000));
        assert_eq!(delay_for(&b, 0.0, 0), Duration::from_millis(3000));
        assert_eq!(delay_for(&b, 0.9, 0), Duration::from_millis(1200));
        assert_eq!(delay_for(&b, 0.6, 0), Duration::from_millis(1800));
        assert_eq!(
            delay_for(&b, 7.0, 0),
            Duration::from_millis(1000),
            "clamped"
        );
        let j = bot(1000, 3000, 150);
        assert_eq!(delay_for(&j, 0.5, 40), Duration::from_millis(2040));
        assert_eq!(
            delay_for(&j, 0.5, 900),
            Duration::from_millis(2150),
            "jitter is capped at jitter_ms"
        );
    }

    #[test]
    fn ranking_is_total_and_deterministic() {
        assert!(beats(("B", 0.9), ("A", 0.6)));
        assert!(!beats(("A", 0.6), ("B", 0.9)));
        assert!(beats(("A", 0.7), ("B", 0.7)));
        assert!(!beats(("B", 0.7), ("A", 0.7)));
    }

    #[test]
    fn grace_is_a_quarter_of_the_delay() {
        let b = bot(1000, 3000, 150);
        assert_eq!(grace_for(&b, 0.6), Duration::from_millis(450));
        assert_eq!(grace_for(&b, 0.9), Duration::from_millis(300));
    }

    const G: Duration = Duration::from_millis(450);

    #[tokio::test(start_paused = true)]
    async fn stands_by_behind_a_better_claim_and_yields_when_it_answers() {
        let board = Arc::new(ClaimBoard::default());
        let t = Ulid::new();
        board.claim(t, "A", 0.6);
        let b2 = board.clone();
        let start = Instant::now();
        let waiter = tokio::spawn(async move {
            b2.wait(t, "A", 0.6, Instant::now() + Duration::from_millis(1800), G)
                .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        board.claim(t, "B", 0.9);
        // Past A's own deadline it still stands by: B may yet withdraw.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiter.is_finished());
        assert!(!board.passed(t));
        board.answered(t, "B");
        assert!(board.passed(t), "standing by, so the answer means A passed");
        assert_eq!(
            waiter.await.unwrap(),
            Some(Yield::BetterClaim {
                bot: "B".into(),
                relevance: 0.9
            })
        );
        assert!(Instant::now() - start < Duration::from_secs(6));

        // The better bot is not disturbed by a worse claim and goes at its deadline.
        let t2 = Ulid::new();
        board.claim(t2, "A", 0.6);
        let start = Instant::now();
        assert_eq!(
            board
                .wait(t2, "B", 0.9, start + Duration::from_millis(1200), G)
                .await,
            None
        );
        assert_eq!(Instant::now() - start, Duration::from_millis(1200));

        // A reply to the trigger makes every waiter yield, even without a claim.
        let t3 = Ulid::new();
        let b3 = board.clone();
        let waiter = tokio::spawn(async move {
            b3.wait(t3, "A", 0.9, Instant::now() + Duration::from_secs(3), G)
                .await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        board.answered(t3, "C");
        assert_eq!(
            waiter.await.unwrap(),
            Some(Yield::Answered { bot: "C".into() })
        );
        // Own reply or own claim never makes a bot yield.
        board.answered(t3, "A");
        assert_eq!(board.should_yield(Ulid::new(), "A", 0.5), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_withdrawn_claim_lets_the_next_best_go_after_a_grace() {
        let board = Arc::new(ClaimBoard::default());
        let t = Ulid::new();
        board.claim(t, "A", 0.6);
        board.claim(t, "B", 0.9);
        board.claim(t, "C", 0.5);
        let start = Instant::now();
        let spawn = |me: &'static str, r: f64, ms: u64| {
            let b = board.clone();
            tokio::spawn(async move {
                let y = b.wait(t, me, r, start + Duration::from_millis(ms), G).await;
                (y, Instant::now() - start)
            })
        };
        let a = spawn("A", 0.6, 1800);
        let c = spawn("C", 0.5, 2000);
        tokio::time::sleep(Duration::from_secs(4)).await;
        // B's reply failed: it withdraws (on the wire, a claim at relevance 0).
        board.claim(t, "B", WITHDRAWN);
        assert!(!board.has_claim(t, "B"));
        let (y, at) = a.await.unwrap();
        assert_eq!(y, None, "A, the next best, goes");
        assert_eq!(at, Duration::from_millis(4000) + G, "after the grace only");
        // C stays behind A's claim, and yields once A answers.
        board.answered(t, "A");
        let (y, _) = c.await.unwrap();
        assert_eq!(
            y,
            Some(Yield::BetterClaim {
                bot: "A".into(),
                relevance: 0.6
            })
        );
        // A claim that arrives after its withdrawal (reordered) stays withdrawn.
        board.claim(t, "B", 0.9);
        assert!(!board.has_claim(t, "B"));

        // A claimant that vanishes without withdrawing is waited for STANDBY_MAX at most.
        let t2 = Ulid::new();
        board.claim(t2, "B", 0.9);
        let start = Instant::now();
        let y = board
            .wait(t2, "A", 0.6, start + Duration::from_millis(1800), G)
            .await;
        assert_eq!(
            y,
            Some(Yield::BetterClaim {
                bot: "B".into(),
                relevance: 0.9
            })
        );
        assert_eq!(
            Instant::now() - start,
            Duration::from_millis(1800) + STANDBY_MAX
        );
    }

    /// Behind a claimant whose agent may work for minutes (its `turn_timeout_secs`),
    /// a bot stands by that much longer than [`STANDBY_MAX`]: it is still there to
    /// answer when the agent dies after five minutes, and it re-enters then.
    #[tokio::test(start_paused = true)]
    async fn behind_an_agent_a_bot_stands_by_for_the_agents_turn_limit() {
        let limit = Duration::from_secs(600);
        let board = Arc::new(ClaimBoard::with_turn_limits(HashMap::from([(
            "Coder".to_string(),
            limit,
        )])));
        let t = Ulid::new();
        board.claim(t, "Coder", 0.9);
        let start = Instant::now();
        let b2 = board.clone();
        let waiting = tokio::spawn(async move {
            b2.wait(t, "Atlas", 0.6, start + Duration::from_millis(1800), G)
                .await
        });
        // The agent dies after five minutes, well past STANDBY_MAX: it withdraws.
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert!(!waiting.is_finished(), "still standing by after 300 s");
        board.claim(t, "Coder", WITHDRAWN);
        assert_eq!(waiting.await.unwrap(), None, "re-enters: goes ahead");
        // A claimant that vanishes is still given up on, after its limit too.
        let t2 = Ulid::new();
        board.claim(t2, "Coder", 0.9);
        let start = Instant::now();
        let y = board
            .wait(t2, "Atlas", 0.6, start + Duration::from_millis(1800), G)
            .await;
        assert!(matches!(y, Some(Yield::BetterClaim { .. })), "{y:?}");
        assert_eq!(
            Instant::now() - start,
            Duration::from_millis(1800) + STANDBY_MAX + limit
        );
    }

    #[test]
    fn claims_ahead_are_the_live_better_ones_ties_to_the_smaller_name() {
        let board = ClaimBoard::default();
        let t = Ulid::new();
        for (bot, r) in [("A", 0.8), ("B", 0.8), ("C", 0.8), ("D", 0.9), ("E", 0.5)] {
            board.claim(t, bot, r);
        }
        let ahead = |me: &str, r: f64| {
            let mut v = board.claims_ahead(t, me, r);
            v.sort();
            v
        };
        assert_eq!(ahead("C", 0.8), ["A", "B", "D"]);
        assert_eq!(ahead("A", 0.8), ["D"]);
        assert!(ahead("D", 0.9).is_empty());
        board.withdraw(t, "B");
        assert_eq!(
            ahead("C", 0.8),
            ["A", "D"],
            "a withdrawn claim is not ahead"
        );
        assert!(board.claims_ahead(Ulid::new(), "C", 0.8).is_empty());
    }

    #[test]
    fn commit_checks_and_marks_in_one_step() {
        let board = ClaimBoard::default();
        let t = Ulid::new();
        board.claim(t, "B", 0.9);
        assert_eq!(
            board.commit(t, "A", 0.6),
            Err(Yield::BetterClaim {
                bot: "B".into(),
                relevance: 0.9
            }),
            "behind a better claim: no commit"
        );
        assert!(!board.answering(t, "A"));
        board.withdraw(t, "B");
        board.claim(t, "C", 0.5);
        assert_eq!(
            board.commit(t, "A", 0.6),
            Ok(()),
            "a worse claim is no obstacle"
        );
        assert!(board.answering(t, "A"));

        let t2 = Ulid::new();
        board.answered(t2, "C");
        assert_eq!(
            board.commit(t2, "A", 0.9),
            Err(Yield::Answered { bot: "C".into() })
        );
        assert!(!board.answering(t2, "A"));
    }

    #[test]
    fn a_claim_arriving_after_the_commit_is_told_it_is_answered() {
        let board = ClaimBoard::default();
        let t = Ulid::new();
        assert!(!board.answering(t, "A"), "nothing known about the trigger");
        board.commit(t, "A", 0.6).unwrap();
        // B's better claim was late: it lands after A committed. The board takes it,
        // and the answer the bridge computes from the board says A is answering.
        board.claim(t, "B", 0.9);
        assert!(board.answering(t, "A"));
        assert!(!board.answering(t, "B"), "only the committed bot counts");
        // Posting (observed) keeps it answered; another trigger is not.
        board.answered(t, "A");
        assert!(board.answering(t, "A"));
        assert!(!board.answering(Ulid::new(), "A"));
        // A mention reply (no claim, no commit) also counts once posted.
        let t3 = Ulid::new();
        board.answered(t3, "A");
        assert!(board.answering(t3, "A"));
    }

    #[test]
    fn a_commit_withdrawn_with_nothing_posted_no_longer_answers_claims() {
        // An ACP agent's turn: committed before the agent works, then the agent failed.
        let board = ClaimBoard::default();
        let t = Ulid::new();
        board.claim(t, "A", 0.6);
        board.commit(t, "A", 0.6).unwrap();
        assert!(board.answering(t, "A"));
        board.withdraw(t, "A");
        assert!(!board.answering(t, "A"), "a later claim may go ahead");
        assert!(!board.has_claim(t, "A"));
    }
}
