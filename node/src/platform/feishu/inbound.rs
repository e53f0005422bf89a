//! The webhook handler and event processing: callbacks and long-connection events alike
//! become arrivals here.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::ingress::server::{self, Body, BodyError};
use crate::platform::kit::inbound::{PlatformMessage, Received, Sender};
use crate::platform::AdapterContext;
use crate::telemetry::metrics::Metrics;
use crate::wire::envelope::now_millis;
use futures_util::future::BoxFuture;

use super::*;

// ---------------------------------------------------------------------------------
// HTTP handler and event processing
// ---------------------------------------------------------------------------------

/// What a verified callback leads to.
pub(super) enum Outcome {
    Challenge(String),
    Duplicate(String),
    Ignored(String, String),
    Message(String, Box<MessageReceived>),
}

/// A Feishu callback reaching a node that takes none (its platform is not feishu, or
/// it listens on the long connection): answered by [`not_enabled`]; `None` for any
/// other request.
pub(crate) fn callback_elsewhere(
    method: &http::Method,
    path: &str,
    metrics: &Metrics,
    remote: SocketAddr,
) -> Option<Response<Body>> {
    (method == http::Method::POST && path == EVENTS_PATH).then(|| not_enabled(metrics, remote))
}

/// `POST /feishu/v1/events` on a node whose platform is not feishu: refused, counted.
pub(crate) fn not_enabled(metrics: &Metrics, remote: SocketAddr) -> Response<Body> {
    let e = EventError::NotEnabled;
    super::metrics::event(metrics, e.reason());
    if crate::telemetry::refusals::REFUSALS.admit("feishu webhook", e.reason()) {
        tracing::warn!(%remote, reason = e.reason(), "feishu callback to a node that is not on feishu");
    }
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
            super::metrics::event(&node.metrics, "challenge");
            tracing::info!(%remote, "feishu url_verification answered");
            server::json(
                StatusCode::OK,
                &serde_json::json!({ "challenge": challenge }),
            )
        }
        Ok(Outcome::Duplicate(event_id)) => {
            super::metrics::event(&node.metrics, "duplicate");
            tracing::info!(%remote, %event_id, "feishu event already handled (retry)");
            server::json(StatusCode::OK, &serde_json::json!({"duplicate": true}))
        }
        Ok(Outcome::Ignored(event_id, event_type)) => {
            super::metrics::event(&node.metrics, "ignored");
            tracing::debug!(%remote, %event_id, %event_type, "feishu event ignored");
            server::json(StatusCode::OK, &serde_json::json!({"ok": true}))
        }
        Ok(Outcome::Message(event_id, msg)) => {
            super::metrics::event(&node.metrics, "message");
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
            super::metrics::event(&node.metrics, e.reason());
            if crate::telemetry::refusals::REFUSALS.admit("feishu webhook", e.reason()) {
                tracing::warn!(%remote, status = e.status().as_u16(), reason = e.reason(), detail = %e, "feishu callback rejected");
            }
            server::json(
                e.status(),
                &serde_json::json!({"error": e.reason(), "detail": e.to_string()}),
            )
        }
    }
}

pub(super) async fn accept(f: &Feishu, req: Request<Incoming>) -> Result<Outcome, EventError> {
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

impl ws::EventHandler for WsEvents {
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
            super::metrics::event(&ingest.metrics, "ignored");
            return 200;
        }
        Err(e) => {
            super::metrics::event(&ingest.metrics, e.reason());
            tracing::warn!(reason = e.reason(), detail = %e, "feishu long-connection event malformed; acknowledged and dropped");
            return 200;
        }
    };
    if let Some(app) = header.app_id.as_ref().filter(|a| **a != f.auth.app_id) {
        super::metrics::event(&ingest.metrics, "wrong_app");
        tracing::warn!(%app, event_id = %header.event_id, "feishu event for another app; dropped");
        return 200;
    }
    if f.dedup.contains(&header.event_id) {
        super::metrics::event(&ingest.metrics, "duplicate");
        tracing::info!(event_id = %header.event_id, "feishu event already handled (redelivery)");
        return 200;
    }
    if header.event_type != "im.message.receive_v1" {
        f.dedup.first_time(&header.event_id, now);
        super::metrics::event(&ingest.metrics, "ignored");
        tracing::debug!(event_id = %header.event_id, event_type = %header.event_type, "feishu event ignored");
        return 200;
    }
    let msg = match MessageReceived::from_event(&event) {
        Ok(m) => m,
        Err(e) => {
            super::metrics::event(&ingest.metrics, e.reason());
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
        super::metrics::event(&ingest.metrics, "message");
        let (f, n) = (f.clone(), ingest.clone());
        ingest.tasks.spawn(async move {
            let _ = process(&f, &n, msg).await;
        });
        return 200;
    }
    match process(f, &ingest, msg).await {
        Ok(()) => {
            f.dedup.first_time(&header.event_id, now);
            super::metrics::event(&ingest.metrics, "message");
            200
        }
        Err(()) => {
            super::metrics::event(&ingest.metrics, "record_failed");
            500
        }
    }
}

/// Records one received message. `Err` when the transcript refused it (already
/// logged); a message deliberately not recorded is `Ok`.
pub(super) async fn process(
    f: &Feishu,
    node: &AdapterContext,
    ev: MessageReceived,
) -> Result<(), ()> {
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
    let sender = if ev.sender.sender_type != "app" {
        // The per-app open_id and, when Feishu gives it, the per-developer union_id:
        // either may name an operator.
        let ids = &ev.sender.sender_id;
        let person: Vec<&str> = std::iter::once(ids.open_id.as_str())
            .chain(ids.union_id.as_deref())
            .filter(|id| !id.is_empty() && !id.contains(char::is_whitespace))
            .collect();
        Sender::Person {
            name: if sender_open_id.is_empty() {
                "feishu user".to_string()
            } else {
                crate::platform::person_name(matcher, FEISHU, &human_name)
            },
            ids: (!person.is_empty()).then(|| person.join(" ")),
        }
    } else {
        // A bot's message. A mesh colleague's authoritative copy comes over the bridge.
        Sender::Bot {
            colleague: f.bots_by_open_id.get(&sender_open_id).cloned(),
            label: format!("app:{sender_open_id}"),
        }
    };
    let mentions = match &sender {
        Sender::Person { .. } => f.platform_mentions(&msg.mentions, matcher),
        Sender::Bot { .. } => Vec::new(),
    };
    let message = PlatformMessage {
        group,
        platform_msg_id: msg.message_id.clone(),
        sent_at,
        text,
        sender,
        mentions,
    };
    match f.inbound.receive(node, message).await {
        Received::Failed => Err(()),
        _ => Ok(()),
    }
}
