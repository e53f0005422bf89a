//! The sidecar engine (`[[bots]] agent = { webhook, timeout_ms }`, docs/sidecar.md):
//! the node POSTs a turn ([`Turn`]) to an external bot and takes its answer from the
//! response, or later through `POST /v1/messages`. Each turn is counted as an `agent`
//! LLM call ([`ask_sidecar`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use crate::config::{AgentEngine, AgentSettings, NodeConfig};
use crate::engine::context::{TurnContext, Written};
use crate::engine::{Reply, ReplyEngine};
use crate::telemetry::metrics::Metrics;
use crate::wire::envelope::Envelope;

/// The engine of a bot with `agent = { webhook, … }`.
pub(crate) fn pick(
    cfg: &NodeConfig,
    metrics: &Arc<Metrics>,
) -> Option<anyhow::Result<Box<dyn ReplyEngine>>> {
    let Some(AgentEngine::Webhook(settings)) = &cfg.bot().agent else {
        return None;
    };
    Some(
        Webhook::new(settings)
            .map(|hook| {
                Box::new(Sidecar {
                    hook,
                    metrics: metrics.clone(),
                }) as Box<dyn ReplyEngine>
            })
            .map_err(|e| anyhow::anyhow!("bot {}'s sidecar webhook client: {e}", cfg.bot().name)),
    )
}

/// The sidecar engine: the bot's webhook, and where its turns are counted.
pub(crate) struct Sidecar {
    /// Where turns go.
    hook: Webhook,
    /// Each turn counts as an `agent` LLM call.
    metrics: Arc<Metrics>,
}

impl ReplyEngine for Sidecar {
    fn name(&self) -> &'static str {
        "sidecar"
    }

    fn write<'a>(&'a self, turn: &'a TurnContext<'a>) -> BoxFuture<'a, Written> {
        Box::pin(async move {
            let msg = turn.msg;
            let context = turn.host.before(turn.me.context_messages.max(12));
            let payload = Turn {
                bot: &turn.me.name,
                group: &msg.group,
                trigger: msg,
                transcript: &context,
                why: turn.why,
                relevance: turn.relevance,
                depth: crate::wire::envelope::next_depth(msg.depth),
                reply_to: msg.id,
            };
            match ask_sidecar(&self.metrics, &self.hook, &payload).await {
                Ok(Answer::Now(text)) => Written::Reply(Reply { text, tokens: 0 }),
                Ok(Answer::Later) => Written::Later {
                    detail: "the agent answers through POST /v1/messages",
                },
                Err(e) => Written::silent("agent_failed", e, "agent failed"),
            }
        })
    }
}

/// What a sidecar agent receives when its bot takes a turn (docs/sidecar.md).
#[derive(Debug, Serialize)]
pub(crate) struct Turn<'a> {
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

/// A bot's sidecar webhook: where turns go and the client that takes them there.
pub(crate) struct Webhook {
    /// Bounded by the configured `timeout_ms`; no proxy (the sidecar is local).
    client: reqwest::Client,
    /// Where turns are POSTed.
    url: String,
}

/// What the webhook made of a turn.
#[derive(Debug, PartialEq)]
pub(crate) enum Answer {
    /// It answered in the response: the text to post.
    Now(String),
    /// It will answer later through `POST /v1/messages` (202 or 204, or an answer
    /// without text).
    Later,
}

impl Webhook {
    /// The webhook `settings` describe.
    pub(crate) fn new(settings: &AgentSettings) -> reqwest::Result<Webhook> {
        Ok(Webhook {
            client: reqwest::Client::builder()
                .no_proxy()
                .connect_timeout(Duration::from_secs(3))
                .timeout(Duration::from_millis(settings.timeout_ms))
                .build()?,
            url: settings.webhook.clone(),
        })
    }

    /// POSTs `turn` and reads the answer. `Err`: why the webhook failed (transport,
    /// a non-success status with the start of its body, an answer that is not
    /// `{"text": …}`).
    pub(crate) async fn ask(&self, turn: &impl Serialize) -> Result<Answer, String> {
        let resp = self
            .client
            .post(&self.url)
            .json(turn)
            .send()
            .await
            .map_err(|e| format!("transport: {e}"))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("reading body: {e}"))?;
        if status == reqwest::StatusCode::ACCEPTED || status == reqwest::StatusCode::NO_CONTENT {
            return Ok(Answer::Later);
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
            .filter(|t| !t.is_empty())
            .map_or(Answer::Later, Answer::Now))
    }
}

/// Hands the turn to the sidecar webhook, counted in `metrics` as an `agent` LLM call.
pub(crate) async fn ask_sidecar(
    metrics: &Metrics,
    hook: &Webhook,
    turn: &Turn<'_>,
) -> Result<Answer, String> {
    let started = Instant::now();
    let result = hook.ask(turn).await;
    let label = match &result {
        Ok(Answer::Now(_)) => "ok",
        Ok(Answer::Later) => "deferred",
        Err(_) => "failed",
    };
    metrics.llm_call("agent", label, started.elapsed().as_secs_f64(), 0, 0);
    result
}
