//! `botmesh-bench flood`: a real peer's envelope latency while junk batches flood the
//! bridge (issue 26: verification before rate limiting).
//!
//! One node runs in this process (its real listeners on 127.0.0.1, transcripts on disk,
//! the default `peer_rate_limit`); its peers.toml lists one peer with an Ed25519 key.
//! The peer posts one signed envelope every 20 ms from 127.0.0.1, with its `v1a`
//! signature alone (no pairwise entry, so every one costs the node an Ed25519 check), and
//! times each answer: first alone, then while `flooders` connections from 127.0.0.2 post
//! junk batches naming the peer as sender back to back — about 222 KiB each, every item
//! carrying `entries` forged `v1a` entries. For each phase it reports the peer's
//! latency, the junk batches answered, and how many Ed25519 (key, signature) pairs the
//! node was handed (`botmesh_ed25519_checks_total`; absent, so 0, on builds before it).
//!
//! Every loop is bounded: each phase lasts `--seconds`.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use botmesh::config::{NodeConfig, Settings};
use botmesh::wire::signing::{Signer, SigningKey};
use clap::Args;

use crate::load::envelope;
use crate::stats::Latency;

/// Options of `botmesh-bench flood`.
#[derive(Args, Clone)]
pub struct FloodArgs {
    /// Length of each phase, seconds.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Connections posting junk batches at once.
    #[arg(long, default_value_t = 4)]
    flooders: usize,
}

/// What one phase measured.
struct Phase {
    /// What flooded (or "none").
    name: String,
    /// The peer's answers, all 200 or not.
    peer: Latency,
    /// The peer's envelopes not answered 200.
    peer_failed: usize,
    /// Junk batches answered (any status).
    junk_batches: usize,
    /// Ed25519 pairs the node was handed during the phase.
    ed25519_checks: f64,
}

/// Runs the phases and prints a Markdown table.
pub async fn run(args: FloodArgs, tmp: &Path) -> anyhow::Result<()> {
    let node_key = SigningKey::generate();
    let peer_key = SigningKey::generate();
    let bridge = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (bridge_addr, api_addr) = (bridge.local_addr()?, api.local_addr()?);
    std::fs::write(tmp.join("node0.key"), node_key.to_whsk())?;
    let toml = format!(
        "[mesh]\ngroup = \"demo\"\ndata_dir = \"data\"\nshutdown_grace_secs = 1\n\
         [[bots]]\nname = \"node0\"\nbridge = \"{bridge_addr}\"\napi = \"{api_addr}\"\n\
         public_key = \"{}\"\nprivate_key_file = \"node0.key\"\nparticipation = \"mentions\"\n\
         [[bots]]\nname = \"peer\"\nbridge = \"127.0.0.1:9\"\napi = \"127.0.0.1:10\"\n\
         public_key = \"{}\"\n",
        node_key.public_key().to_whpk(),
        peer_key.public_key().to_whpk(),
    );
    let path = tmp.join("peers.toml");
    std::fs::write(&path, &toml)?;
    let settings = Settings::load_with_env(&path, &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cfg = NodeConfig::resolve(settings, "node0", None, &HashMap::new())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let node = botmesh::app::lifecycle::start(cfg, bridge, api).await?;
    let base = format!("http://{bridge_addr}");
    let metrics_url = format!("http://{api_addr}/metrics");
    let peer = Signer {
        ed25519: vec![peer_key],
        ..Signer::default()
    };
    let forger = Signer {
        ed25519: vec![SigningKey::generate()],
        ..Signer::default()
    };
    let mut phases = Vec::new();
    for entries in [0, 8, 2] {
        let phase = measure(&args, &base, &metrics_url, &peer, &forger, entries)
            .await
            .with_context(|| format!("phase with {entries} junk entries"))?;
        eprintln!(
            "  {}: peer p50 {:.2} ms p99 {:.2} ms max {:.2} ms ({} failed) | {} junk batches | {:.0} Ed25519 checks",
            phase.name,
            phase.peer.p50_ms,
            phase.peer.p99_ms,
            phase.peer.max_ms,
            phase.peer_failed,
            phase.junk_batches,
            phase.ed25519_checks
        );
        phases.push(phase);
    }
    node.shutdown().await;
    println!("| flood | peer p50 ms | p99 ms | max ms | peer envelopes (not 200) | junk batches answered | Ed25519 checks |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for p in &phases {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {} ({}) | {} | {:.0} |",
            p.name,
            p.peer.p50_ms,
            p.peer.p99_ms,
            p.peer.max_ms,
            p.peer.samples,
            p.peer_failed,
            p.junk_batches,
            p.ed25519_checks
        );
    }
    Ok(())
}

/// One phase: the peer's envelopes, with `args.flooders` junk posters when `entries` > 0.
async fn measure(
    args: &FloodArgs,
    base: &str,
    metrics_url: &str,
    peer: &Signer,
    forger: &Signer,
    entries: usize,
) -> anyhow::Result<Phase> {
    let local = reqwest::Client::builder().no_proxy().build()?;
    let checks_before = ed25519_checks(&local, metrics_url).await?;
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let answered = Arc::new(AtomicUsize::new(0));
    let mut flooders = Vec::new();
    let mut items = 0;
    if entries > 0 {
        let (batch, n) = junk_batch(forger, entries);
        let batch = bytes::Bytes::from(batch);
        items = n;
        for _ in 0..args.flooders {
            let client = reqwest::Client::builder()
                .no_proxy()
                .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
                .timeout(Duration::from_secs(30))
                .build()?;
            let (url, batch, answered) = (
                format!("{base}/bridge/v1/batch"),
                batch.clone(),
                answered.clone(),
            );
            flooders.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    let sent = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(batch.clone())
                        .send()
                        .await;
                    match sent {
                        Ok(r) => {
                            let _ = r.bytes().await;
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            }));
        }
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()?;
    let (mut nanos, mut failed) = (Vec::new(), 0);
    let mut seq = 0;
    while Instant::now() < deadline {
        let env = envelope(9, seq, "peer", false);
        seq += 1;
        let body = env.to_bytes();
        let id = env.id.to_string();
        let ts = botmesh::wire::signing::unix_now();
        let started = Instant::now();
        let r = client
            .post(format!("{base}/bridge/v1/envelopes"))
            .header("webhook-id", &id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", peer.sign(&id, ts, &body))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        match r {
            Ok(r) if r.status().is_success() => {
                r.bytes().await?;
                nanos.push(started.elapsed().as_nanos() as u64);
            }
            _ => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for f in flooders {
        let _ = f.await;
    }
    let checks = ed25519_checks(&local, metrics_url).await? - checks_before;
    Ok(Phase {
        name: if entries == 0 {
            "none".into()
        } else {
            format!(
                "{} × junk batches ({items} items of {entries} v1a entries, {} KiB)",
                args.flooders,
                JUNK_BYTES / 1024
            )
        },
        peer: Latency::from_nanos(nanos),
        peer_failed: failed,
        junk_batches: answered.load(Ordering::Relaxed),
        ed25519_checks: checks,
    })
}

/// The size of a junk batch (the one measured in issue 26).
const JUNK_BYTES: usize = 222 * 1024;

/// A batch of about [`JUNK_BYTES`] (at most 256 items) naming `peer` as the sender,
/// every item signed by `forger` `entries` times (so none verifies), and its items.
fn junk_batch(forger: &Signer, entries: usize) -> (Vec<u8>, usize) {
    let ts = botmesh::wire::signing::unix_now();
    let mut items = Vec::new();
    let mut size = 0;
    while size < JUNK_BYTES && items.len() < 256 {
        let env = envelope(8, items.len(), "peer", false);
        let body = env.to_bytes();
        let id = env.id.to_string();
        let one = forger.sign(&id, ts, &body);
        let item = serde_json::json!({
            "id": id,
            "timestamp": ts.to_string(),
            "signature": vec![one; entries].join(" "),
            "body": String::from_utf8(body).expect("JSON is UTF-8"),
        });
        size += item.to_string().len() + 1;
        items.push(item);
    }
    let n = items.len();
    let body = serde_json::to_vec(&serde_json::json!({ "items": items })).expect("JSON");
    (body, n)
}

/// `botmesh_ed25519_checks_total` of the node (0 where the build has no such counter).
async fn ed25519_checks(http: &reqwest::Client, url: &str) -> anyhow::Result<f64> {
    let r = http.get(url).send().await?;
    if !r.status().is_success() {
        bail!("GET /metrics: {}", r.status());
    }
    let text = r.text().await?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("botmesh_ed25519_checks_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}
