//! The group as tools (docs/agents.md, "Working together"): `read_group`, `members`,
//! `post`, `ask`, `wait_for_message`, on real nodes.
//!
//! - on the node's local API (`POST /v1/tools/<name>`), what every `mesh` server calls;
//! - in a hosted agent's hands: the scripted ACP agent tests/py/acp_agent.py (official
//!   Python ACP SDK) starts the `mesh` server session/new gives it (`botmesh mcp`,
//!   with the official MCP Python SDK's client) and asks a colleague bot on another
//!   node mid-turn;
//! - for an agent outside the mesh: `botmesh mcp --config` driven over stdio by the
//!   official MCP Python SDK's client (tests/py/mesh_client.py).

use std::path::Path;
use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::{
    acp_standin::agent_table, botmesh_bin, test_python as python, wait_for, MeshSpec, TestMesh,
};
use serde_json::{json, Value};

/// The longest any wait here lasts.
const WAIT: Duration = Duration::from_secs(20);

/// `POST /v1/tools/<tool>` on node `i` (with `token` when given): status and body.
async fn tool(
    mesh: &TestMesh,
    i: usize,
    token: Option<&str>,
    name: &str,
    args: Value,
) -> (u16, Value) {
    let mut req = mesh
        .http
        .post(format!("{}/v1/tools/{name}", mesh.api(i)))
        .timeout(Duration::from_secs(30))
        .json(&args);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("the API answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// `ask {colleague, question}` on node `i`.
async fn ask(mesh: &TestMesh, i: usize, colleague: &str, question: &str) -> (u16, Value) {
    let args = json!({"colleague": colleague, "question": question});
    tool(mesh, i, None, "ask", args).await
}

/// `wait_for_message {timeout_secs}` on node `i`.
async fn wait_message(mesh: &TestMesh, i: usize, timeout_secs: u64) -> (u16, Value) {
    let args = json!({ "timeout_secs": timeout_secs });
    tool(mesh, i, None, "wait_for_message", args).await
}

/// A refusal's `code`, checking it is one (422).
fn refused(answer: &(u16, Value)) -> &str {
    assert_eq!(answer.0, 422, "{answer:?}");
    answer.1["code"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer:?}"))
}

/// Bot `name`'s messages in `t`.
fn by<'a>(t: &'a [Envelope], name: &str) -> Vec<&'a Envelope> {
    t.iter()
        .filter(|e| {
            // Chat messages only: a status message a slow turn posts (a loaded machine)
            // is no reply (tests/tests/status_messages.rs tests those).
            e.author.kind == AuthorKind::Bot
                && e.author.name == name
                && e.kind == botmesh::wire::envelope::Kind::Message
        })
        .collect()
}

#[tokio::test]
async fn the_group_tools_read_post_and_ask_through_the_group() {
    // Ada's tools are called as an agent would; Bob answers mentions (offline model).
    let spec = MeshSpec::mentions_only(&["Ada", "Bob"])
        .mesh("max_asks_per_turn = 1")
        .bot("Bob", "role = \"reviewer\"\nskills = [\"code review\"]");
    let mesh = TestMesh::start(spec).await;
    let (ada, bob) = (mesh.index("Ada"), mesh.index("Bob"));

    let (status, members) = tool(&mesh, ada, None, "members", json!({})).await;
    assert_eq!(status, 200, "{members}");
    assert_eq!(
        members,
        json!({"bots": [{"name": "Bob", "role": "reviewer", "skills": ["code review"], "state": "ready"}], "people": []})
    );

    let hello = mesh.post_human(ada, "alice", "the parser is slow").await;
    let (_, read) = tool(&mesh, ada, None, "read_group", json!({})).await;
    let messages = read["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{read}");
    assert_eq!(messages[0]["id"], json!(hello));
    assert_eq!(messages[0]["from"], "alice");
    assert_eq!(messages[0]["kind"], "person");
    assert_eq!(messages[0]["text"], "the parser is slow");
    let at = messages[0]["at"].as_str().unwrap();
    assert!(
        at.len() == 24 && at.ends_with('Z') && at.as_bytes()[10] == b'T',
        "{at}"
    );
    let (_, members) = tool(&mesh, ada, None, "members", json!({})).await;
    assert_eq!(members["people"], json!([{"name": "alice"}]));

    // Refusals are made before anything is posted.
    let before = mesh.transcript(ada).await.len();
    let unknown = ask(&mesh, ada, "Zed", "hi?").await;
    assert_eq!(refused(&unknown), "unknown_colleague");
    assert!(
        unknown.1["error"].as_str().unwrap().contains("Bob"),
        "{unknown:?}"
    );
    let herself = ask(&mesh, ada, "Ada", "hi?").await;
    assert_eq!(refused(&herself), "unknown_colleague");
    let empty = tool(&mesh, ada, None, "post", json!({"text": "  "})).await;
    assert_eq!(refused(&empty), "bad_arguments");
    let (status, _) = tool(&mesh, ada, None, "ask", json!({"colleague": "Bob"})).await;
    assert_eq!(status, 400, "a missing argument");
    let (status, _) = tool(&mesh, ada, None, "nope", json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(mesh.transcript(ada).await.len(), before);

    // The ask: a message everyone sees, the colleague's answer as the result.
    let (status, answer) = tool(
        &mesh,
        ada,
        None,
        "ask",
        json!({"colleague": "bob", "question": "is the parser fix right?", "timeout_secs": 15}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["from"], "Bob");
    let t = mesh.transcript(ada).await;
    let question = by(&t, "Ada")
        .into_iter()
        .find(|e| e.text == "@Bob is the parser fix right?")
        .unwrap_or_else(|| panic!("{t:#?}"));
    let reply = t
        .iter()
        .find(|e| e.id.to_string() == answer["id"].as_str().unwrap())
        .unwrap();
    assert_eq!(reply.author.name, "Bob");
    assert_eq!(reply.reply_to, Some(question.id));
    assert_eq!(answer["answer"], json!(reply.text));
    assert_eq!((question.depth, reply.depth), (1, 2));
    // The answer was the tool's: it started no turn of Ada's (she answers mentions
    // and replies to her), so Ada posted nothing more than the question.
    let t = mesh.settle(ada, Duration::from_millis(500)).await;
    assert_eq!(by(&t, "Ada").len(), 1, "{t:#?}");

    // A progress note: posted as Ada now, seen by the colleague.
    let (status, posted) = tool(
        &mesh,
        ada,
        None,
        "post",
        json!({"text": "started, running the tests"}),
    )
    .await;
    assert_eq!(status, 200, "{posted}");
    let note = posted["id"].as_str().unwrap().to_string();
    mesh.wait_transcript(bob, WAIT, |t| t.iter().any(|e| e.id.to_string() == note))
        .await;

    // The depth rules count a tool's messages: the note continues Bob's answer
    // (depth 2) at 3, so a question now could not be answered under max_depth 3.
    let deep = ask(&mesh, ada, "Bob", "and now?").await;
    assert_eq!(refused(&deep), "depth_limit");
    // A person speaks: depth 0 again, but this "turn" has had its one ask.
    mesh.post_human(ada, "alice", "thanks both").await;
    let spent = ask(&mesh, ada, "Bob", "and now?").await;
    assert_eq!(refused(&spent), "too_many_asks");
    assert_eq!(by(&mesh.transcript(ada).await, "Ada").len(), 2);

    // wait_for_message: the oldest message addressed to Ada, once; then a timeout.
    let waiting = wait_message(&mesh, ada, 0).await;
    assert_eq!(waiting.1, json!({"timed_out": true}));
    let call = mesh
        .post_human(ada, "carol", "@Ada can you take the parser?")
        .await;
    let (status, got) = wait_message(&mesh, ada, 5).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["message"]["id"], json!(call));
    assert_eq!(got["message"]["from"], "carol");
    let again = wait_message(&mesh, ada, 1).await;
    assert_eq!(again.1, json!({"timed_out": true}), "handed out once");
    // Handing out a message began a new turn: one ask again.
    let (status, second) = ask(&mesh, ada, "Bob", "parser again?").await;
    assert_eq!(status, 200, "{second}");

    // A group's tools: another group is a group of its own.
    let (_, other) = tool(
        &mesh,
        ada,
        None,
        "read_group",
        json!({"group": "elsewhere"}),
    )
    .await;
    assert_eq!(other, json!({"messages": []}));
    let metrics = mesh.metrics(ada).await;
    assert!(
        metrics.contains(
            "botmesh_tool_calls_total{bot=\"Ada\",server=\"mesh\",tool=\"ask\",outcome=\"ok\"} 2"
        ),
        "{metrics}"
    );
    mesh.shutdown().await;
}

/// Waits (bounded) until Coder posted `n` messages that are turns' replies (not the
/// tool's: those say `why = posted`), seen at node `i`.
async fn coder_replies(mesh: &TestMesh, i: usize, n: usize) -> Vec<Envelope> {
    let replies = |t: &[Envelope]| -> Vec<Envelope> {
        by(t, "Coder")
            .into_iter()
            .filter(|e| e.why != Some(botmesh::wire::envelope::Why::Posted))
            .cloned()
            .collect()
    };
    let t = mesh
        .wait_transcript(i, WAIT, |t| replies(t).len() >= n)
        .await;
    let got = replies(&t);
    assert!(got.len() >= n, "Coder replied {} of {n}: {t:#?}", got.len());
    got
}

#[tokio::test]
async fn a_hosted_agent_asks_a_colleague_mid_turn_through_its_mesh_server() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let spec = MeshSpec::mentions_only(&["Reviewer", "Coder"])
        .mesh(&format!(
            "mcp_command = {:?}",
            botmesh_bin().display().to_string()
        ))
        .bot("Coder", &agent_table(&dir, ""));
    let mesh = TestMesh::start(spec).await;
    let (coder, reviewer) = (mesh.index("Coder"), mesh.index("Reviewer"));

    // session/new carries the `mesh` server: `botmesh mcp` for Coder and this group,
    // with a credential that opens this group's tools and nothing else.
    mesh.post_human(coder, "alice", "@Coder SESSION").await;
    let first = coder_replies(&mesh, coder, 1).await;
    let seen: Value = serde_json::from_str(&first[0].text).unwrap();
    let server = &seen["mcpServers"][0];
    assert_eq!(server["name"], "mesh", "{seen}");
    assert_eq!(
        server["command"],
        json!(botmesh_bin().display().to_string())
    );
    assert_eq!(
        server["args"],
        json!([
            "mcp",
            "--bot",
            "Coder",
            "--group",
            "demo",
            "--api",
            mesh.api(coder)
        ])
    );
    assert_eq!(server["env"][0]["name"], "BOTMESH_MCP_TOKEN");
    let token = server["env"][0]["value"].as_str().unwrap().to_string();
    assert!(token.starts_with("bmt1."), "{token}");
    let (status, _) = tool(&mesh, coder, Some(&token), "members", json!({})).await;
    assert_eq!(status, 200);
    let (status, _) = tool(
        &mesh,
        coder,
        Some(&token),
        "read_group",
        json!({"group": "other"}),
    )
    .await;
    assert_eq!(status, 403, "another group");
    let status = mesh
        .http
        .get(format!("{}/v1/transcript", mesh.api(coder)))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 403, "another endpoint");
    let status = mesh
        .http
        .post(format!("{}/v1/messages", mesh.api(coder)))
        .bearer_auth(&token)
        .json(&json!({"text": "hi", "from": "Coder"}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 403, "posting but through the tools");

    // The agent lists the tools, then asks the colleague on the other node mid-turn.
    mesh.post_human(coder, "alice", "@Coder MESH tools").await;
    let replies = coder_replies(&mesh, coder, 2).await;
    assert_eq!(
        replies[1].text,
        r#"mesh tools: ["ask", "members", "post", "read_group", "wait_for_message"]"#
    );
    let trigger = mesh
        .post_human(
            coder,
            "alice",
            r#"@Coder MESH ask {"colleague": "Reviewer", "question": "is the fix right?", "timeout_secs": 15}"#,
        )
        .await;
    let replies = coder_replies(&mesh, coder, 3).await;
    let said = replies[2]
        .text
        .strip_prefix("mesh ask: ")
        .unwrap_or_else(|| panic!("{}", replies[2].text));
    let result: Value = serde_json::from_str(said).unwrap();
    assert_eq!(result["isError"], false, "{result}");
    let answer = &result["structuredContent"];
    assert_eq!(answer["from"], "Reviewer", "{result}");
    assert_eq!(
        replies[2].reply_to.map(|r| r.to_string()),
        Some(trigger.clone())
    );

    // Everyone saw it: the question, the answer, the reply, in that order, on both nodes.
    let t = mesh
        .wait_transcript(reviewer, WAIT, |t| t.iter().any(|e| e.id == replies[2].id))
        .await;
    let question = t
        .iter()
        .position(|e| e.author.name == "Coder" && e.text == "@Reviewer is the fix right?")
        .unwrap_or_else(|| panic!("{t:#?}"));
    let reply = t
        .iter()
        .position(|e| e.id.to_string() == answer["id"].as_str().unwrap())
        .unwrap();
    assert_eq!(t[reply].reply_to, Some(t[question].id));
    assert_eq!(answer["answer"], json!(t[reply].text));
    let end = t.iter().position(|e| e.id == replies[2].id).unwrap();
    assert!(question < reply && reply < end, "{t:#?}");

    // The answer was consumed: it took no turn of Coder's, and the next prompt does
    // not bring it back as news (the stand-in echoes its prompt).
    assert_eq!(mesh.decisions(coder, "silent", "agent_busy").await, 0.0);
    mesh.post_human(coder, "alice", "@Coder thanks").await;
    let replies = coder_replies(&mesh, coder, 4).await;
    let answer_line = format!("Reviewer (bot): {}", answer["answer"].as_str().unwrap());
    let echoed = replies[3].text.strip_prefix("echo: ").unwrap_or_default();
    let prompt: Vec<&str> = echoed.lines().collect();
    assert!(!prompt.contains(&answer_line.as_str()), "{prompt:?}");
    assert_eq!(prompt.last(), Some(&"alice: @Coder thanks"), "{prompt:?}");
    let t = mesh.transcript(coder).await;
    assert!(
        t.iter()
            .any(|e| e.id.to_string() == answer["id"].as_str().unwrap()),
        "kept in the transcript"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn botmesh_mcp_serves_the_tools_to_an_outside_agent_over_stdio() {
    // The operator's token protects the API; `botmesh mcp --config` finds it through
    // api_token_env in its own environment, as an agent's MCP config passes it.
    let mut spec = MeshSpec::mentions_only(&["Ada", "Bob"]).mesh("api_token_env = \"GT_OPERATOR\"");
    spec.env.insert("GT_OPERATOR".into(), "op-token-1".into());
    let mesh = TestMesh::start(spec).await;
    let ada = mesh.index("Ada");
    let status = mesh
        .http
        .post(format!("{}/v1/messages", mesh.api(ada)))
        .bearer_auth("op-token-1")
        .json(&json!({"text": "@Ada is anyone there?", "from": "alice"}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);

    let calls = json!([
        ["members", {}],
        ["wait_for_message", {"timeout_secs": 5}],
        ["post", {"text": "here, reading the logs"}],
        ["read_group", {"limit": 2}],
        ["ask", {"colleague": "Nobody", "question": "?"}],
        ["shout", {}],
    ]);
    let out = tokio::process::Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("py/mesh_client.py"))
        .arg(calls.to_string())
        .arg(botmesh_bin())
        .args(["mcp", "--bot", "Ada", "--config"])
        .arg(&mesh.config_path)
        .env_clear()
        .env("GT_OPERATOR", "op-token-1")
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .current_dir(mesh.dir.path())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the MCP client finished")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(
        got["tools"],
        json!(["ask", "members", "post", "read_group", "wait_for_message"])
    );
    let r = got["results"].as_array().unwrap();
    assert_eq!(r[0]["structuredContent"]["bots"][0]["name"], "Bob", "{got}");
    assert_eq!(
        r[1]["structuredContent"]["message"]["text"], "@Ada is anyone there?",
        "{got}"
    );
    assert_eq!(r[2]["isError"], false, "{got}");
    let posted = r[2]["structuredContent"]["id"].as_str().unwrap();
    let read = r[3]["structuredContent"]["messages"].as_array().unwrap();
    assert_eq!(read.len(), 2, "{got}");
    assert_eq!(read[1]["id"], json!(posted));
    assert_eq!(
        (read[1]["from"].as_str(), read[1]["kind"].as_str()),
        (Some("Ada"), Some("bot"))
    );
    assert_eq!(r[4]["isError"], true, "{got}");
    assert_eq!(
        r[4]["structuredContent"]["code"], "unknown_colleague",
        "{got}"
    );
    assert_eq!(r[5]["isError"], true, "{got}");
    assert!(r[5]["text"].as_str().unwrap().contains("no tool"), "{got}");
    // The post reached the colleague like any message of Ada's.
    let bob = mesh.index("Bob");
    let seen = wait_for(
        WAIT,
        Duration::from_millis(50),
        || tool(&mesh, bob, Some("op-token-1"), "read_group", json!({})),
        |(_, read)| {
            read["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["id"] == posted))
        },
    )
    .await;
    assert_eq!(seen.0, 200, "{seen:?}");
    assert!(
        seen.1["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == posted),
        "{seen:?}"
    );

    // Without the token the node refuses, and the tool says so.
    let out = tokio::process::Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("py/mesh_client.py"))
        .arg(json!([["members", {}]]).to_string())
        .arg(botmesh_bin())
        .args(["mcp", "--bot", "Ada", "--config"])
        .arg(&mesh.config_path)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .current_dir(mesh.dir.path())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .unwrap()
        .unwrap();
    let got: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(got["results"][0]["isError"], true, "{got}");
    assert!(
        got["results"][0]["text"].as_str().unwrap().contains("401"),
        "{got}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_external_bots_mentions_wait_for_its_outside_agent_and_the_node_never_answers() {
    let spec = MeshSpec::mentions_only(&["Ada", "Bob"]).bot("Ada", "agent = { external = true }");
    let mesh = TestMesh::start(spec).await;
    let (ada, bob) = (mesh.index("Ada"), mesh.index("Bob"));
    let health = mesh.health(ada).await.1;
    assert_eq!(
        health["agent"],
        json!({"external": true, "attached": false, "waiting_messages": 0})
    );
    let (_, members) = tool(&mesh, ada, None, "members", json!({})).await;
    assert_eq!(
        members["you"],
        json!({"name": "Ada", "agent": "external", "attached": false})
    );

    // A mention waits in the queue; the node takes no turn (`silent/external_agent`).
    let asked = mesh.post_human(bob, "alice", "@Ada what broke?").await;
    mesh.wait_transcript(ada, WAIT, |t| t.iter().any(|e| e.id.to_string() == asked))
        .await;
    let decided = wait_for(
        WAIT,
        Duration::from_millis(50),
        || mesh.decisions(ada, "silent", "external_agent"),
        |n| *n >= 1.0,
    )
    .await;
    assert_eq!(decided, 1.0);
    assert_eq!(mesh.health(ada).await.1["agent"]["waiting_messages"], 1);
    let (_, got) = wait_message(&mesh, ada, 5).await;
    assert_eq!(got["message"]["id"], json!(asked));
    let health = mesh.health(ada).await.1;
    assert_eq!(
        health["agent"],
        json!({"external": true, "attached": true, "waiting_messages": 0})
    );
    // The outside agent answers by posting as Ada.
    let (status, posted) = tool(
        &mesh,
        ada,
        None,
        "post",
        json!({"text": "the parser", "reply_to": asked}),
    )
    .await;
    assert_eq!(status, 200, "{posted}");
    let t = mesh.settle(bob, Duration::from_millis(500)).await;
    let ada_said: Vec<&str> = by(&t, "Ada").iter().map(|e| e.text.as_str()).collect();
    assert_eq!(ada_said, ["the parser"], "only the agent's post");
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_built_in_model_asks_a_colleague_with_group_tools() {
    use botmesh_tests::fake_llm::{FakeLlm, Script, Seen};
    // Ada's model (group_tools) asks Bob through the tool; Bob's model answers "Paris".
    let llm = FakeLlm::start(|seen: &Seen| {
        if !seen.tools().iter().any(|t| t == "ask") {
            return Script::reply("Paris");
        }
        match seen.tool_results().first() {
            None => Script::tool_call(
                "call-ask-1",
                "ask",
                json!({"colleague": "Bob", "question": "what is the capital of France?"}),
            ),
            Some((_, result)) => Script::reply(format!("Bob says: {result}")),
        }
    })
    .await;
    let spec = MeshSpec::mentions_only(&["Ada", "Bob"])
        .llm(&llm.base_url)
        .mesh(&format!(
            "mcp_command = {:?}",
            botmesh_bin().display().to_string()
        ))
        .bot("Ada", "group_tools = true\nwrite_early = false");
    let mesh = TestMesh::start(spec).await;
    let (ada, bob) = (mesh.index("Ada"), mesh.index("Bob"));
    let trigger = mesh
        .post_human(ada, "alice", "@Ada ask Bob the capital")
        .await;
    let t = mesh
        .wait_transcript(bob, WAIT, |t| by(t, "Ada").len() >= 2)
        .await;
    let ada_said = by(&t, "Ada");
    assert_eq!(ada_said.len(), 2, "{t:#?}");
    assert_eq!(ada_said[0].text, "@Bob what is the capital of France?");
    let answer = by(&t, "Bob")
        .into_iter()
        .find(|e| e.reply_to == Some(ada_said[0].id))
        .unwrap_or_else(|| panic!("Bob answered the question: {t:#?}"));
    assert_eq!(answer.text, "Paris");
    assert_eq!(ada_said[1].reply_to.map(|r| r.to_string()), Some(trigger));
    assert!(
        ada_said[1].text.starts_with("Bob says: ")
            && ada_said[1].text.contains("\"answer\":\"Paris\""),
        "{}",
        ada_said[1].text
    );
    // Ada's model was offered the three group tools (its group named by the node).
    let offered: Vec<Vec<String>> = llm
        .requests()
        .iter()
        .map(|s| {
            let mut t = s.tools();
            t.sort();
            t
        })
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(offered[0], ["ask", "members", "read_group"], "{offered:?}");
    // Bob's answer was the tool's: no second turn of Ada's.
    let t = mesh.settle(ada, Duration::from_millis(500)).await;
    assert_eq!(by(&t, "Ada").len(), 2, "{t:#?}");
    mesh.shutdown().await;
}
