//! The one way an adapter asks its long connection's current session for something
//! and waits for the answer (OneBot's actions matched by `echo`, WeCom's requests
//! matched by `req_id`).
//!
//! The adapter holds [`Requests`]; its connection loop takes the receiving end once
//! ([`Requests::take_inbox`]) and hands it to each session, which sends what arrives
//! and puts the answer in the request's [`Pending::reply`]. A request asked while no
//! session is up fails at once; one whose answer does not come in time fails as
//! unanswered (it may have been carried out); requests left when a session ends
//! fail at once ([`fail_queued`]) rather than go out on the next one.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

/// A request on its way to the session, with where its answer goes.
#[derive(Debug)]
pub(crate) struct Pending<R, T, E> {
    /// What the adapter asks (the platform's request, not yet framed).
    pub(crate) request: R,
    /// Where its answer goes.
    pub(crate) reply: oneshot::Sender<Result<T, E>>,
}

/// What the sessions read requests from.
pub(crate) type Inbox<R, T, E> = mpsc::UnboundedReceiver<Pending<R, T, E>>;

/// The adapter's end: asks whichever session is up.
#[derive(Debug)]
pub(crate) struct Requests<R, T, E> {
    /// Requests to the session.
    tx: mpsc::UnboundedSender<Pending<R, T, E>>,
    /// The sessions' end of `tx`, taken once by the connection loop.
    inbox: Mutex<Option<Inbox<R, T, E>>>,
}

impl<R, T, E> Default for Requests<R, T, E> {
    fn default() -> Self {
        let (tx, inbox) = mpsc::unbounded_channel();
        Requests {
            tx,
            inbox: Mutex::new(Some(inbox)),
        }
    }
}

impl<R, T, E> Requests<R, T, E> {
    /// Asks `request` of the session up now (`up`): its answer, or `not_connected`
    /// when none is up, or `unanswered()` when no answer comes within `timeout` (or
    /// the session ended first).
    pub(crate) async fn ask(
        &self,
        request: R,
        up: bool,
        timeout: Duration,
        not_connected: E,
        unanswered: impl FnOnce() -> E,
    ) -> Result<T, E> {
        if !up {
            return Err(not_connected);
        }
        let (reply, answer) = oneshot::channel();
        if self.tx.send(Pending { request, reply }).is_err() {
            return Err(not_connected);
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) | Err(_) => Err(unanswered()),
        }
    }

    /// The sessions' end, once (`None` the second time: one connection loop only).
    pub(crate) fn take_inbox(&self) -> Option<Inbox<R, T, E>> {
        self.inbox.lock().take()
    }
}

/// Fails every request still queued after a session ended, with `e()`.
pub(crate) fn fail_queued<R, T, E>(inbox: &mut Inbox<R, T, E>, e: impl Fn() -> E) {
    while let Ok(p) = inbox.try_recv() {
        let _ = p.reply.send(Err(e()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn answers_reach_their_askers_and_no_session_fails_at_once() {
        let requests: Requests<u32, u32, String> = Requests::default();
        let mut inbox = requests.take_inbox().expect("the first take");
        assert!(requests.take_inbox().is_none(), "one loop only");
        let down = requests
            .ask(1, false, Duration::from_secs(5), "down".into(), || {
                "unanswered".into()
            })
            .await;
        assert_eq!(down.unwrap_err(), "down");
        let session = tokio::spawn(async move {
            let p = inbox.recv().await.unwrap();
            let _ = p.reply.send(Ok(p.request * 10));
            // The next one is held, never answered.
            let silent = inbox.recv().await.unwrap();
            (inbox, silent)
        });
        let ask = |n| {
            requests.ask(n, true, Duration::from_secs(5), "down".into(), || {
                "unanswered".into()
            })
        };
        assert_eq!(ask(4).await.unwrap(), 40);
        assert_eq!(ask(5).await.unwrap_err(), "unanswered", "timed out");
        let (mut inbox, _silent) = session.await.unwrap();
        let (left, ()) = tokio::join!(ask(6), async {
            tokio::task::yield_now().await;
            fail_queued(&mut inbox, || "session ended".to_string());
        });
        assert_eq!(
            left.unwrap_err(),
            "session ended",
            "not sent on the next session"
        );
    }
}
