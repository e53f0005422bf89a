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
            | Event::Question { group, .. } => group,
        }
    }
    /// The SSE event name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Event::Message { .. } => "message",
            Event::Claim { .. } => "claim",
            Event::Decision { .. } => "decision",
            Event::Progress { .. } => "progress",
            Event::Question { .. } => "question",
        }
    }
}

/// A broadcast channel of [`Event`]s.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
}

impl EventBus {
    /// A bus that buffers up to `capacity` events per slow subscriber.
    pub(crate) fn new(capacity: usize) -> Self {
        EventBus {
            tx: broadcast::channel(capacity).0,
        }
    }
    /// Publishes; having no subscriber is fine.
    pub(crate) fn publish(&self, event: Event) {
        let _ = self.tx.send(event);
    }
    /// A new subscription starting now.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}
