//! DingTalk in: a robot message to an arrival. The author's name and ids, the people
//! learned for outgoing @s, robots' @s removed (or kept for a mentions-only robot),
//! and the human envelope broadcast to the peers (see the module docs of `dingtalk`).

use super::frames::RobotMessage;
use super::{DingTalk, DINGTALK, PEOPLE_CAPACITY};
use crate::platform::kit::inbound::{PlatformMessage, Received, Sender};
use crate::turn::mention::MentionMatcher;
use crate::wire::envelope::now_millis;

/// `text` without the `@Name` of each of `members` (DingTalk's @s of robots), and
/// without the space that followed each.
pub(crate) fn strip_mentions(matcher: &MentionMatcher, text: &str, members: &[&str]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for span in matcher.spans(text, &[]) {
        if span.start < last || !members.contains(&span.member.as_str()) {
            continue;
        }
        out.push_str(&text[last..span.start]);
        last = span.end;
        if let Some(c) = text[last..].chars().next().filter(|c| c.is_whitespace()) {
            last += c.len_utf8();
        }
    }
    out.push_str(&text[last..]);
    out.trim().to_string()
}

/// Whether `c` can continue a Latin handle (then `@Bob` is not found in `@Bobby`).
pub(super) fn continues_handle(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl DingTalk {
    /// The display name a person's message is recorded under: their nick, told apart
    /// from a bot of the same name (the bridge refuses a human named like a bot).
    fn author_name(&self, msg: &RobotMessage) -> String {
        let nick = msg.sender_nick.trim();
        if nick.is_empty() {
            return "dingtalk user".into();
        }
        crate::platform::person_name(&self.matcher, DINGTALK, nick)
    }

    /// Remembers what a message teaches about sending: the conversation's session
    /// webhook and the sender's staff id.
    pub(super) fn learn(&self, msg: &RobotMessage) {
        if let (Some(url), Some(exp)) = (&msg.session_webhook, msg.session_webhook_expired_time) {
            if !url.is_empty() {
                self.webhooks
                    .lock()
                    .insert(msg.conversation_id.clone(), (url.clone(), exp));
            }
        }
        if let Some(staff) = msg.sender_staff_id.as_deref().filter(|s| !s.is_empty()) {
            let nick = msg.sender_nick.trim();
            if !nick.is_empty() && self.matcher.reads_as_member(nick).is_none() {
                let mut people = self.people.lock();
                if people.len() >= PEOPLE_CAPACITY && !people.contains_key(nick) {
                    if let Some(k) = people.keys().next().cloned() {
                        people.remove(&k);
                    }
                }
                people.insert(nick.to_string(), staff.to_string());
            }
        }
    }

    /// The text the mesh records for a message DingTalk delivered to the robots
    /// `delivered` (this one, and the colleagues recognised in `atUsers`): the @ of a
    /// judging robot is removed (it was only the way in), the @ of a robot with
    /// `participation = "mentions"` is kept, put back in front if DingTalk left it
    /// out (it is the only way to address such a robot). The result depends only on
    /// the message, so every carrier records the same text.
    ///
    /// A person's command (`/why`, `/stop`, …) is the exception: DingTalk delivered it
    /// to the robots it @-mentions, and those are whom it addresses, so it keeps an @
    /// of each of them, in front, in a stable order.
    pub(crate) fn mesh_text(&self, text: &str, delivered: &[&str]) -> String {
        if crate::turn::control::verb_of(text).is_some() {
            let text = strip_mentions(&self.matcher, text, delivered);
            let mut names = delivered.to_vec();
            names.sort_unstable();
            names.dedup();
            let mut out: String = names.iter().map(|b| format!("@{b} ")).collect();
            out.push_str(&text);
            return out;
        }
        let (keep, strip): (Vec<&str>, Vec<&str>) = delivered
            .iter()
            .copied()
            .partition(|b| self.mentions_only.iter().any(|m| m == b));
        let text = strip_mentions(&self.matcher, text, &strip);
        let missing: Vec<&str> = self
            .mentions_only
            .iter()
            .map(String::as_str)
            .filter(|b| keep.contains(b) && !self.matcher.mentions(&text, &[], b))
            .collect();
        if missing.is_empty() || text.is_empty() {
            return text;
        }
        let mut out: String = missing.iter().map(|b| format!("@{b} ")).collect();
        out.push_str(&text);
        out
    }

    /// Records one robot message (see [`super::stream::StreamHandler::robot_message`]).
    pub(crate) async fn receive(&self, msg: RobotMessage) -> bool {
        let Some(ingest) = self.ingest.get() else {
            return false;
        };
        if msg.is_direct() {
            tracing::info!(msg_id = %msg.msg_id, "ignoring a direct message: botmesh bots talk in group chats");
            self.count("ignored");
            return true;
        }
        tracing::debug!(msg_id = %msg.msg_id, conversation = %msg.conversation_id, at_users = ?msg.at_users, is_in_at_list = msg.is_in_at_list, "dingtalk robot message");
        self.learn(&msg);
        let text = msg.flattened_text();
        if text.is_empty() {
            tracing::info!(msg_id = %msg.msg_id, msgtype = %msg.msgtype, "ignoring an empty dingtalk message");
            self.count("ignored");
            return true;
        }
        let also: Vec<&str> = msg
            .at_users
            .iter()
            .filter_map(|u| {
                self.peers_by_user_id
                    .get(&u.dingtalk_id)
                    .or_else(|| {
                        u.staff_id
                            .as_ref()
                            .and_then(|s| self.peers_by_user_id.get(s))
                    })
                    .map(String::as_str)
            })
            .collect();
        let mut delivered = also.clone();
        if msg.is_in_at_list {
            delivered.push(&self.me);
        }
        let text = self.mesh_text(&text, &delivered);
        if text.is_empty() {
            tracing::info!(msg_id = %msg.msg_id, "ignoring a dingtalk message that only @-mentions robots");
            self.count("ignored");
            return true;
        }
        let group = self.group_for_conversation(&msg.conversation_id);
        let sent_at = msg
            .create_at
            .filter(|t| *t > 0)
            .map(|t| t as u64)
            .unwrap_or_else(now_millis);
        // The kit names it by its DingTalk id, the same on every robot that receives
        // (and forwards) it, so the bots' claims name the same trigger.
        let message = PlatformMessage {
            group,
            platform_msg_id: msg.msg_id.clone(),
            sent_at,
            text,
            sender: Sender::Person {
                name: self.author_name(&msg),
                ids: person_ids(&msg),
            },
            mentions: Vec::new(),
        };
        match self.inbound.receive(ingest, message).await {
            Received::Failed => {
                self.count("unrecorded");
                false
            }
            Received::Duplicate => {
                self.count("duplicate");
                true
            }
            received => {
                tracing::info!(msg_id = %msg.msg_id, conversation = %msg.conversation_id, also_delivered_to = ?also, result = received.as_str(), "dingtalk message recorded and forwarded to the peers");
                self.count("message");
                true
            }
        }
    }
}

/// The sender's ids, for `[mesh] operators` (`dingtalk:<id>`): the staff id (stable
/// in the robot's org) and the sender id DingTalk gives the robot, space-separated;
/// `None` when DingTalk gives neither.
fn person_ids(msg: &RobotMessage) -> Option<String> {
    let ids: Vec<&str> = msg
        .sender_staff_id
        .as_deref()
        .into_iter()
        .chain(std::iter::once(msg.sender_id.as_str()))
        .filter(|id| !id.is_empty() && !id.contains(char::is_whitespace))
        .collect();
    (!ids.is_empty()).then(|| ids.join(" "))
}
