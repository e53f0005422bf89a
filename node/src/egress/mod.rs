//! Outbound delivery: one bounded, ordered, retrying outbox per peer ([`outbox`])
//! over a [`transport::Transport`] — the peer's HTTP bridge or the Redis stream
//! ([`stream`]) — with relaying around a broken link ([`relay`]), and the tracking of
//! claims' acknowledgements ([`acks`]).
pub(crate) mod acks;
pub(crate) mod outbox;
pub(crate) mod relay;
pub(crate) mod stream;
pub(crate) mod transport;
