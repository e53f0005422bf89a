//! The reads the turn code makes of a transcript held as a slice: the last messages,
//! the ones after a message, and the counts `turn::policy`'s rate cap uses ([`RateCount`]:
//! recent bot messages, answers still due). [`Transcripts`](super::transcript::Transcripts)
//! answers through them, and so do the simulator's and the replay's `Ports`.

use std::sync::Arc;

use ulid::Ulid;

use crate::wire::envelope::{AuthorKind, Envelope, Kind};

/// The last `limit` messages of a transcript held as a slice, oldest first: what
/// [`crate::store::transcript::Transcripts::recent`] reads, for the simulator's and the replay's `Ports`.
pub(crate) fn last_in(t: &[Arc<Envelope>], limit: usize) -> Vec<Arc<Envelope>> {
    t[t.len().saturating_sub(limit)..].to_vec()
}

/// The messages of a slice after the message `after` (exclusive): [`crate::store::transcript::Transcripts::since`].
pub(crate) fn since_in(t: &[Arc<Envelope>], after: &Ulid) -> Vec<Arc<Envelope>> {
    match t.iter().position(|e| &e.id == after) {
        Some(i) => t[i + 1..].to_vec(),
        None => Vec::new(),
    }
}

/// What `turn::policy`'s rate cap counts in a group's log, asked of a transcript in
/// one consistent read: the bot messages since the last human one within
/// `window_ms` of `now_ms` among the last `limit` messages, and how many of the bots
/// `ahead` still owe an answer to `trigger` ([`answers_due`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateCount<'a> {
    /// How many of the log's last messages the bot messages are counted among.
    pub(crate) limit: usize,
    /// Unix milliseconds now (virtual in the simulator).
    pub(crate) now_ms: u64,
    /// How far back a bot message still counts.
    pub(crate) window_ms: u64,
    /// The message whose answers may still be due.
    pub(crate) trigger: &'a Ulid,
    /// The bots whose claims on `trigger` go first (none: nothing is due).
    pub(crate) ahead: &'a [String],
}

impl RateCount<'_> {
    /// The two counts over `log` (oldest first), read in place: a slice's or the
    /// node's transcript's messages, whatever holds them.
    pub(crate) fn over<'e, I>(&self, log: I) -> (usize, usize)
    where
        I: DoubleEndedIterator<Item = &'e Arc<Envelope>> + ExactSizeIterator + Clone,
    {
        let start = log.len().saturating_sub(self.limit);
        (
            recent_bot_messages(log.clone().skip(start), self.now_ms, self.window_ms),
            answers_due(log, self.trigger, self.ahead),
        )
    }
}

/// Counts bot messages in `recent` (oldest first) after the last human message and
/// no older than `window_ms` before `now_ms`. A bot's status ([`Kind::Status`]) is
/// not conversation: it is skipped, neither counted nor ending the run.
pub(crate) fn recent_bot_messages<'a>(
    recent: impl DoubleEndedIterator<Item = &'a std::sync::Arc<Envelope>>,
    now_ms: u64,
    window_ms: u64,
) -> usize {
    recent
        .rev()
        .filter(|e| e.kind != Kind::Status)
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
            !recent.clone().rev().any(|e| {
                e.kind == Kind::Message
                    && e.reply_to.as_ref() == Some(trigger)
                    && e.author.name == bot.as_str()
            })
        })
        .count()
}
