//! `RateLimiter`: a token bucket per sender and source address, so one flooding peer
//! is pushed back with 429 while the others go on. It is charged before the sender's
//! signature is checked (see [`crate::ingress::bridge`]), so the budget is kept per
//! source address too: a forger who names a peer as the sender spends the budget of
//! its own address, never the peer's.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;

use tokio::time::Instant;

use crate::config::pacing::TokenBucket;

/// Above this many buckets, the ones that have refilled completely (idle senders and
/// addresses) are dropped: a full bucket is what a new one would be, so nothing is
/// forgotten but memory, and a forger spraying source addresses cannot grow the table
/// without bound.
const PRUNE_ABOVE: usize = 4096;

/// A token bucket per (sender, source address).
pub(crate) struct RateLimiter {
    per_second: f64,
    burst: f64,
    /// Source address → sender → bucket (two levels so that a lookup needs no copy of
    /// the sender's name: the limiter is charged for every envelope).
    buckets: Mutex<Buckets>,
}

/// The buckets and how many there are.
#[derive(Default)]
struct Buckets {
    by_source: HashMap<IpAddr, HashMap<String, TokenBucket>>,
    count: usize,
}

impl RateLimiter {
    /// `per_second` sustained, bursts up to twice that.
    pub(crate) fn new(per_second: u32) -> Self {
        RateLimiter {
            per_second: per_second as f64,
            burst: (per_second * 2) as f64,
            buckets: Mutex::new(Buckets::default()),
        }
    }

    /// Takes one token for `who` sending from `source`, if there is one.
    pub(crate) fn allow(&self, who: &str, source: IpAddr) -> bool {
        let now = Instant::now();
        let mut b = self.buckets.lock();
        if b.count >= PRUNE_ABOVE {
            let mut count = 0;
            b.by_source.retain(|_, senders| {
                senders.retain(|_, bucket| !bucket.is_full(now));
                count += senders.len();
                !senders.is_empty()
            });
            b.count = count;
        }
        let Buckets { by_source, count } = &mut *b;
        let senders = by_source.entry(source).or_default();
        if let Some(bucket) = senders.get_mut(who) {
            return bucket.take(now).is_ok();
        }
        *count += 1;
        senders
            .entry(who.to_string())
            .or_insert_with(|| TokenBucket::full(self.per_second, self.burst, now))
            .take(now)
            .is_ok()
    }

    /// How many buckets there are (for metrics and soak checks).
    pub(crate) fn buckets(&self) -> usize {
        self.buckets.lock().count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
    const THERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

    #[tokio::test(start_paused = true)]
    async fn limiter_refills() {
        let l = RateLimiter::new(2);
        assert!((0..4).all(|_| l.allow("A", HERE)));
        assert!(!l.allow("A", HERE));
        assert!(l.allow("B", HERE), "buckets are per sender");
        assert!(
            l.allow("A", THERE),
            "and per source: a forger naming A elsewhere does not spend A's budget"
        );
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(l.allow("A", HERE));
        assert!(!l.allow("A", HERE));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_buckets_are_dropped_when_the_table_is_large() {
        let l = RateLimiter::new(10);
        for i in 0..PRUNE_ABOVE as u32 {
            assert!(l.allow("A", IpAddr::V4(std::net::Ipv4Addr::from(i))));
        }
        // A busy sender keeps its state across the pruning; the idle ones go.
        assert!((0..20).all(|_| l.allow("B", HERE)));
        assert!(!l.allow("B", HERE));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(l.allow("B", HERE));
        assert!(l.buckets() <= 2, "{}", l.buckets());
        assert!(
            !(0..20).all(|_| l.allow("B", HERE)),
            "B's bucket was kept, not renewed"
        );
    }
}
