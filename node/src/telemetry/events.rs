//! `EventBus`: what the page and `GET /v1/events` watch live.
//!
//! Every message appended to a transcript, every claim and every decision the node
//! makes is published here; subscribers that fall behind are told how much they missed.

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::broadcast;

use crate::wire::envelope::Envelope;

/// One thing worth showing to a watcher.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A chat message was recorded in a transcript.
    Message {
        /// The message.
        envelope: Arc<Envelope>,
    },
    /// A bot announced it intends to answer a trigger.
    Claim {
        /// The claim envelope.
        envelope: Arc<Envelope>,
    },
    /// This node decided what to do about a message.
    Decision {
        /// The group.
        group: String,
        /// The message decided upon.
        trigger: String,
        /// `reply`, `judge`, `silent`, `yield`, …
        action: String,
        /// Why, in a short phrase.
        reason: String,
    },
    /// The bot's ACP agent is working on a turn: a tool call started or changed
    /// ("working: cargo test"), for the page's live line under the trigger.
    Progress {
        /// The group.
        group: String,
        /// The message the turn answers.
        trigger: String,
        /// The bot whose agent works.
        bot: String,
        /// What it is doing: the tool call's title and status.
        text: String,
    },
    /// A bot's status message (a recorded [`crate::wire::envelope::Kind::Status`])
    /// was edited in place: the page replaces its text, as the platform shows it.
    Status {
        /// The group.
        group: String,
        /// The status message's envelope id.
        id: String,
        /// The bot whose status it is.
        bot: String,
        /// Its text now.
        text: String,
    },
    /// The bot's agent asked the chat a permission question (answered with `/allow`
    /// or `/deny`) during its turn on `trigger`: an A2A task waits for input meanwhile.
    Question {
        /// The group.
        group: String,
        /// The message the turn answers.
        trigger: String,
        /// The bot whose agent asks.
        bot: String,
        /// The question as posted.
        text: String,
    },
}

impl Event {
    /// The group the event belongs to.
    pub(crate) fn group(&self) -> &str {
        match self {
            Event::Message { envelope } | Event::Claim { envelope } => &envelope.group,
            Event::Decision { group, .. }
            | Event::Progress { group, .. }
            | Event::Status { group, .. } => group,
            Event::Question { group, .. } => group,
        }
    }
    /// The SSE event name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Event::Message { .. } => "message",
            Event::Claim { .. } => "claim",
            Event::Decision { .. } => "decision",
            Event::Progress { .. } => "progress",
            Event::Status { .. } => "status",
            Event::Question { .. } => "question",
        }
    }
}

/// A broadcast channel of [`Event`]s, which also keeps the latest progress line of
/// each recent turn ([`ProgressLines`]), so a page loaded (or reloaded) while an agent
/// works, or after, shows it with the transcript.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
    /// The latest progress line of each recent turn.
    progress: Arc<ProgressLines>,
}

impl EventBus {
    /// A bus that buffers up to `capacity` events per slow subscriber.
    pub(crate) fn new(capacity: usize) -> Self {
        EventBus {
            tx: broadcast::channel(capacity).0,
            progress: Arc::default(),
        }
    }
    /// Publishes; having no subscriber is fine.
    pub(crate) fn publish(&self, event: Event) {
        if let Event::Progress {
            group,
            trigger,
            bot,
            text,
        } = &event
        {
            self.progress.keep(ProgressLine {
                group: group.clone(),
                trigger: trigger.clone(),
                bot: bot.clone(),
                text: text.clone(),
            });
        }
        let _ = self.tx.send(event);
    }
    /// The latest progress line of each recent turn in `group`, oldest first.
    pub(crate) fn progress(&self, group: &str) -> Vec<ProgressLine> {
        self.progress.of(group)
    }
    /// Whether anyone watches now (the page, an SSE client, a waiting tool call): an
    /// event nobody would receive need not be built. A watcher that subscribes
    /// after this said no misses only what happened before it subscribed.
    pub(crate) fn watched(&self) -> bool {
        self.tx.receiver_count() > 0
    }
    /// A new subscription starting now.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}

/// How many turns' progress lines a node keeps (the newest replace the oldest).
const KEPT_PROGRESS: usize = 256;

/// The latest progress line of one turn, as the page shows it under its trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ProgressLine {
    /// The group.
    pub(crate) group: String,
    /// The message the turn answers.
    pub(crate) trigger: String,
    /// The bot whose agent works.
    pub(crate) bot: String,
    /// What it is (or was last) doing.
    pub(crate) text: String,
}

/// The latest progress line of the [`KEPT_PROGRESS`] most recent turns: what
/// `GET /v1/transcript` returns beside the messages.
#[derive(Default)]
pub(crate) struct ProgressLines {
    /// Oldest first; one entry per (group, trigger, bot).
    lines: parking_lot::Mutex<std::collections::VecDeque<ProgressLine>>,
}

impl ProgressLines {
    /// Keeps `line` as its turn's latest.
    fn keep(&self, line: ProgressLine) {
        let mut lines = self.lines.lock();
        lines
            .retain(|l| !(l.group == line.group && l.trigger == line.trigger && l.bot == line.bot));
        lines.push_back(line);
        while lines.len() > KEPT_PROGRESS {
            lines.pop_front();
        }
    }

    /// The lines of `group`, oldest first.
    fn of(&self, group: &str) -> Vec<ProgressLine> {
        self.lines
            .lock()
            .iter()
            .filter(|l| l.group == group)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(group: &str, trigger: &str, text: &str) -> Event {
        Event::Progress {
            group: group.into(),
            trigger: trigger.into(),
            bot: "Coder".into(),
            text: text.into(),
        }
    }

    #[test]
    fn the_latest_progress_of_each_recent_turn_is_kept_bounded() {
        let bus = EventBus::new(4);
        bus.publish(progress("demo", "t1", "working: cargo test"));
        bus.publish(progress("ops", "t9", "writing…"));
        bus.publish(progress("demo", "t1", "done: cargo test"));
        let kept = bus.progress("demo");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].text, "done: cargo test");
        for i in 0..KEPT_PROGRESS + 10 {
            bus.publish(progress("demo", &format!("n{i}"), "writing…"));
        }
        let kept = bus.progress("demo");
        assert_eq!(kept.len(), KEPT_PROGRESS);
        assert_eq!(
            kept.last().unwrap().trigger,
            format!("n{}", KEPT_PROGRESS + 9)
        );
        assert!(bus.progress("ops").is_empty(), "the oldest went first");
    }
}
