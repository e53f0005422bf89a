//! `/metrics` reports the size of each in-memory cache (`botmesh_cache_entries`), the
//! figures `botmesh-bench soak` watches for unbounded growth.

use std::time::Duration;

use botmesh_tests::{metric, wait_for, MeshSpec, TestMesh};

#[tokio::test]
async fn cache_gauges_follow_traffic() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B"])).await;
    let id = mesh.post_human(0, "alice", "hello, colleagues").await;
    mesh.wait_transcript(1, Duration::from_secs(10), |t| {
        t.iter().any(|e| e.id.to_string() == id)
    })
    .await;
    // The bridge records the message before it remembers the id and counts it:
    // wait (a bounded number of scrapes) for the count.
    let m = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || mesh.metrics(1),
        |m| metric(m, r#"botmesh_envelopes_in_total{result="accepted"}"#) >= 1.0,
    )
    .await;
    let gauge = |cache: &str| metric(&m, &format!("botmesh_cache_entries{{cache=\"{cache}\"}}"));
    assert_eq!(gauge("seen_ids"), 1.0, "{m}");
    assert_eq!(gauge("transcript_ids"), 1.0, "{m}");
    assert_eq!(
        gauge("rate_limiter_buckets"),
        1.0,
        "one sender so far:\n{m}"
    );
    assert!(
        m.contains("botmesh_cache_entries{cache=\"claim_triggers\"}"),
        "{m}"
    );
    assert!(
        !m.contains("feishu_event_ids"),
        "no feishu on a local bot:\n{m}"
    );
    assert_eq!(metric(&m, "botmesh_outbox_depth{peer=\"A\"}"), 0.0, "{m}");
    mesh.shutdown().await;
}
