//! The node's side of a long turn's status message ([`crate::turn::status`]): posted to
//! the platform once and recorded once as a [`Kind::Status`] envelope (the peers get
//! it, so a platform copy of it is known as status there too), then edited in place —
//! on the platform with its own call ([`crate::platform::ChatPlatform::edit`]), on the
//! page through the `status` event. Every edit is counted in
//! `botmesh_status_edits_total{bot,platform,outcome}`; a refused one is logged and
//! leaves the last text. When the turn ends, the status's final version is recorded
//! as a status that `replaces` it (sent to the peers, never posted):
//! [`latest_versions`] folds it onto the status for `GET /v1/transcript`, so a
//! reloaded page shows how the turn went.
//!
//! [`Kind::Status`]: crate::wire::envelope::Kind::Status

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::app::node::{Node, OnlyIfPosted, PublishError};
use crate::platform::EditError;
use crate::telemetry::events::Event;
use crate::turn::status::{Posted, StatusPort};
use crate::wire::envelope::Envelope;

/// `messages` as people are shown them: each status with the text of its latest
/// recorded version (an envelope that [`Envelope::replaces`] it), and the versions
/// themselves left out (one whose status is out of view too).
pub(crate) fn latest_versions(messages: Vec<Arc<Envelope>>) -> Vec<Arc<Envelope>> {
    if !messages.iter().any(|e| e.replaces.is_some()) {
        return messages;
    }
    // Only its own bot's version replaces a status.
    let authors: std::collections::HashMap<ulid::Ulid, &crate::wire::envelope::Author> =
        messages.iter().map(|e| (e.id, &e.author)).collect();
    let latest: std::collections::HashMap<ulid::Ulid, &Arc<Envelope>> = messages
        .iter()
        .filter_map(|e| {
            let of = e.replaces?;
            (authors.get(&of) == Some(&&e.author)).then_some((of, e))
        })
        .collect();
    messages
        .iter()
        .filter(|e| e.replaces.is_none())
        .map(|e| match latest.get(&e.id) {
            Some(v) => {
                let mut shown = (**e).clone();
                shown.text = v.text.clone();
                Arc::new(shown)
            }
            _ => e.clone(),
        })
        .collect()
}

/// The node as a turn's status sees it: an owned handle (the status outlives a turn
/// dropped by `/stop`), used only for posting, recording and editing a status.
pub(crate) struct NodeStatus(pub(crate) Arc<Node>);

impl StatusPort for NodeStatus {
    fn post(&self, mut env: Envelope) -> BoxFuture<'static, Option<Posted>> {
        let node = self.0.clone();
        Box::pin(async move {
            let bot = node.cfg.bot().name.clone();
            env.sent_at = crate::wire::envelope::now_millis();
            let (group, id) = (env.group.clone(), env.id);
            // Published as the bot's messages are, but a status the platform refused
            // is not recorded: the turn goes on without one.
            match node.publish_own(env, "self", OnlyIfPosted, &|_| {}).await {
                // The page's own (local) is edited through its events; a platform's
                // only if it edits.
                Ok(published) => Some(Posted {
                    group,
                    id,
                    editable: !published.on_platform || node.platform.edits(),
                    platform_msg_id: published.platform_msg_id,
                }),
                Err(PublishError::NotPosted(e)) => {
                    // Logged by the adapter too.
                    tracing::warn!(bot, group, error = %e, "the status message could not be posted: none is shown");
                    None
                }
                Err(PublishError::Transcript(e)) => {
                    tracing::error!(bot, group, error = %e, "the status message was refused or could not be recorded: none is shown");
                    None
                }
            }
        })
    }

    fn edit(&self, posted: &Posted, text: String) -> BoxFuture<'static, bool> {
        let (node, posted) = (self.0.clone(), posted.clone());
        Box::pin(async move {
            let bot = node.cfg.bot().name.clone();
            let platform = node.platform.name();
            let done = match &posted.platform_msg_id {
                Some(id) => node.platform.edit(&posted.group, id, &text).await,
                // Only the page's own (local) has no platform id: a status whose
                // platform post failed is never handed out.
                None => Ok::<(), EditError>(()),
            };
            match done {
                Ok(()) => {
                    node.metrics.status_edit(&bot, platform, "edited");
                    tracing::debug!(bot, group = %posted.group, id = %posted.id, text, "status message edited");
                    node.events.publish(Event::Status {
                        group: posted.group.clone(),
                        id: posted.id.to_string(),
                        bot,
                        text,
                    });
                    true
                }
                Err(e) => {
                    node.metrics.status_edit(&bot, platform, e.outcome());
                    tracing::warn!(bot, platform, group = %posted.group, id = %posted.id, error = %e, "could not edit the status message: its last text stays");
                    false
                }
            }
        })
    }

    fn record_end(
        &self,
        status: &Envelope,
        text: String,
        turn_end: Option<String>,
    ) -> BoxFuture<'static, ()> {
        let node = self.0.clone();
        let mut end = status.clone();
        end.replaces = Some(status.id);
        Box::pin(async move {
            let bot = node.cfg.bot().name.clone();
            end.id = ulid::Ulid::new();
            end.sent_at = crate::wire::envelope::now_millis();
            end.platform_msg_id = None;
            end.text = text;
            end.turn_end = turn_end;
            let outbound = !crate::wire::envelope::is_direct_group(&end.group);
            let (id, of, group) = (end.id, end.replaces, end.group.clone());
            match node.record_inner(end, "self", Vec::new(), outbound).await {
                Ok(_) => {
                    tracing::info!(bot, group, %id, replaces = ?of, "the status's final version recorded")
                }
                Err(e) => {
                    tracing::error!(bot, group, error = %e, "the status's final version could not be recorded: the transcript keeps its first text")
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::envelope::{Author, Kind};

    #[test]
    fn a_status_reads_as_its_latest_version_which_is_not_shown_itself() {
        let said = |author: Author, text: &str| {
            Envelope::message(ulid::Ulid::new(), 1, "g", "Coder", author, text)
        };
        let asked = Arc::new(said(Author::human("alice"), "@Coder go"));
        let mut status = said(Author::bot("Coder"), "Coder is working (8s)");
        status.kind = Kind::Status;
        let status = Arc::new(status);
        let version = |text: &str| {
            let mut v = (*status).clone();
            v.id = ulid::Ulid::new();
            v.replaces = Some(status.id);
            v.text = text.into();
            Arc::new(v)
        };
        let answer = Arc::new(said(Author::bot("Coder"), "the answer"));
        // Another bot's "version" of Coder's status is no version of it.
        let mut forged = (*version("Ada says so")).clone();
        forged.author = Author::bot("Ada");
        let shown = latest_versions(vec![
            asked.clone(),
            status.clone(),
            version("Coder is working (11s): cargo test"),
            version("Coder: done in 20s"),
            Arc::new(forged),
            answer.clone(),
        ]);
        let texts: Vec<&str> = shown.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts, ["@Coder go", "Coder: done in 20s", "the answer"]);
        assert_eq!(shown[1].id, status.id);
        assert_eq!(shown[1].kind, Kind::Status);
        // A version whose status is out of view is left out too.
        let shown = latest_versions(vec![version("Coder: done in 20s"), answer.clone()]);
        assert_eq!(shown.len(), 1);
    }
}
