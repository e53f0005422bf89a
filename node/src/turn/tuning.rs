//! `Tuning`: what a reload may change of a bot's turn-taking — who it is, whom it
//! knows, its LLM endpoints (`Provider`, from `[llm]` and its overrides: [`endpoints`]),
//! the mesh's rules and the daily budget — as one snapshot, taken once per decision
//! step (`Brain::tuning`, `Brain::retune`). Its own file so that the files that read
//! it (people's commands, the permission questions) need not name `Brain`.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{BotSettings, LlmSettings, MeshSettings, NodeConfig};
use crate::engine::budget::Limits;
use crate::llm::{Endpoint, Purpose};

/// Where answers come from. (One per node, so the variants' size difference is moot.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Provider {
    /// No LLM configured: lexical-overlap judge, marked placeholder replies.
    Offline,
    /// An OpenAI-compatible endpoint per purpose (called through `Ports::llm`).
    Remote {
        /// Judge settings.
        judge: Endpoint,
        /// Reply settings.
        reply: Endpoint,
    },
}

/// What a reload may change (`Brain::retune`): one consistent snapshot, taken once
/// per decision step, so a step never mixes an old and a new setting.
pub(crate) struct Tuning {
    /// This bot.
    pub(crate) me: Arc<BotSettings>,
    /// The other bots (their profiles feed the judge and the reply).
    pub(crate) colleagues: Vec<BotSettings>,
    /// The LLM, or the offline provider.
    pub(crate) provider: Provider,
    /// The mesh-wide rules (depth, caps, staleness).
    pub(crate) mesh: Arc<MeshSettings>,
    /// The daily LLM budget.
    pub(crate) budget: Limits,
}

impl Tuning {
    /// The tunable part of `cfg`.
    pub(crate) fn of(cfg: &NodeConfig) -> Tuning {
        let provider = match &cfg.settings.llm {
            None => Provider::Offline,
            Some(llm) => {
                let (judge, reply) = endpoints(llm, &cfg.llm_keys);
                Provider::Remote { judge, reply }
            }
        };
        Tuning {
            me: Arc::new(cfg.bot().clone()),
            colleagues: cfg.peers().cloned().collect(),
            provider,
            mesh: Arc::new(cfg.mesh().clone()),
            budget: Limits::of(cfg.settings.llm.as_ref(), cfg.bot()),
        }
    }
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
