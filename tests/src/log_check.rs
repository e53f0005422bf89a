//! What the tests check of a node's log: that at trace level it holds no secret.
//!
//! Exists because every adapter that holds a token is checked this way (tests/tests/
//! api_lock.rs, and the platforms' own files).

/// Fails unless `log` is at trace level and holds none of `secrets`, as text or as the
/// hex of their bytes (how tungstenite prints a frame's payload).
#[track_caller]
pub fn assert_holds_none(log: &str, secrets: &[&str]) {
    assert!(log.contains(" TRACE "), "the log is not at trace:\n{log}");
    for secret in secrets {
        let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
        for (form, needle) in [("text", *secret), ("hex", hex.as_str())] {
            let lines: Vec<&str> = log.lines().filter(|l| l.contains(needle)).collect();
            assert!(
                lines.is_empty(),
                "{secret:?} is in the log as {form}:\n{}",
                lines.join("\n")
            );
        }
    }
}
