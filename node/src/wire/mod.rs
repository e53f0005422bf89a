//! The wire: what travels between nodes and how it is signed.
pub(crate) mod batch;
pub mod envelope;
pub(crate) mod ids;
pub mod limits;
pub mod signing;
