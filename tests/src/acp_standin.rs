//! Driving the scripted ACP agent tests/py/acp_agent.py from a test: the bot's
//! `agent` table running it boxed in a folder, its log there, and the test's word
//! (`go<i>` files) that ends each step of a `STEPS <n>` prompt.
//!
//! Exists because many test files (tests/tests/agents.rs, group_tools.rs,
//! status_messages.rs, browser.rs) host the stand-in, and some have it work slowly,
//! step by step, and watch what people are shown meanwhile.

use std::path::Path;
use std::time::Duration;

use crate::{acp_standin_script, standin_dir, test_python, use_sandbox_launcher, wait_for};

/// The longest a wait for the stand-in's log lasts.
const WAIT: Duration = Duration::from_secs(20);

/// A bot's `agent` table: the stand-in working in `dir` (boxed by the botmesh binary,
/// logging to `dir`/agent.log), with `extra` keys (e.g. `, ask = ["execute"]`).
pub fn agent_table(dir: &Path, extra: &str) -> String {
    use_sandbox_launcher();
    format!(
        "agent = {{ acp = [{:?}, {:?}], cwd = {:?}, env = {{ ACP_STANDIN_LOG = {:?} }}, sandbox = {{ read = [{:?}] }}{extra} }}",
        test_python(),
        acp_standin_script(),
        dir.display().to_string(),
        dir.join("agent.log").display().to_string(),
        standin_dir(),
    )
}

/// The stand-in's log lines so far.
pub fn log(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("agent.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits (bounded) until the stand-in logged a line starting with `line`, and gives
/// that line; panics with its log if it never does.
pub async fn logged(dir: &Path, line: &str) -> String {
    let log = wait_for(
        WAIT,
        Duration::from_millis(20),
        || async { log(dir) },
        |l: &Vec<String>| l.iter().any(|l| l.starts_with(line)),
    )
    .await;
    log.iter()
        .find(|l| l.starts_with(line))
        .cloned()
        .unwrap_or_else(|| panic!("the stand-in never logged {line:?}: {log:?}"))
}

/// Lets the stand-in end step `n` of a `STEPS` prompt.
pub fn end_step(dir: &Path, n: u32) {
    std::fs::write(dir.join(format!("go{n}")), b"").expect("write the go file");
}

/// Lets the stand-in end step `n` and waits until it is on the next one.
pub async fn next_step(dir: &Path, n: u32) {
    end_step(dir, n);
    logged(dir, &format!("step {} ", n + 1)).await;
}
