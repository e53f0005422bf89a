//! `Conversations`: what a bot whose brain is a remote A2A agent (`engine::a2a`)
//! remembers of its conversations with the agent — each group's `contextId`, and the
//! group's task waiting for the chat's input (`INPUT_REQUIRED`) — kept in
//! `a2a-conversations.json` in the bot's data folder, beside its transcripts and its
//! served tasks, so that after a restart the group's next turn goes on with the same
//! conversation (and answers the task that asked).
//!
//! Small (one entry per group, and the node bounds its groups): the whole file is
//! written anew on each change, to a temporary file then renamed over it, so it is
//! never half written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// The file's name in the data folder.
pub(crate) const FILE_NAME: &str = "a2a-conversations.json";

/// What is kept, as the file holds it.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Saved {
    /// Each group's conversation with the agent (`contextId`), by group.
    #[serde(default)]
    contexts: BTreeMap<String, String>,
    /// Each group's task waiting for the chat's input, which its next turn continues.
    #[serde(default)]
    waiting: BTreeMap<String, String>,
}

/// See the module documentation.
pub(crate) struct Conversations {
    /// The file (`None`: kept in memory only, as in unit tests).
    path: Option<PathBuf>,
    /// What is known now; the file is written from it on each change.
    saved: Mutex<Saved>,
}

impl Conversations {
    /// The conversations of the bot whose data folder is `dir`, read back from its file
    /// (`None`: memory only). A file that cannot be read is logged and left as it is
    /// until the first change: the conversations start anew.
    pub(crate) fn open(dir: Option<&Path>) -> Conversations {
        let path = dir.map(|d| d.join(FILE_NAME));
        let saved = match path.as_deref().map(std::fs::read) {
            None => Saved::default(),
            Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Saved::default(),
            Some(Err(e)) => {
                tracing::warn!(file = %FILE_NAME, error = %e, "cannot read the A2A conversations: each group's next turn starts a new one with the agent");
                Saved::default()
            }
            Some(Ok(bytes)) => match serde_json::from_slice::<Saved>(&bytes) {
                Ok(s) => {
                    tracing::info!(file = %FILE_NAME, groups = s.contexts.len(), waiting = s.waiting.len(), "A2A conversations restored: each group goes on with the same one");
                    s
                }
                Err(e) => {
                    tracing::warn!(file = %FILE_NAME, error = %e, "the A2A conversations file is not readable JSON: each group's next turn starts a new one with the agent");
                    Saved::default()
                }
            },
        };
        Conversations {
            path,
            saved: Mutex::new(saved),
        }
    }

    /// `group`'s conversation, begun (a new `contextId`, saved) if it has none.
    pub(crate) fn context(&self, group: &str) -> String {
        let mut saved = self.saved.lock();
        if let Some(c) = saved.contexts.get(group) {
            return c.clone();
        }
        let c = uuid::Uuid::new_v4().to_string();
        saved.contexts.insert(group.to_string(), c.clone());
        self.write(&saved);
        c
    }

    /// Whether `group`'s conversation with the agent has begun.
    pub(crate) fn knows(&self, group: &str) -> bool {
        self.saved.lock().contexts.contains_key(group)
    }

    /// `group`'s task waiting for input, taken: the turn about to run continues it.
    pub(crate) fn take_waiting(&self, group: &str) -> Option<String> {
        let mut saved = self.saved.lock();
        let task = saved.waiting.remove(group)?;
        self.write(&saved);
        Some(task)
    }

    /// Task `task` waits for `group`'s input: the group's next turn continues it.
    pub(crate) fn wait(&self, group: &str, task: &str) {
        let mut saved = self.saved.lock();
        saved.waiting.insert(group.to_string(), task.to_string());
        self.write(&saved);
    }

    /// Writes `saved` to the file (a temporary file, then a rename); a failure is
    /// logged: the conversations go on in memory, and a restart would begin new ones.
    fn write(&self, saved: &Saved) {
        let Some(path) = &self.path else {
            return;
        };
        let tmp = path.with_extension("json.tmp");
        let written = serde_json::to_vec_pretty(saved)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            tracing::warn!(file = %path.display(), error = %e, "cannot save the A2A conversations: after a restart each group would begin a new one with the agent");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_context_and_waiting_task_are_read_back_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let before = Conversations::open(Some(dir.path()));
        assert!(!before.knows("g"));
        let context = before.context("g");
        assert_eq!(before.context("g"), context, "one context per group");
        assert_ne!(before.context("h"), context);
        before.wait("g", "task-1");

        let after = Conversations::open(Some(dir.path()));
        assert!(after.knows("g"));
        assert_eq!(after.context("g"), context);
        assert_eq!(after.take_waiting("g").as_deref(), Some("task-1"));
        assert_eq!(after.take_waiting("g"), None, "taken once");
        assert_eq!(
            Conversations::open(Some(dir.path())).take_waiting("g"),
            None,
            "the taking is saved"
        );
    }

    #[test]
    fn an_unreadable_file_starts_anew_and_is_replaced_on_the_first_change() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), "{not json").unwrap();
        let c = Conversations::open(Some(dir.path()));
        assert!(!c.knows("g"));
        let context = c.context("g");
        assert_eq!(Conversations::open(Some(dir.path())).context("g"), context);
    }
}
