//! Refusals on the public listeners in the log, rate-limited: the bridge's rejected
//! envelopes and batches, the Telegram and Feishu webhooks' refused callbacks, the
//! local API's refused requests (`app::gate`, per result). Anyone
//! who can reach a listener can send junk, so a warning per refusal would let a flood of
//! junk write a flood of log lines. Per source and reason, the first [`FIRST`] refusals
//! of each [`WINDOW`] are logged; the rest are only counted (the metrics still count
//! every one), and the next refusal of that source and reason after the window says in
//! one summary line how many were not logged. Sources and reasons are `'static` names
//! (a listener, a reason code), so the table cannot grow with what senders send.
//!
//! The same mechanism keeps the turn code's loop-breaker silences ([`DECISIONS`]: a
//! rate cap, the depth limit, the quiet switch, an exhausted budget, a stale
//! catch-up) from writing an info line for every message of a runaway exchange: the
//! first few of each window are logged at info, the rest at debug, and `/why` and
//! `botmesh_decisions_total` still have every one.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// How long one window of logged refusals lasts.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Refusals logged whole per source and reason in each [`WINDOW`].
pub const FIRST: u32 = 5;

/// The node's one refusal log, shared by every public listener.
pub static REFUSALS: LazyLock<RefusalLog> = LazyLock::new(RefusalLog::new);

/// The turn code's repeated silences (see the module docs): summaries at info.
pub static DECISIONS: LazyLock<RefusalLog> = LazyLock::new(RefusalLog::decisions);

/// What a log counts, which words and level its lines use.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Counted {
    /// Refused traffic: warnings.
    #[default]
    Refusals,
    /// Silent decisions: info.
    Decisions,
}

/// One source and reason's current window.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// When it began (its first refusal).
    started: Instant,
    /// Refusals logged in it so far.
    logged: u32,
    /// Refusals in it not logged.
    held_back: u64,
}

/// Which refusals to log, per source and reason, as the module says.
#[derive(Debug, Default)]
pub struct RefusalLog {
    /// Refusals or decisions: the summary lines' words and level.
    counted: Counted,
    /// The current window of each source and reason seen.
    windows: Mutex<HashMap<(&'static str, &'static str), Window>>,
}

impl RefusalLog {
    /// An empty log: every source and reason starts with its first [`FIRST`] logged.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty log of silent decisions (`source` is the deciding bot's part, `turn`).
    pub fn decisions() -> Self {
        RefusalLog {
            counted: Counted::Decisions,
            ..Self::default()
        }
    }

    /// One refusal from `source` (a listener: `bridge`, `telegram webhook`, …) for
    /// `reason`: true when the caller is to log it. When it opens a new window after
    /// one in which refusals were held back, the summary line for those is logged
    /// here first.
    pub fn admit(&self, source: &'static str, reason: &'static str) -> bool {
        let now = Instant::now();
        let mut windows = self.windows.lock();
        let window = windows.entry((source, reason)).or_insert(Window {
            started: now,
            logged: 0,
            held_back: 0,
        });
        if now.duration_since(window.started) >= WINDOW {
            if window.held_back > 0 {
                let seconds = now.duration_since(window.started).as_secs();
                let n = window.held_back;
                match self.counted {
                    Counted::Refusals => tracing::warn!(
                        source,
                        reason,
                        not_logged = n,
                        "{n} more {reason} refusals from {source} in the last {seconds} s (counted in the metrics, not logged)"
                    ),
                    Counted::Decisions => tracing::info!(
                        source,
                        reason,
                        not_logged = n,
                        "{n} more silent {reason} decisions in the last {seconds} s (counted in botmesh_decisions_total and kept for /why; logged at debug)"
                    ),
                }
            }
            *window = Window {
                started: now,
                logged: 0,
                held_back: 0,
            };
        }
        if window.logged < FIRST {
            window.logged += 1;
            if window.logged == FIRST {
                let secs = WINDOW.as_secs();
                match self.counted {
                    Counted::Refusals => tracing::warn!(
                        source,
                        reason,
                        "further {reason} refusals from {source} in the next {secs} s are counted, not logged, until one summary line"
                    ),
                    Counted::Decisions => tracing::info!(
                        source,
                        reason,
                        "further silent {reason} decisions in the next {secs} s are logged at debug only, until one summary line"
                    ),
                }
            }
            true
        } else {
            window.held_back += 1;
            false
        }
    }

    /// Refusals of `source` and `reason` held back in the current window (for tests).
    pub fn held_back(&self, source: &'static str, reason: &'static str) -> u64 {
        self.windows
            .lock()
            .get(&(source, reason))
            .map_or(0, |w| w.held_back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_flood_logs_the_first_few_then_one_summary_per_window() {
        let log = RefusalLog::new();
        let logged = (0..500)
            .filter(|_| log.admit("bridge", "bad_signature"))
            .count();
        assert_eq!(logged, FIRST as usize);
        assert_eq!(log.held_back("bridge", "bad_signature"), 500 - FIRST as u64);
        // Another reason and another source each have their own allowance.
        assert!(log.admit("bridge", "stale"));
        assert!(log.admit("telegram webhook", "bad_signature"));
        // Still inside the window: nothing more.
        tokio::time::advance(WINDOW - Duration::from_secs(1)).await;
        assert!(!log.admit("bridge", "bad_signature"));
        // A new window: the summary is said and the first few are logged again.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(log.admit("bridge", "bad_signature"));
        assert_eq!(log.held_back("bridge", "bad_signature"), 0);
        let logged = (0..100)
            .filter(|_| log.admit("bridge", "bad_signature"))
            .count();
        assert_eq!(logged, FIRST as usize - 1);
    }
}
