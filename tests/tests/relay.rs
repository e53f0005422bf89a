//! Relaying around a broken link: A and B reach each other only through test proxies
//! that the test cuts; C reaches both. Messages still arrive, through C, exactly once,
//! in order, each still verifiably written by its original sender; a relay cannot
//! alter or forge one; the hop limit holds; after healing nothing is doubled.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use botmesh_tests::faults::LinkProxy;
use botmesh_tests::{
    assert_metric_at_least, bot_message, wait_for, MeshSpec, SignedRequest, TestMesh,
};

/// POSTs a signed request to `bridge` as a relayed copy for `to` after `hops` hops,
/// optionally with another body than the one signed.
async fn send_relayed(
    http: &reqwest::Client,
    bridge: &str,
    req: &SignedRequest,
    to: &str,
    hops: &str,
    body: Option<Vec<u8>>,
) -> (u16, serde_json::Value, reqwest::header::HeaderMap) {
    let r = http
        .post(format!("{bridge}/bridge/v1/envelopes"))
        .header("webhook-id", &req.id)
        .header("webhook-timestamp", &req.timestamp)
        .header("webhook-signature", &req.signature)
        .header("botmesh-relay-to", to)
        .header("botmesh-hops", hops)
        .header("content-type", "application/json")
        .body(body.unwrap_or_else(|| req.body.clone()))
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let v = r.json().await.unwrap_or(serde_json::Value::Null);
    (status, v, headers)
}

fn ids_in(t: &[botmesh::wire::envelope::Envelope], wanted: &[String]) -> Vec<String> {
    let want: HashSet<&String> = wanted.iter().collect();
    t.iter()
        .map(|e| e.id.to_string())
        .filter(|id| want.contains(id))
        .collect()
}

/// Node `i`'s transcript once every one of `wanted` is in it (or after `within`): the
/// wait this test makes after each round of posts.
async fn wait_all(
    mesh: &TestMesh,
    i: usize,
    wanted: &[String],
    within: Duration,
) -> Vec<botmesh::wire::envelope::Envelope> {
    mesh.wait_transcript(i, within, |t| ids_in(t, wanted).len() == wanted.len())
        .await
}

#[tokio::test]
async fn broken_link_is_relayed_with_original_signatures_hop_limit_and_no_doubles() {
    let a_to_b = LinkProxy::start().await;
    let b_to_a = LinkProxy::start().await;
    let spec = MeshSpec::mentions_only(&["A", "B", "C"])
        .mesh("relay_after_ms = 300")
        .route("A", "B", &a_to_b.url)
        .route("B", "A", &b_to_a.url);
    let mesh = TestMesh::start(spec).await;
    let (a, b, c) = (mesh.index("A"), mesh.index("B"), mesh.index("C"));
    a_to_b.forward_to(mesh.bridges[b]);
    b_to_a.forward_to(mesh.bridges[a]);

    // The direct link works at first.
    let mut from_a = vec![mesh.post_human(a, "alice", "before the cut").await];
    let t = wait_all(&mesh, b, &from_a, Duration::from_secs(10)).await;
    assert_eq!(ids_in(&t, &from_a), from_a);
    assert!(a_to_b.forwarded.load(Ordering::SeqCst) >= 1);

    // Cut A <-> B both ways; C still reaches both.
    a_to_b.cut();
    b_to_a.cut();
    for n in 0..12 {
        // Humans through A, and A's bot speaking for itself.
        let from = if n % 3 == 2 { "A" } else { "alice" };
        from_a.push(mesh.post_human(a, from, &format!("while cut {n}")).await);
    }
    let mut from_b = Vec::new();
    for n in 0..4 {
        from_b.push(
            mesh.post_human(b, "bob", &format!("from B while cut {n}"))
                .await,
        );
    }
    let t = wait_all(&mesh, b, &from_a, Duration::from_secs(30)).await;
    assert_eq!(
        ids_in(&t, &from_a),
        from_a,
        "every message from A reaches B through C, in order, once"
    );
    for e in t.iter().filter(|e| from_a.contains(&e.id.to_string())) {
        assert_eq!(e.sender, "A", "still A's envelope");
    }
    let t = wait_all(&mesh, a, &from_b, Duration::from_secs(30)).await;
    assert_eq!(ids_in(&t, &from_b), from_b, "and B's reach A the same way");
    assert!(
        a_to_b.refused.load(Ordering::SeqCst) >= 1,
        "the direct link was really tried"
    );
    // B records a relayed copy before its signed receipt is back at A: wait (bounded)
    // for A to count the last one, then check the counts.
    let relayed = r#"botmesh_envelopes_out_total{peer="B",result="relayed"}"#;
    let ma = mesh
        .wait_metric(a, relayed, 12.0, Duration::from_secs(10))
        .await;
    assert_metric_at_least(&ma, relayed, 12.0);
    let (mb, mc) = (mesh.metrics(b).await, mesh.metrics(c).await);
    for (m, series) in [
        (
            &ma,
            r#"botmesh_envelopes_relayed_total{role="origin",peer="B",result="delivered"}"#,
        ),
        (
            &mc,
            r#"botmesh_envelopes_relayed_total{role="relay",peer="B",result="forwarded"}"#,
        ),
        (
            &mb,
            r#"botmesh_envelopes_relayed_total{role="destination",peer="A",result="accepted"}"#,
        ),
    ] {
        assert_metric_at_least(m, series, 12.0);
    }

    // A relay cannot alter a copy: C itself refuses it, and so would B.
    let env = bot_message("A", "the genuine text", 1);
    let genuine = SignedRequest::new(&mesh.signers[a], &env, 0);
    let tampered = String::from_utf8(genuine.body.clone())
        .unwrap()
        .replace("genuine", "tampered");
    let (s, v, _) = send_relayed(
        &mesh.http,
        &mesh.bridge(c),
        &genuine,
        "B",
        "1",
        Some(tampered.clone().into_bytes()),
    )
    .await;
    assert_eq!(s, 401, "relay verifies before forwarding: {v}");
    let (s, v, _) = send_relayed(
        &mesh.http,
        &mesh.bridge(b),
        &genuine,
        "B",
        "1",
        Some(tampered.into_bytes()),
    )
    .await;
    assert_eq!(s, 401, "destination verifies A's signature: {v}");
    // Nor sign as A: C's own key does not make an envelope A's.
    let forged = SignedRequest::new(&mesh.signers[c], &env, 0);
    let (s, _, _) = send_relayed(&mesh.http, &mesh.bridge(b), &forged, "B", "1", None).await;
    assert_eq!(s, 401);

    // The hop limit: a copy that already went through a relay is not relayed again.
    let (s, v, _) = send_relayed(&mesh.http, &mesh.bridge(c), &genuine, "B", "2", None).await;
    assert_eq!(s, 403, "{v}");
    assert_eq!(v["error"], "relay_hop_limit");
    // Within the limit it goes through, and B's signed receipt comes back through C.
    let (s, v, h) = send_relayed(&mesh.http, &mesh.bridge(c), &genuine, "B", "1", None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["receipt"]["by"], "B");
    assert_eq!(v["receipt"]["for"], env.id.to_string());
    assert_eq!(
        h.get("webhook-id").unwrap().to_str().unwrap(),
        format!("receipt-{}", env.id)
    );
    let (s, v, _) = send_relayed(&mesh.http, &mesh.bridge(c), &genuine, "B", "1", None).await;
    assert_eq!((s, &v["receipt"]["result"]), (200, &"duplicate".into()));

    // Heal: the direct link carries traffic again and nothing is doubled.
    let direct_before = a_to_b.forwarded.load(Ordering::SeqCst);
    a_to_b.heal();
    b_to_a.heal();
    // While relaying, the direct link is probed on its backoff (retry_max_ms = 500).
    tokio::time::sleep(Duration::from_millis(600)).await;
    for n in 0..5 {
        from_a.push(
            mesh.post_human(a, "alice", &format!("after healing {n}"))
                .await,
        );
    }
    let t = wait_all(&mesh, b, &from_a, Duration::from_secs(30)).await;
    assert_eq!(ids_in(&t, &from_a), from_a);
    wait_for(
        Duration::from_secs(5),
        Duration::from_millis(25),
        || async { a_to_b.forwarded.load(Ordering::SeqCst) },
        |forwarded| *forwarded > direct_before,
    )
    .await;
    assert!(
        a_to_b.forwarded.load(Ordering::SeqCst) > direct_before,
        "A probes and uses the direct link again"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in [a, b, c] {
        let t = mesh.transcript(i).await;
        let unique: HashSet<_> = t.iter().map(|e| e.id).collect();
        assert_eq!(unique.len(), t.len(), "node {i} has a duplicate");
        // 1 + 12 + 5 from A, 4 from B, and the test's own copy signed by A
        // (which A, its sender, never receives).
        let want = if i == a { 22 } else { 23 };
        assert_eq!(t.len(), want, "node {i}");
    }
    mesh.shutdown().await;
}
