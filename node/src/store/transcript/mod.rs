//! `Transcripts`: each group's messages, persisted as an append-only JSON-lines file.
//!
//! One file per group in `<data_dir>/transcripts/`, one envelope per line, named by
//! [`file_stem`] (bounded whatever the group's name). A peer's envelope is kept as the
//! JSON it signed ([`Received`]), the node's own serialized. Appends are deduplicated by `id`
//! and by `platform_msg_id`, written by one writer thread that batches concurrent
//! appends into one `fsync` (group commit; they reach it through a [`WriteQueue`];
//! under load a commit may wait up to half a millisecond for more, [`commit_delay`]),
//! and acknowledged only once on disk. On
//! start every file is read back; a line cut short by a crash is dropped (and the file
//! truncated to the last whole line) with a warning.
//!
//! Bounded by [`TranscriptLimits`]: at most `max_groups` groups (a message that would
//! start one more is refused, [`TranscriptError::TooManyGroups`]), and at most
//! `max_open_files` files open, the least recently written closed first.
//!
//! The node's own messages also go to its peers: the writer appends them to the outbox
//! log (`store::outbox_log`) and hands them to the [`Fanout`] as soon as they are written, while its `fsync`
//! runs, so delivery to the peers overlaps the local sync instead of waiting for it
//! (as a Raft leader sends entries to its followers in parallel with its own disk
//! write). The local caller is still answered only after the sync. A power cut inside
//! that fraction of a millisecond can leave the peers with a message this node's disk
//! did not keep; a failed sync refuses the batch locally but cannot call back what
//! the peers were handed (see [`writer`]).

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;
use ulid::Ulid;

use super::file_names::{file_stem, name_of_stem, HASHED_PREFIX};
use super::outbox_log::{load_outbox_log, Fanout, LoggedOutbound, OUTBOX_LOG};
use super::turn_queries::RateCount;
use crate::telemetry::events::{Event, EventBus};
use crate::wire::envelope::Envelope;
use crate::wire::ids::IdSet;
use queue::WriteQueue;
use writer::{AppendFile, WriteJob, Writer};

/// How many recent messages of each group are kept in memory for context and the API.
pub(crate) const MEMORY_MESSAGES: usize = 2_000;

/// Result of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Recorded and on disk.
    New,
    /// Already recorded (same id or same platform message id); nothing written.
    Duplicate,
}

/// Why an append failed; the message is not recorded and must not be acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    /// The disk refused the write (full, read-only, …).
    #[error("transcript write failed: {0}")]
    Io(#[from] std::io::Error),
    /// The writer thread is gone (node shutting down).
    #[error("transcript writer stopped")]
    Stopped,
    /// The message would start a new group on a node that already holds
    /// `[mesh] max_groups` groups: refused, nothing written; the other groups carry on.
    #[error("this node already holds {max} groups ([mesh] max_groups): no new group {group:?}")]
    TooManyGroups {
        /// The limit.
        max: usize,
        /// The group that was not started.
        group: String,
    },
}

/// What was found while loading, for the start-up log.
#[derive(Debug, Default, Clone)]
pub(crate) struct LoadReport {
    /// Groups found.
    pub groups: usize,
    /// Messages restored.
    pub messages: usize,
    /// Lines that could not be parsed and were skipped or cut.
    pub dropped_lines: usize,
}

struct GroupLog {
    recent: VecDeque<Arc<Envelope>>,
    ids: IdSet,
    platform_ids: HashSet<String>,
}

impl GroupLog {
    fn new() -> Self {
        GroupLog {
            recent: VecDeque::new(),
            ids: IdSet::default(),
            platform_ids: HashSet::new(),
        }
    }
    fn is_duplicate(&self, env: &Envelope) -> bool {
        self.ids.contains(&env.id)
            || env
                .platform_msg_id
                .as_deref()
                .is_some_and(|p| platform_ids(p).any(|p| self.platform_ids.contains(p)))
    }
    fn push(&mut self, env: Arc<Envelope>) {
        self.ids.insert(env.id);
        if let Some(p) = &env.platform_msg_id {
            self.platform_ids
                .extend(platform_ids(p).map(str::to_string));
        }
        self.recent.push_back(env);
        if self.recent.len() > MEMORY_MESSAGES {
            self.recent.pop_front();
        }
    }
    fn remove(&mut self, env: &Envelope) {
        self.ids.remove(&env.id);
        if let Some(p) = &env.platform_msg_id {
            for p in platform_ids(p) {
                self.platform_ids.remove(p);
            }
        }
        self.recent.retain(|e| e.id != env.id);
    }
}

/// Takes back a message that was not written, and its group too when it was the
/// group's only message (a group is counted against `max_groups` only once written).
fn forget(groups: &mut HashMap<String, GroupLog>, env: &Envelope) {
    if let Some(log) = groups.get_mut(&env.group) {
        log.remove(env);
        if log.ids.is_empty() {
            groups.remove(&env.group);
        }
    }
}

/// The platform ids one `platform_msg_id` holds: one, or several separated by spaces
/// when the platform split a long message into parts (Discord's 2,000 characters).
/// Each is indexed, so a part seen on the platform finds the message it belongs to.
pub(crate) fn platform_ids(platform_msg_id: &str) -> impl Iterator<Item = &str> {
    platform_msg_id.split_ascii_whitespace()
}

/// A peer's envelope as admitted, with the bytes it was signed as: the transcript
/// keeps those bytes as its line (they are the envelope's JSON, which the bridge
/// parsed and checked), so a received message is not serialized a second time.
#[derive(Debug, Clone)]
pub struct Received {
    /// The parsed envelope.
    pub env: Arc<Envelope>,
    /// Its JSON exactly as the sender signed it.
    pub signed: Bytes,
}

/// The transcript line of `env`, without its `\n` (the writer adds it): `signed` (the
/// bytes a peer signed, see [`Received`], shared rather than copied) when it is one
/// line, else `env` serialized. JSON escapes control characters in strings, so a raw
/// `\n` in `signed` can only be whitespace between tokens, and such a body is
/// serialized again instead.
fn line_of(env: &Envelope, signed: Option<Bytes>) -> Bytes {
    match signed.filter(|b| !b.contains(&b'\n')) {
        Some(b) => b,
        None => Bytes::from(serde_json::to_vec(env).expect("envelope serializes")),
    }
}

/// Every group's transcript, in memory and on disk.
pub(crate) struct Transcripts {
    groups: Mutex<HashMap<String, GroupLog>>,
    /// The appends on their way to the writer thread.
    queue: Arc<WriteQueue>,
    /// The writer thread, joined by [`Transcripts::close`] so its files are trimmed.
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    events: EventBus,
    /// The last write error, shown by /healthz until a write succeeds again.
    last_error: Arc<Mutex<Option<String>>>,
    /// New groups past this many are refused ([`TranscriptError::TooManyGroups`]).
    max_groups: usize,
    /// Transcript files the writer holds open now (a gauge).
    open_files: Arc<AtomicUsize>,
}

/// What a node's transcripts may hold: `[mesh] max_groups` and
/// `[mesh] max_open_transcripts`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TranscriptLimits {
    /// Groups the node keeps; a message that would start one more is refused, and
    /// the groups it has carry on.
    pub max_groups: usize,
    /// Transcript files held open at once: past it the least recently written one is
    /// closed (and opened again when its group next speaks), so many groups never
    /// exhaust the process's file descriptors.
    pub max_open_files: usize,
}

#[cfg(test)]
impl TranscriptLimits {
    /// Limits no test reaches.
    pub(crate) const UNBOUNDED: TranscriptLimits = TranscriptLimits {
        max_groups: usize::MAX,
        max_open_files: 1024,
    };
}

impl Transcripts {
    /// Opens (creating) `<data_dir>/transcripts`, loads every group and starts the writer.
    pub(crate) fn open(
        data_dir: &Path,
        events: EventBus,
        fsync: bool,
        fanout: Arc<dyn Fanout>,
        min_next_seq: u64,
        limits: TranscriptLimits,
    ) -> std::io::Result<(Transcripts, LoadReport, Vec<LoggedOutbound>)> {
        let dir = data_dir.join("transcripts");
        std::fs::create_dir_all(&dir)?;
        let mut groups = HashMap::new();
        let mut report = LoadReport::default();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
                continue;
            }
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                tracing::warn!(file = %path.display(), "skipping transcript file with an undecodable name");
                continue;
            };
            let named = name_of_stem(stem);
            if named.is_none() && !stem.starts_with(HASHED_PREFIX) {
                tracing::warn!(file = %path.display(), "skipping transcript file with an undecodable name");
                continue;
            }
            let (log, dropped) = load_file(&path)?;
            report.dropped_lines += dropped;
            // A hashed name does not say the group: its lines do.
            let Some(group) = named.or_else(|| log.recent.back().map(|e| e.group.clone())) else {
                continue;
            };
            // A readable name that is not the group's stem now is a long name an older
            // version wrote: the writer keeps appending there ([`super::super::file_names::stored_path`]).
            if stem.starts_with(HASHED_PREFIX) && file_stem(&group) != stem {
                tracing::warn!(file = %path.display(), %group, "skipping a transcript file whose lines belong to a group of another file name (renamed by hand?)");
                continue;
            }
            if groups.contains_key(&group) {
                tracing::warn!(file = %path.display(), %group, "skipping a second transcript file of one group");
                continue;
            }
            report.groups += 1;
            report.messages += log.ids.len();
            groups.insert(group, log);
        }
        if groups.len() > limits.max_groups {
            tracing::warn!(
                groups = groups.len(),
                max_groups = limits.max_groups,
                "the data folder holds more groups than [mesh] max_groups: all are kept, new groups are refused"
            );
        }
        let log_path = data_dir.join(OUTBOX_LOG);
        let pending = load_outbox_log(&log_path)?;
        let next_seq = pending
            .last()
            .map(|p| p.seq + 1)
            .unwrap_or(1)
            .max(min_next_seq);
        let outbox_log = AppendFile::open(&log_path, false)?;
        let queue = Arc::new(WriteQueue::new());
        let last_error = Arc::new(Mutex::new(None));
        let open_files = Arc::new(AtomicUsize::new(0));
        let writer = Writer {
            dir,
            fsync,
            files: HashMap::new(),
            max_open: limits.max_open_files.max(1),
            clock: 0,
            open_files: open_files.clone(),
            log: outbox_log,
            log_entries: !pending.is_empty(),
            next_seq,
            fanout,
            last_error: last_error.clone(),
            buf: Vec::new(),
        };
        let writer_queue = queue.clone();
        let writer_thread = std::thread::Builder::new()
            .name("transcript-writer".into())
            .spawn(move || writer.run(&writer_queue))?;
        queue.set_writer(writer_thread.thread().clone());
        Ok((
            Transcripts {
                groups: Mutex::new(groups),
                queue,
                writer_thread: Mutex::new(Some(writer_thread)),
                events,
                last_error,
                max_groups: limits.max_groups,
                open_files,
            },
            report,
            pending,
        ))
    }

    /// Records `env` unless already present; returns once it is on disk.
    #[cfg(test)]
    pub(crate) async fn append(&self, env: Envelope) -> Result<Appended, TranscriptError> {
        self.append_with(Arc::new(env), false).await
    }

    /// Records `env` and, in the same durable write, queues it for every peer through
    /// the outbox log: once this returns `Ok`, the message survives a crash on both
    /// counts. The peers are handed it as soon as it is written, before the sync
    /// ends (see the module docs), so they may have it even when this returns an error.
    #[cfg(test)]
    pub(crate) async fn append_outbound(&self, env: Envelope) -> Result<Appended, TranscriptError> {
        self.append_with(Arc::new(env), true).await
    }

    /// Records several messages at once, each unless already present, in order: they
    /// reach the writer together, so one group commit (one fdatasync per file) usually
    /// covers them all. One result per message, in the same order; returns once every
    /// message is on disk (or refused).
    pub(crate) async fn append_many(
        &self,
        envs: Vec<Received>,
    ) -> Vec<Result<Appended, TranscriptError>> {
        self.append_all(
            envs.into_iter()
                .map(|r| (r.env, Some(r.signed), false))
                .collect(),
        )
        .await
    }

    pub(crate) async fn append_with(
        &self,
        env: Arc<Envelope>,
        outbound: bool,
    ) -> Result<Appended, TranscriptError> {
        self.append_all(vec![(env, None, outbound)])
            .await
            .pop()
            .expect("one result per message")
    }

    /// Records each `(envelope, the bytes a peer signed, outbound)` in order.
    async fn append_all(
        &self,
        envs: Vec<(Arc<Envelope>, Option<Bytes>, bool)>,
    ) -> Vec<Result<Appended, TranscriptError>> {
        enum Slot {
            Done(Result<Appended, TranscriptError>),
            Wait(Arc<Envelope>, oneshot::Receiver<std::io::Result<()>>),
        }
        // Serialized before taking the lock.
        let prepared: Vec<_> = envs
            .into_iter()
            .map(|(env, signed, outbound)| {
                let line = line_of(&env, signed);
                // The outbox carries the line as it is (without a `\n`).
                let outbound = outbound.then(|| (env.id.to_string(), line.clone()));
                (env, line, outbound)
            })
            .collect();
        let mut slots = Vec::with_capacity(prepared.len());
        let mut wake = false;
        {
            let mut groups = self.groups.lock();
            // Queued under the lock so the file order is the memory order; the
            // writer is woken after it (see [`queue`]).
            for (env, line, outbound) in prepared {
                if groups.len() >= self.max_groups && !groups.contains_key(&env.group) {
                    tracing::warn!(group = %env.group, id = %env.id, max_groups = self.max_groups, "message refused: it would start a group past [mesh] max_groups");
                    slots.push(Slot::Done(Err(TranscriptError::TooManyGroups {
                        max: self.max_groups,
                        group: env.group.clone(),
                    })));
                    continue;
                }
                // The group's name is copied only for a new group.
                if !groups.contains_key(&env.group) {
                    groups.insert(env.group.clone(), GroupLog::new());
                }
                let log = groups.get_mut(&env.group).expect("just inserted");
                if log.is_duplicate(&env) {
                    slots.push(Slot::Done(Ok(Appended::Duplicate)));
                    continue;
                }
                log.push(env.clone());
                let (done_tx, done_rx) = oneshot::channel();
                let queued = self.queue.push(WriteJob {
                    env: env.clone(),
                    line,
                    outbound,
                    done: done_tx,
                });
                match queued {
                    Ok(w) => wake |= w,
                    Err(_) => {
                        forget(&mut groups, &env);
                        slots.push(Slot::Done(Err(TranscriptError::Stopped)));
                        continue;
                    }
                }
                slots.push(Slot::Wait(env, done_rx));
            }
        }
        if wake {
            self.queue.wake();
        }
        let mut out = Vec::with_capacity(slots.len());
        for slot in slots {
            let (env, done_rx) = match slot {
                Slot::Done(r) => {
                    out.push(r);
                    continue;
                }
                Slot::Wait(env, rx) => (env, rx),
            };
            let result = done_rx
                .await
                .unwrap_or_else(|_| Err(std::io::Error::other("writer stopped")));
            out.push(match result {
                Ok(()) => {
                    self.events.publish(Event::Message { envelope: env });
                    Ok(Appended::New)
                }
                Err(e) => {
                    forget(&mut self.groups.lock(), &env);
                    Err(TranscriptError::Io(e))
                }
            });
        }
        out
    }

    /// Whether a message with this id or platform id is recorded in `group`.
    pub(crate) fn contains(&self, group: &str, id: &Ulid, platform_msg_id: Option<&str>) -> bool {
        let groups = self.groups.lock();
        groups.get(group).is_some_and(|g| {
            g.ids.contains(id) || platform_msg_id.is_some_and(|p| g.platform_ids.contains(p))
        })
    }

    /// The last `limit` messages of `group`, oldest first.
    pub(crate) fn recent(&self, group: &str, limit: usize) -> Vec<Arc<Envelope>> {
        let groups = self.groups.lock();
        groups
            .get(group)
            .map(|g| g.recent.iter().rev().take(limit).rev().cloned().collect())
            .unwrap_or_default()
    }

    /// `count` over `group`'s log, in place (no copy of the messages: it runs for
    /// every message) and under one lock, so an answer recorded meanwhile counts once,
    /// either as a message or as one due. A group without messages owes every answer
    /// ahead.
    pub(crate) fn rate_count(&self, group: &str, count: &RateCount<'_>) -> (usize, usize) {
        let groups = self.groups.lock();
        match groups.get(group) {
            Some(g) => count.over(g.recent.iter()),
            None => count.over([].iter()),
        }
    }

    /// Messages recorded in `group` after the message `after` (exclusive), oldest first.
    pub(crate) fn since(&self, group: &str, after: &Ulid) -> Vec<Arc<Envelope>> {
        let groups = self.groups.lock();
        let Some(g) = groups.get(group) else {
            return Vec::new();
        };
        match g.recent.iter().position(|e| &e.id == after) {
            Some(i) => g.recent.iter().skip(i + 1).cloned().collect(),
            None => Vec::new(),
        }
    }

    /// One message by id.
    pub(crate) fn get(&self, group: &str, id: &Ulid) -> Option<Arc<Envelope>> {
        let groups = self.groups.lock();
        groups
            .get(group)?
            .recent
            .iter()
            .rev()
            .find(|e| &e.id == id)
            .cloned()
    }

    /// Groups held (for metrics: how close the node is to `max_groups`).
    pub(crate) fn groups(&self) -> usize {
        self.groups.lock().len()
    }

    /// Transcript files the writer holds open now (at most `max_open_transcripts`).
    pub(crate) fn open_files(&self) -> usize {
        self.open_files.load(Ordering::Relaxed)
    }

    /// Refuses what [`Transcripts::append_with`] would refuse for starting a group past
    /// `max_groups`, before anything else is done with the message (such as posting it
    /// to a chat platform).
    pub(crate) fn admits(&self, group: &str) -> Result<(), TranscriptError> {
        let groups = self.groups.lock();
        if groups.len() >= self.max_groups && !groups.contains_key(group) {
            return Err(TranscriptError::TooManyGroups {
                max: self.max_groups,
                group: group.to_string(),
            });
        }
        Ok(())
    }

    /// Total ids indexed (for metrics and soak checks).
    pub(crate) fn indexed_ids(&self) -> usize {
        self.groups.lock().values().map(|g| g.ids.len()).sum()
    }

    /// The last write error, if the most recent write failed.
    pub(crate) fn health_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// Stops the writer after it has finished what was queued, and waits for it (it
    /// gives back the files' preallocated space as it stops).
    pub(crate) fn close(&self) {
        self.queue.close();
        let thread = self.writer_thread.lock().take();
        if let Some(t) = thread {
            if t.join().is_err() {
                tracing::error!("the transcript writer thread panicked");
            }
        }
    }
}

/// Reads every whole line of an append-only file (without its `\n`), calling `each`
/// with the line and its end offset. What follows the last whole line is cut off, so
/// the next append starts cleanly: quietly when it is only zeros (the space a running
/// node keeps ahead, see [`AppendFile`]), with a warning when it holds anything else
/// (a line cut short by a crash). A whole line with NUL bytes in it (pages of an
/// unfinished group commit that reached the disk out of order) is handed to `each`
/// like any other line, which finds it unreadable; the lines after it are kept.
/// Returns whether a torn tail was cut.
pub(super) fn read_whole_lines(
    path: &Path,
    mut each: impl FnMut(&[u8], u64),
) -> std::io::Result<bool> {
    let mut file = OpenOptions::new().read(true).write(true).open(path)?;
    let mut offset: u64 = 0;
    let mut torn = false;
    let mut tail = false;
    {
        let mut reader = BufReader::new(&mut file);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf)?;
            if n == 0 {
                break;
            }
            if buf.last() != Some(&b'\n') {
                tail = true;
                torn = buf.iter().any(|&b| b != 0);
                break;
            }
            offset += n as u64;
            each(&buf[..buf.len() - 1], offset);
        }
    }
    if torn {
        tracing::warn!(file = %path.display(), kept_bytes = offset, "file ended mid-line (crash?); dropping the torn tail");
    }
    if tail {
        file.set_len(offset)?;
        file.seek(SeekFrom::End(0))?;
    }
    Ok(torn)
}

fn load_file(path: &Path) -> std::io::Result<(GroupLog, usize)> {
    let mut log = GroupLog::new();
    let mut dropped = 0;
    let torn = read_whole_lines(path, |line, offset| {
        match serde_json::from_slice::<Envelope>(line) {
            Ok(env) => {
                if !log.is_duplicate(&env) {
                    log.push(Arc::new(env));
                }
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), offset, error = %e, "skipping unreadable transcript line");
                dropped += 1;
            }
        }
    })?;
    Ok((log, dropped + usize::from(torn)))
}

/// Reads a transcript file without changing it (`botmesh replay`, which may read a
/// running node's file): its last [`MEMORY_MESSAGES`] messages, deduplicated as a
/// node restores them, and how many lines could not be read (a torn last line too).
pub(crate) fn read_only(path: &Path) -> std::io::Result<(Vec<Arc<Envelope>>, usize)> {
    let mut log = GroupLog::new();
    let mut dropped = 0;
    for line in BufReader::new(File::open(path)?).split(b'\n') {
        let line = line?;
        if line.is_empty() || line[0] == 0 {
            continue;
        }
        match serde_json::from_slice::<Envelope>(&line) {
            Ok(env) if !log.is_duplicate(&env) => log.push(Arc::new(env)),
            Ok(_) => {}
            Err(_) => dropped += 1,
        }
    }
    Ok((log.recent.into_iter().collect(), dropped))
}

mod commit_delay;
mod queue;
#[cfg(test)]
mod tests;
mod writer;
