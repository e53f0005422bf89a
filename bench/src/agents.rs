//! `botmesh-bench agents`: what botmesh adds to a coding agent's turn (issue 28).
//!
//! Two real `botmesh run` nodes on 127.0.0.1, bots `agent0` and `agent1`, each answering
//! mentions with an ACP agent: this binary's hidden `acp-agent` command ([`serve_agent`]),
//! a minimal agent speaking ACP over its stdio that writes down, in unix microseconds,
//! when each prompt arrived, when it sent its first progress (a `tool_call`), and when
//! it answered `end_turn`. The bench mentions the bots in turn through the local API
//! (`POST /v1/messages`) and timestamps, on each node's `GET /v1/events`, the first
//! `progress` event and the reply's `message` event. Per turn:
//!
//! - **end_turn → reply on the page**: from the agent's `end_turn` to the reply recorded,
//!   published and seen by a watcher — everything botmesh does with an answer.
//! - **message → prompt at the agent**: from the person's POST to the agent reading its
//!   prompt — botmesh's hand-over (record, decide, build the prompt, `session/prompt`).
//!   A mention needs no judge or claim, so the bot has its turn as soon as it decided.
//! - **message → first progress on the page**: from the person's POST to the agent's
//!   first `tool_call` shown as a `progress` event (the page's "working: …" line); it
//!   bounds the time from winning the turn to the first progress sign from above.
//!
//! Then the node's RSS with its agent attached, against the same two nodes whose bots
//! answer with the built-in model (the offline provider: no LLM configured), after the
//! same number of turns. Every wait is bounded; the turns are `--turns`.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};

use crate::mesh::wait_healthy;
use crate::procs::{free_ports, mib, rss_kib, Machine, Proc};
use crate::stats::Latency;

/// Options of `botmesh-bench agents`.
#[derive(Args, Clone)]
pub struct AgentArgs {
    /// Turns measured (each bot gets half).
    #[arg(long, default_value_t = 200)]
    turns: usize,
    /// How long the bench agent works on each turn, between its first progress and its
    /// answer, ms.
    #[arg(long, default_value_t = 20)]
    work_ms: u64,
    /// The botmesh binary (default: `botmesh` next to this binary).
    #[arg(long)]
    botmesh: Option<PathBuf>,
    /// Update the results block of this Markdown file (docs/agents.md).
    #[arg(long)]
    out_md: Option<PathBuf>,
    /// A note for the report.
    #[arg(long)]
    note: Option<String>,
}

/// Unix microseconds now.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------
// The bench's ACP agent
// ---------------------------------------------------------------------------------

/// The hidden `acp-agent` command: a minimal ACP agent on stdin/stdout. `initialize` and
/// `session/new` are answered at once; a `session/prompt` gets a `tool_call` update
/// ("bench work", in progress), `work_ms` of work, a message chunk `"done <label>"` (the
/// prompt's last word) and `end_turn`. Each turn appends `prompt_us progress_us end_us
/// label` to `$BENCH_AGENT_LOG`, after the answer is written. Ends when stdin closes.
pub fn serve_agent() -> anyhow::Result<()> {
    let log_path = std::env::var("BENCH_AGENT_LOG").context("BENCH_AGENT_LOG is not set")?;
    let work = Duration::from_millis(
        std::env::var("BENCH_AGENT_WORK_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20),
    );
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {log_path}"))?;
    writeln!(log, "started {}", std::process::id())?;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut send = |v: Value| -> std::io::Result<()> {
        out.write_all(v.to_string().as_bytes())?;
        out.write_all(b"\n")?;
        out.flush()
    };
    let mut sessions = 0u64;
    for line in stdin.lock().lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let (id, method) = (msg.get("id").cloned(), msg["method"].as_str().unwrap_or(""));
        let Some(id) = id else {
            continue; // a notification (session/cancel): nothing to cancel here
        };
        match method {
            "initialize" => send(json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": 1, "agentCapabilities": {}, "authMethods": [],
                "agentInfo": {"name": "botmesh-bench-agent", "version": "1"}}}))?,
            "session/new" => {
                sessions += 1;
                send(json!({"jsonrpc": "2.0", "id": id,
                    "result": {"sessionId": format!("bench-{sessions}")}}))?;
            }
            "session/prompt" => {
                let prompt_us = now_us();
                let session = msg["params"]["sessionId"].clone();
                let text = msg["params"]["prompt"]
                    .as_array()
                    .and_then(|b| b.last())
                    .and_then(|b| b["text"].as_str())
                    .unwrap_or("");
                let label = text.split_whitespace().last().unwrap_or("").to_string();
                let update = |update: Value| {
                    json!({"jsonrpc": "2.0", "method": "session/update",
                        "params": {"sessionId": session, "update": update}})
                };
                send(update(
                    json!({"sessionUpdate": "tool_call", "toolCallId": "w1",
                    "title": "bench work", "kind": "think", "status": "in_progress"}),
                ))?;
                let progress_us = now_us();
                std::thread::sleep(work);
                send(update(json!({"sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": format!("done {label}")}})))?;
                let end_us = now_us();
                send(json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": "end_turn"}}))?;
                writeln!(log, "{prompt_us} {progress_us} {end_us} {label}")?;
            }
            _ => send(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "method not found"}}))?,
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------

/// Two nodes and their event watchers.
pub(crate) struct Pair {
    /// The node processes, `agent0` then `agent1`.
    pub(crate) nodes: Vec<Proc>,
    /// Their local APIs.
    pub(crate) apis: Vec<SocketAddr>,
    /// What their watchers saw.
    pub(crate) seen: Arc<Seen>,
    /// The watcher tasks.
    watchers: Vec<tokio::task::JoinHandle<()>>,
}

/// What the bench's watchers saw: unix µs of the first `progress` event per trigger
/// id, and of each reply's `message` event per turn label.
#[derive(Default)]
pub(crate) struct Seen {
    /// Trigger id → first progress event.
    progress: std::sync::Mutex<HashMap<String, u64>>,
    /// Turn label (`turn-7`) → the reply's message event.
    pub(crate) replies: std::sync::Mutex<HashMap<String, u64>>,
}

/// The folder bot `name`'s bench agent works and logs in: `dir/<name>.work`, apart from
/// the nodes' config, secret and data, which the agent's box keeps it from (a new file
/// cannot be made in a folder holding them).
fn agent_work_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.work"))
}

/// The `agent = …` line that makes bot `name` answer with this bench's ACP agent
/// (`exe acp-agent`, working `work_ms` per turn, boxed as by default, in and logging
/// into [`agent_work_dir`]), which it makes.
pub(crate) fn bench_agent(
    exe: &Path,
    dir: &Path,
    name: &str,
    work_ms: u64,
) -> anyhow::Result<String> {
    let work = agent_work_dir(dir, name);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    Ok(format!(
        "agent = {{ acp = [{:?}, \"acp-agent\"], cwd = {:?}, env = {{ BENCH_AGENT_LOG = {:?}, BENCH_AGENT_WORK_MS = \"{work_ms}\" }} }}\n",
        exe.display().to_string(),
        work.display().to_string(),
        work.join("agent.log").display().to_string(),
    ))
}

/// Starts `agent0` and `agent1` in `dir`, each with its `agents[i]` line (an `agent =
/// …` setting; none: the built-in model), and watches their events.
pub(crate) async fn start_pair(
    bin: &Path,
    dir: &Path,
    agents: [Option<String>; 2],
    http: &reqwest::Client,
) -> anyhow::Result<Pair> {
    std::fs::create_dir_all(dir)?;
    let secret = botmesh::wire::signing::HmacSecret::generate();
    std::fs::write(dir.join("mesh.secret"), secret.to_whsec())?;
    let mut toml = format!(
        "[mesh]\ngroup = \"demo\"\ndata_dir = \"data\"\nsecret_file = \"mesh.secret\"\n{}\n",
        crate::mesh::MESH_SETTINGS
    );
    let mut addrs = Vec::new();
    let mut ports = free_ports(2 * agents.len())?.into_iter();
    for (i, agent) in agents.iter().enumerate() {
        let name = format!("agent{i}");
        let bridge = SocketAddr::from(([127, 0, 0, 1], ports.next().expect("two per bot")));
        let api = SocketAddr::from(([127, 0, 0, 1], ports.next().expect("two per bot")));
        toml.push_str(&format!(
            "[[bots]]\nname = \"{name}\"\nbridge = \"{bridge}\"\napi = \"{api}\"\nparticipation = \"mentions\"\n"
        ));
        if let Some(agent) = agent {
            toml.push_str(agent);
        }
        toml.push('\n');
        addrs.push((name, api));
    }
    let config = dir.join("peers.toml");
    std::fs::write(&config, toml)?;
    let seen = Arc::new(Seen::default());
    let mut pair = Pair {
        nodes: Vec::new(),
        apis: Vec::new(),
        seen: seen.clone(),
        watchers: Vec::new(),
    };
    for (name, api) in addrs {
        let mut cmd = Command::new(bin);
        cmd.args(["run", "--bot", &name, "--config"])
            .arg(&config)
            .env_remove("BOTMESH_LOG");
        let log = dir.join(format!("{name}.log"));
        let mut proc = Proc::spawn(&name, cmd, Some(&log))?;
        wait_healthy(&mut proc, &format!("http://{api}/healthz"), http).await?;
        let url = format!("http://{api}/v1/events?group=demo");
        let resp = http
            .get(&url)
            .timeout(Duration::from_secs(3600))
            .send()
            .await
            .with_context(|| format!("subscribing to {url}"))?;
        if !resp.status().is_success() {
            bail!("{url}: {}", resp.status());
        }
        pair.watchers
            .push(tokio::spawn(watch(resp, name.clone(), seen.clone())));
        pair.nodes.push(proc);
        pair.apis.push(api);
    }
    Ok(pair)
}

/// Reads one node's events: the first `progress` per trigger, and each reply by `bot`
/// (by the turn label in its text), timestamped as their chunk arrives.
async fn watch(mut resp: reqwest::Response, bot: String, seen: Arc<Seen>) {
    let mut buf = String::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let at = now_us();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            match v["type"].as_str() {
                Some("progress") => {
                    let trigger = v["trigger"].as_str().unwrap_or("").to_string();
                    let mut p = seen.progress.lock().expect("not poisoned");
                    p.entry(trigger).or_insert(at);
                }
                Some("message") if v["envelope"]["author"]["name"] == bot.as_str() => {
                    let text = v["envelope"]["text"].as_str().unwrap_or("");
                    if let Some(label) = label_in(text) {
                        let mut r = seen.replies.lock().expect("not poisoned");
                        r.entry(label).or_insert(at);
                    }
                }
                _ => {}
            }
        }
    }
}

/// The turn label (`turn-7`) a reply's text carries (the agent's "done turn-7", the
/// offline model's quote of the question).
fn label_in(text: &str) -> Option<String> {
    let at = text.find("turn-")?;
    let digits: String = text[at + 5..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    (!digits.is_empty()).then(|| format!("turn-{digits}"))
}

impl Pair {
    /// Mentions the bots in turn, `turns` times, each time waiting (at most 10 s) for
    /// the reply; returns per turn (label, trigger id, unix µs of the POST).
    async fn run_turns(
        &self,
        turns: usize,
        http: &reqwest::Client,
    ) -> anyhow::Result<Vec<(String, String, u64)>> {
        let mut out = Vec::with_capacity(turns);
        for k in 0..turns {
            let i = k % 2;
            let label = format!("turn-{k}");
            let posted = now_us();
            let r = http
                .post(format!("http://{}/v1/messages", self.apis[i]))
                .json(&json!({"text": format!("@agent{i} {label}"), "from": "alice"}))
                .send()
                .await?;
            if !r.status().is_success() {
                bail!("POST /v1/messages: {}", r.status());
            }
            let id = r.json::<Value>().await?["id"]
                .as_str()
                .unwrap_or("")
                .to_string();
            self.wait_reply(i, &label).await?;
            out.push((label, id, posted));
        }
        Ok(out)
    }

    /// Waits (at most 10 s) until `agent{i}`'s reply carrying `label` is on its page.
    pub(crate) async fn wait_reply(&self, i: usize, label: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self
            .seen
            .replies
            .lock()
            .expect("not poisoned")
            .contains_key(label)
        {
            if Instant::now() > deadline {
                bail!(
                    "agent{i} did not answer {label} within 10 s; its log ends:\n{}",
                    self.nodes[i].log_tail(15)
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// The nodes' RSS, MiB.
    fn rss(&self) -> Vec<f64> {
        self.nodes
            .iter()
            .map(|n| rss_kib(n.pid).map(mib).unwrap_or(0.0))
            .collect()
    }

    /// Stops the nodes (each stops its agent) and the watchers.
    pub(crate) fn stop(&mut self) {
        for w in self.watchers.drain(..) {
            w.abort();
        }
        for n in &mut self.nodes {
            n.stop(Duration::from_secs(6));
        }
    }
}

/// One agent turn as the agent logged it: (prompt, first progress, end_turn), unix µs.
pub(crate) type Logged = (u64, u64, u64);

/// The turns both bench agents logged, by label, and their pids.
pub(crate) fn agent_turns(dir: &Path) -> (HashMap<String, Logged>, Vec<u32>) {
    let mut turns = HashMap::new();
    let mut pids = Vec::new();
    for i in 0..2 {
        let text =
            std::fs::read_to_string(agent_work_dir(dir, &format!("agent{i}")).join("agent.log"))
                .unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["started", pid] => pids.extend(pid.parse::<u32>().ok()),
                [p, g, e, label] => {
                    if let (Ok(p), Ok(g), Ok(e)) = (p.parse(), g.parse(), e.parse()) {
                        turns.insert(label.to_string(), (p, g, e));
                    }
                }
                _ => {}
            }
        }
    }
    (turns, pids)
}

/// A latency from µs differences (negative ones, clock noise, count as 0).
pub(crate) fn latency(us: impl Iterator<Item = i64>) -> Latency {
    Latency::from_nanos(us.map(|d| d.max(0) as u64 * 1000).collect())
}

pub(crate) fn lat(l: &Latency) -> String {
    format!("{:.2} / {:.2} / {:.2}", l.p50_ms, l.p99_ms, l.max_ms)
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(0.0, f64::max);
    format!("{lo:.1}–{hi:.1}")
}

/// What a run of `agents` or `asks` starts from.
pub(crate) struct Setup {
    /// This binary (its hidden `acp-agent` is the bench agent).
    pub(crate) exe: PathBuf,
    /// The botmesh binary the nodes run.
    pub(crate) bin: PathBuf,
    /// The machine, probed at the start.
    pub(crate) machine: Machine,
    /// Unix seconds at the start.
    pub(crate) started: u64,
    /// The bench's HTTP client (no proxy, bounded).
    pub(crate) http: reqwest::Client,
}

impl Setup {
    /// Finds the binaries (`botmesh` next to this one unless given) and probes the
    /// machine; an error names a missing binary.
    pub(crate) fn new(botmesh: Option<&Path>) -> anyhow::Result<Setup> {
        let exe = std::env::current_exe().context("this binary's path")?;
        let bin = match botmesh {
            Some(b) => b.to_path_buf(),
            None => exe.with_file_name("botmesh"),
        };
        if !bin.exists() {
            bail!(
                "{} not found: build it (cargo build --release -p botmesh) or pass --botmesh",
                bin.display()
            );
        }
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .build()?;
        Ok(Setup {
            exe,
            bin,
            machine: Machine::probe(),
            started,
            http,
        })
    }
}

/// The start of a report: how it was made (`command`, the arguments after
/// `botmesh-bench`), when, with which nodes, on what machine, and the `note`.
pub(crate) fn header(
    command: &str,
    started: u64,
    bin: &Path,
    machine: &Machine,
    note: Option<&str>,
) -> String {
    let mut md = format!(
        "Generated by `botmesh-bench {command}` on {} UTC, nodes from `{}` (`cargo build --release -p botmesh -p botmesh-bench` first).\n\n",
        crate::report::utc(started),
        bin.display()
    );
    md.push_str(&format!(
        "- Machine: {} cores ({}), {} MiB RAM, Linux {}; 1-minute load average {:.2} at the start, {:.2} at the end.\n",
        machine.cores, machine.cpu, machine.memory_mib, machine.kernel, machine.loadavg_start, machine.loadavg_end
    ));
    if let Some(note) = note {
        md.push_str(&format!("- Note: {note}\n"));
    }
    md
}

/// Runs the bench; prints the Markdown and writes it into `--out-md`.
pub async fn run(args: AgentArgs, tmp: &Path) -> anyhow::Result<()> {
    let Setup {
        exe,
        bin,
        mut machine,
        started,
        http,
    } = Setup::new(args.botmesh.as_deref())?;
    let turns = args.turns.max(2);

    // The agents.
    let dir = tmp.join("acp");
    let agents = [
        Some(bench_agent(&exe, &dir, "agent0", args.work_ms)?),
        Some(bench_agent(&exe, &dir, "agent1", args.work_ms)?),
    ];
    let mut pair = start_pair(&bin, &dir, agents, &http).await?;
    let idle_acp = pair.rss();
    let posted = pair.run_turns(turns, &http).await;
    let after_acp = pair.rss();
    let (logged, agent_pids) = agent_turns(&dir);
    let agent_rss: Vec<f64> = agent_pids
        .iter()
        .map(|p| rss_kib(*p).map(mib).unwrap_or(0.0))
        .collect();
    let progress = pair.seen.progress.lock().expect("not poisoned").clone();
    let replies = pair.seen.replies.lock().expect("not poisoned").clone();
    pair.stop();
    let posted = posted?;

    let mut after_end = Vec::new();
    let mut to_prompt = Vec::new();
    let mut to_progress = Vec::new();
    let mut whole = Vec::new();
    for (label, id, at) in &posted {
        let (Some(&(prompt, _, end)), Some(&reply)) = (logged.get(label), replies.get(label))
        else {
            bail!("turn {label} is missing from the agent's log or the events");
        };
        after_end.push(reply as i64 - end as i64);
        to_prompt.push(prompt as i64 - *at as i64);
        whole.push(reply as i64 - *at as i64);
        if let Some(&p) = progress.get(id) {
            to_progress.push(p as i64 - *at as i64);
        }
    }
    if to_progress.len() < posted.len() {
        bail!(
            "only {} of {} turns showed progress on the page",
            to_progress.len(),
            posted.len()
        );
    }

    // The baseline: the same nodes answering with the built-in model.
    let base_dir = tmp.join("model");
    let mut base = start_pair(&bin, &base_dir, [None, None], &http).await?;
    let idle_model = base.rss();
    let base_posted = base.run_turns(turns, &http).await;
    let after_model = base.rss();
    let base_replies = base.seen.replies.lock().expect("not poisoned").clone();
    base.stop();
    let base_posted = base_posted?;
    let base_whole: Vec<i64> = base_posted
        .iter()
        .filter_map(|(label, _, at)| base_replies.get(label).map(|r| *r as i64 - *at as i64))
        .collect();
    machine.loadavg_end = crate::procs::loadavg();

    let after_end = latency(after_end.into_iter());
    let to_prompt = latency(to_prompt.into_iter());
    let to_progress = latency(to_progress.into_iter());
    let whole = latency(whole.into_iter());
    let base_whole = latency(base_whole.into_iter());
    let mut md = header(
        &format!(
            "agents --turns {turns} --work-ms {} --out-md docs/agents.md",
            args.work_ms
        ),
        started,
        &bin,
        &machine,
        args.note.as_deref(),
    );
    md.push_str(&format!(
        "- Two nodes on 127.0.0.1 (`participation = \"mentions\"`, local platform), each bot's engine an ACP agent that works {} ms per turn; {turns} turns, the bots mentioned in turn, one at a time. Baseline: the same two nodes with the built-in model (offline provider, no LLM configured), the same turns.\n\n",
        args.work_ms
    ));
    md.push_str("| per turn, ms | p50 / p99 / max |\n|---|---:|\n");
    md.push_str(&format!(
        "| the agent's `end_turn` → the reply on the page (`message` event): what botmesh adds after the agent | {} |\n",
        lat(&after_end)
    ));
    md.push_str(&format!(
        "| the person's message → the agent reads its prompt (record, decide, prompt) | {} |\n",
        lat(&to_prompt)
    ));
    md.push_str(&format!(
        "| the person's message → the first progress on the page (`progress` event; bounds winning the turn → first sign) | {} |\n",
        lat(&to_progress)
    ));
    md.push_str(&format!(
        "| the person's message → the reply on the page, ACP agent ({} ms of work) | {} |\n",
        args.work_ms,
        lat(&whole)
    ));
    md.push_str(&format!(
        "| the person's message → the reply on the page, built-in model (offline) | {} |\n\n",
        lat(&base_whole)
    ));
    md.push_str("| node RSS, MiB | ACP agent attached | built-in model |\n|---|---:|---:|\n");
    md.push_str(&format!(
        "| after start-up | {} | {} |\n| after the turns | {} | {} |\n\n",
        range(&idle_acp),
        range(&idle_model),
        range(&after_acp),
        range(&after_model)
    ));
    md.push_str(&format!(
        "The bench agents themselves (not in the node's figure): {} MiB each. A real agent is much larger (codex-acp: a 220 MB binary on disk).\n",
        range(&agent_rss)
    ));
    println!("{md}");
    if let Some(path) = &args.out_md {
        crate::transports::write_markdown(path, &md)?;
        eprintln!("botmesh-bench: wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_turn_label_is_found_in_the_agents_and_the_offline_models_text() {
        assert_eq!(label_in("done turn-17"), Some("turn-17".into()));
        assert_eq!(
            label_in("[offline] agent0 here … to alice: \"@agent0 turn-3\". I can help"),
            Some("turn-3".into())
        );
        assert_eq!(label_in("turn-x"), None);
        assert_eq!(label_in("hello"), None);
    }
}
