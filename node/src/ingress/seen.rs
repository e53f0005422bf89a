//! `SeenCache`: remembers envelope ids long enough to refuse replays.
//!
//! The signature window is ±300 s, so a captured request can be replayed for at most
//! ten minutes; the cache keeps ids for longer than that (`ttl`) and is bounded in
//! size (`capacity`), evicting the oldest first. Replays older than the window fail
//! the timestamp check; the transcript's permanent id index catches the rest.
//!
//! Ids are kept as [`Ulid`]s (16 bytes, no heap): every envelope a node receives is
//! looked up and inserted once, and a string id would cost two allocations each time.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;
use ulid::Ulid;

use crate::wire::ids::IdMap;

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
    ids: IdMap<Instant>,
    /// Insertion order, for eviction.
    order: VecDeque<(Instant, Ulid)>,
}

impl SeenCache {
    /// A cache keeping ids for `ttl`, at most `capacity` of them.
    pub(crate) fn new(ttl: Duration, capacity: usize) -> Self {
        SeenCache {
            inner: Mutex::new(Inner {
                ids: IdMap::default(),
                order: VecDeque::new(),
            }),
            ttl,
            capacity: capacity.max(1),
        }
    }

    /// Whether `id` was inserted within the ttl.
    pub(crate) fn contains(&self, id: &Ulid) -> bool {
        let mut inner = self.inner.lock();
        self.evict(&mut inner, Instant::now());
        inner.ids.contains_key(id)
    }

    /// Records `id`; returns false if it was already present.
    pub(crate) fn insert(&self, id: Ulid) -> bool {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        self.evict(&mut inner, now);
        if inner.ids.contains_key(&id) {
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
        inner.ids.insert(id, now);
        inner.order.push_back((now, id));
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
        let id = |n: u128| Ulid::from(n);
        assert!(c.insert(id(100)));
        assert!(!c.insert(id(100)));
        tokio::time::advance(Duration::from_secs(599)).await;
        assert!(c.contains(&id(100)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!c.contains(&id(100)));
        for n in [1, 2, 3, 4] {
            c.insert(id(n));
        }
        assert_eq!(c.len(), 3);
        assert!(!c.contains(&id(1)), "oldest evicted first");
        assert!(c.contains(&id(4)));
    }
}
