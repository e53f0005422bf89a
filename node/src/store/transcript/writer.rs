//! The transcript writer: one thread that takes the appends of every group off a
//! queue and writes them as group commits (one write per run of lines, one
//! `fdatasync` per touched file), hands the node's own messages to the peers while the
//! sync runs, and answers each append once its commit is on disk. [`AppendFile`] is a
//! file it appends to, with zeroed space kept ahead so a commit's sync writes data alone.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::commit_delay::{CommitDelay, DELAY_TARGET, DELAY_WAIT};
use super::queue::WriteQueue;
use crate::store::file_names::stored_path;
use crate::store::outbox_log::{outbox_line, Fanout, LoggedOutbound};
use crate::wire::envelope::Envelope;

/// One append on its way to the writer thread.
pub(super) struct WriteJob {
    /// The message (its group names the file): shared, not a copy of the name.
    pub(super) env: Arc<Envelope>,
    /// The line, without its `\n`.
    pub(super) line: Bytes,
    /// Also goes to every peer: written to the outbox log and handed to the [`Fanout`].
    pub(super) outbound: Option<(String, Bytes)>,
    /// Told the outcome once the job's commit is synced (or refused).
    pub(super) done: oneshot::Sender<std::io::Result<()>>,
}

/// The writer thread's state: open files, the outbox log and its sequence. Built by
/// [`super::Transcripts::open`], then owned by the thread ([`Writer::run`]).
pub(super) struct Writer {
    /// `<data_dir>/transcripts`, where each group's file is.
    pub(super) dir: PathBuf,
    /// Whether commits are synced (`false` only where durability is not wanted: tests).
    pub(super) fsync: bool,
    /// The transcript files open now, by group: at most `max_open` (see [`Writer::file`]).
    pub(super) files: HashMap<String, AppendFile>,
    /// How many transcript files may be open at once (`max_open_transcripts`).
    pub(super) max_open: usize,
    /// Counts appends: each open file's `used` is the count at its last append, and the
    /// least recently used one is closed first.
    pub(super) clock: u64,
    /// `files.len()`, for [`super::Transcripts::open_files`].
    pub(super) open_files: Arc<AtomicUsize>,
    /// The outbox log: the node's own messages, until every peer has them.
    pub(super) log: AppendFile,
    /// Whether the log may hold entries (so compaction is worth checking).
    pub(super) log_entries: bool,
    /// The sequence number the next outbound message gets in the outbox log.
    pub(super) next_seq: u64,
    /// The peers' outboxes: handed each outbound message once it is written.
    pub(super) fanout: Arc<dyn Fanout>,
    /// The last write error, shared with `/healthz` (cleared by a commit that succeeds).
    pub(super) last_error: Arc<Mutex<Option<String>>>,
    /// The bytes of the next append (lines and their `\n`s), kept between commits so
    /// that appending allocates nothing.
    pub(super) buf: Vec<u8>,
}

/// The most zeroed space a transcript file keeps ahead of its last line (see
/// [`AppendFile`]). Small, because zeroing is written data too and blocks the writer
/// thread while it is synced: 64 KiB take about 0.2 ms on the bench machine, 1 MiB
/// about 1 ms alone, and every node of a mesh receives the same messages, so they all
/// zero at the same moment (one 8-node run with 256 KiB had a paced p99 of 47 ms;
/// docs/benchmarks.md).
pub(super) const PREALLOCATE_BYTES: u64 = 64 << 10;
/// The zeroed space a file gets first: a group that speaks once costs this, not
/// [`PREALLOCATE_BYTES`]. Each time a file uses its space up it gets twice as much,
/// up to [`PREALLOCATE_BYTES`]: the space grows with the group's activity.
pub(super) const PREALLOCATE_FIRST: u64 = 4 << 10;

/// Zeros to preallocate from (a static, so zeroing allocates nothing).
static ZEROS: [u8; PREALLOCATE_BYTES as usize] = [0; PREALLOCATE_BYTES as usize];

/// An append-only file that knows its length, so a failed append can be cut back
/// without asking the file system for the length before every write.
///
/// A transcript file keeps some zeros ([`AppendFile::preallocate`]), written and synced
/// ahead of time, after its last line: appends then overwrite blocks that are already
/// allocated and inside the file's size, so the `fdatasync` of each group commit
/// writes the data alone. Appending past the end also changes the file's size, which
/// costs one more synchronous write (the inode) before the flush: measured on the
/// bench machine's ext4, 3 device writes per append + sync instead of 2, and a
/// quarter more time. Lines never contain a NUL byte (JSON escapes it), so the first
/// NUL marks the end of the lines; the zeros are cut off when the writer stops, and
/// after a crash the next start cuts them (see [`super::read_whole_lines`]).
pub(super) struct AppendFile {
    file: File,
    /// Bytes of whole, acknowledged-or-pending lines: where the next append starts.
    len: u64,
    /// The file's size: `len` plus the zeroed space after it.
    size: u64,
    /// Whether to keep zeroed space ahead (transcripts, not the outbox log, which
    /// is emptied whenever every peer has everything in it).
    preallocate: bool,
    /// Don't try to preallocate again before `len` reaches this (it failed: disk full).
    retry_preallocate_at: u64,
    /// The zeroed space given last time (0: none yet); the next is twice as much (see
    /// [`PREALLOCATE_FIRST`]). More is given once less than a quarter of it is left.
    chunk: u64,
    /// [`Writer::clock`] at this file's last append (the open-file LRU).
    used: u64,
    /// A cut back failed, so bytes past `len` may remain: nothing is appended until
    /// the file is cut back to `len` (a partial line must never be followed by more).
    dirty: bool,
}

impl AppendFile {
    pub(super) fn open(path: &Path, preallocate: bool) -> std::io::Result<AppendFile> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        let len = file.metadata()?.len();
        Ok(AppendFile {
            file,
            len,
            size: len,
            preallocate,
            retry_preallocate_at: 0,
            chunk: 0,
            used: 0,
            dirty: false,
        })
    }

    /// Keeps zeroed, synced space ahead of `len` once less than a quarter of the last
    /// amount given is left: [`PREALLOCATE_FIRST`] the first time, twice the last
    /// amount after, at most [`PREALLOCATE_BYTES`]. Run after a group commit, so the
    /// commit itself never waits for it. A failure (a full disk) only means plain appends.
    fn preallocate(&mut self) {
        if !self.preallocate
            || self.dirty
            || (self.chunk > 0 && self.size.saturating_sub(self.len) >= self.chunk / 4)
            || self.len < self.retry_preallocate_at
        {
            return;
        }
        let chunk = if self.chunk == 0 {
            PREALLOCATE_FIRST
        } else {
            (self.chunk * 2).min(PREALLOCATE_BYTES)
        };
        let from = self.size.max(self.len);
        let to = self.len + chunk;
        let written = self
            .file
            .write_all_at(&ZEROS[..(to - from) as usize], from)
            .and_then(|()| self.file.sync_data());
        match written {
            Ok(()) => {
                self.size = to;
                self.chunk = chunk;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not preallocate transcript space; appending plainly");
                self.retry_preallocate_at = self.len + chunk;
                // Drop whatever part of the zeros was written (never a line).
                self.size = self.len;
                if let Err(e) = self.file.set_len(self.len) {
                    self.dirty = true;
                    tracing::error!(error = %e, kept_bytes = self.len, "could not cut failed preallocation back; will retry before the next append");
                }
            }
        }
    }

    /// Gives the zeroed space back and any bytes of a failed write, so the file ends
    /// with its last line: true when it does, and the file may be closed (opened
    /// again, its length is where the next line goes).
    fn release(&mut self) -> bool {
        if self.dirty || self.size > self.len {
            match self.file.set_len(self.len) {
                Ok(()) => {
                    self.size = self.len;
                    self.dirty = false;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not cut a transcript file back to its last line; keeping it open");
                    return false;
                }
            }
        }
        true
    }

    /// Gives the zeroed space back (the file then ends with its last line).
    fn trim(&mut self) {
        if self.size > self.len && !self.dirty {
            match self.file.set_len(self.len) {
                Ok(()) => self.size = self.len,
                Err(e) => {
                    tracing::warn!(error = %e, "could not trim preallocated transcript space (the next start will)")
                }
            }
        }
    }

    /// Appends `bytes`; on failure cuts the file back so no partial line remains.
    fn append_clean(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.dirty {
            self.file.set_len(self.len)?;
            self.size = self.len;
            self.dirty = false;
            tracing::info!(
                kept_bytes = self.len,
                "partial write cut back; appending again"
            );
        }
        if let Err(e) = self.file.write_all_at(bytes, self.len) {
            let len = self.len;
            self.cut_back(len);
            return Err(e);
        }
        self.len += bytes.len() as u64;
        self.size = self.size.max(self.len);
        Ok(())
    }

    /// Forgets everything after `len` (written but not to be acknowledged), and the
    /// zeroed space with it.
    fn cut_back(&mut self, len: u64) {
        self.len = len;
        self.size = len;
        if let Err(e) = self.file.set_len(len) {
            self.dirty = true;
            tracing::error!(error = %e, kept_bytes = len, "could not cut a failed write back; will retry before the next append");
        }
    }

    fn truncate(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.len = 0;
        self.size = 0;
        self.dirty = false;
        Ok(())
    }
}

impl Writer {
    /// `group`'s file, opened if it is not. Opening one more than `max_open` closes
    /// the least recently written file first, except those in `busy` (written in the
    /// commit under way, still to be synced: [`Writer::run`] keeps a commit's groups
    /// below `max_open`) and any that cannot be cut back to its last line.
    fn file(
        &mut self,
        group: &str,
        busy: &HashMap<String, u64>,
    ) -> std::io::Result<&mut AppendFile> {
        self.clock += 1;
        if !self.files.contains_key(group) {
            self.make_room(busy);
            let path = stored_path(&self.dir, group, "jsonl");
            // Preallocation only pays where every commit is synced.
            let f = AppendFile::open(&path, self.fsync)?;
            self.files.insert(group.to_string(), f);
            self.open_files.store(self.files.len(), Ordering::Relaxed);
        }
        let f = self.files.get_mut(group).expect("inserted");
        f.used = self.clock;
        Ok(f)
    }

    /// Closes files, least recently written first, until one more may be opened.
    fn make_room(&mut self, busy: &HashMap<String, u64>) {
        while self.files.len() >= self.max_open {
            let mut idle: Vec<(u64, String)> = self
                .files
                .iter()
                .filter(|(g, _)| !busy.contains_key(*g))
                .map(|(g, f)| (f.used, g.clone()))
                .collect();
            idle.sort_unstable();
            let closed = idle
                .into_iter()
                .find(|(_, g)| self.files.get_mut(g).is_some_and(|f| f.release()));
            let Some((_, g)) = closed else {
                tracing::warn!(
                    open = self.files.len(),
                    max_open_transcripts = self.max_open,
                    "no transcript file can be closed now; opening one more"
                );
                return;
            };
            self.files.remove(&g);
            tracing::debug!(group = %g, "transcript file closed (least recently written)");
        }
        self.open_files.store(self.files.len(), Ordering::Relaxed);
    }

    /// Takes group commits off the queue until it closes. A commit takes what is
    /// queued, up to 1024 jobs and `max_open` groups (so none of its files has to be
    /// closed before its sync); the rest waits for the next commit, with whatever
    /// was queued meanwhile. After a busy commit the next may first wait a little for
    /// more ([`CommitDelay`]). When the thread ends (by panic too), what is still
    /// queued is dropped, so no appender waits for it.
    pub(super) fn run(mut self, queue: &WriteQueue) {
        /// Abandons the queue when the writer's loop ends, however it ends.
        struct Abandon<'a>(&'a WriteQueue);
        impl Drop for Abandon<'_> {
            fn drop(&mut self) {
                self.0.abandon();
            }
        }
        let _abandon = Abandon(queue);
        let mut pending: VecDeque<WriteJob> = VecDeque::new();
        let mut delay = CommitDelay::default();
        let mut last = 0;
        loop {
            let idle = pending.is_empty();
            let open = if idle && delay.wait_next(last) {
                let (open, how) =
                    queue.gather(&mut pending, DELAY_TARGET, Instant::now() + DELAY_WAIT);
                delay.waited(how);
                open
            } else {
                queue.take(&mut pending, idle)
            };
            if !open && pending.is_empty() {
                break;
            }
            // The batch's groups (a message each, for its group's name: no copies;
            // a batch rarely spans more than a few groups).
            let mut groups: Vec<Arc<Envelope>> = Vec::new();
            let mut batch = Vec::new();
            while batch.len() < 1024 {
                let Some(job) = pending.front() else { break };
                if !groups.iter().any(|g| g.group == job.env.group) {
                    // `max_open` is at least 1: a batch always takes its first job.
                    if groups.len() >= self.max_open {
                        break;
                    }
                    groups.push(job.env.clone());
                }
                batch.push(pending.pop_front().expect("looked at"));
            }
            last = batch.len();
            self.write_batch(batch);
        }
        // Stopped (the node is shutting down): leave every file ending with its last line.
        for f in self.files.values_mut() {
            f.trim();
        }
    }

    /// Appends the lines of `jobs` (one group's) with one write, noting the file's
    /// length before this commit in `starts` (for a failed sync's undo); returns the
    /// length before this run. A failed write leaves none of them (the file is cut back
    /// to where the run began).
    fn append_run(
        &mut self,
        group: &str,
        jobs: &[WriteJob],
        starts: &mut HashMap<String, u64>,
    ) -> std::io::Result<u64> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        for j in jobs {
            buf.extend_from_slice(&j.line);
            buf.push(b'\n');
        }
        let written = self.file(group, starts).and_then(|f| {
            let before = f.len;
            if !starts.contains_key(group) {
                starts.insert(group.to_string(), before);
            }
            f.append_clean(&buf).map(|()| before)
        });
        self.buf = buf;
        written
    }

    /// Writes one group commit: appends every job, hands the outbound ones to the
    /// peers, syncs, then answers. A job whose write fails leaves nothing behind (its
    /// transcript line is cut back if its outbox log entry fails). If a sync fails,
    /// every job of the batch is refused and its transcript lines are cut back, since
    /// what they wrote may not be on disk; but the outbound messages already handed to
    /// the peers stay in the outbox log, and their sequence numbers are not reused: an
    /// outbox that spilled re-reads them from there, and a restart sends them again
    /// (peers deduplicate), so no peer misses a message another peer got.
    fn write_batch(&mut self, batch: Vec<WriteJob>) {
        let mut results: Vec<std::io::Result<()>> = Vec::with_capacity(batch.len());
        // Each touched file's length before this batch, to undo it if a sync fails.
        let mut starts: HashMap<String, u64> = HashMap::new();
        let log_start = self.log.len;
        let seq_start = self.next_seq;
        let mut i = 0;
        while i < batch.len() {
            let job = &batch[i];
            if job.outbound.is_none() {
                // A run of lines for one group that go to no peer (what a peer's
                // batch brings): one write for all of them, and one result shared.
                let run = batch[i..]
                    .iter()
                    .take_while(|j| j.env.group == job.env.group && j.outbound.is_none())
                    .count();
                let r = self
                    .append_run(&job.env.group, &batch[i..i + run], &mut starts)
                    .map(|_| ());
                for _ in 1..run {
                    results.push(r.as_ref().map(|_| ()).map_err(clone_io_error));
                }
                results.push(r);
                i += run;
                continue;
            }
            i += 1;
            let r = (|| {
                let before =
                    self.append_run(&job.env.group, std::slice::from_ref(job), &mut starts)?;
                let Some((id, body)) = &job.outbound else {
                    return Ok(());
                };
                let seq = self.next_seq;
                let entry = outbox_line(seq, id, body);
                let offset = self.log.len;
                if let Err(e) = self.log.append_clean(&entry) {
                    // Not in the outbox log, so not in the transcript either.
                    self.files
                        .get_mut(&job.env.group)
                        .expect("opened")
                        .cut_back(before);
                    return Err(e);
                }
                self.next_seq += 1;
                // To the peers now, while the sync below runs (see the module docs).
                self.log_entries = true;
                self.fanout.push(LoggedOutbound {
                    seq,
                    id: id.clone(),
                    body: body.clone(),
                    offset,
                });
                Ok(())
            })();
            results.push(r);
        }
        let mut sync_err = None;
        if self.fsync {
            for g in starts.keys() {
                let f = &self.files.get(g).expect("opened").file;
                if let Err(e) = f.sync_data() {
                    sync_err.get_or_insert(e.to_string());
                }
            }
            if self.log.len != log_start {
                if let Err(e) = self.log.file.sync_data() {
                    sync_err.get_or_insert(e.to_string());
                }
            }
        }
        if let Some(e) = &sync_err {
            let handed = self.next_seq - seq_start;
            tracing::error!(error = %e, jobs = batch.len(), handed_to_peers = handed, "fsync failed: the batch is refused and its transcript lines cut back; its outbound messages were already handed to the peers and stay in the outbox log");
            for (g, len) in &starts {
                self.files.get_mut(g).expect("opened").cut_back(*len);
            }
        }
        let results: Vec<std::io::Result<()>> = results
            .into_iter()
            .map(|r| match &sync_err {
                Some(e) => Err(std::io::Error::other(format!("fsync failed: {e}"))),
                None => r,
            })
            .collect();
        // The health state first, then the answers: a caller answered "written" must
        // not find the node still degraded by the failure this batch ended.
        let any_err = results
            .iter()
            .rev()
            .find_map(|r| r.as_ref().err().map(|e| e.to_string()));
        {
            let mut last = self.last_error.lock();
            if let (None, Some(was)) = (&any_err, last.as_ref()) {
                tracing::info!(previous_error = %was, "transcript writes succeed again");
            }
            *last = any_err;
        }
        for (job, r) in batch.into_iter().zip(results) {
            if let Err(e) = &r {
                tracing::error!(group = %job.env.group, dir = %self.dir.display(), error = %e, "transcript write failed; message not acknowledged, nothing of it kept");
            }
            let _ = job.done.send(r);
        }
        if sync_err.is_none() {
            // After the answers: a commit never waits for the zeroing of the next space.
            for g in starts.keys() {
                if let Some(f) = self.files.get_mut(g) {
                    f.preallocate();
                }
            }
        }
        self.compact();
    }

    /// Empties the outbox log once every peer has everything in it.
    fn compact(&mut self) {
        if !self.log_entries || self.fanout.delivered_through() + 1 < self.next_seq {
            return;
        }
        match self.log.truncate() {
            Ok(()) => self.log_entries = false,
            Err(e) => tracing::warn!(error = %e, "could not compact the outbox log"),
        }
    }
}

/// The same failure for each job of a run that was written together.
fn clone_io_error(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}
