//! Bounded resources against real nodes: how deep an envelope may be, how long an
//! author's name, how many groups a node holds and how many transcript files it keeps
//! open, and what a group's name may do to its file name.

use std::time::Duration;

use botmesh::wire::envelope::{Author, AuthorKind};
use botmesh_tests::{bot_message, fetch_json, MeshSpec, SignedRequest, TestMesh};

#[tokio::test]
async fn the_bridge_refuses_depths_past_400_and_200_kib_names_with_400_and_a_reason() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B"])).await;
    let a = mesh.bridge(0);
    for depth in [401, u32::MAX] {
        let env = bot_message("B", "deep", depth);
        let (s, v) = SignedRequest::new(&mesh.signers[1], &env, 0)
            .send(&mesh.http, &a)
            .await;
        assert_eq!(s, 400, "depth {depth}: {v}");
        assert_eq!(v["error"], "malformed", "{v}");
        let detail = v["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(&format!("depth {depth} is over 400")),
            "{detail}"
        );
    }
    // The bound itself is accepted.
    let (s, v) = SignedRequest::new(&mesh.signers[1], &bot_message("B", "at 400", 400), 0)
        .send(&mesh.http, &a)
        .await;
    assert_eq!(s, 200, "{v}");

    // A person's message carried by B, with a 200 KiB name.
    let mut env = bot_message("B", "hello", 0);
    env.author = Author {
        name: "n".repeat(200 * 1024),
        kind: AuthorKind::Human,
    };
    let (s, v) = SignedRequest::new(&mesh.signers[1], &env, 0)
        .send(&mesh.http, &a)
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("author.name is 204800 bytes, over 64")),
        "{v}"
    );
    // 64 bytes is fine.
    env.id = ulid::Ulid::new();
    env.author.name = "n".repeat(64);
    let (s, v) = SignedRequest::new(&mesh.signers[1], &env, 0)
        .send(&mesh.http, &a)
        .await;
    assert_eq!(s, 200, "{v}");
    let transcript = mesh.transcript(0).await;
    assert!(transcript.iter().all(|e| e.author.name.len() <= 64));
    assert_eq!(transcript.len(), 2, "the two accepted messages");
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_sidecar_answer_to_the_deepest_message_stays_at_the_bound() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B"])).await;
    let deep = bot_message("B", "deepest", 400);
    let (s, _) = SignedRequest::new(&mesh.signers[1], &deep, 0)
        .send(&mesh.http, &mesh.bridge(0))
        .await;
    assert_eq!(s, 200);
    let v = fetch_json(mesh.http.post(format!("{}/v1/messages", mesh.api(0))).json(
        &serde_json::json!({"text": "answering", "from": "A", "reply_to": deep.id.to_string()}),
    ))
    .await;
    assert_eq!(v["depth"], 400, "{v}");
    // B accepted it (a depth over the bound would be refused there).
    let seen = mesh
        .wait_transcript(1, Duration::from_secs(10), |t| {
            t.iter().any(|e| e.text == "answering")
        })
        .await;
    let answer = seen.iter().find(|e| e.text == "answering").expect("at B");
    assert_eq!(answer.depth, 400);
    mesh.shutdown().await;
}

/// Posts a person's message to `group` at `api`: the status and the JSON answer.
async fn post_to(
    http: &reqwest::Client,
    api: &str,
    group: &str,
    text: &str,
) -> (u16, serde_json::Value) {
    let r = http
        .post(format!("{api}/v1/messages"))
        .json(&serde_json::json!({"group": group, "text": text, "from": "alice"}))
        .send()
        .await
        .expect("post");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// The texts of `group` at `api`.
async fn texts_of(http: &reqwest::Client, api: &str, group: &str) -> Vec<String> {
    let url = reqwest::Url::parse_with_params(
        &format!("{api}/v1/transcript"),
        &[("group", group), ("limit", "100")],
    )
    .unwrap();
    let v = fetch_json(http.get(url)).await;
    v["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn a_group_past_max_groups_gets_a_clear_error_and_the_others_stay_healthy() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B"]).mesh("max_groups = 5")).await;
    let (http, api) = (&mesh.http, mesh.api(0));
    for g in 0..5 {
        let (s, v) = post_to(http, &api, &format!("team-{g}"), "hello").await;
        assert_eq!(s, 200, "{v}");
    }
    let (s, v) = post_to(http, &api, "team-5", "one group too many").await;
    assert_eq!(s, 507, "{v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("already holds 5 groups ([mesh] max_groups)"),
        "{v}"
    );
    // A peer's message that would start a group: refused for good (400), not retried.
    let mut env = bot_message("B", "from B", 1);
    env.group = "team-6".into();
    let (s, v) = SignedRequest::new(&mesh.signers[1], &env, 0)
        .send(http, &mesh.bridge(0))
        .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("too_many_groups")),
        "{v}"
    );
    // The groups the node holds carry on, over the API and the bridge.
    let (s, _) = post_to(http, &api, "team-0", "still here").await;
    assert_eq!(s, 200);
    let mut env = bot_message("B", "B in team-1", 1);
    env.group = "team-1".into();
    let (s, v) = SignedRequest::new(&mesh.signers[1], &env, 0)
        .send(http, &mesh.bridge(0))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        texts_of(http, &api, "team-0").await,
        ["hello", "still here"]
    );
    assert!(texts_of(http, &api, "team-5").await.is_empty());
    let (status, health) = mesh.health(0).await;
    assert_eq!(status, 200, "{health}");
    let m = mesh.metrics(0).await;
    assert_eq!(
        botmesh_tests::metric(&m, r#"botmesh_cache_entries{cache="transcript_groups"}"#),
        5.0,
        "{m}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn long_cjk_and_long_group_names_work_and_their_files_have_bounded_names() {
    let mut mesh = TestMesh::start(MeshSpec::mentions_only(&["A"])).await;
    let api = mesh.api(0);
    // 30 CJK characters (90 bytes, 270 percent-encoded), the longest group the API
    // takes (256 bytes), and a short name whose file keeps its older readable form.
    let cjk = "项目组".repeat(10);
    let longest = format!("{}x", "群".repeat(85));
    assert_eq!(longest.len(), 256);
    let short = "群聊 1";
    for g in [cjk.as_str(), longest.as_str(), short] {
        let (s, v) = post_to(&mesh.http, &api, g, &format!("hello {g}")).await;
        assert_eq!(s, 200, "{g}: {v}");
    }
    let (status, health) = mesh.health(0).await;
    assert_eq!(status, 200, "{health}");
    mesh.stop(0).await;
    let dir = mesh.dir.path().join("data/A/transcripts");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|f| f.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(files.iter().all(|f| f.len() <= 134), "{files:?}");
    assert!(
        files.contains(&"%E7%BE%A4%E8%81%8A%201.jsonl".to_string()),
        "{files:?}"
    );
    mesh.restart(0).await;
    for g in [cjk.as_str(), longest.as_str(), short] {
        assert_eq!(
            texts_of(&mesh.http, &mesh.api(0), g).await,
            [format!("hello {g}")],
            "{g}"
        );
    }
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_transcript_an_older_version_wrote_loads_after_restart() {
    let mut mesh = TestMesh::start(MeshSpec::mentions_only(&["A"])).await;
    mesh.stop(0).await;
    // As an older version named them: the percent-encoded group, whatever its length.
    let dir = mesh.dir.path().join("data/A/transcripts");
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for group in ["old group", &"旧群".repeat(10)] {
        let mut env = bot_message("A", &format!("from before in {group}"), 0);
        env.group = group.to_string();
        env.author = Author {
            name: "alice".into(),
            kind: AuthorKind::Human,
        };
        let encoded: String = group
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let path = dir.join(format!("{encoded}.jsonl"));
        let mut line = env.to_bytes();
        line.push(b'\n');
        std::fs::write(&path, line).unwrap();
        files.push(path);
    }
    mesh.restart(0).await;
    let api = mesh.api(0);
    for group in ["old group", &"旧群".repeat(10)] {
        let (s, v) = post_to(&mesh.http, &api, group, "after the upgrade").await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            texts_of(&mesh.http, &api, group).await,
            [
                format!("from before in {group}"),
                "after the upgrade".into()
            ]
        );
    }
    mesh.stop(0).await;
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        2,
        "each group still has one file"
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.contains("after the upgrade"), "{}", f.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eleven_hundred_groups_under_a_64_file_limit_stay_healthy() {
    use futures_util::StreamExt;
    // A node allowed 64 open files (its sockets, logs and the outbox log included)
    // holds 1,100 groups through 8 open transcript files.
    let mut mesh = botmesh_tests::ProcessMesh::configure(
        &["A"],
        "max_open_transcripts = 8",
        "participation = \"mentions\"",
    );
    mesh.open_files_limit = Some(64);
    mesh.spawn(0).await;
    let api = mesh.apis[0].clone();
    let client = mesh.http.clone();
    let http = &client;
    let statuses: Vec<(usize, u16, serde_json::Value)> = futures_util::stream::iter(0..1_100)
        .map(|g| {
            let api = api.clone();
            async move {
                let (s, v) = post_to(http, &api, &format!("room-{g}"), &format!("hi {g}")).await;
                (g, s, v)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let failed: Vec<_> = statuses
        .iter()
        .filter(|(_, s, _)| *s != 200)
        .take(3)
        .collect();
    assert!(failed.is_empty(), "{failed:?}\n{}", mesh.log(0));
    assert_eq!(mesh.health(0).await, Some(200), "{}", mesh.log(0));
    for g in (0..1_100).step_by(50) {
        assert_eq!(
            texts_of(http, &api, &format!("room-{g}")).await,
            [format!("hi {g}")]
        );
    }
    let m = mesh.metrics(0).await;
    let open = botmesh_tests::metric(
        &m,
        r#"botmesh_cache_entries{cache="transcript_files_open"}"#,
    );
    assert!((1.0..=8.0).contains(&open), "{open} transcript files open");
    assert_eq!(
        botmesh_tests::metric(&m, r#"botmesh_cache_entries{cache="transcript_groups"}"#),
        1_100.0
    );
    // After a restart (same limit) every group is read back.
    assert!(mesh.terminate(0).success());
    mesh.spawn(0).await;
    for g in [0, 549, 1_099] {
        assert_eq!(
            texts_of(http, &api, &format!("room-{g}")).await,
            [format!("hi {g}")]
        );
    }
}
