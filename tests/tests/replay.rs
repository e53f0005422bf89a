//! `botmesh replay`: a real node records a conversation (transcript + verdict log)
//! with the scripted LLM over HTTP; after it stops, the replay with other settings
//! says exactly which interjections change, without calling the LLM when the judge
//! prompt is unchanged.

use std::collections::BTreeSet;
use std::time::Duration;

use botmesh::app::replay::{replay, LlmMode, ReplayOptions, ReplayReport};
use botmesh_tests::fake_llm::{verdict, FakeLlm, Script, Seen};
use botmesh_tests::{is_draft, is_judge, wait_for, MeshSpec, TestMesh};

/// The relevance the scripted judge gives the message being judged: the `[r=X]` tag
/// on its "New from" line (the context lines carry tags too, so only that line counts).
fn tagged_relevance(seen: &Seen) -> Option<f64> {
    let prompt = seen.messages.last()?.1.clone();
    let line = prompt.lines().find(|l| l.starts_with("New from"))?;
    let tag = line.split("[r=").nth(1)?.split(']').next()?;
    tag.parse().ok()
}

/// The scripted LLM: judge calls answer `speak` at the tagged relevance, replies "ok";
/// a drafting call answers both, the verdict on the first line.
async fn scripted_llm() -> FakeLlm {
    FakeLlm::start(|seen: &Seen| {
        if is_draft(seen) {
            match tagged_relevance(seen) {
                Some(r) => Script::reply(format!("{{\"speak\": true, \"relevance\": {r}}}\nok")),
                None => Script::reply("{\"speak\": false, \"relevance\": 0}"),
            }
        } else if is_judge(seen) {
            match tagged_relevance(seen) {
                Some(r) => verdict(true, r),
                None => verdict(false, 0.0),
            }
        } else {
            Script::reply("ok")
        }
    })
    .await
}

/// Relevances of the human messages Ada judges, in order (min_relevance 0.3 then).
const RELEVANCES: [f64; 7] = [0.1, 0.25, 0.3, 0.5, 0.65, 0.7, 0.9];

/// Records a conversation at Ada's node and stops it. Returns the mesh (stopped), the
/// LLM, and the ids of the tagged messages with their relevance, and the mention's id.
async fn record_conversation() -> (TestMesh, FakeLlm, Vec<(String, f64)>, String) {
    let (mut mesh, llm, tagged, mention) = record_running().await;
    mesh.stop(mesh.index("Ada")).await;
    (mesh, llm, tagged, mention)
}

/// [`record_conversation`], leaving the nodes running.
async fn record_running() -> (TestMesh, FakeLlm, Vec<(String, f64)>, String) {
    record_running_with("").await
}

/// [`record_running`] with `extra` lines in Ada's entry.
async fn record_running_with(extra: &str) -> (TestMesh, FakeLlm, Vec<(String, f64)>, String) {
    let llm = scripted_llm().await;
    let spec = MeshSpec::new(&["Ada", "Bob"])
        .llm(&llm.base_url)
        .bot(
            "Ada",
            "role = \"engineer\"\nskills = [\"rust\"]\nmin_delay_ms = 0\nmax_delay_ms = 100\njitter_ms = 0",
        )
        .bot("Ada", extra)
        .bot("Bob", "participation = \"mentions\"");
    let mesh = TestMesh::start(spec).await;
    let ada = mesh.index("Ada");
    let mut tagged = Vec::new();
    // One message at a time, each settled before the next, so no wait is cut short by
    // a newer message (that would be a re-judge, another story).
    for (k, r) in RELEVANCES.iter().enumerate() {
        let id = mesh
            .post_human(
                ada,
                "carol",
                &format!("question {k} about the build [r={r}]"),
            )
            .await;
        let speaks = *r >= 0.3;
        let declined_before = tagged.iter().filter(|(_, r)| *r < 0.3).count() as f64;
        let settled = wait_for(
            Duration::from_secs(10),
            Duration::from_millis(20),
            || async {
                let t = mesh.transcript(ada).await;
                let declined = mesh.decisions(ada, "silent", "judge_declined").await;
                if speaks {
                    t.iter().any(|e| {
                        e.author.name == "Ada"
                            && e.reply_to.map(|p| p.to_string()) == Some(id.clone())
                    })
                } else {
                    declined > declined_before
                }
            },
            |done| *done,
        )
        .await;
        assert!(settled, "Ada did not settle message {k} (relevance {r})");
        tagged.push((id, *r));
    }
    let mention = mesh
        .post_human(ada, "carol", "@Ada can you look at the release notes?")
        .await;
    let answered = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || mesh.transcript(ada),
        |t| {
            t.iter().any(|e| {
                e.author.name == "Ada" && e.reply_to.map(|p| p.to_string()) == Some(mention.clone())
            })
        },
    )
    .await;
    assert!(answered
        .iter()
        .any(|e| e.reply_to.map(|p| p.to_string()) == Some(mention.clone())));
    (mesh, llm, tagged, mention)
}

fn options(mesh: &TestMesh, sets: &[&str]) -> ReplayOptions {
    ReplayOptions {
        config: mesh.config_path.clone(),
        bot: "Ada".into(),
        transcript: None,
        group: Some("demo".into()),
        data_dir: None,
        verdicts: None,
        sets: sets.iter().map(|s| s.to_string()).collect(),
        judge_prompt_file: None,
        llm: LlmMode::Recorded,
        // Anything not in the log would be asked of the scripted LLM: its count shows it.
        fallback: LlmMode::Live,
        show_prompt: false,
        env: Vec::new(),
    }
}

/// The ids of the tagged messages whose relevance is within `range`.
fn tagged_within(tagged: &[(String, f64)], range: std::ops::Range<f64>) -> BTreeSet<String> {
    tagged
        .iter()
        .filter(|(_, r)| range.contains(r))
        .map(|(id, _)| id.clone())
        .collect()
}

fn ids(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

#[tokio::test]
async fn a_higher_min_relevance_drops_exactly_the_interjections_between_the_thresholds_with_no_llm_call(
) {
    let (mesh, llm, tagged, mention) = record_conversation().await;
    let calls_recorded = llm.count();
    assert_eq!(
        llm.requests().iter().filter(|s| is_judge(s)).count(),
        RELEVANCES.len(),
        "one judge call per tagged message while recording"
    );

    // Unchanged settings: the replay agrees with what happened, from the log alone.
    let same: ReplayReport = replay(&options(&mesh, &[])).await.expect("replay");
    let s = &same.summary;
    assert_eq!(s.messages, RELEVANCES.len() + 1, "{s:?}");
    assert!(
        s.now_speaks.is_empty() && s.no_longer_speaks.is_empty(),
        "{s:?}"
    );
    assert_eq!(
        (s.judge_calls, s.reused, s.asked, s.guessed),
        (7, 7, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.verdict_records, RELEVANCES.len());
    assert_eq!(s.speaks_then, 6, "5 interjections and the mention: {s:?}");

    // min_relevance 0.3 → 0.7: the interjections at 0.3, 0.5 and 0.65 drop out.
    let higher = replay(&options(&mesh, &["min_relevance=0.7"]))
        .await
        .expect("replay");
    let expected = tagged_within(&tagged, 0.3..0.7);
    assert_eq!(expected.len(), 3);
    assert_eq!(ids(&higher.summary.no_longer_speaks), expected);
    assert!(higher.summary.now_speaks.is_empty());
    assert_eq!(higher.summary.reused, 7);
    assert_eq!(higher.summary.asked + higher.summary.guessed, 0);
    assert_eq!(llm.count(), calls_recorded, "the replay called the LLM");

    // Each row says then and now; the dropped ones were claims, now declines.
    for row in &higher.messages {
        if expected.contains(&row.id) {
            assert_eq!(row.then.action.as_deref(), Some("claim"), "{row:?}");
            assert_eq!(row.then.reason.as_deref(), Some("interjected"), "{row:?}");
            assert!(row.then.delay_ms.is_some(), "{row:?}");
            assert_eq!(row.now.action, "silent", "{row:?}");
            assert_eq!(row.now.reason, "judge_declined", "{row:?}");
            assert_eq!(row.now.verdict, Some("recorded"));
            assert_eq!(row.now.relevance, row.then.relevance);
            assert_eq!(row.change, Some("no_longer_speaks"));
        }
        if row.id == mention {
            assert!(!row.then.record, "a mention is not judged: {row:?}");
            assert_eq!(row.then.action.as_deref(), Some("reply"), "{row:?}");
            assert_eq!(row.now.action, "reply", "{row:?}");
            assert_eq!(row.now.reason, "mentioned", "{row:?}");
        }
    }
    // Delays move with the delay settings, from the same recorded verdicts.
    let slower = replay(&options(&mesh, &["max_delay_ms=1000"]))
        .await
        .expect("replay");
    let top = slower
        .messages
        .iter()
        .find(|r| r.now.relevance == Some(0.5))
        .expect("the 0.5 message");
    assert_eq!(top.now.delay_ms, Some(500), "{top:?}");
    assert_eq!(slower.summary.reused, 7);
    assert_eq!(llm.count(), calls_recorded);

    // A lower threshold brings the 0.25 message in.
    let lower = replay(&options(&mesh, &["min_relevance=0.2"]))
        .await
        .expect("replay");
    let r025: BTreeSet<String> = tagged
        .iter()
        .filter(|(_, r)| *r == 0.25)
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(ids(&lower.summary.now_speaks), r025);
    assert_eq!(llm.count(), calls_recorded);
}

#[tokio::test]
async fn a_drafting_bots_verdicts_replay_from_the_log_with_no_llm_call() {
    let (mut mesh, llm, tagged, _) = record_running_with("judge_drafts = true").await;
    mesh.stop(mesh.index("Ada")).await;
    let requests = llm.requests();
    assert_eq!(
        requests.iter().filter(|s| is_draft(s)).count(),
        RELEVANCES.len(),
        "one drafting call per tagged message while recording"
    );
    assert_eq!(requests.iter().filter(|s| is_judge(s)).count(), 0);
    let calls_recorded = llm.count();
    let same = replay(&options(&mesh, &[])).await.expect("replay");
    let s = &same.summary;
    assert_eq!(
        (s.judge_calls, s.reused, s.asked, s.guessed),
        (7, 7, 0, 0),
        "the drafting calls' verdicts are in the log, under their prompt: {s:?}"
    );
    assert!(
        s.now_speaks.is_empty() && s.no_longer_speaks.is_empty(),
        "{s:?}"
    );
    let higher = replay(&options(&mesh, &["min_relevance=0.7"]))
        .await
        .expect("replay");
    let expected = tagged_within(&tagged, 0.3..0.7);
    assert_eq!(ids(&higher.summary.no_longer_speaks), expected);
    assert_eq!(llm.count(), calls_recorded, "the replay called the LLM");
}

#[tokio::test]
async fn a_new_judge_prompt_is_asked_anew_or_guessed_and_bad_settings_are_named() {
    let (mesh, llm, _tagged, _mention) = record_conversation().await;
    let before = llm.count();
    let prompt = mesh.dir.path().join("judge.txt");
    std::fs::write(
        &prompt,
        "You are {name}, {role}.\nRecent:\n{context}\nNew from {from}: {message}\nJSON {\"speak\":bool,\"relevance\":0-1}.",
    )
    .unwrap();

    let mut opts = options(&mesh, &[]);
    opts.judge_prompt_file = Some(prompt.clone());
    opts.show_prompt = true;
    let live = replay(&opts).await.expect("replay");
    let s = &live.summary;
    assert_eq!((s.judge_calls, s.reused, s.asked), (7, 0, 7), "{s:?}");
    assert_eq!(llm.count(), before + 7, "each changed prompt asked once");
    // The scripted judge answers the new prompt as before: no decision changes.
    assert!(
        s.now_speaks.is_empty() && s.no_longer_speaks.is_empty(),
        "{s:?}"
    );
    let shown = live.messages[0]
        .now
        .prompt
        .as_deref()
        .expect("--show-prompt");
    assert!(shown.starts_with("You are Ada, engineer."), "{shown}");
    assert_eq!(live.messages[0].now.verdict, Some("live"));

    // Offline fallback: guessed, no call.
    opts.fallback = LlmMode::Offline;
    let guessed = replay(&opts).await.expect("replay");
    assert_eq!(
        (
            guessed.summary.reused,
            guessed.summary.asked,
            guessed.summary.guessed
        ),
        (0, 0, 7)
    );
    assert_eq!(llm.count(), before + 7);

    // `--llm offline` guesses everything even with the prompt unchanged.
    let mut off = options(&mesh, &[]);
    off.llm = LlmMode::Offline;
    let offline = replay(&off).await.expect("replay");
    assert_eq!((offline.summary.reused, offline.summary.guessed), (0, 7));

    for (set, named) in [
        ("min_relevanse=0.7", "min_relevanse"),
        ("min_relevance=lots", "min_relevance"),
        ("min_relevance=1.5", "must be within 0..1"),
        ("min_relevance", "KEY=VALUE"),
    ] {
        let err = replay(&options(&mesh, &[set])).await.expect_err(set);
        let err = format!("{err:#}");
        assert!(err.contains(named), "--set {set}: {err}");
    }
    // Copies taken elsewhere: --transcript and --verdicts, no data folder needed.
    let data = mesh.dir.path().join("data").join("Ada");
    let copies = tempfile::tempdir().unwrap();
    let (t, v) = (copies.path().join("t.jsonl"), copies.path().join("v.jsonl"));
    std::fs::copy(data.join("transcripts/demo.jsonl"), &t).unwrap();
    std::fs::copy(data.join("verdicts/demo.jsonl"), &v).unwrap();
    let mut copied = options(&mesh, &["min_relevance=0.7"]);
    copied.group = None;
    copied.transcript = Some(t);
    copied.verdicts = Some(v);
    copied.data_dir = Some(copies.path().join("nothing-here"));
    let from_copies = replay(&copied).await.expect("replay of copies");
    assert_eq!(from_copies.group, "demo");
    assert_eq!(from_copies.summary.no_longer_speaks.len(), 3);
    assert_eq!(from_copies.summary.reused, 7);

    let mut missing = options(&mesh, &[]);
    missing.group = Some("nowhere".into());
    let err = replay(&missing)
        .await
        .expect_err("no such group")
        .to_string();
    assert!(err.contains("nowhere") && err.contains("demo"), "{err}");
    assert_eq!(llm.count(), before + 7);
}

#[tokio::test]
async fn the_cli_prints_then_and_now_and_fails_clearly_on_a_bad_setting() {
    let (mesh, llm, tagged, _mention) = record_conversation().await;
    let before = llm.count();
    let run = |args: &[&str]| {
        std::process::Command::new(botmesh_tests::botmesh_bin())
            .arg("replay")
            .args(["--bot", "Ada", "--config"])
            .arg(&mesh.config_path)
            .args(args)
            .env_remove("BOTMESH_LOG")
            .output()
            .expect("run botmesh replay")
    };
    let json = run(&[
        "--group",
        "demo",
        "--set",
        "min_relevance=0.7",
        "--format",
        "json",
    ]);
    assert!(
        json.status.success(),
        "{}",
        String::from_utf8_lossy(&json.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON report");
    let dropped: BTreeSet<String> = report["summary"]["no_longer_speaks"]
        .as_array()
        .expect("list")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let expected = tagged_within(&tagged, 0.3..0.7);
    assert_eq!(dropped, expected);
    assert_eq!(report["summary"]["reused"], 7);

    let text = run(&["--set", "min_relevance=0.7", "--show-prompt"]);
    assert!(text.status.success());
    let out = String::from_utf8_lossy(&text.stdout);
    println!("{out}");
    assert_eq!(out.matches("<- no longer speaks").count(), 3, "{out}");
    assert!(
        out.contains("then: claim interjected relevance=0.50"),
        "{out}"
    );
    assert!(
        out.contains("now:  silent judge_declined relevance=0.50"),
        "{out}"
    );
    assert!(
        out.contains("judge calls: 7 (7 from the verdict log, 0 asked anew"),
        "{out}"
    );
    assert!(out.contains("    | New from carol: question 3"), "{out}");

    let bad = run(&["--set", "min_relevanse=0.7"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("min_relevanse"), "{err}");
    assert_eq!(llm.count(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_asks_a_running_node_what_if_without_an_llm_call() {
    let (mesh, llm, tagged, _mention) = record_running().await;
    let ada = mesh.index("Ada");
    let before = llm.count();
    let page = botmesh_tests::fetch_text(mesh.http.get(format!("{}/", mesh.api(ada)))).await;
    assert!(page.contains("id=\"whatif-form\"") && page.contains("/v1/replay"));

    let post = |body: serde_json::Value| {
        mesh.http
            .post(format!("{}/v1/replay", mesh.api(ada)))
            .json(&body)
            .send()
    };
    let r = post(serde_json::json!({"set": ["min_relevance=0.7"], "changed_only": true}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let report: serde_json::Value = r.json().await.unwrap();
    let rows = report["messages"].as_array().expect("rows");
    let changed: BTreeSet<String> = rows
        .iter()
        .map(|r| {
            assert_eq!(r["change"], "no_longer_speaks", "{r}");
            r["id"].as_str().unwrap().to_string()
        })
        .collect();
    let expected = tagged_within(&tagged, 0.3..0.7);
    assert_eq!(changed, expected);
    assert_eq!(report["summary"]["reused"], 7, "{report}");
    assert_eq!(llm.count(), before, "the page's replay called the LLM");

    for (body, named) in [
        (
            serde_json::json!({"set": ["min_relevanse=0.7"]}),
            "min_relevanse",
        ),
        (
            serde_json::json!({"llm": "live"}),
            "botmesh replay --llm live",
        ),
        (serde_json::json!({"group": "nowhere"}), "nowhere"),
    ] {
        let r = post(body.clone()).await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let text = r.text().await.unwrap();
        assert!(text.contains(named), "{body}: {text}");
    }
    assert_eq!(llm.count(), before);

    // The panel itself, in a real browser (skipped without chromium, as browser.rs is).
    match botmesh_tests::webdriver::binaries() {
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPING the page part of the what-if test: {why}");
        }
        _ => {
            let b = botmesh_tests::webdriver::Browser::start(1280, 900)
                .await
                .expect("start chromedriver + chromium");
            b.goto(&format!("{}/", mesh.api(ada))).await.unwrap();
            b.click("#whatif summary").await.unwrap();
            b.send_keys("#whatif-set", "min_relevance=0.7")
                .await
                .unwrap();
            b.click("#whatif-form button").await.unwrap();
            let (rows, ok) = b
                .poll(
                    "return Array.from(document.querySelectorAll('#whatif-out .whatif-row')).map(r => r.className + '|' + r.textContent);",
                    Duration::from_secs(20),
                    |v| v.as_array().is_some_and(|a| a.len() == 3),
                )
                .await
                .unwrap();
            assert!(
                ok,
                "the panel lists the three dropped interjections: {rows:#}"
            );
            for row in rows.as_array().unwrap() {
                let row = row.as_str().unwrap();
                assert!(
                    row.starts_with(
                        "whatif-row no_longer_speaks|− no longer speaks on carol: question"
                    ),
                    "{row}"
                );
            }
            b.quit().await.unwrap();
        }
    }
    assert_eq!(llm.count(), before);
    mesh.shutdown().await;
}
