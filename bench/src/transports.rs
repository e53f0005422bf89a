//! `botmesh-bench transports`: the HTTP mesh against the Redis Streams transport at
//! 3, 8 and 32 bots, in one run, with the same load.
//!
//! Every mesh runs in this process (real nodes: listeners on 127.0.0.1, transcripts on
//! disk, signed envelopes, a real redis-server), so CPU is the process's own plus the
//! redis-server's. For each transport and size: a warm-up, a paced phase (latency from
//! the POST at node0's API to the message event at every other node), then a
//! closed-loop phase (how fast every node has every message, and CPU per message).
//! Messages carry 500 bytes of text, as in the main benchmark.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use botmesh::app::lifecycle::RunningNode;
use botmesh::config::{NodeConfig, Settings};
use botmesh::telemetry::events::Event;
use botmesh::wire::signing::SigningKey;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::procs::cpu_secs;
use crate::redis::RedisServer;
use crate::stats::Latency;

/// Load sizes of one (transport, size) cell.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Warm-up messages (not measured).
    pub warmup: usize,
    /// Messages in the paced phase.
    pub paced: usize,
    /// Their rate, per second.
    pub rate: f64,
    /// Messages in the closed-loop phase.
    pub saturated: usize,
    /// POSTs in flight in the closed-loop phase.
    pub concurrency: usize,
    /// Longest wait for one phase's deliveries.
    pub phase_limit: Duration,
}

impl Load {
    /// `--quick` or full sizes.
    pub fn new(quick: bool) -> Load {
        if quick {
            Load {
                warmup: 5,
                paced: 40,
                rate: 40.0,
                saturated: 150,
                concurrency: 8,
                phase_limit: Duration::from_secs(20),
            }
        } else {
            Load {
                warmup: 20,
                paced: 300,
                rate: 50.0,
                saturated: 1500,
                concurrency: 16,
                phase_limit: Duration::from_secs(90),
            }
        }
    }
}

/// One measured cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// `http` or `redis`.
    pub transport: String,
    /// Bots in the mesh.
    pub bots: usize,
    /// Paced phase: send → arrival at each receiver.
    pub latency: Latency,
    /// Paced phase: send → arrival at the last receiver.
    pub latency_all: Latency,
    /// Closed-loop phase: messages fully delivered (to every other bot) per second.
    pub messages_per_s: f64,
    /// The same, counted per receiver: messages × (bots − 1) per second.
    pub deliveries_per_s: f64,
    /// CPU seconds (this process + redis-server) per 1,000 messages, closed loop.
    pub cpu_s_per_1000: f64,
    /// Deliveries that never arrived within the phase limit (should be 0).
    pub missing: usize,
    /// Wall time to start every node.
    pub startup_ms: f64,
}

/// Runs every (transport, size) cell; `redis_bin` None skips the Redis transport.
pub async fn run(
    sizes: &[usize],
    load: Load,
    redis_bin: Option<&Path>,
    tmp: &Path,
) -> anyhow::Result<Vec<Cell>> {
    let mut cells = Vec::new();
    for &n in sizes {
        for transport in ["http", "redis"] {
            let dir = tmp.join(format!("{transport}-{n}"));
            std::fs::create_dir_all(&dir)?;
            let redis = match (transport, redis_bin) {
                ("redis", Some(bin)) => Some(RedisServer::start(bin, &dir).await?),
                ("redis", None) => continue,
                _ => None,
            };
            let cell = measure(transport, n, load, redis.as_ref(), &dir).await;
            if let Some(r) = redis {
                r.stop().await;
            }
            let cell = cell.with_context(|| format!("{transport} with {n} bots"))?;
            eprintln!(
                "  {transport:>5} {n:>2} bots: p50 {:.2} ms p99 {:.2} ms (all: p99 {:.2}) | {:.0} msg/s, {:.0} deliveries/s | {:.2} CPU s/1000 msg | missing {}",
                cell.latency.p50_ms,
                cell.latency.p99_ms,
                cell.latency_all.p99_ms,
                cell.messages_per_s,
                cell.deliveries_per_s,
                cell.cpu_s_per_1000,
                cell.missing
            );
            cells.push(cell);
        }
    }
    Ok(cells)
}

/// A started in-process mesh.
struct Mesh {
    nodes: Vec<RunningNode>,
    http: reqwest::Client,
}

impl Mesh {
    async fn start(
        transport: &str,
        n: usize,
        redis: Option<&RedisServer>,
        dir: &Path,
    ) -> anyhow::Result<Mesh> {
        let mut toml = format!(
            "[mesh]\ngroup = \"demo\"\ndata_dir = \"data\"\n{}transport = \"{transport}\"\n",
            crate::mesh::MESH_SETTINGS
        );
        if let Some(r) = redis {
            toml.push_str(&format!(
                "[redis]\nurl = \"redis://127.0.0.1:{}\"\nkey_prefix = \"bench:\"\n",
                r.port
            ));
        }
        let mut listeners = Vec::new();
        for i in 0..n {
            let bridge = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let api = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let key = SigningKey::generate();
            let key_file = format!("node{i}.key");
            std::fs::write(dir.join(&key_file), key.to_whsk())?;
            toml.push_str(&format!(
                "[[bots]]\nname = \"node{i}\"\nbridge = \"{}\"\napi = \"{}\"\npublic_key = \"{}\"\nprivate_key_file = \"{key_file}\"\n{}\n",
                bridge.local_addr()?,
                api.local_addr()?,
                key.public_key().to_whpk(),
                crate::mesh::BOT_SETTINGS
            ));
            listeners.push((bridge, api));
        }
        let path = dir.join("peers.toml");
        std::fs::write(&path, &toml)?;
        let settings = Settings::load_with_env(&path, &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
        let env: HashMap<String, String> = HashMap::new();
        let mut nodes = Vec::new();
        for (i, (bridge, api)) in listeners.into_iter().enumerate() {
            let cfg = NodeConfig::resolve(settings.clone(), &format!("node{i}"), None, &env)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            nodes.push(botmesh::app::lifecycle::start(cfg, bridge, api).await?);
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(Mesh { nodes, http })
    }

    /// Starts recording, at every node but node0, when each numbered message arrives.
    fn watch(&self, total: usize) -> Vec<tokio::task::JoinHandle<Vec<Option<Instant>>>> {
        self.nodes
            .iter()
            .skip(1)
            .map(|n| {
                let mut rx = n.node.events.subscribe();
                tokio::spawn(async move {
                    let mut got: Vec<Option<Instant>> = vec![None; total];
                    let mut left = total;
                    while left > 0 {
                        match rx.recv().await {
                            Ok(Event::Message { envelope }) => {
                                let at = Instant::now();
                                if let Some(k) = seq_of(&envelope.text) {
                                    if k < total && got[k].is_none() {
                                        got[k] = Some(at);
                                        left -= 1;
                                    }
                                }
                            }
                            Ok(_) => {}
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                            Err(_) => break,
                        }
                    }
                    got
                })
            })
            .collect()
    }

    async fn post(&self, k: usize) -> anyhow::Result<()> {
        let api = self.nodes[0].api_addr;
        let text = format!(
            "#{k:06} {}",
            crate::record::text(0, k, crate::load::TEXT_BYTES)
        );
        let r = self
            .http
            .post(format!("http://{api}/v1/messages"))
            .json(&serde_json::json!({"text": text, "from": "alice"}))
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("POST /v1/messages: {}", r.status());
        }
        r.bytes().await?;
        Ok(())
    }

    async fn stop(self) {
        for n in self.nodes {
            n.shutdown().await;
        }
    }
}

/// The message number `#000123` a bench text starts with.
fn seq_of(text: &str) -> Option<usize> {
    text.strip_prefix('#')?.get(..6)?.parse().ok()
}

/// Waits for the watchers (bounded); returns arrivals per receiver.
async fn collect(
    watchers: Vec<tokio::task::JoinHandle<Vec<Option<Instant>>>>,
    total: usize,
    limit: Duration,
) -> Vec<Vec<Option<Instant>>> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut out = Vec::new();
    for mut w in watchers {
        match tokio::time::timeout_at(deadline, &mut w).await {
            Ok(Ok(got)) => out.push(got),
            _ => {
                w.abort();
                out.push(vec![None; total]);
            }
        }
    }
    out
}

async fn measure(
    transport: &str,
    n: usize,
    load: Load,
    redis: Option<&RedisServer>,
    dir: &Path,
) -> anyhow::Result<Cell> {
    let t0 = Instant::now();
    let mesh = Mesh::start(transport, n, redis, dir).await?;
    let startup_ms = t0.elapsed().as_secs_f64() * 1e3;
    let me = std::process::id();
    let redis_pid = redis.map(|r| r.proc.pid);
    let cpu = || cpu_secs(me).unwrap_or(0.0) + redis_pid.and_then(cpu_secs).unwrap_or(0.0);

    // Numbers are global across phases so late arrivals of one phase never count in another.
    let total = load.warmup + load.paced + load.saturated;
    let watchers = mesh.watch(total);
    for k in 0..load.warmup {
        mesh.post(k).await?;
    }
    // Paced: one message every 1/rate seconds.
    let mut sent_at: Vec<Option<Instant>> = vec![None; total];
    let gap = Duration::from_secs_f64(1.0 / load.rate);
    let mut tick = tokio::time::interval(gap);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (k, slot) in sent_at
        .iter_mut()
        .enumerate()
        .skip(load.warmup)
        .take(load.paced)
    {
        tick.tick().await;
        *slot = Some(Instant::now());
        mesh.post(k).await?;
    }
    // Closed loop: `concurrency` POSTs in flight.
    let first = load.warmup + load.paced;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu0 = cpu();
    let started = Instant::now();
    let gate = Arc::new(Semaphore::new(load.concurrency));
    let mesh = Arc::new(mesh);
    let mut posts = tokio::task::JoinSet::new();
    for k in first..total {
        let permit = gate.clone().acquire_owned().await?;
        let m = mesh.clone();
        posts.spawn(async move {
            let r = m.post(k).await;
            drop(permit);
            r
        });
    }
    while let Some(r) = posts.join_next().await {
        r??;
    }
    let arrivals = collect(watchers, total, load.phase_limit).await;
    let cpu1 = cpu();
    let mesh = Arc::into_inner(mesh).context("posts still hold the mesh")?;
    mesh.stop().await;

    let mut each = Vec::new();
    let mut all = Vec::new();
    let mut missing = 0;
    for k in load.warmup..first {
        let sent = sent_at[k].expect("paced sends are timed");
        let mut last = None::<Instant>;
        for r in &arrivals {
            match r[k] {
                Some(at) => {
                    each.push(at.saturating_duration_since(sent).as_nanos() as u64);
                    last = Some(last.map_or(at, |l| l.max(at)));
                }
                None => missing += 1,
            }
        }
        if let Some(l) = last {
            all.push(l.saturating_duration_since(sent).as_nanos() as u64);
        }
    }
    let mut done = started;
    for r in &arrivals {
        for at in &r[first..] {
            match at {
                Some(at) => done = done.max(*at),
                None => missing += 1,
            }
        }
    }
    let elapsed = done.duration_since(started).as_secs_f64().max(1e-9);
    let msgs = load.saturated as f64;
    Ok(Cell {
        transport: transport.into(),
        bots: n,
        latency: Latency::from_nanos(each),
        latency_all: Latency::from_nanos(all),
        messages_per_s: msgs / elapsed,
        deliveries_per_s: msgs * (n - 1) as f64 / elapsed,
        cpu_s_per_1000: (cpu1 - cpu0) / msgs * 1000.0,
        missing,
        startup_ms,
    })
}

/// The Markdown table of a run.
pub fn table(cells: &[Cell]) -> String {
    let mut s = String::from(
        "| transport | bots | latency p50 | p99 | p99 to all | max | messages/s (to all) | deliveries/s | CPU s / 1000 msg | missing |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in cells {
        s.push_str(&format!(
            "| {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.1} ms | {:.0} | {:.0} | {:.2} | {} |\n",
            c.transport,
            c.bots,
            c.latency.p50_ms,
            c.latency.p99_ms,
            c.latency_all.p99_ms,
            c.latency.max_ms,
            c.messages_per_s,
            c.deliveries_per_s,
            c.cpu_s_per_1000,
            c.missing
        ));
    }
    s
}

/// Replaces the text between `<!-- results:start -->` and `<!-- results:end -->` in
/// `path` (hand-written parts stay), or writes a new file around the table.
pub fn write_markdown(path: &Path, body: &str) -> anyhow::Result<()> {
    write_markdown_block(path, "results", body)
}

/// [`write_markdown`] for the block between `<!-- NAME:start -->` and
/// `<!-- NAME:end -->`, so one page can hold several benches' results.
pub fn write_markdown_block(path: &Path, name: &str, body: &str) -> anyhow::Result<()> {
    let start = format!("<!-- {name}:start -->");
    let end = format!("<!-- {name}:end -->");
    let block = format!("{start}\n{body}{end}");
    let text = match std::fs::read_to_string(path) {
        Ok(old) => match (old.find(&start), old.find(&end)) {
            (Some(a), Some(b)) if a < b => format!("{}{block}{}", &old[..a], &old[b + end.len()..]),
            _ => format!("{old}\n{block}\n"),
        },
        Err(_) => format!("# Scaling: HTTP mesh vs Redis Streams\n\n{block}\n"),
    };
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_numbers_round_trip() {
        assert_eq!(seq_of("#000042 hello"), Some(42));
        assert_eq!(seq_of("#12 short"), None);
        assert_eq!(seq_of("hello"), None);
    }

    #[test]
    fn markdown_keeps_hand_written_text() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.md");
        write_markdown(&p, "T1\n").unwrap();
        let first = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, format!("intro\n{first}outro\n")).unwrap();
        write_markdown(&p, "T2\n").unwrap();
        let second = std::fs::read_to_string(&p).unwrap();
        assert!(second.starts_with("intro\n"));
        assert!(second.contains("T2") && !second.contains("T1"));
        assert!(second.trim_end().ends_with("outro"));
    }
}
