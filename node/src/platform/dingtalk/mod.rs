//! DingTalk: robot messages in over Stream mode, answers out through the session
//! webhook or the robot group-send API.
//!
//! On DingTalk a group robot receives a group message only when a person @-mentions
//! it, and robots never receive each other's messages ([`VISIBILITY`]). So the node
//! that receives a person's message records it **and broadcasts it to its peers** as
//! a human envelope whose `platform_msg_id` is DingTalk's `msgId`: every colleague
//! gets what DingTalk hid from it. When the person @-mentioned two mesh robots, both
//! nodes forward it (two envelopes, different ids, one `msgId`) and every transcript
//! keeps the first copy and calls the second a duplicate (transcripts deduplicate by
//! `platform_msg_id` as well as by id).
//!
//! The @ of a robot (picked from DingTalk's member list, so it is in `atUsers`) is
//! how a message reaches the mesh at all on DingTalk, not a choice among colleagues:
//! DingTalk leaves the receiving robot's own @ out of the text, and the adapter
//! removes the @ of each colleague robot it recognises in `atUsers`
//! ([`crate::config::DingTalkIds::peer_user_ids`]) too, so every copy of the message
//! reads the same whichever robot carried it. The message is then decided like any
//! message in a group of colleagues: every bot's judge sees it and the most relevant
//! bot answers, once. A typed `@Name` that is not such a DingTalk @ stays in the text
//! and is a mention as anywhere else. The one exception is a robot with
//! `participation = "mentions"`: a DingTalk @ is the only way to address it, so its @
//! is kept (put back in front where DingTalk left it out) and it answers as mentioned
//! ([`DingTalk::mesh_text`]).
//!
//! - [`stream`] — the Stream mode client (open, WebSocket, ping, ack, reconnect).
//! - [`frames`] — its frames and the robot message.
//! - [`api`] — access token, session webhook, group send, the per-group pace.
//!
//! Outbound, through a session webhook, `@Name` of a person whose staff id the adapter
//! has seen (they wrote in a group this robot is in) becomes a real DingTalk @
//! (`@userId` in the text, the id in `atUserIds`); the group-send API has no @ list, so
//! there the text goes as written. A colleague robot always stays plain `@Name`:
//! DingTalk cannot notify a robot, the bridge does.

pub(crate) mod api;
pub(crate) mod frames;
pub(crate) mod settings;
pub(crate) mod stream;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;

use crate::config::NodeConfig;
use crate::platform::kit::inbound::{Inbound, PlatformMessage, Received, Sender};
use crate::platform::AdapterContext;
use crate::platform::{ChatPlatform, PostError, Visibility};
use crate::turn::mention::MentionMatcher;
use crate::wire::envelope::{now_millis, Envelope};
pub(crate) use settings::{DingTalkIds, DingTalkSecrets, DINGTALK};

use api::{ApiError, DingTalkApi, Outgoing, Pacer, SENDS_PER_MINUTE, WEBHOOK_MARGIN};
use frames::RobotMessage;
use stream::{StreamClient, StreamHandler};

/// A person's message reaches only the robots it @-mentions; robots never see each
/// other's messages.
/// DingTalk in the registry.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: DINGTALK,
        visibility: VISIBILITY,
        check: settings::check,
        build: |cfg| Ok(Arc::new(DingTalk::from_config(cfg)?)),
    };

pub(crate) const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: false,
    bots_see_bots: false,
};

/// At most this many people's staff ids are remembered for outgoing @s.
pub(crate) const PEOPLE_CAPACITY: usize = 10_000;

/// A dingtalk bot's platform state.
pub(crate) struct DingTalk {
    /// The open API (token, sends).
    pub(crate) api: DingTalkApi,
    /// The Stream connection.
    pub(crate) stream: StreamClient,
    /// Spaces sends per group ([`SENDS_PER_MINUTE`]).
    pub(crate) pacer: Pacer,
    /// This bot's name.
    me: String,
    /// The kit's one inbound path, as this adapter uses it (people only: a robot
    /// never receives another robot's message).
    inbound: Inbound,
    /// The conversation that is `[mesh].group`.
    conversation_id: String,
    /// `[mesh].group`.
    mesh_group: String,
    /// Colleague robots' ids in `atUsers` → their names: DingTalk delivered the same
    /// message to them, so their @ is removed from the text like this robot's own.
    peers_by_user_id: HashMap<String, String>,
    /// Finds `@Name` of the roster in a message (to remove DingTalk's @s of robots),
    /// and tells a person called like a bot apart.
    matcher: MentionMatcher,
    /// The bots with `participation = "mentions"`, in roster order: for them a
    /// DingTalk @ is the only way to be addressed, so it stays a mention.
    mentions_only: Vec<String>,
    /// Conversation → its latest session webhook and expiry (unix ms).
    webhooks: Mutex<HashMap<String, (String, i64)>>,
    /// A person's display name → staff id, learnt from their messages.
    people: Mutex<HashMap<String, String>>,
    /// The inbound handle, once started.
    ingest: OnceLock<AdapterContext>,
}

impl std::fmt::Debug for DingTalk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DingTalk")
            .field("bot", &self.me)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

/// Why a message could not be posted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PostFailure {
    /// The group maps to no DingTalk conversation.
    #[error("group {0:?} maps to no dingtalk conversation (set dingtalk.conversation_id for [mesh].group)")]
    NoConversation(String),
    /// DingTalk refused or could not be reached.
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl ChatPlatform for DingTalk {
    fn name(&self) -> &'static str {
        "dingtalk"
    }

    fn visibility(&self) -> Visibility {
        VISIBILITY
    }

    fn should_post(&self, env: &Envelope) -> bool {
        crate::platform::own_unposted(env, &self.me)
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(async move {
            DingTalk::post(self, env)
                .await
                .map_err(|e| PostError(e.to_string()))
        })
    }

    fn start(self: Arc<Self>, ingest: AdapterContext) -> Option<BoxFuture<'static, ()>> {
        let stop = ingest.accepting.clone();
        let _ = self.ingest.set(ingest);
        Some(Box::pin(async move {
            let handler: Arc<dyn StreamHandler> = self.clone();
            self.stream.run(handler, stop).await
        }))
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("dingtalk_people", self.people.lock().len()),
            ("dingtalk_session_webhooks", self.webhooks.lock().len()),
            ("dingtalk_paced_groups", self.pacer.len()),
        ]
    }
}

impl StreamHandler for DingTalk {
    fn robot_message(&self, msg: RobotMessage) -> BoxFuture<'_, bool> {
        Box::pin(self.receive(msg))
    }

    fn event(&self, result: &'static str) {
        self.count(result);
    }
}

/// `text` without the `@Name` of each of `members` (DingTalk's @s of robots), and
/// without the space that followed each.
pub(crate) fn strip_mentions(matcher: &MentionMatcher, text: &str, members: &[&str]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for span in matcher.spans(text, &[]) {
        if span.start < last || !members.contains(&span.member.as_str()) {
            continue;
        }
        out.push_str(&text[last..span.start]);
        last = span.end;
        if let Some(c) = text[last..].chars().next().filter(|c| c.is_whitespace()) {
            last += c.len_utf8();
        }
    }
    out.push_str(&text[last..]);
    out.trim().to_string()
}

/// Whether `c` can continue a Latin handle (then `@Bob` is not found in `@Bobby`).
fn continues_handle(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl DingTalk {
    /// The DingTalk side of `cfg`'s bot (an error when its platform is not dingtalk).
    pub(crate) fn from_config(cfg: &NodeConfig) -> anyhow::Result<DingTalk> {
        let (bot, ids) = crate::platform::own_table::<DingTalkIds>(cfg, DINGTALK)?;
        let secrets = DingTalkSecrets::of(cfg);
        let base = ids.api_base_url();
        let client_id = ids.client_id.clone().unwrap_or_default();
        let robot_code = ids.robot_code.clone().unwrap_or_else(|| client_id.clone());
        let peers_by_user_id = ids
            .peer_user_ids
            .iter()
            .map(|(name, id)| (id.trim().to_string(), name.clone()))
            .collect();
        Ok(DingTalk {
            api: DingTalkApi::new(&base, &client_id, &secrets.client_secret, &robot_code)?,
            stream: StreamClient::new(&base, &client_id, &secrets.client_secret)?,
            pacer: Pacer::new(SENDS_PER_MINUTE, Duration::from_secs(60)),
            me: bot.name.clone(),
            inbound: Inbound {
                platform: "dingtalk",
                me: bot.name.clone(),
                max_depth: cfg.mesh().max_depth,
                grace: Duration::ZERO,
            },
            conversation_id: ids.conversation_id.clone().unwrap_or_default(),
            mesh_group: cfg.mesh().group.clone(),
            peers_by_user_id,
            matcher: MentionMatcher::new(&crate::turn::roster(&cfg.settings.bots)),
            mentions_only: cfg
                .settings
                .bots
                .iter()
                .filter(|b| b.participation == crate::config::Participation::Mentions)
                .map(|b| b.name.clone())
                .collect(),
            webhooks: Mutex::new(HashMap::new()),
            people: Mutex::new(HashMap::new()),
            ingest: OnceLock::new(),
        })
    }

    /// Counts `botmesh_dingtalk_events_total{result}` (once started).
    fn count(&self, result: &str) {
        if let Some(i) = self.ingest.get() {
            i.metrics.dingtalk_event(result);
        }
    }

    /// The mesh group of a conversation: `[mesh].group` for the configured one, else
    /// the conversation id itself.
    pub(crate) fn group_for_conversation(&self, conversation_id: &str) -> String {
        if conversation_id == self.conversation_id {
            self.mesh_group.clone()
        } else {
            conversation_id.to_string()
        }
    }

    /// The conversation a group's messages go to.
    pub(crate) fn conversation_for_group(&self, group: &str) -> Option<String> {
        if group == self.mesh_group {
            Some(self.conversation_id.clone())
        } else if group.starts_with("cid") {
            Some(group.to_string())
        } else {
            None
        }
    }

    /// The display name a person's message is recorded under: their nick, told apart
    /// from a bot of the same name (the bridge refuses a human named like a bot).
    fn author_name(&self, msg: &RobotMessage) -> String {
        let nick = msg.sender_nick.trim();
        if nick.is_empty() {
            return "dingtalk user".into();
        }
        crate::platform::person_name(&self.matcher, DINGTALK, nick)
    }

    /// Remembers what a message teaches about sending: the conversation's session
    /// webhook and the sender's staff id.
    fn learn(&self, msg: &RobotMessage) {
        if let (Some(url), Some(exp)) = (&msg.session_webhook, msg.session_webhook_expired_time) {
            if !url.is_empty() {
                self.webhooks
                    .lock()
                    .insert(msg.conversation_id.clone(), (url.clone(), exp));
            }
        }
        if let Some(staff) = msg.sender_staff_id.as_deref().filter(|s| !s.is_empty()) {
            let nick = msg.sender_nick.trim();
            if !nick.is_empty() && self.matcher.reads_as_member(nick).is_none() {
                let mut people = self.people.lock();
                if people.len() >= PEOPLE_CAPACITY && !people.contains_key(nick) {
                    if let Some(k) = people.keys().next().cloned() {
                        people.remove(&k);
                    }
                }
                people.insert(nick.to_string(), staff.to_string());
            }
        }
    }

    /// The session webhook of `conversation` while it is valid for another
    /// [`WEBHOOK_MARGIN`].
    pub(crate) fn valid_webhook(&self, conversation: &str, now_ms: i64) -> Option<String> {
        let hooks = self.webhooks.lock();
        let (url, exp) = hooks.get(conversation)?;
        (*exp - now_ms > WEBHOOK_MARGIN.as_millis() as i64).then(|| url.clone())
    }

    /// The text to send: each `@Nick` of a person whose staff id is known becomes
    /// `@staffId` with the id in `atUserIds` (DingTalk renders it as a real @ there);
    /// anything else — a colleague robot included — stays as written.
    pub(crate) fn outgoing(&self, text: &str) -> Outgoing {
        let people = self.people.lock();
        let mut nicks: Vec<(&String, &String)> = people.iter().collect();
        nicks.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
        let mut out = String::with_capacity(text.len());
        let mut at_user_ids: Vec<String> = Vec::new();
        let mut rest = text;
        while let Some(pos) = rest.find(['@', '＠']) {
            let at_len = rest[pos..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&rest[..pos]);
            let after = &rest[pos + at_len..];
            let hit = nicks.iter().find(|(nick, _)| {
                after.starts_with(nick.as_str())
                    && !(nick.ends_with(continues_handle)
                        && after[nick.len()..].starts_with(continues_handle))
            });
            match hit {
                Some((nick, staff)) => {
                    out.push('@');
                    out.push_str(staff);
                    if !at_user_ids.contains(staff) {
                        at_user_ids.push((*staff).clone());
                    }
                    rest = &after[nick.len()..];
                }
                None => {
                    out.push_str(&rest[pos..pos + at_len]);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        Outgoing {
            text: out,
            at_user_ids,
        }
    }

    /// The text the mesh records for a message DingTalk delivered to the robots
    /// `delivered` (this one, and the colleagues recognised in `atUsers`): the @ of a
    /// judging robot is removed (it was only the way in), the @ of a robot with
    /// `participation = "mentions"` is kept, put back in front if DingTalk left it
    /// out (it is the only way to address such a robot). The result depends only on
    /// the message, so every carrier records the same text.
    ///
    /// A person's command (`/why`, `/stop`, …) is the exception: DingTalk delivered it
    /// to the robots it @-mentions, and those are whom it addresses, so it keeps an @
    /// of each of them, in front, in a stable order.
    pub(crate) fn mesh_text(&self, text: &str, delivered: &[&str]) -> String {
        if crate::turn::command::verb_of(text).is_some() {
            let text = strip_mentions(&self.matcher, text, delivered);
            let mut names = delivered.to_vec();
            names.sort_unstable();
            names.dedup();
            let mut out: String = names.iter().map(|b| format!("@{b} ")).collect();
            out.push_str(&text);
            return out;
        }
        let (keep, strip): (Vec<&str>, Vec<&str>) = delivered
            .iter()
            .copied()
            .partition(|b| self.mentions_only.iter().any(|m| m == b));
        let text = strip_mentions(&self.matcher, text, &strip);
        let missing: Vec<&str> = self
            .mentions_only
            .iter()
            .map(String::as_str)
            .filter(|b| keep.contains(b) && !self.matcher.mentions(&text, &[], b))
            .collect();
        if missing.is_empty() || text.is_empty() {
            return text;
        }
        let mut out: String = missing.iter().map(|b| format!("@{b} ")).collect();
        out.push_str(&text);
        out
    }

    /// Records one robot message (see [`StreamHandler::robot_message`]).
    pub(crate) async fn receive(&self, msg: RobotMessage) -> bool {
        let Some(ingest) = self.ingest.get() else {
            return false;
        };
        if msg.is_direct() {
            tracing::info!(msg_id = %msg.msg_id, "ignoring a direct message: botmesh bots talk in group chats");
            self.count("ignored");
            return true;
        }
        tracing::debug!(msg_id = %msg.msg_id, conversation = %msg.conversation_id, at_users = ?msg.at_users, is_in_at_list = msg.is_in_at_list, "dingtalk robot message");
        self.learn(&msg);
        let text = msg.flattened_text();
        if text.is_empty() {
            tracing::info!(msg_id = %msg.msg_id, msgtype = %msg.msgtype, "ignoring an empty dingtalk message");
            self.count("ignored");
            return true;
        }
        let also: Vec<&str> = msg
            .at_users
            .iter()
            .filter_map(|u| {
                self.peers_by_user_id
                    .get(&u.dingtalk_id)
                    .or_else(|| {
                        u.staff_id
                            .as_ref()
                            .and_then(|s| self.peers_by_user_id.get(s))
                    })
                    .map(String::as_str)
            })
            .collect();
        let mut delivered = also.clone();
        if msg.is_in_at_list {
            delivered.push(&self.me);
        }
        let text = self.mesh_text(&text, &delivered);
        if text.is_empty() {
            tracing::info!(msg_id = %msg.msg_id, "ignoring a dingtalk message that only @-mentions robots");
            self.count("ignored");
            return true;
        }
        let group = self.group_for_conversation(&msg.conversation_id);
        let sent_at = msg
            .create_at
            .filter(|t| *t > 0)
            .map(|t| t as u64)
            .unwrap_or_else(now_millis);
        // The kit names it by its DingTalk id, the same on every robot that receives
        // (and forwards) it, so the bots' claims name the same trigger.
        let message = PlatformMessage {
            group,
            platform_msg_id: msg.msg_id.clone(),
            sent_at,
            text,
            sender: Sender::Person {
                name: self.author_name(&msg),
                ids: person_ids(&msg),
            },
            mentions: Vec::new(),
        };
        match self.inbound.receive(ingest, message).await {
            Received::Failed => {
                self.count("unrecorded");
                false
            }
            Received::Duplicate => {
                self.count("duplicate");
                true
            }
            received => {
                tracing::info!(msg_id = %msg.msg_id, conversation = %msg.conversation_id, also_delivered_to = ?also, result = received.as_str(), "dingtalk message recorded and forwarded to the peers");
                self.count("message");
                true
            }
        }
    }

    /// Posts the bot's own message: paced per group, through the conversation's
    /// session webhook while it is valid, else the group-send API. Returns the
    /// platform id (`processQueryKey`, or `session:<envelope id>` for a webhook send,
    /// which returns none). Failures are logged here.
    pub(crate) async fn post(&self, env: &Envelope) -> Result<String, PostFailure> {
        let Some(conversation) = self.conversation_for_group(&env.group) else {
            let e = PostFailure::NoConversation(env.group.clone());
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not posted to dingtalk; the mesh still gets it");
            return Err(e);
        };
        let out = self.outgoing(&env.text);
        self.pacer.acquire(&conversation).await;
        if let Some(url) = self.valid_webhook(&conversation, now_millis() as i64) {
            match self.api.send_by_session(&url, &out).await {
                Ok(()) => {
                    tracing::info!(bot = %self.me, id = %env.id, %conversation, "posted to dingtalk (session webhook)");
                    self.count("send_session");
                    return Ok(format!("session:{}", env.id));
                }
                Err(e) => {
                    tracing::warn!(bot = %self.me, id = %env.id, error = %e, "session webhook failed; using the group-send API");
                }
            }
        }
        // The group-send API's sampleText has no @ list: there `@Name` stays as written.
        let plain = Outgoing {
            text: env.text.clone(),
            at_user_ids: Vec::new(),
        };
        match self.api.send_to_group(&conversation, &plain).await {
            Ok(key) => {
                tracing::info!(bot = %self.me, id = %env.id, %conversation, process_query_key = %key, "posted to dingtalk (group send)");
                self.count("send_group");
                Ok(key)
            }
            Err(e) => {
                tracing::error!(bot = %self.me, id = %env.id, %conversation, error = %e, "could not post to dingtalk; the mesh still gets the message");
                self.count("send_failed");
                Err(e.into())
            }
        }
    }
}

/// The sender's ids, for `[mesh] operators` (`dingtalk:<id>`): the staff id (stable
/// in the robot's org) and the sender id DingTalk gives the robot, space-separated;
/// `None` when DingTalk gives neither.
fn person_ids(msg: &RobotMessage) -> Option<String> {
    let ids: Vec<&str> = msg
        .sender_staff_id
        .as_deref()
        .into_iter()
        .chain(std::iter::once(msg.sender_id.as_str()))
        .filter(|id| !id.is_empty() && !id.contains(char::is_whitespace))
        .collect();
    (!ids.is_empty()).then(|| ids.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;
    use std::path::Path;

    /// The shape docs/dingtalk.md shows.
    const DOCS_CONFIG: &str = r#"
[mesh]
group = "team"
secret_env = "BOTMESH_SECRET"

[[bots]]
name = "XiaoBa"
aliases = ["小八"]
bridge = "127.0.0.1:7101"
api = "127.0.0.1:8101"
platform = "dingtalk"

[bots.dingtalk]
client_id = "dingxiaoba0000001"
client_secret_env = "XIAOBA_CLIENT_SECRET"
robot_code = "dingxiaoba0000001"
conversation_id = "cid6KeBBLoveMJOGXoYKF5x7EeiodoA=="
[bots.dingtalk.peer_user_ids]
ErGoz = "$:LWCP_v1:$ergoz=="

[[bots]]
name = "ErGoz"
aliases = ["二狗"]
bridge = "127.0.0.1:7102"
api = "127.0.0.1:8102"
"#;

    fn settings(text: &str) -> Result<Settings, crate::config::ConfigError> {
        Settings::from_toml(text, Path::new("peers.toml"))
            .and_then(|s| crate::platform::registry::check(&s).map(|()| s))
    }

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_documented_config_loads_and_resolves_its_secret() {
        let s = settings(DOCS_CONFIG).unwrap();
        let d: DingTalkIds = s.bots[0].table(DINGTALK).unwrap();
        assert_eq!(d.api_base_url(), settings::DINGTALK_BASE_URL);
        assert_eq!(d.peer_user_ids["ErGoz"], "$:LWCP_v1:$ergoz==");
        let mut vars = env(&[("BOTMESH_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]);
        let e = NodeConfig::resolve(s.clone(), "XiaoBa", None, &vars).unwrap_err();
        assert_eq!(e.key, "bots[0].dingtalk.client_secret_env");
        vars.insert("XIAOBA_CLIENT_SECRET".into(), "the-client-secret".into());
        let cfg = NodeConfig::resolve(s.clone(), "XiaoBa", None, &vars).unwrap();
        let secret = &DingTalkSecrets::of(&cfg);
        assert_eq!(secret.client_secret, "the-client-secret");
        assert!(!format!("{cfg:?} {secret:?}").contains("the-client-secret"));
        let other = NodeConfig::resolve(s, "ErGoz", None, &vars).unwrap();
        assert!(
            other.platform_secret("client_secret_env").is_none(),
            "a local bot needs no dingtalk secret"
        );
        // The adapter builds from it, maps groups and conversations both ways.
        let dir = tempfile::tempdir().unwrap();
        let cfg = NodeConfig::resolve(
            settings(DOCS_CONFIG).unwrap(),
            "XiaoBa",
            Some(dir.path().to_path_buf()),
            &vars,
        )
        .unwrap();
        let d = DingTalk::from_config(&cfg).unwrap();
        assert_eq!(
            d.group_for_conversation("cid6KeBBLoveMJOGXoYKF5x7EeiodoA=="),
            "team"
        );
        assert_eq!(d.group_for_conversation("cidOther=="), "cidOther==");
        assert_eq!(
            d.conversation_for_group("team").as_deref(),
            Some("cid6KeBBLoveMJOGXoYKF5x7EeiodoA==")
        );
        assert_eq!(
            d.conversation_for_group("cidOther==").as_deref(),
            Some("cidOther==")
        );
        assert_eq!(d.conversation_for_group("elsewhere"), None);
        assert_eq!(
            crate::platform::visibility_of(DINGTALK),
            Visibility {
                humans_reach_every_bot: false,
                bots_see_bots: false
            }
        );
        // ErGoz may carry humans to XiaoBa only if ErGoz is on a platform like this one.
        let rules = crate::platform::human_rules(&cfg);
        assert!(!rules.platform_delivers_humans);
        assert!(rules.carriers.contains("ErGoz"), "ErGoz is local");
    }

    #[test]
    fn dingtalk_config_mistakes_name_their_key() {
        let cases = [
            (
                "client_id = \"dingxiaoba0000001\"\n",
                "",
                "bots[0].dingtalk.client_id",
            ),
            (
                "client_secret_env = \"XIAOBA_CLIENT_SECRET\"\n",
                "",
                "bots[0].dingtalk.client_secret_env",
            ),
            (
                "robot_code = \"dingxiaoba0000001\"\n",
                "",
                "bots[0].dingtalk.robot_code",
            ),
            (
                "conversation_id = \"cid6KeBBLoveMJOGXoYKF5x7EeiodoA==\"\n",
                "conversation_id = \" \"\n",
                "bots[0].dingtalk.conversation_id",
            ),
            (
                "ErGoz = \"$:LWCP_v1:$ergoz==\"",
                "Nobody = \"x\"",
                "bots[0].dingtalk.peer_user_ids.Nobody",
            ),
            (
                "ErGoz = \"$:LWCP_v1:$ergoz==\"",
                "XiaoBa = \"x\"",
                "bots[0].dingtalk.peer_user_ids.XiaoBa",
            ),
            (
                "ErGoz = \"$:LWCP_v1:$ergoz==\"",
                "ErGoz = \"\"",
                "bots[0].dingtalk.peer_user_ids.ErGoz",
            ),
            (
                "robot_code = \"dingxiaoba0000001\"\n",
                "robot_code = \"dingxiaoba0000001\"\napi_base_url = \"api.dingtalk.com\"\n",
                "bots[0].dingtalk.api_base_url",
            ),
            (
                "robot_code = \"dingxiaoba0000001\"\n",
                "robot_code = \"dingxiaoba0000001\"\nrobotcode = \"typo\"\n",
                "bots[0].dingtalk",
            ),
        ];
        for (from, to, key) in cases {
            assert!(DOCS_CONFIG.contains(from), "{from}");
            let e = settings(&DOCS_CONFIG.replace(from, to)).unwrap_err();
            assert_eq!(e.key, key, "{e}");
        }
        let without_table = DOCS_CONFIG
            .split("[bots.dingtalk]")
            .next()
            .unwrap()
            .to_string()
            + "[[bots]]\nname = \"ErGoz\"\nbridge = \"127.0.0.1:7102\"\napi = \"127.0.0.1:8102\"\n";
        let e = settings(&without_table).unwrap_err();
        assert_eq!(e.key, "bots[0].dingtalk", "{e}");
    }

    fn adapter() -> (tempfile::TempDir, DingTalk) {
        let dir = tempfile::tempdir().unwrap();
        let vars = env(&[
            ("BOTMESH_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("XIAOBA_CLIENT_SECRET", "s"),
        ]);
        let cfg = NodeConfig::resolve(
            settings(DOCS_CONFIG).unwrap(),
            "XiaoBa",
            Some(dir.path().to_path_buf()),
            &vars,
        )
        .unwrap();
        let d = DingTalk::from_config(&cfg).unwrap();
        (dir, d)
    }

    #[test]
    fn dingtalk_ats_of_robots_are_removed_and_typed_mentions_kept() {
        let (_dir, d) = adapter();
        let m = &d.matcher;
        assert_eq!(
            strip_mentions(m, "@ErGoz please check @小八 too", &["ErGoz", "XiaoBa"]),
            "please check too"
        );
        assert_eq!(
            strip_mentions(m, "ask @ErGoz about it", &["XiaoBa"]),
            "ask @ErGoz about it",
            "a typed @ that DingTalk did not deliver to stays a mention"
        );
        assert_eq!(
            strip_mentions(m, "`@ErGoz` in code", &["ErGoz"]),
            "`@ErGoz` in code"
        );
        // A person's command keeps the @ of each robot it reached: they are whom it
        // addresses (the same text on every robot that carries it).
        assert_eq!(
            d.mesh_text("/why @小八", &["XiaoBa"]),
            "@XiaoBa /why",
            "DingTalk delivered it to XiaoBa alone"
        );
        assert_eq!(
            d.mesh_text("@ErGoz /stop", &["XiaoBa", "ErGoz"]),
            d.mesh_text("/stop", &["ErGoz", "XiaoBa"]),
        );
        assert_eq!(
            d.mesh_text("/stop", &["XiaoBa", "ErGoz"]),
            "@ErGoz @XiaoBa /stop"
        );
    }

    #[test]
    fn a_mentions_only_robot_keeps_its_dingtalk_at_and_a_judging_one_loses_it() {
        let vars = env(&[
            ("BOTMESH_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("XIAOBA_CLIENT_SECRET", "s"),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let toml = DOCS_CONFIG.replace(
            "aliases = [\"二狗\"]\n",
            "aliases = [\"二狗\"]\nparticipation = \"mentions\"\n",
        );
        assert_ne!(toml, DOCS_CONFIG);
        let cfg = NodeConfig::resolve(
            settings(&toml).unwrap(),
            "XiaoBa",
            Some(dir.path().to_path_buf()),
            &vars,
        )
        .unwrap();
        let d = DingTalk::from_config(&cfg).unwrap();
        // XiaoBa's copy: DingTalk left out XiaoBa's own @ and kept ErGoz's.
        let from_xiaoba = d.mesh_text("@ErGoz what broke?", &["ErGoz", "XiaoBa"]);
        assert_eq!(from_xiaoba, "@ErGoz what broke?");
        // Only XiaoBa was picked: nothing to keep.
        assert_eq!(d.mesh_text("what broke?", &["XiaoBa"]), "what broke?");
        // A copy that lost ErGoz's @ gets it back, in front.
        assert_eq!(d.mesh_text("what broke?", &["ErGoz"]), "@ErGoz what broke?");
        // A judging robot's own @ typed again in the text goes too.
        assert_eq!(
            d.mesh_text("@XiaoBa @ErGoz what broke?", &["XiaoBa", "ErGoz"]),
            "@ErGoz what broke?"
        );
    }

    #[test]
    fn outgoing_ats_of_known_people_become_real_ats_and_robots_stay_text() {
        let (_dir, d) = adapter();
        let learn = |nick: &str, staff: &str| {
            d.learn(&RobotMessage {
                conversation_id: "cid1".into(),
                msg_id: "m".into(),
                sender_nick: nick.into(),
                sender_staff_id: Some(staff.into()),
                session_webhook: Some("http://127.0.0.1:1/hook".into()),
                session_webhook_expired_time: Some(10_000_000),
                ..Default::default()
            })
        };
        learn("Mira", "staff-mira");
        learn("Mira Chen", "staff-chen");
        learn("ErGoz", "not-a-person");
        let out = d.outgoing("@Mira Chen and ＠Mira: ask @ErGoz, not @Miranda or mira@corp.com");
        assert_eq!(
            out.text,
            "@staff-chen and @staff-mira: ask @ErGoz, not @Miranda or mira@corp.com"
        );
        assert_eq!(out.at_user_ids, vec!["staff-chen", "staff-mira"]);
        // The session webhook is used while it has more than a minute left.
        assert!(d.valid_webhook("cid1", 10_000_000 - 61_000).is_some());
        assert!(d.valid_webhook("cid1", 10_000_000 - 59_000).is_none());
        assert!(d.valid_webhook("cid2", 0).is_none());
    }
}
