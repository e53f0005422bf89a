//! The node as the layers below see it: ingress's [`Sink`] (record, take up claims,
//! answer them), the turn code's [`Ports`] and [`GroupLog`], and the live `explain`
//! of a decision for the local API.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::node::{Node, STREAM_OUTBOX};
use crate::egress::acks::ClaimAcks;
use crate::ingress::ingest::{Arrival, Sink, Source};
use crate::store::transcript::{Appended, Received, TranscriptError};
use crate::store::turn_queries::RateCount;
use crate::telemetry::events::Event;
use crate::turn::ports::GroupLog;
use crate::turn::{Brain, Llm, Ports};
use crate::wire::envelope::Envelope;

/// The node as ingress sees it ([`Sink`]): it records, and starts turns.
pub(super) struct NodeSink(pub(super) Arc<Node>);

impl Sink for NodeSink {
    fn record_many(
        &self,
        envs: Vec<Received>,
        source: Source,
    ) -> BoxFuture<'_, Vec<Result<Appended, TranscriptError>>> {
        Box::pin(self.0.record_many(envs, source))
    }

    fn arrive(&self, arrival: Arrival) -> BoxFuture<'_, Result<Appended, TranscriptError>> {
        // The platform's own declaration decides: only where people's messages do not
        // reach every bot does this node carry them (see `platform::human_rules`).
        let forward =
            arrival.env.is_human() && !self.0.platform.visibility().humans_reach_every_bot;
        Box::pin(self.0.record_with_mentions(
            arrival.env,
            arrival.source,
            arrival.mentions,
            forward,
        ))
    }

    fn on_claim(&self, env: Arc<Envelope>) {
        self.0.on_claim(env);
    }

    fn answer_claim(&self, env: &Envelope) -> crate::wire::batch::ClaimReply {
        // A claim on a person's message (depth 0) from a platform whose people never
        // reach this node: this node will never judge it, so it is not "judging" (the
        // claimant would wait judge_word_timeout_ms for a word that never comes).
        let claimant = self.0.cfg.member(&env.sender).map(|b| b.platform);
        if env.depth == 0
            && claimant
                .is_some_and(|c| !crate::platform::sees_humans_of(self.0.cfg.bot().platform, c))
        {
            return crate::wire::batch::ClaimReply::default();
        }
        self.0.brain.answer_claim(env)
    }

    fn has_platform_msg(&self, group: &str, platform_msg_id: &str) -> bool {
        self.0
            .transcripts
            .contains(group, &ulid::Ulid::nil(), Some(platform_msg_id))
    }

    fn await_platform_msg<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        within: std::time::Duration,
    ) -> BoxFuture<'a, bool> {
        let events = self.0.events.subscribe();
        Box::pin(crate::ingress::ingest::recorded_within(
            events,
            move || self.has_platform_msg(group, platform_msg_id),
            group,
            platform_msg_id,
            within,
        ))
    }

    fn message(&self, group: &str, id: &ulid::Ulid) -> Option<Arc<Envelope>> {
        self.0.transcripts.get(group, id)
    }
}

/// The node's transcript store as the turn code reads it.
impl GroupLog for Node {
    fn recent(&self, group: &str, limit: usize) -> Vec<Arc<Envelope>> {
        conversation(self.transcripts.recent(group, limit))
    }

    fn since(&self, group: &str, id: &ulid::Ulid) -> Vec<Arc<Envelope>> {
        conversation(self.transcripts.since(group, id))
    }

    fn status_ends(&self, group: &str, limit: usize) -> Vec<Arc<Envelope>> {
        let mut recent = self.transcripts.recent(group, limit);
        recent.retain(|e| e.replaces.is_some());
        recent
    }

    fn rate_count(&self, group: &str, count: &RateCount<'_>) -> (usize, usize) {
        self.transcripts.rate_count(group, count)
    }
}

/// The node as the turn code sees it ([`Ports`]).
impl Ports for Node {
    fn brain(&self) -> &Brain {
        &self.brain
    }

    fn mesh(&self) -> Arc<crate::config::MeshSettings> {
        self.brain.tuning().mesh.clone()
    }

    fn llm(&self) -> &dyn Llm {
        &self.llm
    }

    fn now_millis(&self) -> u64 {
        crate::wire::envelope::now_millis()
    }

    fn new_id(&self) -> ulid::Ulid {
        ulid::Ulid::new()
    }

    fn jitter_ms(&self, max_ms: u64) -> u64 {
        use rand::Rng;
        if max_ms == 0 {
            0
        } else {
            rand::thread_rng().gen_range(0..=max_ms)
        }
    }

    fn link_failing_for(&self, peer: &str) -> Option<Duration> {
        self.outboxes
            .iter()
            .find(|o| o.peer() == peer)
            .and_then(|o| o.link().failing_for())
    }

    fn quiet(&self, group: &str) -> bool {
        self.quiet.in_group(group)
    }

    fn stopping(&self) -> &CancellationToken {
        &self.accepting
    }

    fn broadcast(&self, env: &Envelope) {
        Node::broadcast(self, env);
    }

    fn send_to(&self, peers: &[String], env: &Envelope) {
        let body = Bytes::from(env.to_bytes());
        let id = env.id.to_string();
        // A peer on the Redis stream has no outbox of its own: the stream carries the
        // envelope to every stream peer.
        let mut via_stream = false;
        for peer in peers {
            match self.outboxes.iter().find(|o| o.peer() == peer.as_str()) {
                Some(o) => {
                    let _ = o.push(&id, body.clone(), None, &self.metrics);
                }
                None => via_stream = true,
            }
        }
        if via_stream {
            if let Some(o) = self.outboxes.iter().find(|o| o.peer() == STREAM_OUTBOX) {
                let _ = o.push(&id, body, None, &self.metrics);
            }
        }
    }

    fn broadcast_tracked(&self, env: &Envelope) -> ClaimAcks {
        Node::broadcast_tracked(self, env)
    }

    fn publish(self: Arc<Self>, env: Envelope) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async move {
            Node::publish(&self, env, "self")
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    fn event(&self, event: Event) {
        self.events.publish(event);
    }

    fn watched(&self) -> bool {
        self.events.watched()
    }

    fn typing<'a>(&'a self, group: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Err(e) = self.platform.typing(group).await {
                tracing::warn!(bot = %self.cfg.bot().name, group, error = %e, "could not show the typing signal");
            }
        })
    }

    fn typing_every(&self) -> Option<Duration> {
        self.platform.typing_every()
    }

    fn sees_my_humans(&self, bot: &crate::config::BotSettings) -> bool {
        crate::platform::sees_humans_of(bot.platform, self.cfg.bot().platform)
    }

    fn judged(&self, record: crate::store::verdicts::VerdictRecord) {
        self.verdicts.append(record);
    }

    fn status_port(&self) -> Option<Arc<dyn crate::turn::status::StatusPort>> {
        let node = self.me.upgrade()?;
        Some(Arc::new(crate::app::status::NodeStatus(node)))
    }
}

/// What the turn code reads of a transcript: its conversation, without the bots'
/// status messages (never put in a prompt, judged or answered).
fn conversation(mut messages: Vec<Arc<Envelope>>) -> Vec<Arc<Envelope>> {
    messages.retain(|e| e.kind != crate::wire::envelope::Kind::Status);
    messages
}

/// Explain against a running node's live transcript.
pub(crate) async fn explain_live(
    node: &Node,
    req: crate::turn::ExplainRequest,
) -> Result<serde_json::Value, String> {
    let group = req
        .group
        .clone()
        .unwrap_or_else(|| node.cfg.mesh().group.clone());
    let recent = node.transcripts.recent(&group, 64);
    let e = crate::turn::explain(
        &node.brain,
        &node.llm,
        &node.cfg,
        req,
        &recent,
        node.quiet.in_group(&group),
    )
    .await?;
    Ok(serde_json::to_value(e).expect("serializes"))
}
