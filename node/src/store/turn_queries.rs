//! The reads the turn code makes of a transcript held as a slice: the last messages,
//! the ones after a message, and the counts `turn::policy`'s rate cap uses (recent
//! bot messages, answers still due). [`Transcripts`](super::transcript::Transcripts)
//! answers through them, and so do the simulator's and the replay's `Ports`.

use std::sync::Arc;

use ulid::Ulid;

use crate::wire::envelope::{AuthorKind, Envelope};

/// The last `limit` messages of a transcript held as a slice, oldest first: what
/// [`Transcripts::recent`] reads, for the simulator's and the replay's `Ports`.
pub(crate) fn last_in(t: &[Arc<Envelope>], limit: usize) -> Vec<Arc<Envelope>> {
    t[t.len().saturating_sub(limit)..].to_vec()
}

/// The messages of a slice after the message `after` (exclusive): [`Transcripts::since`].
pub(crate) fn since_in(t: &[Arc<Envelope>], after: &Ulid) -> Vec<Arc<Envelope>> {
    match t.iter().position(|e| &e.id == after) {
        Some(i) => t[i + 1..].to_vec(),
        None => Vec::new(),
    }
}

/// [`Transcripts::recent_bot_messages_and_due`] over a slice.
pub(crate) fn bot_messages_and_due_in(
    t: &[Arc<Envelope>],
    limit: usize,
    now_ms: u64,
    window_ms: u64,
    trigger: &Ulid,
    ahead: &[String],
) -> (usize, usize) {
    let start = t.len().saturating_sub(limit);
    (
        recent_bot_messages(t[start..].iter(), now_ms, window_ms),
        answers_due(t.iter(), trigger, ahead),
    )
}

/// Counts bot messages in `recent` (oldest first) after the last human message and
/// no older than `window_ms` before `now_ms`.
pub(crate) fn recent_bot_messages<'a>(
    recent: impl DoubleEndedIterator<Item = &'a std::sync::Arc<Envelope>>,
    now_ms: u64,
    window_ms: u64,
) -> usize {
    recent
        .rev()
        .take_while(|e| e.author.kind == AuthorKind::Bot)
        .filter(|e| now_ms.saturating_sub(e.sent_at) <= window_ms)
        .count()
}

/// How many of the bots `ahead` have no answer to `trigger` in `recent`: in a round
/// to everyone, the answers still due from the bots whose claims go first. They post
/// before this bot whatever happens, so `turn::policy::last_check`'s rate cap counts them with
/// [`recent_bot_messages`] (an answer counts once: as a message when recorded, else
/// as one due).
pub(crate) fn answers_due<'a>(
    recent: impl DoubleEndedIterator<Item = &'a std::sync::Arc<Envelope>> + Clone,
    trigger: &ulid::Ulid,
    ahead: &[String],
) -> usize {
    ahead
        .iter()
        .filter(|bot| {
            !recent
                .clone()
                .rev()
                .any(|e| e.reply_to.as_ref() == Some(trigger) && e.author.name == bot.as_str())
        })
        .count()
}
