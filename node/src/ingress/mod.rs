//! Inbound: every path a message takes into the node holds an [`ingest::Ingest`]
//! handle, and every envelope passes the same admission checks ([`bridge`]).
//!
//! - [`ingest`] — `Ingest`, the narrow handle, and `Sink`, what the node implements.
//! - [`bridge`] — the HTTP bridge and the admission checks: verify, dedup, rate limit.
//! - [`relayed`] — relayed copies: forward, or admit and sign a receipt.
//! - [`stream`] — the Redis Streams reader.
//! - [`limiter`] — the per-peer token bucket.
//! - [`seen`] — `SeenCache`, the replay window's memory.
//! - [`verify_pool`] — Ed25519 verification off the async workers, batched.
//! - [`server`] — the hyper plumbing both listeners share.
pub(crate) mod bridge;
pub(crate) mod ingest;
pub(crate) mod limiter;
pub(crate) mod relayed;
pub(crate) mod seen;
pub(crate) mod server;
pub(crate) mod stream;
pub(crate) mod verify_pool;
