//! Discord: the gateway in, `POST /channels/{id}/messages` with real `<@id>` mentions
//! out (docs/discord.md).
//!
//! - [`gateway`] — the v10 gateway session: heartbeats, resume, close codes.
//! - [`rest`] — `GET /users/@me`, `GET /gateway/bot`, posting; rate limits; splitting.
//! - [`inbound`] — MESSAGE_CREATE to arrivals: names, mentions, colleagues' copies once.
//! - [`outbound`] — pings for colleagues, `allowed_mentions`, replies, parts, nonces.
//!
//! # Start
//!
//! `GET /users/@me` is compared with `discord.user_id` (a mismatch is logged: mentions
//! of this bot would be missed; a rejected token stops the adapter with that error),
//! the gateway URL comes from `GET /gateway/bot` (or `discord.gateway_url`), and the
//! gateway session runs until the node stops.
//!
//! # Inbound: MESSAGE_CREATE
//!
//! Messages in guild channels become transcript entries; the configured channel is
//! `[mesh].group`, any other channel the bot reads is the group named by its id.
//! Direct messages and system messages (joins, pins) are ignored.
//!
//! - A person's message: a human envelope (depth 0, `platform_msg_id` = the message
//!   id) under their display name (server nickname, else global name, else username),
//!   recorded and never broadcast (every bot reads Discord itself). `<@id>` / `<@!id>`
//!   of a mesh bot becomes `@Name`; of anyone else `<at user_id="id">Name</at>`, a tag
//!   that names no bot even when the person is called like one; a role mention
//!   (`<@&id>`) becomes `@everyone`, so that it, `@everyone` and `@here` ask every bot.
//! - A colleague's message arrives twice, on Discord and over the bridge, whose copy
//!   carries depth and reply_to and the Discord id as `platform_msg_id`. If the bridge
//!   copy is already recorded, the Discord copy is dropped; otherwise it waits up to
//!   [`BRIDGE_GRACE`] for it and, failing that, is recorded as context nobody answers
//!   (depth = max_depth). Either order ends with one entry.
//! - This bot's own messages are ignored; other bots and webhooks are context.
//! - MESSAGE_UPDATE and MESSAGE_DELETE are logged: a message is judged once.
//!
//! # Outbound
//!
//! `@Colleague` becomes `<@id>`; `allowed_mentions` lets exactly the colleagues named
//! and the author of the message answered be pinged (never `@everyone` or roles);
//! `message_reference` points at the message answered; text over 2,000 characters
//! goes in parts cut at paragraph, line or sentence boundaries, and the envelope's
//! `platform_msg_id` lists every part's id (so colleagues recognise each part).

pub mod gateway;
pub mod inbound;
pub mod outbound;
pub mod rest;
pub mod settings;

pub use settings::{is_snowflake, DiscordSecrets, DiscordSettings, DISCORD, DISCORD_API_BASE_URL};

/// Discord in the registry.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: DISCORD,
        visibility: VISIBILITY,
        abilities: ABILITIES,
        check: settings::check,
        member_ids: crate::platform::registry::no_member_ids,
        build: |cfg| Ok(Arc::new(Discord::from_config(cfg)?)),
    };

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use std::time::Duration;

use ulid::Ulid;

use crate::config::NodeConfig;
use crate::platform::kit::in_order::InOrder;
use crate::platform::kit::inbound::Inbound;
use crate::platform::kit::stopped::Stopped;
use crate::platform::registry::Abilities;
use crate::platform::AdapterContext;
use crate::platform::{ChatPlatform, Declared, PostError, Visibility};
use crate::turn::mention::MentionMatcher;
use crate::wire::envelope::Envelope;
use futures_util::future::BoxFuture;

use gateway::{Connector, Dispatch, Gateway, WsConnector};
use inbound::Authors;
pub use inbound::{Member, MessageCreate, MessageUser};
pub use outbound::PostFailure;
use rest::{RestClient, RestError};

/// Discord shows every message of a channel to every bot in it, bots' included.
pub const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: true,
    bots_see_bots: true,
};

/// Discord edits a post (its message PATCH) and shows typing for about 10 s after
/// each signal.
pub(crate) const ABILITIES: Abilities = Abilities::edits_and_typing_every(TYPING_EVERY);

/// How long a Discord copy of a colleague's message waits for its bridge copy.
pub const BRIDGE_GRACE: Duration = Duration::from_secs(10);
/// Authors of recent messages remembered (to ping the person answered).
pub const AUTHOR_MEMORY: usize = 10_000;
/// Discord's epoch (2015-01-01) in unix milliseconds: a snowflake's top 42 bits
/// count milliseconds from it.
pub const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;

/// When a snowflake was made, unix milliseconds.
pub fn snowflake_millis(id: &str) -> Option<u64> {
    id.parse::<u64>().ok().map(|v| (v >> 22) + DISCORD_EPOCH_MS)
}

/// The envelope id of a Discord message: the same on every node of the mesh, so that
/// claims, acknowledgements and answers of the bots that each read it from Discord
/// name the same trigger. Time part: the snowflake's; random part: 80 bits of
/// SHA-256 of the message id (snowflakes are unique across Discord).
pub fn envelope_id(message_id: &str) -> Ulid {
    let at = snowflake_millis(message_id).unwrap_or_else(crate::wire::envelope::now_millis);
    crate::wire::envelope::platform_message_id("discord", message_id, at)
}

/// How often the typing indicator is sent again while the bot works: Discord shows it
/// for about 10 s after each `POST /channels/{id}/typing`, so every 8 s keeps it on
/// without a gap.
pub const TYPING_EVERY: std::time::Duration = std::time::Duration::from_secs(8);

/// A discord bot's platform state.
pub struct Discord {
    /// The REST client.
    pub rest: RestClient,
    /// The bot token, for IDENTIFY and RESUME.
    token: String,
    /// This bot's name in the mesh.
    me: String,
    /// This bot's Discord user id (its own messages are ignored).
    user_id: String,
    /// The channel that is `[mesh].group`.
    channel_id: String,
    /// `[mesh].group`.
    mesh_group: String,
    /// The kit's one inbound path, as this adapter uses it.
    inbound: Inbound,
    /// `discord.gateway_url`, used instead of `GET /gateway/bot`.
    gateway_url: Option<String>,
    /// User id → bot name (this bot and the colleagues).
    bots_by_user_id: HashMap<String, String>,
    /// Colleague → user id.
    peer_user_ids: HashMap<String, String>,
    /// Finds `@Name` of the roster in outgoing text.
    matcher: MentionMatcher,
    /// Who wrote the people's messages seen lately (to ping the person answered).
    authors: Mutex<Authors>,
    /// Opens gateway sockets (in-memory ones in tests).
    connector: Arc<dyn Connector>,
    /// The inbound handle, once the node has started the adapter.
    ingest: OnceLock<AdapterContext>,
    /// Whether the gateway session is up.
    connected: Arc<std::sync::atomic::AtomicBool>,
    /// Why Discord stopped for this node, for `/healthz`.
    stopped: Stopped,
}

impl std::fmt::Debug for Discord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discord")
            .field("bot", &self.me)
            .field("user_id", &self.user_id)
            .field("rest", &self.rest)
            .finish_non_exhaustive()
    }
}

impl ChatPlatform for Discord {
    fn declared(&self) -> Declared<'_> {
        Declared::posting(&ADAPTER, &self.me, Some(&self.stopped))
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(PostError::of(Discord::post(self, env)))
    }

    fn edit<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), crate::platform::EditError>> {
        Box::pin(Discord::edit(self, group, platform_msg_id, text))
    }

    fn typing<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<(), PostError>> {
        Box::pin(async move {
            let channel = self
                .channel_for_group(group)
                .ok_or_else(|| PostError(PostFailure::NoChannel(group.to_string()).to_string()))?;
            self.rest
                .trigger_typing(&channel)
                .await
                .map_err(|e| PostError(e.to_string()))
        })
    }

    fn start(self: Arc<Self>, ingest: AdapterContext) -> Option<BoxFuture<'static, ()>> {
        let _ = self.ingest.set(ingest.clone());
        Some(Box::pin(async move { self.run(ingest).await }))
    }

    fn health(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({"discord": {
            "connected": self.connected.load(std::sync::atomic::Ordering::Relaxed),
            "stopped": self.stopped.reason(),
        }}))
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![("discord_authors", self.authors.lock().map.len())]
    }
}

impl Discord {
    /// The Discord side of `cfg`'s bot (an error when its platform is not discord).
    pub fn from_config(cfg: &NodeConfig) -> anyhow::Result<Discord> {
        Self::with_connector(cfg, Arc::new(WsConnector))
    }

    /// [`Discord::from_config`] with another socket (tests).
    pub fn with_connector(
        cfg: &NodeConfig,
        connector: Arc<dyn Connector>,
    ) -> anyhow::Result<Discord> {
        let (bot, d) = crate::platform::own_table::<DiscordSettings>(cfg, DISCORD)?;
        let token = DiscordSecrets::of(cfg).token;
        let user_id = d.user_id.clone().unwrap_or_default().trim().to_string();
        let mut peer_user_ids = HashMap::new();
        let mut bots_by_user_id = HashMap::new();
        bots_by_user_id.insert(user_id.clone(), bot.name.clone());
        for p in cfg.peers() {
            let id = d.peer_user_ids.get(&p.name).cloned().or_else(|| {
                p.table::<DiscordSettings>(DISCORD)
                    .and_then(|pd| pd.user_id)
            });
            if let Some(id) = id {
                peer_user_ids.insert(p.name.clone(), id.trim().to_string());
                bots_by_user_id.insert(id.trim().to_string(), p.name.clone());
            }
        }
        crate::platform::kit::mention::log_unmentionable(
            cfg,
            &peer_user_ids,
            "discord user id",
            "discord",
        );
        Ok(Discord {
            rest: RestClient::new(&d.api_base_url(), &token, rest::RetryPolicy::default())?,
            token,
            me: bot.name.clone(),
            user_id,
            channel_id: d.channel_id.clone().unwrap_or_default().trim().to_string(),
            mesh_group: cfg.mesh().group.clone(),
            inbound: Inbound {
                platform: "discord",
                me: bot.name.clone(),
                max_depth: cfg.mesh().max_depth,
                grace: BRIDGE_GRACE,
            },
            gateway_url: d.gateway_url.clone(),
            bots_by_user_id,
            peer_user_ids,
            matcher: MentionMatcher::new(&crate::turn::roster(&cfg.settings.bots)),
            authors: Mutex::new(Authors::default()),
            connector,
            ingest: OnceLock::new(),
            connected: Default::default(),
            stopped: Stopped::default(),
        })
    }

    /// The group a channel's messages belong to.
    pub fn group_for_channel(&self, channel_id: &str) -> String {
        if channel_id == self.channel_id {
            self.mesh_group.clone()
        } else {
            channel_id.to_string()
        }
    }

    /// The channel a group's messages go to.
    pub fn channel_for_group(&self, group: &str) -> Option<String> {
        if group == self.mesh_group {
            Some(self.channel_id.clone())
        } else if is_snowflake(group) {
            Some(group.to_string())
        } else {
            None
        }
    }

    /// The adapter's life: identity check, gateway URL, then the session until the
    /// node stops (or a close code that retrying cannot fix).
    async fn run(self: Arc<Self>, ingest: AdapterContext) {
        let cancel = ingest.accepting.clone();
        match self.rest.current_user().await {
            Ok(u) if u.id == self.user_id => {
                tracing::info!(bot = %self.me, user = %u.username, user_id = %u.id, "discord identity confirmed");
            }
            Ok(u) => {
                tracing::error!(bot = %self.me, configured = %self.user_id, actual = %u.id, user = %u.username, "discord.user_id in peers.toml differs from the token's bot user (GET /users/@me): its own messages and mentions of it would be misread; fix discord.user_id");
            }
            Err(RestError::Unauthorized) => {
                let why = "discord rejected the bot token (GET /users/@me answered 401): set discord.token_env to the bot's current token";
                self.stopped.stop(&self.me, "discord", why);
                return;
            }
            Err(e) => {
                tracing::warn!(bot = %self.me, error = %e, "could not read the discord bot user (continuing)");
            }
        }
        let url = match &self.gateway_url {
            Some(u) => u.clone(),
            None => {
                let mut attempt = 0u32;
                loop {
                    match self.rest.gateway_bot().await {
                        Ok(g) => break g.url,
                        Err(RestError::Unauthorized) => {
                            let why = "discord rejected the bot token (GET /gateway/bot answered 401): set discord.token_env to the bot's current token";
                            self.stopped.stop(&self.me, "discord", why);
                            return;
                        }
                        Err(e) => {
                            attempt += 1;
                            let wait = crate::config::pacing::Backoff::new(
                                Duration::from_secs(1),
                                gateway::MAX_BACKOFF,
                            )
                            .delay(attempt, crate::config::pacing::Jitter::Scale(0.8..=1.0));
                            tracing::warn!(bot = %self.me, error = %e, wait_s = wait.as_secs(), "could not get the discord gateway URL; retrying");
                            tokio::select! {
                                _ = cancel.cancelled() => return,
                                _ = tokio::time::sleep(wait) => {}
                            }
                        }
                    }
                }
            }
        };
        let mut gw = Gateway::new(self.connector.clone(), url, self.token.clone());
        gw.connected = self.connected.clone();
        let (me, ing) = (self.clone(), ingest.clone());
        let events = InOrder::spawn(move |d: Dispatch| {
            let (me, ing) = (me.clone(), ing.clone());
            async move { me.on_dispatch(&ing, d).await }
        });
        if let Err(e) = gw.run(events.sender().clone(), cancel).await {
            self.stopped.stop(&self.me, "discord", &e.to_string());
        }
        events.finish().await;
    }
}

#[cfg(test)]
mod tests;
