//! `RateLimiter`: a token bucket per verified sender, so one flooding peer is pushed
//! back with 429 while the others go on.

use parking_lot::Mutex;
use std::collections::HashMap;

use tokio::time::Instant;

use crate::config::pacing::TokenBucket;

/// A token bucket per verified sender.
pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, TokenBucket>>,
}

impl RateLimiter {
    /// `per_second` sustained, bursts up to twice that.
    pub fn new(per_second: u32) -> Self {
        RateLimiter {
            per_second: per_second as f64,
            burst: (per_second * 2) as f64,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `who`, if there is one.
    pub fn allow(&self, who: &str) -> bool {
        let now = Instant::now();
        let mut b = self.buckets.lock();
        b.entry(who.to_string())
            .or_insert_with(|| TokenBucket::full(self.per_second, self.burst, now))
            .take(now)
            .is_ok()
    }

    /// How many senders have a bucket (for metrics and soak checks).
    pub fn buckets(&self) -> usize {
        self.buckets.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn limiter_refills() {
        let l = RateLimiter::new(2);
        assert!((0..4).all(|_| l.allow("A")));
        assert!(!l.allow("A"));
        assert!(l.allow("B"), "buckets are per sender");
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(l.allow("A"));
        assert!(!l.allow("A"));
    }
}
