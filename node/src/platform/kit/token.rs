//! One source for a platform's expiring access token ([`TokenSource`]): cached,
//! refreshed before it expires or when the platform refuses it, fetched once at a
//! time however many callers want it.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// A token just fetched: its value and how long the platform says it lives.
#[derive(Debug, Clone)]
pub(crate) struct Fresh {
    /// The token.
    pub(crate) value: String,
    /// Its lifetime in seconds, as the platform gave it (0 when it gave none).
    pub(crate) expires_in_secs: u64,
}

/// The cached token and when to fetch the next one.
#[derive(Debug, Clone)]
struct Cached {
    /// The token.
    value: String,
    /// Five minutes before it expires (halfway, for lives under ten minutes).
    refresh_at: Instant,
}

/// An expiring access token, fetched on demand and shared.
#[derive(Debug, Default)]
pub(crate) struct TokenSource {
    /// The token, if one was fetched. An async lock: concurrent callers wait for the
    /// one fetch under way and share its result.
    slot: tokio::sync::Mutex<Option<Cached>>,
}

impl TokenSource {
    /// A source with no token yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A valid token: the cached one, or one from `fetch` when it is near expiry or
    /// equals `rejected` (the one the platform just refused). A failed fetch leaves
    /// the cache as it was and is the caller's error.
    pub(crate) async fn get<E, Fut>(
        &self,
        rejected: Option<&str>,
        fetch: impl FnOnce() -> Fut,
    ) -> Result<String, E>
    where
        Fut: Future<Output = Result<Fresh, E>>,
    {
        let mut slot = self.slot.lock().await;
        if let Some(t) = slot.as_ref() {
            if Instant::now() < t.refresh_at && rejected != Some(t.value.as_str()) {
                return Ok(t.value.clone());
            }
        }
        let fresh = fetch().await?;
        let expire = fresh.expires_in_secs;
        // Refresh five minutes early (or halfway, for short lives).
        let early = (expire / 2).min(300);
        *slot = Some(Cached {
            value: fresh.value.clone(),
            refresh_at: Instant::now() + Duration::from_secs(expire.saturating_sub(early)),
        });
        Ok(fresh.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    async fn get(src: &TokenSource, n: &AtomicU32, rejected: Option<&str>) -> String {
        src.get(rejected, || async {
            let i = n.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ()>(Fresh {
                value: format!("t{i}"),
                expires_in_secs: 7200,
            })
        })
        .await
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn cached_until_five_minutes_before_expiry_or_refused() {
        let (src, n) = (TokenSource::new(), AtomicU32::new(0));
        assert_eq!(get(&src, &n, None).await, "t0");
        tokio::time::advance(Duration::from_secs(7200 - 301)).await;
        assert_eq!(get(&src, &n, None).await, "t0", "still cached");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(get(&src, &n, None).await, "t1", "refreshed early");
        assert_eq!(get(&src, &n, Some("t0")).await, "t1", "an old refusal");
        assert_eq!(
            get(&src, &n, Some("t1")).await,
            "t2",
            "refused: fetched anew"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_fetch_keeps_nothing() {
        let src = TokenSource::new();
        let got: Result<String, &str> = src.get(None, || async { Err("down") }).await;
        assert_eq!(got, Err("down"));
        let n = AtomicU32::new(5);
        assert_eq!(get(&src, &n, None).await, "t5");
    }
}
