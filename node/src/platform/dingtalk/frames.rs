//! Stream mode's wire format: the JSON frames DingTalk pushes over the WebSocket, the
//! acknowledgement every frame gets, and the robot message a callback carries.
//!
//! A frame is `{"specVersion", "type", "headers", "data"}` where `type` is `SYSTEM`,
//! `EVENT` or `CALLBACK`, `headers` carries at least `messageId` and `topic`, and
//! `data` is a JSON document inside a string. Its acknowledgement is
//! `{"code": 200, "headers": {"contentType", "messageId"}, "message": "OK", "data"}`
//! with the frame's `messageId`; a `ping` gets its own data back.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The callback topic of robot messages (what botmesh subscribes to).
pub(crate) const TOPIC_ROBOT: &str = "/v1.0/im/bot/messages/get";
/// The system topic of DingTalk's keep-alive: answered with the frame's data.
pub(crate) const TOPIC_PING: &str = "ping";
/// The system topic of a server-side goodbye: acknowledge, then reconnect.
pub(crate) const TOPIC_DISCONNECT: &str = "disconnect";

/// One frame from the Stream gateway.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub(crate) struct Frame {
    /// Protocol version (`1.0`).
    #[serde(rename = "specVersion", default)]
    pub(crate) spec_version: String,
    /// `SYSTEM`, `EVENT` or `CALLBACK`.
    #[serde(rename = "type", default)]
    pub(crate) kind: String,
    /// `messageId`, `topic`, `contentType`, `time`, …: kept as a map because each
    /// frame type has its own extra headers and only two matter here.
    #[serde(default)]
    pub(crate) headers: serde_json::Map<String, Value>,
    /// The payload: JSON text inside a string.
    #[serde(default)]
    pub(crate) data: String,
}

/// What a frame asks of the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// Keep-alive: acknowledge with the same data.
    Ping,
    /// The gateway is going away: acknowledge, close, reconnect.
    Disconnect,
    /// A robot message (`CALLBACK` on [`TOPIC_ROBOT`]).
    RobotMessage,
    /// Anything else (other system topics, events, other callbacks): acknowledged
    /// and otherwise ignored.
    Other(String),
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    /// Not JSON, or not a frame's shape.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A frame without `headers.messageId` cannot be acknowledged.
    #[error("frame without headers.messageId")]
    NoMessageId,
}

impl Frame {
    /// Parses one text frame.
    pub(crate) fn parse(text: &str) -> Result<Frame, FrameError> {
        let f: Frame =
            serde_json::from_str(text).map_err(|e| FrameError::Malformed(e.to_string()))?;
        if f.message_id().is_empty() {
            return Err(FrameError::NoMessageId);
        }
        Ok(f)
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// `headers.messageId`: what the acknowledgement names.
    pub(crate) fn message_id(&self) -> &str {
        self.header("messageId")
    }

    /// `headers.topic`.
    pub(crate) fn topic(&self) -> &str {
        self.header("topic")
    }

    /// What the frame asks for.
    pub(crate) fn classify(&self) -> FrameKind {
        match (self.kind.as_str(), self.topic()) {
            ("SYSTEM", TOPIC_PING) => FrameKind::Ping,
            ("SYSTEM", TOPIC_DISCONNECT) => FrameKind::Disconnect,
            ("CALLBACK", TOPIC_ROBOT) => FrameKind::RobotMessage,
            (kind, topic) => FrameKind::Other(format!("{kind} {topic}")),
        }
    }

    /// The acknowledgement of this frame with `code`, echoing `data` (a JSON text).
    pub(crate) fn ack(&self, code: u16, message: &str, data: &str) -> String {
        serde_json::json!({
            "code": code,
            "headers": {
                "contentType": "application/json",
                "messageId": self.message_id(),
            },
            "message": message,
            "data": data,
        })
        .to_string()
    }
}

/// One entry of a robot message's `atUsers`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct AtUser {
    /// The @-mentioned member's id as this robot sees it (robots have one too).
    #[serde(rename = "dingtalkId", default)]
    pub(crate) dingtalk_id: String,
    /// Their staff (user) id in the organisation, for people of the robot's org.
    #[serde(rename = "staffId", default)]
    pub(crate) staff_id: Option<String>,
}

/// A robot message: the `data` of a [`TOPIC_ROBOT`] callback.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RobotMessage {
    /// The conversation (`cid…`): a group, or a direct chat.
    pub(crate) conversation_id: String,
    /// `"1"` direct, `"2"` group (a string in DingTalk's JSON; a number accepted).
    #[serde(default)]
    pub(crate) conversation_type: Value,
    /// DingTalk's message id: the `platform_msg_id` that makes every copy one message.
    pub(crate) msg_id: String,
    /// `text`, `richText`, `picture`, `audio`, `file`, `video`, …
    #[serde(default)]
    pub(crate) msgtype: String,
    /// The sender's display name: the transcript's author.
    #[serde(default)]
    pub(crate) sender_nick: String,
    /// The sender's staff id (people of the robot's org): what an `atUserIds` names.
    #[serde(default)]
    pub(crate) sender_staff_id: Option<String>,
    /// The sender's id as this robot sees it.
    #[serde(default)]
    pub(crate) sender_id: String,
    /// `{"content": …}` of a text message.
    #[serde(default)]
    pub(crate) text: Option<TextContent>,
    /// The body of a rich-text, picture, audio, file or video message.
    #[serde(default)]
    pub(crate) content: Option<Value>,
    /// Everyone the message @-mentions (robots included).
    #[serde(default)]
    pub(crate) at_users: Vec<AtUser>,
    /// This robot is among the @-mentioned.
    #[serde(default)]
    pub(crate) is_in_at_list: bool,
    /// A URL that answers into this conversation without a token, until it expires.
    #[serde(default)]
    pub(crate) session_webhook: Option<String>,
    /// When [`RobotMessage::session_webhook`] expires (unix ms).
    #[serde(default)]
    pub(crate) session_webhook_expired_time: Option<i64>,
    /// When the message was sent (unix ms).
    #[serde(default)]
    pub(crate) create_at: Option<i64>,
    /// The receiving robot's code.
    #[serde(default)]
    pub(crate) robot_code: Option<String>,
}

/// The `text` of a text message.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct TextContent {
    /// What the person typed (DingTalk leaves out the @ of the receiving robot).
    #[serde(default)]
    pub(crate) content: String,
}

impl RobotMessage {
    /// Parses a callback's `data`.
    pub(crate) fn parse(data: &str) -> Result<RobotMessage, FrameError> {
        serde_json::from_str(data).map_err(|e| FrameError::Malformed(format!("robot message: {e}")))
    }

    /// A direct (one-to-one) conversation rather than a group.
    pub(crate) fn is_direct(&self) -> bool {
        match &self.conversation_type {
            Value::String(s) => s.trim() == "1",
            Value::Number(n) => n.as_u64() == Some(1),
            _ => false,
        }
    }

    /// The message as text: text as typed, rich text's pieces with `[image]` for its
    /// pictures, and a placeholder for media (`[image]`, `[voice]`, `[file: name]`, …).
    pub(crate) fn flattened_text(&self) -> String {
        let content = self.content.as_ref();
        let field = |k: &str| {
            content
                .and_then(|c| c.get(k))
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
        };
        match self.msgtype.as_str() {
            "text" | "" => self
                .text
                .as_ref()
                .map(|t| t.content.trim().to_string())
                .unwrap_or_default(),
            "richText" => {
                let items = content
                    .and_then(|c| c.get("richText"))
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let mut out = String::new();
                for item in items {
                    if let Some(t) = item.get("text").and_then(Value::as_str) {
                        out.push_str(t);
                    } else if item.get("downloadCode").is_some()
                        || item.get("pictureDownloadCode").is_some()
                        || item.get("type").and_then(Value::as_str) == Some("picture")
                    {
                        if !out.is_empty() && !out.ends_with(char::is_whitespace) {
                            out.push(' ');
                        }
                        out.push_str("[image]");
                    }
                }
                out.trim().to_string()
            }
            "picture" => "[image]".into(),
            "audio" => match field("recognition") {
                Some(words) => format!("[voice] {words}"),
                None => "[voice]".into(),
            },
            "video" => "[video]".into(),
            "file" => match field("fileName") {
                Some(name) => format!("[file: {name}]"),
                None => "[file]".into(),
            },
            other => format!("[{other}]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_classified_and_acknowledged_with_their_message_id() {
        let ping = Frame::parse(r#"{"specVersion":"1.0","type":"SYSTEM","headers":{"contentType":"application/json","messageId":"m-1","time":"1690362102194","topic":"ping"},"data":"{\"opaque\":\"abc\"}"}"#).unwrap();
        assert_eq!(ping.classify(), FrameKind::Ping);
        let ack: Value = serde_json::from_str(&ping.ack(200, "OK", &ping.data)).unwrap();
        assert_eq!(
            ack,
            serde_json::json!({"code": 200, "headers": {"contentType": "application/json", "messageId": "m-1"}, "message": "OK", "data": "{\"opaque\":\"abc\"}"})
        );
        let cb = Frame::parse(r#"{"type":"CALLBACK","headers":{"messageId":"m-2","topic":"/v1.0/im/bot/messages/get"},"data":"{}"}"#).unwrap();
        assert_eq!(cb.classify(), FrameKind::RobotMessage);
        let bye = Frame::parse(
            r#"{"type":"SYSTEM","headers":{"messageId":"m-3","topic":"disconnect"},"data":""}"#,
        )
        .unwrap();
        assert_eq!(bye.classify(), FrameKind::Disconnect);
        assert!(matches!(
            Frame::parse(r#"{"type":"SYSTEM","headers":{"topic":"ping"}}"#),
            Err(FrameError::NoMessageId)
        ));
        assert!(matches!(
            Frame::parse("nope"),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn rich_text_and_media_become_text_with_placeholders() {
        let m = RobotMessage::parse(r#"{"conversationId":"cid1","conversationType":"2","msgId":"msg1","msgtype":"richText","senderNick":"Alice","content":{"richText":[{"text":"look at this"},{"pictureDownloadCode":"x","downloadCode":"y","type":"picture"},{"text":"\nand this"}]}}"#).unwrap();
        assert_eq!(m.flattened_text(), "look at this [image]\nand this");
        assert!(!m.is_direct());
        let p = RobotMessage::parse(r#"{"conversationId":"c","conversationType":1,"msgId":"m","msgtype":"picture","content":{"downloadCode":"d"}}"#).unwrap();
        assert_eq!(p.flattened_text(), "[image]");
        assert!(p.is_direct());
        let a = RobotMessage::parse(r#"{"conversationId":"c","msgId":"m","msgtype":"audio","content":{"recognition":"hello there","duration":3}}"#).unwrap();
        assert_eq!(a.flattened_text(), "[voice] hello there");
        let f = RobotMessage::parse(r#"{"conversationId":"c","msgId":"m","msgtype":"file","content":{"fileName":"plan.pdf"}}"#).unwrap();
        assert_eq!(f.flattened_text(), "[file: plan.pdf]");
        let t = RobotMessage::parse(
            r#"{"conversationId":"c","msgId":"m","msgtype":"text","text":{"content":"  hi  "}}"#,
        )
        .unwrap();
        assert_eq!(t.flattened_text(), "hi");
    }
}
