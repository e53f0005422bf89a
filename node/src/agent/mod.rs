//! Reply engines beyond the built-in model: a coding agent hosted over ACP ([`acp`]).
//!
//! This layer sits above `config`, `wire` and `telemetry` and below everything that
//! decides turns: the turn code hands a turn to an engine here and takes its text back.

pub mod acp;
