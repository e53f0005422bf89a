//! `explain`: the decision for a hypothetical message, dry-run (`POST /v1/explain`,
//! `botmesh explain`): the first tool to reach for when a bot did not answer.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use ulid::Ulid;

use crate::config::NodeConfig;
use crate::engine::Llm;
use crate::store::turn_queries::recent_bot_messages;
use crate::turn::brain::{Brain, Provider};
use crate::turn::context::RATE_WINDOW_MS;
use crate::turn::policy::Action;
use crate::wire::envelope::{now_millis, Author, Envelope};

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
    pub(crate) bot: String,
    /// Whether it is mentioned.
    pub(crate) mentioned: bool,
    /// Everyone the message mentions.
    pub(crate) mentions: Vec<String>,
    /// reply, judge or silent.
    pub(crate) action: String,
    /// Why.
    pub(crate) reason: String,
    /// The exact judge prompt (present when the action is judge).
    pub(crate) judge_prompt: Option<String>,
    /// Its size in bytes.
    pub(crate) judge_prompt_bytes: Option<usize>,
    /// The judge's answer, when asked to call it (or offline).
    pub(crate) verdict: Option<VerdictJson>,
    /// The delay the bot would wait before interjecting, in ms (without jitter).
    pub(crate) delay_ms: Option<u64>,
    /// The provider in use.
    pub(crate) provider: &'static str,
}

/// A verdict as JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct VerdictJson {
    /// Speak or not.
    pub(crate) speak: bool,
    /// 0..1.
    pub(crate) relevance: f64,
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
    let group = req
        .group
        .clone()
        .unwrap_or_else(|| cfg.mesh().group.clone());
    let author = if is_bot {
        Author::bot(&from)
    } else {
        Author::human(&from)
    };
    // A person's message is carried by this node (as one posted on its page would be),
    // so `[mesh] operators` reads them as this node's platform's people.
    let sender = if is_bot { from } else { cfg.bot().name.clone() };
    let mut env = Envelope::message(Ulid::new(), now_millis(), group, sender, author, &req.text);
    env.depth = depth;
    Ok(env)
}

/// Explains the decision for a hypothetical message, with the given context.
pub async fn explain(
    brain: &Brain,
    llm: &dyn Llm,
    cfg: &NodeConfig,
    req: ExplainRequest,
    recent: &[Arc<Envelope>],
    quiet: bool,
) -> Result<Explanation, String> {
    let msg = hypothetical(cfg, &req)?;
    let recent_bots = recent_bot_messages(recent.iter(), now_millis(), RATE_WINDOW_MS);
    let t = brain.tuning();
    // Commands never reach an LLM, so they are not in a judge prompt's context either.
    let recent = &crate::turn::control::without_commands(recent.to_vec(), &t)[..];
    let mut d = brain.decide(&t.mesh, &msg, &[], recent_bots, quiet);
    if crate::turn::control::is_command(&msg, &t) {
        // A person's `/quiet`, `/stop`, …: carried out by the node, never judged.
        d.action = Action::Silent;
        d.reason = "command";
    }
    let context_start = recent.len().saturating_sub(t.me.context_messages);
    let context = &recent[context_start..];
    let mut out = Explanation {
        bot: t.me.name.clone(),
        // From the text itself: a decision the hard rules made never scanned it.
        mentioned: brain.mentions_of(&t.me, &msg, &[]).0,
        mentions: brain.matcher.mentioned(&msg.text, &[]),
        action: d.action.as_str().into(),
        reason: d.reason.into(),
        judge_prompt: None,
        judge_prompt_bytes: None,
        verdict: None,
        delay_ms: None,
        provider: match t.provider {
            Provider::Offline => "offline",
            Provider::Remote { .. } => "llm",
        },
    };
    if d.action == Action::Judge {
        // A drafting judge asks inside the reply's prompt, with the reply's context.
        let drafting = t.me.judge_drafts;
        let draft_context = &recent[recent.len().saturating_sub(t.me.context_messages.max(12))..];
        let prompt = if drafting {
            crate::turn::reply::drafting_messages(&t.me, &t.colleagues, draft_context, &msg)
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n\n")
        } else {
            brain.judge_prompt(context, &msg)
        };
        out.judge_prompt_bytes = Some(prompt.len());
        out.judge_prompt = Some(prompt);
        let ask = match t.provider {
            Provider::Offline => true,
            Provider::Remote { .. } => req.call_llm,
        };
        let verdict = if !ask {
            None
        } else if drafting {
            // The verdict line only: the draft is dropped unread.
            brain
                .judge_drafting(llm, draft_context, &msg)
                .await
                .0
                .verdict
        } else {
            brain.judge(llm, context, &msg).await
        };
        if let Some(v) = verdict {
            if !d.mentioned && v.speak && v.relevance >= t.me.min_relevance {
                let me = &t.me;
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
