//! Feishu/Lark: events in; messages with real `<at>` mentions out.
//!
//! A bot whose `platform = "feishu"` gets its humans from Feishu itself, so this module
//! is both its ingress for human messages and its egress for its own replies.
//!
//! Events come one of two ways (`[bots.feishu] mode`):
//!
//! - `long_connection` (the default): the node opens an outbound WebSocket to Feishu
//!   ([`crate::platform::feishu_ws`]); no public address, Verification Token or
//!   Encrypt Key. Each event is acknowledged once it is recorded ([`WsEvents`]).
//! - `webhook`: Feishu POSTs callbacks to the bridge listener, as below.
//!
//! # Inbound: `POST /feishu/v1/events` (on the peer-facing listener)
//!
//! Cheapest check first, each rejection logged with its reason (never a secret):
//!
//! 1. size (413), JSON shape (400);
//! 2. with an Encrypt Key configured, `X-Lark-Signature` = hex sha256 of
//!    `X-Lark-Request-Timestamp + X-Lark-Request-Nonce + encrypt_key + raw body`,
//!    compared in constant time, and the timestamp within ±300 s (401). Only the
//!    `url_verification` challenge may come unsigned, and then it must come
//!    encrypted under our key (Feishu does not sign the URL check);
//! 3. `{"encrypt": "…"}` bodies are decrypted: AES-256-CBC, key = sha256(encrypt_key),
//!    IV = the first 16 bytes of the base64-decoded data, PKCS#7 padding (401 when
//!    that fails: whoever sent it does not hold the key);
//! 4. the Verification Token (`token`, or `header.token` in schema 2.0), constant
//!    time (401), and `header.app_id` must be this bot's app (403);
//! 5. the event id is deduplicated against [`EventDedup`], a small file in the data
//!    folder that remembers ids for 24 h, because Feishu retries for hours and a
//!    restart must not re-process them (200 `{"duplicate": true}`);
//! 6. 200 at once; the message is handled afterwards in a tracked task, well within
//!    Feishu's 3 s deadline whatever the transcript or the LLM are doing.
//!
//! An `im.message.receive_v1` text message from a person becomes a human envelope
//! (depth 0, `platform_msg_id` = its `om_…` id) that is recorded but never broadcast:
//! every bot of a Feishu mesh gets its humans from Feishu. Its `@_user_N`
//! placeholders are resolved through the event's `mentions[]`: a colleague (by this
//! app's open_ids, [`crate::config::FeishuIds::peer_open_ids`], else by display name)
//! becomes `@Name`, anyone else an `<at user_id="ou_…">Name</at>` tag that names no
//! bot; the mention list itself also goes to [`crate::turn::on_message`].
//!
//! A message another mesh bot posted (`sender_type` "app") is the same message that
//! bot broadcast over the bridge with its `om_…` id as `platform_msg_id`; the bridge
//! copy is authoritative (it carries depth and reply_to), so the Feishu copy is only
//! recorded — as context nobody answers — if the bridge copy has not come within
//! [`BRIDGE_GRACE`].
//!
//! # Outbound
//!
//! [`FeishuClient`]: a tenant access token from
//! `POST /open-apis/auth/v3/tenant_access_token/internal`, cached and refreshed five
//! minutes before it expires or when Feishu calls it invalid ([`TOKEN_INVALID_CODES`]);
//! `POST /open-apis/im/v1/messages?receive_id_type=chat_id` with the envelope id as
//! the idempotency `uuid`; 429, 5xx and Feishu's rate-limit codes retried with
//! exponential backoff and jitter; a per-chat token bucket of [`SENDS_PER_CHAT_PER_SEC`].
//! `@Name` of a colleague becomes `<at user_id="ou_…">Name</at>`.

use parking_lot::Mutex;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine;
use cbc::cipher::{block_padding::Pkcs7, BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use tokio::time::Instant;

use crate::config::pacing::TokenBucket;
use crate::config::{FeishuMode, NodeConfig, Platform};
use crate::ingress::ingest::{Arrival, Ingest};
use crate::ingress::server::{self, Body, BodyError};
use crate::platform::feishu_ws::{self, WsSettings, WsStatus};
use crate::platform::{ChatPlatform, PostError, Visibility};
use crate::store::transcript::Appended;
use crate::telemetry::metrics::Metrics;
use crate::turn::mention::{MentionMatcher, PlatformMention};
use crate::wire::envelope::{now_millis, Author, AuthorKind, Envelope};
use futures_util::future::BoxFuture;

/// Where Feishu posts event callbacks, on the peer-facing listener.
pub const EVENTS_PATH: &str = "/feishu/v1/events";
/// Lark's (international) open platform base URL; Feishu's is the default (only the
/// tests name it: `[bots.feishu] base_url` sets it).
#[cfg(test)]
pub(crate) const LARK_BASE_URL: &str = "https://open.larksuite.com";
/// Header carrying the request signature.
pub const HEADER_SIGNATURE: &str = "x-lark-signature";
/// Header carrying the request's unix timestamp (seconds).
pub const HEADER_TIMESTAMP: &str = "x-lark-request-timestamp";
/// Header carrying the request nonce.
pub const HEADER_NONCE: &str = "x-lark-request-nonce";
/// Largest accepted |now − timestamp| of a signed callback, in seconds.
pub(crate) const MAX_SKEW_SECS: i64 = 300;
/// How long event ids are remembered: Feishu retries a failed push for hours.
pub(crate) const EVENT_ID_TTL: Duration = Duration::from_secs(24 * 3600);
/// At most this many event ids are remembered (the oldest are forgotten first).
pub(crate) const EVENT_ID_CAPACITY: usize = 200_000;
/// How long a Feishu copy of a mesh bot's message waits for its bridge copy.
pub(crate) const BRIDGE_GRACE: Duration = Duration::from_secs(10);
/// Messages this node sends to one chat per second (Feishu allows about 5 per group,
/// shared by all bots).
pub(crate) const SENDS_PER_CHAT_PER_SEC: f64 = 5.0;
/// Feishu codes meaning "this access token is invalid or expired": refresh and retry.
/// 99991663 tenant token invalid, 99991661 token missing/malformed, 99991668 and
/// 99991671 access token invalid, 99991664 app token invalid (oapi-sdk-go retries on
/// 99991663/99991664/99991671; the rest are from the generic error code list).
pub(crate) const TOKEN_INVALID_CODES: [i64; 5] = [99991661, 99991663, 99991664, 99991668, 99991671];
/// Feishu codes meaning "too many requests": back off and retry.
pub(crate) const RATE_LIMIT_CODES: [i64; 2] = [99991400, 230020];
/// The longest a sender's display name is looked up before the message is recorded
/// under the open_id instead.
pub(crate) const NAME_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// The data-folder file that remembers handled event ids.
pub(crate) const DEDUP_FILE: &str = "feishu-events.log";

// ---------------------------------------------------------------------------------
// Crypto
// ---------------------------------------------------------------------------------

/// Why an `encrypt` payload could not be decrypted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CryptoError {
    /// Not base64.
    #[error("not base64")]
    Base64,
    /// Shorter than an IV plus one block, or not whole blocks.
    #[error("ciphertext length {0} is not an IV plus whole AES blocks")]
    Length(usize),
    /// Wrong key, or tampered data: the padding does not check out.
    #[error("bad padding (wrong encrypt key?)")]
    Padding,
}

fn aes_key(encrypt_key: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, encrypt_key.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(d.as_ref());
    key
}

/// Decrypts a Feishu `encrypt` field: base64 of IV (16 bytes) + AES-256-CBC ciphertext
/// with key sha256(`encrypt_key`) and PKCS#7 padding.
pub(crate) fn decrypt(encrypt_key: &str, encrypted: &str) -> Result<Vec<u8>, CryptoError> {
    let data = base64::engine::general_purpose::STANDARD
        .decode(encrypted.trim())
        .map_err(|_| CryptoError::Base64)?;
    if data.len() < 32 || data.len() % 16 != 0 {
        return Err(CryptoError::Length(data.len()));
    }
    let (iv, ciphertext) = data.split_at(16);
    cbc::Decryptor::<aes::Aes256>::new_from_slices(&aes_key(encrypt_key), iv)
        .expect("key and IV lengths are fixed")
        .decrypt_padded_vec_mut::<Pkcs7>(ciphertext)
        .map_err(|_| CryptoError::Padding)
}

/// Encrypts like Feishu does (the inverse of [`decrypt`]); for tests and fakes.
pub fn encrypt(encrypt_key: &str, plaintext: &[u8], iv: [u8; 16]) -> String {
    let mut out = iv.to_vec();
    out.extend(
        cbc::Encryptor::<aes::Aes256>::new_from_slices(&aes_key(encrypt_key), &iv)
            .expect("key and IV lengths are fixed")
            .encrypt_padded_vec_mut::<Pkcs7>(plaintext),
    );
    base64::engine::general_purpose::STANDARD.encode(out)
}

/// `X-Lark-Signature`: lowercase hex sha256 of timestamp + nonce + encrypt_key + body.
pub fn signature(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(timestamp.as_bytes());
    ctx.update(nonce.as_bytes());
    ctx.update(encrypt_key.as_bytes());
    ctx.update(body);
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

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
struct RawCallback {
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
struct Outer {
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

// ---------------------------------------------------------------------------------
// Event id dedup
// ---------------------------------------------------------------------------------

/// Remembers handled event ids for a day, in memory and in a small append-only file
/// (`<unix seconds> <event id>` per line, compacted on open and when it grows), so
/// neither Feishu's retries nor a restart make a message count twice.
pub(crate) struct EventDedup {
    path: PathBuf,
    ttl_secs: u64,
    capacity: usize,
    inner: Mutex<DedupInner>,
}

struct DedupInner {
    seen: HashMap<String, u64>,
    order: VecDeque<(u64, String)>,
    file: Option<std::fs::File>,
    appended: usize,
}

impl EventDedup {
    /// Opens (creating) the file at `path`, keeping ids younger than `ttl`.
    pub(crate) fn open(
        path: &Path,
        ttl: Duration,
        capacity: usize,
        now_secs: u64,
    ) -> std::io::Result<EventDedup> {
        let ttl_secs = ttl.as_secs();
        let mut inner = DedupInner {
            seen: HashMap::new(),
            order: VecDeque::new(),
            file: None,
            appended: 0,
        };
        match std::fs::File::open(path) {
            Ok(f) => {
                for line in std::io::BufReader::new(f).lines() {
                    let line = line?;
                    let Some((at, id)) = line.split_once(' ') else {
                        continue;
                    };
                    let (Ok(at), id) = (at.parse::<u64>(), id.trim()) else {
                        continue;
                    };
                    if id.is_empty() || now_secs.saturating_sub(at) >= ttl_secs {
                        continue;
                    }
                    if inner.seen.insert(id.to_string(), at).is_none() {
                        inner.order.push_back((at, id.to_string()));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        while inner.order.len() > capacity {
            if let Some((_, id)) = inner.order.pop_front() {
                inner.seen.remove(&id);
            }
        }
        let dedup = EventDedup {
            path: path.to_path_buf(),
            ttl_secs,
            capacity,
            inner: Mutex::new(inner),
        };
        {
            let mut inner = dedup.inner.lock();
            dedup.compact(&mut inner)?;
        }
        Ok(dedup)
    }

    /// Rewrites the file with the live ids only, then appends to it.
    fn compact(&self, inner: &mut DedupInner) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            for (at, id) in &inner.order {
                writeln!(f, "{at} {id}")?;
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        inner.file = Some(
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&self.path)?,
        );
        inner.appended = 0;
        Ok(())
    }

    /// True the first time `id` is seen (and remembers it); false for a repeat.
    pub(crate) fn first_time(&self, id: &str, now_secs: u64) -> bool {
        let mut inner = self.inner.lock();
        while let Some((at, _)) = inner.order.front() {
            if now_secs.saturating_sub(*at) < self.ttl_secs && inner.order.len() < self.capacity {
                break;
            }
            if let Some((_, old)) = inner.order.pop_front() {
                inner.seen.remove(&old);
            }
        }
        if inner.seen.contains_key(id) {
            return false;
        }
        inner.seen.insert(id.to_string(), now_secs);
        inner.order.push_back((now_secs, id.to_string()));
        let line = format!("{now_secs} {id}\n");
        let written = inner
            .file
            .as_mut()
            .map(|f| f.write_all(line.as_bytes()))
            .unwrap_or_else(|| Err(std::io::Error::other("not open")));
        if let Err(e) = written {
            tracing::warn!(file = %self.path.display(), error = %e, "could not persist a feishu event id (it is still remembered in memory)");
        }
        inner.appended += 1;
        if inner.appended > inner.order.len() * 2 + 1024 {
            if let Err(e) = self.compact(&mut inner) {
                tracing::warn!(file = %self.path.display(), error = %e, "could not compact the feishu event id file");
            }
        }
        true
    }

    /// Whether `id` is remembered (without remembering it).
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.inner.lock().seen.contains_key(id)
    }

    /// How many ids are remembered.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().order.len()
    }
}

// ---------------------------------------------------------------------------------
// Outbound client
// ---------------------------------------------------------------------------------

/// Why a call to the Feishu API failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// The request did not get an answer.
    #[error("request failed: {0}")]
    Http(String),
    /// An HTTP error status without a Feishu JSON body.
    #[error("HTTP {0}")]
    Status(u16),
    /// Feishu answered with a non-zero code.
    #[error("feishu code {code}: {msg}")]
    Api {
        /// Feishu's error code.
        code: i64,
        /// Feishu's message.
        msg: String,
    },
    /// A success answer without the expected field.
    #[error("unexpected answer: {0}")]
    Malformed(String),
    /// The group maps to no Feishu chat.
    #[error("group {0:?} maps to no feishu chat (set feishu.chat_id for [mesh].group)")]
    NoChat(String),
    /// Retries exhausted.
    #[error("gave up after {attempts} attempts; last error: {last}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: Box<SendError>,
    },
}

/// Retry schedule for failures that are not rate limits (the one every platform
/// client uses).
pub(crate) use crate::config::pacing::ApiRetry as RetryPolicy;

#[derive(Clone)]
struct CachedToken {
    value: String,
    refresh_at: Instant,
}

#[derive(Deserialize)]
struct TokenReply {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    tenant_access_token: Option<String>,
    #[serde(default)]
    expire: Option<u64>,
}

#[derive(Deserialize)]
struct ApiReply {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    msg: String,
    #[serde(default)]
    data: Option<serde_json::Value>,
    #[serde(default)]
    bot: Option<BotInfo>,
}

/// What `GET /open-apis/bot/v3/info` says about the app's bot.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct BotInfo {
    /// The bot's open_id in its own app.
    #[serde(default)]
    pub(crate) open_id: String,
    /// The app's name.
    #[serde(default)]
    pub(crate) app_name: String,
}

/// A token bucket per chat.
struct ChatLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, TokenBucket>>,
}

impl ChatLimiter {
    fn new(rate: f64) -> Self {
        ChatLimiter {
            rate,
            burst: rate.max(1.0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    async fn acquire(&self, chat: &str) {
        loop {
            let wait = {
                let now = Instant::now();
                let mut b = self.buckets.lock();
                let bucket = b
                    .entry(chat.to_string())
                    .or_insert_with(|| TokenBucket::full(self.rate, self.burst, now));
                match bucket.take(now) {
                    Ok(()) => return,
                    Err(wait) => wait,
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// The Feishu open platform API as this bot's app: token, bot info, sending.
pub(crate) struct FeishuClient {
    http: reqwest::Client,
    base_url: String,
    app_id: String,
    app_secret: String,
    token: tokio::sync::Mutex<Option<CachedToken>>,
    limiter: ChatLimiter,
    retry: RetryPolicy,
    /// Where every API call is counted (set when the node starts the adapter).
    metrics: OnceLock<Arc<Metrics>>,
}

/// `METHOD /path` of a Feishu API URL with ids (`ou_…`, `oc_…`, `om_…`, `on_…`,
/// `cli_…`) as `{id}`: the label of `botmesh_feishu_api_calls_total`.
pub fn api_endpoint(method: &str, url: &str) -> String {
    let path = reqwest::Url::parse(url)
        .map(|u| u.path().to_string())
        .unwrap_or_default();
    let path: Vec<&str> = path
        .split('/')
        .map(|seg| {
            if ["ou_", "oc_", "om_", "on_", "cli_"]
                .iter()
                .any(|p| seg.starts_with(p))
            {
                "{id}"
            } else {
                seg
            }
        })
        .collect();
    format!("{method} {}", path.join("/"))
}

impl std::fmt::Debug for FeishuClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeishuClient")
            .field("base_url", &self.base_url)
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

/// `s` as one URL path segment or query value (ids are plain, but never trusted).
fn url_segment(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// The server's hint, in seconds, of when to come back.
fn retry_hint(headers: &HeaderMap) -> Option<Duration> {
    ["x-ogw-ratelimit-reset", "retry-after"]
        .iter()
        .find_map(|h| headers.get(*h)?.to_str().ok()?.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

impl FeishuClient {
    /// A client for the app `app_id` at `base_url` (`https://open.feishu.cn` or Lark's).
    pub(crate) fn new(
        base_url: &str,
        app_id: &str,
        app_secret: &str,
        retry: RetryPolicy,
    ) -> anyhow::Result<FeishuClient> {
        let base_url = base_url.trim_end_matches('/').to_string();
        let http = crate::platform::api_client(
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(3))
                .timeout(Duration::from_secs(10)),
            &base_url,
        )?;
        Ok(FeishuClient {
            http,
            base_url,
            app_id: app_id.to_string(),
            app_secret: app_secret.to_string(),
            token: tokio::sync::Mutex::new(None),
            limiter: ChatLimiter::new(SENDS_PER_CHAT_PER_SEC),
            retry,
            metrics: OnceLock::new(),
        })
    }

    /// Counts every API call from now on in `metrics`.
    pub(crate) fn set_metrics(&self, metrics: Arc<Metrics>) {
        let _ = self.metrics.set(metrics);
    }

    fn count(&self, method: &str, url: &str) {
        if let Some(m) = self.metrics.get() {
            m.feishu_api_call(&api_endpoint(method, url));
        }
    }

    /// A valid tenant access token: the cached one, or a fresh one when it is near
    /// expiry or equals `rejected` (the one Feishu just called invalid). One fetch
    /// at a time: concurrent callers wait for it and share the result.
    pub(crate) async fn tenant_token(&self, rejected: Option<&str>) -> Result<String, SendError> {
        let mut slot = self.token.lock().await;
        if let Some(t) = slot.as_ref() {
            if Instant::now() < t.refresh_at && rejected != Some(t.value.as_str()) {
                return Ok(t.value.clone());
            }
        }
        let fresh = self.fetch_token().await?;
        let value = fresh.value.clone();
        *slot = Some(fresh);
        Ok(value)
    }

    async fn fetch_token(&self) -> Result<CachedToken, SendError> {
        let url = format!(
            "{}/open-apis/auth/v3/tenant_access_token/internal",
            self.base_url
        );
        let body = serde_json::json!({"app_id": self.app_id, "app_secret": self.app_secret});
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.count("POST", &url);
            let (last, hint) = match self.http.post(&url).json(&body).send().await {
                Err(e) => (SendError::Http(e.to_string()), None),
                Ok(resp) => {
                    let status = resp.status();
                    let hint = retry_hint(resp.headers());
                    match resp.json::<TokenReply>().await {
                        Ok(r) if r.code == 0 => {
                            let value =
                                r.tenant_access_token.filter(|t| !t.is_empty()).ok_or_else(
                                    || SendError::Malformed("no tenant_access_token".into()),
                                )?;
                            let expire = r.expire.unwrap_or(0);
                            // Refresh five minutes early (or halfway, for short lives).
                            let early = (expire / 2).min(300);
                            tracing::debug!(expire, "feishu tenant token fetched");
                            return Ok(CachedToken {
                                value,
                                refresh_at: Instant::now()
                                    + Duration::from_secs(expire.saturating_sub(early)),
                            });
                        }
                        Ok(r) if !retryable(status) && !RATE_LIMIT_CODES.contains(&r.code) => {
                            return Err(SendError::Api {
                                code: r.code,
                                msg: r.msg,
                            })
                        }
                        Ok(r) => (
                            SendError::Api {
                                code: r.code,
                                msg: r.msg,
                            },
                            hint,
                        ),
                        Err(_) if retryable(status) => (SendError::Status(status.as_u16()), hint),
                        Err(e) => return Err(SendError::Malformed(e.to_string())),
                    }
                }
            };
            if attempt >= self.retry.attempts {
                return Err(SendError::GaveUp {
                    attempts: attempt,
                    last: Box::new(last),
                });
            }
            tracing::warn!(attempt, error = %last, "feishu token request failed; retrying");
            tokio::time::sleep(self.retry.delay(attempt, hint)).await;
        }
    }

    /// Calls the API with the tenant token: retries 429/5xx/rate-limit codes with
    /// backoff and refreshes the token (at most twice) when Feishu calls it invalid.
    async fn call(
        &self,
        method: reqwest::Method,
        url: &str,
        body: Option<&serde_json::Value>,
        chat: Option<&str>,
    ) -> Result<ApiReply, SendError> {
        let mut rejected: Option<String> = None;
        let mut refreshes = 0;
        let mut attempt = 0;
        loop {
            attempt += 1;
            if let Some(chat) = chat {
                self.limiter.acquire(chat).await;
            }
            let token = self.tenant_token(rejected.as_deref()).await?;
            let mut req = self.http.request(method.clone(), url).bearer_auth(&token);
            if let Some(b) = body {
                req = req.json(b);
            }
            self.count(method.as_str(), url);
            let (last, hint) = match req.send().await {
                Err(e) => (SendError::Http(e.to_string()), None),
                Ok(resp) => {
                    let status = resp.status();
                    let hint = retry_hint(resp.headers());
                    match resp.json::<ApiReply>().await {
                        Ok(r) if r.code == 0 && status.is_success() => return Ok(r),
                        Ok(r) if TOKEN_INVALID_CODES.contains(&r.code) && refreshes < 2 => {
                            refreshes += 1;
                            attempt -= 1;
                            tracing::info!(
                                code = r.code,
                                "feishu says the tenant token is invalid; refreshing it"
                            );
                            rejected = Some(token);
                            continue;
                        }
                        Ok(r) if !retryable(status) && !RATE_LIMIT_CODES.contains(&r.code) => {
                            return Err(SendError::Api {
                                code: r.code,
                                msg: r.msg,
                            })
                        }
                        Ok(r) => (
                            SendError::Api {
                                code: r.code,
                                msg: r.msg,
                            },
                            hint,
                        ),
                        Err(_) if retryable(status) => (SendError::Status(status.as_u16()), hint),
                        Err(_) if !status.is_success() => {
                            return Err(SendError::Status(status.as_u16()))
                        }
                        Err(e) => return Err(SendError::Malformed(e.to_string())),
                    }
                }
            };
            if attempt >= self.retry.attempts {
                return Err(SendError::GaveUp {
                    attempts: attempt,
                    last: Box::new(last),
                });
            }
            tracing::warn!(attempt, error = %last, "feishu API call failed; retrying");
            tokio::time::sleep(self.retry.delay(attempt, hint)).await;
        }
    }

    /// Sends a text message to `chat_id`; `uuid` makes retries idempotent on Feishu's
    /// side. Returns the new message's `om_…` id.
    pub(crate) async fn send_text(
        &self,
        chat_id: &str,
        text: &str,
        uuid: &str,
    ) -> Result<String, SendError> {
        let url = format!(
            "{}/open-apis/im/v1/messages?receive_id_type=chat_id",
            self.base_url
        );
        let body = serde_json::json!({
            "receive_id": chat_id,
            "msg_type": "text",
            "content": serde_json::json!({"text": text}).to_string(),
            "uuid": uuid,
        });
        let r = self
            .call(reqwest::Method::POST, &url, Some(&body), Some(chat_id))
            .await?;
        r.data
            .as_ref()
            .and_then(|d| d.get("message_id"))
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or_else(|| SendError::Malformed("no data.message_id".into()))
    }

    /// A person's display name, from the contact API (scope
    /// `contact:user.base:readonly`). `Ok(None)` when Feishu gives no name.
    pub(crate) async fn user_name(&self, open_id: &str) -> Result<Option<String>, SendError> {
        let url = format!(
            "{}/open-apis/contact/v3/users/{}?user_id_type=open_id",
            self.base_url,
            url_segment(open_id)
        );
        let r = self.call(reqwest::Method::GET, &url, None, None).await?;
        Ok(r.data
            .as_ref()
            .and_then(|d| d.pointer("/user/name"))
            .and_then(|v| v.as_str())
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty()))
    }

    /// GETs `url` page by page (at most `pages`, following `page_token` while
    /// `has_more`) and hands each of `data.items` to `each`.
    async fn each_item(
        &self,
        url: &str,
        pages: usize,
        mut each: impl FnMut(&serde_json::Value),
    ) -> Result<(), SendError> {
        let mut page: Option<String> = None;
        for _ in 0..pages {
            let url = match &page {
                Some(p) => format!("{url}&page_token={}", url_segment(p)),
                None => url.to_string(),
            };
            let r = self.call(reqwest::Method::GET, &url, None, None).await?;
            let data = r.data.unwrap_or_default();
            for item in data["items"].as_array().into_iter().flatten() {
                each(item);
            }
            page = data["page_token"].as_str().map(str::to_string);
            if !data["has_more"].as_bool().unwrap_or(false) || page.is_none() {
                break;
            }
        }
        Ok(())
    }

    /// The people in a chat as (open_id, name), from the chat members API (scope
    /// `im:chat.members:read` or `im:chat:readonly`); at most 20 pages of 100.
    pub(crate) async fn chat_members(
        &self,
        chat_id: &str,
    ) -> Result<Vec<(String, String)>, SendError> {
        let url = format!(
            "{}/open-apis/im/v1/chats/{}/members?member_id_type=open_id&page_size=100",
            self.base_url,
            url_segment(chat_id)
        );
        let mut out = Vec::new();
        self.each_item(&url, 20, |item| {
            let id = item["member_id"].as_str().unwrap_or_default();
            let name = item["name"].as_str().unwrap_or_default().trim();
            if !id.is_empty() && !name.is_empty() {
                out.push((id.to_string(), name.to_string()));
            }
        })
        .await?;
        Ok(out)
    }

    /// Who was @mentioned in the chat's recent messages, as (open_id in this app,
    /// display name), newest first; `pages` pages of 50 messages at most.
    pub(crate) async fn recent_mentions(
        &self,
        chat_id: &str,
        pages: usize,
    ) -> Result<Vec<(String, String)>, SendError> {
        let url = format!(
            "{}/open-apis/im/v1/messages?container_id_type=chat&container_id={}&sort_type=ByCreateTimeDesc&page_size=50",
            self.base_url,
            url_segment(chat_id)
        );
        let mut out = Vec::new();
        self.each_item(&url, pages.max(1), |item| {
            for m in item["mentions"].as_array().into_iter().flatten() {
                let id = m["id"]
                    .as_str()
                    .or_else(|| m.pointer("/id/open_id").and_then(|v| v.as_str()))
                    .unwrap_or_default();
                let name = m["name"].as_str().unwrap_or_default().trim();
                if id.starts_with("ou_") && !name.is_empty() {
                    out.push((id.to_string(), name.to_string()));
                }
            }
        })
        .await?;
        Ok(out)
    }

    /// The app's bot: its open_id (in this app) and name.
    pub(crate) async fn bot_info(&self) -> Result<BotInfo, SendError> {
        let url = format!("{}/open-apis/bot/v3/info", self.base_url);
        let r = self.call(reqwest::Method::GET, &url, None, None).await?;
        r.bot
            .or_else(|| {
                r.data
                    .and_then(|d| serde_json::from_value(d.get("bot")?.clone()).ok())
            })
            .ok_or_else(|| SendError::Malformed("no bot".into()))
    }
}

// ---------------------------------------------------------------------------------
// The node's Feishu side
// ---------------------------------------------------------------------------------

/// A feishu bot's platform state: the app, its ids and the event id memory.
pub(crate) struct Feishu {
    /// The API client.
    pub(crate) client: FeishuClient,
    /// Checks callbacks.
    pub(crate) auth: EventAuth,
    /// Handled event ids.
    pub(crate) dedup: EventDedup,
    me: String,
    open_id: Option<String>,
    chat_id: Option<String>,
    mesh_group: String,
    max_depth: u32,
    /// open_id in this app → bot name (this bot and the colleagues).
    bots_by_open_id: HashMap<String, String>,
    /// Colleague (canonical name) → open_id in this app.
    peer_open_ids: HashMap<String, String>,
    /// Finds and rewrites mentions of the roster (names and aliases).
    matcher: MentionMatcher,
    /// The inbound handle, once the node has started the adapter.
    ingest: OnceLock<Ingest>,
    /// How events arrive.
    mode: FeishuMode,
    /// The open platform base URL (the long connection asks it for an endpoint).
    base_url: String,
    /// The App Secret (the long connection's endpoint call needs it).
    app_secret: String,
    /// The long connection's state, once started (for health).
    ws: OnceLock<Arc<WsStatus>>,
    /// People's display names by open_id.
    pub(crate) names: crate::platform::feishu_names::Names,
}

/// Every bot with `im:message.group_msg` sees every human message in its groups;
/// other bots' messages arrive only with the include_bot scopes (and then twice: the
/// bridge copy is authoritative).
pub(crate) const VISIBILITY: Visibility = Visibility {
    humans_reach_every_bot: true,
    bots_see_bots: false,
};

impl ChatPlatform for Feishu {
    fn name(&self) -> &'static str {
        "feishu"
    }

    fn visibility(&self) -> Visibility {
        VISIBILITY
    }

    fn should_post(&self, env: &Envelope) -> bool {
        Feishu::should_post(self, env)
    }

    fn post<'a>(&'a self, env: &'a Envelope) -> BoxFuture<'a, Result<String, PostError>> {
        Box::pin(async move {
            Feishu::post(self, env)
                .await
                .map_err(|e| PostError(e.to_string()))
        })
    }

    fn start(self: Arc<Self>, ingest: Ingest) -> Option<BoxFuture<'static, ()>> {
        let _ = self.ingest.set(ingest.clone());
        self.client.set_metrics(ingest.metrics.clone());
        // Best effort: log when the app's real open_id differs from peers.toml.
        let me = self.clone();
        tokio::spawn(async move { me.check_identity().await });
        if self.mode != FeishuMode::LongConnection {
            return None;
        }
        let status = Arc::new(WsStatus::new(ingest.metrics.clone()));
        let _ = self.ws.set(status.clone());
        let settings = WsSettings {
            base_url: self.base_url.clone(),
            app_id: self.auth.app_id.clone(),
            app_secret: self.app_secret.clone(),
        };
        let handler = Arc::new(WsEvents(self.clone()));
        Some(Box::pin(feishu_ws::run(
            settings,
            handler,
            status,
            ingest.accepting.clone(),
        )))
    }

    fn webhook_path(&self) -> Option<&'static str> {
        (self.mode == FeishuMode::Webhook).then_some(EVENTS_PATH)
    }

    fn health(&self) -> Option<serde_json::Value> {
        let ws = self.ws.get().map(|s| s.health());
        Some(serde_json::json!({
            "feishu": {
                "mode": match self.mode {
                    FeishuMode::LongConnection => "long_connection",
                    FeishuMode::Webhook => "webhook",
                },
                "long_connection": ws,
            }
        }))
    }

    fn webhook(
        self: Arc<Self>,
        req: Request<Incoming>,
        remote: SocketAddr,
    ) -> BoxFuture<'static, Response<Body>> {
        Box::pin(handle_events(self, req, remote))
    }

    fn cache_sizes(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("feishu_event_ids", self.dedup.len()),
            ("feishu_names", self.names.len()),
        ]
    }
}

impl std::fmt::Debug for Feishu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feishu")
            .field("bot", &self.me)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

/// `<at user_id="ou_…">Name</at>`.
fn at_tag(open_id: &str, name: &str) -> String {
    let name: String = name.chars().filter(|c| !matches!(c, '<' | '>')).collect();
    let open_id: String = open_id
        .chars()
        .filter(|c| !matches!(c, '<' | '>' | '"'))
        .collect();
    format!("<at user_id=\"{open_id}\">{name}</at>")
}

impl Feishu {
    /// The Feishu side of `cfg`'s bot (an error when its platform is not feishu).
    pub(crate) fn from_config(cfg: &NodeConfig) -> anyhow::Result<Feishu> {
        let (bot, ids, secrets) = crate::platform::bot_tables(
            cfg,
            Platform::Feishu,
            "feishu",
            |b| b.feishu.as_ref(),
            cfg.feishu.as_ref(),
        )?;
        let app_id = ids.app_id.clone().unwrap_or_default();
        if ids.mode == FeishuMode::Webhook
            && secrets.verification_token.is_none()
            && secrets.encrypt_key.is_none()
        {
            anyhow::bail!(
                "bot {}: webhook mode needs a Verification Token or an Encrypt Key",
                bot.name
            );
        }
        let client = FeishuClient::new(
            &ids.base_url(),
            &app_id,
            &secrets.app_secret,
            RetryPolicy::default(),
        )?;
        let now = now_millis() / 1000;
        let path = cfg.data_dir.join(DEDUP_FILE);
        let dedup = EventDedup::open(&path, EVENT_ID_TTL, EVENT_ID_CAPACITY, now)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
        let mut peer_open_ids = HashMap::new();
        let mut bots_by_open_id = HashMap::new();
        for (name, open_id) in &ids.peer_open_ids {
            if let Some((_, b)) = cfg.settings.bot(name) {
                peer_open_ids.insert(b.name.clone(), open_id.trim().to_string());
                bots_by_open_id.insert(open_id.trim().to_string(), b.name.clone());
            }
        }
        if let Some(own) = bot.open_id() {
            bots_by_open_id.insert(own.to_string(), bot.name.clone());
        }
        let missing: Vec<&str> = cfg
            .peers()
            .map(|p| p.name.as_str())
            .filter(|p| !peer_open_ids.contains_key(*p))
            .collect();
        if !missing.is_empty() {
            tracing::warn!(bot = %bot.name, peers = ?missing, "no feishu.peer_open_ids for these colleagues: @mentions of them stay plain text on feishu");
        }
        Ok(Feishu {
            matcher: MentionMatcher::new(&crate::turn::roster(&cfg.settings.bots)),
            ingest: OnceLock::new(),
            client,
            auth: EventAuth {
                app_id,
                verification_token: secrets.verification_token.clone(),
                encrypt_key: secrets.encrypt_key.clone(),
            },
            dedup,
            me: bot.name.clone(),
            open_id: bot.open_id().map(str::to_string),
            chat_id: ids.chat_id.clone(),
            mesh_group: cfg.mesh().group.clone(),
            max_depth: cfg.mesh().max_depth,
            bots_by_open_id,
            peer_open_ids,
            mode: ids.mode,
            base_url: ids.base_url(),
            app_secret: secrets.app_secret.clone(),
            ws: OnceLock::new(),
            names: Default::default(),
        })
    }

    /// Best effort at start: asks Feishu for the bot's open_id and logs a mismatch.
    pub(crate) async fn check_identity(&self) {
        match self.client.bot_info().await {
            Ok(info) if self.open_id.as_deref() == Some(info.open_id.as_str()) => {
                tracing::info!(bot = %self.me, app_name = %info.app_name, "feishu app identity confirmed");
            }
            Ok(info) => {
                tracing::warn!(bot = %self.me, configured = ?self.open_id, actual = %info.open_id, app_name = %info.app_name, "feishu.open_id in peers.toml differs from the app's bot open_id; mentions of this bot may be missed");
            }
            Err(e) => {
                tracing::warn!(bot = %self.me, error = %e, "could not read the feishu bot info (continuing)");
            }
        }
    }

    /// The mesh group a chat belongs to: `[mesh].group` for the configured chat,
    /// else the chat id itself.
    pub(crate) fn group_for_chat(&self, chat_id: &str) -> String {
        if self.chat_id.as_deref() == Some(chat_id) {
            self.mesh_group.clone()
        } else {
            chat_id.to_string()
        }
    }

    /// The chat a group's messages go to.
    pub(crate) fn chat_for_group(&self, group: &str) -> Option<String> {
        if let Some(chat) = group.strip_prefix(crate::wire::envelope::DIRECT_GROUP_PREFIX) {
            return Some(chat.to_string()).filter(|c| c.starts_with("oc_"));
        }
        if group == self.mesh_group {
            self.chat_id.clone()
        } else if group.starts_with("oc_") {
            Some(group.to_string())
        } else {
            None
        }
    }

    /// The mesh bot a mention entry names: by open_id in this app, else by display
    /// name (the same rule as the mention matcher).
    pub(crate) fn bot_for_mention(&self, m: &Mention, matcher: &MentionMatcher) -> Option<String> {
        if !m.id.open_id.is_empty() {
            if let Some(b) = self.bots_by_open_id.get(&m.id.open_id) {
                return Some(b.clone());
            }
        }
        matcher.resolve(m.name.trim()).map(str::to_string)
    }

    /// The mention list for the turn pipeline, with colleagues' per-app open_ids
    /// resolved to their canonical names.
    pub(crate) fn platform_mentions(
        &self,
        mentions: &[Mention],
        matcher: &MentionMatcher,
    ) -> Vec<PlatformMention> {
        mentions
            .iter()
            .map(|m| match self.bot_for_mention(m, matcher) {
                Some(name) => PlatformMention {
                    key: m.key.clone(),
                    open_id: String::new(),
                    name,
                },
                None => PlatformMention {
                    key: m.key.clone(),
                    open_id: m.id.open_id.clone(),
                    name: String::new(),
                },
            })
            .collect()
    }

    /// The message text as the mesh shows it: each `@_user_N` placeholder becomes
    /// `@Name` for a mesh bot and an `<at user_id="ou_…">Name</at>` tag (which names
    /// no bot) for anyone else; unknown placeholders stay as they are.
    pub(crate) fn readable_text(
        &self,
        text: &str,
        mentions: &[Mention],
        matcher: &MentionMatcher,
    ) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(pos) = rest.find("@_user_") {
            out.push_str(&rest[..pos]);
            let after = &rest[pos + "@_user_".len()..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            let key_len = "@_user_".len() + digits;
            let key = &rest[pos..pos + key_len];
            match mentions.iter().find(|m| digits > 0 && m.key == key) {
                Some(m) => match self.bot_for_mention(m, matcher) {
                    Some(bot) => {
                        out.push('@');
                        out.push_str(&bot);
                    }
                    None => out.push_str(&at_tag(&m.id.open_id, &m.name)),
                },
                None => out.push_str(key),
            }
            rest = &rest[pos + key_len..];
        }
        out.push_str(rest);
        out
    }

    /// Any message as the mesh shows it ([`crate::platform::feishu_content`]): text
    /// and rich text with mentions resolved, media as placeholders.
    pub(crate) fn message_text(&self, msg: &Message, matcher: &MentionMatcher) -> String {
        let text = |t: &str| self.readable_text(t, &msg.mentions, matcher);
        let at = |user_id: &str, user_name: &str| {
            if user_id.starts_with("@_user_") {
                self.readable_text(user_id, &msg.mentions, matcher)
            } else if user_id == "all" {
                "@all".to_string()
            } else if let Some(bot) = self.bots_by_open_id.get(user_id) {
                format!("@{bot}")
            } else {
                at_tag(user_id, user_name)
            }
        };
        crate::platform::feishu_content::flatten(
            &msg.message_type,
            &msg.content,
            &crate::platform::feishu_content::Resolve {
                text: &text,
                at: &at,
            },
        )
    }

    /// The text to post: `@Colleague` becomes a real `<at user_id="ou_…">` mention.
    pub(crate) fn outgoing_text(&self, matcher: &MentionMatcher, text: &str) -> String {
        matcher.rewrite(text, |member| {
            self.peer_open_ids
                .get(member)
                .filter(|_| member != self.me)
                .map(|open_id| at_tag(open_id, member))
        })
    }

    /// Whether `env` is this bot's own chat message not yet on Feishu.
    pub(crate) fn should_post(&self, env: &Envelope) -> bool {
        crate::platform::own_unposted(env, &self.me)
    }

    /// Posts the bot's own message to its chat (the envelope id is the idempotency
    /// uuid). Returns the `om_…` id. Failures are logged here.
    pub(crate) async fn post(&self, env: &Envelope) -> Result<String, SendError> {
        let Some(chat) = self.chat_for_group(&env.group) else {
            let e = SendError::NoChat(env.group.clone());
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not posted to feishu; the mesh still gets it");
            return Err(e);
        };
        let text = self.outgoing_text(&self.matcher, &env.text);
        match self
            .client
            .send_text(&chat, &text, &env.id.to_string())
            .await
        {
            Ok(message_id) => {
                tracing::info!(bot = %self.me, id = %env.id, %message_id, chat = %chat, "posted to feishu");
                Ok(message_id)
            }
            Err(e) => {
                tracing::error!(bot = %self.me, id = %env.id, chat = %chat, error = %e, "could not post to feishu; the mesh still gets the message");
                Err(e)
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// HTTP handler and event processing
// ---------------------------------------------------------------------------------

/// What a verified callback leads to.
enum Outcome {
    Challenge(String),
    Duplicate(String),
    Ignored(String, String),
    Message(String, Box<MessageReceived>),
}

/// `POST /feishu/v1/events` on a node whose platform is not feishu: refused, counted.
pub(crate) fn not_enabled(metrics: &Metrics, remote: SocketAddr) -> Response<Body> {
    let e = EventError::NotEnabled;
    metrics.feishu_event(e.reason());
    tracing::warn!(%remote, reason = e.reason(), "feishu callback to a node that is not on feishu");
    server::json(
        e.status(),
        &serde_json::json!({"error": e.reason(), "detail": e.to_string()}),
    )
}

/// `POST /feishu/v1/events`: verifies, answers at once, handles the message after.
pub(crate) async fn handle_events(
    f: Arc<Feishu>,
    req: Request<Incoming>,
    remote: SocketAddr,
) -> Response<Body> {
    let Some(ingest) = f.ingest.get().cloned() else {
        return server::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "feishu adapter not started",
        );
    };
    let outcome = accept(&f, req).await;
    let node = &ingest;
    match outcome {
        Ok(Outcome::Challenge(challenge)) => {
            node.metrics.feishu_event("challenge");
            tracing::info!(%remote, "feishu url_verification answered");
            server::json(
                StatusCode::OK,
                &serde_json::json!({ "challenge": challenge }),
            )
        }
        Ok(Outcome::Duplicate(event_id)) => {
            node.metrics.feishu_event("duplicate");
            tracing::info!(%remote, %event_id, "feishu event already handled (retry)");
            server::json(StatusCode::OK, &serde_json::json!({"duplicate": true}))
        }
        Ok(Outcome::Ignored(event_id, event_type)) => {
            node.metrics.feishu_event("ignored");
            tracing::debug!(%remote, %event_id, %event_type, "feishu event ignored");
            server::json(StatusCode::OK, &serde_json::json!({"ok": true}))
        }
        Ok(Outcome::Message(event_id, msg)) => {
            node.metrics.feishu_event("message");
            tracing::info!(%remote, %event_id, message_id = %msg.message.message_id, sender_type = %msg.sender.sender_type, "feishu message event");
            if !node.accepting.is_cancelled() {
                let n = node.clone();
                node.tasks.spawn(async move {
                    let _ = process(&f, &n, *msg).await;
                });
            }
            server::json(StatusCode::OK, &serde_json::json!({"ok": true}))
        }
        Err(e) => {
            node.metrics.feishu_event(e.reason());
            tracing::warn!(%remote, status = e.status().as_u16(), reason = e.reason(), detail = %e, "feishu callback rejected");
            server::json(
                e.status(),
                &serde_json::json!({"error": e.reason(), "detail": e.to_string()}),
            )
        }
    }
}

async fn accept(f: &Feishu, req: Request<Incoming>) -> Result<Outcome, EventError> {
    let (parts, body) = server::read_body(req, crate::wire::limits::MAX_BODY_BYTES)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { limit } => EventError::TooLarge(limit),
            BodyError::Read(r) => EventError::Unreadable(r),
        })?;
    let now = (now_millis() / 1000) as i64;
    match f.auth.open(&parts.headers, &body, now)? {
        Callback::UrlVerification { challenge, .. } => Ok(Outcome::Challenge(challenge)),
        Callback::Legacy { uuid, kind, .. } => Ok(Outcome::Ignored(
            uuid.unwrap_or_default(),
            kind.unwrap_or_else(|| "schema 1.0".into()),
        )),
        Callback::Event { header, event } => {
            if !f.dedup.first_time(&header.event_id, now as u64) {
                return Ok(Outcome::Duplicate(header.event_id));
            }
            if header.event_type != "im.message.receive_v1" {
                return Ok(Outcome::Ignored(header.event_id, header.event_type));
            }
            let msg = MessageReceived::from_event(&event)?;
            Ok(Outcome::Message(header.event_id, Box::new(msg)))
        }
    }
}

/// Events off the long connection: each is recorded before it is acknowledged.
pub(crate) struct WsEvents(pub(crate) Arc<Feishu>);

impl feishu_ws::EventHandler for WsEvents {
    fn handle(&self, payload: Vec<u8>) -> BoxFuture<'_, u16> {
        Box::pin(take_event(&self.0, payload))
    }
}

/// One event from the long connection: 200 once it is recorded (or is a repeat, or
/// is deliberately ignored), 500 when it could not be recorded (Feishu sends it
/// again). Its event id is remembered only after that, so a redelivery of an event
/// that failed is handled afresh.
pub(crate) async fn take_event(f: &Arc<Feishu>, payload: Vec<u8>) -> u16 {
    let Some(ingest) = f.ingest.get().cloned() else {
        return 500;
    };
    let now = now_millis() / 1000;
    let (header, event) = match parse_callback(&payload) {
        Ok(Callback::Event { header, event }) => (header, event),
        Ok(_) => {
            ingest.metrics.feishu_event("ignored");
            return 200;
        }
        Err(e) => {
            ingest.metrics.feishu_event(e.reason());
            tracing::warn!(reason = e.reason(), detail = %e, "feishu long-connection event malformed; acknowledged and dropped");
            return 200;
        }
    };
    if let Some(app) = header.app_id.as_ref().filter(|a| **a != f.auth.app_id) {
        ingest.metrics.feishu_event("wrong_app");
        tracing::warn!(%app, event_id = %header.event_id, "feishu event for another app; dropped");
        return 200;
    }
    if f.dedup.contains(&header.event_id) {
        ingest.metrics.feishu_event("duplicate");
        tracing::info!(event_id = %header.event_id, "feishu event already handled (redelivery)");
        return 200;
    }
    if header.event_type != "im.message.receive_v1" {
        f.dedup.first_time(&header.event_id, now);
        ingest.metrics.feishu_event("ignored");
        tracing::debug!(event_id = %header.event_id, event_type = %header.event_type, "feishu event ignored");
        return 200;
    }
    let msg = match MessageReceived::from_event(&event) {
        Ok(m) => m,
        Err(e) => {
            ingest.metrics.feishu_event(e.reason());
            tracing::warn!(event_id = %header.event_id, detail = %e, "feishu message event malformed; dropped");
            f.dedup.first_time(&header.event_id, now);
            return 200;
        }
    };
    tracing::info!(event_id = %header.event_id, message_id = %msg.message.message_id, sender_type = %msg.sender.sender_type, "feishu message event (long connection)");
    if ingest.accepting.is_cancelled() {
        return 500;
    }
    if msg.sender.sender_type == "app" {
        // A bot's message may wait for its bridge copy: do not hold the connection.
        f.dedup.first_time(&header.event_id, now);
        ingest.metrics.feishu_event("message");
        let (f, n) = (f.clone(), ingest.clone());
        ingest.tasks.spawn(async move {
            let _ = process(&f, &n, msg).await;
        });
        return 200;
    }
    match process(f, &ingest, msg).await {
        Ok(()) => {
            f.dedup.first_time(&header.event_id, now);
            ingest.metrics.feishu_event("message");
            200
        }
        Err(()) => {
            ingest.metrics.feishu_event("record_failed");
            500
        }
    }
}

/// Records one received message. `Err` when the transcript refused it (already
/// logged); a message deliberately not recorded is `Ok`.
async fn process(f: &Feishu, node: &Ingest, ev: MessageReceived) -> Result<(), ()> {
    let msg = &ev.message;
    let matcher = &f.matcher;
    let text = f.message_text(msg, matcher);
    if text.trim().is_empty() {
        tracing::info!(message_id = %msg.message_id, message_type = %msg.message_type, "ignoring an empty feishu message");
        return Ok(());
    }
    // A direct (p2p) chat is its own group, with this bot alone in it.
    let group = if msg.chat_type == "p2p" {
        format!(
            "{}{}",
            crate::wire::envelope::DIRECT_GROUP_PREFIX,
            msg.chat_id
        )
    } else {
        f.group_for_chat(&msg.chat_id)
    };
    let mut text = text.trim().to_string();
    if text.len() > crate::wire::envelope::MAX_TEXT_BYTES {
        let mut end = crate::wire::envelope::MAX_TEXT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    let sent_at = msg
        .create_time
        .as_deref()
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or_else(now_millis);
    let sender_open_id = ev.sender.sender_id.open_id.clone();
    for m in &msg.mentions {
        if !f.bots_by_open_id.contains_key(&m.id.open_id) {
            f.names.learn(&m.id.open_id, &m.name);
        }
    }
    let human_name = if ev.sender.sender_type == "app" || sender_open_id.is_empty() {
        String::new()
    } else {
        // Bounded: a slow Feishu must not hold the message (nor the long connection).
        tokio::time::timeout(
            NAME_LOOKUP_TIMEOUT,
            f.names
                .display_name(&f.client, &sender_open_id, &msg.chat_id),
        )
        .await
        .unwrap_or_else(|_| sender_open_id.clone())
    };
    // The same id on every bot that reads this message from Feishu, so their claims
    // name the same trigger.
    let id = crate::wire::envelope::platform_message_id("feishu", &msg.message_id, sent_at);
    let author = Author::human(if sender_open_id.is_empty() {
        "feishu user".to_string()
    } else {
        crate::platform::person_name(matcher, Platform::Feishu, &human_name)
    });
    let mut env = Envelope::message(id, sent_at, group.clone(), f.me.clone(), author, text);
    env.root = Some(id);
    env.platform_msg_id = Some(msg.message_id.clone());
    if ev.sender.sender_type != "app" {
        // The per-app open_id and, when Feishu gives it, the per-developer union_id:
        // either may name an operator.
        let ids = &ev.sender.sender_id;
        let person: Vec<&str> = std::iter::once(ids.open_id.as_str())
            .chain(ids.union_id.as_deref())
            .filter(|id| !id.is_empty() && !id.contains(char::is_whitespace))
            .collect();
        env.person = (!person.is_empty()).then(|| person.join(" "));
        let mentions = f.platform_mentions(&msg.mentions, matcher);
        let arrival = Arrival {
            env,
            mentions,
            source: "feishu",
        };
        match node.arrive(arrival).await {
            Ok(Appended::New) => {}
            Ok(Appended::Duplicate) => {
                tracing::info!(message_id = %msg.message_id, "feishu message already recorded");
            }
            Err(e) => {
                tracing::error!(message_id = %msg.message_id, error = %e, "feishu message could not be recorded");
                return Err(());
            }
        }
        return Ok(());
    }
    // A bot's message. A mesh colleague's authoritative copy comes over the bridge.
    let bot = f.bots_by_open_id.get(&sender_open_id).cloned();
    if bot.as_deref() == Some(f.me.as_str()) {
        return Ok(());
    }
    if bot.is_some() {
        let deadline = Instant::now() + BRIDGE_GRACE;
        loop {
            if node.sink.has_platform_msg(&group, &msg.message_id) {
                tracing::debug!(message_id = %msg.message_id, "feishu copy of a colleague's message: the bridge copy is already recorded");
                return Ok(());
            }
            if Instant::now() >= deadline || node.accepting.is_cancelled() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!(message_id = %msg.message_id, bot = ?bot, "no bridge copy of a colleague's feishu message; recording it as context only");
    }
    // Context only: nobody answers it (its real depth is unknown).
    env.author = Author {
        name: bot.unwrap_or_else(|| format!("app:{sender_open_id}")),
        kind: AuthorKind::Bot,
    };
    env.depth = f.max_depth;
    env.root = None;
    let arrival = Arrival {
        env,
        mentions: Vec::new(),
        source: "feishu",
    };
    if let Err(e) = node.arrive(arrival).await {
        tracing::error!(message_id = %msg.message_id, error = %e, "feishu bot message could not be recorded");
        return Err(());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::mention::Member;

    /// Feishu's documented example: encrypt key "test key", plaintext "hello world"
    /// (open.feishu.cn event subscription docs; also in many SDKs' tests).
    const DOC_KEY: &str = "test key";
    const DOC_ENCRYPTED: &str = "P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=";

    /// larksuite/oapi-sdk-go event/dispatcher/dispatcher_test.go: `TestDecryptEvent`
    /// (encrypt key "1212121212") and `mockEventReq` (the same plaintext as the body,
    /// signed with timestamp "timestamp", nonce "nonce", key "1212121212").
    const SDK_KEY: &str = "1212121212";
    const SDK_ENCRYPTED: &str = "bZ3L7yh6m3Fkuffl4g+3uGjIHnhOm5fVZbKVuyT8t7tcd5ABMYm8l28/X900ZL3knZ7n+sCREu/H2WnIzft0amC7+xWqNH8o25IU63N4BnZWfHh+4hyG76QPd19vkw2bPJCx9aqxK8Nz+xqFNbk0RdgyWhmgd30jSxHtcQXAllkI7FMpGpOCteJad3bLXPDBQIV/xkCtKICCS7Z63gakpxZCLaRZ3qCXP1fapHh+LBIupxenrU6ysc7I3nHmjmKie41IiWwS5puG4zQHhVbq6KWLcgWm/3NBZOPQy53ucMu75SXA55I7jarVLZXWUcqBGrcgE3vouWbtwgZuzmoTQl0GSh5VYSVvpW992BuGxUWj0XjPYdICJm6Cr7xouNXwMcdb7N8caVdkdSZeEnswG19qSyDoQhklwzNGW0yiaayulBqJNjfge/G5V3401c2XaIuAeEIo+QQ4RSNpRGfnHkbu/j55FGQAGWjpuBNaIwZbaUoVP3NkGP+vM5rpEDe3sL2GN+Xsd+g9yBs7FqdMV8mXTGgLjCqjrPrke5/km76Q3Pe6KPs2YexMRG4MkSx3xUTzZnNn7zIzShPcjeSwBd2pxk6ht5N+fzueZdxl6Oo=";
    const SDK_PLAIN: &str = r#"{"schema":"2.0","header":{"event_id":"f7984f25108f8137722bb63cee927e66","event_type":"contact.user.created_v3","app_id":"cli_xxxxxxxx","tenant_key":"xxxxxxx","create_time":"1603977298000000","token":"v"},"event":{"object":{"open_id":"ou_7dab8a3d3cdcc9da365777c7ad535d62","union_id":"on_576833b917gda3d939b9a3c2d53e72c8","user_id":"e33ggbyz","name":"张三","employee_no":"employee_no"}},"challenge":"1212","type":"url_verification"}"#;
    /// sha256("timestamp" + "nonce" + "1212121212" + SDK_PLAIN), computed independently
    /// (Python hashlib) from the SDK's `Signature` definition.
    const SDK_SIGNATURE: &str = "4dca085198cb3216defc5b65b0668c1328b038a22dbadf2bc6c4fdc3d32bbc45";

    /// The `im.message.receive_v1` example of Feishu's "receive message" docs.
    const DOC_MESSAGE_EVENT: &str = r#"{
        "schema": "2.0",
        "header": {
            "event_id": "5e3702a84e847582be8db7fb73283c02",
            "event_type": "im.message.receive_v1",
            "create_time": "1608725989000",
            "token": "rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV",
            "app_id": "cli_9f5343c580712544",
            "tenant_key": "2ca1d211f64f6438"
        },
        "event": {
            "sender": {
                "sender_id": {
                    "union_id": "on_8ed6aa67826108097d9ee143816345",
                    "user_id": "e33ggbyz",
                    "open_id": "ou_84aad35d084aa403a838cf73ee18467"
                },
                "sender_type": "user",
                "tenant_key": "736588c9260f175e"
            },
            "message": {
                "message_id": "om_5ce6d572455d361153b7cb51da133945",
                "root_id": "om_5ce6d572455d361153b7cb5xxfsdfsdfdsf",
                "parent_id": "om_5ce6d572455d361153b7cb5xxfsdfsdfdsf",
                "create_time": "1609073151345",
                "update_time": "1687343654666",
                "chat_id": "oc_5ce6d572455d361153b7xx51da133945",
                "thread_id": "omt_d4be107c616",
                "chat_type": "group",
                "message_type": "text",
                "content": "{\"text\":\"@_user_1 hello\"}",
                "mentions": [
                    {
                        "key": "@_user_1",
                        "id": {
                            "union_id": "on_8ed6aa67826108097d9ee143816345",
                            "user_id": "e33ggbyz",
                            "open_id": "ou_84aad35d084aa403a838cf73ee18467"
                        },
                        "name": "Tom",
                        "tenant_key": "736588c9260f175e"
                    }
                ],
                "user_agent": "Mozilla/5.0"
            }
        }
    }"#;

    fn headers(ts: &str, nonce: &str, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HEADER_TIMESTAMP, ts.parse().unwrap());
        h.insert(HEADER_NONCE, nonce.parse().unwrap());
        h.insert(HEADER_SIGNATURE, sig.parse().unwrap());
        h
    }

    fn auth(token: Option<&str>, key: Option<&str>) -> EventAuth {
        EventAuth {
            app_id: "cli_9f5343c580712544".into(),
            verification_token: token.map(str::to_string),
            encrypt_key: key.map(str::to_string),
        }
    }

    #[test]
    fn decrypts_feishus_documented_example() {
        assert_eq!(decrypt(DOC_KEY, DOC_ENCRYPTED).unwrap(), b"hello world");
        assert!(
            decrypt("other key", DOC_ENCRYPTED).is_err(),
            "a wrong key fails"
        );
        assert_eq!(decrypt(DOC_KEY, "%%%"), Err(CryptoError::Base64));
        assert_eq!(decrypt(DOC_KEY, "AAAA"), Err(CryptoError::Length(3)));
    }

    #[test]
    fn decrypts_the_sdk_test_vector_into_a_url_verification() {
        let plain = decrypt(SDK_KEY, SDK_ENCRYPTED).unwrap();
        assert_eq!(std::str::from_utf8(&plain).unwrap(), SDK_PLAIN);
        assert_eq!(
            parse_callback(&plain).unwrap(),
            Callback::UrlVerification {
                challenge: "1212".into(),
                token: Some("v".into())
            }
        );
    }

    #[test]
    fn encrypt_round_trips() {
        let enc = encrypt("k", "你好 {\"a\":1}".as_bytes(), [7u8; 16]);
        assert_eq!(decrypt("k", &enc).unwrap(), "你好 {\"a\":1}".as_bytes());
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(&enc)
            .unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        let tampered = base64::engine::general_purpose::STANDARD.encode(raw);
        assert_ne!(
            decrypt("k", &tampered).ok(),
            Some("你好 {\"a\":1}".as_bytes().to_vec()),
            "tampering never yields the original"
        );
    }

    #[test]
    fn signature_matches_the_sdk_definition() {
        assert_eq!(
            signature("timestamp", "nonce", SDK_KEY, SDK_PLAIN.as_bytes()),
            SDK_SIGNATURE
        );
    }

    #[test]
    fn signed_callbacks_are_checked_in_time_and_in_content() {
        let a = auth(Some("v"), Some(SDK_KEY));
        let body = SDK_PLAIN.as_bytes();
        let now = 1_700_000_000;
        let ts = now.to_string();
        let sig = signature(&ts, "n1", SDK_KEY, body);
        assert!(matches!(
            a.open(&headers(&ts, "n1", &sig), body, now),
            Ok(Callback::UrlVerification { .. })
        ));
        // Uppercase hex is the same signature.
        assert!(a
            .open(&headers(&ts, "n1", &sig.to_uppercase()), body, now)
            .is_ok());
        let tampered = SDK_PLAIN.replace("1212", "1213");
        assert!(matches!(
            a.open(&headers(&ts, "n1", &sig), tampered.as_bytes(), now),
            Err(EventError::BadSignature)
        ));
        for skew in [301, -301] {
            let ts = (now - skew).to_string();
            let sig = signature(&ts, "n1", SDK_KEY, body);
            let e = a.open(&headers(&ts, "n1", &sig), body, now).unwrap_err();
            assert!(matches!(e, EventError::Stale(_)), "{e}");
            assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        }
        let ts = (now - 300).to_string();
        let sig = signature(&ts, "n1", SDK_KEY, body);
        assert!(a.open(&headers(&ts, "n1", &sig), body, now).is_ok());
        let mut h = headers(&ts, "n1", &sig);
        h.remove(HEADER_NONCE);
        assert!(matches!(
            a.open(&h, body, now),
            Err(EventError::MissingHeader(HEADER_NONCE))
        ));
    }

    #[test]
    fn with_an_encrypt_key_only_the_encrypted_url_check_may_be_unsigned() {
        let a = auth(Some("v"), Some(SDK_KEY));
        let encrypted = format!("{{\"encrypt\":\"{SDK_ENCRYPTED}\"}}");
        let cb = a.open(&HeaderMap::new(), encrypted.as_bytes(), 0).unwrap();
        assert!(
            matches!(cb, Callback::UrlVerification { ref challenge, .. } if challenge == "1212")
        );
        // The same in plaintext proves nothing.
        assert!(matches!(
            a.open(&HeaderMap::new(), SDK_PLAIN.as_bytes(), 0),
            Err(EventError::Unsigned)
        ));
        // An unsigned event, even encrypted under the right key, is refused.
        let event = encrypt(SDK_KEY, DOC_MESSAGE_EVENT.as_bytes(), [1; 16]);
        let body = format!("{{\"encrypt\":\"{event}\"}}");
        let a = auth(None, Some(SDK_KEY));
        assert!(matches!(
            a.open(&HeaderMap::new(), body.as_bytes(), 0),
            Err(EventError::Unsigned)
        ));
        // A wrong key does not decrypt.
        let b = auth(None, Some("another key"));
        let e = b
            .open(&HeaderMap::new(), encrypted.as_bytes(), 0)
            .unwrap_err();
        assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        // No key configured: encrypted bodies are a configuration problem.
        let c = auth(Some("v"), None);
        assert!(matches!(
            c.open(&HeaderMap::new(), encrypted.as_bytes(), 0),
            Err(EventError::NoEncryptKey)
        ));
    }

    #[test]
    fn verification_token_and_app_are_checked() {
        let a = auth(Some("rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV"), None);
        let cb = a
            .open(&HeaderMap::new(), DOC_MESSAGE_EVENT.as_bytes(), 0)
            .unwrap();
        assert!(
            matches!(cb, Callback::Event { ref header, .. } if header.event_id == "5e3702a84e847582be8db7fb73283c02")
        );
        let wrong = auth(Some("something else"), None);
        assert!(matches!(
            wrong.open(&HeaderMap::new(), DOC_MESSAGE_EVENT.as_bytes(), 0),
            Err(EventError::BadToken)
        ));
        let mut other_app = auth(Some("rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV"), None);
        other_app.app_id = "cli_other".into();
        let e = other_app
            .open(&HeaderMap::new(), DOC_MESSAGE_EVENT.as_bytes(), 0)
            .unwrap_err();
        assert_eq!(e.status(), StatusCode::FORBIDDEN);
        assert!(matches!(
            a.open(&HeaderMap::new(), b"not json", 0),
            Err(EventError::Malformed(_))
        ));
    }

    #[test]
    fn parses_the_documented_message_event() {
        let Callback::Event { header, event } =
            parse_callback(DOC_MESSAGE_EVENT.as_bytes()).unwrap()
        else {
            panic!("an event")
        };
        assert_eq!(header.event_type, "im.message.receive_v1");
        assert_eq!(header.app_id.as_deref(), Some("cli_9f5343c580712544"));
        let m = MessageReceived::from_event(&event).unwrap();
        assert_eq!(m.sender.sender_type, "user");
        assert_eq!(
            m.sender.sender_id.open_id,
            "ou_84aad35d084aa403a838cf73ee18467"
        );
        assert_eq!(m.message.message_id, "om_5ce6d572455d361153b7cb51da133945");
        assert_eq!(m.message.chat_type, "group");
        assert_eq!(m.message.text().as_deref(), Some("@_user_1 hello"));
        assert_eq!(m.message.mentions[0].key, "@_user_1");
        assert_eq!(m.message.mentions[0].name, "Tom");
        assert_eq!(m.message.create_time.as_deref(), Some("1609073151345"));
        let legacy = parse_callback(
            br#"{"uuid":"u1","token":"t","ts":"1","type":"event_callback","event":{}}"#,
        )
        .unwrap();
        assert_eq!(legacy.token(), Some("t"));
        assert!(matches!(legacy, Callback::Legacy { .. }));
        assert!(matches!(
            parse_callback(br#"{"schema":"2.0","header":{"event_id":"a b","event_type":"x"}}"#),
            Err(EventError::Malformed(_))
        ));
    }

    fn feishu_for_tests(dir: &Path) -> Feishu {
        Feishu {
            client: FeishuClient::new("http://127.0.0.1:9", "cli_a", "s", RetryPolicy::default())
                .unwrap(),
            auth: auth(None, None),
            dedup: EventDedup::open(&dir.join(DEDUP_FILE), EVENT_ID_TTL, 10, 0).unwrap(),
            me: "XiaoBa".into(),
            open_id: Some("ou_me".into()),
            chat_id: Some("oc_team".into()),
            mesh_group: "demo".into(),
            max_depth: 3,
            bots_by_open_id: [("ou_me", "XiaoBa"), ("ou_ergoz_here", "ErGoz")]
                .into_iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            peer_open_ids: [("ErGoz".to_string(), "ou_ergoz_here".to_string())]
                .into_iter()
                .collect(),
            matcher: matcher(),
            ingest: OnceLock::new(),
            mode: FeishuMode::Webhook,
            base_url: "http://127.0.0.1:9".into(),
            app_secret: "s".into(),
            ws: OnceLock::new(),
            names: Default::default(),
        }
    }

    fn matcher() -> MentionMatcher {
        MentionMatcher::new(&[
            Member {
                name: "XiaoBa".into(),
                aliases: vec!["小八".into()],
                open_ids: vec!["ou_me".into()],
            },
            Member {
                name: "ErGoz".into(),
                aliases: vec!["二狗".into()],
                open_ids: vec!["ou_ergoz_own_app".into()],
            },
            Member {
                name: "Mira".into(),
                aliases: vec![],
                open_ids: vec![],
            },
        ])
    }

    fn mention(key: &str, open_id: &str, name: &str) -> Mention {
        Mention {
            key: key.into(),
            id: UserIds {
                open_id: open_id.into(),
                ..Default::default()
            },
            name: name.into(),
        }
    }

    #[test]
    fn placeholders_become_names_for_bots_and_tags_for_people() {
        let dir = tempfile::tempdir().unwrap();
        let f = feishu_for_tests(dir.path());
        let m = matcher();
        let mentions = vec![
            mention("@_user_1", "ou_me", "小八机器人"),
            mention("@_user_2", "ou_ergoz_here", "二狗 bot"),
            mention("@_user_3", "ou_bob", "Mira Chen"),
            mention("@_user_10", "ou_unknown_app_id", "Mira"),
        ];
        let text = "@_user_1 @_user_2 看下，cc @_user_3 and @_user_10 @_user_4 @_all";
        let readable = f.readable_text(text, &mentions, &m);
        assert_eq!(
            readable,
            "@XiaoBa @ErGoz 看下，cc <at user_id=\"ou_bob\">Mira Chen</at> and @Mira @_user_4 @_all"
        );
        // The human named like a bot is not a mention of the bot; the bots are.
        assert_eq!(m.mentioned(&readable, &[]), vec!["XiaoBa", "ErGoz", "Mira"]);
        let pm = f.platform_mentions(&mentions, &m);
        assert_eq!(pm[0].name, "XiaoBa");
        assert_eq!(pm[2].open_id, "ou_bob");
        assert!(m.mentions(text, &pm, "XiaoBa"));
        assert!(!m.mentioned(text, &pm[2..3]).contains(&"Mira".to_string()));
    }

    #[test]
    fn outgoing_mentions_of_colleagues_become_at_tags() {
        let dir = tempfile::tempdir().unwrap();
        let f = feishu_for_tests(dir.path());
        let m = matcher();
        assert_eq!(
            f.outgoing_text(&m, "@二狗 请 review，@XiaoBa 是我，@Mira 没有 id，`@ErGoz` 在代码里"),
            "<at user_id=\"ou_ergoz_here\">ErGoz</at> 请 review，@XiaoBa 是我，@Mira 没有 id，`@ErGoz` 在代码里"
        );
        assert_eq!(f.group_for_chat("oc_team"), "demo");
        assert_eq!(f.group_for_chat("oc_other"), "oc_other");
        assert_eq!(f.chat_for_group("demo").as_deref(), Some("oc_team"));
        assert_eq!(f.chat_for_group("oc_other").as_deref(), Some("oc_other"));
        assert_eq!(f.chat_for_group("elsewhere"), None);
        assert_eq!(f.chat_for_group("direct:oc_p2p").as_deref(), Some("oc_p2p"));
        assert_eq!(f.chat_for_group("direct:nope"), None);
    }

    #[test]
    fn event_ids_survive_a_restart_and_expire_after_a_day() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DEDUP_FILE);
        let day = EVENT_ID_TTL.as_secs();
        let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 1000).unwrap();
        assert!(d.first_time("e1", 1000));
        assert!(!d.first_time("e1", 1001));
        assert!(d.first_time("e2", 2000));
        drop(d);
        let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 1500).unwrap();
        assert!(!d.first_time("e1", 1500), "remembered across a restart");
        assert_eq!(d.len(), 2);
        drop(d);
        let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 1000 + day).unwrap();
        assert_eq!(d.len(), 1, "e1 expired");
        assert!(d.first_time("e1", 1000 + day));
        assert!(!d.first_time("e2", 1000 + day));
        // Expiry in memory too, and a bounded size.
        assert!(d.first_time("e2", 2000 + day));
        let small = EventDedup::open(&dir.path().join("small.log"), EVENT_ID_TTL, 2, 0).unwrap();
        for id in ["a", "b", "c"] {
            assert!(small.first_time(id, 5));
        }
        assert_eq!(small.len(), 2);
        assert!(small.first_time("a", 5), "the oldest was forgotten");
    }

    #[test]
    fn dedup_file_is_compacted_and_tolerates_junk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DEDUP_FILE);
        std::fs::write(&path, "garbage\n10 ok1\nx y\n10 ok1\n20 ok2\n").unwrap();
        let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 30).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "10 ok1\n20 ok2\n");
        for i in 0..1100 {
            d.first_time(&format!("e{i}"), 40);
        }
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert_eq!(lines, 1102);
        let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 50).unwrap();
        assert_eq!(d.len(), 100, "bounded on load");
    }

    #[tokio::test(start_paused = true)]
    async fn chat_limiter_spaces_sends_per_chat() {
        let l = ChatLimiter::new(5.0);
        let start = Instant::now();
        for _ in 0..5 {
            l.acquire("oc_a").await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "a burst of 5 is free");
        l.acquire("oc_b").await;
        assert_eq!(start.elapsed(), Duration::ZERO, "buckets are per chat");
        l.acquire("oc_a").await;
        assert!(
            start.elapsed() >= Duration::from_millis(199),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn retry_delays_grow_and_honour_hints() {
        let p = RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        assert!(p.delay(1, None) >= Duration::from_millis(100));
        assert!(p.delay(1, None) < Duration::from_millis(121));
        assert!(p.delay(3, None) >= Duration::from_millis(400));
        assert!(p.delay(10, None) <= Duration::from_millis(1200));
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(60))),
            Duration::from_secs(1)
        );
    }

    /// The shape docs/feishu.md shows, with tables under `[[bots]]`.
    const DOCS_CONFIG: &str = r#"
[mesh]
group = "team"
secret_env = "BOTMESH_SECRET"

[[bots]]
name = "XiaoBa"
aliases = ["小八"]
bridge = "127.0.0.1:7101"
api = "127.0.0.1:8101"
platform = "feishu"

[bots.feishu]
mode = "webhook"
open_id = "ou_xiaoba"
app_id = "cli_a1b2c3d4e5f60001"
app_secret_env = "XIAOBA_APP_SECRET"
verification_token_env = "XIAOBA_VERIFICATION_TOKEN"
encrypt_key_env = "XIAOBA_ENCRYPT_KEY"
chat_id = "oc_team"
base_url = "https://open.larksuite.com/"
[bots.feishu.peer_open_ids]
ErGoz = "ou_ergoz_in_xiaoba"

[[bots]]
name = "ErGoz"
bridge = "127.0.0.1:7102"
api = "127.0.0.1:8102"
"#;

    fn settings(text: &str) -> Result<crate::config::Settings, crate::config::ConfigError> {
        crate::config::Settings::from_toml(text, Path::new("peers.toml"))
    }

    #[test]
    fn the_documented_config_loads_and_resolves_its_secrets() {
        let s = settings(DOCS_CONFIG).unwrap();
        let f = s.bots[0].feishu.as_ref().unwrap();
        assert_eq!(f.base_url(), LARK_BASE_URL);
        assert_eq!(f.peer_open_ids["ErGoz"], "ou_ergoz_in_xiaoba");
        let mut env: HashMap<String, String> = [
            ("BOTMESH_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            ("XIAOBA_APP_SECRET", "app-secret"),
            ("XIAOBA_VERIFICATION_TOKEN", "vt"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let e = NodeConfig::resolve(s.clone(), "XiaoBa", None, &env).unwrap_err();
        assert_eq!(e.key, "bots[0].feishu.encrypt_key_env");
        assert!(!e.to_string().contains("app-secret"));
        env.insert("XIAOBA_ENCRYPT_KEY".into(), "ek".into());
        let cfg = NodeConfig::resolve(s.clone(), "XiaoBa", None, &env).unwrap();
        let secrets = cfg.feishu.as_ref().unwrap();
        assert_eq!(
            (secrets.app_secret.as_str(), secrets.encrypt_key.as_deref()),
            ("app-secret", Some("ek"))
        );
        assert!(!format!("{cfg:?} {secrets:?}").contains("app-secret"));
        let other = NodeConfig::resolve(s, "ErGoz", None, &env).unwrap();
        assert!(
            other.feishu.is_none(),
            "a local bot needs no feishu secrets"
        );
    }

    #[test]
    fn feishu_config_mistakes_name_their_key() {
        let cases = [
            ("app_id = \"cli_a1b2c3d4e5f60001\"\n", "", "bots[0].feishu.app_id"),
            ("app_secret_env = \"XIAOBA_APP_SECRET\"\n", "", "bots[0].feishu.app_secret_env"),
            (
                "verification_token_env = \"XIAOBA_VERIFICATION_TOKEN\"\nencrypt_key_env = \"XIAOBA_ENCRYPT_KEY\"\n",
                "",
                "bots[0].feishu.encrypt_key_env",
            ),
            ("base_url = \"https://open.larksuite.com/\"", "base_url = \"open.feishu.cn\"", "bots[0].feishu.base_url"),
            ("ErGoz = \"ou_ergoz_in_xiaoba\"", "Nobody = \"ou_x\"", "bots[0].feishu.peer_open_ids.Nobody"),
            ("ErGoz = \"ou_ergoz_in_xiaoba\"", "XiaoBa = \"ou_x\"", "bots[0].feishu.peer_open_ids.XiaoBa"),
        ];
        for (from, to, key) in cases {
            assert!(DOCS_CONFIG.contains(from), "{from}");
            let e = settings(&DOCS_CONFIG.replace(from, to)).unwrap_err();
            assert_eq!(e.key, key, "{e}");
        }
        let e =
            settings(&DOCS_CONFIG.replace("chat_id = \"oc_team\"", "chat_id = \"\"")).unwrap_err();
        assert_eq!(e.key, "bots[0].feishu.chat_id");
        // The long connection (the default mode) needs neither token nor key.
        let lc = DOCS_CONFIG
            .replace("mode = \"webhook\"\n", "")
            .replace(
                "verification_token_env = \"XIAOBA_VERIFICATION_TOKEN\"\n",
                "",
            )
            .replace("encrypt_key_env = \"XIAOBA_ENCRYPT_KEY\"\n", "");
        let s = settings(&lc).unwrap();
        assert_eq!(
            s.bots[0].feishu.as_ref().unwrap().mode,
            FeishuMode::LongConnection
        );
        let e =
            settings(&DOCS_CONFIG.replace("mode = \"webhook\"", "mode = \"socket\"")).unwrap_err();
        assert_eq!(e.key, "bots[0].feishu.mode", "{e}");
    }

    #[test]
    fn errors_map_to_statuses_and_never_carry_secrets() {
        let e = EventError::BadToken;
        assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(e.reason(), "bad_token");
        let a = auth(Some("super-secret-token"), Some("super-secret-key"));
        assert!(!format!("{a:?}").contains("super-secret"));
    }
}
