//! `botmesh-bench asks`: what botmesh adds to a colleague's `ask` (issue 34).
//!
//! Two real `botmesh run` nodes on 127.0.0.1: `agent0`, an external-agent bot
//! (`agent = { external = true }`) whose outside agent is this bench, calling the group
//! tools on its node's local API (`POST /v1/tools/<tool>`, what `botmesh mcp` calls for
//! an agent), and `agent1`, answering mentions with the bench's ACP agent
//! (`agents::serve_agent`) working 0 ms, so it answers as soon as it reads its prompt
//! and logs, in unix microseconds, when it read the prompt and when it answered. Per
//! ask, one at a time:
//!
//! 1. a person mentions `agent0` (`POST /v1/messages`) and the bench takes that message
//!    with `wait_for_message` (which starts the outside agent's turn, its ask count from
//!    zero);
//! 2. the bench calls `ask {colleague: "agent1", question: "… ask-K"}` and times it.
//!
//! - **ask call → the colleague's agent reads its prompt**: the question recorded,
//!   broadcast to `agent1`'s node, decided (a mention: no judge, no claim) and handed to
//!   the agent in `session/prompt`.
//! - **the colleague's `end_turn` → the `ask` result returned**: the answer recorded
//!   and broadcast by `agent1`'s node, recognised by `agent0`'s node as the answer, and
//!   the tool call's HTTP response read by the bench.
//!
//! Baseline, on the same nodes after the asks: a person's plain mention of `agent1`
//! posted on `agent0`'s node → `agent1`'s agent reads its prompt (the same hop as the
//! question's, without the tool). Every wait is bounded; the asks are `--asks`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::{json, Value};

use crate::agents::{
    agent_turns, bench_agent, header, lat, latency, now_us, start_pair, Pair, Setup,
};

/// Options of `botmesh-bench asks`.
#[derive(Args, Clone)]
pub struct AskArgs {
    /// Asks measured (and as many baseline mentions).
    #[arg(long, default_value_t = 200)]
    asks: usize,
    /// The botmesh binary (default: `botmesh` next to this binary).
    #[arg(long)]
    botmesh: Option<PathBuf>,
    /// Update the `asks` block of this Markdown file (docs/agents.md).
    #[arg(long)]
    out_md: Option<PathBuf>,
    /// A note for the report.
    #[arg(long)]
    note: Option<String>,
}

/// One measured ask: unix µs of the tool call made and of its result read.
struct Timed {
    /// The question's label (`ask-7`), the last word the colleague's agent reads.
    label: String,
    /// Just before the `ask` call was sent.
    called: u64,
    /// Just after its result was read.
    returned: u64,
}

/// Calls `tool` on `agent0`'s node; its result, or the refusal as an error.
async fn tool(
    pair: &Pair,
    http: &reqwest::Client,
    tool: &str,
    args: Value,
) -> anyhow::Result<Value> {
    let r = http
        .post(format!("http://{}/v1/tools/{tool}", pair.apis[0]))
        .json(&args)
        .send()
        .await
        .with_context(|| format!("calling {tool}"))?;
    let status = r.status();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        bail!(
            "{tool}: {status} {body}; agent0's log ends:\n{}",
            pair.nodes[0].log_tail(15)
        );
    }
    Ok(body)
}

/// Posts `text` as the person alice on node `i`'s API.
async fn say(pair: &Pair, http: &reqwest::Client, i: usize, text: &str) -> anyhow::Result<()> {
    let r = http
        .post(format!("http://{}/v1/messages", pair.apis[i]))
        .json(&json!({"text": text, "from": "alice"}))
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("POST /v1/messages: {}", r.status());
    }
    Ok(())
}

/// The asks, one at a time (see the module documentation).
async fn run_asks(pair: &Pair, http: &reqwest::Client, asks: usize) -> anyhow::Result<Vec<Timed>> {
    let mut out = Vec::with_capacity(asks);
    for k in 0..asks {
        let label = format!("ask-{k}");
        say(pair, http, 0, &format!("@agent0 task {k}")).await?;
        let handed = tool(pair, http, "wait_for_message", json!({"timeout_secs": 10})).await?;
        if handed.get("message").is_none() {
            bail!("wait_for_message did not hand agent0 the mention: {handed}");
        }
        let called = now_us();
        let result = tool(
            pair,
            http,
            "ask",
            json!({"colleague": "agent1", "question": format!("please check {label}"), "timeout_secs": 10}),
        )
        .await?;
        let returned = now_us();
        let answer = result["answer"].as_str().unwrap_or("");
        if result["from"] != "agent1" || answer != format!("done {label}") {
            bail!("{label}: the ask returned {result}, not agent1's \"done {label}\"");
        }
        out.push(Timed {
            label,
            called,
            returned,
        });
    }
    Ok(out)
}

/// The baseline: `n` plain mentions of `agent1` posted on `agent0`'s node, each waited
/// for (at most 10 s) until `agent1`'s reply is on its page; (label, unix µs posted).
async fn run_mentions(
    pair: &Pair,
    http: &reqwest::Client,
    n: usize,
) -> anyhow::Result<Vec<(String, u64)>> {
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        // `turn-` labels: the watchers record replies that carry one.
        let label = format!("turn-{k}");
        let posted = now_us();
        say(pair, http, 0, &format!("@agent1 {label}")).await?;
        pair.wait_reply(1, &label).await?;
        out.push((label, posted));
    }
    Ok(out)
}

/// Runs the bench; prints the Markdown and writes it into `--out-md`.
pub async fn run(args: AskArgs, tmp: &Path) -> anyhow::Result<()> {
    let setup = Setup::new(args.botmesh.as_deref())?;
    let (exe, http, mut machine) = (&setup.exe, &setup.http, setup.machine.clone());
    let asks = args.asks.max(1);

    let dir = tmp.join("asks");
    let agents = [
        Some("agent = { external = true }\n".to_string()),
        Some(bench_agent(exe, &dir, "agent1", 0)?),
    ];
    let mut pair = start_pair(&setup.bin, &dir, agents, http).await?;
    let timed = run_asks(&pair, http, asks).await;
    let mentions = match &timed {
        Ok(_) => run_mentions(&pair, http, asks).await,
        Err(_) => Ok(Vec::new()),
    };
    pair.stop();
    let (timed, mentions) = (timed?, mentions?);
    let (logged, _) = agent_turns(&dir);
    machine.loadavg_end = crate::procs::loadavg();

    let mut to_prompt = Vec::new();
    let mut to_result = Vec::new();
    let mut whole = Vec::new();
    for t in &timed {
        let Some(&(prompt, _, end)) = logged.get(&t.label) else {
            bail!("{} is missing from agent1's log", t.label);
        };
        to_prompt.push(prompt as i64 - t.called as i64);
        to_result.push(t.returned as i64 - end as i64);
        whole.push(t.returned as i64 - t.called as i64);
    }
    let mut base = Vec::new();
    for (label, posted) in &mentions {
        let Some(&(prompt, _, _)) = logged.get(label) else {
            bail!("{label} is missing from agent1's log");
        };
        base.push(prompt as i64 - *posted as i64);
    }
    let (to_prompt, to_result) = (
        latency(to_prompt.into_iter()),
        latency(to_result.into_iter()),
    );
    let (whole, base) = (latency(whole.into_iter()), latency(base.into_iter()));

    let mut md = header(
        &format!("asks --asks {asks} --out-md docs/agents.md"),
        setup.started,
        &setup.bin,
        &machine,
        args.note.as_deref(),
    );
    md.push_str(&format!(
        "- Two nodes on 127.0.0.1: `agent0` an external-agent bot whose agent is the bench (the group tools on its local API, as `botmesh mcp` calls them), `agent1` an ACP agent answering at once; {asks} asks, one at a time, each in its own turn (a person's mention handed out by `wait_for_message`). Baseline: {} plain mentions of `agent1` posted on `agent0`'s node, after the asks.\n\n",
        mentions.len()
    ));
    md.push_str("| per ask, ms | p50 / p99 / max |\n|---|---:|\n");
    for (what, l) in [
        ("the `ask` call → the colleague's agent reads the question in its prompt", &to_prompt),
        ("the colleague's `end_turn` → the `ask` result returned to the asker", &to_result),
        ("the whole `ask` call (the colleague answering at once)", &whole),
        ("baseline: a person's mention posted on `agent0`'s node → `agent1`'s agent reads its prompt", &base),
    ] {
        md.push_str(&format!("| {what} | {} |\n", lat(l)));
    }
    println!("{md}");
    if let Some(path) = &args.out_md {
        crate::transports::write_markdown_block(path, "asks", &md)?;
        eprintln!("botmesh-bench: wrote {}", path.display());
    }
    Ok(())
}
