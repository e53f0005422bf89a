//! The running node.
pub mod api;
pub mod node;
