//! Webhook mode: Telegram posts each `Update` to [`super::settings::WEBHOOK_PATH`] on
//! the bridge listener with the secret given to `setWebhook` in
//! `X-Telegram-Bot-Api-Secret-Token`. A request without the right secret is refused
//! (401, logged, nothing read); an update is answered 200 once recorded, and 500
//! when it could not be, so Telegram delivers it again (a second delivery of a
//! recorded update is recorded once). An update refused for good (its chat would be a
//! group past `max_groups`) is answered 200 and logged once: a 500 would have Telegram
//! deliver it forever.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::Telegram;
use crate::ingress::server::{self, Body};

/// The header Telegram puts the webhook's secret token in.
pub(crate) const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";
/// Largest update accepted (Telegram's are a few KiB; a long text with entities far
/// under this).
pub(crate) const MAX_UPDATE_BYTES: usize = 1 << 20;

/// Answers one delivery.
pub(super) async fn answer(
    tg: Arc<Telegram>,
    req: Request<Incoming>,
    remote: std::net::SocketAddr,
) -> Response<Body> {
    let Some(ingest) = tg.ingest.get().cloned() else {
        return server::error(StatusCode::SERVICE_UNAVAILABLE, "not started");
    };
    let want = tg.secret_token.as_deref().unwrap_or_default();
    let given = req
        .headers()
        .get(SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if want.is_empty() || !crate::wire::signing::constant_time_eq(given, want.as_bytes()) {
        ingest
            .metrics
            .http_refused("bridge", "telegram_secret_token");
        if crate::telemetry::refusals::REFUSALS.admit("telegram webhook", "bad_secret_token") {
            tracing::warn!(%remote, bot = %tg.me, "a telegram webhook request without the right secret token; refused");
        }
        return server::error(
            StatusCode::UNAUTHORIZED,
            "wrong or missing X-Telegram-Bot-Api-Secret-Token",
        );
    }
    let body = match server::read_body(req, MAX_UPDATE_BYTES).await {
        Ok((_, b)) => b,
        Err(e) => {
            ingest
                .metrics
                .http_refused("bridge", "telegram_unreadable_body");
            if crate::telemetry::refusals::REFUSALS.admit("telegram webhook", "unreadable_body") {
                tracing::warn!(%remote, error = %e, "a telegram webhook body could not be read");
            }
            return server::error(StatusCode::BAD_REQUEST, "unreadable body");
        }
    };
    let Ok(raw) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return server::error(StatusCode::BAD_REQUEST, "not a JSON update");
    };
    if tg.on_update(&ingest, raw).await {
        server::json(StatusCode::OK, &serde_json::json!({"ok": true}))
    } else {
        server::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "not recorded; deliver it again",
        )
    }
}
