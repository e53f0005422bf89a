//! Reloading peers.toml in a running node (`POST /v1/reload`; SIGHUP and the CLI are in
//! process.rs) and the daily LLM budget: real nodes, the scripted LLM.

use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_llm::{BotLlm, FakeLlm};
use botmesh_tests::{decisions, fetch_json, is_judge, metric, MeshSpec, TestMesh};

/// A judge prompt that names the bot (so the scripted LLM knows whose call it is) and
/// carries a marker the test looks for.
const PROMPT_V2: &str =
    "judge_prompt = \"V2-PROMPT You are {name}. Should you speak? {message} Answer JSON.\"";

/// Rewrites the mesh's peers.toml: `from` → `to` (which must be there).
fn edit(mesh: &TestMesh, from: &str, to: &str) {
    let text = std::fs::read_to_string(&mesh.config_path).unwrap();
    assert!(text.contains(from), "{from:?} not in\n{text}");
    std::fs::write(&mesh.config_path, text.replacen(from, to, 1)).unwrap();
}

/// `POST /v1/reload` at node `i`: status and report.
async fn reload(mesh: &TestMesh, i: usize) -> (u16, serde_json::Value) {
    let r = mesh
        .http
        .post(format!("{}/v1/reload", mesh.api(i)))
        .send()
        .await
        .expect("reload");
    let status = r.status().as_u16();
    (status, r.json().await.expect("reload JSON"))
}

/// The bot's answer to message `id`, if posted.
fn answer_to<'a>(t: &'a [Envelope], id: &str) -> Option<&'a Envelope> {
    t.iter().find(|e| {
        e.author.kind == AuthorKind::Bot && e.reply_to.map(|r| r.to_string()).as_deref() == Some(id)
    })
}

/// The judge prompts the LLM received about a message containing `text`.
fn judge_prompts_about(llm: &FakeLlm, text: &str) -> Vec<String> {
    llm.requests()
        .iter()
        .filter(|s| is_judge(s))
        .map(|s| {
            s.messages
                .iter()
                .map(|(_, c)| c.as_str())
                .collect::<String>()
        })
        .filter(|p| p.contains(text))
        .collect()
}

/// Node 0's metrics once it counts `n` decisions `action`/`reason` (or 10 s passed).
async fn wait_decisions(mesh: &TestMesh, action: &str, reason: &str, n: f64) -> String {
    botmesh_tests::wait_for(
        Duration::from_secs(10),
        Duration::from_millis(25),
        || mesh.metrics(0),
        |m| decisions(m, action, reason) >= n,
    )
    .await
}

async fn answered(mesh: &TestMesh, id: &str, within: Duration) -> Option<Envelope> {
    let t = mesh
        .wait_transcript(0, within, |t| answer_to(t, id).is_some())
        .await;
    answer_to(&t, id).cloned()
}

#[tokio::test]
async fn a_reload_changes_the_delay_and_judge_prompt_between_two_messages_and_loses_nothing() {
    let llm = BotLlm::judging(true, 0.9).start().await;
    let spec = MeshSpec::new(&["A"])
        .llm(&llm.base_url)
        .all_bots("min_delay_ms = 100\nmax_delay_ms = 100\njitter_ms = 0");
    let mesh = TestMesh::start(spec).await;
    let node = mesh.node(0).node.clone();

    let first = mesh
        .post_human(0, "alice", "first question about shards")
        .await;
    assert!(
        answered(&mesh, &first, Duration::from_secs(10))
            .await
            .is_some(),
        "the first message is answered"
    );
    let before = judge_prompts_about(&llm, "first question");
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(!before[0].contains("V2-PROMPT"));

    // A 2.5 s delay and a new judge prompt, by reload.
    edit(
        &mesh,
        "min_delay_ms = 100\nmax_delay_ms = 100",
        &format!("min_delay_ms = 2500\nmax_delay_ms = 2500\n{PROMPT_V2}"),
    );
    let (status, report) = reload(&mesh, 0).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["result"], "applied");
    assert_eq!(
        report["applied"],
        serde_json::json!([
            "bots[0].judge_prompt",
            "bots[0].max_delay_ms",
            "bots[0].min_delay_ms"
        ]),
        "{report}"
    );
    assert_eq!(report["restart_required"], serde_json::json!([]));

    let second = mesh
        .post_human(0, "alice", "second question about shards")
        .await;
    // The new delay: no answer for the first second (a lower bound, which no slow
    // machine can break)…
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        answer_to(&mesh.transcript(0).await, &second).is_none(),
        "answered before the reloaded 2.5 s delay"
    );
    // …and a reload while that turn waits changes nothing for it: it finishes.
    edit(&mesh, "min_delay_ms = 2500", "min_delay_ms = 2000");
    let (status, report) = reload(&mesh, 0).await;
    assert_eq!(
        (status, &report["applied"]),
        (200, &serde_json::json!(["bots[0].min_delay_ms"]))
    );
    let reply = answered(&mesh, &second, Duration::from_secs(15)).await;
    assert!(reply.is_some(), "the message in flight was not lost");
    let after = judge_prompts_about(&llm, "second question");
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(after[0].contains("V2-PROMPT"), "{}", after[0]);

    // The same node all along; reloads counted and shown.
    assert!(std::sync::Arc::ptr_eq(&node, &mesh.node(0).node));
    let m = mesh.metrics(0).await;
    assert_eq!(
        metric(&m, "botmesh_config_reloads_total{result=\"applied\"}"),
        2.0,
        "{m}"
    );
    let (_, health) = mesh.health(0).await;
    assert_eq!(health["config_reload"]["result"], "applied", "{health}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_broken_file_is_refused_whole_and_the_old_config_keeps_serving() {
    let llm = BotLlm::judging(true, 0.9).start().await;
    let spec = MeshSpec::new(&["A"])
        .llm(&llm.base_url)
        .mesh("max_depth = 3")
        .all_bots("min_delay_ms = 100\nmax_delay_ms = 100\njitter_ms = 0");
    let mesh = TestMesh::start(spec).await;
    let good = std::fs::read_to_string(&mesh.config_path).unwrap();

    // One good change and one mistake in the same file: nothing applies.
    edit(&mesh, "max_depth = 3", "max_depth = 5");
    edit(
        &mesh,
        "min_delay_ms = 100\nmax_delay_ms = 100",
        &format!("min_delay_ms = 900\nmax_delay_ms = 100\n{PROMPT_V2}"),
    );
    // The same named error as at start.
    let at_start = botmesh::config::Settings::load(&mesh.config_path)
        .expect_err("the file is invalid")
        .to_string();
    assert!(at_start.contains("bots[0].min_delay_ms"), "{at_start}");
    let (status, report) = reload(&mesh, 0).await;
    assert_eq!(status, 422, "{report}");
    assert_eq!(report["result"], "refused");
    assert_eq!(report["error"], at_start.as_str());
    assert_eq!(report["applied"], serde_json::json!([]));

    // Visible in /healthz (still healthy: the old configuration serves) and counted.
    let (code, health) = mesh.health(0).await;
    assert_eq!(code, 200, "{health}");
    assert_eq!(health["config_reload"]["result"], "refused");
    assert_eq!(health["config_reload"]["error"], at_start.as_str());
    let m = mesh.metrics(0).await;
    assert_eq!(
        metric(&m, "botmesh_config_reloads_total{result=\"refused\"}"),
        1.0,
        "{m}"
    );
    let info = fetch_json(mesh.http.get(format!("{}/v1/info", mesh.api(0)))).await;
    assert_eq!(
        info["max_depth"], 3,
        "the good change was not applied either"
    );

    // The old config keeps serving: old prompt, old delay, answered.
    let id = mesh
        .post_human(0, "alice", "a question after the refusal")
        .await;
    assert!(answered(&mesh, &id, Duration::from_secs(10))
        .await
        .is_some());
    let prompts = judge_prompts_about(&llm, "after the refusal");
    assert!(
        prompts.len() == 1 && !prompts[0].contains("V2-PROMPT"),
        "{prompts:?}"
    );

    // A change that needs a restart is reported, not half applied.
    let moved = good.replacen(
        &format!("api = \"{}\"", mesh.apis[0]),
        "api = \"127.0.0.1:1\"",
        1,
    );
    assert_ne!(moved, good);
    std::fs::write(&mesh.config_path, moved).unwrap();
    let (status, report) = reload(&mesh, 0).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["applied"], serde_json::json!([]), "{report}");
    assert_eq!(
        report["restart_required"],
        serde_json::json!(["bots[0].api"])
    );
    let (_, health) = mesh.health(0).await;
    assert_eq!(
        health["config_reload"]["restart_required"],
        serde_json::json!(["bots[0].api"]),
        "served on the old address, and says a restart is pending"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_budget_of_n_calls_stops_judging_at_n_still_answers_mentions_and_a_raise_applies_at_once()
{
    // The judge declines everything: one call per message that is not a mention.
    let llm = BotLlm::judging(false, 0.1).start().await;
    let spec = MeshSpec::new(&["A"])
        .llm_with(&llm.base_url, "timeout_ms = 3000\ndaily_calls = 2")
        .all_bots("min_delay_ms = 50\nmax_delay_ms = 50\njitter_ms = 0");
    let mesh = TestMesh::start(spec).await;
    for n in 1..=2 {
        mesh.post_human(0, "alice", &format!("question number {n}"))
            .await;
        let m = wait_decisions(&mesh, "silent", "judge_declined", n as f64).await;
        assert_eq!(decisions(&m, "silent", "judge_declined"), n as f64, "{m}");
    }
    assert_eq!(llm.count(), 2);
    // The third message is not judged: the day's two calls are spent.
    mesh.post_human(0, "alice", "question number 3").await;
    let m = wait_decisions(&mesh, "silent", "budget", 1.0).await;
    assert_eq!(decisions(&m, "silent", "budget"), 1.0, "{m}");
    assert_eq!(llm.count(), 2, "no judge call past the budget");
    // A mention is still answered (over_budget = "mentions", the default).
    let id = mesh.post_human(0, "alice", "@A are you there?").await;
    assert!(answered(&mesh, &id, Duration::from_secs(10))
        .await
        .is_some());
    mesh.post_human(0, "alice", "question number 4").await;
    let m = wait_decisions(&mesh, "silent", "budget", 2.0).await;
    assert_eq!(
        metric(&m, "botmesh_llm_budget_exhausted_total{result=\"calls\"}"),
        1.0,
        "counted once a day: {m}"
    );
    let (_, health) = mesh.health(0).await;
    let b = &health["budget"];
    assert_eq!(
        (&b["calls"], &b["daily_calls"], &b["exhausted"]),
        (
            &serde_json::json!(3),
            &serde_json::json!(2),
            &serde_json::json!("calls")
        ),
        "two judge calls and the mention's reply: {health}"
    );
    let info = fetch_json(mesh.http.get(format!("{}/v1/info", mesh.api(0)))).await;
    assert_eq!(
        info["budget"]["exhausted"], "calls",
        "the page's source: {info}"
    );

    // Raised by reload: judging resumes with the next message.
    edit(&mesh, "daily_calls = 2", "daily_calls = 10");
    let (status, report) = reload(&mesh, 0).await;
    assert_eq!(
        (status, &report["applied"]),
        (200, &serde_json::json!(["llm.daily_calls"]))
    );
    mesh.post_human(0, "alice", "question number 5").await;
    let m = wait_decisions(&mesh, "silent", "judge_declined", 3.0).await;
    assert_eq!(decisions(&m, "silent", "judge_declined"), 3.0, "{m}");
    assert_eq!(decisions(&m, "silent", "budget"), 2.0, "{m}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_opt_in_file_watch_reloads_when_the_file_changes() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A"])).await;
    let node = mesh.node(0).node.clone();
    tokio::spawn(botmesh::app::reload::watch(node, Duration::from_millis(50)));
    // Let the watch take its first look before the file changes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    edit(
        &mesh,
        "participation = \"mentions\"",
        "participation = \"mentions\"\nquiet = true",
    );
    let info = botmesh_tests::wait_for(
        Duration::from_secs(10),
        Duration::from_millis(25),
        || fetch_json(mesh.http.get(format!("{}/v1/info", mesh.api(0)))),
        |i| i["quiet"] == true,
    )
    .await;
    assert_eq!(info["quiet"], true, "{info}");
    let (_, health) = mesh.health(0).await;
    assert_eq!(health["config_reload"]["via"], "watch", "{health}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn reload_needs_the_api_token_like_the_rest_of_the_api() {
    let mut spec = MeshSpec::mentions_only(&["A"]).mesh("api_token_env = \"RELOAD_TEST_TOKEN\"");
    spec.env
        .insert("RELOAD_TEST_TOKEN".into(), "s3cret-token".into());
    let mesh = TestMesh::start(spec).await;
    let url = format!("{}/v1/reload", mesh.api(0));
    let without = mesh.http.post(&url).send().await.unwrap().status();
    assert_eq!(without.as_u16(), 401);
    let wrong = mesh
        .http
        .post(&url)
        .bearer_auth("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let r = mesh
        .http
        .post(&url)
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let m = botmesh_tests::fetch_text(
        mesh.http
            .get(format!("{}/metrics", mesh.api(0)))
            .bearer_auth("s3cret-token"),
    )
    .await;
    assert_eq!(
        metric(&m, "botmesh_config_reloads_total{result=\"applied\"}"),
        1.0,
        "only the authorized reload ran: {m}"
    );
    mesh.shutdown().await;
}
