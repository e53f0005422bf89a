//! The Redis Streams transport against a real redis-server: a group is one stream,
//! each bot reads it with its own persisted cursor, envelopes are checked exactly as
//! on the HTTP bridge, and Redis going away loses nothing.

use std::collections::HashSet;
use std::time::Duration;

use botmesh::wire::envelope::Envelope;
use botmesh_tests::redis_server::RedisServer;
use botmesh_tests::{
    assert_metric, bot_message, decisions, fetch_json, metric, wait_for, MeshSpec, TestMesh,
};

/// A mesh of `names` on the stream transport of `redis`, bots answering mentions only.
fn spec(redis: &RedisServer, names: &[&str]) -> MeshSpec {
    let mut s = MeshSpec::mentions_only(names).mesh("transport = \"redis\"");
    s.top.push_str(&format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"t:\"\nblock_ms = 200\nmax_len = 100\n",
        redis.url()
    ));
    s
}

fn texts(t: &[Envelope]) -> Vec<&str> {
    t.iter().map(|e| e.text.as_str()).collect()
}

fn count_ids(t: &[Envelope]) -> (usize, usize) {
    let set: HashSet<_> = t.iter().map(|e| e.id).collect();
    (t.len(), set.len())
}

async fn xlen(redis: &RedisServer) -> u64 {
    redis::cmd("XLEN")
        .arg("t:group:demo")
        .query_async(&mut redis.client().await)
        .await
        .unwrap()
}

#[tokio::test]
async fn three_bots_share_a_group_through_one_stream() {
    let redis = RedisServer::start().await;
    let mesh = TestMesh::start(spec(&redis, &["A", "B", "C"])).await;
    let id = mesh.post_human(0, "alice", "hello, colleagues").await;
    for i in 1..3 {
        let t = mesh
            .wait_transcript(i, Duration::from_secs(10), |t| !t.is_empty())
            .await;
        assert_eq!(texts(&t), ["hello, colleagues"], "node {i}");
        assert_eq!(t[0].id.to_string(), id);
        assert_eq!(t[0].sender, "A");
    }
    // A mention: B answers, and its reply reaches A and C through the stream too.
    mesh.post_human(0, "alice", "@B what do you think?").await;
    for i in [0, 2] {
        let t = mesh
            .wait_transcript(i, Duration::from_secs(10), |t| {
                t.iter().any(|e| e.sender == "B" && e.depth == 1)
            })
            .await;
        let reply = t.iter().find(|e| e.sender == "B").expect("B's reply");
        assert_eq!(reply.author.name, "B");
        assert_eq!(count_ids(&t).0, count_ids(&t).1, "node {i} has a duplicate");
    }
    // One append per message, not one POST per peer.
    let m = mesh.metrics(0).await;
    assert_eq!(
        metric(
            &m,
            r#"botmesh_envelopes_out_total{peer="@redis",result="delivered"}"#
        ),
        2.0,
        "{m}"
    );
    assert!(!m.contains(r#"peer="B""#), "no HTTP outbox for B: {m}");
    assert_eq!(metric(&m, "botmesh_redis_up"), 1.0);
    assert!(xlen(&redis).await >= 3);
    let (status, h) = mesh.health(1).await;
    assert_eq!(status, 200, "{h}");
    assert_eq!(h["transport"], "redis");
    assert_eq!(h["redis"]["connected"], true);
    assert_eq!(h["redis"]["groups"], 1);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_bot_that_was_down_catches_up_in_order_exactly_once() {
    let redis = RedisServer::start().await;
    let mut mesh = TestMesh::start(spec(&redis, &["A", "B", "C"])).await;
    mesh.post_human(0, "alice", "before").await;
    mesh.wait_transcript(1, Duration::from_secs(10), |t| t.len() == 1)
        .await;
    mesh.stop(1).await;
    let mut sent = vec!["before".to_string()];
    for n in 0..20 {
        let text = format!("while B was away {n}");
        mesh.post_human(n % 2 * 2, "alice", &text).await;
        sent.push(text);
    }
    // Even a mention that waited in the stream is answered on return (it is fresh).
    mesh.restart(1).await;
    let t = mesh
        .wait_transcript(1, Duration::from_secs(15), |t| t.len() >= 21)
        .await;
    let got: Vec<String> = t.iter().map(|e| e.text.clone()).collect();
    assert_eq!(got.len(), 21, "{got:?}");
    // Each sender's messages keep their order (A's and C's interleave by arrival).
    for from in [0usize, 2] {
        let want: Vec<&String> = sent[1..].iter().skip(from / 2).step_by(2).collect();
        let have: Vec<&String> = got
            .iter()
            .filter(|x| x.contains("away") && want.contains(x))
            .collect();
        assert_eq!(have, want);
    }
    assert_eq!(count_ids(&t).0, count_ids(&t).1);
    // The cursor was saved: a second restart re-reads nothing.
    mesh.stop(1).await;
    mesh.restart(1).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let m = mesh.metrics(1).await;
    assert_metric(
        &m,
        r#"botmesh_transcript_appends_total{result="stream"}"#,
        0.0,
    );
    assert_metric(&m, r#"botmesh_envelopes_in_total{result="accepted"}"#, 0.0);
    assert_eq!(mesh.transcript(1).await.len(), 21);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_mention_that_waited_too_long_is_recorded_but_not_answered() {
    let redis = RedisServer::start().await;
    let mut mesh = TestMesh::start(spec(&redis, &["A", "B"]).mesh("stale_after_secs = 1")).await;
    mesh.post_human(0, "alice", "warm up").await;
    mesh.wait_transcript(1, Duration::from_secs(10), |t| t.len() == 1)
        .await;
    mesh.stop(1).await;
    mesh.post_human(0, "alice", "@B are you there?").await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    mesh.restart(1).await;
    mesh.wait_transcript(1, Duration::from_secs(10), |t| t.len() == 2)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = mesh.metrics(1).await;
    assert_eq!(decisions(&m, "silent", "stale"), 1.0, "{m}");
    assert!(mesh.transcript(0).await.iter().all(|e| e.sender != "B"));
    mesh.shutdown().await;
}

#[tokio::test]
async fn redis_going_away_loses_nothing_and_health_says_so() {
    let mut redis = RedisServer::start().await;
    let mesh = TestMesh::start(spec(&redis, &["A", "B", "C"])).await;
    mesh.post_human(0, "alice", "first").await;
    mesh.wait_transcript(2, Duration::from_secs(10), |t| t.len() == 1)
        .await;
    redis.kill();
    // The API still accepts: each message is on disk in A's outbox log first.
    for n in 0..10 {
        mesh.post_human(0, "alice", &format!("during the outage {n}"))
            .await;
    }
    let h = wait_for(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || mesh.health(0),
        |h| h.0 == 503,
    )
    .await;
    assert_eq!(h.0, 503, "{}", h.1);
    assert_eq!(h.1["status"], "degraded");
    assert_eq!(h.1["redis"]["connected"], false);
    assert!(h.1["redis"]["error"]
        .as_str()
        .is_some_and(|e| !e.is_empty()));
    assert!(metric(&mesh.metrics(0).await, "botmesh_redis_up") == 0.0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.resume().await;
    for i in 1..3 {
        let t = mesh
            .wait_transcript(i, Duration::from_secs(20), |t| t.len() >= 11)
            .await;
        let want: Vec<String> = std::iter::once("first".to_string())
            .chain((0..10).map(|n| format!("during the outage {n}")))
            .collect();
        let got: Vec<String> = t.iter().map(|e| e.text.clone()).collect();
        assert_eq!(got, want, "node {i}: in order, exactly once");
    }
    let (ok, _) = wait_for(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async { (mesh.health(1).await.0, mesh.health(0).await.0) },
        |both| *both == (200, 200),
    )
    .await;
    assert_eq!(ok, 200);
    let m = mesh.metrics(0).await;
    assert!(metric(&m, r#"botmesh_stream_events_total{result="write_error"}"#) >= 1.0);
    assert!(
        metric(
            &m,
            r#"botmesh_envelopes_out_total{peer="@redis",result="retry"}"#
        ) >= 1.0
    );
    // What waited during the outage went out in pipelined batches, not one by one.
    assert!(
        metric(
            &m,
            r#"botmesh_peer_requests_total{peer="@redis",kind="batch"}"#
        ) >= 1.0,
        "{m}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn forged_tampered_stale_and_replayed_entries_get_nowhere() {
    let redis = RedisServer::start().await;
    let mesh = TestMesh::start(spec(&redis, &["A", "B"])).await;
    mesh.post_human(0, "alice", "genuine").await;
    mesh.wait_transcript(1, Duration::from_secs(10), |t| t.len() == 1)
        .await;
    let mut c = redis.client().await;
    let now = botmesh::wire::signing::unix_now();
    let add = |id: String, ts: i64, sig: String, body: Vec<u8>| {
        let mut cmd = redis::cmd("XADD");
        cmd.arg("t:group:demo")
            .arg("*")
            .arg("id")
            .arg(id)
            .arg("ts")
            .arg(ts)
            .arg("sig")
            .arg(sig)
            .arg("body")
            .arg(body);
        cmd
    };
    // A bot message "from A" signed with B's key (the attacker holds only B's key).
    let forged = bot_message("A", "forged", 0);
    let cmd = add(
        forged.id.to_string(),
        now,
        mesh.signers[1].sign(&forged.id.to_string(), now, &forged.to_bytes()),
        forged.to_bytes(),
    );
    let _: String = cmd.query_async(&mut c).await.unwrap();
    // A's real signature over a body that was then altered.
    let real = bot_message("A", "original", 0);
    let sig = mesh.signers[0].sign(&real.id.to_string(), now, &real.to_bytes());
    let mut altered = real.clone();
    altered.text = "altered".into();
    let _: String = add(real.id.to_string(), now, sig, altered.to_bytes())
        .query_async(&mut c)
        .await
        .unwrap();
    // A correctly signed envelope whose signature is 10 minutes older than its entry.
    let old = bot_message("A", "stale", 0);
    let _: String = add(
        old.id.to_string(),
        now - 600,
        mesh.signers[0].sign(&old.id.to_string(), now - 600, &old.to_bytes()),
        old.to_bytes(),
    )
    .query_async(&mut c)
    .await
    .unwrap();
    // An entry without a signature, and one without a body.
    let bare = bot_message("A", "unsigned", 0);
    let _: String = redis::cmd("XADD")
        .arg("t:group:demo")
        .arg("*")
        .arg("id")
        .arg(bare.id.to_string())
        .arg("body")
        .arg(bare.to_bytes())
        .query_async(&mut c)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("t:group:demo")
        .arg("*")
        .arg("junk")
        .arg("1")
        .query_async(&mut c)
        .await
        .unwrap();
    // A genuine entry, then the same entry added again (a replay within the window).
    let good = bot_message("A", "signed by A", 0);
    let sig = mesh.signers[0].sign(&good.id.to_string(), now, &good.to_bytes());
    for _ in 0..2 {
        let _: String = add(good.id.to_string(), now, sig.clone(), good.to_bytes())
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let t = mesh
        .wait_transcript(1, Duration::from_secs(10), |t| t.len() >= 2)
        .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let t2 = mesh.transcript(1).await;
    assert_eq!(t.len(), t2.len());
    assert_eq!(texts(&t2), ["genuine", "signed by A"]);
    let m = mesh.metrics(1).await;
    let rejected = |r: &str| {
        metric(
            &m,
            &format!(r#"botmesh_envelopes_in_total{{result="{r}"}}"#),
        )
    };
    assert_eq!(rejected("bad_signature"), 2.0, "{m}");
    assert_eq!(rejected("stale"), 1.0, "{m}");
    assert_eq!(rejected("missing_header"), 1.0, "{m}");
    assert_eq!(rejected("malformed"), 1.0, "{m}");
    assert_eq!(rejected("duplicate"), 1.0, "{m}");
    // B is still reading.
    mesh.post_human(0, "alice", "still here").await;
    let t = mesh
        .wait_transcript(1, Duration::from_secs(10), |t| t.len() == 3)
        .await;
    assert_eq!(t.last().unwrap().text, "still here");
    mesh.shutdown().await;
}

/// A reader records one read's entries in stream order, even when the later ones'
/// signatures are decided at once (a pairwise tag) and the earlier ones need
/// public-key arithmetic. Checking each entry on its own let the cheap ones overtake.
#[tokio::test]
async fn entries_are_recorded_in_stream_order_whatever_their_signatures_cost() {
    let redis = RedisServer::start().await;
    let mesh = TestMesh::start(spec(&redis, &["A", "B"])).await;
    mesh.post_human(0, "alice", "genuine").await;
    mesh.wait_transcript(1, Duration::from_secs(10), |t| t.len() == 1)
        .await;
    // A's signer with the pairwise key for B, as A's HTTP outbox to B signs.
    let mut a = mesh.signers[0].clone();
    let a_key = a.ed25519[0].clone();
    let b_pub = mesh.signers[1].ed25519[0].public_key();
    a.pairwise.insert(
        "B".into(),
        botmesh::wire::signing::PairwiseKey::sending(&a_key, "A", &b_pub, "B").unwrap(),
    );
    // Six entries appended atomically, so B reads them together: every other one
    // carries a pairwise entry for B (no Ed25519 work), the others only `v1a`.
    let now = botmesh::wire::signing::unix_now();
    let mut pipe = redis::pipe();
    pipe.atomic();
    let mut want = vec!["genuine".to_string()];
    for n in 0..6 {
        let e = bot_message("A", &format!("entry {n}"), 0);
        let id = e.id.to_string();
        let sig = if n % 2 == 1 {
            a.sign_for("B", &id, now, &e.to_bytes())
        } else {
            a.sign(&id, now, &e.to_bytes())
        };
        pipe.cmd("XADD")
            .arg("t:group:demo")
            .arg("*")
            .arg("id")
            .arg(&id)
            .arg("ts")
            .arg(now)
            .arg("sig")
            .arg(sig)
            .arg("body")
            .arg(e.to_bytes())
            .ignore();
        want.push(e.text);
    }
    let () = pipe.query_async(&mut redis.client().await).await.unwrap();
    let t = mesh
        .wait_transcript(1, Duration::from_secs(10), |t| t.len() >= 7)
        .await;
    assert_eq!(texts(&t), want);
    // Counted once the durable write ends, which may be after the transcript shows them.
    let accepted = r#"botmesh_envelopes_in_total{result="accepted"}"#;
    let m = wait_for(
        Duration::from_secs(5),
        Duration::from_millis(25),
        || mesh.metrics(1),
        |m| metric(m, accepted) >= 7.0,
    )
    .await;
    assert_eq!(metric(&m, accepted), 7.0, "{m}");
    assert_eq!(
        metric(
            &m,
            r#"botmesh_signatures_verified_total{scheme="pairwise"}"#
        ),
        3.0,
        "{m}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn mixed_mesh_http_and_redis_bots_hear_each_other_once() {
    let redis = RedisServer::start().await;
    let mesh =
        TestMesh::start(spec(&redis, &["A", "B", "C"]).bot("C", "transport = \"http\"")).await;
    mesh.post_human(0, "alice", "from A on redis").await;
    mesh.post_human(2, "bob", "from C on http").await;
    mesh.post_human(1, "carol", "@C hi from B").await;
    for i in 0..3 {
        let t = mesh
            .wait_transcript(i, Duration::from_secs(10), |t| {
                t.len() >= 4 && t.iter().any(|e| e.sender == "C" && e.depth == 1)
            })
            .await;
        let mut got: Vec<&str> = t
            .iter()
            .filter(|e| e.depth == 0)
            .map(|e| e.text.as_str())
            .collect();
        got.sort();
        assert_eq!(
            got,
            ["@C hi from B", "from A on redis", "from C on http"],
            "node {i}"
        );
        assert_eq!(count_ids(&t).0, count_ids(&t).1, "node {i} has a duplicate");
    }
    // A reaches B through the stream and C by HTTP; C, on http, posts to both.
    let a = mesh.metrics(0).await;
    assert!(
        metric(
            &a,
            r#"botmesh_envelopes_out_total{peer="C",result="delivered"}"#
        ) >= 1.0,
        "{a}"
    );
    assert!(!a.contains(r#"peer="B""#), "{a}");
    let c = mesh.metrics(2).await;
    assert!(
        metric(
            &c,
            r#"botmesh_envelopes_out_total{peer="A",result="delivered"}"#
        ) >= 2.0,
        "{c}"
    );
    assert!(
        metric(
            &c,
            r#"botmesh_envelopes_out_total{peer="B",result="delivered"}"#
        ) >= 2.0,
        "{c}"
    );
    assert!(!c.contains("@redis"), "{c}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_stream_is_capped_and_a_bot_away_too_long_is_told_what_it_missed() {
    let redis = RedisServer::start().await;
    let mut mesh = TestMesh::start(spec(&redis, &["A", "B"])).await;
    mesh.post_human(0, "alice", "seen by B").await;
    mesh.wait_transcript(1, Duration::from_secs(10), |t| t.len() == 1)
        .await;
    mesh.stop(1).await;
    for n in 0..150 {
        mesh.post_human(0, "alice", &format!("burst {n}")).await;
    }
    mesh.wait_outboxes_empty(0, Duration::from_secs(5)).await;
    assert_eq!(xlen(&redis).await, 100, "MAXLEN = 100 holds");
    mesh.restart(1).await;
    let t = mesh
        .wait_transcript(1, Duration::from_secs(10), |t| t.len() >= 101)
        .await;
    assert_eq!(t.len(), 101);
    assert_eq!(t.last().unwrap().text, "burst 149");
    assert_eq!(t[1].text, "burst 50", "the 100 newest remain");
    let m = mesh.metrics(1).await;
    assert_metric(&m, r#"botmesh_stream_events_total{result="gap"}"#, 1.0);
    mesh.shutdown().await;
}

#[tokio::test]
async fn each_group_is_its_own_stream_and_new_groups_are_found() {
    let redis = RedisServer::start().await;
    let mesh = TestMesh::start(spec(&redis, &["A", "B"])).await;
    mesh.post_human(0, "alice", "in demo").await;
    for group in ["ops", "研发群"] {
        let r = mesh
            .http
            .post(format!("{}/v1/messages", mesh.api(0)))
            .json(&serde_json::json!({"group": group, "text": format!("in {group}"), "from": "alice"}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    // Groups are separate streams, read in no particular order: wait for each.
    for group in ["demo", "ops", "研发群"] {
        let got: serde_json::Value = wait_for(
            Duration::from_secs(5),
            Duration::from_millis(25),
            || {
                fetch_json(
                    mesh.http
                        .get(format!("{}/v1/transcript", mesh.api(1)))
                        .query(&[("group", group)]),
                )
            },
            |got: &serde_json::Value| got["messages"].as_array().is_some_and(|m| !m.is_empty()),
        )
        .await;
        let msgs = got["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 1, "{group}: {got}");
        assert_eq!(msgs[0]["text"], format!("in {group}"));
    }
    assert_eq!(texts(&mesh.transcript(1).await), ["in demo"]);
    let mut c = redis.client().await;
    let mut groups: Vec<String> = redis::cmd("SMEMBERS")
        .arg("t:groups")
        .query_async(&mut c)
        .await
        .unwrap();
    groups.sort();
    assert_eq!(groups, ["demo", "ops", "研发群"]);
    let len: u64 = redis::cmd("XLEN")
        .arg("t:group:ops")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(len, 1);
    let (_, h) = mesh.health(1).await;
    assert_eq!(h["redis"]["groups"], 3);
    mesh.shutdown().await;
}
