//! The `botmesh` binary: parses arguments, sets up tracing, validates the
//! configuration, binds the listeners and calls `node::run`.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use botmesh::config::{NodeConfig, ProcessEnv, Settings};
use botmesh::signing::{HmacSecret, SigningKey};
use clap::{Parser, Subcommand};

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
    /// Switch a running bot quiet (it takes no turns) or back on.
    Quiet {
        /// The bot.
        #[arg(long)]
        bot: String,
        /// Switch quiet off again.
        #[arg(long)]
        off: bool,
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
        } => run(bot, config, data_dir, &log_format),
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
        Command::Quiet { bot, off, config } => quiet(bot, config, !off),
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
    let filter = tracing_subscriber::EnvFilter::try_from_env("BOTMESH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn run(
    bot: String,
    config: PathBuf,
    data_dir: Option<PathBuf>,
    log_format: &str,
) -> anyhow::Result<()> {
    init_tracing(log_format);
    // Configuration errors end the process before any port is bound.
    let settings = Settings::load(&config)?;
    let cfg = NodeConfig::resolve(settings, &bot, data_dir, &ProcessEnv)?;
    let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    rt.block_on(async move {
        let bridge = tokio::net::TcpListener::bind(cfg.bridge_addr)
            .await
            .with_context(|| format!("binding the bridge listener on {}", cfg.bridge_addr))?;
        let api = tokio::net::TcpListener::bind(cfg.api_addr)
            .await
            .with_context(|| format!("binding the local API on {}", cfg.api_addr))?;
        botmesh::node::run(cfg, bridge, api, shutdown_signal()).await
    })
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
    let cfg = NodeConfig::without_secrets(settings, &bot, &ProcessEnv)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = rt.block_on(async {
        let brain = botmesh::turn::Brain::new(
            &cfg,
            std::sync::Arc::new(botmesh::metrics::Metrics::new()),
            botmesh::events::EventBus::new(1),
        )?;
        botmesh::turn::explain(&brain, &cfg, req, &[], false)
            .await
            .map_err(anyhow::Error::msg)
    })?;
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn quiet(bot: String, config: PathBuf, on: bool) -> anyhow::Result<()> {
    let settings = Settings::load(&config)?;
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
        let mut req = client
            .post(format!("http://{}/v1/quiet", cfg.api_addr))
            .json(&serde_json::json!({"quiet": on}));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
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
