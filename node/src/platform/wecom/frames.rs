//! The long connection's frames, as WeCom's SDKs write and read them: one JSON object
//! per WebSocket text frame, `{cmd?, headers: {req_id}, body?, errcode?, errmsg?}`.
//!
//! Requests carry a `cmd`; an answer (an "ack") has none and is matched to its request
//! by `headers.req_id` alone. The server pushes `aibot_msg_callback` (a message to the
//! robot) and `aibot_event_callback` (an event) with its own req_ids.

use serde_json::{json, Value};

/// Logs in: the first frame after the connection opens.
pub const SUBSCRIBE: &str = "aibot_subscribe";
/// A heartbeat.
pub const PING: &str = "ping";
/// A message to the robot (pushed).
pub const MSG_CALLBACK: &str = "aibot_msg_callback";
/// An event (pushed): `enter_chat`, `disconnected_event`, ….
pub const EVENT_CALLBACK: &str = "aibot_event_callback";
/// An answer on a callback's req_id.
pub const RESPOND: &str = "aibot_respond_msg";
/// A proactive message to a chat.
pub const SEND: &str = "aibot_send_msg";

/// The event WeCom pushes to a connection another client has replaced.
pub const DISCONNECTED_EVENT: &str = "disconnected_event";

/// The error codes the adapter acts on (docs/wecom.md).
pub mod code {
    /// A wrong Bot ID or Secret: stop.
    pub const INVALID_CREDENTIALS: i64 = 853_000;
    /// An unknown Bot ID.
    pub const INVALID_BOT_ID: i64 = 93_019;
    /// The req_id is no longer valid (a reconnect came between, or it was an event's).
    pub const INVALID_REQ_ID: i64 = 846_605;
    /// The stream can no longer be updated.
    pub const STREAM_EXPIRED: i64 = 846_608;
    /// The content is over the cap: nothing was shown, and the same bytes never will be.
    pub const TOO_LONG: i64 = 45_002;
    /// Too many calls: wait and try again.
    pub const FREQ_LIMIT: i64 = 45_009;
    /// Too many calls at once: wait and try again.
    pub const CONCURRENCY_LIMIT: i64 = 45_033;
    /// The system is busy: try again.
    pub const BUSY: i64 = -1;
}

/// The most one message holds, in UTF-8 bytes (a stream's content, markdown, a
/// proactive send alike).
pub const MAX_MESSAGE_BYTES: usize = 20_480;

/// A fresh req_id for a request of `cmd`: `{cmd}_{unix ms}_{8 hex}`, as the SDKs make
/// them (acks are matched by it, and the login's by its prefix).
pub fn req_id(cmd: &str) -> String {
    format!(
        "{cmd}_{}_{:08x}",
        crate::wire::envelope::now_millis(),
        rand::random::<u32>()
    )
}

/// A request frame.
pub fn request(cmd: &str, req_id: &str, body: Option<Value>) -> Value {
    let mut frame = json!({"cmd": cmd, "headers": {"req_id": req_id}});
    if let Some(body) = body {
        frame["body"] = body;
    }
    frame
}

/// The login frame. It holds the secret: it is written to the socket and nowhere else.
pub fn subscribe(req_id: &str, bot_id: &str, secret: &str) -> String {
    request(
        SUBSCRIBE,
        req_id,
        Some(json!({"bot_id": bot_id, "secret": secret})),
    )
    .to_string()
}

/// A frame's req_id (empty when it has none).
pub fn req_id_of(frame: &Value) -> &str {
    frame["headers"]["req_id"].as_str().unwrap_or_default()
}

/// An ack's error code (0 when it says none).
pub fn errcode(frame: &Value) -> i64 {
    frame["errcode"].as_i64().unwrap_or(0)
}

/// A stream frame's body: the whole text so far, finished or not.
pub fn stream_body(stream_id: &str, content: &str, finish: bool) -> Value {
    json!({"msgtype": "stream", "stream": {"id": stream_id, "finish": finish, "content": content}})
}

/// A proactive markdown message's body.
pub fn send_body(chatid: &str, content: &str) -> Value {
    json!({"chatid": chatid, "msgtype": "markdown", "markdown": {"content": content}})
}

/// One `aibot_msg_callback`, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callback {
    /// Its req_id: the one an answer on it (`aibot_respond_msg`) must carry.
    pub req_id: String,
    /// WeCom's id of the message: the same on every robot it reaches.
    pub msgid: String,
    /// The group chat's id (empty in a single chat).
    pub chatid: String,
    /// `group` or `single`.
    pub chattype: String,
    /// The sender's userid (no display name comes with it).
    pub userid: String,
    /// The message's type (`text`, `mixed`, `image`, `voice`, `file`, `video`).
    pub msgtype: String,
    /// The text, rich content flattened ([`flatten`]).
    pub text: String,
    /// When it was sent (ms since the epoch), when the callback says.
    pub sent_at: Option<u64>,
}

impl Callback {
    /// The callback in `frame` (`None` when it has no msgid).
    pub fn parse(frame: &Value) -> Option<Callback> {
        let body = &frame["body"];
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let msgid = s(&body["msgid"]);
        if msgid.is_empty() {
            return None;
        }
        Some(Callback {
            req_id: req_id_of(frame).to_string(),
            msgid,
            chatid: s(&body["chatid"]),
            chattype: s(&body["chattype"]),
            userid: s(&body["from"]["userid"]),
            msgtype: s(&body["msgtype"]),
            text: flatten(body),
            sent_at: body["create_time"].as_u64().filter(|t| *t > 0).map(|t| {
                if t < 10_000_000_000 {
                    t * 1000
                } else {
                    t
                }
            }),
        })
    }

    /// Whether it came from a group chat.
    pub fn is_group(&self) -> bool {
        self.chattype == "group" || (self.chattype.is_empty() && !self.chatid.is_empty())
    }
}

/// A message body's text: `text` as written, a voice message's transcript, each item
/// of a `mixed` one in order, media as placeholders (`[image]`, `[file]`, `[video]`).
pub fn flatten(body: &Value) -> String {
    fn one(kind: &str, item: &Value) -> String {
        match kind {
            "text" => item["text"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            "voice" => item["voice"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            "image" => "[image]".to_string(),
            "file" => "[file]".to_string(),
            "video" => "[video]".to_string(),
            "mixed" => item["mixed"]["msg_item"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|i| one(i["msgtype"].as_str().unwrap_or_default(), i))
                .filter(|t| !t.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        }
    }
    one(body["msgtype"].as_str().unwrap_or_default(), body)
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_callback_is_read_and_rich_content_flattened() {
        let frame = json!({"cmd": "aibot_msg_callback", "headers": {"req_id": "r1"}, "body": {
        "msgid": "m1", "aibotid": "aibA", "chatid": "wrC1", "chattype": "group",
        "from": {"userid": "zhangsan"}, "msgtype": "mixed",
        "mixed": {"msg_item": [
            {"msgtype": "text", "text": {"content": "@Ada 看这张图"}},
            {"msgtype": "image", "image": {"url": "https://x", "aeskey": "k"}}
        ]}}});
        let c = Callback::parse(&frame).unwrap();
        assert_eq!(
            (c.req_id.as_str(), c.msgid.as_str(), c.chatid.as_str()),
            ("r1", "m1", "wrC1")
        );
        assert!(c.is_group());
        assert_eq!(c.userid, "zhangsan");
        assert_eq!(c.text, "@Ada 看这张图 [image]");
        let voice = json!({"msgtype": "voice", "voice": {"content": "语音转文字"}});
        assert_eq!(flatten(&voice), "语音转文字");
        assert!(Callback::parse(&json!({"headers": {"req_id": "r"}, "body": {}})).is_none());
    }

    #[test]
    fn req_ids_carry_their_command_as_prefix_and_the_login_holds_the_secret() {
        let id = req_id(SUBSCRIBE);
        assert!(id.starts_with("aibot_subscribe_"), "{id}");
        assert_ne!(id, req_id(SUBSCRIBE));
        let login: Value = serde_json::from_str(&subscribe(&id, "aibX", "s3cr3t")).unwrap();
        assert_eq!(login["cmd"], "aibot_subscribe");
        assert_eq!(login["headers"]["req_id"], id.as_str());
        assert_eq!(login["body"], json!({"bot_id": "aibX", "secret": "s3cr3t"}));
    }
}
