//! [`CommitDelay`]: when the transcript writer waits for more appends before a commit.
//!
//! Each commit ends in one `fdatasync` per file, and a sync costs about the same
//! whether it carries one message or twenty. Under load the writer syncs back to back,
//! and each commit takes what arrived during the sync before it: on the bench machine
//! one `fdatasync` per 6–11 envelopes with 32 requests in flight. Waiting a little for more
//! (PostgreSQL's `commit_delay`) makes the commits fewer and larger, and the node
//! spends less CPU per envelope (docs/benchmarks.md, "eleventh look").
//!
//! Waiting only pays when more appends are on their way. A sender with a few requests
//! in flight, each one waiting for its answer before the next, sends nothing more while
//! the writer waits, and every commit would lose the whole wait. So the writer waits
//! only after a commit of at least [`DELAY_AFTER`] messages, and when a wait ends at its
//! deadline without the [`DELAY_TARGET`] it waited for, the writer stops waiting for the
//! next 1, 2, 4, … commits (up to [`MAX_BACKOFF`]), trying again after each pause; a wait
//! that fills resets the pause. The added latency is bounded by [`DELAY_WAIT`], and a
//! node under light load (commits of fewer than [`DELAY_AFTER`] messages) never waits.

use std::time::Duration;

/// A commit at least this large says appends arrive faster than the disk syncs.
pub(super) const DELAY_AFTER: usize = 4;
/// How many queued appends end a wait. With 32 requests in flight on the bench machine,
/// waiting for 16 used the least CPU of 8, 12 and 16 at the same ingest; 24 used a
/// little less CPU still but ingested less (docs/benchmarks.md, "eleventh look").
pub(super) const DELAY_TARGET: usize = 16;
/// The longest a commit waits for [`DELAY_TARGET`] appends: a few of the bench
/// machine's commit syncs (0.25 ms saved less CPU than 0.5 ms for 12).
pub(super) const DELAY_WAIT: Duration = Duration::from_micros(500);
/// The most commits taken without waiting after waits that ran out.
pub(super) const MAX_BACKOFF: u32 = 256;

/// How a wait for more appends ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waited {
    /// [`DELAY_TARGET`] appends were queued.
    Full,
    /// [`DELAY_WAIT`] passed first.
    Deadline,
}

/// The writer's choice, commit by commit, of whether to wait for more appends first.
#[derive(Debug, Default)]
pub(super) struct CommitDelay {
    /// Commits still to be taken without waiting (the pause after a wait ran out).
    skip: u32,
    /// The length of the last pause: doubled by each wait that runs out.
    backoff: u32,
}

impl CommitDelay {
    /// Whether the next commit waits for [`DELAY_TARGET`] appends, after a commit of
    /// `last` messages.
    pub(super) fn wait_next(&mut self, last: usize) -> bool {
        if last < DELAY_AFTER {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// Notes how a wait ended.
    pub(super) fn waited(&mut self, how: Waited) {
        match how {
            Waited::Full => self.backoff = 0,
            Waited::Deadline => {
                self.backoff = (self.backoff * 2).clamp(1, MAX_BACKOFF);
                self.skip = self.backoff;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which of `n` busy commits in a row wait, each wait ending as `how` says.
    fn pattern(d: &mut CommitDelay, n: usize, how: Waited) -> Vec<bool> {
        (0..n)
            .map(|_| {
                let w = d.wait_next(DELAY_TARGET);
                if w {
                    d.waited(how);
                }
                w
            })
            .collect()
    }

    #[test]
    fn a_light_load_never_waits() {
        let mut d = CommitDelay::default();
        for last in 0..DELAY_AFTER {
            assert!(!d.wait_next(last), "a commit of {last} is not load");
        }
        assert!(d.wait_next(DELAY_AFTER));
    }

    #[test]
    fn waits_that_fill_go_on() {
        let mut d = CommitDelay::default();
        assert!(pattern(&mut d, 50, Waited::Full).iter().all(|w| *w));
    }

    #[test]
    fn waits_that_run_out_back_off_doubling_up_to_the_cap() {
        let mut d = CommitDelay::default();
        let p = pattern(&mut d, 1 + 2 + 3 + 5 + 9, Waited::Deadline);
        let waits: Vec<usize> = p
            .iter()
            .enumerate()
            .filter(|(_, w)| **w)
            .map(|(i, _)| i)
            .collect();
        // Waits at 0, then after pauses of 1, 2, 4 and 8 commits.
        assert_eq!(waits, vec![0, 2, 5, 10, 19]);
        // The pause stops growing at the cap: a wait, then MAX_BACKOFF without.
        let mut d = CommitDelay::default();
        pattern(&mut d, 4096, Waited::Deadline);
        assert_eq!(d.backoff, MAX_BACKOFF);
        let p = pattern(&mut d, 2 * (MAX_BACKOFF as usize + 1), Waited::Deadline);
        assert_eq!(p.iter().filter(|w| **w).count(), 2);
    }

    #[test]
    fn a_wait_that_fills_ends_the_pause_doubling() {
        let mut d = CommitDelay::default();
        pattern(&mut d, 20, Waited::Deadline);
        assert!(d.backoff > 1);
        // Let the pause run out, then a wait fills: the next one that runs out pauses
        // for one commit only.
        while !d.wait_next(DELAY_TARGET) {}
        d.waited(Waited::Full);
        assert!(d.wait_next(DELAY_TARGET));
        d.waited(Waited::Deadline);
        assert_eq!(
            pattern(&mut d, 3, Waited::Deadline),
            vec![false, true, false]
        );
    }

    #[test]
    fn a_small_commit_does_not_use_up_the_pause() {
        let mut d = CommitDelay::default();
        assert!(d.wait_next(DELAY_TARGET));
        d.waited(Waited::Deadline);
        for _ in 0..10 {
            assert!(!d.wait_next(1));
        }
        assert!(
            !d.wait_next(DELAY_TARGET),
            "the pause of one busy commit is still due"
        );
        assert!(d.wait_next(DELAY_TARGET));
    }
}
