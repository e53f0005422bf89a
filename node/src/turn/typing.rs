//! The platform's typing signal while a bot writes its reply: sent at once when the
//! writing starts (the bot has its turn), then again every `typing_every` (Discord's
//! fades after about 10 s), and no more once the writing ends — the reply is posted
//! next, or the turn ends without one. A coding agent's turn can take minutes; the
//! signal is how the chat sees that it is at work (the page shows its progress too).
//!
//! The signal never holds the work up: a slow or failing signal request is dropped
//! when the work ends, and the next one waits for its tick.

use std::future::Future;
use std::time::Duration;

use tokio::time::MissedTickBehavior;

use crate::turn::Ports;

/// Runs `work` with `p`'s typing signal on in `group` (see the module docs).
pub(crate) async fn typing_while<P: Ports + ?Sized, T>(
    p: &P,
    group: &str,
    work: impl Future<Output = T>,
) -> T {
    while_typing(p.typing_every(), || p.typing(group), work).await
}

/// Runs `work`, calling `send` at once and then every `every` until `work` ends
/// (`None`: `work` alone, nothing sent). A `send` still in flight when `work` ends is
/// dropped; one that takes longer than `every` delays the next, never the work.
pub(crate) async fn while_typing<T, S, F>(
    every: Option<Duration>,
    mut send: S,
    work: impl Future<Output = T>,
) -> T
where
    S: FnMut() -> F,
    F: Future<Output = ()>,
{
    let Some(every) = every.filter(|e| !e.is_zero()) else {
        return work.await;
    };
    let signal = async {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            send().await;
        }
    };
    tokio::pin!(work);
    tokio::pin!(signal);
    tokio::select! {
        biased;
        out = &mut work => out,
        _ = &mut signal => unreachable!("the signal goes on until the work ends"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use tokio::time::Instant;

    /// A signal that counts its sends and records when each one started.
    fn counter() -> (Arc<AtomicU32>, Arc<parking_lot::Mutex<Vec<Duration>>>) {
        (
            Arc::new(AtomicU32::new(0)),
            Arc::new(parking_lot::Mutex::new(Vec::new())),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn sent_at_once_then_every_period_while_the_work_goes_on_and_never_after() {
        let (sent, at) = counter();
        let start = Instant::now();
        let send = || {
            sent.fetch_add(1, Ordering::SeqCst);
            at.lock().push(start.elapsed());
            async {}
        };
        let out = while_typing(
            Some(Duration::from_secs(8)),
            send,
            tokio::time::sleep(Duration::from_secs(25)),
        )
        .await;
        let () = out;
        assert_eq!(
            *at.lock(),
            [0, 8, 16, 24].map(Duration::from_secs).to_vec(),
            "at once, then every 8 s while the 25 s of work go on"
        );
        // The work is done: time goes on, nothing more is sent.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(sent.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_is_ready_at_once_sends_nothing_and_no_period_sends_nothing() {
        let (sent, _) = counter();
        let send = || {
            sent.fetch_add(1, Ordering::SeqCst);
            async {}
        };
        assert_eq!(
            while_typing(Some(Duration::from_secs(8)), send, async { 7 }).await,
            7
        );
        assert_eq!(sent.load(Ordering::SeqCst), 0, "nothing to wait for");
        let send = || {
            sent.fetch_add(1, Ordering::SeqCst);
            async {}
        };
        while_typing(None, send, tokio::time::sleep(Duration::from_secs(30))).await;
        assert_eq!(sent.load(Ordering::SeqCst), 0, "a platform with no signal");
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_that_hangs_never_holds_the_work_up() {
        let (sent, _) = counter();
        let send = || {
            sent.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(60))
        };
        let start = Instant::now();
        while_typing(
            Some(Duration::from_secs(8)),
            send,
            tokio::time::sleep(Duration::from_secs(3)),
        )
        .await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(3),
            "the work's own time"
        );
        assert_eq!(
            sent.load(Ordering::SeqCst),
            1,
            "the first send was in flight"
        );
        // A hanging send delays the next one (no pile-up of requests).
        let (sent, at) = counter();
        let start = Instant::now();
        let send = || {
            sent.fetch_add(1, Ordering::SeqCst);
            at.lock().push(start.elapsed());
            tokio::time::sleep(Duration::from_secs(12))
        };
        while_typing(
            Some(Duration::from_secs(8)),
            send,
            tokio::time::sleep(Duration::from_secs(30)),
        )
        .await;
        assert_eq!(
            *at.lock(),
            [0, 12, 24].map(Duration::from_secs).to_vec(),
            "each send starts when the one before ended, as the ticks come due"
        );
    }
}
