//! Feishu/Lark: events in; messages with real `<at>` mentions out.
//!
//! A bot whose `platform = "feishu"` gets its humans from Feishu itself, so this module
//! is both its ingress for human messages and its egress for its own replies.
//!
//! Events come one of two ways (`[bots.feishu] mode`):
//!
//! - `long_connection` (the default): the node opens an outbound WebSocket to Feishu
//!   ([`crate::platform::feishu::ws`]); no public address, Verification Token or
//!   Encrypt Key. Each event is acknowledged once it is recorded ([`WsEvents`]).
//! - `webhook`: Feishu POSTs callbacks to the bridge listener, as below.
//!
//! # Inbound: `POST /feishu/v1/events` (on the peer-facing listener)
//!
//! Cheapest check first, each rejection logged with its reason (never a secret):
//!
//! 1. size (413), JSON shape (400);
//! 2. with an Encrypt Key configured, `X-Lark-Signature` = hex sha256 of
//!    `X-Lark-Request-Timestamp + X-Lark-Request-Nonce + encrypt_key + raw body`,
//!    compared in constant time, and the timestamp within ±300 s (401). Only the
//!    `url_verification` challenge may come unsigned, and then it must come
//!    encrypted under our key (Feishu does not sign the URL check);
//! 3. `{"encrypt": "…"}` bodies are decrypted: AES-256-CBC, key = sha256(encrypt_key),
//!    IV = the first 16 bytes of the base64-decoded data, PKCS#7 padding (401 when
//!    that fails: whoever sent it does not hold the key);
//! 4. the Verification Token (`token`, or `header.token` in schema 2.0), constant
//!    time (401), and `header.app_id` must be this bot's app (403);
//! 5. the event id is deduplicated against [`EventDedup`], a small file in the data
//!    folder that remembers ids for 24 h, because Feishu retries for hours and a
//!    restart must not re-process them (200 `{"duplicate": true}`);
//! 6. 200 at once; the message is handled afterwards in a tracked task, well within
//!    Feishu's 3 s deadline whatever the transcript or the LLM are doing.
//!
//! An `im.message.receive_v1` text message from a person becomes a human envelope
//! (depth 0, `platform_msg_id` = its `om_…` id) that is recorded but never broadcast:
//! every bot of a Feishu mesh gets its humans from Feishu. Its `@_user_N`
//! placeholders are resolved through the event's `mentions[]`: a colleague (by this
//! app's open_ids, `peer_open_ids` in the Feishu settings, else by display name)
//! becomes `@Name`, anyone else an `<at user_id="ou_…">Name</at>` tag that names no
//! bot; the mention list itself also goes to [`crate::turn::on_message`].
//!
//! A message another mesh bot posted (`sender_type` "app") is the same message that
//! bot broadcast over the bridge with its `om_…` id as `platform_msg_id`; the bridge
//! copy is authoritative (it carries depth and reply_to), so the Feishu copy is only
//! recorded — as context nobody answers — if the bridge copy has not come within
//! [`BRIDGE_GRACE`].
//!
//! # Outbound
//!
//! [`FeishuClient`]: a tenant access token from
//! `POST /open-apis/auth/v3/tenant_access_token/internal`, cached and refreshed five
//! minutes before it expires or when Feishu calls it invalid ([`TOKEN_INVALID_CODES`]);
//! `POST /open-apis/im/v1/messages?receive_id_type=chat_id` with the envelope id as
//! the idempotency `uuid`; 429, 5xx and Feishu's rate-limit codes retried with
//! exponential backoff and jitter; a per-chat token bucket of [`SENDS_PER_CHAT_PER_SEC`].
//! `@Name` of a colleague becomes `<at user_id="ou_…">Name</at>`.
//!
//! # Files
//!
//! - [`api`] — the outbound API client: token, sending, retries, pacing.
//! - [`events`] — callbacks' shapes, parsing and authentication.
//! - [`crypto`] — callback bodies' AES and signatures.
//! - [`dedup`] — the event id log.
//! - [`inbound`] — the webhook handler and event processing, for both modes.
//! - [`ws`] — the long connection.
//! - [`content`] — rich text and media flattened to text.
//! - [`names`] — people by display name.
//!
//! This file holds the adapter itself ([`Feishu`]) and its constants.

pub(crate) mod api;
pub(crate) mod content;
pub(crate) mod crypto;
pub(crate) mod dedup;
pub(crate) mod events;
pub(crate) mod inbound;
pub(crate) mod metrics;
pub mod names;
pub(crate) mod settings;
#[cfg(test)]
mod tests;
pub mod ws;

pub use api::*;
pub use crypto::*;
pub(crate) use dedup::*;
pub(crate) use events::*;
pub(crate) use inbound::*;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::config::NodeConfig;
use crate::ingress::server::Body;
use crate::platform::kit::inbound::Inbound;
use crate::platform::registry::Abilities;
use crate::platform::AdapterContext;
use crate::platform::{ChatPlatform, Declared, PostError, Visibility};
use crate::turn::mention::{MentionMatcher, PlatformMention};
use crate::wire::envelope::{now_millis, Envelope};
use futures_util::future::BoxFuture;
pub(crate) use settings::{FeishuIds, FeishuMode, FeishuSecrets, FEISHU};
use ws::{WsSettings, WsStatus};

/// Where Feishu posts event callbacks, on the peer-facing listener.
pub const EVENTS_PATH: &str = "/feishu/v1/events";
/// Lark's (international) open platform base URL; Feishu's is the default (only the
/// tests name it: `[bots.feishu] base_url` sets it).
#[cfg(test)]
pub(crate) const LARK_BASE_URL: &str = "https://open.larksuite.com";
/// Header carrying the request signature.
pub const HEADER_SIGNATURE: &str = "x-lark-signature";
/// Header carrying the request's unix timestamp (seconds).
pub const HEADER_TIMESTAMP: &str = "x-lark-request-timestamp";
/// Header carrying the request nonce.
pub const HEADER_NONCE: &str = "x-lark-request-nonce";
/// Largest accepted |now − timestamp| of a signed callback, in seconds.
pub(crate) const MAX_SKEW_SECS: i64 = 300;
/// How long event ids are remembered: Feishu retries a failed push for hours.
pub(crate) const EVENT_ID_TTL: Duration = Duration::from_secs(24 * 3600);
/// At most this many event ids are remembered (the oldest are forgotten first).
pub(crate) const EVENT_ID_CAPACITY: usize = 200_000;
/// How long a Feishu copy of a mesh bot's message waits for its bridge copy.
pub(crate) const BRIDGE_GRACE: Duration = Duration::from_secs(10);
/// Messages this node sends to one chat per second (Feishu allows about 5 per group,
/// shared by all bots).
pub(crate) const SENDS_PER_CHAT_PER_SEC: f64 = 5.0;
/// Feishu codes meaning "this access token is invalid or expired": refresh and retry.
/// 99991663 tenant token invalid, 99991661 token missing/malformed, 99991668 and
/// 99991671 access token invalid, 99991664 app token invalid (oapi-sdk-go retries on
/// 99991663/99991664/99991671; the rest are from the generic error code list).
pub(crate) const TOKEN_INVALID_CODES: [i64; 5] = [99991661, 99991663, 99991664, 99991668, 99991671];
/// Feishu codes meaning "too many requests": back off and retry.
pub(crate) const RATE_LIMIT_CODES: [i64; 2] = [99991400, 230020];
/// The longest a sender's display name is looked up before the message is recorded
/// under the open_id instead.
pub(crate) const NAME_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// The data-folder file that remembers handled event ids.
pub(crate) const DEDUP_FILE: &str = "feishu-events.log";

// ---------------------------------------------------------------------------------
// The node's Feishu side
// ---------------------------------------------------------------------------------

/// A feishu bot's platform state: the app, its ids and the event id memory.
pub(crate) struct Feishu {
    /// The API client.
    pub(crate) client: FeishuClient,
    /// Checks callbacks.
    pub(crate) auth: EventAuth,
    /// Handled event ids.
    pub(crate) dedup: EventDedup,
    me: String,
    open_id: Option<String>,
    chat_id: Option<String>,
    mesh_group: String,
    /// The kit's one inbound path, as this adapter uses it.
    pub(crate) inbound: Inbound,
    /// open_id in this app → bot name (this bot and the colleagues).
    bots_by_open_id: HashMap<String, String>,
    /// Colleague (canonical name) → open_id in this app.
    peer_open_ids: HashMap<String, String>,
    /// Finds and rewrites mentions of the roster (names and aliases).
    matcher: MentionMatcher,
    /// The inbound handle, once the node has started the adapter.
    ingest: OnceLock<AdapterContext>,
    /// How events arrive.
    mode: FeishuMode,
    /// The open platform base URL (the long connection asks it for an endpoint).
    base_url: String,
    /// The App Secret (the long connection's endpoint call needs it).
    app_secret: String,
    /// The long connection's state, once started (for health).
    ws: OnceLock<Arc<WsStatus>>,
    /// People's display names by open_id.
    pub(crate) names: crate::platform::feishu::names::Names,
}

/// Every bot with `im:message.group_msg` sees every human message in its groups;
/// other bots' messages arrive only with the include_bot scopes (and then twice: the
/// bridge copy is authoritative).
/// Feishu in the registry.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: FEISHU,
        visibility: VISIBILITY,
        abilities: ABILITIES,
        check: settings::check,
        member_ids: settings::member_ids,
        build: |cfg| Ok(Arc::new(Feishu::from_config(cfg)?)),
    };

pub(crate) const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: true,
    bots_see_bots: false,
};

/// Feishu edits a post (its message update); a bot has no typing signal.
pub(crate) const ABILITIES: Abilities = Abilities::EDITS;

impl ChatPlatform for Feishu {
    fn declared(&self) -> Declared<'_> {
        Declared::posting(&ADAPTER, &self.me, None)
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(PostError::of(Feishu::post(self, env)))
    }

    fn edit<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), crate::platform::EditError>> {
        Box::pin(async move {
            use crate::platform::EditError;
            let chat = self
                .chat_for_group(group)
                .ok_or_else(|| EditError::Failed(SendError::NoChat(group.into()).to_string()))?;
            let text = self.outgoing_text(&self.matcher, text);
            self.client
                .update_text(&chat, platform_msg_id, &text)
                .await
                .map_err(|e| EditError::Failed(e.to_string()))
        })
    }

    fn start(self: Arc<Self>, ingest: AdapterContext) -> Option<BoxFuture<'static, ()>> {
        let _ = self.ingest.set(ingest.clone());
        self.client.set_metrics(ingest.metrics.clone());
        // Best effort: log when the app's real open_id differs from peers.toml.
        let me = self.clone();
        tokio::spawn(async move { me.check_identity().await });
        if self.mode != FeishuMode::LongConnection {
            return None;
        }
        let status = Arc::new(WsStatus::new(ingest.metrics.clone()));
        let _ = self.ws.set(status.clone());
        let settings = WsSettings {
            base_url: self.base_url.clone(),
            app_id: self.auth.app_id.clone(),
            app_secret: self.app_secret.clone(),
        };
        let handler = Arc::new(WsEvents(self.clone()));
        Some(Box::pin(ws::run(
            settings,
            handler,
            status,
            ingest.accepting.clone(),
        )))
    }

    fn webhook_path(&self) -> Option<&'static str> {
        (self.mode == FeishuMode::Webhook).then_some(EVENTS_PATH)
    }

    fn health(&self) -> Option<serde_json::Value> {
        let ws = self.ws.get().map(|s| s.health());
        Some(serde_json::json!({
            "feishu": {
                "mode": match self.mode {
                    FeishuMode::LongConnection => "long_connection",
                    FeishuMode::Webhook => "webhook",
                },
                "long_connection": ws,
            }
        }))
    }

    fn webhook(
        self: Arc<Self>,
        req: Request<Incoming>,
        remote: SocketAddr,
    ) -> BoxFuture<'static, Response<Body>> {
        Box::pin(handle_events(self, req, remote))
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("feishu_event_ids", self.dedup.len()),
            ("feishu_names", self.names.len()),
        ]
    }
}

impl std::fmt::Debug for Feishu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feishu")
            .field("bot", &self.me)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

/// `<at user_id="ou_…">Name</at>`.
fn at_tag(open_id: &str, name: &str) -> String {
    let name: String = name.chars().filter(|c| !matches!(c, '<' | '>')).collect();
    let open_id: String = open_id
        .chars()
        .filter(|c| !matches!(c, '<' | '>' | '"'))
        .collect();
    format!("<at user_id=\"{open_id}\">{name}</at>")
}

impl Feishu {
    /// The Feishu side of `cfg`'s bot (an error when its platform is not feishu).
    pub(crate) fn from_config(cfg: &NodeConfig) -> anyhow::Result<Feishu> {
        let (bot, ids) = crate::platform::own_table::<FeishuIds>(cfg, FEISHU)?;
        let secrets = FeishuSecrets::of(cfg);
        let app_id = ids.app_id.clone().unwrap_or_default();
        if ids.mode == FeishuMode::Webhook
            && secrets.verification_token.is_none()
            && secrets.encrypt_key.is_none()
        {
            anyhow::bail!(
                "bot {}: webhook mode needs a Verification Token or an Encrypt Key",
                bot.name
            );
        }
        let client = FeishuClient::new(
            &ids.base_url(),
            &app_id,
            &secrets.app_secret,
            RetryPolicy::default(),
        )?;
        let now = now_millis() / 1000;
        let path = cfg.data_dir.join(DEDUP_FILE);
        let dedup = EventDedup::open(&path, EVENT_ID_TTL, EVENT_ID_CAPACITY, now)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
        let mut peer_open_ids = HashMap::new();
        let mut bots_by_open_id = HashMap::new();
        for (name, open_id) in &ids.peer_open_ids {
            if let Some((_, b)) = cfg.settings.bot(name) {
                peer_open_ids.insert(b.name.clone(), open_id.trim().to_string());
                bots_by_open_id.insert(open_id.trim().to_string(), b.name.clone());
            }
        }
        if let Some(own) = ids.open_id.as_deref() {
            bots_by_open_id.insert(own.to_string(), bot.name.clone());
        }
        crate::platform::kit::mention::log_unmentionable(
            cfg,
            &peer_open_ids,
            "feishu.peer_open_ids",
            "feishu",
        );
        Ok(Feishu {
            matcher: MentionMatcher::new(&crate::platform::registry::roster(&cfg.settings.bots)),
            ingest: OnceLock::new(),
            client,
            auth: EventAuth {
                app_id,
                verification_token: secrets.verification_token.clone(),
                encrypt_key: secrets.encrypt_key.clone(),
            },
            dedup,
            me: bot.name.clone(),
            open_id: ids.open_id.clone(),
            chat_id: ids.chat_id.clone(),
            mesh_group: cfg.mesh().group.clone(),
            inbound: Inbound {
                platform: "feishu",
                me: bot.name.clone(),
                max_depth: cfg.mesh().max_depth,
                grace: BRIDGE_GRACE,
            },
            bots_by_open_id,
            peer_open_ids,
            mode: ids.mode,
            base_url: ids.base_url(),
            app_secret: secrets.app_secret.clone(),
            ws: OnceLock::new(),
            names: Default::default(),
        })
    }

    /// Best effort at start: asks Feishu for the bot's open_id and logs a mismatch.
    pub(crate) async fn check_identity(&self) {
        match self.client.bot_info().await {
            Ok(info) if self.open_id.as_deref() == Some(info.open_id.as_str()) => {
                tracing::info!(bot = %self.me, app_name = %info.app_name, "feishu app identity confirmed");
            }
            Ok(info) => {
                tracing::warn!(bot = %self.me, configured = ?self.open_id, actual = %info.open_id, app_name = %info.app_name, "feishu.open_id in peers.toml differs from the app's bot open_id; mentions of this bot may be missed");
            }
            Err(e) => {
                tracing::warn!(bot = %self.me, error = %e, "could not read the feishu bot info (continuing)");
            }
        }
    }

    /// The mesh group a chat belongs to: `[mesh].group` for the configured chat,
    /// else the chat id itself.
    pub(crate) fn group_for_chat(&self, chat_id: &str) -> String {
        if self.chat_id.as_deref() == Some(chat_id) {
            self.mesh_group.clone()
        } else {
            chat_id.to_string()
        }
    }

    /// The chat a group's messages go to.
    pub(crate) fn chat_for_group(&self, group: &str) -> Option<String> {
        if let Some(chat) = group.strip_prefix(crate::wire::envelope::DIRECT_GROUP_PREFIX) {
            return Some(chat.to_string()).filter(|c| c.starts_with("oc_"));
        }
        if group == self.mesh_group {
            self.chat_id.clone()
        } else if group.starts_with("oc_") {
            Some(group.to_string())
        } else {
            None
        }
    }

    /// The mesh bot a mention entry names: by open_id in this app, else by display
    /// name (the same rule as the mention matcher).
    pub(crate) fn bot_for_mention(&self, m: &Mention, matcher: &MentionMatcher) -> Option<String> {
        if !m.id.open_id.is_empty() {
            if let Some(b) = self.bots_by_open_id.get(&m.id.open_id) {
                return Some(b.clone());
            }
        }
        matcher.resolve(m.name.trim()).map(str::to_string)
    }

    /// The mention list for the turn pipeline, with colleagues' per-app open_ids
    /// resolved to their canonical names.
    pub(crate) fn platform_mentions(
        &self,
        mentions: &[Mention],
        matcher: &MentionMatcher,
    ) -> Vec<PlatformMention> {
        mentions
            .iter()
            .map(|m| match self.bot_for_mention(m, matcher) {
                Some(name) => PlatformMention {
                    key: m.key.clone(),
                    open_id: String::new(),
                    name,
                },
                None => PlatformMention {
                    key: m.key.clone(),
                    open_id: m.id.open_id.clone(),
                    name: String::new(),
                },
            })
            .collect()
    }

    /// The message text as the mesh shows it: each `@_user_N` placeholder becomes
    /// `@Name` for a mesh bot and an `<at user_id="ou_…">Name</at>` tag (which names
    /// no bot) for anyone else; unknown placeholders stay as they are.
    pub(crate) fn readable_text(
        &self,
        text: &str,
        mentions: &[Mention],
        matcher: &MentionMatcher,
    ) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(pos) = rest.find("@_user_") {
            out.push_str(&rest[..pos]);
            let after = &rest[pos + "@_user_".len()..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            let key_len = "@_user_".len() + digits;
            let key = &rest[pos..pos + key_len];
            match mentions.iter().find(|m| digits > 0 && m.key == key) {
                Some(m) => match self.bot_for_mention(m, matcher) {
                    Some(bot) => {
                        out.push('@');
                        out.push_str(&bot);
                    }
                    None => out.push_str(&at_tag(&m.id.open_id, &m.name)),
                },
                None => out.push_str(key),
            }
            rest = &rest[pos + key_len..];
        }
        out.push_str(rest);
        out
    }

    /// Any message as the mesh shows it ([`crate::platform::feishu::content`]): text
    /// and rich text with mentions resolved, media as placeholders.
    pub(crate) fn message_text(&self, msg: &Message, matcher: &MentionMatcher) -> String {
        let text = |t: &str| self.readable_text(t, &msg.mentions, matcher);
        let at = |user_id: &str, user_name: &str| {
            if user_id.starts_with("@_user_") {
                self.readable_text(user_id, &msg.mentions, matcher)
            } else if user_id == "all" {
                "@all".to_string()
            } else if let Some(bot) = self.bots_by_open_id.get(user_id) {
                format!("@{bot}")
            } else {
                at_tag(user_id, user_name)
            }
        };
        crate::platform::feishu::content::flatten(
            &msg.message_type,
            &msg.content,
            &crate::platform::feishu::content::Resolve {
                text: &text,
                at: &at,
            },
        )
    }

    /// The text to post: `@Colleague` becomes a real `<at user_id="ou_…">` mention.
    pub(crate) fn outgoing_text(&self, matcher: &MentionMatcher, text: &str) -> String {
        matcher.rewrite(text, |member| {
            self.peer_open_ids
                .get(member)
                .filter(|_| member != self.me)
                .map(|open_id| at_tag(open_id, member))
        })
    }

    /// Posts the bot's own message to its chat (the envelope id is the idempotency
    /// uuid). Returns the `om_…` id. Failures are logged here.
    pub(crate) async fn post(&self, env: &Envelope) -> Result<String, SendError> {
        let Some(chat) = self.chat_for_group(&env.group) else {
            let e = SendError::NoChat(env.group.clone());
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not posted to feishu; the mesh still gets it");
            return Err(e);
        };
        let text = self.outgoing_text(&self.matcher, &env.text);
        match self
            .client
            .send_text(&chat, &text, &env.id.to_string())
            .await
        {
            Ok(message_id) => {
                tracing::info!(bot = %self.me, id = %env.id, %message_id, chat = %chat, "posted to feishu");
                Ok(message_id)
            }
            Err(e) => {
                tracing::error!(bot = %self.me, id = %env.id, chat = %chat, error = %e, "could not post to feishu; the mesh still gets the message");
                Err(e)
            }
        }
    }
}
