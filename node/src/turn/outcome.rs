//! How an agent's turn ended, said once in the chat and once to the agent.
//!
//! [`Outcome`] is the one account of a turn's end: how it ended ([`Ended`]: answered,
//! stopped by a person, finished without an answer, failed) and which tool calls were
//! rejected and why. It has two sayings:
//!
//! - [`Outcome::line`], the short line the chat shows ("stopped by Alice", "denied
//!   by Alice: edit notes.txt", "couldn't fetch https://…: not allowed here",
//!   "finished without an answer", "failed: the agent crashed"); `None` for a turn
//!   that answered with nothing rejected, whose answer says enough. A turn whose
//!   status message is up says it there instead, once: its final edit ("Coder:
//!   stopped by Alice after 40s", "Coder: done in 2m; denied by Alice: edit
//!   notes.txt", `turn::status`), which takes the outcome from the slot.
//! - [`Outcome::for_agent`], what the agent is told at the start of its next prompt
//!   ("Your last turn was stopped by Alice.", "Your request to fetch https://… was
//!   rejected: not allowed here.").
//!
//! [`announce`] is the one place the line is posted: a reply to the turn's trigger, at
//! the depth limit (no bot answers it), held by the loop brake as every bot message
//! is (`bot_messages_per_minute`: then neither the chat nor the agent is told), carrying the agent's words in
//! [`Envelope::turn_end`] — so the end of the last turn is in the transcript and
//! survives a restart, and the agent's next prompt starts after that turn
//! (`engine::acp::acp_prompt`). A status that said the end carries the same words
//! on its recorded final version instead. [`OutcomeSlot`] carries the outcome from
//! the agent step up to where the turn ends (`turn::pipeline::act`), and whoever
//! says it takes it.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::agent::acp::{Rejection, ToolRejection};
use crate::turn::ports::Ports;
use crate::wire::envelope::{Envelope, Why};

pub(crate) use crate::engine::context::Ended;

/// How an agent's turn ended, and the tool calls it was not let run: see the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// How it ended.
    pub(crate) ended: Ended,
    /// The tool calls rejected in it, in order.
    pub(crate) rejected: Vec<ToolRejection>,
}

impl Outcome {
    /// A turn that ended as `ended` with `rejected` tool calls.
    pub(crate) fn new(ended: Ended, rejected: Vec<ToolRejection>) -> Outcome {
        Outcome { ended, rejected }
    }

    /// A stable snake_case label for logs.
    pub(crate) fn label(&self) -> &'static str {
        match (&self.ended, self.rejected.is_empty()) {
            (Ended::Stopped { .. }, _) => "stopped",
            (Ended::Failed { .. }, _) => "failed",
            (_, false) => "tool_rejected",
            (Ended::Answered, true) => "answered",
            (Ended::NoAnswer, true) => "no_answer",
        }
    }

    /// The line the chat shows (see the module); `None`: the answer says enough.
    pub(crate) fn line(&self) -> Option<String> {
        self.said(&CHAT_WORDS)
    }

    /// What the agent is told first in its next prompt (see the module); `None`: it
    /// answered with nothing rejected, and needs no word.
    pub(crate) fn for_agent(&self) -> Option<String> {
        self.said(&Wording {
            stopped: |by| format!("Your last turn was stopped by {by}."),
            denied: |action, by| format!("Your request to {action} was denied by {by}."),
            rejected: |action, why| format!("Your request to {action} was rejected: {why}."),
            no_answer: "Your last turn ended without an answer in the chat.",
            failed: |why| format!("Your last turn failed: {why}."),
            joined: " ",
        })
    }

    /// The rejected tool calls in the chat's words ("denied by Alice: edit
    /// notes.txt; couldn't fetch https://…: not allowed here"), for a status whose
    /// final edit says the rest; `None` for none, or for a stopped turn (the stop is
    /// all that is said of it).
    pub(crate) fn rejections(&self) -> Option<String> {
        if matches!(self.ended, Ended::Stopped { .. }) || self.rejected.is_empty() {
            return None;
        }
        Some(self.rejected_parts(&CHAT_WORDS).join(CHAT_WORDS.joined))
    }

    /// Each rejected call in `w`'s words.
    fn rejected_parts(&self, w: &Wording) -> Vec<String> {
        self.rejected
            .iter()
            .map(|r| match &r.why {
                Rejection::Denied { by: Some(by) } => (w.denied)(&r.action, by),
                why => (w.rejected)(&r.action, reason(why)),
            })
            .collect()
    }

    /// The outcome in `w`'s words: a stop alone; else each rejected call, then a
    /// failure (or, when nothing else is said, a turn without an answer).
    fn said(&self, w: &Wording) -> Option<String> {
        if let Ended::Stopped { by } = &self.ended {
            return Some((w.stopped)(by));
        }
        let mut parts = self.rejected_parts(w);
        match &self.ended {
            Ended::NoAnswer if parts.is_empty() => parts.push(w.no_answer.into()),
            Ended::Failed { why } => parts.push((w.failed)(why)),
            _ => {}
        }
        (!parts.is_empty()).then(|| parts.join(w.joined))
    }
}

/// How the chat is told of an [`Outcome`].
const CHAT_WORDS: Wording = Wording {
    stopped: |by| format!("stopped by {by}"),
    denied: |action, by| format!("denied by {by}: {action}"),
    rejected: |action, why| format!("couldn't {action}: {why}"),
    no_answer: "finished without an answer",
    failed: |why| format!("failed: {why}"),
    joined: "; ",
};

/// How an [`Outcome`] is put into words: for the chat, or for the agent.
struct Wording {
    /// Stopped by this person.
    stopped: fn(&str) -> String,
    /// This action denied by this person.
    denied: fn(&str, &str) -> String,
    /// This action rejected for this reason.
    rejected: fn(&str, &str) -> String,
    /// Ended with nothing to post and nothing rejected.
    no_answer: &'static str,
    /// Failed for this reason.
    failed: fn(&str) -> String,
    /// Between two parts.
    joined: &'static str,
}

/// Why a tool call was rejected, in the chat's words.
fn reason(why: &Rejection) -> &'static str {
    match why {
        Rejection::NotAllowed => "not allowed here",
        Rejection::NoOneToAsk => "no one here may allow it",
        Rejection::Denied { .. } => "rejected",
        Rejection::Unanswered => "no one answered in time",
    }
}

/// A rejected call as `/why` lists it: `fetch https://…: not allowed here`.
pub(crate) fn rejection_detail(r: &ToolRejection) -> String {
    match &r.why {
        Rejection::Denied { by: Some(by) } => format!("{}: denied by {by}", r.action),
        why => format!("{}: {}", r.action, reason(why)),
    }
}

/// Where an agent step leaves its turn's outcome for the end of the turn: set when
/// the agent is handed the turn (so a `/stop` from then on is said), replaced when the
/// turn ends, cleared when nothing is to be said (the turn waits for the next prompt,
/// or the node stops).
#[derive(Default)]
pub(crate) struct OutcomeSlot(Mutex<Option<Outcome>>);

impl OutcomeSlot {
    /// The turn now ends (or, until replaced, would end) as `outcome`.
    pub(crate) fn set(&self, outcome: Outcome) {
        *self.0.lock() = Some(outcome);
    }

    /// Nothing is to be said of this turn.
    pub(crate) fn clear(&self) {
        *self.0.lock() = None;
    }

    /// The turn was stopped by `by`: `None` when the agent never had it (nothing to
    /// say), else its outcome, now stopped.
    pub(crate) fn stopped(&self, by: String) -> Option<Outcome> {
        let mut slot = self.0.lock();
        let outcome = slot.as_mut()?;
        outcome.ended = Ended::Stopped { by };
        Some(outcome.clone())
    }

    /// The outcome to say, once.
    pub(crate) fn take(&self) -> Option<Outcome> {
        self.0.lock().take()
    }
}

/// An engine leaves how its turn ended here (`engine::context::TurnOutcome`).
impl crate::engine::context::TurnOutcome for OutcomeSlot {
    fn set(&self, ended: Ended, rejected: Vec<ToolRejection>) {
        OutcomeSlot::set(self, Outcome::new(ended, rejected));
    }

    fn clear(&self) {
        OutcomeSlot::clear(self);
    }
}

/// Says how the turn on `trigger` ended: posts [`Outcome::line`], when there is one,
/// as the bot (see the module). The one place a turn's end reaches the chat.
pub(crate) async fn announce<P: Ports>(p: Arc<P>, trigger: &Envelope, outcome: Outcome) {
    let brain = p.brain();
    let me = brain.me().name.clone();
    let label = outcome.label();
    let Some(line) = outcome.line() else {
        return;
    };
    // A line is a bot message: the loop brake holds it like any other.
    let mesh = p.mesh();
    let recent = crate::turn::context::bots_since_human(&*p, &trigger.group, p.now_millis());
    if recent >= mesh.bot_messages_per_minute as usize {
        tracing::info!(bot = %me, trigger = %trigger.id, outcome = label, %line, recent_bot_messages = recent, limit = mesh.bot_messages_per_minute, "the loop brake is on in this group (bot_messages_per_minute): how the agent's turn ended is not said");
        return;
    }
    let mut env = Envelope::answer(p.new_id(), p.now_millis(), &me, trigger, line, Why::Posted);
    // A hard rule, so no bot of any version judges or answers it.
    env.depth = env.depth.max(mesh.max_depth);
    env.why = None;
    env.turn_end = outcome.for_agent();
    let (id, text) = (env.id, env.text.clone());
    match p.publish(env).await {
        Ok(()) => {
            tracing::info!(bot = %me, %id, trigger = %trigger.id, outcome = label, line = %text, "said how the agent's turn ended")
        }
        Err(e) => {
            tracing::error!(bot = %me, trigger = %trigger.id, outcome = label, error = %e, "the line saying how the agent's turn ended could not be recorded; not sent")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::acp::{AcpError, ToolKind};
    use crate::engine::acp::failure;

    fn rejected(action: &str, why: Rejection) -> ToolRejection {
        ToolRejection {
            action: action.into(),
            kind: ToolKind::Fetch,
            why,
        }
    }

    fn said(o: &Outcome) -> (Option<String>, Option<String>) {
        (o.line(), o.for_agent())
    }

    #[test]
    fn each_end_has_its_line_and_its_word_to_the_agent() {
        let stopped = Outcome::new(
            Ended::Stopped { by: "Alice".into() },
            vec![rejected("fetch https://x", Rejection::NotAllowed)],
        );
        assert_eq!(
            said(&stopped),
            (
                Some("stopped by Alice".into()),
                Some("Your last turn was stopped by Alice.".into())
            )
        );
        assert_eq!(stopped.label(), "stopped");
        let silent = Outcome::new(Ended::NoAnswer, vec![]);
        assert_eq!(
            said(&silent),
            (
                Some("finished without an answer".into()),
                Some("Your last turn ended without an answer in the chat.".into())
            )
        );
        let answered = Outcome::new(Ended::Answered, vec![]);
        assert_eq!(said(&answered), (None, None));
        assert_eq!(answered.label(), "answered");
        let failed = Outcome::new(
            Ended::Failed {
                why: failure(&AcpError::Died {
                    reason: "eof".into(),
                    status: None,
                }),
            },
            vec![],
        );
        assert_eq!(
            said(&failed),
            (
                Some("failed: the agent crashed".into()),
                Some("Your last turn failed: the agent crashed.".into())
            )
        );
    }

    #[test]
    fn rejected_tools_are_named_with_why_whether_or_not_it_answered() {
        let auto = Outcome::new(
            Ended::NoAnswer,
            vec![rejected("fetch https://example.com", Rejection::NotAllowed)],
        );
        assert_eq!(
            said(&auto),
            (
                Some("couldn't fetch https://example.com: not allowed here".into()),
                Some(
                    "Your request to fetch https://example.com was rejected: not allowed here."
                        .into()
                )
            )
        );
        assert_eq!(auto.label(), "tool_rejected");
        let denied = Outcome::new(
            Ended::Answered,
            vec![
                rejected(
                    "edit notes.txt",
                    Rejection::Denied {
                        by: Some("Alice".into()),
                    },
                ),
                rejected("run `make`", Rejection::Unanswered),
            ],
        );
        assert_eq!(
            said(&denied),
            (
                Some(
                    "denied by Alice: edit notes.txt; couldn't run `make`: no one answered in time"
                        .into()
                ),
                Some(
                    "Your request to edit notes.txt was denied by Alice. Your request to run `make` was rejected: no one answered in time."
                        .into()
                )
            )
        );
        let unput = rejected("use x", Rejection::Denied { by: None });
        assert_eq!(rejection_detail(&unput), "use x: rejected");
        let failed = Outcome::new(
            Ended::Failed {
                why: failure(&AcpError::TimedOut(std::time::Duration::from_secs(90))),
            },
            vec![rejected("read a", Rejection::NoOneToAsk)],
        );
        assert_eq!(
            failed.line().unwrap(),
            "couldn't read a: no one here may allow it; failed: took longer than 90 s"
        );
    }

    #[test]
    fn a_stop_is_said_only_once_the_agent_had_the_turn() {
        let slot = OutcomeSlot::default();
        assert_eq!(slot.stopped("Alice".into()), None);
        slot.set(Outcome::new(Ended::NoAnswer, vec![]));
        let stopped = slot.stopped("Alice".into()).unwrap();
        assert_eq!(stopped.line().as_deref(), Some("stopped by Alice"));
        assert!(slot.take().is_some() && slot.take().is_none());
    }
}
