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
pub mod bridge;
pub mod ingest;
pub mod limiter;
pub mod relayed;
pub mod seen;
pub mod server;
pub mod stream;
pub mod verify_pool;
