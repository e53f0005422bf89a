//! The platform kit: the mechanisms every adapter needs once, so that an adapter is
//! its platform's wire format and little else (issue 25).
//!
//! - [`api`] — the one retry loop for platform API calls, driven by the adapter's
//!   [`api::Classify`] of each answer, with the one give-up error [`api::ApiError`].
//! - [`token`] — the one source for an expiring access token.
//! - [`pacer`] — the one per-chat pacer, on `config::pacing`'s limits.
//!
//! Still to come: one
//! reconnect loop for long connections, one inbound path, self-describing adapters.

pub(crate) mod api;
pub(crate) mod pacer;
pub(crate) mod token;
