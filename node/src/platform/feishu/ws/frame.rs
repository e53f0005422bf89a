//! The protobuf frame every binary WebSocket message is (`pbbp2.Frame`), its headers,
//! and the control and data frames the client builds.

use std::time::Duration;

use prost::Message as _;

use super::{WsError, HEADER_BIZ_RT, HEADER_TYPE, METHOD_CONTROL};

/// `pbbp2.Header`: one key/value header of a frame.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Header {
    /// Header name (`type`, `message_id`, …).
    #[prost(string, required, tag = "1")]
    pub key: String,
    /// Header value, always a string (numbers are decimal).
    #[prost(string, required, tag = "2")]
    pub value: String,
}

/// `pbbp2.Frame` (proto2): every binary WebSocket message of the long connection.
/// Derived by hand from the schema the SDKs embed, so no `protoc` is needed.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Frame {
    /// Sequence id (echoed in the acknowledgement).
    #[prost(uint64, required, tag = "1")]
    pub seq_id: u64,
    /// Log id (echoed in the acknowledgement).
    #[prost(uint64, required, tag = "2")]
    pub log_id: u64,
    /// The service id from the connection URL (pings carry it).
    #[prost(int32, required, tag = "3")]
    pub service: i32,
    /// [`METHOD_CONTROL`] or [`super::METHOD_DATA`].
    #[prost(int32, required, tag = "4")]
    pub method: i32,
    /// Key/value headers ([`HEADER_TYPE`], …).
    #[prost(message, repeated, tag = "5")]
    pub headers: Vec<Header>,
    /// How the payload is encoded (unused by Feishu so far; kept for the echo).
    #[prost(string, optional, tag = "6")]
    pub payload_encoding: Option<String>,
    /// The payload's type (unused by Feishu so far; kept for the echo).
    #[prost(string, optional, tag = "7")]
    pub payload_type: Option<String>,
    /// The event JSON (or one fragment of it), a pong's config, an ack's code.
    #[prost(bytes = "vec", optional, tag = "8")]
    pub payload: Option<Vec<u8>>,
    /// The newer, string log id (kept for the echo).
    #[prost(string, optional, tag = "9")]
    pub log_id_new: Option<String>,
}

impl Frame {
    /// The first header named `key`.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.key == key)
            .map(|h| h.value.as_str())
    }

    /// Sets header `key` (replacing an existing one).
    pub fn set_header(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.headers.iter_mut().find(|h| h.key == key) {
            Some(h) => h.value = value,
            None => self.headers.push(Header {
                key: key.to_string(),
                value,
            }),
        }
    }

    /// A ping for the connection's service.
    pub fn ping(service: i32) -> Frame {
        Frame {
            service,
            method: METHOD_CONTROL,
            headers: vec![Header {
                key: HEADER_TYPE.into(),
                value: "ping".into(),
            }],
            ..Frame::default()
        }
    }

    /// The acknowledgement of this data frame: the same frame, `biz_rt` and
    /// `{"code": code}`.
    pub fn ack(&self, code: u16, biz_rt: Duration) -> Frame {
        let mut a = self.clone();
        a.set_header(HEADER_BIZ_RT, biz_rt.as_millis().to_string());
        a.payload = Some(format!("{{\"code\":{code}}}").into_bytes());
        a
    }

    /// Serialises for the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.encode_to_vec()
    }

    /// Parses a binary WebSocket message.
    pub fn from_bytes(b: &[u8]) -> Result<Frame, WsError> {
        Frame::decode(b).map_err(|e| WsError::Protocol(format!("not a pbbp2 frame: {e}")))
    }
}
