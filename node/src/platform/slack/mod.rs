//! Slack: Socket Mode in, `chat.postMessage` with real `<@U…>` mentions out
//! (docs/slack.md).
//!
//! - [`settings`] — `[bots.slack]`, its checks and the two tokens (part of the config
//!   layer).
//! - [`api`] — the Web API: auth.test, apps.connections.open, chat.postMessage,
//!   users.info; how each answer drives the kit's retry loop (429 `Retry-After`).
//! - [`socket`] — the Socket Mode session: hello, acks before anything else,
//!   `disconnect`, drops, reconnects.
//! - [`inbound`] — events to arrivals: redeliveries once, people by display name,
//!   colleagues' copies once with the bridge copy, mentions and Slack's markup.
//! - [`outbound`] — escaping, mentions of colleagues, threads, parts, pacing.
//!
//! # Start
//!
//! `auth.test` with the bot token must name `slack.user_id`: a refused token or
//! another user stops the adapter, saying what to fix (`/healthz` shows it). Then
//! Socket Mode runs until the node stops, or until Slack refuses the app-level token
//! or disables the link.
//!
//! # Groups
//!
//! `slack.channel_id` is `[mesh].group`; any other channel the app is in is the group
//! named by its id, and a reply to it goes back there.

pub mod api;
pub mod inbound;
pub mod outbound;
pub mod settings;
pub mod socket;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use futures_util::future::BoxFuture;
use parking_lot::Mutex;

use crate::config::pacing::TokenBucket;
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

use api::{ApiError, WebApi};
use inbound::{Recent, Seen};
pub use settings::{SlackSecrets, SlackSettings, SLACK, SLACK_API_BASE_URL};
use socket::SocketState;

/// Slack in the registry.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: SLACK,
        visibility: VISIBILITY,
        abilities: ABILITIES,
        check: settings::check,
        member_ids: crate::platform::registry::no_member_ids,
        build: |cfg| Ok(Arc::new(Slack::from_config(cfg)?)),
    };

/// Slack shows every message of a channel to every app in it, apps' messages included.
pub const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: true,
    bots_see_bots: true,
};

/// Slack edits a post (`chat.update`); an app has no typing signal.
pub(crate) const ABILITIES: Abilities = Abilities::EDITS;

/// Threads remembered (message `ts` → its thread's `ts`).
pub const THREAD_MEMORY: usize = 10_000;
/// Posts a second to one channel (Slack allows about one, short bursts aside).
pub const POSTS_PER_SECOND: f64 = 1.0;

/// A Slack bot's platform state.
pub struct Slack {
    /// The Web API client (both tokens).
    pub api: WebApi,
    /// This bot's name in the mesh.
    me: String,
    /// This bot's Slack user id (its own messages are ignored).
    user_id: String,
    /// This bot's bot id (`B…`), from auth.test: its messages carry it too.
    bot_id: Mutex<Option<String>>,
    /// The channel that is `[mesh].group`.
    channel_id: String,
    /// `[mesh].group`.
    mesh_group: String,
    /// The kit's one inbound path, as this adapter uses it.
    inbound: Inbound,
    /// User id → bot name (this bot and the colleagues with a `[bots.slack].user_id`).
    bots_by_user_id: HashMap<String, String>,
    /// Colleague → user id, for `<@U…>` in posts.
    peer_user_ids: HashMap<String, String>,
    /// Finds `@Name` of the roster in outgoing text.
    matcher: MentionMatcher,
    /// Event ids and message keys handled (redeliveries, app_mention + message).
    seen: Mutex<Seen>,
    /// People's display names (`users.info`), by user id.
    names: Mutex<Recent<String, String>>,
    /// A message's thread, by its `ts`.
    threads: Mutex<Recent<String, String>>,
    /// Paces posts per channel.
    pacer: ChatPacer<TokenBucket>,
    /// The inbound handle, once the node has started the adapter.
    ingest: OnceLock<AdapterContext>,
    /// The socket's state, for `/healthz`.
    socket: Arc<SocketState>,
    /// Why Slack stopped for this node, for `/healthz`.
    stopped: Stopped,
}

impl std::fmt::Debug for Slack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slack")
            .field("bot", &self.me)
            .field("user_id", &self.user_id)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl ChatPlatform for Slack {
    fn declared(&self) -> Declared<'_> {
        Declared::posting(&ADAPTER, &self.me, Some(&self.stopped))
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(self.post_envelope(env))
    }

    fn edit<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), crate::platform::EditError>> {
        Box::pin(self.edit_message(group, platform_msg_id, text))
    }

    fn start(self: Arc<Self>, ingest: AdapterContext) -> Option<BoxFuture<'static, ()>> {
        let _ = self.ingest.set(ingest.clone());
        Some(Box::pin(async move { self.run(ingest).await }))
    }

    fn health(&self) -> Option<serde_json::Value> {
        use std::sync::atomic::Ordering::Relaxed;
        Some(serde_json::json!({"slack": {
            "connected": self.socket.connected.load(Relaxed),
            "sessions": self.socket.sessions.load(Relaxed),
            "acked": self.socket.acked.load(Relaxed),
            "stopped": self.stopped.reason(),
        }}))
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("slack_seen", self.seen.lock().len()),
            ("slack_names", self.names.lock().len()),
            ("slack_threads", self.threads.lock().len()),
            ("slack_channels", self.pacer.len()),
        ]
    }
}

impl Slack {
    /// The Slack side of `cfg`'s bot (an error when its platform is not slack).
    pub fn from_config(cfg: &NodeConfig) -> anyhow::Result<Slack> {
        let (bot, s) = crate::platform::own_table::<SlackSettings>(cfg, SLACK)?;
        let secrets = SlackSecrets::of(cfg)?;
        let user_id = s.user_id.clone().unwrap_or_default().trim().to_string();
        let mut bots_by_user_id = HashMap::from([(user_id.clone(), bot.name.clone())]);
        let mut peer_user_ids = HashMap::new();
        for p in cfg.peers() {
            if let Some(id) = p.table::<SlackSettings>(SLACK).and_then(|s| s.user_id) {
                peer_user_ids.insert(p.name.clone(), id.trim().to_string());
                bots_by_user_id.insert(id.trim().to_string(), p.name.clone());
            }
        }
        crate::platform::kit::mention::log_unmentionable(
            cfg,
            &peer_user_ids,
            "slack user id ([bots.slack].user_id)",
            "slack",
        );
        Ok(Slack {
            api: WebApi::new(
                &s.api_base_url(),
                &secrets.bot_token,
                &secrets.app_token,
                api::RETRY,
            )?,
            me: bot.name.clone(),
            user_id,
            bot_id: Mutex::new(None),
            channel_id: s.channel_id.clone().unwrap_or_default().trim().to_string(),
            mesh_group: cfg.mesh().group.clone(),
            inbound: Inbound {
                platform: "slack",
                me: bot.name.clone(),
                max_depth: cfg.mesh().max_depth,
                grace: inbound::BRIDGE_GRACE,
            },
            bots_by_user_id,
            peer_user_ids,
            matcher: MentionMatcher::new(&crate::turn::roster(&cfg.settings.bots)),
            seen: Mutex::new(Recent::new(inbound::SEEN_MEMORY)),
            names: Mutex::new(Recent::new(inbound::NAME_MEMORY)),
            threads: Mutex::new(Recent::new(THREAD_MEMORY)),
            pacer: ChatPacer::<TokenBucket>::new(POSTS_PER_SECOND),
            ingest: OnceLock::new(),
            socket: Arc::new(SocketState::default()),
            stopped: Stopped::default(),
        })
    }

    /// The group a channel's messages belong to.
    pub fn group_for_channel(&self, channel: &str) -> String {
        if channel == self.channel_id {
            self.mesh_group.clone()
        } else {
            channel.to_string()
        }
    }

    /// The channel a group's messages go to.
    pub fn channel_for_group(&self, group: &str) -> Option<String> {
        if group == self.mesh_group {
            Some(self.channel_id.clone())
        } else if settings::is_slack_id(group, settings::CHANNEL_ID_KINDS) {
            Some(group.to_string())
        } else {
            None
        }
    }

    /// The adapter's life: identity check, then Socket Mode until the node stops (or
    /// Slack refuses the app or its link).
    async fn run(self: Arc<Self>, ingest: AdapterContext) {
        let stop = ingest.accepting.clone();
        let who = tokio::select! {
            _ = stop.cancelled() => return,
            who = self.api.auth_test() => who,
        };
        match who {
            Ok(a) if a.user_id == self.user_id => {
                tracing::info!(bot = %self.me, user = %a.user, user_id = %a.user_id, bot_id = ?a.bot_id, team = %a.team, "slack identity confirmed");
                *self.bot_id.lock() = a.bot_id;
            }
            Ok(a) => {
                self.stopped.stop(&self.me, "slack", &format!(
                    "slack.user_id in peers.toml is {} but the bot token belongs to {} ({}, auth.test): this bot would misread its own messages and mentions of it; set slack.user_id to {}",
                    self.user_id, a.user_id, a.user, a.user_id
                ));
                return;
            }
            Err(e @ ApiError::Auth { .. }) => {
                self.stopped.stop(&self.me, "slack", &format!(
                    "slack refused the bot token ({e}): set slack.bot_token_env to the app's current Bot User OAuth Token (xoxb-…, app settings → OAuth & Permissions)"
                ));
                return;
            }
            Err(e) => {
                tracing::warn!(bot = %self.me, error = %e, "could not check the slack bot user (auth.test); continuing");
            }
        }
        let (me, ing) = (self.clone(), ingest.clone());
        let events = InOrder::spawn(move |d| {
            let (me, ing) = (me.clone(), ing.clone());
            async move { me.on_delivery(&ing, d).await }
        });
        let sender = events.sender().clone();
        if let Some(why) = socket::run(&self.api, sender, self.socket.clone(), stop).await {
            self.stopped.stop(&self.me, "slack", &why);
        }
        events.finish().await;
    }
}

#[cfg(test)]
mod tests;
