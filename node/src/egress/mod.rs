//! Outbound delivery: one bounded, ordered, retrying outbox per peer ([`outbox`])
//! over its link — the peer's HTTP bridge, a relay around a broken link ([`relay`]),
//! or the Redis stream ([`stream`]) — and the tracking of claims' acknowledgements
//! ([`acks`]).
pub mod acks;
pub mod outbox;
pub mod relay;
pub mod stream;
