//! People by name: Feishu events name a sender by open_id only, so the display
//! name comes, cheapest first, from
//!
//! 1. what is already known: names learned from events' `mentions[]` (free) and
//!    earlier look-ups, cached;
//! 2. the contact API (`GET /open-apis/contact/v3/users/{open_id}`, scope
//!    `contact:user.base:readonly`), one call per new person;
//! 3. the chat members API (`GET /open-apis/im/v1/chats/{chat_id}/members`, scope
//!    `im:chat.members:read`), one listing per chat at most every
//!    [`MEMBERS_REFRESH`], which names everyone in it at once.
//!
//! Without either scope the open_id is shown; that is logged once, and a person
//! whose name could not be found is not looked up again for [`RETRY_AFTER`], so a
//! busy chat never spends API quota on every message.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::platform::feishu::{FeishuClient, SendError};

/// How often a chat's member list may be fetched again.
pub(crate) const MEMBERS_REFRESH: Duration = Duration::from_secs(600);
/// How long a person whose name was not found is shown by open_id before the
/// next look-up.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(600);
/// At most this many names are cached (the cache restarts when full).
pub(crate) const CAPACITY: usize = 20_000;

/// Whether an API may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Not tried yet, or it worked.
    Open,
    /// Feishu refused it (no scope): not asked again.
    Refused,
}

struct Inner {
    by_open_id: HashMap<String, String>,
    contact: Access,
    members: Access,
    members_fetched: HashMap<String, Instant>,
    not_found: HashMap<String, Instant>,
    warned: bool,
}

/// Display names of people by open_id (in this bot's app).
pub(crate) struct Names {
    inner: Mutex<Inner>,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            inner: Mutex::new(Inner {
                by_open_id: HashMap::new(),
                contact: Access::Open,
                members: Access::Open,
                members_fetched: HashMap::new(),
                not_found: HashMap::new(),
                warned: false,
            }),
        }
    }
}

impl Names {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Remembers a name seen for free (a mention in an event).
    pub(crate) fn learn(&self, open_id: &str, name: &str) {
        let (open_id, name) = (open_id.trim(), name.trim());
        if open_id.is_empty() || name.is_empty() {
            return;
        }
        let mut g = self.lock();
        if g.by_open_id.len() >= CAPACITY {
            g.by_open_id.clear();
        }
        g.by_open_id.insert(open_id.to_string(), name.to_string());
        g.not_found.remove(open_id);
    }

    /// How many names are cached.
    pub(crate) fn len(&self) -> usize {
        self.lock().by_open_id.len()
    }

    /// The display name of `open_id`, a sender in `chat_id`; the open_id itself when
    /// no name can be found (see the module docs for the order and the limits).
    pub(crate) async fn display_name(
        &self,
        client: &FeishuClient,
        open_id: &str,
        chat_id: &str,
    ) -> String {
        let now = Instant::now();
        let (ask_contact, ask_members) = {
            let mut g = self.lock();
            if let Some(n) = g.by_open_id.get(open_id) {
                return n.clone();
            }
            if g.not_found
                .get(open_id)
                .is_some_and(|at| now.duration_since(*at) < RETRY_AFTER)
            {
                return open_id.to_string();
            }
            g.not_found
                .retain(|_, at| now.duration_since(*at) < RETRY_AFTER);
            let fresh = g
                .members_fetched
                .get(chat_id)
                .is_some_and(|at| now.duration_since(*at) < MEMBERS_REFRESH);
            (
                g.contact == Access::Open,
                g.members == Access::Open && !fresh && !chat_id.is_empty(),
            )
        };
        if ask_contact {
            match client.user_name(open_id).await {
                Ok(Some(name)) => {
                    self.learn(open_id, &name);
                    return name;
                }
                Ok(None) => {}
                Err(SendError::Api { code, msg }) => {
                    tracing::info!(code, %msg, "feishu contact API refused (no contact:user.base:readonly scope?): names come from chat members instead");
                    self.lock().contact = Access::Refused;
                }
                Err(e) => tracing::debug!(error = %e, "feishu contact look-up failed"),
            }
        }
        if ask_members {
            match client.chat_members(chat_id).await {
                Ok(members) => {
                    self.lock().members_fetched.insert(chat_id.to_string(), now);
                    for (id, name) in members {
                        self.learn(&id, &name);
                    }
                }
                Err(SendError::Api { code, msg }) => {
                    tracing::info!(code, %msg, "feishu chat members API refused (no im:chat.members:read scope?)");
                    self.lock().members = Access::Refused;
                }
                Err(e) => tracing::debug!(error = %e, "feishu chat members look-up failed"),
            }
        }
        let mut g = self.lock();
        if let Some(n) = g.by_open_id.get(open_id) {
            return n.clone();
        }
        g.not_found.insert(open_id.to_string(), now);
        if !g.warned {
            g.warned = true;
            tracing::warn!(%open_id, "no display name for a feishu user: grant the app contact:user.base:readonly or im:chat.members:read (docs/feishu.md); people are shown by open_id meanwhile");
        }
        open_id.to_string()
    }
}

/// `botmesh feishu ids --bot NAME`: the bot's own open_id and its colleagues'
/// open_ids *in this bot's app* (open_ids differ per app), as TOML to paste under
/// `[bots.feishu]`. Colleagues are found by their display names (name or alias) in
/// the @mentions of the chat's recent messages; whoever is not found is listed with
/// what to do. Calls `GET /open-apis/bot/v3/info` and up to 10 pages of
/// `GET /open-apis/im/v1/messages`.
pub async fn colleague_ids(cfg: &crate::config::NodeConfig) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let bot = cfg.bot();
    let me = cfg
        .settings
        .bot(&bot.name)
        .map(|(i, _)| i)
        .unwrap_or_default();
    let ids: super::FeishuIds = bot
        .table(super::FEISHU)
        .ok_or_else(|| anyhow::anyhow!("bots[{me}].feishu: {} has no feishu table", bot.name))?;
    if bot.platform != super::FEISHU {
        anyhow::bail!("bots[{me}].platform: {} is not on feishu", bot.name);
    }
    let secrets = super::FeishuSecrets::of(cfg);
    let chat = ids.chat_id.as_deref().ok_or_else(|| {
        anyhow::anyhow!("bots[{me}].feishu.chat_id is not set: the ids are read from that chat's recent @mentions")
    })?;
    let client = FeishuClient::new(
        &ids.base_url(),
        ids.app_id.as_deref().unwrap_or_default(),
        &secrets.app_secret,
        crate::platform::feishu::RetryPolicy {
            attempts: 3,
            ..Default::default()
        },
    )?;
    let info = client.bot_info().await?;
    let mentions = client.recent_mentions(chat, 10).await?;
    let matcher = crate::turn::mention::MentionMatcher::new(&crate::platform::registry::roster(
        &cfg.settings.bots,
    ));
    let mut found: std::collections::BTreeMap<String, String> = Default::default();
    for (open_id, name) in mentions {
        if open_id == info.open_id {
            continue;
        }
        if let Some(member) = matcher.resolve(name.trim()) {
            if member != bot.name {
                found.entry(member.to_string()).or_insert(open_id);
            }
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# {} — app {} ({:?})",
        bot.name,
        ids.app_id.as_deref().unwrap_or_default(),
        info.app_name
    );
    let _ = writeln!(out, "[bots.feishu]");
    let _ = writeln!(out, "open_id = {:?}", info.open_id);
    let _ = writeln!(out, "[bots.feishu.peer_open_ids]");
    for (name, open_id) in &found {
        let _ = writeln!(out, "{name} = {open_id:?}");
    }
    for p in cfg.peers().filter(|p| !found.contains_key(&p.name)) {
        let _ = writeln!(
            out,
            "# {}: not found — ask someone to @mention {} in chat {chat} (its display name must be its name or an alias), then run this again",
            p.name, p.name
        );
    }
    Ok(out)
}
