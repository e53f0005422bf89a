//! The node's side of a long turn's status message ([`crate::turn::status`]): posted to
//! the platform once and recorded once as a [`Kind::Status`] envelope (the peers get
//! it, so a platform copy of it is known as status there too), then edited in place —
//! on the platform with its own call ([`crate::platform::ChatPlatform::edit`]), on the
//! page through the `status` event. Every edit is counted in
//! `botmesh_status_edits_total{bot,platform,outcome}`; a refused one is logged and
//! leaves the last text.
//!
//! [`Kind::Status`]: crate::wire::envelope::Kind::Status

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::app::node::Node;
use crate::platform::EditError;
use crate::telemetry::events::Event;
use crate::turn::status::{Posted, StatusPort};
use crate::wire::envelope::Envelope;

/// The node as a turn's status sees it: an owned handle (the status outlives a turn
/// dropped by `/stop`), used only for posting, recording and editing a status.
pub(crate) struct NodeStatus(pub(crate) Arc<Node>);

impl StatusPort for NodeStatus {
    fn post(&self, mut env: Envelope) -> BoxFuture<'static, Option<Posted>> {
        let node = self.0.clone();
        Box::pin(async move {
            let bot = node.cfg.bot().name.clone();
            env.sent_at = crate::wire::envelope::now_millis();
            if let Err(e) = node.transcripts.admits(&env.group) {
                tracing::warn!(bot, group = %env.group, error = %e, "no status message: the group is refused");
                return None;
            }
            let posts = node.platform.should_post(&env);
            if posts {
                match node.platform.post(&env).await {
                    Ok(id) => env.platform_msg_id = Some(id),
                    Err(e) => {
                        // Logged by the adapter too; the turn goes on without a status.
                        tracing::warn!(bot, group = %env.group, error = %e, "the status message could not be posted: none is shown");
                        return None;
                    }
                }
            }
            // The page's own (local) is edited through its events; a platform's only
            // if it edits.
            let editable = !posts || node.platform.edits();
            let posted = Posted {
                group: env.group.clone(),
                id: env.id,
                platform_msg_id: env.platform_msg_id.clone(),
                editable,
            };
            let outbound = !crate::wire::envelope::is_direct_group(&env.group);
            match node.record_inner(env, "self", Vec::new(), outbound).await {
                Ok(_) => Some(posted),
                Err(e) => {
                    tracing::error!(bot, group = %posted.group, error = %e, "the status message could not be recorded; it is not edited");
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
}
