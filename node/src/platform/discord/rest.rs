//! Discord's REST API, as much of it as a bot of the mesh uses: who am I
//! (`GET /users/@me`), where is the gateway (`GET /gateway/bot`), posting a
//! message (`POST /channels/{channel.id}/messages`), and the typing indicator while
//! the bot's reply is being written (`POST /channels/{channel.id}/typing`).
//!
//! # Rate limits
//!
//! Discord answers every request with its bucket's state (`X-RateLimit-Remaining`,
//! `X-RateLimit-Reset-After`, `X-RateLimit-Bucket`) and refuses a request over a limit
//! with 429 and `retry_after` seconds in the body (`global: true`, or the header
//! `X-RateLimit-Global`, for the limit shared by every route). [`RateLimits`] keeps one
//! state per route (the route's template with its major parameter, the channel id)
//! and one global pause: a request waits while its bucket is empty or a global pause
//! runs, and one request at a time goes out per route, so the parts of a long message
//! keep their order. A 429 is waited out and the same request sent again; it does not
//! count as a failed attempt (Discord's limits are a pace, not an error), up to
//! [`MAX_RATE_LIMITED`] in a row. Server errors and lost connections are retried with
//! backoff; every post carries a `nonce` with `enforce_nonce`, so a retry of a post
//! that did reach Discord does not post it twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::platform::kit::api::{self as kit, Call, Classify, GaveUp};

/// Longest message content Discord accepts, in characters.
pub const MAX_MESSAGE_CHARS: usize = 2000;
/// 429 answers in a row before a request is given up.
pub const MAX_RATE_LIMITED: u32 = 50;
/// Longest 429 wait honoured for one request (a longer one is given up: the reply
/// would come too late to belong to the conversation).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Why a REST call failed.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    /// No answer (connection refused, reset, timed out).
    #[error("request failed: {0}")]
    Http(String),
    /// 401: the token is wrong or was reset.
    #[error(
        "HTTP 401: the bot token was rejected (discord.token_env holds a wrong or reset token)"
    )]
    Unauthorized,
    /// Another refusal, with Discord's JSON error body.
    #[error("HTTP {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// Discord's error body (`{"code": …, "message": …}`), cut short.
        body: String,
    },
    /// A success whose body is not what the route returns.
    #[error("unexpected answer: {0}")]
    Malformed(String),
    /// A 429 asked for a longer wait than [`MAX_RETRY_AFTER`], or came too often.
    #[error("rate limited for too long ({0})")]
    RateLimited(String),
    /// Retries ran out.
    #[error(transparent)]
    GaveUp(GaveUp<RestError>),
}

/// A Discord user, as far as the mesh needs one.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct User {
    /// Snowflake.
    pub id: String,
    /// Unique username.
    #[serde(default)]
    pub username: String,
    /// The display name, when the user set one.
    #[serde(default)]
    pub global_name: Option<String>,
    /// True for bot accounts.
    #[serde(default)]
    pub bot: Option<bool>,
}

impl User {
    /// The name people see: the display name, else the username.
    pub fn display_name(&self) -> &str {
        self.global_name
            .as_deref()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or(&self.username)
    }
}

/// `GET /gateway/bot`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct GatewayBot {
    /// The WebSocket URL to connect to (`wss://gateway.discord.gg`).
    pub url: String,
    /// Recommended shards (one bot of the mesh is in few guilds: one is used).
    #[serde(default)]
    pub shards: u32,
}

/// Who is allowed to be pinged by a posted message.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct AllowedMentions {
    /// Kinds pinged by parsing the content (`users`, `roles`, `everyone`): none.
    pub parse: Vec<String>,
    /// Exactly these users may be pinged.
    pub users: Vec<String>,
    /// Whether the author of the message replied to is pinged.
    pub replied_user: bool,
}

/// The message a post answers.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MessageReference {
    /// The message answered.
    pub message_id: String,
    /// Its channel.
    pub channel_id: String,
    /// Post anyway when it was deleted meanwhile.
    pub fail_if_not_exists: bool,
}

/// The body of `POST /channels/{channel.id}/messages`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CreateMessage {
    /// The text (at most [`MAX_MESSAGE_CHARS`]).
    pub content: String,
    /// Who may be pinged.
    pub allowed_mentions: AllowedMentions,
    /// The message answered, when any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_reference: Option<MessageReference>,
    /// At most 25 characters; with `enforce_nonce`, a second post with the same nonce
    /// within a few minutes returns the first message instead of posting again.
    pub nonce: String,
    /// See `nonce`.
    pub enforce_nonce: bool,
}

/// What a post returns (the message object; only its id is used).
#[derive(Debug, Clone, Deserialize)]
pub struct Created {
    /// The new message's id.
    pub id: String,
}

/// Retry schedule for failures that are not rate limits (the one every platform
/// client uses).
pub use crate::config::pacing::ApiRetry as RetryPolicy;

/// One route's bucket as Discord last described it.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Requests left before `reset_at`.
    remaining: u32,
    /// When the bucket refills.
    reset_at: Instant,
}

/// Discord's rate limits as this client knows them: per route, and global.
#[derive(Default)]
pub struct RateLimits {
    /// Every route waits until then (a global 429).
    global_until: Mutex<Option<Instant>>,
    /// Per route key: the bucket's state.
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Per route key: one request in flight at a time.
    lanes: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The seconds in a header, if it holds a number.
fn header_secs(headers: &HeaderMap, name: &str) -> Option<f64> {
    headers
        .get(name)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

impl RateLimits {
    fn lane(&self, route: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.lanes
            .lock()
            .entry(route.to_string())
            .or_default()
            .clone()
    }

    /// How long `route` must wait now (zero when it may go).
    pub fn wait_for(&self, route: &str, now: Instant) -> Duration {
        let global = self
            .global_until
            .lock()
            .map(|t| t.saturating_duration_since(now))
            .unwrap_or_default();
        let bucket = self
            .buckets
            .lock()
            .get(route)
            .filter(|b| b.remaining == 0)
            .map(|b| b.reset_at.saturating_duration_since(now))
            .unwrap_or_default();
        global.max(bucket)
    }

    /// Takes in a response's `X-RateLimit-*` headers for `route`.
    pub fn update(&self, route: &str, headers: &HeaderMap, now: Instant) {
        let remaining = header_secs(headers, "x-ratelimit-remaining");
        let reset_after = header_secs(headers, "x-ratelimit-reset-after");
        if let (Some(remaining), Some(after)) = (remaining, reset_after) {
            self.buckets.lock().insert(
                route.to_string(),
                Bucket {
                    remaining: remaining as u32,
                    reset_at: now + Duration::from_secs_f64(after.min(3600.0)),
                },
            );
        }
    }

    /// A 429: nothing goes on `route` (or anywhere, when `global`) for `wait`.
    pub fn limited(&self, route: &str, global: bool, wait: Duration, now: Instant) {
        let until = now + wait;
        if global {
            let mut g = self.global_until.lock();
            *g = Some(g.map_or(until, |t| t.max(until)));
        } else {
            self.buckets.lock().insert(
                route.to_string(),
                Bucket {
                    remaining: 0,
                    reset_at: until,
                },
            );
        }
    }
}

/// The body of a 429.
#[derive(Debug, Deserialize)]
struct TooMany {
    /// Seconds to wait.
    #[serde(default)]
    retry_after: Option<f64>,
    /// Whether the global limit was hit.
    #[serde(default)]
    global: bool,
}

/// A bot's REST client: its token, Discord's base URL, the rate limits it has seen.
pub struct RestClient {
    http: reqwest::Client,
    base_url: String,
    token: String,
    /// Per route and global limits.
    pub limits: RateLimits,
    retry: RetryPolicy,
}

impl std::fmt::Debug for RestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestClient")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

use crate::platform::kit::http::Timeouts;

impl RestClient {
    /// A client for `base_url` (`https://discord.com/api/v10`) with the bot `token`.
    pub fn new(base_url: &str, token: &str, retry: RetryPolicy) -> anyhow::Result<RestClient> {
        let base_url = base_url.trim_end_matches('/').to_string();
        let http = crate::platform::kit::http::client(
            &base_url,
            Timeouts {
                connect: Duration::from_secs(5),
                whole: Duration::from_secs(15),
            },
            Some(concat!(
                "DiscordBot (https://github.com/botmesh, ",
                env!("CARGO_PKG_VERSION"),
                ")"
            )),
        )?;
        Ok(RestClient {
            http,
            base_url,
            token: token.to_string(),
            limits: RateLimits::default(),
            retry,
        })
    }

    /// Sends one request on `route` (the rate-limit key), waiting out limits and
    /// retrying as the module docs say; returns the success body.
    async fn call(
        &self,
        method: reqwest::Method,
        route: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<bytes::Bytes, RestError> {
        let lane = self.limits.lane(route);
        let _one_at_a_time = lane.lock().await;
        let url = format!("{}{}", self.base_url, path);
        // 429s in a row: waited out without spending an attempt, up to MAX_RATE_LIMITED.
        let limited = AtomicU32::new(0);
        let (url, limited, method) = (&url, &limited, &method);
        let call = Call {
            platform: "discord",
            noun: "request",
            what: Some(route),
        };
        kit::run(&self.retry, call, || async move {
            let wait = self.limits.wait_for(route, Instant::now());
            if !wait.is_zero() {
                tracing::debug!(
                    route,
                    wait_ms = wait.as_millis() as u64,
                    "discord rate limit: waiting"
                );
                tokio::time::sleep(wait).await;
            }
            let mut req = self
                .http
                .request(method.clone(), url)
                .header("authorization", format!("Bot {}", self.token));
            if let Some(b) = body {
                req = req.json(b);
            }
            let resp = match req.send().await {
                Err(e) => return Classify::RetryAfter(None, RestError::Http(e.to_string())),
                Ok(resp) => resp,
            };
            let status = resp.status();
            let headers = resp.headers().clone();
            self.limits.update(route, &headers, Instant::now());
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| RestError::Http(e.to_string()));
            if status.is_success() {
                return match bytes {
                    Ok(b) => Classify::Ok(b),
                    Err(e) => Classify::GiveUp(e),
                };
            }
            let bytes = bytes.unwrap_or_default();
            if status == StatusCode::TOO_MANY_REQUESTS {
                let parsed: Option<TooMany> = serde_json::from_slice(&bytes).ok();
                let secs = parsed
                    .as_ref()
                    .and_then(|t| t.retry_after)
                    .or_else(|| header_secs(&headers, "retry-after"))
                    .unwrap_or(1.0);
                let global = parsed.as_ref().is_some_and(|t| t.global)
                    || headers
                        .get("x-ratelimit-global")
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
                let wait = Duration::from_secs_f64(secs);
                let limited = limited.fetch_add(1, Ordering::Relaxed) + 1;
                if wait > MAX_RETRY_AFTER || limited > MAX_RATE_LIMITED {
                    return Classify::GiveUp(RestError::RateLimited(format!(
                        "retry_after {secs} s, {limited} times in a row"
                    )));
                }
                tracing::info!(
                    route,
                    global,
                    retry_after_ms = wait.as_millis() as u64,
                    "discord answered 429; waiting it out"
                );
                self.limits.limited(route, global, wait, Instant::now());
                return Classify::Again;
            }
            let text: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
            if status == StatusCode::UNAUTHORIZED {
                return Classify::GiveUp(RestError::Unauthorized);
            }
            let error = RestError::Status {
                status: status.as_u16(),
                body: text,
            };
            if status.is_server_error() {
                Classify::RetryAfter(None, error)
            } else {
                Classify::GiveUp(error)
            }
        })
        .await
        .map_err(|e| e.into_error(RestError::GaveUp))
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, RestError> {
        let body = self
            .call(reqwest::Method::GET, &format!("GET {path}"), path, None)
            .await?;
        serde_json::from_slice(&body).map_err(|e| RestError::Malformed(e.to_string()))
    }

    /// `GET /users/@me`: the bot's own user.
    pub async fn current_user(&self) -> Result<User, RestError> {
        self.get("/users/@me").await
    }

    /// `GET /gateway/bot`: the gateway URL.
    pub async fn gateway_bot(&self) -> Result<GatewayBot, RestError> {
        self.get("/gateway/bot").await
    }

    /// `POST /channels/{channel_id}/messages`; returns the new message's id.
    pub async fn create_message(
        &self,
        channel_id: &str,
        msg: &CreateMessage,
    ) -> Result<String, RestError> {
        let path = format!("/channels/{channel_id}/messages");
        let body = serde_json::to_value(msg).expect("serializes");
        let bytes = self
            .call(
                reqwest::Method::POST,
                &format!("POST {path}"),
                &path,
                Some(&body),
            )
            .await?;
        serde_json::from_slice::<Created>(&bytes)
            .map(|c| c.id)
            .map_err(|e| RestError::Malformed(e.to_string()))
    }
}

impl RestClient {
    /// `PATCH /channels/{channel_id}/messages/{message_id}`: replaces the content of
    /// one of the bot's own messages (pinging only `users`). Discord lets a bot edit
    /// its messages at any age; the route has its own rate-limit bucket (about 5
    /// edits per 5 s per channel), which the lanes honour.
    pub async fn edit_message(
        &self,
        channel_id: &str,
        message_id: &str,
        content: &str,
        users: Vec<String>,
    ) -> Result<(), RestError> {
        let path = format!("/channels/{channel_id}/messages/{message_id}");
        let body = serde_json::json!({
            "content": content,
            "allowed_mentions": AllowedMentions { parse: Vec::new(), users, replied_user: false },
        });
        // One lane for the channel's edits, whichever message.
        let route = format!("PATCH /channels/{channel_id}/messages/{{id}}");
        self.call(reqwest::Method::PATCH, &route, &path, Some(&body))
            .await
            .map(|_| ())
    }

    /// `POST /channels/{channel_id}/typing`: shows the bot as typing in the channel
    /// for about 10 s, or until it posts there. Discord answers 204 with no body.
    /// A route of its own, so it never waits behind a post's rate limit.
    pub async fn trigger_typing(&self, channel_id: &str) -> Result<(), RestError> {
        let path = format!("/channels/{channel_id}/typing");
        self.call(reqwest::Method::POST, &format!("POST {path}"), &path, None)
            .await
            .map(|_| ())
    }
}

pub use crate::platform::kit::split::{split_message, utf16_len as discord_len};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_state_follows_headers_and_429s() {
        let l = RateLimits::default();
        let now = Instant::now();
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining", "0".parse().unwrap());
        h.insert("x-ratelimit-reset-after", "1.5".parse().unwrap());
        l.update("POST /channels/1/messages", &h, now);
        assert_eq!(
            l.wait_for("POST /channels/1/messages", now),
            Duration::from_millis(1500)
        );
        assert_eq!(l.wait_for("POST /channels/2/messages", now), Duration::ZERO);
        l.limited("GET /users/@me", true, Duration::from_secs(3), now);
        assert_eq!(
            l.wait_for("POST /channels/2/messages", now),
            Duration::from_secs(3),
            "a global limit holds every route"
        );
        assert_eq!(
            l.wait_for("x", now + Duration::from_secs(4)),
            Duration::ZERO
        );
    }

    #[test]
    fn the_post_body_has_discords_field_names() {
        let m = CreateMessage {
            content: "<@1> hi".into(),
            allowed_mentions: AllowedMentions {
                parse: vec![],
                users: vec!["1".into()],
                replied_user: true,
            },
            message_reference: Some(MessageReference {
                message_id: "9".into(),
                channel_id: "8".into(),
                fail_if_not_exists: false,
            }),
            nonce: "n".into(),
            enforce_nonce: true,
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["allowed_mentions"]["users"][0], "1");
        assert_eq!(v["allowed_mentions"]["parse"], serde_json::json!([]));
        assert_eq!(v["message_reference"]["message_id"], "9");
        assert_eq!(v["enforce_nonce"], true);
    }
}
