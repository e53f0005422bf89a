//! `SeenCache`: remembers envelope ids long enough to refuse replays.
//!
//! The signature window is ±300 s, so a captured request can be replayed for at most
//! ten minutes; the cache keeps ids for longer than that (`ttl`) and is bounded in
//! size (`capacity`), evicting the oldest first. Replays older than the window fail
//! the timestamp check; the transcript's permanent id index catches the rest.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// A bounded, time-evicting set of recently seen ids.
pub(crate) struct SeenCache {
    inner: Mutex<Inner>,
    /// How long an id is remembered; must exceed twice the signature window.
    ttl: Duration,
    /// The most ids held at once.
    capacity: usize,
}

struct Inner {
    /// id → when it was inserted (to skip stale entries in `order`).
    ids: HashMap<String, Instant>,
    /// Insertion order, for eviction.
    order: VecDeque<(Instant, String)>,
}

impl SeenCache {
    /// A cache keeping ids for `ttl`, at most `capacity` of them.
    pub(crate) fn new(ttl: Duration, capacity: usize) -> Self {
        SeenCache {
            inner: Mutex::new(Inner {
                ids: HashMap::new(),
                order: VecDeque::new(),
            }),
            ttl,
            capacity: capacity.max(1),
        }
    }

    /// Whether `id` was inserted within the ttl.
    pub(crate) fn contains(&self, id: &str) -> bool {
        let mut inner = self.inner.lock();
        self.evict(&mut inner, Instant::now());
        inner.ids.contains_key(id)
    }

    /// Records `id`; returns false if it was already present.
    pub(crate) fn insert(&self, id: &str) -> bool {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        self.evict(&mut inner, now);
        if inner.ids.contains_key(id) {
            return false;
        }
        while inner.ids.len() >= self.capacity {
            match inner.order.pop_front() {
                Some((_, old)) => {
                    inner.ids.remove(&old);
                }
                None => break,
            }
        }
        inner.ids.insert(id.to_string(), now);
        inner.order.push_back((now, id.to_string()));
        true
    }

    /// Number of ids currently held (for metrics and soak checks).
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().ids.len()
    }

    fn evict(&self, inner: &mut Inner, now: Instant) {
        while let Some((at, _)) = inner.order.front() {
            if now.duration_since(*at) < self.ttl {
                break;
            }
            let (_, id) = inner.order.pop_front().expect("front exists");
            inner.ids.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn forgets_after_ttl_and_stays_bounded() {
        let c = SeenCache::new(Duration::from_secs(600), 3);
        assert!(c.insert("a"));
        assert!(!c.insert("a"));
        tokio::time::advance(Duration::from_secs(599)).await;
        assert!(c.contains("a"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!c.contains("a"));
        for id in ["1", "2", "3", "4"] {
            c.insert(id);
        }
        assert_eq!(c.len(), 3);
        assert!(!c.contains("1"), "oldest evicted first");
        assert!(c.contains("4"));
    }
}
