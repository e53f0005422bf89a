//! The platform kit: the mechanisms every adapter needs once, so that an adapter is
//! its platform's wire format and little else (issue 25).
//!
//! - [`api`] — the one retry loop for platform API calls, driven by the adapter's
//!   [`api::Classify`] of each answer, with the one give-up error [`api::ApiError`].
//! - [`token`] — the one source for an expiring access token.
//! - [`pacer`] — the one per-chat pacer, on `config::pacing`'s limits.
//!
//! Still to come (issue 25): one reconnect loop for long connections (Feishu's
//! `ws::run`, Discord's gateway, DingTalk's stream each have their own), one inbound
//! path (the bridge-grace wait is still polled in Feishu and Discord), one builder for
//! HTTP clients, one text truncation, adapters that describe themselves (a registry
//! instead of `match` arms in `platform::build` and `visibility_of`) and one metric
//! family for API calls.
//!
//! The llm client keeps its own retry loop: `llm/` is below `platform/` and its loop
//! also measures each attempt's latency, reports the successful attempt's status and
//! honours `Retry-After` without a cap; sharing this one would change what it does.

pub(crate) mod api;
pub(crate) mod pacer;
pub(crate) mod token;
