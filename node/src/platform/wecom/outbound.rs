//! Sending a bot's message.
//!
//! - An answer to a person's message this robot received goes on that callback's
//!   req_id as `aibot_respond_msg`, a `stream` ([`ReplyStream`]): each frame the whole
//!   text so far, the last one `finish: true`, never an empty bubble.
//! - Everything else — an answer to a colleague or to a person another robot carried,
//!   an interjection, an answer after a reconnect made the req_id stale (846605) or
//!   after the stream expired (846608) — goes as `aibot_send_msg` (markdown) to the
//!   chat.
//! - A message holds at most [`MAX_MESSAGE_BYTES`] of UTF-8: longer text goes in parts
//!   cut by bytes (the kit's splitter, [`Unit::Utf8Bytes`]), each its own stream on the
//!   same callback, or its own send.
//! - 45009, 45033 and -1 (nothing was shown) are tried again by the kit's retry loop;
//!   a request without an ack is not (it may have been shown), so nothing is posted
//!   twice; 45002 (over the cap) is final.
//! - Sends to one chat are paced by the kit's per-chat pacer
//!   ([`SENDS_PER_MINUTE`]).
//!
//! `@Colleague` stays text: WeCom cannot notify a robot; the bridge does.

use crate::config::pacing::ApiRetry;
use crate::platform::kit::api::{self, Call, Classify};
use crate::platform::kit::inbound::truncate;
use crate::platform::kit::split::{split_message_in, Unit};
use crate::platform::PostError;
use crate::store::transcript::platform_ids;
use crate::wire::envelope::Envelope;

use super::conn::{Link, SendError};
use super::frames::{self, code, MAX_MESSAGE_BYTES};
use super::inbound::ReplyTo;
use super::Wecom;

/// Sends to one chat in a minute at most (the rate WeCom's SDKs guard locally; the
/// server answers 45009 beyond it).
pub const SENDS_PER_MINUTE: usize = 20;

/// Tries per frame.
pub(crate) const RETRY: ApiRetry = ApiRetry {
    attempts: 4,
    base: std::time::Duration::from_millis(500),
    max: std::time::Duration::from_secs(10),
};

/// What a failed request means for another try.
pub(crate) fn classify(e: SendError) -> Classify<serde_json::Value, SendError> {
    match &e {
        // Never sent: try again.
        SendError::NotConnected => Classify::RetryAfter(None, e),
        // Nothing was shown: wait and try again.
        SendError::Refused {
            errcode: code::FREQ_LIMIT | code::CONCURRENCY_LIMIT | code::BUSY,
            ..
        } => Classify::RetryAfter(None, e),
        // Over the cap, a stale req_id, anything else: another try is the same.
        SendError::Refused { .. } => Classify::GiveUp(e),
        // It may have been shown: a second try could post twice.
        SendError::NoAnswer(_) => Classify::GiveUp(e),
    }
}

/// Sends one request on the kit's retry loop.
async fn request(
    link: &Link,
    cmd: &'static str,
    req_id: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value, SendError> {
    let call = Call {
        platform: "wecom",
        noun: "request",
        what: Some(cmd),
    };
    api::run(&RETRY, call, || async {
        match link.call(cmd, req_id, body.clone()).await {
            Ok(v) => Classify::Ok(v),
            Err(e) => classify(e),
        }
    })
    .await
    .map_err(|e| e.last)
}

/// A streamed answer on one callback: one bubble, replaced by each frame, which holds
/// the whole text so far. It never shows an empty bubble: empty text is never sent,
/// and [`ReplyStream::finish`] with none finishes on the last text shown. Text over
/// [`MAX_MESSAGE_BYTES`] is cut there (a caller with more splits it first).
#[derive(Debug)]
pub struct ReplyStream<'a> {
    /// The connection.
    link: &'a Link,
    /// The callback's req_id.
    req_id: String,
    /// The stream's id (the bubble's).
    id: String,
    /// The text shown so far (empty: no bubble yet).
    shown: String,
}

impl<'a> ReplyStream<'a> {
    /// A stream on the callback `req_id`; nothing is sent until there is text.
    pub fn new(link: &'a Link, req_id: &str) -> Self {
        ReplyStream {
            link,
            req_id: req_id.to_string(),
            id: frames::req_id("stream"),
            shown: String::new(),
        }
    }

    /// The stream's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Shows `text` (the whole text so far) while the work goes on. Empty text shows
    /// nothing.
    pub async fn update(&mut self, text: &str) -> Result<(), SendError> {
        self.frame(text, false).await
    }

    /// Shows `text` as the final answer and ends the stream; with no text, ends it on
    /// the last text shown (and sends nothing when nothing was).
    pub async fn finish(mut self, text: &str) -> Result<(), SendError> {
        let text = if text.trim().is_empty() {
            std::mem::take(&mut self.shown)
        } else {
            text.to_string()
        };
        self.frame(&text, true).await
    }

    /// Sends one frame of non-empty `text`.
    async fn frame(&mut self, text: &str, finish: bool) -> Result<(), SendError> {
        let text = truncate(text.trim().to_string(), MAX_MESSAGE_BYTES);
        if text.is_empty() {
            return Ok(());
        }
        let body = frames::stream_body(&self.id, &text, finish);
        request(self.link, frames::RESPOND, &self.req_id, body).await?;
        self.shown = text;
        Ok(())
    }
}

impl Wecom {
    /// Where to answer `env` on a callback: its trigger is a message this robot
    /// received on the session up now.
    fn reply_to(&self, env: &Envelope) -> Option<ReplyTo> {
        // A status message goes to the chat as a plain send: the callback's stream is
        // kept for the answer, which people are notified by.
        if env.kind == crate::wire::envelope::Kind::Status {
            return None;
        }
        let trigger = env
            .reply_to
            .and_then(|r| self.ingest.get()?.sink.message(&env.group, &r))?;
        let msgid = platform_ids(trigger.platform_msg_id.as_deref()?)
            .next()?
            .to_string();
        self.replies.lock().usable(&msgid, self.link.session())
    }

    /// Sends `text` to `chatid` as `aibot_send_msg`; returns its id (`send:<req_id>`:
    /// the ack carries no message id).
    async fn send(&self, chatid: &str, text: &str) -> Result<String, SendError> {
        let req_id = frames::req_id(frames::SEND);
        request(
            &self.link,
            frames::SEND,
            &req_id,
            frames::send_body(chatid, text),
        )
        .await?;
        Ok(format!("send:{req_id}"))
    }

    /// Posts the bot's own message (see the module docs); returns the ids of its
    /// parts (`stream:<id>` or `send:<req_id>`), space-separated.
    pub async fn post_envelope(&self, env: &Envelope) -> Result<String, PostError> {
        let Some(chatid) = self.chatid_for(&env.group) else {
            let e = format!(
                "group {:?} maps to no wecom chat (set wecom.chat_id to the group chat that is [mesh].group)",
                env.group
            );
            tracing::error!(bot = %self.me, id = %env.id, error = %e, "not sent to wecom; the mesh still gets it");
            return Err(PostError(e));
        };
        let mut reply = self.reply_to(env);
        let parts = split_message_in(&env.text, MAX_MESSAGE_BYTES, Unit::Utf8Bytes);
        let mut ids = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            self.pacer.acquire(&chatid).await;
            let mut sent = None;
            if let Some(r) = &reply {
                let stream = ReplyStream::new(&self.link, &r.req_id);
                let id = format!("stream:{}", stream.id());
                match stream.finish(part).await {
                    Ok(()) => sent = Some(Ok(id)),
                    Err(e)
                        if matches!(
                            e.errcode(),
                            Some(code::INVALID_REQ_ID | code::STREAM_EXPIRED)
                        ) =>
                    {
                        tracing::info!(bot = %self.me, id = %env.id, error = %e, "wecom: the callback's req_id no longer takes an answer; sending to the chat instead");
                        reply = None;
                    }
                    Err(e) => sent = Some(Err(e)),
                }
            }
            let sent = match sent {
                Some(s) => s,
                None => self.send(&chatid, part).await,
            };
            match sent {
                Ok(id) => ids.push(id),
                Err(e) if ids.is_empty() => {
                    tracing::error!(bot = %self.me, id = %env.id, %chatid, error = %e, "could not send to wecom; the mesh still gets the message");
                    return Err(PostError(e.to_string()));
                }
                Err(e) => {
                    tracing::error!(bot = %self.me, id = %env.id, %chatid, part = i + 1, parts = parts.len(), error = %e, "could not send a later part to wecom");
                    break;
                }
            }
        }
        if ids.is_empty() {
            return Err(PostError("empty message".into()));
        }
        let joined = ids.join(" ");
        tracing::info!(bot = %self.me, id = %env.id, sent = %joined, %chatid, on_callback = reply.is_some(), "sent to wecom");
        Ok(joined)
    }
}
