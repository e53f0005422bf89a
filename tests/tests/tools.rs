//! MCP tool servers for a bot's reply model (docs/tools.md), end to end: real nodes,
//! real MCP servers (the official `mcp-server-time` from PyPI over stdio, small servers
//! made with the official `mcp` SDK over stdio and streamable HTTP: tests/py/), and the
//! scripted LLM asking for tool calls.
//!
//! The Python side runs from the test venv (`BOTMESH_TEST_PYTHON`, tests/requirements.txt).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use botmesh::wire::envelope::Envelope;
use botmesh_tests::fake_llm::{FakeLlm, Script, Seen};
use botmesh_tests::{bot_msgs, is_judge, metric, wait_for, MeshSpec, TestMesh};
use serde_json::{json, Value};

/// Quick turns.
const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";

/// The test venv's Python (mcp, mcp-server-time).
fn python() -> PathBuf {
    PathBuf::from(std::env::var("BOTMESH_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "BOTMESH_TEST_PYTHON is not set: run scripts/test.sh, which creates .venv-test/ \
             with tests/requirements.txt (mcp, mcp-server-time) and exports it"
        )
    }))
}

/// A script of tests/py/.
fn script(name: &str) -> String {
    format!("{}/py/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The `[[bots.mcp]]` entry of the official `mcp-server-time` (installed next to the
/// venv's Python).
fn time_server() -> String {
    let bin = python().with_file_name("mcp-server-time");
    format!(
        "[[bots.mcp]]\nname = \"time\"\ncommand = [{:?}, \"--local-timezone\", \"UTC\"]\n",
        bin.display().to_string()
    )
}

/// Waits (bounded) until node `i`'s transcript holds `n` bot messages, then returns it.
async fn bot_messages(mesh: &TestMesh, i: usize, n: usize) -> Vec<Envelope> {
    mesh.bot_messages(i, n, Duration::from_secs(30)).await
}

/// The reply calls the LLM saw (not judge calls), in order.
fn reply_calls(llm: &FakeLlm) -> Vec<Seen> {
    llm.requests()
        .into_iter()
        .filter(|s| !is_judge(s))
        .collect()
}

/// `botmesh_tool_calls_total{bot,server,tool,outcome}` of node `i`.
async fn tool_calls(mesh: &TestMesh, i: usize, server: &str, tool: &str, outcome: &str) -> f64 {
    metric(
        &mesh.metrics(i).await,
        &format!(
            "botmesh_tool_calls_total{{bot=\"A\",server=\"{server}\",tool=\"{tool}\",outcome=\"{outcome}\"}}"
        ),
    )
}

/// The last user message of a request (the trigger is quoted there).
fn prompt(seen: &Seen) -> String {
    seen.messages
        .iter()
        .filter(|(r, _)| r == "user")
        .map(|(_, c)| c.clone())
        .next_back()
        .unwrap_or_default()
}

#[tokio::test]
async fn mcp_server_time_answers_a_question_through_a_tool_call() {
    // The judge says speak; the reply model asks for the time, then answers with it.
    let llm = FakeLlm::start(|seen: &Seen| {
        if is_judge(seen) {
            return Script::reply("{\"speak\": true, \"relevance\": 0.9}");
        }
        match seen.tool_results().first() {
            None => Script::tool_call("call-1", "get_current_time", json!({"timezone": "UTC"})),
            Some((_, result)) => {
                let v: Value = serde_json::from_str(result).unwrap_or_default();
                Script::reply(format!(
                    "It is {} there.",
                    v["datetime"].as_str().unwrap_or("?")
                ))
            }
        }
    })
    .await;
    let spec = MeshSpec::new(&["A"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot("A", &format!("daily_calls = 100\n{}", time_server()));
    let mesh = TestMesh::start(spec).await;
    mesh.post_human(0, "alice", "what time is it in UTC right now?")
        .await;
    let t = bot_messages(&mesh, 0, 1).await;
    let answer = &bot_msgs(&t)[0].text;

    let judge: Vec<Seen> = llm.requests().into_iter().filter(is_judge).collect();
    assert!(!judge.is_empty(), "the bot judged the message");
    for j in &judge {
        assert!(
            j.body.get("tools").is_none(),
            "a judge call carries no tools: {}",
            j.body
        );
    }
    let replies = reply_calls(&llm);
    assert_eq!(replies.len(), 2, "{replies:#?}");
    // Both tools of the real server were listed and offered.
    let mut offered = replies[0].tools();
    offered.sort();
    assert_eq!(offered, ["convert_time", "get_current_time"]);
    // The tool's real answer went back as a `tool` message for the call.
    let results = replies[1].tool_results();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].0, "call-1");
    let v: Value = serde_json::from_str(&results[0].1).expect("the server's JSON");
    assert_eq!(v["timezone"], "UTC", "{v}");
    let datetime = v["datetime"].as_str().expect("a datetime");
    assert_eq!(answer, &format!("It is {datetime} there."));
    // The assistant message that asked for it precedes it.
    let msgs = replies[1].body["messages"].as_array().unwrap();
    let asked = &msgs[msgs.len() - 2];
    assert_eq!(asked["role"], "assistant");
    assert_eq!(asked["tool_calls"][0]["id"], "call-1");
    assert_eq!(
        asked["tool_calls"][0]["function"]["name"],
        "get_current_time"
    );

    // Counted: the tool call, and both reply rounds as reply calls.
    assert_eq!(
        tool_calls(&mesh, 0, "time", "get_current_time", "ok").await,
        1.0
    );
    let m = mesh.metrics(0).await;
    assert_eq!(
        metric(
            &m,
            "botmesh_llm_calls_total{purpose=\"reply\",result=\"ok\"}"
        ),
        2.0,
        "{m}"
    );
    // The judge call and both reply rounds count against the day's budget.
    let calls = judge.len() as f64 + 2.0;
    assert_eq!(
        metric(&m, "botmesh_llm_budget_spent{kind=\"calls\"}"),
        calls,
        "{m}"
    );

    // /why tells the tool call.
    mesh.post_human(0, "alice", "/why @A").await;
    let t = bot_messages(&mesh, 0, 2).await;
    let why = &bot_msgs(&t)[1].text;
    assert!(why.contains("tool (ok: time/get_current_time"), "{why}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_stdio_tool_server_gets_a_clean_environment() {
    // Secrets the node holds in its environment: the LLM key and a mesh secret.
    std::env::set_var("TOOLS_TEST_LLM_KEY", "sk-not-for-tools");
    std::env::set_var("TOOLS_TEST_MESH_SECRET", "whsec-not-for-tools");
    let llm = FakeLlm::start(|seen: &Seen| match seen.tool_results().first() {
        None => Script::tool_call("call-env", "env", json!({})),
        Some(_) => Script::reply("seen"),
    })
    .await;
    let mut spec = MeshSpec::mentions_only(&["A"])
        .llm_with(&llm.base_url, "timeout_ms = 3000\napi_key_env = \"TOOLS_TEST_LLM_KEY\"")
        .all_bots(FAST)
        .bot(
            "A",
            &format!(
                "[[bots.mcp]]\nname = \"env\"\ncommand = [{:?}, {:?}]\nenv = {{ GREETING = \"hello\" }}\n",
                python().display().to_string(),
                script("mcp_env_server.py")
            ),
        );
    spec.env
        .insert("TOOLS_TEST_LLM_KEY".into(), "sk-not-for-tools".into());
    let mesh = TestMesh::start(spec).await;
    mesh.post_human(0, "alice", "@A show me your environment")
        .await;
    bot_messages(&mesh, 0, 1).await;
    let replies = reply_calls(&llm);
    let results = replies.last().unwrap().tool_results();
    assert_eq!(results.len(), 1, "{replies:#?}");
    let env: Value = serde_json::from_str(&results[0].1).expect("the env tool's JSON");
    assert_eq!(env["GREETING"], "hello", "{env}");
    assert!(env.get("PATH").is_some(), "{env}");
    assert!(env.get("TOOLS_TEST_LLM_KEY").is_none(), "{env}");
    assert!(env.get("TOOLS_TEST_MESH_SECRET").is_none(), "{env}");
    assert!(
        !results[0].1.contains("not-for-tools"),
        "no secret value reached the server: {env}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_server_that_will_not_start_leaves_the_bot_answering_without_tools() {
    let llm = FakeLlm::start(|_: &Seen| Script::reply("answered anyway")).await;
    let spec = MeshSpec::mentions_only(&["A"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot(
            "A",
            "[[bots.mcp]]\nname = \"ghost\"\ncommand = [\"/nonexistent/mcp-server-ghost\"]\n",
        );
    let mesh = TestMesh::start(spec).await;
    mesh.post_human(0, "alice", "@A are you there?").await;
    let t = bot_messages(&mesh, 0, 1).await;
    assert_eq!(bot_msgs(&t)[0].text, "answered anyway");
    let replies = reply_calls(&llm);
    assert!(
        replies[0].body.get("tools").is_none(),
        "{}",
        replies[0].body
    );
    mesh.post_human(0, "alice", "/why @A").await;
    let t = bot_messages(&mesh, 0, 2).await;
    let why = &bot_msgs(&t)[1].text;
    assert!(
        why.contains("tools (server_unavailable: ghost: could not start"),
        "{why}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn tool_rounds_stop_at_max_tool_rounds_and_the_model_answers_without_tools() {
    // A model that asks for the time whenever it may.
    let llm = FakeLlm::start(|seen: &Seen| {
        if seen.tools().is_empty() {
            Script::reply("final answer without tools")
        } else {
            let n = seen.tool_results().len();
            Script::tool_call(
                &format!("call-{n}"),
                "get_current_time",
                json!({"timezone": "UTC"}),
            )
        }
    })
    .await;
    let spec = MeshSpec::mentions_only(&["A"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot("A", &format!("max_tool_rounds = 2\n{}", time_server()));
    let mesh = TestMesh::start(spec).await;
    mesh.post_human(0, "alice", "@A loop forever").await;
    let t = bot_messages(&mesh, 0, 1).await;
    assert_eq!(bot_msgs(&t)[0].text, "final answer without tools");
    let replies = reply_calls(&llm);
    assert_eq!(replies.len(), 3, "two rounds with tools, one without");
    assert!(!replies[1].tools().is_empty());
    assert!(
        replies[2].body.get("tools").is_none(),
        "{}",
        replies[2].body
    );
    assert_eq!(replies[2].tool_results().len(), 2);
    assert_eq!(
        tool_calls(&mesh, 0, "time", "get_current_time", "ok").await,
        2.0
    );
    mesh.post_human(0, "alice", "/why @A").await;
    let t = bot_messages(&mesh, 0, 2).await;
    let why = &bot_msgs(&t)[1].text;
    assert!(why.contains("tools (max_tool_rounds"), "{why}");
    mesh.shutdown().await;
}

/// The streamable-HTTP test server (tests/py/mcp_http_server.py), killed on drop.
struct HttpServer {
    child: std::process::Child,
    url: String,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the streamable-HTTP test server on a free port and waits (bounded) until it
/// accepts connections.
async fn http_server() -> HttpServer {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    http_server_on(port).await
}

/// [`http_server`] on `port`.
async fn http_server_on(port: u16) -> HttpServer {
    let child = std::process::Command::new(python())
        .arg(script("mcp_http_server.py"))
        .arg(port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the test venv's python runs the MCP server");
    let server = HttpServer {
        child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    };
    let up = wait_for(
        Duration::from_secs(20),
        Duration::from_millis(50),
        || tokio::net::TcpStream::connect(("127.0.0.1", port)),
        Result::is_ok,
    )
    .await;
    assert!(up.is_ok(), "the MCP test server never listened on {port}");
    server
}

/// The model of the HTTP tests: a message `call TOOL ARGS` makes it call TOOL with the
/// JSON ARGS; with the result back, it answers `done`.
fn calling_model(seen: &Seen) -> Script {
    if !seen.tool_results().is_empty() {
        return Script::reply("done");
    }
    let p = prompt(seen);
    let Some(call) = p.rsplit("call ").next().filter(|_| p.contains("call ")) else {
        return Script::reply("no call asked");
    };
    let (tool, args) = call.trim().split_once(' ').unwrap_or((call.trim(), "{}"));
    let args: Value = serde_json::from_str(args).unwrap_or(json!({}));
    let n = seen.messages.len();
    Script::tool_call(&format!("call-{tool}-{n}"), tool, args)
}

/// Node `i`'s `botmesh_mcp_tools{bot="A",server}`.
async fn tools_offered(mesh: &TestMesh, i: usize, server: &str) -> f64 {
    metric(
        &mesh.metrics(i).await,
        &format!("botmesh_mcp_tools{{bot=\"A\",server=\"{server}\"}}"),
    )
}

/// Posts `text` to A, waits for its answer, and gives the tool result the model got.
async fn ask(mesh: &TestMesh, llm: &FakeLlm, n: usize, text: &str) -> String {
    mesh.post_human(0, "alice", &format!("@A {text}")).await;
    bot_messages(mesh, 0, n).await;
    let last = reply_calls(llm)
        .into_iter()
        .rev()
        .find(|s| prompt(s).contains(text))
        .expect("a reply call about it");
    last.tool_results()
        .first()
        .map(|(_, r)| r.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_streamable_http_server_s_tools_fail_time_out_are_cut_and_change() {
    std::env::set_var("TOOLS_TEST_WEB_TOKEN", "Bearer web-token-1");
    std::env::set_var("TOOLS_TEST_HTTP_LLM_KEY", "sk-http-llm-key");
    let server = http_server().await;
    let llm = FakeLlm::start(calling_model).await;
    let mut spec = MeshSpec::mentions_only(&["A"])
        .llm_with(
            &llm.base_url,
            "timeout_ms = 3000\napi_key_env = \"TOOLS_TEST_HTTP_LLM_KEY\"",
        )
        .all_bots(FAST)
        .bot(
            "A",
            &format!(
                "tool_timeout_ms = 1000\ntool_result_chars = 500\n[[bots.mcp]]\nname = \"web\"\nurl = \"{}\"\nheaders_env = {{ Authorization = \"TOOLS_TEST_WEB_TOKEN\" }}\n",
                server.url
            ),
        );
    spec.env
        .insert("TOOLS_TEST_WEB_TOKEN".into(), "Bearer web-token-1".into());
    spec.env
        .insert("TOOLS_TEST_HTTP_LLM_KEY".into(), "sk-http-llm-key".into());
    let mesh = TestMesh::start(spec).await;

    // A plain call, with the configured header and no other secret.
    let r = ask(&mesh, &llm, 1, "call headers {}").await;
    let headers: Value = serde_json::from_str(&r).expect("the headers tool's JSON");
    assert_eq!(headers["authorization"], "Bearer web-token-1", "{headers}");
    assert!(
        !r.contains("sk-http-llm-key"),
        "the LLM key stays with the LLM: {headers}"
    );
    let r = ask(&mesh, &llm, 2, "call ok {\"text\": \"hi\"}").await;
    assert_eq!(r, "ok: hi");

    // isError goes back to the model as an error.
    let r = ask(&mesh, &llm, 3, "call fails {}").await;
    assert!(r.starts_with("[tool error] "), "{r}");
    assert!(r.contains("this tool always fails"), "{r}");

    // A call past the timeout: the model is told, and the turn still answers.
    let r = ask(&mesh, &llm, 4, "call slow {\"seconds\": 5}").await;
    assert_eq!(r, "[tool timeout] the tool did not answer within 1000 ms");

    // A huge result is cut at tool_result_chars, and the model is told so.
    let r = ask(&mesh, &llm, 5, "call huge {\"chars\": 100000}").await;
    assert!(
        r.starts_with(&"x".repeat(500)),
        "{}",
        &r[..600.min(r.len())]
    );
    assert!(
        r.ends_with("\n[result cut: 500 of 100000 characters shown]"),
        "{}",
        &r[r.len().saturating_sub(100)..]
    );

    // The server adds a tool and says so: the next turn offers it.
    assert_eq!(tools_offered(&mesh, 0, "web").await, 6.0);
    let r = ask(&mesh, &llm, 6, "call grow {}").await;
    assert_eq!(r, "grown");
    let listed = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || tools_offered(&mesh, 0, "web"),
        |n| *n == 7.0,
    )
    .await;
    assert_eq!(listed, 7.0, "the new list was fetched");
    let r = ask(&mesh, &llm, 7, "call fresh {}").await;
    assert_eq!(r, "fresh and new");
    let last = reply_calls(&llm)
        .into_iter()
        .rev()
        .find(|s| prompt(s).contains("call fresh"))
        .unwrap();
    assert!(
        last.tools().contains(&"fresh".to_string()),
        "{:?}",
        last.tools()
    );

    for (tool, outcome) in [
        ("headers", "ok"),
        ("ok", "ok"),
        ("fails", "error"),
        ("slow", "timeout"),
        ("huge", "ok"),
        ("grow", "ok"),
        ("fresh", "ok"),
    ] {
        assert_eq!(
            tool_calls(&mesh, 0, "web", tool, outcome).await,
            1.0,
            "{tool}"
        );
    }
    mesh.shutdown().await;
    drop(server);
}

#[tokio::test]
async fn a_server_that_dies_is_reconnected_and_its_tools_come_back() {
    let llm = FakeLlm::start(calling_model).await;
    let spec = MeshSpec::mentions_only(&["A"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot(
            "A",
            &format!(
                "[[bots.mcp]]\nname = \"env\"\ncommand = [{:?}, {:?}]\n",
                python().display().to_string(),
                script("mcp_env_server.py")
            ),
        );
    let mesh = TestMesh::start(spec).await;
    let r = ask(&mesh, &llm, 1, "call exit {}").await;
    assert!(r.starts_with("[tool failed] "), "{r}");
    assert_eq!(tool_calls(&mesh, 0, "env", "exit", "failed").await, 1.0);
    // Down at once (its tools are not offered), then back after the backoff.
    assert_eq!(tools_offered(&mesh, 0, "env").await, 0.0);
    let back = wait_for(
        Duration::from_secs(20),
        Duration::from_millis(50),
        || tools_offered(&mesh, 0, "env"),
        |n| *n == 3.0,
    )
    .await;
    assert_eq!(back, 3.0, "the server was started again (env, exit, read)");
    let r = ask(&mesh, &llm, 2, "call env {}").await;
    let env: Value = serde_json::from_str(&r).expect("the env tool answers again");
    assert!(env.get("PATH").is_some(), "{env}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_drafting_judge_s_streamed_answer_asks_for_a_tool_and_the_loop_goes_on() {
    // The drafting call (streamed) says speak and asks for the time; the next round
    // (not streamed) has the result and answers.
    let llm = FakeLlm::start(|seen: &Seen| {
        if seen.stream {
            return Script::ToolCalls {
                text: "{\"speak\": true, \"relevance\": 0.9}\n".into(),
                calls: vec![(
                    "call-s".into(),
                    "get_current_time".into(),
                    json!({"timezone": "UTC"}).to_string(),
                )],
            };
        }
        match seen.tool_results().first() {
            Some((_, r)) => {
                let v: Value = serde_json::from_str(r).unwrap_or_default();
                Script::reply(format!(
                    "streamed: {}",
                    v["timezone"].as_str().unwrap_or("?")
                ))
            }
            None => Script::reply("no tool result"),
        }
    })
    .await;
    let spec = MeshSpec::new(&["A"]).llm(&llm.base_url).all_bots(FAST).bot(
        "A",
        &format!(
            "judge_drafts = true\nwrite_early = true\ndaily_calls = 100\n{}",
            time_server()
        ),
    );
    let mesh = TestMesh::start(spec).await;
    mesh.post_human(0, "alice", "what time is it in UTC?").await;
    let t = bot_messages(&mesh, 0, 1).await;
    assert_eq!(bot_msgs(&t)[0].text, "streamed: UTC");
    let seen = llm.requests();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert!(seen[0].stream, "the drafting call streams");
    assert!(seen[0].tools().contains(&"get_current_time".to_string()));
    assert!(!seen[1].stream);
    let results = seen[1].tool_results();
    assert_eq!(results[0].0, "call-s");
    let msgs = seen[1].body["messages"].as_array().unwrap();
    let asked = &msgs[msgs.len() - 2];
    assert_eq!(
        asked["tool_calls"][0]["function"]["arguments"],
        "{\"timezone\":\"UTC\"}"
    );
    assert_eq!(
        tool_calls(&mesh, 0, "time", "get_current_time", "ok").await,
        1.0
    );
    // Both calls count against the day's budget.
    let m = mesh.metrics(0).await;
    assert_eq!(
        metric(&m, "botmesh_llm_budget_spent{kind=\"calls\"}"),
        2.0,
        "{m}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_http_server_that_goes_away_is_reached_again_when_it_is_back() {
    let server = http_server().await;
    let port: u16 = server
        .url
        .trim_end_matches("/mcp")
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let llm = FakeLlm::start(calling_model).await;
    let spec = MeshSpec::mentions_only(&["A"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot(
            "A",
            &format!("[[bots.mcp]]\nname = \"web\"\nurl = \"{}\"\n", server.url),
        );
    let mesh = TestMesh::start(spec).await;
    assert_eq!(
        ask(&mesh, &llm, 1, "call ok {\"text\": \"one\"}").await,
        "ok: one"
    );
    drop(server);
    let r = ask(&mesh, &llm, 2, "call ok {\"text\": \"two\"}").await;
    assert!(r.starts_with("[tool failed] "), "{r}");
    assert_eq!(tools_offered(&mesh, 0, "web").await, 0.0, "down at once");
    let _back = http_server_on(port).await;
    let listed = wait_for(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || tools_offered(&mesh, 0, "web"),
        |n| *n == 6.0,
    )
    .await;
    assert_eq!(listed, 6.0, "reconnected");
    assert_eq!(
        ask(&mesh, &llm, 3, "call ok {\"text\": \"three\"}").await,
        "ok: three"
    );
    mesh.shutdown().await;
}

/// Starts bot A with the env server (`sandbox`: its `sandbox` key, or nothing), has
/// its model call `read` on the node's config, key file and data dir and on the
/// server's own temp dir, and returns what the server got, with those paths.
async fn read_as_tool_server(sandbox: &str) -> (Value, Vec<String>) {
    let paths: Arc<std::sync::OnceLock<Vec<String>>> = Arc::default();
    let asked = paths.clone();
    let llm = FakeLlm::start(move |seen: &Seen| match seen.tool_results().first() {
        None => Script::tool_call(
            "call-read",
            "read",
            json!({"paths": asked.get().cloned().unwrap_or_default()}),
        ),
        Some(_) => Script::reply("read"),
    })
    .await;
    let spec = MeshSpec::mentions_only(&["A"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot(
            "A",
            &format!(
                "[[bots.mcp]]\nname = \"env\"\ncommand = [{:?}, {:?}]\n{sandbox}\n",
                python().display().to_string(),
                script("mcp_env_server.py")
            ),
        );
    let mesh = TestMesh::start(spec).await;
    let home = mesh.dir.path();
    let list = vec![
        mesh.config_path.display().to_string(),
        home.join("a.key").display().to_string(),
        home.join("data").display().to_string(),
        // The server's own temp dir: open to it, boxed or not.
        "$TMPDIR".to_string(),
    ];
    paths.set(list.clone()).unwrap();
    mesh.post_human(0, "alice", "@A read the node's files")
        .await;
    bot_messages(&mesh, 0, 1).await;
    let replies = reply_calls(&llm);
    let results = replies.last().unwrap().tool_results();
    assert_eq!(results.len(), 1, "{replies:#?}");
    let out: Value = serde_json::from_str(&results[0].1)
        .unwrap_or_else(|_| panic!("the read tool's JSON: {}", results[0].1));
    mesh.shutdown().await;
    (out, list)
}

#[tokio::test]
async fn a_stdio_tool_server_is_boxed_away_from_the_node_s_config_keys_and_data() {
    // Boxed, as by default: the node's files are out of its reach.
    let (boxed, paths) = read_as_tool_server("").await;
    for path in &paths[..3] {
        assert_eq!(
            boxed[path]["ok"], false,
            "the boxed server read {path}: {boxed}"
        );
        assert!(
            boxed[path]["error"]
                .as_str()
                .is_some_and(|e| e.contains("PermissionError")),
            "{path}: {boxed}"
        );
    }
    // The probe works: its own temp dir is open to it.
    assert_eq!(boxed["$TMPDIR"]["ok"], true, "{boxed}");
    // Unboxed, the same server reads them: the box is what closed them.
    let (open, paths) = read_as_tool_server("sandbox = \"off\"").await;
    for path in &paths[..3] {
        assert_eq!(
            open[path]["ok"], true,
            "{path} unreadable even unboxed: {open}"
        );
    }
    assert!(
        open[&paths[1]]["text"]
            .as_str()
            .is_some_and(|k| k.starts_with("whsk_")),
        "{open}"
    );
}

/// The built-in model's tool loop ends visibly as an agent's turn does: a loop that
/// called a tool and then came to no answer (a turn shorter than
/// `status_after_secs`) ends with one short line, which carries what the bot is told
/// of it; a plain reply that fails stays a silence.
#[tokio::test]
async fn a_tool_loop_without_an_answer_ends_with_one_line() {
    let llm = FakeLlm::start(|seen: &Seen| {
        if is_judge(seen) {
            return Script::reply("{\"speak\": true, \"relevance\": 0.9}");
        }
        match seen.tool_results().first() {
            None => Script::tool_call("call-1", "get_current_time", json!({"timezone": "UTC"})),
            // After the tool's result the model says nothing.
            Some(_) => Script::reply(""),
        }
    })
    .await;
    let spec = MeshSpec::new(&["A"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot("A", &format!("write_early = false\n{}", time_server()));
    let mesh = TestMesh::start(spec).await;
    let asked = mesh.post_human(0, "alice", "@A what time is it?").await;
    let t = bot_messages(&mesh, 0, 1).await;
    let line = &bot_msgs(&t)[0];
    assert_eq!(line.text, "finished without an answer");
    assert_eq!(line.reply_to.map(|r| r.to_string()), Some(asked.clone()));
    assert_eq!(
        line.turn_end.as_deref(),
        Some("Your last turn ended without an answer in the chat.")
    );
    assert_eq!(
        tool_calls(&mesh, 0, "time", "get_current_time", "ok").await,
        1.0
    );
    let t = mesh.settle(0, Duration::from_millis(500)).await;
    assert_eq!(bot_msgs(&t).len(), 1, "one line: {t:#?}");
    mesh.shutdown().await;
}
