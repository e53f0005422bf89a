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

/// What the scripted model says once its `ask` came back, before the tool's output.
const ASKED: &str = "Ada answered:";

/// The names of the `mesh` server's tools as Codex offers them to the model: in a
/// namespace named after the server (`mcp__mesh`), each called
/// `<namespace>__<tool>` by the model.
fn mesh_tools(s: &Seen) -> Vec<String> {
    let tools = s.body["tools"].as_array().cloned().unwrap_or_default();
    tools
        .iter()
        .filter(|t| t["name"].as_str().is_some_and(|n| n.contains("mesh")))
        .flat_map(|ns| {
            let prefix = ns["name"].as_str().unwrap_or_default().to_string();
            let inner = ns["tools"].as_array().cloned().unwrap_or_default();
            inner
                .into_iter()
                .filter_map(move |t| t["name"].as_str().map(|n| format!("{prefix}__{n}")))
        })
        .collect()
}

/// The `mesh` server's `ask` tool as the model calls it.
fn mesh_ask(s: &Seen) -> Option<String> {
    mesh_tools(s).into_iter().find(|t| t.ends_with("__ask"))
}

/// The scripted model: asked to "write the proof", it calls the shell to write
/// proof.txt, then answers [`AFTER_RUN`] once the call's output came back; asked to
/// "ask Ada", it calls the `mesh` server's `ask` and answers [`ASKED`] with the tool's
/// output; anything else gets [`HELLO`]. Only Responses requests are expected.
async fn model() -> FakeLlm {
    FakeLlm::start(|s| {
        if s.api != Api::Responses {
            return Script::Status(404);
        }
        // The Responses API sends the whole history: earlier turns' tool results too.
        let results = s.tool_results();
        let asked = last_user(s).contains("ask Ada");
        if asked {
            if let Some((_, output)) = results.iter().find(|(id, _)| id.starts_with("call_ask_")) {
                return Script::reply(format!("{ASKED} {output}"));
            }
            if let Some(name) = mesh_ask(s) {
                let n = s.body.to_string().len();
                let args = json!({"colleague": "Ada", "question": "is the parser fix right?", "timeout_secs": 20});
                return Script::tool_call(&format!("call_ask_{n}"), &name, args);
            }
        }
        if !results.is_empty() {
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
        .filter(|e| {
            // Chat messages only: a status message a slow turn posts (a loaded machine)
            // is no reply (tests/tests/status_messages.rs tests those).
            e.author.kind == AuthorKind::Bot
                && e.author.name == "Codex"
                && e.kind == botmesh::wire::envelope::Kind::Message
        })
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
         allow = [\"read\", \"search\", \"think\", \"other\"], ask = [\"execute\", \"edit\"], ask_timeout_secs = 25 }}",
        codex_acp(),
        work.display().to_string(),
        home.display().to_string(),
        home.display().to_string(),
    );
    let spec = MeshSpec::mentions_only(&["Ada", "Codex"])
        .mesh(&format!(
            "mcp_command = {:?}",
            botmesh_tests::botmesh_bin().display().to_string()
        ))
        .bot("Codex", &agent);
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
        question.starts_with("Codex wants to run `")
            && question.contains("proof.txt")
            && question.ends_with("` — /allow or /deny"),
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

    // The group as tools: the model is offered the `mesh` server's tools and asks Ada
    // mid-turn (Codex asks "Approve MCP tool call", kind `other`, before each MCP call:
    // allowed above); the question and Ada's answer are messages everyone sees, and the
    // answer comes back to the model as the tool's output.
    let offered = llm.requests().last().map(mesh_tools).unwrap_or_default();
    assert_eq!(
        offered,
        ["ask", "members", "post", "read_group", "wait_for_message"]
            .map(|t| format!("mcp__mesh__{t}")),
        "the model is offered the mesh tools"
    );
    mesh.post_human(codex, "alice", "@Codex ask Ada about the fix")
        .await;
    let replies = codex_replies(&mesh, &llm, ada, 5).await;
    assert_eq!(replies[3].text, "@Ada is the parser fix right?");
    let t = mesh.transcript(ada).await;
    let answer = t
        .iter()
        .find(|e| e.author.name == "Ada" && e.reply_to == Some(replies[3].id))
        .unwrap_or_else(|| panic!("Ada answered the question: {t:#?}"));
    assert!(
        replies[4].text.starts_with(ASKED) && replies[4].text.contains(&answer.id.to_string()),
        "the model got Ada's answer as the tool's output: {}",
        replies[4].text
    );
    mesh.shutdown().await;
}
