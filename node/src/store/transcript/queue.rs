//! [`WriteQueue`]: the appends on their way to the writer thread.
//!
//! Appends are queued under the transcripts' lock, so the file order is the memory
//! order, but the writer thread is woken only after that lock is released
//! ([`WriteQueue::push`], then [`WriteQueue::wake`]). Waking a parked thread is a
//! system call (on a virtual machine often an exit to the hypervisor as well): made
//! under the lock, as a channel's `send` makes it, it held the lock for that long, and
//! the other runtime worker, waiting for the same lock, spun and called `sched_yield`
//! (docs/benchmarks.md, "tenth look"). The writer takes everything queued at once.
//!
//! While the writer waits for more appends before a commit ([`WriteQueue::gather`],
//! see [`super::commit_delay`]), a push wakes it only once the count it waits for is
//! queued, so the appends it gathers cost no wake each.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::Instant;

use super::commit_delay::Waited;
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
    /// How many queued jobs make a push ask for the writer to be woken: 1, or the
    /// count the writer gathers for ([`WriteQueue::gather`]).
    wake_at: usize,
}

impl WriteQueue {
    pub(super) fn new() -> WriteQueue {
        WriteQueue {
            state: Mutex::new(State {
                jobs: Vec::new(),
                closed: false,
                wake_at: 1,
            }),
            writer: OnceLock::new(),
        }
    }

    /// Names the thread [`WriteQueue::wake`] wakes.
    pub(super) fn set_writer(&self, thread: Thread) {
        let _ = self.writer.set(thread);
    }

    /// Queues `job` without waking the writer: when this returns `Ok(true)` the caller
    /// calls [`WriteQueue::wake`] once it has released its own locks (`false`: the
    /// writer is gathering and not yet to be woken). Gives the job back when the queue
    /// is closed (the node is stopping, or the writer thread is gone).
    pub(super) fn push(&self, job: WriteJob) -> Result<bool, WriteJob> {
        let mut state = self.state.lock();
        if state.closed {
            return Err(job);
        }
        state.jobs.push(job);
        Ok(state.jobs.len() >= state.wake_at)
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

    /// The writer's side, gathering: waits until `target` jobs are queued or `until`
    /// passes, then moves what is queued to the back of `into` (when nothing is
    /// queued by then, waits for the first job as [`WriteQueue::take`] does). Returns
    /// whether the queue is still open or had jobs left, and how the wait ended.
    pub(super) fn gather(
        &self,
        into: &mut VecDeque<WriteJob>,
        target: usize,
        until: Instant,
    ) -> (bool, Waited) {
        loop {
            {
                let mut state = self.state.lock();
                let now = Instant::now();
                let full = state.jobs.len() >= target;
                if full || state.closed || now >= until {
                    state.wake_at = 1;
                    let how = if full { Waited::Full } else { Waited::Deadline };
                    if !state.jobs.is_empty() {
                        into.extend(state.jobs.drain(..));
                        return (true, how);
                    }
                    if state.closed {
                        return (false, how);
                    }
                    drop(state);
                    return (self.take(into, true), how);
                }
                state.wake_at = target;
            }
            // The push that reaches `target` wakes this park (before it too: then it
            // returns at once); so does a close.
            std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
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
            assert_eq!(
                queue.push(j).ok(),
                Some(true),
                "a writer not gathering is woken"
            );
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
    fn a_gathering_writer_is_woken_by_the_push_that_fills_its_count() {
        let queue = Arc::new(WriteQueue::new());
        let q = queue.clone();
        let (out_tx, out_rx) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            let mut taken = VecDeque::new();
            // A deadline far off: only the third push can end this wait.
            let until = Instant::now() + Duration::from_secs(60);
            let waited = q.gather(&mut taken, 3, until);
            out_tx.send((waited, taken.len())).unwrap();
        });
        queue.set_writer(writer.thread().clone());
        // Wait until the writer gathers (bounded: a writer that never does fails the test).
        let start = Instant::now();
        while queue.state.lock().wake_at != 3 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the writer never gathered"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let pushed: Vec<bool> = (0..3)
            .map(|n| queue.push(job(n).0).ok().expect("open"))
            .collect();
        assert_eq!(
            pushed,
            vec![false, false, true],
            "only the third push asks for a wake"
        );
        queue.wake();
        let (waited, taken) = out_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the third push woke the writer");
        writer.join().unwrap();
        assert_eq!(waited, (true, Waited::Full));
        assert_eq!(taken, 3);
        // Gathering over, a push asks for a wake again.
        assert_eq!(queue.push(job(4).0).ok(), Some(true));
    }

    #[test]
    fn a_gathering_wait_ends_at_its_deadline_with_what_is_queued() {
        let queue = WriteQueue::new();
        queue.set_writer(std::thread::current());
        assert_eq!(queue.push(job(1).0).ok(), Some(true));
        let mut taken = VecDeque::new();
        let waited = queue.gather(&mut taken, 16, Instant::now() + Duration::from_millis(5));
        assert_eq!(waited, (true, Waited::Deadline));
        assert_eq!(
            taken.len(),
            1,
            "the one queued job is committed without the rest"
        );
        // Closed while gathering: what is queued is still taken, then the end.
        assert!(queue.push(job(2).0).is_ok());
        queue.close();
        let waited = queue.gather(&mut taken, 16, Instant::now() + Duration::from_secs(60));
        assert_eq!(waited, (true, Waited::Deadline));
        assert_eq!(taken.len(), 2);
        let waited = queue.gather(&mut taken, 16, Instant::now() + Duration::from_secs(60));
        assert!(!waited.0, "closed and empty");
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
