//! The client-server API client: `{homeserver}/_matrix/client/v3/…` with the access
//! token as `Authorization: Bearer` (never in a URL, so no logged URL carries it).
//!
//! Every call goes through the kit's one retry loop ([`kit::run`]); this file only
//! reads the homeserver's answers ([`ClientApi::classify`]): a 429
//! `M_LIMIT_EXCEEDED` is waited out by its `retry_after_ms` (else the `Retry-After`
//! header, else the backoff) before the same request goes again — a send keeps its
//! transaction id, so a retried send never posts twice — and every other call of this
//! bot waits for it too. A 401 (`M_UNKNOWN_TOKEN`, `M_MISSING_TOKEN`) is
//! [`ApiError::Unauthorized`] at once: the token is wrong or logged out, and no retry
//! can fix that. 5xx and broken connections are retried; other refusals are not.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::config::pacing::ApiRetry;
use crate::platform::kit::api::{self as kit, Call, Classify, GaveUp, RatePause};

/// The retry schedule: the kit's, with room for a homeserver's rate-limit waits
/// (Synapse's default lets a user send one event every 5 s after a burst).
pub const RETRY: ApiRetry = ApiRetry {
    attempts: 8,
    base: Duration::from_millis(250),
    max: Duration::from_secs(60),
};

/// How long one `/sync` long poll asks the homeserver to hold the request open.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a client-server call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No answer (connection refused, reset, timed out).
    #[error("request failed: {0}")]
    Http(String),
    /// 401: the access token is wrong, logged out or expired (`errcode` says which).
    #[error("the homeserver rejected the access token ({errcode}): matrix.access_token_env holds a wrong or logged-out token")]
    Unauthorized {
        /// `M_UNKNOWN_TOKEN`, `M_MISSING_TOKEN`, …
        errcode: String,
    },
    /// An error answer the request cannot get past (403 not in the room, 404, 400).
    #[error("the homeserver refused {what}: {status} {errcode} {error}")]
    Refused {
        /// The call, as its path's last words (`join`, `send`).
        what: &'static str,
        /// The HTTP status.
        status: u16,
        /// The Matrix `errcode`.
        errcode: String,
        /// The homeserver's `error` text.
        error: String,
    },
    /// A success whose body is not what the endpoint returns.
    #[error("unexpected answer to {0}")]
    Malformed(&'static str),
    /// Retries ran out.
    #[error(transparent)]
    GaveUp(GaveUp<ApiError>),
}

impl ApiError {
    /// The HTTP status of a refusal, if it was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Refused { status, .. } => Some(*status),
            ApiError::GaveUp(g) => g.last.status(),
            _ => None,
        }
    }
}

/// The body of every error answer (spec: "Standard error response").
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    /// `M_FORBIDDEN`, `M_LIMIT_EXCEEDED`, …
    #[serde(default)]
    errcode: String,
    /// What went wrong, for people.
    #[serde(default)]
    error: String,
    /// A 429's wait in ms (deprecated since v1.10 in favour of `Retry-After`, which
    /// has only whole seconds; Synapse sends both).
    #[serde(default)]
    retry_after_ms: Option<u64>,
}

/// `GET /account/whoami`'s answer.
#[derive(Debug, Clone, Deserialize)]
pub struct Whoami {
    /// The user the token belongs to.
    pub user_id: String,
    /// The token's device (transaction ids are remembered per device).
    #[serde(default)]
    pub device_id: Option<String>,
}

/// A bot user's client for its homeserver: the token, the base URL, and a 429's
/// pause.
pub struct ClientApi {
    /// The HTTP client (loopback without a proxy).
    http: reqwest::Client,
    /// The homeserver's base URL, no trailing `/`.
    base: reqwest::Url,
    /// The access token (never logged: [`std::fmt::Debug`] leaves it out).
    token: String,
    /// Retry schedule.
    retry: ApiRetry,
    /// Every call waits out the last 429's wait.
    paused: RatePause,
}

impl std::fmt::Debug for ClientApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientApi")
            .field("homeserver", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

impl ClientApi {
    /// A client for `homeserver` with the bot user's `token`.
    pub fn new(homeserver: &str, token: &str, retry: ApiRetry) -> anyhow::Result<ClientApi> {
        let homeserver = homeserver.trim().trim_end_matches('/');
        let http = crate::platform::kit::http::client(
            homeserver,
            crate::platform::kit::http::Timeouts {
                connect: Duration::from_secs(5),
                whole: Duration::from_secs(20),
            },
            Some(concat!("botmesh/", env!("CARGO_PKG_VERSION"))),
        )?;
        Ok(ClientApi {
            http,
            base: reqwest::Url::parse(homeserver)?,
            token: token.to_string(),
            retry,
            paused: RatePause::default(),
        })
    }

    /// `{homeserver}/_matrix/client/v3/` followed by `segments`, each
    /// percent-encoded (room ids hold `!` and `:`, event ids `$`).
    pub fn url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("an http(s) URL")
            .pop_if_empty()
            .extend(["_matrix", "client", "v3"])
            .extend(segments);
        url
    }

    /// Makes one request (the same one on every retry), as the module docs say; `timeout`
    /// bounds each attempt (longer for a long poll).
    async fn call<T: DeserializeOwned>(
        &self,
        what: &'static str,
        method: reqwest::Method,
        url: reqwest::Url,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        let call = Call {
            platform: "matrix",
            noun: "API call",
            what: Some(what),
        };
        let (url, method) = (&url, &method);
        let result = kit::run(&self.retry, call, || async move {
            self.paused.wait(call).await;
            let mut req = self
                .http
                .request(method.clone(), url.clone())
                .bearer_auth(&self.token)
                .timeout(timeout);
            if let Some(b) = body {
                req = req.json(b);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    return Classify::RetryAfter(None, ApiError::Http(e.without_url().to_string()))
                }
            };
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            match resp.bytes().await {
                Ok(bytes) => self.classify(what, status, &bytes, retry_after),
                Err(e) => Classify::RetryAfter(None, ApiError::Http(e.without_url().to_string())),
            }
        })
        .await
        .map_err(|e| e.into_error(ApiError::GaveUp))?;
        serde_json::from_value(result).map_err(|_| ApiError::Malformed(what))
    }

    /// What one answer means ([`Classify`]).
    fn classify(
        &self,
        what: &'static str,
        status: u16,
        bytes: &[u8],
        retry_after: Option<Duration>,
    ) -> Classify<Value, ApiError> {
        if (200..300).contains(&status) {
            return match serde_json::from_slice(bytes) {
                Ok(v) => Classify::Ok(v),
                Err(_) => Classify::GiveUp(ApiError::Malformed(what)),
            };
        }
        let body: ErrorBody = serde_json::from_slice(bytes).unwrap_or_default();
        if status == 401 {
            return Classify::GiveUp(ApiError::Unauthorized {
                errcode: if body.errcode.is_empty() {
                    "401".into()
                } else {
                    body.errcode
                },
            });
        }
        let wait = body
            .retry_after_ms
            .map(Duration::from_millis)
            .or(retry_after);
        let e = ApiError::Refused {
            what,
            status,
            errcode: body.errcode,
            error: body.error,
        };
        if status == 429 {
            if let Some(wait) = wait {
                self.paused.extend(wait);
            }
            tracing::info!(
                what,
                retry_after_ms = wait.map(|w| w.as_millis() as u64),
                "matrix answered 429 M_LIMIT_EXCEEDED; waiting it out before the same request goes again"
            );
            return Classify::RetryAfter(wait, e);
        }
        if status >= 500 {
            return Classify::RetryAfter(None, e);
        }
        Classify::GiveUp(e)
    }

    /// `GET /account/whoami`: whose token this is.
    pub async fn whoami(&self) -> Result<Whoami, ApiError> {
        let url = self.url(&["account", "whoami"]);
        self.call(
            "whoami",
            reqwest::Method::GET,
            url,
            None,
            Duration::from_secs(15),
        )
        .await
    }

    /// `GET /joined_rooms`: the rooms the bot is in.
    pub async fn joined_rooms(&self) -> Result<Vec<String>, ApiError> {
        #[derive(Deserialize)]
        struct Joined {
            joined_rooms: Vec<String>,
        }
        let url = self.url(&["joined_rooms"]);
        let j: Joined = self
            .call(
                "joined_rooms",
                reqwest::Method::GET,
                url,
                None,
                Duration::from_secs(15),
            )
            .await?;
        Ok(j.joined_rooms)
    }

    /// `POST /join/{roomId}`: joins a room the bot is invited to (or may join).
    pub async fn join(&self, room_id: &str) -> Result<(), ApiError> {
        let url = self.url(&["join", room_id]);
        let _: Value = self
            .call(
                "join",
                reqwest::Method::POST,
                url,
                Some(&serde_json::json!({})),
                Duration::from_secs(15),
            )
            .await?;
        Ok(())
    }

    /// Whether the room has an `m.room.encryption` state event (then it is
    /// end-to-end encrypted for good): 200 yes, 404 no.
    pub async fn is_encrypted(&self, room_id: &str) -> Result<bool, ApiError> {
        let url = self.url(&["rooms", room_id, "state", "m.room.encryption", ""]);
        match self
            .call::<Value>(
                "room state",
                reqwest::Method::GET,
                url,
                None,
                Duration::from_secs(15),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `POST /user/{userId}/filter`: stores `filter`; returns its id.
    pub async fn create_filter(&self, user_id: &str, filter: &Value) -> Result<String, ApiError> {
        #[derive(Deserialize)]
        struct Created {
            filter_id: String,
        }
        let url = self.url(&["user", user_id, "filter"]);
        let c: Created = self
            .call(
                "filter",
                reqwest::Method::POST,
                url,
                Some(filter),
                Duration::from_secs(15),
            )
            .await?;
        Ok(c.filter_id)
    }

    /// `GET /sync`: what happened since `since` (everything recent without it),
    /// holding the request up to `timeout` while nothing does.
    pub async fn sync(
        &self,
        since: Option<&str>,
        filter: &str,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let mut url = self.url(&["sync"]);
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("filter", filter)
                .append_pair("timeout", &timeout.as_millis().to_string())
                .append_pair("set_presence", "offline");
            if let Some(s) = since {
                q.append_pair("since", s);
            }
        }
        self.call(
            "sync",
            reqwest::Method::GET,
            url,
            None,
            timeout + Duration::from_secs(15),
        )
        .await
    }

    /// `GET /rooms/{roomId}/messages` forwards from `from` to `to`: one page of the
    /// room's events (at most `limit`), and the token to go on from (none at the end).
    pub async fn messages(
        &self,
        room_id: &str,
        from: &str,
        to: &str,
        limit: u32,
    ) -> Result<(Vec<Value>, Option<String>), ApiError> {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            chunk: Vec<Value>,
            #[serde(default)]
            end: Option<String>,
        }
        let mut url = self.url(&["rooms", room_id, "messages"]);
        url.query_pairs_mut()
            .append_pair("from", from)
            .append_pair("to", to)
            .append_pair("dir", "f")
            .append_pair("limit", &limit.to_string());
        let p: Page = self
            .call(
                "messages",
                reqwest::Method::GET,
                url,
                None,
                Duration::from_secs(20),
            )
            .await?;
        Ok((p.chunk, p.end))
    }

    /// `PUT /rooms/{roomId}/send/m.room.message/{txnId}`: posts `content`; returns
    /// the event id. The same `txn_id` on a retry is the same message to the
    /// homeserver (it answers with the first event id), so the caller picks it once.
    pub async fn send(
        &self,
        room_id: &str,
        txn_id: &str,
        content: &Value,
    ) -> Result<String, ApiError> {
        #[derive(Deserialize)]
        struct Sent {
            event_id: String,
        }
        let url = self.url(&["rooms", room_id, "send", "m.room.message", txn_id]);
        let s: Sent = self
            .call(
                "send",
                reqwest::Method::PUT,
                url,
                Some(content),
                Duration::from_secs(20),
            )
            .await?;
        Ok(s.event_id)
    }

    /// Replaces the text of one of the bot's own messages (`m.replace`, "Event
    /// replacements"): `content` is the new `m.room.message` content as [`send`]
    /// takes it, without `m.relates_to`. Returns the edit's event id.
    ///
    /// [`send`]: ClientApi::send
    pub async fn edit(
        &self,
        room_id: &str,
        txn_id: &str,
        event_id: &str,
        content: &Value,
    ) -> Result<String, ApiError> {
        let mut edit = content.clone();
        edit["body"] = format!("* {}", content["body"].as_str().unwrap_or_default()).into();
        if let Some(html) = content["formatted_body"].as_str() {
            edit["formatted_body"] = format!("* {html}").into();
        }
        edit["m.new_content"] = content.clone();
        edit["m.relates_to"] = serde_json::json!({"rel_type": "m.replace", "event_id": event_id});
        self.send(room_id, txn_id, &edit).await
    }

    /// `PUT /rooms/{roomId}/typing/{userId}`: shows (for `timeout`) or clears the
    /// bot's typing notice. Not an event: no rate limit spent.
    pub async fn typing(
        &self,
        room_id: &str,
        user_id: &str,
        timeout: Option<Duration>,
    ) -> Result<(), ApiError> {
        let body = match timeout {
            Some(t) => serde_json::json!({"typing": true, "timeout": t.as_millis() as u64}),
            None => serde_json::json!({"typing": false}),
        };
        let url = self.url(&["rooms", room_id, "typing", user_id]);
        let _: Value = self
            .call(
                "typing",
                reqwest::Method::PUT,
                url,
                Some(&body),
                Duration::from_secs(15),
            )
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn api() -> ClientApi {
        ClientApi::new("http://127.0.0.1:9/base/", "syt_secret", RETRY).unwrap()
    }

    #[test]
    fn paths_are_percent_encoded_below_the_base() {
        let a = api();
        assert_eq!(
            a.url(&["rooms", "!abc:localhost", "send", "m.room.message", "t1"])
                .as_str(),
            "http://127.0.0.1:9/base/_matrix/client/v3/rooms/!abc:localhost/send/m.room.message/t1",
            "`!` and `:` are legal in a path segment"
        );
        let state = a.url(&["rooms", "!a/b:x", "state", "m.room.encryption", ""]);
        assert!(
            state
                .as_str()
                .ends_with("/rooms/!a%2Fb:x/state/m.room.encryption/"),
            "{state}"
        );
        let ev = a.url(&["rooms", "!a:x", "event", "$e#1"]);
        assert!(ev.as_str().ends_with("/event/$e%231"), "{ev}");
        assert!(
            !format!("{a:?}").contains("syt_secret"),
            "the token never shows"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_read_as_the_spec_means_them() {
        let a = api();
        assert!(matches!(
            a.classify("sync", 200, b"{\"next_batch\":\"s1\"}", None),
            Classify::Ok(_)
        ));
        match a.classify(
            "send",
            429,
            br#"{"errcode":"M_LIMIT_EXCEEDED","error":"Too Many Requests","retry_after_ms":1500}"#,
            Some(Duration::from_secs(2)),
        ) {
            Classify::RetryAfter(Some(w), _) => {
                assert_eq!(w, Duration::from_millis(1500), "ms precision first")
            }
            other => panic!("{other:?}"),
        }
        let paused = a.paused.until().unwrap();
        assert_eq!(
            paused - Instant::now(),
            Duration::from_millis(1500),
            "every call waits"
        );
        match a.classify(
            "send",
            429,
            br#"{"errcode":"M_LIMIT_EXCEEDED"}"#,
            Some(Duration::from_secs(3)),
        ) {
            Classify::RetryAfter(Some(w), _) => {
                assert_eq!(w, Duration::from_secs(3), "else Retry-After")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            a.classify("whoami", 401, br#"{"errcode":"M_UNKNOWN_TOKEN","error":"Invalid access token passed.","soft_logout":false}"#, None),
            Classify::GiveUp(ApiError::Unauthorized { errcode }) if errcode == "M_UNKNOWN_TOKEN"
        ));
        assert!(matches!(
            a.classify(
                "join",
                403,
                br#"{"errcode":"M_FORBIDDEN","error":"not invited"}"#,
                None
            ),
            Classify::GiveUp(ApiError::Refused { status: 403, .. })
        ));
        assert!(matches!(
            a.classify("sync", 502, b"bad gateway", None),
            Classify::RetryAfter(None, _)
        ));
        let e = ApiError::Unauthorized {
            errcode: "M_UNKNOWN_TOKEN".into(),
        };
        assert!(e.to_string().contains("matrix.access_token_env"));
    }
}
