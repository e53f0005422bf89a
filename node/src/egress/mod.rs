//! Outbound delivery: one ordered, retrying outbox per peer over its transport.
pub mod acks;
pub mod outbox;
pub mod relay;
pub mod stream;
