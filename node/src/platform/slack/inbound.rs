//! Events in: Socket Mode deliveries → transcript arrivals.
//!
//! - An event is handled once: a redelivery (the same `event_id`, `retry_attempt` >
//!   0) is logged and dropped, and so is the second event about one message (an
//!   `app_mention` and the `message` it is about share `channel` and `ts`); both are
//!   counted as `duplicate` in `botmesh_platform_events_total{platform="slack"}`, this
//!   bot's own messages as `own`.
//! - `message` (no subtype, `thread_broadcast`, `file_share`, `me_message`) and
//!   `app_mention` in a channel: a person's message is a human envelope under their
//!   display name (`users.info`, cached); a bot's (`bot_id`, or `subtype:
//!   bot_message`) is a colleague's copy when its `user` is a mesh bot's user id —
//!   recorded once with the bridge copy — or another app's, context nobody answers:
//!   the kit's one inbound path ([`crate::platform::kit::inbound`]) records them, the
//!   envelope id derived from the message's `ts` (the same on every node).
//!   This bot's own messages are ignored. `message_changed` / `message_deleted` are
//!   logged, not judged again; other subtypes (joins, topic changes) are ignored.
//!   Direct messages are not the mesh's.
//! - Text ([`readable_text`]): `<@U…>` of a mesh bot becomes `@Name`, of anyone else a
//!   `<at user_id="U…">Name</at>` tag that names no bot; `<!here>` is `@here`,
//!   `<!channel>` and `<!everyone>` are `@everyone` (so they ask every bot);
//!   `<#C…|name>` is `#name`; `<url|label>` is `label (url)` (just the label for a
//!   `mailto:`, just the URL when the label is the URL); then `&lt;` `&gt;` `&amp;`
//!   are unescaped. Files become `[image]` / `[file]` placeholders.
//! - Each message's thread (`thread_ts`) is remembered, so a reply to it goes to the
//!   same thread.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Deserialize;

use crate::platform::kit::inbound::{PlatformMessage, Sender};
use crate::platform::AdapterContext;

use super::Slack;

/// How long a Slack copy of a colleague's message waits for its bridge copy.
pub const BRIDGE_GRACE: Duration = Duration::from_secs(10);
/// Event ids and message keys remembered (a redelivery comes within minutes).
pub const SEEN_MEMORY: usize = 10_000;
/// People's display names remembered.
pub const NAME_MEMORY: usize = 2_000;

/// A bounded map: the oldest entry goes first when it is full.
#[derive(Debug)]
pub struct Recent<K, V> {
    /// The entries.
    map: HashMap<K, V>,
    /// Keys, oldest first.
    order: VecDeque<K>,
    /// Entries at most.
    cap: usize,
}

impl<K: Eq + Hash + Clone, V> Recent<K, V> {
    /// An empty map of at most `cap` entries.
    pub fn new(cap: usize) -> Self {
        Recent {
            map: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Inserts (or replaces) `k`; returns whether it was new.
    pub fn insert(&mut self, k: K, v: V) -> bool {
        if self.map.insert(k.clone(), v).is_some() {
            return false;
        }
        self.order.push_back(k);
        while self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
        true
    }

    /// The value of `k`.
    pub fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// A file attached to a message (only what its placeholder needs).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct File {
    /// `image/png`, …
    #[serde(default)]
    pub mimetype: String,
}

/// An app's profile on its messages.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct BotProfile {
    /// The app's name.
    #[serde(default)]
    pub name: String,
}

/// The fields of a `message` or `app_mention` event the mesh uses.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MessageEvent {
    /// `message` or `app_mention`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `bot_message`, `message_changed`, `thread_broadcast`, …; none for a plain message.
    #[serde(default)]
    pub subtype: Option<String>,
    /// The conversation.
    #[serde(default)]
    pub channel: String,
    /// `channel`, `group`, `im`, `mpim` (absent on `app_mention`).
    #[serde(default)]
    pub channel_type: Option<String>,
    /// The author (a bot's messages carry its bot user id too).
    #[serde(default)]
    pub user: Option<String>,
    /// Set on messages posted by an app.
    #[serde(default)]
    pub bot_id: Option<String>,
    /// The name a legacy `bot_message` was posted under.
    #[serde(default)]
    pub username: Option<String>,
    /// The posting app's profile.
    #[serde(default)]
    pub bot_profile: Option<BotProfile>,
    /// The text, in Slack's markup.
    #[serde(default)]
    pub text: String,
    /// The message's timestamp: its id within the channel.
    #[serde(default)]
    pub ts: String,
    /// The thread's parent `ts`, for a message in a thread.
    #[serde(default)]
    pub thread_ts: Option<String>,
    /// Attached files.
    #[serde(default)]
    pub files: Vec<File>,
    /// `message_changed`: the message as it is now.
    #[serde(default)]
    pub message: Option<serde_json::Value>,
    /// `message_deleted`: the deleted message's ts.
    #[serde(default)]
    pub deleted_ts: Option<String>,
}

/// A Slack `ts` (`"1700000000.000100"`) in unix milliseconds.
pub fn ts_millis(ts: &str) -> Option<u64> {
    let (secs, frac) = ts.split_once('.').unwrap_or((ts, "0"));
    let secs: u64 = secs.parse().ok()?;
    let micros: u64 = format!("{frac:0<6}").get(..6)?.parse().ok()?;
    Some(secs * 1000 + micros / 1000)
}

/// `&lt;`, `&gt;`, `&amp;` back to `<`, `>`, `&` (Slack escapes exactly these three).
pub fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// One `<…>` of Slack's markup, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token<'a> {
    /// `<@U…>` or `<@U…|name>`.
    User(&'a str),
    /// Text to show as it is (a special mention, a channel, a link, a label).
    Text(String),
}

/// Reads one `<…>`'s inside (`inner`, still escaped).
pub fn token(inner: &str) -> Token<'_> {
    let (target, label) = match inner.split_once('|') {
        Some((t, l)) => (t, Some(unescape(l))),
        None => (inner, None),
    };
    if let Some(id) = target.strip_prefix('@') {
        return Token::User(id);
    }
    if let Some(special) = target.strip_prefix('!') {
        let word = special.split('^').next().unwrap_or(special);
        return Token::Text(match word {
            "here" => "@here".into(),
            "channel" | "everyone" => "@everyone".into(),
            _ => label.unwrap_or_else(|| format!("@{word}")),
        });
    }
    if let Some(channel) = target.strip_prefix('#') {
        return Token::Text(format!("#{}", label.unwrap_or_else(|| channel.to_string())));
    }
    let url = unescape(target);
    Token::Text(match (url.strip_prefix("mailto:"), label) {
        (Some(address), label) => label.unwrap_or_else(|| address.to_string()),
        (None, None) => url,
        (None, Some(label)) => {
            let bare = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
            if label == url || label == bare || label.is_empty() {
                url
            } else {
                format!("{label} ({url})")
            }
        }
    })
}

/// The `<…>` spans of a Slack text.
fn markup() -> &'static regex::Regex {
    static RE: OnceLock<regex::Regex> = OnceLock::new();
    RE.get_or_init(|| regex::Regex::new(r"<([^<>\s][^<>]*)>").expect("valid"))
}

/// The user ids a text mentions (`<@U…>`), in order, once each.
pub fn mentioned_users(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in markup().captures_iter(text) {
        if let Token::User(id) = token(&c[1]) {
            if !out.iter().any(|o| o == id) {
                out.push(id.to_string());
            }
        }
    }
    out
}

/// The text as the mesh shows it (see the module docs): `bots` maps a mesh bot's
/// user id to its name, `names` a person's user id to their display name.
pub fn readable_text(
    text: &str,
    bots: &HashMap<String, String>,
    names: &HashMap<String, String>,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for c in markup().captures_iter(text) {
        let whole = c.get(0).expect("a match");
        out.push_str(&unescape(&text[last..whole.start()]));
        last = whole.end();
        match token(&c[1]) {
            Token::User(id) => match bots.get(id) {
                Some(bot) => {
                    out.push('@');
                    out.push_str(bot);
                }
                None => {
                    let name: String = names
                        .get(id)
                        .map_or(id, String::as_str)
                        .chars()
                        .filter(|c| !matches!(c, '<' | '>' | '"'))
                        .collect();
                    out.push_str(&format!("<at user_id=\"{id}\">{name}</at>"));
                }
            },
            Token::Text(t) => out.push_str(&t),
        }
    }
    out.push_str(&unescape(&text[last..]));
    out
}

/// Placeholders for a message's files.
fn file_placeholders(files: &[File]) -> String {
    files
        .iter()
        .map(|f| {
            if f.mimetype.starts_with("image/") {
                "[image]"
            } else {
                "[file]"
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Slack {
    /// Handles one acknowledged delivery.
    pub async fn on_delivery(
        self: &Arc<Self>,
        ingest: &AdapterContext,
        d: super::socket::Delivery,
    ) {
        if d.kind != "events_api" {
            tracing::debug!(kind = %d.kind, "slack: an envelope the mesh does not use");
            return;
        }
        let event_id = d.payload["event_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !event_id.is_empty() && !self.seen.lock().insert(format!("ev:{event_id}"), ()) {
            tracing::info!(%event_id, retry_attempt = d.retry_attempt, retry_reason = %d.retry_reason, "slack redelivered an event already handled; ignoring it");
            ingest.metrics.platform_event("slack", "duplicate");
            return;
        }
        let event = &d.payload["event"];
        match event["type"].as_str() {
            Some("message") | Some("app_mention") => match MessageEvent::deserialize(event) {
                Ok(m) => self.on_message(ingest, m).await,
                Err(e) => {
                    tracing::warn!(%event_id, error = %e, "a slack message event this build cannot read; ignoring it")
                }
            },
            other => {
                tracing::debug!(%event_id, kind = ?other, "slack: an event the mesh does not use")
            }
        }
    }

    /// Records one `message` / `app_mention` event (see the module docs).
    pub async fn on_message(self: &Arc<Self>, ingest: &AdapterContext, m: MessageEvent) {
        match m.subtype.as_deref() {
            None | Some("bot_message" | "thread_broadcast" | "file_share" | "me_message") => {}
            Some("message_changed") => {
                let ts = m
                    .message
                    .as_ref()
                    .and_then(|v| v["ts"].as_str())
                    .unwrap_or("");
                tracing::info!(channel = %m.channel, ts, "slack message edited; the transcript keeps what was judged");
                return;
            }
            Some("message_deleted") => {
                tracing::info!(channel = %m.channel, ts = ?m.deleted_ts, "slack message deleted; the transcript keeps it");
                return;
            }
            Some(other) => {
                tracing::debug!(channel = %m.channel, subtype = other, "slack: a message subtype the mesh does not record");
                return;
            }
        }
        if matches!(m.channel_type.as_deref(), Some("im" | "mpim")) || m.channel.starts_with('D') {
            tracing::info!(channel = %m.channel, "ignoring a slack direct message: botmesh bots talk in channels");
            return;
        }
        if m.ts.is_empty() || m.channel.is_empty() {
            tracing::warn!(kind = %m.kind, "a slack message event without channel or ts; ignoring it");
            return;
        }
        if !self
            .seen
            .lock()
            .insert(format!("msg:{}:{}", m.channel, m.ts), ())
        {
            tracing::debug!(channel = %m.channel, ts = %m.ts, kind = %m.kind, "slack: second event about one message (app_mention and message)");
            ingest.metrics.platform_event("slack", "duplicate");
            return;
        }
        if let Some(thread) = m.thread_ts.as_ref().filter(|t| **t != m.ts) {
            self.threads.lock().insert(m.ts.clone(), thread.clone());
        }
        let own = m.user.as_deref() == Some(self.user_id.as_str())
            || (m.bot_id.is_some() && m.bot_id == *self.bot_id.lock());
        if own {
            ingest.metrics.platform_event("slack", "own");
            return;
        }
        // A mesh bot's user id marks its message as a bot's even when an event (an
        // `app_mention` that came before its `message`) leaves `bot_id` out.
        let is_bot = m.bot_id.is_some()
            || m.subtype.as_deref() == Some("bot_message")
            || m.user
                .as_ref()
                .is_some_and(|u| self.bots_by_user_id.contains_key(u));
        let mut names = HashMap::new();
        for id in mentioned_users(&m.text) {
            if !self.bots_by_user_id.contains_key(&id) {
                let name = self.person_display_name(&id).await;
                names.insert(id, name);
            }
        }
        let mut text = readable_text(&m.text, &self.bots_by_user_id, &names)
            .trim()
            .to_string();
        let files = file_placeholders(&m.files);
        if !files.is_empty() {
            text = if text.is_empty() {
                files
            } else {
                format!("{text} {files}")
            };
        }
        if text.is_empty() {
            tracing::info!(channel = %m.channel, ts = %m.ts, "ignoring a slack message without text");
            return;
        }
        let sender = if is_bot {
            let app_name = m
                .bot_profile
                .as_ref()
                .map(|p| p.name.clone())
                .or_else(|| m.username.clone())
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| m.bot_id.clone().unwrap_or_else(|| "app".into()));
            Sender::Bot {
                colleague: m
                    .user
                    .as_ref()
                    .and_then(|u| self.bots_by_user_id.get(u))
                    .cloned(),
                label: format!("bot:{app_name}"),
            }
        } else {
            let user = m.user.clone().unwrap_or_default();
            let shown = if user.is_empty() {
                "someone".to_string()
            } else {
                self.person_display_name(&user).await
            };
            Sender::Person {
                name: crate::platform::person_name(&self.matcher, super::SLACK, &shown),
                ids: Some(user).filter(|u| !u.is_empty()),
            }
        };
        let msg = PlatformMessage {
            group: self.group_for_channel(&m.channel),
            platform_msg_id: m.ts.clone(),
            sent_at: ts_millis(&m.ts).unwrap_or_else(crate::wire::envelope::now_millis),
            text,
            sender,
            mentions: Vec::new(),
        };
        if is_bot {
            // A colleague's copy may wait for its bridge copy: not on the socket's
            // delivery task.
            self.inbound.receive_aside(ingest, msg);
        } else {
            self.inbound.receive(ingest, msg).await;
        }
    }

    /// A person's display name: cached, else `users.info` (the user id when that fails,
    /// not cached, so a later message tries again).
    pub async fn person_display_name(&self, user: &str) -> String {
        if let Some(n) = self.names.lock().get(&user.to_string()) {
            return n.clone();
        }
        match self.api.users_info(user).await {
            Ok(u) => {
                let name = u.display_name();
                self.names.lock().insert(user.to_string(), name.clone());
                name
            }
            Err(e) => {
                tracing::warn!(user, error = %e, "slack users.info failed; showing the user id (needs the users:read scope)");
                user.to_string()
            }
        }
    }
}

/// The set type the adapter keeps of what it has handled.
pub type Seen = Recent<String, ()>;

#[cfg(test)]
mod tests {
    use super::*;

    fn bots() -> HashMap<String, String> {
        [("U1001", "Ada"), ("U1002", "Bix")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn markup_is_flattened_and_unescaped() {
        let names: HashMap<String, String> = [("U2001".to_string(), "Ada <3".to_string())]
            .into_iter()
            .collect();
        let text = "<@U1001> and <@U1002|bix> ask <@U2001>, <!here> <!channel> <!subteam^S1|@devs> in <#C0700|general>: 5 &lt; 6 &amp;&amp; \"x\" &gt; y, see <https://example.com/a?b=1&amp;c=2|the docs>, <https://example.com> <http://example.com|example.com> <mailto:ops@example.com|ops@example.com>";
        assert_eq!(
            readable_text(text, &bots(), &names),
            "@Ada and @Bix ask <at user_id=\"U2001\">Ada 3</at>, @here @everyone @devs in #general: 5 < 6 && \"x\" > y, see the docs (https://example.com/a?b=1&c=2), https://example.com http://example.com ops@example.com"
        );
        assert_eq!(mentioned_users(text), vec!["U1001", "U1002", "U2001"]);
        assert_eq!(
            readable_text("&amp;lt; is literal", &bots(), &names),
            "&lt; is literal"
        );
        assert_eq!(readable_text("a <b", &bots(), &names), "a <b");
    }

    #[test]
    fn ts_are_times() {
        assert_eq!(ts_millis("1700000000.000100"), Some(1_700_000_000_000));
        assert_eq!(ts_millis("1700000000.123456"), Some(1_700_000_000_123));
        assert_eq!(ts_millis("x"), None);
    }

    #[test]
    fn recent_forgets_the_oldest() {
        let mut r = Recent::new(2);
        assert!(r.insert("a", 1));
        assert!(!r.insert("a", 2));
        r.insert("b", 3);
        r.insert("c", 4);
        assert_eq!((r.get(&"a"), r.get(&"c"), r.len()), (None, Some(&4), 2));
    }
}
