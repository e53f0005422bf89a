//! The adapter's session on the kit's one reconnect loop ([`crate::platform::kit::reconnect`]): the
//! start-up checks, then the `/sync` long polls, each batch's room events handed to
//! the adapter and its `next_batch` saved only once they are recorded.
//!
//! Start-up (until it succeeded once): `whoami` names `matrix.user_id`; the bot is in
//! its room (`joined_rooms`, else `join`: it must be invited); the room is not
//! encrypted; a filter keeps `/sync` to the room's timeline and state (members lazily
//! loaded) and drops presence, account data and ephemeral events.
//!
//! The `since` token lives in the node's data folder ([`super::SINCE_FILE`]), written
//! after every event of its batch is recorded (a temporary file renamed over it): a
//! restart resumes there, and a message is neither lost nor recorded twice (one
//! recorded but whose batch's token was not yet saved comes again and is recorded
//! once: its envelope id is derived from its event id). A batch with an event that
//! could not be recorded is not confirmed: the session ends and asks for it again
//! after the loop's pause. The very first start has no token: the room's earlier
//! history is skipped (logged), not answered. A `limited` timeline (more happened
//! than the filter's limit while the node was away) is logged with how to see it.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::api::{ApiError, SYNC_TIMEOUT};
use super::inbound::RoomEvent;
use super::Matrix;
use crate::config::pacing::{Backoff, Jitter};
use crate::platform::kit::reconnect::Ended;
use crate::platform::AdapterContext;

/// Longest pause between failed sessions.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(60);

/// Events of the room's timeline one `/sync` returns at most.
pub(crate) const TIMELINE_LIMIT: u32 = 50;

/// Pages of [`TIMELINE_LIMIT`] events read to fill one gap at most.
pub(crate) const GAP_PAGES: usize = 20;

/// The pause before session attempt `attempt` (0 after a session that got going):
/// 1 s doubling to [`MAX_PAUSE`], less up to a fifth.
pub(crate) fn schedule(attempt: u32) -> Duration {
    Backoff::new(Duration::from_secs(1), MAX_PAUSE).delay(attempt + 1, Jitter::Scale(0.8..=1.0))
}

/// What the sessions keep between them.
#[derive(Debug)]
pub(crate) struct SyncState {
    /// Where `since` is saved.
    path: PathBuf,
    /// The last `next_batch` whose events are all recorded.
    since: Option<String>,
    /// The filter's id, once created (the start-up checks passed).
    filter: Option<String>,
}

impl SyncState {
    /// The state saved at `path` (none on a first start, or an unreadable file,
    /// logged).
    pub(crate) fn load(path: &Path) -> SyncState {
        let since = match std::fs::read_to_string(path) {
            Ok(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the saved matrix sync token; starting without it (earlier history is skipped)");
                None
            }
        };
        SyncState {
            path: path.to_path_buf(),
            since,
            filter: None,
        }
    }

    /// Saves `next_batch` as the token to resume from; a failure is logged (the next
    /// batch tries again; a restart meanwhile would fetch some events again and
    /// record them once).
    fn save(&mut self, next_batch: &str) {
        let tmp = self.path.with_extension("tmp");
        let written = self
            .path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, next_batch))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            tracing::error!(path = %self.path.display(), error = %e, "cannot save the matrix sync token");
        }
        self.since = Some(next_batch.to_string());
    }
}

/// `call`'s result, or `None` when the node stops first (a long poll or a call being
/// retried must not hold up a shutdown).
async fn or_stop<T>(cancel: &CancellationToken, call: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        _ = cancel.cancelled() => None,
        r = call => Some(r),
    }
}

/// The reason a rejected token stops the adapter, naming the call.
fn rejected(what: &str, e: &ApiError) -> String {
    format!("matrix rejected the access token ({what}: {e}); set matrix.access_token_env to a current token of the bot user (docs/matrix.md)")
}

/// The reason an encrypted room stops the adapter.
pub(crate) const ENCRYPTED: &str = "the matrix room is end-to-end encrypted; botmesh supports unencrypted rooms only: use an unencrypted room (docs/matrix.md)";

/// How a failed call ends the session: a rejected token for good, anything else as
/// a drop.
fn ended(what: &str, e: ApiError, established: bool) -> Ended<String> {
    match e {
        ApiError::Unauthorized { .. } => Ended::Fatal(rejected(what, &e)),
        e => Ended::Dropped {
            why: format!("{what}: {e}"),
            established,
        },
    }
}

/// The start-up checks (module docs); `Err` is how the session ends.
async fn prepare(mx: &Matrix, cancel: &CancellationToken) -> Result<String, Ended<String>> {
    let Some(me) = or_stop(cancel, mx.api.whoami()).await else {
        return Err(Ended::Stopped);
    };
    let me = me.map_err(|e| ended("whoami", e, false))?;
    if me.user_id != mx.user_id {
        return Err(Ended::Fatal(format!(
            "matrix.user_id is {} but the access token belongs to {} (whoami): fix matrix.user_id or matrix.access_token_env",
            mx.user_id, me.user_id
        )));
    }
    tracing::info!(bot = %mx.me, user_id = %me.user_id, device_id = ?me.device_id, "matrix identity confirmed");
    let Some(joined) = or_stop(cancel, mx.api.joined_rooms()).await else {
        return Err(Ended::Stopped);
    };
    if !joined
        .map_err(|e| ended("joined_rooms", e, false))?
        .contains(&mx.room_id)
    {
        tracing::info!(bot = %mx.me, room_id = %mx.room_id, "joining the matrix room");
        match or_stop(cancel, mx.api.join(&mx.room_id)).await {
            None => return Err(Ended::Stopped),
            Some(Ok(())) => {}
            Some(Err(
                e @ ApiError::Refused {
                    status: 403 | 404, ..
                },
            )) => {
                return Err(Ended::Fatal(format!(
                    "the bot cannot join matrix room {} ({e}): invite {} to it (docs/matrix.md)",
                    mx.room_id, mx.user_id
                )));
            }
            Some(Err(e)) => return Err(ended("join", e, false)),
        }
    }
    match or_stop(cancel, mx.api.is_encrypted(&mx.room_id)).await {
        None => return Err(Ended::Stopped),
        Some(Ok(true)) => return Err(Ended::Fatal(ENCRYPTED.to_string())),
        Some(Ok(false)) => {}
        Some(Err(e)) => return Err(ended("room state", e, false)),
    }
    let filter = json!({
        "room": {
            "rooms": [mx.room_id],
            "timeline": {"limit": TIMELINE_LIMIT},
            "state": {"lazy_load_members": true},
            "ephemeral": {"not_types": ["*"]},
            "account_data": {"not_types": ["*"]},
        },
        "presence": {"not_types": ["*"]},
        "account_data": {"not_types": ["*"]},
    });
    match or_stop(cancel, mx.api.create_filter(&mx.user_id, &filter)).await {
        None => Err(Ended::Stopped),
        Some(r) => r.map_err(|e| ended("filter", e, false)),
    }
}

/// One session: the start-up checks (until they passed once), then `/sync` until a
/// poll fails, an event cannot be recorded, or the node stops.
pub(super) async fn session(
    mx: &Arc<Matrix>,
    ingest: &AdapterContext,
    state: &mut SyncState,
) -> Ended<String> {
    let cancel = &ingest.accepting;
    let filter = match state.filter.clone() {
        Some(f) => f,
        None => match prepare(mx, cancel).await {
            Ok(f) => {
                state.filter = Some(f.clone());
                f
            }
            Err(ended) => return ended,
        },
    };
    let mut established = false;
    loop {
        let first = state.since.is_none();
        let timeout = if first { Duration::ZERO } else { SYNC_TIMEOUT };
        let Some(got) = or_stop(
            cancel,
            mx.api.sync(state.since.as_deref(), &filter, timeout),
        )
        .await
        else {
            return Ended::Stopped;
        };
        let batch = match got {
            Ok(b) => b,
            Err(e) => {
                mx.syncing.store(false, Ordering::Relaxed);
                return ended("sync", e, established);
            }
        };
        let Some(next) = batch["next_batch"].as_str().map(str::to_string) else {
            mx.syncing.store(false, Ordering::Relaxed);
            return Ended::Dropped {
                why: "a sync answer without next_batch".into(),
                established,
            };
        };
        if !mx.syncing.swap(true, Ordering::Relaxed) {
            tracing::info!(bot = %mx.me, room_id = %mx.room_id, "matrix syncing");
        }
        established = true;
        match handle(mx, ingest, &batch, state.since.as_deref()).await {
            Handled::Recorded => state.save(&next),
            Handled::Fatal(why) => return Ended::Fatal(why),
            Handled::Failed => {
                mx.syncing.store(false, Ordering::Relaxed);
                return Ended::Dropped {
                    why: "a message could not be recorded; its batch is not confirmed and is asked for again".into(),
                    established: false,
                };
            }
        }
    }
}

/// What became of one batch.
#[derive(Debug, PartialEq, Eq)]
enum Handled {
    /// Every event is recorded (or needed no record): its token may be saved.
    Recorded,
    /// An event could not be recorded: the token is not saved.
    Failed,
    /// The room became unusable (encrypted, the bot removed).
    Fatal(String),
}

/// Hands one batch's events of the bot's room to the adapter, after those of a gap
/// before them; on the first sync (no token yet, `since` is `None`) only state is
/// read, the earlier messages skipped.
async fn handle(
    mx: &Arc<Matrix>,
    ingest: &AdapterContext,
    batch: &Value,
    since: Option<&str>,
) -> Handled {
    let rooms = &batch["rooms"];
    if let Some(left) = rooms["leave"].get(&mx.room_id) {
        let how = left["timeline"]["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["type"] == "m.room.member" && e["state_key"] == mx.user_id.as_str())
            .filter_map(|e| e["content"]["membership"].as_str())
            .next_back()
            .unwrap_or("leave");
        return Handled::Fatal(format!(
            "the bot is no longer in matrix room {} (membership: {how}): invite it again and restart the node",
            mx.room_id
        ));
    }
    if rooms["invite"].get(&mx.room_id).is_some() {
        tracing::info!(bot = %mx.me, room_id = %mx.room_id, "invited to the matrix room again: joining");
        if let Err(e) = mx.api.join(&mx.room_id).await {
            tracing::error!(bot = %mx.me, error = %e, "could not join the matrix room");
        }
    }
    let Some(room) = rooms["join"].get(&mx.room_id) else {
        return Handled::Recorded;
    };
    let events = |part: &str| -> Vec<RoomEvent> {
        room[part]["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| serde_json::from_value(e.clone()).ok())
            .collect()
    };
    for e in events("state") {
        match e.kind.as_str() {
            "m.room.member" => mx.on_member(&e),
            "m.room.encryption" => return Handled::Fatal(ENCRYPTED.to_string()),
            _ => {}
        }
    }
    let timeline = events("timeline");
    let Some(since) = since else {
        let skipped = timeline
            .iter()
            .filter(|e| e.kind == "m.room.message")
            .count();
        for e in timeline.iter().filter(|e| e.kind == "m.room.member") {
            mx.on_member(e);
        }
        tracing::info!(bot = %mx.me, room_id = %mx.room_id, skipped, "first matrix sync of this node: the room's earlier messages are not recorded (only what is said from now on)");
        return Handled::Recorded;
    };
    let mut events = Vec::new();
    let prev = room["timeline"]["prev_batch"].as_str();
    if let (Some(true), Some(prev)) = (room["timeline"]["limited"].as_bool(), prev) {
        events = gap(mx, since, prev).await;
    }
    events.extend(timeline);
    record(mx, ingest, events).await
}

/// The room's events between `since` (the last batch recorded) and `prev` (the start
/// of a `limited` timeline: more happened than one sync returns), read with
/// `/messages`, oldest first; at most [`GAP_PAGES`] pages, and what cannot be read
/// is logged as skipped.
async fn gap(mx: &Matrix, since: &str, prev: &str) -> Vec<RoomEvent> {
    let mut events = Vec::new();
    let mut from = since.to_string();
    for _ in 0..GAP_PAGES {
        match mx
            .api
            .messages(&mx.room_id, &from, prev, TIMELINE_LIMIT)
            .await
        {
            Ok((chunk, end)) => {
                let done =
                    chunk.is_empty() || end.as_deref().is_none_or(|e| e == prev || e == from);
                events.extend(
                    chunk
                        .into_iter()
                        .filter_map(|e| serde_json::from_value(e).ok()),
                );
                match end {
                    Some(end) if !done => from = end,
                    _ => {
                        tracing::info!(bot = %mx.me, room_id = %mx.room_id, events = events.len(), "a gap in the matrix timeline, read with /messages");
                        return events;
                    }
                }
            }
            Err(e) => {
                tracing::error!(bot = %mx.me, room_id = %mx.room_id, error = %e, read = events.len(), "cannot read a gap in the matrix timeline; the messages in it are skipped (read them in a Matrix client)");
                return events;
            }
        }
    }
    tracing::warn!(bot = %mx.me, room_id = %mx.room_id, read = events.len(), "a gap in the matrix timeline longer than botmesh reads: older messages in it are skipped");
    events
}

/// Hands `events` (oldest first) to the adapter.
async fn record(mx: &Arc<Matrix>, ingest: &AdapterContext, events: Vec<RoomEvent>) -> Handled {
    for e in events {
        match e.kind.as_str() {
            "m.room.member" => mx.on_member(&e),
            "m.room.encryption" => return Handled::Fatal(ENCRYPTED.to_string()),
            "m.room.encrypted" => {
                let n = mx.encrypted_events.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(bot = %mx.me, event_id = %e.event_id, sender = %e.sender, count = n, "an encrypted matrix event cannot be read here; not recorded");
            }
            "m.room.message" => {
                if !mx.on_message(ingest, e).await {
                    return Handled::Failed;
                }
            }
            other => tracing::trace!(bot = %mx.me, kind = other, "matrix event not recorded"),
        }
    }
    Handled::Recorded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_saved_and_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node").join(super::super::SINCE_FILE);
        let mut s = SyncState::load(&path);
        assert_eq!(s.since, None, "a first start has none");
        s.save("s72_594");
        assert_eq!(SyncState::load(&path).since.as_deref(), Some("s72_594"));
        assert!(!path.with_extension("tmp").exists());
    }
}
