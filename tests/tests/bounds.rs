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
