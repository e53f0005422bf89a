//! Who may steer the bots, end to end: `[mesh] operators`, a person's `/quiet` for
//! their own group, and names that read as a bot's (refused on the API and the
//! bridge, marked on a platform). Real nodes on 127.0.0.1, the scripted LLM, the
//! Discord stand-in, and the `botmesh` binary for what only its log shows.

use std::collections::HashMap;
use std::time::Duration;

use botmesh::wire::envelope::{Author, AuthorKind, Envelope};
use botmesh_tests::fake_discord::{BotAccount, FakeDiscord, Person};
use botmesh_tests::fake_llm::{BotLlm, FakeLlm};
use botmesh_tests::{
    bot_message, fetch_json, metric, wait_for, MeshSpec, ProcessMesh, SignedRequest, TestMesh,
};

const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";
const XIAOBA: usize = 0;
const B: usize = 1;

/// XiaoBa (alias 小八) and B on the local platform, with more `[mesh]` lines.
async fn local_mesh(llm: &FakeLlm, extra_mesh: &str) -> TestMesh {
    TestMesh::start(
        MeshSpec::new(&["XiaoBa", "B"])
            .llm(&llm.base_url)
            .mesh(extra_mesh)
            .all_bots(FAST)
            .bot("XiaoBa", "aliases = [\"小八\"]"),
    )
    .await
}

async fn answering_llm() -> FakeLlm {
    BotLlm::judging(false, 0.1)
        .replies(|bot| format!("here, {bot}"))
        .start()
        .await
}

/// Posts `text` as person `from` in `group` at node `i`: the HTTP status and answer.
async fn post(
    mesh: &TestMesh,
    i: usize,
    group: &str,
    from: &str,
    text: &str,
) -> (u16, serde_json::Value) {
    let r = mesh
        .http
        .post(format!("{}/v1/messages", mesh.api(i)))
        .json(&serde_json::json!({"group": group, "from": from, "text": text}))
        .send()
        .await
        .expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// Node `i`'s messages in `group`.
async fn transcript(mesh: &TestMesh, i: usize, group: &str) -> Vec<Envelope> {
    let v = fetch_json(mesh.http.get(format!(
        "{}/v1/transcript?group={group}&limit=500",
        mesh.api(i)
    )))
    .await;
    serde_json::from_value(v["messages"].clone()).expect("envelopes")
}

fn spoke(t: &[Envelope], bot: &str) -> usize {
    t.iter()
        .filter(|e| e.author.kind == AuthorKind::Bot && e.author.name == bot)
        .count()
}

/// Waits (bounded) until `bot` has spoken `n` times in `group` at node `i`.
async fn wait_spoken(mesh: &TestMesh, i: usize, group: &str, bot: &str, n: usize) -> Vec<Envelope> {
    wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || transcript(mesh, i, group),
        |t: &Vec<Envelope>| spoke(t, bot) >= n,
    )
    .await
}

/// `botmesh_chat_commands_total{command,outcome}` at node `i`.
async fn commands(mesh: &TestMesh, i: usize, command: &str, outcome: &str) -> f64 {
    metric(
        &mesh.metrics(i).await,
        &format!("botmesh_chat_commands_total{{command=\"{command}\",outcome=\"{outcome}\"}}"),
    )
}

/// Node `i`'s quiet switches as `/healthz` shows them: node-wide, and the groups.
async fn quiet(mesh: &TestMesh, i: usize) -> (bool, Vec<String>) {
    let h = mesh.health(i).await.1;
    let groups = serde_json::from_value(h["quiet_groups"].clone()).unwrap_or_default();
    (h["quiet"] == true, groups)
}

/// Waits (bounded) until node `i`'s quiet switches read `want`.
async fn wait_quiet(mesh: &TestMesh, i: usize, want: (bool, &[&str])) {
    let want = (
        want.0,
        want.1.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
    );
    let got = wait_for(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || quiet(mesh, i),
        |q| *q == want,
    )
    .await;
    assert_eq!(got, want, "node {i}'s quiet switches");
}

/// Waits (bounded) until node `i` has counted one `/quiet` as `not_operator`, and checks
/// that no quiet switch is on.
async fn one_quiet_not_carried_out(mesh: &TestMesh, i: usize) {
    let n = wait_for(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || commands(mesh, i, "quiet", "not_operator"),
        |n| *n == 1.0,
    )
    .await;
    assert_eq!(n, 1.0);
    assert_eq!(quiet(mesh, i).await, (false, vec![]));
}

#[tokio::test]
async fn a_persons_quiet_in_one_room_leaves_the_others_answering() {
    let llm = answering_llm().await;
    let mesh = local_mesh(&llm, "").await;
    assert_eq!(post(&mesh, B, "side", "alice", "/quiet").await.0, 200);
    for i in [XIAOBA, B] {
        wait_quiet(&mesh, i, (false, &["side"])).await;
    }
    // The main room still gets its answer…
    post(&mesh, B, "demo", "alice", "@XiaoBa are you there?").await;
    let t = wait_spoken(&mesh, B, "demo", "XiaoBa", 1).await;
    assert_eq!(spoke(&t, "XiaoBa"), 1, "XiaoBa answers in demo");
    // …the side room does not.
    post(&mesh, B, "side", "alice", "@XiaoBa and here?").await;
    wait_for(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || mesh.decisions(XIAOBA, "silent", "quiet"),
        |n| *n >= 1.0,
    )
    .await;
    mesh.settle(XIAOBA, Duration::from_millis(800)).await;
    assert_eq!(spoke(&transcript(&mesh, XIAOBA, "side").await, "XiaoBa"), 0);

    // The operator's switch: node-wide, or one group.
    let switch = |body: serde_json::Value| {
        fetch_json(
            mesh.http
                .post(format!("{}/v1/quiet", mesh.api(XIAOBA)))
                .json(&body),
        )
    };
    let r = switch(serde_json::json!({"quiet": true, "group": "ops"})).await;
    assert_eq!(
        (r["was"].as_bool(), r["group"].as_str()),
        (Some(false), Some("ops"))
    );
    assert_eq!(
        quiet(&mesh, XIAOBA).await,
        (false, vec!["ops".into(), "side".into()])
    );
    switch(serde_json::json!({"quiet": true})).await;
    assert!(quiet(&mesh, XIAOBA).await.0, "node-wide");
    let info = fetch_json(mesh.http.get(format!("{}/v1/info", mesh.api(XIAOBA)))).await;
    assert_eq!(
        (info["quiet"].as_bool(), info["quiet_groups"][1].as_str()),
        (Some(true), Some("side"))
    );
    // A person's /resume lifts their group's switch, not the operator's.
    post(&mesh, B, "side", "alice", "/resume").await;
    wait_quiet(&mesh, XIAOBA, (true, &["ops"])).await;
    wait_quiet(&mesh, B, (false, &[])).await;
    switch(serde_json::json!({"quiet": false})).await;
    switch(serde_json::json!({"quiet": false, "group": "ops"})).await;
    assert_eq!(quiet(&mesh, XIAOBA).await, (false, vec![]));
    let status = mesh
        .http
        .post(format!("{}/v1/quiet", mesh.api(XIAOBA)))
        .json(&serde_json::json!({"quiet": true, "group": ""}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 400, "an empty group is refused");
    mesh.shutdown().await;
}

#[tokio::test]
async fn with_operators_set_only_theirs_steer_and_anyone_elses_is_ordinary_text() {
    let llm = answering_llm().await;
    let mesh = local_mesh(&llm, "operators = [\"local:Boss\"]").await;
    // Not an operator: full-width, upper case, after a mention; a name like Boss's.
    post(&mesh, XIAOBA, "demo", "alice", "／QUIET").await;
    post(&mesh, XIAOBA, "demo", "alice", "@XiaoBa /quiet").await;
    post(&mesh, B, "demo", "boss", "/stop").await;
    // Ordinary text: XiaoBa, mentioned, answers it.
    let t = wait_spoken(&mesh, B, "demo", "XiaoBa", 1).await;
    let answer = t
        .iter()
        .find(|e| e.author.name == "XiaoBa")
        .expect("XiaoBa spoke");
    let asked = t
        .iter()
        .find(|e| e.text == "@XiaoBa /quiet")
        .expect("recorded");
    assert_eq!(answer.reply_to, Some(asked.id));
    for i in [XIAOBA, B] {
        // Each node counts the three as they reach it (over the bridge for the other).
        let counted = wait_for(
            Duration::from_secs(10),
            Duration::from_millis(25),
            || async {
                (
                    commands(&mesh, i, "quiet", "not_operator").await,
                    commands(&mesh, i, "stop", "not_operator").await,
                )
            },
            |c| *c == (2.0, 1.0),
        )
        .await;
        assert_eq!(counted, (2.0, 1.0), "node {i}: quiet, stop not_operator");
        assert_eq!(commands(&mesh, i, "quiet", "applied").await, 0.0);
        assert_eq!(quiet(&mesh, i).await, (false, vec![]));
    }
    // Explain agrees: the operator's is a command, anyone else's is judged as text.
    for (from, command) in [("Boss", true), ("alice", false)] {
        let e = fetch_json(
            mesh.http
                .post(format!("{}/v1/explain", mesh.api(XIAOBA)))
                .json(&serde_json::json!({"text": "@XiaoBa /quiet", "from": from})),
        )
        .await;
        assert_eq!(e["reason"] == "command", command, "{from}: {e}");
    }
    // `/why` is everyone's.
    post(&mesh, XIAOBA, "demo", "alice", "/why @B").await;
    wait_spoken(&mesh, XIAOBA, "demo", "B", 1).await;
    // The operator, on XiaoBa's page and (carried over the bridge) on B's.
    post(&mesh, B, "demo", "Boss", "/quiet").await;
    for i in [XIAOBA, B] {
        wait_quiet(&mesh, i, (false, &["demo"])).await;
    }
    post(&mesh, XIAOBA, "demo", "Boss", "/resume").await;
    for i in [XIAOBA, B] {
        wait_quiet(&mesh, i, (false, &[])).await;
        assert_eq!(commands(&mesh, i, "resume", "applied").await, 1.0);
    }
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_peer_is_believed_only_about_its_own_platforms_people_and_no_human_takes_a_bots_name() {
    let llm = answering_llm().await;
    let mesh = local_mesh(&llm, "operators = [\"discord:5005\", \"local:Mgr\"]").await;
    // B is on `local`: its word that a person is Discord's 5005 counts for nothing…
    let carried = |name: &str, person: Option<&str>, text: &str| {
        let mut env = bot_message("B", text, 0);
        env.author = Author {
            name: name.into(),
            kind: AuthorKind::Human,
        };
        env.person = person.map(str::to_string);
        SignedRequest::new(&mesh.signers[B], &env, 0)
    };
    let (s, v) = carried("Dan", Some("5005"), "/quiet")
        .send(&mesh.http, &mesh.bridge(XIAOBA))
        .await;
    assert_eq!(s, 200, "{v}");
    one_quiet_not_carried_out(&mesh, XIAOBA).await;
    // …while a local person it carries is who their name says.
    carried("Mgr", Some("5005"), "/quiet")
        .send(&mesh.http, &mesh.bridge(XIAOBA))
        .await;
    wait_quiet(&mesh, XIAOBA, (false, &["demo"])).await;

    // Over the bridge, a person named like a bot is refused and counted.
    for name in [
        "xiaoba",
        "Xiao\u{200b}Ba",
        "ＸｉａｏＢａ",
        "小八",
        "\u{2066}b\u{2069}",
    ] {
        let (s, v) = carried(name, None, "hello")
            .send(&mesh.http, &mesh.bridge(XIAOBA))
            .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (403, Some("human_named_as_bot")),
            "{name:?}: {v}"
        );
    }
    let m = mesh.metrics(XIAOBA).await;
    assert_eq!(
        metric(
            &m,
            r#"botmesh_envelopes_in_total{result="human_named_as_bot"}"#
        ),
        5.0,
        "{m}"
    );

    // On the API too, with a clear 403.
    for name in ["xiaoba", "ＸｉａｏＢａ", "Xiao\u{200b}Ba", "小八", "b"] {
        let (s, v) = post(&mesh, XIAOBA, "demo", name, "hello").await;
        assert_eq!(s, 403, "{name:?}: {v}");
        let why = v["error"].as_str().unwrap_or_default();
        assert!(why.contains("reads as bot"), "{name:?}: {why}");
    }
    assert_eq!(
        post(&mesh, XIAOBA, "demo", "Xiao Ba", "hello").await.0,
        200,
        "another name"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_discord_operator_steers_and_a_person_named_like_a_bot_is_marked() {
    const CHANNEL: &str = "1200000000000000001";
    const ADA_ID: &str = "1300000000000000001";
    const CAROL_ID: &str = "1400000000000000001";
    const DAN_ID: &str = "1400000000000000002";
    const ECHO_ID: &str = "1400000000000000003";
    let person = |id: &str, name: &str| Person {
        id: id.into(),
        username: name.to_lowercase(),
        global_name: Some(name.into()),
        nick: None,
    };
    let fake = FakeDiscord::start(
        vec![BotAccount {
            token: "ada-token".into(),
            user_id: ADA_ID.into(),
            username: "ada".into(),
        }],
        vec![
            person(CAROL_ID, "Carol"),
            person(DAN_ID, "Dan"),
            person(ECHO_ID, "ＡＤＡ"),
        ],
        &[CHANNEL],
    )
    .await;
    let llm = answering_llm().await;
    let mut spec = MeshSpec::new(&["Ada", "Loc"])
        .llm(&llm.base_url)
        .mesh(&format!("operators = [\"discord:{CAROL_ID}\"]"))
        .all_bots(FAST)
        .bot(
            "Ada",
            &format!(
                "platform = \"discord\"\ndiscord = {{ token_env = \"ADA_TOKEN\", channel_id = \"{CHANNEL}\", user_id = \"{ADA_ID}\", api_base_url = \"{}\", gateway_url = \"{}\" }}",
                fake.api_base_url, fake.gateway_url
            ),
        );
    spec.env = HashMap::from([("ADA_TOKEN".to_string(), "ada-token".to_string())]);
    let mesh = TestMesh::start(spec).await;
    fake.wait("Ada connected", |f| f.connected() == 1).await;
    const ADA: usize = 0;

    // A person whose display name reads as Ada's is shown with a marker.
    fake.say(CHANNEL, ECHO_ID, "hello from the echo");
    let t = mesh
        .wait_transcript(ADA, Duration::from_secs(10), |t| {
            t.iter().any(|e| e.text == "hello from the echo")
        })
        .await;
    let echo = t.iter().find(|e| e.text == "hello from the echo").unwrap();
    assert_eq!(
        (echo.author.name.as_str(), echo.author.kind),
        ("ＡＤＡ (discord user)", AuthorKind::Human)
    );
    assert_eq!(echo.person.as_deref(), Some(ECHO_ID));

    // Dan is no operator: his /quiet is ordinary text.
    fake.say(CHANNEL, DAN_ID, "/quiet");
    one_quiet_not_carried_out(&mesh, ADA).await;
    // Carol is, by her Discord user id.
    fake.say(CHANNEL, CAROL_ID, "/quiet");
    let (_, groups) = wait_for(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || quiet(&mesh, ADA),
        |q| !q.1.is_empty(),
    )
    .await;
    assert_eq!(groups, vec![echo.group.clone()]);
    assert_eq!(commands(&mesh, ADA, "quiet", "applied").await, 1.0);
    mesh.shutdown().await;
}

/// Bot 0's log once it says it started (its API may answer a moment before).
async fn started_log(mesh: &ProcessMesh) -> String {
    wait_for(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || async { mesh.log(0) },
        |l| l.contains("node started") && l.contains("operators"),
    )
    .await
}

#[tokio::test]
async fn without_operators_the_node_warns_at_start_and_why_logs_ids_as_text() {
    let mut open = ProcessMesh::start(&["A"], "", "").await;
    let log = started_log(&open).await;
    assert!(
        log.contains("[mesh] operators is not set: anyone in any group may /quiet, /resume and /stop this bot"),
        "{log}"
    );
    let first = open.post(0, "hello there").await.expect("posted");
    open.post(0, "/why").await.expect("posted");
    let answered = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { open.log(0) },
        |l| l.contains("answered a person's /why"),
    )
    .await;
    let line = answered
        .lines()
        .find(|l| l.contains("answered a person's /why"))
        .expect("the /why line");
    assert!(line.contains(&format!("about={first}")), "{line}");
    assert!(!line.contains("Ulid("), "{line}");
    // Anyone commands: alice's /quiet is carried out.
    open.post(0, "/quiet").await.expect("posted");
    let info = wait_for(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || fetch_json(open.http.get(format!("{}/v1/info", open.apis[0]))),
        |v| v["quiet_groups"][0] == "demo",
    )
    .await;
    assert_eq!(info["quiet_groups"][0], "demo");
    open.terminate(0);

    let mut closed = ProcessMesh::start(&["A"], "operators = [\"local:Boss\"]", "").await;
    let log = started_log(&closed).await;
    assert!(!log.contains("operators is not set"), "{log}");
    assert!(
        log.contains("only these people's /quiet, /resume and /stop are carried out"),
        "{log}"
    );
    closed.terminate(0);
}
