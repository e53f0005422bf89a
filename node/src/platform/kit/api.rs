//! One retry loop for platform API calls ([`run`]).
//!
//! The adapter makes one attempt and says what its platform's answer means
//! ([`Classify`]); the loop counts attempts, waits [`ApiRetry`]'s backoff (the one in
//! [`crate::config::pacing`]) or the server's own wait between them, logs each retry
//! and gives up with [`ApiError`], which the adapter maps to its own error (its
//! [`GaveUp`] variant when the attempts ran out). [`RatePause`] holds every call of a
//! client back while a 429's wait lasts.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::pacing::ApiRetry;

/// What one attempt's answer means, as the adapter reads its platform.
#[derive(Debug)]
pub(crate) enum Classify<T, E> {
    /// The call succeeded with this value.
    Ok(T),
    /// Worth another attempt (a 5xx, a rate limit, a broken connection): after the
    /// server's wait when it named one (never sooner; a wait longer than
    /// [`ApiRetry::max`] gives up), else after the backoff. Spends an attempt.
    RetryAfter(Option<Duration>, E),
    /// Another attempt cannot succeed (a refused request, a malformed answer).
    GiveUp(E),
    /// Try again at once without spending an attempt: the adapter has already dealt
    /// with the cause (refreshed a token the platform called invalid, waited out a
    /// rate limit it tracks itself). The adapter bounds how often it says this.
    Again,
}

/// Why a call failed for good: its last error, and whether that was because retries
/// ran out (else the last error was one another attempt could not fix).
#[derive(Debug, thiserror::Error)]
#[error("gave up after {attempts} attempts; last error: {last}")]
pub(crate) struct ApiError<E: Display> {
    /// Attempts made (those [`Classify::Again`] did not spend are not counted).
    pub(crate) attempts: u32,
    /// The last attempt's error.
    pub(crate) last: E,
    /// Whether the attempts ran out (or the server asked for a longer wait than the
    /// policy allows) on an error worth retrying.
    pub(crate) exhausted: bool,
}

impl<E: Display> ApiError<E> {
    /// The adapter's own error: its give-up variant `gave_up` around [`GaveUp`] when
    /// the attempts ran out, else the last error as it was.
    pub(crate) fn into_error(self, gave_up: impl FnOnce(GaveUp<E>) -> E) -> E {
        if self.exhausted {
            gave_up(GaveUp {
                attempts: self.attempts,
                last: Box::new(self.last),
            })
        } else {
            self.last
        }
    }
}

/// Retries ran out: the attempts made and the last one's error. The give-up variant
/// of every adapter's own API error (`GaveUp(GaveUp<Self>)`, shown as it is), so its
/// fields and words are written once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gave up after {attempts} attempts; last error: {last}")]
pub struct GaveUp<E: Display> {
    /// Attempts made.
    pub attempts: u32,
    /// The last attempt's error.
    pub last: Box<E>,
}

/// A 429's pause over every call of one client: once the platform has said how long
/// to wait (Telegram's `retry_after`, Matrix's `retry_after_ms`), every attempt of
/// every call waits it out, not only the call that met it.
#[derive(Debug, Default)]
pub(crate) struct RatePause(Mutex<Option<Instant>>);

impl RatePause {
    /// Holds every call back until `wait` from now (a pause that ends later stands).
    pub(crate) fn extend(&self, wait: Duration) {
        let until = Instant::now() + wait;
        let mut p = self.0.lock();
        *p = Some(p.map_or(until, |t| t.max(until)));
    }

    /// When the pause ends, if one was set.
    pub(crate) fn until(&self) -> Option<Instant> {
        *self.0.lock()
    }

    /// Waits until the pause ends, if it has not; logged with the call's names.
    pub(crate) async fn wait(&self, call: Call<'_>) {
        let pause = self
            .until()
            .map(|t| t.saturating_duration_since(Instant::now()))
            .unwrap_or_default();
        if !pause.is_zero() {
            tracing::debug!(
                platform = call.platform,
                what = call.what,
                wait_ms = pause.as_millis() as u64,
                "{} rate limit: waiting out the last 429",
                call.platform
            );
            tokio::time::sleep(pause).await;
        }
    }
}

/// What a retry's log line names: `"{platform} {noun} failed; retrying"`, with `what`
/// (a route, an endpoint) as a field when given.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    /// The platform, as in peers.toml (`feishu`, `discord`, ...).
    pub(crate) platform: &'static str,
    /// What kind of call this is, in the log line's words (`API call`, `request`).
    pub(crate) noun: &'static str,
    /// Which call, when the adapter names one.
    pub(crate) what: Option<&'a str>,
}

/// Runs `attempt` until the adapter's [`Classify`] says it succeeded or it is to give
/// up, or `policy.attempts` attempts are spent; waits between attempts as
/// [`Classify::RetryAfter`] says.
pub(crate) async fn run<T, E, F, Fut>(
    policy: &ApiRetry,
    call: Call<'_>,
    mut attempt: F,
) -> Result<T, ApiError<E>>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Classify<T, E>>,
{
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (last, hint) = match attempt().await {
            Classify::Ok(v) => return Ok(v),
            Classify::Again => {
                attempts -= 1;
                continue;
            }
            Classify::GiveUp(last) => {
                return Err(ApiError {
                    attempts,
                    last,
                    exhausted: false,
                })
            }
            Classify::RetryAfter(hint, last) => (last, hint),
        };
        let too_long = hint.is_some_and(|h| h > policy.max);
        if attempts >= policy.attempts || too_long {
            if too_long {
                tracing::warn!(
                    platform = call.platform,
                    what = call.what,
                    wait_ms = hint.unwrap_or_default().as_millis() as u64,
                    max_ms = policy.max.as_millis() as u64,
                    error = %last,
                    "the server asks for a longer wait than the retry policy allows; giving up"
                );
            }
            return Err(ApiError {
                attempts,
                last,
                exhausted: true,
            });
        }
        let wait = policy.delay(attempts, hint);
        tracing::warn!(
            platform = call.platform,
            what = call.what,
            attempt = attempts,
            wait_ms = wait.as_millis() as u64,
            error = %last,
            "{} {} failed; retrying",
            call.platform,
            call.noun
        );
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const CALL: Call<'static> = Call {
        platform: "test",
        noun: "call",
        what: None,
    };

    fn policy(attempts: u32) -> ApiRetry {
        ApiRetry {
            attempts,
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_every_call_back_and_a_shorter_one_does_not_cut_it() {
        let p = RatePause::default();
        let start = Instant::now();
        p.wait(CALL).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "no pause, no wait");
        p.extend(Duration::from_secs(3));
        p.extend(Duration::from_secs(1));
        assert_eq!(
            p.until(),
            Some(start + Duration::from_secs(3)),
            "the longer pause stands"
        );
        p.wait(CALL).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        p.wait(CALL).await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(3),
            "a pause that has ended holds nothing back"
        );
    }

    #[test]
    fn a_give_up_becomes_the_adapters_variant_only_when_attempts_ran_out() {
        #[derive(Debug, thiserror::Error)]
        enum E {
            #[error("refused")]
            Refused,
            #[error(transparent)]
            GaveUp(GaveUp<E>),
        }
        let ran_out = ApiError {
            attempts: 3,
            last: E::Refused,
            exhausted: true,
        };
        let e = ran_out.into_error(E::GaveUp);
        assert_eq!(
            e.to_string(),
            "gave up after 3 attempts; last error: refused"
        );
        assert!(matches!(e, E::GaveUp(GaveUp { attempts: 3, .. })));
        let refused = ApiError {
            attempts: 1,
            last: E::Refused,
            exhausted: false,
        };
        assert!(matches!(refused.into_error(E::GaveUp), E::Refused));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_until_ok_and_counts_attempts() {
        let n = AtomicU32::new(0);
        let n = &n;
        let got: Result<u32, ApiError<String>> = run(&policy(5), CALL, || async move {
            match n.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Classify::RetryAfter(None, "busy".to_string()),
                i => Classify::Ok(i),
            }
        })
        .await;
        assert_eq!(got.unwrap(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_when_attempts_are_spent_and_again_spends_none() {
        let n = AtomicU32::new(0);
        let n = &n;
        let got: Result<(), ApiError<String>> = run(&policy(3), CALL, || async move {
            match n.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Classify::Again,
                _ => Classify::RetryAfter(None, "down".to_string()),
            }
        })
        .await;
        let e = got.unwrap_err();
        assert_eq!((e.attempts, e.exhausted), (3, true));
        assert_eq!(
            n.load(Ordering::SeqCst),
            5,
            "two free tries and three spent"
        );
        assert_eq!(e.to_string(), "gave up after 3 attempts; last error: down");
    }

    #[tokio::test(start_paused = true)]
    async fn give_up_stops_at_once() {
        let got: Result<(), ApiError<&str>> =
            run(&policy(5), CALL, || async { Classify::GiveUp("refused") }).await;
        let e = got.unwrap_err();
        assert_eq!((e.attempts, e.exhausted, e.last), (1, false, "refused"));
    }

    #[tokio::test(start_paused = true)]
    async fn waits_the_servers_wait_never_sooner() {
        let start = tokio::time::Instant::now();
        let n = AtomicU32::new(0);
        let n = &n;
        let got: Result<(), ApiError<&str>> = run(&policy(5), CALL, || async move {
            match n.fetch_add(1, Ordering::SeqCst) {
                0 => Classify::RetryAfter(Some(Duration::from_millis(1500)), "slow down"),
                _ => Classify::Ok(()),
            }
        })
        .await;
        got.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_beyond_the_policy_gives_up_rather_than_retry_sooner() {
        let start = tokio::time::Instant::now();
        let got: Result<(), ApiError<&str>> = run(&policy(5), CALL, || async {
            Classify::RetryAfter(Some(Duration::from_secs(60)), "come back in a minute")
        })
        .await;
        let e = got.unwrap_err();
        assert_eq!((e.attempts, e.exhausted), (1, true));
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
