//! A turn's decision about a message, recorded the one way: the board learns when the
//! bot passed for good, `botmesh_decisions_total{action,reason}` counts it, the trail
//! `/why` reads keeps it, the log and the watchers (the page, SSE) see it.

use crate::telemetry::events::Event;
use crate::turn::ports::Ports;
use crate::wire::envelope::Envelope;

/// Silent decisions of the cheap local filters, for messages that were never this
/// bot's to answer: logged at debug, counted as every decision is.
const ROUTINE_SILENCE: &[&str] = &[
    "not_mentioned",
    "addressed_to_other",
    "acknowledgement",
    "ignores_bots",
];

/// Silences that hit every message of a runaway exchange or a backlog (a loop at the
/// rate cap or the depth limit, the quiet switch, a spent budget, a catch-up): the
/// first few of each minute are logged at info, the rest at debug
/// ([`crate::telemetry::refusals::DECISIONS`]), so a flood writes no flood of lines.
const REPEATED_SILENCE: &[&str] = &["rate_cap", "max_depth", "quiet", "budget", "stale"];

/// Whether a decision means this bot passed on the trigger for good.
pub(crate) fn passes(action: &str, reason: &str) -> bool {
    matches!(action, "yield" | "yield_writing")
        || matches!(reason, "judge_declined" | "rejudged_silent")
}

/// Records a decision about `msg`: the board learns when the bot passed for good,
/// `botmesh_decisions_total{action,reason}` counts it, the log and the watchers see it.
pub(crate) fn record<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    action: &'static str,
    reason: &'static str,
    detail: &str,
) {
    let brain = p.brain();
    if passes(action, reason) {
        brain.board.pass(msg.id);
    }
    brain.metrics.decision(action, reason);
    brain.trail.note(msg.id, action, reason, detail);
    let quiet_line = action == "silent"
        && (ROUTINE_SILENCE.contains(&reason)
            || (REPEATED_SILENCE.contains(&reason)
                && !crate::telemetry::refusals::DECISIONS.admit("turn", reason)));
    if quiet_line {
        // One per message the bot stays out of: counted in the metrics, logged only
        // at debug (an info line each cost ~2 % of a busy receiver's CPU, ~9 % in a
        // flood at the rate cap).
        tracing::debug!(bot = %brain.me().name, trigger = %msg.id, from = %msg.author.name, depth = msg.depth, action, reason, detail, "decision");
    } else {
        tracing::info!(bot = %brain.me().name, trigger = %msg.id, from = %msg.author.name, depth = msg.depth, action, reason, detail, "decision");
    }
    if p.watched() {
        p.event(Event::Decision {
            group: msg.group.clone(),
            trigger: msg.id.to_string(),
            action: action.into(),
            reason: reason.into(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BotSettings;
    use crate::engine::budget::Limits;
    use crate::telemetry::refusals::{DECISIONS, FIRST};
    use crate::turn::test_ports::{count, Clocked};

    #[tokio::test(start_paused = true)]
    async fn a_flood_at_the_rate_cap_is_counted_and_kept_whole_but_logged_in_a_few_lines() {
        let me = BotSettings::from_toml("name = \"A\"").unwrap();
        let p = Clocked::alone(&me, Limits::default(), "");
        let held_before = DECISIONS.held_back("turn", "rate_cap");
        let msgs: Vec<Envelope> = (0..300).map(|_| p.question("again")).collect();
        for m in &msgs {
            record(&p, m, "silent", "rate_cap", "");
        }
        // Every decision counted and on the trail /why reads.
        assert_eq!(count(&p, "silent", "rate_cap"), 300);
        assert!(msgs.iter().all(|m| p
            .brain
            .trail
            .steps(m.id)
            .iter()
            .any(|s| s.reason == "rate_cap")));
        // At most FIRST of them at info this window (other tests share the log, so at
        // least 300 − FIRST of these went to debug).
        let held = DECISIONS.held_back("turn", "rate_cap") - held_before;
        assert!(held >= 300 - u64::from(FIRST), "held back {held}");
        // A routine silence never touches the budget; a judged one is always info.
        assert!(!REPEATED_SILENCE.contains(&"not_mentioned"));
        assert!(!REPEATED_SILENCE.contains(&"judge_declined"));
    }
}
