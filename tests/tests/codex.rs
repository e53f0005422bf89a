//! A real coding agent as a bot's reply engine: `@zed-industries/codex-acp` (npm, the
//! version scripts/test.sh pins and installs into .npm-test/, found through
//! `BOTMESH_TEST_CODEX_ACP`), hosted over ACP by a real node, its model the scripted
//! server of tests/src/fake_llm.rs speaking OpenAI's Responses API on 127.0.0.1.
//! Codex is configured offline as docs/agents.md says (`CODEX_HOME` with its
//! config.toml): no update check, no analytics, one model provider on loopback.

use std::path::{Path, PathBuf};
use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_llm::{Api, FakeLlm, Script, Seen};
use botmesh_tests::{MeshSpec, TestMesh};
use serde_json::json;

/// The longest any wait here lasts (codex-acp starts in well under a second).
const WAIT: Duration = Duration::from_secs(30);

/// What the scripted model says to a plain question.
const HELLO: &str = "Hello from the scripted model: the parser tests fail on empty input.";
/// What it says once the command it asked for has run.
const AFTER_RUN: &str = "I ran it: proof.txt is written.";

/// The codex-acp launcher scripts/test.sh installed.
fn codex_acp() -> String {
    std::env::var("BOTMESH_TEST_CODEX_ACP").unwrap_or_else(|_| {
        panic!(
            "BOTMESH_TEST_CODEX_ACP is not set: run scripts/test.sh, which installs \
             @zed-industries/codex-acp (npm) into .npm-test/ and exports it"
        )
    })
}

/// The last user message's text of a request (the agent's prompt, for Codex the
/// last `input_text` of a user `message` item).
fn last_user(s: &Seen) -> String {
    s.messages
        .iter()
        .rev()
        .find(|(role, _)| role == "user")
        .map(|(_, t)| t.clone())
        .unwrap_or_default()
}

/// The shell tool Codex offers and the arguments that run `command` with it.
fn shell_call(s: &Seen, command: &str) -> Option<(String, serde_json::Value)> {
    let tools = s.tools();
    let has = |n: &str| tools.iter().any(|t| t == n);
    if has("shell_command") {
        Some(("shell_command".into(), json!({ "command": command })))
    } else if has("exec_command") {
        Some(("exec_command".into(), json!({ "cmd": command })))
    } else if has("shell") {
        Some((
            "shell".into(),
            json!({ "command": ["bash", "-lc", command] }),
        ))
    } else {
        None
    }
}

/// The scripted model: asked to "write the proof", it calls the shell to write
/// proof.txt, then answers [`AFTER_RUN`] once the call's output came back; anything
/// else gets [`HELLO`]. Only Responses requests are expected.
async fn model() -> FakeLlm {
    FakeLlm::start(|s| {
        if s.api != Api::Responses {
            return Script::Status(404);
        }
        if !s.tool_results().is_empty() {
            return Script::reply(AFTER_RUN);
        }
        if last_user(s).contains("write the proof") {
            if let Some((name, args)) = shell_call(s, "echo codex-ran > proof.txt") {
                let n = s.body.to_string().len();
                return Script::ToolCalls {
                    text: String::new(),
                    calls: vec![(format!("call_proof_{n}"), name, args.to_string())],
                };
            }
        }
        Script::reply(HELLO)
    })
    .await
}

/// `CODEX_HOME` for an offline codex talking to `llm` (docs/agents.md).
fn codex_home(dir: &Path, llm: &FakeLlm) -> PathBuf {
    let home = dir.join("codex-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"model = "gpt-5.4-mini"
model_provider = "standin"
approval_policy = "untrusted"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.standin]
name = "standin"
base_url = "{}"
wire_api = "responses"
env_key = "STANDIN_API_KEY"
requires_openai_auth = false
supports_websockets = false
request_max_retries = 0
stream_max_retries = 0
"#,
            llm.base_url
        ),
    )
    .unwrap();
    home
}

fn codex_msgs(t: &[Envelope]) -> Vec<&Envelope> {
    t.iter()
        .filter(|e| e.author.kind == AuthorKind::Bot && e.author.name == "Codex")
        .collect()
}

/// Waits (bounded) until Codex has posted `n` messages, seen from node `i`.
async fn codex_replies(mesh: &TestMesh, llm: &FakeLlm, i: usize, n: usize) -> Vec<Envelope> {
    let t = mesh
        .wait_transcript(i, WAIT, |t| codex_msgs(t).len() >= n)
        .await;
    let msgs: Vec<Envelope> = codex_msgs(&t).into_iter().cloned().collect();
    assert!(
        msgs.len() >= n,
        "Codex posted {} of {n}: {t:#?}\nthe model saw: {:#?}",
        msgs.len(),
        llm.requests()
            .iter()
            .map(|s| (s.tools(), s.messages.last().cloned()))
            .collect::<Vec<_>>()
    );
    msgs
}

#[tokio::test]
async fn codex_over_acp_answers_with_the_scripted_models_text_and_asks_before_running() {
    botmesh_tests::init_logs();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let work = dir.join("repo");
    std::fs::create_dir_all(&work).unwrap();
    let llm = model().await;
    let home = codex_home(&dir, &llm);
    let agent = format!(
        "agent = {{ acp = [{:?}], cwd = {:?}, env = {{ CODEX_HOME = {:?}, STANDIN_API_KEY = \"x\" }}, sandbox = {{ write = [{:?}] }}, \
         allow = [\"read\", \"search\", \"think\"], ask = [\"execute\", \"edit\"], ask_timeout_secs = 25 }}",
        codex_acp(),
        work.display().to_string(),
        home.display().to_string(),
        home.display().to_string(),
    );
    let spec = MeshSpec::mentions_only(&["Ada", "Codex"]).bot("Codex", &agent);
    let mesh = TestMesh::start(spec).await;
    let codex = mesh.index("Codex");
    let ada = mesh.index("Ada");

    // A question: the reply posted in the group is the model's text, through Codex.
    let trigger = mesh
        .post_human(codex, "alice", "@Codex why is the build red?")
        .await;
    let replies = codex_replies(&mesh, &llm, ada, 1).await;
    assert_eq!(replies[0].text, HELLO);
    assert_eq!(replies[0].reply_to.map(|r| r.to_string()), Some(trigger));
    let asked = llm.requests();
    assert!(!asked.is_empty());
    assert!(
        asked.iter().all(|s| s.api == Api::Responses && s.stream),
        "Codex streams from the Responses API"
    );
    assert!(
        last_user(&asked[0]).contains("why is the build red?"),
        "the prompt reached the model: {:?}",
        asked[0].messages
    );

    // A command: Codex asks before running it (approval_policy "untrusted"), the bot
    // puts the question to the chat, a person allows it, the command runs, and the
    // model's answer after it is the reply.
    mesh.post_human(codex, "alice", "@Codex write the proof")
        .await;
    let replies = codex_replies(&mesh, &llm, ada, 2).await;
    let question = &replies[1].text;
    assert!(
        question.starts_with("Codex wants to run: ") && question.ends_with(" — /allow or /deny"),
        "{question}"
    );
    assert!(
        !work.join("proof.txt").exists(),
        "nothing ran before the answer"
    );
    // The person who asked answers (anyone else's /allow is ordinary text).
    mesh.post_human(ada, "alice", "/allow").await;
    let replies = codex_replies(&mesh, &llm, codex, 3).await;
    assert_eq!(replies[2].text, AFTER_RUN);
    assert_eq!(
        std::fs::read_to_string(work.join("proof.txt")).unwrap(),
        "codex-ran\n",
        "the allowed command ran in the bot's cwd"
    );
    let results: Vec<(String, String)> = llm
        .requests()
        .iter()
        .flat_map(|s| s.tool_results())
        .collect();
    assert!(
        results.iter().any(|(id, _)| id.starts_with("call_proof_")),
        "the command's output went back to the model: {results:?}"
    );
    mesh.shutdown().await;
}
