//! A peer away for a long time: its outbox keeps at most `outbox_capacity` envelopes in
//! memory, the rest wait in the outbox log on disk, nothing is refused, and everything
//! arrives in order, exactly once, when the peer returns — also across a restart of
//! the sender in between.

use std::time::Duration;

use botmesh_tests::{metric, MeshSpec, TestMesh};

#[tokio::test]
async fn peer_down_for_200_messages_gets_all_in_order_with_memory_bounded_across_a_restart() {
    let spec = MeshSpec::mentions_only(&["A", "B"]).mesh("outbox_capacity = 8");
    let mut mesh = TestMesh::start(spec).await;
    let (a, b) = (mesh.index("A"), mesh.index("B"));
    mesh.stop(b).await;

    let mut ids = Vec::new();
    for n in 0..200 {
        ids.push(mesh.post_human(a, "alice", &format!("message {n}")).await);
        let o = &mesh.node(a).node.outboxes[0];
        assert!(o.len() <= 8, "memory queue at {} after {n} posts", o.len());
    }
    let o = mesh.node(a).node.outboxes[0].clone();
    assert_eq!(o.peer(), "B");
    assert!(o.peak_len() <= 8, "peak {}", o.peak_len());
    assert!(o.spilled() >= 190, "spilled {}", o.spilled());
    let m = mesh.metrics(a).await;
    assert!(
        metric(&m, r#"botmesh_outbox_depth{peer="B"}"#) <= 8.0,
        "{m}"
    );
    assert!(
        metric(&m, r#"botmesh_outbox_spilled{peer="B"}"#) >= 190.0,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            r#"botmesh_envelopes_out_total{peer="B",result="refused_full"}"#
        ),
        0.0,
        "nothing durable is refused"
    );

    // The sender restarts while the peer is still away: the backlog is resumed from
    // the outbox log, again with at most the capacity in memory.
    mesh.stop(a).await;
    mesh.restart(a).await;
    let o = mesh.node(a).node.outboxes[0].clone();
    assert!(
        o.len() <= 8 && o.peak_len() <= 8,
        "after restart: {}",
        o.len()
    );
    assert!(o.spilled() >= 190, "after restart spilled {}", o.spilled());

    mesh.restart(b).await;
    let got = mesh
        .wait_transcript(b, Duration::from_secs(60), |t| t.len() >= 200)
        .await;
    let got_ids: Vec<String> = got.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(got_ids, ids, "all 200, in order, exactly once");
    assert!(got.iter().all(|e| e.sender == "A"));
    mesh.wait_outboxes_empty(a, Duration::from_secs(5)).await;
    assert!(o.is_empty() && o.spilled() == 0);
    assert!(o.peak_len() <= 8, "peak {}", o.peak_len());
    // Nothing arrives twice later either.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mesh.transcript(b).await.len(), 200);
    mesh.shutdown().await;
}
