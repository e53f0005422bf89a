//! A real mesh of `botmesh run` processes on 127.0.0.1, and SSE watchers on its nodes.
//!
//! The bench writes a peers.toml (Ed25519 keys in files, as an operator would), starts
//! each node as its own process one after the other (so each start-up time is measured
//! alone), and subscribes to each node's `GET /v1/events` to timestamp arrivals.
//!
//! Bench bots have no role or skills and `participation = "mentions"`: the offline
//! judge never makes them reply, so only transport is measured. `peer_rate_limit` is
//! raised so that the per-peer ingress limit (default 200/s) does not cap the stream,
//! and `max_connections_per_source` so that every bot and the load generator, all on
//! 127.0.0.1, may hold as many connections to one bridge as they like.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use botmesh::wire::signing::{HmacSecret, PairwiseKey, Signer, SigningKey};

use crate::procs::{free_ports, Proc};
use crate::record::Recorder;

/// `[mesh]` settings of the bench mesh (besides group and data folder).
pub const MESH_SETTINGS: &str =
    "peer_rate_limit = 1000000\nmax_connections_per_source = 1024\nretry_base_ms = 50\nretry_max_ms = 1000\nshutdown_grace_secs = 2\n";

/// Settings every bench bot gets.
pub const BOT_SETTINGS: &str = "participation = \"mentions\"\n";

/// One node process.
pub struct NodeProc {
    /// Bot name.
    pub name: String,
    /// The process.
    pub proc: Proc,
    /// Its local API.
    pub api: SocketAddr,
    /// Its peer-facing listener.
    pub bridge: SocketAddr,
    /// Spawn until `/healthz` answered 200.
    pub startup: Duration,
}

/// A running mesh of node processes.
pub struct Mesh {
    /// Holds peers.toml, keys, data and logs.
    pub dir: PathBuf,
    /// The nodes, in peers.toml order.
    pub nodes: Vec<NodeProc>,
    /// Each bot's signer (the bench signs direct-bridge envelopes with them).
    pub signers: Vec<Signer>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
}

/// Bot name of node `i`.
pub fn bot_name(i: usize) -> String {
    format!("node{i}")
}

impl Mesh {
    /// Writes the config into `dir` and starts `n` nodes of `bin`, one at a time.
    /// `hmac`: one mesh-wide HMAC secret instead of per-bot Ed25519 keys;
    /// `ed25519_only`: the signers (for the bench's own posts) add no pairwise entries.
    pub async fn start(
        bin: &Path,
        dir: &Path,
        n: usize,
        hmac: bool,
        ed25519_only: bool,
        http: &reqwest::Client,
    ) -> anyhow::Result<Mesh> {
        std::fs::create_dir_all(dir)?;
        let mut toml = format!("[mesh]\ngroup = \"demo\"\ndata_dir = \"data\"\n{MESH_SETTINGS}");
        let secret = hmac.then(HmacSecret::generate);
        if let Some(s) = &secret {
            std::fs::write(dir.join("mesh.secret"), s.to_whsec())?;
            toml.push_str("secret_file = \"mesh.secret\"\n");
        }
        toml.push('\n');
        let mut addrs = Vec::new();
        let mut signers = Vec::new();
        // Per-bot keys, made up front so each signer can derive its pairwise keys.
        let keys: Vec<(String, SigningKey)> = match &secret {
            Some(_) => Vec::new(),
            None => (0..n)
                .map(|i| (bot_name(i), SigningKey::generate()))
                .collect(),
        };
        let mut ports = free_ports(2 * n)?.into_iter();
        for i in 0..n {
            let name = bot_name(i);
            let bridge = SocketAddr::from(([127, 0, 0, 1], ports.next().expect("two per bot")));
            let api = SocketAddr::from(([127, 0, 0, 1], ports.next().expect("two per bot")));
            toml.push_str(&format!(
                "[[bots]]\nname = \"{name}\"\nbridge = \"{bridge}\"\napi = \"{api}\"\n{BOT_SETTINGS}"
            ));
            match &secret {
                Some(s) => signers.push(Signer {
                    pairwise: Default::default(),
                    hmac: vec![s.clone()],
                    ed25519: vec![],
                }),
                None => {
                    let key = keys[i].1.clone();
                    let key_file = format!("{name}.key");
                    std::fs::write(dir.join(&key_file), key.to_whsk())?;
                    toml.push_str(&format!(
                        "public_key = \"{}\"\nprivate_key_file = \"{key_file}\"\n",
                        key.public_key().to_whpk()
                    ));
                    // As the node's own outbox signs: v1a plus a pairwise entry per peer
                    // (unless `ed25519_only`: v1a alone, as an older sender would).
                    let pairwise = keys
                        .iter()
                        .filter(|(peer, _)| *peer != name && !ed25519_only)
                        .filter_map(|(peer, k)| {
                            PairwiseKey::sending(&key, &name, &k.public_key(), peer)
                                .map(|pk| (peer.clone(), pk))
                        })
                        .collect();
                    signers.push(Signer {
                        pairwise,
                        hmac: vec![],
                        ed25519: vec![key],
                    });
                }
            }
            toml.push('\n');
            addrs.push((name, bridge, api));
        }
        let config = dir.join("peers.toml");
        std::fs::write(&config, toml)?;
        let mut mesh = Mesh {
            dir: dir.to_path_buf(),
            nodes: Vec::new(),
            signers,
            watchers: Vec::new(),
        };
        for (name, bridge, api) in addrs {
            let mut cmd = Command::new(bin);
            cmd.args(["run", "--bot", &name, "--config"])
                .arg(&config)
                .env_remove("BOTMESH_LOG");
            let log = dir.join(format!("{name}.log"));
            let mut proc = Proc::spawn(&name, cmd, Some(&log))?;
            let startup = wait_healthy(&mut proc, &format!("http://{api}/healthz"), http).await?;
            mesh.nodes.push(NodeProc {
                name,
                proc,
                api,
                bridge,
                startup,
            });
        }
        Ok(mesh)
    }

    /// Pids of all nodes.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.proc.pid).collect()
    }

    /// Subscribes to the events of nodes `1..` (receiver `i - 1` is node `i`); returns
    /// once every subscription is live.
    pub async fn watch(&mut self, recorder: Arc<Recorder>) -> anyhow::Result<()> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .build()?;
        for (receiver, node) in self.nodes.iter().enumerate().skip(1) {
            let url = format!("http://{}/v1/events?group=demo", node.api);
            let resp = client
                .get(&url)
                .send()
                .await
                .with_context(|| format!("subscribing to {url}"))?;
            if !resp.status().is_success() {
                bail!("{url}: {}", resp.status());
            }
            self.watchers
                .push(tokio::spawn(sse_loop(resp, receiver - 1, recorder.clone())));
        }
        Ok(())
    }

    /// Stops every node (SIGTERM, bounded wait) and the watchers.
    pub fn stop(&mut self) {
        for w in self.watchers.drain(..) {
            w.abort();
        }
        for n in &mut self.nodes {
            n.proc.stop(Duration::from_secs(4));
        }
    }

    /// Lines in all node logs that report a warning or error, for the report.
    pub fn log_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for n in &self.nodes {
            let text = std::fs::read_to_string(self.dir.join(format!("{}.log", n.name)))
                .unwrap_or_default();
            out.extend(
                text.lines()
                    .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                    .take(5)
                    .map(|l| format!("{}: {l}", n.name)),
            );
        }
        out
    }
}

/// Polls `url` every millisecond until it answers 200; returns the time since spawn.
pub async fn wait_healthy(
    proc: &mut Proc,
    url: &str,
    http: &reqwest::Client,
) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(r) = http
            .get(url)
            .timeout(Duration::from_millis(500))
            .send()
            .await
        {
            if r.status().is_success() {
                return Ok(proc.spawned.elapsed());
            }
        }
        proc.check_alive()?;
        if Instant::now() > deadline {
            bail!("{} did not answer {url} within 15 s", proc.name);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Reads one SSE stream: every `message` event's arrival is timestamped when its chunk
/// arrives; `lagged` events are counted.
async fn sse_loop(mut resp: reqwest::Response, receiver: usize, recorder: Arc<Recorder>) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    while let Ok(Some(chunk)) = resp.chunk().await {
        let at = Instant::now();
        buf.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(end) = find(&buf[start..], b"\n\n") {
            let event = &buf[start..start + end];
            if event.starts_with(b"event: message\n") {
                recorder.arrived(receiver, event, at);
            } else if event.starts_with(b"event: lagged\n") {
                let missed = std::str::from_utf8(event)
                    .ok()
                    .and_then(|s| s.split("\"missed\":").nth(1))
                    .and_then(|s| s.trim_end_matches(['}', '\n']).parse::<u64>().ok())
                    .unwrap_or(1);
                recorder
                    .lagged
                    .fetch_add(missed, std::sync::atomic::Ordering::Relaxed);
            }
            start += end + 2;
        }
        buf.drain(..start);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
