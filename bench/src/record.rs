//! Send and arrival timestamps of one measured phase, and the tags that link them.
//!
//! Every payload's text starts with a tag `bmPPP-SSSSSSS` (phase, sequence number), so
//! an arrival seen on any receiver — an SSE stream of a node, a Redis subscription —
//! is matched to its send time without any shared state but this table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Send and arrival times of one phase: `messages` payloads to `receivers` receivers.
pub struct PhaseTable {
    /// Time zero of the phase.
    pub base: Instant,
    /// Per message: nanoseconds since `base` + 1 when sent (0 = not sent).
    sent: Vec<AtomicU64>,
    /// Per receiver, per message: nanoseconds since `base` + 1 when it arrived.
    arrived: Vec<Vec<AtomicU64>>,
    /// Arrivals recorded (first arrival of each message at each receiver).
    count: AtomicUsize,
}

impl PhaseTable {
    /// An empty table.
    pub fn new(messages: usize, receivers: usize) -> PhaseTable {
        let col = |n| (0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        PhaseTable {
            base: Instant::now(),
            sent: col(messages),
            arrived: (0..receivers).map(|_| col(messages)).collect(),
            count: AtomicUsize::new(0),
        }
    }

    /// Number of messages in the phase.
    pub fn messages(&self) -> usize {
        self.sent.len()
    }

    /// Number of receivers.
    pub fn receivers(&self) -> usize {
        self.arrived.len()
    }

    fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64 + 1
    }

    /// Records that message `seq` is being sent now.
    pub fn mark_sent(&self, seq: usize) {
        if let Some(s) = self.sent.get(seq) {
            s.store(self.stamp(Instant::now()), Ordering::Relaxed);
        }
    }

    /// Records that `receiver` got message `seq` at `at` (repeats are ignored).
    pub fn mark_arrived(&self, receiver: usize, seq: usize, at: Instant) {
        let Some(slot) = self.arrived.get(receiver).and_then(|r| r.get(seq)) else {
            return;
        };
        if slot
            .compare_exchange(0, self.stamp(at), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Arrivals so far.
    pub fn arrivals(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Waits until every message reached every receiver, or `deadline`. True if complete.
    pub async fn wait_complete(&self, deadline: Instant) -> bool {
        let want = self.messages() * self.receivers();
        while self.arrivals() < want {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    /// Per delivery (message × receiver) latencies in ns, send to arrival.
    pub fn delivery_latencies(&self) -> Vec<u64> {
        let mut v = Vec::new();
        for r in &self.arrived {
            for (seq, a) in r.iter().enumerate() {
                let (s, a) = (
                    self.sent[seq].load(Ordering::Relaxed),
                    a.load(Ordering::Relaxed),
                );
                if s > 0 && a > 0 {
                    v.push(a.saturating_sub(s));
                }
            }
        }
        v
    }

    /// Per message: the time until the last receiver had it (messages every receiver got).
    pub fn all_receivers_latencies(&self) -> Vec<u64> {
        (0..self.messages())
            .filter_map(|seq| {
                let s = self.sent[seq].load(Ordering::Relaxed);
                let last = self
                    .arrived
                    .iter()
                    .map(|r| r[seq].load(Ordering::Relaxed))
                    .try_fold(0u64, |m, a| (a > 0).then_some(m.max(a)))?;
                (s > 0).then(|| last.saturating_sub(s))
            })
            .collect()
    }

    /// From the first send to the last arrival (zero if nothing arrived).
    pub fn span(&self) -> Duration {
        let first = self
            .sent
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&s| s > 0)
            .min()
            .unwrap_or(0);
        let last = self
            .arrived
            .iter()
            .flatten()
            .map(|a| a.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        Duration::from_nanos(last.saturating_sub(first))
    }
}

/// The phases receivers may see, by phase number.
#[derive(Default)]
pub struct Recorder {
    phases: Mutex<HashMap<u32, Arc<PhaseTable>>>,
    /// Events an SSE subscriber reported as missed (`event: lagged`).
    pub lagged: AtomicU64,
}

impl Recorder {
    /// Makes `table` the destination of arrivals tagged with `phase`.
    pub fn register(&self, phase: u32, table: Arc<PhaseTable>) {
        self.phases.lock().expect("phases").insert(phase, table);
    }

    /// Records an arrival of tagged `text` (or a JSON document holding it) at `receiver`.
    pub fn arrived(&self, receiver: usize, payload: &[u8], at: Instant) {
        if let Some((phase, seq)) = find_tag(payload) {
            let t = self.phases.lock().expect("phases").get(&phase).cloned();
            if let Some(t) = t {
                t.mark_arrived(receiver, seq, at);
            }
        }
    }
}

/// The tag that starts the text of message `seq` of `phase`.
pub fn tag(phase: u32, seq: usize) -> String {
    format!("bm{phase:03}-{seq:07}")
}

/// Finds the first tag in `payload` (plain text, or JSON whose `text` starts with it).
pub fn find_tag(payload: &[u8]) -> Option<(u32, usize)> {
    let digits = |b: &[u8]| {
        b.iter().try_fold(0usize, |n, &d| {
            d.is_ascii_digit().then(|| n * 10 + (d - b'0') as usize)
        })
    };
    payload.windows(13).find_map(|w| {
        if &w[..2] != b"bm" || w[5] != b'-' {
            return None;
        }
        Some((digits(&w[2..5])? as u32, digits(&w[6..])?))
    })
}

/// A neutral, realistic ~`len`-byte chat text starting with the tag: no @mentions, no
/// words any bench bot could take as addressed to it.
pub fn text(phase: u32, seq: usize, len: usize) -> String {
    const FILLER: &str = "status update from the nightly batch: all jobs finished on time, \
        the numbers match yesterday within the usual margin, the queue is empty again and \
        nothing needs attention this morning; details are in the shared sheet as always. ";
    let mut s = tag(phase, seq);
    s.push(' ');
    while s.len() < len {
        s.push_str(FILLER);
    }
    let mut cut = len;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_in_text_and_json() {
        let t = text(7, 1234, 500);
        assert!(t.len() <= 500 && t.len() > 480);
        assert_eq!(find_tag(t.as_bytes()), Some((7, 1234)));
        let json = serde_json::json!({"type": "message", "envelope": {"id": "01J", "text": t}});
        assert_eq!(find_tag(json.to_string().as_bytes()), Some((7, 1234)));
        assert_eq!(find_tag(b"no tag here"), None);
    }

    #[test]
    fn latencies_and_completion() {
        let p = PhaseTable::new(2, 2);
        p.mark_sent(0);
        p.mark_sent(1);
        let now = Instant::now();
        p.mark_arrived(0, 0, now);
        p.mark_arrived(0, 0, now);
        p.mark_arrived(1, 0, now);
        p.mark_arrived(0, 1, now);
        assert_eq!(p.arrivals(), 3);
        assert_eq!(p.delivery_latencies().len(), 3);
        assert_eq!(p.all_receivers_latencies().len(), 1);
    }
}
