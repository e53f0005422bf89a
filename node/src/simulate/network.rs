//! The scenario's network as the real outboxes see it.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::Rng;

use super::*;

/// What an envelope on the network is, for its drop rate (`human_drop`, `drop`,
/// `claim_drop`, or a link's override).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Carry {
    /// A person's message reaching a bot.
    Human,
    /// A bot's message.
    Message,
    /// A claim, its withdrawal, or a verdict.
    Claim,
}

/// The scenario's network as the outboxes see it: one delivery task per link, one
/// envelope at a time and in order; a dropped attempt is retried after the outbox's
/// backoff. Shared by the baselines' event loop and the botmesh runner.
#[derive(Default)]
pub(super) struct Network {
    /// (sender, receiver) → when that outbox's delivery task is free again.
    link_free: HashMap<(String, String), u64>,
}

impl Network {
    /// Delay until one envelope from `from` to `to`, queued at `now`, is delivered,
    /// and the network delay of the answer that acknowledges it.
    ///
    /// As the real outbox does (`egress::outbox::Outbox::run`): one delivery task per
    /// peer, one envelope at a time and in order, so an envelope waits for the ones
    /// queued before it (until their answer comes back, one more network delay). A
    /// "dropped" attempt fails: the sender learns it after a round trip and retries
    /// after `RetryPolicy::backoff` (exponential from `retry_base_ms`, capped at
    /// `retry_max_ms`, jitter in [d/2, d]), drawing loss and delay afresh. Nothing
    /// accepted is lost: a drop makes an envelope late, never absent.
    pub(super) fn delay(
        &mut self,
        w: &World,
        rng: &mut StdRng,
        now: u64,
        from: &str,
        to: &str,
        carry: Carry,
    ) -> (u64, u64) {
        let t = &w.scenario.timing;
        let l = w
            .scenario
            .links
            .iter()
            .rev()
            .find(|l| (l.from == "*" || l.from == from) && (l.to == "*" || l.to == to));
        let p = match carry {
            Carry::Human => l.and_then(|l| l.drop).unwrap_or(t.human_drop),
            Carry::Message => l.and_then(|l| l.drop).unwrap_or(t.drop),
            Carry::Claim => l.and_then(|l| l.claim_drop).unwrap_or(t.claim_drop),
        };
        let dist = l.and_then(|l| l.delay.as_ref()).unwrap_or(&t.network);
        let key = (from.to_string(), to.to_string());
        let mut at = now.max(self.link_free.get(&key).copied().unwrap_or(0));
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let lost = p > 0.0 && rng.gen_bool(p.min(1.0));
            let d = dist.sample(rng);
            if !lost {
                self.link_free.insert(key, at + 2 * d);
                return (at + d - now, d);
            }
            let exp = w
                .mesh
                .retry_base_ms
                .saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
            let b = exp.min(w.mesh.retry_max_ms);
            at += 2 * d + b / 2 + rng.gen_range(0..=b / 2);
        }
    }
}
