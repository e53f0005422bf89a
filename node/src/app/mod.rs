//! One running node: its state and lifecycle ([`node`]), the routing of its two
//! listeners, and the local API and page ([`api`]). The node implements the narrow
//! handles the layers below hold: `turn::Ports`, `ingress::ingest::Sink`.
//! [`replay`]: `botmesh replay` and `POST /v1/replay`, one bot's decisions over a
//! recorded transcript with changed settings.
pub(crate) mod api;
pub mod node;
pub mod replay;
