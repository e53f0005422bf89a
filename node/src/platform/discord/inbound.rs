//! Discord in: gateway dispatches to arrivals. MESSAGE_CREATE's shape, a person's
//! display name, `<@id>` mentions to the mesh's names, and a colleague's copy
//! recorded once with its bridge copy (see the module docs of `discord`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};

use serde::Deserialize;

use super::gateway::Dispatch;
use super::rest::User;
use super::{snowflake_millis, Discord, AUTHOR_MEMORY, DISCORD};
use crate::platform::kit::inbound::{PlatformMessage, Sender};
use crate::platform::AdapterContext;

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
pub(super) struct Authors {
    /// Message id → its author's user id.
    pub(super) map: HashMap<String, String>,
    /// Message ids, oldest first, to forget the oldest beyond [`AUTHOR_MEMORY`].
    order: VecDeque<String>,
}

impl Authors {
    pub(super) fn insert(&mut self, msg: &str, author: &str) {
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

impl Discord {
    pub(super) async fn on_dispatch(self: &Arc<Self>, ingest: &AdapterContext, d: Dispatch) {
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
            self.inbound.receive_aside(ingest, msg);
        } else {
            self.inbound.receive(ingest, msg).await;
        }
    }
}
