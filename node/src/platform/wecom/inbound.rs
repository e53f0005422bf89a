//! Callbacks in: `aibot_msg_callback` → transcript arrivals.
//!
//! - A group callback is a person's message to this robot (WeCom shows a robot only
//!   the messages that @ it, and never another robot's). Its text keeps every
//!   `@Name` as typed, so colleagues named there are mentions as usual; when the text
//!   does not name this bot by its name or an alias (the robot's WeCom name differs),
//!   `@Me ` is put in front, because the message addresses it.
//! - The person is recorded under their userid (callbacks carry no display name;
//!   `[mesh] operators` takes `wecom:<userid>`).
//! - The kit's one inbound path records it, named by the `msgid`, and the node carries
//!   it to its peers (people's messages reach only the robots they @). When a person
//!   @-ed two mesh robots both carry it and every transcript keeps one copy (by
//!   `msgid`); a callback delivered again is a duplicate.
//! - The callback's req_id is remembered by `msgid` ([`Replies`]), for the answer.
//! - Single chats and events (`enter_chat`, `feedback_event`, …) are logged and
//!   counted as `ignored`: botmesh bots talk in group chats.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::platform::kit::inbound::{PlatformMessage, Sender};
use crate::platform::AdapterContext;

use super::frames::{self, Callback};
use super::{Wecom, WECOM};

/// Callbacks remembered for answers on their req_id.
pub const REPLIES_REMEMBERED: usize = 2_000;
/// How long a callback's req_id takes an answer (WeCom's passive reply window).
pub const REPLY_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Where an answer to a message can go on its callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTo {
    /// The callback's req_id.
    pub req_id: String,
    /// The session that received it: a req_id is good on that one only (846605).
    pub session: u64,
    /// When it came.
    pub at: Instant,
}

/// The callbacks this robot received, by `msgid`, oldest forgotten first.
#[derive(Debug, Default)]
pub struct Replies {
    /// `msgid` → where to answer it.
    by_msgid: HashMap<String, ReplyTo>,
    /// `msgid`s in arrival order.
    order: VecDeque<String>,
}

impl Replies {
    /// Remembers `reply` for `msgid` (the first callback of a msgid wins).
    pub fn remember(&mut self, msgid: &str, reply: ReplyTo) {
        if self.by_msgid.contains_key(msgid) {
            return;
        }
        if self.order.len() >= REPLIES_REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.by_msgid.remove(&old);
            }
        }
        self.order.push_back(msgid.to_string());
        self.by_msgid.insert(msgid.to_string(), reply);
    }

    /// Where to answer `msgid` on session `session` now, if its callback came on that
    /// session within the window.
    pub fn usable(&self, msgid: &str, session: Option<u64>) -> Option<ReplyTo> {
        let r = self.by_msgid.get(msgid)?;
        (Some(r.session) == session && r.at.elapsed() < REPLY_WINDOW).then(|| r.clone())
    }

    /// How many are remembered.
    pub fn len(&self) -> usize {
        self.by_msgid.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_msgid.is_empty()
    }
}

impl Wecom {
    /// The text the mesh records for a callback's `text`: as typed, with `@Me ` in
    /// front when it does not name this bot.
    pub fn mesh_text(&self, text: &str) -> String {
        let text = text.trim();
        if text.is_empty() || self.matcher.mentions(text, &[], &self.me) {
            return text.to_string();
        }
        format!("@{} {text}", self.me)
    }

    /// Handles one pushed frame from the connection, received on session `session`.
    pub(crate) async fn on_frame(&self, ingest: &AdapterContext, session: u64, frame: Value) {
        if frame["cmd"].as_str() == Some(frames::EVENT_CALLBACK) {
            let body = &frame["body"];
            tracing::info!(
                eventtype = body["event"]["eventtype"].as_str().unwrap_or_default(),
                chattype = body["chattype"].as_str().unwrap_or_default(),
                "wecom: an event the mesh does not use"
            );
            self.count(ingest, "ignored");
            return;
        }
        let Some(cb) = Callback::parse(&frame) else {
            tracing::warn!("wecom: a message callback without msgid; ignored");
            self.count(ingest, "ignored");
            return;
        };
        if !cb.is_group() {
            tracing::info!(msgid = %cb.msgid, userid = %cb.userid, "wecom: ignoring a single-chat message: botmesh bots talk in group chats");
            self.count(ingest, "ignored");
            return;
        }
        self.replies.lock().remember(
            &cb.msgid,
            ReplyTo {
                req_id: cb.req_id.clone(),
                session,
                at: Instant::now(),
            },
        );
        tracing::debug!(msgid = %cb.msgid, chatid = %cb.chatid, msgtype = %cb.msgtype, "wecom message callback");
        let text = self.mesh_text(&cb.text);
        let msg = PlatformMessage {
            group: self.group_for(&cb.chatid),
            platform_msg_id: cb.msgid.clone(),
            sent_at: cb.sent_at.unwrap_or_else(crate::wire::envelope::now_millis),
            text,
            sender: Sender::Person {
                name: crate::platform::person_name(&self.matcher, WECOM, &cb.userid),
                ids: Some(cb.userid.clone()).filter(|u| !u.is_empty()),
            },
            mentions: Vec::new(),
        };
        let received = self.inbound.receive(ingest, msg).await;
        tracing::info!(msgid = %cb.msgid, chatid = %cb.chatid, result = received.as_str(), "wecom message recorded (and carried to the peers when new)");
    }

    /// Counts a callback that is no message of the mesh's.
    fn count(&self, ingest: &AdapterContext, result: &str) {
        ingest.metrics.platform_event("wecom", result);
    }
}
