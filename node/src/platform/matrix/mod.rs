//! Matrix: client-server `/sync` long polling in, `m.room.message` with pills and
//! `m.mentions` out, one room per bot (docs/matrix.md).
//!
//! - [`settings`] — `[bots.matrix]`, its validation and secret (config layer).
//! - [`api`] — the client-server API client on the kit's retry loop: Bearer token,
//!   429 `M_LIMIT_EXCEEDED` waited out, 401 never retried.
//! - [`sync`] — the session on the kit's reconnect loop: identity, room, filter,
//!   then `/sync` with the `since` token saved once a batch is recorded.
//! - [`inbound`] — room events → readable text: pills, reply fallbacks, media.
//! - [`outbound`] — text → content: escaped HTML, pills, `m.mentions`, replies.
//! - `held` — pieces of text (pills) kept out of a rewrite, for both.
//!
//! # Start
//!
//! `whoami` must name `matrix.user_id` (else the adapter stops with that error); a
//! rejected token (401) stops it too, at once and for good: no retry loop. The bot
//! joins `matrix.room_id` when it is not in it yet (it must be invited, or the room
//! public). An end-to-end encrypted room (one with `m.room.encryption`) stops the
//! adapter with a reason that says so: botmesh cannot read or write encrypted
//! messages and will not post plaintext into such a room. Each reason shows in
//! `/healthz` (503).
//!
//! # Inbound
//!
//! The room's messages become transcript entries through the kit's inbound path
//! ([`crate::platform::kit::inbound`]) under the group named by the room id. A message
//! is known to the mesh by its event id, and its envelope id is derived from it, so
//! every node names it alike.
//!
//! - A person's message: a human envelope under their display name (`m.room.member`,
//!   else the localpart), their user id kept for `[mesh] operators`
//!   (`matrix:@carol:example.org`). Mentions: pills, `m.mentions` and typed `@Name`.
//! - Bots see each other in Matrix: a colleague's message (its sender is a
//!   colleague's `[bots.matrix] user_id`) also comes over the bridge with depth and
//!   reply_to; the kit keeps the bridge copy, waiting up to [`BRIDGE_GRACE`] for it,
//!   so either order ends with one entry. This bot's own messages are dropped; an
//!   `m.notice` from any other account is a bot's: context nobody answers.
//! - Edits (`m.replace`) are logged, not judged again; `m.room.encrypted` events are
//!   counted and logged, never recorded.
//!
//! # Outbound
//!
//! See [`outbound`]. Each part is sent with a transaction id made from the envelope
//! id and the part's number, the same on every retry (and after a restart), so the
//! homeserver never posts it twice. While a reply is written the bot shows typing,
//! cleared once it posted.

pub mod api;
mod held;
pub mod inbound;
pub mod outbound;
pub mod settings;
pub(crate) mod sync;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;

use crate::config::NodeConfig;
use crate::platform::kit::inbound::{Inbound, PlatformMessage, Received, Sender};
use crate::platform::kit::parts::{post_in_parts, PostTo};
use crate::platform::kit::reconnect::{Next, Reconnect, Reconnects};
use crate::platform::kit::stopped::Stopped;
use crate::platform::registry::Abilities;
use crate::platform::{AdapterContext, ChatPlatform, Declared, PostError, Visibility};
use crate::store::transcript::platform_ids;
use crate::turn::mention::MentionMatcher;
use crate::wire::envelope::Envelope;

use api::ClientApi;
use inbound::RoomEvent;
pub use settings::{MatrixSettings, MATRIX};

/// Every member of a room sees every message in it, bots' included.
pub const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: true,
    bots_see_bots: true,
};

/// Matrix edits a post (`m.replace`) and shows a typing notice for as long as asked.
pub(crate) const ABILITIES: Abilities = Abilities::edits_and_typing_every(TYPING_EVERY);

/// The Matrix adapter, as the registry lists it.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: MATRIX,
        visibility: VISIBILITY,
        abilities: ABILITIES,
        check: settings::check,
        member_ids: crate::platform::registry::no_member_ids,
        build: |cfg| Ok(Arc::new(Matrix::from_config(cfg)?)),
    };

/// How long a Matrix copy of a colleague's message waits for its bridge copy.
pub const BRIDGE_GRACE: Duration = Duration::from_secs(10);
/// How long one typing notice lasts on the homeserver.
pub const TYPING_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the typing notice is sent again while a reply is written.
pub const TYPING_EVERY: Duration = Duration::from_secs(25);
/// The file in the node's data folder holding the last `next_batch` recorded.
pub const SINCE_FILE: &str = "matrix-since";

/// Why a post failed.
#[derive(Debug, thiserror::Error)]
pub enum PostFailure {
    /// The group is not this bot's room.
    #[error("group {0:?} is not this bot's matrix room (matrix.room_id is its group)")]
    NoRoom(String),
    /// The adapter is stopped (an encrypted room, a rejected token).
    #[error("matrix is stopped for this node: {0}")]
    Stopped(String),
    /// The homeserver refused or could not be reached.
    #[error(transparent)]
    Api(#[from] api::ApiError),
}

/// A Matrix bot's platform state.
pub struct Matrix {
    /// The client-server API client.
    pub api: ClientApi,
    /// This bot's name in the mesh.
    me: String,
    /// This bot's Matrix user id.
    user_id: String,
    /// The room it serves: its group.
    room_id: String,
    /// The kit's inbound path (ids, colleague copies, the events metric).
    inbound: Inbound,
    /// Mesh bots by Matrix user id (this one included).
    bots: HashMap<String, String>,
    /// Matrix user ids by mesh bot name (this one included).
    user_of: HashMap<String, String>,
    /// Finds `@Name` of the roster in text.
    matcher: MentionMatcher,
    /// Display names of the room's members, from `m.room.member` state.
    names: Mutex<HashMap<String, String>>,
    /// Where the last recorded `next_batch` is kept.
    since_path: PathBuf,
    /// The inbound handle, once started.
    ingest: OnceLock<AdapterContext>,
    /// Whether the last `/sync` succeeded.
    syncing: AtomicBool,
    /// Encrypted events seen (never readable here).
    encrypted_events: AtomicU64,
    /// Why Matrix stopped for this node, for `/healthz`.
    stopped: Stopped,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matrix")
            .field("bot", &self.me)
            .field("user_id", &self.user_id)
            .field("room_id", &self.room_id)
            .finish_non_exhaustive()
    }
}

impl ChatPlatform for Matrix {
    fn declared(&self) -> Declared<'_> {
        Declared::posting(&ADAPTER, &self.me, Some(&self.stopped))
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(PostError::of(Matrix::post(self, env)))
    }

    fn edit<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), crate::platform::EditError>> {
        Box::pin(Matrix::edit(self, group, platform_msg_id, text))
    }

    fn typing<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<(), PostError>> {
        Box::pin(async move {
            if group != self.room_id {
                return Err(PostError(
                    PostFailure::NoRoom(group.to_string()).to_string(),
                ));
            }
            self.api
                .typing(&self.room_id, &self.user_id, Some(TYPING_TIMEOUT))
                .await
                .map_err(|e| PostError(e.to_string()))
        })
    }

    fn start(self: Arc<Self>, ingest: AdapterContext) -> Option<BoxFuture<'static, ()>> {
        let _ = self.ingest.set(ingest.clone());
        Some(Box::pin(async move { self.run(ingest).await }))
    }

    fn health(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({"matrix": {
            "user_id": self.user_id,
            "room_id": self.room_id,
            "syncing": self.syncing.load(Ordering::Relaxed),
            "encrypted_events_ignored": self.encrypted_events.load(Ordering::Relaxed),
            "stopped": self.stopped.reason(),
        }}))
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![("matrix_display_names", self.names.lock().len())]
    }
}

impl Matrix {
    /// The Matrix side of `cfg`'s bot (an error when its platform is not matrix).
    pub fn from_config(cfg: &NodeConfig) -> anyhow::Result<Matrix> {
        let (bot, s) = crate::platform::own_table::<MatrixSettings>(cfg, MATRIX)?;
        let token = settings::access_token(cfg)?;
        let mut bots = HashMap::new();
        let mut user_of = HashMap::new();
        for b in &cfg.settings.bots {
            if let Some(u) = b.table::<MatrixSettings>(MATRIX).and_then(|t| t.user_id) {
                bots.insert(u.trim().to_string(), b.name.clone());
                user_of.insert(b.name.clone(), u.trim().to_string());
            }
        }
        crate::platform::kit::mention::log_unmentionable(cfg, &user_of, "matrix.user_id", "matrix");
        let trimmed = |v: &Option<String>| v.as_deref().unwrap_or_default().trim().to_string();
        Ok(Matrix {
            api: ClientApi::new(&trimmed(&s.homeserver), &token, api::RETRY)?,
            me: bot.name.clone(),
            user_id: trimmed(&s.user_id),
            room_id: trimmed(&s.room_id),
            inbound: Inbound {
                platform: "matrix",
                me: bot.name.clone(),
                max_depth: cfg.mesh().max_depth,
                grace: BRIDGE_GRACE,
            },
            bots,
            user_of,
            matcher: MentionMatcher::new(&crate::turn::roster(&cfg.settings.bots)),
            names: Mutex::new(HashMap::new()),
            since_path: cfg.data_dir.join(SINCE_FILE),
            ingest: OnceLock::new(),
            syncing: AtomicBool::new(false),
            encrypted_events: AtomicU64::new(0),
            stopped: Stopped::default(),
        })
    }

    /// The adapter's life: sessions ([`sync::session`]) on the kit's reconnect loop
    /// until the node stops or a failure retrying cannot fix.
    async fn run(self: Arc<Self>, ingest: AdapterContext) {
        let mut reconnects = Reconnects::new(Reconnect {
            platform: "matrix",
            what: "sync",
            schedule: &sync::schedule,
            asked_pause: Duration::ZERO,
        });
        let mut state = sync::SyncState::load(&self.since_path);
        loop {
            let ended = sync::session(&self, &ingest, &mut state).await;
            match reconnects.after(ended, &ingest.accepting, |_| {}).await {
                Next::Again => continue,
                Next::Stop(Some(why)) => {
                    self.stopped.stop(&self.me, "matrix", &why);
                    break;
                }
                Next::Stop(None) => break,
            }
        }
        self.syncing.store(false, Ordering::Relaxed);
    }

    /// The name a member is shown under: their display name, else their localpart.
    fn display_name(&self, user_id: &str) -> String {
        self.names.lock().get(user_id).cloned().unwrap_or_else(|| {
            user_id
                .trim_start_matches('@')
                .split(':')
                .next()
                .unwrap_or(user_id)
                .to_string()
        })
    }

    /// Takes an `m.room.member` state event: the member's display name.
    fn on_member(&self, e: &RoomEvent) {
        let (Some(user), Some(name)) = (
            e.state_key.as_deref(),
            e.content["displayname"]
                .as_str()
                .filter(|n| !n.trim().is_empty()),
        ) else {
            return;
        };
        self.names
            .lock()
            .insert(user.to_string(), name.trim().to_string());
    }

    /// A pill in a message: `@Name` for a mesh bot, a tag naming no bot for anyone else.
    fn pill_text(&self, user_id: &str, shown: &str) -> String {
        match self.bots.get(user_id) {
            Some(name) => format!("@{name}"),
            None => {
                let shown = if shown.is_empty() {
                    self.display_name(user_id)
                } else {
                    shown.trim_start_matches('@').to_string()
                };
                let name = crate::platform::person_name(&self.matcher, MATRIX, &shown);
                format!("<at user_id=\"{user_id}\">{name}</at>")
            }
        }
    }

    /// Records one `m.room.message` (see the module docs); false when recording
    /// failed (so the batch's `since` is not saved and it comes again).
    pub(crate) async fn on_message(
        self: &Arc<Self>,
        ingest: &AdapterContext,
        e: RoomEvent,
    ) -> bool {
        if e.is_edit() {
            tracing::info!(bot = %self.me, event_id = %e.event_id, sender = %e.sender, "a matrix message was edited; the edit is not judged again (the original stays as recorded)");
            return true;
        }
        let mut text = inbound::message_text(&e.content, &|u, shown| self.pill_text(u, shown));
        let (intended, room) = e.intentional_mentions();
        let already = self.matcher.mentioned(&text, &[]);
        let mut missing: Vec<String> = intended
            .iter()
            .filter_map(|u| self.bots.get(u))
            .filter(|n| !already.contains(n))
            .map(|n| format!("@{n}"))
            .collect();
        if room && !text.contains("@everyone") && !text.contains("@room") {
            missing.push("@everyone".into());
        }
        if !missing.is_empty() && !text.is_empty() {
            tracing::debug!(bot = %self.me, event_id = %e.event_id, added = ?missing, "m.mentions names members the text does not: added as @Name");
            text = format!("{} {text}", missing.join(" "));
        }
        let colleague = self.bots.get(&e.sender).cloned();
        let shown = self.display_name(&e.sender);
        let is_bot = colleague.is_some() || e.msgtype() == "m.notice";
        let sender = if is_bot {
            Sender::Bot {
                colleague: colleague.clone(),
                label: format!("bot:{shown}"),
            }
        } else {
            Sender::Person {
                name: crate::platform::person_name(&self.matcher, MATRIX, &shown),
                ids: Some(e.sender.clone()),
            }
        };
        let msg = PlatformMessage {
            group: self.room_id.clone(),
            platform_msg_id: e.event_id.clone(),
            sent_at: if e.origin_server_ts > 0 {
                e.origin_server_ts
            } else {
                crate::wire::envelope::now_millis()
            },
            text,
            sender,
            mentions: Vec::new(),
        };
        if colleague.is_some() && colleague.as_deref() != Some(self.me.as_str()) {
            // A colleague's copy may wait for its bridge copy: not on the sync task
            // (the bridge copy, or this one, is recorded).
            self.inbound.receive_aside(ingest, msg);
            return true;
        }
        self.inbound.receive(ingest, msg).await != Received::Failed
    }

    /// The Matrix user id a mention of roster member `name` becomes (none for this
    /// bot itself, or a member without one).
    fn user_id_for(&self, name: &str) -> Option<String> {
        (name != self.me).then(|| self.user_of.get(name).cloned())?
    }

    /// Posts the bot's own message; returns the event ids of its parts,
    /// space-separated.
    pub async fn post(&self, env: &Envelope) -> Result<String, PostFailure> {
        if let Some(why) = self.stopped.reason() {
            return Err(PostFailure::Stopped(why));
        }
        if env.group != self.room_id {
            let e = PostFailure::NoRoom(env.group.clone());
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not posted to matrix; the mesh still gets it");
            return Err(e);
        }
        let reply_to = env
            .reply_to
            .and_then(|r| self.ingest.get()?.sink.message(&env.group, &r))
            .and_then(|t| {
                let first = platform_ids(t.platform_msg_id.as_deref()?).next()?;
                first.starts_with('$').then(|| first.to_string())
            });
        let parts = crate::platform::kit::split::split_message(&env.text, outbound::MAX_PART_CHARS);
        let to = PostTo {
            platform: "matrix",
            bot: &self.me,
            id: &env.id,
            chat: &self.room_id,
        };
        let empty = || api::ApiError::Malformed("empty message");
        let posted = post_in_parts(to, &parts, empty, |i, part| {
            let content = outbound::content(
                part,
                &self.matcher,
                &|name| self.user_id_for(name),
                reply_to.as_deref().filter(|_| i == 0),
            );
            // Chosen once per part, kept across every retry and restart.
            let txn_id = format!("botmesh-{}-{i}", env.id);
            async move { self.api.send(&self.room_id, &txn_id, &content).await }
        });
        let posted = posted.await?;
        if let Err(e) = self.api.typing(&self.room_id, &self.user_id, None).await {
            tracing::debug!(bot = %self.me, error = %e, "could not clear the matrix typing notice (it fades by itself)");
        }
        Ok(posted)
    }

    /// Replaces the text of the bot's event `platform_msg_id` (its first part) with
    /// `text` (`m.replace`, made as a post's first part: pills, `m.mentions`). Matrix
    /// sets no age or count limit on edits; each is an event, under the homeserver's
    /// send rate limit.
    pub(crate) async fn edit(
        &self,
        group: &str,
        platform_msg_id: &str,
        text: &str,
    ) -> Result<(), crate::platform::EditError> {
        use crate::platform::EditError;
        if group != self.room_id {
            return Err(EditError::Failed(
                PostFailure::NoRoom(group.into()).to_string(),
            ));
        }
        let event_id = platform_ids(platform_msg_id)
            .next()
            .filter(|id| id.starts_with('$'))
            .ok_or_else(|| EditError::Failed(format!("{platform_msg_id:?} is no event id")))?;
        let first = crate::platform::kit::split::split_message(text, outbound::MAX_PART_CHARS)
            .into_iter()
            .next()
            .ok_or_else(|| EditError::Failed("nothing to show".into()))?;
        let content =
            outbound::content(&first, &self.matcher, &|name| self.user_id_for(name), None);
        // One transaction id per edit, kept across its retries.
        let txn_id = format!("botmesh-edit-{}", ulid::Ulid::new());
        self.api
            .edit(&self.room_id, &txn_id, event_id, &content)
            .await
            .map(|_| ())
            .map_err(|e| EditError::Failed(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
