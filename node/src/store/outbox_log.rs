//! The outbox log: every message this node sends to its peers, in the order it was
//! written, until every peer has it (`<data_dir>/outbox.log`, one
//! `seq \t id \t envelope-json` line each).
//!
//! The transcript writer appends to it in the same group commit as the message's
//! transcript line and hands each entry to the [`Fanout`] (see `store::transcript`);
//! `egress::outbox` re-reads it when a peer's outbox spilled, and a restart sends
//! again what no peer confirmed.

use std::path::Path;

use bytes::Bytes;

use super::transcript::read_whole_lines;

/// Where outbound messages go once they are written to the outbox log, in log order
/// (the sync of that write runs while the peers are sent to; see the module docs).
///
/// Implemented by the node over its peers' outboxes. Called from the writer thread, so
/// the order peers see is exactly the order of the outbox log.
pub(crate) trait Fanout: Send + Sync {
    /// Queues an envelope just written to the outbox log for every peer.
    fn push(&self, entry: LoggedOutbound);
    /// The highest sequence every peer has been handed or has given up on.
    fn delivered_through(&self) -> u64;
}

/// An outbound message still in the outbox log (delivery may be pending).
#[derive(Debug, Clone)]
pub struct LoggedOutbound {
    /// Position in the log.
    pub seq: u64,
    /// Envelope id.
    pub id: String,
    /// Serialized envelope.
    pub body: Bytes,
    /// Where its line starts in the outbox log (a spilled outbox re-reads from here).
    pub offset: u64,
}

/// Name of the outbox log in the data folder.
pub(crate) const OUTBOX_LOG: &str = "outbox.log";

/// The outbox log line (with its `\n`) for the message `id` at sequence `seq`, the
/// line [`parse_outbox_line`] reads back.
pub(super) fn outbox_line(seq: u64, id: &str, body: &[u8]) -> Vec<u8> {
    let mut line = format!("{seq}\t{id}\t").into_bytes();
    line.extend_from_slice(body);
    line.push(b'\n');
    line
}

/// Reads the outbox log: `seq \t id \t envelope-json` lines. A torn last line is cut.
pub(super) fn load_outbox_log(path: &Path) -> std::io::Result<Vec<LoggedOutbound>> {
    let mut out = Vec::new();
    if !path.exists() {
        return Ok(out);
    }
    read_whole_lines(path, |line, end| {
        let start = end - line.len() as u64 - 1;
        match parse_outbox_line(line, start) {
            Some(e) => out.push(e),
            None => {
                tracing::warn!(file = %path.display(), offset = start, "skipping unreadable outbox log line")
            }
        }
    })?;
    Ok(out)
}

/// Parses one outbox log line (without its `\n`) that starts at byte `offset`.
pub(crate) fn parse_outbox_line(line: &[u8], offset: u64) -> Option<LoggedOutbound> {
    let mut parts = line.splitn(3, |b| *b == b'\t');
    let seq: u64 = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let id = std::str::from_utf8(parts.next()?).ok()?.to_string();
    let body = Bytes::copy_from_slice(parts.next()?);
    Some(LoggedOutbound {
        seq,
        id,
        body,
        offset,
    })
}
