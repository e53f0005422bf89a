//! The agent's process: started from `acp` in `cwd` with a clean environment, in its
//! own process group, boxed by the `botmesh sandbox` launcher unless `sandbox = "off"`
//! (see `agent::sandbox`: `cwd`, a private temp dir and `write` read-write, the
//! system's and the program's install read-only, nothing of the node's), and stopped
//! by that group.
//!
//! Stopping: the caller closes its stdin first; the process gets [`STDIN_GRACE`] to
//! exit, then the whole group gets SIGTERM, then after [`TERM_GRACE`] SIGKILL (codex-acp
//! and claude-code-acp ignore a closed stdin; a tool's child may ignore SIGTERM). Once
//! the process is gone, whatever is left of its group (commands the agent ran) is ended
//! the same way, also after a crash. `kill_on_drop` is the last resort when the
//! runtime itself goes away.

use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::AcpError;
use crate::agent::boxing::{boxed_command, Boxing, Launch, TempDir};
use crate::config::acp::AcpSettings;

/// How long an agent has to exit after its stdin is closed.
pub(crate) const STDIN_GRACE: Duration = Duration::from_secs(1);
/// How long its group has between SIGTERM and SIGKILL.
pub(crate) const TERM_GRACE: Duration = Duration::from_secs(3);
/// The only variables taken from the node's environment.
const INHERITED: [&str; 3] = ["PATH", "HOME", "LANG"];

/// A running agent process, watched by a task that owns it.
pub(crate) struct AgentProcess {
    /// The process id, which is also its group id.
    pub(crate) pid: u32,
    /// Cancelled to stop it (after its stdin was closed).
    stop: CancellationToken,
    /// The exit status, described, once it exited.
    pub(crate) exit: watch::Receiver<Option<String>>,
    /// True once the process and what was left of its group are gone.
    gone: watch::Receiver<bool>,
}

/// The pipes of a new process.
pub(crate) struct Pipes {
    /// Its stdin, for the connection's writer.
    pub(crate) stdin: ChildStdin,
    /// Its stdout, for the connection's reader.
    pub(crate) stdout: ChildStdout,
}

/// The command line as one string, for errors and logs.
pub(crate) fn command_line(settings: &AcpSettings) -> String {
    settings.acp.join(" ")
}

/// The environment an agent gets: PATH, HOME and LANG from `node_env` (when set), then
/// the configured `env` (which may override them). Nothing else of the node's reaches
/// it: its secrets stay in the node.
pub(crate) fn clean_env(
    settings: &AcpSettings,
    node_env: impl Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = INHERITED
        .iter()
        .filter(|k| !settings.env.contains_key(**k))
        .filter_map(|k| node_env(k).map(|v| (k.to_string(), v)))
        .collect();
    env.extend(settings.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Starts the agent. A program that cannot be started, or a `cwd` that is not a
/// directory, is [`AcpError::Spawn`] naming the command.
pub(crate) fn spawn(
    settings: &AcpSettings,
    bot: &str,
    boxing: &Boxing,
) -> Result<(AgentProcess, Pipes), AcpError> {
    let command = command_line(settings);
    let spawn_error = |reason: String| AcpError::Spawn {
        command: command.clone(),
        reason,
    };
    let Some((program, args)) = settings.acp.split_first() else {
        return Err(spawn_error("the command is empty".into()));
    };
    if !settings.cwd.is_dir() {
        return Err(spawn_error(format!(
            "its working directory {:?} is not a directory",
            settings.cwd
        )));
    }
    let env = clean_env(settings, |k| std::env::var(k).ok());
    let (mut cmd, temp) = boxed_command(
        boxing,
        Launch {
            who: bot,
            program,
            args,
            cwd: &settings.cwd,
            cwd_write: true,
            env,
            sandbox: &settings.sandbox,
            run_as: settings.run_as.as_deref(),
        },
    )
    .map_err(&spawn_error)?;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| spawn_error(e.to_string()))?;
    let pid = child
        .id()
        .ok_or_else(|| spawn_error("it exited at once".into()))?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(spawn_error("its pipes were not opened".into()));
    };
    tracing::info!(bot, pid, command = %command, cwd = ?settings.cwd, boxed = temp.is_some(), "started the ACP agent");
    let label: Arc<str> = format!("{bot}/{}", program).into();
    tokio::spawn(crate::agent::stderr::log_lines(
        stderr,
        label.clone(),
        crate::agent::stderr::Level::Debug,
    ));
    let stop = CancellationToken::new();
    let (exit_tx, exit) = watch::channel(None);
    let (gone_tx, gone) = watch::channel(false);
    tokio::spawn(watch_child(
        child,
        pid,
        stop.clone(),
        exit_tx,
        gone_tx,
        (label, temp),
    ));
    Ok((
        AgentProcess {
            pid,
            stop,
            exit,
            gone,
        },
        Pipes { stdin, stdout },
    ))
}

impl AgentProcess {
    /// Stops the process (its stdin should be closed first) and what is left of its
    /// group; returns once they are gone.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        let mut gone = self.gone.clone();
        let _ = gone.wait_for(|g| *g).await;
    }
}

/// Describes an exit status for errors and logs.
fn describe(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("unknown ({e})"),
    }
}

/// Owns the child: reports its exit, stops it when asked, and ends what is left of its
/// group either way.
async fn watch_child(
    mut child: Child,
    pid: u32,
    stop: CancellationToken,
    exit_tx: watch::Sender<Option<String>>,
    gone_tx: watch::Sender<bool>,
    (label, temp): (Arc<str>, Option<TempDir>),
) {
    let group = Pid::from_raw(pid as i32);
    let status = tokio::select! {
        status = child.wait() => status,
        _ = stop.cancelled() => terminate(&mut child, group, &label).await,
    };
    let status = describe(status);
    tracing::info!(agent = %label, status = %status, "the ACP agent's process ended");
    exit_tx.send_replace(Some(status));
    end_group(group, &label).await;
    drop(temp);
    gone_tx.send_replace(true);
}

/// Stopping, in order: (stdin already closed) wait, SIGTERM to the group, wait,
/// SIGKILL to the group.
async fn terminate(child: &mut Child, group: Pid, label: &str) -> std::io::Result<ExitStatus> {
    if let Ok(status) = tokio::time::timeout(STDIN_GRACE, child.wait()).await {
        return status;
    }
    tracing::info!(agent = %label, "the ACP agent did not exit on a closed stdin: SIGTERM to its group");
    let _ = killpg(group, Signal::SIGTERM);
    if let Ok(status) = tokio::time::timeout(TERM_GRACE, child.wait()).await {
        return status;
    }
    tracing::warn!(agent = %label, "the ACP agent ignored SIGTERM: SIGKILL to its group");
    let _ = killpg(group, Signal::SIGKILL);
    child.wait().await
}

/// Ends the rest of the group once its leader is gone: SIGTERM, then SIGKILL to
/// whatever still lives after [`TERM_GRACE`].
async fn end_group(group: Pid, label: &str) {
    let alive = || killpg(group, None).is_ok();
    if !alive() {
        return;
    }
    tracing::info!(agent = %label, "processes of the ACP agent's group outlived it: SIGTERM");
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + TERM_GRACE;
    while alive() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if alive() {
        tracing::warn!(agent = %label, "processes of the ACP agent's group ignored SIGTERM: SIGKILL");
        let _ = killpg(group, Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_path_home_lang_and_the_configured_env() {
        let settings = AcpSettings {
            acp: vec!["a".into()],
            cwd: "/".into(),
            env: [
                ("LANG".to_string(), "C.UTF-8".to_string()),
                ("X".into(), "1".into()),
            ]
            .into(),
            env_from: Default::default(),
            allow: vec![],
            ask: vec![],
            turn_timeout_secs: 1,
            ask_timeout_secs: 1,
            init_timeout_secs: 1,
            max_reply_chars: 1,
            max_title_chars: 1,
            sandbox: Default::default(),
            run_as: None,
        };
        let node = |k: &str| match k {
            "PATH" => Some("/bin".to_string()),
            "LANG" => Some("fr_FR".to_string()),
            "BOTMESH_SECRET" => Some("whsec_x".to_string()),
            _ => None,
        };
        let mut env = clean_env(&settings, node);
        env.sort();
        assert_eq!(
            env,
            [
                ("LANG".to_string(), "C.UTF-8".to_string()),
                ("PATH".into(), "/bin".into()),
                ("X".into(), "1".into())
            ]
        );
    }
}
