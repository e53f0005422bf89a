//! The `botmesh` binary: parses arguments, sets up tracing, validates the
//! configuration, binds the listeners and calls `lifecycle::run`.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use botmesh::config::{NodeConfig, ProcessEnv, Settings};
use botmesh::wire::signing::{HmacSecret, SigningKey};
use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc. A node allocates per envelope on the async
/// workers and frees much of it on the transcript writer thread (and back), where
/// glibc's malloc took about an eighth of a receiver's CPU in the bench profile,
/// including arena lock waits; with mimalloc the receiver's CPU per envelope fell
/// 12–15 % (docs/benchmarks.md). Built with `no_thp`: with transparent huge pages its
/// arenas doubled a node's idle RSS (20 MiB instead of 11).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// botmesh: several LLM bots in one group chat, as colleagues.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the bridge node of one bot.
    Run {
        /// The bot to run (a `name` in peers.toml).
        #[arg(long)]
        bot: String,
        /// The mesh file.
        #[arg(long, default_value = "peers.toml")]
        config: PathBuf,
        /// Override the data folder (default `<mesh.data_dir>/<bot>`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Log format.
        #[arg(long, value_parser = ["text", "json"], default_value = "text")]
        log_format: String,
        /// Reload the configuration when the file changes, checking every SECS
        /// seconds (SIGHUP and `botmesh reload` work without it).
        #[arg(long, value_name = "SECS")]
        watch_config: Option<u64>,
    },
    /// Make keys: an Ed25519 key pair (default) or a mesh HMAC secret.
    Keygen {
        /// Make a mesh-wide HMAC secret (whsec_…) instead of a key pair.
        #[arg(long)]
        secret: bool,
        /// Write the private key (or secret) to this file (mode 0600) instead of stdout.
        #[arg(long)]
        private_out: Option<PathBuf>,
    },
    /// Dry-run the decision a bot would make about a message (no running node needed).
    Explain {
        /// The deciding bot.
        #[arg(long)]
        bot: String,
        /// Who wrote the message (a bot name, or any human name).
        #[arg(long, default_value = "human")]
        from: String,
        /// The message's depth (default 0 for humans, 1 for bots).
        #[arg(long)]
        depth: Option<u32>,
        /// The group.
        #[arg(long)]
        group: Option<String>,
        /// Actually call the configured judge LLM.
        #[arg(long)]
        call_llm: bool,
        /// The mesh file.
        #[arg(long, default_value = "peers.toml")]
        config: PathBuf,
        /// The message text.
        text: String,
    },
    /// Switch a running bot quiet (it takes no turns) or back on: everywhere (the
    /// operator's node-wide switch), or in one group (as a person's `/quiet` there).
    Quiet {
        /// The bot.
        #[arg(long)]
        bot: String,
        /// Switch quiet off again.
        #[arg(long)]
        off: bool,
        /// Only this group's switch; without it, the node-wide one.
        #[arg(long)]
        group: Option<String>,
        /// The mesh file.
        #[arg(long, default_value = "peers.toml")]
        config: PathBuf,
    },
    /// The group as MCP tools over stdio (`read_group`, `members`, `post`, `ask`,
    /// `wait_for_message`) for an agent outside the mesh (Claude Code, Codex, Cursor),
    /// through the bot's running node (docs/agents.md, "Working together").
    Mcp {
        /// The bot the agent acts as.
        #[arg(long)]
        bot: String,
        /// The mesh file (for the bot's API address and its `api_token_env` token).
        #[arg(long, default_value = "peers.toml")]
        config: PathBuf,
        /// The group the tools act in (default: `[mesh].group`).
        #[arg(long)]
        group: Option<String>,
        /// The node's API URL instead of the mesh file's, with the credential in
        /// BOTMESH_MCP_TOKEN: how a node starts this server for its hosted agent.
        #[arg(long)]
        api: Option<String>,
        /// Offer only these tools (comma-separated), e.g. the built-in model's
        /// `read_group,members,ask`.
        #[arg(long, value_delimiter = ',')]
        only: Option<Vec<String>>,
    },
    /// Make a running bot read its configuration file again (as SIGHUP does): prints
    /// the keys applied and those that wait for a restart; fails if the file is refused.
    Reload {
        /// The bot.
        #[arg(long)]
        bot: String,
        /// The mesh file (for the bot's API address and token).
        #[arg(long, default_value = "peers.toml")]
        config: PathBuf,
    },
    /// Replay a recorded transcript through the bot's decision code with changed
    /// settings: what it did then and what it would do now (docs/tuning.md).
    Replay {
        /// The bot to replay.
        #[arg(long)]
        bot: String,
        /// The mesh file.
        #[arg(long, default_value = "peers.toml")]
        config: PathBuf,
        /// A transcript file (the format of `<data_dir>/transcripts/<group>.jsonl`).
        #[arg(long, conflicts_with = "group")]
        transcript: Option<PathBuf>,
        /// A group, whose transcript is read from the bot's data folder (default
        /// `[mesh].group`).
        #[arg(long)]
        group: Option<String>,
        /// The bot's data folder (default `<mesh.data_dir>/<bot>`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// The verdict log to read (default `<data_dir>/verdicts/<group>.jsonl`).
        #[arg(long)]
        verdicts: Option<PathBuf>,
        /// Change a setting of the bot for the replay, as in peers.toml
        /// (`min_relevance=0.7`; `mesh.max_depth=3` for a mesh setting). Repeatable.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Replace the bot's judge prompt template with this file's text.
        #[arg(long)]
        judge_prompt_file: Option<PathBuf>,
        /// Where judge answers come from: recorded (the verdict log when the prompt is
        /// unchanged), live (the configured LLM) or offline (the offline judge).
        #[arg(long, value_parser = ["recorded", "live", "offline"], default_value = "recorded")]
        llm: String,
        /// With --llm recorded, what answers a judge call that has no recorded
        /// verdict: offline (guess) or live (ask the LLM anew).
        #[arg(long, value_parser = ["offline", "live"], default_value = "offline")]
        fallback: String,
        /// Print each message's judge prompt.
        #[arg(long)]
        show_prompt: bool,
        /// Output format.
        #[arg(long, value_parser = ["text", "json"], default_value = "text")]
        format: String,
    },
    /// Enter an agent's sandbox, then become the agent: how the node starts ACP
    /// agents and stdio MCP servers (docs/security.md). Not for people.
    #[command(hide = true)]
    Sandbox {
        /// A read-only (and executable) root. Repeatable.
        #[arg(long)]
        read: Vec<PathBuf>,
        /// A read-write root. Repeatable.
        #[arg(long)]
        write: Vec<PathBuf>,
        /// A path no root may reach (the node's data dir, config, keys). Repeatable.
        #[arg(long)]
        deny: Vec<PathBuf>,
        /// Become this user after entering the sandbox (the node runs as root).
        #[arg(long)]
        run_as: Option<String>,
        /// Only say whether this kernel enforces Landlock.
        #[arg(long)]
        check: bool,
        /// The agent's command line.
        #[arg(last = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Feishu helpers.
    Feishu {
        #[command(subcommand)]
        command: FeishuCommand,
    },
    /// Run the turn-taking simulator: the real decision code, scripted judges, virtual time,
    /// botmesh against the XiaoBa, nanobot and review-panel baselines.
    Simulate {
        /// Folder of scenario files (*.toml).
        #[arg(long, default_value = "scenarios")]
        scenarios: PathBuf,
        /// Which policy to run: all, botmesh, botmesh-drafting, botmesh-shared, xiaoba, nanobot or review-panel.
        #[arg(long, default_value = "all")]
        policy: String,
        /// Base seed; the same seed gives the same results.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Runs per scenario and policy.
        #[arg(long, default_value_t = 50)]
        runs: usize,
        /// Write the full report as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write the Markdown report (docs/turn-taking.md) to this file.
        #[arg(long)]
        write_doc: Option<PathBuf>,
        /// Instead of the report, print the event trace of one run of this scenario.
        #[arg(long)]
        trace: Option<String>,
        /// Which run of the scenario to trace (0-based).
        #[arg(long, default_value_t = 0)]
        trace_run: usize,
    },
}

/// `botmesh feishu …`.
#[derive(Subcommand)]
enum FeishuCommand {
    /// Print the bot's open_id and its colleagues' open_ids in this bot's app (from
    /// the chat's recent @mentions), as TOML for `[bots.feishu]`.
    Ids {
        /// The bot whose app asks.
        #[arg(long)]
        bot: String,
        /// The mesh file.
        #[arg(long, default_value = "peers.toml")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            bot,
            config,
            data_dir,
            log_format,
            watch_config,
        } => run(bot, config, data_dir, &log_format, watch_config),
        Command::Keygen {
            secret,
            private_out,
        } => keygen(secret, private_out),
        Command::Explain {
            bot,
            from,
            depth,
            group,
            call_llm,
            config,
            text,
        } => explain(
            bot,
            config,
            botmesh::turn::ExplainRequest {
                text,
                from: Some(from),
                depth,
                group,
                call_llm,
            },
        ),
        Command::Quiet {
            bot,
            off,
            group,
            config,
        } => post_local(
            bot,
            config,
            "/v1/quiet",
            Some(match group {
                Some(group) => serde_json::json!({"quiet": !off, "group": group}),
                None => serde_json::json!({"quiet": !off}),
            }),
        ),
        Command::Reload { bot, config } => post_local(bot, config, "/v1/reload", None),
        Command::Mcp {
            bot,
            config,
            group,
            api,
            only,
        } => mcp(bot, config, group, api, only),
        Command::Replay {
            bot,
            config,
            transcript,
            group,
            data_dir,
            verdicts,
            sets,
            judge_prompt_file,
            llm,
            fallback,
            show_prompt,
            format,
        } => replay(
            botmesh::app::replay::ReplayOptions {
                config,
                bot,
                transcript,
                group,
                data_dir,
                verdicts,
                sets,
                judge_prompt_file,
                llm: botmesh::app::replay::LlmMode::Recorded,
                fallback: botmesh::app::replay::LlmMode::Offline,
                show_prompt,
                env: std::env::vars().collect(),
            },
            (&llm, &fallback),
            &format,
        ),
        Command::Sandbox {
            read,
            write,
            deny,
            run_as,
            check,
            command,
        } => {
            let rules = botmesh::agent::sandbox::Rules {
                read,
                write,
                deny,
                run_as,
            };
            return sandbox(&rules, check, command);
        }
        Command::Feishu {
            command: FeishuCommand::Ids { bot, config },
        } => feishu_ids(bot, config),
        Command::Simulate {
            scenarios,
            policy,
            seed,
            runs,
            json,
            write_doc,
            trace,
            trace_run,
        } => simulate(
            scenarios,
            &policy,
            (seed, runs),
            json,
            write_doc,
            trace.map(|t| (t, trace_run)),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("botmesh: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("BOTMESH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only for a terminal: a log file or journal gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(botmesh::telemetry::secret_safe_levels());
    if format == "json" {
        registry.with(fmt.json()).init();
    } else {
        registry.with(fmt).init();
    }
}

fn run(
    bot: String,
    config: PathBuf,
    data_dir: Option<PathBuf>,
    log_format: &str,
    watch_config: Option<u64>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        watch_config != Some(0),
        "--watch-config must be at least 1 second"
    );
    // Before anything reads a secret: no process of this user (an agent, a tool it
    // runs) may read this one's environment or memory, or ptrace it.
    botmesh::agent::sandbox::make_undumpable()
        .map_err(|e| anyhow::anyhow!("prctl(PR_SET_DUMPABLE, 0) failed: {e}"))?;
    init_tracing(log_format);
    tracing::info!(
        dumpable = ?botmesh::agent::sandbox::dumpable(),
        "the node is not dumpable: other processes of its user cannot read its memory or environment"
    );
    // Configuration errors end the process before any port is bound.
    let settings = Settings::load(&config)?;
    botmesh::platform::registry::check(&settings)?;
    let cfg = NodeConfig::resolve(settings, &bot, data_dir, &ProcessEnv)?;
    let rt = runtime()?;
    tracing::info!(
        workers = rt.metrics().num_workers(),
        "runtime started (TOKIO_WORKER_THREADS sets how many workers; default one per core)"
    );
    rt.block_on(async move {
        let bridge = tokio::net::TcpListener::bind(cfg.bridge_addr)
            .await
            .with_context(|| format!("binding the bridge listener on {}", cfg.bridge_addr))?;
        let api = tokio::net::TcpListener::bind(cfg.api_addr)
            .await
            .with_context(|| format!("binding the local API on {}", cfg.api_addr))?;
        let watch = watch_config.map(std::time::Duration::from_secs);
        botmesh::app::lifecycle::run(cfg, bridge, api, shutdown_signal(), watch).await
    })
}

/// The multi-thread runtime a node runs on: a worker per core, or as many as
/// `TOKIO_WORKER_THREADS` says. The variable is checked here, because tokio itself
/// would panic on a bad value. Fewer workers spend less CPU per envelope and take less
/// traffic (docs/benchmarks.md, issue 40's fifth look).
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(value) = std::env::var_os("TOKIO_WORKER_THREADS") {
        let workers = value
            .to_str()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "TOKIO_WORKER_THREADS must be a whole number of at least 1, not {value:?}"
                )
            })?;
        builder.worker_threads(workers);
    }
    builder.build().context("starting the tokio runtime")
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}

/// `botmesh sandbox`: enters the box `rules` describe and `exec`s `command` in it (or,
/// with `check`, only proves Landlock is enforced, in this throwaway process). Exit
/// 125 when the box cannot be made, 127 when the command cannot be run; every
/// message goes to stderr prefixed `botmesh-sandbox:`, for the node's log.
fn sandbox(
    rules: &botmesh::agent::sandbox::Rules,
    check: bool,
    command: Vec<std::ffi::OsString>,
) -> ExitCode {
    use botmesh::agent::sandbox::{self as sb, SandboxError};
    let fail = |e: &SandboxError| {
        match e {
            SandboxError::Unavailable(why) => eprintln!("botmesh-sandbox: unavailable: {why}"),
            other => eprintln!("botmesh-sandbox: {other}"),
        }
        ExitCode::from(125)
    };
    if !check && command.is_empty() {
        eprintln!("botmesh-sandbox: no command after --");
        return ExitCode::from(125);
    }
    let entered = match sb::enter(rules) {
        Ok(entered) => entered,
        Err(e) => return fail(&e),
    };
    if check {
        println!(
            "{} ({})",
            sb::CHECK_OK,
            if entered.fully {
                "fully"
            } else {
                "partly: an older Landlock ABI"
            }
        );
        return ExitCode::SUCCESS;
    }
    if let Some(user) = &rules.run_as {
        if let Err(e) = sb::become_user(user) {
            return fail(&e);
        }
    }
    if !entered.fully {
        eprintln!("botmesh-sandbox: this kernel's Landlock is older: some rights are not enforced");
    }
    let (program, args) = command.split_first().expect("checked above");
    let error =
        std::os::unix::process::CommandExt::exec(std::process::Command::new(program).args(args));
    eprintln!("botmesh-sandbox: cannot run {program:?}: {error}");
    ExitCode::from(127)
}

fn keygen(secret: bool, private_out: Option<PathBuf>) -> anyhow::Result<()> {
    let (private, public) = if secret {
        (HmacSecret::generate().to_whsec(), None)
    } else {
        let k = SigningKey::generate();
        (k.to_whsk(), Some(k.public_key().to_whpk()))
    };
    match private_out {
        Some(path) => {
            write_private(&path, &private)?;
            eprintln!(
                "private {} written to {}",
                if secret { "secret" } else { "key" },
                path.display()
            );
            if let Some(p) = public {
                println!("{p}");
            }
        }
        None => {
            println!("{private}");
            if let Some(p) = public {
                println!("{p}");
            }
        }
    }
    Ok(())
}

fn write_private(path: &std::path::Path, value: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(f, "{value}")?;
    Ok(())
}

fn explain(bot: String, config: PathBuf, req: botmesh::turn::ExplainRequest) -> anyhow::Result<()> {
    let settings = Settings::load(&config)?;
    botmesh::platform::registry::check(&settings)?;
    let cfg = NodeConfig::without_secrets(settings, &bot, &ProcessEnv)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = rt.block_on(async {
        let brain = botmesh::turn::Brain::new(
            &cfg,
            std::sync::Arc::new(botmesh::telemetry::metrics::Metrics::new()),
            botmesh::platform::registry::member_ids,
        )?;
        let llm = botmesh::llm::LlmClient::new(botmesh::llm::LlmClient::build_http(
            std::time::Duration::from_secs(3),
        )?);
        botmesh::turn::explain(&brain, &llm, &cfg, req, &[], cfg.bot().quiet)
            .await
            .map_err(anyhow::Error::msg)
    })?;
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn replay(
    mut opts: botmesh::app::replay::ReplayOptions,
    (llm, fallback): (&str, &str),
    format: &str,
) -> anyhow::Result<()> {
    use botmesh::app::replay as r;
    opts.llm = r::LlmMode::parse(llm)?;
    opts.fallback = r::LlmMode::parse(fallback)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(r::replay(&opts))?;
    if format == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", r::render_text(&report));
    }
    Ok(())
}

/// POSTs `body` (none: an empty body) to `path` on bot `bot`'s local API, with the
/// API token when `[mesh].api_token_env` names one, and prints the answer: the CLI
/// of `botmesh quiet` and `botmesh reload`.
fn post_local(
    bot: String,
    config: PathBuf,
    path: &str,
    body: Option<serde_json::Value>,
) -> anyhow::Result<()> {
    let settings = Settings::load(&config)?;
    botmesh::platform::registry::check(&settings)?;
    let cfg = NodeConfig::without_secrets(settings, &bot, &ProcessEnv)?;
    let token = cfg
        .settings
        .mesh
        .api_token_env
        .as_ref()
        .and_then(|v| std::env::var(v).ok());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_secs(5))
            .build()?;
        // Always a JSON body (`{}` when the endpoint reads none): the API refuses
        // POSTs that declare anything else.
        let req = client
            .post(format!("http://{}{path}", cfg.api_addr))
            .json(&body.unwrap_or_else(|| serde_json::json!({})));
        let req = match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req
            .send()
            .await
            .with_context(|| format!("reaching {} at {}", cfg.bot().name, cfg.api_addr))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        anyhow::ensure!(status.is_success(), "{status}: {body}");
        println!("{body}");
        Ok(())
    })
}

/// `botmesh mcp`: the `mesh` tools over stdio (stdout is the protocol's: the log goes
/// to stderr).
fn mcp(
    bot: String,
    config: PathBuf,
    group: Option<String>,
    api: Option<String>,
    only: Option<Vec<String>>,
) -> anyhow::Result<()> {
    init_tracing("text");
    let target = match api {
        Some(api) => botmesh::agent::mesh::MeshTarget {
            api,
            token: std::env::var(botmesh::agent::mesh::TOKEN_ENV).ok(),
            group,
        },
        None => {
            let settings = Settings::load(&config)?;
            botmesh::platform::registry::check(&settings)?;
            let cfg = NodeConfig::without_secrets(settings, &bot, &ProcessEnv)?;
            botmesh::agent::mesh::MeshTarget::of(&cfg, group)
        }
    };
    let mut server = botmesh::agent::mesh::MeshServer::new(&bot, target)?;
    if let Some(only) = only {
        server = server.only(only)?;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(server.serve_stdio())
}

fn feishu_ids(bot: String, config: PathBuf) -> anyhow::Result<()> {
    let settings = Settings::load(&config)?;
    botmesh::platform::registry::check(&settings)?;
    let cfg = NodeConfig::resolve(settings, &bot, None, &ProcessEnv)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let text = rt.block_on(botmesh::platform::feishu::names::colleague_ids(&cfg))?;
    print!("{text}");
    Ok(())
}

fn simulate(
    dir: PathBuf,
    policy: &str,
    (seed, runs): (u64, usize),
    json: Option<PathBuf>,
    write_doc: Option<PathBuf>,
    trace: Option<(String, usize)>,
) -> anyhow::Result<()> {
    use botmesh::simulate as sim;
    let policies = sim::PolicyKind::parse_list(policy)?;
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    let worlds = sim::load_dir(&dir)?;
    if let Some((name, run)) = trace {
        let w = worlds
            .iter()
            .find(|w| w.scenario.name == name)
            .with_context(|| format!("no scenario {name:?} in {}", dir.display()))?;
        let run_seed = sim::run_seed(seed, &name, run);
        for p in &policies {
            let (t, lines) = sim::trace_once(w, *p, run_seed);
            println!(
                "== {name}, run {run} (seed {run_seed}), policy {}",
                p.as_str()
            );
            for l in lines {
                println!("{l}");
            }
            println!(
                "-- {} bot messages, {} duplicate interjections, right bot first {}/{}, longest chain {}, {} judge + {} reply calls\n",
                t.bot_posts,
                t.dup_interjections,
                t.right_first,
                t.expected,
                t.longest_chain,
                t.judge_human + t.judge_bot + t.rejudge,
                t.reply_calls
            );
        }
        return Ok(());
    }
    let report = sim::simulate(&worlds, &policies, seed, runs);
    println!(
        "{} scenarios x {} runs, seed {}\n\n{}",
        worlds.len(),
        runs,
        seed,
        sim::headline_table(&report.overall)
    );
    for t in &report.targets {
        println!(
            "botmesh target {}: {} ({})",
            if t.met { "met" } else { "MISSED" },
            t.target,
            t.detail
        );
    }
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = write_doc {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, sim::render_doc(&report))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
