//! The `getUpdates` loop: long polls, each update handed to the adapter, and the
//! offset confirmed only once the update is recorded.
//!
//! Telegram keeps every update until a later `getUpdates` names an `offset` past it,
//! so nothing said while the node is down is lost. The offset this loop sends is one
//! past the last update recorded: an update whose recording failed is asked for again
//! (after a pause) rather than confirmed; one recorded but not yet confirmed when the
//! node stops comes again after a restart and is recorded once (its envelope id is
//! derived from the chat and message ids, the same every time). At shutdown a last
//! `getUpdates` with `timeout = 0` confirms what was recorded.
//!
//! Kept apart from the adapter so that the kit's one reconnect loop can take over
//! the pauses between failures ([`pause`]) when it comes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::api::{ApiError, POLL_TIMEOUT_SECS};
use super::Telegram;
use crate::config::pacing::{Backoff, Jitter};
use crate::ingress::ingest::Ingest;

/// Longest pause between failed polls.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(60);

/// Waits the backoff for failure number `failures` (from 1 s up to [`MAX_PAUSE`]);
/// false when the node stopped meanwhile.
pub(super) async fn pause(cancel: &CancellationToken, failures: u32) -> bool {
    let wait =
        Backoff::new(Duration::from_secs(1), MAX_PAUSE).delay(failures, Jitter::Scale(0.8..=1.0));
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}

/// Polls until the node stops (or the token is rejected).
pub(super) async fn run(tg: &Arc<Telegram>, ingest: &Ingest) {
    let cancel = ingest.accepting.clone();
    let mut offset: Option<i64> = None;
    let mut failures = 0u32;
    'polling: loop {
        let got = tokio::select! {
            _ = cancel.cancelled() => break,
            r = tg.api.get_updates(offset, POLL_TIMEOUT_SECS) => r,
        };
        let updates = match got {
            Ok(u) => u,
            Err(ApiError::Unauthorized(code)) => {
                tg.stop(&format!("telegram rejected the bot token (getUpdates answered {code}): set telegram.token_env to the bot's current token"));
                return;
            }
            Err(e) => {
                failures += 1;
                tg.polling.store(false, Ordering::Relaxed);
                if e.code() == Some(409) {
                    tracing::error!(bot = %tg.me, error = %e, "telegram says another program polls this bot (or a webhook is set): only one may; retrying");
                } else {
                    tracing::warn!(bot = %tg.me, error = %e, failures, "telegram getUpdates failed; retrying");
                }
                if !pause(&cancel, failures).await {
                    break;
                }
                continue;
            }
        };
        if !tg.polling.swap(true, Ordering::Relaxed) {
            tracing::info!(bot = %tg.me, "telegram long polling");
        }
        failures = 0;
        for raw in updates {
            let Some(id) = raw.get("update_id").and_then(|v| v.as_i64()) else {
                tracing::warn!(bot = %tg.me, "a telegram update without update_id; ignoring it");
                continue;
            };
            if offset.is_some_and(|o| id < o) {
                continue; // already confirmed: never twice
            }
            if !tg.on_update(ingest, raw).await {
                // Not recorded: ask for it again rather than confirm it.
                failures += 1;
                if !pause(&cancel, failures).await {
                    break 'polling;
                }
                continue 'polling;
            }
            offset = Some(id + 1);
            tg.last_update.store(id, Ordering::Relaxed);
        }
    }
    tg.polling.store(false, Ordering::Relaxed);
    if let Some(o) = offset {
        let confirm = tg.api.get_updates(Some(o), 0);
        match tokio::time::timeout(Duration::from_secs(3), confirm).await {
            Ok(Ok(_)) => {
                tracing::info!(bot = %tg.me, offset = o, "telegram updates confirmed up to the last one recorded")
            }
            _ => {
                tracing::info!(bot = %tg.me, offset = o, "could not confirm the last telegram updates; they come again at the next start and are recorded once")
            }
        }
    }
}
