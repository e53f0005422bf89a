//! Sidecar mode: the Python example bot answers turns its node decided to take.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Why};
use botmesh_tests::{MeshSpec, TestMesh};

struct Sidecar(Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts examples/sidecar_bot.py on `port`; returns it and the webhook URL it printed.
fn start_sidecar(mode: &str, node: &str, port: u16) -> (Sidecar, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/sidecar_bot.py");
    let mut child = Command::new("python3")
        .args([
            script,
            "--port",
            &port.to_string(),
            "--mode",
            mode,
            "--node",
            node,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the example");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .expect("startup line")
        .to_string();
    (Sidecar(child), url)
}

#[tokio::test]
async fn the_python_example_bot_takes_turns_in_both_modes() {
    for mode in ["sync", "async"] {
        // The sidecar needs B's API address before the mesh starts: reserve it.
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let webhook_port = probe.local_addr().unwrap().port();
        drop(probe);
        let webhook = format!("http://127.0.0.1:{webhook_port}/turn");
        let spec = MeshSpec::mentions_only(&["A", "B"]).bot(
            "B",
            &format!("agent = {{ webhook = \"{webhook}\", timeout_ms = 5000 }}"),
        );
        let mesh = TestMesh::start(spec).await;
        let (_sidecar, url) = start_sidecar(mode, &mesh.api(1), webhook_port);
        assert_eq!(url, webhook);

        let trigger = mesh.post_human(0, "alice", "@B what's the status?").await;
        let t = mesh
            .wait_transcript(0, Duration::from_secs(10), |t| {
                t.iter().any(|e| e.author.kind == AuthorKind::Bot)
            })
            .await;
        let reply = t
            .iter()
            .find(|e| e.author.kind == AuthorKind::Bot)
            .unwrap_or_else(|| panic!("{mode}: no reply"));
        assert_eq!(reply.author.name, "B");
        assert!(
            reply.text.starts_with("B (sidecar) got it, alice"),
            "{mode}: {}",
            reply.text
        );
        assert_eq!(reply.depth, 1);
        assert_eq!(reply.reply_to.map(|r| r.to_string()), Some(trigger.clone()));
        let why = if mode == "sync" {
            Why::Mentioned
        } else {
            Why::Posted
        };
        assert_eq!(reply.why, Some(why));
        mesh.shutdown().await;
    }
}
