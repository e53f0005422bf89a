//! Event id dedup: a small file in the data folder remembering event ids for 24 h.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

// ---------------------------------------------------------------------------------
// Event id dedup
// ---------------------------------------------------------------------------------

/// Remembers handled event ids for a day, in memory and in a small append-only file
/// (`<unix seconds> <event id>` per line, compacted on open and when it grows), so
/// neither Feishu's retries nor a restart make a message count twice.
pub(crate) struct EventDedup {
    path: PathBuf,
    ttl_secs: u64,
    capacity: usize,
    inner: Mutex<DedupInner>,
}

pub(super) struct DedupInner {
    seen: HashMap<String, u64>,
    order: VecDeque<(u64, String)>,
    file: Option<std::fs::File>,
    appended: usize,
}

impl EventDedup {
    /// Opens (creating) the file at `path`, keeping ids younger than `ttl`.
    pub(crate) fn open(
        path: &Path,
        ttl: Duration,
        capacity: usize,
        now_secs: u64,
    ) -> std::io::Result<EventDedup> {
        let ttl_secs = ttl.as_secs();
        let mut inner = DedupInner {
            seen: HashMap::new(),
            order: VecDeque::new(),
            file: None,
            appended: 0,
        };
        match std::fs::File::open(path) {
            Ok(f) => {
                for line in std::io::BufReader::new(f).lines() {
                    let line = line?;
                    let Some((at, id)) = line.split_once(' ') else {
                        continue;
                    };
                    let (Ok(at), id) = (at.parse::<u64>(), id.trim()) else {
                        continue;
                    };
                    if id.is_empty() || now_secs.saturating_sub(at) >= ttl_secs {
                        continue;
                    }
                    if inner.seen.insert(id.to_string(), at).is_none() {
                        inner.order.push_back((at, id.to_string()));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        while inner.order.len() > capacity {
            if let Some((_, id)) = inner.order.pop_front() {
                inner.seen.remove(&id);
            }
        }
        let dedup = EventDedup {
            path: path.to_path_buf(),
            ttl_secs,
            capacity,
            inner: Mutex::new(inner),
        };
        {
            let mut inner = dedup.inner.lock();
            dedup.compact(&mut inner)?;
        }
        Ok(dedup)
    }

    /// Rewrites the file with the live ids only, then appends to it.
    fn compact(&self, inner: &mut DedupInner) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            for (at, id) in &inner.order {
                writeln!(f, "{at} {id}")?;
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        inner.file = Some(
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&self.path)?,
        );
        inner.appended = 0;
        Ok(())
    }

    /// True the first time `id` is seen (and remembers it); false for a repeat.
    pub(crate) fn first_time(&self, id: &str, now_secs: u64) -> bool {
        let mut inner = self.inner.lock();
        while let Some((at, _)) = inner.order.front() {
            if now_secs.saturating_sub(*at) < self.ttl_secs && inner.order.len() < self.capacity {
                break;
            }
            if let Some((_, old)) = inner.order.pop_front() {
                inner.seen.remove(&old);
            }
        }
        if inner.seen.contains_key(id) {
            return false;
        }
        inner.seen.insert(id.to_string(), now_secs);
        inner.order.push_back((now_secs, id.to_string()));
        let line = format!("{now_secs} {id}\n");
        let written = inner
            .file
            .as_mut()
            .map(|f| f.write_all(line.as_bytes()))
            .unwrap_or_else(|| Err(std::io::Error::other("not open")));
        if let Err(e) = written {
            tracing::warn!(file = %self.path.display(), error = %e, "could not persist a feishu event id (it is still remembered in memory)");
        }
        inner.appended += 1;
        if inner.appended > inner.order.len() * 2 + 1024 {
            if let Err(e) = self.compact(&mut inner) {
                tracing::warn!(file = %self.path.display(), error = %e, "could not compact the feishu event id file");
            }
        }
        true
    }

    /// Whether `id` is remembered (without remembering it).
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.inner.lock().seen.contains_key(id)
    }

    /// How many ids are remembered.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().order.len()
    }
}
