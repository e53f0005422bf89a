//! Turn-taking end to end: real nodes, a scripted OpenAI-compatible LLM.

use std::time::Duration;

use botmesh::wire::envelope::Envelope;
use botmesh_tests::fake_llm::{BotLlm, FakeLlm, Script};
use botmesh_tests::transcript::bot_authored;
use botmesh_tests::{
    bot_message, bot_of, decisions, fetch_json, is_judge, metric, wait_for, ClaimProxy, MeshSpec,
    SignedRequest, TestMesh,
};

const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";

/// Bots `names` on `llm`, with the short reply delays ([`FAST`]): the mesh most tests
/// here start from, written once.
fn fast_mesh(names: &[&str], llm: &FakeLlm) -> MeshSpec {
    MeshSpec::new(names).llm(&llm.base_url).all_bots(FAST)
}

#[tokio::test]
async fn two_bots_mentioning_each_other_stop_at_max_depth() {
    let llm = BotLlm::judging(true, 0.9)
        .replies(|bot| {
            let other = if bot == "A" { "B" } else { "A" };
            format!("@{other}, what do you think?")
        })
        .start()
        .await;
    let mesh =
        TestMesh::start(fast_mesh(&["A", "B"], &llm).mesh("max_depth = 3\nllm_threshold = 1"))
            .await;
    mesh.post_human(0, "alice", "@A kick this off please").await;
    let t = mesh.settle(1, Duration::from_secs(3)).await;
    let bots = bot_authored(&t);
    assert_eq!(
        bots.len(),
        3,
        "exactly max_depth bot messages: {:#?}",
        t.iter()
            .map(|e| (&e.author.name, e.depth, &e.text))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        bots.iter().map(|e| e.depth).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(
        bots.iter()
            .map(|e| e.author.name.as_str())
            .collect::<Vec<_>>(),
        vec!["A", "B", "A"]
    );
    // B saw depth 3 and refused by rule, without asking the LLM.
    let m = mesh.metrics(1).await;
    assert_eq!(decisions(&m, "silent", "max_depth"), 1.0, "{m}");
    mesh.shutdown().await;
}

/// A scripted LLM: Hi judges the human's question at 0.9, Mid at 0.6 (when
/// `mid_speaks`), any other bot declines; nobody interjects on bot messages; replies
/// name their bot.
fn hi_and_mid(mid_speaks: bool) -> BotLlm {
    let llm = BotLlm::judging(false, 0.1)
        .judging_only("New from alice:")
        .judge("Hi", true, 0.9)
        .replies(|bot| format!("answer from {bot}"));
    if mid_speaks {
        llm.judge("Mid", true, 0.6)
    } else {
        llm
    }
}

async fn one_interjection_from_the_most_relevant(drop_claims: bool) {
    let llm = hi_and_mid(true).start().await;
    let proxy = ClaimProxy::dropping().await;
    let mut spec = fast_mesh(&["Hi", "Mid", "Low"], &llm);
    if drop_claims {
        // Every envelope to Mid goes through the proxy, which swallows claims:
        // Mid must yield because of Hi's reply itself.
        spec = spec.bot("Mid", &format!("bridge_url = \"{}\"", proxy.url));
    }
    let mesh = TestMesh::start(spec).await;
    proxy.forward_to(&mesh.bridge(1));
    mesh.post_human(2, "alice", "How should we shard the transcript files?")
        .await;
    let t = mesh.settle(2, Duration::from_secs(2)).await;
    let bots = bot_authored(&t);
    assert_eq!(
        bots.len(),
        1,
        "exactly one interjection: {:?}",
        bots.iter().map(|e| &e.author.name).collect::<Vec<_>>()
    );
    assert_eq!(bots[0].author.name, "Hi");
    assert_eq!(bots[0].text, "answer from Hi");
    assert_eq!(bots[0].depth, 1);
    let m = mesh.metrics(1).await;
    let reason = if drop_claims {
        "already_answered"
    } else {
        "better_claim"
    };
    assert_eq!(decisions(&m, "yield", reason), 1.0, "{m}");
    if drop_claims {
        assert!(
            proxy.claims.load(std::sync::atomic::Ordering::SeqCst) >= 1,
            "the claim was really swallowed"
        );
    }
    // The others passed on the question (one yielded, one declined), so the winner's
    // answer to it costs them no judge call.
    let judged_answer = llm
        .requests()
        .iter()
        .filter(|s| {
            is_judge(s)
                && s.messages
                    .iter()
                    .any(|(_, c)| c.contains("New from Hi (bot):"))
        })
        .count();
    assert_eq!(judged_answer, 0);
    // The winner wrote its reply; a bot that wrote while waiting (its board showed no
    // better claim yet, or none ever reached it) threw its text away or had the
    // request cancelled, and says so in its metrics.
    let replies = llm.reply_bots();
    assert_eq!(
        replies.iter().filter(|b| *b == "Hi").count(),
        1,
        "{replies:?}"
    );
    assert!(
        replies.iter().all(|b| b == "Hi" || b == "Mid"),
        "{replies:?}"
    );
    let mid_wrote = replies.iter().filter(|b| *b == "Mid").count() as f64;
    let mid_discarded: f64 = m
        .lines()
        .filter(|l| l.starts_with("botmesh_replies_discarded_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(mid_discarded, mid_wrote, "{m}");
    if drop_claims {
        // Nothing told Mid of Hi's claim: it wrote while waiting, then Hi's answer
        // made it yield.
        assert_eq!(mid_wrote, 1.0, "{replies:?}");
    }
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_most_relevant_bot_interjects_and_the_other_yields_to_its_claim() {
    one_interjection_from_the_most_relevant(false).await;
}

#[tokio::test]
async fn with_the_claim_lost_in_transit_the_reply_itself_makes_the_other_yield() {
    one_interjection_from_the_most_relevant(true).await;
}

/// Hi and Mid ([`hi_and_mid_llm`]), Hi's link to Mid holding claims for `hold`;
/// `hi` adds lines to Hi's settings.
async fn hi_and_mid_with_held_claims(
    mid_speaks: bool,
    hold: Duration,
    hi: &str,
) -> (FakeLlm, ClaimProxy, TestMesh) {
    // Mid's judge answers 300 ms after Hi's: Hi has claimed by the time Mid's claim
    // reaches it, so Hi answers it plainly (not `judging`) and Mid does not wait for
    // Hi's held claim.
    let llm = hi_and_mid(mid_speaks)
        .judge_after("Mid", Duration::from_millis(300))
        .start()
        .await;
    let proxy = ClaimProxy::holding(hold).await;
    let mesh = TestMesh::start(
        fast_mesh(&["Hi", "Mid"], &llm)
            .bot("Hi", hi)
            .route("Hi", "Mid", &proxy.url),
    )
    .await;
    proxy.forward_to(&mesh.bridge(1));
    (llm, proxy, mesh)
}

#[tokio::test]
async fn a_late_claim_makes_no_second_answer_the_acknowledgement_says_answered() {
    // Hi's link to Mid holds every request carrying a claim for 1.5 s: Hi's claim
    // reaches Mid long after Mid's own wait (460 ms), and Hi's reply queued behind it
    // too. Without acknowledgements Hi (190 ms) and Mid would both post.
    let (_llm, proxy, mesh) =
        hi_and_mid_with_held_claims(true, Duration::from_millis(1500), "").await;
    let q = mesh
        .post_human(1, "alice", "How should we shard the transcript files?")
        .await;
    let answers = |t: &[Envelope]| -> Vec<String> {
        t.iter()
            .filter(|e| e.reply_to.map(|r| r.to_string()) == Some(q.clone()))
            .map(|e| e.author.name.clone())
            .collect()
    };
    // Wait until Hi's claim has been through the proxy and Hi has decided.
    wait_for(
        Duration::from_secs(10),
        Duration::from_millis(25),
        || async {
            mesh.decisions(0, "yield_writing", "already_answered").await
                + mesh.decisions(0, "post", "claim_unacked").await
                > 0.0
                || answers(&mesh.transcript(0).await).iter().any(|a| a == "Hi")
        },
        |decided| *decided,
    )
    .await;
    let at_mid = mesh.settle(1, Duration::from_secs(2)).await;
    let at_hi = mesh.settle(0, Duration::from_secs(1)).await;
    assert_eq!(
        answers(&at_mid),
        vec!["Mid".to_string()],
        "exactly one interjection: Mid committed first, Hi's late claim was told so"
    );
    assert_eq!(answers(&at_hi), vec!["Mid".to_string()]);
    assert!(proxy.claims.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert_eq!(
        mesh.decisions(0, "yield_writing", "already_answered").await,
        1.0,
        "Hi wrote its reply, then its claim's acknowledgement said Mid answers"
    );
    assert_eq!(mesh.decisions(0, "post", "claim_unacked").await, 0.0);
    assert!(
        mesh.node(0).node.acks.is_empty(),
        "tracking ends with the turn"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_claim_never_acknowledged_in_time_still_posts_and_counts_it() {
    // Hi's claim to Mid is held far longer than Hi's claim_ack_timeout_ms.
    let (_llm, proxy, mesh) =
        hi_and_mid_with_held_claims(false, Duration::from_secs(4), "claim_ack_timeout_ms = 200")
            .await;
    mesh.post_human(1, "alice", "How should we shard the transcript files?")
        .await;
    let t = mesh
        .wait_transcript(0, Duration::from_secs(20), |t| {
            t.iter().any(|e| e.author.name == "Hi")
        })
        .await;
    let hi_answers: Vec<&Envelope> = t.iter().filter(|e| e.author.name == "Hi").collect();
    assert_eq!(hi_answers.len(), 1, "Hi posts after the timeout: {t:?}");
    assert_eq!(hi_answers[0].text, "answer from Hi");
    assert_eq!(
        mesh.decisions(0, "post", "claim_unacked").await,
        1.0,
        "the post without every acknowledgement is counted"
    );
    assert!(proxy.claims.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_mention_is_answered_even_when_the_judge_says_no_and_nobody_answers_itself() {
    let llm = BotLlm::judging(false, 0.0)
        .replies(|bot| format!("here is {bot}"))
        .start()
        .await;
    let mesh = TestMesh::start(fast_mesh(&["A", "B"], &llm)).await;
    mesh.post_human(0, "alice", "@B can you check the logs?")
        .await;
    let t = mesh.settle(0, Duration::from_secs(2)).await;
    let bots = bot_authored(&t);
    assert_eq!(bots.len(), 1);
    assert_eq!(
        (bots[0].author.name.as_str(), bots[0].text.as_str()),
        ("B", "here is B")
    );
    assert_eq!(bots[0].why, Some(botmesh::wire::envelope::Why::Mentioned));
    // A bot's own message mentioning itself gets no answer from it.
    let before = llm.count();
    let r = mesh
        .http
        .post(format!("{}/v1/messages", mesh.api(0)))
        .json(&serde_json::json!({"text": "@A note to self", "from": "A"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let t = mesh.settle(0, Duration::from_secs(1)).await;
    assert_eq!(bot_authored(&t).len(), 2, "only the note itself");
    let asked_for_a: Vec<_> = llm.requests()[before..]
        .iter()
        .filter(|s| bot_of(s) == "A")
        .cloned()
        .collect();
    assert!(
        asked_for_a.is_empty(),
        "A asked its LLM about its own message"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn llm_down_or_hanging_means_silence_a_healthy_node_and_a_counted_failure() {
    for (script, label) in [(Script::Status(500), "http_5xx"), (Script::Hang, "timeout")] {
        let llm = FakeLlm::start(move |_| script.clone()).await;
        let mesh = TestMesh::start(
            MeshSpec::new(&["A", "B"])
                .llm_with(&llm.base_url, "timeout_ms = 400")
                .all_bots(FAST),
        )
        .await;
        mesh.post_human(0, "alice", "@B are you there?").await;
        mesh.post_human(0, "alice", "anyone know about sharding?")
            .await;
        let metrics_b = wait_for(
            Duration::from_secs(10),
            Duration::from_millis(50),
            || mesh.metrics(1),
            |m| {
                metric(
                    m,
                    &format!("botmesh_llm_calls_total{{purpose=\"reply\",result=\"{label}\"}}"),
                ) >= 1.0
            },
        )
        .await;
        assert!(
            metric(
                &metrics_b,
                &format!("botmesh_llm_calls_total{{purpose=\"reply\",result=\"{label}\"}}")
            ) >= 1.0,
            "{label}: {metrics_b}"
        );
        assert!(decisions(&metrics_b, "silent", "reply_failed") >= 1.0);
        let t = mesh.settle(1, Duration::from_millis(800)).await;
        assert!(bot_authored(&t).is_empty(), "{label}: nobody spoke");
        for i in 0..2 {
            assert_eq!(mesh.health(i).await.0, 200);
        }
        mesh.shutdown().await;
        llm.shutdown().await;
    }
}

#[tokio::test]
async fn acknowledgements_from_bots_get_no_reply_and_no_llm_call() {
    let llm = BotLlm::judging(true, 1.0)
        .replies(|_| "sure".into())
        .start()
        .await;
    let mesh = TestMesh::start(fast_mesh(&["A", "B"], &llm)).await;
    for (i, text) in ["好的", "thanks!", "收到", "ok 👍"].iter().enumerate() {
        let env = bot_message("B", text, 1 + (i as u32 % 2));
        let (s, _) = SignedRequest::new(&mesh.signers[1], &env, 0)
            .send(&mesh.http, &mesh.bridge(0))
            .await;
        assert_eq!(s, 200);
    }
    let t = mesh.settle(0, Duration::from_secs(1)).await;
    assert_eq!(t.len(), 4);
    assert_eq!(llm.count(), 0, "no LLM call for acknowledgements");
    let m = mesh.metrics(0).await;
    assert_eq!(decisions(&m, "silent", "acknowledgement"), 4.0, "{m}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_humans_only_bot_ignores_bot_messages() {
    let llm = BotLlm::judging(true, 1.0)
        .replies(|bot| format!("from {bot}"))
        .start()
        .await;
    let mesh =
        TestMesh::start(fast_mesh(&["A", "B"], &llm).bot("A", "reply_to = \"humans\"")).await;
    let env = bot_message("B", "@A what do you think about the parser?", 1);
    SignedRequest::new(&mesh.signers[1], &env, 0)
        .send(&mesh.http, &mesh.bridge(0))
        .await;
    let t = mesh.settle(0, Duration::from_secs(1)).await;
    assert_eq!(bot_authored(&t).len(), 1, "A stayed silent");
    assert!(llm.requests().iter().all(|s| bot_of(s) != "A"));
    let m = mesh.metrics(0).await;
    assert_eq!(decisions(&m, "silent", "ignores_bots"), 1.0);
    // A human's mention is still answered.
    mesh.post_human(1, "alice", "@A and you?").await;
    let t = mesh.settle(0, Duration::from_secs(1)).await;
    assert!(bot_authored(&t).iter().any(|e| e.author.name == "A"));
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_group_rate_cap_holds_when_the_llm_always_says_speak() {
    let llm = BotLlm::judging(true, 0.9)
        .replies(|bot| {
            // Every reply hands over to the next bot, so only the cap can end the chain.
            let next = match bot {
                "A" => "B",
                "B" => "C",
                _ => "A",
            };
            format!("more thoughts from {bot}. @{next} what do you think?")
        })
        .start()
        .await;
    let spec = MeshSpec::new(&["A", "B", "C"])
        .llm(&llm.base_url)
        .mesh("max_depth = 50\nllm_threshold = 1\nbot_messages_per_minute = 4")
        .all_bots("min_delay_ms = 50\nmax_delay_ms = 300\njitter_ms = 0");
    let mesh = TestMesh::start(spec).await;
    mesh.post_human(0, "alice", "let's brainstorm names for the project")
        .await;
    let t = mesh.settle(0, Duration::from_secs(3)).await;
    let bots = bot_authored(&t);
    assert_eq!(
        bots.len(),
        4,
        "the cap: {:?}",
        bots.iter()
            .map(|e| (&e.author.name, e.depth))
            .collect::<Vec<_>>()
    );
    // A new human message opens a new allowance.
    mesh.post_human(1, "bob", "and a logo?").await;
    let t = mesh.settle(0, Duration::from_secs(3)).await;
    assert_eq!(bot_authored(&t).len(), 8);
    mesh.shutdown().await;
}

#[tokio::test]
async fn quiet_switch_and_explain() {
    let llm = BotLlm::judging(true, 0.8)
        .replies(|_| "hi".into())
        .start()
        .await;
    let mesh = TestMesh::start(fast_mesh(&["A", "B"], &llm).bot("A", "aliases = [\"小A\"]")).await;
    let explain = |body: serde_json::Value| {
        fetch_json(
            mesh.http
                .post(format!("{}/v1/explain", mesh.api(0)))
                .json(&body),
        )
    };
    let e = explain(serde_json::json!({"text": "问@小A吧", "from": "alice"})).await;
    assert_eq!(
        (
            e["mentioned"].as_bool(),
            e["action"].as_str(),
            e["reason"].as_str()
        ),
        (Some(true), Some("reply"), Some("mentioned"))
    );
    let e = explain(serde_json::json!({"text": "any ideas on caching?", "from": "alice"})).await;
    assert_eq!(e["action"], "judge");
    assert!(e["judge_prompt"]
        .as_str()
        .unwrap()
        .contains("any ideas on caching?"));
    assert!(e["verdict"].is_null(), "no LLM call unless asked");
    assert_eq!(llm.count(), 0);
    let e = explain(
        serde_json::json!({"text": "any ideas on caching?", "from": "alice", "call_llm": true}),
    )
    .await;
    assert_eq!(e["verdict"]["relevance"], 0.8);
    assert_eq!(e["delay_ms"], 280);
    let e = explain(serde_json::json!({"text": "@A go on", "from": "B", "depth": 3})).await;
    assert_eq!(
        (e["action"].as_str(), e["reason"].as_str()),
        (Some("silent"), Some("max_depth"))
    );

    let r = mesh
        .http
        .post(format!("{}/v1/quiet", mesh.api(0)))
        .json(&serde_json::json!({"quiet": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    mesh.post_human(1, "alice", "@A are you there?").await;
    let t = mesh.settle(0, Duration::from_secs(1)).await;
    assert!(bot_authored(&t).is_empty(), "quiet bot stayed quiet");
    let e = explain(serde_json::json!({"text": "@A hi"})).await;
    assert_eq!(e["reason"], "quiet");
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_server_that_refuses_json_schema_still_gets_judged_without_it() {
    // llama-cpp-python's server answers 500 to `response_format: json_schema`.
    let bots = BotLlm::judging(true, 0.9).replies(|_| "an answer".into());
    let llm = FakeLlm::start(move |s| {
        if s.body["response_format"]["type"] == "json_schema" {
            Script::Raw {
                status: 500,
                headers: vec![],
                body: "{\"error\":{\"message\":\"1 validation error: ('body', 'response_format', 'type') Input should be 'text' or 'json_object'\"}}".into(),
            }
        } else {
            bots.answer(s)
        }
    })
    .await;
    let mesh =
        TestMesh::start(fast_mesh(&["A", "B"], &llm).bot("B", "participation = \"mentions\""))
            .await;
    mesh.post_human(1, "alice", "what is a good sharding key?")
        .await;
    let t = mesh.settle(0, Duration::from_secs(2)).await;
    assert_eq!(
        bot_authored(&t)
            .iter()
            .map(|e| e.text.as_str())
            .collect::<Vec<_>>(),
        vec!["an answer"]
    );
    // A second question goes straight to the fallback form.
    let refused_before = llm
        .requests()
        .iter()
        .filter(|s| s.body["response_format"]["type"] == "json_schema")
        .count();
    mesh.post_human(1, "alice", "and the replication factor?")
        .await;
    let t = mesh.settle(0, Duration::from_secs(2)).await;
    assert_eq!(bot_authored(&t).len(), 2);
    let refused_after = llm
        .requests()
        .iter()
        .filter(|s| s.body["response_format"]["type"] == "json_schema")
        .count();
    assert_eq!(
        refused_before, refused_after,
        "no second try with the schema"
    );
    // The fallback asks for a JSON object with the same schema (what llama-cpp-python takes).
    let last_judge = llm.requests().into_iter().rfind(is_judge).expect("judged");
    assert_eq!(last_judge.body["response_format"]["type"], "json_object");
    assert_eq!(
        last_judge.body["response_format"]["schema"],
        botmesh::llm::verdict_schema()
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn when_the_winners_reply_fails_it_withdraws_and_the_next_best_answers() {
    let llm = hi_and_mid(true)
        .reply_with("Hi", Script::Status(500))
        .start()
        .await;
    let mesh = TestMesh::start(fast_mesh(&["Hi", "Mid", "Low"], &llm)).await;
    mesh.post_human(2, "alice", "How should we shard the transcript files?")
        .await;
    let t = mesh.settle(2, Duration::from_secs(3)).await;
    let bots = bot_authored(&t);
    assert_eq!(
        bots.iter()
            .map(|e| (e.author.name.as_str(), e.text.as_str()))
            .collect::<Vec<_>>(),
        vec![("Mid", "answer from Mid")],
        "exactly one answer, from the next best bot"
    );
    let hi = mesh.metrics(0).await;
    assert_eq!(decisions(&hi, "silent", "reply_failed"), 1.0, "{hi}");
    assert_eq!(decisions(&hi, "withdraw", "claim"), 1.0, "{hi}");
    let mid = mesh.metrics(1).await;
    assert_eq!(
        decisions(&mid, "resume", "claim_withdrawn"),
        1.0,
        "Mid stood by behind Hi's claim and re-entered: {mid}"
    );
    assert_eq!(decisions(&mid, "yield", "better_claim"), 0.0);
    // Mid waited for Hi's claim, not for a fresh delay, and judged only once.
    let mid_judged = llm.judge_bots().iter().filter(|b| *b == "Mid").count();
    assert_eq!(mid_judged, 1);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_message_to_everyone_gets_an_answer_from_each_relevant_bot_in_order() {
    let llm = BotLlm::judging(false, 0.1)
        .judge("A", true, 0.9)
        .judge("B", true, 0.6)
        .judge("C", true, 0.4)
        .replies(|bot| format!("my view, from {bot}"))
        .start()
        .await;
    let mesh = TestMesh::start(fast_mesh(&["A", "B", "C", "D"], &llm)).await;
    mesh.post_human(3, "老师", "大家都说说对这个新架构方案的看法")
        .await;
    let t = mesh.settle(3, Duration::from_secs(3)).await;
    let bots = bot_authored(&t);
    assert_eq!(
        bots.iter()
            .map(|e| e.author.name.as_str())
            .collect::<Vec<_>>(),
        vec!["A", "B", "C"],
        "each bot with something to say, staggered by relevance (D declined)"
    );
    assert!(bots.iter().all(|e| e.depth == 1));
    // The round's answers are not triggers of their own: no judge call about them.
    let judges = llm.judge_bots().len();
    assert_eq!(judges, 4, "one judge call per bot, about the question only");
    let m = mesh.metrics(2).await;
    assert_eq!(decisions(&m, "judge", "everyone_asked"), 1.0, "{m}");

    // An ordinary question in the same group still gets one answer.
    mesh.post_human(3, "老师", "这个方案的瓶颈在哪里？").await;
    let t = mesh.settle(3, Duration::from_secs(3)).await;
    assert_eq!(bot_authored(&t).len(), 4, "one more answer, not three");
    assert_eq!(bot_authored(&t)[3].author.name, "A");
    mesh.shutdown().await;
}

/// Four bots, all judging 0.8, a cap of two bot messages: "@all" from a human, and the
/// transcript once things settle.
async fn round_under_a_cap_of_two(jitter_ms: u64) -> (FakeLlm, TestMesh, Vec<Envelope>) {
    let llm = BotLlm::judging(true, 0.8)
        .replies(|bot| format!("my risk, from {bot}"))
        .start()
        .await;
    let mesh = TestMesh::start(
        MeshSpec::new(&["A", "B", "C", "D"])
            .llm(&llm.base_url)
            .mesh("max_depth = 3\nllm_threshold = 1\nbot_messages_per_minute = 2")
            .all_bots(&format!(
                "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = {jitter_ms}"
            )),
    )
    .await;
    mesh.post_human(0, "dana", "@all name one risk for the launch")
        .await;
    let t = mesh.settle(0, Duration::from_secs(3)).await;
    (llm, mesh, t)
}

#[tokio::test]
async fn a_round_to_everyone_still_stops_at_the_group_rate_cap() {
    let (_llm, mesh, t) = round_under_a_cap_of_two(300).await;
    assert_eq!(bot_authored(&t).len(), 2, "the cap holds in a round too");
    mesh.shutdown().await;
}

/// Equal relevance and no jitter: all four finish writing at the same moment, before
/// any answer has arrived anywhere. The cap still holds, because each bot counts the
/// answers due from the bots whose claims go first (ties go to the smaller name).
#[tokio::test]
async fn a_round_where_everyone_finishes_at_once_still_stops_at_the_cap() {
    let (llm, mesh, t) = round_under_a_cap_of_two(0).await;
    let mut who: Vec<&str> = bot_authored(&t)
        .iter()
        .map(|e| e.author.name.as_str())
        .collect();
    who.sort();
    assert_eq!(
        who,
        ["A", "B"],
        "the two whose claims go first, and no one else"
    );
    // All four wrote an answer: C and D were stopped by the last check, not earlier.
    let mut writers = llm.reply_bots();
    writers.sort();
    assert_eq!(writers, ["A", "B", "C", "D"]);
    for i in [2, 3] {
        assert!(mesh.decisions(i, "silent", "rate_cap").await >= 1.0);
    }
    mesh.shutdown().await;
}

/// Starts `names` with `delays` on `llm`, has alice ask the shard question at the last
/// node and waits until its transcript is quiet for `quiet_secs`.
async fn ask_the_question(
    llm: &FakeLlm,
    names: &[&str],
    delays: &str,
    quiet_secs: u64,
) -> TestMesh {
    let spec = MeshSpec::new(names).llm(&llm.base_url).all_bots(delays);
    let mesh = TestMesh::start(spec).await;
    let last = names.len() - 1;
    mesh.post_human(last, "alice", "How should we shard the transcript files?")
        .await;
    mesh.settle(last, Duration::from_secs(quiet_secs)).await;
    mesh
}

/// The bots that spoke, in order, in node `i`'s transcript.
async fn speakers(mesh: &TestMesh, i: usize) -> Vec<String> {
    bot_authored(&mesh.transcript(i).await)
        .iter()
        .map(|e| e.author.name.clone())
        .collect()
}

/// Hi is the most relevant (0.9) but its judge is slow (1.5 s); Mid (0.6) judges at
/// once, waits its 0.5 s and writes its reply while waiting. Without Hi's word Mid
/// would post long before Hi even claims. Mid's claim reaches Hi while Hi's judge is
/// out, so Hi answers it `judging`; Mid then waits for Hi's word — Hi's better claim —
/// and stands by, and Hi answers first and alone.
#[tokio::test]
async fn a_slow_judge_on_the_most_relevant_bot_still_answers_first() {
    let llm = hi_and_mid(true)
        .judge_after("Hi", Duration::from_millis(1500))
        .start()
        .await;
    let delays = "min_delay_ms = 300\nmax_delay_ms = 800\njitter_ms = 0";
    let mesh = ask_the_question(&llm, &["Hi", "Mid", "Low"], delays, 3).await;
    assert_eq!(
        speakers(&mesh, 2).await,
        vec!["Hi"],
        "only the most relevant bot answers, though its judge was the slowest"
    );
    let hi = mesh.metrics(0).await;
    let mid = mesh.metrics(1).await;
    // Hi told Mid it was still judging (no extra message: the answer to Mid's claim).
    assert!(
        mid.lines().any(
            |l| l.starts_with("botmesh_decisions_total{action=\"yield_writing\"")
                || l.starts_with("botmesh_decisions_total{action=\"yield\"")
        ),
        "Mid yielded: {mid}"
    );
    assert_eq!(
        metric(
            &mid,
            "botmesh_decisions_total{action=\"post\",reason=\"judge_word_missing\"}"
        ),
        0.0,
        "Hi's word came in time: {mid}"
    );
    assert_eq!(
        metric(
            &hi,
            "botmesh_decisions_total{action=\"withdraw\",reason=\"after_judging\"}"
        ),
        0.0,
        "Hi claimed, so it owed no withdrawal"
    );
    mesh.shutdown().await;
}

/// Low's judge is out when Mid's claim arrives and then declines: Low owes Mid its
/// word and sends a withdrawal, so Mid does not wait out `judge_word_timeout_ms`.
#[tokio::test]
async fn a_slow_judge_that_declines_sends_its_word_and_the_claimant_goes_on() {
    let llm = BotLlm::judging(false, 0.2)
        .judging_only("New from alice:")
        .judge("Mid", true, 0.6)
        .judge_after("Low", Duration::from_millis(1200))
        .replies(|bot| format!("answer from {bot}"))
        .start()
        .await;
    let delays =
        "min_delay_ms = 200\nmax_delay_ms = 400\njitter_ms = 0\njudge_word_timeout_ms = 60000";
    // Settles within 2 s, far less than the 60 s word timeout: Low's withdrawal
    // released Mid.
    let mesh = ask_the_question(&llm, &["Mid", "Low"], delays, 2).await;
    assert_eq!(speakers(&mesh, 1).await, vec!["Mid"]);
    let low = mesh.metrics(1).await;
    let mid = mesh.metrics(0).await;
    assert_eq!(
        metric(
            &low,
            "botmesh_decisions_total{action=\"withdraw\",reason=\"after_judging\"}"
        ),
        1.0,
        "{low}\n--- Mid:\n{mid}"
    );
    mesh.shutdown().await;
}

/// How many of `llm`'s requests about alice's message were shared judge calls, own
/// judge calls and replies.
fn calls_by_kind(llm: &FakeLlm) -> (usize, usize, usize) {
    let seen: Vec<_> = llm
        .requests()
        .into_iter()
        .filter(|s| {
            s.messages.iter().any(|(_, c)| {
                c.contains("New from alice:") || c.contains("to this message from alice:")
            })
        })
        .collect();
    let shared = seen
        .iter()
        .filter(|s| botmesh_tests::shared_judge_bots(s).is_some())
        .count();
    let own = seen.iter().filter(|s| is_judge(s)).count();
    (shared, own, seen.len() - shared - own)
}

#[tokio::test]
async fn a_shared_judge_asks_once_for_the_whole_mesh() {
    let llm = hi_and_mid(true).start().await;
    let mesh = TestMesh::start(
        fast_mesh(&["Hi", "Mid", "Low"], &llm)
            .mesh("judge = \"shared\"\nverdict_timeout_ms = 5000"),
    )
    .await;
    mesh.post_human(2, "alice", "How should we shard the transcript files?")
        .await;
    let t = mesh.settle(2, Duration::from_secs(2)).await;
    let bots = bot_authored(&t);
    assert_eq!(
        bots.iter()
            .map(|e| e.author.name.as_str())
            .collect::<Vec<_>>(),
        vec!["Hi"],
        "one interjection, from the most relevant bot"
    );
    let (shared, own, replies) = calls_by_kind(&llm);
    assert_eq!(shared, 1, "one judge call for the whole mesh");
    assert_eq!(own, 0, "no bot asked its own judge");
    assert!(
        (1..=2).contains(&replies),
        "Hi's reply (and at most Mid's early one, thrown away): {replies}"
    );
    // Exactly one node sent the verdict; every bot that judged applied it.
    let mut sent = 0.0;
    for i in 0..3 {
        let m = mesh.metrics(i).await;
        sent += decisions(&m, "verdict", "sent");
        assert_eq!(decisions(&m, "judge", "shared_verdict_late"), 0.0, "{m}");
    }
    assert_eq!(sent, 1.0);
    let hi = mesh.metrics(0).await;
    assert_eq!(decisions(&hi, "judge", "interject_check"), 1.0, "{hi}");
    let low = mesh.metrics(2).await;
    assert_eq!(decisions(&low, "silent", "judge_declined"), 1.0, "{low}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn when_the_shared_judge_call_fails_every_bot_judges_itself_at_once() {
    let base = hi_and_mid(false);
    let llm = FakeLlm::start(move |seen| {
        if botmesh_tests::shared_judge_bots(seen).is_some() {
            Script::Status(500)
        } else {
            base.answer(seen)
        }
    })
    .await;
    // A long verdict timeout: only the empty verdict can make the bots judge soon.
    let mesh = TestMesh::start(
        fast_mesh(&["Hi", "Mid", "Low"], &llm)
            .mesh("judge = \"shared\"\nverdict_timeout_ms = 30000"),
    )
    .await;
    mesh.post_human(0, "alice", "How should we shard the transcript files?")
        .await;
    let hi = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            let t = mesh.transcript(1).await;
            bot_authored(&t).first().map(|e| e.author.name.clone())
        },
        Option::is_some,
    )
    .await;
    assert_eq!(hi.as_deref(), Some("Hi"));
    let (shared, own, _) = calls_by_kind(&llm);
    assert!(
        (1..=2).contains(&shared),
        "the shared call (and its retry): {shared}"
    );
    assert_eq!(own, 3, "then each bot its own judge");
    let mut failed = 0.0;
    for i in 0..3 {
        failed += decisions(&mesh.metrics(i).await, "verdict", "failed");
    }
    assert_eq!(failed, 1.0);
    mesh.shutdown().await;
}

/// The requests about alice's question: (drafting calls, own judge calls, reply calls).
fn drafting_calls(llm: &FakeLlm) -> (usize, usize, usize) {
    let about: Vec<_> = llm
        .requests()
        .into_iter()
        .filter(|s| s.messages.iter().any(|(_, c)| c.contains("alice")))
        .collect();
    let drafts = about.iter().filter(|s| botmesh_tests::is_draft(s)).count();
    let judges = about.iter().filter(|s| is_judge(s)).count();
    (drafts, judges, about.len() - drafts - judges)
}

#[tokio::test]
async fn a_drafting_judge_answers_with_one_call_per_bot() {
    let llm = hi_and_mid(true).start().await;
    let mesh =
        TestMesh::start(fast_mesh(&["Hi", "Mid", "Low"], &llm).all_bots("judge_drafts = true"))
            .await;
    // What the drafting bot would send, before anything is asked.
    let explained = fetch_json(
        mesh.http
            .post(format!("{}/v1/explain", mesh.api(0)))
            .json(&serde_json::json!({"text": "any ideas on caching?", "from": "alice"})),
    )
    .await;
    let prompt = explained["judge_prompt"].as_str().unwrap_or_default();
    assert!(
        prompt.contains("Now reply, as Hi") && prompt.contains("But first decide"),
        "explain shows the drafting prompt: {explained}"
    );
    mesh.post_human(2, "alice", "How should we shard the transcript files?")
        .await;
    let t = mesh.settle(2, Duration::from_secs(2)).await;
    let bots = bot_authored(&t);
    assert_eq!(
        bots.iter()
            .map(|e| (e.author.name.as_str(), e.text.as_str()))
            .collect::<Vec<_>>(),
        vec![("Hi", "answer from Hi")],
        "one interjection, the most relevant bot's draft, without its verdict line"
    );
    let (drafts, judges, replies) = drafting_calls(&llm);
    assert_eq!(
        (drafts, judges, replies),
        (3, 0, 0),
        "one drafting call per bot, and no other call"
    );
    assert!(
        llm.requests()
            .iter()
            .filter(|s| botmesh_tests::is_draft(s))
            .all(|s| s
                .messages
                .last()
                .is_some_and(|(_, c)| c.contains("But first decide"))),
        "every streamed call is a drafting prompt: the judge question after the reply's"
    );
    for i in 0..3 {
        let m = mesh.metrics(i).await;
        assert_eq!(
            metric(
                &m,
                "botmesh_llm_calls_total{purpose=\"draft\",result=\"ok\"}"
            ),
            1.0,
            "{m}"
        );
    }
    let hi = mesh.metrics(0).await;
    assert_eq!(decisions(&hi, "judge", "interject_check"), 1.0, "{hi}");
    // Mid spoke too, at 0.6: its draft was dropped or thrown away, never posted.
    let mid = mesh.metrics(1).await;
    assert_eq!(decisions(&mid, "yield", "better_claim"), 1.0, "{mid}");
    let low = mesh.metrics(2).await;
    assert_eq!(decisions(&low, "silent", "judge_declined"), 1.0, "{low}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_drafting_bot_behind_a_better_claim_cancels_its_draft_and_the_slow_winner_still_answers()
{
    // Every draft pauses 2 s after its verdict line; Mid's verdict comes 300 ms after
    // Hi's, when Hi's claim is already on Mid's board: Mid drops its call at once.
    let llm = hi_and_mid(true)
        .judge_after("Mid", Duration::from_millis(300))
        .drafts_pausing(Duration::from_secs(2))
        .start()
        .await;
    let mesh =
        TestMesh::start(fast_mesh(&["Hi", "Mid", "Low"], &llm).all_bots("judge_drafts = true"))
            .await;
    mesh.post_human(2, "alice", "How should we shard the transcript files?")
        .await;
    let t = mesh.settle(2, Duration::from_secs(3)).await;
    let bots = bot_authored(&t);
    assert_eq!(
        bots.iter()
            .map(|e| (e.author.name.as_str(), e.text.as_str()))
            .collect::<Vec<_>>(),
        vec![("Hi", "answer from Hi")],
        "the most relevant bot answers, with the draft it went on writing"
    );
    assert_eq!(drafting_calls(&llm), (3, 0, 0));
    let streams = llm.streams();
    assert_eq!(
        streams.len(),
        3,
        "every drafting call streamed: {streams:?}"
    );
    assert_eq!(
        streams.iter().filter(|s| s.abandoned).count(),
        1,
        "Mid let go of its draft before it was written: {streams:?}"
    );
    let mid = mesh.metrics(1).await;
    assert_eq!(
        metric(
            &mid,
            "botmesh_replies_discarded_total{result=\"draft_dropped\"}"
        ),
        1.0,
        "{mid}"
    );
    assert_eq!(decisions(&mid, "yield", "better_claim"), 1.0, "{mid}");
    mesh.shutdown().await;
}
