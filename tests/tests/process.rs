//! The `botmesh` binary as an operator runs it: real processes, real signals.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use botmesh_tests::botmesh_bin;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn sigterm(p: &Proc) {
    let ok = Command::new("kill")
        .args(["-TERM", &p.0.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

async fn wait_healthy(http: &reqwest::Client, api: &str) {
    for _ in 0..200 {
        if http
            .get(format!("{api}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{api} never became healthy");
}

#[tokio::test]
async fn two_processes_exchange_messages_and_stop_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let key_a = dir.path().join("a.key");
    let key_b = dir.path().join("b.key");
    let mut public = Vec::new();
    for key in [&key_a, &key_b] {
        let out = Command::new(botmesh_bin())
            .args(["keygen", "--private-out"])
            .arg(key)
            .output()
            .unwrap();
        public.push(String::from_utf8(out.stdout).unwrap().trim().to_string());
    }
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let toml = format!(
        "[mesh]\ndata_dir = \"data\"\nshutdown_grace_secs = 2\n\
[[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:{}\"\napi = \"127.0.0.1:{}\"\npublic_key = \"{}\"\nprivate_key_file = \"a.key\"\nparticipation = \"mentions\"\n\
[[bots]]\nname = \"B\"\nbridge = \"127.0.0.1:{}\"\napi = \"127.0.0.1:{}\"\npublic_key = \"{}\"\nprivate_key_file = \"b.key\"\nparticipation = \"mentions\"\n",
        ports[0], ports[1], public[0], ports[2], ports[3], public[1]
    );
    let config = dir.path().join("peers.toml");
    std::fs::write(&config, toml).unwrap();
    let spawn = |bot: &str| {
        Proc(
            Command::new(botmesh_bin())
                .args(["run", "--bot", bot, "--config"])
                .arg(&config)
                .env("BOTMESH_LOG", "info")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    let a = spawn("A");
    let b = spawn("B");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let (api_a, api_b) = (
        format!("http://127.0.0.1:{}", ports[1]),
        format!("http://127.0.0.1:{}", ports[3]),
    );
    wait_healthy(&http, &api_a).await;
    wait_healthy(&http, &api_b).await;

    let r: serde_json::Value = http
        .post(format!("{api_a}/v1/messages"))
        .json(&serde_json::json!({"text": "across processes", "from": "alice"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = r["id"].as_str().unwrap().to_string();
    let mut seen = false;
    for _ in 0..200 {
        let t: serde_json::Value = http
            .get(format!("{api_b}/v1/transcript"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if t["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == id.as_str())
        {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(seen, "B received A's message");

    // The operator's tools against the running processes.
    let quiet = Command::new(botmesh_bin())
        .args(["quiet", "--bot", "B", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        quiet.status.success(),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
    let info: serde_json::Value = http
        .get(format!("{api_b}/v1/info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["quiet"], true);
    let off = Command::new(botmesh_bin())
        .args(["quiet", "--off", "--bot", "B", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(off.status.success());
    let info: serde_json::Value = http
        .get(format!("{api_b}/v1/info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["quiet"], false);
    // explain needs no running node and no secrets: run it with the key files gone.
    let explain = Command::new(botmesh_bin())
        .args(["explain", "--bot", "A", "--from", "alice", "--config"])
        .arg(&config)
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

    for p in [&a, &b] {
        sigterm(p);
    }
    for (name, mut p) in [("A", a), ("B", b)] {
        let status = p.0.wait().unwrap();
        let mut log = String::new();
        std::io::Read::read_to_string(p.0.stderr.as_mut().unwrap(), &mut log).unwrap();
        assert!(status.success(), "{name} exit {status:?}\n{log}");
        assert!(
            log.contains("SIGTERM received") && log.contains("stopped"),
            "{name}:\n{log}"
        );
    }
    // The transcript is on disk for the next start.
    let file = dir.path().join("data/B/transcripts/demo.jsonl");
    assert!(std::fs::read_to_string(file).unwrap().contains(&id));
}
