//! Batched delivery (`POST /bridge/v1/batch`) end to end: a backlog goes in few
//! requests, in order, exactly once; every item is verified on its own; an older
//! receiver (404 on the batch path) still gets everything, one envelope at a time.

use std::sync::atomic::Ordering;
use std::time::Duration;

use botmesh::wire::signing::{Signer, SigningKey};
use botmesh_tests::faults::OldReceiverProxy;
use botmesh_tests::{
    assert_metric, bot_message, client_from, loopback, metric, MeshSpec, SignedRequest, TestMesh,
};

fn ids(t: &[botmesh::wire::envelope::Envelope]) -> Vec<String> {
    t.iter().map(|e| e.id.to_string()).collect()
}

/// One batch item as the outbox encodes it.
fn item(r: &SignedRequest) -> serde_json::Value {
    serde_json::json!({
        "id": r.id, "timestamp": r.timestamp, "signature": r.signature,
        "body": String::from_utf8(r.body.clone()).unwrap(),
    })
}

/// POSTs `items` as one batch to node `i`'s bridge; the answer must be 200.
async fn post_batch(mesh: &TestMesh, i: usize, items: &[serde_json::Value]) -> serde_json::Value {
    post_batch_with(&mesh.http, mesh, i, items).await
}

/// [`post_batch`] with `http` (a client at another source address).
async fn post_batch_with(
    http: &reqwest::Client,
    mesh: &TestMesh,
    i: usize,
    items: &[serde_json::Value],
) -> serde_json::Value {
    let resp = http
        .post(format!("{}/bridge/v1/batch", mesh.bridge(i)))
        .json(&serde_json::json!({ "items": items }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

#[tokio::test]
async fn a_peer_back_after_300_messages_gets_them_in_order_once_in_few_requests() {
    let spec = MeshSpec::mentions_only(&["A", "B"]);
    let mut mesh = TestMesh::start(spec).await;
    let (a, b) = (mesh.index("A"), mesh.index("B"));
    mesh.stop(b).await;
    let mut sent = Vec::new();
    for n in 0..300 {
        sent.push(mesh.post_human(a, "alice", &format!("message {n}")).await);
    }
    let before = mesh.metrics(a).await;
    let requests_before = metric(
        &before,
        r#"botmesh_peer_requests_total{peer="B",kind="single"}"#,
    ) + metric(
        &before,
        r#"botmesh_peer_requests_total{peer="B",kind="batch"}"#,
    );
    mesh.restart(b).await;
    let got = mesh
        .wait_transcript(b, Duration::from_secs(60), |t| t.len() >= 300)
        .await;
    assert_eq!(ids(&got), sent, "all 300, in order, exactly once");
    let o = mesh.node(a).node.outboxes[0].clone();
    mesh.wait_outboxes_empty(a, Duration::from_secs(5)).await;
    assert!(o.is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mesh.transcript(b).await.len(), 300, "nothing arrives twice");

    let m = mesh.metrics(a).await;
    let batches = metric(&m, r#"botmesh_peer_requests_total{peer="B",kind="batch"}"#);
    let singles = metric(&m, r#"botmesh_peer_requests_total{peer="B",kind="single"}"#);
    let after_return = batches + singles - requests_before;
    assert!(batches >= 5.0, "{m}");
    assert!(
        after_return <= 20.0,
        "{after_return} requests for 300 envelopes after the peer returned:\n{m}"
    );
    assert_eq!(
        metric(
            &m,
            r#"botmesh_envelopes_out_total{peer="B",result="delivered"}"#
        ),
        300.0
    );
    let mb = mesh.metrics(b).await;
    assert_metric(
        &mb,
        r#"botmesh_envelopes_in_total{result="accepted"}"#,
        300.0,
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_forged_item_in_a_batch_is_rejected_alone() {
    let spec = MeshSpec::mentions_only(&["A", "B"]);
    let mesh = TestMesh::start(spec).await;
    let (a, b) = (mesh.index("A"), mesh.index("B"));
    let honest = &mesh.signers[b];
    let forger = Signer {
        pairwise: Default::default(),
        hmac: vec![],
        ed25519: vec![SigningKey::generate()],
    };
    let envs: Vec<_> = (0..3)
        .map(|n| bot_message("B", &format!("batch item {n}"), 1))
        .collect();
    let reqs = [
        SignedRequest::new(honest, &envs[0], 0),
        SignedRequest::new(&forger, &envs[1], 0),
        SignedRequest::new(honest, &envs[2], 0),
    ];
    let items: Vec<serde_json::Value> = reqs.iter().map(item).collect();
    let v = post_batch(&mesh, a, &items).await;
    let r = v["results"].as_array().expect("results");
    assert_eq!(r.len(), 3, "{v}");
    assert_eq!(
        (r[0]["status"].as_u64(), r[0]["result"].as_str()),
        (Some(200), Some("accepted"))
    );
    assert_eq!(r[1]["status"], 401, "{v}");
    assert_eq!(r[1]["result"], "bad_signature", "{v}");
    assert_eq!(
        (r[2]["status"].as_u64(), r[2]["result"].as_str()),
        (Some(200), Some("accepted"))
    );
    let t = mesh
        .wait_transcript(a, Duration::from_secs(5), |t| t.len() >= 2)
        .await;
    assert_eq!(
        ids(&t),
        vec![envs[0].id.to_string(), envs[2].id.to_string()]
    );

    // The same batch again: the two accepted ones are duplicates, the forgery still 401.
    let again = post_batch(&mesh, a, &items).await;
    let r = again["results"].as_array().unwrap();
    assert_eq!(r[0]["result"], "duplicate");
    assert_eq!(r[1]["status"], 401);
    assert_eq!(r[2]["result"], "duplicate");
    // A batch that is not one is refused as a whole.
    let bad = mesh
        .http
        .post(format!("{}/bridge/v1/batch", mesh.bridge(a)))
        .body("[1,2,3]")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let m = mesh.metrics(a).await;
    assert_metric(
        &m,
        r#"botmesh_envelopes_in_total{result="bad_signature"}"#,
        2.0,
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_older_receiver_without_batches_still_gets_everything_in_order() {
    let proxy = OldReceiverProxy::start().await;
    let spec = MeshSpec::mentions_only(&["A", "B"]).route("A", "B", &proxy.url);
    let mut mesh = TestMesh::start(spec).await;
    let (a, b) = (mesh.index("A"), mesh.index("B"));
    proxy.forward_to(mesh.bridges[b]);
    mesh.stop(b).await;
    let mut sent = Vec::new();
    for n in 0..40 {
        sent.push(mesh.post_human(a, "alice", &format!("old {n}")).await);
    }
    mesh.restart(b).await;
    let got = mesh
        .wait_transcript(b, Duration::from_secs(30), |t| t.len() >= 40)
        .await;
    assert_eq!(ids(&got), sent, "all 40, in order, exactly once");
    assert!(proxy.batches_refused.load(Ordering::SeqCst) >= 1);
    assert!(proxy.forwarded.load(Ordering::SeqCst) >= 40);
    // B records the 40th message before its answer reaches A's outbox: wait (bounded)
    // for A to count the last delivery, then check the count is exactly 40.
    let delivered = r#"botmesh_envelopes_out_total{peer="B",result="delivered"}"#;
    let m = mesh
        .wait_metric(a, delivered, 40.0, Duration::from_secs(10))
        .await;
    assert_metric(&m, delivered, 40.0);
    assert_eq!(
        metric(
            &m,
            r#"botmesh_envelopes_out_total{peer="B",result="given_up"}"#
        ),
        0.0
    );
    mesh.shutdown().await;
}

/// A claim envelope from bot `sender` on `trigger` at `relevance`.
fn claim(sender: &str, trigger: ulid::Ulid, relevance: f64) -> botmesh::wire::envelope::Envelope {
    let mut env = bot_message(sender, "", 0);
    env.kind = botmesh::wire::envelope::Kind::Claim;
    env.reply_to = Some(trigger);
    env.relevance = Some(relevance);
    env
}

#[tokio::test]
async fn a_claim_on_a_trigger_this_bot_answers_is_answered_answered_single_and_in_a_batch() {
    let spec = MeshSpec::mentions_only(&["A", "B"]);
    let mesh = TestMesh::start(spec).await;
    let (a, b) = (mesh.index("A"), mesh.index("B"));
    let signer = &mesh.signers[b];
    let board = &mesh.node(a).node.brain.board;
    let trigger = ulid::Ulid::new();
    let early = SignedRequest::new(signer, &claim("B", trigger, 0.6), 0);
    let (status, v) = early.send(&mesh.http, &mesh.bridge(a)).await;
    // A has not looked at this trigger (it never arrived here): it may still judge it,
    // so it answers `judging` and owes B its word.
    assert_eq!(
        (status, v.clone()),
        (200, serde_json::json!({"accepted": true, "judging": true}))
    );

    // A commits on the trigger (its claim beats B's 0.6): from now on claims on it
    // are told that A answers it, new ones and duplicates alike.
    board.commit(trigger, "A", 0.9).expect("clear to commit");
    let late = SignedRequest::new(signer, &claim("B", trigger, 0.7), 0);
    let (status, v) = late.send(&mesh.http, &mesh.bridge(a)).await;
    assert_eq!(
        (status, v),
        (200, serde_json::json!({"accepted": true, "answered": "A"}))
    );
    let (status, v) = early.send(&mesh.http, &mesh.bridge(a)).await;
    assert_eq!(
        (status, v),
        (200, serde_json::json!({"duplicate": true, "answered": "A"}))
    );

    // In a batch: a new claim on the trigger, a duplicate one, a claim on another
    // trigger (not looked at here: `judging`) and a plain message; only the first two
    // carry `answered`.
    let reqs = [
        SignedRequest::new(signer, &claim("B", trigger, 0.8), 0),
        early,
        SignedRequest::new(signer, &claim("B", ulid::Ulid::new(), 0.8), 0),
        SignedRequest::new(signer, &bot_message("B", "plain", 1), 0),
    ];
    let items: Vec<serde_json::Value> = reqs.iter().map(item).collect();
    let v = post_batch(&mesh, a, &items).await;
    assert_eq!(
        v,
        serde_json::json!({"results": [
            {"status": 200, "result": "accepted", "answered": "A"},
            {"status": 200, "result": "duplicate", "answered": "A"},
            {"status": 200, "result": "accepted", "judging": true},
            {"status": 200, "result": "accepted"},
        ]})
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn junk_signatures_cost_bounded_verification_and_none_past_the_rate_limit() {
    // 1 envelope/s, a burst of 2, per sender and source address.
    let mesh =
        TestMesh::start(MeshSpec::mentions_only(&["A", "B"]).mesh("peer_rate_limit = 1")).await;
    let checks = || async { metric(&mesh.metrics(0).await, "botmesh_ed25519_checks_total") };
    let forger = Signer {
        ed25519: vec![SigningKey::generate()],
        ..Signer::default()
    };
    let forged = |text: &str| SignedRequest::new(&forger, &bot_message("B", text, 1), 0);

    // A junk batch from 127.0.0.2 naming B: the items within the burst are verified
    // (and refused), the first one over the limit is refused before its signature is
    // looked at, and the rest are not even prechecked.
    let flooder = client_from(loopback(2));
    let items: Vec<_> = (0..40)
        .map(|i| item(&forged(&format!("junk {i}"))))
        .collect();
    let answer = post_batch_with(&flooder, &mesh, 0, &items).await;
    let results: Vec<&str> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["result"].as_str().unwrap())
        .collect();
    let verified = results
        .iter()
        .take_while(|r| **r == "bad_signature")
        .count();
    // Sent at once, before a metrics scrape lets the bucket refill.
    let (over, over_answer) = forged("over the limit")
        .send(&flooder, &mesh.bridge(0))
        .await;
    assert!((1..=3).contains(&verified), "{results:?}");
    assert_eq!(results[verified], "rate_limited", "{results:?}");
    assert!(
        results[verified + 1..]
            .iter()
            .all(|r| *r == "not_processed"),
        "{results:?}"
    );
    assert_eq!(
        checks().await,
        verified as f64,
        "one Ed25519 check per item verified, none after"
    );
    assert_eq!(
        (over, over_answer["error"].as_str()),
        (429, Some("rate_limited"))
    );
    assert_eq!(
        checks().await,
        verified as f64,
        "a source over its limit costs no check"
    );

    // 100 `v1a` entries (the genuine one last) from another address: refused unread.
    let from3 = client_from(loopback(3));
    let genuine = SignedRequest::new(&mesh.signers[1], &bot_message("B", "padded", 1), 0);
    let junk = forger.sign(
        &genuine.id,
        genuine.timestamp.parse().unwrap(),
        &genuine.body,
    );
    let padded = SignedRequest {
        signature: format!("{} {}", vec![junk; 99].join(" "), genuine.signature),
        ..genuine
    };
    let (status, answer) = padded.send(&from3, &mesh.bridge(0)).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (401, Some("too_many_signatures")),
        "{answer}"
    );
    // An unknown sender: refused before any signature work.
    let stranger = SignedRequest::new(&forger, &bot_message("Zed", "hello", 1), 0);
    let (status, _) = stranger.send(&from3, &mesh.bridge(0)).await;
    assert_eq!(status, 403);
    assert_eq!(checks().await, verified as f64);

    // The real B, at its own address, was never short of budget: one check, accepted.
    let (status, answer) = SignedRequest::new(&mesh.signers[1], &bot_message("B", "real", 1), 0)
        .send(&mesh.http, &mesh.bridge(0))
        .await;
    assert_eq!(
        (status, &answer["accepted"]),
        (200, &serde_json::json!(true)),
        "{answer}"
    );
    assert_eq!(checks().await, verified as f64 + 1.0);
    mesh.shutdown().await;
}
