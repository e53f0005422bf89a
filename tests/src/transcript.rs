//! What the tests read in a transcript: its rows shown for an assertion message, the
//! bots' chat messages, and the check that no platform message was recorded twice.
//!
//! Exists because every platform's end-to-end test reads transcripts these ways.

use botmesh::wire::envelope::Envelope;

/// A transcript as (author, depth, text, platform message id) rows, for assertion
/// messages.
///
/// Exists because every platform's end-to-end test prints transcripts this way when an
/// assertion fails.
pub fn show(t: &[Envelope]) -> Vec<(String, u32, String, Option<String>)> {
    t.iter()
        .map(|e| {
            (
                e.author.name.clone(),
                e.depth,
                e.text.clone(),
                e.platform_msg_id.clone(),
            )
        })
        .collect()
}

/// Who wrote `e`, as (name, kind): what a test checks of an author in one assertion.
pub fn author(e: &Envelope) -> (&str, botmesh::wire::envelope::AuthorKind) {
    (e.author.name.as_str(), e.author.kind)
}

/// The bots' chat messages of a transcript, in order (not their status messages,
/// which a slow turn posts: tests/tests/status_messages.rs).
pub fn bot_msgs(t: &[Envelope]) -> Vec<&Envelope> {
    t.iter()
        .filter(|e| {
            e.author.kind == botmesh::wire::envelope::AuthorKind::Bot
                && e.kind == botmesh::wire::envelope::Kind::Message
        })
        .collect()
}

/// Every entry of a transcript a bot wrote, in order: its chat messages and its status
/// messages alike.
pub fn bot_authored(t: &[Envelope]) -> Vec<&Envelope> {
    t.iter()
        .filter(|e| e.author.kind == botmesh::wire::envelope::AuthorKind::Bot)
        .collect()
}

/// Asserts that no platform message id stands twice in `t` (an entry's ids are
/// space-separated: a message posted in parts); `what` names such a message in the
/// failure ("node 0: a QQ message").
#[track_caller]
pub fn assert_each_platform_msg_once(t: &[Envelope], what: &str) {
    let mut ids: Vec<&str> = t
        .iter()
        .filter_map(|e| e.platform_msg_id.as_deref())
        .flat_map(|p| p.split(' '))
        .collect();
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "{what} recorded twice: {:#?}", show(t));
}
