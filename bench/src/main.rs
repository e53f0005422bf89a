//! `botmesh-bench`: measures a real botmesh mesh on 127.0.0.1 side by side with two
//! baselines run on the same machine, in the same run, with the same payloads — a bare
//! hyper server (the ceiling) and Redis pub/sub (the relay earlier designs recommended).
//!
//! For each mesh size (3 and 8 nodes by default) it starts the node processes, then:
//! fan-out at a fixed rate (latency), fan-out closed loop (throughput, CPU), signed
//! envelopes straight to one bridge (like with like against the hyper server); then the
//! hyper server and Redis get the identical load. It prints a table and writes
//! docs/benchmarks.md and a JSON file. See docs/benchmarks.md, "Method".
//!
//! Every loop is bounded in count and time: each phase has a deadline and the whole run
//! a budget (under a minute with `--quick`, under ten minutes without).

#![forbid(unsafe_code)]

mod agents;
mod asks;
mod crypto;
mod flood;
mod load;
mod mesh;
mod procs;
mod record;
mod redis;
mod report;
mod sink;
mod soak;
mod stats;
mod transports;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, Parser, Subcommand};

use crate::load::{api_posts, bridge_posts, closed_loop, paced, per_second, retarget, Post};
use crate::mesh::{bot_name, wait_healthy, Mesh};
use crate::procs::{cpu_total, mib, rss_kib, Proc, RssSampler};
use crate::record::{PhaseTable, Recorder};
use crate::redis::{Pace, RedisServer};
use crate::report::{FanOut, Ingest, MeshResult, Params, ProcFigures, Report};
use crate::stats::Latency;

/// Benchmark botmesh against a bare hyper server and Redis pub/sub on this machine.
#[derive(Parser)]
#[command(
    name = "botmesh-bench",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// The bare hyper baseline server (the bench starts it itself).
    #[command(hide = true)]
    Sink {
        /// Where to listen.
        #[arg(long)]
        addr: SocketAddr,
    },
    /// A long run of a mesh under steady mixed traffic with peers restarting; fails if
    /// RSS, open files or a cache grows without bound (scripts/soak.sh).
    Soak(soak::SoakArgs),
    /// The HTTP mesh against the Redis Streams transport at several sizes, in-process.
    Transports(TransportArgs),
    /// A real peer's envelope latency while junk batches flood one node's bridge.
    Flood(flood::FloodArgs),
    /// What botmesh adds to an ACP agent's turn, and the node's RSS with agents
    /// attached (docs/agents.md).
    Agents(agents::AgentArgs),
    /// What botmesh adds to a colleague's `ask` (the group tools, issue 34).
    Asks(asks::AskArgs),
    /// The minimal ACP agent `agents` and `asks` run (on stdin/stdout).
    #[command(hide = true)]
    AcpAgent,
}

/// Options of `botmesh-bench transports`.
#[derive(Args, Clone)]
struct TransportArgs {
    /// Small loads: finishes in under a minute.
    #[arg(long)]
    quick: bool,
    /// Mesh sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "3,8,32")]
    bots: Vec<usize>,
    /// The redis-server binary (default: from PATH); without one only HTTP is measured.
    #[arg(long)]
    redis_server: Option<PathBuf>,
    /// Update the results block of this Markdown file (hand-written text is kept).
    #[arg(long)]
    out_md: Option<PathBuf>,
    /// Write the JSON results here.
    #[arg(long)]
    out_json: Option<PathBuf>,
}

/// Options of a benchmark run.
#[derive(Args, Clone)]
struct RunArgs {
    /// Small loads: finishes in under a minute.
    #[arg(long)]
    quick: bool,
    /// The botmesh binary (default: `botmesh` next to this binary).
    #[arg(long)]
    botmesh: Option<PathBuf>,
    /// The redis-server binary (default: from PATH).
    #[arg(long)]
    redis_server: Option<PathBuf>,
    /// Skip the Redis baseline.
    #[arg(long)]
    no_redis: bool,
    /// Sign the direct-bridge envelopes with the Ed25519 signature alone, as a sender
    /// that does not derive pairwise keys (an older version) would: measures the
    /// receiver's fallback path instead of the one its peers' outboxes use.
    #[arg(long)]
    ed25519_only: bool,
    /// Mesh sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "3,8")]
    nodes: Vec<usize>,
    /// Requests (or PUBLISHes) in flight in the closed-loop phases.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Messages per second in the paced (latency) phase.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Write the Markdown report here (hand-written notes in it are kept).
    #[arg(long)]
    out_md: Option<PathBuf>,
    /// Write the JSON results here.
    #[arg(long)]
    out_json: Option<PathBuf>,
    /// A note for the report, e.g. "others were compiling in parallel".
    #[arg(long)]
    note: Option<String>,
    /// Where the temporary folder (configs, keys, transcripts, logs) is made.
    #[arg(long)]
    data_root: Option<PathBuf>,
    /// Record `perf` profiles of node0 (sender) and node1 (receiver) during the first
    /// saturated fan-out, and of node0 during the direct-bridge phases, into this folder.
    #[arg(long)]
    perf: Option<PathBuf>,
    /// Keep the temporary folder (its path is printed).
    #[arg(long)]
    keep: bool,
    /// Envelopes in each direct-bridge phase, over all its rounds (default: 1500 with
    /// --quick, else 10000); more gives `--perf` enough samples of the receiver.
    #[arg(long)]
    direct: Option<usize>,
}

/// Load sizes and time limits of a run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    paced: usize,
    saturated: usize,
    direct: usize,
    /// The direct-bridge envelopes are sent in this many rounds, each interleaved
    /// with the hyper baseline (see `bench_size`).
    direct_rounds: usize,
    warmup: usize,
    settle: Duration,
    phase_limit: Duration,
    budget: Duration,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                paced: 150,
                saturated: 800,
                direct: 1500,
                direct_rounds: 3,
                warmup: 20,
                settle: Duration::from_millis(500),
                phase_limit: Duration::from_secs(8),
                budget: Duration::from_secs(55),
            }
        } else {
            Sizes {
                paced: 1000,
                saturated: 5000,
                direct: 10000,
                direct_rounds: 5,
                warmup: 50,
                settle: Duration::from_secs(2),
                phase_limit: Duration::from_secs(60),
                budget: Duration::from_secs(540),
            }
        }
    }
}

/// State shared by every phase of a run.
struct Ctx {
    args: RunArgs,
    sizes: Sizes,
    botmesh: PathBuf,
    redis: Option<PathBuf>,
    tmp: PathBuf,
    http: reqwest::Client,
    phase: u32,
    started: Instant,
    api_post_bytes: usize,
    bridge_post_bytes: usize,
}

impl Ctx {
    fn next_phase(&mut self) -> u32 {
        self.phase += 1;
        self.phase
    }

    /// A phase deadline: `expected` plus the phase limit, never past the run's budget.
    fn deadline(&self, expected: Duration) -> Instant {
        let phase = Instant::now() + expected + self.sizes.phase_limit;
        phase
            .min(self.started + self.sizes.budget)
            .max(Instant::now())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Some(Cmd::Sink { addr }) => sink::run(addr),
        Some(Cmd::Soak(args)) => tokio::runtime::Runtime::new()
            .context("starting the tokio runtime")
            .and_then(|rt| rt.block_on(soak::run(args))),
        Some(Cmd::Transports(t)) => tokio::runtime::Runtime::new()
            .context("starting the tokio runtime")
            .and_then(|rt| rt.block_on(run_transports(t))),
        Some(Cmd::Agents(a)) => tokio::runtime::Runtime::new()
            .context("starting the tokio runtime")
            .and_then(|rt| {
                let tmp = tempfile::tempdir().context("creating a temporary folder")?;
                rt.block_on(agents::run(a, tmp.path()))
            }),
        Some(Cmd::Asks(a)) => tokio::runtime::Runtime::new()
            .context("starting the tokio runtime")
            .and_then(|rt| {
                let tmp = tempfile::tempdir().context("creating a temporary folder")?;
                rt.block_on(asks::run(a, tmp.path()))
            }),
        Some(Cmd::AcpAgent) => agents::serve_agent(),
        Some(Cmd::Flood(f)) => tokio::runtime::Runtime::new()
            .context("starting the tokio runtime")
            .and_then(|rt| {
                let tmp = tempfile::tempdir().context("creating a temporary folder")?;
                rt.block_on(flood::run(f, tmp.path()))
            }),
        None => tokio::runtime::Runtime::new()
            .context("starting the tokio runtime")
            .and_then(|rt| rt.block_on(run(cli.run))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("botmesh-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

async fn run_transports(args: TransportArgs) -> anyhow::Result<()> {
    if args.bots.iter().any(|&n| n < 2) {
        bail!("--bots: a mesh needs at least 2 bots");
    }
    let redis = args.redis_server.clone().or_else(|| which("redis-server"));
    if redis.is_none() {
        eprintln!("botmesh-bench: redis-server not found (scripts/bench.sh installs it); measuring HTTP only");
    }
    let tmp = tempfile::Builder::new()
        .prefix("botmesh-transports-")
        .tempdir()?;
    let load = transports::Load::new(args.quick);
    eprintln!(
        "botmesh-bench transports: {} run, {:?} bots, {:?}",
        if args.quick { "quick" } else { "full" },
        args.bots,
        load
    );
    let cells = transports::run(&args.bots, load, redis.as_deref(), tmp.path()).await?;
    let machine = procs::Machine::probe();
    let table = transports::table(&cells);
    println!("{table}");
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if let Some(path) = &args.out_md {
        let body = format!(
            "Measured {} ({} run) on {} ({} cores); load average at the end {:.2}. {} paced messages at {}/s for latency, then {} closed-loop with {} in flight; 500-byte texts.\n\n{table}",
            report::utc(unix),
            if args.quick { "quick" } else { "full" },
            machine.cpu,
            machine.cores,
            procs::loadavg(),
            load.paced,
            load.rate,
            load.saturated,
            load.concurrency,
        );
        transports::write_markdown(path, &body)?;
    }
    if let Some(path) = &args.out_json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&serde_json::json!({
                "started_utc": report::utc(unix),
                "quick": args.quick,
                "cells": cells,
            }))?,
        )?;
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let exe_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let botmesh = args
        .botmesh
        .clone()
        .unwrap_or_else(|| exe_dir.join("botmesh"));
    if !botmesh.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release -p botmesh` or pass --botmesh",
            botmesh.display()
        );
    }
    let redis = if args.no_redis {
        None
    } else {
        match args.redis_server.clone().or_else(|| which("redis-server")) {
            Some(p) => Some(p),
            None => {
                eprintln!("botmesh-bench: redis-server not found (scripts/bench.sh installs it); skipping the Redis baseline");
                None
            }
        }
    };
    if args.nodes.iter().any(|&n| n < 2) {
        bail!("--nodes: a mesh needs at least 2 nodes");
    }
    let root = args.data_root.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&root)?;
    let tmp = tempfile::Builder::new()
        .prefix("botmesh-bench-")
        .tempdir_in(&root)
        .with_context(|| format!("creating a folder in {}", root.display()))?;
    let mut machine = procs::Machine::probe();
    let (p50, p99) = procs::fsync_probe(tmp.path(), 200)?;
    let crypto = crypto::measure(if args.quick { 300 } else { 2000 });
    let mut sizes = Sizes::new(args.quick);
    if let Some(n) = args.direct {
        sizes.direct = n;
    }
    let mut ctx = Ctx {
        http: reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(256)
            .build()?,
        args: args.clone(),
        sizes,
        botmesh,
        redis,
        tmp: tmp.path().to_path_buf(),
        phase: 0,
        started,
        api_post_bytes: 0,
        bridge_post_bytes: 0,
    };
    eprintln!(
        "botmesh-bench: {} run, meshes of {:?} nodes, working in {}",
        if args.quick { "quick" } else { "full" },
        args.nodes,
        ctx.tmp.display()
    );
    let mut meshes = Vec::new();
    for &n in &args.nodes {
        let mut m = bench_size(&mut ctx, n).await?;
        m.compute_ratios();
        meshes.push(m);
    }
    machine.loadavg_end = procs::loadavg();
    let targets = report::check_targets(&meshes);
    let rep = Report {
        started_utc: report::utc(unix),
        mode: if args.quick { "quick" } else { "full" }.into(),
        machine,
        note: args.note.clone(),
        params: Params {
            paced_messages: sizes.paced,
            paced_rate: args.rate,
            saturated_messages: sizes.saturated,
            direct_messages: sizes.direct,
            concurrency: args.concurrency,
            text_bytes: load::TEXT_BYTES,
            api_post_bytes: ctx.api_post_bytes,
            bridge_post_bytes: ctx.bridge_post_bytes,
        },
        fsync: report::Fsync {
            dir: root.display().to_string(),
            p50_ms: p50,
            p99_ms: p99,
        },
        crypto,
        meshes,
        targets,
        duration_s: started.elapsed().as_secs_f64(),
    };
    println!("{}", report::text_table(&rep));
    if let Some(p) = &args.out_json {
        std::fs::write(p, serde_json::to_string_pretty(&rep)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("botmesh-bench: wrote {}", p.display());
    }
    if let Some(p) = &args.out_md {
        let notes = report::existing_notes(p);
        std::fs::write(p, report::markdown(&rep, &notes))
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("botmesh-bench: wrote {}", p.display());
    }
    if args.keep {
        eprintln!("botmesh-bench: kept {}", tmp.keep().display());
    }
    Ok(())
}

/// Starts the mesh (a second try on fresh ports if a port was taken meanwhile).
async fn start_mesh(ctx: &Ctx, n: usize, hmac: bool) -> anyhow::Result<Mesh> {
    let mut last = None;
    for attempt in 0..2 {
        let scheme = if hmac { "hmac" } else { "ed25519" };
        let dir = ctx.tmp.join(format!("mesh{n}-{scheme}-{attempt}"));
        match Mesh::start(
            &ctx.botmesh,
            &dir,
            n,
            hmac,
            ctx.args.ed25519_only,
            &ctx.http,
        )
        .await
        {
            Ok(m) => return Ok(m),
            Err(e) => {
                eprintln!("botmesh-bench: mesh of {n} did not start ({e:#}); retrying");
                last = Some(e);
            }
        }
    }
    Err(last.expect("tried"))
}

fn rss_mib(pids: &[u32]) -> Vec<f64> {
    pids.iter()
        .map(|&p| rss_kib(p).map(mib).unwrap_or(0.0))
        .collect()
}

fn peak_mib(pids: &[u32], peaks: &std::collections::HashMap<u32, u64>) -> Vec<f64> {
    pids.iter()
        .map(|p| peaks.get(p).copied().map(mib).unwrap_or(0.0))
        .collect()
}

/// Everything for one mesh size: botmesh, then the hyper server, then Redis.
async fn bench_size(ctx: &mut Ctx, n: usize) -> anyhow::Result<MeshResult> {
    let mut res = MeshResult {
        nodes: n,
        fsync_ms: procs::fsync_probe(&ctx.tmp, 100)?,
        ..Default::default()
    };
    let sizes = ctx.sizes;
    let c = ctx.args.concurrency;
    let rate = ctx.args.rate;

    // botmesh
    eprintln!("[{n} nodes] starting {n} botmesh processes");
    let mut mesh = start_mesh(ctx, n, false).await?;
    let pids = mesh.pids();
    res.botmesh.procs.startup_ms = mesh.nodes.iter().map(|x| ms(x.startup)).collect();
    tokio::time::sleep(sizes.settle).await;
    res.botmesh.procs.idle_rss_mib = rss_mib(&pids);
    let recorder = Arc::new(Recorder::default());
    mesh.watch(recorder.clone()).await?;
    let api0 = format!("http://{}", mesh.nodes[0].api);
    let bridge0 = format!("http://{}", mesh.nodes[0].bridge);
    let (warm, _) = fanout_http(
        ctx,
        &recorder,
        &api0,
        n - 1,
        sizes.warmup,
        Pace::Window(4),
        &[],
    )
    .await;
    if !warm.complete {
        bail!(
            "warm-up: only {} of {} deliveries arrived — see the logs in {}",
            warm.delivered,
            sizes.warmup * (n - 1),
            mesh.dir.display()
        );
    }
    eprintln!(
        "[{n} nodes] botmesh paced fan-out: {} messages at {rate}/s",
        sizes.paced
    );
    res.botmesh.paced = fanout_http(
        ctx,
        &recorder,
        &api0,
        n - 1,
        sizes.paced,
        Pace::Rate(rate),
        &[],
    )
    .await
    .0;
    eprintln!(
        "[{n} nodes] botmesh saturated fan-out: {} messages, {c} in flight",
        sizes.saturated
    );
    let rss = RssSampler::start(pids.clone());
    let perf_dir = ctx.args.perf.clone().filter(|_| n == ctx.args.nodes[0]);
    let profile = |label: &str, pids: &[u32]| match &perf_dir {
        Some(dir) => start_perf(dir, &format!("{n}nodes-{label}"), pids),
        None => Ok(Vec::new()),
    };
    let perf = profile("fanout", &pids[..2])?;
    let (sat, sat_posts) = fanout_http(
        ctx,
        &recorder,
        &api0,
        n - 1,
        sizes.saturated,
        Pace::Window(c),
        &pids,
    )
    .await;
    for mut p in perf {
        p.stop_with("-INT", Duration::from_secs(20));
    }
    res.botmesh.saturated = sat;

    // The direct-bridge phases, interleaved with the bare hyper baseline: the host's
    // speed drifts by tens of percent within minutes, so each round measures botmesh
    // (Ed25519), the sink on the identical requests, botmesh (HMAC, a 2-node mesh),
    // and the sink again, back to back; the headline ratio is the median of the
    // rounds' ratios.
    let mut hmesh = start_mesh(ctx, 2, true).await?;
    let hbridge0 = format!("http://{}", hmesh.nodes[0].bridge);
    let hsenders = vec![(bot_name(1), hmesh.signers[1].clone())];
    eprintln!("[{n} nodes] bare hyper sink for the baselines");
    let port = procs::free_port()?;
    let sink_base = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["sink", "--addr", &format!("127.0.0.1:{port}")]);
    let mut sink = Proc::spawn("hyper", cmd, Some(&ctx.tmp.join("hyper.log")))?;
    let startup = wait_healthy(&mut sink, &format!("{sink_base}/healthz"), &ctx.http).await?;
    tokio::time::sleep(sizes.settle).await;
    let sink_pid = [sink.pid];
    let mut figures = ProcFigures {
        startup_ms: vec![ms(startup)],
        idle_rss_mib: rss_mib(&sink_pid),
        load_rss_mib: vec![],
    };
    let sink_rss = RssSampler::start(sink_pid.to_vec());
    let senders: Vec<_> = (1..n)
        .map(|i| (bot_name(i), mesh.signers[i].clone()))
        .collect();
    // A warm-up, not counted: each botmesh bridge gets `warmup` envelopes with the
    // rounds' window, and the sink the identical requests after it, so that no server
    // the rounds measure meets a cold connection pool. (Before, only the sink had one,
    // with 4 in flight.)
    let deadline = ctx.deadline(Duration::ZERO);
    for (bridge, from, logs) in [
        (&bridge0, &senders, &mesh.dir),
        (&hbridge0, &hsenders, &hmesh.dir),
    ] {
        let warm = bridge_posts(bridge, &bot_name(0), ctx.next_phase(), sizes.warmup, from);
        let sink_warm = Arc::new(retarget(&warm, bridge, &sink_base));
        let run = closed_loop(&ctx.http, Arc::new(warm), c, None, deadline).await;
        if run.ok < sizes.warmup {
            bail!(
                "direct-bridge warm-up of {bridge}: {} of {} envelopes accepted, answers {:?} \
                 — see the logs in {}",
                run.ok,
                sizes.warmup,
                run.statuses,
                logs.display()
            );
        }
        closed_loop(&ctx.http, sink_warm, c, None, deadline).await;
    }
    let rounds = sizes.direct_rounds;
    let per_round = (sizes.direct / rounds).max(1);
    eprintln!(
        "[{n} nodes] direct bridge: {rounds} rounds of {per_round} signed envelopes to node0 \
         ({c} in flight), each round Ed25519 → hyper → HMAC (2-node mesh) → hyper, \
         the HMAC half first in every second round"
    );
    let mut direct = Vec::new();
    for round in 0..rounds {
        let posts = Arc::new(bridge_posts(
            &bridge0,
            &bot_name(0),
            ctx.next_phase(),
            per_round,
            &senders,
        ));
        let hposts = Arc::new(bridge_posts(
            &hbridge0,
            &bot_name(0),
            ctx.next_phase(),
            per_round,
            &hsenders,
        ));
        ctx.bridge_post_bytes = load::mean_size(&posts);
        // node0 of each mesh is profiled in the first round only.
        let perf = |label: &str| {
            perf_dir
                .as_deref()
                .filter(|_| round == 0)
                .map(|d| (d, format!("{n}nodes-{label}")))
        };
        let hpids = hmesh.pids();
        let ed_half = (perf("direct"), posts, &pids[..1], bridge0.as_str());
        let hm_half = (perf("direct-hmac"), hposts, &hpids[..1], hbridge0.as_str());
        let hmac_first = report::DirectRound::hmac_first(round);
        let [first, second] = if hmac_first {
            [hm_half, ed_half]
        } else {
            [ed_half, hm_half]
        };
        let run = |(perf, posts, pids, bridge)| {
            direct_pair(ctx, perf, posts, pids, bridge, &sink_base, &sink_pid)
        };
        let first = run(first).await?;
        let second = run(second).await?;
        let ((ed, ed_sink), (hm, hm_sink)) = if hmac_first {
            (second, first)
        } else {
            (first, second)
        };
        direct.push(report::DirectRound {
            ed25519: ed,
            hyper: ed_sink,
            hmac: hm,
            hyper_hmac: hm_sink,
            hmac_first,
        });
    }
    res.botmesh.procs.load_rss_mib = peak_mib(&pids, &rss.finish());
    res.botmesh.sse_lagged = recorder.lagged.load(std::sync::atomic::Ordering::Relaxed);
    mesh.stop();
    res.botmesh.log_problems = mesh.log_problems();
    hmesh.stop();
    res.botmesh.log_problems.extend(hmesh.log_problems());
    res.botmesh.direct = Ingest::merge(direct.iter().map(|r| &r.ed25519));
    res.botmesh.direct_hmac = Ingest::merge(direct.iter().map(|r| &r.hmac));
    res.hyper.bridge = Ingest::merge(direct.iter().map(|r| &r.hyper));
    res.hyper.bridge_hmac = Ingest::merge(direct.iter().map(|r| &r.hyper_hmac));
    res.direct_rounds = direct;

    // The API requests of the saturated fan-out, on the sink.
    res.hyper.api = ingest(
        ctx,
        Arc::new(retarget(&sat_posts, &api0, &sink_base)),
        &sink_pid,
    )
    .await;
    figures.load_rss_mib = peak_mib(&sink_pid, &sink_rss.finish());
    res.hyper.procs = figures;
    sink.stop(Duration::from_secs(2));

    // Redis
    if let Some(bin) = ctx.redis.clone() {
        eprintln!(
            "[{n} nodes] Redis pub/sub: {} subscribers, same payloads",
            n - 1
        );
        match bench_redis(ctx, &bin, n).await {
            Ok(r) => res.redis = Some(r),
            Err(e) => eprintln!("botmesh-bench: Redis baseline failed: {e:#}"),
        }
    }
    Ok(res)
}

/// One direct-bridge measurement: `posts` to botmesh (`pids`: node0, profiled into
/// `perf` when given), then the identical requests to the sink, back to back.
async fn direct_pair(
    ctx: &Ctx,
    perf: Option<(&Path, String)>,
    posts: Arc<Vec<Post>>,
    pids: &[u32],
    bridge: &str,
    sink_base: &str,
    sink_pid: &[u32],
) -> anyhow::Result<(Ingest, Ingest)> {
    let profiling = match perf {
        Some((dir, label)) => start_perf(dir, &label, pids)?,
        None => Vec::new(),
    };
    let botmesh = ingest(ctx, posts.clone(), pids).await;
    for mut p in profiling {
        p.stop_with("-INT", Duration::from_secs(20));
    }
    let sink = ingest(ctx, Arc::new(retarget(&posts, bridge, sink_base)), sink_pid).await;
    Ok((botmesh, sink))
}

/// Starts `perf record` (cpu-clock, call graphs) on each of `pids` (node0, node1, …);
/// the direct-bridge phases are profiled on node0 alone.
fn start_perf(dir: &Path, label: &str, pids: &[u32]) -> anyhow::Result<Vec<Proc>> {
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    for (i, pid) in pids.iter().enumerate() {
        let file = dir.join(format!("perf-{label}-node{i}.data"));
        let mut cmd = Command::new("perf");
        cmd.args(["record", "-e", "cpu-clock", "-F", "999", "-g", "-o"])
            .arg(&file)
            .args(["-p", &pid.to_string()]);
        out.push(Proc::spawn("perf", cmd, Some(&dir.join("perf.log")))?);
    }
    // perf needs a moment to attach.
    std::thread::sleep(Duration::from_millis(300));
    Ok(out)
}

/// One fan-out phase through node0's `POST /v1/messages`; returns the result and the
/// requests (so the hyper baseline can get the identical ones).
async fn fanout_http(
    ctx: &mut Ctx,
    recorder: &Arc<Recorder>,
    api: &str,
    receivers: usize,
    count: usize,
    pace: Pace,
    cpu_pids: &[u32],
) -> (FanOut, Arc<Vec<Post>>) {
    let phase = ctx.next_phase();
    let table = Arc::new(PhaseTable::new(count, receivers));
    recorder.register(phase, table.clone());
    let posts = Arc::new(api_posts(api, phase, count));
    ctx.api_post_bytes = load::mean_size(&posts);
    let expected = match pace {
        Pace::Rate(r) => Duration::from_secs_f64(count as f64 / r),
        Pace::Window(_) => Duration::ZERO,
    };
    let deadline = ctx.deadline(expected);
    let cpu0 = cpu_total(cpu_pids);
    let host0 = procs::host_cpu_ticks();
    let run = match pace {
        Pace::Rate(r) => {
            paced(
                &ctx.http,
                posts.clone(),
                r,
                ctx.args.concurrency,
                table.clone(),
                deadline,
            )
            .await
        }
        Pace::Window(w) => {
            closed_loop(&ctx.http, posts.clone(), w, Some(table.clone()), deadline).await
        }
    };
    let complete = run.ok == count && table.wait_complete(deadline).await;
    let cpu = cpu_total(cpu_pids) - cpu0;
    let steal = procs::steal_percent(host0, procs::host_cpu_ticks());
    let mut out = fanout_result(
        &table,
        complete,
        run.sent,
        run.sent - run.ok,
        cpu,
        !cpu_pids.is_empty(),
    );
    out.inject_rtt = Latency::from_nanos(run.rtt);
    out.host_steal_percent = steal;
    (out, posts)
}

fn fanout_result(
    table: &PhaseTable,
    complete: bool,
    sent: usize,
    errors: usize,
    cpu: f64,
    cpu_measured: bool,
) -> FanOut {
    let all = table.all_receivers_latencies();
    let span = table.span();
    let arrivals = table.arrivals();
    FanOut {
        messages: sent,
        receivers: table.receivers(),
        delivered: arrivals,
        complete,
        messages_per_s: per_second(all.len(), span),
        deliveries_per_s: per_second(arrivals, span),
        latency: Latency::from_nanos(table.delivery_latencies()),
        all_receivers_latency: Latency::from_nanos(all),
        cpu_s_per_1000: if cpu_measured && arrivals > 0 {
            cpu / arrivals as f64 * 1000.0
        } else {
            0.0
        },
        send_errors: errors,
        inject_rtt: Latency::default(),
        host_steal_percent: None,
    }
}

/// POSTs every request to one receiver, closed loop; CPU of `pids` over the phase.
async fn ingest(ctx: &Ctx, posts: Arc<Vec<Post>>, pids: &[u32]) -> Ingest {
    let deadline = ctx.deadline(Duration::ZERO);
    let cpu0 = cpu_total(pids);
    let run = closed_loop(&ctx.http, posts, ctx.args.concurrency, None, deadline).await;
    let cpu = cpu_total(pids) - cpu0;
    Ingest {
        requests: run.sent,
        ok: run.ok,
        per_s: run.per_second(),
        rtt: Latency::from_nanos(run.rtt.clone()),
        rtt_nanos: run.rtt.clone(),
        cpu_s_per_1000: if run.ok > 0 {
            cpu / run.ok as f64 * 1000.0
        } else {
            0.0
        },
        statuses: run.statuses,
    }
}

/// Redis pub/sub with `n - 1` subscribers: paced, then closed loop.
async fn bench_redis(ctx: &mut Ctx, bin: &Path, n: usize) -> anyhow::Result<report::RedisResult> {
    let sizes = ctx.sizes;
    let dir = ctx.tmp.join(format!("redis{n}"));
    std::fs::create_dir_all(&dir)?;
    let server = RedisServer::start(bin, &dir).await?;
    let pid = [server.proc.pid];
    let mut out = report::RedisResult::default();
    out.procs.startup_ms = vec![ms(server.startup)];
    tokio::time::sleep(sizes.settle).await;
    out.procs.idle_rss_mib = rss_mib(&pid);
    let recorder = Arc::new(Recorder::default());
    let mut subs = Vec::new();
    for r in 0..n - 1 {
        subs.push(redis::subscribe(server.port, r, recorder.clone()).await?);
    }
    let rate = ctx.args.rate;
    let result = async {
        fanout_redis(
            ctx,
            &recorder,
            server.port,
            n - 1,
            sizes.warmup,
            Pace::Window(4),
            &[],
        )
        .await?;
        out.paced = fanout_redis(
            ctx,
            &recorder,
            server.port,
            n - 1,
            sizes.paced,
            Pace::Rate(rate),
            &[],
        )
        .await?;
        let rss = RssSampler::start(pid.to_vec());
        out.saturated = fanout_redis(
            ctx,
            &recorder,
            server.port,
            n - 1,
            sizes.saturated,
            Pace::Window(ctx.args.concurrency),
            &pid,
        )
        .await?;
        out.procs.load_rss_mib = peak_mib(&pid, &rss.finish());
        anyhow::Ok(())
    }
    .await;
    for s in subs {
        s.abort();
    }
    server.stop().await;
    result.map(|()| out)
}

async fn fanout_redis(
    ctx: &mut Ctx,
    recorder: &Arc<Recorder>,
    port: u16,
    receivers: usize,
    count: usize,
    pace: Pace,
    cpu_pids: &[u32],
) -> anyhow::Result<FanOut> {
    let phase = ctx.next_phase();
    let table = Arc::new(PhaseTable::new(count, receivers));
    recorder.register(phase, table.clone());
    let payloads: Arc<Vec<Bytes>> = Arc::new(
        (0..count)
            .map(|i| Bytes::from(load::envelope(phase, i, &bot_name(0), true).to_bytes()))
            .collect(),
    );
    let expected = match pace {
        Pace::Rate(r) => Duration::from_secs_f64(count as f64 / r),
        Pace::Window(_) => Duration::ZERO,
    };
    let deadline = ctx.deadline(expected);
    let cpu0 = cpu_total(cpu_pids);
    let answered = redis::publish(port, payloads, pace, table.clone(), deadline).await?;
    let complete = answered == count && table.wait_complete(deadline).await;
    let cpu = cpu_total(cpu_pids) - cpu0;
    Ok(fanout_result(
        &table,
        complete,
        answered,
        count - answered,
        cpu,
        !cpu_pids.is_empty(),
    ))
}
