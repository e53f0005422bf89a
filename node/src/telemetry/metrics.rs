//! `Metrics`: the Prometheus counters behind `GET /metrics`.
//!
//! Names follow Prometheus conventions (`botmesh_…_total` for counters). Every
//! rejection, delivery outcome, decision and LLM call is counted by reason, so an
//! operator can tell from one scrape why a bot did or did not speak.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::telemetry::hot_counters::{resolved, scheme_index, HotCounters};

/// Label set with one `result` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// accepted, duplicate, or the rejection reason.
    pub(crate) result: String,
}

/// Labels of a platform's inbound messages (`botmesh_platform_events_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlatformResultLabel {
    /// The platform (`discord`, `dingtalk`, `telegram`, …).
    pub(crate) platform: String,
    /// What became of the message (`platform::kit::inbound::Received`).
    pub(crate) result: String,
}

/// Labels for outgoing deliveries.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerResult {
    /// The peer bot's name.
    pub(crate) peer: String,
    /// delivered, retry, given_up, refused_full.
    pub(crate) result: String,
}

/// Labels for delivery requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerKind {
    /// The peer bot's name.
    pub(crate) peer: String,
    /// single or batch.
    pub(crate) kind: String,
}

/// Labels naming one peer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabel {
    /// The peer bot's name.
    pub(crate) peer: String,
}

/// Labels naming one in-memory cache or table.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabel {
    /// seen_ids, transcript_ids, rate_limiter_buckets, claim_triggers, feishu_event_ids.
    pub(crate) cache: String,
}

/// Labels naming one of the node's two listeners.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    /// `bridge` (peers, platform callbacks) or `api` (the local API and page).
    pub(crate) listener: String,
}

/// Labels for a listener's refusals of connections and requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    /// `bridge` or `api`.
    pub(crate) listener: String,
    /// `source_connections` (one address over `max_connections_per_source`) or
    /// `body_timeout` (a body not received within `body_timeout_ms`).
    pub(crate) reason: String,
}

/// Labels naming what is counted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `calls` or `tokens`.
    pub(crate) kind: String,
}

/// Labels for relayed envelopes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RelayLabel {
    /// origin (this node's envelope went through a relay), relay (this node
    /// forwarded another's), or destination (this node received a relayed copy).
    pub(crate) role: String,
    /// The peer the envelope was for (origin, relay) or came from (destination).
    pub(crate) peer: String,
    /// delivered, failed, forwarded, refused reason, accepted, duplicate, …
    pub(crate) result: String,
}

/// Labels for decisions.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// reply, judge, silent, yield.
    pub(crate) action: String,
    /// Why, as a stable snake_case code.
    pub(crate) reason: String,
}

/// Labels for people's commands in the chat.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabel {
    /// quiet, resume, stop, why.
    pub(crate) command: String,
    /// applied, not_addressed, stale, failed.
    pub(crate) outcome: String,
}

/// Labels for status message edits (`botmesh_status_edits_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusEditLabel {
    /// The bot whose status message it is.
    pub(crate) bot: String,
    /// The platform it is on (`telegram`, `local`, …).
    pub(crate) platform: String,
    /// `edited`, `failed` (refused or failed: the last text stays) or
    /// `unsupported` (the platform cannot edit).
    pub(crate) outcome: String,
}

/// Labels for MCP tool calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabel {
    /// The bot whose reply model called the tool.
    pub(crate) bot: String,
    /// The MCP server (`[[bots.mcp]] name`).
    pub(crate) server: String,
    /// The tool's name.
    pub(crate) tool: String,
    /// ok, error (the tool said `isError`), timeout, failed, unavailable, unknown_tool.
    pub(crate) outcome: String,
}

/// Labels for A2A tasks.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct A2aTaskLabel {
    /// The bot.
    pub(crate) bot: String,
    /// `served` (a caller's task for this bot) or `sent` (this bot's turn given to its
    /// remote agent).
    pub(crate) direction: String,
    /// The state the task reached: completed, failed, canceled, rejected,
    /// input_required.
    pub(crate) state: String,
}

/// Labels for a bot's MCP server.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolServerLabel {
    /// The bot.
    pub(crate) bot: String,
    /// The server (`[[bots.mcp]] name`).
    pub(crate) server: String,
}

/// Labels for LLM calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LlmLabel {
    /// judge or reply.
    pub(crate) purpose: String,
    /// ok or the failure label.
    pub(crate) result: String,
}

/// Labels for LLM latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PurposeLabel {
    /// judge or reply.
    pub(crate) purpose: String,
}

/// Labels for token counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabel {
    /// judge or reply.
    pub(crate) purpose: String,
    /// prompt or completion.
    pub(crate) kind: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// Label for a signature scheme.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SchemeLabel {
    /// `pairwise`, `ed25519` or `hmac` ([`crate::wire::signing::Scheme::label`]).
    pub(crate) scheme: String,
}

/// Labels for ACP agent turns.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BotOutcome {
    /// The bot whose agent ran the turn.
    pub(crate) bot: String,
    /// The stop reason or the failure label.
    pub(crate) outcome: String,
}

/// Labels naming one bot.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BotLabel {
    /// The bot's name.
    pub(crate) bot: String,
}

/// The ACP agents' metrics: turns by outcome, restarts.
pub(crate) struct AgentMetrics {
    /// `botmesh_agent_turns_total{bot,outcome}`.
    turns: Family<BotOutcome, Counter>,
    /// `botmesh_agent_restarts_total{bot}`.
    restarts: Family<BotLabel, Counter>,
    /// `botmesh_agent_output_cut_total{bot,outcome}`: what of an agent's output was
    /// cut at its bound (`reply`, `title`), the outcome label naming what.
    cut: Family<BotOutcome, Counter>,
}

impl AgentMetrics {
    fn register(registry: &mut Registry) -> AgentMetrics {
        let m = AgentMetrics {
            turns: Family::default(),
            restarts: Family::default(),
            cut: Family::default(),
        };
        registry.register(
            "botmesh_agent_turns",
            "ACP agent turns, by bot and outcome (stop reason or failure)",
            m.turns.clone(),
        );
        registry.register(
            "botmesh_agent_restarts",
            "Restarts of a bot's ACP agent process after it died",
            m.restarts.clone(),
        );
        registry.register(
            "botmesh_agent_output_cut",
            "An ACP agent's output cut at its bound, by bot and what (reply, title)",
            m.cut.clone(),
        );
        m
    }
}

/// Families a module above this layer declares for itself (a platform adapter's own
/// metrics, e.g. `platform/feishu/metrics.rs`), so that this file names no platform:
/// [`Metrics::own`] registers them on first use and shares them from then on.
pub(crate) trait OwnFamilies: Default + Send + Sync + 'static {
    /// Registers every family (its name and help) in `registry`.
    fn register(&self, registry: &mut Registry);
}

/// Every metric the node exports.
pub struct Metrics {
    /// Where every family is registered; behind a lock only so that [`Metrics::own`]
    /// can add a module's families after start (a scrape and a first use are rare).
    registry: Mutex<Registry>,
    /// The [`OwnFamilies`] registered so far, by type.
    own: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    /// Envelopes received on the bridge, by result.
    pub(crate) envelopes_in: Family<ResultLabel, Counter>,
    /// Envelopes whose signature verified, by the scheme that verified it: shows
    /// whether peers reach this node with the cheap pairwise entry or need Ed25519.
    pub(crate) signatures_verified: Family<SchemeLabel, Counter>,
    /// Ed25519 (key, signature) pairs handed to the verifying thread: the work
    /// incoming envelopes cost it, which a flood of junk signatures must not move.
    pub(crate) ed25519_checks: Counter,
    /// Open connections per listener: a flood that fills `max_connections` shows here.
    pub(crate) open_connections: Family<ListenerLabel, Gauge>,
    /// Connections and requests a listener refused, by reason.
    pub(crate) http_refusals: Family<RefusalLabel, Counter>,
    /// Deliveries to peers, by peer and result.
    pub(crate) envelopes_out: Family<PeerResult, Counter>,
    /// Requests sent to peers, by peer and kind (`single` envelope or `batch`).
    pub(crate) peer_requests: Family<PeerKind, Counter>,
    /// Envelopes waiting in each peer's outbox.
    pub(crate) outbox_depth: Family<PeerLabel, Gauge>,
    /// Durable envelopes for each peer waiting only in the outbox log (spilled).
    pub(crate) outbox_spilled: Family<PeerLabel, Gauge>,
    /// Envelopes relayed around broken links, by role, peer and result.
    pub(crate) envelopes_relayed: Family<RelayLabel, Counter>,
    /// Decisions by action and reason.
    pub(crate) decisions: Family<DecisionLabel, Counter>,
    /// People's commands in the chat (`/quiet`, `/stop`, …), by command and outcome.
    pub(crate) chat_commands: Family<CommandLabel, Counter>,
    /// Replies written (or being written) and then not posted, by why: the cost of
    /// writing while waiting.
    pub(crate) replies_discarded: Family<ResultLabel, Counter>,
    /// Completion tokens of the replies thrown away.
    pub(crate) reply_tokens_discarded: Counter,
    /// LLM calls by purpose and result.
    pub(crate) llm_calls: Family<LlmLabel, Counter>,
    /// LLM latency by purpose, seconds.
    pub(crate) llm_latency: HistogramFamily<PurposeLabel>,
    /// LLM tokens by purpose and kind.
    pub(crate) llm_tokens: Family<TokenLabel, Counter>,
    /// Local API requests by result.
    pub(crate) api_requests: Family<ResultLabel, Counter>,
    /// Messages recorded in transcripts, by source (bridge, api, self).
    pub(crate) transcript_appends: Family<ResultLabel, Counter>,
    /// Entries held by each in-memory cache, refreshed at every scrape: lets an
    /// operator (and `botmesh-bench soak`) see that none grows without bound.
    pub(crate) cache_entries: Family<CacheLabel, Gauge>,
    /// Every platform's inbound messages, by platform and by what became of each
    /// (`recorded`, `duplicate`, `own`, `bridge_copy`, `context`, `empty`, `failed`):
    /// one family for all adapters (`platform::kit::inbound`), so one dashboard
    /// reads them all. The per-platform families above stay for their connection
    /// events and for the dashboards that read them.
    pub(crate) platform_events: Family<PlatformResultLabel, Counter>,
    /// DingTalk Stream mode events, by result: `message` (a robot message recorded and
    /// acknowledged), `duplicate`, `ignored` (direct or empty), `unrecorded` (left
    /// unacknowledged for redelivery), `ping`, `disconnect`, `other`, `unreadable`,
    /// `connected`, `connect_failed`, `closed`; and sends by path: `send_session`,
    /// `send_group`, `send_failed`.
    pub(crate) dingtalk_events: Family<ResultLabel, Counter>,
    /// 1 while the Redis Streams transport is connected, 0 while it is not (absent
    /// on `http` nodes).
    pub(crate) redis_up: Gauge,
    /// Redis Streams transport incidents: `read_error`, `write_error`, `gap` (entries
    /// trimmed before this bot read them), `reset` (a stream restarted behind a cursor).
    pub(crate) stream_events: Family<ResultLabel, Counter>,
    /// Configuration reloads (SIGHUP, `POST /v1/reload`, the file watch), by result:
    /// `applied` (the file was valid; some keys may wait for a restart) or `refused`
    /// (a mistake in the file; the running configuration stays).
    pub(crate) config_reloads: Family<ResultLabel, Counter>,
    /// Days on which this bot ran out of its LLM budget, by the limit reached
    /// (`calls` or `tokens`): counted once per day, when it runs out.
    pub(crate) budget_exhausted: Family<ResultLabel, Counter>,
    /// Today's LLM use against the daily budget, by kind (`calls`, `tokens`),
    /// refreshed at every scrape.
    pub(crate) budget_spent: Family<KindLabel, Gauge>,
    /// Verdict log lines (`botmesh replay`'s record of judge answers), by result:
    /// `written`, `failed` (the disk refused), `dropped` (the writer's queue was full).
    pub(crate) verdict_log: Family<ResultLabel, Counter>,
    /// MCP tool calls the reply model made, by bot, server, tool and outcome.
    pub(crate) tool_calls: Family<ToolLabel, Counter>,
    /// A2A tasks by bot, direction and the state they reached.
    pub(crate) a2a_tasks: Family<A2aTaskLabel, Counter>,
    /// The tools each MCP server offers now: 0 while it is down (or still starting).
    pub(crate) mcp_tools: Family<ToolServerLabel, Gauge>,
    /// Edits of long turns' status messages, by bot, platform and outcome.
    pub(crate) status_edits: Family<StatusEditLabel, Counter>,
    /// ACP agents' turns and restarts ([`AgentMetrics`]).
    pub(crate) agent: AgentMetrics,
    /// The counters every received envelope bumps, looked up once.
    hot: HotCounters,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let envelopes_in = Family::<ResultLabel, Counter>::default();
        let envelopes_out = Family::<PeerResult, Counter>::default();
        let signatures_verified = Family::<SchemeLabel, Counter>::default();
        let ed25519_checks = Counter::default();
        let open_connections = Family::<ListenerLabel, Gauge>::default();
        let http_refusals = Family::<RefusalLabel, Counter>::default();
        registry.register(
            "botmesh_ed25519_checks",
            "Ed25519 (key, signature) pairs handed to signature verification",
            ed25519_checks.clone(),
        );
        registry.register(
            "botmesh_open_connections",
            "Open connections per listener (bridge, api)",
            open_connections.clone(),
        );
        registry.register(
            "botmesh_http_refusals",
            "Connections and requests a listener refused, by reason (source_connections, body_timeout)",
            http_refusals.clone(),
        );
        let outbox_depth = Family::<PeerLabel, Gauge>::default();
        let peer_requests = Family::<PeerKind, Counter>::default();
        let outbox_spilled = Family::<PeerLabel, Gauge>::default();
        let envelopes_relayed = Family::<RelayLabel, Counter>::default();
        let decisions = Family::<DecisionLabel, Counter>::default();
        let chat_commands = Family::<CommandLabel, Counter>::default();
        let replies_discarded = Family::<ResultLabel, Counter>::default();
        let reply_tokens_discarded = Counter::default();
        registry.register(
            "botmesh_replies_discarded",
            "Replies written (or cancelled while being written) and not posted, by reason",
            replies_discarded.clone(),
        );
        registry.register(
            "botmesh_reply_tokens_discarded",
            "Completion tokens of replies written and then thrown away",
            reply_tokens_discarded.clone(),
        );
        let llm_calls = Family::<LlmLabel, Counter>::default();
        let llm_latency: HistogramFamily<PurposeLabel> =
            Family::new_with_constructor(latency_histogram);
        let llm_tokens = Family::<TokenLabel, Counter>::default();
        let api_requests = Family::<ResultLabel, Counter>::default();
        let transcript_appends = Family::<ResultLabel, Counter>::default();
        let cache_entries = Family::<CacheLabel, Gauge>::default();
        let redis_up = Gauge::default();
        let platform_events = Family::<PlatformResultLabel, Counter>::default();
        let dingtalk_events = Family::<ResultLabel, Counter>::default();
        let stream_events = Family::<ResultLabel, Counter>::default();
        let config_reloads = Family::<ResultLabel, Counter>::default();
        let budget_exhausted = Family::<ResultLabel, Counter>::default();
        let budget_spent = Family::<KindLabel, Gauge>::default();
        registry.register(
            "botmesh_config_reloads",
            "Configuration reloads, by result (applied, refused)",
            config_reloads.clone(),
        );
        registry.register(
            "botmesh_llm_budget_exhausted",
            "Days on which the bot ran out of its daily LLM budget, by limit (calls, tokens)",
            budget_exhausted.clone(),
        );
        registry.register(
            "botmesh_llm_budget_spent",
            "Today's LLM use against the daily budget, by kind (calls, tokens)",
            budget_spent.clone(),
        );
        let verdict_log = Family::<ResultLabel, Counter>::default();
        let agent = AgentMetrics::register(&mut registry);
        registry.register(
            "botmesh_verdict_log",
            "Verdict log lines (judge answers kept for botmesh replay), by result",
            verdict_log.clone(),
        );
        let tool_calls = Family::<ToolLabel, Counter>::default();
        registry.register(
            "botmesh_tool_calls",
            "MCP tool calls made by the reply model, by bot, server, tool and outcome",
            tool_calls.clone(),
        );
        let status_edits = Family::<StatusEditLabel, Counter>::default();
        registry.register(
            "botmesh_status_edits",
            "Edits of long turns' status messages, by bot, platform and outcome",
            status_edits.clone(),
        );
        let a2a_tasks = Family::<A2aTaskLabel, Counter>::default();
        registry.register(
            "botmesh_a2a_tasks",
            "A2A tasks by bot, direction (served, sent) and the state they reached",
            a2a_tasks.clone(),
        );
        let mcp_tools = Family::<ToolServerLabel, Gauge>::default();
        registry.register(
            "botmesh_mcp_tools",
            "Tools each MCP server of the bot offers now (0: down or starting)",
            mcp_tools.clone(),
        );
        registry.register(
            "botmesh_envelopes_in",
            "Envelopes received on the bridge, by result",
            envelopes_in.clone(),
        );
        registry.register(
            "botmesh_signatures_verified",
            "Envelope signatures that verified, by scheme (pairwise, ed25519, hmac)",
            signatures_verified.clone(),
        );
        registry.register(
            "botmesh_envelopes_out",
            "Envelope deliveries to peers, by peer and result",
            envelopes_out.clone(),
        );
        registry.register(
            "botmesh_peer_requests",
            "Delivery requests sent to peers, by peer and kind (single, batch)",
            peer_requests.clone(),
        );
        registry.register(
            "botmesh_outbox_depth",
            "Envelopes waiting in a peer's outbox",
            outbox_depth.clone(),
        );
        registry.register(
            "botmesh_outbox_spilled",
            "Durable envelopes for a peer waiting only in the outbox log, beyond the memory capacity",
            outbox_spilled.clone(),
        );
        registry.register(
            "botmesh_envelopes_relayed",
            "Envelopes relayed around a broken direct link, by role (origin, relay, destination), peer and result",
            envelopes_relayed.clone(),
        );
        registry.register(
            "botmesh_decisions",
            "Decisions about incoming messages, by action and reason",
            decisions.clone(),
        );
        registry.register(
            "botmesh_chat_commands",
            "People's commands in the chat (/quiet, /resume, /stop, /why), by command and outcome",
            chat_commands.clone(),
        );
        registry.register(
            "botmesh_llm_calls",
            "LLM calls by purpose and result",
            llm_calls.clone(),
        );
        registry.register(
            "botmesh_llm_latency_seconds",
            "LLM call latency by purpose",
            llm_latency.clone(),
        );
        registry.register(
            "botmesh_llm_tokens",
            "LLM tokens by purpose and kind",
            llm_tokens.clone(),
        );
        registry.register(
            "botmesh_api_requests",
            "Local API requests by result",
            api_requests.clone(),
        );
        registry.register(
            "botmesh_transcript_appends",
            "Transcript appends by result",
            transcript_appends.clone(),
        );
        registry.register(
            "botmesh_cache_entries",
            "Entries held by an in-memory cache or index, at the last scrape",
            cache_entries.clone(),
        );
        registry.register(
            "botmesh_platform_events",
            "Messages read from a chat platform, by platform and by what became of each",
            platform_events.clone(),
        );
        registry.register(
            "botmesh_dingtalk_events",
            "DingTalk Stream mode events and sends, by result",
            dingtalk_events.clone(),
        );
        registry.register(
            "botmesh_redis_up",
            "1 while the Redis Streams transport is connected",
            redis_up.clone(),
        );
        registry.register(
            "botmesh_stream_events",
            "Redis Streams transport incidents, by kind",
            stream_events.clone(),
        );
        Metrics {
            tool_calls,
            status_edits,
            a2a_tasks,
            mcp_tools,
            agent,
            config_reloads,
            budget_exhausted,
            budget_spent,
            verdict_log,
            platform_events,
            dingtalk_events,
            redis_up,
            stream_events,
            registry: Mutex::new(registry),
            own: Mutex::default(),
            envelopes_in,
            signatures_verified,
            ed25519_checks,
            open_connections,
            http_refusals,
            envelopes_out,
            outbox_depth,
            peer_requests,
            outbox_spilled,
            envelopes_relayed,
            decisions,
            chat_commands,
            replies_discarded,
            reply_tokens_discarded,
            llm_calls,
            llm_latency,
            llm_tokens,
            api_requests,
            transcript_appends,
            cache_entries,
            hot: HotCounters::default(),
        }
    }

    /// Counts one ACP agent turn of `bot` by outcome: its stop reason (`end_turn`,
    /// `max_tokens`, `refusal`, `cancelled`, …) or its failure (`died`, `timed_out`, …).
    pub fn agent_turn(&self, bot: &str, outcome: &str) {
        self.agent
            .turns
            .get_or_create(&BotOutcome {
                bot: bot.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts one restart of `bot`'s ACP agent after it died.
    pub fn agent_restart(&self, bot: &str) {
        self.agent
            .restarts
            .get_or_create(&BotLabel { bot: bot.into() })
            .inc();
    }

    /// Counts one piece of `bot`'s agent output cut at its bound: `reply`
    /// (`max_reply_chars`) or `title` (`max_title_chars`).
    pub fn agent_output_cut(&self, bot: &str, what: &str) {
        self.agent
            .cut
            .get_or_create(&BotOutcome {
                bot: bot.into(),
                outcome: what.into(),
            })
            .inc();
    }

    /// Sets the size of one in-memory cache.
    pub(crate) fn set_cache_entries(&self, cache: &str, entries: usize) {
        self.cache_entries
            .get_or_create(&CacheLabel {
                cache: cache.into(),
            })
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
    }

    /// Counts one incoming envelope.
    pub(crate) fn envelope_in(&self, result: &str) {
        let hot = match result {
            "accepted" => &self.hot.accepted,
            "duplicate" => &self.hot.duplicate,
            _ => {
                self.envelopes_in
                    .get_or_create(&ResultLabel {
                        result: result.into(),
                    })
                    .inc();
                return;
            }
        };
        resolved(hot, &self.envelopes_in, || ResultLabel {
            result: result.into(),
        })
        .inc();
    }

    /// Counts one envelope signature that verified under `scheme`.
    pub(crate) fn signature_verified(&self, scheme: crate::wire::signing::Scheme) {
        let cell = &self.hot.schemes[scheme_index(scheme)];
        resolved(cell, &self.signatures_verified, || SchemeLabel {
            scheme: scheme.label().into(),
        })
        .inc();
    }

    /// Counts one message recorded in a transcript, by where it came from (`bridge`,
    /// `api`, …), or `error` when it could not be recorded.
    pub(crate) fn transcript_append(&self, source: &str) {
        if source == "bridge" {
            resolved(&self.hot.appends_bridge, &self.transcript_appends, || {
                ResultLabel {
                    result: source.into(),
                }
            })
            .inc();
            return;
        }
        self.transcript_appends
            .get_or_create(&ResultLabel {
                result: source.into(),
            })
            .inc();
    }

    /// Counts `pairs` Ed25519 (key, signature) pairs handed to verification.
    pub(crate) fn ed25519_checks(&self, pairs: usize) {
        self.ed25519_checks.inc_by(pairs as u64);
    }

    /// Moves `listener`'s open-connection gauge by `delta` (+1 opened, -1 closed).
    pub(crate) fn add_open_connections(&self, listener: &str, delta: i64) {
        self.open_connections
            .get_or_create(&ListenerLabel {
                listener: listener.into(),
            })
            .inc_by(delta);
    }

    /// Counts one connection or request `listener` refused, by reason.
    pub(crate) fn http_refused(&self, listener: &str, reason: &str) {
        self.http_refusals
            .get_or_create(&RefusalLabel {
                listener: listener.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts one DingTalk Stream event or send.
    pub(crate) fn dingtalk_event(&self, result: &str) {
        self.dingtalk_events
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Counts one message read from `platform`, by what became of it.
    pub(crate) fn platform_event(&self, platform: &str, result: &str) {
        self.platform_events
            .get_or_create(&PlatformResultLabel {
                platform: platform.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts one edit of a status message by its outcome.
    pub(crate) fn status_edit(&self, bot: &str, platform: &str, outcome: &str) {
        self.status_edits
            .get_or_create(&StatusEditLabel {
                bot: bot.into(),
                platform: platform.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts one MCP tool call by its outcome.
    pub(crate) fn tool_call(&self, bot: &str, server: &str, tool: &str, outcome: &str) {
        self.tool_calls
            .get_or_create(&ToolLabel {
                bot: bot.into(),
                server: server.into(),
                tool: tool.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts an A2A task of `bot` reaching `state` (`direction`: served or sent).
    pub(crate) fn a2a_task(&self, bot: &str, direction: &str, state: &str) {
        self.a2a_tasks
            .get_or_create(&A2aTaskLabel {
                bot: bot.into(),
                direction: direction.into(),
                state: state.into(),
            })
            .inc();
    }

    /// Sets how many tools MCP server `server` of `bot` offers now.
    pub(crate) fn mcp_tools(&self, bot: &str, server: &str, tools: usize) {
        self.mcp_tools
            .get_or_create(&ToolServerLabel {
                bot: bot.into(),
                server: server.into(),
            })
            .set(i64::try_from(tools).unwrap_or(i64::MAX));
    }

    /// Counts one verdict log line: written, failed or dropped.
    pub(crate) fn verdict_logged(&self, result: &str) {
        self.verdict_log
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Counts one Redis Streams incident.
    pub(crate) fn stream_event(&self, result: &str) {
        self.stream_events
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Counts one delivery outcome.
    pub(crate) fn envelope_out(&self, peer: &str, result: &str) {
        self.envelopes_out
            .get_or_create(&PeerResult {
                peer: peer.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts one delivery request to a peer.
    pub(crate) fn peer_request(&self, peer: &str, kind: &str) {
        self.peer_requests
            .get_or_create(&PeerKind {
                peer: peer.into(),
                kind: kind.into(),
            })
            .inc();
    }

    /// Sets a peer's outbox depth.
    pub(crate) fn set_outbox_depth(&self, peer: &str, depth: usize) {
        self.outbox_depth
            .get_or_create(&PeerLabel { peer: peer.into() })
            .set(depth as i64);
    }

    /// Counts one relayed envelope.
    pub(crate) fn relayed(&self, role: &str, peer: &str, result: &str) {
        self.envelopes_relayed
            .get_or_create(&RelayLabel {
                role: role.into(),
                peer: peer.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Sets how many durable envelopes for a peer wait only on disk.
    pub(crate) fn set_outbox_spilled(&self, peer: &str, spilled: usize) {
        self.outbox_spilled
            .get_or_create(&PeerLabel { peer: peer.into() })
            .set(spilled as i64);
    }

    /// Counts a reply that was written (`tokens` > 0) or cancelled while being written
    /// and then not posted.
    pub fn reply_discarded(&self, reason: &str, tokens: u64) {
        self.replies_discarded
            .get_or_create(&ResultLabel {
                result: reason.into(),
            })
            .inc();
        self.reply_tokens_discarded.inc_by(tokens);
    }

    /// Counts one command from a person in the chat.
    pub(crate) fn chat_command(&self, command: &str, outcome: &str) {
        self.chat_commands
            .get_or_create(&CommandLabel {
                command: command.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts one decision.
    pub(crate) fn decision(&self, action: &'static str, reason: &'static str) {
        if let Some(c) = self.hot.decisions.read().get(&(action, reason)) {
            c.inc();
            return;
        }
        let c = self
            .decisions
            .get_or_create(&DecisionLabel {
                action: action.into(),
                reason: reason.into(),
            })
            .clone();
        c.inc();
        self.hot.decisions.write().insert((action, reason), c);
    }

    /// Records one LLM call.
    pub(crate) fn llm_call(
        &self,
        purpose: &str,
        result: &str,
        seconds: f64,
        prompt_tokens: u64,
        completion_tokens: u64,
    ) {
        self.llm_calls
            .get_or_create(&LlmLabel {
                purpose: purpose.into(),
                result: result.into(),
            })
            .inc();
        self.llm_latency
            .get_or_create(&PurposeLabel {
                purpose: purpose.into(),
            })
            .observe(seconds);
        self.llm_tokens(purpose, prompt_tokens, completion_tokens);
    }

    /// Counts tokens of an LLM call recorded before they were known (a drafting call
    /// is counted when its verdict line comes, its tokens when its reply is done).
    pub(crate) fn llm_tokens(&self, purpose: &str, prompt_tokens: u64, completion_tokens: u64) {
        self.llm_tokens
            .get_or_create(&TokenLabel {
                purpose: purpose.into(),
                kind: "prompt".into(),
            })
            .inc_by(prompt_tokens);
        self.llm_tokens
            .get_or_create(&TokenLabel {
                purpose: purpose.into(),
                kind: "completion".into(),
            })
            .inc_by(completion_tokens);
    }

    /// A module's own families ([`OwnFamilies`]), registered on their first use: a
    /// node exports the families of the parts it uses (a Feishu node Feishu's).
    pub(crate) fn own<T: OwnFamilies>(&self) -> Arc<T> {
        let mut own = self.own.lock();
        if let Some(found) = own.get(&TypeId::of::<T>()) {
            return found
                .clone()
                .downcast::<T>()
                .expect("stored under its own type");
        }
        let fresh = Arc::new(T::default());
        fresh.register(&mut self.registry.lock());
        own.insert(TypeId::of::<T>(), fresh.clone());
        fresh
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_turns_and_restarts_are_exported_by_bot() {
        let m = Metrics::new();
        m.agent_turn("Ada", "end_turn");
        m.agent_turn("Ada", "end_turn");
        m.agent_turn("Ada", "died");
        m.agent_restart("Ada");
        let text = m.render();
        for line in [
            r#"botmesh_agent_turns_total{bot="Ada",outcome="end_turn"} 2"#,
            r#"botmesh_agent_turns_total{bot="Ada",outcome="died"} 1"#,
            r#"botmesh_agent_restarts_total{bot="Ada"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
