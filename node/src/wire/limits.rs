//! Paths, headers and size limits of the peer-facing protocol: shared by the sender
//! (egress), the receiver (ingress) and the configuration's validation.

/// Where peers post single envelopes.
pub const ENVELOPES_PATH: &str = "/bridge/v1/envelopes";

/// Request bodies larger than this are refused (413) before they are buffered.
pub(crate) const MAX_BODY_BYTES: usize = 256 * 1024;

/// Relay request header: the bot the relayed envelope is for.
pub(crate) const HEADER_RELAY_TO: &str = "botmesh-relay-to";
/// Relay request header: hops taken so far (1 at the first relay).
pub(crate) const HEADER_HOPS: &str = "botmesh-hops";
/// Relay request header: the relay that forwarded the envelope on its last hop.
pub(crate) const HEADER_RELAYED_BY: &str = "botmesh-relayed-by";
/// The most hops `[mesh].max_relay_hops` may allow.
pub(crate) const MAX_HOPS_LIMIT: u32 = 3;

/// The deepest an envelope may be: bot turns since the last person's message. The
/// loop brake (`[mesh] max_depth`, at most this) stops bots long before; the bound is
/// for what a peer sends, so a forged or broken depth near `u32::MAX` is refused
/// rather than carried (and wrapped to 0 by the next answer).
pub const MAX_DEPTH: u32 = 400;

/// The longest name an author may carry, in bytes: a bot's name in peers.toml, a
/// person's name posted through the local API (`from`) or carried by a peer. Names
/// from chat platforms are cut to it ([`crate::wire::envelope::Author::human`]).
pub const MAX_NAME_BYTES: usize = 64;
