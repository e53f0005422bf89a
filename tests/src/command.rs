//! Running a command line program (the botmesh binary's subcommands, a Python one-liner)
//! to its end from a test, and insisting it succeeded.
//!
//! Exists because several tests (tests/tests/process.rs, sandbox.rs) ran a program and
//! each spelled out the same check of its exit status with its stderr.

use std::process::{Command, Output};

/// Runs `command` to its end and gives its output; panics if it cannot start, or with
/// its stderr if it exits unsuccessfully.
pub fn run_ok(command: &mut Command) -> Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
