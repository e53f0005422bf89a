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
//! ([`settings::DingTalkIds::peer_user_ids`]) too, so every copy of the message
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
//! - [`inbound`] — a robot message to an arrival: names, ids, robots' @s, the broadcast.
//! - [`outbound`] — session webhook (real @s of people) or group send, paced.
//!
//! Outbound, through a session webhook, `@Name` of a person whose staff id the adapter
//! has seen (they wrote in a group this robot is in) becomes a real DingTalk @
//! (`@userId` in the text, the id in `atUserIds`); the group-send API has no @ list, so
//! there the text goes as written. A colleague robot always stays plain `@Name`:
//! DingTalk cannot notify a robot, the bridge does.

pub(crate) mod api;
pub(crate) mod frames;
pub(crate) mod inbound;
pub(crate) mod outbound;
pub(crate) mod settings;
pub(crate) mod stream;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;

use crate::config::NodeConfig;
use crate::platform::kit::inbound::Inbound;
use crate::platform::registry::Abilities;
use crate::platform::AdapterContext;
use crate::platform::{ChatPlatform, Declared, PostError, Visibility};
use crate::turn::mention::MentionMatcher;
use crate::wire::envelope::Envelope;
pub(crate) use settings::{DingTalkIds, DingTalkSecrets, DINGTALK};

use api::{DingTalkApi, Pacer, SENDS_PER_MINUTE};
use frames::RobotMessage;
use stream::{StreamClient, StreamHandler};

/// A person's message reaches only the robots it @-mentions; robots never see each
/// other's messages.
/// DingTalk in the registry.
pub(crate) static ADAPTER: crate::platform::registry::Adapter =
    crate::platform::registry::Adapter {
        platform: DINGTALK,
        visibility: VISIBILITY,
        abilities: ABILITIES,
        check: settings::check,
        member_ids: crate::platform::registry::no_member_ids,
        build: |cfg| Ok(Arc::new(DingTalk::from_config(cfg)?)),
    };

pub(crate) const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: false,
    bots_see_bots: false,
};

/// A robot's group message cannot be edited here, and robots have no typing signal.
pub(crate) const ABILITIES: Abilities = Abilities::POSTS_ONLY;

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

impl ChatPlatform for DingTalk {
    fn declared(&self) -> Declared<'_> {
        Declared::posting(&ADAPTER, &self.me, None)
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(PostError::of(DingTalk::post(self, env)))
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
}

#[cfg(test)]
mod tests;
