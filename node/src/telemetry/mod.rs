//! What a node tells its operators: Prometheus metrics and live events.
pub mod events;
pub(crate) mod hot_counters;
pub mod metrics;
pub mod refusals;
#[cfg(test)]
pub(crate) mod test_log;

/// The WebSocket crates (via `log`), whose debug and trace lines print whole frames and
/// handshake requests: Discord's IDENTIFY frame carries the bot token, DingTalk's and
/// Feishu's connection URLs carry their one-time tickets and access keys. Held at
/// [`SECRET_SAFE_LEVEL`] whatever `BOTMESH_LOG` says.
pub const FRAME_LOGGING_CRATES: [&str; 2] = ["tungstenite", "tokio_tungstenite"];

/// The most [`FRAME_LOGGING_CRATES`] may log.
pub const SECRET_SAFE_LEVEL: tracing::level_filters::LevelFilter =
    tracing::level_filters::LevelFilter::WARN;

/// A filter layer to add next to the operator's own (`BOTMESH_LOG`): it lets everything
/// through but the [`FRAME_LOGGING_CRATES`] below [`SECRET_SAFE_LEVEL`], so that no
/// filter, not even `BOTMESH_LOG=trace` or `tungstenite=trace`, puts a token in the log.
/// An event is logged only when every filter of the subscriber lets it through.
pub fn secret_safe_levels() -> tracing_subscriber::filter::Targets {
    FRAME_LOGGING_CRATES.iter().fold(
        tracing_subscriber::filter::Targets::new()
            .with_default(tracing::level_filters::LevelFilter::TRACE),
        |t, krate| t.with_target(*krate, SECRET_SAFE_LEVEL),
    )
}
