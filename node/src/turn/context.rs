//! The group's transcript as a turn reads it: the context before a message (people's
//! commands left out, [`context_before`]) and the bots' run since the last person
//! ([`bots_since_human`], within the rate window).

use std::sync::Arc;

use ulid::Ulid;

use crate::store::turn_queries::RateCount;
use crate::turn::control::without_commands;
use crate::turn::ports::Ports;
use crate::wire::envelope::Envelope;

/// The window of the per-group bot-message cap.
pub(crate) const RATE_WINDOW_MS: u64 = 60_000;

/// Context for a judge or reply: up to `k` messages before `msg` in its group,
/// people's commands and the answers to them left out (they never reach an LLM).
pub(crate) fn context_before<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    k: usize,
) -> Vec<Arc<Envelope>> {
    let recent = without_commands(p.recent(&msg.group, k + 64), &p.brain().tuning());
    let end = recent
        .iter()
        .position(|e| e.id == msg.id)
        .unwrap_or(recent.len());
    let start = end.saturating_sub(k);
    recent[start..end].to_vec()
}

/// Bot messages since the last human one in `group`, within the rate window.
pub(crate) fn bots_since_human<P: Ports + ?Sized>(p: &P, group: &str, now: u64) -> usize {
    let count = RateCount {
        limit: 64,
        now_ms: now,
        window_ms: RATE_WINDOW_MS,
        trigger: &Ulid::nil(),
        ahead: &[],
    };
    p.rate_count(group, &count).0
}
