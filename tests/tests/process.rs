//! The `botmesh` binary as an operator runs it: real processes, real signals, the CLIs.

use std::process::Command;
use std::time::Duration;

use botmesh_tests::{botmesh_bin, explain_cli, fetch_json, ProcessMesh};

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
    botmesh_tests::command::run_ok(
        Command::new(botmesh_bin())
            .args(["quiet", "--bot", "B", "--config"])
            .arg(&mesh.config),
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
    let e = explain_cli(&mesh.config, "A", "alice", "hey @a, and ops@a.dev too");
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

#[tokio::test]
async fn sighup_and_botmesh_reload_reread_the_file_and_the_node_lives_on() {
    let mut mesh = ProcessMesh::start(&["A"], "", "participation = \"mentions\"").await;
    let info = |mesh: &ProcessMesh| fetch_json(mesh.http.get(format!("{}/v1/info", mesh.apis[0])));
    let edit = |mesh: &ProcessMesh, from: &str, to: &str| {
        let text = std::fs::read_to_string(&mesh.config).unwrap();
        assert!(text.contains(from), "{text}");
        std::fs::write(&mesh.config, text.replacen(from, to, 1)).unwrap();
    };
    assert_eq!(info(&mesh).await["quiet"], false);

    // SIGHUP, which used to end the node, reloads the file: quiet = true applies.
    edit(
        &mesh,
        "participation = \"mentions\"",
        "participation = \"mentions\"\nquiet = true",
    );
    let pid = mesh.procs[0].as_ref().unwrap().id().to_string();
    let sent = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(sent.success());
    let quiet = botmesh_tests::wait_for(
        Duration::from_secs(10),
        Duration::from_millis(25),
        || info(&mesh),
        |i| i["quiet"] == true,
    )
    .await;
    assert_eq!(quiet["quiet"], true, "{}", mesh.log(0));
    assert!(
        mesh.procs[0]
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
            .is_none(),
        "the node lives on after SIGHUP:\n{}",
        mesh.log(0)
    );
    assert!(
        mesh.log(0).contains("configuration reloaded"),
        "{}",
        mesh.log(0)
    );

    // botmesh reload: the same through the local API, printing what applied.
    edit(&mesh, "quiet = true", "quiet = false");
    let out = botmesh_tests::command::run_ok(
        Command::new(botmesh_bin())
            .args(["reload", "--bot", "A", "--config"])
            .arg(&mesh.config),
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["applied"], serde_json::json!(["bots[0].quiet"]));
    assert_eq!(info(&mesh).await["quiet"], false);

    // A broken file: SIGHUP is refused with the start-up error (in /healthz), the
    // node runs on; the CLI, which reads the file for the bot's address, fails with
    // the same error without asking the node.
    edit(&mesh, "quiet = false", "quiet = \"maybe\"");
    let sent = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(sent.success());
    let health =
        |mesh: &ProcessMesh| fetch_json(mesh.http.get(format!("{}/healthz", mesh.apis[0])));
    let h = botmesh_tests::wait_for(
        Duration::from_secs(10),
        Duration::from_millis(25),
        || health(&mesh),
        |h| h["config_reload"]["result"] == "refused",
    )
    .await;
    assert_eq!(h["status"], "ok", "{h}");
    assert!(
        h["config_reload"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("bots[0].quiet")),
        "{h}"
    );
    let out = Command::new(botmesh_bin())
        .args(["reload", "--bot", "A", "--config"])
        .arg(&mesh.config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("bots[0].quiet"), "{err}");
    assert_eq!(mesh.health(0).await, Some(200));

    let status = mesh.terminate(0);
    assert!(status.success(), "{}", mesh.log(0));
}

#[tokio::test]
async fn tokio_worker_threads_sets_the_runtime_workers_and_a_bad_value_stops_the_node() {
    let mut mesh = ProcessMesh::configure(&["A"], "", "participation = \"mentions\"");
    // A bad value ends the process with an error naming the variable, before any port
    // is bound (tokio itself would panic on it).
    for bad in ["0", "two", ""] {
        let run = tokio::process::Command::new(botmesh_bin())
            .args(["run", "--bot", "A", "--config"])
            .arg(&mesh.config)
            .env("TOKIO_WORKER_THREADS", bad)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(10), run)
            .await
            .unwrap_or_else(|_| panic!("TOKIO_WORKER_THREADS={bad:?}: the node did not stop"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad:?}: {stderr}");
        assert!(
            stderr.contains("TOKIO_WORKER_THREADS must be a whole number of at least 1"),
            "{bad:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{bad:?}: {stderr}");
    }
    // A good one is the number of workers the node runs, and says so at start-up.
    mesh.spawn_with(0, &[("TOKIO_WORKER_THREADS", "1")]).await;
    let id = mesh.post(0, "served by one worker").await;
    assert!(id.is_some(), "{}", mesh.log(0));
    assert!(
        mesh.log(0).contains("runtime started") && mesh.log(0).contains("workers=1"),
        "{}",
        mesh.log(0)
    );
    assert!(mesh.terminate(0).success(), "{}", mesh.log(0));
}
