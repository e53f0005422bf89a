//! What a node keeps on disk: transcripts, the outbox log, delivery cursors, the
//! verdict log (`botmesh replay`).
pub(crate) mod cursor;
pub(crate) mod transcript;
pub(crate) mod verdicts;
