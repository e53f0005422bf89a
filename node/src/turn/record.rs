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
    if action == "silent" && ROUTINE_SILENCE.contains(&reason) {
        // One per message the bot stays out of: counted in the metrics, logged only
        // at debug (an info line each cost ~2 % of a busy receiver's CPU).
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
