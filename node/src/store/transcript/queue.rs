//! [`WriteQueue`]: the appends on their way to the writer thread.
//!
//! Appends are queued under the transcripts' lock, so the file order is the memory
//! order, but the writer thread is woken only after that lock is released
//! ([`WriteQueue::push`], then [`WriteQueue::wake`]). Waking a parked thread is a
//! system call (on a virtual machine often an exit to the hypervisor as well): made
//! under the lock, as a channel's `send` makes it, it held the lock for that long, and
//! the other runtime worker, waiting for the same lock, spun and called `sched_yield`
//! (docs/benchmarks.md, "tenth look"). The writer takes everything queued at once.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::OnceLock;
use std::thread::Thread;

use super::writer::WriteJob;

/// The queue between the appenders and the writer thread (one writer, any appenders).
pub(super) struct WriteQueue {
    /// What is queued, oldest first, and whether the queue is closed.
    state: Mutex<State>,
    /// The writer thread, to wake; set once, right after it is spawned (before any
    /// append can be queued, see [`super::Transcripts::open`]).
    writer: OnceLock<Thread>,
}

/// [`WriteQueue`]'s shared state.
struct State {
    /// Jobs not yet taken by the writer, in the order they were queued.
    jobs: Vec<WriteJob>,
    /// No more jobs are taken; the writer stops once it has written what is queued.
    closed: bool,
}

impl WriteQueue {
    pub(super) fn new() -> WriteQueue {
        WriteQueue {
            state: Mutex::new(State {
                jobs: Vec::new(),
                closed: false,
            }),
            writer: OnceLock::new(),
        }
    }

    /// Names the thread [`WriteQueue::wake`] wakes.
    pub(super) fn set_writer(&self, thread: Thread) {
        let _ = self.writer.set(thread);
    }

    /// Queues `job` without waking the writer: the caller calls [`WriteQueue::wake`]
    /// once it has released its own locks. Gives the job back when the queue is
    /// closed (the node is stopping, or the writer thread is gone).
    pub(super) fn push(&self, job: WriteJob) -> Result<(), WriteJob> {
        let mut state = self.state.lock();
        if state.closed {
            return Err(job);
        }
        state.jobs.push(job);
        Ok(())
    }

    /// Wakes the writer. Costs an atomic swap when it is awake (its next park returns
    /// at once, and it finds the queue empty or not), a system call when it is parked.
    pub(super) fn wake(&self) {
        if let Some(t) = self.writer.get() {
            t.unpark();
        }
    }

    /// Closes the queue: what is queued is still written, then the writer stops.
    pub(super) fn close(&self) {
        self.state.lock().closed = true;
        self.wake();
    }

    /// Closes the queue and drops what is queued, so every appender waiting for one
    /// of those jobs is told the writer stopped instead of waiting for ever. Run when
    /// the writer thread ends, by panic too.
    pub(super) fn abandon(&self) {
        let jobs = {
            let mut state = self.state.lock();
            state.closed = true;
            std::mem::take(&mut state.jobs)
        };
        // Dropped outside the lock: each drop wakes an appender.
        drop(jobs);
    }

    /// The writer's side: moves everything queued to the back of `into`. When
    /// nothing is queued and `wait` is set, parks until something is (or the queue is
    /// closed). Returns false once the queue is closed and nothing is left to take.
    pub(super) fn take(&self, into: &mut VecDeque<WriteJob>, wait: bool) -> bool {
        loop {
            {
                let mut state = self.state.lock();
                if !state.jobs.is_empty() {
                    into.extend(state.jobs.drain(..));
                    return true;
                }
                if state.closed {
                    return false;
                }
            }
            if !wait {
                return true;
            }
            // A wake between the check above and this park makes it return at once.
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::envelope::{Author, Envelope};
    use bytes::Bytes;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::oneshot;
    use ulid::Ulid;

    fn job(n: u32) -> (WriteJob, oneshot::Receiver<std::io::Result<()>>) {
        let (done, rx) = oneshot::channel();
        let env = Arc::new(Envelope::message(
            Ulid::new(),
            0,
            "g",
            "A",
            Author::human("alice"),
            format!("m{n}"),
        ));
        let job = WriteJob {
            env,
            line: Bytes::from(format!("line {n}")),
            outbound: None,
            done,
        };
        (job, rx)
    }

    #[test]
    fn the_writer_takes_jobs_in_order_and_is_woken_for_them() {
        let queue = Arc::new(WriteQueue::new());
        let q = queue.clone();
        let (lines_tx, lines_rx) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            let mut taken = VecDeque::new();
            while q.take(&mut taken, true) {}
            let lines: Vec<String> = taken
                .into_iter()
                .map(|j| String::from_utf8(j.line.to_vec()).unwrap())
                .collect();
            lines_tx.send(lines).unwrap();
        });
        queue.set_writer(writer.thread().clone());
        for n in 0..100 {
            let (j, _) = job(n);
            assert!(queue.push(j).is_ok());
            if n % 7 == 0 {
                // Let the writer park now and then, so a wake has to reach a parked thread.
                std::thread::sleep(Duration::from_millis(1));
            }
            queue.wake();
        }
        queue.close();
        // A lost wake would leave the writer parked: bounded, so the test fails
        // instead of hanging.
        let lines = lines_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the writer was woken and saw the close");
        writer.join().unwrap();
        let expected: Vec<String> = (0..100).map(|n| format!("line {n}")).collect();
        assert_eq!(lines, expected, "every job, in the order queued");
        let (late, _) = job(100);
        assert!(queue.push(late).is_err(), "a closed queue refuses");
    }

    #[test]
    fn abandoned_jobs_tell_their_appenders_the_writer_stopped() {
        let queue = WriteQueue::new();
        let (j, mut rx) = job(1);
        assert!(queue.push(j).is_ok());
        queue.abandon();
        assert!(
            matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Closed)),
            "the appender's wait ends"
        );
        let mut taken = VecDeque::new();
        assert!(!queue.take(&mut taken, true), "closed and empty");
        assert!(taken.is_empty());
    }
}
