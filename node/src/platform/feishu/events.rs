//! Callbacks: their shapes (schema 1.0 and 2.0), parsing, and authentication ([`EventAuth`]).

use std::borrow::Cow;

use http::{HeaderMap, StatusCode};
use serde::Deserialize;

use super::*;

// ---------------------------------------------------------------------------------
// Callbacks
// ---------------------------------------------------------------------------------

/// Why a callback was refused. Each maps to a status and a reason code for the logs.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EventError {
    /// This bot is not on Feishu.
    #[error("feishu is not enabled for this bot")]
    NotEnabled,
    /// The body is over the limit.
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
    /// The body could not be read.
    #[error("could not read body: {0}")]
    Unreadable(String),
    /// Not JSON, or not a callback's shape.
    #[error("malformed callback: {0}")]
    Malformed(String),
    /// A signature header without its companions.
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    /// The timestamp header is not unix seconds.
    #[error("X-Lark-Request-Timestamp is not unix seconds")]
    BadTimestamp,
    /// The timestamp is outside the window.
    #[error("timestamp is {0} s away from now (allowed ±{MAX_SKEW_SECS} s)")]
    Stale(i64),
    /// The signature does not match.
    #[error("X-Lark-Signature does not match")]
    BadSignature,
    /// An Encrypt Key is configured but the event is not signed.
    #[error("unsigned callback: with an encrypt key configured only the encrypted url_verification may be unsigned")]
    Unsigned,
    /// An `encrypt` body arrived but no Encrypt Key is configured.
    #[error("encrypted body, but this bot has no encrypt key configured (feishu.encrypt_key_env)")]
    NoEncryptKey,
    /// The `encrypt` field does not decrypt under our key.
    #[error("cannot decrypt: {0}")]
    Decrypt(#[from] CryptoError),
    /// The verification token is missing or wrong.
    #[error("verification token missing or wrong")]
    BadToken,
    /// The event is for another app.
    #[error("event is for app {0:?}, not this bot's app")]
    WrongApp(String),
}

impl EventError {
    /// The HTTP status answered.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            EventError::NotEnabled => StatusCode::NOT_FOUND,
            EventError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            EventError::Unreadable(_) | EventError::Malformed(_) | EventError::NoEncryptKey => {
                StatusCode::BAD_REQUEST
            }
            EventError::WrongApp(_) => StatusCode::FORBIDDEN,
            EventError::MissingHeader(_)
            | EventError::BadTimestamp
            | EventError::Stale(_)
            | EventError::BadSignature
            | EventError::Unsigned
            | EventError::Decrypt(_)
            | EventError::BadToken => StatusCode::UNAUTHORIZED,
        }
    }

    /// A short reason code for logs.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            EventError::NotEnabled => "not_enabled",
            EventError::TooLarge(_) => "too_large",
            EventError::Unreadable(_) => "unreadable",
            EventError::Malformed(_) => "malformed",
            EventError::MissingHeader(_) => "missing_header",
            EventError::BadTimestamp => "bad_timestamp",
            EventError::Stale(_) => "stale",
            EventError::BadSignature => "bad_signature",
            EventError::Unsigned => "unsigned",
            EventError::NoEncryptKey => "no_encrypt_key",
            EventError::Decrypt(_) => "decrypt_failed",
            EventError::BadToken => "bad_token",
            EventError::WrongApp(_) => "wrong_app",
        }
    }
}

/// A schema 2.0 event header.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub(crate) struct EventHeader {
    /// Unique per event (and the same on every retry of it).
    pub(crate) event_id: String,
    /// E.g. `im.message.receive_v1`.
    pub(crate) event_type: String,
    /// The Verification Token.
    #[serde(default)]
    pub(crate) token: Option<String>,
    /// The app the event is for (`cli_…`).
    #[serde(default)]
    pub(crate) app_id: Option<String>,
    /// When the event was created (a string of digits).
    #[serde(default)]
    pub(crate) create_time: Option<String>,
    /// The tenant.
    #[serde(default)]
    pub(crate) tenant_key: Option<String>,
}

/// A decrypted, parsed callback.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Callback {
    /// The request URL check: answer `{"challenge": …}`.
    UrlVerification {
        /// The value to echo.
        challenge: String,
        /// The Verification Token it carried.
        token: Option<String>,
    },
    /// A schema 2.0 event.
    Event {
        /// Its header.
        header: EventHeader,
        /// The `event` object, parsed further per type.
        event: serde_json::Value,
    },
    /// A schema 1.0 (`event_callback`) event; acknowledged, not handled.
    Legacy {
        /// Its `uuid` (the 1.0 event id).
        uuid: Option<String>,
        /// Its `type`.
        kind: Option<String>,
        /// The Verification Token it carried.
        token: Option<String>,
    },
}

impl Callback {
    /// The Verification Token the callback carried.
    pub(crate) fn token(&self) -> Option<&str> {
        match self {
            Callback::UrlVerification { token, .. } | Callback::Legacy { token, .. } => {
                token.as_deref()
            }
            Callback::Event { header, .. } => header.token.as_deref(),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawCallback {
    #[serde(default)]
    schema: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    challenge: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default)]
    header: Option<serde_json::Value>,
    #[serde(default)]
    event: Option<serde_json::Value>,
}

/// Parses a (decrypted) callback body.
pub(crate) fn parse_callback(plain: &[u8]) -> Result<Callback, EventError> {
    let raw: RawCallback =
        serde_json::from_slice(plain).map_err(|e| EventError::Malformed(e.to_string()))?;
    if raw.kind.as_deref() == Some("url_verification") {
        let challenge = raw
            .challenge
            .ok_or_else(|| EventError::Malformed("url_verification without challenge".into()))?;
        // Schema 2.0 URL checks may carry the token in their header.
        let header_token = raw
            .header
            .as_ref()
            .and_then(|h| h.get("token")?.as_str().map(str::to_string));
        return Ok(Callback::UrlVerification {
            challenge,
            token: raw.token.or(header_token),
        });
    }
    if raw.schema.is_some() || raw.header.is_some() {
        let header = raw
            .header
            .ok_or_else(|| EventError::Malformed("schema 2.0 event without header".into()))?;
        let header = EventHeader::deserialize(header)
            .map_err(|e| EventError::Malformed(format!("header: {e}")))?;
        if header.event_id.is_empty()
            || header.event_id.len() > 128
            || header.event_id.chars().any(char::is_whitespace)
        {
            return Err(EventError::Malformed(
                "header.event_id must be 1..=128 characters without spaces".into(),
            ));
        }
        return Ok(Callback::Event {
            header,
            event: raw.event.unwrap_or(serde_json::Value::Null),
        });
    }
    Ok(Callback::Legacy {
        uuid: raw.uuid,
        kind: raw.kind,
        token: raw.token,
    })
}

/// Someone's ids as Feishu gives them.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct UserIds {
    /// Per-app id (`ou_…`): the same person has a different one in each app.
    #[serde(default)]
    pub(crate) open_id: String,
    /// Per-developer id (`on_…`).
    #[serde(default)]
    pub(crate) union_id: Option<String>,
    /// Tenant-wide user id.
    #[serde(default)]
    pub(crate) user_id: Option<String>,
}

/// Who sent a message.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct Sender {
    /// Their ids.
    #[serde(default)]
    pub(crate) sender_id: UserIds,
    /// `user` for a person, `app` for a bot.
    #[serde(default)]
    pub(crate) sender_type: String,
}

/// One entry of a message's `mentions[]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct Mention {
    /// The placeholder in the text, e.g. `@_user_1`.
    pub(crate) key: String,
    /// Who is mentioned.
    #[serde(default)]
    pub(crate) id: UserIds,
    /// Their display name.
    #[serde(default)]
    pub(crate) name: String,
}

/// `event.message` of `im.message.receive_v1`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct Message {
    /// `om_…`.
    pub(crate) message_id: String,
    /// The chat (`oc_…`).
    pub(crate) chat_id: String,
    /// `group` or `p2p`.
    #[serde(default)]
    pub(crate) chat_type: String,
    /// `text`, `post`, `image`, …
    pub(crate) message_type: String,
    /// A JSON string; for text `{"text": "@_user_1 hi"}`.
    #[serde(default)]
    pub(crate) content: String,
    /// The mentions' placeholders and ids.
    #[serde(default)]
    pub(crate) mentions: Vec<Mention>,
    /// Unix milliseconds, as a string.
    #[serde(default)]
    pub(crate) create_time: Option<String>,
    /// The thread root, when a reply.
    #[serde(default)]
    pub(crate) root_id: Option<String>,
    /// The message replied to, when a reply.
    #[serde(default)]
    pub(crate) parent_id: Option<String>,
}

impl Message {
    /// The text of a `text` message (placeholders left as they are).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn text(&self) -> Option<String> {
        if self.message_type != "text" {
            return None;
        }
        #[derive(Deserialize)]
        struct Content {
            text: String,
        }
        serde_json::from_str::<Content>(&self.content)
            .ok()
            .map(|c| c.text)
    }
}

/// The event of `im.message.receive_v1`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct MessageReceived {
    /// Who sent it.
    #[serde(default)]
    pub(crate) sender: Sender,
    /// The message.
    pub(crate) message: Message,
}

impl MessageReceived {
    /// Parses the `event` object of an `im.message.receive_v1` callback.
    pub(crate) fn from_event(event: &serde_json::Value) -> Result<MessageReceived, EventError> {
        MessageReceived::deserialize(event)
            .map_err(|e| EventError::Malformed(format!("im.message.receive_v1: {e}")))
    }
}

/// What authenticates callbacks: the app and its subscription's secrets.
#[derive(Clone)]
pub(crate) struct EventAuth {
    /// This bot's App ID; events for another app are refused.
    pub(crate) app_id: String,
    /// The Verification Token, when configured.
    pub(crate) verification_token: Option<String>,
    /// The Encrypt Key, when configured (then events must be signed).
    pub(crate) encrypt_key: Option<String>,
}

impl std::fmt::Debug for EventAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventAuth")
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
pub(super) struct Outer {
    #[serde(default)]
    encrypt: Option<String>,
}

impl EventAuth {
    /// Checks, decrypts and parses one callback (see the module docs for the order).
    /// `now` is unix seconds.
    pub(crate) fn open(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<Callback, EventError> {
        let outer: Outer =
            serde_json::from_slice(body).map_err(|e| EventError::Malformed(e.to_string()))?;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let mut signed = false;
        if let (Some(key), Some(sig)) = (&self.encrypt_key, header(HEADER_SIGNATURE)) {
            let ts = header(HEADER_TIMESTAMP).ok_or(EventError::MissingHeader(HEADER_TIMESTAMP))?;
            let nonce = header(HEADER_NONCE).ok_or(EventError::MissingHeader(HEADER_NONCE))?;
            let at: i64 = ts.trim().parse().map_err(|_| EventError::BadTimestamp)?;
            let skew = now.saturating_sub(at);
            if skew.abs() > MAX_SKEW_SECS {
                return Err(EventError::Stale(skew));
            }
            let want = signature(ts, nonce, key, body);
            if !crate::wire::signing::constant_time_eq(
                want.as_bytes(),
                sig.trim().to_ascii_lowercase().as_bytes(),
            ) {
                return Err(EventError::BadSignature);
            }
            signed = true;
        }
        let encrypted = outer.encrypt.is_some();
        let plain: Cow<[u8]> = match &outer.encrypt {
            Some(data) => {
                let key = self.encrypt_key.as_ref().ok_or(EventError::NoEncryptKey)?;
                Cow::Owned(decrypt(key, data)?)
            }
            None => Cow::Borrowed(body),
        };
        let cb = parse_callback(&plain)?;
        if self.encrypt_key.is_some() && !signed {
            // Feishu does not sign the URL check; decrypting it proved the key.
            let url_check = matches!(cb, Callback::UrlVerification { .. });
            if !(url_check && encrypted) {
                return Err(EventError::Unsigned);
            }
        }
        if let Some(want) = &self.verification_token {
            if !cb.token().is_some_and(|t| {
                crate::wire::signing::constant_time_eq(t.as_bytes(), want.as_bytes())
            }) {
                return Err(EventError::BadToken);
            }
        }
        if let Callback::Event { header, .. } = &cb {
            if let Some(app) = header.app_id.as_ref().filter(|a| **a != self.app_id) {
                return Err(EventError::WrongApp(app.clone()));
            }
        }
        Ok(cb)
    }
}
