//! What a node tells its operators: Prometheus metrics and live events.
pub mod events;
pub mod metrics;
