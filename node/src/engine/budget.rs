//! The daily LLM budget: `[llm] daily_calls` / `daily_tokens`, counted per node (each
//! bot its own) in memory, starting again at local midnight (`budget_utc_offset`)
//! by the clock of [`crate::turn::Ports`] (virtual in the simulator and in tests).
//!
//! Every judge and reply call is counted with its tokens. Past a limit the bot stops
//! judging ([`crate::turn::pipeline::triage`] records `silent/budget`) and answers mentions
//! only, or nothing with `over_budget = "silent"`, until the next day. A restart
//! starts the count again (it is not persisted).

use parking_lot::Mutex;
use serde::Serialize;

use crate::config::{BotSettings, LlmSettings, OverBudget};

/// One day in milliseconds.
const DAY_MS: i64 = 86_400_000;

/// The limits of `[llm]`, as the turn code reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Calls per day, if limited.
    pub(crate) calls: Option<u64>,
    /// Tokens per day, if limited.
    pub(crate) tokens: Option<u64>,
    /// What the bot does past them.
    pub(crate) over: OverBudget,
    /// Minutes east of UTC of the budget's day.
    pub(crate) offset_min: i64,
}

impl Limits {
    /// The limits `[llm]` sets for bot `me`: its own `daily_calls` / `daily_tokens`
    /// where it has them, else `[llm]`'s (none without `[llm]`).
    pub(crate) fn of(llm: Option<&LlmSettings>, me: &BotSettings) -> Limits {
        match llm {
            None => Limits::default(),
            Some(l) => Limits {
                calls: me.daily_calls.or(l.daily_calls),
                tokens: me.daily_tokens.or(l.daily_tokens),
                over: l.over_budget,
                offset_min: crate::config::parse_utc_offset(&l.budget_utc_offset)
                    .expect("validated"),
            },
        }
    }

    /// The local day number of `now_ms`.
    fn day(&self, now_ms: u64) -> i64 {
        (now_ms as i64 + self.offset_min * 60_000).div_euclid(DAY_MS)
    }
}

/// What was spent on the current day.
#[derive(Debug, Default)]
struct Spent {
    /// The local day the counts are for.
    day: i64,
    /// LLM calls made.
    calls: u64,
    /// Tokens they cost.
    tokens: u64,
    /// The day whose exhaustion was already logged and counted.
    reported: Option<i64>,
}

/// Today's use against the limits, for `/healthz` and the page.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BudgetStatus {
    /// Calls made today.
    pub(crate) calls: u64,
    /// The daily call limit, if any.
    pub(crate) daily_calls: Option<u64>,
    /// Tokens spent today.
    pub(crate) tokens: u64,
    /// The daily token limit, if any.
    pub(crate) daily_tokens: Option<u64>,
    /// `calls` or `tokens` when a limit is reached, else none.
    pub(crate) exhausted: Option<&'static str>,
    /// What the bot does while exhausted (`mentions`, `silent`).
    pub(crate) over_budget: OverBudget,
}

/// The day's counts of one bot's LLM use.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    /// Today's counts.
    spent: Mutex<Spent>,
}

/// A limit reached: which one, and whether this is the first time today (log it,
/// count it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exhausted {
    /// `calls` or `tokens`.
    pub(crate) limit: &'static str,
    /// First report of the day.
    pub(crate) first: bool,
}

impl Budget {
    /// Moves the counts to `now_ms`'s day (a new day starts from zero).
    fn roll(s: &mut Spent, limits: &Limits, now_ms: u64) {
        let day = limits.day(now_ms);
        if day != s.day {
            *s = Spent {
                day,
                ..Spent::default()
            };
        }
    }

    /// The limit reached today, if any (`first` once per day).
    pub(crate) fn exhausted(&self, limits: &Limits, now_ms: u64) -> Option<Exhausted> {
        let mut s = self.spent.lock();
        Self::roll(&mut s, limits, now_ms);
        let limit = Self::reached(&s, limits)?;
        let first = s.reported != Some(s.day);
        s.reported = Some(s.day);
        Some(Exhausted { limit, first })
    }

    fn reached(s: &Spent, limits: &Limits) -> Option<&'static str> {
        if limits.calls.is_some_and(|c| s.calls >= c) {
            Some("calls")
        } else if limits.tokens.is_some_and(|t| s.tokens >= t) {
            Some("tokens")
        } else {
            None
        }
    }

    /// Counts one LLM call and its tokens against the current day (the day the last
    /// check rolled to: a call that crosses midnight counts for the day it began).
    pub(crate) fn spend(&self, tokens: u64) {
        let mut s = self.spent.lock();
        s.calls += 1;
        s.tokens += tokens;
    }

    /// Counts tokens of a call already counted by [`Budget::spend`] (a drafting
    /// call's, known only once its reply is done).
    pub(crate) fn spend_tokens(&self, tokens: u64) {
        self.spent.lock().tokens += tokens;
    }

    /// Today's use against `limits`.
    pub(crate) fn status(&self, limits: &Limits, now_ms: u64) -> BudgetStatus {
        let mut s = self.spent.lock();
        Self::roll(&mut s, limits, now_ms);
        BudgetStatus {
            calls: s.calls,
            daily_calls: limits.calls,
            tokens: s.tokens,
            daily_tokens: limits.tokens,
            exhausted: Self::reached(&s, limits),
            over_budget: limits.over,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    #[test]
    fn n_calls_exhaust_the_day_and_local_midnight_starts_a_new_one() {
        let limits = Limits {
            calls: Some(3),
            tokens: None,
            over: OverBudget::Mentions,
            offset_min: 8 * 60,
        };
        // 2026-01-01 10:00 UTC = 18:00 at +08:00.
        let t0: u64 = 1_767_261_600_000;
        let b = Budget::default();
        for _ in 0..3 {
            assert_eq!(b.exhausted(&limits, t0), None);
            b.spend(10);
        }
        assert_eq!(
            b.exhausted(&limits, t0),
            Some(Exhausted {
                limit: "calls",
                first: true
            })
        );
        assert_eq!(
            b.exhausted(&limits, t0 + HOUR).map(|e| e.first),
            Some(false),
            "reported once a day"
        );
        // 15:59 UTC is 23:59 local: still the same day.
        assert!(b.exhausted(&limits, t0 + 6 * HOUR - 60_000).is_some());
        // 16:00 UTC is local midnight: a new day.
        assert_eq!(b.exhausted(&limits, t0 + 6 * HOUR), None);
        assert_eq!(b.status(&limits, t0 + 6 * HOUR).calls, 0);
    }

    #[test]
    fn a_bots_own_limits_replace_the_mesh_wide_ones() {
        let settings = crate::config::Settings::from_toml(
            "[mesh]\nsecret_env = \"S\"\n[llm]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\ndaily_calls = 100\ndaily_tokens = 5000\n\
             [[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:7001\"\napi = \"127.0.0.1:7101\"\ndaily_calls = 7\n\
             [[bots]]\nname = \"B\"\nbridge = \"127.0.0.1:7002\"\napi = \"127.0.0.1:7102\"\n",
            std::path::Path::new("peers.toml"),
        );
        let settings = settings.expect("valid");
        let llm = settings.llm.as_ref();
        let a = Limits::of(llm, &settings.bots[0]);
        assert_eq!((a.calls, a.tokens), (Some(7), Some(5000)));
        let b = Limits::of(llm, &settings.bots[1]);
        assert_eq!((b.calls, b.tokens), (Some(100), Some(5000)));
        assert_eq!(Limits::of(None, &settings.bots[0]).calls, None);
    }

    #[test]
    fn tokens_count_prompt_and_completion_against_their_own_limit() {
        let limits = Limits {
            calls: None,
            tokens: Some(100),
            ..Limits::default()
        };
        let b = Budget::default();
        b.spend(60);
        assert_eq!(b.exhausted(&limits, 0), None);
        b.spend(40);
        assert_eq!(b.exhausted(&limits, 0).map(|e| e.limit), Some("tokens"));
        let raised = Limits {
            tokens: Some(1_000),
            ..limits
        };
        assert_eq!(
            b.exhausted(&raised, 0),
            None,
            "a raised budget applies at once"
        );
    }
}
