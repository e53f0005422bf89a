//! The Bot API client: `POST {api_base_url}/bot{token}/{method}` with a JSON body,
//! answered `{"ok": true, "result": …}` or `{"ok": false, "error_code", "description",
//! "parameters"}`.
//!
//! Every call goes through the kit's one retry loop ([`kit::run`]); this file only
//! reads Telegram's answers (`classify`): a 429's `parameters.retry_after` is waited
//! out exactly (never sooner) before the same request goes again, and every other
//! call of this bot waits for it too; a longer wait than [`RETRY`] allows gives up
//! rather than post late. A refused request (400, 403, 409) is not retried; 401/404
//! mean the token was rejected. The token is part of every URL, so no error here
//! carries a URL (`reqwest::Error::without_url`).

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::pacing::ApiRetry;
use crate::platform::kit::api::{self as kit, Call, Classify, GaveUp, RatePause};

/// The retry schedule: the kit's, with room for Telegram's usual flood waits (a
/// group's 429 often asks for tens of seconds; more than a minute gives up).
pub const RETRY: ApiRetry = ApiRetry {
    attempts: 6,
    base: Duration::from_millis(250),
    max: Duration::from_secs(60),
};

/// Why a Bot API call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No answer (connection refused, reset, timed out).
    #[error("request failed: {0}")]
    Http(String),
    /// 401 or 404 on a bot method: the token is wrong or was revoked.
    #[error(
        "the bot token was rejected (HTTP {0}): telegram.token_env holds a wrong or revoked token"
    )]
    Unauthorized(u16),
    /// `ok: false` with this code and description (400 bad request, 403 not a member,
    /// 409 another poller or a webhook).
    #[error("telegram refused {method}: {code} {description}")]
    Refused {
        /// The method called.
        method: String,
        /// `error_code`.
        code: u16,
        /// Telegram's `description`.
        description: String,
    },
    /// A success whose `result` is not what the method returns.
    #[error("unexpected answer to {0}")]
    Malformed(String),
    /// Retries ran out.
    #[error(transparent)]
    GaveUp(GaveUp<ApiError>),
}

impl ApiError {
    /// Telegram's code for a refusal, if it was one.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Refused { code, .. } => Some(*code),
            ApiError::GaveUp(g) => g.last.code(),
            _ => None,
        }
    }
}

/// The envelope of every answer.
#[derive(Debug, Deserialize)]
struct Answer {
    /// Whether the call succeeded.
    ok: bool,
    /// The method's result (when `ok`).
    #[serde(default)]
    result: Value,
    /// The error code (when not `ok`).
    #[serde(default)]
    error_code: Option<u16>,
    /// What went wrong (when not `ok`).
    #[serde(default)]
    description: Option<String>,
    /// Why, machine-readable: `retry_after`, `migrate_to_chat_id`.
    #[serde(default)]
    parameters: Option<ResponseParameters>,
}

/// `ResponseParameters`.
#[derive(Debug, Deserialize)]
struct ResponseParameters {
    /// Seconds to wait before the request may be repeated (a 429).
    #[serde(default)]
    retry_after: Option<u64>,
    /// The group became a supergroup with this id.
    #[serde(default)]
    migrate_to_chat_id: Option<i64>,
}

/// A Telegram user (or bot), as far as the mesh needs one.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct User {
    /// The user's id.
    pub id: i64,
    /// Whether it is a bot.
    #[serde(default)]
    pub is_bot: bool,
    /// First name.
    #[serde(default)]
    pub first_name: String,
    /// Last name.
    #[serde(default)]
    pub last_name: Option<String>,
    /// The @handle without `@`.
    #[serde(default)]
    pub username: Option<String>,
    /// getMe only: whether privacy mode is off (the bot reads every group message).
    #[serde(default)]
    pub can_read_all_group_messages: Option<bool>,
}

impl User {
    /// First and last name, as Telegram shows them.
    pub fn full_name(&self) -> String {
        match &self.last_name {
            Some(l) if !l.trim().is_empty() => format!("{} {}", self.first_name, l),
            _ => self.first_name.clone(),
        }
    }
}

/// `getWebhookInfo`'s result, as far as the adapter reads it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WebhookInfo {
    /// The webhook's URL; empty when none is set.
    #[serde(default)]
    pub url: String,
    /// Updates waiting to be delivered.
    #[serde(default)]
    pub pending_update_count: u64,
}

/// `ReplyParameters`: the message a post answers.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ReplyParameters {
    /// The message answered.
    pub message_id: i64,
    /// Post anyway when it was deleted meanwhile.
    pub allow_sending_without_reply: bool,
}

/// The body of `sendMessage`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SendMessage {
    /// The chat.
    pub chat_id: i64,
    /// The text, at most 4,096 characters after entity parsing.
    pub text: String,
    /// `HTML`, or absent for plain text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parse_mode: Option<&'static str>,
    /// The message answered, when any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_parameters: Option<ReplyParameters>,
    /// A bot's answer needs no link previews.
    pub link_preview_options: Value,
}

/// A message as `sendMessage` and `editMessageText` return it (only its id is used).
#[derive(Debug, Clone, Deserialize)]
pub struct Sent {
    /// The message's id in its chat.
    pub message_id: i64,
    /// The text as Telegram shows it (entities parsed).
    #[serde(default)]
    pub text: Option<String>,
}

/// A bot's Bot API client: its token, the base URL, and a 429's pause.
pub struct BotApi {
    /// The HTTP client (loopback without a proxy).
    http: reqwest::Client,
    /// `{api_base_url}/bot{token}`: the token is in here, so this is never logged.
    base: String,
    /// Retry schedule.
    retry: ApiRetry,
    /// Every call waits out the last 429's `retry_after`.
    paused: RatePause,
}

impl std::fmt::Debug for BotApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BotApi").finish_non_exhaustive()
    }
}

/// How long one long poll asks Telegram to hold the request open, in seconds.
pub const POLL_TIMEOUT_SECS: u64 = 25;

impl BotApi {
    /// A client for `api_base_url` (`https://api.telegram.org`) with the bot `token`.
    pub fn new(api_base_url: &str, token: &str, retry: ApiRetry) -> anyhow::Result<BotApi> {
        let base_url = api_base_url.trim_end_matches('/');
        let http = crate::platform::kit::http::client(
            base_url,
            crate::platform::kit::http::Timeouts {
                connect: Duration::from_secs(5),
                whole: Duration::from_secs(15),
            },
            None,
        )?;
        Ok(BotApi {
            http,
            base: format!("{base_url}/bot{token}"),
            retry,
            paused: RatePause::default(),
        })
    }

    /// Calls `method` with `body`, retrying as the module docs say; `timeout` bounds
    /// each attempt (longer for a long poll). Returns `result`.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let url = format!("{}/{method}", self.base);
        let url = &url;
        let call = Call {
            platform: "telegram",
            noun: "API call",
            what: Some(method),
        };
        let result = kit::run(&self.retry, call, || async move {
            self.paused.wait(call).await;
            let sent = self.http.post(url).json(body).timeout(timeout).send().await;
            let resp = match sent {
                Ok(r) => r,
                Err(e) => {
                    return Classify::RetryAfter(None, ApiError::Http(e.without_url().to_string()))
                }
            };
            let status = resp.status().as_u16();
            let bytes = match resp.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    return Classify::RetryAfter(None, ApiError::Http(e.without_url().to_string()))
                }
            };
            let answer: Option<Answer> = serde_json::from_slice(&bytes).ok();
            self.classify(method, status, answer)
        })
        .await
        .map_err(|e| e.into_error(ApiError::GaveUp))?;
        serde_json::from_value(result).map_err(|_| ApiError::Malformed(method.to_string()))
    }

    /// What one answer means ([`Classify`]).
    fn classify(
        &self,
        method: &str,
        status: u16,
        answer: Option<Answer>,
    ) -> Classify<Value, ApiError> {
        let Some(answer) = answer else {
            let e = ApiError::Refused {
                method: method.into(),
                code: status,
                description: "an answer that is not the Bot API's JSON".into(),
            };
            return if status >= 500 || status == 429 {
                Classify::RetryAfter(None, e)
            } else if status == 401 || status == 404 {
                Classify::GiveUp(ApiError::Unauthorized(status))
            } else {
                Classify::GiveUp(e)
            };
        };
        if answer.ok {
            return Classify::Ok(answer.result);
        }
        let code = answer.error_code.unwrap_or(status);
        let description = answer.description.unwrap_or_default();
        let params = answer.parameters;
        if let Some(to) = params.as_ref().and_then(|p| p.migrate_to_chat_id) {
            tracing::error!(
                method,
                migrate_to_chat_id = to,
                "the telegram group became a supergroup: set telegram.chat_id to {to}"
            );
        }
        let e = ApiError::Refused {
            method: method.into(),
            code,
            description,
        };
        match code {
            429 => {
                let secs = params.and_then(|p| p.retry_after).unwrap_or(1);
                let wait = Duration::from_secs(secs);
                self.paused.extend(wait);
                tracing::info!(
                    method,
                    retry_after_s = secs,
                    "telegram answered 429; waiting it out before the same request goes again"
                );
                Classify::RetryAfter(Some(wait), e)
            }
            401 | 404 => Classify::GiveUp(ApiError::Unauthorized(code)),
            c if c >= 500 => Classify::RetryAfter(None, e),
            _ => Classify::GiveUp(e),
        }
    }

    /// `getMe`: the bot itself.
    pub async fn get_me(&self) -> Result<User, ApiError> {
        self.call("getMe", &serde_json::json!({}), Duration::from_secs(15))
            .await
    }

    /// `getUpdates`: confirms every update before `offset` and returns those after,
    /// holding the request up to `timeout_secs` while there are none.
    pub async fn get_updates(
        &self,
        offset: Option<i64>,
        timeout_secs: u64,
    ) -> Result<Vec<Value>, ApiError> {
        let mut body = serde_json::json!({
            "timeout": timeout_secs,
            "allowed_updates": ["message"],
        });
        if let Some(o) = offset {
            body["offset"] = o.into();
        }
        self.call("getUpdates", &body, Duration::from_secs(timeout_secs + 10))
            .await
    }

    /// `getWebhookInfo`.
    pub async fn get_webhook_info(&self) -> Result<WebhookInfo, ApiError> {
        self.call(
            "getWebhookInfo",
            &serde_json::json!({}),
            Duration::from_secs(15),
        )
        .await
    }

    /// `deleteWebhook`, keeping the updates waiting (they are polled next).
    pub async fn delete_webhook(&self) -> Result<bool, ApiError> {
        self.call(
            "deleteWebhook",
            &serde_json::json!({"drop_pending_updates": false}),
            Duration::from_secs(15),
        )
        .await
    }

    /// `setWebhook` with the secret Telegram will send back in every delivery.
    pub async fn set_webhook(&self, url: &str, secret_token: &str) -> Result<bool, ApiError> {
        self.call(
            "setWebhook",
            &serde_json::json!({"url": url, "secret_token": secret_token, "allowed_updates": ["message"]}),
            Duration::from_secs(15),
        )
        .await
    }

    /// `sendMessage`; returns the message as sent.
    pub async fn send_message(&self, msg: &SendMessage) -> Result<Sent, ApiError> {
        let body = serde_json::to_value(msg).expect("serializes");
        self.call("sendMessage", &body, Duration::from_secs(15))
            .await
    }

    /// `sendChatAction` `typing`: shown for 5 s or until the bot's next message.
    pub async fn send_typing(&self, chat_id: i64) -> Result<bool, ApiError> {
        self.call(
            "sendChatAction",
            &serde_json::json!({"chat_id": chat_id, "action": "typing"}),
            Duration::from_secs(15),
        )
        .await
    }

    /// `editMessageText` of one of the bot's own messages, in HTML parse mode (text
    /// escaped by the caller, [`crate::platform::telegram::outbound::escape_html`]).
    pub async fn edit_message_text(
        &self,
        chat_id: i64,
        message_id: i64,
        html: &str,
    ) -> Result<Sent, ApiError> {
        self.call(
            "editMessageText",
            &serde_json::json!({"chat_id": chat_id, "message_id": message_id, "text": html, "parse_mode": "HTML"}),
            Duration::from_secs(15),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn api() -> BotApi {
        BotApi::new("http://127.0.0.1:9", "1:x", RETRY).unwrap()
    }

    fn answer(v: Value) -> Option<Answer> {
        serde_json::from_value(v).ok()
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_read_as_telegram_means_them() {
        let a = api();
        assert!(matches!(
            a.classify(
                "getMe",
                200,
                answer(serde_json::json!({"ok": true, "result": {"id": 1}}))
            ),
            Classify::Ok(_)
        ));
        match a.classify(
            "sendMessage",
            429,
            answer(serde_json::json!({"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 7", "parameters": {"retry_after": 7}})),
        ) {
            Classify::RetryAfter(Some(w), _) => assert_eq!(w, Duration::from_secs(7)),
            other => panic!("{other:?}"),
        }
        let paused = a.paused.until().unwrap();
        assert_eq!(
            paused - Instant::now(),
            Duration::from_secs(7),
            "every call waits"
        );
        assert!(matches!(
            a.classify("getMe", 401, answer(serde_json::json!({"ok": false, "error_code": 401, "description": "Unauthorized"}))),
            Classify::GiveUp(ApiError::Unauthorized(401))
        ));
        assert!(matches!(
            a.classify("sendMessage", 400, answer(serde_json::json!({"ok": false, "error_code": 400, "description": "Bad Request: can't parse entities"}))),
            Classify::GiveUp(ApiError::Refused { code: 400, .. })
        ));
        assert!(matches!(
            a.classify("getUpdates", 502, None),
            Classify::RetryAfter(None, _)
        ));
    }

    #[test]
    fn the_token_never_shows() {
        let a = api();
        assert!(!format!("{a:?}").contains("1:x"));
        let e = ApiError::Unauthorized(401);
        assert!(e.to_string().contains("telegram.token_env"));
    }
}
