//! The shared judge's verdicts a node has heard (`[mesh] judge = "shared"`), by
//! trigger, for the turns waiting on them: what `Brain` keeps; `turn::shared` sends,
//! checks and waits for them.

use std::collections::{BTreeMap, VecDeque};

use parking_lot::Mutex;
use ulid::Ulid;

use crate::wire::envelope::BotVerdict;
use crate::wire::ids::IdMap;

/// Verdicts kept at most; the oldest go first (a verdict matters for seconds).
const KEPT: usize = 4096;

/// A verdict heard (or made here) about one trigger.
#[derive(Debug, Clone)]
pub(crate) struct Heard {
    /// The bot that asked the LLM and signed it.
    pub from: String,
    /// Each bot's entry; empty when the shared call failed.
    pub entries: BTreeMap<String, BotVerdict>,
}

/// Verdicts kept per trigger at most (one is expected: the chosen bot's).
const PER_TRIGGER: usize = 4;

/// Verdicts by trigger (each signer's first), with the triggers' arrival order.
type Heards = (IdMap<Vec<Heard>>, VecDeque<Ulid>);

/// The shared verdicts a node has heard, by trigger, for the turns waiting on them.
#[derive(Default)]
pub(crate) struct Verdicts {
    /// By trigger, with the order for eviction.
    inner: Mutex<Heards>,
    /// Wakes the turns waiting for a verdict.
    arrived: tokio::sync::Notify,
}

impl Verdicts {
    /// Keeps the verdict `from` sent about `trigger` (its first one) and wakes the
    /// waiting turns. Whether `from` was the bot chosen for it is checked where it is
    /// used, when the message itself is known.
    pub(crate) fn put(&self, trigger: Ulid, from: &str, entries: BTreeMap<String, BotVerdict>) {
        {
            let mut g = self.inner.lock();
            let (map, order) = &mut *g;
            let heard = map.entry(trigger).or_insert_with(|| {
                order.push_back(trigger);
                Vec::new()
            });
            if heard.len() >= PER_TRIGGER || heard.iter().any(|h| h.from == from) {
                return;
            }
            heard.push(Heard {
                from: from.to_string(),
                entries,
            });
            while order.len() > KEPT {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
        self.arrived.notify_waiters();
    }

    /// The verdict `from` sent about `trigger`, if it was heard.
    pub(crate) fn get(&self, trigger: &Ulid, from: &str) -> Option<Heard> {
        self.inner
            .lock()
            .0
            .get(trigger)
            .and_then(|v| v.iter().find(|h| h.from == from).cloned())
    }

    /// Bots other than `from` that sent a verdict about `trigger` (not chosen for it).
    pub(crate) fn others(&self, trigger: &Ulid, from: &str) -> Vec<String> {
        self.inner.lock().0.get(trigger).map_or(Vec::new(), |v| {
            v.iter()
                .filter(|h| h.from != from)
                .map(|h| h.from.clone())
                .collect()
        })
    }

    /// Waits until `from`'s verdict about `trigger` is heard, or `until`.
    pub(crate) async fn wait(
        &self,
        trigger: &Ulid,
        from: &str,
        until: tokio::time::Instant,
    ) -> Option<Heard> {
        loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(h) = self.get(trigger, from) {
                return Some(h);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until) => return self.get(trigger, from),
            }
        }
    }
}
