//! Slack's Web API, as much of it as a bot of the mesh uses: `auth.test` (who am I),
//! `apps.connections.open` (a Socket Mode URL, with the app-level token),
//! `chat.postMessage` and `users.info` (with the bot token).
//!
//! Every method is `POST {api_base_url}{method}` with `Authorization: Bearer …`, a
//! form body (`application/x-www-form-urlencoded`) or, for chat.postMessage, JSON,
//! as slack_sdk sends them. Slack answers HTTP 200 with `{"ok": true, …}` or
//! `{"ok": false, "error": "…"}`; a rate limit is HTTP 429 with `Retry-After`
//! seconds. How each answer is read (`classify`) drives the kit's one retry loop:
//! a 429 (or `ratelimited`) waits exactly `Retry-After` (never sooner, and only that
//! wait: no backoff on top), a 5xx, a lost connection or Slack's own transient errors
//! (`internal_error`, `fatal_error`, `service_unavailable`, `request_timeout`) back
//! off, anything else is final.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::config::pacing::ApiRetry;
use crate::platform::kit::api::{self as kit, Call, Classify, GaveUp};

/// How Slack API calls are retried: six attempts, backing off from 250 ms; a
/// `Retry-After` of up to 60 s is waited out (Slack's per-channel post limit asks for
/// about a second; a longer wait gives up, the reply would come too late).
pub const RETRY: ApiRetry = ApiRetry {
    attempts: 6,
    base: Duration::from_millis(250),
    max: Duration::from_secs(60),
};

/// Errors in `{"ok": false}` answers that mean the token is wrong, revoked or of the
/// wrong kind: another attempt cannot succeed, and the adapter stops on them at start.
pub const AUTH_ERRORS: &[&str] = &[
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "not_allowed_token_type",
];

/// Errors in `{"ok": false}` answers that Slack documents as transient.
pub const TRANSIENT_ERRORS: &[&str] = &[
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
];

/// Why a Web API call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// No answer (connection refused, reset, timed out).
    #[error("request failed: {0}")]
    Http(String),
    /// An HTTP status other than 200 and 429.
    #[error("HTTP {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The body, cut short.
        body: String,
    },
    /// A 429 (or `ratelimited`), with the wait Slack asked for.
    #[error("rate limited (Retry-After {0:?})")]
    RateLimited(Duration),
    /// `{"ok": false}` with a token error ([`AUTH_ERRORS`]).
    #[error("{method}: {error} (the token was refused)")]
    Auth {
        /// The method called.
        method: String,
        /// Slack's error code.
        error: String,
    },
    /// `{"ok": false}` with another error code.
    #[error("{method}: {error}")]
    Slack {
        /// The method called.
        method: String,
        /// Slack's error code (`channel_not_found`, `not_in_channel`, …).
        error: String,
    },
    /// A 200 whose body is not Slack's JSON.
    #[error("unexpected answer: {0}")]
    Malformed(String),
    /// Retries ran out.
    #[error(transparent)]
    GaveUp(GaveUp<ApiError>),
}

impl ApiError {
    /// Slack's error code, when Slack answered `{"ok": false}` (looking through a
    /// give-up to its last error).
    pub fn code(&self) -> Option<&str> {
        match self {
            ApiError::Auth { error, .. } | ApiError::Slack { error, .. } => Some(error),
            ApiError::GaveUp(g) => g.last.code(),
            _ => None,
        }
    }

    /// Whether the token was refused.
    pub fn is_auth(&self) -> bool {
        match self {
            ApiError::Auth { .. } => true,
            ApiError::GaveUp(g) => g.last.is_auth(),
            _ => false,
        }
    }
}

/// A request body, as slack_sdk sends one.
#[derive(Debug, Clone)]
pub enum Body {
    /// `application/x-www-form-urlencoded` (every method but chat.postMessage).
    Form(Vec<(&'static str, String)>),
    /// `application/json; charset=utf-8` (chat.postMessage).
    Json(Value),
}

/// One HTTP answer as [`classify`] reads it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// `Retry-After` in seconds, when sent.
    pub retry_after: Option<f64>,
    /// The body.
    pub body: bytes::Bytes,
}

/// What one answer of `method` means for the retry loop (see the module docs).
pub(crate) fn classify(method: &str, answer: Answer) -> Classify<Value, ApiError> {
    let wait = Duration::from_secs_f64(answer.retry_after.unwrap_or(1.0).clamp(0.0, 3600.0));
    if answer.status == 429 {
        return Classify::RetryAfter(Some(wait), ApiError::RateLimited(wait));
    }
    if answer.status != 200 {
        let error = ApiError::Status {
            status: answer.status,
            body: String::from_utf8_lossy(&answer.body)
                .chars()
                .take(300)
                .collect(),
        };
        return if answer.status >= 500 {
            Classify::RetryAfter(None, error)
        } else {
            Classify::GiveUp(error)
        };
    }
    let v: Value = match serde_json::from_slice(&answer.body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            let body: String = String::from_utf8_lossy(&answer.body)
                .chars()
                .take(200)
                .collect();
            return Classify::GiveUp(ApiError::Malformed(body));
        }
    };
    if v["ok"] == Value::Bool(true) {
        return Classify::Ok(v);
    }
    let error = v["error"].as_str().unwrap_or("unknown_error").to_string();
    let method = method.to_string();
    if error == "ratelimited" {
        Classify::RetryAfter(Some(wait), ApiError::RateLimited(wait))
    } else if AUTH_ERRORS.contains(&error.as_str()) {
        Classify::GiveUp(ApiError::Auth { method, error })
    } else if TRANSIENT_ERRORS.contains(&error.as_str()) {
        Classify::RetryAfter(None, ApiError::Slack { method, error })
    } else {
        Classify::GiveUp(ApiError::Slack { method, error })
    }
}

/// `auth.test`: who the bot token belongs to.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct AuthTest {
    /// The bot user's id.
    pub user_id: String,
    /// The bot user's name.
    #[serde(default)]
    pub user: String,
    /// The bot's id (`B…`), which its messages carry as `bot_id`.
    #[serde(default)]
    pub bot_id: Option<String>,
    /// The workspace.
    #[serde(default)]
    pub team: String,
}

/// A user as `users.info` describes one (what naming a person needs).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct User {
    /// `U…`.
    pub id: String,
    /// The username (handle).
    #[serde(default)]
    pub name: String,
    /// The full name.
    #[serde(default)]
    pub real_name: Option<String>,
    /// Profile fields.
    #[serde(default)]
    pub profile: Profile,
    /// Whether this is an app's bot user.
    #[serde(default)]
    pub is_bot: bool,
}

/// `users.info`'s `user.profile`, as far as names go.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Profile {
    /// The name the person chose to be shown by (may be empty).
    #[serde(default)]
    pub display_name: String,
    /// The full name.
    #[serde(default)]
    pub real_name: String,
}

impl User {
    /// The name Slack shows: the display name, else the full name, else the handle.
    pub fn display_name(&self) -> String {
        [
            self.profile.display_name.as_str(),
            self.profile.real_name.as_str(),
            self.real_name.as_deref().unwrap_or(""),
            self.name.as_str(),
        ]
        .into_iter()
        .map(str::trim)
        .find(|n| !n.is_empty())
        .unwrap_or(self.id.as_str())
        .to_string()
    }
}

/// A bot's Web API client: Slack's base URL and the two tokens.
pub struct WebApi {
    /// The HTTP client (timeouts; no proxy for a loopback stand-in).
    http: reqwest::Client,
    /// `https://slack.com/api/`, ending in `/`.
    base_url: String,
    /// The bot token (`xoxb-…`).
    bot_token: String,
    /// The app-level token (`xapp-…`).
    app_token: String,
    /// How calls are retried.
    retry: ApiRetry,
}

impl std::fmt::Debug for WebApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebApi")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// Which token a method takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// The bot token.
    Bot,
    /// The app-level token.
    App,
}

impl WebApi {
    /// A client for `base_url` (ending in `/`) with the two tokens.
    pub fn new(
        base_url: &str,
        bot_token: &str,
        app_token: &str,
        retry: ApiRetry,
    ) -> anyhow::Result<WebApi> {
        let http = crate::platform::kit::http::client(
            base_url,
            crate::platform::kit::http::Timeouts {
                connect: Duration::from_secs(5),
                whole: Duration::from_secs(15),
            },
            Some(concat!("botmesh/", env!("CARGO_PKG_VERSION"))),
        )?;
        Ok(WebApi {
            http,
            base_url: base_url.to_string(),
            bot_token: bot_token.to_string(),
            app_token: app_token.to_string(),
            retry,
        })
    }

    /// Calls `method` with `token` and `body`, retrying as the module docs say;
    /// returns Slack's `{"ok": true, …}` object.
    pub async fn call(&self, method: &str, token: Token, body: Body) -> Result<Value, ApiError> {
        let url = format!("{}{method}", self.base_url);
        let token = match token {
            Token::Bot => &self.bot_token,
            Token::App => &self.app_token,
        };
        let (url, body) = (&url, &body);
        let call = Call {
            platform: "slack",
            noun: "API call",
            what: Some(method),
        };
        kit::run(&self.retry, call, || async move {
            let req = self.http.post(url).bearer_auth(token);
            let req = match body {
                Body::Form(fields) => req.form(fields),
                Body::Json(v) => req
                    .header("content-type", "application/json; charset=utf-8")
                    .body(v.to_string()),
            };
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => return Classify::RetryAfter(None, ApiError::Http(e.to_string())),
            };
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0);
            match resp.bytes().await {
                Ok(body) => classify(
                    method,
                    Answer {
                        status,
                        retry_after,
                        body,
                    },
                ),
                Err(e) => Classify::RetryAfter(None, ApiError::Http(e.to_string())),
            }
        })
        .await
        .map_err(|e| e.into_error(ApiError::GaveUp))
    }

    /// `auth.test` with the bot token.
    pub async fn auth_test(&self) -> Result<AuthTest, ApiError> {
        let v = self
            .call("auth.test", Token::Bot, Body::Form(Vec::new()))
            .await?;
        AuthTest::deserialize(&v).map_err(|e| ApiError::Malformed(e.to_string()))
    }

    /// `apps.connections.open` with the app-level token: a Socket Mode URL (`wss://…`),
    /// good for one connection.
    pub async fn connections_open(&self) -> Result<String, ApiError> {
        let v = self
            .call("apps.connections.open", Token::App, Body::Form(Vec::new()))
            .await?;
        v["url"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ApiError::Malformed("apps.connections.open without a url".into()))
    }

    /// `users.info`: a user's names.
    pub async fn users_info(&self, user: &str) -> Result<User, ApiError> {
        let v = self
            .call(
                "users.info",
                Token::Bot,
                Body::Form(vec![("user", user.to_string())]),
            )
            .await?;
        User::deserialize(&v["user"]).map_err(|e| ApiError::Malformed(e.to_string()))
    }

    /// `chat.postMessage` of `text` to `channel`, in the thread of `thread_ts` when
    /// given; returns the new message's `ts`.
    pub async fn post_message(
        &self,
        channel: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> Result<String, ApiError> {
        let mut body = serde_json::json!({"channel": channel, "text": text});
        if let Some(t) = thread_ts {
            body["thread_ts"] = Value::String(t.to_string());
        }
        let v = self
            .call("chat.postMessage", Token::Bot, Body::Json(body))
            .await?;
        v["ts"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ApiError::Malformed("chat.postMessage without a ts".into()))
    }

    /// `chat.update`: replaces the text of the bot's message `ts` in `channel`.
    pub async fn update_message(
        &self,
        channel: &str,
        ts: &str,
        text: &str,
    ) -> Result<(), ApiError> {
        let body = serde_json::json!({"channel": channel, "ts": ts, "text": text});
        self.call("chat.update", Token::Bot, Body::Json(body))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, retry_after: Option<f64>, body: &str) -> Answer {
        Answer {
            status,
            retry_after,
            body: bytes::Bytes::from(body.to_string()),
        }
    }

    #[test]
    fn answers_are_read_as_slack_means_them() {
        assert!(matches!(
            classify("auth.test", answer(200, None, r#"{"ok":true,"user_id":"U1"}"#)),
            Classify::Ok(v) if v["user_id"] == "U1"
        ));
        match classify("chat.postMessage", answer(429, Some(2.0), "")) {
            Classify::RetryAfter(Some(w), _) => assert_eq!(w, Duration::from_secs(2)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify("x", answer(200, Some(3.0), r#"{"ok":false,"error":"ratelimited"}"#)),
            Classify::RetryAfter(Some(w), _) if w == Duration::from_secs(3)
        ));
        assert!(matches!(
            classify(
                "x",
                answer(200, None, r#"{"ok":false,"error":"invalid_auth"}"#)
            ),
            Classify::GiveUp(ApiError::Auth { .. })
        ));
        assert!(matches!(
            classify(
                "x",
                answer(200, None, r#"{"ok":false,"error":"internal_error"}"#)
            ),
            Classify::RetryAfter(None, _)
        ));
        assert!(matches!(
            classify("x", answer(200, None, r#"{"ok":false,"error":"channel_not_found"}"#)),
            Classify::GiveUp(ApiError::Slack { ref error, .. }) if error == "channel_not_found"
        ));
        assert!(matches!(
            classify("x", answer(503, None, "down")),
            Classify::RetryAfter(None, _)
        ));
        assert!(matches!(
            classify("x", answer(404, None, "no")),
            Classify::GiveUp(_)
        ));
        assert!(matches!(
            classify("x", answer(200, None, "<html>")),
            Classify::GiveUp(ApiError::Malformed(_))
        ));
    }

    #[test]
    fn display_names_fall_back_in_slacks_order() {
        let mut u = User {
            id: "U1".into(),
            name: "carol".into(),
            real_name: Some("Carol C".into()),
            ..Default::default()
        };
        assert_eq!(u.display_name(), "Carol C");
        u.profile.display_name = "cc".into();
        assert_eq!(u.display_name(), "cc");
        assert_eq!(
            User {
                id: "U2".into(),
                ..Default::default()
            }
            .display_name(),
            "U2"
        );
    }
}
