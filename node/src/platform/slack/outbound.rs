//! Posting a bot's message: `chat.postMessage` with the text as Slack renders it.
//!
//! - [`escape`]: `&`, `<`, `>` become `&amp;`, `&lt;`, `&gt;` (Slack's markup is made
//!   of `<…>`; anything else in the text is shown as written).
//! - `@Colleague` becomes `<@U…>` (the colleague's `[bots.slack].user_id`), and a
//!   person's `<at user_id="U…">Name</at>` tag (how the transcript shows people) becomes
//!   `<@U…>`; `@here` / `@everyone` written by a bot stay plain text (a bot never pings
//!   the channel).
//! - Threads: a reply to a message that was in a thread goes to that thread
//!   (`thread_ts`); a reply to a top-level message stays top-level.
//! - Text over [`MAX_PART_CHARS`] (Slack recommends 4,000; it cuts at 40,000) goes in
//!   parts cut at paragraph, line or sentence boundaries; the envelope's
//!   `platform_msg_id` lists every part's `ts`, so colleagues recognise each part.
//! - Posts to one channel are paced at about one a second (Slack's limit for
//!   chat.postMessage), with the kit's per-chat pacer; a 429 waits its `Retry-After`.

use std::sync::OnceLock;

use crate::platform::kit::mention;
use crate::platform::{EditError, PostError};
use crate::store::transcript::platform_ids;
use crate::wire::envelope::Envelope;

use super::Slack;

/// The longest part posted, in characters (Slack's recommended maximum).
pub const MAX_PART_CHARS: usize = 4_000;

/// Private-use characters that hold a person's mention through [`escape`].
const HOLD_OPEN: char = '\u{E000}';
/// See [`HOLD_OPEN`].
const HOLD_CLOSE: char = '\u{E001}';

/// `&`, `<`, `>` as Slack wants them in text.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl Slack {
    /// The text to post (see the module docs); returns it and the colleagues' user
    /// ids it mentions.
    pub fn outgoing_text(&self, text: &str) -> (String, Vec<String>) {
        static AT: OnceLock<regex::Regex> = OnceLock::new();
        let at = AT.get_or_init(|| {
            regex::Regex::new(r#"<at user_id="([UWB][A-Z0-9]{2,30})">[^<]*</at>"#).expect("valid")
        });
        // The holding characters never come from the text itself.
        let text: String = text
            .chars()
            .filter(|c| *c != HOLD_OPEN && *c != HOLD_CLOSE)
            .collect();
        let held = at.replace_all(&text, format!("{HOLD_OPEN}$1{HOLD_CLOSE}").as_str());
        let escaped = escape(&held);
        let (text, pinged) = mention::by_id(
            &self.matcher,
            &escaped,
            &self.me,
            &self.peer_user_ids,
            |id| format!("<@{id}>"),
        );
        let text = text.replace(HOLD_OPEN, "<@").replace(HOLD_CLOSE, ">");
        (text, pinged)
    }

    /// The thread a reply to `env`'s trigger goes to: the trigger's thread, if it was
    /// in one.
    fn thread_of_trigger(&self, env: &Envelope) -> Option<String> {
        let trigger = env
            .reply_to
            .and_then(|r| self.ingest.get()?.sink.message(&env.group, &r))?;
        let ts = platform_ids(trigger.platform_msg_id.as_deref()?)
            .next()?
            .to_string();
        self.threads.lock().get(&ts).cloned()
    }

    /// Posts the bot's own message; returns the `ts` of its parts, space-separated.
    pub async fn post_envelope(&self, env: &Envelope) -> Result<String, PostError> {
        let Some(channel) = self.channel_for_group(&env.group) else {
            let e = format!(
                "group {:?} maps to no slack channel (slack.channel_id is [mesh].group)",
                env.group
            );
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not posted to slack; the mesh still gets it");
            return Err(PostError(e));
        };
        let thread = self.thread_of_trigger(env);
        let parts = crate::platform::kit::split::split_message(&env.text, MAX_PART_CHARS);
        let mut ids = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let (text, _) = self.outgoing_text(part);
            self.pacer.acquire(&channel).await;
            match self
                .api
                .post_message(&channel, &text, thread.as_deref())
                .await
            {
                Ok(ts) => {
                    if let Some(t) = &thread {
                        self.threads.lock().insert(ts.clone(), t.clone());
                    }
                    ids.push(ts);
                }
                Err(e) if ids.is_empty() => {
                    tracing::error!(bot = %self.me, id = %env.id, %channel, error = %e, "could not post to slack; the mesh still gets the message");
                    return Err(PostError(e.to_string()));
                }
                Err(e) => {
                    tracing::error!(bot = %self.me, id = %env.id, %channel, part = i + 1, parts = parts.len(), error = %e, "could not post a later part to slack");
                    break;
                }
            }
        }
        if ids.is_empty() {
            return Err(PostError("empty message".into()));
        }
        let joined = ids.join(" ");
        tracing::info!(bot = %self.me, id = %env.id, ts = %joined, %channel, thread = ?thread, "posted to slack");
        Ok(joined)
    }

    /// `chat.update` of the bot's message `platform_msg_id` (its first part's `ts`) in
    /// `group`'s channel, the text made as for a post (cut to one part), paced with the
    /// channel's posts. Slack lets a bot edit its own messages at any age; the edit
    /// is a Tier 3 call (about 50 a minute).
    pub async fn edit_message(
        &self,
        group: &str,
        platform_msg_id: &str,
        text: &str,
    ) -> Result<(), EditError> {
        let channel = self.channel_for_group(group).ok_or_else(|| {
            EditError::Failed(format!("group {group:?} maps to no slack channel"))
        })?;
        let ts = platform_ids(platform_msg_id)
            .next()
            .ok_or_else(|| EditError::Failed("no message ts".into()))?;
        let first = crate::platform::kit::split::split_message(text, MAX_PART_CHARS)
            .into_iter()
            .next()
            .ok_or_else(|| EditError::Failed("nothing to show".into()))?;
        let (text, _) = self.outgoing_text(&first);
        self.pacer.acquire(&channel).await;
        self.api
            .update_message(&channel, ts, &text)
            .await
            .map_err(|e| EditError::Failed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_characters_are_escaped() {
        assert_eq!(
            escape("<b>5 < 6 & \"x\"</b>"),
            "&lt;b&gt;5 &lt; 6 &amp; \"x\"&lt;/b&gt;"
        );
        assert_eq!(
            super::super::inbound::unescape(&escape("a &amp; <@U1> & b")),
            "a &amp; <@U1> & b",
            "unescaping what was escaped gives the text back"
        );
    }
}
