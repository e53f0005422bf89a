//! The one inbound path: a message an adapter read from its platform becomes an
//! envelope here, the same way for every platform.
//!
//! The adapter parses its platform's payload into a [`PlatformMessage`] — the
//! group, the platform's id, the time, the text with mentions made readable, and who
//! sent it ([`Sender`]) — and [`Inbound::receive`] does the rest:
//!
//! - the text is cut to [`MAX_TEXT_BYTES`] at a character boundary; an empty one is
//!   not recorded;
//! - the envelope id is [`platform_message_id`] of the platform's id and time, so
//!   every bot that reads the same message names the same trigger in its claims;
//! - a person's message is recorded as a human envelope (depth 0, its own `root`,
//!   the person's platform ids for `[mesh] operators`);
//! - this bot's own message is dropped; a mesh colleague's platform copy waits up to
//!   [`Inbound::grace`] for the bridge copy, which carries depth and reply_to (told
//!   by the transcript, not polled: [`crate::ingress::ingest::Sink::await_platform_msg`]),
//!   and only if none comes is recorded as context nobody answers (depth =
//!   max_depth, no root) — either order ends with one entry; any other bot's
//!   message is context at once;
//! - what became of the message is logged and counted in
//!   `botmesh_platform_events_total{platform,result}` ([`Received`]).

use std::time::Duration;

use crate::ingress::ingest::Arrival;
use crate::platform::AdapterContext;
use crate::store::transcript::{Appended, TranscriptError};
use crate::turn::mention::PlatformMention;
use crate::wire::envelope::{platform_message_id, Author, Envelope, MAX_TEXT_BYTES};

/// Who sent a platform message, as the adapter read it.
#[derive(Debug, Clone)]
pub(crate) enum Sender {
    /// A person.
    Person {
        /// The name to record (already marked when it reads as a bot's:
        /// [`crate::platform::person_name`]).
        name: String,
        /// The person's platform ids, space-separated, for `[mesh] operators`.
        ids: Option<String>,
    },
    /// A bot (or a webhook, an app) as the platform shows it.
    Bot {
        /// The mesh bot it is, when the adapter knows its platform id.
        colleague: Option<String>,
        /// What to record it as when it is no colleague (`bot:Name`, `app:ou_…`).
        label: String,
    },
}

/// One message read from a platform, parsed by its adapter.
#[derive(Debug, Clone)]
pub(crate) struct PlatformMessage {
    /// The mesh group it belongs to.
    pub(crate) group: String,
    /// The platform's id of the message.
    pub(crate) platform_msg_id: String,
    /// When it was sent (ms since the epoch), by the platform's clock when it says.
    pub(crate) sent_at: u64,
    /// Its text, rich content flattened, mentions readable (`@Name`).
    pub(crate) text: String,
    /// Who sent it.
    pub(crate) sender: Sender,
    /// The platform's own mention list (Feishu's `@_user_N` placeholders).
    pub(crate) mentions: Vec<PlatformMention>,
}

/// What became of a platform message: the `result` of
/// `botmesh_platform_events_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    /// Recorded as a new entry (a person's message).
    Recorded,
    /// Already recorded (a redelivery, a replay after a resume, a copy a colleague
    /// carried over the bridge first).
    Duplicate,
    /// This bot's own message, already recorded when it was sent.
    Own,
    /// A colleague's platform copy whose bridge copy is recorded.
    BridgeCopy,
    /// A bot's message recorded as context nobody answers.
    Context,
    /// No text: nothing to record.
    Empty,
    /// The transcript refused it (logged); the platform should deliver it again
    /// where it can.
    Failed,
    /// Refused for good: it would start a group past `[mesh] max_groups`. The platform
    /// is told it was taken (a webhook answered 500 would deliver it forever); logged
    /// once per group.
    Refused,
}

impl Received {
    /// The metric's label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Received::Recorded => "recorded",
            Received::Duplicate => "duplicate",
            Received::Own => "own",
            Received::BridgeCopy => "bridge_copy",
            Received::Context => "context",
            Received::Empty => "empty",
            Received::Failed => "failed",
            Received::Refused => "refused",
        }
    }
}

/// An adapter's inbound path: who it is and how long a colleague's platform copy
/// waits for the bridge copy.
#[derive(Debug, Clone)]
pub(crate) struct Inbound {
    /// The platform (`discord`), as the arrival's source and the metric's label.
    pub(crate) platform: &'static str,
    /// This node's bot: its own messages are not recorded again.
    pub(crate) me: String,
    /// The mesh's max_depth: the depth of context nobody answers.
    pub(crate) max_depth: u32,
    /// How long a colleague's platform copy waits for the bridge copy.
    pub(crate) grace: Duration,
}

/// The groups refused past `max_groups` whose refusal was logged, per bot (bounded:
/// past [`REFUSALS_KEPT`] the set starts over, and a refusal is logged again).
static REFUSALS: std::sync::OnceLock<
    parking_lot::Mutex<std::collections::HashSet<(String, String)>>,
> = std::sync::OnceLock::new();
/// How many refused groups [`REFUSALS`] remembers.
const REFUSALS_KEPT: usize = 1024;

/// True the first time `group` is refused for `bot`.
fn first_refusal(bot: &str, group: &str) -> bool {
    let mut seen = REFUSALS.get_or_init(Default::default).lock();
    if seen.len() >= REFUSALS_KEPT {
        seen.clear();
    }
    seen.insert((bot.to_string(), group.to_string()))
}

/// `text` cut to at most `max` bytes at a character boundary.
pub(crate) fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

impl Inbound {
    /// Records `msg` as the module docs say; counts and returns what became of it.
    /// A colleague's copy may wait up to [`Inbound::grace`]: an adapter that must not
    /// wait spawns this on `ingest.tasks`.
    pub(crate) async fn receive(&self, ingest: &AdapterContext, msg: PlatformMessage) -> Received {
        let id = msg.platform_msg_id.clone();
        let received = self.record(ingest, msg).await;
        ingest
            .metrics
            .platform_event(self.platform, received.as_str());
        tracing::debug!(platform = self.platform, message_id = %id, result = received.as_str(), "platform message");
        received
    }

    /// Records a colleague's `msg` on `ingest.tasks`: its copy may wait up to
    /// [`Inbound::grace`] for the bridge copy, and the adapter's reading task (the
    /// gateway, the socket, the poll) must not wait with it.
    pub(crate) fn receive_aside(&self, ingest: &AdapterContext, msg: PlatformMessage) {
        let inbound = self.clone();
        let ing = ingest.clone();
        ingest.tasks.spawn(async move {
            inbound.receive(&ing, msg).await;
        });
    }

    async fn record(&self, ingest: &AdapterContext, msg: PlatformMessage) -> Received {
        let text = truncate(msg.text.trim().to_string(), MAX_TEXT_BYTES);
        if text.is_empty() {
            tracing::info!(platform = self.platform, message_id = %msg.platform_msg_id, "ignoring a platform message without text");
            return Received::Empty;
        }
        let id = platform_message_id(self.platform, &msg.platform_msg_id, msg.sent_at);
        let author = match &msg.sender {
            Sender::Person { name, .. } => Author::human(name.clone()),
            Sender::Bot { colleague, label } => {
                Author::bot(colleague.clone().unwrap_or_else(|| label.clone()))
            }
        };
        let mut env = Envelope::message(
            id,
            msg.sent_at,
            msg.group.clone(),
            self.me.clone(),
            author,
            text,
        );
        env.platform_msg_id = Some(msg.platform_msg_id.clone());
        let mentions = match msg.sender {
            Sender::Person { ids, .. } => {
                env.root = Some(id);
                env.person = ids;
                msg.mentions
            }
            Sender::Bot { colleague, .. } => {
                if colleague.as_deref() == Some(self.me.as_str()) {
                    return Received::Own;
                }
                if colleague.is_some()
                    && ingest
                        .sink
                        .await_platform_msg(&msg.group, &msg.platform_msg_id, self.grace)
                        .await
                {
                    tracing::debug!(platform = self.platform, message_id = %msg.platform_msg_id, "a colleague's platform copy: the bridge copy is recorded");
                    return Received::BridgeCopy;
                }
                if ingest.accepting.is_cancelled() {
                    return Received::Failed;
                }
                tracing::info!(platform = self.platform, message_id = %msg.platform_msg_id, bot = ?colleague, "recording a bot's platform message as context only (no bridge copy)");
                env.depth = self.max_depth;
                env.root = None;
                Vec::new()
            }
        };
        let context = env.depth == self.max_depth && !env.is_human();
        let arrival = Arrival {
            env,
            mentions,
            source: self.platform,
        };
        match ingest.arrive(arrival).await {
            Ok(Appended::New) if context => Received::Context,
            Ok(Appended::New) => Received::Recorded,
            Ok(Appended::Duplicate) => {
                tracing::info!(platform = self.platform, message_id = %msg.platform_msg_id, "platform message already recorded (a redelivery, or a colleague carried it first)");
                Received::Duplicate
            }
            Err(e @ TranscriptError::TooManyGroups { .. }) => {
                if first_refusal(&self.me, &msg.group) {
                    tracing::warn!(platform = self.platform, group = %msg.group, error = %e, "a platform message that would start a group past max_groups: taken and dropped (logged once per group)");
                } else {
                    tracing::debug!(platform = self.platform, message_id = %msg.platform_msg_id, "dropped: its group is past max_groups");
                }
                Received::Refused
            }
            Err(e) => {
                tracing::error!(platform = self.platform, message_id = %msg.platform_msg_id, error = %e, "platform message could not be recorded");
                Received::Failed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("héllo".into(), 3), "hé");
        assert_eq!(truncate("short".into(), 100), "short");
        assert_eq!(truncate("小八".into(), 4), "小");
    }
}
