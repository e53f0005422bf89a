//! `VerdictLog`: every judge answer the node got, kept next to the transcripts so
//! `botmesh replay` can say what the bot did then and reuse the answer instead of
//! paying for the LLM again (docs/tuning.md, "The verdict log").
//!
//! One JSON line per judge call in `<data_dir>/verdicts/<group>.jsonl` (the group's
//! name encoded as for transcripts): the message, the hash of the exact judge
//! messages sent, the model, the answer, and what the bot then did. Written by one
//! thread behind a bounded queue, so a turn never waits for the disk: a full queue or
//! a failed write costs that line (logged, counted in `botmesh_verdict_log_total`),
//! never the turn. No `fsync`: the log is a tuning aid, not a record anything else
//! depends on. A file past [`MAX_FILE_BYTES`] is renamed to `<group>.jsonl.1`
//! (replacing the older one), so a group keeps at most twice that.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use crate::store::file_names::stored_path;
use crate::telemetry::metrics::Metrics;

/// The record format's version, written in every line (`"v"`); readers skip lines of
/// a version they do not know.
pub(crate) const VERDICT_FORMAT: u32 = 1;

/// A group's file is rotated (to `.jsonl.1`) once it passes this size.
pub(crate) const MAX_FILE_BYTES: u64 = 8 << 20;

/// Records waiting for the writer; past this, new ones are dropped (and counted). The
/// writer appends without fsync, far faster than judge answers come; std's bounded
/// channel allocates every slot up front, and 4096 of them cost each node about 2 MiB
/// of idle RSS (botmesh-bench, measured side by side).
const QUEUE: usize = 256;

/// One judge answer and what the bot did with it: one line of the verdict log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct VerdictRecord {
    /// The format version ([`VERDICT_FORMAT`]).
    pub(crate) v: u32,
    /// Unix ms when the judge answered.
    pub(crate) at: u64,
    /// The group of the message.
    pub(crate) group: String,
    /// The message judged.
    pub(crate) msg: Ulid,
    /// Its author.
    pub(crate) from: String,
    /// Whether this was the re-judge after the wait (others spoke meanwhile).
    #[serde(default)]
    pub(crate) rejudge: bool,
    /// The judge model (`offline` for the offline judge).
    pub(crate) model: String,
    /// Hash of the exact judge messages sent (`turn::judge::prompt_hash`); absent for
    /// the offline judge, which sends none.
    #[serde(default)]
    pub(crate) prompt_hash: Option<String>,
    /// Size of the judge prompt, bytes.
    #[serde(default)]
    pub(crate) prompt_bytes: usize,
    /// The judge's `speak`; absent when the call failed.
    #[serde(default)]
    pub(crate) speak: Option<bool>,
    /// The judge's `relevance`; absent when the call failed.
    #[serde(default)]
    pub(crate) relevance: Option<f64>,
    /// What the bot then did: `claim` (interjects after its delay), `reply`
    /// (mentioned, and the judge agreed) or `silent`.
    pub(crate) action: String,
    /// Why: `interjected`, `mentioned`, `judge_declined`, `judge_failed`,
    /// `rejudged_speak`, `rejudged_silent`.
    pub(crate) reason: String,
    /// For a claim: the relevance-scaled delay, ms, without jitter.
    #[serde(default)]
    pub(crate) delay_ms: Option<u64>,
    /// The bot's `min_relevance` at the time.
    #[serde(default)]
    pub(crate) min_relevance: Option<f64>,
}

/// The folder of the verdict logs in a data folder.
pub(crate) fn verdict_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("verdicts")
}

/// A group's current verdict log file.
pub(crate) fn verdict_path(data_dir: &Path, group: &str) -> PathBuf {
    stored_path(&verdict_dir(data_dir), group, "jsonl")
}

/// The rotated file next to `path` (`….jsonl.1`).
fn rotated(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".1");
    PathBuf::from(s)
}

/// What [`load`] read.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    /// Records, oldest first.
    pub records: Vec<VerdictRecord>,
    /// Lines that were not a record of a known version.
    pub skipped: usize,
}

/// Reads a verdict log: the rotated file next to `path` first (`….jsonl.1`), then
/// `path`; missing files are an empty log.
pub(crate) fn load(path: &Path) -> std::io::Result<Loaded> {
    let path = path.to_path_buf();
    let mut out = Loaded::default();
    for p in [rotated(&path), path] {
        let file = match File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for line in BufReader::new(file).split(b'\n') {
            let line = line?;
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<VerdictRecord>(&line) {
                Ok(r) if r.v == VERDICT_FORMAT => out.records.push(r),
                _ => out.skipped += 1,
            }
        }
    }
    Ok(out)
}

/// The verdict log's writer: a thread behind a bounded queue.
pub(crate) struct VerdictLog {
    tx: Mutex<Option<mpsc::SyncSender<VerdictRecord>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    metrics: Arc<Metrics>,
}

impl VerdictLog {
    /// Starts the writer (which creates `<data_dir>/verdicts` when it first writes). Only
    /// a thread that cannot be started is an error: the log never stops a node.
    pub(crate) fn open(data_dir: &Path, metrics: Arc<Metrics>) -> std::io::Result<VerdictLog> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let writer = Writer {
            data_dir: data_dir.to_path_buf(),
            files: HashMap::new(),
            metrics: metrics.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("verdict-log".into())
            .spawn(move || writer.run(rx))?;
        Ok(VerdictLog {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            metrics,
        })
    }

    /// Queues a record; never blocks (a full queue drops it, counted and logged).
    pub(crate) fn append(&self, rec: VerdictRecord) {
        let tx = self.tx.lock().clone();
        let Some(tx) = tx else { return };
        match tx.try_send(rec) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(r)) => {
                self.metrics.verdict_logged("dropped");
                tracing::warn!(trigger = %r.msg, "verdict log queue full; record dropped");
            }
            Err(mpsc::TrySendError::Disconnected(_)) => self.metrics.verdict_logged("dropped"),
        }
    }

    /// Writes what is queued and stops the writer (at shutdown).
    pub(crate) fn close(&self) {
        self.tx.lock().take();
        if let Some(t) = self.thread.lock().take() {
            if t.join().is_err() {
                tracing::error!("the verdict log writer thread panicked");
            }
        }
    }
}

impl Drop for VerdictLog {
    fn drop(&mut self) {
        self.close();
    }
}

/// One open verdict file and its size.
struct Open {
    out: BufWriter<File>,
    len: u64,
}

/// The writer thread's state.
struct Writer {
    data_dir: PathBuf,
    /// The files written since the queue was last empty (then closed).
    files: HashMap<String, Open>,
    metrics: Arc<Metrics>,
}

impl Writer {
    /// Writes what comes, flushing and closing every file once the queue is empty:
    /// judge answers come far slower than files open, and a file kept open per group
    /// (with its buffer) would cost a descriptor and 8 KiB for every group ever judged.
    fn run(mut self, rx: mpsc::Receiver<VerdictRecord>) {
        while let Ok(rec) = rx.recv() {
            self.write(&rec);
            while let Ok(rec) = rx.try_recv() {
                self.write(&rec);
            }
            self.close_all();
        }
        self.flush();
    }

    /// Flushes and closes every file (the queue is empty).
    fn close_all(&mut self) {
        self.flush();
        self.files.clear();
    }

    fn write(&mut self, rec: &VerdictRecord) {
        let mut line = serde_json::to_vec(rec).expect("a verdict record serializes");
        line.push(b'\n');
        match self.write_line(&rec.group, &line) {
            Ok(()) => self.metrics.verdict_logged("written"),
            Err(e) => {
                self.metrics.verdict_logged("failed");
                // The buffered writer may hold part of the line: start that file afresh.
                self.files.remove(&rec.group);
                tracing::warn!(group = %rec.group, trigger = %rec.msg, error = %e, "could not write the verdict log");
            }
        }
    }

    fn write_line(&mut self, group: &str, line: &[u8]) -> std::io::Result<()> {
        let path = verdict_path(&self.data_dir, group);
        let full = self.open(group, &path)?.len + line.len() as u64 > MAX_FILE_BYTES;
        if full {
            if let Some(mut f) = self.files.remove(group) {
                f.out.flush()?;
            }
            std::fs::rename(&path, rotated(&path))?;
        }
        let f = self.open(group, &path)?;
        f.out.write_all(line)?;
        f.len += line.len() as u64;
        Ok(())
    }

    /// The group's open file, opened (appending) if it is not yet.
    fn open(&mut self, group: &str, path: &Path) -> std::io::Result<&mut Open> {
        if !self.files.contains_key(group) {
            std::fs::create_dir_all(verdict_dir(&self.data_dir))?;
            let file = OpenOptions::new().create(true).append(true).open(path)?;
            let len = file.metadata()?.len();
            self.files.insert(
                group.to_string(),
                Open {
                    out: BufWriter::new(file),
                    len,
                },
            );
        }
        Ok(self.files.get_mut(group).expect("just opened"))
    }

    fn flush(&mut self) {
        let mut failed = Vec::new();
        for (group, f) in &mut self.files {
            if let Err(e) = f.out.flush() {
                self.metrics.verdict_logged("failed");
                tracing::warn!(%group, error = %e, "could not flush the verdict log");
                failed.push(group.clone());
            }
        }
        for g in failed {
            self.files.remove(&g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(group: &str, relevance: f64) -> VerdictRecord {
        VerdictRecord {
            v: VERDICT_FORMAT,
            at: 1,
            group: group.into(),
            msg: Ulid::new(),
            from: "h".into(),
            rejudge: false,
            model: "m".into(),
            prompt_hash: Some("abc".into()),
            prompt_bytes: 10,
            speak: Some(true),
            relevance: Some(relevance),
            action: "claim".into(),
            reason: "interjected".into(),
            delay_ms: Some(5),
            min_relevance: Some(0.3),
        }
    }

    #[test]
    fn writes_reads_back_and_skips_unknown_versions() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let log = VerdictLog::open(dir.path(), metrics.clone()).unwrap();
        let a = rec("g/1", 0.5);
        let b = rec("g/1", 0.7);
        let other = rec("other", 0.1);
        log.append(a.clone());
        log.append(other.clone());
        log.append(b.clone());
        log.close();
        let path = verdict_path(dir.path(), "g/1");
        assert!(path.ends_with("verdicts/g%2F1.jsonl"), "{}", path.display());
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"v\":99}\nnot json\n").unwrap();
        let got = load(&verdict_path(dir.path(), "g/1")).unwrap();
        assert_eq!(got.records, vec![a, b]);
        assert_eq!(got.skipped, 2);
        assert_eq!(
            load(&verdict_path(dir.path(), "other")).unwrap().records,
            vec![other]
        );
        assert!(load(&verdict_path(dir.path(), "none"))
            .unwrap()
            .records
            .is_empty());
        assert!(metrics
            .render()
            .contains("botmesh_verdict_log_total{result=\"written\"} 3"));
    }

    #[test]
    fn a_failed_write_is_counted_and_the_next_one_goes_through() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let log = VerdictLog::open(dir.path(), metrics.clone()).unwrap();
        // A file where the folder should be: every write fails until it is gone.
        std::fs::write(verdict_dir(dir.path()), b"in the way").unwrap();
        log.append(rec("g", 0.1));
        let written = |m: &Metrics, r: &str| {
            m.render()
                .contains(&format!("botmesh_verdict_log_total{{result=\"{r}\"}} 1"))
        };
        for _ in 0..500 {
            if written(&metrics, "failed") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(written(&metrics, "failed"), "{}", metrics.render());
        std::fs::remove_file(verdict_dir(dir.path())).unwrap();
        let ok = rec("g", 0.2);
        log.append(ok.clone());
        log.close();
        assert!(written(&metrics, "written"), "{}", metrics.render());
        assert_eq!(
            load(&verdict_path(dir.path(), "g")).unwrap().records,
            vec![ok]
        );
    }

    #[test]
    fn files_are_closed_once_the_queue_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer {
            data_dir: dir.path().to_path_buf(),
            files: HashMap::new(),
            metrics: Arc::new(Metrics::new()),
        };
        let long = "群".repeat(30);
        for g in ["a", "b", long.as_str()] {
            w.write(&rec(g, 0.5));
        }
        assert_eq!(w.files.len(), 3);
        w.close_all();
        assert!(w.files.is_empty(), "no descriptor held per group");
        for g in ["a", "b", long.as_str()] {
            assert_eq!(load(&verdict_path(dir.path(), g)).unwrap().records.len(), 1);
        }
        let hashed = verdict_path(dir.path(), &long);
        assert!(
            hashed.file_name().unwrap().len() < 80,
            "{}",
            hashed.display()
        );
    }

    #[test]
    fn rotates_past_the_size_bound_and_reads_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = VerdictLog::open(dir.path(), Arc::new(Metrics::new())).unwrap();
        let path = verdict_path(dir.path(), "g");
        // A file already near the bound: the next line rotates it.
        let first = rec("g", 0.1);
        let mut line = serde_json::to_vec(&first).unwrap();
        line.push(b'\n');
        let mut pad = Vec::new();
        while (pad.len() as u64) + (line.len() as u64) < MAX_FILE_BYTES - 10 {
            pad.extend_from_slice(b"\n");
        }
        pad.extend_from_slice(&line);
        std::fs::create_dir_all(verdict_dir(dir.path())).unwrap();
        std::fs::write(&path, &pad).unwrap();
        let second = rec("g", 0.2);
        log.append(second.clone());
        log.close();
        assert!(rotated(&path).exists());
        assert!(std::fs::metadata(&path).unwrap().len() < 1000);
        assert_eq!(
            load(&verdict_path(dir.path(), "g")).unwrap().records,
            vec![first, second]
        );
    }
}
