//! Telegram: Bot API long polling (or a webhook) in, `sendMessage` in HTML parse mode
//! with real @mentions out (docs/telegram.md).
//!
//! - [`settings`] — `[bots.telegram]`, its validation and secrets (config layer).
//! - [`api`] — the Bot API client on the kit's retry loop: 429 `retry_after`.
//! - [`poll`] — the session on the kit's reconnect loop: identity, then `getUpdates`,
//!   offsets confirmed once recorded.
//! - [`inbound`] — `Update` → text: entities in UTF-16 units, mentions, media.
//! - [`outbound`] — escaping, mentions, the 4,096-unit split.
//! - [`webhook`] — webhook mode's deliveries, checked against the secret token.
//!
//! # Start
//!
//! `getMe` must name the bot `telegram.username` says (else the adapter stops with
//! that error: people's @handle of it would be misread); a rejected token stops it
//! too. Both show in `/healthz`. A bot whose privacy mode is on is warned about (it
//! would see only messages that mention it). Polling first deletes a webhook that is
//! set (`getWebhookInfo`, `deleteWebhook`: the two cannot run together), keeping the
//! updates waiting; webhook mode registers `telegram.webhook_url` with `setWebhook`.
//!
//! # Inbound
//!
//! Messages in groups become transcript entries through the kit's inbound path
//! ([`crate::platform::kit::inbound`]): `telegram.chat_id` is `[mesh].group`, any other
//! group the bot is in is the group named by its chat id. Private chats are ignored
//! (logged). A message is known to the mesh as `{chat_id}:{message_id}`
//! ([`platform_msg_id`]: message ids are unique within a chat only), and its envelope id
//! is derived from that, so every node names it alike.
//!
//! - A person's message: a human envelope (depth 0) under their name, recorded and
//!   never broadcast: every bot with privacy mode off reads the group itself.
//!   Mentions: see [`inbound::readable_text`].
//! - A bot's message reaches a bot only in bot-to-bot mode (opt-in in @BotFather, and
//!   the receiving bot an admin with privacy mode off). A colleague's then arrives
//!   twice, on Telegram and over the bridge, whose copy carries depth and reply_to and
//!   the same `platform_msg_id`: the kit keeps the bridge copy, waiting up to
//!   [`BRIDGE_GRACE`] for it (told by the transcript, not polled); with none, the
//!   Telegram copy is context nobody answers (depth = max_depth). Either order ends
//!   with one entry. This bot's own messages are ignored.
//!
//! # Outbound
//!
//! See [`outbound`]; the first part answers the message replied to
//! (`reply_parameters`), and the envelope's `platform_msg_id` lists every part's id.
//! Sends to one group are paced by the kit's pacer at Telegram's 20 a minute.

pub mod api;
pub mod inbound;
pub mod outbound;
pub(crate) mod poll;
pub mod settings;
pub(crate) mod webhook;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::RwLock;
use ulid::Ulid;

use crate::config::pacing::Window;
use crate::config::NodeConfig;
use crate::platform::kit::inbound::{Inbound, PlatformMessage, Received, Sender};
use crate::platform::kit::pacer::ChatPacer;
use crate::platform::kit::parts::{post_in_parts, PostTo};
use crate::platform::kit::reconnect::{Next, Reconnect, Reconnects};
use crate::platform::kit::stopped::Stopped;
use crate::platform::registry::Abilities;
use crate::platform::AdapterContext;
use crate::platform::{ChatPlatform, Declared, EditError, PostError, Visibility};
use crate::store::transcript::platform_ids;
use crate::turn::mention::MentionMatcher;
use crate::wire::envelope::Envelope;

use api::{ApiError, BotApi, ReplyParameters, SendMessage};
use inbound::{Handles, Message, Update};
pub use settings::{TelegramSecrets, TelegramSettings, TELEGRAM};

/// Every bot with privacy mode off (or an admin) sees every person's message in its
/// groups; bots see each other's only in bot-to-bot mode, which is opt-in, so the
/// mesh carries them.
pub const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: true,
    bots_see_bots: false,
};

/// Telegram edits a post (`editMessageText`) and shows typing for 5 s after each
/// `sendChatAction`.
pub(crate) const ABILITIES: Abilities = Abilities::edits_and_typing_every(TYPING_EVERY);

/// The Telegram adapter, as the registry lists it.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: TELEGRAM,
        visibility: VISIBILITY,
        abilities: ABILITIES,
        check: settings::check,
        member_ids: crate::platform::registry::no_member_ids,
        build: |cfg| Ok(Arc::new(Telegram::from_config(cfg)?)),
    };

/// How long a Telegram copy of a colleague's message waits for its bridge copy.
pub const BRIDGE_GRACE: Duration = Duration::from_secs(10);
/// How often the typing signal is sent again while a reply is written (Telegram
/// shows it for 5 s).
pub const TYPING_EVERY: Duration = Duration::from_secs(4);
/// Messages one bot may send to one group a minute (Telegram's limit).
pub const GROUP_SENDS_PER_MINUTE: usize = 20;

/// The mesh's id of a Telegram message, `{chat_id}:{message_id}` (message ids are
/// unique within a chat only): its `platform_msg_id`, on every node alike.
pub fn platform_msg_id(chat_id: i64, message_id: i64) -> String {
    format!("{chat_id}:{message_id}")
}

/// The envelope id of a Telegram message, as the kit's inbound path derives it: the
/// same on every node, so that claims and answers of the bots that each read it from
/// Telegram name the same trigger.
pub fn envelope_id(chat_id: i64, message_id: i64, sent_at_ms: u64) -> Ulid {
    crate::wire::envelope::platform_message_id(
        "telegram",
        &platform_msg_id(chat_id, message_id),
        sent_at_ms,
    )
}

/// Why a post failed.
#[derive(Debug, thiserror::Error)]
pub enum PostFailure {
    /// The group is neither the mesh group nor a chat id.
    #[error("group {0:?} maps to no telegram chat (telegram.chat_id is [mesh].group)")]
    NoChat(String),
    /// Telegram refused or could not be reached.
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// A telegram bot's platform state.
pub struct Telegram {
    /// The Bot API client.
    pub api: BotApi,
    /// This bot's name in the mesh.
    me: String,
    /// Its configured @handle, lower-cased.
    handle: String,
    /// The group that is `[mesh].group`.
    chat_id: i64,
    /// `[mesh].group`.
    mesh_group: String,
    /// The kit's inbound path (ids, colleague copies, the events metric).
    inbound: Inbound,
    /// Bots' @handles and this bot's user id (set by `getMe`).
    handles: RwLock<Handles>,
    /// Roster name → @handle, for outgoing mentions.
    handle_of: HashMap<String, String>,
    /// Finds `@Name` of the roster in text.
    matcher: MentionMatcher,
    /// Webhook mode's URL, when set.
    webhook_url: Option<String>,
    /// Webhook mode's secret token.
    secret_token: Option<String>,
    /// Telegram's per-group limit.
    pacer: ChatPacer<Window>,
    /// The inbound handle, once started.
    ingest: OnceLock<AdapterContext>,
    /// Whether the last long poll succeeded.
    polling: AtomicBool,
    /// The last update recorded (confirmed with the next poll).
    last_update: AtomicI64,
    /// Why Telegram stopped for this node, for `/healthz`.
    stopped: Stopped,
}

impl std::fmt::Debug for Telegram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telegram")
            .field("bot", &self.me)
            .field("handle", &self.handle)
            .field("chat_id", &self.chat_id)
            .finish_non_exhaustive()
    }
}

impl ChatPlatform for Telegram {
    fn declared(&self) -> Declared<'_> {
        Declared::posting(&ADAPTER, &self.me, Some(&self.stopped))
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(PostError::of(Telegram::post(self, env)))
    }

    fn edit<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), EditError>> {
        Box::pin(Telegram::edit(self, group, platform_msg_id, text))
    }

    fn typing<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<(), PostError>> {
        Box::pin(async move {
            let chat = self
                .chat_for_group(group)
                .ok_or_else(|| PostError(PostFailure::NoChat(group.to_string()).to_string()))?;
            self.api
                .send_typing(chat)
                .await
                .map(|_| ())
                .map_err(|e| PostError(e.to_string()))
        })
    }

    fn start(self: Arc<Self>, ingest: AdapterContext) -> Option<BoxFuture<'static, ()>> {
        let _ = self.ingest.set(ingest.clone());
        Some(Box::pin(async move { self.run(ingest).await }))
    }

    fn webhook_path(&self) -> Option<&'static str> {
        self.webhook_url.as_ref().map(|_| settings::WEBHOOK_PATH)
    }

    fn webhook(
        self: Arc<Self>,
        req: http::Request<hyper::body::Incoming>,
        remote: std::net::SocketAddr,
    ) -> BoxFuture<'static, http::Response<crate::ingress::server::Body>> {
        Box::pin(webhook::answer(self, req, remote))
    }

    fn health(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({"telegram": {
            "mode": if self.webhook_url.is_some() { "webhook" } else { "polling" },
            "polling": self.polling.load(Ordering::Relaxed),
            "last_update_id": self.last_update.load(Ordering::Relaxed),
            "stopped": self.stopped.reason(),
        }}))
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![("telegram_paced_chats", self.pacer.len())]
    }
}

impl Telegram {
    /// The Telegram side of `cfg`'s bot (an error when its platform is not telegram).
    pub fn from_config(cfg: &NodeConfig) -> anyhow::Result<Telegram> {
        let (bot, t) = crate::platform::own_table::<TelegramSettings>(cfg, TELEGRAM)?;
        let secrets = TelegramSecrets::of(cfg)?;
        let mut bots = HashMap::new();
        let mut handle_of = HashMap::new();
        for b in &cfg.settings.bots {
            let handle = b
                .table::<TelegramSettings>(TELEGRAM)
                .and_then(|t| t.handle());
            if let Some(h) = handle {
                bots.insert(h.clone(), b.name.clone());
                handle_of.insert(b.name.clone(), h);
            }
        }
        crate::platform::kit::mention::log_unmentionable(
            cfg,
            &handle_of,
            "telegram.username",
            "telegram",
        );
        Ok(Telegram {
            api: BotApi::new(&t.api_base_url(), &secrets.token, api::RETRY)?,
            me: bot.name.clone(),
            handle: t.handle().unwrap_or_default(),
            chat_id: t.chat().unwrap_or_default(),
            mesh_group: cfg.mesh().group.clone(),
            inbound: Inbound {
                platform: "telegram",
                me: bot.name.clone(),
                max_depth: cfg.mesh().max_depth,
                grace: BRIDGE_GRACE,
            },
            handles: RwLock::new(Handles { bots, me: None }),
            handle_of,
            matcher: MentionMatcher::new(&crate::turn::roster(&cfg.settings.bots)),
            webhook_url: t.webhook_url.clone(),
            secret_token: secrets.secret_token.clone(),
            pacer: ChatPacer::<Window>::new(GROUP_SENDS_PER_MINUTE, Duration::from_secs(60)),
            ingest: OnceLock::new(),
            polling: AtomicBool::new(false),
            last_update: AtomicI64::new(0),
            stopped: Stopped::default(),
        })
    }

    /// The group a chat's messages belong to.
    pub fn group_for_chat(&self, chat_id: i64) -> String {
        if chat_id == self.chat_id {
            self.mesh_group.clone()
        } else {
            chat_id.to_string()
        }
    }

    /// The chat a group's messages go to.
    pub fn chat_for_group(&self, group: &str) -> Option<i64> {
        if group == self.mesh_group {
            Some(self.chat_id)
        } else {
            group.parse().ok().filter(|c: &i64| *c < 0)
        }
    }

    /// Whether `getMe` confirmed the identity (this node's user id is known).
    fn identified(&self) -> bool {
        self.handles.read().me.is_some()
    }

    /// Takes `getMe`'s answer: the bot must be `telegram.username` (else why not, in
    /// words that say what to fix).
    fn identify(&self, me: api::User) -> Result<(), String> {
        let actual = me.username.clone().unwrap_or_default();
        if actual.to_ascii_lowercase() != self.handle {
            return Err(format!("telegram.username is {:?} but the token belongs to @{actual} (getMe): fix telegram.username (people's @{actual} would not reach this bot) or telegram.token_env", self.handle));
        }
        self.handles.write().me = Some((me.id, self.me.clone()));
        tracing::info!(bot = %self.me, user = %actual, user_id = me.id, "telegram identity confirmed");
        if me.can_read_all_group_messages == Some(false) {
            tracing::warn!(bot = %self.me, "telegram privacy mode is on for @{actual}: it sees only messages that mention it or answer it; in @BotFather: /setprivacy → Disable (then re-add it to the group), or make it an admin (docs/telegram.md)");
        }
        Ok(())
    }

    /// The adapter's life: sessions ([`poll::session`]) on the kit's reconnect loop
    /// until the node stops or a failure retrying cannot fix; then the last
    /// confirmation.
    async fn run(self: Arc<Self>, ingest: AdapterContext) {
        let mut reconnects = Reconnects::new(Reconnect {
            platform: "telegram",
            what: if self.webhook_url.is_some() {
                "webhook set-up"
            } else {
                "long polling"
            },
            schedule: &poll::schedule,
            asked_pause: Duration::ZERO,
        });
        let mut offset = None;
        loop {
            let ended = poll::session(&self, &ingest, &mut offset).await;
            match reconnects.after(ended, &ingest.accepting, |_| {}).await {
                Next::Again => continue,
                Next::Stop(Some(why)) => {
                    self.stopped.stop(&self.me, "telegram", &why);
                    break;
                }
                Next::Stop(None) => break,
            }
        }
        poll::confirm(&self, offset).await;
    }

    /// Handles one raw update; false when it could not be recorded (so it is not
    /// confirmed and comes again).
    pub(crate) async fn on_update(
        self: &Arc<Self>,
        ingest: &AdapterContext,
        raw: serde_json::Value,
    ) -> bool {
        let update: Update = match serde_json::from_value(raw) {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(bot = %self.me, error = %e, "a telegram update this build cannot read; ignoring it");
                return true;
            }
        };
        match update.message {
            Some(m) => self.on_message(ingest, m).await,
            None => {
                tracing::debug!(bot = %self.me, update_id = update.update_id, "a telegram update without a message; ignoring it");
                true
            }
        }
    }

    /// Records one message (see the module docs); false when recording failed.
    pub async fn on_message(self: &Arc<Self>, ingest: &AdapterContext, m: Message) -> bool {
        if let Some(to) = m.migrate_to_chat_id {
            tracing::error!(bot = %self.me, chat_id = m.chat.id, migrate_to_chat_id = to, "the telegram group became a supergroup: set telegram.chat_id to {to}");
            return true;
        }
        if !matches!(m.chat.kind.as_str(), "group" | "supergroup") {
            tracing::info!(bot = %self.me, chat_type = %m.chat.kind, "ignoring a telegram message outside groups: botmesh bots talk in groups");
            return true;
        }
        let Some(from) = m.from.clone() else {
            return true;
        };
        let my_id = self.handles.read().me.as_ref().map(|(id, _)| *id);
        if Some(from.id) == my_id {
            return true;
        }
        let text = {
            let handles = self.handles.read();
            let is_member = |w: &str| self.matcher.resolve(w).is_some();
            m.text_and_media(&handles, &is_member)
        };
        let sent_at = u64::try_from(m.date)
            .ok()
            .filter(|d| *d > 0)
            .map(|d| d * 1000)
            .unwrap_or_else(crate::wire::envelope::now_millis);
        // An anonymous admin posts as the group, through Telegram's GroupAnonymousBot.
        let anonymous = m.sender_chat.as_ref().filter(|c| c.id == m.chat.id);
        let is_bot = from.is_bot && anonymous.is_none();
        let shown = match anonymous {
            Some(c) => c.title.clone().unwrap_or_else(|| "group admin".into()),
            None => from.full_name(),
        };
        let sender = if is_bot {
            Sender::Bot {
                colleague: from
                    .username
                    .as_deref()
                    .and_then(|u| self.handles.read().bot(u).map(str::to_string)),
                label: format!("bot:{shown}"),
            }
        } else {
            Sender::Person {
                name: crate::platform::person_name(&self.matcher, TELEGRAM, &shown),
                ids: Some(from.id.to_string()),
            }
        };
        let msg = PlatformMessage {
            group: self.group_for_chat(m.chat.id),
            platform_msg_id: platform_msg_id(m.chat.id, m.message_id),
            sent_at,
            text,
            sender,
            mentions: Vec::new(),
        };
        if is_bot {
            // A colleague's copy may wait for its bridge copy: not on the polling task
            // (the update is confirmed; the bridge copy, or this one, is recorded).
            self.inbound.receive_aside(ingest, msg);
            return true;
        }
        self.inbound.receive(ingest, msg).await != Received::Failed
    }

    /// The @handle a mention of roster member `name` becomes (none for this bot
    /// itself, or a member without one).
    fn handle_for(&self, name: &str) -> Option<String> {
        (name != self.me).then(|| self.handle_of.get(name).cloned())?
    }

    /// Posts the bot's own message; returns the ids of its parts, space-separated.
    pub async fn post(&self, env: &Envelope) -> Result<String, PostFailure> {
        let Some(chat_id) = self.chat_for_group(&env.group) else {
            let e = PostFailure::NoChat(env.group.clone());
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not posted to telegram; the mesh still gets it");
            return Err(e);
        };
        let reply_to = env
            .reply_to
            .and_then(|r| self.ingest.get()?.sink.message(&env.group, &r))
            .and_then(|t| {
                // Answered only in its own chat.
                let first = platform_ids(t.platform_msg_id.as_deref()?).next()?;
                let (chat, id) = first.split_once(':')?;
                (chat.parse::<i64>().ok()? == chat_id).then(|| id.parse::<i64>().ok())?
            });
        let parts = outbound::parts(
            &env.text,
            outbound::MAX_MESSAGE_UNITS,
            &self.matcher,
            &|name| self.handle_for(name),
        );
        let chat = chat_id.to_string();
        let to = PostTo {
            platform: "telegram",
            bot: &self.me,
            id: &env.id,
            chat: &chat,
        };
        let empty = || ApiError::Malformed("empty message".into());
        let chat = &chat;
        let posted = post_in_parts(to, &parts, empty, |i, part| {
            let msg = SendMessage {
                chat_id,
                text: part.html.clone(),
                parse_mode: Some("HTML"),
                reply_parameters: reply_to
                    .filter(|_| i == 0)
                    .map(|message_id| ReplyParameters {
                        message_id,
                        allow_sending_without_reply: true,
                    }),
                link_preview_options: serde_json::json!({"is_disabled": true}),
            };
            async move {
                self.pacer.acquire(chat).await;
                let sent = self.api.send_message(&msg).await?;
                Ok(platform_msg_id(chat_id, sent.message_id))
            }
        });
        Ok(posted.await?)
    }

    /// `editMessageText` of the bot's message `platform_msg_id` (its first part) in
    /// `group`'s chat: the text rendered as a post's first part is (HTML, @handles),
    /// paced with the chat's posts. Telegram lets a bot edit its own messages for 48
    /// hours; an edit counts against the chat's send limit.
    pub(crate) async fn edit(
        &self,
        group: &str,
        platform_msg_id: &str,
        text: &str,
    ) -> Result<(), EditError> {
        let chat_id = self
            .chat_for_group(group)
            .ok_or_else(|| EditError::Failed(PostFailure::NoChat(group.to_string()).to_string()))?;
        let message_id = platform_ids(platform_msg_id)
            .next()
            .and_then(|first| first.split_once(':'))
            .and_then(|(chat, id)| (chat.parse::<i64>().ok()? == chat_id).then_some(id))
            .and_then(|id| id.parse::<i64>().ok())
            .ok_or_else(|| {
                EditError::Failed(format!(
                    "{platform_msg_id:?} is no message of chat {chat_id}"
                ))
            })?;
        let part = outbound::parts(text, outbound::MAX_MESSAGE_UNITS, &self.matcher, &|name| {
            self.handle_for(name)
        })
        .into_iter()
        .next()
        .ok_or_else(|| EditError::Failed("nothing to show".into()))?;
        self.pacer.acquire(&chat_id.to_string()).await;
        self.api
            .edit_message_text(chat_id, message_id, &part.html)
            .await
            .map(|_| ())
            .map_err(|e| EditError::Failed(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
