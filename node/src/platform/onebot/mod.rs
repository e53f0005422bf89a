//! QQ groups through OneBot v11 (NapCat, LLOneBot, Lagrange): the implementation's
//! forward WebSocket in and out (docs/qq.md).
//!
//! - [`settings`] — `[bots.onebot]`, its checks and the access token (part of the
//!   config layer).
//! - [`conn`] — the WebSocket session: the token, `get_login_info`, heartbeats,
//!   actions matched to answers by `echo`, drops, reconnects.
//! - [`segments`] — message segments in the array and CQ-string forms, escaping.
//! - [`inbound`] — group messages to arrivals: mentions by at-segment and by name,
//!   people by card or nickname, colleagues' copies once with the bridge copy, own
//!   echoes.
//! - [`outbound`] — `send_group_msg` with reply and at segments, paced per group.
//!
//! # Start
//!
//! The account the implementation is logged in as (`get_login_info`) must be
//! `onebot.self_id`: another account, or a refused token, stops the adapter saying
//! what to fix (`/healthz` shows it). Then the connection runs until the node stops.
//!
//! # Groups
//!
//! `onebot.group_id` is `[mesh].group`; any other group the account is in is the
//! group named by its number, and a reply to it goes back there.

pub mod conn;
pub mod inbound;
pub mod outbound;
pub mod segments;
pub mod settings;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

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
pub use settings::{OnebotSettings, ONEBOT};

/// OneBot in the registry.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: ONEBOT,
        visibility: VISIBILITY,
        abilities: ABILITIES,
        check: settings::check,
        member_ids: crate::platform::registry::no_member_ids,
        build: |cfg| Ok(Arc::new(Onebot::from_config(cfg)?)),
    };

/// QQ shows every group message to every member, other bot accounts' included.
pub const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: true,
    bots_see_bots: true,
};

/// A QQ message cannot be edited once sent, and OneBot has no typing signal.
pub(crate) const ABILITIES: Abilities = Abilities::POSTS_ONLY;

/// A QQ bot's platform state.
pub struct Onebot {
    /// The connection's adapter end.
    pub link: Link,
    /// The forward WebSocket URL.
    ws_url: String,
    /// The access token.
    token: String,
    /// This bot's name in the mesh.
    me: String,
    /// This bot's QQ number.
    self_id: String,
    /// The QQ group that is `[mesh].group`.
    group_id: String,
    /// `[mesh].group`.
    mesh_group: String,
    /// The kit's one inbound path, as this adapter uses it.
    inbound: Inbound,
    /// QQ number → bot name (this bot and the colleagues with a `[bots.onebot].self_id`).
    bots_by_qq: HashMap<String, String>,
    /// Colleague → QQ number, for at-segments in sends.
    peer_qq: HashMap<String, String>,
    /// Finds `@Name` of the roster in text.
    matcher: MentionMatcher,
    /// People's names (card, else nickname) by (group, QQ number).
    names: Mutex<HashMap<(String, String), String>>,
    /// Paces sends per group: one per `send_interval_ms`, no bursts.
    pacer: ChatPacer<Window>,
    /// The inbound handle, once the node has started the adapter.
    ingest: OnceLock<AdapterContext>,
    /// Why QQ stopped for this node, for `/healthz`.
    stopped: Stopped,
}

impl std::fmt::Debug for Onebot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Onebot")
            .field("bot", &self.me)
            .field("self_id", &self.self_id)
            .field("ws_url", &self.ws_url)
            .finish_non_exhaustive()
    }
}

impl ChatPlatform for Onebot {
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
        Some(serde_json::json!({"onebot": {
            "connected": s.connected.load(Relaxed),
            "sessions": s.sessions.load(Relaxed),
            "heartbeats": s.heartbeats.load(Relaxed),
            "answered": s.answered.load(Relaxed),
            "stopped": self.stopped.reason(),
        }}))
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("onebot_names", self.names.lock().len()),
            ("onebot_groups", self.pacer.len()),
        ]
    }
}

impl Onebot {
    /// The QQ side of `cfg`'s bot (an error when its platform is not onebot).
    pub fn from_config(cfg: &NodeConfig) -> anyhow::Result<Onebot> {
        let (bot, s) = crate::platform::own_table::<OnebotSettings>(cfg, ONEBOT)?;
        let token = settings::access_token(cfg)?;
        let self_id = s.self_id.clone().unwrap_or_default().trim().to_string();
        let mut bots_by_qq = HashMap::from([(self_id.clone(), bot.name.clone())]);
        let mut peer_qq = HashMap::new();
        for p in cfg.peers() {
            if let Some(id) = p.table::<OnebotSettings>(ONEBOT).and_then(|s| s.self_id) {
                peer_qq.insert(p.name.clone(), id.trim().to_string());
                bots_by_qq.insert(id.trim().to_string(), p.name.clone());
            }
        }
        Ok(Onebot {
            link: Link::default(),
            ws_url: s.ws_url.clone().unwrap_or_default().trim().to_string(),
            token,
            me: bot.name.clone(),
            self_id,
            group_id: s.group_id.clone().unwrap_or_default().trim().to_string(),
            mesh_group: cfg.mesh().group.clone(),
            inbound: Inbound {
                platform: "onebot",
                me: bot.name.clone(),
                max_depth: cfg.mesh().max_depth,
                grace: inbound::BRIDGE_GRACE,
            },
            bots_by_qq,
            peer_qq,
            matcher: MentionMatcher::new(&crate::turn::roster(&cfg.settings.bots)),
            names: Mutex::new(HashMap::new()),
            pacer: ChatPacer::<Window>::new(1, s.send_interval()),
            ingest: OnceLock::new(),
            stopped: Stopped::default(),
        })
    }

    /// The mesh group a QQ group's messages belong to.
    pub fn group_for(&self, group_id: &str) -> String {
        if group_id == self.group_id {
            self.mesh_group.clone()
        } else {
            group_id.to_string()
        }
    }

    /// The QQ group a mesh group's messages go to.
    pub fn group_id_for(&self, group: &str) -> Option<String> {
        if group == self.mesh_group {
            Some(self.group_id.clone())
        } else if settings::is_qq_number(group) {
            Some(group.to_string())
        } else {
            None
        }
    }

    /// The adapter's life: sessions until the node stops (or one ends fatally).
    async fn run(self: Arc<Self>, ingest: AdapterContext) {
        let stop = ingest.accepting.clone();
        let (me, ing) = (self.clone(), ingest.clone());
        let events = InOrder::spawn(move |event| {
            let (me, ing) = (me.clone(), ing.clone());
            async move { me.on_event(&ing, event).await }
        });
        let session = conn::Session {
            url: &self.ws_url,
            token: &self.token,
            self_id: &self.self_id,
            events: events.sender(),
            state: &self.link.state,
            stop: &stop,
        };
        if let Some(why) = conn::run(&self.link, session).await {
            self.stopped.stop(&self.me, "qq", &why);
        }
        events.finish().await;
    }
}

#[cfg(test)]
mod tests;
