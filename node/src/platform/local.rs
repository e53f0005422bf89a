//! `local`: the mesh is the chat. People post through the page or `POST /v1/messages`
//! and the node broadcasts their messages as human envelopes; nothing is posted
//! anywhere else.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::platform::registry::Abilities;
use crate::platform::AdapterContext;
use crate::platform::{ChatPlatform, Declared, PostError, Visibility};
use crate::wire::envelope::Envelope;

/// Nobody sees anything but the mesh: every node carries its people's messages.
pub(crate) const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: false,
    bots_see_bots: false,
};

/// Posts nowhere: nothing to edit, no typing signal.
pub(crate) const ABILITIES: Abilities = Abilities::POSTS_ONLY;

/// The local platform in the registry: it has no table (people's ids are their
/// names), and its adapter is stateless.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: crate::config::Platform::LOCAL,
        visibility: VISIBILITY,
        abilities: ABILITIES,
        check: |cx| match cx.table {
            None => Ok(()),
            Some(_) => Err(cx.problem("", "local takes no table: a local bot needs no ids")),
        },
        member_ids: crate::platform::registry::no_member_ids,
        build: |_| Ok(Arc::new(Local)),
    };

/// The local platform (it has no state: the node's API is its inbound side).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Local;

impl ChatPlatform for Local {
    /// Nothing is posted: people and bots meet on the mesh itself.
    fn declared(&self) -> Declared<'_> {
        Declared::silent(&ADAPTER)
    }

    fn post<'a>(&'a self, _env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(async { Err(PostError("the local platform posts nowhere".into())) })
    }

    fn start(self: Arc<Self>, _ingest: AdapterContext) -> Option<BoxFuture<'static, ()>> {
        None
    }
}
