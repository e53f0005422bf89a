//! Discord: the gateway in, `POST /channels/{id}/messages` with real `<@id>` mentions
//! out (docs/discord.md).
//!
//! - [`gateway`] — the v10 gateway session: heartbeats, resume, close codes.
//! - [`rest`] — `GET /users/@me`, `GET /gateway/bot`, posting; rate limits; splitting.
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
pub mod rest;
pub mod settings;

pub use settings::{is_snowflake, DiscordSecrets, DiscordSettings, DISCORD, DISCORD_API_BASE_URL};

/// Discord in the registry.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: DISCORD,
        visibility: VISIBILITY,
        check: settings::check,
        build: |cfg| Ok(Arc::new(Discord::from_config(cfg)?)),
    };

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::mpsc;
use ulid::Ulid;

use crate::config::NodeConfig;
use crate::platform::kit::inbound::{Inbound, PlatformMessage, Sender};
use crate::platform::AdapterContext;
use crate::platform::{ChatPlatform, PostError, Visibility};
use crate::store::transcript::platform_ids;
use crate::turn::mention::MentionMatcher;
use crate::wire::envelope::{AuthorKind, Envelope};
use futures_util::future::BoxFuture;

use gateway::{Connector, Dispatch, Gateway, WsConnector};
use rest::{AllowedMentions, CreateMessage, MessageReference, RestClient, RestError, User};

/// Discord shows every message of a channel to every bot in it, bots' included.
pub const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: true,
    bots_see_bots: true,
};

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

/// A server member's guild-specific fields (MESSAGE_CREATE's `member`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Member {
    /// The server nickname.
    #[serde(default)]
    pub nick: Option<String>,
}

/// A user in a message (author or mention): the user, with the member fields Discord
/// adds in `mentions[]`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MessageUser {
    /// The user's own fields.
    #[serde(flatten)]
    pub user: User,
    /// Guild member fields (in `mentions[]`).
    #[serde(default)]
    pub member: Option<Member>,
}

impl MessageUser {
    /// Nickname, else global name, else username.
    pub fn display_name(&self, member: Option<&Member>) -> String {
        member
            .or(self.member.as_ref())
            .and_then(|m| m.nick.as_deref())
            .or(self.user.global_name.as_deref())
            .filter(|n| !n.trim().is_empty())
            .unwrap_or(&self.user.username)
            .to_string()
    }
}

/// The fields of a MESSAGE_CREATE the mesh uses (Discord's message object plus the
/// gateway's `guild_id` and `member`).
#[derive(Debug, Clone, Deserialize)]
pub struct MessageCreate {
    /// Message id.
    pub id: String,
    /// Channel.
    pub channel_id: String,
    /// Absent in direct messages.
    #[serde(default)]
    pub guild_id: Option<String>,
    /// Who wrote it.
    pub author: MessageUser,
    /// The author's member fields.
    #[serde(default)]
    pub member: Option<Member>,
    /// Text (empty without the MESSAGE_CONTENT intent).
    #[serde(default)]
    pub content: String,
    /// Users mentioned, with their member fields.
    #[serde(default)]
    pub mentions: Vec<MessageUser>,
    /// Roles mentioned.
    #[serde(default)]
    pub mention_roles: Vec<String>,
    /// `@everyone` / `@here` used.
    #[serde(default)]
    pub mention_everyone: bool,
    /// Message type: 0 default, 19 reply; the rest are system messages.
    #[serde(default, rename = "type")]
    pub kind: u8,
    /// Set for messages posted by a webhook.
    #[serde(default)]
    pub webhook_id: Option<String>,
}

/// A bounded map of message id → author id, oldest forgotten first.
#[derive(Default)]
struct Authors {
    /// Message id → its author's user id.
    map: HashMap<String, String>,
    /// Message ids, oldest first, to forget the oldest beyond [`AUTHOR_MEMORY`].
    order: VecDeque<String>,
}

impl Authors {
    fn insert(&mut self, msg: &str, author: &str) {
        if self
            .map
            .insert(msg.to_string(), author.to_string())
            .is_none()
        {
            self.order.push_back(msg.to_string());
        }
        while self.order.len() > AUTHOR_MEMORY {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
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
    stopped: Mutex<Option<String>>,
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
    fn name(&self) -> &'static str {
        "discord"
    }

    fn visibility(&self) -> Visibility {
        VISIBILITY
    }

    fn should_post(&self, env: &Envelope) -> bool {
        crate::platform::own_unposted(env, &self.me)
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(async move {
            Discord::post(self, env)
                .await
                .map_err(|e| PostError(e.to_string()))
        })
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

    fn typing_every(&self) -> Option<std::time::Duration> {
        Some(TYPING_EVERY)
    }

    fn start(self: Arc<Self>, ingest: AdapterContext) -> Option<BoxFuture<'static, ()>> {
        let _ = self.ingest.set(ingest.clone());
        Some(Box::pin(async move { self.run(ingest).await }))
    }

    fn health(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({"discord": {
            "connected": self.connected.load(std::sync::atomic::Ordering::Relaxed),
            "stopped": *self.stopped.lock(),
        }}))
    }

    fn stopped(&self) -> Option<String> {
        self.stopped.lock().clone()
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![("discord_authors", self.authors.lock().map.len())]
    }
}

/// Why a post failed.
#[derive(Debug, thiserror::Error)]
pub enum PostFailure {
    /// The group is neither the mesh group nor a channel id.
    #[error("group {0:?} maps to no discord channel (discord.channel_id is [mesh].group)")]
    NoChannel(String),
    /// Discord refused or could not be reached.
    #[error(transparent)]
    Rest(#[from] RestError),
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
        let missing: Vec<&str> = cfg
            .peers()
            .map(|p| p.name.as_str())
            .filter(|p| !peer_user_ids.contains_key(*p))
            .collect();
        if !missing.is_empty() {
            tracing::info!(bot = %bot.name, peers = ?missing, "no discord user id for these colleagues: @mentions of them stay plain text on discord");
        }
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
            stopped: Mutex::new(None),
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
                tracing::error!(bot = %self.me, "{why}; discord is stopped for this node");
                self.stop(why);
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
                            tracing::error!(bot = %self.me, "{why}; discord is stopped for this node");
                            self.stop(why);
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
        let (tx, mut rx) = mpsc::unbounded_channel::<Dispatch>();
        let me = self.clone();
        let ing = ingest.clone();
        let consumer = tokio::spawn(async move {
            while let Some(d) = rx.recv().await {
                me.on_dispatch(&ing, d).await;
            }
        });
        if let Err(e) = gw.run(tx, cancel).await {
            tracing::error!(bot = %self.me, error = %e, "discord is stopped for this node; the mesh goes on without it");
            self.stop(&e.to_string());
        }
        let _ = consumer.await;
    }

    fn stop(&self, why: &str) {
        *self.stopped.lock() = Some(why.to_string());
    }

    async fn on_dispatch(self: &Arc<Self>, ingest: &AdapterContext, d: Dispatch) {
        match d.t.as_str() {
            "READY" => {
                let guilds = d.d["guilds"].as_array().map_or(0, Vec::len);
                tracing::info!(bot = %self.me, user_id = %d.d["user"]["id"].as_str().unwrap_or(""), guilds, "discord session ready");
            }
            "MESSAGE_CREATE" => match MessageCreate::deserialize(&d.d) {
                Ok(m) => self.on_message(ingest, m).await,
                Err(e) => {
                    tracing::warn!(bot = %self.me, error = %e, "a MESSAGE_CREATE this build cannot read; ignoring it");
                }
            },
            "MESSAGE_UPDATE" => {
                tracing::info!(bot = %self.me, message_id = %d.d["id"].as_str().unwrap_or(""), channel_id = %d.d["channel_id"].as_str().unwrap_or(""), "discord message edited; the transcript keeps what was judged");
            }
            "MESSAGE_DELETE" => {
                tracing::info!(bot = %self.me, message_id = %d.d["id"].as_str().unwrap_or(""), channel_id = %d.d["channel_id"].as_str().unwrap_or(""), "discord message deleted; the transcript keeps it");
            }
            _ => {}
        }
    }

    /// The message's text as the mesh shows it (see the module docs).
    pub fn readable_text(&self, m: &MessageCreate) -> String {
        static RE: OnceLock<regex::Regex> = OnceLock::new();
        let re = RE.get_or_init(|| regex::Regex::new(r"<@([!&]?)(\d{1,20})>").expect("valid"));
        re.replace_all(&m.content, |c: &regex::Captures| {
            let (sigil, id) = (&c[1], &c[2]);
            if sigil == "&" {
                return "@everyone".to_string();
            }
            if let Some(bot) = self.bots_by_user_id.get(id) {
                return format!("@{bot}");
            }
            let name = m
                .mentions
                .iter()
                .find(|u| u.user.id == id)
                .map(|u| u.display_name(None))
                .unwrap_or_else(|| id.to_string());
            let name: String = name.chars().filter(|c| !matches!(c, '<' | '>')).collect();
            format!("<at user_id=\"{id}\">{name}</at>")
        })
        .into_owned()
    }

    /// Records one MESSAGE_CREATE (see the module docs).
    pub async fn on_message(self: &Arc<Self>, ingest: &AdapterContext, m: MessageCreate) {
        if m.guild_id.is_none() {
            tracing::info!(message_id = %m.id, "ignoring a discord direct message: botmesh bots talk in channels");
            return;
        }
        if !matches!(m.kind, 0 | 19) {
            return;
        }
        if m.author.user.id == self.user_id {
            return;
        }
        let mut text = self.readable_text(&m).trim().to_string();
        if text.is_empty() {
            tracing::info!(message_id = %m.id, "ignoring a discord message without text (attachments only, or the MESSAGE CONTENT intent is off)");
            return;
        }
        if m.mention_everyone && !crate::turn::policy::asks_everyone(&text) {
            text.push_str(" @everyone");
        }
        let group = self.group_for_channel(&m.channel_id);
        let sent_at = snowflake_millis(&m.id).unwrap_or_else(crate::wire::envelope::now_millis);
        let is_bot = m.author.user.bot == Some(true) || m.webhook_id.is_some();
        let shown = m.author.display_name(m.member.as_ref());
        let sender = if is_bot {
            Sender::Bot {
                colleague: self.bots_by_user_id.get(&m.author.user.id).cloned(),
                label: format!("bot:{shown}"),
            }
        } else {
            self.authors.lock().insert(&m.id, &m.author.user.id);
            Sender::Person {
                name: crate::platform::person_name(&self.matcher, DISCORD, &shown),
                ids: Some(m.author.user.id.clone()),
            }
        };
        let msg = PlatformMessage {
            group,
            platform_msg_id: m.id.clone(),
            sent_at,
            text,
            sender,
            mentions: Vec::new(),
        };
        if is_bot {
            // A colleague's copy may wait for its bridge copy: not on the gateway's
            // reading task.
            let inbound = self.inbound.clone();
            let ing = ingest.clone();
            ingest.tasks.spawn(async move {
                inbound.receive(&ing, msg).await;
            });
        } else {
            self.inbound.receive(ingest, msg).await;
        }
    }

    /// The text to post: `@Colleague` becomes `<@id>`, and `<at user_id="id">` tags
    /// (people, as the transcript shows them) become `<@id>` too. Returns the text
    /// and the colleagues' ids it mentions.
    pub fn outgoing_text(&self, text: &str) -> (String, Vec<String>) {
        static AT: OnceLock<regex::Regex> = OnceLock::new();
        let at = AT.get_or_init(|| {
            regex::Regex::new(r#"<at user_id="(\d{1,20})">[^<]*</at>"#).expect("valid")
        });
        let pinged = std::cell::RefCell::new(Vec::new());
        let text = self.matcher.rewrite(text, |member| {
            let id = self
                .peer_user_ids
                .get(member)
                .filter(|_| member != self.me)?;
            let mut p = pinged.borrow_mut();
            if !p.contains(id) {
                p.push(id.clone());
            }
            Some(format!("<@{id}>"))
        });
        let pinged = pinged.into_inner();
        (at.replace_all(&text, "<@$1>").into_owned(), pinged)
    }

    /// Nonce of part `i` of envelope `id`: at most 25 characters, the same on a retry.
    pub fn nonce(id: &Ulid, i: usize) -> String {
        let s = id.to_string();
        format!("{}{:03}", &s[4..], i % 1000)
    }

    /// Posts the bot's own message; returns the ids of its parts, space-separated.
    pub async fn post(&self, env: &Envelope) -> Result<String, PostFailure> {
        let Some(channel) = self.channel_for_group(&env.group) else {
            let e = PostFailure::NoChannel(env.group.clone());
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not posted to discord; the mesh still gets it");
            return Err(e);
        };
        let (text, colleagues) = self.outgoing_text(&env.text);
        // The message answered: its Discord id and its author.
        let trigger = env
            .reply_to
            .and_then(|r| self.ingest.get()?.sink.message(&env.group, &r));
        let reference = trigger.as_ref().and_then(|t| {
            let first = platform_ids(t.platform_msg_id.as_deref()?)
                .next()?
                .to_string();
            Some(MessageReference {
                message_id: first,
                channel_id: channel.clone(),
                fail_if_not_exists: false,
            })
        });
        let answered: Option<String> = reference.as_ref().and_then(|r| {
            let t = trigger.as_ref()?;
            match t.author.kind {
                AuthorKind::Human => self.authors.lock().map.get(&r.message_id).cloned(),
                AuthorKind::Bot => self.peer_user_ids.get(&t.author.name).cloned(),
            }
        });
        let mut users: Vec<String> = colleagues;
        if let Some(a) = &answered {
            if !users.contains(a) {
                users.push(a.clone());
            }
        }
        let parts = rest::split_message(&text, rest::MAX_MESSAGE_CHARS);
        let mut ids = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let in_part: Vec<String> = users
                .iter()
                .filter(|u| part.contains(&format!("<@{u}>")) || Some(*u) == answered.as_ref())
                .cloned()
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            let mut in_part = in_part;
            in_part.sort();
            let msg = CreateMessage {
                content: part.clone(),
                allowed_mentions: AllowedMentions {
                    parse: Vec::new(),
                    users: in_part,
                    replied_user: i == 0 && answered.is_some(),
                },
                message_reference: reference.clone().filter(|_| i == 0),
                nonce: Self::nonce(&env.id, i),
                enforce_nonce: true,
            };
            match self.rest.create_message(&channel, &msg).await {
                Ok(id) => ids.push(id),
                Err(e) if ids.is_empty() => {
                    tracing::error!(bot = %self.me, id = %env.id, channel = %channel, error = %e, "could not post to discord; the mesh still gets the message");
                    return Err(e.into());
                }
                Err(e) => {
                    tracing::error!(bot = %self.me, id = %env.id, channel = %channel, part = i + 1, parts = parts.len(), error = %e, "could not post a later part to discord");
                    break;
                }
            }
        }
        if ids.is_empty() {
            return Err(PostFailure::Rest(RestError::Malformed(
                "empty message".into(),
            )));
        }
        let joined = ids.join(" ");
        tracing::info!(bot = %self.me, id = %env.id, message_id = %joined, channel = %channel, "posted to discord");
        Ok(joined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::kit::test_sink::{ingest, TestSink};
    use crate::wire::envelope::Author;
    use tokio::time::Instant;

    /// The shape docs/discord.md shows.
    const DOCS_CONFIG: &str = r#"
[mesh]
group = "team"
secret_env = "BOTMESH_SECRET"

[[bots]]
name = "Ada"
bridge = "127.0.0.1:7101"
api = "127.0.0.1:8101"
platform = "discord"

[bots.discord]
token_env = "ADA_DISCORD_TOKEN"
channel_id = "1200000000000000001"
user_id = "1300000000000000001"
[bots.discord.peer_user_ids]
Bix = "1300000000000000002"

[[bots]]
name = "Bix"
aliases = ["bixie"]
bridge = "127.0.0.1:7102"
api = "127.0.0.1:8102"
platform = "discord"
discord = { token_env = "BIX_DISCORD_TOKEN", channel_id = "1200000000000000001", user_id = "1300000000000000002" }

[[bots]]
name = "Loc"
bridge = "127.0.0.1:7103"
api = "127.0.0.1:8103"
"#;

    fn settings(text: &str) -> Result<crate::config::Settings, crate::config::ConfigError> {
        crate::config::Settings::from_toml(text, std::path::Path::new("peers.toml"))
            .and_then(|s| crate::platform::registry::check(&s).map(|()| s))
    }

    fn env() -> HashMap<String, String> {
        [
            ("BOTMESH_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("ADA_DISCORD_TOKEN", "ada-token-value"),
            ("BIX_DISCORD_TOKEN", "bix-token-value"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn ada() -> Discord {
        let cfg = NodeConfig::resolve(settings(DOCS_CONFIG).unwrap(), "Ada", None, &env()).unwrap();
        Discord::from_config(&cfg).unwrap()
    }

    #[test]
    fn the_documented_config_loads_and_resolves_its_token() {
        let s = settings(DOCS_CONFIG).unwrap();
        let d: DiscordSettings = s.bots[0].table(DISCORD).unwrap();
        assert_eq!(d.api_base_url(), DISCORD_API_BASE_URL);
        assert_eq!(d.peer_user_ids["Bix"], "1300000000000000002");
        let cfg = NodeConfig::resolve(s.clone(), "Ada", None, &env()).unwrap();
        assert_eq!(DiscordSecrets::of(&cfg).token, "ada-token-value");
        assert!(!format!("{cfg:?} {:?}", DiscordSecrets::of(&cfg)).contains("ada-token-value"));
        let mut no_token = env();
        no_token.remove("ADA_DISCORD_TOKEN");
        let e = NodeConfig::resolve(s.clone(), "Ada", None, &no_token).unwrap_err();
        assert_eq!(e.key, "bots[0].discord.token_env");
        let loc = NodeConfig::resolve(s, "Loc", None, &no_token).unwrap();
        assert!(
            loc.platform_secret("token_env").is_none(),
            "a local bot needs no discord token"
        );
        assert_eq!(
            crate::platform::visibility_of(DISCORD),
            Visibility {
                humans_reach_every_bot: true,
                bots_see_bots: true
            }
        );
    }

    #[test]
    fn discord_config_mistakes_name_their_key() {
        let cases = [
            (
                "token_env = \"ADA_DISCORD_TOKEN\"\n",
                "",
                "bots[0].discord.token_env",
            ),
            (
                "channel_id = \"1200000000000000001\"\nuser_id",
                "user_id",
                "bots[0].discord.channel_id",
            ),
            (
                "channel_id = \"1200000000000000001\"\nuser_id",
                "channel_id = \"#general\"\nuser_id",
                "bots[0].discord.channel_id",
            ),
            (
                "user_id = \"1300000000000000001\"\n",
                "",
                "bots[0].discord.user_id",
            ),
            (
                "user_id = \"1300000000000000001\"\n",
                "user_id = \"ada\"\n",
                "bots[0].discord.user_id",
            ),
            (
                "Bix = \"1300000000000000002\"",
                "Nobody = \"1\"",
                "bots[0].discord.peer_user_ids.Nobody",
            ),
            (
                "Bix = \"1300000000000000002\"",
                "Ada = \"1\"",
                "bots[0].discord.peer_user_ids.Ada",
            ),
            (
                "Bix = \"1300000000000000002\"",
                "Bix = \"<@1>\"",
                "bots[0].discord.peer_user_ids.Bix",
            ),
            (
                "Bix = \"1300000000000000002\"",
                "Bix = \"1300000000000000001\"",
                "bots[0].discord.peer_user_ids.Bix",
            ),
            (
                "token_env = \"ADA_DISCORD_TOKEN\"\n",
                "token_env = \"ADA_DISCORD_TOKEN\"\napi_base_url = \"discord.com/api\"\n",
                "bots[0].discord.api_base_url",
            ),
            (
                "token_env = \"ADA_DISCORD_TOKEN\"\n",
                "token_env = \"ADA_DISCORD_TOKEN\"\ngateway_url = \"http://127.0.0.1:9\"\n",
                "bots[0].discord.gateway_url",
            ),
            (
                "discord = { token_env = \"BIX_DISCORD_TOKEN\", channel_id = \"1200000000000000001\", user_id = \"1300000000000000002\" }\n",
                "",
                "bots[1].discord",
            ),
        ];
        for (from, to, key) in cases {
            assert!(DOCS_CONFIG.contains(from), "{from}");
            let e = settings(&DOCS_CONFIG.replacen(from, to, 1)).unwrap_err();
            assert_eq!(e.key, key, "{from:?} → {to:?}: {e}");
        }
        let e =
            settings(&DOCS_CONFIG.replace("token_env = \"ADA", "tokn_env = \"ADA")).unwrap_err();
        assert!(e.to_string().contains("unknown field `tokn_env`"), "{e}");
    }

    fn message(content: &str, mentions: serde_json::Value) -> MessageCreate {
        serde_json::from_value(serde_json::json!({
            "id": "1500000000000000001", "channel_id": "1200000000000000001",
            "guild_id": "1100000000000000001", "type": 0, "content": content,
            "author": {"id": "1400000000000000001", "username": "carol", "global_name": "Carol", "avatar": null},
            "member": {"nick": "Carol C", "roles": []},
            "mentions": mentions, "mention_roles": [], "mention_everyone": false,
        }))
        .unwrap()
    }

    #[test]
    fn mentions_become_roster_names_tags_for_people_and_everyone_for_roles() {
        let d = ada();
        let m = message(
            "<@1300000000000000001> <@!1300000000000000002> ask <@1400000000000000002> and <@1400000000000000003>, cc <@&1600000000000000001>",
            serde_json::json!([
                {"id": "1400000000000000002", "username": "ada_fan", "global_name": "Ada", "member": {"nick": null}},
                {"id": "1400000000000000003", "username": "eve", "global_name": null, "member": {"nick": "Eve <3"}},
            ]),
        );
        let text = d.readable_text(&m);
        assert_eq!(
            text,
            "@Ada @Bix ask <at user_id=\"1400000000000000002\">Ada</at> and <at user_id=\"1400000000000000003\">Eve 3</at>, cc @everyone"
        );
        assert_eq!(m.author.display_name(m.member.as_ref()), "Carol C");
        let matcher =
            MentionMatcher::new(&crate::turn::roster(&settings(DOCS_CONFIG).unwrap().bots));
        assert_eq!(
            matcher.mentioned(&text, &[]),
            vec!["Ada", "Bix"],
            "the person called Ada is nobody's mention"
        );
        assert!(
            crate::turn::policy::asks_everyone(&text),
            "a role mention asks everyone"
        );
        assert!(crate::turn::policy::asks_everyone(&d.readable_text(
            &message("@here anyone?", serde_json::json!([]))
        )));
    }

    #[test]
    fn outgoing_mentions_of_colleagues_become_pings() {
        let d = ada();
        let (text, pinged) = d.outgoing_text(
            "@bixie please review, @Ada is me, @Loc has no id, `@Bix` in code, thanks <at user_id=\"1400000000000000001\">Carol C</at>",
        );
        assert_eq!(
            text,
            "<@1300000000000000002> please review, @Ada is me, @Loc has no id, `@Bix` in code, thanks <@1400000000000000001>"
        );
        assert_eq!(pinged, vec!["1300000000000000002".to_string()]);
        assert_eq!(d.group_for_channel("1200000000000000001"), "team");
        assert_eq!(
            d.group_for_channel("1200000000000000009"),
            "1200000000000000009"
        );
        assert_eq!(
            d.channel_for_group("team").as_deref(),
            Some("1200000000000000001")
        );
        assert_eq!(
            d.channel_for_group("1200000000000000009").as_deref(),
            Some("1200000000000000009")
        );
        assert_eq!(d.channel_for_group("demo"), None);
        let own = Envelope::message(Ulid::new(), 1, "team", "Ada", Author::bot("Ada"), "hi");
        assert!(d.should_post(&own));
        let mut posted = own.clone();
        posted.platform_msg_id = Some("1".into());
        assert!(!d.should_post(&posted));
        assert!(!d.should_post(&Envelope::message(
            Ulid::new(),
            1,
            "team",
            "Ada",
            Author::human("x"),
            "hi"
        )));
    }

    /// A message by Bix (a colleague bot) on Discord, with id `id`.
    fn from_bix(id: &str) -> MessageCreate {
        serde_json::from_value(serde_json::json!({
            "id": id, "channel_id": "1200000000000000001", "guild_id": "1100000000000000001",
            "type": 0, "content": "<@1300000000000000001> done",
            "author": {"id": "1300000000000000002", "username": "bix", "global_name": null, "avatar": null, "bot": true},
            "mentions": [], "mention_roles": [], "mention_everyone": false,
        }))
        .unwrap()
    }

    fn bridge_copy(pid: &str) -> Envelope {
        let mut e = Envelope::message(
            Ulid::new(),
            1,
            "team",
            "Bix",
            Author::bot("Bix"),
            "@Ada done",
        );
        e.depth = 1;
        e.platform_msg_id = Some(pid.into());
        e
    }

    /// A colleague's message is recorded once, keeping the bridge copy (its depth),
    /// whether the bridge copy comes before the Discord copy, during its wait, or never
    /// (then the Discord copy is context at max_depth). Own messages are ignored; a
    /// person's message replayed after a RESUME is recorded once.
    #[tokio::test(start_paused = true)]
    async fn a_colleagues_message_is_recorded_once_in_either_order() {
        let d = Arc::new(ada());
        let sink = Arc::new(TestSink::default());
        let ing = ingest(sink.clone());
        // Bridge copy first.
        sink.add(bridge_copy("1500000000000000010"));
        d.on_message(&ing, from_bix("1500000000000000010")).await;
        ing.tasks.close();
        ing.tasks.wait().await;
        ing.tasks.reopen();
        assert_eq!(sink.all().len(), 1);
        // Discord copy first; the bridge copy comes 2 s later.
        d.on_message(&ing, from_bix("1500000000000000011")).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sink.all().len(), 1, "the Discord copy waits");
        sink.add(bridge_copy("1500000000000000011"));
        let told = Instant::now();
        ing.tasks.close();
        ing.tasks.wait().await;
        ing.tasks.reopen();
        assert_eq!(
            told.elapsed(),
            Duration::ZERO,
            "the wait ends when the bridge copy is recorded (told, not polled)"
        );
        let all = sink.all();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].depth, 1, "the bridge copy's depth");
        // No bridge copy at all: context nobody answers.
        let start = Instant::now();
        d.on_message(&ing, from_bix("1500000000000000012")).await;
        ing.tasks.close();
        ing.tasks.wait().await;
        ing.tasks.reopen();
        assert!(start.elapsed() >= BRIDGE_GRACE);
        let ctx = sink.all().pop().unwrap();
        assert_eq!(
            (
                ctx.author.name.as_str(),
                ctx.author.kind,
                ctx.depth,
                ctx.text.as_str()
            ),
            ("Bix", AuthorKind::Bot, 3, "@Ada done")
        );
        // Its own message: ignored.
        let mut own = from_bix("1500000000000000013");
        own.author.user.id = "1300000000000000001".into();
        d.on_message(&ing, own).await;
        ing.tasks.close();
        ing.tasks.wait().await;
        ing.tasks.reopen();
        assert_eq!(sink.all().len(), 3);
        // A person's message, twice (a replay): once, with the id every node derives.
        let m = message("hello <@1300000000000000001>", serde_json::json!([]));
        d.on_message(&ing, m.clone()).await;
        d.on_message(&ing, m).await;
        let all = sink.all();
        assert_eq!(all.len(), 4);
        let h = &all[3];
        assert_eq!(h.id, envelope_id("1500000000000000001"));
        assert_eq!(
            (h.author.name.as_str(), h.text.as_str(), h.root),
            ("Carol C", "hello @Ada", Some(h.id))
        );
        // Each one counted once, by what became of it.
        let text = ing.metrics.render();
        for (result, n) in [
            ("bridge_copy", 2),
            ("context", 1),
            ("recorded", 1),
            ("duplicate", 1),
        ] {
            let line = format!(
                "botmesh_platform_events_total{{platform=\"discord\",result=\"{result}\"}} {n}"
            );
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        // DMs and system messages are not the mesh's.
        let mut dm = message("psst", serde_json::json!([]));
        dm.id = "1500000000000000099".into();
        dm.guild_id = None;
        d.on_message(&ing, dm).await;
        let mut join = message("joined", serde_json::json!([]));
        join.id = "1500000000000000098".into();
        join.kind = 7;
        d.on_message(&ing, join).await;
        assert_eq!(sink.all().len(), 4);
    }

    #[test]
    fn snowflakes_carry_their_time() {
        // Discord's docs: 175928847299117063 was made at 2016-04-30 11:18:25.796 UTC.
        assert_eq!(
            snowflake_millis("175928847299117063"),
            Some(1_462_015_105_796)
        );
        assert_eq!(snowflake_millis("x"), None);
    }

    #[test]
    fn every_node_names_a_discord_message_alike() {
        let a = envelope_id("175928847299117063");
        assert_eq!(a, envelope_id("175928847299117063"));
        assert_ne!(a, envelope_id("175928847299117064"));
        assert_eq!(a.timestamp_ms(), 1_462_015_105_796);
    }

    #[test]
    fn nonces_fit_discords_limit_and_differ_per_part() {
        let id = Ulid::new();
        let a = Discord::nonce(&id, 0);
        assert!(a.len() <= 25);
        assert_ne!(a, Discord::nonce(&id, 1));
        assert_eq!(a, Discord::nonce(&id, 0));
    }
}
