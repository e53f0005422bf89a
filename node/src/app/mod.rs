//! One running node: its state and lifecycle ([`node`]), the routing of its two
//! listeners, the local API and page ([`api`]), configuration reloads ([`reload`])
//! and people's commands in the chat ([`commands`]). The node implements the narrow
//! handles the layers below hold: `turn::Ports`, `ingress::ingest::Sink`.
pub(crate) mod api;
pub(crate) mod commands;
pub mod node;
pub mod reload;
