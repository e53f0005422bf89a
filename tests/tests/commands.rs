//! Commands from people in the chat (`/quiet`, `/resume`, `/stop`, `/why`), end to end:
//! real nodes on the local platform, the scripted LLM.

use std::time::Duration;

use botmesh::telemetry::events::Event;
use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_llm::{BotLlm, Script};
use botmesh_tests::transcript::bot_authored;
use botmesh_tests::{
    bot_of, decisions, fetch_json, is_judge, metric, wait_for, MeshSpec, TestMesh,
};

const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";

/// `botmesh_chat_commands_total{command,outcome}` in node `i`'s metrics.
async fn commands(mesh: &TestMesh, i: usize, command: &str, outcome: &str) -> f64 {
    metric(
        &mesh.metrics(i).await,
        &format!("botmesh_chat_commands_total{{command=\"{command}\",outcome=\"{outcome}\"}}"),
    )
}

/// Waits (bounded) until node `i`'s transcript holds `n` bot messages, then returns it.
async fn bot_messages(mesh: &TestMesh, i: usize, n: usize) -> Vec<Envelope> {
    wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || mesh.transcript(i),
        |t: &Vec<Envelope>| bot_authored(t).len() >= n,
    )
    .await
}

#[tokio::test]
async fn stop_during_a_wait_posts_no_answer_and_withdraws_the_claim() {
    // A interjects after a long wait (≈4 s); B declines.
    let llm = BotLlm::judging(false, 0.1)
        .judge("A", true, 0.9)
        .replies(|bot| format!("an answer from {bot}"))
        .start()
        .await;
    let mesh = TestMesh::start(
        MeshSpec::new(&["A", "B"])
            .llm(&llm.base_url)
            .bot(
                "A",
                "min_delay_ms = 4000\nmax_delay_ms = 5000\njitter_ms = 0",
            )
            .bot("B", FAST),
    )
    .await;
    let mut b_events = mesh.node(1).node.events.subscribe();
    mesh.post_human(1, "alice", "How should we cache the transcripts?")
        .await;
    // A claimed and writes its reply while it waits; B has judged (and declined).
    let seen = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { llm.requests() },
        |r| {
            r.iter().any(|s| !is_judge(s) && bot_of(s) == "A")
                && r.iter().any(|s| is_judge(s) && bot_of(s) == "B")
        },
    )
    .await;
    assert!(
        seen.iter().any(|s| !is_judge(s) && bot_of(s) == "A"),
        "A is waiting"
    );
    let calls = llm.count();
    mesh.post_human(1, "alice", "/stop").await;

    // A drops its turn and withdraws: B hears the withdrawal (a claim at relevance 0).
    let withdrawn = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match b_events.recv().await {
                Ok(Event::Claim { envelope })
                    if envelope.sender == "A" && envelope.relevance == Some(0.0) =>
                {
                    return envelope
                }
                Ok(_) => {}
                Err(e) => panic!("event stream: {e}"),
            }
        }
    })
    .await
    .expect("B heard A's withdrawal");
    assert_eq!(withdrawn.kind, botmesh::wire::envelope::Kind::Claim);
    let a = mesh.metrics(0).await;
    assert_eq!(decisions(&a, "withdraw", "stopped"), 1.0, "{a}");
    assert_eq!(decisions(&a, "silent", "stopped"), 1.0, "{a}");

    // Past A's deadline: no answer, and the command is on record on both nodes.
    tokio::time::sleep(Duration::from_secs(6)).await;
    for i in 0..2 {
        let t = mesh.transcript(i).await;
        assert!(bot_authored(&t).is_empty(), "node {i}: {t:?}");
        let stop = t.iter().find(|e| e.text == "/stop").expect("recorded");
        assert_eq!(stop.author.kind, AuthorKind::Human);
        assert_eq!(commands(&mesh, i, "stop", "applied").await, 1.0);
    }
    assert_eq!(llm.count(), calls, "the command reached no LLM");

    // Later messages are taken as usual.
    mesh.post_human(1, "alice", "@B are you there?").await;
    let t = bot_messages(&mesh, 1, 1).await;
    assert_eq!(bot_authored(&t)[0].author.name, "B");
    mesh.shutdown().await;
}

#[tokio::test]
async fn why_answers_with_the_reason_and_commands_never_reach_an_llm() {
    let llm = BotLlm::judging(false, 0.1)
        .replies(|bot| format!("answer from {bot}"))
        .start()
        .await;
    let mesh = TestMesh::start(MeshSpec::new(&["A", "B"]).llm(&llm.base_url).all_bots(FAST)).await;
    mesh.post_human(0, "alice", "@A when is the release?").await;
    bot_messages(&mesh, 1, 1).await;
    // B was not asked, so it passes on A's answer too (no judge call).
    mesh.settle(1, Duration::from_millis(500)).await;
    assert!(llm.judge_bots().is_empty(), "{:?}", llm.judge_bots());
    let calls = llm.count();

    // B did not speak on the last message (A's answer): it says why.
    let cmd = mesh.post_human(1, "alice", "/why @B").await;
    let t = bot_messages(&mesh, 0, 2).await;
    let why_b = bot_authored(&t)[1];
    assert_eq!(why_b.author.name, "B");
    assert_eq!(why_b.reply_to.map(|r| r.to_string()), Some(cmd.clone()));
    assert!(
        why_b.text.contains("A's message \"answer from A\""),
        "{}",
        why_b.text
    );
    assert!(
        why_b.text.contains("silent (passed_on_thread)"),
        "{}",
        why_b.text
    );
    assert!(why_b.text.contains("- spoke: no"), "{}", why_b.text);
    assert_eq!(why_b.depth, 3, "at max_depth: nobody answers it");

    // A did speak: mentioned, and what it said.
    mesh.post_human(0, "alice", "@A /WHY").await;
    let t = bot_messages(&mesh, 1, 3).await;
    let why_a = bot_authored(&t)[2];
    assert_eq!(why_a.author.name, "A");
    assert!(why_a.text.contains("- mentioned: yes"), "{}", why_a.text);
    assert!(why_a.text.contains("reply (mentioned)"), "{}", why_a.text);
    assert!(
        why_a.text.contains("- spoke: \"answer from A\""),
        "{}",
        why_a.text
    );
    let t = mesh.settle(0, Duration::from_millis(800)).await;
    assert_eq!(bot_authored(&t).len(), 3, "nobody answered a /why answer");
    assert_eq!(
        llm.count(),
        calls,
        "no LLM call for commands or their answers"
    );
    for i in 0..2 {
        assert_eq!(commands(&mesh, i, "why", "applied").await, 1.0);
        assert_eq!(commands(&mesh, i, "why", "not_addressed").await, 1.0);
    }

    // Commands and their answers stay out of the next prompt's context.
    mesh.post_human(1, "alice", "@A and the version number?")
        .await;
    bot_messages(&mesh, 1, 4).await;
    let reply = llm
        .requests()
        .into_iter()
        .rfind(|s| !is_judge(s) && bot_of(s) == "A")
        .expect("A's reply call");
    let prompt: String = reply.messages.iter().map(|(_, c)| c.as_str()).collect();
    assert!(
        prompt.contains("when is the release?"),
        "the conversation is there: {prompt}"
    );
    assert!(!prompt.contains("/why"), "{prompt}");
    assert!(!prompt.contains("/WHY"), "{prompt}");
    assert!(!prompt.contains("- decided:"), "{prompt}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn quiet_addressed_to_one_bot_and_resume_for_all() {
    let llm = BotLlm::judging(false, 0.1)
        .replies(|bot| format!("here, {bot}"))
        .start()
        .await;
    let mesh = TestMesh::start(MeshSpec::new(&["A", "B"]).llm(&llm.base_url).all_bots(FAST)).await;
    mesh.post_human(1, "alice", "/quiet @A").await;
    // Quiet in the group it was said in (demo), not node-wide.
    let (_, h) = wait_for(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || mesh.health(0),
        |(_, h)| h["quiet_groups"] == serde_json::json!(["demo"]),
    )
    .await;
    assert_eq!(h["quiet_groups"], serde_json::json!(["demo"]));
    assert_eq!(h["quiet"], false);
    assert_eq!(
        mesh.health(1).await.1["quiet_groups"],
        serde_json::json!([]),
        "B was not addressed"
    );
    assert_eq!(commands(&mesh, 1, "quiet", "not_addressed").await, 1.0);

    mesh.post_human(1, "alice", "@A @B roll call").await;
    bot_messages(&mesh, 1, 1).await;
    let t = mesh.settle(1, Duration::from_millis(800)).await;
    let speakers: Vec<&str> = bot_authored(&t)
        .iter()
        .map(|e| e.author.name.as_str())
        .collect();
    assert_eq!(speakers, vec!["B"], "A is quiet, B speaks");
    assert!(mesh.decisions(0, "silent", "quiet").await >= 1.0);

    mesh.post_human(0, "alice", "/resume").await;
    wait_for(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || mesh.health(0),
        |(_, h)| h["quiet_groups"] == serde_json::json!([]),
    )
    .await;
    mesh.post_human(1, "alice", "@A @B roll call again").await;
    bot_messages(&mesh, 1, 3).await;
    let t = mesh.settle(1, Duration::from_millis(800)).await;
    let mut speakers: Vec<&str> = bot_authored(&t)[1..]
        .iter()
        .map(|e| e.author.name.as_str())
        .collect();
    speakers.sort();
    assert_eq!(speakers, vec!["A", "B"], "both speak again");
    for i in 0..2 {
        assert_eq!(commands(&mesh, i, "resume", "applied").await, 1.0);
    }
    // Explain says so too: a command is carried out, never judged.
    let e = fetch_json(
        mesh.http
            .post(format!("{}/v1/explain", mesh.api(0)))
            .json(&serde_json::json!({"text": "@A /quiet", "from": "alice"})),
    )
    .await;
    assert_eq!(
        (e["action"].as_str(), e["reason"].as_str()),
        (Some("silent"), Some("command"))
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_bots_slash_text_is_ordinary_text() {
    // A answers "@B /quiet" when asked: from a person that would quiet B; from a bot it
    // is a message like any other, which B (mentioned) answers.
    let llm = BotLlm::judging(false, 0.1)
        .replies(|bot| {
            if bot == "A" {
                "@B /quiet".to_string()
            } else {
                "fine".to_string()
            }
        })
        .start()
        .await;
    let mesh = TestMesh::start(MeshSpec::new(&["A", "B"]).llm(&llm.base_url).all_bots(FAST)).await;
    mesh.post_human(0, "alice", "@A what do you say to the others?")
        .await;
    let t = bot_messages(&mesh, 1, 2).await;
    let bots = bot_authored(&t);
    assert_eq!(bots[0].text, "@B /quiet");
    assert_eq!(
        (bots[1].author.name.as_str(), bots[1].text.as_str()),
        ("B", "fine")
    );
    // A's text reached B's LLM as ordinary conversation.
    let seen = llm
        .requests()
        .into_iter()
        .filter(|s| !is_judge(s) && bot_of(s) == "B")
        .any(|s| s.messages.iter().any(|(_, c)| c.contains("/quiet")));
    assert!(seen, "B's reply prompt shows A's \"/quiet\"");
    for i in 0..2 {
        assert_eq!(mesh.health(i).await.1["quiet"], false);
        assert_eq!(
            mesh.health(i).await.1["quiet_groups"],
            serde_json::json!([])
        );
        let m = mesh.metrics(i).await;
        assert!(!m.contains("botmesh_chat_commands_total{"), "{m}");
    }
    mesh.shutdown().await;
}

#[tokio::test]
async fn stop_while_a_mentioned_bot_writes_drops_the_reply() {
    // A's reply takes 3 s to write; B is not asked.
    let llm = BotLlm::judging(false, 0.1)
        .reply_with(
            "A",
            Script::delay(Duration::from_secs(3), Script::reply("late answer")),
        )
        .start()
        .await;
    let mesh = TestMesh::start(MeshSpec::new(&["A", "B"]).llm(&llm.base_url).all_bots(FAST)).await;
    mesh.post_human(0, "alice", "@A write me a long report")
        .await;
    wait_for(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || async { llm.reply_bots() },
        |b: &Vec<String>| b.iter().any(|b| b == "A"),
    )
    .await;
    // `/stop @A` addresses A alone; B counts it as not its own.
    mesh.post_human(1, "alice", "/stop @A").await;
    wait_for(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || mesh.decisions(0, "silent", "stopped"),
        |n: &f64| *n >= 1.0,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let t = mesh.transcript(0).await;
    assert!(bot_authored(&t).is_empty(), "the reply was dropped: {t:?}");
    let a = mesh.metrics(0).await;
    assert_eq!(decisions(&a, "silent", "stopped"), 1.0, "{a}");
    assert_eq!(
        decisions(&a, "withdraw", "stopped"),
        0.0,
        "a mention reply holds no claim: {a}"
    );
    assert_eq!(commands(&mesh, 1, "stop", "not_addressed").await, 1.0);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_why_flood_gets_a_few_answers_from_the_bot_it_names_and_none_from_the_others() {
    let llm = BotLlm::judging(false, 0.1).start().await;
    let mesh = TestMesh::start(MeshSpec::new(&["A", "B"]).llm(&llm.base_url).all_bots(FAST)).await;
    // Naming no bot, in a mesh of two: nobody answers (it would be two answers).
    mesh.post_human(0, "alice", "/why").await;
    wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || commands(&mesh, 0, "why", "not_addressed"),
        |n| *n >= 1.0,
    )
    .await;
    // Twenty from one person: the burst is answered, the rest counted and dropped.
    for _ in 0..20 {
        mesh.post_human(0, "mallory", "/why @A").await;
    }
    let limited = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || commands(&mesh, 0, "why", "rate_limited"),
        |n| *n >= 17.0,
    )
    .await;
    assert_eq!(limited, 17.0);
    // Someone else still gets an answer.
    mesh.post_human(0, "carol", "/why @A").await;
    bot_messages(&mesh, 0, 4).await;
    let t = mesh.settle(0, Duration::from_millis(500)).await;
    let answers = bot_authored(&t);
    assert_eq!(answers.len(), 4, "{answers:#?}");
    assert!(answers.iter().all(|m| m.author.name == "A"));
    assert_eq!(commands(&mesh, 1, "why", "applied").await, 0.0);
}
