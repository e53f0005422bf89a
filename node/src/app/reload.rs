//! Reloading peers.toml in a running node: `SIGHUP`, `POST /v1/reload`,
//! `botmesh reload --bot NAME`, and the opt-in file watch all come here.
//!
//! The file is read and validated exactly as at start (`Settings::load` and
//! `NodeConfig::resolve`), so a file with any mistake is refused whole with the same
//! named error, and the running configuration stays. A valid file's tunable keys
//! ([`crate::config::reload::merge`]) go into the brain's tuning at once, for the
//! next decision: turns already under way finish with the snapshot they took, so
//! nothing in flight is lost. Keys that need a restart keep their running value and
//! are reported as pending. Every reload is logged, counted
//! (`botmesh_config_reloads_total{result}`) and shown in `/healthz` (`config_reload`).

use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use crate::app::node::Node;
use crate::config::reload::{diff, merge};
use crate::config::{NodeConfig, SecretSource, Settings};

/// The outcome of one reload, as the API answers it and `/healthz` shows the last.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadReport {
    /// Unix milliseconds of the reload.
    pub at_ms: u64,
    /// What asked for it: `sighup`, `api`, `watch`.
    pub via: String,
    /// `applied` (the file was valid) or `refused` (it was not; nothing changed).
    pub result: &'static str,
    /// The configuration error of a refused file, named as at start.
    pub error: Option<String>,
    /// Changed keys now in effect.
    pub applied: Vec<String>,
    /// Changed keys that wait for a restart (still running with their old value),
    /// from this reload or an earlier one.
    pub restart_required: Vec<String>,
}

/// A node's reload state: what runs and where secrets come from.
pub(crate) struct Reloader {
    /// The configuration in force: the start one with every reload's tunable keys.
    running: Mutex<Arc<NodeConfig>>,
    /// Where a reload reads secrets (the process environment, or a test's map).
    secrets: Mutex<Arc<dyn SecretSource + Send + Sync>>,
    /// The last reload's outcome.
    last: Mutex<Option<ReloadReport>>,
}

impl Reloader {
    /// A reloader for a node started with `cfg`, reading secrets from the process
    /// environment as `botmesh run` does.
    pub(crate) fn new(cfg: Arc<NodeConfig>) -> Reloader {
        Reloader {
            running: Mutex::new(cfg),
            secrets: Mutex::new(Arc::new(crate::config::ProcessEnv)),
            last: Mutex::new(None),
        }
    }

    /// The configuration in force (the start one with every reload's tunable keys).
    pub(crate) fn running(&self) -> Arc<NodeConfig> {
        self.running.lock().clone()
    }

    /// The last reload's outcome, if there was one.
    pub(crate) fn last(&self) -> Option<ReloadReport> {
        self.last.lock().clone()
    }
}

impl Node {
    /// Makes reloads read secrets from `secrets` instead of the process environment
    /// (an embedding, or a test whose node was resolved from a map).
    pub fn set_reload_secrets(&self, secrets: Arc<dyn SecretSource + Send + Sync>) {
        *self.reloader.secrets.lock() = secrets;
    }

    /// Reads the configuration file again and applies what a bot tunes (see the
    /// module). `via` names what asked. `Err`: the file was refused (the report says
    /// why); the running configuration is unchanged.
    pub fn reload(&self, via: &str) -> Result<ReloadReport, ReloadReport> {
        let mut running = self.reloader.running.lock();
        let secrets = self.reloader.secrets.lock().clone();
        let name = running.bot().name.clone();
        let mut report = ReloadReport {
            at_ms: crate::wire::envelope::now_millis(),
            via: via.to_string(),
            result: "applied",
            error: None,
            applied: Vec::new(),
            restart_required: Vec::new(),
        };
        let file = Settings::load(&running.settings.path)
            .and_then(|s| crate::platform::registry::check(&s).map(|()| s))
            .and_then(|s| NodeConfig::resolve(s, &name, Some(running.data_dir.clone()), &*secrets));
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                report.result = "refused";
                report.error = Some(e.to_string());
                // What was pending stays pending.
                report.restart_required = self
                    .reloader
                    .last()
                    .map(|l| l.restart_required)
                    .unwrap_or_default();
                self.count_reload("refused");
                tracing::error!(bot = %name, via, error = %e, "configuration reload refused: the file has a mistake; the running configuration stays");
                *self.reloader.last.lock() = Some(report.clone());
                return Err(report);
            }
        };
        let merged = merge(&running.settings, &file.settings);
        let d = diff(&running.settings, &file.settings, &merged);
        let mut next = (**running).clone();
        next.set_settings(merged);
        next.llm_keys = file.llm_keys;
        let next = Arc::new(next);
        self.brain.retune(&next);
        if next.bot().quiet != running.bot().quiet {
            self.quiet.set_node(next.bot().quiet);
        }
        *running = next;
        report.applied = d.applied;
        report.restart_required = d.restart_required;
        self.count_reload("applied");
        if report.restart_required.is_empty() {
            tracing::info!(bot = %name, via, applied = ?report.applied, "configuration reloaded");
        } else {
            tracing::warn!(bot = %name, via, applied = ?report.applied, restart_required = ?report.restart_required, "configuration reloaded; some changed keys take effect only after a restart");
        }
        *self.reloader.last.lock() = Some(report.clone());
        Ok(report)
    }

    fn count_reload(&self, result: &str) {
        self.metrics
            .config_reloads
            .get_or_create(&crate::telemetry::metrics::ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// The file's modification time and length, to notice a change ([`watch`]).
    fn file_stamp(&self) -> Option<(std::time::SystemTime, u64)> {
        let path = self.reloader.running().settings.path.clone();
        let meta = std::fs::metadata(path).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    }
}

/// Reloads on every `SIGHUP` until the node stops accepting work: the signal an
/// operator sends to reload a daemon no longer ends the node.
#[cfg(unix)]
pub(crate) async fn on_sighup(node: Arc<Node>, mut hup: tokio::signal::unix::Signal) {
    loop {
        tokio::select! {
            _ = node.accepting.cancelled() => return,
            got = hup.recv() => {
                if got.is_none() {
                    return;
                }
                tracing::info!("SIGHUP received: reloading the configuration");
                let _ = node.reload("sighup");
            }
        }
    }
}

/// The opt-in file watch (`--watch-config SECS`): checks the file's modification time
/// and length every `every`, and reloads when they change, until the node stops
/// accepting work. Public for embeddings (and tests) that start a node with
/// [`crate::app::lifecycle::start`] rather than `run`.
pub async fn watch(node: Arc<Node>, every: std::time::Duration) {
    let mut seen = node.file_stamp();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = node.accepting.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = node.file_stamp();
        if now.is_some() && now != seen {
            seen = now;
            tracing::info!("configuration file changed: reloading");
            let _ = node.reload("watch");
        }
    }
}
