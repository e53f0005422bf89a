//! WeCom (企业微信) smart robots over their long connection: callbacks in, streamed
//! answers and proactive sends out, on one WebSocket (docs/wecom.md).
//!
//! In a group a smart robot receives only the messages that @ it, and never another
//! robot's ([`VISIBILITY`]). So the node that receives a person's message records it
//! and carries it to its peers as a human envelope named by WeCom's `msgid` (as for
//! DingTalk): every colleague records it once, whichever robots it reached.
//!
//! - [`settings`] — `[bots.wecom]`, its checks and the Secret (part of the config
//!   layer).
//! - [`frames`] — the long connection's frames, error codes and limits.
//! - [`conn`] — the session: login, heartbeats, requests matched to acks by req_id,
//!   `disconnected_event`, drops, reconnects.
//! - [`inbound`] — message callbacks to arrivals, and the callbacks remembered for
//!   answers.
//! - [`outbound`] — a streamed answer on the callback, else a proactive send; parts
//!   by bytes; retries; the per-chat pace.
//!
//! # Start
//!
//! A refused login (853000: a wrong Bot ID or Secret) or a `disconnected_event`
//! (another client logged in as the robot) stops the adapter with the reason in
//! `/healthz`; it never reconnects then. Otherwise the connection runs until the node
//! stops.
//!
//! # Groups
//!
//! `wecom.chat_id` is `[mesh].group`; any other group chat is the group named by its
//! chatid, and an answer to it goes back there.

pub mod conn;
pub mod frames;
pub mod inbound;
pub mod outbound;
pub mod settings;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;

use crate::config::pacing::Window;
use crate::config::NodeConfig;
use crate::platform::kit::in_order::InOrder;
use crate::platform::kit::inbound::Inbound;
use crate::platform::kit::pacer::ChatPacer;
use crate::platform::kit::stopped::Stopped;
use crate::platform::registry::Abilities;
use crate::platform::AdapterContext;
use crate::platform::{ChatPlatform, Declared, PostError, Visibility};
use crate::turn::mention::MentionMatcher;
use crate::wire::envelope::Envelope;

use conn::Link;
use inbound::Replies;
use outbound::SENDS_PER_MINUTE;
pub use settings::{WecomSettings, WECOM};

/// WeCom in the registry.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: WECOM,
        visibility: VISIBILITY,
        abilities: ABILITIES,
        check: settings::check,
        member_ids: crate::platform::registry::no_member_ids,
        build: |cfg| Ok(Arc::new(Wecom::from_config(cfg)?)),
    };

/// A person's message reaches only the robots it @-mentions; robots never see each
/// other's messages.
pub const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: false,
    bots_see_bots: false,
};

/// A proactive send cannot be edited (a streamed answer is the callback's own), and
/// robots have no typing signal.
pub(crate) const ABILITIES: Abilities = Abilities::POSTS_ONLY;

/// A WeCom robot's platform state.
pub struct Wecom {
    /// The connection's adapter end.
    pub link: Link,
    /// The long connection's URL.
    ws_url: String,
    /// The robot's Bot ID.
    bot_id: String,
    /// The robot's Secret (only ever written into the login frame).
    secret: String,
    /// The time between pings.
    heartbeat: Duration,
    /// This bot's name in the mesh.
    me: String,
    /// The group chat that is `[mesh].group`, if set.
    chat_id: Option<String>,
    /// `[mesh].group`.
    mesh_group: String,
    /// The kit's one inbound path, as this adapter uses it (people only: a robot
    /// never receives another robot's message).
    inbound: Inbound,
    /// Finds `@Name` of the roster in text, and tells a person called like a bot apart.
    matcher: MentionMatcher,
    /// The callbacks received, for answers on their req_id.
    replies: Mutex<Replies>,
    /// Paces sends per chat ([`outbound::SENDS_PER_MINUTE`]).
    pacer: ChatPacer<Window>,
    /// The inbound handle, once the node has started the adapter.
    ingest: OnceLock<AdapterContext>,
    /// Why WeCom stopped for this node, for `/healthz`.
    stopped: Stopped,
}

impl std::fmt::Debug for Wecom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wecom")
            .field("bot", &self.me)
            .field("bot_id", &self.bot_id)
            .field("ws_url", &self.ws_url)
            .finish_non_exhaustive()
    }
}

impl ChatPlatform for Wecom {
    fn declared(&self) -> Declared<'_> {
        Declared::posting(&ADAPTER, &self.me, Some(&self.stopped))
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(self.post_envelope(env))
    }

    fn start(self: Arc<Self>, ingest: AdapterContext) -> Option<BoxFuture<'static, ()>> {
        let _ = self.ingest.set(ingest.clone());
        Some(Box::pin(async move { self.run(ingest).await }))
    }

    fn health(&self) -> Option<serde_json::Value> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.link.state;
        Some(serde_json::json!({"wecom": {
            "connected": s.connected.load(Relaxed),
            "sessions": s.sessions.load(Relaxed),
            "pings": s.pings.load(Relaxed),
            "pongs": s.pongs.load(Relaxed),
            "acked": s.acked.load(Relaxed),
            "stopped": self.stopped.reason(),
        }}))
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("wecom_replies", self.replies.lock().len()),
            ("wecom_chats", self.pacer.len()),
        ]
    }
}

impl Wecom {
    /// The WeCom side of `cfg`'s bot (an error when its platform is not wecom).
    pub fn from_config(cfg: &NodeConfig) -> anyhow::Result<Wecom> {
        let (bot, s) = crate::platform::own_table::<WecomSettings>(cfg, WECOM)?;
        let secret = settings::secret(cfg)?;
        Ok(Wecom {
            link: Link::default(),
            ws_url: s.ws_url(),
            bot_id: s.bot_id.clone().unwrap_or_default().trim().to_string(),
            secret,
            heartbeat: s.heartbeat_interval(),
            me: bot.name.clone(),
            chat_id: s
                .chat_id
                .as_deref()
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string),
            mesh_group: cfg.mesh().group.clone(),
            inbound: Inbound {
                platform: "wecom",
                me: bot.name.clone(),
                max_depth: cfg.mesh().max_depth,
                // Robots never receive each other's messages: no copy ever waits.
                grace: Duration::ZERO,
            },
            matcher: MentionMatcher::new(&crate::turn::roster(&cfg.settings.bots)),
            replies: Mutex::new(Replies::default()),
            pacer: ChatPacer::<Window>::new(SENDS_PER_MINUTE, Duration::from_secs(60)),
            ingest: OnceLock::new(),
            stopped: Stopped::default(),
        })
    }

    /// The mesh group a chat's messages belong to.
    pub fn group_for(&self, chatid: &str) -> String {
        if self.chat_id.as_deref() == Some(chatid) {
            self.mesh_group.clone()
        } else {
            chatid.to_string()
        }
    }

    /// The chat a mesh group's messages go to (`None`: `[mesh].group` without
    /// `wecom.chat_id`).
    pub fn chatid_for(&self, group: &str) -> Option<String> {
        if group == self.mesh_group {
            self.chat_id.clone()
        } else {
            Some(group.to_string())
        }
    }

    /// The adapter's life: sessions until the node stops (or one ends fatally).
    async fn run(self: Arc<Self>, ingest: AdapterContext) {
        let stop = ingest.accepting.clone();
        let (me, ing) = (self.clone(), ingest.clone());
        let events = InOrder::spawn(move |(session, frame)| {
            let (me, ing) = (me.clone(), ing.clone());
            async move { me.on_frame(&ing, session, frame).await }
        });
        let session = conn::Session {
            url: &self.ws_url,
            bot_id: &self.bot_id,
            secret: &self.secret,
            heartbeat: self.heartbeat,
            callbacks: events.sender(),
            state: &self.link.state,
            stop: &stop,
        };
        if let Some(why) = conn::run(&self.link, session).await {
            self.stopped.stop(&self.me, "wecom", &why);
        }
        events.finish().await;
    }
}

#[cfg(test)]
mod tests;
