//! The bridge mesh end to end: real nodes on 127.0.0.1, real HTTP, real signatures.

use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh::wire::signing::{HmacSecret, Signer, SigningKey};
use botmesh_tests::{
    assert_metric, bot_message, fetch_json, metric, MeshSpec, Scheme, SignedRequest, TestMesh,
};

fn count(t: &[Envelope], id: &str) -> usize {
    t.iter().filter(|e| e.id.to_string() == id).count()
}

#[tokio::test]
async fn human_message_reaches_every_transcript_once_and_bot_messages_verify() {
    for scheme in [Scheme::Ed25519, Scheme::Hmac] {
        let mut spec = MeshSpec::mentions_only(&["A", "B", "C"]);
        spec.scheme = scheme;
        let mesh = TestMesh::start(spec).await;
        let id = mesh.post_human(0, "alice", "hello everyone").await;
        for i in 0..3 {
            let t = mesh
                .wait_transcript(i, Duration::from_secs(10), |t| count(t, &id) == 1)
                .await;
            assert_eq!(
                count(&t, &id),
                1,
                "{scheme:?}: node {i} has the human message exactly once"
            );
            let e = t.iter().find(|e| e.id.to_string() == id).unwrap();
            assert_eq!(
                (e.author.name.as_str(), e.author.kind, e.depth),
                ("alice", AuthorKind::Human, 0)
            );
        }
        // A bot message from A (posted by A's sidecar as A itself).
        let r =
            fetch_json(mesh.http.post(format!("{}/v1/messages", mesh.api(0))).json(
                &serde_json::json!({"text": "status: all green", "from": "A", "reply_to": id}),
            ))
            .await;
        let bot_id = r["id"].as_str().unwrap().to_string();
        assert_eq!(r["depth"], 1, "a bot answer to a human is one deeper");
        for i in 1..3 {
            let t = mesh
                .wait_transcript(i, Duration::from_secs(10), |t| count(t, &bot_id) == 1)
                .await;
            let e = t
                .iter()
                .find(|e| e.id.to_string() == bot_id)
                .expect("bot message arrived");
            assert_eq!((e.sender.as_str(), e.author.kind), ("A", AuthorKind::Bot));
        }
        // Give delivery a moment so duplicates, if any were sent, would show.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for i in 0..3 {
            let t = mesh.transcript(i).await;
            assert_eq!((count(&t, &id), count(&t, &bot_id)), (1, 1), "node {i}");
            let m = mesh.metrics(i).await;
            if i > 0 {
                assert_eq!(
                    metric(&m, r#"botmesh_envelopes_in_total{result="accepted"}"#),
                    2.0,
                    "node {i}:\n{m}"
                );
                // Per-bot keys: A's outbox adds the pairwise entry for each peer, so
                // no receiver needs an Ed25519 verification.
                let cheap = match scheme {
                    Scheme::Ed25519 => "pairwise",
                    Scheme::Hmac => "hmac",
                };
                let verified = |s: &str| {
                    metric(
                        &m,
                        &format!(r#"botmesh_signatures_verified_total{{scheme="{s}"}}"#),
                    )
                };
                assert_eq!(
                    (verified(cheap), verified("ed25519")),
                    (2.0, 0.0),
                    "node {i}: {scheme:?}\n{m}"
                );
            }
        }
        if scheme == Scheme::Ed25519 {
            // A sender that adds no pairwise entry (an older version): its `v1a`
            // signature is verified instead, and the envelope is accepted all the same.
            let old_style = SignedRequest::new(&mesh.signers[0], &bot_message("A", "hi", 1), 0);
            assert!(!old_style.signature.contains("v1,"));
            let (status, _) = old_style.send(&mesh.http, &mesh.bridge(1)).await;
            assert_eq!(status, 200);
            let m = mesh.metrics(1).await;
            assert_metric(
                &m,
                r#"botmesh_signatures_verified_total{scheme="ed25519"}"#,
                1.0,
            );
        }
        mesh.shutdown().await;
    }
}

#[tokio::test]
async fn bad_input_is_rejected_with_the_right_status_and_the_node_keeps_serving() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B", "C"])).await;
    let a = mesh.bridge(0);
    let b_signer = mesh.signers[1].clone();
    let c_signer = mesh.signers[2].clone();
    let http = &mesh.http;

    let send_raw = |headers: Vec<(&'static str, String)>, body: Vec<u8>| {
        let mut req = http.post(format!("{a}/bridge/v1/envelopes")).body(body);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        async move {
            let r = req.send().await.unwrap();
            let s = r.status().as_u16();
            (s, r.json::<serde_json::Value>().await.unwrap_or_default())
        }
    };
    let headers_for = |s: &SignedRequest| {
        vec![
            ("webhook-id", s.id.clone()),
            ("webhook-timestamp", s.timestamp.clone()),
            ("webhook-signature", s.signature.clone()),
        ]
    };

    // Forged signature: random key.
    let forged = Signer {
        pairwise: Default::default(),
        hmac: vec![],
        ed25519: vec![SigningKey::generate()],
    };
    let (s, v) = SignedRequest::new(&forged, &bot_message("B", "forged", 1), 0)
        .send(http, &a)
        .await;
    assert_eq!((s, v["error"].as_str()), (401, Some("bad_signature")));
    // Signed by another bot's key (C's key, claiming to be B).
    let (s, _) = SignedRequest::new(&c_signer, &bot_message("B", "not really B", 1), 0)
        .send(http, &a)
        .await;
    assert_eq!(s, 401);
    // The mesh HMAC secret does not help either when B has an Ed25519 key.
    let hmac = Signer {
        pairwise: Default::default(),
        hmac: vec![HmacSecret::generate()],
        ed25519: vec![],
    };
    let (s, _) = SignedRequest::new(&hmac, &bot_message("B", "hmac", 1), 0)
        .send(http, &a)
        .await;
    assert_eq!(s, 401);
    // Author claiming another bot, properly signed by B.
    let mut env = bot_message("B", "I am C", 1);
    env.author.name = "C".into();
    let (s, v) = SignedRequest::new(&b_signer, &env, 0).send(http, &a).await;
    assert_eq!((s, v["error"].as_str()), (403, Some("author_not_sender")));
    // Missing headers.
    let ok = SignedRequest::new(&b_signer, &bot_message("B", "x", 1), 0);
    for drop in 0..3 {
        let mut h = headers_for(&ok);
        h.remove(drop);
        let (s, v) = send_raw(h, ok.body.clone()).await;
        assert_eq!((s, v["error"].as_str()), (401, Some("missing_header")));
    }
    // Timestamp 301 s old and 301 s ahead; 299 s is fine.
    let (s, v) = SignedRequest::new(&b_signer, &bot_message("B", "old", 1), -301)
        .send(http, &a)
        .await;
    assert_eq!((s, v["error"].as_str()), (401, Some("stale")));
    let (s, v) = SignedRequest::new(&b_signer, &bot_message("B", "future", 1), 301)
        .send(http, &a)
        .await;
    assert_eq!((s, v["error"].as_str()), (401, Some("future")));
    let (s, _) = SignedRequest::new(&b_signer, &bot_message("B", "skewed but fine", 1), -299)
        .send(http, &a)
        .await;
    assert_eq!(s, 200);
    // A replay of a captured request: accepted once, then answered as duplicate.
    let captured = SignedRequest::new(&b_signer, &bot_message("B", "pay me once", 1), 0);
    assert_eq!(
        captured.send(http, &a).await,
        (200, serde_json::json!({"accepted": true}))
    );
    assert_eq!(
        captured.send(http, &a).await,
        (200, serde_json::json!({"duplicate": true}))
    );
    // 1 MiB body: refused from its Content-Length, before buffering.
    let big = vec![b'x'; 1024 * 1024];
    let (s, _) = send_raw(headers_for(&ok), big).await;
    assert_eq!(s, 413);
    // Malformed JSON and invalid UTF-8.
    let (s, v) = send_raw(headers_for(&ok), b"{\"id\": ".to_vec()).await;
    assert_eq!((s, v["error"].as_str()), (400, Some("malformed")));
    let mut utf = ok.body.clone();
    let pos = utf.windows(1).position(|w| w == b"x").unwrap();
    utf[pos] = 0xff;
    let (s, _) = send_raw(headers_for(&ok), utf).await;
    assert_eq!(s, 400);
    // Unknown sender.
    let stranger = Signer {
        pairwise: Default::default(),
        hmac: vec![],
        ed25519: vec![SigningKey::generate()],
    };
    let (s, v) = SignedRequest::new(&stranger, &bot_message("Mallory", "hi", 1), 0)
        .send(http, &a)
        .await;
    assert_eq!((s, v["error"].as_str()), (403, Some("unknown_sender")));
    // webhook-id not matching the body's id.
    let mut h = headers_for(&ok);
    h[0].1 = ulid::Ulid::new().to_string();
    let (s, v) = send_raw(h, ok.body.clone()).await;
    assert_eq!((s, v["error"].as_str()), (400, Some("id_mismatch")));

    // Still serving, and the replayed message is in the transcript once.
    let health = http.get(format!("{a}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let (s, _) = SignedRequest::new(&b_signer, &bot_message("B", "after the storm", 1), 0)
        .send(http, &a)
        .await;
    assert_eq!(s, 200);
    let t = mesh.transcript(0).await;
    let texts: Vec<&str> = t.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(
        texts,
        vec!["skewed but fine", "pay me once", "after the storm"]
    );
    let m = mesh.metrics(0).await;
    assert_eq!(
        metric(&m, r#"botmesh_envelopes_in_total{result="duplicate"}"#),
        1.0
    );
    assert!(
        metric(&m, r#"botmesh_envelopes_in_total{result="bad_signature"}"#) >= 3.0,
        "{m}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_peer_down_for_a_while_gets_everything_in_order_exactly_once() {
    let mut mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B", "C"])).await;
    mesh.stop(1).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(mesh.post_human(0, "alice", &format!("message {i}")).await);
    }
    // C got them all meanwhile: a dead B does not hold C up.
    let t = mesh
        .wait_transcript(2, Duration::from_secs(10), |t| t.len() == 20)
        .await;
    assert_eq!(t.len(), 20);
    // A keeps retrying B.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let m = mesh.metrics(0).await;
    assert!(
        metric(
            &m,
            r#"botmesh_envelopes_out_total{peer="B",result="retry"}"#
        ) >= 2.0,
        "{m}"
    );
    assert_eq!(metric(&m, r#"botmesh_outbox_depth{peer="B"}"#), 20.0);
    mesh.restart(1).await;
    let t = mesh
        .wait_transcript(1, Duration::from_secs(15), |t| t.len() >= 20)
        .await;
    let got: Vec<String> = t.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(got, ids, "in order, exactly once");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mesh.transcript(1).await.len(), 20);
    let m = mesh.metrics(0).await;
    assert_eq!(metric(&m, r#"botmesh_outbox_depth{peer="B"}"#), 0.0);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_restarted_node_still_has_its_transcript() {
    let mut mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B"])).await;
    let first = mesh.post_human(0, "alice", "remember me").await;
    mesh.wait_transcript(1, Duration::from_secs(10), |t| t.len() == 1)
        .await;
    mesh.stop(0).await;
    mesh.stop(1).await;
    mesh.restart(0).await;
    mesh.restart(1).await;
    for i in 0..2 {
        let t = mesh.transcript(i).await;
        assert_eq!(
            t.iter().map(|e| e.id.to_string()).collect::<Vec<_>>(),
            vec![first.clone()],
            "node {i}"
        );
    }
    // Dedup survives the restart: the same envelope again is a duplicate.
    let again = mesh.transcript(1).await[0].clone();
    let (s, v) = SignedRequest::new(&mesh.signers[0], &again, 0)
        .send(&mesh.http, &mesh.bridge(1))
        .await;
    assert_eq!((s, v), (200, serde_json::json!({"duplicate": true})));
    mesh.shutdown().await;
}

#[tokio::test]
async fn local_api_rejects_bad_posts() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B"])).await;
    let post = |body: serde_json::Value| {
        let req = mesh
            .http
            .post(format!("{}/v1/messages", mesh.api(0)))
            .json(&body);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(post(serde_json::json!({"text": ""})).await, 400);
    assert_eq!(
        post(serde_json::json!({"text": "hi", "from": "B"})).await,
        403,
        "posting as another bot"
    );
    assert_eq!(
        post(serde_json::json!({"text": "hi", "bogus": 1})).await,
        400
    );
    assert_eq!(
        post(serde_json::json!({"text": "hi", "reply_to": ulid::Ulid::new().to_string()})).await,
        400
    );
    let r = mesh
        .http
        .get(format!("{}/v1/transcript?limit=0", mesh.api(0)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = mesh
        .http
        .get(format!("{}/nope", mesh.api(0)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    mesh.shutdown().await;
}

#[tokio::test]
async fn rotation_accepts_old_and_new_keys_and_nothing_else() {
    let old = SigningKey::generate();
    let spec = MeshSpec::mentions_only(&["A", "B"]).bot(
        "B",
        &format!(
            "previous_public_keys = [\"{}\"]",
            old.public_key().to_whpk()
        ),
    );
    let mesh = TestMesh::start(spec).await;
    let a = mesh.bridge(0);
    let with_old = Signer {
        pairwise: Default::default(),
        hmac: vec![],
        ed25519: vec![old.clone()],
    };
    let (s, _) = SignedRequest::new(
        &with_old,
        &bot_message("B", "signed with the old key", 1),
        0,
    )
    .send(&mesh.http, &a)
    .await;
    assert_eq!(s, 200, "old key still valid during the rotation");
    let both = Signer {
        pairwise: Default::default(),
        hmac: vec![],
        ed25519: vec![old, mesh.signers[1].ed25519[0].clone()],
    };
    let (s, _) = SignedRequest::new(&both, &bot_message("B", "signed with both", 1), 0)
        .send(&mesh.http, &a)
        .await;
    assert_eq!(s, 200);
    let other = Signer {
        pairwise: Default::default(),
        hmac: vec![],
        ed25519: vec![SigningKey::generate()],
    };
    let (s, _) = SignedRequest::new(&other, &bot_message("B", "neither", 1), 0)
        .send(&mesh.http, &a)
        .await;
    assert_eq!(s, 401);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_local_api_token_is_required_when_configured() {
    let mut spec = MeshSpec::mentions_only(&["A", "B"]).mesh("api_token_env = \"TEST_API_TOKEN\"");
    spec.env
        .insert("TEST_API_TOKEN".into(), "s3cret-token".into());
    let mesh = TestMesh::start(spec).await;
    let url = format!("{}/v1/transcript", mesh.api(0));
    let status =
        |r: reqwest::RequestBuilder| async move { r.send().await.unwrap().status().as_u16() };
    assert_eq!(status(mesh.http.get(&url)).await, 401);
    assert_eq!(status(mesh.http.get(&url).bearer_auth("wrong")).await, 401);
    assert_eq!(
        status(mesh.http.get(&url).bearer_auth("s3cret-token")).await,
        200
    );
    assert_eq!(
        status(mesh.http.get(format!("{url}?token=s3cret-token"))).await,
        200,
        "the page passes ?token="
    );
    let post = mesh
        .http
        .post(format!("{}/v1/messages", mesh.api(0)))
        .json(&serde_json::json!({"text": "hi"}));
    assert_eq!(status(post).await, 401);
    assert_eq!(
        status(mesh.http.get(format!("{}/healthz", mesh.api(0)))).await,
        200,
        "health stays open"
    );
    mesh.shutdown().await;
}
