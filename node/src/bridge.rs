//! The peer-facing listener: `POST /bridge/v1/envelopes`, and Feishu's event callbacks
//! at `POST /feishu/v1/events` (checked by [`crate::feishu`]).
//!
//! Every request runs the same gauntlet, cheapest check first, and every rejection is
//! counted and logged with its reason, the peer address and the id (never a secret):
//! size (413) → headers (401) → JSON shape (400) → id match (400) → known sender (403)
//! → signature and timestamp window (401) → author rules (403) → rate limit (429) →
//! replay/duplicate (200 duplicate) → transcript (200 accepted).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::config::Platform;
use crate::envelope::{AuthorKind, Envelope, Kind};
use crate::node::Node;
use crate::outbox::ENVELOPES_PATH;
use crate::server::{self, Body, BodyError};
use crate::signing::{HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use crate::transcript::Appended;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Routes a request on the peer-facing listener.
pub async fn handle(node: Arc<Node>, req: Request<Incoming>, remote: SocketAddr) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::POST, ENVELOPES_PATH) => receive(node, req, remote).await,
        (&Method::POST, crate::feishu::EVENTS_PATH) => {
            crate::feishu::handle_events(node, req, remote).await
        }
        (&Method::GET, "/healthz") => crate::api::health(&node),
        (_, ENVELOPES_PATH) => server::error(StatusCode::METHOD_NOT_ALLOWED, "use POST"),
        _ => server::error(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

/// A rejection: status, reason code for metrics, human-readable detail for logs.
struct Reject(StatusCode, &'static str, String);

async fn receive(node: Arc<Node>, req: Request<Incoming>, remote: SocketAddr) -> Response<Body> {
    let header_id = req
        .headers()
        .get(HEADER_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match gauntlet(&node, req).await {
        Ok((env, outcome)) => {
            let result = match outcome {
                Appended::New => "accepted",
                Appended::Duplicate => "duplicate",
            };
            node.metrics.envelope_in(result);
            tracing::info!(%remote, sender = %env.sender, id = %env.id, kind = ?env.kind, group = %env.group, depth = env.depth, result, "envelope");
            match outcome {
                Appended::New => {
                    server::json(StatusCode::OK, &serde_json::json!({"accepted": true}))
                }
                Appended::Duplicate => {
                    server::json(StatusCode::OK, &serde_json::json!({"duplicate": true}))
                }
            }
        }
        Err(Reject(status, code, detail)) => {
            node.metrics.envelope_in(code);
            tracing::warn!(%remote, id = header_id.as_deref().unwrap_or("-"), status = status.as_u16(), reason = code, %detail, "envelope rejected");
            server::json(
                status,
                &serde_json::json!({"error": code, "detail": detail}),
            )
        }
    }
}

async fn gauntlet(
    node: &Arc<Node>,
    req: Request<Incoming>,
) -> Result<(Arc<Envelope>, Appended), Reject> {
    let (parts, body) = server::read_body(req, MAX_BODY_BYTES)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { .. } => {
                Reject(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.to_string())
            }
            BodyError::Read(_) => Reject(StatusCode::BAD_REQUEST, "unreadable", e.to_string()),
        })?;
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    for name in [HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE] {
        if header(name).is_none() {
            return Err(Reject(
                StatusCode::UNAUTHORIZED,
                "missing_header",
                format!("missing {name}"),
            ));
        }
    }
    let env = Envelope::parse(&body)
        .map_err(|e| Reject(StatusCode::BAD_REQUEST, "malformed", e.to_string()))?;
    if header(HEADER_ID) != Some(env.id.to_string().as_str()) {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            "id_mismatch",
            "webhook-id does not equal the body's id".into(),
        ));
    }
    let cfg = &node.cfg;
    let Some(sender) = cfg.member(&env.sender).filter(|b| b.name != cfg.bot().name) else {
        return Err(Reject(
            StatusCode::FORBIDDEN,
            "unknown_sender",
            format!("sender {:?} is not a peer in peers.toml", env.sender),
        ));
    };
    let now = (crate::envelope::now_millis() / 1000) as i64;
    node.cfg
        .verifier
        .verify(
            &env.sender,
            header(HEADER_ID),
            header(HEADER_TIMESTAMP),
            header(HEADER_SIGNATURE),
            &body,
            now,
        )
        .map_err(|e| Reject(StatusCode::UNAUTHORIZED, e.reason_code(), e.to_string()))?;
    match env.author.kind {
        AuthorKind::Bot if env.author.name != env.sender => {
            return Err(Reject(
                StatusCode::FORBIDDEN,
                "author_not_sender",
                format!("{} may not send as bot {:?}", env.sender, env.author.name),
            ));
        }
        AuthorKind::Human if sender.platform != Platform::Local => {
            return Err(Reject(
                StatusCode::FORBIDDEN,
                "human_from_platform_bot",
                format!(
                    "{} is on {:?}: its humans arrive through the platform, not the bridge",
                    env.sender, sender.platform
                ),
            ));
        }
        AuthorKind::Human if cfg.member(&env.author.name).is_some() => {
            return Err(Reject(
                StatusCode::FORBIDDEN,
                "human_named_as_bot",
                format!("a human may not use the bot name {:?}", env.author.name),
            ));
        }
        _ => {}
    }
    if !node.limiter.allow(&env.sender) {
        return Err(Reject(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "{} is over {} envelopes/s",
                env.sender,
                cfg.mesh().peer_rate_limit
            ),
        ));
    }
    let id = env.id.to_string();
    if node.seen.contains(&id) {
        return Ok((Arc::new(env), Appended::Duplicate));
    }
    let env = Arc::new(env);
    let outcome = match env.kind {
        Kind::Claim => {
            if node.seen.insert(&id) {
                node.on_claim(env.clone());
                Appended::New
            } else {
                Appended::Duplicate
            }
        }
        Kind::Message if env.is_human() && cfg.bot().platform != Platform::Local => {
            // This node's platform delivers humans itself; the bridge copy would be a second one.
            node.seen.insert(&id);
            tracing::info!(id = %env.id, sender = %env.sender, "ignoring bridge copy of a human message (platform delivers humans)");
            Appended::Duplicate
        }
        Kind::Message => {
            let outcome = node
                .record((*env).clone(), "bridge")
                .await
                .map_err(|e| Reject(StatusCode::SERVICE_UNAVAILABLE, "storage", e.to_string()))?;
            node.seen.insert(&id);
            outcome
        }
    };
    Ok((env, outcome))
}

/// A token bucket per verified sender.
pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    /// `per_second` sustained, bursts up to twice that.
    pub fn new(per_second: u32) -> Self {
        RateLimiter {
            per_second: per_second as f64,
            burst: (per_second * 2) as f64,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `who`, if there is one.
    pub fn allow(&self, who: &str) -> bool {
        let now = Instant::now();
        let mut b = self.buckets.lock().expect("limiter lock");
        let (tokens, at) = b.entry(who.to_string()).or_insert((self.burst, now));
        let elapsed = now
            .duration_since(*at)
            .min(Duration::from_secs(60))
            .as_secs_f64();
        *tokens = (*tokens + elapsed * self.per_second).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How many senders have a bucket (for metrics and soak checks).
    pub fn buckets(&self) -> usize {
        self.buckets.lock().expect("limiter lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn limiter_refills() {
        let l = RateLimiter::new(2);
        assert!((0..4).all(|_| l.allow("A")));
        assert!(!l.allow("A"));
        assert!(l.allow("B"), "buckets are per sender");
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(l.allow("A"));
        assert!(!l.allow("A"));
    }
}
