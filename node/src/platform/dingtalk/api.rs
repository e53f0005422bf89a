//! DingTalk's open API as one robot uses it: the access token, the two ways to send
//! into a group, and the per-group pace.
//!
//! - `POST /v1.0/oauth2/accessToken` `{appKey, appSecret}` → `{accessToken, expireIn}`:
//!   cached, refreshed five minutes early (or halfway through a short life), and
//!   fetched again when DingTalk answers 401.
//! - A message's `sessionWebhook` answers into its conversation without a token until
//!   `sessionWebhookExpiredTime`: `{"msgtype": "text", "text": {"content"}, "at":
//!   {"atUserIds"}}` → `{"errcode": 0}`.
//! - Otherwise `POST /v1.0/robot/groupMessages/send` with the token in
//!   `x-acs-dingtalk-access-token`: `{robotCode, openConversationId, msgKey:
//!   "sampleText", msgParam: "{\"content\": …}"}` → `{processQueryKey}`.
//!
//! DingTalk allows a robot about [`SENDS_PER_MINUTE`] messages a minute per group and
//! refuses the rest: [`Pacer`] queues sends per group (first come, first sent) and
//! spaces them so no minute ever holds more. Nothing is dropped; a send waits.

use std::time::Duration;

use parking_lot::Mutex;
use serde::Deserialize;

use crate::config::pacing::ApiRetry;
use crate::config::pacing::Window;
use crate::platform::kit::api::{self as kit, GaveUp};
use crate::platform::kit::pacer::ChatPacer;
use crate::platform::kit::token::{Fresh, TokenSource};

/// The token endpoint.
pub(crate) const TOKEN_PATH: &str = "/v1.0/oauth2/accessToken";
/// The robot group-send endpoint.
pub(crate) const GROUP_SEND_PATH: &str = "/v1.0/robot/groupMessages/send";
/// The header carrying the access token on the new (`api.dingtalk.com`) APIs.
pub(crate) const TOKEN_HEADER: &str = "x-acs-dingtalk-access-token";
/// Messages a robot may send to one group per minute (DingTalk's limit is 20).
pub(crate) const SENDS_PER_MINUTE: usize = 20;
/// The longest delay between two attempts of a send.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(8);
/// How long before its expiry a session webhook is no longer used.
pub(crate) const WEBHOOK_MARGIN: Duration = Duration::from_secs(60);

/// Why a call to DingTalk failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// The request got no answer.
    #[error("request failed: {0}")]
    Http(String),
    /// An error status; `code`/`message` from DingTalk's error body when it had one.
    #[error("HTTP {status}: {code} {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// DingTalk's error code (`InvalidAuthentication`, `Forbidden.AccessDenied.QpsLimit`, …).
        code: String,
        /// DingTalk's message.
        message: String,
    },
    /// A session webhook answered with a non-zero `errcode`.
    #[error("session webhook errcode {errcode}: {errmsg}")]
    Webhook {
        /// DingTalk's error code.
        errcode: i64,
        /// DingTalk's message.
        errmsg: String,
    },
    /// A success without the expected field.
    #[error("unexpected answer: {0}")]
    Malformed(String),
    /// Retries ran out.
    #[error(transparent)]
    GaveUp(GaveUp<ApiError>),
}

impl ApiError {
    fn retryable(&self) -> bool {
        match self {
            ApiError::Http(_) => true,
            ApiError::Status { status, .. } => *status == 429 || *status >= 500,
            // 130101: send too fast (custom and session webhooks).
            ApiError::Webhook { errcode, .. } => *errcode == 130101,
            _ => false,
        }
    }
}

/// A text to send, with the people it really @-mentions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outgoing {
    /// The content, with `@userId` where each mention stands.
    pub(crate) text: String,
    /// Staff ids to notify (`at.atUserIds`).
    pub(crate) at_user_ids: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TokenReply {
    #[serde(default)]
    access_token: Option<String>,
    #[serde(default)]
    expire_in: Option<u64>,
}

#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Spaces sends per group: at most `per_window` in any `window`, in arrival order
/// (a sliding window, not a token bucket: see [`Window`]).
pub(crate) type Pacer = ChatPacer<Window>;

/// The open API as this robot's app.
pub(crate) struct DingTalkApi {
    http: reqwest::Client,
    base_url: String,
    client_id: String,
    client_secret: String,
    robot_code: String,
    token: TokenSource,
    /// Retries of a failed send (429, 5xx, network), with doubling delays from
    /// `retry_base`.
    attempts: u32,
    retry_base: Duration,
}

impl std::fmt::Debug for DingTalkApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DingTalkApi")
            .field("base_url", &self.base_url)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// An HTTP client for `base_url` that never goes through a proxy for loopback.
pub(crate) fn http_client(base_url: &str) -> anyhow::Result<reqwest::Client> {
    crate::platform::kit::http::client(
        base_url,
        crate::platform::kit::http::Timeouts {
            connect: Duration::from_secs(3),
            whole: Duration::from_secs(10),
        },
        None,
    )
}

async fn error_of(resp: reqwest::Response) -> ApiError {
    let status = resp.status().as_u16();
    let body: ErrorBody = resp.json().await.unwrap_or_default();
    ApiError::Status {
        status,
        code: body.code,
        message: body.message,
    }
}

impl DingTalkApi {
    /// The API at `base_url` for the app `client_id` and its robot `robot_code`.
    pub(crate) fn new(
        base_url: &str,
        client_id: &str,
        client_secret: &str,
        robot_code: &str,
    ) -> anyhow::Result<DingTalkApi> {
        let base_url = base_url.trim_end_matches('/').to_string();
        Ok(DingTalkApi {
            http: http_client(&base_url)?,
            base_url,
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            robot_code: robot_code.into(),
            token: TokenSource::new(),
            attempts: 5,
            retry_base: Duration::from_millis(250),
        })
    }

    /// A valid access token: the cached one, or a fresh one when it is near expiry or
    /// is `rejected` (the one DingTalk just refused). One fetch at a time.
    pub(crate) async fn access_token(&self, rejected: Option<&str>) -> Result<String, ApiError> {
        self.token.get(rejected, || self.fetch_token()).await
    }

    /// Fetches a new access token (one attempt: the calls that need it retry).
    async fn fetch_token(&self) -> Result<Fresh, ApiError> {
        let resp = self
            .http
            .post(format!("{}{TOKEN_PATH}", self.base_url))
            .json(&serde_json::json!({"appKey": self.client_id, "appSecret": self.client_secret}))
            .send()
            .await
            .map_err(|e| ApiError::Http(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(error_of(resp).await);
        }
        let r: TokenReply = resp
            .json()
            .await
            .map_err(|e| ApiError::Malformed(e.to_string()))?;
        let value = r
            .access_token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::Malformed("no accessToken".into()))?;
        let expire = r.expire_in.unwrap_or(0);
        tracing::debug!(expire, "dingtalk access token fetched");
        Ok(Fresh {
            value,
            expires_in_secs: expire,
        })
    }

    /// Runs `call` until it succeeds, fails for good, or the attempts are spent.
    async fn with_retries<F, Fut, T>(&self, what: &str, mut call: F) -> Result<T, ApiError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ApiError>>,
    {
        let policy = ApiRetry {
            attempts: self.attempts,
            base: self.retry_base,
            max: RETRY_MAX,
        };
        let kit_call = kit::Call {
            platform: "dingtalk",
            noun: "call",
            what: Some(what),
        };
        let run = kit::run(&policy, kit_call, || {
            let attempt = call();
            async move {
                match attempt.await {
                    Ok(v) => kit::Classify::Ok(v),
                    Err(e) if e.retryable() => kit::Classify::RetryAfter(None, e),
                    Err(e) => kit::Classify::GiveUp(e),
                }
            }
        });
        // Any failure after a retry reads as giving up, with the last error.
        run.await.map_err(|e| match e.attempts {
            1 => e.last,
            attempts => ApiError::GaveUp(GaveUp {
                attempts,
                last: Box::new(e.last),
            }),
        })
    }

    /// Answers into a conversation through a message's session webhook.
    pub(crate) async fn send_by_session(
        &self,
        webhook: &str,
        msg: &Outgoing,
    ) -> Result<(), ApiError> {
        let body = serde_json::json!({
            "msgtype": "text",
            "text": {"content": msg.text},
            "at": {"atUserIds": msg.at_user_ids, "isAtAll": false},
        });
        self.with_retries("session webhook", || async {
            let resp = self
                .http
                .post(webhook)
                .json(&body)
                .send()
                .await
                .map_err(|e| ApiError::Http(e.to_string()))?;
            if !resp.status().is_success() {
                return Err(error_of(resp).await);
            }
            #[derive(Deserialize)]
            struct Reply {
                #[serde(default)]
                errcode: i64,
                #[serde(default)]
                errmsg: String,
            }
            let r: Reply = resp
                .json()
                .await
                .map_err(|e| ApiError::Malformed(e.to_string()))?;
            if r.errcode != 0 {
                return Err(ApiError::Webhook {
                    errcode: r.errcode,
                    errmsg: r.errmsg,
                });
            }
            Ok(())
        })
        .await
    }

    /// Sends to a group with the robot group-send API. Returns `processQueryKey`.
    pub(crate) async fn send_to_group(
        &self,
        open_conversation_id: &str,
        msg: &Outgoing,
    ) -> Result<String, ApiError> {
        let body = serde_json::json!({
            "robotCode": self.robot_code,
            "openConversationId": open_conversation_id,
            "msgKey": "sampleText",
            "msgParam": serde_json::json!({"content": msg.text}).to_string(),
        });
        let url = format!("{}{GROUP_SEND_PATH}", self.base_url);
        let rejected: Mutex<Option<String>> = Mutex::new(None);
        self.with_retries("group send", || async {
            let stale = rejected.lock().clone();
            let token = self.access_token(stale.as_deref()).await?;
            let resp = self
                .http
                .post(&url)
                .header(TOKEN_HEADER, &token)
                .json(&body)
                .send()
                .await
                .map_err(|e| ApiError::Http(e.to_string()))?;
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED && stale.is_none() {
                // Refused token: the next attempt fetches a new one.
                *rejected.lock() = Some(token);
                return Err(ApiError::Http("access token refused (401)".into()));
            }
            if !resp.status().is_success() {
                return Err(error_of(resp).await);
            }
            let v: serde_json::Value = resp
                .json()
                .await
                .map_err(|e| ApiError::Malformed(e.to_string()))?;
            v.get("processQueryKey")
                .and_then(|k| k.as_str())
                .map(str::to_string)
                .ok_or_else(|| ApiError::Malformed("no processQueryKey".into()))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_paced_to_the_limit_per_minute_and_nothing_is_dropped() {
        let pacer = Arc::new(Pacer::new(SENDS_PER_MINUTE, Duration::from_secs(60)));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..45 {
            let p = pacer.clone();
            tasks.push(tokio::spawn(async move {
                p.acquire("cid-team").await;
                (i, start.elapsed())
            }));
            // Queued in order.
            tokio::task::yield_now().await;
        }
        let mut times = Vec::new();
        for t in tasks {
            times.push(t.await.unwrap());
        }
        assert_eq!(times.len(), 45, "every send went out");
        // In order, and no window of 60 s holds more than 20.
        for w in times.windows(2) {
            assert!(w[0].1 <= w[1].1, "{times:?}");
        }
        for (i, (_, at)) in times.iter().enumerate() {
            let in_window = times[i..]
                .iter()
                .filter(|(_, t)| *t < *at + Duration::from_secs(60))
                .count();
            assert!(in_window <= SENDS_PER_MINUTE, "{i}: {in_window}");
        }
        assert_eq!(times[19].1, Duration::ZERO, "the first 20 at once");
        assert_eq!(times[20].1, Duration::from_secs(60));
        assert_eq!(times[44].1, Duration::from_secs(120));
        // Another group is not held up by this one's queue.
        let before = Instant::now();
        pacer.acquire("cid-other").await;
        assert_eq!(before.elapsed(), Duration::ZERO);
    }
}
