//! `Brain`: a bot's turn-taking state — who it is, whom it knows, what it has seen
//! claimed — and its two LLM questions: the judge ("should I interject?") and the
//! reply. The calls go through [`Llm`], so the simulator can script them.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;

use crate::config::{BotSettings, NodeConfig};
use crate::engine::budget::{Budget, Exhausted, Limits};
use crate::engine::context::ModelPrompt;
use crate::engine::metered::LlmCall;
use crate::engine::model::{ShowTool, ToolLoop};
use crate::engine::{Llm, MeteredLlm, ReplyEngine};
use crate::llm::{estimate_tokens, parse_verdict, ChatMessage, Endpoint, Purpose, Verdict};
use crate::telemetry::metrics::Metrics;
use crate::turn::control::{GroupStops, Trail, WhyLimits};
use crate::turn::judge::{build_prompt, offline_verdict, prompt_hash, JudgeInput};
use crate::turn::mention::{Member, MentionMatcher, PlatformMention};
use crate::turn::policy::{decide, silenced_whoever_is_mentioned, Decision, Facts};
use crate::turn::scheduler::{ClaimBoard, ClaimReply};
use crate::wire::envelope::{AuthorKind, Envelope, Kind};

pub(crate) use crate::turn::tuning::{endpoints, Provider, Tuning};

/// The node's turn-taking state: who it is, whom it knows, what it has seen claimed.
pub struct Brain {
    /// What a reload may change; read through [`Brain::tuning`] or [`Brain::me`].
    tuning: RwLock<Arc<Tuning>>,
    /// Finds @mentions against the whole roster (names and aliases need a restart).
    pub(crate) matcher: MentionMatcher,
    /// Claims and replies per trigger.
    pub board: ClaimBoard,
    /// Shared verdicts heard, per trigger (`[mesh] judge = "shared"`).
    pub(crate) verdicts: crate::turn::heard_verdicts::Verdicts,
    /// Today's LLM use against [`Tuning::budget`].
    pub(crate) budget: Budget,
    /// Set once the judge endpoint refused structured output.
    schema_unsupported: std::sync::atomic::AtomicBool,
    /// What writes the replies: the built-in model (with its MCP tools), a sidecar
    /// webhook, a coding agent… (`engine::of` picks it from the config).
    pub(crate) engine: Box<dyn ReplyEngine>,
    /// The ACP agent's permission questions waiting for a person's `/allow` or
    /// `/deny` (an ACP bot of a running node only).
    pub(crate) permissions: Option<Arc<crate::turn::approval::ChatAsker>>,
    /// Decisions and LLM calls are counted here.
    pub(crate) metrics: Arc<Metrics>,
    /// The decisions about recent messages, which a person's `/why` reads back.
    pub(crate) trail: Trail,
    /// Each group's stop token, which a person's `/stop` cancels.
    pub(crate) stops: GroupStops,
    /// The group tools' questions to colleagues, turns in flight and the messages
    /// addressed to the bot not handed out yet (`turn::asks`).
    pub(crate) asks: crate::turn::asks::Asks,
    /// How many `/why` each person may ask in each group.
    pub(crate) why_limits: WhyLimits,
}

/// A judge call's answer and the prompt it was asked with.
#[derive(Debug, Clone)]
pub(crate) struct Judged {
    /// The verdict; `None` when the call failed or the answer was not understood.
    pub verdict: Option<Verdict>,
    /// The judge model (`offline` for the offline judge).
    pub model: String,
    /// [`prompt_hash`] of the messages sent (none offline: nothing is sent).
    pub prompt_hash: Option<String>,
    /// The prompt's size, bytes.
    pub prompt_bytes: usize,
}

/// The reply a drafting judge is still writing ([`Brain::judge_drafting`]).
pub(crate) struct PendingDraft {
    /// The rest of the call: the reply. Dropping it cancels the request.
    rest: futures_util::future::BoxFuture<
        'static,
        Result<crate::llm::Completion, crate::llm::LlmError>,
    >,
    /// When the call was made.
    started: Instant,
    /// Prompt and completion tokens already counted for it (estimated when the verdict
    /// line came, since a dropped call never learns its usage).
    counted: (u64, u64),
    /// When the bot has tools: the call's endpoint, messages and offered tools, so
    /// the tool loop goes on from a rest that asks for tools.
    tooled: Option<(Endpoint, Vec<ChatMessage>, Vec<crate::llm::ToolSpec>)>,
}

pub(crate) use crate::engine::Reply;

/// Whether an error is a server refusing the `response_format` we sent.
fn rejects_schema(e: &crate::llm::LlmError) -> bool {
    matches!(e, crate::llm::LlmError::Http { status: 400 | 422 | 500, body } if body.contains("response_format"))
}

/// The roster the matcher needs: every bot by its name and aliases (no platform ids:
/// [`roster_with`]).
pub(crate) fn roster(bots: &[BotSettings]) -> Vec<Member> {
    roster_with(bots, |_| Vec::new())
}

/// The roster with each bot's platform ids (`ids`: the platforms', as
/// `platform::registry::member_ids` gives them), which mentions name bots by.
pub(crate) fn roster_with(
    bots: &[BotSettings],
    ids: impl Fn(&BotSettings) -> Vec<String>,
) -> Vec<Member> {
    bots.iter()
        .map(|b| Member {
            name: b.name.clone(),
            aliases: b.aliases.clone(),
            open_ids: ids(b),
        })
        .collect()
}

impl Brain {
    /// Builds the brain for the node's bot. `member_ids`: the ids the platforms'
    /// mentions name a bot by (`platform::registry::member_ids`), which the mention
    /// matcher knows every bot by.
    pub fn new(
        cfg: &NodeConfig,
        metrics: Arc<Metrics>,
        member_ids: fn(&BotSettings) -> Vec<String>,
    ) -> anyhow::Result<Brain> {
        let tuning = Tuning::of(cfg);
        let engine = crate::engine::of(cfg, &metrics)?;
        let mut brain = Brain::with(tuning, &cfg.settings.bots, metrics);
        brain.matcher = MentionMatcher::new(&roster_with(&cfg.settings.bots, member_ids));
        brain.engine = engine;
        Ok(brain)
    }

    /// Starts what the bot's reply engine runs (the model's MCP tool servers, a
    /// coding agent): what a running node does (not `botmesh explain`). What cannot
    /// start is an error naming it, before the node serves. `model_mesh`: the node's
    /// own `mesh` server for the model (`group_tools = true`); `group_servers`: the
    /// `mesh` MCP server for each group's agent session. `Some`: the agent's
    /// permission questions, for the node to post in the chat (a person's `/allow` or
    /// `/deny` answers them through [`Brain::permissions`]).
    pub(crate) async fn start_engine(
        &mut self,
        cfg: &NodeConfig,
        model_mesh: Option<crate::config::McpServerSettings>,
        group_servers: Option<crate::agent::acp::GroupServers>,
    ) -> anyhow::Result<
        Option<tokio::sync::mpsc::UnboundedReceiver<crate::turn::approval::AskedQuestion>>,
    > {
        let (asker, questions) = match self.engine.asks_permission() {
            true => {
                let (asker, questions) = crate::turn::approval::ChatAsker::new();
                (Some(asker), Some(questions))
            }
            false => (None, None),
        };
        let starting = crate::engine::Starting {
            cfg,
            model_mesh,
            group_servers,
            metrics: self.metrics.clone(),
            asker: asker
                .clone()
                .map(|a| a as Arc<dyn crate::agent::acp::PermissionAsker>),
        };
        tracing::info!(bot = %cfg.bot().name, engine = self.engine.name(), "starting the reply engine");
        self.engine.start(starting).await?;
        self.permissions = asker;
        Ok(questions)
    }

    /// A brain tuned by `tuning` (`roster`: every bot, for mentions, and for how long
    /// a colleague's agent may hold the turn), without a
    /// sidecar agent: what the simulator builds for each of its bots.
    pub(crate) fn with(tuning: Tuning, roster_of: &[BotSettings], metrics: Arc<Metrics>) -> Brain {
        Brain {
            schema_unsupported: std::sync::atomic::AtomicBool::new(false),
            engine: Box::<crate::engine::model::Model>::default(),
            permissions: None,
            tuning: RwLock::new(Arc::new(tuning)),
            matcher: MentionMatcher::new(&roster(roster_of)),
            board: ClaimBoard::with_turn_limits(turn_limits(roster_of)),
            verdicts: crate::turn::heard_verdicts::Verdicts::default(),
            budget: Budget::default(),
            metrics,
            trail: Trail::default(),
            stops: GroupStops::default(),
            asks: crate::turn::asks::Asks::default(),
            why_limits: WhyLimits::default(),
        }
    }

    /// The current tuning: one consistent snapshot of everything a reload may change.
    pub(crate) fn tuning(&self) -> Arc<Tuning> {
        self.tuning.read().clone()
    }

    /// This bot's current settings.
    pub(crate) fn me(&self) -> Arc<BotSettings> {
        self.tuning.read().me.clone()
    }

    /// Puts a reloaded configuration's tuning in force for every decision from now
    /// on; turns already under way finish with the snapshot they took.
    pub(crate) fn retune(&self, cfg: &NodeConfig) {
        let tuning = Arc::new(Tuning::of(cfg));
        *self.tuning.write() = tuning;
        // The judge endpoint may have changed: ask it for structured output again.
        self.schema_unsupported
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// When today's LLM budget is spent at `now_ms` (logged and counted the first time
    /// each day): what the bot does past it. `None`: no budget, or some left.
    pub(crate) fn spent_today(&self, now_ms: u64) -> Option<crate::config::OverBudget> {
        let limits = self.tuning().budget;
        if limits.calls.is_none() && limits.tokens.is_none() {
            return None;
        }
        self.over_budget(&limits, now_ms).map(|_| limits.over)
    }

    /// Whether today's LLM budget is spent at `now_ms`: logs and counts it the first
    /// time each day.
    fn over_budget(&self, limits: &Limits, now_ms: u64) -> Option<Exhausted> {
        let e = self.budget.exhausted(limits, now_ms)?;
        if e.first {
            self.metrics
                .budget_exhausted
                .get_or_create(&crate::telemetry::metrics::ResultLabel {
                    result: e.limit.into(),
                })
                .inc();
            tracing::warn!(bot = %self.me().name, limit = e.limit, daily_calls = ?limits.calls, daily_tokens = ?limits.tokens, over_budget = ?limits.over, "daily LLM budget spent: no more judging until local midnight");
        }
        Some(e)
    }

    /// Every newly recorded message passes here: a bot's reply to a trigger makes
    /// waiting bots yield (its status does not: the turn may still end without one).
    pub(crate) fn observe(&self, env: &Envelope) {
        if env.author.kind == AuthorKind::Bot && env.kind == Kind::Message {
            if let Some(trigger) = env.reply_to {
                self.board.answered(trigger, &env.author.name);
            }
        }
    }

    /// A peer's claim (at relevance 0: its withdrawal), or a shared judge's verdict.
    pub(crate) fn on_claim(&self, env: &Envelope) {
        if env.kind == Kind::Verdict {
            if let (Some(trigger), Some(entries)) = (env.reply_to, &env.verdicts) {
                tracing::info!(bot = %self.me().name, %trigger, from = %env.sender, entries = ?entries, "shared verdict heard");
                self.verdicts.put(trigger, &env.sender, entries.clone());
            }
            return;
        }
        if let (Some(trigger), Some(r)) = (env.reply_to, env.relevance) {
            self.board.claim(trigger, &env.sender, r);
        }
    }

    /// For a peer's claim already on the board ([`Brain::on_claim`]): what the
    /// bridge answers the claimant — this bot's name when it has committed to answer,
    /// or answered, the trigger (`answered`), or that its judge about the trigger is
    /// still out (`judging`: this bot then owes the peers its claim or a withdrawal).
    pub(crate) fn answer_claim(&self, env: &Envelope) -> ClaimReply {
        match env.reply_to.filter(|_| env.kind == Kind::Claim) {
            Some(trigger) => self
                .board
                .answer_claim(trigger, &self.me().name, &env.sender),
            None => ClaimReply::default(),
        }
    }

    /// The local rules for `msg`, given how many bot messages end the recent
    /// transcript (`recent_bots`, see [`crate::store::turn_queries::recent_bot_messages`]).
    pub(crate) fn decide(
        &self,
        mesh: &crate::config::MeshSettings,
        msg: &Envelope,
        platform: &[PlatformMention],
        recent_bots: usize,
        quiet: bool,
    ) -> Decision {
        let passed_on_parent = msg.reply_to.is_some_and(|p| self.board.passed(p));
        let me = self.me();
        self.decide_as(
            &me,
            mesh,
            msg,
            platform,
            recent_bots,
            quiet,
            passed_on_parent,
        )
    }

    /// The local rules for `msg` as bot `who` would apply them, as far as this node
    /// can tell (the shared judge asks only about the bots whose rules say judge).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decide_as(
        &self,
        who: &BotSettings,
        mesh: &crate::config::MeshSettings,
        msg: &Envelope,
        platform: &[PlatformMention],
        recent_bots: usize,
        quiet: bool,
        passed_on_parent: bool,
    ) -> Decision {
        let mut facts = Facts {
            me: who,
            mesh,
            msg,
            mentioned: false,
            mentions_others: false,
            quiet,
            recent_bot_messages: recent_bots,
            passed_on_parent,
        };
        // The rules that hold whoever is mentioned come first, so a message they
        // silence (every one of a flood at the rate cap) costs no scan of its text.
        if let Some(d) = silenced_whoever_is_mentioned(&facts) {
            return d;
        }
        (facts.mentioned, facts.mentions_others) = self.mentions_of(who, msg, platform);
        decide(&facts)
    }

    /// Whether `msg` mentions bot `who`, and whether it mentions only others. In a
    /// direct chat a person talks to the bot alone: no mention needed.
    pub(crate) fn mentions_of(
        &self,
        who: &BotSettings,
        msg: &Envelope,
        platform: &[PlatformMention],
    ) -> (bool, bool) {
        let mentioned_names = self.matcher.mentioned(&msg.text, platform);
        let direct = crate::wire::envelope::is_direct_group(&msg.group)
            && msg.author.kind == crate::wire::envelope::AuthorKind::Human;
        let mentioned = direct || mentioned_names.iter().any(|n| n == &who.name);
        (mentioned, !mentioned && !mentioned_names.is_empty())
    }

    /// The judge prompt for `msg` with `context` before it.
    pub(crate) fn judge_prompt(&self, context: &[Arc<Envelope>], msg: &Envelope) -> String {
        let t = self.tuning();
        build_prompt(&JudgeInput {
            me: &t.me,
            colleagues: &t.colleagues,
            context,
            msg,
        })
    }

    /// Asks the judge. `None` means it failed (logged and counted): stay silent.
    pub(crate) async fn judge(
        &self,
        llm: &dyn Llm,
        context: &[Arc<Envelope>],
        msg: &Envelope,
    ) -> Option<Verdict> {
        self.judge_traced(llm, context, msg).await.verdict
    }

    /// [`Brain::judge`], also saying which prompt was sent (for the verdict log).
    pub(crate) async fn judge_traced(
        &self,
        llm: &dyn Llm,
        context: &[Arc<Envelope>],
        msg: &Envelope,
    ) -> Judged {
        let offline = |verdict| Judged {
            verdict: Some(verdict),
            model: "offline".into(),
            prompt_hash: None,
            prompt_bytes: 0,
        };
        let t = self.tuning();
        match &t.provider {
            // Offline placeholders say little worth answering: interject on humans only.
            Provider::Offline if msg.author.kind == AuthorKind::Bot => offline(Verdict {
                speak: false,
                relevance: 0.0,
            }),
            Provider::Offline => offline(offline_verdict(&t.me, &msg.text)),
            Provider::Remote { judge, .. } => {
                let prompt = self.judge_prompt(context, msg);
                let messages = [ChatMessage::user(prompt)];
                let mut out = Judged {
                    verdict: None,
                    model: judge.model.clone(),
                    prompt_hash: Some(prompt_hash(&messages)),
                    prompt_bytes: messages[0].content.len(),
                };
                let mut ep = judge.clone();
                if self
                    .schema_unsupported
                    .load(std::sync::atomic::Ordering::Relaxed)
                {
                    ep.json_schema = false;
                    ep.json_object = judge.json_schema;
                }
                let text = match self.call(llm, &ep, Purpose::Judge, &messages, msg).await {
                    Ok(text) => text,
                    Err(e) if ep.json_schema && rejects_schema(&e) => {
                        // Some servers (llama-cpp-python) refuse `json_schema` but accept
                        // `json_object` with a schema; the tolerant parser copes either way.
                        self.schema_unsupported
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(bot = %t.me.name, "the judge endpoint refuses response_format json_schema; using json_object from now on");
                        ep.json_schema = false;
                        ep.json_object = true;
                        match self.call(llm, &ep, Purpose::Judge, &messages, msg).await {
                            Ok(text) => text,
                            Err(_) => return out,
                        }
                    }
                    Err(_) => return out,
                };
                out.verdict = parse_verdict(&text);
                if out.verdict.is_none() {
                    self.metrics.llm_call("judge", "unparsable", 0.0, 0, 0);
                    tracing::warn!(bot = %t.me.name, trigger = %msg.id, answer = %crate::turn::judge::trim(&text, 200), "judge answer not understood; staying silent");
                }
                out
            }
        }
    }

    /// A drafting judge (`judge_drafts`): one call whose first line is the verdict and
    /// whose rest is the reply, so the reply is being written while the verdict is
    /// acted on. The verdict as [`Brain::judge_traced`] gives it, and the reply still
    /// coming when the verdict says speak (dropping it cancels the request). The call
    /// goes to the reply endpoint: the reply's model writes the reply.
    pub(crate) async fn judge_drafting(
        &self,
        llm: &dyn Llm,
        context: &[Arc<Envelope>],
        msg: &Envelope,
    ) -> (Judged, Option<PendingDraft>) {
        let t = self.tuning();
        let messages = crate::turn::reply::drafting_messages(&t.me, &t.colleagues, context, msg);
        let mut out = Judged {
            verdict: None,
            model: "offline".into(),
            prompt_hash: None,
            prompt_bytes: messages.iter().map(|m| m.content.len()).sum(),
        };
        let started = Instant::now();
        let ep = match &t.provider {
            Provider::Offline => {
                // The offline judge and its placeholder reply, as without drafting.
                let judged = self.judge_traced(llm, context, msg).await;
                let speak = judged.verdict.is_some_and(|v| v.speak);
                let text = crate::turn::reply::offline_reply(&t.me, msg, "interjected");
                let rest = speak.then(|| PendingDraft {
                    rest: Box::pin(async move { Ok(crate::llm::Completion::offline(text)) }),
                    started,
                    counted: (0, 0),
                    tooled: None,
                });
                return (judged, rest);
            }
            Provider::Remote { reply, .. } => {
                let mut ep = reply.clone();
                // The verdict line comes first: room for it on top of the reply's.
                ep.max_tokens = ep.max_tokens.saturating_add(24);
                ep
            }
        };
        out.model = ep.model.clone();
        out.prompt_hash = Some(prompt_hash(&messages));
        // The drafting call writes the reply: it is offered the bot's tools.
        let specs = match self.engine.tools() {
            Some(tools) => {
                crate::engine::model::offered_tools(&t.me, tools, &self.trail, msg).await
            }
            None => Vec::new(),
        };
        let call = LlmCall::new(&ep, Purpose::Draft, &messages, msg).offering(&specs);
        let drafting = llm.draft(call).await;
        match drafting {
            Ok(d) => {
                // What the call has cost so far, estimated: most drafting calls end
                // here (the bot declines), and a dropped call never learns its usage.
                let counted = (
                    estimate_tokens(messages.iter().map(|m| m.content.chars().count()).sum()),
                    estimate_tokens(d.head.chars().count()),
                );
                self.budget.spend(counted.0 + counted.1);
                self.metrics.llm_call(
                    "draft",
                    "ok",
                    started.elapsed().as_secs_f64(),
                    counted.0,
                    counted.1,
                );
                out.verdict = parse_verdict(&d.head);
                if out.verdict.is_none() {
                    self.metrics.llm_call("draft", "unparsable", 0.0, 0, 0);
                    tracing::warn!(bot = %t.me.name, trigger = %msg.id, answer = %crate::turn::judge::trim(&d.head, 200), "drafting judge's verdict line not understood; staying silent (the draft is dropped)");
                    return (out, None);
                }
                let speak = out.verdict.is_some_and(|v| v.speak);
                let tooled = (!specs.is_empty()).then(|| (ep.clone(), messages.clone(), specs));
                let rest = speak.then(|| PendingDraft {
                    rest: d.rest,
                    started,
                    counted,
                    tooled,
                });
                (out, rest)
            }
            Err(e) => {
                self.budget.spend(0);
                self.metrics
                    .llm_call("draft", e.label(), started.elapsed().as_secs_f64(), 0, 0);
                tracing::warn!(bot = %t.me.name, purpose = "draft", error = %e, "LLM call failed");
                (out, None)
            }
        }
    }

    /// The reply a drafting judge goes on writing once its verdict said speak:
    /// `None` if the rest of the call failed or wrote nothing (logged). Its tokens
    /// count now, against the day's budget and in the metrics. `show`: the running
    /// turn's status message, for the tool calls the draft goes on with.
    pub(crate) async fn finish_draft(
        &self,
        llm: &dyn Llm,
        msg: &Envelope,
        draft: PendingDraft,
        show: &dyn ShowTool,
    ) -> Option<Reply> {
        match draft.rest.await {
            Ok(c) => {
                // The call's usage, less what was counted at its verdict line.
                let more = (
                    c.usage.prompt_tokens.saturating_sub(draft.counted.0),
                    c.usage.completion_tokens.saturating_sub(draft.counted.1),
                );
                let tokens = c.usage.prompt_tokens + c.usage.completion_tokens;
                self.budget.spend_tokens(more.0 + more.1);
                self.metrics.llm_tokens("draft", more.0, more.1);
                if let (false, Some((ep, messages, specs)), Some(tools)) =
                    (c.tool_calls.is_empty(), draft.tooled, self.engine.tools())
                {
                    // The draft asks for tools: the loop goes on from it.
                    let first = crate::llm::Completion {
                        usage: crate::llm::Usage {
                            prompt_tokens: 0,
                            completion_tokens: more.1,
                        },
                        ..c
                    };
                    let t = self.tuning();
                    return self
                        .tool_loop(&t, llm, tools, show)
                        .run(&ep, messages, &specs, msg, Some(first))
                        .await;
                }
                let text = c.text.trim().to_string();
                if text.is_empty() {
                    tracing::warn!(bot = %self.me().name, "the drafting judge said speak but wrote no reply");
                }
                tracing::debug!(bot = %self.me().name, ms = draft.started.elapsed().as_millis() as u64, tokens, "draft written");
                (!text.is_empty()).then_some(Reply {
                    text,
                    tokens: c.usage.completion_tokens,
                })
            }
            Err(e) => {
                tracing::warn!(bot = %self.me().name, purpose = "draft", error = %e, "the drafting judge's reply failed");
                None
            }
        }
    }

    /// The shared judge's one call about `msg` for every bot in `bots`: each bot's
    /// verdict, by name (a bot the answer leaves out is missing). `None`: the call
    /// failed or nothing in the answer was understood (logged and counted).
    pub(crate) async fn judge_all(
        &self,
        llm: &dyn Llm,
        context: &[Arc<Envelope>],
        msg: &Envelope,
        bots: &[&BotSettings],
    ) -> Option<std::collections::BTreeMap<String, Verdict>> {
        let t = self.tuning();
        match &t.provider {
            Provider::Offline => Some(
                bots.iter()
                    .map(|b| {
                        let v = if msg.author.kind == AuthorKind::Bot {
                            Verdict {
                                speak: false,
                                relevance: 0.0,
                            }
                        } else {
                            offline_verdict(b, &msg.text)
                        };
                        (b.name.clone(), v)
                    })
                    .collect(),
            ),
            Provider::Remote { judge, .. } => {
                let prompt =
                    crate::turn::judge::build_shared_prompt(bots, context, msg, t.me.context_chars);
                let messages = [ChatMessage::user(prompt)];
                let mut ep = judge.clone();
                // About 24 tokens per bot's entry, and never less than one verdict's.
                ep.max_tokens = ep.max_tokens.max(16 + 24 * bots.len() as u32);
                ep.json_schema = ep.json_schema
                    && !self
                        .schema_unsupported
                        .load(std::sync::atomic::Ordering::Relaxed);
                let text = self
                    .call(llm, &ep, Purpose::SharedJudge, &messages, msg)
                    .await
                    .ok()?;
                let names: Vec<String> = bots.iter().map(|b| b.name.clone()).collect();
                let v = crate::llm::parse_shared_verdicts(&text, &names);
                if v.is_empty() {
                    self.metrics
                        .llm_call("shared_judge", "unparsable", 0.0, 0, 0);
                    tracing::warn!(bot = %t.me.name, trigger = %msg.id, answer = %crate::turn::judge::trim(&text, 200), "shared judge answer not understood; every bot judges itself");
                    return None;
                }
                Some(v)
            }
        }
    }

    /// The built-in model's reply written ahead of the turn (while the bot waits its
    /// turn, with no status to show its tool calls on): the model engine's call
    /// (`engine::model::write`) over the bot's prompt. `None` means the LLM failed
    /// (logged and counted).
    pub(crate) async fn write_reply(
        &self,
        llm: &dyn Llm,
        context: &[Arc<Envelope>],
        msg: &Envelope,
        why: &str,
        show: &dyn ShowTool,
    ) -> Option<Reply> {
        let t = self.tuning();
        let prompt = model_prompt(&t, context, msg, why);
        let tools = self
            .engine
            .tools()
            .map(|tools| self.tool_loop(&t, llm, tools, show));
        crate::engine::model::write(self.metered(llm, &t.me.name), tools, prompt, msg).await
    }

    /// One judge call, counted ([`Brain::metered`]): the answer's text.
    async fn call(
        &self,
        llm: &dyn Llm,
        ep: &Endpoint,
        purpose: Purpose,
        messages: &[ChatMessage],
        about: &Envelope,
    ) -> Result<String, crate::llm::LlmError> {
        let me = self.me();
        let call = LlmCall::new(ep, purpose, messages, about);
        self.metered(llm, &me.name)
            .complete(call)
            .await
            .map(|c| c.text)
    }

    /// `llm` as bot `bot`'s engines call it: counted against this brain's daily
    /// budget and in its metrics.
    pub(crate) fn metered<'a>(&'a self, llm: &'a dyn Llm, bot: &'a str) -> MeteredLlm<'a> {
        MeteredLlm {
            llm,
            budget: &self.budget,
            metrics: &self.metrics,
            bot,
        }
    }

    /// The built-in model's tool loop for a turn taken with tuning `t`, over the bot's
    /// tool servers `tools`: its calls metered, its tool calls noted in the trail and
    /// shown through `show`.
    fn tool_loop<'a>(
        &'a self,
        t: &'a Tuning,
        llm: &'a dyn Llm,
        tools: &'a crate::agent::mcp::McpTools,
        show: &'a dyn ShowTool,
    ) -> ToolLoop<'a> {
        ToolLoop {
            me: &t.me,
            ask_timeout_secs: t.mesh.ask_timeout_secs,
            llm: self.metered(llm, &t.me.name),
            tools,
            trail: &self.trail,
            show,
        }
    }
}

/// The built-in model's prompt for a reply to `msg` over `context` with tuning `t`:
/// the offline placeholder, or the reply call's endpoint and messages.
pub(crate) fn model_prompt(
    t: &Tuning,
    context: &[Arc<Envelope>],
    msg: &Envelope,
    why: &str,
) -> ModelPrompt {
    match &t.provider {
        Provider::Offline => {
            ModelPrompt::Offline(crate::turn::reply::offline_reply(&t.me, msg, why))
        }
        Provider::Remote { reply, .. } => ModelPrompt::Remote {
            ep: reply.clone(),
            messages: crate::turn::reply::messages(&t.me, &t.colleagues, context, msg),
        },
    }
}

/// How long each bot's turn may run once it has the turn, for the bots whose reply
/// engine is a coding agent (its `turn_timeout_secs`): the colleagues standing by
/// behind such a bot's claim wait that much longer ([`ClaimBoard::with_turn_limits`]).
fn turn_limits(bots: &[BotSettings]) -> std::collections::HashMap<String, std::time::Duration> {
    bots.iter()
        .filter_map(|b| match &b.agent {
            Some(crate::config::AgentEngine::Acp(s)) => Some((
                b.name.clone(),
                std::time::Duration::from_secs(s.turn_timeout_secs),
            )),
            _ => None,
        })
        .collect()
}
