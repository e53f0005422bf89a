//! Inbound: admission checks, the HTTP bridge, the stream reader.
pub mod bridge;
pub mod seen;
pub mod server;
pub mod verify_pool;
