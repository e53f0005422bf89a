//! How the node starts a process in its box: the one way an ACP agent
//! (`agent::acp::process`) and a built-in model's stdio MCP server (`agent::mcp`) are
//! launched, so both get the same rules (`agent::sandbox`): read-write in their work
//! folder, a private temp dir (`TMPDIR`) and `sandbox.write`; read-only in the system's
//! program folders, the install their program lives in and `sandbox.read`; nothing of
//! the node's data dir, config, key or secret files.
//!
//! [`Boxing::prepare`] proves the launcher once, at start (a kernel without Landlock is
//! a start-up error); [`boxed_command`] builds each start's command line.

use std::path::{Path, PathBuf};

use crate::agent::sandbox::{self, Rules, SandboxError};
use crate::config::acp::SandboxSetting;

/// How the node boxes the processes it starts: the launcher (`None`: no process is
/// boxed, every `sandbox = "off"`) and the paths no box may reach.
#[derive(Debug, Clone, Default)]
pub(crate) struct Boxing {
    /// The botmesh binary that enters the box, checked by `sandbox::check`.
    pub(crate) launcher: Option<PathBuf>,
    /// The node's data dir, config, key and secret files.
    pub(crate) deny: Vec<PathBuf>,
}

impl Boxing {
    /// The launcher (`launcher`, else `sandbox::launcher_path`), proven to be a botmesh
    /// binary on a kernel that enforces Landlock, with the paths to `deny`; and its
    /// answer line, for the log.
    pub(crate) async fn prepare(
        launcher: Option<PathBuf>,
        deny: Vec<PathBuf>,
    ) -> Result<(Boxing, String), SandboxError> {
        let launcher = match launcher {
            Some(l) => l,
            None => sandbox::launcher_path()?,
        };
        let answer = sandbox::check(&launcher).await?;
        Ok((
            Boxing {
                launcher: Some(launcher),
                deny,
            },
            answer,
        ))
    }
}

/// One process to start, boxed or not.
pub(crate) struct Launch<'a> {
    /// Who it is, for its temp dir's name (`<bot>` or `<bot>-mcp-<server>`).
    pub(crate) who: &'a str,
    /// Its program (a path, or a name on its `PATH`).
    pub(crate) program: &'a str,
    /// Its arguments.
    pub(crate) args: &'a [String],
    /// Its working directory.
    pub(crate) cwd: &'a Path,
    /// Whether its box lets it write `cwd` (an agent's own `cwd`), or only read it (an
    /// MCP server started in the node's working directory).
    pub(crate) cwd_write: bool,
    /// Its whole environment (the caller's clean one).
    pub(crate) env: Vec<(String, String)>,
    /// Its `sandbox` setting.
    pub(crate) sandbox: &'a SandboxSetting,
    /// The user the launcher becomes (the node runs as root).
    pub(crate) run_as: Option<&'a str>,
}

/// The command that starts `launch` (through the launcher when `boxing` has one and
/// its setting is not `"off"`), with its environment and working directory set, and
/// its private temp dir, to keep until the process is gone. An error says why it
/// cannot be started (a program that is not there, a temp dir that cannot be made).
pub(crate) fn boxed_command(
    boxing: &Boxing,
    launch: Launch<'_>,
) -> Result<(tokio::process::Command, Option<TempDir>), String> {
    let (mut cmd, temp) = match (&boxing.launcher, launch.sandbox) {
        (Some(launcher), SandboxSetting::Boxed { read, write }) => {
            let path_var = launch
                .env
                .iter()
                .find(|(k, _)| k == "PATH")
                .map(|(_, v)| v.as_str());
            if !found(launch.program, path_var) {
                return Err(format!(
                    "{:?} is not a file and not on the PATH it gets",
                    launch.program
                ));
            }
            let temp = TempDir::make(launch.who, launch.run_as)?;
            let mut rules = Rules {
                read: read.clone(),
                write: vec![temp.0.clone()],
                deny: boxing.deny.clone(),
                run_as: launch.run_as.map(str::to_string),
            };
            if launch.cwd_write {
                rules.write.push(launch.cwd.to_path_buf());
            } else {
                rules.read.push(launch.cwd.to_path_buf());
            }
            rules
                .read
                .extend(sandbox::program_home(Path::new(launch.program), path_var));
            rules.write.extend(write.iter().cloned());
            let mut cmd = tokio::process::Command::new(launcher);
            cmd.args(rules.to_args())
                .arg(launch.program)
                .args(launch.args);
            (cmd, Some(temp))
        }
        _ => {
            let mut cmd = tokio::process::Command::new(launch.program);
            cmd.args(launch.args);
            (cmd, None)
        }
    };
    let own_tmpdir = launch.env.iter().any(|(k, _)| k == "TMPDIR");
    cmd.current_dir(launch.cwd).env_clear().envs(launch.env);
    if let Some(temp) = temp.as_ref().filter(|_| !own_tmpdir) {
        cmd.env("TMPDIR", &temp.0);
    }
    Ok((cmd, temp))
}

/// Whether `program` can be started: a path to a file, or a name on `path_var`.
fn found(program: &str, path_var: Option<&str>) -> bool {
    sandbox::find_program(Path::new(program), path_var).is_some_and(|p| p.is_file())
}

/// A boxed process's private temp dir (its `TMPDIR`, read-write in its box), removed
/// when dropped (once its process is gone).
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// Makes `<temp>/botmesh-agent-<who>-<ulid>`, mode 0700, owned by `run_as` when set.
    fn make(who: &str, run_as: Option<&str>) -> Result<TempDir, String> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("botmesh-agent-{who}-{}", ulid::Ulid::new()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot make its temp dir {dir:?}: {e}"))?;
        let made = TempDir(dir);
        if let Some(user) = run_as {
            let (uid, gid) = sandbox::user_ids(user).map_err(|e| e.to_string())?;
            std::os::unix::fs::chown(&made.0, Some(uid), Some(gid))
                .map_err(|e| format!("cannot hand its temp dir to {user}: {e}"))?;
        }
        Ok(made)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            tracing::debug!(dir = ?self.0, error = %e, "a boxed process's temp dir could not be removed");
        }
    }
}
