//! What a node keeps on disk: transcripts, the outbox log, delivery cursors.
pub(crate) mod cursor;
pub(crate) mod transcript;
