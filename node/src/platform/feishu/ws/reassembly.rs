//! A data payload sent in fragments (`sum` above 1), put back together by
//! `message_id`, bounded in count, size and age.

use std::collections::HashMap;

use tokio::time::Instant;

use super::{FRAGMENT_TTL, MAX_FRAGMENTS, MAX_PARTIAL_PAYLOADS};

struct Partial {
    parts: Vec<Option<Vec<u8>>>,
    started: Instant,
}

/// Fragments of payloads by `message_id`, until every `seq` of `sum` has come.
/// Bounded in payloads, fragments and age: whatever is dropped was never
/// acknowledged, so Feishu sends it again.
#[derive(Default)]
pub struct Reassembly {
    partial: HashMap<String, Partial>,
}

impl Reassembly {
    /// Adds fragment `seq` of `sum`; returns the whole payload once complete.
    pub fn add(
        &mut self,
        message_id: &str,
        sum: usize,
        seq: usize,
        data: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let now = Instant::now();
        self.partial
            .retain(|_, p| now.duration_since(p.started) < FRAGMENT_TTL);
        if sum <= 1 {
            return Some(data);
        }
        if sum > MAX_FRAGMENTS || seq >= sum {
            tracing::warn!(
                message_id,
                sum,
                seq,
                "feishu fragment out of range; dropped"
            );
            return None;
        }
        if !self.partial.contains_key(message_id) && self.partial.len() >= MAX_PARTIAL_PAYLOADS {
            tracing::warn!(
                message_id,
                "too many feishu payloads being reassembled; fragment dropped"
            );
            return None;
        }
        let p = self
            .partial
            .entry(message_id.to_string())
            .or_insert_with(|| Partial {
                parts: vec![None; sum],
                started: now,
            });
        if p.parts.len() != sum {
            tracing::warn!(
                message_id,
                sum,
                "feishu fragments disagree on their count; restarting"
            );
            *p = Partial {
                parts: vec![None; sum],
                started: now,
            };
        }
        p.parts[seq] = Some(data);
        if p.parts.iter().any(Option::is_none) {
            return None;
        }
        let p = self.partial.remove(message_id)?;
        Some(p.parts.into_iter().flatten().flatten().collect())
    }

    /// Payloads waiting for fragments.
    pub fn len(&self) -> usize {
        self.partial.len()
    }

    /// True when nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.partial.is_empty()
    }
}
