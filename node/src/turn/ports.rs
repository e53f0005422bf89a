//! `Ports`: everything the turn code touches outside itself, as one small trait. The
//! node implements it over its transcripts, outboxes, LLM client and clock (`app/`);
//! the simulator implements it in virtual time over scripted judges and a modelled
//! network, so `botmesh simulate` runs this very code.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::config::{BotSettings, MeshSettings};
use crate::egress::acks::ClaimAcks;
use crate::engine::Llm;
use crate::store::turn_queries::{last_in, since_in, RateCount};
use crate::store::verdicts::VerdictRecord;
use crate::telemetry::events::Event;
use crate::turn::brain::Brain;
use crate::wire::envelope::Envelope;

/// The turn code's view of the rest of the node.
pub(crate) trait Ports: GroupLog + Send + Sync + 'static {
    /// This bot's turn-taking state.
    fn brain(&self) -> &Brain;
    /// The mesh-wide rules (depth, caps, staleness), as they are now (a reload may
    /// change them).
    fn mesh(&self) -> Arc<MeshSettings>;
    /// The LLM the judge and the reply use.
    fn llm(&self) -> &dyn Llm;

    /// Unix milliseconds now (virtual in the simulator).
    fn now_millis(&self) -> u64;
    /// A fresh envelope id.
    fn new_id(&self) -> Ulid;
    /// A random delay in `0..=max_ms`, the jitter added to a wait.
    fn jitter_ms(&self, max_ms: u64) -> u64;

    /// How long this node's direct link to `peer` (an outbox name) has been failing,
    /// if it is: a peer down that long is not waited for. None by default (no link
    /// known to fail: the simulator retries a dropped delivery until it gets through).
    fn link_failing_for(&self, _peer: &str) -> Option<std::time::Duration> {
        None
    }

    /// Whether the bot is quiet in `group`: the operator's node-wide switch, or the
    /// group's own (a person's `/quiet` there). Never by default (the simulator and a
    /// replay have no operator).
    fn quiet(&self, _group: &str) -> bool {
        false
    }
    /// Cancelled when the node stops taking turns.
    fn stopping(&self) -> &CancellationToken;

    /// Sends an ephemeral envelope (a claim or its withdrawal) to every peer.
    fn broadcast(&self, env: &Envelope);
    /// Sends an ephemeral envelope (a withdrawal owed to claimants) to these peers only.
    fn send_to(&self, peers: &[String], env: &Envelope);
    /// [`Ports::broadcast`], tracking the envelope's delivery to every peer.
    fn broadcast_tracked(&self, env: &Envelope) -> ClaimAcks;
    /// Records the bot's reply, posts it to the platform and queues it for every peer.
    fn publish(self: Arc<Self>, env: Envelope) -> BoxFuture<'static, Result<(), String>>;
    /// Tells the watchers (the page, SSE, the simulator's tally).
    fn event(&self, event: Event);
    /// Whether anyone watches the events now: when not, an event is not even built
    /// (a busy receiver's silent decisions, with no page open). Always by default.
    fn watched(&self) -> bool {
        true
    }
    /// Shows `group`'s chat, once, that the bot is at work on its reply (the
    /// platform's typing signal); a failure is logged, never the turn's concern.
    /// Nothing by default (a platform without the signal, the simulator).
    fn typing<'a>(&'a self, group: &'a str) -> BoxFuture<'a, ()> {
        let _ = group;
        Box::pin(async {})
    }
    /// How often [`Ports::typing`] is repeated while the work goes on; `None`: the
    /// platform has no typing signal, and the turn sends none.
    fn typing_every(&self) -> Option<std::time::Duration> {
        None
    }
    /// The handle that posts and edits a long turn's status message
    /// ([`crate::turn::status`]); `None` (the default: the simulator) shows none.
    fn status_port(&self) -> Option<Arc<dyn crate::turn::status::StatusPort>> {
        None
    }
    /// Keeps a judge answer and what the bot did with it (the node's verdict log, for
    /// `botmesh replay`). Must not block. Nothing by default.
    fn judged(&self, _record: VerdictRecord) {}
    /// Whether colleague `bot` sees the people this node sees (its platform shows them,
    /// or they are carried to it over the bridge): the shared judge for a person's
    /// message is chosen among those. Everyone, by default.
    fn sees_my_humans(&self, _bot: &BotSettings) -> bool {
        true
    }
}

/// The turn code's reads of a group's log: the node's transcript store, or a log
/// held whole in memory ([`SliceLog`]).
pub(crate) trait GroupLog {
    /// Up to `limit` of the group's most recent messages, oldest first: conversation
    /// only (the node leaves out the bots' status messages).
    fn recent(&self, group: &str, limit: usize) -> Vec<Arc<Envelope>>;
    /// The group's messages recorded after `id`, oldest first (conversation only).
    fn since(&self, group: &str, id: &Ulid) -> Vec<Arc<Envelope>>;
    /// The final versions of the bots' status messages among the group's last
    /// `limit` records, oldest first: a status that said how its turn ended carries
    /// the agent's `turn_end` there, for its next prompt
    /// (`engine::acp::acp_prompt`). None where no status is shown.
    fn status_ends(&self, _group: &str, _limit: usize) -> Vec<Arc<Envelope>> {
        Vec::new()
    }
    /// What the rate cap counts in the group's log ([`RateCount`]), in one consistent
    /// read.
    fn rate_count(&self, group: &str, count: &RateCount<'_>) -> (usize, usize);
}

/// A log held whole in memory as one slice, whatever the group (the simulator's, a
/// replay's, a unit test's): its [`GroupLog`] is the slice queries of
/// `store::turn_queries`, written once.
pub(crate) trait SliceLog {
    /// Runs `read` over the log, oldest first.
    fn read_log<R>(&self, read: impl FnOnce(&[Arc<Envelope>]) -> R) -> R;
}

impl<T: SliceLog> GroupLog for T {
    fn recent(&self, _group: &str, limit: usize) -> Vec<Arc<Envelope>> {
        self.read_log(|log| last_in(log, limit))
    }

    fn since(&self, _group: &str, id: &Ulid) -> Vec<Arc<Envelope>> {
        self.read_log(|log| since_in(log, id))
    }

    fn rate_count(&self, _group: &str, count: &RateCount<'_>) -> (usize, usize) {
        self.read_log(|log| count.over(log.iter()))
    }
}
