//! The `botmesh` binary as an operator runs it: real processes, real signals, the CLIs.

use std::process::Command;
use std::time::Duration;

use botmesh_tests::{botmesh_bin, fetch_json, ProcessMesh};

#[tokio::test]
async fn two_processes_exchange_messages_and_stop_cleanly_on_sigterm() {
    let mut mesh = ProcessMesh::start(&["A", "B"], "", "participation = \"mentions\"").await;
    let id = mesh.post(0, "across processes").await.expect("accepted");
    let seen = mesh
        .wait_ids(1, Duration::from_secs(5), |ids| ids.contains(&id))
        .await
        .contains(&id);
    assert!(seen, "B received A's message");

    // The operator's tools against the running processes.
    let info = |mesh: &ProcessMesh| fetch_json(mesh.http.get(format!("{}/v1/info", mesh.apis[1])));
    let quiet = Command::new(botmesh_bin())
        .args(["quiet", "--bot", "B", "--config"])
        .arg(&mesh.config)
        .output()
        .unwrap();
    assert!(
        quiet.status.success(),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
    assert_eq!(info(&mesh).await["quiet"], true);
    let off = Command::new(botmesh_bin())
        .args(["quiet", "--off", "--bot", "B", "--config"])
        .arg(&mesh.config)
        .output()
        .unwrap();
    assert!(off.status.success());
    assert_eq!(info(&mesh).await["quiet"], false);
    // explain needs no running node and no secrets: run it with an empty environment.
    let explain = Command::new(botmesh_bin())
        .args(["explain", "--bot", "A", "--from", "alice", "--config"])
        .arg(&mesh.config)
        .arg("hey @a, and ops@a.dev too")
        .env_clear()
        .output()
        .unwrap();
    assert!(
        explain.status.success(),
        "{}",
        String::from_utf8_lossy(&explain.stderr)
    );
    let e: serde_json::Value = serde_json::from_slice(&explain.stdout).unwrap();
    assert_eq!(
        (
            e["mentioned"].as_bool(),
            e["action"].as_str(),
            e["reason"].as_str()
        ),
        (Some(true), Some("reply"), Some("mentioned"))
    );
    assert_eq!(e["mentions"], serde_json::json!(["A"]));

    for i in 0..2 {
        let status = mesh.terminate(i);
        let log = mesh.log(i);
        assert!(status.success(), "exit {status:?}\n{log}");
        assert!(
            log.contains("SIGTERM received") && log.contains("stopped"),
            "{log}"
        );
    }
    // The transcript is on disk for the next start.
    let file = mesh.dir.path().join("data/B/transcripts/demo.jsonl");
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(&id));
    // A clean stop gives back the zeroed space kept ahead of the lines.
    assert!(!text.contains('\0') && text.ends_with('\n'), "{text:?}");
}
