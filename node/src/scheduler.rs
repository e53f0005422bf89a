//! `Scheduler`: relevance-scaled delays and claims, so the most relevant bot speaks
//! first and the others yield.
//!
//! A bot that will interject waits `min + (1 − relevance) × (max − min)` plus a little
//! jitter, and broadcasts a claim at once. While it waits it yields to a better claim
//! (higher relevance; ties go to the smaller name, so every node agrees) or to a bot
//! message that already answers the trigger.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;
use ulid::Ulid;

use crate::config::BotSettings;

/// How long the board remembers a trigger.
const TRIGGER_TTL: Duration = Duration::from_secs(900);

/// The wait before interjecting at `relevance`.
pub fn delay_for(me: &BotSettings, relevance: f64) -> Duration {
    let r = relevance.clamp(0.0, 1.0);
    let span = me.max_delay_ms.saturating_sub(me.min_delay_ms) as f64;
    let base = me.min_delay_ms as f64 + (1.0 - r) * span;
    let jitter = if me.jitter_ms > 0 {
        rand::thread_rng().gen_range(0..=me.jitter_ms)
    } else {
        0
    };
    Duration::from_millis(base.round() as u64 + jitter)
}

/// Whether claim `a` beats claim `b`: higher relevance, then the smaller name.
pub fn beats(a: (&str, f64), b: (&str, f64)) -> bool {
    a.1 > b.1 || (a.1 == b.1 && a.0 < b.0)
}

/// What is known about one trigger message.
#[derive(Default)]
struct Trigger {
    /// bot → relevance.
    claims: HashMap<String, f64>,
    /// Bots that have posted a reply to it.
    answered_by: Vec<String>,
    /// This node's bot passed on the trigger (judge declined, yielded, re-judged silent).
    passed: bool,
    /// Woken on every change.
    notify: Arc<Notify>,
    /// For eviction.
    seen_at: Option<Instant>,
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
    triggers: Mutex<HashMap<Ulid, Trigger>>,
}

impl ClaimBoard {
    fn with<R>(&self, trigger: Ulid, f: impl FnOnce(&mut Trigger) -> R) -> R {
        let mut map = self.triggers.lock().expect("claim board lock");
        let now = Instant::now();
        if map.len() > 1024 {
            map.retain(|_, t| {
                t.seen_at
                    .is_some_and(|s| now.duration_since(s) < TRIGGER_TTL)
            });
        }
        let t = map.entry(trigger).or_default();
        t.seen_at.get_or_insert(now);
        f(t)
    }

    /// Triggers currently tracked (for metrics and soak checks).
    pub fn len(&self) -> usize {
        self.triggers.lock().expect("claim board lock").len()
    }

    /// True when no trigger is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records `bot`'s claim on `trigger`.
    pub fn claim(&self, trigger: Ulid, bot: &str, relevance: f64) {
        self.with(trigger, |t| {
            t.claims.insert(bot.to_string(), relevance);
            t.notify.notify_waiters();
        });
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
            .expect("claim board lock")
            .get(&trigger)
            .is_some_and(|t| t.passed)
    }

    /// Records that `bot` replied to `trigger`.
    pub fn answered(&self, trigger: Ulid, bot: &str) {
        self.with(trigger, |t| {
            t.answered_by.push(bot.to_string());
            t.notify.notify_waiters();
        });
    }

    /// Reason to yield now, if any, for `me` holding `relevance`.
    pub fn should_yield(&self, trigger: Ulid, me: &str, relevance: f64) -> Option<Yield> {
        self.with(trigger, |t| {
            if let Some(bot) = t.answered_by.iter().find(|b| b.as_str() != me) {
                return Some(Yield::Answered { bot: bot.clone() });
            }
            t.claims
                .iter()
                .filter(|(b, _)| b.as_str() != me)
                .filter(|(b, r)| beats((b.as_str(), **r), (me, relevance)))
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(b, r)| Yield::BetterClaim {
                    bot: b.clone(),
                    relevance: *r,
                })
        })
    }

    /// Waits until `deadline`, returning early with a reason to yield.
    pub async fn wait(
        &self,
        trigger: Ulid,
        me: &str,
        relevance: f64,
        deadline: Instant,
    ) -> Option<Yield> {
        let notify = self.with(trigger, |t| t.notify.clone());
        loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(y) = self.should_yield(trigger, me, relevance) {
                return Some(y);
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return self.should_yield(trigger, me, relevance),
                _ = &mut notified => {}
            }
        }
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
        assert_eq!(delay_for(&b, 1.0), Duration::from_millis(1000));
        assert_eq!(delay_for(&b, 0.0), Duration::from_millis(3000));
        assert_eq!(delay_for(&b, 0.9), Duration::from_millis(1200));
        assert_eq!(delay_for(&b, 0.6), Duration::from_millis(1800));
        assert_eq!(delay_for(&b, 7.0), Duration::from_millis(1000), "clamped");
        let j = bot(1000, 3000, 150);
        for _ in 0..100 {
            let d = delay_for(&j, 0.5).as_millis();
            assert!((2000..=2150).contains(&d));
        }
    }

    #[test]
    fn ranking_is_total_and_deterministic() {
        assert!(beats(("B", 0.9), ("A", 0.6)));
        assert!(!beats(("A", 0.6), ("B", 0.9)));
        assert!(beats(("A", 0.7), ("B", 0.7)));
        assert!(!beats(("B", 0.7), ("A", 0.7)));
    }

    #[tokio::test(start_paused = true)]
    async fn yields_to_better_claim_and_to_answers() {
        let board = Arc::new(ClaimBoard::default());
        let t = Ulid::new();
        board.claim(t, "A", 0.6);
        let b2 = board.clone();
        let waiter = tokio::spawn(async move {
            b2.wait(t, "A", 0.6, Instant::now() + Duration::from_millis(1800))
                .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        board.claim(t, "B", 0.9);
        let y = waiter.await.unwrap();
        assert_eq!(
            y,
            Some(Yield::BetterClaim {
                bot: "B".into(),
                relevance: 0.9
            })
        );

        // The better bot is not disturbed by a worse claim and goes at its deadline.
        let t2 = Ulid::new();
        board.claim(t2, "A", 0.6);
        let start = Instant::now();
        assert_eq!(
            board
                .wait(t2, "B", 0.9, start + Duration::from_millis(1200))
                .await,
            None
        );
        assert_eq!(Instant::now() - start, Duration::from_millis(1200));

        // A reply to the trigger makes every waiter yield, even without a claim.
        let t3 = Ulid::new();
        let b3 = board.clone();
        let waiter = tokio::spawn(async move {
            b3.wait(t3, "A", 0.9, Instant::now() + Duration::from_secs(3))
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
}
