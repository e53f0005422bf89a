//! A full disk, for real: a `botmesh run` process whose data folder is a 1 MiB tmpfs in
//! a private mount namespace made by the test (it exists only inside that namespace and
//! vanishes with it; nothing outside the test is touched). The test fills it with a
//! ballast file through `/proc/<pid>/root`, and checks: 503 with a clear error, /healthz
//! unhealthy with the reason, a log line, nothing half-written; once the ballast is gone,
//! posts succeed and health is ok again; after `kill -9` and a torn tail, a restart loads
//! every acknowledged message and reports the dropped tail.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use botmesh_tests::{botmesh_bin, wait_for, ProcessMesh};

/// Kills and reaps a child when dropped.
struct Reap(Child);
impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Why mount namespaces cannot be used here, if they cannot.
fn namespaces_unavailable() -> Option<String> {
    let probe = tempfile::tempdir().ok()?;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size=64k tmpfs {} && umount {}",
            probe.path().display(),
            probe.path().display()
        ))
        .output();
    match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "unshare/mount refused: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run unshare: {e}")),
    }
}

/// The path `p` as seen inside the namespace of process `pid`.
fn inside(pid: u32, p: &Path) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{}", p.display()))
}

struct Harness {
    mesh: ProcessMesh,
    /// Holds the namespace (and so the tmpfs) open across node restarts.
    holder: Reap,
    node: Option<Reap>,
    data: PathBuf,
}

impl Harness {
    fn start_node(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.mesh.dir.path().join("A.log"))
            .unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--mount=/proc/{}/ns/mnt", self.holder.0.id()))
            .arg("--")
            .arg(botmesh_bin())
            .args(["run", "--bot", "A", "--config"])
            .arg(&self.mesh.config)
            .env("BOTMESH_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.node = Some(Reap(child));
    }

    async fn wait_up(&self) {
        let answered = wait_for(
            Duration::from_secs(10),
            Duration::from_millis(25),
            || self.mesh.health(0),
            Option::is_some,
        )
        .await;
        assert!(
            answered.is_some(),
            "node never answered:\n{}",
            self.mesh.log(0)
        );
    }

    async fn post(&self, text: &str) -> (u16, serde_json::Value) {
        let r = self
            .mesh
            .http
            .post(format!("{}/v1/messages", self.mesh.apis[0]))
            .json(&serde_json::json!({"text": text, "from": "alice"}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or_default())
    }

    async fn health(&self) -> (u16, serde_json::Value) {
        let r = self
            .mesh
            .http
            .get(format!("{}/healthz", self.mesh.apis[0]))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or_default())
    }

    /// The transcript file as the node sees it.
    fn transcript_file(&self) -> PathBuf {
        inside(
            self.holder.0.id(),
            &self.data.join("A/transcripts/demo.jsonl"),
        )
    }
}

/// The log without terminal colour codes.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Every line of the transcript file is whole JSON; returns the ids in file order.
/// A running node keeps zeroed space after the last line: the lines end at the first
/// NUL, and everything after it must be zeros.
fn file_ids(path: &Path) -> Vec<String> {
    let all = std::fs::read(path).unwrap();
    let end = all.iter().position(|&b| b == 0).unwrap_or(all.len());
    assert!(
        all[end..].iter().all(|&b| b == 0),
        "data after the zeroed space"
    );
    let bytes = &all[..end];
    assert!(
        bytes.is_empty() || bytes.ends_with(b"\n"),
        "transcript ends mid-line"
    );
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(l)
                .unwrap_or_else(|e| panic!("corrupt line {:?}: {e}", String::from_utf8_lossy(l)));
            v["id"].as_str().unwrap().to_string()
        })
        .collect()
}

#[tokio::test]
async fn disk_full_gives_503_and_unhealthy_keeps_files_whole_and_recovers() {
    if let Some(why) = namespaces_unavailable() {
        eprintln!("SKIPPED disk_full test: {why} (needs root and mount namespaces)");
        return;
    }
    // A one-bot mesh: the node's config, keys and ports, as an operator would have them.
    let mut mesh = ProcessMesh::start(&["A"], "", "participation = \"mentions\"").await;
    mesh.terminate(0);
    let data = mesh.dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let holder = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size=1m tmpfs {} && exec sleep 600",
            data.display()
        ))
        .spawn()
        .unwrap();
    let mut h = Harness {
        mesh,
        holder: Reap(holder),
        node: None,
        data: data.clone(),
    };
    let holder_pid = h.holder.0.id();
    wait_for(
        Duration::from_secs(2),
        Duration::from_millis(10),
        || async {
            std::fs::read_to_string(format!("/proc/{holder_pid}/mountinfo")).unwrap_or_default()
        },
        |info| info.contains(&format!(" {} ", data.display())),
    )
    .await;
    h.start_node();
    h.wait_up().await;
    let mut acked = Vec::new();
    for n in 0..5 {
        let (s, v) = h.post(&format!("before the disk fills {n}")).await;
        assert_eq!(s, 200, "{v}");
        acked.push(v["id"].as_str().unwrap().to_string());
    }

    // Fill the tmpfs.
    let ballast = inside(holder_pid, &data.join("ballast"));
    {
        let mut f = std::fs::File::create(&ballast).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        let mut filled = false;
        for _ in 0..64 {
            if f.write_all(&chunk).is_err() {
                filled = true;
                break;
            }
        }
        assert!(filled, "a 1 MiB tmpfs should fill up");
    }
    // The transcript's preallocated space (up to 64 KiB, zeroed before the disk
    // filled) still takes lines; then writes must fail.
    let mut refused = 0;
    for n in 0..1000 {
        let (s, v) = h.post(&format!("while the disk is full {n}")).await;
        match s {
            200 => acked.push(v["id"].as_str().unwrap().to_string()),
            503 => {
                let e = v["error"].as_str().unwrap_or_default();
                assert!(e.contains("No space left"), "clear error: {v}");
                refused += 1;
                if refused == 3 {
                    break;
                }
            }
            other => panic!("unexpected {other}: {v}"),
        }
    }
    assert_eq!(refused, 3, "writes never failed on a full disk");
    let (s, v) = h.health().await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["status"], "degraded");
    assert!(
        v["storage_error"]
            .as_str()
            .unwrap_or_default()
            .contains("No space left"),
        "{v}"
    );
    assert!(
        h.mesh.log(0).contains("transcript write failed"),
        "{}",
        h.mesh.log(0)
    );
    // Nothing half-written: the file holds exactly the acknowledged messages.
    assert_eq!(file_ids(&h.transcript_file()), acked);

    // Space returns: the next post succeeds and health is ok again.
    std::fs::remove_file(&ballast).unwrap();
    let (s, v) = h.post("after space returns").await;
    assert_eq!(s, 200, "{v}");
    acked.push(v["id"].as_str().unwrap().to_string());
    let (s, v) = h.health().await;
    assert_eq!((s, &v["status"]), (200, &"ok".into()), "{v}");
    assert_eq!(file_ids(&h.transcript_file()), acked);

    // Power loss mid-line: kill -9, a torn tail, restart in the same namespace.
    h.node.take();
    {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(h.transcript_file())
            .unwrap();
        f.write_all(br#"{"v":1,"id":"01JTORN"#).unwrap();
    }
    h.start_node();
    h.wait_up().await;
    let ids = h.mesh.ids(0).await;
    assert_eq!(ids, acked, "every acknowledged message, nothing else");
    let log = strip_ansi(&h.mesh.log(0));
    assert!(log.contains("dropping the torn tail"), "{log}");
    assert!(log.contains("dropped_lines=1"), "{log}");
    assert_eq!(file_ids(&h.transcript_file()), acked);
    eprintln!(
        "disk full: {} acknowledged, {refused} refused with 503, recovered after the ballast was removed",
        acked.len()
    );
}
