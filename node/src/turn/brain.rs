//! `Brain`: a bot's turn-taking state — who it is, whom it knows, what it has seen
//! claimed — and its two LLM questions: the judge ("should I interject?") and the
//! reply. The calls go through [`Llm`], so the simulator can script them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::config::{BotSettings, LlmSettings, NodeConfig};
use crate::llm::{parse_verdict, ChatMessage, Endpoint, Purpose, Verdict};
use crate::telemetry::metrics::Metrics;
use crate::turn::judge::{build_prompt, offline_verdict, prompt_hash, JudgeInput};
use crate::turn::mention::{Member, MentionMatcher, PlatformMention};
use crate::turn::pipeline::Turn;
use crate::turn::policy::{decide, Decision, Facts};
use crate::turn::ports::Llm;
use crate::turn::scheduler::{ClaimBoard, ClaimReply};
use crate::wire::envelope::{AuthorKind, Envelope, Kind};

/// Where answers come from. (One per node, so the variants' size difference is moot.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Provider {
    /// No LLM configured: lexical-overlap judge, marked placeholder replies.
    Offline,
    /// An OpenAI-compatible endpoint per purpose (called through [`Ports::llm`]).
    Remote {
        /// Judge settings.
        judge: Endpoint,
        /// Reply settings.
        reply: Endpoint,
    },
}

/// The node's turn-taking state: who it is, whom it knows, what it has seen claimed.
pub struct Brain {
    /// This bot.
    pub(crate) me: BotSettings,
    /// The other bots.
    pub(crate) colleagues: Vec<BotSettings>,
    /// Finds @mentions against the whole roster.
    pub(crate) matcher: MentionMatcher,
    /// The LLM, or the offline provider.
    pub(crate) provider: Provider,
    /// Claims and replies per trigger.
    pub board: ClaimBoard,
    /// Set once the judge endpoint refused structured output.
    schema_unsupported: std::sync::atomic::AtomicBool,
    /// Client for the sidecar agent's webhook, when one is configured.
    pub(crate) agent: Option<(reqwest::Client, String)>,
    /// Decisions and LLM calls are counted here.
    pub(crate) metrics: Arc<Metrics>,
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

/// A reply the LLM wrote, with its completion tokens (counted when it is thrown away).
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    /// The text to post.
    pub text: String,
    /// Completion tokens it cost.
    pub tokens: u64,
}

/// Whether an error is a server refusing the `response_format` we sent.
fn rejects_schema(e: &crate::llm::LlmError) -> bool {
    matches!(e, crate::llm::LlmError::Http { status: 400 | 422 | 500, body } if body.contains("response_format"))
}

/// Builds the roster the matcher needs.
pub(crate) fn roster(bots: &[BotSettings]) -> Vec<Member> {
    bots.iter()
        .map(|b| Member {
            name: b.name.clone(),
            aliases: b.aliases.clone(),
            open_ids: b.open_id().map(|o| vec![o.to_string()]).unwrap_or_default(),
        })
        .collect()
}

/// Endpoints for judge and reply from `[llm]` and its overrides.
pub(crate) fn endpoints(
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
    pub fn new(cfg: &NodeConfig, metrics: Arc<Metrics>) -> anyhow::Result<Brain> {
        let provider = match &cfg.settings.llm {
            None => Provider::Offline,
            Some(llm) => {
                let (judge, reply) = endpoints(llm, &cfg.llm_keys);
                Provider::Remote { judge, reply }
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
        let mut brain = Brain::with(
            cfg.bot().clone(),
            cfg.peers().cloned().collect(),
            &cfg.settings.bots,
            provider,
            metrics,
        );
        brain.agent = agent;
        Ok(brain)
    }

    /// A brain for bot `me` among `colleagues` (`roster`: every bot, for mentions),
    /// without a sidecar agent: what the simulator builds for each of its bots.
    pub(crate) fn with(
        me: BotSettings,
        colleagues: Vec<BotSettings>,
        roster_of: &[BotSettings],
        provider: Provider,
        metrics: Arc<Metrics>,
    ) -> Brain {
        Brain {
            schema_unsupported: std::sync::atomic::AtomicBool::new(false),
            agent: None,
            me,
            colleagues,
            matcher: MentionMatcher::new(&roster(roster_of)),
            provider,
            board: ClaimBoard::default(),
            metrics,
        }
    }

    /// Every newly recorded message passes here: a bot's reply to a trigger makes
    /// waiting bots yield.
    pub(crate) fn observe(&self, env: &Envelope) {
        if env.author.kind == AuthorKind::Bot {
            if let Some(trigger) = env.reply_to {
                self.board.answered(trigger, &env.author.name);
            }
        }
    }

    /// A peer's claim (at relevance 0: its withdrawal).
    pub(crate) fn on_claim(&self, env: &Envelope) {
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
            Some(trigger) => self.board.answer_claim(trigger, &self.me.name, &env.sender),
            None => ClaimReply::default(),
        }
    }

    /// The local rules for `msg`, given how many bot messages end the recent
    /// transcript (`recent_bots`, see [`crate::turn::policy::recent_bot_messages`]).
    pub(crate) fn decide(
        &self,
        mesh: &crate::config::MeshSettings,
        msg: &Envelope,
        platform: &[PlatformMention],
        recent_bots: usize,
        quiet: bool,
    ) -> Decision {
        let mentioned_names = self.matcher.mentioned(&msg.text, platform);
        // In a direct chat a person talks to this bot alone: no mention needed.
        let direct = crate::wire::envelope::is_direct_group(&msg.group)
            && msg.author.kind == crate::wire::envelope::AuthorKind::Human;
        let mentioned = direct || mentioned_names.iter().any(|n| n == &self.me.name);
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
    pub(crate) fn judge_prompt(&self, context: &[Arc<Envelope>], msg: &Envelope) -> String {
        build_prompt(&JudgeInput {
            me: &self.me,
            colleagues: &self.colleagues,
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
        match &self.provider {
            // Offline placeholders say little worth answering: interject on humans only.
            Provider::Offline if msg.author.kind == AuthorKind::Bot => offline(Verdict {
                speak: false,
                relevance: 0.0,
            }),
            Provider::Offline => offline(offline_verdict(&self.me, &msg.text)),
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
                        tracing::warn!(bot = %self.me.name, "the judge endpoint refuses response_format json_schema; using json_object from now on");
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
                    tracing::warn!(bot = %self.me.name, trigger = %msg.id, answer = %crate::turn::judge::trim(&text, 200), "judge answer not understood; staying silent");
                }
                out
            }
        }
    }

    /// Hands the turn to the sidecar agent. `Ok(Some(text))`: it answered in the
    /// response; `Ok(None)`: it will answer later through `POST /v1/messages`.
    pub(crate) async fn ask_agent(
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
    pub(crate) async fn write_reply(
        &self,
        llm: &dyn Llm,
        context: &[Arc<Envelope>],
        msg: &Envelope,
        why: &str,
    ) -> Option<Reply> {
        match &self.provider {
            Provider::Offline => Some(Reply {
                text: crate::turn::reply::offline_reply(&self.me, msg, why),
                tokens: 0,
            }),
            Provider::Remote { reply, .. } => {
                let messages =
                    crate::turn::reply::messages(&self.me, &self.colleagues, context, msg);
                let (text, tokens) = self
                    .call_counted(llm, reply, Purpose::Reply, &messages, msg)
                    .await
                    .ok()?;
                let text = text.trim().to_string();
                (!text.is_empty()).then_some(Reply { text, tokens })
            }
        }
    }

    async fn call(
        &self,
        llm: &dyn Llm,
        ep: &Endpoint,
        purpose: Purpose,
        messages: &[ChatMessage],
        about: &Envelope,
    ) -> Result<String, crate::llm::LlmError> {
        self.call_counted(llm, ep, purpose, messages, about)
            .await
            .map(|(text, _)| text)
    }

    /// [`Brain::call`], also giving the completion's token count.
    async fn call_counted(
        &self,
        llm: &dyn Llm,
        ep: &Endpoint,
        purpose: Purpose,
        messages: &[ChatMessage],
        about: &Envelope,
    ) -> Result<(String, u64), crate::llm::LlmError> {
        let started = Instant::now();
        match llm.complete(ep, purpose, messages, about).await {
            Ok(c) => {
                self.metrics.llm_call(
                    purpose.as_str(),
                    "ok",
                    started.elapsed().as_secs_f64(),
                    c.usage.prompt_tokens,
                    c.usage.completion_tokens,
                );
                Ok((c.text, c.usage.completion_tokens))
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
