//! botmesh: a bridge node that lets several LLM bots share one group chat as colleagues.
//!
//! Each bot runs one node: a peer-facing HTTP listener (signed envelopes from the other
//! bots, platform callbacks) and a local API (the page, the CLI, sidecar bots). Data
//! takes one path through a node:
//!
//! ```text
//! ingress (bridge, api) → transcript → policy → judge → scheduler → reply → egress (outbox)
//! ```
//!
//! Modules, one concern each:
//!
//! - [`config`] — peers.toml: typed settings, env overrides, validation before binding.
//! - [`envelope`] — the wire message and its rules.
//! - [`signing`] — Standard Webhooks signatures: mesh HMAC and per-bot Ed25519.
//! - [`verify_pool`] — `VerifyPool`: Ed25519 verification off the async workers, batched.
//! - [`seen`] — `SeenCache`, the replay window's memory.
//! - [`transcript`] — per-group, append-only, deduplicated, durable transcripts.
//! - [`outbox`] — one ordered, retrying, bounded queue per peer.
//! - [`cursor`] — `DeliveryCursor`: how far delivery to a peer got, saved off the async workers.
//! - [`acks`] — claim acknowledgements: when one claim has reached every peer, and who answered.
//! - [`streams`] — the Redis Streams transport: one stream per group, a cursor per bot.
//! - [`bridge`] — the peer-facing listener and its checks.
//! - [`relay`] — relaying around a broken link: hop limit, original signatures, signed receipts.
//! - [`api`] — the local API and page.
//! - [`feishu`] — Feishu/Lark: signed, encrypted event callbacks in; messages with real `<at>` out.
//! - [`server`] — hyper plumbing shared by both listeners.
//! - [`events`] — live events for the page and SSE.
//! - [`metrics`] — Prometheus metrics.
//! - [`mention`] — `MentionMatcher`: @mentions with real Latin and CJK boundaries.
//! - [`policy`] — depth, quiet, caps, participation: the rules no prompt can bend.
//! - [`judge`] — the short "should I interject?" prompt and the offline judge.
//! - [`scheduler`] — relevance-scaled delays, claims and yielding.
//! - [`reply`] — the reply prompt and the offline reply.
//! - [`llm`] — the OpenAI-compatible client.
//! - [`turn`] — the pipeline for one message, and `explain`.
//! - [`simulate`] — `botmesh simulate`: the real turn-taking code in virtual time, against baselines.
//! - [`node`] — one running node: state, start, graceful shutdown.
//! - [`fuzzing`] — the fuzz harnesses, shared by `fuzz/` and the corpus replay test.

#![forbid(unsafe_code)]

pub mod app;
pub mod config;
pub mod egress;
pub mod fuzzing;
pub mod ingress;
pub mod llm;
pub mod platform;
pub mod simulate;
pub mod store;
pub mod telemetry;
pub mod turn;
pub mod wire;
