//! A platform's official client (a Python script on its SDK) run against a stand-in:
//! its JSON lines read one at a time, its stderr kept for failure messages, its end
//! checked.
//!
//! Exists because every stand-in is proven faithful by such a client, and each
//! platform's test read the client's lines with its own copy of this loop.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// `program` as a client reaching only loopback: `NO_PROXY` covers 127.0.0.1 and every
/// proxy setting of the environment is removed (the test machine may set one, and
/// the SDKs honour them).
pub fn loopback_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// One running client and what it printed so far.
pub struct SdkClient {
    /// What failure messages call it (`discord.py`, `slack_sdk`).
    name: String,
    /// The process (killed when dropped).
    child: Child,
    /// Its stdout, one JSON object a line.
    lines: Lines<BufReader<ChildStdout>>,
    /// Everything it wrote to stderr so far.
    stderr: Arc<Mutex<String>>,
    /// How long one expected line, and its exit, may take.
    wait: Duration,
    /// Every JSON line read so far, oldest first (shown when a line does not come).
    pub seen: Vec<serde_json::Value>,
}

impl SdkClient {
    /// Runs `cmd` (its stdout and stderr piped, killed when dropped) as the client
    /// called `name`, each expected line and its exit bounded by `wait`.
    pub fn start(name: &str, mut cmd: Command, wait: Duration) -> SdkClient {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start python");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = stderr.clone();
        tokio::spawn(async move {
            while let Ok(Some(l)) = err_lines.next_line().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&l);
                s.push('\n');
            }
        });
        SdkClient {
            name: name.to_string(),
            child,
            lines,
            stderr,
            wait,
            seen: Vec::new(),
        }
    }

    /// Everything the client wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The next of the client's JSON lines that satisfies `want` (bounded in time);
    /// `what` names it when it does not come.
    pub async fn expect_line(
        &mut self,
        what: &str,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        self.expect_line_showing(what, String::new, want).await
    }

    /// The next line whose `event` is `event`.
    pub async fn expect_event(&mut self, event: &str) -> serde_json::Value {
        self.expect_line(event, |v| v["event"] == event).await
    }

    /// The first line that satisfies `want`: one already read (for a client that
    /// handles events on a thread pool, so two may print in either order), else the
    /// next such line. `stand_in` tells the stand-in's side when none comes.
    pub async fn expect_seen_or_next(
        &mut self,
        what: &str,
        stand_in: impl Fn() -> String,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        if let Some(v) = self.seen.iter().find(|v| want(v)) {
            return v.clone();
        }
        self.expect_line_showing(what, stand_in, want).await
    }

    /// [`SdkClient::expect_line`], with `stand_in` telling the stand-in's side when the
    /// line does not come in time.
    async fn expect_line_showing(
        &mut self,
        what: &str,
        stand_in: impl Fn() -> String,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{}: no {what} in time; saw {:#?}\nstderr:\n{}\n{}",
                        self.name,
                        self.seen,
                        self.stderr(),
                        stand_in()
                    )
                })
                .expect("read stdout")
                .unwrap_or_else(|| {
                    // Its last words may still be on their way to the stderr reader.
                    tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(300)));
                    panic!(
                        "{} exited before {what}; saw {:#?}\nstderr:\n{}",
                        self.name,
                        self.seen,
                        self.stderr()
                    )
                });
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            self.seen.push(v.clone());
            if want(&v) {
                return v;
            }
        }
    }

    /// Waits (bounded) for the client to exit, asserts it succeeded and raised
    /// nothing on the stand-in's payloads, and returns its stderr.
    pub async fn finish(mut self) -> String {
        let status = tokio::time::timeout(self.wait, self.child.wait())
            .await
            .expect("exits")
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let err = self.stderr();
        assert!(status.success(), "{} failed: {err}", self.name);
        assert!(
            !err.contains("Traceback"),
            "{} raised on the stand-in's payloads:\n{err}",
            self.name
        );
        err
    }
}
