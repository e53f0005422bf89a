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

async fn receive(node: Arc<Node>, req: Request<Incoming>, remote: SocketAddr) -> Response<Body> {
    if req.headers().contains_key(crate::relay::HEADER_RELAY_TO) {
        return crate::relay::receive(node, req, remote).await;
    }
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
        Err(reject) => reject.respond(&node, remote, header_id.as_deref().unwrap_or("-"), false),
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
    admit_posted(node, &parts.headers, &body).await
}

/// [`admit`] for an envelope POSTed to this node, directly or through a relay
/// ([`crate::relay`]): its signature values are headers, `now` is the wall clock.
pub(crate) async fn admit_posted(
    node: &Arc<Node>,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Result<(Arc<Envelope>, Appended), Reject> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let signed = Signed {
        id: header(HEADER_ID),
        timestamp: header(HEADER_TIMESTAMP),
        signature: header(HEADER_SIGNATURE),
    };
    let now = (crate::envelope::now_millis() / 1000) as i64;
    admit(node, signed, body, now, Via::Http).await
}

/// The three Standard Webhooks values that travel beside an envelope's bytes: HTTP
/// headers on the bridge, entry fields on a Redis Stream.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    /// `webhook-id`: must equal the envelope's id.
    pub id: Option<&'a str>,
    /// `webhook-timestamp`: unix seconds when it was signed.
    pub timestamp: Option<&'a str>,
    /// `webhook-signature`: the sender's signatures over `id.timestamp.body`.
    pub signature: Option<&'a str>,
}

/// Which transport carried an envelope. The checks are the same; only what "now" is
/// and whether the per-peer rate limit applies differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// POSTed by a peer: `now` is the wall clock, and the peer is rate-limited (it
    /// pushes, so a flood must be pushed back with 429).
    Http,
    /// Read from a Redis Stream: `now` is when Redis stored the entry (so a bot that
    /// catches up after downtime still accepts what was fresh when written, while a
    /// re-added old entry is stale), and no rate limit (the node pulls at its own pace).
    Stream,
}

/// A rejected envelope: status (the HTTP answer), reason code for metrics, and a
/// human-readable detail for logs.
#[derive(Debug)]
pub struct Reject(pub StatusCode, pub &'static str, pub String);

impl Reject {
    /// Counts and logs the rejection, then answers the peer with its status and reason.
    pub(crate) fn respond(
        self,
        node: &Node,
        remote: SocketAddr,
        id: &str,
        relayed: bool,
    ) -> Response<Body> {
        let Reject(status, code, detail) = self;
        node.metrics.envelope_in(code);
        tracing::warn!(%remote, id, relayed, status = status.as_u16(), reason = code, %detail, "envelope rejected");
        server::json(
            status,
            &serde_json::json!({"error": code, "detail": detail}),
        )
    }
}

/// The checks every envelope passes, whichever transport carried it: headers → JSON
/// shape → id match → known sender → signature and timestamp window → author rules →
/// rate limit (HTTP) → replay/duplicate → transcript.
pub async fn admit(
    node: &Arc<Node>,
    signed: Signed<'_>,
    body: &[u8],
    now: i64,
    via: Via,
) -> Result<(Arc<Envelope>, Appended), Reject> {
    for (name, value) in [
        (HEADER_ID, signed.id),
        (HEADER_TIMESTAMP, signed.timestamp),
        (HEADER_SIGNATURE, signed.signature),
    ] {
        if value.is_none() {
            return Err(Reject(
                StatusCode::UNAUTHORIZED,
                "missing_header",
                format!("missing {name}"),
            ));
        }
    }
    let env = Envelope::parse(body)
        .map_err(|e| Reject(StatusCode::BAD_REQUEST, "malformed", e.to_string()))?;
    if signed.id != Some(env.id.to_string().as_str()) {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            "id_mismatch",
            "webhook-id does not equal the body's id".into(),
        ));
    }
    let cfg = &node.cfg;
    if via == Via::Stream && env.sender == cfg.bot().name {
        // The stream carries this node's own envelopes back to it.
        return Err(Reject(StatusCode::OK, "own", String::new()));
    }
    let Some(sender) = cfg.member(&env.sender).filter(|b| b.name != cfg.bot().name) else {
        return Err(Reject(
            StatusCode::FORBIDDEN,
            "unknown_sender",
            format!("sender {:?} is not a peer in peers.toml", env.sender),
        ));
    };
    node.cfg
        .verifier
        .verify(
            &env.sender,
            signed.id,
            signed.timestamp,
            signed.signature,
            body,
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
    if via == Via::Http && !node.limiter.allow(&env.sender) {
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
            let source = match via {
                Via::Http => "bridge",
                Via::Stream => "stream",
            };
            let outcome = node
                .record((*env).clone(), source)
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
