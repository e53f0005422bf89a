//! What a node keeps on disk: transcripts, the outbox log, delivery cursors.
pub mod cursor;
pub mod transcript;
