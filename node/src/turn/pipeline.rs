//! Taking turns: what a node does with each new message.
//!
//! `consider` runs the pipeline for one message: policy (depth, quiet, caps, mentions,
//! local filters) → judge (one short LLM call, or the offline overlap judge) →
//! scheduler (relevance-scaled wait with claims, yield, one re-judge) → reply (one
//! LLM call) → for an interjection, the claim's acknowledgements and the commit →
//! publish (transcript + every peer's outbox). Each step logs its decision and counts
//! it in `botmesh_decisions_total{action,reason}`.
//!
//! Before an interjection is posted, the bot waits (at most `claim_ack_timeout_ms`)
//! until its claim has reached every peer ([`crate::egress::acks`]): a peer that already
//! committed to answer says so in its acknowledgement, and the bot yields
//! (`yield_writing/already_answered`). Then it commits on its board
//! ([`ClaimBoard::commit`]): behind a better claim that arrived meanwhile it stands
//! by with its written reply; otherwise it is marked as answering, so any claim that
//! reaches it from now on is told so. A claim that is late in transit therefore
//! cannot produce a second answer. If some peer never acknowledges in time, the bot
//! posts anyway, logged at warn and counted as `post/claim_unacked`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use ulid::Ulid;

use crate::app::node::Node;
use crate::config::{BotSettings, LlmSettings, NodeConfig};
use crate::egress::acks::ClaimAcks;
use crate::llm::{parse_verdict, ChatMessage, Endpoint, LlmClient, Purpose, Verdict};
use crate::telemetry::events::{Event, EventBus};
use crate::telemetry::metrics::Metrics;
use crate::turn::judge::{build_prompt, offline_verdict, JudgeInput};
use crate::turn::mention::{Member, MentionMatcher, PlatformMention};
use crate::turn::policy::{decide, recent_bot_messages, Action, Decision, Facts};
use crate::turn::scheduler::{delay_for, grace_for, ClaimBoard, Yield, MIN_CLAIM, WITHDRAWN};
use crate::wire::envelope::{
    now_millis, Author, AuthorKind, Envelope, Kind, Why, PROTOCOL_VERSION,
};

/// The window of the per-group bot-message cap.
pub const RATE_WINDOW_MS: u64 = 60_000;

/// Where answers come from. (One per node, so the variants' size difference is moot.)
#[allow(clippy::large_enum_variant)]
pub enum Provider {
    /// No LLM configured: lexical-overlap judge, marked placeholder replies.
    Offline,
    /// An OpenAI-compatible endpoint per purpose.
    Remote {
        /// The shared client.
        client: LlmClient,
        /// Judge settings.
        judge: Endpoint,
        /// Reply settings.
        reply: Endpoint,
    },
}

/// The node's turn-taking state: who it is, whom it knows, what it has seen claimed.
pub struct Brain {
    /// This bot.
    pub me: BotSettings,
    /// The other bots.
    pub colleagues: Vec<BotSettings>,
    /// Finds @mentions against the whole roster.
    pub matcher: MentionMatcher,
    /// The LLM, or the offline provider.
    pub provider: Provider,
    /// Claims and replies per trigger.
    pub board: ClaimBoard,
    /// Set once the judge endpoint refused structured output.
    schema_unsupported: std::sync::atomic::AtomicBool,
    /// Client for the sidecar agent's webhook, when one is configured.
    agent: Option<(reqwest::Client, String)>,
    metrics: Arc<Metrics>,
    events: EventBus,
}

/// Whether an error is a server refusing the `response_format` we sent.
fn rejects_schema(e: &crate::llm::LlmError) -> bool {
    matches!(e, crate::llm::LlmError::Http { status: 400 | 422 | 500, body } if body.contains("response_format"))
}

/// Silent decisions of the cheap local filters, for messages that were never this
/// bot's to answer: logged at debug, counted as every decision is.
const ROUTINE_SILENCE: &[&str] = &[
    "not_mentioned",
    "addressed_to_other",
    "acknowledgement",
    "ignores_bots",
];

/// Whether a decision means this bot passed on the trigger for good.
pub fn passes(action: &str, reason: &str) -> bool {
    matches!(action, "yield" | "yield_writing")
        || matches!(reason, "judge_declined" | "rejudged_silent")
}

/// Builds the roster the matcher needs.
pub fn roster(bots: &[BotSettings]) -> Vec<Member> {
    bots.iter()
        .map(|b| Member {
            name: b.name.clone(),
            aliases: b.aliases.clone(),
            open_ids: b.open_id().map(|o| vec![o.to_string()]).unwrap_or_default(),
        })
        .collect()
}

/// Endpoints for judge and reply from `[llm]` and its overrides.
pub fn endpoints(
    llm: &LlmSettings,
    keys: &std::collections::HashMap<String, String>,
) -> (Endpoint, Endpoint) {
    let make = |o: Option<&crate::config::LlmOverride>, purpose: Purpose| {
        let o = o.cloned().unwrap_or_default();
        let mut ep = Endpoint::new(
            o.base_url.unwrap_or_else(|| llm.base_url.clone()),
            o.model.unwrap_or_else(|| llm.model.clone()),
        );
        ep.api_key = o
            .api_key_env
            .as_ref()
            .or(llm.api_key_env.as_ref())
            .and_then(|v| keys.get(v).cloned());
        let default_timeout = if purpose == Purpose::Judge {
            llm.timeout_ms.min(10_000)
        } else {
            llm.timeout_ms
        };
        ep.timeout = Duration::from_millis(o.timeout_ms.unwrap_or(default_timeout));
        ep.connect_timeout = Duration::from_secs(3);
        ep.max_tokens = o.max_tokens.unwrap_or(if purpose == Purpose::Judge {
            24
        } else {
            llm.max_tokens
        });
        ep.temperature = o
            .temperature
            .or(llm.temperature)
            .or(if purpose == Purpose::Judge {
                Some(0.0)
            } else {
                None
            });
        ep.json_schema = purpose == Purpose::Judge && llm.json_schema;
        ep.retries = if purpose == Purpose::Judge { 1 } else { 2 };
        ep
    };
    (
        make(llm.judge.as_ref(), Purpose::Judge),
        make(llm.reply.as_ref(), Purpose::Reply),
    )
}

impl Brain {
    /// Builds the brain for the node's bot.
    pub fn new(cfg: &NodeConfig, metrics: Arc<Metrics>, events: EventBus) -> anyhow::Result<Brain> {
        let provider = match &cfg.settings.llm {
            None => Provider::Offline,
            Some(llm) => {
                let (judge, reply) = endpoints(llm, &cfg.llm_keys);
                let http = LlmClient::build_http(Duration::from_secs(3))?;
                Provider::Remote {
                    client: LlmClient::new(http),
                    judge,
                    reply,
                }
            }
        };
        let agent = match &cfg.bot().agent {
            Some(a) => Some((
                reqwest::Client::builder()
                    .no_proxy()
                    .connect_timeout(Duration::from_secs(3))
                    .timeout(Duration::from_millis(a.timeout_ms))
                    .build()?,
                a.webhook.clone(),
            )),
            None => None,
        };
        Ok(Brain {
            schema_unsupported: std::sync::atomic::AtomicBool::new(false),
            agent,
            me: cfg.bot().clone(),
            colleagues: cfg.peers().cloned().collect(),
            matcher: MentionMatcher::new(&roster(&cfg.settings.bots)),
            provider,
            board: ClaimBoard::default(),
            metrics,
            events,
        })
    }

    /// Every newly recorded message passes here: a bot's reply to a trigger makes
    /// waiting bots yield.
    pub fn observe(&self, env: &Envelope) {
        if env.author.kind == AuthorKind::Bot {
            if let Some(trigger) = env.reply_to {
                self.board.answered(trigger, &env.author.name);
            }
        }
    }

    /// A peer's claim (at relevance 0: its withdrawal).
    pub fn on_claim(&self, env: &Envelope) {
        if let (Some(trigger), Some(r)) = (env.reply_to, env.relevance) {
            self.board.claim(trigger, &env.sender, r);
        }
    }

    /// For a peer's claim already on the board ([`Brain::on_claim`]): this bot's name
    /// when it has committed to answer, or answered, the claim's trigger — what the
    /// bridge's answer to the claim carries as `answered`.
    pub fn answering(&self, env: &Envelope) -> Option<String> {
        let trigger = env.reply_to.filter(|_| env.kind == Kind::Claim)?;
        self.board
            .answering(trigger, &self.me.name)
            .then(|| self.me.name.clone())
    }

    fn record(&self, msg: &Envelope, action: &str, reason: &str, detail: &str) {
        if passes(action, reason) {
            self.board.pass(msg.id);
        }
        self.metrics.decision(action, reason);
        if action == "silent" && ROUTINE_SILENCE.contains(&reason) {
            // One per message the bot stays out of: counted in the metrics, logged only
            // at debug (an info line each cost ~2 % of a busy receiver's CPU).
            tracing::debug!(bot = %self.me.name, trigger = %msg.id, from = %msg.author.name, depth = msg.depth, action, reason, detail, "decision");
        } else {
            tracing::info!(bot = %self.me.name, trigger = %msg.id, from = %msg.author.name, depth = msg.depth, action, reason, detail, "decision");
        }
        self.events.publish(Event::Decision {
            group: msg.group.clone(),
            trigger: msg.id.to_string(),
            action: action.into(),
            reason: reason.into(),
        });
    }

    /// The local rules for `msg`, given how many bot messages end the recent
    /// transcript (`recent_bots`, see [`crate::turn::policy::recent_bot_messages`]).
    pub fn decide(
        &self,
        mesh: &crate::config::MeshSettings,
        msg: &Envelope,
        platform: &[PlatformMention],
        recent_bots: usize,
        quiet: bool,
    ) -> Decision {
        let mentioned_names = self.matcher.mentioned(&msg.text, platform);
        let mentioned = mentioned_names.iter().any(|n| n == &self.me.name);
        let mentions_others = !mentioned && !mentioned_names.is_empty();
        decide(&Facts {
            me: &self.me,
            mesh,
            msg,
            mentioned,
            mentions_others,
            quiet,
            recent_bot_messages: recent_bots,
            passed_on_parent: msg.reply_to.is_some_and(|p| self.board.passed(p)),
        })
    }

    /// The judge prompt for `msg` with `context` before it.
    pub fn judge_prompt(&self, context: &[Arc<Envelope>], msg: &Envelope) -> String {
        build_prompt(&JudgeInput {
            me: &self.me,
            colleagues: &self.colleagues,
            context,
            msg,
        })
    }

    /// Asks the judge. `None` means it failed (logged and counted): stay silent.
    pub async fn judge(&self, context: &[Arc<Envelope>], msg: &Envelope) -> Option<Verdict> {
        match &self.provider {
            // Offline placeholders say little worth answering: interject on humans only.
            Provider::Offline if msg.author.kind == AuthorKind::Bot => Some(Verdict {
                speak: false,
                relevance: 0.0,
            }),
            Provider::Offline => Some(offline_verdict(&self.me, &msg.text)),
            Provider::Remote { client, judge, .. } => {
                let prompt = self.judge_prompt(context, msg);
                let messages = [ChatMessage::user(prompt)];
                let mut ep = judge.clone();
                if self
                    .schema_unsupported
                    .load(std::sync::atomic::Ordering::Relaxed)
                {
                    ep.json_schema = false;
                    ep.json_object = judge.json_schema;
                }
                let text = match self.call(client, &ep, Purpose::Judge, &messages).await {
                    Ok(text) => text,
                    Err(e) if ep.json_schema && rejects_schema(&e) => {
                        // Some servers (llama-cpp-python) refuse `json_schema` but accept
                        // `json_object` with a schema; the tolerant parser copes either way.
                        self.schema_unsupported
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(bot = %self.me.name, "the judge endpoint refuses response_format json_schema; using json_object from now on");
                        ep.json_schema = false;
                        ep.json_object = true;
                        self.call(client, &ep, Purpose::Judge, &messages)
                            .await
                            .ok()?
                    }
                    Err(_) => return None,
                };
                let v = parse_verdict(&text);
                if v.is_none() {
                    self.metrics.llm_call("judge", "unparsable", 0.0, 0, 0);
                    tracing::warn!(bot = %self.me.name, trigger = %msg.id, answer = %crate::turn::judge::trim(&text, 200), "judge answer not understood; staying silent");
                }
                v
            }
        }
    }

    /// Hands the turn to the sidecar agent. `Ok(Some(text))`: it answered in the
    /// response; `Ok(None)`: it will answer later through `POST /v1/messages`.
    async fn ask_agent(
        &self,
        client: &reqwest::Client,
        url: &str,
        turn: &Turn<'_>,
    ) -> Result<Option<String>, String> {
        let started = Instant::now();
        let result = async {
            let resp = client
                .post(url)
                .json(turn)
                .send()
                .await
                .map_err(|e| format!("transport: {e}"))?;
            let status = resp.status();
            let body = resp
                .bytes()
                .await
                .map_err(|e| format!("reading body: {e}"))?;
            if status == reqwest::StatusCode::ACCEPTED || status == reqwest::StatusCode::NO_CONTENT
            {
                return Ok(None);
            }
            if !status.is_success() {
                return Err(format!(
                    "status {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(200)])
                ));
            }
            /// The agent's in-response answer.
            #[derive(Deserialize)]
            struct AgentAnswer {
                text: Option<String>,
            }
            let a: AgentAnswer = serde_json::from_slice(&body)
                .map_err(|e| format!("answer is not {{\"text\": …}}: {e}"))?;
            Ok(a.text
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()))
        }
        .await;
        let label = match &result {
            Ok(Some(_)) => "ok",
            Ok(None) => "deferred",
            Err(_) => "failed",
        };
        self.metrics
            .llm_call("agent", label, started.elapsed().as_secs_f64(), 0, 0);
        result
    }

    /// Writes the reply text. `None` means the LLM failed (logged and counted).
    pub async fn write_reply(
        &self,
        context: &[Arc<Envelope>],
        msg: &Envelope,
        why: &str,
    ) -> Option<String> {
        match &self.provider {
            Provider::Offline => Some(crate::turn::reply::offline_reply(&self.me, msg, why)),
            Provider::Remote { client, reply, .. } => {
                let messages =
                    crate::turn::reply::messages(&self.me, &self.colleagues, context, msg);
                let text = self
                    .call(client, reply, Purpose::Reply, &messages)
                    .await
                    .ok()?;
                let text = text.trim().to_string();
                (!text.is_empty()).then_some(text)
            }
        }
    }

    async fn call(
        &self,
        client: &LlmClient,
        ep: &Endpoint,
        purpose: Purpose,
        messages: &[ChatMessage],
    ) -> Result<String, crate::llm::LlmError> {
        let started = Instant::now();
        match client.complete(ep, purpose, messages).await {
            Ok(c) => {
                self.metrics.llm_call(
                    purpose.as_str(),
                    "ok",
                    started.elapsed().as_secs_f64(),
                    c.usage.prompt_tokens,
                    c.usage.completion_tokens,
                );
                Ok(c.text)
            }
            Err(e) => {
                self.metrics.llm_call(
                    purpose.as_str(),
                    e.label(),
                    started.elapsed().as_secs_f64(),
                    0,
                    0,
                );
                tracing::warn!(bot = %self.me.name, purpose = purpose.as_str(), error = %e, "LLM call failed");
                Err(e)
            }
        }
    }
}

/// Context for a judge or reply: up to `k` messages before `msg` in its group.
fn context_before(node: &Node, msg: &Envelope, k: usize) -> Vec<Arc<Envelope>> {
    let recent = node.transcripts.recent(&msg.group, k + 64);
    let end = recent
        .iter()
        .position(|e| e.id == msg.id)
        .unwrap_or(recent.len());
    let start = end.saturating_sub(k);
    recent[start..end].to_vec()
}

/// Runs the whole pipeline for one newly recorded message, with the platform's
/// mention list (Feishu `mentions[]`, empty elsewhere). Boxed with an explicit `Send`
/// because replying records a message, which spawns `consider` again.
pub fn consider(
    node: Arc<Node>,
    msg: Arc<Envelope>,
    platform: Vec<PlatformMention>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move { consider_with(node, msg, &platform).await })
}

/// [`consider`] with the platform's mention list (Feishu `mentions[]`).
pub async fn consider_with(node: Arc<Node>, msg: Arc<Envelope>, platform: &[PlatformMention]) {
    if let Some(d) = triage(&node, &msg, platform) {
        act(node, msg, d).await;
    }
}

/// The local rules for a newly recorded message: `None` when the bot stays silent (the
/// decision is recorded), else what [`act`] is to do. Cheap and synchronous, so the
/// node runs it as the message is recorded and spawns a turn only when there is one.
pub fn triage(node: &Node, msg: &Envelope, platform: &[PlatformMention]) -> Option<Decision> {
    let brain = &node.brain;
    let mesh = node.cfg.mesh();
    if msg.kind != Kind::Message {
        return None;
    }
    let recent_bots =
        node.transcripts
            .recent_bot_messages(&msg.group, 64, now_millis(), RATE_WINDOW_MS);
    let mut d = brain.decide(mesh, msg, platform, recent_bots, node.is_quiet());
    let age_secs = crate::wire::envelope::now_millis().saturating_sub(msg.sent_at) / 1000;
    if d.action != Action::Silent && age_secs > mesh.stale_after_secs {
        // A catch-up after downtime: on record, but the conversation has moved on.
        d.action = Action::Silent;
        d.reason = "stale";
    }
    if d.everyone {
        // A round: the colleagues' answers to it are what was asked for, not triggers
        // of their own, so they cost no judge call (unless they mention this bot).
        brain.board.pass(msg.id);
    }
    if d.action == Action::Silent {
        // Own messages are not worth a log line each.
        if d.reason != "own_message" {
            brain.record(msg, "silent", d.reason, "");
        }
        return None;
    }
    Some(d)
}

/// Carries out a [`triage`] decision that is not silence: judge, wait and claim,
/// write, post.
async fn act(node: Arc<Node>, msg: Arc<Envelope>, d: Decision) {
    let brain = &node.brain;
    let (why, relevance) = match d.action {
        Action::Silent => return,
        Action::Reply => {
            brain.record(&msg, "reply", d.reason, "");
            let why = if d.mentioned {
                Why::Mentioned
            } else {
                Why::AlwaysAnswers
            };
            (why, None)
        }
        Action::Judge => {
            brain.record(&msg, "judge", d.reason, "");
            let context = context_before(&node, &msg, brain.me.context_messages);
            let Some(v) = brain.judge(&context, &msg).await else {
                brain.record(&msg, "silent", "judge_failed", "");
                return;
            };
            if !v.speak || v.relevance < brain.me.min_relevance {
                brain.record(
                    &msg,
                    "silent",
                    "judge_declined",
                    &format!("speak={} relevance={:.2}", v.speak, v.relevance),
                );
                return;
            }
            if d.mentioned {
                // Mentioned past the threshold, and the judge agreed: answer without a wait.
                (Why::Mentioned, None)
            } else {
                (
                    Why::Interjected {
                        relevance: v.relevance,
                    },
                    Some(v.relevance.max(MIN_CLAIM)),
                )
            }
        }
    };
    // The claim's acknowledgements, for an interjection (a round to everyone does not
    // wait for them: nobody yields there).
    let mut acks = None;
    if let Some(r) = relevance {
        let Some(claim_acks) = wait_turn(&node, &msg, r, d.everyone).await else {
            return;
        };
        acks = Some(claim_acks).filter(|_| !d.everyone);
    }
    // From here on, every way out that posts nothing withdraws this bot's claim, so
    // the bots that stood by behind it re-enter (a yield is not final).
    let withdraw = |why: &str| {
        if relevance.is_some() {
            withdraw_claim(&node, &msg, why);
        }
    };
    if node.accepting.is_cancelled() {
        withdraw("shutting down");
        return;
    }
    let context = context_before(&node, &msg, brain.me.context_messages.max(12));
    let reason = match &why {
        Why::Mentioned => "mentioned",
        Why::Interjected { .. } => "interjected",
        Why::AlwaysAnswers => "always_answers",
        Why::Posted => "posted",
    };
    let text = if let Some((client, url)) = &brain.agent {
        let turn = Turn {
            bot: &brain.me.name,
            group: &msg.group,
            trigger: &msg,
            transcript: &context,
            why: reason,
            relevance,
            depth: msg.depth + 1,
            reply_to: msg.id,
        };
        match brain.ask_agent(client, url, &turn).await {
            Ok(Some(text)) => text,
            Ok(None) => {
                brain.record(
                    &msg,
                    "reply",
                    "handed_to_agent",
                    "the agent answers through POST /v1/messages",
                );
                return;
            }
            Err(e) => {
                brain.record(&msg, "silent", "agent_failed", &e);
                withdraw("agent failed");
                return;
            }
        }
    } else {
        let Some(text) = brain.write_reply(&context, &msg, reason).await else {
            brain.record(&msg, "silent", "reply_failed", "");
            withdraw("reply failed");
            return;
        };
        text
    };
    // The world may have moved during the LLM call: apply the hard rules once more.
    // In a round, the answers of the bots whose claims go first count against the
    // rate cap even before they arrive: they post first whatever happens, so counting
    // only what has arrived would let bots that finish together all pass the cap.
    let ahead = match relevance {
        Some(r) if d.everyone => brain.board.claims_ahead(msg.id, &brain.me.name, r),
        _ => Vec::new(),
    };
    let (recent_bots, due) = node.transcripts.recent_bot_messages_and_due(
        &msg.group,
        64,
        now_millis(),
        RATE_WINDOW_MS,
        &msg.id,
        &ahead,
    );
    let last = crate::turn::policy::last_check(
        node.cfg.mesh(),
        node.is_quiet(),
        msg.depth,
        recent_bots + due,
    );
    if let Some(reason) = last {
        brain.record(
            &msg,
            "silent",
            reason,
            &format!("checked again before sending: {recent_bots} bot messages recorded, {due} due from bots ahead in the round"),
        );
        withdraw(reason);
        return;
    }
    if let (Some(r), Some(acks)) = (relevance, acks.as_mut()) {
        // Wait until the claim has reached every peer, so that it cannot land on a peer
        // after that peer has answered too; a peer that already answers says so.
        let timeout = Duration::from_millis(brain.me.claim_ack_timeout_ms);
        let known = tokio::select! {
            a = acks.wait(timeout) => a,
            _ = node.accepting.cancelled() => {
                withdraw("shutting down");
                return;
            }
        };
        if let Some(bot) = known.answered.first() {
            brain.board.answered(msg.id, bot);
            brain.record(
                &msg,
                "yield_writing",
                "already_answered",
                &format!("{bot} answers it, by its acknowledgement of this bot's claim"),
            );
            withdraw("yielded while writing");
            return;
        }
        if !known.pending.is_empty() && brain.me.claim_ack_timeout_ms > 0 {
            tracing::warn!(bot = %brain.me.name, trigger = %msg.id, unacked = ?known.pending, timeout_ms = brain.me.claim_ack_timeout_ms, "claim not acknowledged by every peer in time; posting anyway");
            brain.record(
                &msg,
                "post",
                "claim_unacked",
                &format!("no acknowledgement from {}", known.pending.join(", ")),
            );
        }
        // Commit, in one step with the last standing check. Behind a better claim heard
        // meanwhile: stand by with the text written; go on only if that claim is
        // withdrawn (after the hard rules once more), then commit again.
        loop {
            let y = match brain.board.commit(msg.id, &brain.me.name, r) {
                Ok(()) => break,
                Err(y @ Yield::Answered { .. }) => Some(y),
                Err(Yield::BetterClaim { .. }) => {
                    let now = tokio::time::Instant::now();
                    let grace = grace_for(&brain.me, r);
                    tokio::select! {
                        y = brain.board.wait(msg.id, &brain.me.name, r, now, grace) => y,
                        _ = node.accepting.cancelled() => Some(Yield::Answered { bot: String::new() }),
                    }
                }
            };
            if let Some(y) = y {
                brain.record(
                    &msg,
                    "yield_writing",
                    y.reason(),
                    &format!("{y:?} while writing"),
                );
                withdraw("yielded while writing");
                return;
            }
            brain.record(
                &msg,
                "resume",
                "claim_withdrawn",
                "posting the reply written meanwhile",
            );
            let recent_bots =
                node.transcripts
                    .recent_bot_messages(&msg.group, 64, now_millis(), RATE_WINDOW_MS);
            let last = crate::turn::policy::last_check(
                node.cfg.mesh(),
                node.is_quiet(),
                msg.depth,
                recent_bots,
            );
            if let Some(reason) = last {
                brain.record(&msg, "silent", reason, "checked again before sending");
                withdraw(reason);
                return;
            }
        }
    }
    let reply = Envelope {
        v: PROTOCOL_VERSION,
        id: Ulid::new(),
        kind: Kind::Message,
        group: msg.group.clone(),
        sender: brain.me.name.clone(),
        author: Author {
            name: brain.me.name.clone(),
            kind: AuthorKind::Bot,
        },
        text,
        depth: msg.depth + 1,
        reply_to: Some(msg.id),
        root: msg.root.or(Some(msg.id)),
        platform_msg_id: None,
        sent_at: now_millis(),
        relevance: None,
        why: Some(why),
    };
    match node.publish(reply.clone(), "self").await {
        Ok(_) => {
            tracing::info!(bot = %brain.me.name, id = %reply.id, trigger = %msg.id, depth = reply.depth, reason, "replied")
        }
        Err(e) => {
            tracing::error!(bot = %brain.me.name, trigger = %msg.id, error = %e, "reply could not be recorded; not sent")
        }
    }
}

/// What a sidecar agent receives when its bot takes a turn (docs/sidecar.md).
#[derive(Debug, Serialize)]
pub struct Turn<'a> {
    /// The bot taking the turn.
    pub bot: &'a str,
    /// The group.
    pub group: &'a str,
    /// The message to answer.
    pub trigger: &'a Envelope,
    /// Recent messages before it, oldest first.
    pub transcript: &'a [Arc<Envelope>],
    /// Why the bot speaks: mentioned, interjected, always_answers.
    pub why: &'a str,
    /// The judge's relevance, for interjections.
    pub relevance: Option<f64>,
    /// The depth the reply will carry.
    pub depth: u32,
    /// The id to pass as `reply_to` when answering later through `POST /v1/messages`.
    pub reply_to: Ulid,
}

/// A claim envelope for `msg` at `relevance` ([`WITHDRAWN`]: a withdrawal).
fn claim_envelope(me: &str, msg: &Envelope, relevance: f64) -> Envelope {
    Envelope {
        v: PROTOCOL_VERSION,
        id: Ulid::new(),
        kind: Kind::Claim,
        group: msg.group.clone(),
        sender: me.to_string(),
        author: Author {
            name: me.to_string(),
            kind: AuthorKind::Bot,
        },
        text: String::new(),
        depth: msg.depth,
        reply_to: Some(msg.id),
        root: msg.root.or(Some(msg.id)),
        platform_msg_id: None,
        sent_at: now_millis(),
        relevance: Some(relevance),
        why: None,
    }
}

/// Withdraws this bot's claim on `msg` (if it still holds one) and tells the peers,
/// so the bots that stood by behind it re-enter.
pub fn withdraw_claim(node: &Arc<Node>, msg: &Envelope, why: &str) {
    let brain = &node.brain;
    let me = brain.me.name.clone();
    if !brain.board.has_claim(msg.id, &me) {
        return;
    }
    brain.board.withdraw(msg.id, &me);
    if brain.board.answered_by_other(msg.id, &me) {
        // Everyone hears that answer anyway: nobody is left behind this claim.
        return;
    }
    let env = claim_envelope(&me, msg, WITHDRAWN);
    node.broadcast(&env);
    node.events.publish(Event::Claim {
        envelope: Arc::new(env),
    });
    brain.metrics.decision("withdraw", "claim");
    tracing::info!(bot = %me, trigger = %msg.id, why, "claim withdrawn");
}

/// Claims the trigger, waits the relevance-scaled delay, stands by behind a better
/// claim (and re-enters if it is withdrawn), yields if the trigger is answered, and
/// re-judges once if others spoke meanwhile. `Some` means: go ahead and reply; it
/// holds the claim's acknowledgements, to await before posting.
///
/// On a message that asks everyone (`everyone`), the claim only staggers the answers:
/// nobody yields to a better claim or to another answer, and there is no re-judge
/// (the others' answers are what was asked for).
async fn wait_turn(
    node: &Arc<Node>,
    msg: &Envelope,
    relevance: f64,
    everyone: bool,
) -> Option<ClaimAcks> {
    let brain = &node.brain;
    let me = brain.me.name.clone();
    let relevance = relevance.max(MIN_CLAIM);
    let delay = delay_for(&brain.me, relevance);
    brain.board.claim(msg.id, &me, relevance);
    let claim = claim_envelope(&me, msg, relevance);
    let acks = node.broadcast_tracked(&claim);
    node.events.publish(Event::Claim {
        envelope: Arc::new(claim),
    });
    tracing::info!(bot = %me, trigger = %msg.id, relevance, delay_ms = delay.as_millis() as u64, everyone, "claimed; waiting");
    let deadline = tokio::time::Instant::now() + delay;
    if everyone {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = node.accepting.cancelled() => {
                withdraw_claim(node, msg, "shutting down");
                return None;
            }
        }
        brain.record(
            msg,
            "judge",
            "everyone_asked",
            "no yield on a message to everyone",
        );
        return Some(acks);
    }
    let grace = grace_for(&brain.me, relevance);
    let outcome = tokio::select! {
        y = brain.board.wait(msg.id, &me, relevance, deadline, grace) => y,
        _ = node.accepting.cancelled() => {
            withdraw_claim(node, msg, "shutting down");
            return None;
        }
    };
    if let Some(y) = outcome {
        brain.record(msg, "yield", y.reason(), &format!("{y:?}"));
        // Gave up for good (answered, or the better claimant vanished): let any bot
        // behind this one go.
        withdraw_claim(node, msg, "yielded");
        return None;
    }
    if brain.board.resumed(msg.id) {
        brain.record(
            msg,
            "resume",
            "claim_withdrawn",
            "a better claim was withdrawn",
        );
    }
    let newer: Vec<Arc<Envelope>> = node
        .transcripts
        .since(&msg.group, &msg.id)
        .into_iter()
        .filter(|e| e.author.name != me)
        .collect();
    if !newer.is_empty() {
        let context = context_before(
            node,
            newer.last().expect("non-empty"),
            brain.me.context_messages,
        );
        let mut fresh = context;
        fresh.push(newer.last().expect("non-empty").clone());
        let fresh_context: Vec<Arc<Envelope>> =
            fresh.iter().filter(|e| e.id != msg.id).cloned().collect();
        match brain.judge(&fresh_context, msg).await {
            Some(v) if v.speak && v.relevance >= brain.me.min_relevance => {
                brain.record(
                    msg,
                    "judge",
                    "rejudged_speak",
                    &format!("relevance={:.2}", v.relevance),
                );
            }
            _ => {
                brain.record(
                    msg,
                    "silent",
                    "rejudged_silent",
                    &format!("{} newer messages", newer.len()),
                );
                withdraw_claim(node, msg, "re-judged silent");
                return None;
            }
        }
    }
    Some(acks)
}

/// `POST /v1/explain` and `botmesh explain` input.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplainRequest {
    /// The hypothetical message.
    pub text: String,
    /// Its author: a bot's name or a human's (default "human").
    #[serde(default)]
    pub from: Option<String>,
    /// Its depth (default 0 for humans, 1 for bots).
    #[serde(default)]
    pub depth: Option<u32>,
    /// The group (default `[mesh].group`).
    #[serde(default)]
    pub group: Option<String>,
    /// Actually call the judge.
    #[serde(default)]
    pub call_llm: bool,
}

/// What explain answers.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// The bot deciding.
    pub bot: String,
    /// Whether it is mentioned.
    pub mentioned: bool,
    /// Everyone the message mentions.
    pub mentions: Vec<String>,
    /// reply, judge or silent.
    pub action: String,
    /// Why.
    pub reason: String,
    /// The exact judge prompt (present when the action is judge).
    pub judge_prompt: Option<String>,
    /// Its size in bytes.
    pub judge_prompt_bytes: Option<usize>,
    /// The judge's answer, when asked to call it (or offline).
    pub verdict: Option<VerdictJson>,
    /// The delay the bot would wait before interjecting, in ms (without jitter).
    pub delay_ms: Option<u64>,
    /// The provider in use.
    pub provider: &'static str,
}

/// A verdict as JSON.
#[derive(Debug, Clone, Serialize)]
pub struct VerdictJson {
    /// Speak or not.
    pub speak: bool,
    /// 0..1.
    pub relevance: f64,
}

/// Builds the hypothetical envelope for an explain request.
fn hypothetical(cfg: &NodeConfig, req: &ExplainRequest) -> Result<Envelope, String> {
    let from = req.from.clone().unwrap_or_else(|| "human".into());
    let is_bot = cfg.member(&from).is_some();
    let depth = req.depth.unwrap_or(if is_bot { 1 } else { 0 });
    if !is_bot && depth != 0 {
        return Err(format!(
            "{from:?} is not a bot in peers.toml, so it is a human and its depth is 0"
        ));
    }
    Ok(Envelope {
        v: PROTOCOL_VERSION,
        id: Ulid::new(),
        kind: Kind::Message,
        group: req
            .group
            .clone()
            .unwrap_or_else(|| cfg.mesh().group.clone()),
        sender: from.clone(),
        author: Author {
            name: from,
            kind: if is_bot {
                AuthorKind::Bot
            } else {
                AuthorKind::Human
            },
        },
        text: req.text.clone(),
        depth,
        reply_to: None,
        root: None,
        platform_msg_id: None,
        sent_at: now_millis(),
        relevance: None,
        why: None,
    })
}

/// Explains the decision for a hypothetical message, with the given context.
pub async fn explain(
    brain: &Brain,
    cfg: &NodeConfig,
    req: ExplainRequest,
    recent: &[Arc<Envelope>],
    quiet: bool,
) -> Result<Explanation, String> {
    let msg = hypothetical(cfg, &req)?;
    let recent_bots = recent_bot_messages(recent.iter(), now_millis(), RATE_WINDOW_MS);
    let d = brain.decide(cfg.mesh(), &msg, &[], recent_bots, quiet);
    let context_start = recent.len().saturating_sub(brain.me.context_messages);
    let context = &recent[context_start..];
    let mut out = Explanation {
        bot: brain.me.name.clone(),
        mentioned: d.mentioned,
        mentions: brain.matcher.mentioned(&msg.text, &[]),
        action: d.action.as_str().into(),
        reason: d.reason.into(),
        judge_prompt: None,
        judge_prompt_bytes: None,
        verdict: None,
        delay_ms: None,
        provider: match brain.provider {
            Provider::Offline => "offline",
            Provider::Remote { .. } => "llm",
        },
    };
    if d.action == Action::Judge {
        let prompt = brain.judge_prompt(context, &msg);
        out.judge_prompt_bytes = Some(prompt.len());
        out.judge_prompt = Some(prompt);
        let verdict = match brain.provider {
            Provider::Offline => brain.judge(context, &msg).await,
            Provider::Remote { .. } if req.call_llm => brain.judge(context, &msg).await,
            Provider::Remote { .. } => None,
        };
        if let Some(v) = verdict {
            if !d.mentioned && v.speak && v.relevance >= brain.me.min_relevance {
                let me = &brain.me;
                let span = me.max_delay_ms.saturating_sub(me.min_delay_ms) as f64;
                out.delay_ms =
                    Some((me.min_delay_ms as f64 + (1.0 - v.relevance) * span).round() as u64);
            }
            out.verdict = Some(VerdictJson {
                speak: v.speak,
                relevance: v.relevance,
            });
        }
    }
    Ok(out)
}

/// Explain against a running node's live transcript.
pub async fn explain_live(
    node: &Arc<Node>,
    req: ExplainRequest,
) -> Result<serde_json::Value, String> {
    let group = req
        .group
        .clone()
        .unwrap_or_else(|| node.cfg.mesh().group.clone());
    let recent = node.transcripts.recent(&group, 64);
    let e = explain(&node.brain, &node.cfg, req, &recent, node.is_quiet()).await?;
    Ok(serde_json::to_value(e).expect("serializes"))
}
