//! A child's stderr in the node's log: the ACP agent's and each stdio MCP server's,
//! line by line, prefixed with whose it is, lines cut at [`LINE`], and rate-limited
//! ([`PER_SECOND`], bursts of [`BURST`]): a process printing without end cannot fill
//! the node's log. What is skipped is counted and said once logging resumes. The
//! sandbox launcher's own lines (`botmesh-sandbox: …`, why a box failed) go at warn.

use std::sync::Arc;

use tokio::io::{AsyncRead, BufReader};

use crate::agent::acp::rpc::read_bounded_line;
use crate::config::pacing::TokenBucket;

/// The longest line logged whole; the rest of a longer line is cut.
pub(crate) const LINE: usize = 2048;
/// Lines logged per second, on average.
pub(crate) const PER_SECOND: f64 = 20.0;
/// Lines logged at once before the rate applies.
pub(crate) const BURST: f64 = 200.0;

/// At which level a child's ordinary lines are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// An ACP agent's chatter.
    Debug,
    /// An MCP server's (its errors are what an operator looks for).
    Info,
}

/// Logs `stderr` until it ends, as the module says; `label` names the process.
pub(crate) async fn log_lines(stderr: impl AsyncRead + Unpin, label: Arc<str>, level: Level) {
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    let mut bucket = TokenBucket::full(PER_SECOND, BURST, tokio::time::Instant::now());
    let mut skipped = 0u64;
    while let Ok(Some(cut)) = read_bounded_line(&mut reader, LINE, &mut buf).await {
        if bucket.take(tokio::time::Instant::now()).is_err() {
            skipped += 1;
            continue;
        }
        if skipped > 0 {
            tracing::info!(process = %label, skipped, "stderr lines not logged (over {PER_SECOND} a second)");
            skipped = 0;
        }
        let line = String::from_utf8_lossy(&buf);
        if line.starts_with("botmesh-sandbox:") {
            tracing::warn!(process = %label, "{line}");
        } else if level == Level::Info {
            tracing::info!(process = %label, cut, "stderr: {line}");
        } else {
            tracing::debug!(process = %label, cut, "stderr: {line}");
        }
    }
    if skipped > 0 {
        tracing::info!(process = %label, skipped, "stderr lines not logged (over {PER_SECOND} a second)");
    }
}
