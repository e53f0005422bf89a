//! Discord out: `@Colleague` to `<@id>` pings, `allowed_mentions`, the reply
//! reference, parts of at most 2,000 characters and their nonces.

use std::collections::HashSet;
use std::sync::OnceLock;

use ulid::Ulid;

use super::rest::{self, AllowedMentions, CreateMessage, MessageReference, RestError};
use super::Discord;
use crate::platform::kit::mention;
use crate::platform::kit::parts::{post_in_parts, PostTo};
use crate::store::transcript::platform_ids;
use crate::wire::envelope::{AuthorKind, Envelope};

/// Why a post failed.
#[derive(Debug, thiserror::Error)]
pub enum PostFailure {
    /// The group is neither the mesh group nor a channel id.
    #[error("group {0:?} maps to no discord channel (discord.channel_id is [mesh].group)")]
    NoChannel(String),
    /// Discord refused or could not be reached.
    #[error(transparent)]
    Rest(#[from] RestError),
}

impl Discord {
    /// The text to post: `@Colleague` becomes `<@id>`, and `<at user_id="id">` tags
    /// (people, as the transcript shows them) become `<@id>` too. Returns the text
    /// and the colleagues' ids it mentions.
    pub fn outgoing_text(&self, text: &str) -> (String, Vec<String>) {
        static AT: OnceLock<regex::Regex> = OnceLock::new();
        let at = AT.get_or_init(|| {
            regex::Regex::new(r#"<at user_id="(\d{1,20})">[^<]*</at>"#).expect("valid")
        });
        let (text, pinged) =
            mention::by_id(&self.matcher, text, &self.me, &self.peer_user_ids, |id| {
                format!("<@{id}>")
            });
        (at.replace_all(&text, "<@$1>").into_owned(), pinged)
    }

    /// Nonce of part `i` of envelope `id`: at most 25 characters, the same on a retry.
    pub fn nonce(id: &Ulid, i: usize) -> String {
        let s = id.to_string();
        format!("{}{:03}", &s[4..], i % 1000)
    }

    /// Posts the bot's own message; returns the ids of its parts, space-separated.
    pub async fn post(&self, env: &Envelope) -> Result<String, PostFailure> {
        let Some(channel) = self.channel_for_group(&env.group) else {
            let e = PostFailure::NoChannel(env.group.clone());
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not posted to discord; the mesh still gets it");
            return Err(e);
        };
        let (text, colleagues) = self.outgoing_text(&env.text);
        // The message answered: its Discord id and its author.
        let trigger = env
            .reply_to
            .and_then(|r| self.ingest.get()?.sink.message(&env.group, &r));
        let reference = trigger.as_ref().and_then(|t| {
            let first = platform_ids(t.platform_msg_id.as_deref()?)
                .next()?
                .to_string();
            Some(MessageReference {
                message_id: first,
                channel_id: channel.clone(),
                fail_if_not_exists: false,
            })
        });
        let answered: Option<String> = reference.as_ref().and_then(|r| {
            let t = trigger.as_ref()?;
            match t.author.kind {
                AuthorKind::Human => self.authors.lock().map.get(&r.message_id).cloned(),
                AuthorKind::Bot => self.peer_user_ids.get(&t.author.name).cloned(),
            }
        });
        let mut users: Vec<String> = colleagues;
        if let Some(a) = &answered {
            if !users.contains(a) {
                users.push(a.clone());
            }
        }
        let parts = rest::split_message(&text, rest::MAX_MESSAGE_CHARS);
        let to = PostTo {
            platform: "discord",
            bot: &self.me,
            id: &env.id,
            chat: &channel,
        };
        let empty = || RestError::Malformed("empty message".into());
        let channel = &channel;
        let posted = post_in_parts(to, &parts, empty, |i, part| {
            let in_part: Vec<String> = users
                .iter()
                .filter(|u| part.contains(&format!("<@{u}>")) || Some(*u) == answered.as_ref())
                .cloned()
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            let mut in_part = in_part;
            in_part.sort();
            let msg = CreateMessage {
                content: part.clone(),
                allowed_mentions: AllowedMentions {
                    parse: Vec::new(),
                    users: in_part,
                    replied_user: i == 0 && answered.is_some(),
                },
                message_reference: reference.clone().filter(|_| i == 0),
                nonce: Self::nonce(&env.id, i),
                enforce_nonce: true,
            };
            async move { self.rest.create_message(channel, &msg).await }
        });
        Ok(posted.await?)
    }

    /// Edits the bot's message `platform_msg_id` (its first part) in `group`'s channel
    /// to `text`, made as for a post (cut to one part; only the colleagues it names
    /// pinged).
    pub(crate) async fn edit(
        &self,
        group: &str,
        platform_msg_id: &str,
        text: &str,
    ) -> Result<(), crate::platform::EditError> {
        use crate::platform::EditError;
        let channel = self
            .channel_for_group(group)
            .ok_or_else(|| EditError::Failed(PostFailure::NoChannel(group.into()).to_string()))?;
        let id = platform_ids(platform_msg_id)
            .next()
            .ok_or_else(|| EditError::Failed("no message id".into()))?;
        let (text, users) = self.outgoing_text(text);
        let content = rest::split_message(&text, rest::MAX_MESSAGE_CHARS)
            .into_iter()
            .next()
            .ok_or_else(|| EditError::Failed("nothing to show".into()))?;
        self.rest
            .edit_message(&channel, id, &content, users)
            .await
            .map_err(|e| EditError::Failed(e.to_string()))
    }
}
