//! The ACP client (`botmesh::agent::acp`) driving a real agent process: the scripted
//! stand-in tests/py/acp_agent.py, written with the official Python ACP SDK
//! (`agent-client-protocol`, from the test venv in `BOTMESH_TEST_PYTHON`). What each
//! prompt makes it do is listed at the top of that file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use botmesh::agent::acp::{
    AcpAgent, AcpError, AcpOptions, AcpProgress, AcpPrompt, AcpSettings, Decision, PermissionAsker,
    PermissionQuestion, PlanStep, Rejection, StopReason, ToolKind,
};
use botmesh::config::acp::SandboxSetting;
use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// The longest any wait here lasts.
const WAIT: Duration = Duration::from_secs(20);

use botmesh_tests::{acp_standin_script as script, test_python as python};

/// A working directory with the stand-in's log in it.
struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().expect("temp dir"))
    }
    fn path(&self) -> PathBuf {
        self.0.path().canonicalize().expect("canonical")
    }
    fn log_path(&self) -> String {
        self.path().join("agent.log").display().to_string()
    }
    /// The stand-in's log lines so far.
    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
    /// Waits (bounded) until the stand-in logged a line starting with `prefix`.
    async fn wait_log(&self, prefix: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(line) = self.log().into_iter().find(|l| l.starts_with(prefix)) {
                return line;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the agent never logged {prefix:?}: {:?}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Settings running the stand-in in `dir`: `read` allowed; `execute`, `edit`, `move`
/// asked about; everything else rejected.
fn settings(dir: &Dir, env: &[(&str, &str)]) -> AcpSettings {
    let mut vars: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    vars.insert("ACP_STANDIN_LOG".into(), dir.log_path());
    AcpSettings {
        acp: vec![python(), script()],
        cwd: dir.path(),
        env: vars,
        env_from: Default::default(),
        allow: vec![ToolKind::Read],
        ask: vec![ToolKind::Execute, ToolKind::Edit, ToolKind::Move],
        turn_timeout_secs: 30,
        ask_timeout_secs: 1,
        init_timeout_secs: 10,
        max_reply_chars: 20_000,
        max_title_chars: 200,
        // Boxed, as by default: the stand-in's script is read where it lies.
        sandbox: SandboxSetting::Boxed {
            read: vec![botmesh_tests::standin_dir().into()],
            write: vec![],
        },
        run_as: None,
    }
}

async fn start(settings: AcpSettings, options: AcpOptions) -> AcpAgent {
    botmesh_tests::init_logs();
    botmesh_tests::use_sandbox_launcher();
    tokio::time::timeout(WAIT, AcpAgent::start(settings, "Ada", options))
        .await
        .expect("starts in time")
        .expect("starts")
}

async fn prompt(agent: &AcpAgent, group: &str, text: &str) -> botmesh::agent::acp::TurnOutcome {
    tokio::time::timeout(WAIT, agent.prompt(group, text, None))
        .await
        .expect("the turn ends in time")
        .expect("the turn succeeds")
}

#[tokio::test]
async fn message_chunks_make_the_reply_in_order_and_tool_calls_and_plans_are_progress() {
    let dir = Dir::new();
    let agent = start(settings(&dir, &[]), AcpOptions::default()).await;
    let (tx, mut rx) = mpsc::channel(16);
    let out = agent
        .prompt("g1", "CHUNKS please", Some(tx))
        .await
        .expect("turn");
    assert_eq!(out.text, "one two three");
    assert_eq!(out.stop_reason, StopReason::EndTurn);
    assert!(out.new_session);
    let mut progress = Vec::new();
    while let Ok(p) = rx.try_recv() {
        progress.push(p);
    }
    assert_eq!(
        progress,
        [
            AcpProgress::Plan(vec![PlanStep {
                content: "count to three".into(),
                status: "in_progress".into()
            }]),
            // Its first message chunk: it is writing.
            AcpProgress::Writing,
            AcpProgress::ToolCall {
                id: "t1".into(),
                title: "cargo test".into(),
                kind: ToolKind::Execute,
                status: "in_progress".into()
            },
            // The update leaves title and kind out: they are filled from the call.
            AcpProgress::ToolCall {
                id: "t1".into(),
                title: "cargo test".into(),
                kind: ToolKind::Execute,
                status: "completed".into()
            },
        ]
    );
    let again = prompt(&agent, "g1", "hello").await;
    assert_eq!(again.text, "echo: hello");
    assert!(!again.new_session, "the group's session is kept");
    let refused = prompt(&agent, "g1", "REFUSE").await;
    assert_eq!(refused.stop_reason, StopReason::Refusal);
    assert_eq!(
        refused.text, "I started, but ",
        "what came before a refusal is kept"
    );
    let init = dir.wait_log("initialize").await;
    assert!(
        init.contains(r#""fs": {"readTextFile": false, "writeTextFile": false}"#)
            && init.contains(r#""terminal": false"#),
        "{init}"
    );
    agent.stop().await;
}

#[tokio::test]
async fn session_new_carries_the_mcp_servers_and_cwd_and_context_goes_only_to_a_new_session() {
    let dir = Dir::new();
    let servers = vec![
        json!({"name": "time", "command": "/usr/bin/mcp-server-time", "args": ["--local-timezone", "UTC"], "env": [{"name": "TZ", "value": "UTC"}]}),
        json!({"type": "http", "name": "docs", "url": "http://127.0.0.1:9/mcp", "headers": []}),
    ];
    // The servers as ACP's types read them from the wire shape they must go out in.
    let options = AcpOptions {
        mcp_servers: serde_json::from_value(Value::Array(servers.clone())).expect("ACP McpServers"),
        ..AcpOptions::default()
    };
    let agent = start(settings(&dir, &[]), options).await;
    assert!(agent.needs_context("g1"));
    let with_context = |text: &str| AcpPrompt {
        text: text.into(),
        context: Some("Bob: the build is red".into()),
    };
    let first = agent
        .prompt("g1", with_context("SESSION"), None)
        .await
        .unwrap();
    assert!(first.new_session);
    let seen: Value = serde_json::from_str(&first.text).expect("JSON");
    assert_eq!(seen["cwd"], json!(dir.path().display().to_string()));
    assert_eq!(seen["mcpServers"], Value::Array(servers));
    assert_eq!(seen["blocks"], json!(["Bob: the build is red", "SESSION"]));
    assert!(!agent.needs_context("g1"));
    let second = agent
        .prompt("g1", with_context("SESSION"), None)
        .await
        .unwrap();
    let seen2: Value = serde_json::from_str(&second.text).expect("JSON");
    assert_eq!(
        seen2["blocks"],
        json!(["SESSION"]),
        "no context in a kept session"
    );
    assert_eq!(seen2["sessionId"], seen["sessionId"]);
    let other: Value = serde_json::from_str(&prompt(&agent, "g2", "SESSION").await.text).unwrap();
    assert_ne!(
        other["sessionId"], seen["sessionId"],
        "one session per group"
    );
    agent.stop().await;
}

#[tokio::test]
async fn the_agent_gets_a_clean_environment_and_its_cwd() {
    // The node's secrets live in its environment: none may reach the agent.
    std::env::set_var("BOTMESH_SECRET", "whsec_must_not_leak");
    std::env::set_var("LANG", "C.UTF-8");
    let dir = Dir::new();
    let agent = start(
        settings(&dir, &[("CODEX_HOME", "/srv/codex")]),
        AcpOptions::default(),
    )
    .await;
    let out: Value = serde_json::from_str(&prompt(&agent, "g", "ENV").await.text).unwrap();
    let env = out["env"].as_object().expect("env");
    assert_eq!(env.get("CODEX_HOME"), Some(&json!("/srv/codex")));
    assert_eq!(
        env.get("PATH"),
        Some(&json!(std::env::var("PATH").unwrap()))
    );
    assert_eq!(
        env.get("HOME"),
        Some(&json!(std::env::var("HOME").unwrap()))
    );
    assert_eq!(env.get("LANG"), Some(&json!("C.UTF-8")));
    assert!(!env.contains_key("BOTMESH_SECRET"), "{env:?}");
    // Python itself may add LC_CTYPE (its C-locale coercion); nothing else is there.
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "CODEX_HOME",
        "ACP_STANDIN_LOG",
        "LC_CTYPE",
        // The box's private temp dir.
        "TMPDIR",
    ];
    let extra: Vec<&String> = env
        .keys()
        .filter(|k| !allowed.contains(&k.as_str()))
        .collect();
    assert!(extra.is_empty(), "unexpected variables: {extra:?}");
    assert_eq!(out["cwd"], json!(dir.path().display().to_string()));
    agent.stop().await;
}

#[tokio::test]
async fn a_command_that_cannot_start_is_a_spawn_error_naming_it() {
    let dir = Dir::new();
    let mut s = settings(&dir, &[]);
    s.acp = vec!["botmesh-no-such-agent".into(), "--acp".into()];
    botmesh_tests::use_sandbox_launcher();
    let err = AcpAgent::start(s, "Ada", AcpOptions::default())
        .await
        .expect_err("cannot start");
    let AcpError::Spawn { command, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(command, "botmesh-no-such-agent --acp");
    assert!(err.to_string().contains("botmesh-no-such-agent"), "{err}");
}

/// Whether a process is gone (or a zombie no one reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn stop_ends_an_agent_that_ignores_stdin_and_sigterm_and_its_children() {
    let dir = Dir::new();
    let agent = start(
        settings(&dir, &[("ACP_STANDIN_STUBBORN", "1")]),
        AcpOptions::default(),
    )
    .await;
    let leader = agent.pid().expect("running");
    let sleeper: u32 = prompt(&agent, "g", "SLEEPER").await.text.parse().unwrap();
    assert!(!gone(leader) && !gone(sleeper));
    tokio::time::timeout(WAIT, agent.stop())
        .await
        .expect("stops in time");
    assert!(gone(leader), "the agent outlived stop");
    assert!(gone(sleeper), "the agent's child outlived stop");
    assert!(
        dir.log().iter().any(|l| l == "stdin closed"),
        "stdin is closed first: {:?}",
        dir.log()
    );
}

/// Answers by the tool call's title, and records every question.
struct Scripted {
    asked: std::sync::Mutex<Vec<PermissionQuestion>>,
}

impl PermissionAsker for Scripted {
    fn ask(&self, question: PermissionQuestion) -> BoxFuture<'static, Decision> {
        self.asked.lock().unwrap().push(question.clone());
        Box::pin(async move {
            match question.kind {
                ToolKind::Execute => Decision::Allow,
                ToolKind::Edit => Decision::Deny {
                    by: Some("Boss".into()),
                },
                // No one answers: the client's ask_timeout_secs decides.
                _ => std::future::pending().await,
            }
        })
    }
}

#[tokio::test]
async fn permissions_are_answered_by_kind_and_the_agent_sees_each_decision() {
    let dir = Dir::new();
    let asker = Arc::new(Scripted {
        asked: std::sync::Mutex::new(Vec::new()),
    });
    let options = AcpOptions {
        asker: Some(asker.clone()),
        ..AcpOptions::default()
    };
    let agent = start(settings(&dir, &[]), options).await;
    // Option ids are not their kinds: the client picks by kind.
    // Each rejection is reported with the turn, saying why.
    let denied = Rejection::Denied {
        by: Some("Boss".into()),
    };
    for (kind, picked, rejected) in [
        ("read", "proceed-once", None),                 // allowed
        ("execute", "proceed-once", None),              // asked: allowed
        ("edit", "nope", Some(denied)),                 // asked: denied
        ("move", "nope", Some(Rejection::Unanswered)),  // asked: no answer within ask_timeout_secs
        ("fetch", "nope", Some(Rejection::NotAllowed)), // neither allowed nor asked
    ] {
        let out = prompt(&agent, "g", &format!("TOOL {kind}")).await;
        assert_eq!(out.text, format!("permission: {picked}"), "kind {kind}");
        let rejections: Vec<Rejection> = out.rejected.iter().map(|r| r.why.clone()).collect();
        assert_eq!(rejections, Vec::from_iter(rejected), "kind {kind}");
        dir.wait_log(&format!("permission {kind} {picked}")).await;
    }
    // A rejection with no option of kind reject_once is not an allow in disguise.
    let out = prompt(&agent, "g", "TOOL fetch ONLYALLOW").await;
    assert_eq!(out.text, "permission: cancelled");
    assert_eq!(out.rejected.len(), 1, "{:?}", out.rejected);
    assert_eq!(out.rejected[0].kind, ToolKind::Fetch);
    assert_eq!(out.rejected[0].why, Rejection::NotAllowed);
    let asked: Vec<(String, String, String, ToolKind)> = asker
        .asked
        .lock()
        .unwrap()
        .iter()
        .map(|q| (q.bot.clone(), q.group.clone(), q.title.clone(), q.kind))
        .collect();
    let q = |kind: ToolKind| ("Ada".into(), "g".into(), format!("do a {kind} thing"), kind);
    assert_eq!(
        asked,
        [q(ToolKind::Execute), q(ToolKind::Edit), q(ToolKind::Move)],
        "only kinds in ask are asked about"
    );
    // Each question says what the call would do, from its kind and object.
    let actions: Vec<String> = asker
        .asked
        .lock()
        .unwrap()
        .iter()
        .map(|q| q.action.clone())
        .collect();
    assert_eq!(
        actions,
        ["run `cargo test`", "edit notes.txt", "move notes.txt"]
    );
    agent.stop().await;
}

#[tokio::test]
async fn string_request_ids_are_echoed_and_unknown_methods_get_method_not_found() {
    let dir = Dir::new();
    let agent = start(settings(&dir, &[]), AcpOptions::default()).await;
    let out: Value = serde_json::from_str(&prompt(&agent, "g", "STRINGID").await.text).unwrap();
    assert_eq!(
        out["permission"],
        json!({"outcome": {"outcome": "selected", "optionId": "ok"}})
    );
    assert_eq!(out["unknown"], json!(-32601));
    agent.stop().await;
}

#[tokio::test]
async fn a_dropped_turn_is_cancelled_at_the_agent_and_the_group_goes_on() {
    let dir = Dir::new();
    let agent = start(settings(&dir, &[]), AcpOptions::default()).await;
    let turn = agent.prompt("g", "SLOW", None);
    // The turn is dropped (/stop, the node stopping): its future is dropped.
    let lost = tokio::time::timeout(Duration::from_millis(800), turn).await;
    assert!(lost.is_err(), "SLOW works for 30 s");
    let line = dir.wait_log("cancelled ").await;
    assert!(line.starts_with("cancelled sess-"), "{line}");
    let next = prompt(&agent, "g", "after").await;
    assert_eq!(next.text, "echo: after");
    agent.stop().await;
}

#[tokio::test]
async fn cancel_stops_a_turn_in_flight_which_returns_no_text() {
    let dir = Dir::new();
    let agent = start(settings(&dir, &[]), AcpOptions::default()).await;
    let (out, ()) = tokio::join!(agent.prompt("g", "SLOW", None), async {
        dir.wait_log("prompt ").await;
        let busy = agent.prompt("g", "too", None).await;
        assert_eq!(busy, Err(AcpError::Busy("g".into())), "one turn per group");
        assert!(agent.cancel("g"), "a turn was in flight");
    });
    let out = out.expect("the turn ends");
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(out.text, "", "a cancelled turn has no text");
    dir.wait_log("cancelled ").await;
    assert!(!agent.cancel("g"), "nothing in flight any more");
    agent.stop().await;
}

#[tokio::test]
async fn a_turn_past_its_timeout_is_cancelled_and_timed_out() {
    let dir = Dir::new();
    let mut s = settings(&dir, &[]);
    s.turn_timeout_secs = 2;
    let agent = start(s, AcpOptions::default()).await;
    let err = tokio::time::timeout(WAIT, agent.prompt("g", "SLOW", None))
        .await
        .expect("ends")
        .expect_err("times out");
    assert_eq!(err, AcpError::TimedOut(Duration::from_secs(2)));
    dir.wait_log("cancelled ").await;
    agent.stop().await;
}

#[tokio::test]
async fn a_crash_fails_the_turn_and_the_next_prompt_runs_on_a_restarted_agent() {
    let dir = Dir::new();
    let agent = start(settings(&dir, &[]), AcpOptions::default()).await;
    let first_pid = agent.pid().unwrap();
    let opened = prompt(&agent, "g", "SESSION").await;
    let before: Value = serde_json::from_str(&opened.text).unwrap();
    let err = tokio::time::timeout(WAIT, agent.prompt("g", "CRASH", None))
        .await
        .expect("ends")
        .expect_err("dies");
    let AcpError::Died { status, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(status.as_deref(), Some("exit status: 3"), "{err}");
    let again = prompt(&agent, "g", "SESSION").await;
    assert!(again.new_session, "the caller is told the session is new");
    let after: Value = serde_json::from_str(&again.text).unwrap();
    assert_ne!(after["sessionId"], before["sessionId"]);
    assert_ne!(agent.pid(), Some(first_pid), "a new process");
    assert!(gone(first_pid));
    agent.stop().await;
}

/// Never answers; counts the questions.
struct Silent {
    asked: std::sync::atomic::AtomicUsize,
}

impl PermissionAsker for Silent {
    fn ask(&self, _question: PermissionQuestion) -> BoxFuture<'static, Decision> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn a_question_pending_when_the_turn_is_cancelled_is_answered_cancelled() {
    let dir = Dir::new();
    let mut s = settings(&dir, &[]);
    s.ask_timeout_secs = 60;
    let asker = Arc::new(Silent {
        asked: std::sync::atomic::AtomicUsize::new(0),
    });
    let options = AcpOptions {
        asker: Some(asker.clone()),
        ..AcpOptions::default()
    };
    let agent = start(s, options).await;
    let (out, ()) = tokio::join!(agent.prompt("g", "TOOL execute", None), async {
        let deadline = tokio::time::Instant::now() + WAIT;
        while asker.asked.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "never asked");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(agent.cancel("g"));
    });
    dir.wait_log("permission execute cancelled").await;
    assert_eq!(
        out.expect("the turn ends").text,
        "",
        "a cancelled turn has no text"
    );
    agent.stop().await;
}

/// What the hostile stand-in got for each path (`PROBE`): `(path, ok, text or error)`.
fn probed(out: &Value, list: &str, path: &str) -> (bool, String) {
    let got = &out[list][path];
    let ok = got["ok"]
        .as_bool()
        .unwrap_or_else(|| panic!("{path}: {out}"));
    let text = got["text"].as_str().or(got["error"].as_str()).unwrap_or("");
    (ok, text.to_string())
}

/// A node's private files next to the agent's folder: the config, a key, the data dir.
struct Private {
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl Private {
    fn make() -> Private {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("data/Ada")).unwrap();
        std::fs::write(
            root.join("peers.toml"),
            "secret_env = \"whsec_config_marker\"",
        )
        .unwrap();
        std::fs::write(root.join("ada.key"), "whsk_key_marker").unwrap();
        std::fs::write(root.join("data/Ada/state"), "data_marker").unwrap();
        std::fs::write(root.join("notes.txt"), "notes_marker").unwrap();
        Private { root, _dir: dir }
    }
    fn deny(&self) -> Vec<PathBuf> {
        ["peers.toml", "ada.key", "data"]
            .iter()
            .map(|p| self.root.join(p))
            .collect()
    }
    fn at(&self, p: &str) -> String {
        self.root.join(p).display().to_string()
    }
}

#[tokio::test]
async fn a_boxed_agent_reaches_its_cwd_and_temp_dir_and_nothing_of_the_node() {
    let dir = Dir::new();
    let private = Private::make();
    let outside = tempfile::tempdir().unwrap();
    let outside_file = outside.path().join("other-bot.txt");
    std::fs::write(&outside_file, "other_marker").unwrap();
    // The box is widened to the node's folder: what is denied in it stays closed.
    let mut s = settings(&dir, &[]);
    s.sandbox = SandboxSetting::Boxed {
        read: vec![botmesh_tests::standin_dir().into(), private.root.clone()],
        write: vec![],
    };
    let options = AcpOptions {
        sandbox_deny: private.deny(),
        ..AcpOptions::default()
    };
    let agent = start(s.clone(), options.clone()).await;
    let cwd = dir.path().display().to_string();
    let spec = json!({
        "read": [private.at("peers.toml"), private.at("ada.key"), private.at("data/Ada/state"),
                 private.at("data"), private.at("notes.txt"), outside_file.display().to_string(),
                 "/proc/self/environ", "/etc/passwd"],
        "write": [cwd, private.root.display().to_string(), outside.path().display().to_string()],
    });
    let out: Value =
        serde_json::from_str(&prompt(&agent, "g", &format!("PROBE {spec}")).await.text).unwrap();
    agent.stop().await;
    for closed in ["peers.toml", "ada.key", "data/Ada/state", "data"] {
        let (ok, said) = probed(&out, "read", &private.at(closed));
        assert!(!ok, "{closed} was read in the box: {said}");
        assert!(said.contains("PermissionError"), "{closed}: {said}");
    }
    let (ok, _) = probed(&out, "read", &outside_file.display().to_string());
    assert!(!ok, "a folder outside the box was read");
    // (The node's /proc entries are closed by the node being non-dumpable, which this
    // test process is not: tests/tests/sandbox.rs proves it, as an unprivileged user.)
    // What the box leaves open is open: the probe itself works.
    assert_eq!(
        probed(&out, "read", &private.at("notes.txt")),
        (true, "notes_marker".into())
    );
    assert!(probed(&out, "read", "/proc/self/environ").0);
    assert!(probed(&out, "read", "/etc/passwd").0);
    assert!(
        probed(&out, "write", &dir.path().display().to_string()).0,
        "{out}"
    );
    assert!(
        !probed(&out, "write", &private.root.display().to_string()).0,
        "read-only"
    );
    assert!(!probed(&out, "write", &outside.path().display().to_string()).0);

    // The same agent unboxed gets all of it: the box is what closed it.
    s.sandbox = SandboxSetting::Off;
    let agent = start(s, options).await;
    let out: Value =
        serde_json::from_str(&prompt(&agent, "g", &format!("PROBE {spec}")).await.text).unwrap();
    agent.stop().await;
    assert_eq!(
        probed(&out, "read", &private.at("peers.toml")),
        (true, "secret_env = \"whsec_config_marker\"".into())
    );
    assert_eq!(
        probed(&out, "read", &private.at("ada.key")),
        (true, "whsk_key_marker".into())
    );
    assert!(probed(&out, "write", &outside.path().display().to_string()).0);
}

#[tokio::test]
async fn a_boxed_agent_gets_a_private_temp_dir_removed_when_it_stops() {
    let dir = Dir::new();
    let agent = start(settings(&dir, &[]), AcpOptions::default()).await;
    let out: Value = serde_json::from_str(&prompt(&agent, "g", "ENV").await.text).unwrap();
    let tmp = PathBuf::from(out["env"]["TMPDIR"].as_str().expect("TMPDIR"));
    assert!(
        tmp.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("botmesh-agent-Ada-"),
        "{tmp:?}"
    );
    assert!(tmp.is_dir());
    let spec = json!({"read": [], "write": [tmp.display().to_string(), std::env::temp_dir().display().to_string()]});
    let probe: Value =
        serde_json::from_str(&prompt(&agent, "g", &format!("PROBE {spec}")).await.text).unwrap();
    assert!(
        probed(&probe, "write", &tmp.display().to_string()).0,
        "{probe}"
    );
    assert!(
        !probed(&probe, "write", &std::env::temp_dir().display().to_string()).0,
        "the shared temp dir is not the agent's"
    );
    agent.stop().await;
    assert!(!tmp.exists(), "the temp dir outlived the agent");
}

#[tokio::test]
async fn a_launcher_that_is_not_botmesh_is_refused_naming_the_variable() {
    let dir = Dir::new();
    let options = AcpOptions {
        sandbox_launcher: Some("/bin/true".into()),
        ..AcpOptions::default()
    };
    let err = AcpAgent::start(settings(&dir, &[]), "Ada", options)
        .await
        .expect_err("not a launcher");
    let text = err.to_string();
    assert!(
        matches!(err, AcpError::Sandbox(_))
            && text.contains("/bin/true")
            && text.contains("BOTMESH_SANDBOX_LAUNCHER"),
        "{text}"
    );
    assert!(dir.log().is_empty(), "the agent was started anyway");
}

#[tokio::test]
async fn a_huge_reply_and_title_are_cut_at_their_bounds_and_counted() {
    let dir = Dir::new();
    let mut s = settings(&dir, &[]);
    s.max_reply_chars = 1000;
    s.max_title_chars = 50;
    let metrics = Arc::new(botmesh::telemetry::metrics::Metrics::new());
    let options = AcpOptions {
        metrics: Some(metrics.clone()),
        ..AcpOptions::default()
    };
    let agent = start(s, options).await;
    let (tx, mut rx) = mpsc::channel(16);
    // 4 MiB of reply and of title: neither is kept whole.
    let out = tokio::time::timeout(WAIT, agent.prompt("g", "HUGE 4194304", Some(tx)))
        .await
        .expect("in time")
        .expect("turn");
    agent.stop().await;
    assert_eq!(
        out.text,
        format!(
            "{}\n\n[cut: the answer was longer than 1000 characters]",
            "x".repeat(1000)
        )
    );
    let Some(AcpProgress::ToolCall { title, .. }) = rx.recv().await else {
        panic!("no progress")
    };
    assert_eq!(title, format!("{}…", "T".repeat(49)));
    let text = metrics.render();
    for what in ["reply", "title"] {
        let series = format!("botmesh_agent_output_cut_total{{bot=\"Ada\",outcome=\"{what}\"}}");
        assert_eq!(botmesh_tests::metric(&text, &series), 1.0, "{text}");
    }
}
