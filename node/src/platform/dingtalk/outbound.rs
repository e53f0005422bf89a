//! DingTalk out: through the session webhook while it is valid (with real @s of known
//! people) else the group-send API, at the per-group pace.

use super::api::{ApiError, Outgoing, WEBHOOK_MARGIN};
use super::inbound::continues_handle;
use super::DingTalk;
use crate::wire::envelope::{now_millis, Envelope};

/// Why a message could not be posted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PostFailure {
    /// The group maps to no DingTalk conversation.
    #[error("group {0:?} maps to no dingtalk conversation (set dingtalk.conversation_id for [mesh].group)")]
    NoConversation(String),
    /// DingTalk refused or could not be reached.
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl DingTalk {
    /// The session webhook of `conversation` while it is valid for another
    /// [`WEBHOOK_MARGIN`].
    pub(crate) fn valid_webhook(&self, conversation: &str, now_ms: i64) -> Option<String> {
        let hooks = self.webhooks.lock();
        let (url, exp) = hooks.get(conversation)?;
        (*exp - now_ms > WEBHOOK_MARGIN.as_millis() as i64).then(|| url.clone())
    }

    /// The text to send: each `@Nick` of a person whose staff id is known becomes
    /// `@staffId` with the id in `atUserIds` (DingTalk renders it as a real @ there);
    /// anything else — a colleague robot included — stays as written.
    pub(crate) fn outgoing(&self, text: &str) -> Outgoing {
        let people = self.people.lock();
        let mut nicks: Vec<(&String, &String)> = people.iter().collect();
        nicks.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
        let mut out = String::with_capacity(text.len());
        let mut at_user_ids: Vec<String> = Vec::new();
        let mut rest = text;
        while let Some(pos) = rest.find(['@', '＠']) {
            let at_len = rest[pos..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&rest[..pos]);
            let after = &rest[pos + at_len..];
            let hit = nicks.iter().find(|(nick, _)| {
                after.starts_with(nick.as_str())
                    && !(nick.ends_with(continues_handle)
                        && after[nick.len()..].starts_with(continues_handle))
            });
            match hit {
                Some((nick, staff)) => {
                    out.push('@');
                    out.push_str(staff);
                    if !at_user_ids.contains(staff) {
                        at_user_ids.push((*staff).clone());
                    }
                    rest = &after[nick.len()..];
                }
                None => {
                    out.push_str(&rest[pos..pos + at_len]);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        Outgoing {
            text: out,
            at_user_ids,
        }
    }

    /// Posts the bot's own message: paced per group, through the conversation's
    /// session webhook while it is valid, else the group-send API. Returns the
    /// platform id (`processQueryKey`, or `session:<envelope id>` for a webhook send,
    /// which returns none). Failures are logged here.
    pub(crate) async fn post(&self, env: &Envelope) -> Result<String, PostFailure> {
        let Some(conversation) = self.conversation_for_group(&env.group) else {
            let e = PostFailure::NoConversation(env.group.clone());
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not posted to dingtalk; the mesh still gets it");
            return Err(e);
        };
        let out = self.outgoing(&env.text);
        self.pacer.acquire(&conversation).await;
        if let Some(url) = self.valid_webhook(&conversation, now_millis() as i64) {
            match self.api.send_by_session(&url, &out).await {
                Ok(()) => {
                    tracing::info!(bot = %self.me, id = %env.id, %conversation, "posted to dingtalk (session webhook)");
                    self.count("send_session");
                    return Ok(format!("session:{}", env.id));
                }
                Err(e) => {
                    tracing::warn!(bot = %self.me, id = %env.id, error = %e, "session webhook failed; using the group-send API");
                }
            }
        }
        // The group-send API's sampleText has no @ list: there `@Name` stays as written.
        let plain = Outgoing {
            text: env.text.clone(),
            at_user_ids: Vec::new(),
        };
        match self.api.send_to_group(&conversation, &plain).await {
            Ok(key) => {
                tracing::info!(bot = %self.me, id = %env.id, %conversation, process_query_key = %key, "posted to dingtalk (group send)");
                self.count("send_group");
                Ok(key)
            }
            Err(e) => {
                tracing::error!(bot = %self.me, id = %env.id, %conversation, error = %e, "could not post to dingtalk; the mesh still gets the message");
                self.count("send_failed");
                Err(e.into())
            }
        }
    }
}
