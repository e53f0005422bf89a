//! The results: what was measured, the ratios against the baselines, the targets, and
//! their rendering as a terminal table, docs/benchmarks.md and JSON.
//!
//! The Markdown file keeps whatever is written between `<!-- notes:begin -->` and
//! `<!-- notes:end -->` (profiles, analysis) when it is regenerated.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::procs::Machine;
use crate::stats::{max, median, min, Latency};

/// Marks the start of the hand-written part of the Markdown report.
pub const NOTES_BEGIN: &str = "<!-- notes:begin -->";
/// Marks its end.
pub const NOTES_END: &str = "<!-- notes:end -->";

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// UTC time the run started, `YYYY-MM-DD HH:MM:SS`.
    pub started_utc: String,
    /// `quick` or `full`.
    pub mode: String,
    /// The machine.
    pub machine: Machine,
    /// Free-form note given with `--note` (e.g. "others compiling in parallel").
    pub note: Option<String>,
    /// Load sizes.
    pub params: Params,
    /// Append + fdatasync of a 600-byte line where the transcripts live.
    pub fsync: Fsync,
    /// Signing and verifying one envelope, in-process.
    pub crypto: crate::crypto::CryptoCost,
    /// One entry per mesh size.
    pub meshes: Vec<MeshResult>,
    /// The issue's targets, checked against this run.
    pub targets: Vec<TargetCheck>,
    /// Wall-clock seconds the run took.
    pub duration_s: f64,
}

/// Load sizes of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Messages in the paced (latency) phase.
    pub paced_messages: usize,
    /// Their rate, messages per second.
    pub paced_rate: f64,
    /// Messages in the saturated (throughput) phase.
    pub saturated_messages: usize,
    /// Envelopes in the direct-bridge phase.
    pub direct_messages: usize,
    /// Requests (or PUBLISHes) in flight in closed-loop phases.
    pub concurrency: usize,
    /// Chat text per message, bytes.
    pub text_bytes: usize,
    /// Mean `POST /v1/messages` body, bytes.
    pub api_post_bytes: usize,
    /// Mean bridge POST (body + webhook headers), bytes.
    pub bridge_post_bytes: usize,
}

/// Disk sync cost where the transcripts are written.
#[derive(Debug, Clone, Serialize)]
pub struct Fsync {
    /// The folder probed.
    pub dir: String,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
}

/// One fan-out phase: messages injected at one point, received by every other member.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FanOut {
    /// Messages injected.
    pub messages: usize,
    /// Receivers per message (nodes − 1, or subscribers).
    pub receivers: usize,
    /// Deliveries observed (message × receiver).
    pub delivered: usize,
    /// Every message reached every receiver before the deadline.
    pub complete: bool,
    /// Messages fully delivered per second (messages / (first send → last arrival)).
    pub messages_per_s: f64,
    /// Deliveries per second.
    pub deliveries_per_s: f64,
    /// Send → arrival at one receiver.
    pub latency: Latency,
    /// Send → arrival at the last receiver.
    pub all_receivers_latency: Latency,
    /// CPU seconds (all server processes) per 1,000 deliveries; 0 when not measured.
    pub cpu_s_per_1000: f64,
    /// Injection requests that were not answered 2xx.
    pub send_errors: usize,
    /// Round trip of the injecting request (`POST /v1/messages`, or PUBLISH is not timed).
    pub inject_rtt: Latency,
    /// Percent of the machine's CPU time the hypervisor stole during the phase (None
    /// where /proc/stat has no steal column): the tail latency follows it.
    pub host_steal_percent: Option<f64>,
}

/// One ingest phase: POSTs to a single receiver.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ingest {
    /// Requests sent.
    pub requests: usize,
    /// Answered 2xx.
    pub ok: usize,
    /// 2xx answers per second.
    pub per_s: f64,
    /// Request round trip.
    pub rtt: Latency,
    /// CPU seconds of the receiving process per 1,000 requests.
    pub cpu_s_per_1000: f64,
    /// Answers by status (0 = transport error).
    pub statuses: std::collections::BTreeMap<u16, usize>,
    /// The round trips behind `rtt`, in ns (kept to pool phases in [`Ingest::merge`]).
    #[serde(skip)]
    pub rtt_nanos: Vec<u64>,
}

impl Ingest {
    /// Several phases as one: counts and answers added, the rate over the summed time,
    /// CPU per request weighted by requests, round-trip percentiles over the pooled
    /// samples.
    pub fn merge<'a>(phases: impl Iterator<Item = &'a Ingest>) -> Ingest {
        let phases: Vec<&Ingest> = phases.collect();
        let mut out = Ingest::default();
        let mut seconds = 0.0;
        let mut cpu = 0.0;
        for p in &phases {
            out.requests += p.requests;
            out.ok += p.ok;
            if p.per_s > 0.0 {
                seconds += p.ok as f64 / p.per_s;
            }
            cpu += p.cpu_s_per_1000 * p.ok as f64 / 1000.0;
            for (status, count) in &p.statuses {
                *out.statuses.entry(*status).or_default() += count;
            }
        }
        if seconds > 0.0 {
            out.per_s = out.ok as f64 / seconds;
        }
        if out.ok > 0 {
            out.cpu_s_per_1000 = cpu / out.ok as f64 * 1000.0;
        }
        out.rtt_nanos = phases
            .iter()
            .flat_map(|p| p.rtt_nanos.iter().copied())
            .collect();
        out.rtt = crate::stats::Latency::from_nanos(out.rtt_nanos.clone());
        out
    }
}

/// One round of the direct-bridge phase: botmesh and the sink, back to back, on the
/// identical requests, so that the host's drift cancels out of the round's ratio.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DirectRound {
    /// botmesh, Ed25519 scheme.
    pub ed25519: Ingest,
    /// The sink, on the same requests, right after.
    pub hyper: Ingest,
    /// botmesh, HMAC scheme (2-node mesh).
    pub hmac: Ingest,
    /// The sink, on the same HMAC requests, right after.
    pub hyper_hmac: Ingest,
    /// Whether the HMAC half ran first in this round ([`DirectRound::hmac_first`]).
    pub hmac_first: bool,
}

/// `a ÷ b`, or 0 when `b` is not positive (a phase that measured nothing): a ratio
/// of 0 then fails every target instead of dividing by zero.
fn div(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl DirectRound {
    /// Whether round `round` (from 0) runs its HMAC half before its Ed25519 half. The
    /// halves take turns going first: a botmesh half measured faster in its round's
    /// second place than in its first, whichever scheme it was (docs/benchmarks.md,
    /// "ninth look"), so a fixed order would favour one scheme in every round.
    pub fn hmac_first(round: usize) -> bool {
        round % 2 == 1
    }

    /// (Ed25519 ÷ hyper, HMAC ÷ hyper) envelopes/s in this round.
    pub fn ratios(&self) -> (f64, f64) {
        (
            div(self.ed25519.per_s, self.hyper.per_s),
            div(self.hmac.per_s, self.hyper_hmac.per_s),
        )
    }

    /// (Ed25519 ÷ hyper, HMAC ÷ hyper) CPU per request in this round: the spread the
    /// CPU ratio over all rounds hides (hyper's own figure moves between rounds).
    pub fn cpu_ratios(&self) -> (f64, f64) {
        (
            div(self.ed25519.cpu_s_per_1000, self.hyper.cpu_s_per_1000),
            div(self.hmac.cpu_s_per_1000, self.hyper_hmac.cpu_s_per_1000),
        )
    }
}

/// Process figures of one server (or the nodes of a mesh).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProcFigures {
    /// Spawn → first healthy answer, per process, ms.
    pub startup_ms: Vec<f64>,
    /// RSS after settling idle, per process, MiB.
    pub idle_rss_mib: Vec<f64>,
    /// Largest RSS seen under load, per process, MiB.
    pub load_rss_mib: Vec<f64>,
}

/// botmesh at one mesh size.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BotmeshResult {
    /// Start-up and memory of the node processes.
    pub procs: ProcFigures,
    /// `POST /v1/messages` at node0 at a fixed rate → every peer's transcript.
    pub paced: FanOut,
    /// The same, closed loop: throughput.
    pub saturated: FanOut,
    /// Signed envelopes POSTed straight to node0's bridge (like with like vs the sink).
    pub direct: Ingest,
    /// The same on a 2-node mesh using the HMAC scheme instead of Ed25519.
    pub direct_hmac: Ingest,
    /// Events the SSE watchers reported missed.
    pub sse_lagged: u64,
    /// Warnings and errors found in the node logs (first few per node).
    pub log_problems: Vec<String>,
}

/// The bare hyper server.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SinkResult {
    /// Start-up and memory.
    pub procs: ProcFigures,
    /// The same `POST /v1/messages` requests as the saturated fan-out.
    pub api: Ingest,
    /// The same signed bridge requests as the direct phase.
    pub bridge: Ingest,
    /// The same HMAC-signed requests as the HMAC direct phase.
    pub bridge_hmac: Ingest,
}

/// Redis pub/sub.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RedisResult {
    /// Start-up and memory.
    pub procs: ProcFigures,
    /// PUBLISH at the same rate as botmesh's paced phase.
    pub paced: FanOut,
    /// PUBLISH closed loop with the same window.
    pub saturated: FanOut,
}

/// Ratios against the baselines (botmesh ÷ baseline).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ratios {
    /// Direct-bridge envelopes/s ÷ sink POSTs/s on identical requests, the median of
    /// the rounds' ratios (target ≥ 0.5).
    pub direct_vs_hyper: f64,
    /// The same with the HMAC scheme.
    pub direct_hmac_vs_hyper: f64,
    /// Fan-out messages/s (to all peers) ÷ sink POSTs/s of the same API requests.
    pub fanout_vs_hyper: f64,
    /// Fan-out messages/s ÷ Redis messages/s (to all subscribers).
    pub fanout_vs_redis: Option<f64>,
    /// Paced p99 delivery latency ÷ Redis paced p99 (lower is better).
    pub p99_vs_redis: Option<f64>,
    /// CPU per delivery ÷ Redis CPU per delivery.
    pub cpu_vs_redis: Option<f64>,
    /// Direct-bridge CPU per envelope ÷ sink CPU per POST.
    pub direct_cpu_vs_hyper: f64,
}

/// Everything measured at one mesh size.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MeshResult {
    /// Nodes in the mesh.
    pub nodes: usize,
    /// fdatasync probe (p50, p99 ms) just before this section: disk contention varies.
    pub fsync_ms: (f64, f64),
    /// botmesh.
    pub botmesh: BotmeshResult,
    /// The hyper ceiling.
    pub hyper: SinkResult,
    /// The Redis relay (absent with `--no-redis`).
    pub redis: Option<RedisResult>,
    /// The direct-bridge rounds, each interleaved with the sink.
    pub direct_rounds: Vec<DirectRound>,
    /// The headline ratios.
    pub ratios: Ratios,
}

/// One target of the issue, checked.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    /// What is measured.
    pub metric: String,
    /// The target, in words.
    pub target: String,
    /// The measured value, in words.
    pub measured: String,
    /// Met or not.
    pub met: bool,
}

impl MeshResult {
    /// Computes the ratios from the measurements.
    pub fn compute_ratios(&mut self) {
        let b = &self.botmesh;
        let (ed, hm): (Vec<f64>, Vec<f64>) =
            self.direct_rounds.iter().map(DirectRound::ratios).unzip();
        self.ratios = Ratios {
            direct_vs_hyper: median(&ed),
            direct_hmac_vs_hyper: median(&hm),
            fanout_vs_hyper: div(b.saturated.messages_per_s, self.hyper.api.per_s),
            fanout_vs_redis: self
                .redis
                .as_ref()
                .map(|r| div(b.saturated.messages_per_s, r.saturated.messages_per_s)),
            p99_vs_redis: self
                .redis
                .as_ref()
                .map(|r| div(b.paced.latency.p99_ms, r.paced.latency.p99_ms)),
            cpu_vs_redis: self
                .redis
                .as_ref()
                .map(|r| div(b.saturated.cpu_s_per_1000, r.saturated.cpu_s_per_1000)),
            direct_cpu_vs_hyper: div(b.direct.cpu_s_per_1000, self.hyper.bridge.cpu_s_per_1000),
        };
    }
}

/// Checks the issue's targets against all mesh sizes.
pub fn check_targets(meshes: &[MeshResult]) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    for m in meshes {
        out.push(TargetCheck {
            metric: format!("direct-bridge throughput vs bare hyper, {} nodes", m.nodes),
            target: "≥ 50 %".into(),
            measured: format!("{:.1} %", m.ratios.direct_vs_hyper * 100.0),
            met: m.ratios.direct_vs_hyper >= 0.5,
        });
        out.push(TargetCheck {
            metric: format!(
                "the same with the HMAC scheme (2-node mesh, in the {}-node section)",
                m.nodes
            ),
            target: "≥ 50 %".into(),
            measured: format!("{:.1} %", m.ratios.direct_hmac_vs_hyper * 100.0),
            met: m.ratios.direct_hmac_vs_hyper >= 0.5,
        });
        let cpu = m.ratios.direct_cpu_vs_hyper;
        out.push(TargetCheck {
            metric: format!(
                "receiver CPU per direct-bridge envelope vs bare hyper's, {} nodes",
                m.nodes
            ),
            target: "≤ 3×".into(),
            measured: format!("{cpu:.2}×"),
            met: cpu > 0.0 && cpu <= 3.0,
        });
    }
    if let Some(m) = meshes.iter().max_by_key(|m| m.nodes) {
        let p99 = m.botmesh.paced.latency.p99_ms;
        out.push(TargetCheck {
            metric: format!(
                "p99 delivery latency, {} nodes, {} msg/s",
                m.nodes,
                fmt_num(rate_of(m))
            ),
            target: "≤ 5 ms".into(),
            measured: format!("{p99:.2} ms"),
            met: p99 > 0.0 && p99 <= 5.0,
        });
    }
    let idle = meshes
        .iter()
        .flat_map(|m| m.botmesh.procs.idle_rss_mib.iter().copied())
        .fold(0.0, f64::max);
    out.push(TargetCheck {
        metric: "idle RSS per node (largest)".into(),
        target: "≤ 20 MiB".into(),
        measured: format!("{idle:.1} MiB"),
        met: idle > 0.0 && idle <= 20.0,
    });
    let start = meshes
        .iter()
        .flat_map(|m| m.botmesh.procs.startup_ms.iter().copied())
        .fold(0.0, f64::max);
    out.push(TargetCheck {
        metric: "start-up per node (slowest)".into(),
        target: "≤ 100 ms".into(),
        measured: format!("{start:.0} ms"),
        met: start > 0.0 && start <= 100.0,
    });
    out
}

fn rate_of(m: &MeshResult) -> f64 {
    let p = &m.botmesh.paced;
    if p.messages == 0 {
        0.0
    } else {
        p.messages_per_s
    }
}

/// A number with a sensible number of digits.
pub fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn ratio(v: Option<f64>) -> String {
    match v {
        Some(r) if r > 0.0 => format!("{r:.2}×"),
        _ => "–".into(),
    }
}

fn lat(l: &Latency) -> String {
    if l.samples == 0 {
        "–".into()
    } else {
        format!("{:.2} / {:.2} / {:.1}", l.p50_ms, l.p99_ms, l.max_ms)
    }
}

fn mib_range(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let (lo, hi) = (min(v), max(v));
    if (hi - lo).abs() < 0.05 {
        format!("{hi:.1}")
    } else {
        format!("{lo:.1}–{hi:.1}")
    }
}

fn ms_range(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    format!("{:.0} (max {:.0})", median(v), max(v))
}

/// Rows of the headline table: metric, then botmesh / hyper / Redis / ratio per mesh.
/// The direct-bridge rounds' ratios, in words (none without rounds).
fn rounds_line(m: &MeshResult) -> Option<String> {
    if m.direct_rounds.is_empty() {
        return None;
    }
    let hyper_cpu_us: Vec<f64> = m
        .direct_rounds
        .iter()
        .flat_map(|r| [&r.hyper, &r.hyper_hmac])
        .map(|i| i.cpu_s_per_1000 * 1000.0)
        .collect();
    let hmac_first: Vec<String> = m
        .direct_rounds
        .iter()
        .enumerate()
        .filter(|(_, r)| r.hmac_first)
        .map(|(i, _)| (i + 1).to_string())
        .collect();
    let order = match hmac_first.as_slice() {
        [] => "the per-bot keys half first in every round".to_string(),
        [round] => format!("the HMAC half first in round {round}"),
        rounds => format!("the HMAC half first in rounds {}", rounds.join(", ")),
    };
    let list = |f: fn(&DirectRound) -> f64| {
        m.direct_rounds
            .iter()
            .map(|r| format!("{:.2}", f(r)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(format!(
        "Direct-bridge rounds, botmesh ÷ bare hyper envelopes/s, each round back to back \
         (the direct ratios above are their medians; {}): per-bot keys {}; HMAC {}. \
         Receiver CPU per envelope, botmesh ÷ bare hyper, the same rounds (the CPU ratios \
         above are over all rounds together): per-bot keys {}; HMAC {}; bare hyper's own \
         CPU per request ranged {:.1}–{:.1} µs.",
        order,
        list(|r| r.ratios().0),
        list(|r| r.ratios().1),
        list(|r| r.cpu_ratios().0),
        list(|r| r.cpu_ratios().1),
        min(&hyper_cpu_us),
        max(&hyper_cpu_us),
    ))
}

fn headline_rows(m: &MeshResult) -> Vec<[String; 5]> {
    let b = &m.botmesh;
    let h = &m.hyper;
    let r = m.redis.as_ref();
    let dash = || "–".to_string();
    let redis = |f: &dyn Fn(&RedisResult) -> String| r.map(f).unwrap_or_else(dash);
    vec![
        [
            "direct bridge ingest, per-bot keys, envelopes/s (same signed POSTs)".into(),
            fmt_num(b.direct.per_s),
            fmt_num(h.bridge.per_s),
            dash(),
            format!("{:.2}× hyper", m.ratios.direct_vs_hyper),
        ],
        [
            "direct bridge ingest, HMAC scheme, envelopes/s".into(),
            fmt_num(b.direct_hmac.per_s),
            fmt_num(h.bridge_hmac.per_s),
            dash(),
            format!("{:.2}× hyper", m.ratios.direct_hmac_vs_hyper),
        ],
        [
            "fan-out, messages/s delivered to every peer".into(),
            fmt_num(b.saturated.messages_per_s),
            format!("{} (POSTs/s)", fmt_num(h.api.per_s)),
            redis(&|r| fmt_num(r.saturated.messages_per_s)),
            format!(
                "{:.2}× hyper, {} Redis",
                m.ratios.fanout_vs_hyper,
                ratio(m.ratios.fanout_vs_redis)
            ),
        ],
        [
            "fan-out, envelope deliveries/s".into(),
            fmt_num(b.saturated.deliveries_per_s),
            dash(),
            redis(&|r| fmt_num(r.saturated.deliveries_per_s)),
            dash(),
        ],
        [
            format!(
                "delivery latency p50 / p99 / max, ms (paced {} msg/s)",
                fmt_num(b.paced.messages_per_s.max(0.0))
            ),
            lat(&b.paced.latency),
            dash(),
            redis(&|r| lat(&r.paced.latency)),
            format!("p99 {} Redis", ratio(m.ratios.p99_vs_redis)),
        ],
        [
            "latency to the last peer p50 / p99 / max, ms (paced)".into(),
            lat(&b.paced.all_receivers_latency),
            dash(),
            redis(&|r| lat(&r.paced.all_receivers_latency)),
            dash(),
        ],
        [
            "latency under saturation p50 / p99 / max, ms".into(),
            lat(&b.saturated.latency),
            dash(),
            redis(&|r| lat(&r.saturated.latency)),
            dash(),
        ],
        [
            "API POST /v1/messages round trip p50 / p99 / max, ms (paced)".into(),
            lat(&b.paced.inject_rtt),
            dash(),
            dash(),
            dash(),
        ],
        [
            "bridge POST round trip under load p50 / p99 / max, ms".into(),
            lat(&b.direct.rtt),
            lat(&h.bridge.rtt),
            dash(),
            dash(),
        ],
        [
            "CPU s per 1,000 deliveries (all server processes)".into(),
            format!("{:.3}", b.saturated.cpu_s_per_1000),
            format!("{:.3} (per 1,000 POSTs)", h.api.cpu_s_per_1000),
            redis(&|r| format!("{:.3}", r.saturated.cpu_s_per_1000)),
            format!("{} Redis", ratio(m.ratios.cpu_vs_redis)),
        ],
        [
            "CPU s per 1,000 direct-bridge envelopes (receiver)".into(),
            format!("{:.3}", b.direct.cpu_s_per_1000),
            format!("{:.3}", h.bridge.cpu_s_per_1000),
            dash(),
            format!("{:.2}× hyper", m.ratios.direct_cpu_vs_hyper),
        ],
        [
            "CPU s per 1,000 direct-bridge envelopes, HMAC scheme".into(),
            format!("{:.3}", b.direct_hmac.cpu_s_per_1000),
            format!("{:.3}", h.bridge_hmac.cpu_s_per_1000),
            dash(),
            dash(),
        ],
        [
            "RSS idle, MiB per process".into(),
            mib_range(&b.procs.idle_rss_mib),
            mib_range(&h.procs.idle_rss_mib),
            redis(&|r| mib_range(&r.procs.idle_rss_mib)),
            dash(),
        ],
        [
            "RSS under load (peak), MiB per process".into(),
            mib_range(&b.procs.load_rss_mib),
            mib_range(&h.procs.load_rss_mib),
            redis(&|r| mib_range(&r.procs.load_rss_mib)),
            dash(),
        ],
        [
            "start-up, ms: median (max)".into(),
            ms_range(&b.procs.startup_ms),
            ms_range(&h.procs.startup_ms),
            redis(&|r| ms_range(&r.procs.startup_ms)),
            dash(),
        ],
    ]
}

const HEADER: [&str; 5] = ["metric", "botmesh", "bare hyper", "Redis pub/sub", "ratio"];

/// The terminal table.
pub fn text_table(rep: &Report) -> String {
    let mut out = String::new();
    for m in &rep.meshes {
        let rows = headline_rows(m);
        let mut w = HEADER.map(|h| h.chars().count());
        for r in &rows {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let steal = m
            .botmesh
            .paced
            .host_steal_percent
            .map(|p| format!(", host steal in the paced phase {p:.1} %"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "\n== {} nodes (fdatasync p50 {:.2} ms, p99 {:.2} ms{steal}) ==",
            m.nodes, m.fsync_ms.0, m.fsync_ms.1
        );
        let line = |cells: &[String]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate() {
                let pad = w[i] - c.chars().count();
                let _ = write!(l, "{c}{}  ", " ".repeat(pad));
            }
            l.trim_end().to_string()
        };
        let _ = writeln!(out, "{}", line(&HEADER.map(String::from)));
        for r in &rows {
            let _ = writeln!(out, "{}", line(r));
        }
        if let Some(l) = rounds_line(m) {
            let _ = writeln!(out, "{l}");
        }
    }
    let c = &rep.crypto;
    let _ = writeln!(
        out,
        "\nsignatures: Ed25519 sign {:.1} µs, verify {:.1} µs (in batches of 8: {:.1}, of 64: {:.1} per envelope); pairwise entry sign {:.1} µs, verify {:.1} µs; HMAC sign {:.1} µs, verify {:.1} µs; fsync p50 {:.2} ms, p99 {:.2} ms",
        c.ed25519_sign_us, c.ed25519_verify_us, c.ed25519_verify_batch8_us, c.ed25519_verify_batch64_us, c.pairwise_sign_us, c.pairwise_verify_us, c.hmac_sign_us, c.hmac_verify_us, rep.fsync.p50_ms, rep.fsync.p99_ms
    );
    let _ = writeln!(out, "\n== targets ==");
    for t in &rep.targets {
        let _ = writeln!(
            out,
            "{} {}: {} (target {})",
            if t.met { "MET " } else { "MISS" },
            t.metric,
            t.measured,
            t.target
        );
    }
    out
}

/// The Markdown report; `notes` is the preserved hand-written part.
pub fn markdown(rep: &Report, notes: &str) -> String {
    let mut md = String::new();
    let m0 = &rep.machine;
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Generated by `scripts/bench.sh` (`botmesh-bench`); the tables are rewritten on every \
         full run, the notes at the end are kept. Numbers vary with the machine: read the \
         **ratios**, which compare botmesh with baselines measured in the same run on the \
         same machine with the same payloads.\n"
    );
    let _ = writeln!(md, "## This run\n");
    let _ = writeln!(
        md,
        "- Started {} UTC, {} mode, {:.0} s.",
        rep.started_utc, rep.mode, rep.duration_s
    );
    let _ = writeln!(
        md,
        "- Machine: {} cores ({}), {} MiB RAM, Linux {}. 1-minute load average {:.2} at the start, {:.2} at the end.",
        m0.cores, m0.cpu, m0.memory_mib, m0.kernel, m0.loadavg_start, m0.loadavg_end
    );
    if let Some(n) = &rep.note {
        let _ = writeln!(md, "- Note: {n}");
    }
    let p = &rep.params;
    let _ = writeln!(
        md,
        "- Load: {} B of chat text per message (API POST body ≈ {} B, signed bridge POST ≈ {} B); \
         paced phase {} messages at {} msg/s; saturated phase {} messages with {} in flight; \
         direct-bridge phase {} envelopes with {} in flight.",
        p.text_bytes,
        p.api_post_bytes,
        p.bridge_post_bytes,
        p.paced_messages,
        fmt_num(p.paced_rate),
        p.saturated_messages,
        p.concurrency,
        p.direct_messages,
        p.concurrency
    );
    let _ = writeln!(
        md,
        "- Transcript durability: every accepted envelope is acknowledged only after its \
         batch's `fdatasync`; append + fdatasync of a 600-byte line in `{}` took p50 {:.3} ms, \
         p99 {:.3} ms on this disk.",
        rep.fsync.dir, rep.fsync.p50_ms, rep.fsync.p99_ms
    );
    let c = &rep.crypto;
    let _ = writeln!(
        md,
        "- Signatures, in-process on a {} B envelope ({} iterations): Ed25519 sign {:.1} µs, \
         verify {:.1} µs, or per envelope {:.1} µs in batches of 8 and {:.1} µs in batches of 64; \
         the pairwise entry for one peer: add {:.1} µs, verify {:.1} µs (the whole check, \
         no Ed25519 arithmetic); HMAC-SHA256 sign {:.1} µs, verify {:.1} µs. A sender signs \
         an envelope once (peers share the signature within a second) and adds one pairwise \
         entry per peer; a receiver verifies each envelope once: by its pairwise entry when it \
         carries a valid one, else by the Ed25519 signature, together with whatever else \
         waits on its verify thread (docs/security.md).\n",
        c.body_bytes,
        c.iterations,
        c.ed25519_sign_us,
        c.ed25519_verify_us,
        c.ed25519_verify_batch8_us,
        c.ed25519_verify_batch64_us,
        c.pairwise_sign_us,
        c.pairwise_verify_us,
        c.hmac_sign_us,
        c.hmac_verify_us
    );
    let _ = writeln!(md, "## Headline\n");
    for m in &rep.meshes {
        let _ = writeln!(md, "### {} nodes\n", m.nodes);
        let _ = writeln!(
            md,
            "fdatasync probe just before this section: p50 {:.2} ms, p99 {:.2} ms.\n",
            m.fsync_ms.0, m.fsync_ms.1
        );
        let _ = writeln!(md, "| {} |", HEADER.join(" | "));
        let _ = writeln!(md, "|---|---:|---:|---:|---|");
        for r in headline_rows(m) {
            let _ = writeln!(md, "| {} |", r.join(" | "));
        }
        if let Some(l) = rounds_line(m) {
            let _ = writeln!(md, "\n{l}");
        }
        let b = &m.botmesh;
        let mut issues = Vec::new();
        if !b.paced.complete || !b.saturated.complete {
            issues.push(format!(
                "not every message reached every peer before the deadline (paced {}/{}, saturated {}/{})",
                b.paced.delivered,
                b.paced.messages * b.paced.receivers,
                b.saturated.delivered,
                b.saturated.messages * b.saturated.receivers
            ));
        }
        if b.paced.send_errors + b.saturated.send_errors > 0 {
            issues.push(format!(
                "{} injection POSTs failed",
                b.paced.send_errors + b.saturated.send_errors
            ));
        }
        for (name, d) in [("direct", &b.direct), ("direct HMAC", &b.direct_hmac)] {
            if d.ok < d.requests {
                issues.push(format!("{name} bridge answers by status: {:?}", d.statuses));
            }
        }
        if b.sse_lagged > 0 {
            issues.push(format!("SSE watchers missed {} events", b.sse_lagged));
        }
        if !b.log_problems.is_empty() {
            issues.push(format!(
                "{} warning/error lines in node logs, e.g. `{}`",
                b.log_problems.len(),
                b.log_problems[0].replace('`', "'")
            ));
        }
        if let (Some(p), Some(s)) = (b.paced.host_steal_percent, b.saturated.host_steal_percent) {
            let _ = writeln!(
                md,
                "\nHost: the hypervisor took {p:.1} % of this machine's CPU time during botmesh's paced phase and {s:.1} % during its saturated one (steal, /proc/stat; time the vCPUs were ready to run and did not, which lands in the latency tail)."
            );
        }
        if issues.is_empty() {
            let _ = writeln!(
                md,
                "\nEvery message reached every peer; no failed request, no missed event, no warning in the node logs.\n"
            );
        } else {
            let _ = writeln!(md, "\nIssues: {}.\n", issues.join("; "));
        }
    }
    let _ = writeln!(md, "## Targets (reported, not asserted)\n");
    let _ = writeln!(md, "| metric | target | measured | |\n|---|---|---|---|");
    for t in &rep.targets {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            t.metric,
            t.target,
            t.measured,
            if t.met { "met" } else { "**missed**" }
        );
    }
    let _ = writeln!(md, "\n## Method\n");
    md.push_str(METHOD);
    let _ = writeln!(
        md,
        "\n{NOTES_BEGIN}\n{}\n{NOTES_END}",
        notes.trim_matches('\n')
    );
    md
}

const METHOD: &str = "\
- **botmesh**: N real `botmesh run` processes (release build) on 127.0.0.1, Ed25519 keys, \
  no `[llm]` (offline provider), bots with no role or skills and `participation = \"mentions\"` \
  so no bot ever replies: only transport is measured. `peer_rate_limit` is raised to 1,000,000/s \
  (the default 200 envelopes/s per peer, burst 400, would otherwise answer 429 and cap one \
  sender). Node logs stay at the default `info` level, written to a file.
- **Fan-out** (the real path): the bench POSTs a human message (`{\"text\", \"from\": \"bench\"}`) to \
  node0's `POST /v1/messages`; node0 writes it to its transcript and outbox log and, while \
  that batch's fdatasync runs, hands it to its per-peer outboxes, which deliver the signed \
  envelope to every other node; each verifies and records it (fdatasync) before answering. \
  The API call is answered after node0's fdatasync. Arrival is the \
  moment the bench reads the `message` event from each peer's `GET /v1/events` SSE stream, which \
  is published after the transcript write: latency = send → in every peer's transcript. The \
  *paced* phase sends open-loop at a fixed rate (latency); the *saturated* phase keeps a fixed \
  number of POSTs in flight (throughput = messages / (first send → last arrival at every peer)).
- **Direct bridge**: the bench signs envelopes itself (`botmesh::wire::signing`, as a peer's outbox \
  does: the sender's Ed25519 signature plus the pairwise entry for node0, docs/security.md; \
  `--ed25519-only` leaves the pairwise entry out, as an older sender would, so node0 verifies \
  the Ed25519 signature) from the other bots and POSTs them to node0's `/bridge/v1/envelopes` \
  with the same number in flight; the identical requests (same bytes and headers) go to the \
  bare hyper server. The same phase is repeated on a 2-node mesh configured with the \
  mesh-wide HMAC secret instead of per-bot Ed25519 keys. The phase runs \
  in rounds (5; 3 with `--quick`), each one botmesh Ed25519 → hyper → botmesh HMAC → hyper on \
  fresh envelopes, back to back, because this host's speed drifts by tens of percent within \
  minutes; every second round runs its HMAC half first, because a botmesh half measured \
  faster in a round's second place than in its first, whichever scheme it was. Before the \
  first round each botmesh bridge gets a warm-up, not counted (50 envelopes; 20 with \
  `--quick`; as many in flight as the rounds), and the sink gets the identical requests. \
  The direct ratios are the medians of the rounds' ratios, and the envelopes/s columns \
  and the receiver CPU ratios are over all rounds (each round's CPU ratio is listed under its \
  mesh's table).
- **Bare hyper** (the ceiling): a separate process (`botmesh-bench sink`) with hyper 1 http1 on \
  a tokio multi-thread runtime, which reads each body and answers `200 {\"accepted\":true}`: no \
  auth, no parsing, no storage.
- **Redis pub/sub** (the relay earlier designs recommended): Debian's `redis-server` on \
  127.0.0.1 at a random port, `--save \"\" --appendonly no`; one subscriber connection per \
  receiving bot (N − 1), one pipelined publisher; the payload is the same envelope JSON a node \
  broadcasts; same rate and same window as botmesh. No auth, no durability, no retry: a lower \
  bound for a relay, not a like-for-like.
- **CPU** is the on-CPU time of every thread of the server processes over the phase, from \
  `/proc/<pid>/task/*/schedstat` (nanoseconds; `/proc/<pid>/stat` ticks as a fallback); the \
  bench client's own CPU is not counted. **RSS** is `VmRSS` from \
  `/proc/<pid>/status`: idle after the processes settled, and the peak of 50 ms samples during \
  the saturated and direct phases. **Start-up** is spawn → first `200` from `/healthz` (Redis: \
  `PONG`), polled every millisecond, nodes started one at a time.
- `scripts/bench.sh --quick` runs smaller phases (under a minute) and writes its results under \
  the target folder, never over these files; `--perf DIR` records `perf` profiles of node0 and \
  node1 during the first mesh's saturated and direct phases.
- The client, the servers and anything else on the machine share the same cores, so the \
  absolute figures are pessimistic on a small machine and noisy when others are busy; the \
  baselines suffer the same conditions, which is why the ratios are the headline.
";

/// Reads the hand-written notes of an existing report (empty if none).
pub fn existing_notes(path: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    match (text.find(NOTES_BEGIN), text.find(NOTES_END)) {
        (Some(a), Some(b)) if b > a => text[a + NOTES_BEGIN.len()..b].to_string(),
        _ => String::new(),
    }
}

/// `YYYY-MM-DD HH:MM:SS` for unix seconds (UTC, proleptic Gregorian).
pub fn utc(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_bar_is_checked_at_every_size() {
        let mesh = |nodes, cpu| {
            let mut m = MeshResult {
                nodes,
                ..MeshResult::default()
            };
            m.ratios.direct_cpu_vs_hyper = cpu;
            m
        };
        let checks = check_targets(&[mesh(3, 2.99), mesh(32, 3.01), mesh(8, 0.0)]);
        let cpu: Vec<(&str, bool)> = checks
            .iter()
            .filter(|t| t.metric.starts_with("receiver CPU"))
            .map(|t| (t.measured.as_str(), t.met))
            .collect();
        // No measurement (0) is not a pass.
        assert_eq!(cpu, [("2.99×", true), ("3.01×", false), ("0.00×", false)]);
    }

    #[test]
    fn each_rounds_cpu_ratio_and_the_baselines_spread_are_reported() {
        let ingest = |per_s, cpu_us: f64| Ingest {
            per_s,
            cpu_s_per_1000: cpu_us / 1000.0,
            ..Ingest::default()
        };
        let round = |ed: f64, hyper: f64, hm: f64, hyper_hm: f64| DirectRound {
            ed25519: ingest(500.0, ed),
            hyper: ingest(1000.0, hyper),
            hmac: ingest(600.0, hm),
            hyper_hmac: ingest(1000.0, hyper_hm),
            hmac_first: false,
        };
        let mut second = round(26.0, 6.5, 22.0, 11.0);
        second.hmac_first = true;
        let mut m = MeshResult {
            nodes: 3,
            direct_rounds: vec![round(25.0, 10.0, 24.0, 8.0), second],
            ..MeshResult::default()
        };
        m.compute_ratios();
        assert_eq!(m.ratios.direct_vs_hyper, 0.5);
        let line = rounds_line(&m).expect("two rounds");
        assert!(
            line.contains("per-bot keys 2.50, 4.00; HMAC 3.00, 2.00;"),
            "{line}"
        );
        assert!(line.contains("ranged 6.5–11.0 µs"), "{line}");
        assert!(line.contains("the HMAC half first in round 2)"), "{line}");
        assert_eq!(rounds_line(&MeshResult::default()), None);
    }

    #[test]
    fn the_halves_take_turns_going_first() {
        let order: Vec<bool> = (0..5).map(DirectRound::hmac_first).collect();
        assert_eq!(order, [false, true, false, true, false]);
    }

    #[test]
    fn formats_dates_and_keeps_notes() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_763_800_000), "2025-11-22 08:26:40");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.md");
        std::fs::write(&p, format!("x\n{NOTES_BEGIN}\nkeep me\n{NOTES_END}\n")).unwrap();
        assert_eq!(existing_notes(&p).trim(), "keep me");
    }
}
