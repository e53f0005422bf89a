//! A bot served as an A2A agent (`[[bots]] a2a`, docs/a2a.md), end to end: real nodes
//! on 127.0.0.1, the scripted LLM, and the official `a2a-sdk` client
//! (tests/py/a2a_caller.py) fetching the card, sending, streaming, getting and
//! cancelling tasks, and refused without its token. The group sees every exchange.

use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_llm::{BotLlm, Script};
use botmesh_tests::{metric, test_python, wait_for, MeshSpec, TestMesh};
use serde_json::Value;

/// The caller's token, as the node reads it from `A2A_TEST_HERMES`.
const TOKEN: &str = "a2a-test-token-hermes";

/// A (served to the caller `hermes`) and B, answering mentions only.
fn spec(llm: &str) -> MeshSpec {
    let mut spec = MeshSpec::mentions_only(&["A", "B"])
        .llm(llm)
        .bot(
            "A",
            "role = \"release manager\"\nskills = [\"releases\", \"changelogs\"]\na2a = { serve = true, callers = { hermes = \"A2A_TEST_HERMES\" } }",
        )
        .all_bots("min_delay_ms = 50\nmax_delay_ms = 200\njitter_ms = 0");
    spec.env.insert("A2A_TEST_HERMES".into(), TOKEN.into());
    spec
}

/// Runs the SDK caller against node `i`'s API; its JSON lines.
async fn caller(mesh: &TestMesh, i: usize, token: &str, args: &[&str]) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/py/a2a_caller.py");
    let run = tokio::process::Command::new(test_python())
        .arg(script)
        .arg(mesh.api(i))
        .arg(token)
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the SDK caller finishes")
        .expect("the test venv's python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "a2a_caller {args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Messages of `name` in `t`.
fn by<'a>(t: &'a [Envelope], name: &str) -> Vec<&'a Envelope> {
    // Chat messages only: a status message a slow turn posts (a loaded machine) is no
    // reply (tests/tests/status_messages.rs tests those).
    t.iter()
        .filter(|e| e.author.name == name && e.kind == botmesh::wire::envelope::Kind::Message)
        .collect()
}

/// `botmesh_a2a_tasks_total{bot="A",direction="served",state}` on node `i`.
async fn served(mesh: &TestMesh, i: usize, state: &str) -> f64 {
    metric(
        &mesh.metrics(i).await,
        &format!("botmesh_a2a_tasks_total{{bot=\"A\",direction=\"served\",state=\"{state}\"}}"),
    )
}

#[tokio::test]
async fn the_sdk_client_reads_the_card_sends_streams_and_gets_and_the_group_sees_it_all() {
    let llm = BotLlm::judging(false, 0.0)
        .replies(|bot| format!("{bot} says: v1.4 ships Friday"))
        .start()
        .await;
    let mesh = TestMesh::start(spec(&llm.base_url)).await;

    // The card: public, a JSON-RPC interface at /a2a on 1.0, streaming, a bearer scheme.
    let card = &caller(&mesh, 0, "-", &["card"]).await[0]["card"];
    assert_eq!(card["name"], "A", "{card}");
    assert_eq!(card["description"], "A: release manager");
    let iface = &card["supportedInterfaces"][0];
    assert_eq!(iface["url"], format!("{}/a2a", mesh.api(0)));
    assert_eq!(iface["protocolBinding"], "JSONRPC");
    assert_eq!(iface["protocolVersion"], "1.0");
    assert_eq!(card["capabilities"]["streaming"], true);
    assert_eq!(card["skills"][0]["name"], "releases");
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );

    // SendMessage: the task comes back completed, the bot's reply its artifact.
    let events = caller(&mesh, 0, TOKEN, &["send", "when does v1.4 ship?"]).await;
    let task = &events[0]["event"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    assert_eq!(
        task["artifacts"][0]["parts"][0]["text"],
        "A says: v1.4 ships Friday"
    );
    let task_id = task["id"].as_str().expect("task id").to_string();
    let context = task["contextId"].as_str().expect("context id").to_string();

    // The group saw the caller's message and the answer: on A, and on colleague B.
    for i in [0, 1] {
        let t = mesh
            .wait_transcript(i, Duration::from_secs(10), |t| !by(t, "A").is_empty())
            .await;
        let asked = by(&t, "a2a:hermes");
        assert_eq!(asked.len(), 1, "node {i}: {t:?}");
        assert_eq!(asked[0].text, "@A when does v1.4 ship?");
        assert_eq!(asked[0].author.kind, AuthorKind::Human);
        assert_eq!(asked[0].depth, 0);
        let answer = by(&t, "A")[0];
        assert_eq!(answer.reply_to, Some(asked[0].id));
        assert_eq!(answer.text, "A says: v1.4 ships Friday");
        assert!(by(&t, "B").is_empty(), "B was not asked: {t:?}");
    }

    // GetTask: the same task, completed.
    let got = &caller(&mesh, 0, TOKEN, &["get", &task_id]).await[0]["task"];
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED", "{got}");
    assert_eq!(
        got["history"][0]["parts"][0]["text"],
        "when does v1.4 ship?"
    );

    // A follow-up in the same context continues the thread: it replies to the answer.
    let events = caller(&mesh, 0, TOKEN, &["send", "and v1.5?", &context]).await;
    let follow = &events[0]["event"]["task"];
    assert_eq!(follow["contextId"], context.as_str());
    assert_eq!(follow["status"]["state"], "TASK_STATE_COMPLETED");
    let t = mesh.transcript(0).await;
    let first_answer = by(&t, "A")[0].id;
    let asked = by(&t, "a2a:hermes");
    assert_eq!(asked[1].reply_to, Some(first_answer), "{t:?}");

    // SendStreamingMessage: the task, then the answer as an artifact, then COMPLETED.
    let events = caller(&mesh, 0, TOKEN, &["stream", "anything blocking?"]).await;
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| {
            let ev = e["event"].as_object().expect("an event");
            ev.keys().next().map_or("", String::as_str)
        })
        .collect();
    assert_eq!(kinds.first(), Some(&"task"), "{events:?}");
    assert_eq!(
        &kinds[kinds.len() - 2..],
        ["artifactUpdate", "statusUpdate"],
        "{events:?}"
    );
    let last = &events[events.len() - 1]["event"]["statusUpdate"];
    assert_eq!(last["status"]["state"], "TASK_STATE_COMPLETED");
    let artifact = &events[events.len() - 2]["event"]["artifactUpdate"]["artifact"];
    assert_eq!(artifact["parts"][0]["text"], "A says: v1.4 ships Friday");

    // A wrong token, or none: refused (HTTP 401), nothing posted.
    let before = mesh.transcript(0).await.len();
    for token in ["not-the-token", "-"] {
        let refused = caller(&mesh, 0, token, &["send", "let me in"]).await;
        assert_eq!(refused[0]["error"], "A2AClientError", "{refused:?}");
        assert!(
            refused[0]["message"].as_str().unwrap_or("").contains("401"),
            "{refused:?}"
        );
    }
    // Another caller's task, or none: not found.
    let missing = caller(&mesh, 0, TOKEN, &["get", "no-such-task"]).await;
    assert_eq!(missing[0]["error"], "TaskNotFoundError", "{missing:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mesh.transcript(0).await.len(), before, "nothing was posted");

    assert_eq!(served(&mesh, 0, "completed").await, 3.0);
    mesh.shutdown().await;
    llm.shutdown().await;
}

#[tokio::test]
async fn cancel_stops_the_turn_a_failed_turn_fails_the_task_and_tasks_outlive_a_restart() {
    // A's reply takes 4 s: long enough to be cancelled while it is written.
    let llm = BotLlm::judging(false, 0.0)
        .reply_with(
            "A",
            Script::delay(Duration::from_secs(4), Script::reply("too late")),
        )
        .start()
        .await;
    let mut mesh = TestMesh::start(spec(&llm.base_url)).await;

    let events = caller(&mesh, 0, TOKEN, &["cancel", "write the full changelog"]).await;
    let first = &events[0]["event"]["task"];
    assert_eq!(first["status"]["state"], "TASK_STATE_WORKING", "{events:?}");
    let task_id = first["id"].as_str().expect("task id").to_string();
    let canceled = &events[1]["canceled"];
    assert_eq!(
        canceled["status"]["state"], "TASK_STATE_CANCELED",
        "{events:?}"
    );
    assert_eq!(events[2]["again"], "TaskNotCancelableError", "{events:?}");

    // The turn was stopped as by /stop: no answer is posted.
    wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || mesh.decisions(0, "silent", "stopped"),
        |n: &f64| *n >= 1.0,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t = mesh.transcript(0).await;
    assert!(
        by(&t, "A").is_empty(),
        "the cancelled turn posted nothing: {t:?}"
    );
    assert_eq!(by(&t, "a2a:hermes").len(), 1);
    assert_eq!(served(&mesh, 0, "canceled").await, 1.0);

    // After a restart the task is still there, still cancelled.
    mesh.stop(0).await;
    mesh.restart(0).await;
    let got = &caller(&mesh, 0, TOKEN, &["get", &task_id]).await[0]["task"];
    assert_eq!(got["status"]["state"], "TASK_STATE_CANCELED", "{got}");
    mesh.shutdown().await;
    llm.shutdown().await;
}

#[tokio::test]
async fn a_turn_that_fails_fails_its_task_with_the_reason() {
    let llm = BotLlm::judging(false, 0.0)
        .reply_with("A", Script::Status(500))
        .start()
        .await;
    let mesh = TestMesh::start(spec(&llm.base_url)).await;
    let events = caller(&mesh, 0, TOKEN, &["send", "status?"]).await;
    let task = &events[0]["event"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{events:?}");
    let why = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or("");
    assert!(why.contains("reply_failed"), "{why}");
    assert_eq!(served(&mesh, 0, "failed").await, 1.0);
    mesh.shutdown().await;
    llm.shutdown().await;
}

#[tokio::test]
async fn the_card_names_the_public_url_and_a_request_not_on_a2a_1_0_is_refused_as_the_sdk_refuses_it(
) {
    let llm = BotLlm::judging(false, 0.0).start().await;
    // The served bot's API as callers reach it, through a proxy.
    let mut spec = MeshSpec::mentions_only(&["A", "B"]).llm(&llm.base_url).bot(
        "A",
        "a2a = { serve = true, callers = { hermes = \"A2A_TEST_HERMES\" }, public_url = \"https://bot.example/api/\" }",
    );
    spec.env.insert("A2A_TEST_HERMES".into(), TOKEN.into());
    let mesh = TestMesh::start(spec).await;

    // The card names the public address, read by the SDK's resolver.
    let card = &caller(&mesh, 0, "-", &["card"]).await[0]["card"];
    assert_eq!(
        card["supportedInterfaces"][0]["url"], "https://bot.example/api/a2a",
        "{card}"
    );

    // A2A-Version: none (taken as 0.3), 0.3, 1.1 or 2.0 is -32009 VersionNotSupported in
    // an HTTP 200 JSON answer, as the SDK's server answers; 1.0.1 and the query
    // parameter are 1.0.
    let http = reqwest::Client::new();
    let get = serde_json::json!({"jsonrpc": "2.0", "id": "r1", "method": "GetTask", "params": {"id": "no-such-task"}});
    let ask = |version: Option<&'static str>, query: &'static str| {
        let mut r = http
            .post(format!("{}/a2a{query}", mesh.api(0)))
            .bearer_auth(TOKEN)
            .json(&get);
        if let Some(v) = version {
            r = r.header("A2A-Version", v);
        }
        async move {
            let resp = r.send().await.expect("the node answers");
            assert_eq!(resp.status(), 200);
            resp.json::<Value>().await.expect("a JSON answer")
        }
    };
    for (version, said) in [
        (None, "0.3"),
        (Some("0.3"), "0.3"),
        (Some("1.1"), "1.1"),
        (Some("2.0"), "2.0"),
    ] {
        let answer = ask(version, "").await;
        assert_eq!(answer["error"]["code"], -32009, "{version:?}: {answer}");
        assert_eq!(
            answer["error"]["data"][0]["reason"], "VERSION_NOT_SUPPORTED",
            "{answer}"
        );
        assert_eq!(
            answer["error"]["message"],
            format!(
                "A2A version '{said}' is not supported by this handler. Expected version '1.0'."
            ),
        );
        assert_eq!(answer["id"], "r1");
    }
    for (version, query) in [(Some("1.0.1"), ""), (None, "?A2A-Version=1.0")] {
        let answer = ask(version, query).await;
        assert_eq!(
            answer["error"]["code"], -32001,
            "{version:?} {query}: {answer}"
        );
    }
    mesh.shutdown().await;
    llm.shutdown().await;
}

#[tokio::test]
async fn on_telegram_the_chat_shows_the_callers_message_then_the_answer_each_recorded_once() {
    use botmesh_tests::fake_telegram::{BotAccount, FakeTelegram};
    const CHAT: i64 = -1001234567890;
    const A_ID: i64 = 1111;
    let llm = BotLlm::judging(false, 0.0)
        .replies(|bot| format!("{bot} says: v1.4 ships Friday"))
        .start()
        .await;
    let account = |token: &str, id: i64, username: &str| BotAccount {
        token: token.into(),
        id,
        username: username.into(),
        first_name: username.into(),
    };
    let fake = FakeTelegram::start(
        vec![
            account("111:a", A_ID, "a_bot"),
            account("222:b", 2222, "b_bot"),
        ],
        Vec::new(),
        &[(CHAT, "Team")],
    )
    .await;
    let mut spec = MeshSpec::mentions_only(&["A", "B"]).llm(&llm.base_url).bot(
        "A",
        &format!(
            "platform = \"telegram\"\ntelegram = {{ token_env = \"A_TG_TOKEN\", chat_id = \"{CHAT}\", username = \"a_bot\", api_base_url = \"{}\" }}\na2a = {{ serve = true, callers = {{ hermes = \"A2A_TEST_HERMES\" }} }}",
            fake.api_base_url
        ),
    );
    spec.env.insert("A_TG_TOKEN".into(), "111:a".into());
    spec.env.insert("A2A_TEST_HERMES".into(), TOKEN.into());
    let mesh = TestMesh::start(spec).await;

    let events = caller(&mesh, 0, TOKEN, &["send", "when does v1.4 ship?"]).await;
    let task = &events[0]["event"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "{events:?}"
    );

    // The chat: the caller's words, in its name, then the answer replying to them.
    fake.wait("the question and the answer in the chat", |f| {
        f.posted_by(A_ID).len() >= 2
    })
    .await;
    let posted = fake.posted_by(A_ID);
    assert_eq!(posted.len(), 2, "{posted:?}");
    assert!(
        posted[0].text.starts_with("a2a:hermes: ")
            && posted[0].text.ends_with("when does v1.4 ship?"),
        "{posted:?}"
    );
    assert_eq!(posted[1].text, "A says: v1.4 ships Friday");
    assert_eq!(posted[1].reply_to, Some(posted[0].message_id), "{posted:?}");

    // The transcript: the caller's message once, carrying the chat's id; the answer once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = mesh.transcript(0).await;
    let asked = by(&t, "a2a:hermes");
    assert_eq!(asked.len(), 1, "{t:?}");
    assert_eq!(
        asked[0].platform_msg_id,
        Some(format!("{CHAT}:{}", posted[0].message_id)),
        "{t:?}"
    );
    let answers = by(&t, "A");
    assert_eq!(answers.len(), 1, "{t:?}");
    assert_eq!(answers[0].reply_to, Some(asked[0].id));
    mesh.shutdown().await;
    llm.shutdown().await;
}

/// The SDK-built agent tests/py/a2a_agent.py, killed when dropped.
struct RemoteAgent {
    child: tokio::process::Child,
    url: String,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl RemoteAgent {
    async fn start(token: &str) -> RemoteAgent {
        use tokio::io::AsyncBufReadExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("agent.jsonl");
        let mut child = tokio::process::Command::new(test_python())
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/py/a2a_agent.py"))
            .arg(token)
            .env("A2A_AGENT_LOG", &log)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the test venv's python runs");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the agent starts")
            .expect("reads its stdout")
            .expect("a first line");
        let url = first
            .strip_prefix("listening on ")
            .expect("the start line")
            .to_string();
        RemoteAgent {
            child,
            url,
            log,
            _dir: dir,
        }
    }

    /// What the agent logged: the messages it received and the tasks it cancelled.
    fn log(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    }
}

impl Drop for RemoteAgent {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

#[tokio::test]
async fn a_remote_sdk_agent_writes_the_bots_replies_asks_the_chat_and_is_cancelled_by_stop() {
    let agent = RemoteAgent::start("remote-token").await;
    let llm = BotLlm::judging(false, 0.0).start().await;
    let mut spec = MeshSpec::mentions_only(&["A", "R"]).llm(&llm.base_url).bot(
        "R",
        &format!(
            "agent = {{ a2a = \"{}\", token_env = \"A2A_TEST_REMOTE\" }}",
            agent.url
        ),
    );
    spec.env
        .insert("A2A_TEST_REMOTE".into(), "remote-token".into());
    let mut mesh = TestMesh::start(spec).await;
    let replies = |n: usize| {
        let mesh = &mesh;
        async move {
            mesh.wait_transcript(0, Duration::from_secs(20), |t| by(t, "R").len() >= n)
                .await
        }
    };

    // A turn: the agent gets the delta, its artifact is the reply.
    mesh.post_human(0, "alice", "@R hello there").await;
    let t = replies(1).await;
    assert_eq!(
        by(&t, "R")[0].text,
        "remote saw 1 lines; last: alice: @R hello there",
        "{t:?}"
    );
    // The next turn: only what was said since, in the same conversation.
    mesh.post_human(0, "bob", "side remark").await;
    mesh.post_human(0, "alice", "@R again").await;
    let t = replies(2).await;
    assert_eq!(
        by(&t, "R")[1].text,
        "remote saw 2 lines; last: alice: @R again"
    );
    let log = agent.log();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(
        log[0]["context"], log[1]["context"],
        "one context per group"
    );
    assert_eq!(log[1]["text"], "bob: side remark\nalice: @R again");

    // INPUT_REQUIRED: the question goes to the chat; the next turn continues the task.
    mesh.post_human(0, "alice", "@R permission to deploy?")
        .await;
    let t = replies(3).await;
    assert_eq!(by(&t, "R")[2].text, "may I deploy?");
    mesh.post_human(0, "alice", "@R yes go ahead").await;
    let t = replies(4).await;
    assert_eq!(
        by(&t, "R")[3].text,
        "deployed after: alice: @R yes go ahead"
    );
    let log = agent.log();
    assert_eq!(
        log[2]["task"], log[3]["task"],
        "the answer continued the task: {log:?}"
    );

    // /stop while the agent works: the task is cancelled at the agent, nothing posted.
    mesh.post_human(0, "alice", "@R slow job").await;
    wait_for(
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { agent.log() },
        |l: &Vec<Value>| l.len() >= 5,
    )
    .await;
    mesh.post_human(0, "alice", "/stop").await;
    let log = wait_for(
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { agent.log() },
        |l: &Vec<Value>| l.iter().any(|e| e.get("canceled").is_some()),
    )
    .await;
    let slow = log
        .iter()
        .find(|e| e["text"].as_str().is_some_and(|t| t.contains("slow job")))
        .unwrap_or_else(|| panic!("the slow job reached the agent: {log:?}"));
    let canceled: Vec<&Value> = log.iter().filter_map(|e| e.get("canceled")).collect();
    assert_eq!(
        canceled,
        vec![&slow["task"]],
        "only the slow job's task is cancelled: {log:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(by(&mesh.transcript(0).await, "R").len(), 4);
    // /why shows the A2A turn: handed to the agent, then stopped.
    mesh.post_human(0, "alice", "/why @R").await;
    let t = replies(5).await;
    let why = &by(&t, "R")[4].text;
    assert!(why.contains("agent (prompted: A2A task, 1 lines)"), "{why}");
    assert!(why.contains("silent (stopped"), "{why}");

    let m = mesh.metrics(1).await;
    let sent = |state: &str| {
        metric(
            &m,
            &format!("botmesh_a2a_tasks_total{{bot=\"R\",direction=\"sent\",state=\"{state}\"}}"),
        )
    };
    assert_eq!(sent("completed"), 3.0, "{m}");
    assert_eq!(sent("input_required"), 1.0, "{m}");

    // A restart between the agent's question and the chat's answer: R goes on with the
    // same conversation and the same waiting task, sending only what was said since.
    mesh.post_human(0, "alice", "@R permission to roll back?")
        .await;
    mesh.wait_transcript(0, Duration::from_secs(20), |t| by(t, "R").len() >= 6)
        .await;
    mesh.stop(1).await;
    mesh.restart(1).await;
    mesh.post_human(0, "alice", "@R yes roll back").await;
    let t = mesh
        .wait_transcript(0, Duration::from_secs(30), |t| by(t, "R").len() >= 7)
        .await;
    assert_eq!(
        by(&t, "R")[6].text,
        "deployed after: alice: @R yes roll back",
        "{t:?}"
    );
    let log = agent.log();
    let turns: Vec<&Value> = log.iter().filter(|e| e.get("text").is_some()).collect();
    let (asked, answered) = (turns[turns.len() - 2], turns[turns.len() - 1]);
    assert_eq!(answered["task"], asked["task"], "the waiting task: {log:?}");
    assert_eq!(
        answered["context"], log[0]["context"],
        "the same conversation after the restart: {log:?}"
    );
    mesh.shutdown().await;
    llm.shutdown().await;
}

#[tokio::test]
async fn a_served_agents_permission_question_makes_the_task_wait_for_input_and_the_caller_allows_it(
) {
    // A served bot whose brain is the scripted ACP agent, asking before it executes.
    let dir = tempfile::tempdir().expect("temp dir");
    let dir = dir.path().canonicalize().expect("canonical");
    let agent = format!(
        "agent = {{ acp = [{:?}, {:?}], cwd = {:?}, env = {{ ACP_STANDIN_LOG = {:?} }}, sandbox = {{ read = [{:?}] }}, ask = [\"execute\"], ask_timeout_secs = 30 }}",
        test_python(),
        botmesh_tests::acp_standin_script(),
        dir.display().to_string(),
        dir.join("agent.log").display().to_string(),
        botmesh_tests::standin_dir(),
    );
    let mut spec = MeshSpec::mentions_only(&["A", "B"]).bot(
        "A",
        &format!("{agent}\na2a = {{ serve = true, callers = {{ hermes = \"A2A_TEST_HERMES\" }} }}"),
    );
    spec.env.insert("A2A_TEST_HERMES".into(), TOKEN.into());
    let mesh = TestMesh::start(spec).await;

    let lines = caller(&mesh, 0, TOKEN, &["ask", "TOOL execute"]).await;
    let waiting = &lines[0]["event"]["task"];
    assert_eq!(
        waiting["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{lines:?}"
    );
    assert_eq!(
        waiting["status"]["message"]["parts"][0]["text"],
        "A wants to run `cargo test` — /allow or /deny"
    );
    let done = &lines.last().expect("lines")["task"];
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{lines:?}");
    assert_eq!(
        done["artifacts"][0]["parts"][0]["text"],
        "permission: proceed-once"
    );
    // The caller's /allow is in the group, from the caller, as the question's answer.
    let t = mesh.transcript(0).await;
    assert!(
        by(&t, "a2a:hermes").iter().any(|e| e.text == "/allow"),
        "{t:?}"
    );
    assert_eq!(served(&mesh, 0, "input_required").await, 1.0);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_served_sidecar_bots_later_answer_completes_the_task() {
    // B's turns go to the example sidecar, which answers later through /v1/messages.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = probe.local_addr().expect("its address").port();
    drop(probe);
    let mut spec = MeshSpec::mentions_only(&["A", "B"]).bot(
        "B",
        &format!(
            "agent = {{ webhook = \"http://127.0.0.1:{port}/turn\", timeout_ms = 5000 }}\na2a = {{ serve = true, callers = {{ hermes = \"A2A_TEST_HERMES\" }} }}"
        ),
    );
    spec.env.insert("A2A_TEST_HERMES".into(), TOKEN.into());
    let mesh = TestMesh::start(spec).await;
    let mut sidecar = tokio::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/sidecar_bot.py"
        ))
        .args([
            "--port",
            &port.to_string(),
            "--mode",
            "async",
            "--node",
            &mesh.api(1),
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs the example");
    {
        use tokio::io::AsyncBufReadExt;
        let out = sidecar.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(out).lines();
        tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the sidecar starts")
            .expect("reads its stdout");
    }
    let events = caller(&mesh, 1, TOKEN, &["send", "status?"]).await;
    let task = &events[0]["event"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    let answer = task["artifacts"][0]["parts"][0]["text"]
        .as_str()
        .unwrap_or("");
    assert!(
        answer.starts_with("B (sidecar) got it, a2a:hermes"),
        "{answer}"
    );
    let _ = sidecar.start_kill();
    mesh.shutdown().await;
}
