//! Chat platforms behind one boundary, [`ChatPlatform`].
//!
//! An adapter turns its platform's events into arrivals for the transcript
//! ([`crate::ingress::ingest::Arrival`]: the platform's message id, the author by display
//! name, mentions resolved to roster names, rich content flattened to text) and posts a
//! bot's text back with the platform's real mentions, returning the platform's message
//! id. It declares what its platform shows to whom ([`Visibility`]), which decides who
//! may carry human messages over the bridge. Inbound, an adapter holds only an
//! [`AdapterContext`] (the sink, metrics, the stop signal and a task tracker), given
//! to it at [`ChatPlatform::start`]; it never sees the node.
//!
//! - [`local`] — the mesh is the chat: people post through the page or the API.
//! - [`feishu`] — Feishu/Lark events in (over [`feishu::ws`], the long connection, or
//!   as callbacks), messages with real `<at>` out. `feishu_ws` and `feishu_names` are
//!   the old paths of [`feishu::ws`] and [`feishu::names`], kept for tests and tools.
//! - [`dingtalk`] — DingTalk Stream mode in (forwarded to the peers: DingTalk shows a
//!   person's message only to the robots it @-mentions), session webhook or group send out.
//! - [`discord`] — the Discord gateway in, messages with real `<@id>` out.
//! - [`matrix`] — a Matrix room through the client-server API: `/sync` in (the
//!   `since` token saved once recorded), `m.room.message` with pills and
//!   `m.mentions` out (docs/matrix.md).
//! - [`onebot`] — QQ groups through a OneBot v11 implementation's forward WebSocket,
//!   `send_group_msg` with reply and at segments out (docs/qq.md).
//! - [`slack`] — Slack's Socket Mode in, `chat.postMessage` with real `<@U…>` out.
//! - [`telegram`] — Bot API long polling (or a webhook) in, HTML-escaped messages
//!   with @handles out.
//! - [`wecom`] — WeCom smart robots' long connection in (forwarded to the peers: a
//!   person's message reaches only the robots it @s), streamed answers on the callback
//!   or proactive sends out (docs/wecom.md).
//!
//! Every adapter describes itself in its own folder (its settings, their checks and
//! its secrets in `<name>/settings.rs`, which the config layer may read; its
//! visibility, abilities and build in a [`registry::Adapter`], which its
//! [`ChatPlatform::declared`] names with its stopped record, so the boundary's name,
//! visibility, edits, typing pace, stopped reason and which messages it posts are
//! written once) and is listed once in [`registry`], which
//! checks every bot's platform tables before anything binds.
//! Adding a platform is a folder, its `mod` line here and its line in the registry.
//!
//! What every adapter needs once lives in [`kit`]: the one HTTP client builder and
//! retry loop for API calls, the one source for an expiring access token, the one
//! per-chat pacer, the one reconnect loop for long connections and the one inbound
//! path (see its docs).

pub(crate) mod dingtalk;
pub mod discord;
pub mod feishu;
pub(crate) mod kit;
/// The old path of [`feishu::names`].
pub use feishu::names as feishu_names;
/// The old path of [`feishu::ws`].
pub use feishu::ws as feishu_ws;
pub(crate) mod local;
pub mod matrix;
pub mod onebot;
pub mod registry;
pub mod slack;
pub mod telegram;
pub mod wecom;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::config::{NodeConfig, Platform};
use futures_util::future::BoxFuture;

use crate::ingress::ingest::{Arrival, HumanRules, Ingest, Sink};
use crate::ingress::server::Body;
use crate::store::transcript::{Appended, TranscriptError};
use crate::telemetry::metrics::Metrics;
use crate::wire::envelope::Envelope;

/// What a platform shows to whom. The table in DESIGN.md, as data each adapter declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Visibility {
    /// Every bot in a group sees every human message there on the platform itself.
    /// When false (local: nobody sees anything but the mesh; DingTalk: only the
    /// mentioned robots), the node that receives a person's message carries it to its
    /// peers as a human envelope — and only such nodes may send one.
    pub(crate) humans_reach_every_bot: bool,
    /// A bot sees other bots' messages on the platform (then a colleague's message
    /// arrives twice, from the platform and over the bridge, and is recorded once).
    pub(crate) bots_see_bots: bool,
}

/// Why a message could not be posted to the platform (logged by the adapter; the mesh
/// still gets the message).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PostError(pub String);

impl PostError {
    /// The outcome of `post`, an adapter's own post with its own error, as the
    /// boundary's.
    pub(crate) async fn of<E: std::fmt::Display>(
        post: impl std::future::Future<Output = Result<String, E>>,
    ) -> Result<String, PostError> {
        post.await.map_err(|e| PostError(e.to_string()))
    }
}

/// Why a message the bot posted could not be edited (a status message: the turn logs
/// it, counts it and leaves the last text standing; nothing is posted instead).
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The platform has no edit of a posted message (QQ through OneBot), or none this
    /// adapter can make (a DingTalk group message, a WeCom proactive send).
    #[error("{0} cannot edit a posted message")]
    Unsupported(&'static str),
    /// The platform refused or failed the edit (a rate limit that outlasted the
    /// retries, a message too old to edit, a network failure).
    #[error("{0}")]
    Failed(String),
}

impl EditError {
    /// The `outcome` label of `botmesh_status_edits_total`.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            EditError::Unsupported(_) => "unsupported",
            EditError::Failed(_) => "failed",
        }
    }
}

/// What an adapter's inbound side is given at [`ChatPlatform::start`], and all it
/// ever sees of the node: where its messages go, the node's metrics, when to stop and
/// where to run work that must end before the node does.
#[derive(Clone)]
pub struct AdapterContext {
    /// Records arrivals and answers what is recorded.
    pub sink: Arc<dyn Sink>,
    /// The node's metrics (the adapter's own families and the kit's).
    pub metrics: Arc<Metrics>,
    /// Cancelled when the node stops accepting: the adapter's connection ends then.
    pub accepting: tokio_util::sync::CancellationToken,
    /// Where the adapter spawns work the node waits for when it stops.
    pub tasks: tokio_util::task::TaskTracker,
}

impl AdapterContext {
    /// The adapter's part of the node's inbound handle.
    pub(crate) fn of(ingest: &Ingest) -> AdapterContext {
        AdapterContext {
            sink: ingest.sink.clone(),
            metrics: ingest.metrics.clone(),
            accepting: ingest.accepting.clone(),
            tasks: ingest.tasks.clone(),
        }
    }

    /// Records one platform arrival.
    pub async fn arrive(&self, arrival: Arrival) -> Result<Appended, TranscriptError> {
        self.sink.arrive(arrival).await
    }
}

/// What an adapter declares of itself once ([`ChatPlatform::declared`]), from which the
/// boundary answers its name, its visibility and which messages it posts.
pub struct Declared<'a> {
    /// The adapter's entry in the registry: the one place its platform's name and
    /// visibility are written.
    pub(crate) adapter: &'static registry::Adapter,
    /// The mesh name of the bot whose own messages it posts; `None` for a platform
    /// that posts nowhere (`local`: the mesh is the chat).
    pub(crate) posts_for: Option<&'a str>,
    /// Its record of why it is out of service ([`ChatPlatform::stopped`]), if it keeps
    /// one.
    pub(crate) stopped: Option<&'a kit::stopped::Stopped>,
}

impl<'a> Declared<'a> {
    /// An adapter that posts bot `me`'s own messages, keeping why it stopped in
    /// `stopped` if it can stop.
    pub(crate) fn posting(
        adapter: &'static registry::Adapter,
        me: &'a str,
        stopped: Option<&'a kit::stopped::Stopped>,
    ) -> Declared<'a> {
        Declared {
            adapter,
            posts_for: Some(me),
            stopped,
        }
    }

    /// An adapter that posts nothing (and never stops).
    pub(crate) fn silent(adapter: &'static registry::Adapter) -> Declared<'a> {
        Declared {
            adapter,
            posts_for: None,
            stopped: None,
        }
    }
}

/// One chat platform, as a node uses it.
///
/// An adapter declares its platform once, in its [`registry::Adapter`]; its name,
/// visibility and abilities (edit, typing) here are read from that declaration, which
/// messages it posts from the bot it posts for, and why it stopped from its record,
/// so an adapter writes only what differs.
pub trait ChatPlatform: Send + Sync + 'static {
    /// What the adapter declares of itself: its registry entry and the bot it posts for.
    fn declared(&self) -> Declared<'_>;

    /// The platform's name as written in peers.toml (`local`, `feishu`, ...).
    fn name(&self) -> &'static str {
        self.declared().adapter.platform.as_str()
    }

    /// What the platform shows to whom.
    fn visibility(&self) -> Visibility {
        self.declared().adapter.visibility
    }

    /// Whether `env` (a message this node publishes) is to be posted to the platform:
    /// the bot's own chat message (or status message), not yet there.
    fn should_post(&self, env: &Envelope) -> bool {
        self.declared()
            .posts_for
            .is_some_and(|me| own_unposted(env, me))
    }

    /// Posts a bot's message with real platform mentions; returns the platform's id of
    /// the posted message.
    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>>;

    /// Whether [`ChatPlatform::edit`] can change a posted message here: a status
    /// message is then edited in place; where it cannot, one status message is posted
    /// at most and never changed (no stream of notes). As the registry entry's
    /// [`registry::Abilities`] say.
    fn edits(&self) -> bool {
        self.declared().adapter.abilities.edits
    }

    /// Replaces the text of a message this bot posted in `group` (`platform_msg_id`
    /// as [`ChatPlatform::post`] returned it; a message posted in parts is edited in its
    /// first) with `text`, mentions made real as in a post. The kit capability behind the
    /// status message a long turn keeps up to date; the platform's own call per adapter
    /// (Telegram `editMessageText`, Slack `chat.update`, Discord's message PATCH,
    /// Feishu's message update, Matrix `m.replace`).
    fn edit<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), EditError>> {
        let _ = (group, platform_msg_id, text);
        let name = self.name();
        Box::pin(async move { Err(EditError::Unsupported(name)) })
    }

    /// Shows `group`'s chat that this bot is at work on a reply (the typing indicator
    /// of Discord and Telegram), once; while the work goes on the turn repeats it every
    /// [`ChatPlatform::typing_every`]. A platform without one does nothing.
    fn typing<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<(), PostError>> {
        let _ = group;
        Box::pin(async { Ok(()) })
    }

    /// How often the typing signal must be sent again to stay on (it fades by itself:
    /// Discord's after about 10 s, Telegram's after 5 s); `None` when the platform has
    /// no such signal. As the registry entry's [`registry::Abilities`] say.
    fn typing_every(&self) -> Option<std::time::Duration> {
        self.declared().adapter.abilities.typing_every
    }

    /// Starts the inbound side with its context. A platform that keeps a connection
    /// open returns the task that runs it until `ingest.accepting` is cancelled; one
    /// whose events come as webhooks keeps the context for [`ChatPlatform::webhook`].
    fn start(self: Arc<Self>, ingest: AdapterContext) -> Option<BoxFuture<'static, ()>>;

    /// The path on the peer-facing listener where the platform delivers callbacks, if
    /// it does.
    fn webhook_path(&self) -> Option<&'static str> {
        None
    }

    /// Answers a callback at [`ChatPlatform::webhook_path`].
    fn webhook(
        self: Arc<Self>,
        req: Request<Incoming>,
        remote: SocketAddr,
    ) -> BoxFuture<'static, Response<Body>> {
        let _ = (req, remote);
        Box::pin(async {
            crate::ingress::server::error(http::StatusCode::NOT_FOUND, "no such endpoint")
        })
    }

    /// Why the platform is out of service until an operator acts (a rejected token, a
    /// missing intent), in words that say what to fix; `/healthz` then answers 503.
    fn stopped(&self) -> Option<String> {
        self.declared()
            .stopped
            .and_then(kit::stopped::Stopped::reason)
    }

    /// What `/healthz` shows of the adapter (its connection's state), if anything.
    /// Never calls the platform: health checks must cost no API quota.
    fn health(&self) -> Option<serde_json::Value> {
        None
    }

    /// Sizes of the adapter's caches, for `botmesh_cache_entries{cache}`.
    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        Vec::new()
    }
}

/// Whether `env` is bot `me`'s own chat message (or status message) not yet on its
/// platform: [`ChatPlatform::should_post`] of every adapter that posts.
fn own_unposted(env: &Envelope, me: &str) -> bool {
    matches!(
        env.kind,
        crate::wire::envelope::Kind::Message | crate::wire::envelope::Kind::Status
    ) && env.author.kind == crate::wire::envelope::AuthorKind::Bot
        && env.author.name == me
        && env.platform_msg_id.is_none()
}

pub(crate) use registry::visibility_of;

/// Whether a person's message that a bot on `claimant`'s platform sees ever reaches a
/// bot on `me`'s: carried over the bridge (the claimant's platform does not show people
/// to every bot, and `me`'s does not deliver people itself, which would make it ignore
/// bridge copies), or shown by the platform to both (the same platform, showing people
/// to every bot). A claim on a person's message `me` can never see is not one `me` will
/// ever judge, so `me` must not make the claimant wait for its word.
pub fn sees_humans_of(me: Platform, claimant: Platform) -> bool {
    let (mine, theirs) = (visibility_of(me), visibility_of(claimant));
    (!theirs.humans_reach_every_bot && !mine.humans_reach_every_bot)
        || (me == claimant && mine.humans_reach_every_bot)
}

/// Who may carry humans over the bridge to this node, and whether it ignores bridge
/// copies of them, from every bot's platform.
pub(crate) fn human_rules(cfg: &NodeConfig) -> HumanRules {
    HumanRules {
        platform_delivers_humans: visibility_of(cfg.bot().platform).humans_reach_every_bot,
        carriers: cfg
            .peers()
            .filter(|p| !visibility_of(p.platform).humans_reach_every_bot)
            .map(|p| p.name.clone())
            .collect(),
    }
}

/// What an adapter's `from_config` starts from: `cfg`'s bot, which must be on
/// `platform`, and its `[bots.<platform>]` table read as `T` (checked at start by
/// [`registry::check`]; a missing one is a named error).
pub(crate) fn own_table<T: serde::de::DeserializeOwned>(
    cfg: &NodeConfig,
    platform: Platform,
) -> anyhow::Result<(&crate::config::BotSettings, T)> {
    let bot = cfg.bot();
    if bot.platform != platform {
        anyhow::bail!("bot {} is not on {platform}", bot.name);
    }
    let table = bot.table(platform).ok_or_else(|| {
        anyhow::anyhow!(
            "bot {} is on {platform} but has no [bots.{platform}] table",
            bot.name
        )
    })?;
    Ok((bot, table))
}

/// The name a platform person's message is recorded under: their display name, with
/// a marker (`XiaoBa (discord user)`) when it reads as a bot's name or alias (case,
/// width and invisible characters aside), logged. People are not refused for their
/// platform name; they are only never taken for a bot.
pub(crate) fn person_name(
    matcher: &crate::turn::mention::MentionMatcher,
    platform: Platform,
    name: &str,
) -> String {
    let bot = matcher.reads_as_member(name);
    if let Some(bot) = bot {
        tracing::info!(
            name,
            bot,
            platform = platform.as_str(),
            "a person's display name reads as a bot's: shown with a marker"
        );
    }
    crate::config::names::marked_person_name(name, platform, bot.is_some())
}

/// A request on the peer-facing listener for a platform's callback this node does not
/// take (its platform is another, or it takes no callbacks): the answer that
/// platform's adapter gives, when it gives one (Feishu's console checks the URL, so it
/// is told why, and the refusal is counted); `None` leaves the request to the listener.
pub(crate) fn callback_elsewhere(
    method: &http::Method,
    path: &str,
    metrics: &Metrics,
    remote: SocketAddr,
) -> Option<Response<crate::ingress::server::Body>> {
    feishu::callback_elsewhere(method, path, metrics, remote)
}

/// The adapter for this node's bot ([`registry::build`]).
pub(crate) use registry::build;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_sees_whose_people() {
        #[allow(non_snake_case)]
        let (Local, Discord, Feishu) = (
            Platform::LOCAL,
            discord::settings::DISCORD,
            feishu::settings::FEISHU,
        );
        assert!(sees_humans_of(Local, Local), "carried over the bridge");
        assert!(sees_humans_of(Discord, Discord), "both read the channel");
        assert!(sees_humans_of(Feishu, Feishu));
        assert!(
            !sees_humans_of(Local, Discord),
            "nobody carries Discord's people"
        );
        assert!(
            !sees_humans_of(Discord, Local),
            "a Discord node ignores bridge copies"
        );
        assert!(!sees_humans_of(Feishu, Discord));
    }
}
