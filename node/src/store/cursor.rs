//! `DeliveryCursor`: how far delivery to one peer got, and its copy on disk.
//!
//! An outbox marks each outbox-log sequence it delivered (or gave up on) as handled;
//! after a restart only the entries after the saved position are sent again. The copy
//! on disk may lag: a lagging cursor only means re-sends after a crash, which peers
//! answer with `duplicate`. So it is written at most every [`SAVE_EVERY`] while the
//! outbox is busy, once more when it falls quiet, and at shutdown. A peer new to the
//! node is the exception: its starting position is written at start, before anything
//! is accepted (a missing cursor means "new peer, start from now").
//!
//! Writes happen on tokio's blocking pool, never on an async worker: a write can block
//! for a millisecond when the disk is busy with transcript fsyncs, and a sender with
//! seven peers used to do seven of them per message on the workers that also answer
//! its API and deliver to its peers. At most one write per cursor is under way at a
//! time. A write replaces the number in place ([`overwrite`]), never through a
//! new file. The Redis reader's stream cursors (`ingress::stream`) are written the same
//! way.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// How often, at most, a busy outbox writes its cursor.
pub(crate) const SAVE_EVERY: Duration = Duration::from_millis(100);

/// A peer's delivery position, shared with the blocking-pool task that writes it.
pub(crate) struct DeliveryCursor {
    /// The peer, for log lines.
    peer: String,
    /// Where the position is kept across restarts (`None`: in memory only).
    path: Option<PathBuf>,
    /// The highest log sequence delivered to (or given up on for) this peer.
    handled: AtomicU64,
    /// One more than the position on disk (0: there is none, not even 0): a peer
    /// that never got anything still needs its cursor written, or the next start
    /// would take it for a new peer and skip what it is owed.
    on_disk_plus_one: AtomicU64,
    /// A write is queued or running on the blocking pool.
    writing: AtomicBool,
    /// Held for the whole write, so two writes never interleave.
    file: Mutex<()>,
    /// When the last write was started.
    started_at: Mutex<Instant>,
}

impl DeliveryCursor {
    /// A cursor for `peer` at position 0, kept in `path` when given.
    pub(crate) fn new(peer: &str, path: Option<PathBuf>) -> Arc<DeliveryCursor> {
        Arc::new(DeliveryCursor {
            peer: peer.to_string(),
            path,
            handled: AtomicU64::new(0),
            on_disk_plus_one: AtomicU64::new(0),
            writing: AtomicBool::new(false),
            file: Mutex::new(()),
            started_at: Mutex::new(
                Instant::now()
                    .checked_sub(SAVE_EVERY)
                    .unwrap_or_else(Instant::now),
            ),
        })
    }

    /// The position saved on disk by an earlier run, if any. A file that is there but
    /// does not hold a number counts as position 0 (everything still in the outbox
    /// log is sent again; peers deduplicate), never as "no cursor": that would make
    /// the peer new, starting from now, and it would miss what it is owed.
    pub(crate) fn read_saved(&self) -> Option<u64> {
        let path = self.path.as_ref()?;
        let seq = match std::fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => Err(e.to_string()),
            Ok(text) => std::str::from_utf8(&text)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .ok_or_else(|| "it does not hold a number".to_string()),
        };
        Some(seq.unwrap_or_else(|why| {
            tracing::warn!(peer = %self.peer, path = %path.display(), why, "unreadable outbox cursor: sending this peer everything still in the outbox log (it deduplicates)");
            0
        }))
    }

    /// Sets the position at start: the saved one (`on_disk`), or where a peer new to
    /// this node starts (then it is written soon).
    pub(crate) fn set(&self, seq: u64, on_disk: bool) {
        self.handled.store(seq, Ordering::SeqCst);
        self.on_disk_plus_one
            .store(if on_disk { seq + 1 } else { 0 }, Ordering::SeqCst);
    }

    /// The highest log sequence delivered to or given up on.
    pub(crate) fn handled(&self) -> u64 {
        self.handled.load(Ordering::SeqCst)
    }

    /// Whether the copy on disk is behind or missing (a quiet outbox should write it).
    pub(crate) fn behind(&self) -> bool {
        self.path.is_some() && self.on_disk_plus_one.load(Ordering::SeqCst) <= self.handled()
    }

    /// Marks `seq` handled; starts a write when the last one is [`SAVE_EVERY`] old.
    pub(crate) fn advance(self: &Arc<Self>, seq: u64) {
        self.handled.fetch_max(seq, Ordering::SeqCst);
        let due = self.started_at.lock().elapsed() >= SAVE_EVERY;
        if due {
            self.save_soon();
        }
    }

    /// Starts a write on the blocking pool unless one is under way or nothing changed
    /// (outside a tokio runtime: writes now).
    pub(crate) fn save_soon(self: &Arc<Self>) {
        if !self.behind() || self.writing.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.started_at.lock() = Instant::now();
        let me = self.clone();
        let write = move || {
            me.save_now();
            me.writing.store(false, Ordering::SeqCst);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(write)),
            Err(_) => write(),
        }
    }

    /// Writes the current position now, after any write under way (at shutdown).
    pub(crate) fn save_now(&self) {
        let Some(path) = &self.path else { return };
        let _file = self.file.lock();
        if !self.behind() {
            return;
        }
        let seq = self.handled();
        match overwrite(path, record(seq).as_bytes()) {
            Ok(()) => {
                self.on_disk_plus_one.fetch_max(seq + 1, Ordering::SeqCst);
            }
            Err(e) => {
                tracing::warn!(peer = %self.peer, error = %e, "could not save the outbox cursor (a restart may re-send; peers deduplicate)");
            }
        }
    }
}

/// How a position is written: always 21 bytes long (20 digits hold any `u64`, then a
/// newline), so each write covers the last one exactly, within the file's first sector.
fn record(seq: u64) -> String {
    format!("{seq:020}\n")
}

/// Writes `record` over the start of the file at `path` (made if missing) and cuts
/// whatever followed it. No new file per write: a sender writes each peer's cursor up
/// to ten times a second, and a create and rename per write made the file system
/// allocate and free an inode each time — with 127 peers, a third of a busy sender's
/// CPU (docs/scaling.md, "Issue 40"). A [`record`] of 21 bytes at offset 0 stays inside
/// one sector, so a crash leaves the old number or the new one; a file that holds
/// something else is read as position 0 ([`DeliveryCursor::read_saved`]). A caller
/// whose records differ in length only makes them longer or cuts them here.
pub(crate) fn overwrite(path: &Path, record: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    file.write_all_at(record, 0)?;
    // A file left longer (by an older, longer record or by anything else) ends with
    // the record.
    if file.metadata()?.len() > record.len() as u64 {
        file.set_len(record.len() as u64)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// The length of every [`record`].
    const RECORD_BYTES: u64 = 21;

    #[test]
    fn a_write_replaces_the_number_in_place_without_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("B.cursor");
        let c = DeliveryCursor::new("B", Some(path.clone()));
        c.save_now();
        let inode = std::fs::metadata(&path).unwrap().ino();
        for seq in [9, 10, 12_345, 9_999_999_999_999_999_999, 7] {
            c.handled.store(seq, Ordering::SeqCst);
            c.on_disk_plus_one.store(0, Ordering::SeqCst);
            c.save_now();
            assert_eq!(c.read_saved(), Some(seq));
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!((meta.ino(), meta.len()), (inode, RECORD_BYTES), "{seq}");
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["B.cursor"], "no temporary file");
    }

    #[test]
    fn an_older_cursor_is_read_and_one_without_a_number_counts_as_zero_not_as_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("B.cursor");
        let c = DeliveryCursor::new("B", Some(path.clone()));
        assert_eq!(c.read_saved(), None, "no file: a new peer");
        // As earlier versions wrote it (through a temporary file and a rename).
        std::fs::write(&path, "17").unwrap();
        assert_eq!(c.read_saved(), Some(17));
        c.handled.store(18, Ordering::SeqCst);
        c.save_now();
        assert_eq!(c.read_saved(), Some(18));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), RECORD_BYTES);
        // Cut short by a crash, or damaged: everything in the outbox log goes again.
        for junk in [&b""[..], b"00000000", b"x7\n", b"\xff\xfe", b"-3"] {
            std::fs::write(&path, junk).unwrap();
            assert_eq!(c.read_saved(), Some(0), "{junk:?}");
        }
        // Longer than a record (not written by botmesh): cut to the record on write.
        std::fs::write(&path, "1".repeat(100)).unwrap();
        c.on_disk_plus_one.store(0, Ordering::SeqCst);
        c.save_now();
        assert_eq!(c.read_saved(), Some(18));
    }

    #[test]
    fn outside_a_runtime_a_due_advance_writes_at_once_and_a_later_one_waits() {
        let dir = tempfile::tempdir().unwrap();
        let c = DeliveryCursor::new("B", Some(dir.path().join("B.cursor")));
        assert_eq!(c.read_saved(), None);
        assert!(c.behind(), "not on disk yet, not even as 0");
        c.save_now();
        assert_eq!((c.read_saved(), c.behind()), (Some(0), false));
        *c.started_at.lock() -= SAVE_EVERY;
        c.advance(3);
        assert_eq!(c.read_saved(), Some(3));
        assert!(!c.behind());
        c.advance(5);
        assert_eq!(
            c.read_saved(),
            Some(3),
            "within SAVE_EVERY of the last write"
        );
        assert!(c.behind());
        c.save_now();
        assert_eq!((c.read_saved(), c.behind()), (Some(5), false));
        c.advance(4);
        assert_eq!(c.handled(), 5, "the position never goes back");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inside_a_runtime_writes_happen_on_the_blocking_pool_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let c = DeliveryCursor::new("B", Some(dir.path().join("B.cursor")));
        // Many advances racing with many save requests: every write finishes whole,
        // and once the last one is done the file holds the final position.
        let tasks: Vec<_> = (0..4u64)
            .map(|t| {
                let c = c.clone();
                tokio::spawn(async move {
                    for i in 0..250u64 {
                        c.advance(t * 1000 + i + 1);
                        c.save_soon();
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while c.behind() && std::time::Instant::now() < deadline {
            c.save_soon();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(c.handled(), 3250);
        assert_eq!(c.read_saved(), Some(3250));
        assert!(
            !dir.path().join("B.tmp").exists(),
            "no temp file left behind"
        );
    }

    #[test]
    fn a_position_read_from_disk_is_not_written_again_and_a_new_peer_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let c = DeliveryCursor::new("B", Some(dir.path().join("B.cursor")));
        c.set(9, true);
        assert!(!c.behind());
        c.save_now();
        assert_eq!(c.read_saved(), None, "nothing changed, nothing written");
        let n = DeliveryCursor::new("C", Some(dir.path().join("C.cursor")));
        n.set(9, false);
        assert!(n.behind(), "a peer new to this node has no cursor yet");
        n.save_now();
        assert_eq!(n.read_saved(), Some(9));
    }

    #[test]
    fn without_a_path_nothing_is_written_and_nothing_is_behind() {
        let c = DeliveryCursor::new("B", None);
        c.advance(7);
        c.save_now();
        assert_eq!((c.handled(), c.behind(), c.read_saved()), (7, false, None));
    }
}
