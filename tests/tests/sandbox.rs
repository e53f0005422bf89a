//! Agents in a box, as in production: the node (the `botmesh` binary) runs as an
//! unprivileged user, and its ACP agent — the stand-in tests/py/acp_agent.py made
//! hostile (`PROBE`) — reaches for the node's `/proc` entries, its config, key and
//! data dir. Boxed (the default), it finds nothing; with `sandbox = "off"` the same
//! agent reads the files (so the test can fail), and the node's `/proc/<pid>/environ`
//! stays closed even then: the node is not dumpable.

use std::path::Path;
use std::time::Duration;

use botmesh_tests::{acp_standin_script as script, test_python as python, wait_for, ProcessMesh};

/// The stand-in agent and the venv packages it imports, copied into a folder the
/// unprivileged user can reach: the checkout and its venv may sit under a folder only
/// root can enter (/root, where pyenv also keeps the venv's interpreter), so the agent
/// runs on the system's Python, which must be of the venv's version.
struct Stage {
    /// Holds `acp_agent.py` and `site-packages/`; the user's.
    dir: tempfile::TempDir,
}

/// The modules tests/py/acp_agent.py imports from the venv: the ACP SDK and what it
/// needs (pydantic and its parts).
const STAGED_MODULES: &str =
    "acp, pydantic, pydantic_core, typing_extensions, annotated_types, typing_inspection";

impl Stage {
    fn new() -> Stage {
        let version = |python: &str| {
            let out = std::process::Command::new(python)
                .args(["-c", "import sys; print(sys.version_info[:2])"])
                .output()
                .unwrap_or_else(|e| panic!("{python}: {e}"));
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let (system, venv) = (version("/usr/bin/python3"), version(&python()));
        assert_eq!(
            system, venv,
            "the agent runs on /usr/bin/python3 with the venv's packages: the versions must match"
        );
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("site-packages");
        std::fs::create_dir_all(&site).unwrap();
        let find = format!(
            "import os, {STAGED_MODULES}; [print(os.path.dirname(m.__file__) \
             if m.__file__.endswith('__init__.py') else m.__file__) for m in ({STAGED_MODULES},)]"
        );
        let out = botmesh_tests::command::run_ok(
            std::process::Command::new(python()).args(["-c", &find]),
        );
        for path in String::from_utf8_lossy(&out.stdout).lines() {
            let ok = std::process::Command::new("cp")
                .args(["-a", path])
                .arg(&site)
                .status()
                .unwrap();
            assert!(ok.success(), "cp {path}");
        }
        std::fs::copy(script(), dir.path().join("acp_agent.py")).unwrap();
        give_to_nobody(dir.path());
        Stage { dir }
    }

    /// The folder, for the box's `read`.
    fn root(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// The stand-in's script.
    fn script(&self) -> String {
        self.dir.path().join("acp_agent.py").display().to_string()
    }

    /// Its `PYTHONPATH`.
    fn site_packages(&self) -> String {
        self.dir.path().join("site-packages").display().to_string()
    }
}
use serde_json::{json, Value};

/// The longest any wait here lasts.
const WAIT: Duration = Duration::from_secs(20);
/// The user the node runs as (`nobody` on Debian).
const NOBODY: u32 = 65534;
/// A secret only the node's environment holds.
const MARKER: &str = "whsec_only_in_the_nodes_environment";

/// Makes `path` (and all in it) the unprivileged user's.
fn give_to_nobody(path: &Path) {
    let ok = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{NOBODY}:{NOBODY}"))
        .arg(path)
        .status()
        .unwrap();
    assert!(ok.success(), "chown {path:?}");
}

/// Whether the test runs as root (only root can start the node as another user).
fn is_root() -> bool {
    let out = std::process::Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// Starts Coder as `nobody` with the stand-in (`sandbox`: the agent's sandbox key),
/// has it probe the node's files, and returns what it got, with the paths probed.
async fn probe_as_nobody(stage: &Stage, sandbox: &str) -> (Value, [String; 5]) {
    let work = tempfile::tempdir().unwrap();
    let work_dir = work.path().canonicalize().unwrap();
    let agent = format!(
        "agent = {{ acp = [\"/usr/bin/python3\", {:?}], cwd = {:?}, env = {{ ACP_STANDIN_LOG = {:?}, PYTHONPATH = {:?} }}, {sandbox} }}",
        stage.script(),
        work_dir.display().to_string(),
        work_dir.join("agent.log").display().to_string(),
        stage.site_packages(),
    );
    let mut mesh = ProcessMesh::configure(&["Coder"], "", &agent);
    let home = mesh.dir.path().canonicalize().unwrap();
    give_to_nobody(&home);
    give_to_nobody(&work_dir);
    mesh.as_user = Some(NOBODY);
    mesh.spawn_with(0, &[("BOTMESH_TEST_MARKER", MARKER)]).await;
    let paths = [
        "/proc/{ppid}/environ".to_string(),
        "/proc/{ppid}/mem".to_string(),
        mesh.config.display().to_string(),
        home.join("coder.key").display().to_string(),
        home.join("data/Coder").display().to_string(),
    ];
    let spec = json!({
        "read": paths.iter().chain(["/proc/self/environ".to_string()].iter()).collect::<Vec<_>>(),
        "write": [home.join("data/Coder").display().to_string(), work_dir.display().to_string()],
    });
    mesh.post(0, &format!("@Coder PROBE {spec}"))
        .await
        .expect("posted");
    let transcript = wait_for(
        WAIT,
        Duration::from_millis(50),
        || {
            botmesh_tests::fetch_json(
                mesh.http
                    .get(format!("{}/v1/transcript?limit=50", mesh.apis[0])),
            )
        },
        |v: &Value| {
            v["messages"]
                .as_array()
                .is_some_and(|ms| ms.iter().any(|m| m["author"]["kind"] == "bot"))
        },
    )
    .await;
    let reply = transcript["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["author"]["kind"] == "bot")
        .find_map(|m| m["text"].as_str().filter(|t| t.starts_with('{')))
        .unwrap_or_else(|| panic!("no PROBE reply: {transcript}\n{}", mesh.log(0)))
        .to_string();
    let log = mesh.log(0);
    assert!(
        log.contains("the node is not dumpable"),
        "no start-up line about prctl:\n{log}"
    );
    (serde_json::from_str(&reply).unwrap(), paths)
}

fn got(out: &Value, list: &str, path: &str) -> (bool, String) {
    let v = &out[list][path];
    let ok = v["ok"].as_bool().unwrap_or_else(|| panic!("{path}: {out}"));
    let text = v["text"].as_str().or(v["error"].as_str()).unwrap_or("");
    (ok, text.to_string())
}

#[tokio::test]
async fn as_an_unprivileged_user_a_hostile_agent_finds_nothing_of_the_node() {
    assert!(
        is_root(),
        "this test starts the node as another user: run it as root (CI does)"
    );
    // Boxed, as by default (the stand-in's script is widened in).
    let stage = Stage::new();
    let (boxed, paths) = probe_as_nobody(
        &stage,
        &format!("sandbox = {{ read = [{:?}] }}", stage.root(),),
    )
    .await;
    for path in &paths {
        let (ok, said) = got(&boxed, "read", path);
        assert!(
            !ok,
            "the boxed agent read {path}: {}",
            &said[..said.len().min(300)]
        );
        assert!(!said.contains(MARKER));
    }
    assert!(!got(&boxed, "write", &paths[4]).0, "wrote the data dir");
    // The probe works: its own environment and its cwd are open to it.
    assert!(got(&boxed, "read", "/proc/self/environ").0, "{boxed}");
    let cwd_written = boxed["write"]
        .as_object()
        .unwrap()
        .iter()
        .any(|(p, v)| !p.contains("/data/") && v["ok"] == true);
    assert!(cwd_written, "{boxed}");

    // Unboxed, the same agent reads the node's files: the box is what closed them.
    let (open, paths) = probe_as_nobody(&stage, "sandbox = \"off\"").await;
    for path in &paths[2..] {
        assert!(
            got(&open, "read", path).0,
            "{path} unreadable even unboxed: {open}"
        );
    }
    assert!(got(&open, "write", &paths[4]).0);
    // …but not the node's memory or environment: the node is not dumpable.
    for path in &paths[..2] {
        let (ok, said) = got(&open, "read", path);
        assert!(
            !ok,
            "{path} read from an unboxed agent of the same user: {}",
            &said[..said.len().min(300)]
        );
        assert!(said.contains("PermissionError"), "{path}: {said}");
    }
}

#[tokio::test]
async fn a_node_run_as_root_starts_its_agent_as_run_as_inside_the_box() {
    use botmesh::agent::acp::{AcpAgent, AcpOptions, AcpSettings};
    use botmesh::config::acp::SandboxSetting;
    assert!(is_root(), "run_as needs a node running as root (CI does)");
    botmesh_tests::use_sandbox_launcher();
    let work = tempfile::tempdir().unwrap();
    let cwd = work.path().canonicalize().unwrap();
    give_to_nobody(&cwd);
    let stage = Stage::new();
    let settings = AcpSettings {
        acp: vec!["/usr/bin/python3".into(), stage.script()],
        cwd: cwd.clone(),
        env: [("PYTHONPATH".to_string(), stage.site_packages())].into(),
        env_from: Default::default(),
        allow: vec![],
        ask: vec![],
        turn_timeout_secs: 30,
        ask_timeout_secs: 1,
        init_timeout_secs: 15,
        max_reply_chars: 20_000,
        max_title_chars: 200,
        sandbox: SandboxSetting::Boxed {
            read: vec![stage.root().into()],
            write: vec![],
        },
        run_as: Some("nobody".into()),
    };
    let agent = tokio::time::timeout(
        WAIT,
        AcpAgent::start(settings, "Ada", AcpOptions::default()),
    )
    .await
    .expect("in time")
    .expect("starts as nobody");
    let spec = json!({"read": ["/root"], "write": [cwd.display().to_string()]});
    let out = tokio::time::timeout(
        WAIT,
        agent.prompt("g", format!("PROBE {spec}").as_str(), None),
    )
    .await
    .expect("in time")
    .expect("turn");
    agent.stop().await;
    let out: Value = serde_json::from_str(&out.text).unwrap();
    assert_eq!(
        (out["uid"].clone(), out["gid"].clone()),
        (json!(NOBODY), json!(NOBODY)),
        "{out}"
    );
    assert_eq!(
        out["groups"],
        json!([NOBODY]),
        "no supplementary groups of root's"
    );
    assert!(!got(&out, "read", "/root").0, "{out}");
    assert!(got(&out, "write", &cwd.display().to_string()).0, "{out}");
}
