//! Pacing: how long to wait before trying again ([`Backoff`], and [`ApiRetry`] on it
//! for the platform API clients) and how fast to go ([`TokenBucket`]). Every retrying path (the outbox, the Feishu client, the LLM
//! client, the Redis stream reader) and every rate-limited one (admission per sender,
//! Feishu sends per chat) shares these two, so there is one schedule to read and test.
//! They sit in `config`, below every layer that uses them.

use std::ops::RangeInclusive;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// A capped exponential retry schedule: `base` before the first retry, doubling per
/// attempt, never more than `max` (jitter included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The delay before retry number 1.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

/// How a [`Backoff`] delay is spread, so that many retrying senders do not move in
/// lockstep.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Jitter {
    /// Exactly the nominal delay.
    None,
    /// The nominal delay times a factor drawn uniformly from the range (still capped
    /// at `max`).
    Scale(RangeInclusive<f64>),
}

impl Backoff {
    /// A schedule from `base` doubling up to `max`.
    pub(crate) const fn new(base: Duration, max: Duration) -> Self {
        Backoff { base, max }
    }

    /// The delay before retry number `attempt` (1-based; 0 counts as 1) without
    /// jitter: `base · 2^(attempt-1)`, capped at `max`.
    pub(crate) fn nominal(&self, attempt: u32) -> Duration {
        self.base
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
            .min(self.max)
    }

    /// The delay before retry number `attempt`, spread by `jitter`, capped at `max`.
    pub(crate) fn delay(&self, attempt: u32, jitter: Jitter) -> Duration {
        let nominal = self.nominal(attempt);
        match jitter {
            Jitter::None => nominal,
            Jitter::Scale(range) => nominal
                .mul_f64(rand::thread_rng().gen_range(range))
                .min(self.max),
        }
    }
}

/// How a platform API client (Feishu, Discord, DingTalk: `platform::kit::api`) retries
/// a request that failed for a reason other than a rate limit it waits out: at most
/// `attempts` tries, waiting the server's hint when it gave one, else [`Backoff`] from
/// `base` up to `max` with up to 20 % added jitter.
#[derive(Debug, Clone, Copy)]
pub struct ApiRetry {
    /// Attempts at most.
    pub attempts: u32,
    /// First delay; doubles each attempt.
    pub base: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl Default for ApiRetry {
    fn default() -> Self {
        ApiRetry {
            attempts: 6,
            base: Duration::from_millis(250),
            max: Duration::from_secs(8),
        }
    }
}

impl ApiRetry {
    /// The wait before retry number `attempt`: the server's hint if it gave one (never
    /// more than `max`), else the backoff.
    pub(crate) fn delay(&self, attempt: u32, hint: Option<Duration>) -> Duration {
        hint.map(|h| h.min(self.max)).unwrap_or_else(|| {
            Backoff::new(self.base, self.max).delay(attempt, Jitter::Scale(1.0..=1.2))
        })
    }
}

/// A token bucket: `rate` tokens a second, holding at most `burst`; starts full.
/// Callers that pace many keys (senders, chats) keep one per key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub(crate) fn full(rate: f64, burst: f64, now: Instant) -> Self {
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Whether the bucket has refilled completely by `now` (it is then the same as a
    /// new one: a caller keeping many may drop it).
    pub(crate) fn is_full(&self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens + elapsed * self.rate >= self.burst
    }

    /// Takes one token at `now` if there is one; otherwise says how long until there
    /// will be.
    pub(crate) fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// A sliding window: at most `per_window` events in any `window`. Where a platform
/// counts per minute (DingTalk: 20 a minute per group) a [`TokenBucket`] would not do:
/// a bucket of 20 refilling at 20 a minute lets a full burst be followed by another
/// 19 within the same minute.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    /// Events allowed in any window.
    per_window: usize,
    /// The window's length.
    window: Duration,
    /// When the events still inside the window happened, oldest first.
    sent: std::collections::VecDeque<Instant>,
}

impl Window {
    /// An empty window allowing `per_window` (at least one) events per `window`.
    pub(crate) fn new(per_window: usize, window: Duration) -> Self {
        Window {
            per_window: per_window.max(1),
            window,
            sent: std::collections::VecDeque::new(),
        }
    }

    /// Counts one event at `now` if the window has room; otherwise says how long
    /// until it will (when the oldest event leaves it).
    pub(crate) fn take(&mut self, now: Instant) -> Result<(), Duration> {
        while self
            .sent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.window)
        {
            self.sent.pop_front();
        }
        if self.sent.len() < self.per_window {
            self.sent.push_back(now);
            return Ok(());
        }
        let oldest = *self.sent.front().expect("a full window");
        Err((oldest + self.window).saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(b.nominal(0), Duration::from_millis(100));
        assert_eq!(b.nominal(1), Duration::from_millis(100));
        assert_eq!(b.nominal(3), Duration::from_millis(400));
        assert_eq!(b.nominal(u32::MAX), Duration::from_secs(1));
        assert_eq!(b.delay(2, Jitter::None), Duration::from_millis(200));
        for _ in 0..50 {
            let d = b.delay(2, Jitter::Scale(0.5..=1.0));
            assert!(d >= Duration::from_millis(100) && d <= Duration::from_millis(200));
            assert!(b.delay(30, Jitter::Scale(1.0..=1.5)) <= Duration::from_secs(1));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_bursts_then_paces() {
        let mut b = TokenBucket::full(2.0, 2.0, Instant::now());
        assert!(b.take(Instant::now()).is_ok());
        assert!(b.take(Instant::now()).is_ok());
        assert_eq!(b.take(Instant::now()), Err(Duration::from_millis(500)));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(b.take(Instant::now()).is_ok());
        assert!(!b.is_full(Instant::now()));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!b.is_full(Instant::now()));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(b.is_full(Instant::now()));
    }
}
