//! One running node: its state ([`node`]), how it is started and stopped
//! ([`lifecycle`]) and what the layers below see of it ([`ports`]), the routing of its two
//! listeners, the local API and page ([`api`]) and who may use it ([`gate`]), configuration reloads ([`reload`])
//! and people's commands in the chat ([`commands`]); the group as tools for the bot's
//! agent ([`group_tools`]); a long turn's status message posted, recorded and edited
//! ([`status`]); the bot served as an A2A agent ([`a2a_edge`]).
//! [`replay`]: `botmesh replay` and `POST /v1/replay`, one bot's decisions over a
//! recorded transcript with changed settings.
pub(crate) mod a2a_edge;
pub(crate) mod api;
pub(crate) mod commands;
pub(crate) mod gate;
pub(crate) mod group_tools;
pub mod lifecycle;
pub mod node;
pub(crate) mod ports;
pub mod reload;
pub mod replay;
pub(crate) mod status;
