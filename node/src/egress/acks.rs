//! Claim acknowledgements: when has one claim envelope reached every peer, and what
//! did the peers answer?
//!
//! A bot about to post an interjection waits until its own claim has reached every
//! peer (or delivery to that peer was given up), so that no claim of its own can
//! arrive somewhere *after* that peer has answered the same trigger. A peer that has
//! already committed to answer the trigger says so in its answer to the claim
//! (`"answered": "<bot>"`, see [`crate::ingress::bridge`] and [`crate::wire::batch`]), and the
//! claimant then yields.
//!
//! [`AckTracker::track`] registers an envelope id with the peers (outboxes) it is
//! queued for and returns a [`ClaimAcks`] handle; each outbox reports the final
//! outcome of that envelope for its peer ([`AckTracker::report`]): delivered (with the
//! `answered` value, if any) or given up (refused because the outbox is full, a final
//! 4xx, the delivery deadline). Durable messages are never looked up; an untracked
//! claim (a withdrawal: nobody waits on it) costs one map lookup and is ignored.
//!
//! Bounded: an entry lives only as long as its handle. Dropping the handle (the turn
//! ended, timed out or was cancelled) removes it; the handle of a bot's turn lives at
//! most for that turn.
//!
//! Limits, by transport: on the Redis Streams transport a successful XADD counts as
//! delivered to every stream peer (the stream has no per-peer acknowledgement, so no
//! `answered` comes back from them); an envelope delivered through a relay counts as
//! delivered, but the relay's signed receipt does not carry `answered`. A receiver
//! that predates acknowledgements answers without the field: its ack still proves
//! delivery (the claim is on its board).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::wire::batch::ClaimReply;

/// How one tracked envelope fared with one peer, as its outbox reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerOutcome {
    /// The peer accepted it (or had it already), with its answer to the claim: the
    /// bot that, by the peer's account, already answers the trigger, or that the
    /// peer's own judge is still out.
    Delivered(ClaimReply),
    /// Delivery to this peer was given up (outbox full, final 4xx, deadline): waiting
    /// longer for it would only delay the post.
    GivenUp,
}

/// What is known so far about one tracked envelope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acks {
    /// Peers (outboxes) that have not reported yet.
    pub pending: Vec<String>,
    /// Bots that, by some peer's answer, already answer the trigger.
    pub answered: Vec<String>,
    /// Peers whose delivery was given up.
    pub given_up: Vec<String>,
    /// Peers whose own judge about the trigger was still out when the claim reached
    /// them: the claimant waits for their word before it commits.
    pub judging: Vec<String>,
}

impl Acks {
    /// Every peer reported, or one of them says the trigger is answered already (the
    /// rest cannot change that verdict).
    pub fn settled(&self) -> bool {
        self.pending.is_empty() || !self.answered.is_empty()
    }
}

/// Tracked envelopes by id; shared by the node (which tracks) and its outboxes (which
/// report).
#[derive(Default)]
pub struct AckTracker {
    entries: Mutex<HashMap<String, watch::Sender<Acks>>>,
}

impl AckTracker {
    /// Starts tracking envelope `id`, about to be queued for `peers` (outbox names).
    /// Call it before queuing, so that no report can come before the entry exists.
    pub fn track(self: &Arc<Self>, id: &str, peers: Vec<String>) -> ClaimAcks {
        let (tx, rx) = watch::channel(Acks {
            pending: peers,
            ..Acks::default()
        });
        self.entries.lock().insert(id.to_string(), tx);
        ClaimAcks {
            id: id.to_string(),
            rx,
            tracker: self.clone(),
        }
    }

    /// Reports the final outcome of envelope `id` for `peer`; ignored unless tracked.
    pub fn report(&self, id: &str, peer: &str, outcome: PeerOutcome) {
        let entries = self.entries.lock();
        let Some(tx) = entries.get(id) else {
            return;
        };
        tx.send_if_modified(|a| {
            let Some(i) = a.pending.iter().position(|p| p == peer) else {
                return false;
            };
            a.pending.swap_remove(i);
            match outcome {
                PeerOutcome::Delivered(reply) => {
                    a.answered.extend(reply.answered);
                    if reply.judging {
                        a.judging.push(peer.to_string());
                    }
                }
                PeerOutcome::GivenUp => a.given_up.push(peer.to_string()),
            }
            true
        });
    }

    /// Envelopes tracked right now (for tests and soak checks: it returns to 0).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// True when nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The handle of one tracked claim: await its acknowledgements; dropping it stops the
/// tracking.
pub struct ClaimAcks {
    id: String,
    rx: watch::Receiver<Acks>,
    tracker: Arc<AckTracker>,
}

impl ClaimAcks {
    /// What is known now.
    pub fn now(&self) -> Acks {
        self.rx.borrow().clone()
    }

    /// Waits until the acknowledgements are settled ([`Acks::settled`]) or `timeout`
    /// passes, and returns what is known then (on a timeout, `pending` names the
    /// peers that never reported).
    pub async fn wait(&mut self, timeout: Duration) -> Acks {
        let _ = tokio::time::timeout(timeout, self.rx.wait_for(Acks::settled)).await;
        self.now()
    }
}

impl Drop for ClaimAcks {
    fn drop(&mut self) {
        self.tracker.entries.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn settles_when_every_peer_reported_and_forgets_on_drop() {
        let t = Arc::new(AckTracker::default());
        let mut acks = t.track("c1", peers(&["B", "C"]));
        t.report("other", "B", PeerOutcome::GivenUp); // untracked: ignored
        t.report("c1", "B", PeerOutcome::Delivered(ClaimReply::default()));
        assert!(!acks.now().settled());
        t.report("c1", "B", PeerOutcome::GivenUp); // B already reported: ignored
        t.report("c1", "C", PeerOutcome::GivenUp);
        let start = tokio::time::Instant::now();
        let a = acks.wait(Duration::from_secs(3)).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "already settled");
        assert_eq!(
            a,
            Acks {
                pending: vec![],
                answered: vec![],
                given_up: peers(&["C"]),
                judging: vec![],
            }
        );
        assert_eq!(t.len(), 1);
        drop(acks);
        assert!(t.is_empty(), "the handle's drop ends the tracking");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_ack_settles_at_once_and_silence_times_out() {
        let t = Arc::new(AckTracker::default());
        let mut acks = t.track("c1", peers(&["B", "C"]));
        let t2 = t.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            t2.report(
                "c1",
                "C",
                PeerOutcome::Delivered(ClaimReply {
                    answered: Some("C".into()),
                    judging: false,
                }),
            );
        });
        let start = tokio::time::Instant::now();
        let a = acks.wait(Duration::from_secs(3)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(400));
        assert_eq!(a.answered, peers(&["C"]));
        assert_eq!(
            a.pending,
            peers(&["B"]),
            "B never answered, C's verdict stands"
        );

        // A peer that never acknowledges: the wait ends at the timeout, naming it.
        let mut acks = t.track("c2", peers(&["B"]));
        let start = tokio::time::Instant::now();
        let a = acks.wait(Duration::from_millis(3000)).await;
        assert_eq!(start.elapsed(), Duration::from_millis(3000));
        assert_eq!(a.pending, peers(&["B"]));
        assert!(!a.settled());
    }
}
