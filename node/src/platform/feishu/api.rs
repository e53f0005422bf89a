//! The outbound API client ([`FeishuClient`]): tenant token, sending, retries, pacing.

use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde::Deserialize;

use crate::config::pacing::TokenBucket;
use crate::telemetry::metrics::Metrics;

use super::*;
use crate::platform::kit::api::{self as kit, ApiError, Call, Classify, GaveUp};
use crate::platform::kit::pacer::ChatPacer;
use crate::platform::kit::token::{Fresh, TokenSource};

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
    /// Retries ran out.
    #[error(transparent)]
    GaveUp(GaveUp<SendError>),
}

impl From<ApiError<SendError>> for SendError {
    /// Retries ran out: [`SendError::GaveUp`]; else the error another attempt could not fix.
    fn from(e: ApiError<SendError>) -> Self {
        e.into_error(SendError::GaveUp)
    }
}

/// Retry schedule for failures that are not rate limits (the one every platform
/// client uses).
pub(crate) use crate::config::pacing::ApiRetry as RetryPolicy;

#[derive(Deserialize)]
pub(super) struct TokenReply {
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
pub(super) struct ApiReply {
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

/// A token bucket per chat ([`SENDS_PER_CHAT_PER_SEC`]).
pub(super) type ChatLimiter = ChatPacer<TokenBucket>;

/// The Feishu open platform API as this bot's app: token, bot info, sending.
pub(crate) struct FeishuClient {
    http: reqwest::Client,
    base_url: String,
    app_id: String,
    app_secret: String,
    token: TokenSource,
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
pub(super) fn url_segment(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

pub(super) fn retryable(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// The server's hint, in seconds, of when to come back.
pub(super) fn retry_hint(headers: &HeaderMap) -> Option<Duration> {
    ["x-ogw-ratelimit-reset", "retry-after"]
        .iter()
        .find_map(|h| headers.get(*h)?.to_str().ok()?.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// How a Feishu answer with a nonzero code reads: a rate limit ([`RATE_LIMIT_CODES`],
/// 429) or server trouble (5xx) is worth another attempt, after Feishu's wait if it
/// named one; any other code is Feishu's final word.
fn refused<T>(
    status: StatusCode,
    hint: Option<Duration>,
    code: i64,
    msg: String,
) -> Classify<T, SendError> {
    let error = SendError::Api { code, msg };
    if retryable(status) || RATE_LIMIT_CODES.contains(&code) {
        Classify::RetryAfter(hint, error)
    } else {
        Classify::GiveUp(error)
    }
}

/// Feishu's open API answers quickly or not at all.
const API_TIMEOUTS: crate::platform::kit::http::Timeouts = crate::platform::kit::http::Timeouts {
    connect: Duration::from_secs(3),
    whole: Duration::from_secs(10),
};

impl FeishuClient {
    /// A client for the app `app_id` at `base_url` (`https://open.feishu.cn` or Lark's).
    pub(crate) fn new(
        base_url: &str,
        app_id: &str,
        app_secret: &str,
        retry: RetryPolicy,
    ) -> anyhow::Result<FeishuClient> {
        let base_url = base_url.trim_end_matches('/').to_string();
        let http = crate::platform::kit::http::client(&base_url, API_TIMEOUTS, None)?;
        Ok(FeishuClient {
            http,
            base_url,
            app_id: app_id.to_string(),
            app_secret: app_secret.to_string(),
            token: TokenSource::new(),
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
            super::metrics::api_call(m, &api_endpoint(method, url));
        }
    }

    /// A valid tenant access token: the cached one, or a fresh one when it is near
    /// expiry or equals `rejected` (the one Feishu just called invalid). One fetch
    /// at a time: concurrent callers wait for it and share the result.
    pub(crate) async fn tenant_token(&self, rejected: Option<&str>) -> Result<String, SendError> {
        self.token.get(rejected, || self.fetch_token()).await
    }

    async fn fetch_token(&self) -> Result<Fresh, SendError> {
        let url = format!(
            "{}/open-apis/auth/v3/tenant_access_token/internal",
            self.base_url
        );
        let body = serde_json::json!({"app_id": self.app_id, "app_secret": self.app_secret});
        let (url, body) = (&url, &body);
        let call = Call {
            platform: "feishu",
            noun: "token request",
            what: None,
        };
        kit::run(&self.retry, call, || async move {
            self.count("POST", url);
            let resp = match self.http.post(url).json(body).send().await {
                Err(e) => return Classify::RetryAfter(None, SendError::Http(e.to_string())),
                Ok(resp) => resp,
            };
            let status = resp.status();
            let hint = retry_hint(resp.headers());
            match resp.json::<TokenReply>().await {
                Ok(r) if r.code == 0 => {
                    let Some(value) = r.tenant_access_token.filter(|t| !t.is_empty()) else {
                        return Classify::GiveUp(SendError::Malformed(
                            "no tenant_access_token".into(),
                        ));
                    };
                    let expire = r.expire.unwrap_or(0);
                    tracing::debug!(expire, "feishu tenant token fetched");
                    Classify::Ok(Fresh {
                        value,
                        expires_in_secs: expire,
                    })
                }
                Ok(r) => refused(status, hint, r.code, r.msg),
                Err(_) if retryable(status) => {
                    Classify::RetryAfter(hint, SendError::Status(status.as_u16()))
                }
                Err(e) => Classify::GiveUp(SendError::Malformed(e.to_string())),
            }
        })
        .await
        .map_err(SendError::from)
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
        // What a refresh needs across attempts: the token Feishu called invalid, and
        // how many refreshes were made (at most two).
        let refreshed: Mutex<(Option<String>, u32)> = Mutex::new((None, 0));
        let (refreshed, method) = (&refreshed, &method);
        let call = Call {
            platform: "feishu",
            noun: "API call",
            what: None,
        };
        kit::run(&self.retry, call, || async move {
            if let Some(chat) = chat {
                self.limiter.acquire(chat).await;
            }
            let rejected = refreshed.lock().0.clone();
            let token = match self.tenant_token(rejected.as_deref()).await {
                Ok(token) => token,
                Err(e) => return Classify::GiveUp(e),
            };
            let mut req = self.http.request(method.clone(), url).bearer_auth(&token);
            if let Some(b) = body {
                req = req.json(b);
            }
            self.count(method.as_str(), url);
            let resp = match req.send().await {
                Err(e) => return Classify::RetryAfter(None, SendError::Http(e.to_string())),
                Ok(resp) => resp,
            };
            let status = resp.status();
            let hint = retry_hint(resp.headers());
            match resp.json::<ApiReply>().await {
                Ok(r) if r.code == 0 && status.is_success() => Classify::Ok(r),
                Ok(r) if TOKEN_INVALID_CODES.contains(&r.code) && refreshed.lock().1 < 2 => {
                    let mut refresh = refreshed.lock();
                    refresh.0 = Some(token);
                    refresh.1 += 1;
                    drop(refresh);
                    tracing::info!(
                        code = r.code,
                        "feishu says the tenant token is invalid; refreshing it"
                    );
                    Classify::Again
                }
                Ok(r) => refused(status, hint, r.code, r.msg),
                Err(_) if retryable(status) => {
                    Classify::RetryAfter(hint, SendError::Status(status.as_u16()))
                }
                Err(_) if !status.is_success() => {
                    Classify::GiveUp(SendError::Status(status.as_u16()))
                }
                Err(e) => Classify::GiveUp(SendError::Malformed(e.to_string())),
            }
        })
        .await
        .map_err(SendError::from)
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

    /// Edits the text of the bot's message `message_id` in `chat_id` (`PUT
    /// /open-apis/im/v1/messages/:message_id`, "edit message": text and post messages
    /// only; Feishu allows 20 edits of one message, within 14 days of its sending),
    /// paced with the chat's posts.
    pub(crate) async fn update_text(
        &self,
        chat_id: &str,
        message_id: &str,
        text: &str,
    ) -> Result<(), SendError> {
        let url = format!("{}/open-apis/im/v1/messages/{message_id}", self.base_url);
        let body = serde_json::json!({
            "msg_type": "text",
            "content": serde_json::json!({"text": text}).to_string(),
        });
        self.call(reqwest::Method::PUT, &url, Some(&body), Some(chat_id))
            .await
            .map(|_| ())
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
