//! A bot whose replies come from a coding agent hosted over ACP (`[[bots]] agent =
//! { acp = … }`, docs/agents.md), in a real mesh: the agent is the scripted stand-in
//! tests/py/acp_agent.py (official Python ACP SDK, from the test venv in
//! `BOTMESH_TEST_PYTHON`); what each prompt makes it do is listed at the top of it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh::wire::signing::HmacSecret;
use botmesh_tests::{botmesh_bin, fetch_json, wait_for, MeshSpec, ProcessMesh, TestMesh};

/// The longest any wait here lasts.
const WAIT: Duration = Duration::from_secs(20);

use botmesh_tests::acp_standin::{agent_table as agent_line, log, logged as wait_log};
use botmesh_tests::test_python as python;

/// A 2-bot mesh (mentions only): Ada on the built-in model, Coder on the stand-in.
async fn mesh(dir: &Path, extra: &str) -> TestMesh {
    let spec = MeshSpec::mentions_only(&["Ada", "Coder"]).bot("Coder", &agent_line(dir, extra));
    TestMesh::start(spec).await
}

/// Coder's messages in node `i`'s transcript.
fn coder_msgs(t: &[Envelope]) -> Vec<&Envelope> {
    // Its chat messages: a status message a slow turn posts (a loaded machine) is no
    // reply (tests/tests/status_messages.rs).
    t.iter()
        .filter(|e| {
            e.author.kind == AuthorKind::Bot
                && e.author.name == "Coder"
                && e.kind == botmesh::wire::envelope::Kind::Message
        })
        .collect()
}

/// Waits (bounded) until Coder has posted `n` messages, seen from node `i`.
async fn coder_replies(mesh: &TestMesh, i: usize, n: usize) -> Vec<Envelope> {
    let t = mesh
        .wait_transcript(i, WAIT, |t| coder_msgs(t).len() >= n)
        .await;
    let msgs: Vec<Envelope> = coder_msgs(&t).into_iter().cloned().collect();
    assert!(
        msgs.len() >= n,
        "Coder posted {} of {n}: {t:#?}",
        msgs.len()
    );
    msgs
}

/// Waits (bounded) until node `coder` counted one `silent/{reason}` decision, then
/// checks Coder posted no answer, only (settled for `quiet`) the one line saying how
/// the turn ended, `line`, as a reply to `trigger` that tells the agent `told`.
async fn silent_once(
    mesh: &TestMesh,
    coder: usize,
    reason: &str,
    quiet: Duration,
    trigger: &str,
    (line, told): (&str, &str),
) {
    let n = wait_for(
        WAIT,
        Duration::from_millis(50),
        || mesh.decisions(coder, "silent", reason),
        |n| *n >= 1.0,
    )
    .await;
    assert_eq!(n, 1.0, "silent/{reason}");
    coder_replies(mesh, coder, 1).await;
    let t = mesh.settle(coder, quiet).await;
    let said = coder_msgs(&t);
    assert_eq!(said.len(), 1, "one line, once: {t:#?}");
    assert_turn_end(said[0], trigger, line, told);
}

/// `env` is Coder's line saying how its turn on `trigger` ended: `line`, telling the
/// agent `told`, at the depth limit (3 in these meshes) so no bot answers it.
fn assert_turn_end(env: &Envelope, trigger: &str, line: &str, told: &str) {
    assert_eq!(env.text, line, "{env:#?}");
    assert_eq!(env.turn_end.as_deref(), Some(told), "{env:#?}");
    assert_eq!(
        env.reply_to.map(|r| r.to_string()).as_deref(),
        Some(trigger)
    );
    assert!(env.depth >= 3, "{env:#?}");
}

/// Waits (bounded) until Coder posted a message with `text`, seen from node `i` (a
/// reply to `to`, when given).
async fn coder_said(mesh: &TestMesh, i: usize, text: &str, to: Option<&str>) -> Envelope {
    let said = |e: &&Envelope| {
        e.text == text
            && to.is_none_or(|to| e.reply_to.map(|r| r.to_string()).as_deref() == Some(to))
    };
    let t = mesh
        .wait_transcript(i, WAIT, |t| coder_msgs(t).iter().any(said))
        .await;
    coder_msgs(&t)
        .into_iter()
        .find(|e| said(e))
        .cloned()
        .unwrap_or_else(|| panic!("Coder never said {text:?} to {to:?}: {t:#?}"))
}

#[tokio::test]
async fn a_mentioned_agent_answers_with_what_was_said_since_its_last_turn() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mesh = mesh(&dir, "").await;
    let coder = mesh.index("Coder");
    let ada = mesh.index("Ada");

    // The agent's chunks, joined, are the reply, seen by the colleague too.
    let trigger = mesh.post_human(coder, "alice", "@Coder CHUNKS").await;
    let first = coder_replies(&mesh, ada, 1).await;
    assert_eq!(first[0].text, "one two three");
    assert_eq!(first[0].reply_to.map(|r| r.to_string()), Some(trigger));

    // What people and the colleague said since, then the trigger last.
    mesh.post_human(coder, "alice", "the build is red on main")
        .await;
    mesh.post_human(ada, "Ada", "it fails in the parser tests")
        .await;
    mesh.wait_transcript(coder, WAIT, |t| {
        t.iter().any(|e| e.text == "it fails in the parser tests")
    })
    .await;
    // A person's command and the answer to it are not in the prompt.
    let why = mesh.post_human(coder, "alice", "/why @Ada").await;
    mesh.wait_transcript(coder, WAIT, |t| {
        t.iter()
            .any(|e| e.reply_to.map(|r| r.to_string()).as_deref() == Some(why.as_str()))
    })
    .await;
    mesh.post_human(coder, "bob", "@Coder can you look").await;
    let replies = coder_replies(&mesh, coder, 2).await;
    let echo = &replies[1].text;
    let prompt = echo
        .strip_prefix("echo: ")
        .unwrap_or_else(|| panic!("{echo}"));
    let lines: Vec<&str> = prompt.lines().collect();
    assert_eq!(
        lines,
        [
            "alice: the build is red on main",
            "Ada (bot): it fails in the parser tests",
            "bob: @Coder can you look",
        ],
        "{echo}"
    );
    // Its own reply and what came before its last turn are not in the prompt; its
    // session was opened on the first turn, so no context came with the second.
    assert!(!prompt.contains("one two three") && !prompt.contains("CHUNKS"));
    let sessions = log(&dir)
        .iter()
        .filter(|l| l.starts_with("new_session"))
        .count();
    assert_eq!(sessions, 1, "{:?}", log(&dir));
    // Shutdown stops the agent.
    let started = wait_log(&dir, "started ").await;
    let proc_dir = PathBuf::from(format!("/proc/{}", started.trim_start_matches("started ")));
    assert!(proc_dir.exists(), "{started}");
    mesh.shutdown().await;
    // Stopped by the node (its stdin closed), not only killed when the node dropped.
    assert!(
        log(&dir).iter().any(|l| l == "stdin closed"),
        "{:?}",
        log(&dir)
    );
    let gone = wait_for(
        WAIT,
        Duration::from_millis(50),
        || async { !proc_dir.exists() },
        |gone| *gone,
    )
    .await;
    assert!(gone, "the agent {started} outlived the node");
}

#[tokio::test]
async fn a_new_session_gets_the_recent_transcript_first_and_a_refusal_posts_what_came() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mesh = mesh(&dir, "").await;
    let coder = mesh.index("Coder");
    mesh.post_human(coder, "alice", "we ship on friday").await;
    mesh.post_human(coder, "bob", "@Coder SESSION").await;
    let first = coder_replies(&mesh, coder, 1).await;
    let seen: serde_json::Value = serde_json::from_str(&first[0].text).unwrap();
    let blocks: Vec<&str> = seen["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap())
        .collect();
    assert_eq!(blocks.len(), 2, "{seen}");
    assert!(
        blocks[0].contains("you are Coder") && blocks[0].contains("alice: we ship on friday"),
        "{seen}"
    );
    assert_eq!(blocks[1], "alice: we ship on friday\nbob: @Coder SESSION");
    assert_eq!(seen["cwd"], dir.display().to_string());

    // A refusal posts the text that came before it.
    mesh.post_human(coder, "bob", "@Coder REFUSE").await;
    let replies = coder_replies(&mesh, coder, 2).await;
    assert_eq!(replies[1].text, "I started, but");
    mesh.shutdown().await;
}

#[tokio::test]
async fn stop_while_the_agent_works_cancels_it_says_so_once_and_the_next_prompt_knows() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mesh = mesh(&dir, "").await;
    let coder = mesh.index("Coder");
    let ada = mesh.index("Ada");
    let slow = mesh.post_human(coder, "alice", "@Coder SLOW").await;
    wait_log(&dir, "prompt ").await;
    mesh.post_human(coder, "alice", "/stop").await;
    let cancel = wait_log(&dir, "cancel ").await;
    assert!(cancel.starts_with("cancel sess-"), "{cancel}");
    // The stand-in would say "working" then "done slowly": none of it reaches the
    // chat, only the one line saying who stopped it.
    silent_once(
        &mesh,
        coder,
        "stopped",
        Duration::from_millis(600),
        &slow,
        ("stopped by alice", "Your last turn was stopped by alice."),
    )
    .await;
    // The colleague sees the line and leaves it alone.
    coder_said(&mesh, ada, "stopped by alice", Some(&slow)).await;
    // The next prompt starts after the stopped request, and begins with how it ended.
    mesh.post_human(coder, "alice", "@Coder next").await;
    let replies = coder_replies(&mesh, coder, 2).await;
    assert_eq!(
        replies[1].text,
        "echo: Your last turn was stopped by alice.\nalice: @Coder next"
    );
    let t = mesh.settle(ada, Duration::from_millis(300)).await;
    assert!(
        !t.iter().any(|e| e.author.name == "Ada"),
        "the colleague answered a line: {t:#?}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_auto_rejected_tool_is_said_named_by_why_and_told_to_the_agent_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    // `fetch` is neither allowed nor asked about: rejected without asking.
    let mut mesh = mesh(&dir, "").await;
    let coder = mesh.index("Coder");
    let fetch = mesh
        .post_human(coder, "alice", "@Coder TOOL fetch NOTEXT")
        .await;
    wait_log(&dir, "permission fetch nope").await;
    // It ends its turn without text, as opencode does: the chat says why.
    let told = "Your request to fetch https://example.com/page was rejected: not allowed here.";
    silent_once(
        &mesh,
        coder,
        "agent_silent",
        Duration::from_millis(300),
        &fetch,
        (
            "couldn't fetch https://example.com/page: not allowed here",
            told,
        ),
    )
    .await;
    // /why names the rejected call.
    mesh.post_human(coder, "alice", "/why @Coder").await;
    let why = coder_replies(&mesh, coder, 2).await;
    assert!(
        why[1]
            .text
            .contains("tool (rejected: fetch https://example.com/page: not allowed here)"),
        "{}",
        why[1].text
    );
    // The line saying how the turn ended is no answer of it.
    assert!(why[1].text.contains("- spoke: no"), "{}", why[1].text);
    // The end of the turn is in the transcript: a restarted node still tells the
    // (new) agent, and does not ask for the fetch again.
    mesh.stop(coder).await;
    mesh.restart(coder).await;
    mesh.post_human(coder, "alice", "@Coder next").await;
    let replies = coder_replies(&mesh, coder, 3).await;
    assert_eq!(replies[2].text, format!("echo: {told}\nalice: @Coder next"));
    mesh.shutdown().await;
}

#[tokio::test]
async fn questions_say_what_each_kind_would_do_reply_to_the_request_and_a_denial_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mesh = mesh(
        &dir,
        ", ask = [\"edit\", \"execute\", \"fetch\"], ask_timeout_secs = 20",
    )
    .await;
    let coder = mesh.index("Coder");
    for (kind, asks, answer) in [
        ("execute", "run `cargo test`", "/allow"),
        ("fetch", "fetch https://example.com/page", "/allow"),
        ("edit", "edit notes.txt", "/deny"),
    ] {
        let request = mesh
            .post_human(coder, "alice", &format!("@Coder TOOL {kind}"))
            .await;
        // The question replies to the request it belongs to.
        coder_said(
            &mesh,
            coder,
            &format!("Coder wants to {asks} — /allow or /deny"),
            Some(&request),
        )
        .await;
        mesh.post_human(coder, "alice", answer).await;
        let picked = if answer == "/allow" {
            "proceed-once"
        } else {
            "nope"
        };
        wait_log(&dir, &format!("permission {kind} {picked}")).await;
        coder_said(
            &mesh,
            coder,
            &format!("permission: {picked}"),
            Some(&request),
        )
        .await;
        if answer == "/deny" {
            let line = coder_said(
                &mesh,
                coder,
                "denied by alice: edit notes.txt",
                Some(&request),
            )
            .await;
            assert_turn_end(
                &line,
                &request,
                "denied by alice: edit notes.txt",
                "Your request to edit notes.txt was denied by alice.",
            );
        }
    }
    // An allowed call needs no line: only the denied one has one.
    let t = mesh.settle(coder, Duration::from_millis(300)).await;
    let ends: Vec<&str> = coder_msgs(&t)
        .iter()
        .filter(|e| e.turn_end.is_some())
        .map(|e| e.text.as_str())
        .collect();
    assert_eq!(ends, ["denied by alice: edit notes.txt"], "{t:#?}");
    mesh.post_human(coder, "alice", "@Coder next").await;
    let echo = coder_said(
        &mesh,
        coder,
        "echo: Your request to edit notes.txt was denied by alice.\nalice: @Coder next",
        None,
    )
    .await;
    assert!(echo.turn_end.is_none());
    mesh.shutdown().await;
}

#[tokio::test]
async fn shutting_down_while_the_agent_works_cancels_its_turn_before_stopping_it() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mut mesh = mesh(&dir, "").await;
    let coder = mesh.index("Coder");
    mesh.post_human(coder, "alice", "@Coder SLOW").await;
    wait_log(&dir, "prompt ").await;
    mesh.stop(coder).await;
    // The agent heard session/cancel before its stdin closed (it logs both, in order).
    let lines = log(&dir);
    let cancel = lines.iter().position(|l| l.starts_with("cancel sess-"));
    let closed = lines.iter().position(|l| l == "stdin closed");
    assert!(
        matches!((cancel, closed), (Some(c), Some(e)) if c < e),
        "{lines:?}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_message_to_the_busy_agent_waits_for_its_next_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mesh = mesh(&dir, "").await;
    let coder = mesh.index("Coder");
    mesh.post_human(coder, "alice", "@Coder AWAITGO").await;
    wait_log(&dir, "awaiting ").await;
    // One turn per group: this one is not a turn of its own.
    mesh.post_human(coder, "bob", "@Coder also look at the docs")
        .await;
    let busy = wait_for(
        WAIT,
        Duration::from_millis(50),
        || mesh.decisions(coder, "silent", "agent_busy"),
        |n| *n >= 1.0,
    )
    .await;
    assert_eq!(busy, 1.0);
    std::fs::write(dir.join("go"), b"").unwrap();
    let replies = coder_replies(&mesh, coder, 1).await;
    assert_eq!(replies[0].text, "built after the signal");
    // It was said after the last turn's prompt, so the next prompt has it.
    mesh.post_human(coder, "alice", "@Coder next").await;
    let replies = coder_replies(&mesh, coder, 2).await;
    assert_eq!(
        replies[1].text,
        "echo: bob: @Coder also look at the docs\nalice: @Coder next"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_turn_past_its_timeout_is_agent_failed_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mesh = mesh(&dir, ", turn_timeout_secs = 1").await;
    let coder = mesh.index("Coder");
    let slow = mesh.post_human(coder, "alice", "@Coder SLOW").await;
    silent_once(
        &mesh,
        coder,
        "agent_failed",
        Duration::from_millis(600),
        &slow,
        (
            "failed: took longer than 1 s",
            "Your last turn failed: took longer than 1 s.",
        ),
    )
    .await;
    wait_log(&dir, "cancel ").await;
    // /why says so.
    mesh.post_human(coder, "alice", "/why @Coder").await;
    let why = coder_replies(&mesh, coder, 2).await;
    assert!(why[1].text.contains("agent_failed"), "{}", why[1].text);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_broken_agent_command_stops_the_node_at_start_naming_it() {
    let mesh = ProcessMesh::configure(
        &["Coder"],
        "",
        "agent = { acp = [\"no-such-agent-7f3e\", \"--acp\"], cwd = \"/\" }",
    );
    let mut child = std::process::Command::new(botmesh_bin())
        .args(["run", "--bot", "Coder", "--config"])
        .arg(&mesh.config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: the node must exit by itself well before WAIT.
    let deadline = std::time::Instant::now() + WAIT;
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the node started with a broken agent command");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!exit.success(), "{stderr}");
    assert!(stderr.contains("no-such-agent-7f3e"), "{stderr}");
}

#[tokio::test]
async fn the_agent_gets_env_from_but_not_the_mesh_secret_or_llm_key() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mut mesh = ProcessMesh::configure(
        &["Coder"],
        "secret_env = \"BOTMESH_TEST_MESH_SECRET\"\n[llm]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key_env = \"BOTMESH_TEST_LLM_KEY\"",
        &agent_line(&dir, ", env_from = { CODER_TOKEN = \"BOTMESH_TEST_CODER_TOKEN\" }"),
    );
    let secret = HmacSecret::generate().to_whsec();
    mesh.spawn_with(
        0,
        &[
            ("BOTMESH_TEST_MESH_SECRET", secret.as_str()),
            ("BOTMESH_TEST_LLM_KEY", "sk-llm-key-do-not-leak"),
            ("BOTMESH_TEST_CODER_TOKEN", "tok-for-the-agent"),
        ],
    )
    .await;
    mesh.post(0, "@Coder ENV").await.expect("posted");
    let transcript = wait_for(
        WAIT,
        Duration::from_millis(50),
        || {
            fetch_json(
                mesh.http
                    .get(format!("{}/v1/transcript?limit=50", mesh.apis[0])),
            )
        },
        |v: &serde_json::Value| v.to_string().contains("\\\"env\\\""),
    )
    .await;
    let reply = transcript["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            m["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("{\"env\""))
        })
        .unwrap_or_else(|| panic!("no ENV reply: {transcript}\n{}", mesh.log(0)));
    let seen: serde_json::Value = serde_json::from_str(reply["text"].as_str().unwrap()).unwrap();
    let env = seen["env"].as_object().unwrap();
    assert_eq!(env["CODER_TOKEN"], "tok-for-the-agent", "{env:?}");
    assert_eq!(
        env["ACP_STANDIN_LOG"],
        dir.join("agent.log").display().to_string()
    );
    let text = seen.to_string();
    assert!(!text.contains(&secret) && !text.contains("sk-llm-key-do-not-leak"));
    assert!(!env.contains_key("BOTMESH_TEST_CODER_TOKEN"), "{env:?}");
    // Stopped with the node, the agent is not reported dead.
    assert!(mesh.terminate(0).success(), "{}", mesh.log(0));
    let log = mesh.log(0);
    assert!(
        log.contains("stopping the ACP agent")
            && log.contains("the ACP connection ended after its input was closed")
            && !log.contains("is dead")
            && !log.contains("died"),
        "{log}"
    );
}

#[tokio::test]
async fn an_asked_tool_call_is_put_to_the_chat_and_a_person_allows_or_denies_it() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mesh = mesh(&dir, ", ask = [\"execute\"], ask_timeout_secs = 20").await;
    let coder = mesh.index("Coder");
    let ada = mesh.index("Ada");

    // Asked in the chat; a person's /allow (said at the colleague's node) answers it.
    mesh.post_human(coder, "alice", "@Coder TOOL execute").await;
    let asked = coder_replies(&mesh, ada, 1).await;
    assert_eq!(
        asked[0].text,
        "Coder wants to run `cargo test` — /allow or /deny"
    );
    mesh.post_human(ada, "alice", "/allow").await;
    let replies = coder_replies(&mesh, coder, 2).await;
    assert_eq!(replies[1].text, "permission: proceed-once");
    wait_log(&dir, "permission execute proceed-once").await;

    // /deny rejects it.
    mesh.post_human(coder, "bob", "@Coder TOOL execute").await;
    coder_replies(&mesh, coder, 3).await;
    mesh.post_human(coder, "bob", "/deny @Coder").await;
    let replies = coder_replies(&mesh, coder, 4).await;
    assert_eq!(replies[3].text, "permission: nope");
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_question_is_answered_only_by_the_requester_or_an_operator_and_only_after_it_was_posted()
{
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let spec = MeshSpec::mentions_only(&["Ada", "Coder"])
        .mesh("operators = [\"local:alice\"]")
        .bot(
            "Coder",
            &agent_line(&dir, ", ask = [\"execute\"], ask_timeout_secs = 20"),
        );
    let mesh = TestMesh::start(spec).await;
    let coder = mesh.index("Coder");
    mesh.post_human(coder, "mallory", "@Coder TOOL execute")
        .await;
    coder_replies(&mesh, coder, 1).await;
    // Neither the requester nor an operator: ordinary text, counted, and told who may.
    let bob = mesh.post_human(coder, "bob", "/allow").await;
    let replies = coder_replies(&mesh, coder, 2).await;
    assert_eq!(
        replies[1].text,
        "Only mallory (who asked) or an operator can answer Coder's question."
    );
    assert_eq!(replies[1].reply_to.map(|r| r.to_string()), Some(bob));
    assert_eq!(
        botmesh_tests::metric(
            &mesh.metrics(coder).await,
            "botmesh_chat_commands_total{command=\"allow\",outcome=\"not_entitled\"}"
        ),
        1.0
    );
    // An operator's answers it.
    mesh.post_human(coder, "alice", "/allow").await;
    let replies = coder_replies(&mesh, coder, 3).await;
    assert_eq!(replies[2].text, "permission: proceed-once");

    // The requester's own /deny, said before the next question existed, answers
    // nothing; said after it was posted, it does.
    mesh.post_human(coder, "mallory", "/deny").await;
    mesh.post_human(coder, "mallory", "@Coder TOOL execute")
        .await;
    coder_replies(&mesh, coder, 4).await;
    let t = mesh.settle(coder, Duration::from_millis(300)).await;
    assert_eq!(coder_msgs(&t).len(), 4, "the early /deny answered: {t:#?}");
    mesh.post_human(coder, "mallory", "/deny").await;
    let replies = coder_replies(&mesh, coder, 5).await;
    assert_eq!(replies[4].text, "permission: nope");
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_agents_tool_calls_reach_the_page_as_progress_events() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mesh = mesh(&dir, "").await;
    let coder = mesh.index("Coder");
    let mut events = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("{}/v1/events?group=demo", mesh.api(coder)))
        .send()
        .await
        .unwrap();
    let trigger = mesh.post_human(coder, "alice", "@Coder CHUNKS").await;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !seen.contains("done: cargo test") {
        let chunk = tokio::time::timeout_at(deadline, events.chunk())
            .await
            .unwrap_or_else(|_| panic!("no progress events: {seen}"))
            .unwrap()
            .expect("the stream goes on");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let progress: Vec<serde_json::Value> = seen
        .split("\n\n")
        .filter(|e| e.contains("event: progress"))
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let texts: Vec<&str> = progress
        .iter()
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        [
            "working: count to three",
            "writing…",
            "working: cargo test",
            "done: cargo test"
        ],
        "{seen}"
    );
    assert!(progress
        .iter()
        .all(|p| p["trigger"] == trigger.as_str() && p["bot"] == "Coder"));
    // A page loaded now (a reload) reads the turn's latest progress with the
    // transcript.
    let page = fetch_json(mesh.http.get(format!(
        "{}/v1/transcript?group=demo&limit=20",
        mesh.api(coder)
    )))
    .await;
    assert_eq!(
        page["progress"],
        serde_json::json!([{"group": "demo", "trigger": trigger, "bot": "Coder", "text": "done: cargo test"}]),
        "{page}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_agent_that_dies_mid_turn_is_agent_failed_and_the_next_turn_runs_on_a_restarted_one() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let mesh = mesh(&dir, "").await;
    let coder = mesh.index("Coder");
    let crash = mesh.post_human(coder, "alice", "@Coder CRASH").await;
    // "about to crash" came before it died: none of it is posted, only the line.
    silent_once(
        &mesh,
        coder,
        "agent_failed",
        Duration::from_millis(300),
        &crash,
        (
            "failed: the agent crashed",
            "Your last turn failed: the agent crashed.",
        ),
    )
    .await;
    // The restarted agent opens a new session, with the transcript first.
    mesh.post_human(coder, "alice", "@Coder SESSION").await;
    let replies = coder_replies(&mesh, coder, 2).await;
    let seen: serde_json::Value = serde_json::from_str(&replies[1].text).unwrap();
    let blocks = seen["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "{seen}");
    assert!(
        blocks[0].as_str().unwrap().contains("alice: @Coder CRASH"),
        "{seen}"
    );
    let started = log(&dir)
        .iter()
        .filter(|l| l.starts_with("started"))
        .count();
    assert_eq!(started, 2, "{:?}", log(&dir));
    mesh.shutdown().await;
}

#[tokio::test]
async fn session_new_carries_the_bots_mcp_servers_as_the_official_sdk_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let env_server = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("py/mcp_env_server.py")
        .display()
        .to_string();
    // A stdio server with its env, and an HTTP one whose header comes from the node's
    // environment (headers_env, read at start): the agent connects to them itself.
    let coder = format!(
        "{}\n[[bots.mcp]]\nname = \"env\"\ncommand = [{:?}, {env_server:?}]\nenv = {{ GREETING = \"hello\" }}\n\
         [[bots.mcp]]\nname = \"web\"\nurl = \"http://127.0.0.1:9/mcp\"\nheaders_env = {{ Authorization = \"AGENTS_TEST_WEB_TOKEN\" }}\n",
        agent_line(&dir, ""),
        python(),
    );
    let mut spec = MeshSpec::mentions_only(&["Ada", "Coder"])
        .mesh(&format!(
            "mcp_command = {:?}",
            botmesh_bin().display().to_string()
        ))
        .bot("Coder", &coder);
    spec.env
        .insert("AGENTS_TEST_WEB_TOKEN".into(), "Bearer web-token-2".into());
    let mesh = TestMesh::start(spec).await;
    let coder = mesh.index("Coder");
    mesh.post_human(coder, "alice", "@Coder SESSION").await;
    let replies = coder_replies(&mesh, coder, 1).await;
    let seen: serde_json::Value = serde_json::from_str(&replies[0].text).unwrap();
    // What the Python SDK parsed session/new's mcpServers into (McpServerStdio,
    // HttpMcpServer), dumped back by alias; the node's own `mesh` server last
    // (tests/tests/group_tools.rs).
    let mut servers = seen["mcpServers"].as_array().cloned().unwrap_or_default();
    let mesh_server = servers.pop().unwrap_or_default();
    assert_eq!(mesh_server["name"], "mesh", "{seen}");
    assert_eq!(mesh_server["args"][0], "mcp", "{seen}");
    assert_eq!(
        serde_json::Value::Array(servers),
        serde_json::json!([
            {"name": "env", "command": python(), "args": [env_server],
             "env": [{"name": "GREETING", "value": "hello"}]},
            {"type": "http", "name": "web", "url": "http://127.0.0.1:9/mcp",
             "headers": [{"name": "Authorization", "value": "Bearer web-token-2"}]},
        ]),
        "{seen}"
    );
    assert_eq!(seen["cwd"], serde_json::json!(dir.display().to_string()));
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_better_claim_heard_while_the_agent_works_is_told_it_is_answered_and_cancels_nothing() {
    use botmesh::wire::envelope::Kind;
    use botmesh_tests::fake_llm::BotLlm;
    use botmesh_tests::SignedRequest;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    // Coder judges the question relevant and interjects; Ada answers mentions only,
    // so the better claim on the question is one the test sends in Ada's name.
    let llm = BotLlm::judging(false, 0.0)
        .judge("Coder", true, 0.6)
        .start()
        .await;
    let spec = MeshSpec::new(&["Ada", "Coder"])
        .llm(&llm.base_url)
        .all_bots("min_delay_ms = 50\nmax_delay_ms = 200\njitter_ms = 0")
        .bot("Ada", "participation = \"mentions\"")
        .bot("Coder", &agent_line(&dir, ""));
    let mesh = TestMesh::start(spec).await;
    let (ada, coder) = (mesh.index("Ada"), mesh.index("Coder"));
    let trigger = mesh.post_human(coder, "alice", "can someone AWAITGO").await;
    // Coder won its turn (claimed, waited, committed) and its agent is at work.
    wait_log(&dir, "awaiting ").await;
    let trigger = ulid::Ulid::from_string(&trigger).unwrap();
    let mut claim = botmesh_tests::bot_message("Ada", "", 0);
    claim.kind = Kind::Claim;
    claim.reply_to = Some(trigger);
    claim.root = Some(trigger);
    claim.relevance = Some(0.99);
    let (status, answer) = SignedRequest::new(&mesh.signers[ada], &claim, 0)
        .send(&mesh.http, &mesh.bridge(coder))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["answered"], "Coder",
        "the claim holds while the agent works: {answer}"
    );
    // The agent goes on to the end of its turn, and its reply is posted.
    std::fs::write(dir.join("go"), b"").unwrap();
    let replies = coder_replies(&mesh, coder, 1).await;
    assert_eq!(replies[0].text, "built after the signal");
    assert!(
        !log(&dir).iter().any(|l| l.starts_with("cancelled ")),
        "{:?}",
        log(&dir)
    );
    assert_eq!(
        mesh.decisions(coder, "yield_writing", "better_claim").await,
        0.0
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_agent_that_never_initializes_is_started_again_while_the_node_serves() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let line = agent_line(&dir, ", init_timeout_secs = 8").replace(
        "ACP_STANDIN_LOG = ",
        "ACP_STANDIN_NO_INIT = \"1\", ACP_STANDIN_LOG = ",
    );
    let mut mesh = ProcessMesh::configure(&["Coder"], "", &line);
    let child = std::process::Command::new(botmesh_bin())
        .args(["run", "--bot", "Coder", "--config"])
        .arg(&mesh.config)
        .env("BOTMESH_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(mesh.dir.path().join("Coder.log")).unwrap())
        .spawn()
        .unwrap();
    mesh.procs[0] = Some(child);
    // The node serves, and says why the bot is not ready.
    let health = wait_for(
        WAIT,
        Duration::from_millis(50),
        || async {
            let r = mesh
                .http
                .get(format!("{}/healthz", mesh.apis[0]))
                .send()
                .await
                .ok()?;
            Some((
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.ok()?,
            ))
        },
        |h| {
            h.as_ref()
                .is_some_and(|(_, v)| !v["agent_not_ready"].is_null())
        },
    )
    .await
    .unwrap_or_else(|| panic!("never served:\n{}", mesh.log(0)));
    assert_eq!(health.0, 503, "{}", health.1);
    let why = health.1["agent_not_ready"].as_str().unwrap().to_string();
    assert!(why.contains("init_timeout_secs"), "{why}");
    // Started again, with backoff, and the node is still there.
    let restarts = wait_for(
        WAIT,
        Duration::from_millis(100),
        || async {
            botmesh_tests::metric(
                &mesh.metrics(0).await,
                "botmesh_agent_restarts_total{bot=\"Coder\"}",
            )
        },
        |n| *n >= 1.0,
    )
    .await;
    assert!(restarts >= 1.0, "{}", mesh.log(0));
    assert!(mesh.running(0), "the node exited:\n{}", mesh.log(0));
    // It was started and reached `initialize`, which it never answered.
    wait_log(&dir, "never initializing").await;
    // Once the restarted agent waits in `initialize` too, the node is stopped: the
    // shutdown stops that agent instead of waiting out its init_timeout_secs (8 s),
    // and says so before it reports `stopped`.
    let second = wait_for(
        WAIT,
        Duration::from_millis(50),
        || async {
            log(&dir)
                .iter()
                .filter(|l| l.starts_with("never initializing"))
                .count()
        },
        |n| *n >= 2,
    )
    .await;
    assert!(second >= 2, "{:?}", log(&dir));
    assert!(mesh.terminate(0).success(), "{}", mesh.log(0));
    let node_log = mesh.log(0);
    let shutdown = node_log
        .find("shutting down")
        .unwrap_or_else(|| panic!("{node_log}"));
    let after = &node_log[shutdown..];
    let stopping = after.find("stopping the ACP agent");
    let ended = after.find("the ACP agent's process ended");
    let stopped = after.find("INFO botmesh::app::lifecycle: stopped");
    assert!(
        stopping.is_some() && stopping < ended && ended < stopped,
        "the agent in `initialize` is stopped before the node reports stopped:\n{after}"
    );
    assert!(
        !after.contains("restarting the ACP agent failed"),
        "the shutdown waited out the agent's initialize:\n{after}"
    );
}

#[tokio::test]
async fn a_permission_question_is_held_by_the_loop_brake_like_any_bot_message() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let spec = MeshSpec::mentions_only(&["Ada", "Coder"])
        .mesh("bot_messages_per_minute = 2")
        .bot(
            "Coder",
            &agent_line(&dir, ", ask = [\"execute\"], ask_timeout_secs = 60"),
        );
    let mesh = TestMesh::start(spec).await;
    let coder = mesh.index("Coder");
    let ada = mesh.index("Ada");
    // The turn starts; before the agent asks, two bot messages fill the brake.
    mesh.post_human(coder, "alice", "@Coder TOOL execute AFTERGO")
        .await;
    wait_log(&dir, "awaiting").await;
    for text in ["chatter one", "chatter two"] {
        let env = botmesh_tests::bot_message("Ada", text, 1);
        let (status, body) = botmesh_tests::SignedRequest::new(&mesh.signers[ada], &env, 0)
            .send(&mesh.http, &mesh.bridge(coder))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    std::fs::write(dir.join("go"), "").unwrap();
    // The question is not posted: the agent is rejected at once (not after 60 s).
    wait_log(&dir, "permission execute nope").await;
    let t = mesh.transcript(coder).await;
    assert!(
        !t.iter().any(|e| e.text.contains("wants to run")),
        "a question was posted past the brake: {t:#?}"
    );
    let held = botmesh_tests::metric(
        &mesh.metrics(coder).await,
        "botmesh_decisions_total{action=\"silent\",reason=\"rate_cap\"}",
    );
    assert!(held >= 1.0, "{held}");
    mesh.shutdown().await;
}
