//! The platform kit: the mechanisms every adapter needs once, so that an adapter is
//! its platform's wire format and little else (issue 25).
//!
//! - [`api`] — the one retry loop for platform API calls, driven by the adapter's
//!   [`api::Classify`] of each answer, with the one give-up error [`api::ApiError`].
//! - [`token`] — the one source for an expiring access token.
//!
//! Still to come: a per-chat token bucket, one
//! reconnect loop for long connections, one inbound path, self-describing adapters.

pub(crate) mod api;
pub(crate) mod token;
