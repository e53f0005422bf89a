//! Events in: OneBot events → transcript arrivals.
//!
//! - `message` with `message_type: group`: a person's message is a human envelope
//!   under their group card, else their nickname (else `get_group_member_info`, else
//!   the QQ number; cached); a colleague's (its `user_id` is a mesh bot's `self_id`)
//!   is recorded once with its bridge copy; this bot's own is not new. The kit's one
//!   inbound path ([`crate::platform::kit::inbound`]) records them, the envelope id
//!   derived from the `message_id` and `time`.
//! - `message_sent` (the implementation's echo of this bot's own sends) is this bot's
//!   own message: not new.
//! - Text ([`Onebot::readable`]): `text` segments as written; an `at` of a mesh bot's
//!   QQ number becomes `@Name`, `at` all `@everyone`, anyone else's `@name` (the
//!   segment's name, the cached card, or the number); `image`, `face`, `record`,
//!   `file`, … become placeholders; a `reply` segment adds nothing to the text.
//! - Private messages and notices are not the mesh's (logged).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::platform::kit::inbound::{PlatformMessage, Sender};
use crate::platform::AdapterContext;

use super::segments::{self, Segment};
use super::{Onebot, ONEBOT};

/// How long a QQ copy of a colleague's message waits for its bridge copy.
pub const BRIDGE_GRACE: Duration = Duration::from_secs(10);
/// People's names remembered (the cache is emptied when it reaches this).
pub const NAME_MEMORY: usize = 2_000;

/// A OneBot id (number or string) as a string.
pub fn id_of(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => String::new(),
    }
}

impl Onebot {
    /// The text of `segs` as the mesh reads it (see the module docs).
    pub fn readable(&self, group_id: &str, segs: &[Segment]) -> String {
        let mut out = String::new();
        // An at is followed by a space, as QQ clients show it, unless text brings one.
        let mut after_at = false;
        for s in segs {
            let piece = match s {
                Segment::Text(t) => t.clone(),
                Segment::At { qq, name } => {
                    if qq == "all" {
                        "@everyone".to_string()
                    } else if let Some(bot) = self.bots_by_qq.get(qq) {
                        format!("@{bot}")
                    } else {
                        let cached = self
                            .names
                            .lock()
                            .get(&(group_id.to_string(), qq.clone()))
                            .cloned();
                        format!("@{}", name.clone().or(cached).unwrap_or_else(|| qq.clone()))
                    }
                }
                Segment::Reply(_) => continue,
                Segment::Other(kind) => match segments::placeholder(kind) {
                    Some(p) => p.to_string(),
                    None => continue,
                },
            };
            if after_at && !piece.starts_with(char::is_whitespace) {
                out.push(' ');
            }
            after_at = matches!(s, Segment::At { .. });
            out.push_str(&piece);
        }
        out.trim().to_string()
    }

    /// A person's name in a group: card, else nickname, else the cache, else
    /// `get_group_member_info`, else the number.
    async fn person_name(&self, group_id: &str, user_id: &str, sender: &Value) -> String {
        let key = (group_id.to_string(), user_id.to_string());
        let given = [&sender["card"], &sender["nickname"]]
            .into_iter()
            .filter_map(Value::as_str)
            .map(str::trim)
            .find(|s| !s.is_empty())
            .map(str::to_string);
        let name = match given {
            Some(n) => n,
            None => {
                if let Some(n) = self.names.lock().get(&key).cloned() {
                    return n;
                }
                let params = json!({"group_id": group_id.parse::<i64>().unwrap_or_default(), "user_id": user_id.parse::<i64>().unwrap_or_default(), "no_cache": false});
                match self.link.call("get_group_member_info", params).await {
                    Ok(d) => [&d["card"], &d["nickname"]]
                        .into_iter()
                        .filter_map(Value::as_str)
                        .map(str::trim)
                        .find(|s| !s.is_empty())
                        .map(str::to_string)
                        .unwrap_or_else(|| user_id.to_string()),
                    Err(e) => {
                        tracing::warn!(user_id, error = %e, "onebot: no name for a group member; using the QQ number");
                        return user_id.to_string();
                    }
                }
            }
        };
        let mut names = self.names.lock();
        if names.len() >= NAME_MEMORY {
            names.clear();
        }
        names.insert(key, name.clone());
        name
    }

    /// Handles one event from the connection.
    pub(crate) async fn on_event(self: Arc<Self>, ingest: &AdapterContext, v: Value) {
        let post_type = v["post_type"].as_str().unwrap_or_default();
        let own_echo = post_type == "message_sent";
        if !(post_type == "message" || own_echo) {
            tracing::debug!(post_type, "onebot: an event the mesh does not use");
            return;
        }
        if v["message_type"].as_str() != Some("group") {
            tracing::debug!(message_type = ?v["message_type"].as_str(), "onebot: not a group message; ignored");
            return;
        }
        let group_id = id_of(&v["group_id"]);
        let user_id = id_of(&v["user_id"]);
        let message_id = id_of(&v["message_id"]);
        let sent_at = v["time"]
            .as_u64()
            .map_or_else(crate::wire::envelope::now_millis, |t| t * 1000);
        let segs = segments::parse(&v["message"]);
        let text = self.readable(&group_id, &segs);
        let sender = if own_echo || user_id == self.self_id {
            Sender::Bot {
                colleague: Some(self.me.clone()),
                label: self.me.clone(),
            }
        } else if let Some(bot) = self.bots_by_qq.get(&user_id) {
            Sender::Bot {
                colleague: Some(bot.clone()),
                label: bot.clone(),
            }
        } else {
            let name = self.person_name(&group_id, &user_id, &v["sender"]).await;
            Sender::Person {
                name: crate::platform::person_name(&self.matcher, ONEBOT, &name),
                ids: Some(user_id.clone()),
            }
        };
        let colleague = matches!(&sender, Sender::Bot { colleague: Some(c), .. } if *c != self.me);
        let msg = PlatformMessage {
            group: self.group_for(&group_id),
            platform_msg_id: message_id,
            sent_at,
            text,
            sender,
            mentions: Vec::new(),
        };
        if colleague {
            // A colleague's copy may wait for its bridge copy: the next events do not.
            self.inbound.receive_aside(ingest, msg);
        } else {
            self.inbound.receive(ingest, msg).await;
        }
    }
}
