//! `botmesh-bench soak`: a mesh of real `botmesh run` processes under steady mixed
//! traffic, with peers restarting, sampled until the deadline; fails if RSS, open
//! files, threads or a cache keeps growing.
//!
//! * Traffic: human messages posted to the live nodes' local APIs at a steady rate —
//!   plain chatter (Chinese and English), @mentions that make the mentioned bot reply
//!   (offline provider: no LLM server), bare acknowledgements, and every so often a
//!   burst.
//! * Restarts: every `--restart-every` seconds one of nodes `1..` is stopped —
//!   SIGTERM and `kill -9` alternately — and started again on the same config and
//!   data folder. `node0` is never restarted, so one process lives through the whole
//!   run and its series is unbroken.
//! * Samples, per node every `--sample-secs`: VmRSS and Threads from
//!   /proc/PID/status, the entries of /proc/PID/fd, and from `/metrics` the
//!   `botmesh_cache_entries` gauges and the summed `botmesh_outbox_depth`.
//! * Growth check, per node and metric: over the samples taken after the metric's
//!   warm-up (counted from the start of the node's current process, since a restart
//!   empties its caches), the largest value of the last third may exceed the largest of the middle
//!   third by at most a tolerance (a ratio plus an absolute slack). Warm-up growth
//!   (caches filling up to their TTL) is thus not a failure, but steady growth is.
//!   Caches whose TTL is longer than the run cannot be checked and are reported so.
//!   `transcript_ids` is the permanent dedup index and grows with traffic by design;
//!   it is reported, not checked.
//!
//! Every loop is bounded: by the run's deadline, and each request by a timeout.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use tokio::sync::Mutex;

use crate::mesh::{bot_name, wait_healthy, Mesh};
use crate::procs::{mib, rss_kib, Proc};

/// Options of `botmesh-bench soak`.
#[derive(Args, Clone, Debug)]
pub struct SoakArgs {
    /// How long to run, in minutes.
    #[arg(long, default_value_t = 20.0)]
    pub minutes: f64,
    /// How long to run, in seconds (overrides --minutes; for a quick smoke run).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Nodes in the mesh (3 or 4 is typical).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Human messages per second, between bursts.
    #[arg(long, default_value_t = 4.0)]
    pub rate: f64,
    /// Seconds between two restarts (default: a sixth of the run, at least 20 s).
    #[arg(long)]
    pub restart_every: Option<u64>,
    /// Seconds between two samples (default: 5, or 2 for runs under 3 minutes).
    #[arg(long)]
    pub sample_secs: Option<u64>,
    /// The botmesh binary (default: `botmesh` next to this binary).
    #[arg(long)]
    pub botmesh: Option<PathBuf>,
    /// Where the temporary folder (config, keys, data, logs) is made.
    #[arg(long)]
    pub data_root: Option<PathBuf>,
    /// Write the figures as Markdown here.
    #[arg(long)]
    pub out_md: Option<PathBuf>,
    /// Write every sample as CSV here.
    #[arg(long)]
    pub out_csv: Option<PathBuf>,
    /// Keep the temporary folder (its path is printed).
    #[arg(long)]
    pub keep: bool,
}

/// One sample of one node.
#[derive(Debug, Clone)]
struct Sample {
    /// Seconds since traffic started.
    t: f64,
    /// Seconds since this node's current process started (restarts reset it): a
    /// restarted node's caches fill up again from empty, so warm-up counts from here.
    age: f64,
    /// Node index.
    node: usize,
    /// Metric name → value (rss_kib, fds, threads, outbox_depth, cache names).
    values: BTreeMap<String, f64>,
}

/// How one metric is judged.
struct Rule {
    /// Metric name as in [`Sample::values`].
    name: &'static str,
    /// Samples before this many seconds are warm-up and not judged.
    warmup_secs: f64,
    /// Allowed ratio of last-third max to middle-third max.
    ratio: f64,
    /// Allowed absolute excess on top of the ratio (same unit as the metric).
    slack: f64,
    /// False: reported only (grows with traffic by design).
    checked: bool,
}

/// The seen cache and the claim board forget entries after 900 s
/// (`botmesh::app::node::SEEN_TTL`, the scheduler's trigger TTL): until then they grow.
const TTL_WARMUP_SECS: f64 = 930.0;

const RULES: &[Rule] = &[
    Rule {
        name: "rss_kib",
        warmup_secs: 0.0,
        ratio: 1.10,
        slack: 4096.0,
        checked: true,
    },
    Rule {
        name: "fds",
        warmup_secs: 0.0,
        ratio: 1.0,
        slack: 8.0,
        checked: true,
    },
    Rule {
        name: "threads",
        warmup_secs: 0.0,
        ratio: 1.0,
        slack: 4.0,
        checked: true,
    },
    Rule {
        name: "outbox_depth",
        warmup_secs: 0.0,
        ratio: 1.5,
        slack: 500.0,
        checked: true,
    },
    Rule {
        name: "rate_limiter_buckets",
        warmup_secs: 0.0,
        ratio: 1.0,
        slack: 0.0,
        checked: true,
    },
    Rule {
        name: "seen_ids",
        warmup_secs: TTL_WARMUP_SECS,
        ratio: 1.10,
        slack: 100.0,
        checked: true,
    },
    Rule {
        name: "claim_triggers",
        warmup_secs: TTL_WARMUP_SECS,
        ratio: 1.10,
        slack: 100.0,
        checked: true,
    },
    Rule {
        name: "transcript_ids",
        warmup_secs: 0.0,
        ratio: 1.0,
        slack: 0.0,
        checked: false,
    },
];

/// The verdict on one node's metric.
#[derive(Debug)]
struct Verdict {
    node: usize,
    metric: &'static str,
    first: f64,
    mid_max: f64,
    last_max: f64,
    limit: f64,
    /// "ok", "GROWS", "not checked: …", "reported".
    status: String,
}

/// What the traffic task did.
#[derive(Default)]
struct TrafficCounts {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    mentions: AtomicU64,
    bursts: AtomicU64,
}

/// Runs the soak; fails if anything grows without bound or a node dies.
pub async fn run(args: SoakArgs) -> anyhow::Result<()> {
    let total = Duration::from_secs(
        args.seconds
            .unwrap_or((args.minutes * 60.0).round().max(1.0) as u64),
    );
    if args.nodes < 2 {
        bail!("--nodes: a mesh needs at least 2 nodes");
    }
    let sample_every = Duration::from_secs(args.sample_secs.unwrap_or(
        if total < Duration::from_secs(180) {
            2
        } else {
            5
        },
    ));
    let restart_every =
        Duration::from_secs(args.restart_every.unwrap_or((total.as_secs() / 6).max(20)));
    let exe_dir = std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let bin = args
        .botmesh
        .clone()
        .unwrap_or_else(|| exe_dir.join("botmesh"));
    if !bin.is_file() {
        bail!("{} not found: build it or pass --botmesh", bin.display());
    }
    let root = args.data_root.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&root)?;
    let tmp = tempfile::Builder::new()
        .prefix("botmesh-soak-")
        .tempdir_in(&root)?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?;
    eprintln!(
        "soak: {} nodes of {}, {:.0} s, {} msg/s, a restart every {} s, a sample every {} s, in {}",
        args.nodes,
        bin.display(),
        total.as_secs_f64(),
        args.rate,
        restart_every.as_secs(),
        sample_every.as_secs(),
        tmp.path().display()
    );
    let mesh = Mesh::start(&bin, tmp.path(), args.nodes, false, false, &http).await?;
    let apis: Vec<String> = mesh
        .nodes
        .iter()
        .map(|n| format!("http://{}", n.api))
        .collect();
    let mesh = Arc::new(Mutex::new(mesh));
    let down: Arc<std::sync::Mutex<Option<usize>>> = Arc::default();
    let counts = Arc::new(TrafficCounts::default());
    let started = Instant::now();
    let deadline = started + total;

    let traffic = tokio::spawn(traffic(
        http.clone(),
        apis.clone(),
        down.clone(),
        counts.clone(),
        args.rate,
        deadline,
    ));

    let mut samples: Vec<Sample> = Vec::new();
    let mut restarts: Vec<String> = Vec::new();
    let mut next_restart = started + restart_every;
    let mut next_victim = 1usize;
    let mut kill9 = false;
    let mut born = vec![0.0f64; args.nodes];
    let mut tick = tokio::time::interval(sample_every);
    while Instant::now() < deadline {
        tick.tick().await;
        let t = started.elapsed().as_secs_f64();
        {
            let mut m = mesh.lock().await;
            for (i, n) in m.nodes.iter_mut().enumerate() {
                n.proc
                    .check_alive()
                    .with_context(|| format!("node{i} died during the soak"))?;
                let mut s = sample(&http, &apis[i], n.proc.pid, i, t).await;
                s.age = t - born[i];
                samples.push(s);
            }
        }
        if Instant::now() >= next_restart && Instant::now() + Duration::from_secs(5) < deadline {
            let victim = next_victim;
            next_victim = if victim + 1 >= args.nodes {
                1
            } else {
                victim + 1
            };
            let signal = if kill9 { "-KILL" } else { "-TERM" };
            kill9 = !kill9;
            *down.lock().expect("down lock") = Some(victim);
            let took = restart(&mesh, &bin, victim, signal, &http).await?;
            *down.lock().expect("down lock") = None;
            born[victim] = started.elapsed().as_secs_f64();
            let line = format!(
                "t={t:.0}s node{victim} {signal} → healthy again in {:.1} s",
                took.as_secs_f64()
            );
            eprintln!("soak: {line}");
            restarts.push(line);
            next_restart = Instant::now() + restart_every;
        }
    }
    if traffic.await.is_err() {
        bail!("the traffic task failed");
    }

    // Nothing accepted is lost: every outbox drains once traffic stops.
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    let mut drained = false;
    while Instant::now() < drain_deadline {
        let mut depth = 0.0;
        for api in &apis {
            depth += scrape(&http, api)
                .await
                .get("outbox_depth")
                .copied()
                .unwrap_or(f64::NAN);
        }
        if depth == 0.0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drain_secs = 60.0
        - drain_deadline
            .saturating_duration_since(Instant::now())
            .as_secs_f64();
    mesh.lock().await.stop();

    let verdicts = judge(&samples, args.nodes);
    let text = report(
        &args, total, &counts, &restarts, &verdicts, drained, drain_secs, &samples,
    );
    println!("{text}");
    if let Some(p) = &args.out_md {
        std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("soak: wrote {}", p.display());
    }
    if let Some(p) = &args.out_csv {
        std::fs::write(p, csv(&samples)).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("soak: wrote {}", p.display());
    }
    if args.keep {
        eprintln!("soak: kept {}", tmp.keep().display());
    }
    let growing: Vec<String> = verdicts
        .iter()
        .filter(|v| v.status == "GROWS")
        .map(|v| {
            format!(
                "node{} {}: last-third max {:.0} > limit {:.0} (middle-third max {:.0})",
                v.node, v.metric, v.last_max, v.limit, v.mid_max
            )
        })
        .collect();
    if !growing.is_empty() {
        bail!("grows without bound:\n  {}", growing.join("\n  "));
    }
    if !drained {
        bail!("outboxes did not drain within 60 s after traffic stopped");
    }
    Ok(())
}

/// Stops node `i` with `signal`, starts it again on the same config and data folder,
/// and waits for `/healthz`; returns the time from the signal to healthy.
async fn restart(
    mesh: &Arc<Mutex<Mesh>>,
    bin: &Path,
    i: usize,
    signal: &str,
    http: &reqwest::Client,
) -> anyhow::Result<Duration> {
    let mut m = mesh.lock().await;
    let dir = m.dir.clone();
    let at = Instant::now();
    let node = &mut m.nodes[i];
    node.proc.stop_with(signal, Duration::from_secs(10));
    let name = bot_name(i);
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--bot", &name, "--config"])
        .arg(dir.join("peers.toml"))
        .env_remove("BOTMESH_LOG");
    let mut proc = Proc::spawn(&name, cmd, Some(&dir.join(format!("{name}.log"))))?;
    wait_healthy(&mut proc, &format!("http://{}/healthz", node.api), http).await?;
    node.proc = proc;
    Ok(at.elapsed())
}

/// Posts human messages to live nodes until `deadline`: steady `rate` per second, a
/// burst of 40 every 30 s; a mix of chatter, @mentions and acknowledgements.
async fn traffic(
    http: reqwest::Client,
    apis: Vec<String>,
    down: Arc<std::sync::Mutex<Option<usize>>>,
    counts: Arc<TrafficCounts>,
    rate: f64,
    deadline: Instant,
) -> Arc<TrafficCounts> {
    const CHATTER: [&str; 6] = [
        "大家早上好，今天的构建又挂了吗？",
        "I pushed the fix for the flaky test, can someone double-check the CI run?",
        "这篇论文的第三节讲的是检索增强，和我们的方案有点像",
        "Lunch at 12:30? The usual place.",
        "周报我放在共享文件夹里了，有空看看",
        "Does anyone know why the staging deploy is slow today?",
    ];
    const ACKS: [&str; 4] = ["好的", "谢谢", "ok", "收到👍"];
    let n = apis.len();
    let gap = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let mut k: u64 = 0;
    let mut next_burst = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let burst = Instant::now() >= next_burst;
        let batch = if burst {
            next_burst = Instant::now() + Duration::from_secs(30);
            counts.bursts.fetch_add(1, Ordering::Relaxed);
            40
        } else {
            1
        };
        for _ in 0..batch {
            k += 1;
            let target = (k as usize) % n;
            let skip = *down.lock().expect("down lock");
            let target = if skip == Some(target) {
                (target + 1) % n
            } else {
                target
            };
            let text = match k % 10 {
                0..=5 => format!("{} (#{k})", CHATTER[(k as usize / 10) % CHATTER.len()]),
                6 | 7 => {
                    counts.mentions.fetch_add(1, Ordering::Relaxed);
                    let bot = bot_name((k as usize / 10) % n);
                    format!("@{bot} 你看下这个问题 (#{k})")
                }
                _ => ACKS[(k as usize) % ACKS.len()].to_string(),
            };
            let body = serde_json::json!({"text": text, "from": format!("human{}", k % 3)});
            counts.sent.fetch_add(1, Ordering::Relaxed);
            let ok = http
                .post(format!("{}/v1/messages", apis[target]))
                .json(&body)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            let c = if ok { &counts.ok } else { &counts.failed };
            c.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(gap).await;
    }
    counts
}

/// One sample of node `i`.
async fn sample(http: &reqwest::Client, api: &str, pid: u32, node: usize, t: f64) -> Sample {
    let mut values = scrape(http, api).await;
    if let Some(kib) = rss_kib(pid) {
        values.insert("rss_kib".into(), kib as f64);
    }
    if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        values.insert("fds".into(), d.count() as f64);
    }
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
    if let Some(th) = threads {
        values.insert("threads".into(), th);
    }
    Sample {
        t,
        age: t,
        node,
        values,
    }
}

/// The cache gauges and the summed outbox depth from a node's `/metrics`.
async fn scrape(http: &reqwest::Client, api: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(resp) = http.get(format!("{api}/metrics")).send().await else {
        return out;
    };
    let Ok(text) = resp.text().await else {
        return out;
    };
    let mut depth = 0.0;
    for line in text.lines() {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        if let Some(rest) = key.strip_prefix("botmesh_cache_entries{cache=\"") {
            out.insert(rest.trim_end_matches("\"}").to_string(), v);
        } else if key.starts_with("botmesh_outbox_depth{") {
            depth += v;
        }
    }
    out.insert("outbox_depth".into(), depth);
    out
}

/// Applies [`RULES`] to every node's series.
fn judge(samples: &[Sample], nodes: usize) -> Vec<Verdict> {
    let mut out = Vec::new();
    for node in 0..nodes {
        for rule in RULES {
            let series: Vec<(f64, f64)> = samples
                .iter()
                .filter(|s| s.node == node)
                .filter_map(|s| s.values.get(rule.name).map(|v| (s.age, *v)))
                .collect();
            let first = series.first().map_or(f64::NAN, |s| s.1);
            let judged: Vec<f64> = series
                .iter()
                .filter(|(age, _)| *age >= rule.warmup_secs)
                .map(|s| s.1)
                .collect();
            let third = judged.len() / 3;
            let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
            let (mid_max, last_max) = if third >= 2 {
                (
                    max(&judged[third..2 * third]),
                    max(&judged[judged.len() - third..]),
                )
            } else {
                (f64::NAN, max(&judged))
            };
            let limit = mid_max * rule.ratio + rule.slack;
            let status = if !rule.checked {
                "reported (grows with traffic by design)".to_string()
            } else if series.is_empty() {
                "not checked: no samples".to_string()
            } else if third < 2 {
                format!(
                    "not checked: too few samples from a process older than its {:.0} s warm-up",
                    rule.warmup_secs
                )
            } else if last_max > limit {
                "GROWS".to_string()
            } else {
                "ok".to_string()
            };
            out.push(Verdict {
                node,
                metric: rule.name,
                first,
                mid_max,
                last_max,
                limit,
                status,
            });
        }
    }
    out
}

/// The figures as Markdown (also printed).
#[allow(clippy::too_many_arguments)]
fn report(
    args: &SoakArgs,
    total: Duration,
    counts: &TrafficCounts,
    restarts: &[String],
    verdicts: &[Verdict],
    drained: bool,
    drain_secs: f64,
    samples: &[Sample],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Soak: {} nodes, {:.1} min, {} human msg/s (+ a 40-message burst every 30 s), {} samples, load average at the end {:.2}.\n",
        args.nodes,
        total.as_secs_f64() / 60.0,
        args.rate,
        samples.len(),
        crate::procs::loadavg()
    );
    let _ = writeln!(
        s,
        "Traffic: {} posts ({} accepted, {} refused or failed — posts to a node being restarted), {} @mentions, {} bursts. Restarts: {}. Outboxes {} {:.1} s after traffic stopped.\n",
        counts.sent.load(Ordering::Relaxed),
        counts.ok.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        counts.mentions.load(Ordering::Relaxed),
        counts.bursts.load(Ordering::Relaxed),
        restarts.len(),
        if drained { "drained" } else { "had NOT drained" },
        drain_secs
    );
    for r in restarts {
        let _ = writeln!(s, "- {r}");
    }
    let _ = writeln!(
        s,
        "\n| node | metric | first | max, middle third | max, last third | limit | verdict |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---|");
    for v in verdicts {
        let fmt = |x: f64| {
            if x.is_nan() {
                "–".to_string()
            } else if v.metric == "rss_kib" {
                format!("{:.1} MiB", mib(x as u64))
            } else {
                format!("{x:.0}")
            }
        };
        let limit = if v.status == "ok" || v.status == "GROWS" {
            fmt(v.limit)
        } else {
            "–".into()
        };
        let _ = writeln!(
            s,
            "| node{} | {} | {} | {} | {} | {} | {} |",
            v.node,
            v.metric,
            fmt(v.first),
            fmt(v.mid_max),
            fmt(v.last_max),
            limit,
            v.status
        );
    }
    s
}

/// Every sample as CSV: t, process age, node, then one column per metric.
fn csv(samples: &[Sample]) -> String {
    let mut cols: Vec<&str> = RULES.iter().map(|r| r.name).collect();
    cols.dedup();
    let mut s = format!("t,process_age,node,{}\n", cols.join(","));
    for x in samples {
        let vals: Vec<String> = cols
            .iter()
            .map(|c| x.values.get(*c).map_or(String::new(), |v| format!("{v}")))
            .collect();
        let _ = writeln!(
            s,
            "{:.1},{:.1},node{},{}",
            x.t,
            x.age,
            x.node,
            vals.join(",")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(metric: &str, values: &[f64]) -> Vec<Sample> {
        values
            .iter()
            .enumerate()
            .map(|(k, v)| Sample {
                t: 1000.0 + k as f64,
                age: 1000.0 + k as f64,
                node: 0,
                values: BTreeMap::from([(metric.to_string(), *v)]),
            })
            .collect()
    }

    fn verdict(metric: &str, values: &[f64]) -> String {
        judge(&series(metric, values), 1)
            .into_iter()
            .find(|v| v.metric == metric)
            .expect("a verdict")
            .status
    }

    #[test]
    fn warm_up_then_flat_passes_but_steady_growth_fails() {
        let flat: Vec<f64> = (0..30)
            .map(|k| if k < 5 { 10.0 * k as f64 } else { 50.0 })
            .collect();
        assert_eq!(verdict("fds", &flat), "ok");
        let growing: Vec<f64> = (0..30).map(|k| 10.0 + k as f64).collect();
        assert_eq!(verdict("fds", &growing), "GROWS");
        assert!(verdict("fds", &[1.0, 2.0]).starts_with("not checked"));
        assert!(verdict("transcript_ids", &growing).starts_with("reported"));
        // A restarted process's TTL cache is still warming up: not judged.
        let mut young = series("seen_ids", &growing);
        for s in &mut young {
            s.age -= 900.0;
        }
        let v = judge(&young, 1);
        let seen = v.iter().find(|v| v.metric == "seen_ids").expect("verdict");
        assert!(seen.status.starts_with("not checked"), "{}", seen.status);
    }
}
