//! Crash recovery with real processes: `kill -9` mid-stream loses nothing accepted and
//! processes nothing twice, because whatever a node acknowledged — including what it
//! still owes its peers — was on disk first.

use std::collections::HashSet;
use std::time::Duration;

use botmesh_tests::ProcessMesh;

#[tokio::test]
async fn kill_9_while_500_messages_stream_loses_nothing_and_duplicates_nothing() {
    let mut mesh = ProcessMesh::start(&["A", "B", "C"], "", "participation = \"mentions\"").await;
    let mut accepted: Vec<String> = Vec::new();
    for n in 0..500usize {
        if n == 150 {
            // The sender itself dies with envelopes still owed to a peer that is down.
            mesh.kill9(1);
        }
        if n == 200 {
            mesh.kill9(0);
        }
        if n == 260 {
            mesh.spawn(0).await;
        }
        if n == 320 {
            mesh.spawn(1).await;
        }
        let at = n % 3;
        if let Some(id) = mesh.post(at, &format!("message {n} via {at}")).await {
            accepted.push(id);
        }
    }
    let alive_all_along = 500 - (320 - 150) / 3 - (260 - 200) / 3;
    assert!(
        accepted.len() >= alive_all_along - 2,
        "only {} accepted",
        accepted.len()
    );
    assert_every_node_has_exactly(&mesh, &accepted).await;
    // A really did owe B envelopes across its crash, and resumed them from its outbox log.
    assert!(
        mesh.log(0).contains("resuming undelivered envelopes"),
        "{}",
        mesh.log(0)
    );
    // Everything delivered: every outbox drained, so a clean stop exits 0.
    for i in 0..3 {
        assert!(mesh.terminate(i).success(), "{}", mesh.log(i));
    }
}

#[tokio::test]
async fn kill_9_on_the_redis_transport_loses_nothing_and_duplicates_nothing() {
    let redis = botmesh_tests::redis_server::RedisServer::start().await;
    let extra = format!(
        "transport = \"redis\"\n[redis]\nurl = \"{}\"\nblock_ms = 200\n",
        redis.url()
    );
    let mut mesh =
        ProcessMesh::start(&["A", "B", "C"], &extra, "participation = \"mentions\"").await;
    let mut accepted: Vec<String> = Vec::new();
    for n in 0..300usize {
        match n {
            // A reader dies mid-batch: its cursor is saved only after what it read is on disk.
            80 => mesh.kill9(1),
            // A sender dies with appends still owed to the stream.
            120 => mesh.kill9(0),
            150 => mesh.spawn(0).await,
            200 => mesh.spawn(1).await,
            _ => {}
        }
        let at = n % 3;
        if let Some(id) = mesh.post(at, &format!("message {n} via {at}")).await {
            accepted.push(id);
        }
    }
    assert!(
        accepted.len() >= 300 - 40 - 10 - 2,
        "only {} accepted",
        accepted.len()
    );
    assert_every_node_has_exactly(&mesh, &accepted).await;
    for i in 0..3 {
        assert!(mesh.terminate(i).success(), "{}", mesh.log(i));
    }
}

#[tokio::test]
async fn a_peer_down_since_the_start_still_gets_everything_after_the_sender_is_killed() {
    // B dies before A delivered it anything, so A has no delivery position for B yet
    // other than its starting one; A must have written that down, or after its own
    // `kill -9` it would take B for a peer new to it and start B from "now".
    let mut mesh = ProcessMesh::start(&["A", "B"], "", "participation = \"mentions\"").await;
    mesh.kill9(1);
    let mut accepted = Vec::new();
    for n in 0..20 {
        accepted.push(
            mesh.post(0, &format!("owed {n}"))
                .await
                .expect("A accepts while B is down"),
        );
    }
    mesh.kill9(0);
    mesh.spawn(0).await;
    mesh.spawn(1).await;
    let got = mesh
        .wait_ids(1, Duration::from_secs(20), |got| {
            got.len() >= accepted.len()
        })
        .await;
    assert_eq!(got, accepted, "B got all 20, in order\n{}", mesh.log(0));
}

/// Every node ends up with exactly the accepted ids: none missing, none twice, none extra.
async fn assert_every_node_has_exactly(mesh: &ProcessMesh, accepted: &[String]) {
    let want: HashSet<&String> = accepted.iter().collect();
    for i in 0..3 {
        let got = mesh
            .wait_ids(i, Duration::from_secs(20), |got| {
                got.len() >= accepted.len()
            })
            .await;
        let set: HashSet<&String> = got.iter().collect();
        assert_eq!(set.len(), got.len(), "node {i} has duplicates");
        let missing: Vec<_> = want.difference(&set).collect();
        assert!(
            missing.is_empty(),
            "node {i} lost {} accepted messages, e.g. {:?}\n{}",
            missing.len(),
            missing.first(),
            mesh.log(i)
        );
        assert_eq!(got.len(), accepted.len(), "node {i} has extra messages");
    }
}
