//! `RateLimiter`: a token bucket per verified sender, so one flooding peer is pushed
//! back with 429 while the others go on.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A token bucket per verified sender.
pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
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
        let mut b = self.buckets.lock().expect("limiter lock");
        let (tokens, at) = b.entry(who.to_string()).or_insert((self.burst, now));
        let elapsed = now
            .duration_since(*at)
            .min(Duration::from_secs(60))
            .as_secs_f64();
        *tokens = (*tokens + elapsed * self.per_second).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How many senders have a bucket (for metrics and soak checks).
    pub fn buckets(&self) -> usize {
        self.buckets.lock().expect("limiter lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
