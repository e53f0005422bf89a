//! The policies a scenario is run under: botmesh's own (three judge modes) and the
//! baselines that reproduce earlier systems, with the baselines' judge prompts.

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::config::BotSettings;

/// A turn-taking policy the simulator can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// botmesh itself: docs/design.md steps 2–6, through the real code (`[mesh] judge = "own"`).
    Botmesh,
    /// botmesh with one judge call per message for the whole mesh (`judge = "shared"`).
    BotmeshShared,
    /// botmesh with every bot's own judge drafting its reply in the same call
    /// (`judge_drafts = true`).
    BotmeshDrafting,
    /// XiaoBa's HTTP bridge with the interjection judge (seed 004).
    Xiaoba,
    /// The nanobot Feishu relay with its depth stop policy (seed 000, transcript 001).
    Nanobot,
    /// The review panel that ignores bot messages (seed 002).
    ReviewPanel,
}

impl PolicyKind {
    /// Every policy, botmesh first.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Botmesh,
        PolicyKind::BotmeshDrafting,
        PolicyKind::BotmeshShared,
        PolicyKind::Xiaoba,
        PolicyKind::Nanobot,
        PolicyKind::ReviewPanel,
    ];

    /// The CLI / report name.
    pub fn as_str(&self) -> &'static str {
        match self {
            PolicyKind::Botmesh => "botmesh",
            PolicyKind::BotmeshShared => "botmesh-shared",
            PolicyKind::BotmeshDrafting => "botmesh-drafting",
            PolicyKind::Xiaoba => "xiaoba",
            PolicyKind::Nanobot => "nanobot",
            PolicyKind::ReviewPanel => "review-panel",
        }
    }

    /// Whether this is botmesh (any judge mode) rather than a baseline.
    pub fn is_botmesh(&self) -> bool {
        matches!(
            self,
            PolicyKind::Botmesh | PolicyKind::BotmeshShared | PolicyKind::BotmeshDrafting
        )
    }

    /// Whether every bot's judge drafts its reply under this policy.
    pub(super) fn drafting(&self) -> bool {
        *self == PolicyKind::BotmeshDrafting
    }

    /// The judge mode botmesh runs with under this policy.
    pub(super) fn judge_mode(&self) -> crate::config::JudgeMode {
        match self {
            PolicyKind::BotmeshShared => crate::config::JudgeMode::Shared,
            _ => crate::config::JudgeMode::Own,
        }
    }

    /// Parses `all` or one name into the policies to run.
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<PolicyKind>> {
        if s == "all" {
            return Ok(PolicyKind::ALL.to_vec());
        }
        PolicyKind::ALL
            .iter()
            .find(|p| p.as_str() == s)
            .map(|p| vec![*p])
            .with_context(|| {
                format!("unknown policy {s:?} (all, botmesh, botmesh-drafting, botmesh-shared, xiaoba, nanobot, review-panel)")
            })
    }

    /// The bot's settings as this policy's judge prompt would be built: botmesh
    /// uses the bot as configured; a baseline gets its estimated template and
    /// context (see the docs: "Judge prompt bytes").
    pub(super) fn prompt_bot(&self, b: &BotSettings) -> BotSettings {
        let mut b = b.clone();
        match self {
            PolicyKind::Botmesh | PolicyKind::BotmeshShared | PolicyKind::BotmeshDrafting => {}
            PolicyKind::Xiaoba => {
                b.judge_prompt = Some(XIAOBA_JUDGE_PROMPT.into());
                b.context_messages = 10;
                b.context_chars = 1 << 20;
            }
            PolicyKind::Nanobot => {
                b.judge_prompt = Some(NANOBOT_JUDGE_PROMPT.into());
                b.context_messages = 20;
                b.context_chars = 1 << 20;
            }
            PolicyKind::ReviewPanel => {
                b.judge_prompt = Some(PANEL_JUDGE_PROMPT.into());
                b.context_messages = 0;
                b.context_chars = 1 << 20;
            }
        }
        b
    }
}

/// Estimated XiaoBa judge prompt (seed 004 P0: a short prompt with the last 5–10
/// broadcasts, the bot's profile and, per P1, the colleague table; yes/no answer).
pub(crate) const XIAOBA_JUDGE_PROMPT: &str = "你是 {name}（{role}，擅长：{skills}）。\n\
群里的同事：{colleagues}\n最近的群聊记录：\n{context}\n新消息（{from}）：{message}\n\
这条消息跟你有没有关系，你该不该主动回应？只回答 yes 或 no。";

/// Estimated nanobot relevance / stop-policy prompt (seed 000 §4.4: recent
/// transcript, the current message and the agent's role → YES/NO; seed 001: the
/// transcript is read with `get_recent(max_messages=20)`, untrimmed).
pub(crate) const NANOBOT_JUDGE_PROMPT: &str =
    "You are {name}, {role}.\nRecent group conversation:\n\
{context}\nNew message from {from}: {message}\n\
Is it necessary for you to respond to this message? Decline courtesy replies \
(ok/thanks), messages without substance and finished conversations. Answer YES or NO.";

/// Estimated review-panel `should_respond` prompt (seed 002 §8.1: the judge's
/// instruction; §4.1: the message alone, no history).
pub(crate) const PANEL_JUDGE_PROMPT: &str = "You are {name} ({role}) in a multi-agent panel.\n\
YOUR ROLE:\n- {skills}\nRULES:\n1. Keep responses under 150 words\n\
2. Use send_channel_message to respond\n3. Only respond to human messages\n\
4. Ask 1-2 probing questions per response\n5. Focus on {skills}\n\
Message from {from}: {message}\nShould you respond? Answer yes or no.";
