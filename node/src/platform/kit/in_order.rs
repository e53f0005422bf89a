//! The one way an adapter handles what its connection reads ([`InOrder`]): in the
//! order it was read, one event at a time, on a task of its own, so that a slow
//! handler (an API call, a colleague's copy waiting for its bridge copy) never stalls
//! the reading, and every event read is handled before the adapter's run ends.

use std::future::Future;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A task handing each event sent to it to the adapter's handler, in order.
#[derive(Debug)]
pub(crate) struct InOrder<E> {
    /// Where the connection sends what it reads.
    tx: mpsc::UnboundedSender<E>,
    /// The task running the handler.
    task: JoinHandle<()>,
}

impl<E: Send + 'static> InOrder<E> {
    /// Starts handling events with `handle`: each one awaited before the next.
    pub(crate) fn spawn<F, Fut>(mut handle: F) -> InOrder<E>
    where
        F: FnMut(E) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(event) = rx.recv().await {
                handle(event).await;
            }
        });
        InOrder { tx, task }
    }

    /// Where the connection sends what it reads (cloned by a connection that keeps
    /// its own sender; its clone must be dropped when it ends).
    pub(crate) fn sender(&self) -> &mpsc::UnboundedSender<E> {
        &self.tx
    }

    /// Waits until every event sent has been handled: the connection has ended, so
    /// no more come.
    pub(crate) async fn finish(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    use parking_lot::Mutex;

    #[tokio::test(start_paused = true)]
    async fn events_are_handled_one_at_a_time_in_order_and_all_before_finish() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let events = InOrder::spawn(move |n: u64| {
            let log = log.clone();
            async move {
                // The first event is the slowest: a handler running two at once would
                // log it last.
                tokio::time::sleep(Duration::from_millis(100 / (n + 1))).await;
                log.lock().push(n);
            }
        });
        let sender = events.sender().clone();
        for n in 0..5 {
            sender.send(n).unwrap();
        }
        drop(sender);
        events.finish().await;
        assert_eq!(*seen.lock(), vec![0, 1, 2, 3, 4]);
    }
}
