//! One per-chat pacer ([`ChatPacer`]): sends to one chat wait their turn, first come
//! first sent, under that chat's limit; other chats are not held up.
//!
//! The limit is one of [`crate::config::pacing`]'s: a [`TokenBucket`] (Feishu: five
//! sends a second per chat) or a sliding [`Window`] (DingTalk: twenty a minute per
//! group, a count a bucket would overrun).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::pacing::{TokenBucket, Window};

/// A rate limit a [`ChatPacer`] keeps for each chat.
pub(crate) trait Limit: Send + 'static {
    /// Counts one send at `now` if the limit allows it; otherwise says how long until
    /// it will.
    fn take(&mut self, now: Instant) -> Result<(), Duration>;
}

impl Limit for TokenBucket {
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        TokenBucket::take(self, now)
    }
}

impl Limit for Window {
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        Window::take(self, now)
    }
}

/// A limit per chat, made on a chat's first send.
pub(crate) struct ChatPacer<L> {
    /// Makes a chat's limit (fresh: a full bucket, an empty window).
    fresh: Box<dyn Fn(Instant) -> L + Send + Sync>,
    /// Each chat's limit, behind a fair lock so that a chat's sends queue in order.
    chats: Mutex<HashMap<String, Arc<tokio::sync::Mutex<L>>>>,
}

impl<L: Limit> ChatPacer<L> {
    /// A pacer giving each chat the limit `fresh` makes.
    pub(crate) fn with(fresh: impl Fn(Instant) -> L + Send + Sync + 'static) -> Self {
        ChatPacer {
            fresh: Box::new(fresh),
            chats: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for `chat`'s turn and counts the send. Sends to one chat queue in the
    /// order they asked (tokio's mutex is fair); other chats are not held up.
    pub(crate) async fn acquire(&self, chat: &str) {
        let slot = self
            .chats
            .lock()
            .entry(chat.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new((self.fresh)(Instant::now()))))
            .clone();
        let mut limit = slot.lock().await;
        while let Err(wait) = limit.take(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }

    /// How many chats it keeps a limit for.
    pub(crate) fn len(&self) -> usize {
        self.chats.lock().len()
    }
}

impl ChatPacer<TokenBucket> {
    /// `rate` sends a second per chat, a burst of as many (at least one).
    pub(crate) fn new(rate: f64) -> Self {
        ChatPacer::with(move |now| TokenBucket::full(rate, rate.max(1.0), now))
    }
}

impl ChatPacer<Window> {
    /// At most `per_window` sends in any `window` per chat.
    pub(crate) fn new(per_window: usize, window: Duration) -> Self {
        ChatPacer::with(move |_| Window::new(per_window, window))
    }
}

impl<L> std::fmt::Debug for ChatPacer<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatPacer")
            .field("chats", &self.chats.lock().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_chats_sends_go_in_the_order_they_asked() {
        let pacer = Arc::new(ChatPacer::<TokenBucket>::new(2.0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..6 {
            let p = pacer.clone();
            tasks.push(tokio::spawn(async move {
                p.acquire("oc_a").await;
                (i, start.elapsed())
            }));
            tokio::task::yield_now().await;
        }
        let mut times = Vec::new();
        for t in tasks {
            times.push(t.await.unwrap());
        }
        for w in times.windows(2) {
            assert!(w[0].1 <= w[1].1, "in order: {times:?}");
        }
        assert_eq!(times[1].1, Duration::ZERO, "a burst of two");
        assert_eq!(times[5].1, Duration::from_secs(2), "then two a second");
        assert_eq!(pacer.len(), 1);
    }
}
