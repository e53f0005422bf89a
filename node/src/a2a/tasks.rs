//! `TaskStore`: the tasks callers gave the served bot, kept so that `GetTask` answers
//! after the answer came and after a restart.
//!
//! Bounded: the newest [`MAX_TASKS`] are kept (the oldest forgotten, logged). Durable:
//! every change is one JSON line appended to `a2a-tasks.jsonl` in the bot's data
//! folder, beside its transcripts; on start the file is read back (the last line of a
//! task wins), a task that was still running is marked failed (its turn died with the
//! node), and the file is written anew with what is kept, so it never grows past
//! twice the bound. Every change is also published to the store's watchers (the
//! streams and the blocking `SendMessage` calls waiting on it).

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::a2a::rpc::{self, TaskState};

/// Tasks kept.
pub(crate) const MAX_TASKS: usize = 1_000;

/// The file's name in the data folder.
pub(crate) const FILE_NAME: &str = "a2a-tasks.jsonl";

/// One task as the node keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TaskRecord {
    /// The task's id (a UUID).
    pub(crate) id: String,
    /// Its conversation: follow-ups with it continue the same thread in the group.
    pub(crate) context_id: String,
    /// The group its messages are in.
    pub(crate) group: String,
    /// Who gave it (the caller's name, without `a2a:`).
    pub(crate) caller: String,
    /// The id of the caller's message in the group (the turn's trigger).
    pub(crate) trigger: String,
    /// Where it stands.
    pub(crate) state: TaskState,
    /// The last word about it: the agent's progress, the question it waits on, why
    /// it failed.
    #[serde(default)]
    pub(crate) status_text: Option<String>,
    /// The bot's answer: its message id in the group and its text.
    #[serde(default)]
    pub(crate) answer: Option<(String, String)>,
    /// The caller's message as it sent it: its id and text.
    pub(crate) request: (String, String),
}

impl TaskRecord {
    /// The task on the wire (`Task`): its status (with the last word as an agent
    /// message), its answer as the one artifact, the caller's message as its history.
    pub(crate) fn to_wire(&self) -> Value {
        let mut status = json!({"state": self.state});
        if let Some(text) = &self.status_text {
            status["message"] = rpc::text_message(
                &format!("{}-status", self.id),
                "ROLE_AGENT",
                text,
                Some(&self.context_id),
                Some(&self.id),
            );
        }
        let artifacts: Vec<Value> = self
            .answer
            .iter()
            .map(
                |(id, text)| json!({"artifactId": id, "name": "answer", "parts": [{"text": text}]}),
            )
            .collect();
        json!({
            "id": self.id,
            "contextId": self.context_id,
            "status": status,
            "artifacts": artifacts,
            "history": [rpc::text_message(
                &self.request.0,
                "ROLE_USER",
                &self.request.1,
                Some(&self.context_id),
                Some(&self.id),
            )],
            "metadata": {"group": self.group, "messageId": self.trigger},
        })
    }
}

/// The kept tasks, newest last.
struct Kept {
    /// By id.
    tasks: HashMap<String, TaskRecord>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    /// Lines in the file now.
    lines: usize,
}

/// See the module documentation.
pub(crate) struct TaskStore {
    /// The tasks.
    kept: Mutex<Kept>,
    /// The file (`None`: memory only, for tests).
    path: Option<PathBuf>,
    /// Every change, for the watchers.
    changes: broadcast::Sender<TaskRecord>,
}

impl TaskStore {
    /// A store in memory only.
    pub(crate) fn in_memory() -> TaskStore {
        TaskStore {
            kept: Mutex::new(Kept {
                tasks: HashMap::new(),
                order: VecDeque::new(),
                lines: 0,
            }),
            path: None,
            changes: broadcast::channel(256).0,
        }
    }

    /// Opens the store in `dir` (read back, running tasks marked failed, rewritten).
    pub(crate) fn open(dir: &Path) -> std::io::Result<TaskStore> {
        let path = dir.join(FILE_NAME);
        let mut store = TaskStore::in_memory();
        store.path = Some(path.clone());
        let mut restored = 0;
        if let Ok(file) = std::fs::File::open(&path) {
            let mut kept = store.kept.lock();
            for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
                let line = line?;
                match serde_json::from_str::<TaskRecord>(&line) {
                    Ok(mut t) => {
                        if !t.state.is_terminal() {
                            t.state = TaskState::Failed;
                            t.status_text = Some("the node restarted while the task ran".into());
                        }
                        keep(&mut kept, t);
                    }
                    // A line cut short by a crash: the task's earlier line stands.
                    Err(e) => {
                        tracing::warn!(file = %path.display(), line = n + 1, error = %e, "skipping an unreadable A2A task line")
                    }
                }
            }
            restored = kept.tasks.len();
        }
        store.rewrite()?;
        if restored > 0 {
            tracing::info!(file = %path.display(), tasks = restored, "A2A tasks restored");
        }
        Ok(store)
    }

    /// Writes the file anew with the kept tasks, oldest first.
    fn rewrite(&self) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut kept = self.kept.lock();
        let tmp = path.with_extension("jsonl.tmp");
        {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            for id in &kept.order {
                serde_json::to_writer(&mut f, &kept.tasks[id])?;
                f.write_all(b"\n")?;
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        kept.lines = kept.order.len();
        Ok(())
    }

    /// The task `id`.
    pub(crate) fn get(&self, id: &str) -> Option<TaskRecord> {
        self.kept.lock().tasks.get(id).cloned()
    }

    /// The newest task of conversation `context_id`.
    pub(crate) fn last_in_context(&self, context_id: &str) -> Option<TaskRecord> {
        let kept = self.kept.lock();
        kept.order
            .iter()
            .rev()
            .map(|id| &kept.tasks[id])
            .find(|t| t.context_id == context_id)
            .cloned()
    }

    /// Every change from now on.
    pub(crate) fn watch(&self) -> broadcast::Receiver<TaskRecord> {
        self.changes.subscribe()
    }

    /// Keeps a new task, or a task's new state (a task that is over changes no more:
    /// `false`, nothing written). Written to the file and published to the watchers.
    pub(crate) fn put(&self, t: TaskRecord) -> bool {
        let compact = {
            let mut kept = self.kept.lock();
            if let Some(old) = kept.tasks.get(&t.id) {
                if old.state.is_terminal() || *old == t {
                    return false;
                }
            }
            if let Some(path) = &self.path {
                if let Err(e) = append(path, &t) {
                    tracing::error!(file = %path.display(), task = %t.id, error = %e, "could not write the A2A task: GetTask after a restart will not know this state");
                }
                kept.lines += 1;
            }
            keep(&mut kept, t.clone());
            kept.lines > 2 * MAX_TASKS
        };
        if compact {
            if let Err(e) = self.rewrite() {
                tracing::error!(error = %e, "could not compact the A2A task file");
            }
        }
        let _ = self.changes.send(t);
        true
    }

    /// Tasks kept now.
    pub(crate) fn len(&self) -> usize {
        self.kept.lock().tasks.len()
    }
}

/// Keeps `t` in `kept`, the oldest forgotten past [`MAX_TASKS`].
fn keep(kept: &mut Kept, t: TaskRecord) {
    if kept.tasks.insert(t.id.clone(), t.clone()).is_none() {
        kept.order.push_back(t.id);
        while kept.order.len() > MAX_TASKS {
            if let Some(old) = kept.order.pop_front() {
                kept.tasks.remove(&old);
                tracing::debug!(task = %old, kept = MAX_TASKS, "forgot the oldest A2A task");
            }
        }
    }
}

/// Appends one line for `t`.
fn append(path: &Path, t: &TaskRecord) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(t)?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, state: TaskState) -> TaskRecord {
        TaskRecord {
            id: id.into(),
            context_id: "ctx".into(),
            group: "g".into(),
            caller: "hermes".into(),
            trigger: "01J".into(),
            state,
            status_text: None,
            answer: None,
            request: ("m1".into(), "hi".into()),
        }
    }

    #[test]
    fn tasks_survive_a_restart_and_a_running_one_is_failed() {
        let dir = std::env::temp_dir().join(format!("a2a-tasks-{}", ulid::Ulid::new()));
        std::fs::create_dir_all(&dir).unwrap();
        {
            let s = TaskStore::open(&dir).unwrap();
            assert!(s.put(task("a", TaskState::Working)));
            let mut done = task("a", TaskState::Completed);
            done.answer = Some(("01K".into(), "the answer".into()));
            assert!(s.put(done.clone()));
            // Over is over.
            assert!(!s.put(task("a", TaskState::Canceled)));
            assert!(s.put(task("b", TaskState::Working)));
            assert_eq!(s.get("a"), Some(done));
        }
        let s = TaskStore::open(&dir).unwrap();
        assert_eq!(s.get("a").unwrap().state, TaskState::Completed);
        let b = s.get("b").unwrap();
        assert_eq!(b.state, TaskState::Failed);
        assert!(b.status_text.unwrap().contains("restarted"));
        assert_eq!(s.last_in_context("ctx").unwrap().id, "b");
        let wire = s.get("a").unwrap().to_wire();
        assert_eq!(wire["status"]["state"], "TASK_STATE_COMPLETED");
        assert_eq!(wire["artifacts"][0]["parts"][0]["text"], "the answer");
        assert_eq!(wire["history"][0]["role"], "ROLE_USER");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_store_is_bounded() {
        let s = TaskStore::in_memory();
        for i in 0..MAX_TASKS + 5 {
            s.put(task(&i.to_string(), TaskState::Completed));
        }
        assert_eq!(s.len(), MAX_TASKS);
        assert!(s.get("0").is_none());
        assert!(s.get(&(MAX_TASKS + 4).to_string()).is_some());
    }
}
