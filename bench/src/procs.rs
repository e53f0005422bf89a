//! Child processes and what `/proc` says about them: RSS, CPU time, start-up.
//!
//! Every process the benchmark starts is a [`Proc`]: stopped with SIGTERM and a bounded
//! wait, and killed on drop if still running, so an aborted run leaves nothing behind.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A child process started by the benchmark.
pub struct Proc {
    /// A short label for reports and errors ("node3", "redis", "sink").
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// When it was spawned.
    pub spawned: Instant,
    child: Child,
    log: Option<std::path::PathBuf>,
}

impl Proc {
    /// Spawns `cmd` with stdin closed and stdout/stderr appended to `log` (or discarded).
    pub fn spawn(name: &str, mut cmd: Command, log: Option<&Path>) -> anyhow::Result<Proc> {
        let (out, err) = match log {
            Some(p) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("opening {}", p.display()))?;
                (Stdio::from(f.try_clone()?), Stdio::from(f))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        let spawned = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name} ({cmd:?})"))?;
        Ok(Proc {
            name: name.to_string(),
            pid: child.id(),
            spawned,
            child,
            log: log.map(Path::to_path_buf),
        })
    }

    /// Fails with the end of its log if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}) — last log lines:\n{}",
                self.name,
                self.log_tail(20)
            );
        }
        Ok(())
    }

    /// The last `n` lines of its log, if it has one.
    pub fn log_tail(&self, n: usize) -> String {
        let Some(p) = &self.log else {
            return String::new();
        };
        let text = std::fs::read_to_string(p).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        self.stop_with("-TERM", grace);
    }

    /// Sends `signal` (as `kill` spells it, e.g. `-INT`), waits up to `grace`, then SIGKILL.
    pub fn stop_with(&mut self, signal: &str, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = Command::new("kill")
            .args([signal, &self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Resident set size of `pid` in KiB (`VmRSS` in `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Clock ticks per second for `/proc/<pid>/stat` (`getconf CLK_TCK`, 100 if unknown).
fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// CPU seconds used so far by `pid`: the sum of its threads' on-CPU time from
/// `/proc/<pid>/task/*/schedstat` (nanosecond resolution; phases are short and a 10 ms
/// tick would blur them), else user + system time from `/proc/<pid>/stat`.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).ok();
    let ns: u64 = threads
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let s = std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok()?;
            s.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    if ns > 0 {
        return Some(ns as f64 / 1e9);
    }
    stat_cpu_secs(pid)
}

/// User + system CPU seconds of every thread of `pid`, from `/proc/<pid>/stat` (ticks).
pub fn stat_cpu_secs(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields are counted after its closing ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime field 15.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / clk_tck())
}

/// Sum of [`cpu_secs`] over `pids` (missing processes count 0).
pub fn cpu_total(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|&p| cpu_secs(p)).sum()
}

/// The machine's CPU time from the first line of /proc/stat, in ticks: (stolen by
/// the hypervisor, all). On a virtual machine whose host is busy, steal is time the
/// vCPUs were ready to run and did not: it shows up as latency, not as CPU use.
pub fn host_cpu_ticks() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = s
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice, inside user].
    let all = fields.iter().take(8).sum();
    Some((*fields.get(7)?, all))
}

/// Percent of the machine's CPU time stolen between two [`host_cpu_ticks`] readings.
pub fn steal_percent(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    let ((s0, a0), (s1, a1)) = (before?, after?);
    (a1 > a0).then(|| (s1.saturating_sub(s0)) as f64 * 100.0 / (a1 - a0) as f64)
}

/// A free TCP port on 127.0.0.1 (bound to port 0, then released).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(free_ports(1)?[0])
}

/// `n` distinct free TCP ports on 127.0.0.1: all are held bound until the last is
/// found, then released. Ports found one at a time can repeat (the kernel may hand
/// out a port again once it is released), and a mesh whose config names a port twice
/// does not start.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// Samples VmRSS of some processes every 50 ms in the background; keeps each maximum.
pub struct RssSampler {
    max: Arc<Mutex<HashMap<u32, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    /// Starts sampling `pids`.
    pub fn start(pids: Vec<u32>) -> RssSampler {
        let max: Arc<Mutex<HashMap<u32, u64>>> = Arc::default();
        let m = max.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tick.tick().await;
                let mut m = m.lock().expect("rss lock");
                for &p in &pids {
                    if let Some(kib) = rss_kib(p) {
                        let e = m.entry(p).or_insert(0);
                        *e = (*e).max(kib);
                    }
                }
            }
        });
        RssSampler { max, task }
    }

    /// Stops sampling; returns the largest RSS seen per pid, in KiB.
    pub fn finish(self) -> HashMap<u32, u64> {
        self.task.abort();
        let m = self.max.lock().expect("rss lock").clone();
        m
    }
}

/// KiB to MiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// What the benchmark knows about the machine it ran on.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    /// Logical CPUs visible to the process.
    pub cores: usize,
    /// `model name` from /proc/cpuinfo.
    pub cpu: String,
    /// Kernel release.
    pub kernel: String,
    /// Total memory in MiB.
    pub memory_mib: u64,
    /// 1-minute load average when the run started (others compiling show up here).
    pub loadavg_start: f64,
    /// 1-minute load average when the run ended.
    pub loadavg_end: f64,
}

impl Machine {
    /// Reads /proc; the end load average is filled in later.
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let memory_mib = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|k| k / 1024)
            .unwrap_or(0);
        Machine {
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            memory_mib,
            loadavg_start: loadavg(),
            loadavg_end: 0.0,
        }
    }
}

/// The 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// Append-plus-fdatasync latency of a ~600-byte line in `dir`, the same operation a
/// transcript write does per batch: (p50 ms, p99 ms) over `n` writes.
pub fn fsync_probe(dir: &Path, n: usize) -> anyhow::Result<(f64, f64)> {
    use std::io::Write;
    let path = dir.join("fsync-probe.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let line = [b'x'; 600];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        f.write_all(&line)?;
        let t = Instant::now();
        f.sync_data()?;
        v.push(t.elapsed().as_nanos() as u64);
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    v.sort_unstable();
    Ok((
        crate::stats::percentile(&v, 50.0) as f64 / 1e6,
        crate::stats::percentile(&v, 99.0) as f64 / 1e6,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_proc_entries() {
        let me = std::process::id();
        assert!(rss_kib(me).unwrap() > 0);
        assert!(cpu_secs(me).is_some());
        assert!(stat_cpu_secs(me).is_some());
        assert!(free_port().unwrap() > 0);
        let ports = free_ports(64).unwrap();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), 64, "{ports:?}");
    }

    #[test]
    fn steal_is_the_stolen_share_of_the_ticks_between_two_readings() {
        let (steal, all) = host_cpu_ticks().expect("/proc/stat has a steal column");
        assert!(steal <= all && all > 0);
        assert_eq!(
            steal_percent(Some((10, 1_000)), Some((60, 2_000))),
            Some(5.0)
        );
        assert_eq!(steal_percent(Some((10, 1_000)), Some((10, 1_000))), None);
        assert_eq!(steal_percent(None, Some((10, 1_000))), None);
    }
}
