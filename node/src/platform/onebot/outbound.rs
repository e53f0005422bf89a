//! Sending a bot's message: `send_group_msg` with the message as an array of segments.
//!
//! - The reply goes as a `reply` segment to its trigger, when the trigger is a QQ
//!   message (recorded from QQ by this bot or a QQ colleague).
//! - `@Colleague` becomes an `at` segment of the colleague's `[bots.onebot].self_id`;
//!   everything else goes in `text` segments, as written: a bot's text can never
//!   become a CQ code.
//! - Text over [`MAX_PART_CHARS`] goes in parts (the kit's splitter); the envelope's
//!   `platform_msg_id` lists every part's `message_id`.
//! - Sends to one group are paced by the kit's per-chat pacer (`send_interval_ms`,
//!   default 1 s apart). A failed send (`status: failed`) is tried again by the kit's
//!   retry loop; one that may have gone through (no answer) is not, so nothing is
//!   posted twice.

use serde_json::json;

use crate::config::pacing::ApiRetry;
use crate::platform::kit::api::{self, Call, Classify};
use crate::platform::PostError;
use crate::store::transcript::platform_ids;
use crate::wire::envelope::Envelope;

use super::conn::ActionError;
use super::inbound::id_of;
use super::segments;
use super::Onebot;

/// The longest part sent, in characters (QQ cuts long messages; 3,000 stays clear).
pub const MAX_PART_CHARS: usize = 3_000;

/// Tries per send.
pub(crate) const RETRY: ApiRetry = ApiRetry {
    attempts: 3,
    base: std::time::Duration::from_millis(500),
    max: std::time::Duration::from_secs(10),
};

/// Private-use characters that hold an at-segment's number through the rewrite.
const HOLD_OPEN: char = '\u{E000}';
/// See [`HOLD_OPEN`].
const HOLD_CLOSE: char = '\u{E001}';

/// What a failed action means for another try.
pub(crate) fn classify(e: ActionError) -> Classify<serde_json::Value, ActionError> {
    match &e {
        // Never sent: try again.
        ActionError::NotConnected => Classify::RetryAfter(None, e),
        // Refused as asked (bad request, no permission, unsupported): another try is the same.
        ActionError::Failed {
            retcode: 1400 | 1401 | 1403 | 1404,
            ..
        } => Classify::GiveUp(e),
        ActionError::Failed { .. } => Classify::RetryAfter(None, e),
        // It may have been carried out: a second try could post twice.
        ActionError::NoAnswer(_) => Classify::GiveUp(e),
    }
}

impl Onebot {
    /// `text` cut at the colleagues it names: `Ok(text)` is text, `Err(qq)` an at.
    pub fn outgoing_parts(&self, text: &str) -> Vec<Result<String, String>> {
        let text: String = text
            .chars()
            .filter(|c| *c != HOLD_OPEN && *c != HOLD_CLOSE)
            .collect();
        let held = self.matcher.rewrite(&text, |member| {
            let qq = self.peer_qq.get(member).filter(|_| member != self.me)?;
            Some(format!("{HOLD_OPEN}{qq}{HOLD_CLOSE}"))
        });
        let mut parts = Vec::new();
        let mut rest = held.as_str();
        while let Some(open) = rest.find(HOLD_OPEN) {
            let after = &rest[open + HOLD_OPEN.len_utf8()..];
            let Some(close) = after.find(HOLD_CLOSE) else {
                break;
            };
            parts.push(Ok(rest[..open].to_string()));
            parts.push(Err(after[..close].to_string()));
            rest = &after[close + HOLD_CLOSE.len_utf8()..];
        }
        parts.push(Ok(rest.to_string()));
        parts
    }

    /// The QQ message id of `env`'s trigger, when it is a QQ message.
    fn trigger_id(&self, env: &Envelope) -> Option<String> {
        let trigger = env
            .reply_to
            .and_then(|r| self.ingest.get()?.sink.message(&env.group, &r))?;
        let from_qq = trigger.sender == self.me || self.peer_qq.contains_key(&trigger.sender);
        if !from_qq {
            return None;
        }
        let id = platform_ids(trigger.platform_msg_id.as_deref()?)
            .next()
            .map(str::to_string);
        id
    }

    /// Sends one message to a group; returns its `message_id`.
    async fn send(
        &self,
        group_id: &str,
        message: serde_json::Value,
    ) -> Result<String, ActionError> {
        let params = json!({
            "group_id": group_id.parse::<i64>().unwrap_or_default(),
            "message": message,
            "auto_escape": false,
        });
        let call = Call {
            platform: "onebot",
            noun: "action",
            what: Some("send_group_msg"),
        };
        let data = api::run(&RETRY, call, || async {
            match self.link.call("send_group_msg", params.clone()).await {
                Ok(d) => Classify::Ok(d),
                Err(e) => classify(e),
            }
        })
        .await
        .map_err(|e| e.last)?;
        Ok(id_of(&data["message_id"]))
    }

    /// Posts the bot's own message; returns the `message_id` of its parts,
    /// space-separated.
    pub async fn post_envelope(&self, env: &Envelope) -> Result<String, PostError> {
        let Some(group_id) = self.group_id_for(&env.group) else {
            let e = format!(
                "group {:?} maps to no QQ group (onebot.group_id is [mesh].group)",
                env.group
            );
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not sent to qq; the mesh still gets it");
            return Err(PostError(e));
        };
        let trigger = self.trigger_id(env);
        let parts = crate::platform::kit::split::split_message(&env.text, MAX_PART_CHARS);
        let mut ids = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let reply = if i == 0 { trigger.as_deref() } else { None };
            let message = segments::outgoing(reply, &self.outgoing_parts(part));
            self.pacer.acquire(&group_id).await;
            match self.send(&group_id, message).await {
                Ok(id) => ids.push(id),
                Err(e) if ids.is_empty() => {
                    tracing::error!(bot = %self.me, id = %env.id, %group_id, error = %e, "could not send to qq; the mesh still gets the message");
                    return Err(PostError(e.to_string()));
                }
                Err(e) => {
                    tracing::error!(bot = %self.me, id = %env.id, %group_id, part = i + 1, parts = parts.len(), error = %e, "could not send a later part to qq");
                    break;
                }
            }
        }
        if ids.is_empty() {
            return Err(PostError("empty message".into()));
        }
        let joined = ids.join(" ");
        tracing::info!(bot = %self.me, id = %env.id, message_id = %joined, %group_id, reply_to = ?trigger, "sent to qq");
        Ok(joined)
    }
}
