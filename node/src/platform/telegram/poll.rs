//! The adapter's session on the kit's one reconnect loop ([`kit::reconnect`]): the
//! identity check, then the `getUpdates` long polls (or, in webhook mode, the
//! webhook's registration), each update handed to the adapter and its offset
//! confirmed only once it is recorded.
//!
//! Telegram keeps every update until a later `getUpdates` names an `offset` past it,
//! so nothing said while the node is down is lost. The offset sent is one past the
//! last update recorded: an update whose recording failed ends the session without
//! being confirmed and is asked for again after the loop's pause (unless a later
//! update of the same batch could be recorded: then it fails for itself, a group
//! past `[mesh] max_groups`, and is given up, logged, so that it holds up nothing);
//! one recorded but not yet confirmed when the node stops comes again after a restart
//! and is recorded once (its envelope id is derived from the chat and message ids, the same every
//! time). At shutdown a last `getUpdates` with `timeout = 0` ([`confirm`]) confirms
//! what was recorded.
//!
//! [`kit::reconnect`]: crate::platform::kit::reconnect

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::api::{ApiError, POLL_TIMEOUT_SECS};
use super::Telegram;
use crate::config::pacing::{Backoff, Jitter};
use crate::platform::kit::reconnect::Ended;
use crate::platform::AdapterContext;

/// Longest pause between failed sessions.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(60);

/// The pause before session attempt `attempt` (0 after a session that got going):
/// 1 s doubling to [`MAX_PAUSE`], less up to a fifth.
pub(crate) fn schedule(attempt: u32) -> Duration {
    Backoff::new(Duration::from_secs(1), MAX_PAUSE).delay(attempt + 1, Jitter::Scale(0.8..=1.0))
}

/// `call`'s result, or `None` when the node stops first (a call being retried must
/// not hold up a shutdown).
async fn or_stop<T>(cancel: &CancellationToken, call: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        _ = cancel.cancelled() => None,
        r = call => Some(r),
    }
}

/// One session: identity (until it was confirmed once), then polling until a poll
/// fails, an update cannot be recorded, or the node stops. `offset` is the next
/// update wanted, kept across sessions.
pub(super) async fn session(
    tg: &Arc<Telegram>,
    ingest: &AdapterContext,
    offset: &mut Option<i64>,
) -> Ended<String> {
    let cancel = &ingest.accepting;
    if !tg.identified() {
        let Some(me) = or_stop(cancel, tg.api.get_me()).await else {
            return Ended::Stopped;
        };
        match me {
            Ok(user) => {
                if let Err(why) = tg.identify(user) {
                    return Ended::Fatal(why);
                }
            }
            Err(ApiError::Unauthorized(code)) => {
                return Ended::Fatal(format!("telegram rejected the bot token (getMe answered {code}): set telegram.token_env to the bot's current token (from @BotFather)"));
            }
            Err(e) => {
                return Ended::Dropped {
                    why: format!("getMe: {e}"),
                    established: false,
                }
            }
        }
    }
    if let Some(url) = &tg.webhook_url {
        let secret = tg.secret_token.clone().unwrap_or_default();
        let Some(set) = or_stop(cancel, tg.api.set_webhook(url, &secret)).await else {
            return Ended::Stopped;
        };
        return match set {
            Ok(_) => {
                tracing::info!(bot = %tg.me, "telegram webhook set; updates arrive at {}", super::settings::WEBHOOK_PATH);
                // Nothing more to keep going: Telegram posts from now on.
                Ended::Stopped
            }
            Err(ApiError::Unauthorized(code)) => Ended::Fatal(format!("telegram rejected the bot token (setWebhook answered {code}): set telegram.token_env to the bot's current token")),
            Err(e) => Ended::Dropped {
                why: format!("setWebhook: {e}"),
                established: false,
            },
        };
    }
    let Some(info) = or_stop(cancel, tg.api.get_webhook_info()).await else {
        return Ended::Stopped;
    };
    match info {
        Ok(info) if !info.url.is_empty() => {
            tracing::info!(bot = %tg.me, pending = info.pending_update_count, "a telegram webhook is set, and polling cannot run beside it: deleting it (its pending updates are kept and polled)");
            match or_stop(cancel, tg.api.delete_webhook()).await {
                None => return Ended::Stopped,
                Some(Err(e)) => {
                    tracing::warn!(bot = %tg.me, error = %e, "could not delete the telegram webhook; polling will say why")
                }
                Some(Ok(_)) => {}
            }
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(bot = %tg.me, error = %e, "could not read the telegram webhook info (continuing)")
        }
    }
    let mut established = false;
    loop {
        let Some(got) = or_stop(cancel, tg.api.get_updates(*offset, POLL_TIMEOUT_SECS)).await
        else {
            return Ended::Stopped;
        };
        let updates = match got {
            Ok(u) => u,
            Err(ApiError::Unauthorized(code)) => {
                return Ended::Fatal(format!("telegram rejected the bot token (getUpdates answered {code}): set telegram.token_env to the bot's current token"));
            }
            Err(e) => {
                tg.polling.store(false, Ordering::Relaxed);
                if e.code() == Some(409) {
                    tracing::error!(bot = %tg.me, error = %e, "telegram says another program polls this bot (or a webhook is set): only one may");
                }
                return Ended::Dropped {
                    why: format!("getUpdates: {e}"),
                    established,
                };
            }
        };
        if !tg.polling.swap(true, Ordering::Relaxed) {
            tracing::info!(bot = %tg.me, "telegram long polling");
        }
        established = true;
        // Updates of this batch that could not be recorded, since the last that was.
        let mut failed: Vec<i64> = Vec::new();
        for raw in updates {
            let Some(id) = raw.get("update_id").and_then(|v| v.as_i64()) else {
                tracing::warn!(bot = %tg.me, "a telegram update without update_id; ignoring it");
                continue;
            };
            if offset.is_some_and(|o| id < o) {
                continue; // already confirmed: never twice
            }
            if !tg.on_update(ingest, raw).await {
                failed.push(id);
                continue;
            }
            if !failed.is_empty() {
                // A later update could be recorded, so these fail for themselves (a
                // group past [mesh] max_groups), not for the node: confirming them
                // is the only way past them.
                tracing::error!(bot = %tg.me, updates = ?failed, recorded = id, "telegram updates that could not be recorded, though a later one could, are given up so that they do not hold up the rest");
                failed.clear();
            }
            *offset = Some(id + 1);
            tg.last_update.store(id, Ordering::Relaxed);
        }
        if !failed.is_empty() {
            tg.polling.store(false, Ordering::Relaxed);
            return Ended::Dropped {
                why: format!("updates {failed:?} could not be recorded; they are not confirmed and are asked for again"),
                established: false,
            };
        }
    }
}

/// At shutdown: confirms every update recorded (`getUpdates` with the offset and
/// `timeout = 0`), so a restart does not fetch them again (it would record them
/// once anyway).
pub(super) async fn confirm(tg: &Telegram, offset: Option<i64>) {
    tg.polling.store(false, Ordering::Relaxed);
    let Some(o) = offset else { return };
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
