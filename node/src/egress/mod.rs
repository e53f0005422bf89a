//! Outbound delivery: one bounded, ordered, retrying outbox per peer ([`outbox`])
//! over its link — the peer's HTTP bridge, a relay around a broken link ([`relay`]),
//! or the Redis stream ([`stream`]) — and the tracking of claims' acknowledgements
//! ([`acks`]).
pub(crate) mod acks;
pub(crate) mod outbox;
pub(crate) mod relay;
pub(crate) mod stream;
