//! What a node keeps on disk: transcripts (`transcript`, read by the turn code through
//! `turn_queries`), the outbox log (`outbox_log`), delivery cursors, the verdict log
//! (`botmesh replay`), and the file names they are all stored under (`file_names`).
pub(crate) mod cursor;
pub(crate) mod file_names;
pub(crate) mod outbox_log;
pub(crate) mod transcript;
pub(crate) mod turn_queries;
pub(crate) mod verdicts;
