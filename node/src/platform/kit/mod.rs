//! The platform kit: the mechanisms every adapter needs once, so that an adapter is
//! its platform's wire format and little else (issue 25).
//!
//! - [`api`] — the one retry loop for platform API calls, driven by the adapter's
//!   [`api::Classify`] of each answer, with the one give-up error [`api::ApiError`]
//!   (an adapter's error's [`api::GaveUp`] variant) and the one 429 pause over every
//!   call of a client ([`api::RatePause`]).
//! - [`token`] — the one source for an expiring access token.
//! - [`pacer`] — the one per-chat pacer, on `config::pacing`'s limits.
//! - [`reconnect`] — the one reconnect loop for long connections (Feishu's WebSocket,
//!   Discord's gateway, DingTalk's stream): the adapter writes a session, the loop
//!   keeps it going.
//! - [`requests`] — the one way to ask a long connection's session and wait for the
//!   answer (OneBot's actions, WeCom's requests).
//! - [`in_order`] — the one way a connection's events are handled: in order, off the
//!   reading task, all of them before the adapter's run ends.
//! - [`inbound`] — the one inbound path: a platform message becomes an envelope
//!   (truncation, ids, root, a colleague's copy waiting for the bridge copy by
//!   notification) and is counted in `botmesh_platform_events_total`.
//! - [`mention`] — the one way a colleague's `@Name` becomes a mention of its platform
//!   id in the text (`<@id>`), with the ids mentioned.
//! - [`settings`] — what every adapter's settings need once: its table read (the keys
//!   a bot on the platform needs named when it has none), its secret read.
//! - [`parts`] — the one way a message cut into parts is posted: the first part
//!   decides, a later failure keeps what is posted, the ids joined.
//! - [`split`] — the one way to cut a long reply into parts a platform accepts.
//! - [`stopped`] — the one record of why an adapter is out of service (its `/healthz`
//!   reason), logged once.
//! - [`http`] — the one builder of an adapter's HTTP client (timeouts always set, no
//!   proxy for loopback).
//! - `test_sink`, `test_config` (tests only) — what an adapter's unit tests start
//!   from: a sink recording as the transcript does, the adapter context around it, and
//!   a peers.toml loaded, resolved and checked for named mistakes as a node does.
//!
//! An adapter describes itself in its own folder — its `[bots.<name>]` table, the
//! table's checks and its secrets in `settings.rs` (the config layer's part), its
//! visibility and build in an [`crate::platform::registry::Adapter`] — and is
//! registered with one line in [`crate::platform::registry`].
//!
//! The llm client keeps its own retry loop: `llm/` is below `platform/` and its loop
//! also measures each attempt's latency, reports the successful attempt's status and
//! honours `Retry-After` without a cap; sharing this one would change what it does.

pub(crate) mod api;
pub(crate) mod http;
pub(crate) mod in_order;
pub(crate) mod inbound;
pub(crate) mod mention;
pub(crate) mod pacer;
pub(crate) mod parts;
pub(crate) mod reconnect;
pub(crate) mod requests;
pub(crate) mod settings;
pub(crate) mod split;
pub(crate) mod stopped;
#[cfg(test)]
pub(crate) mod test_config;
#[cfg(test)]
pub(crate) mod test_sink;
pub(crate) mod token;
