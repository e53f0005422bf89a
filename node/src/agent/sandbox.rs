//! The box a hosted agent (an ACP agent, a stdio MCP server) runs in: a Landlock
//! filesystem sandbox, entered by the `botmesh sandbox` launcher before it replaces
//! itself with the agent (Landlock rules survive `exec`, and bind its children).
//!
//! The node never restricts itself. It starts `<launcher> sandbox --read … --write …
//! --deny … [--run-as USER] -- <agent command>`; the launcher ([`enter`]) builds the
//! ruleset, restricts itself (which also sets `no_new_privs`), drops to `run_as` when
//! given, and `exec`s the agent. Inside the box:
//!
//! - read-write: the agent's `cwd`, its private temp dir (`TMPDIR`) and `write`;
//! - read-only (and executable): the system's program and library folders
//!   ([`SYSTEM_READ`]), the install the agent's program lives in
//!   ([`program_home`]) and `read`;
//! - nothing else: not the node's data dir, config, key or secret files (`--deny`:
//!   a read or write root that contains one is split into its other entries,
//!   [`roots`]), not other bots' folders, no signals to processes outside the box
//!   and no abstract UNIX sockets of theirs (Landlock scopes). The network stays open
//!   (agents need their model).
//!
//! The launcher is the botmesh binary itself ([`launcher_path`]: the running
//! executable, or [`LAUNCHER_ENV`] for packagers and tests whose executable is not
//! botmesh); [`check`] proves it is one and that the kernel enforces Landlock before
//! the first agent starts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The environment variable naming the botmesh binary that boxes agents, when the
/// running executable is not it (a test binary, a wrapper script).
pub const LAUNCHER_ENV: &str = "BOTMESH_SANDBOX_LAUNCHER";

/// The first line `botmesh sandbox --check` prints when Landlock is enforced: how
/// [`check`] knows it spoke to a botmesh launcher.
pub const CHECK_OK: &str = "botmesh-sandbox: landlock enforced";

/// Read-only (and executable) for every boxed process: where programs, libraries,
/// certificates and the system's settings live, and the kernel's views. (The node's
/// own `/proc/<pid>/environ` and `mem` are closed by the node being non-dumpable, to
/// any process of its user; not to root, so a node run as root sets `run_as`.)
pub const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
    "/dev",
    "/snap",
    "/nix",
    // The resolver's files (/etc/resolv.conf links here); not the rest of /run, where
    // service managers keep credentials (/run/secrets, /run/credentials).
    "/run/systemd/resolve",
];

/// Devices a program writes to as a matter of course (`/dev/null`, a terminal).
const DEVICE_WRITE: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
];

/// The Landlock ABI whose rights the box asks for; a newer kernel enforces them, an
/// older one what it knows (best effort), a kernel without Landlock nothing (an error).
const ABI_WANTED: ABI = ABI::V6;

/// How long `botmesh sandbox --check` may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a box could not be made or entered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    /// The launcher is not a botmesh binary (or could not be run).
    #[error("{path:?} is not a botmesh binary that can box agents ({why}); set {LAUNCHER_ENV} to the botmesh binary")]
    NotLauncher {
        /// The launcher tried.
        path: PathBuf,
        /// What it did instead.
        why: String,
    },
    /// The kernel does not enforce Landlock (too old, or not enabled at boot).
    #[error("this kernel does not enforce Landlock ({0}): agents and MCP servers cannot be boxed; set `sandbox = \"off\"` in the bot's agent (or the MCP server) to run it unboxed (not recommended)")]
    Unavailable(String),
    /// A rule could not be added (the path cannot be opened).
    #[error("cannot add the sandbox rule for {path:?}: {why}")]
    Rule {
        /// The path.
        path: PathBuf,
        /// The system's words.
        why: String,
    },
    /// `run_as` names no user, or the launcher could not become it.
    #[error("cannot run the agent as user {user:?}: {why}")]
    RunAs {
        /// The configured user.
        user: String,
        /// Why.
        why: String,
    },
}

/// What one boxed process may touch, as the launcher's arguments carry it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// Read-only (and executable) roots.
    pub read: Vec<PathBuf>,
    /// Read-write roots.
    pub write: Vec<PathBuf>,
    /// Paths no root may reach: the node's data dir, config, key and secret files.
    pub deny: Vec<PathBuf>,
    /// The user to become after entering the box (the node runs as root).
    pub run_as: Option<String>,
}

impl Rules {
    /// The launcher's arguments for these rules, up to and including `--`.
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec!["sandbox".into()];
        for (flag, paths) in [
            ("--read", &self.read),
            ("--write", &self.write),
            ("--deny", &self.deny),
        ] {
            for p in paths {
                args.push(flag.into());
                args.push(p.into());
            }
        }
        if let Some(user) = &self.run_as {
            args.push("--run-as".into());
            args.push(user.into());
        }
        args.push("--".into());
        args
    }
}

/// The botmesh binary that boxes agents: [`LAUNCHER_ENV`] when set, else the running
/// executable.
pub fn launcher_path() -> Result<PathBuf, SandboxError> {
    match std::env::var_os(LAUNCHER_ENV).filter(|v| !v.is_empty()) {
        Some(p) => Ok(PathBuf::from(p)),
        None => std::env::current_exe().map_err(|e| SandboxError::NotLauncher {
            path: PathBuf::from("(the running executable)"),
            why: e.to_string(),
        }),
    }
}

/// Proves `launcher` is a botmesh binary and that this kernel enforces Landlock, by
/// running `<launcher> sandbox --check`: its answer line (Landlock's ABI) on success.
pub async fn check(launcher: &Path) -> Result<String, SandboxError> {
    let not_launcher = |why: String| SandboxError::NotLauncher {
        path: launcher.to_path_buf(),
        why,
    };
    let run = tokio::process::Command::new(launcher)
        .args(["sandbox", "--check"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(CHECK_TIMEOUT, run)
        .await
        .map_err(|_| not_launcher(format!("`sandbox --check` took over {CHECK_TIMEOUT:?}")))?
        .map_err(|e| not_launcher(e.to_string()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let first = stdout.lines().next().unwrap_or("").to_string();
    if out.status.success() && first.starts_with(CHECK_OK) {
        return Ok(first);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(reason) = stderr
        .lines()
        .find_map(|l| l.strip_prefix("botmesh-sandbox: unavailable: "))
    {
        return Err(SandboxError::Unavailable(reason.to_string()));
    }
    let said: String = stderr
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect();
    Err(not_launcher(format!(
        "`sandbox --check` exited {} saying {said:?}",
        out.status
    )))
}

/// The install an agent's program lives in, read-only in its box: the folder above
/// the one holding the program (a venv's `bin/python` → the venv, `node_modules/.bin/x`
/// → `node_modules`), for the path as found on `PATH` and for the file it links to.
/// Never `/` or a top-level folder (`/usr/bin/x` gives nothing: [`SYSTEM_READ`] has it).
/// A script's interpreter (its `#!` line, `#!/usr/bin/env node` found on `path_var`)
/// is a program of its own: its install is added too (a venv's `bin/mcp-server-time`
/// runs the Python the venv links to).
pub fn program_home(program: &Path, path_var: Option<&str>) -> Vec<PathBuf> {
    let mut homes = install_of(program, path_var);
    if let Some(interpreter) = interpreter_of(program, path_var) {
        for home in install_of(&interpreter, path_var) {
            if !homes.contains(&home) {
                homes.push(home);
            }
        }
    }
    homes
}

/// The interpreter a script names on its `#!` line (`env`'s argument found on
/// `path_var`), when `program` is one.
fn interpreter_of(program: &Path, path_var: Option<&str>) -> Option<PathBuf> {
    use std::io::Read;
    let found = find_program(program, path_var)?;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(found).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line);
    let mut words = line.lines().next()?.split_whitespace();
    let first = PathBuf::from(words.next()?);
    if first.file_name().is_some_and(|f| f == "env") {
        let name = words.find(|w| !w.starts_with('-'))?;
        return find_program(Path::new(name), path_var);
    }
    Some(first)
}

/// `program` as a path: itself when it names a folder, else the first match on
/// `path_var`.
pub fn find_program(program: &Path, path_var: Option<&str>) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return Some(program.to_path_buf());
    }
    path_var.and_then(|p| {
        std::env::split_paths(p)
            .map(|d| d.join(program))
            .find(|c| c.is_file())
    })
}

/// The install `program` itself lives in (see [`program_home`]).
fn install_of(program: &Path, path_var: Option<&str>) -> Vec<PathBuf> {
    let Some(found) = find_program(program, path_var) else {
        return Vec::new();
    };
    let mut homes = Vec::new();
    for p in [Some(found.clone()), found.canonicalize().ok()]
        .into_iter()
        .flatten()
    {
        if let Some(home) = p.parent().and_then(Path::parent) {
            if home.components().count() > 2 && !homes.contains(&home.to_path_buf()) {
                homes.push(home.to_path_buf());
            }
        }
    }
    homes
}

/// The roots to add for `root` so that none reaches a path in `deny`: `root` itself
/// when no denied path is in it; nothing when it is in a denied path; else its entries
/// one by one, those holding a denied path split the same way, the denied ones left
/// out. A root that does not exist gives nothing.
pub fn roots(root: &Path, deny: &[PathBuf]) -> Vec<PathBuf> {
    let Ok(root) = root.canonicalize() else {
        return Vec::new();
    };
    let deny: Vec<PathBuf> = deny
        .iter()
        .map(|d| d.canonicalize().unwrap_or_else(|_| d.clone()))
        .collect();
    let mut out = Vec::new();
    split(&root, &deny, &mut out);
    out
}

fn split(root: &Path, deny: &[PathBuf], out: &mut Vec<PathBuf>) {
    if deny.iter().any(|d| root.starts_with(d)) {
        return;
    }
    if !deny.iter().any(|d| d.starts_with(root)) {
        out.push(root.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut children: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    children.sort();
    for child in children {
        // A link is followed to where it points, and checked there.
        let real = child.canonicalize().unwrap_or(child);
        split(&real, deny, out);
    }
}

/// What entering the box came to, for the launcher's log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entered {
    /// Every right asked for is enforced (else the kernel's Landlock is older than
    /// [`ABI_WANTED`] and enforces what it knows).
    pub fully: bool,
    /// The roots added, read-only then read-write.
    pub read: Vec<PathBuf>,
    /// The read-write roots added.
    pub write: Vec<PathBuf>,
}

/// Restricts the calling (single-threaded) process with `rules`: the launcher's work
/// before it `exec`s the agent. A kernel without Landlock is
/// [`SandboxError::Unavailable`]; nothing is half-applied silently.
pub fn enter(rules: &Rules) -> Result<Entered, SandboxError> {
    let unavailable = |e: landlock::RulesetError| SandboxError::Unavailable(e.to_string());
    let abi = ABI_WANTED;
    let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    read.extend(rules.read.iter().cloned());
    let read: Vec<PathBuf> = read.iter().flat_map(|r| roots(r, &rules.deny)).collect();
    let mut write: Vec<PathBuf> = DEVICE_WRITE.iter().map(PathBuf::from).collect();
    write.extend(rules.write.iter().cloned());
    let write: Vec<PathBuf> = write.iter().flat_map(|r| roots(r, &rules.deny)).collect();
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(unavailable)?
        .scope(Scope::from_all(abi))
        .map_err(unavailable)?
        .create()
        .map_err(unavailable)?;
    for (paths, access) in [
        (&read, AccessFs::from_read(abi)),
        (&write, AccessFs::from_all(abi)),
    ] {
        for path in paths {
            let fd = PathFd::new(path).map_err(|e| SandboxError::Rule {
                path: path.clone(),
                why: e.to_string(),
            })?;
            let access = if path.is_dir() {
                access
            } else {
                access & AccessFs::from_file(abi)
            };
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, access).set_compatibility(CompatLevel::BestEffort))
                .map_err(|e| SandboxError::Rule {
                    path: path.clone(),
                    why: e.to_string(),
                })?;
        }
    }
    let status = ruleset.restrict_self().map_err(unavailable)?;
    match status.ruleset {
        RulesetStatus::NotEnforced => Err(SandboxError::Unavailable(
            "Landlock is not supported or not enabled at boot (lsm=landlock)".into(),
        )),
        enforced => Ok(Entered {
            fully: enforced == RulesetStatus::FullyEnforced,
            read,
            write,
        }),
    }
}

/// Becomes `user` (its uid, its primary group, no supplementary groups): the
/// launcher's step after [`enter`] when `run_as` is set. Only root can.
pub fn become_user(user: &str) -> Result<(), SandboxError> {
    use nix::unistd::{setgid, setgroups, setuid, Uid, User};
    let fail = |why: String| SandboxError::RunAs {
        user: user.to_string(),
        why,
    };
    let found = User::from_name(user)
        .map_err(|e| fail(e.to_string()))?
        .ok_or_else(|| fail("no such user".into()))?;
    if !Uid::effective().is_root() {
        return Err(fail(
            "only a node running as root can start its agent as another user".into(),
        ));
    }
    setgroups(&[found.gid]).map_err(|e| fail(format!("setgroups: {e}")))?;
    setgid(found.gid).map_err(|e| fail(format!("setgid: {e}")))?;
    setuid(found.uid).map_err(|e| fail(format!("setuid: {e}")))?;
    Ok(())
}

/// The uid and gid of `user`, for the node to hand it the agent's temp dir.
pub fn user_ids(user: &str) -> Result<(u32, u32), SandboxError> {
    let found = nix::unistd::User::from_name(user)
        .map_err(|e| SandboxError::RunAs {
            user: user.to_string(),
            why: e.to_string(),
        })?
        .ok_or_else(|| SandboxError::RunAs {
            user: user.to_string(),
            why: "no such user".into(),
        })?;
    Ok((found.uid.as_raw(), found.gid.as_raw()))
}

/// Makes the node's process non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): no other
/// process of its user can read its `/proc/<pid>/environ` or `mem`, or ptrace it.
/// The first thing `botmesh run` does.
pub fn make_undumpable() -> Result<(), String> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| e.to_string())
}

/// Whether the calling process is dumpable (for the start-up log and tests).
pub fn dumpable() -> Option<bool> {
    nix::sys::prctl::get_dumpable().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_holding_a_denied_path_is_split_around_it() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        for d in ["repo/src", "repo/data/bot", "repo/keys"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        std::fs::write(base.join("repo/peers.toml"), "x").unwrap();
        std::fs::write(base.join("repo/README"), "x").unwrap();
        let deny = vec![base.join("repo/data"), base.join("repo/peers.toml")];
        let got = roots(&base.join("repo"), &deny);
        assert_eq!(
            got,
            [
                base.join("repo/README"),
                base.join("repo/keys"),
                base.join("repo/src")
            ]
        );
        // A root inside a denied path gives nothing; one apart from them, itself.
        assert!(roots(&base.join("repo/data/bot"), &deny).is_empty());
        assert_eq!(
            roots(&base.join("repo/src"), &deny),
            [base.join("repo/src")]
        );
        assert!(roots(&base.join("nowhere"), &deny).is_empty());
    }

    #[test]
    fn the_launcher_arguments_carry_every_rule() {
        let rules = Rules {
            read: vec!["/r".into()],
            write: vec!["/w1".into(), "/w2".into()],
            deny: vec!["/d".into()],
            run_as: Some("agent".into()),
        };
        let args: Vec<String> = rules
            .to_args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "sandbox", "--read", "/r", "--write", "/w1", "--write", "/w2", "--deny", "/d",
                "--run-as", "agent", "--"
            ]
        );
    }

    #[test]
    fn a_program_home_is_the_folder_above_its_bin() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("venv/bin")).unwrap();
        std::fs::write(base.join("venv/bin/tool"), "").unwrap();
        let path = base.join("venv/bin").display().to_string();
        assert_eq!(
            program_home(Path::new("tool"), Some(&path)),
            [base.join("venv")]
        );
        assert_eq!(
            program_home(&base.join("venv/bin/tool"), None),
            [base.join("venv")]
        );
        assert!(program_home(Path::new("/usr/bin/env"), None).is_empty());
        assert!(program_home(Path::new("no-such-tool"), Some(&path)).is_empty());
    }

    #[test]
    fn a_script_s_interpreter_install_is_read_too() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        for d in ["venv/bin", "py/bin", "node/bin"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        std::fs::write(base.join("py/bin/python3"), "").unwrap();
        std::fs::write(base.join("node/bin/node"), "").unwrap();
        let script = base.join("venv/bin/server");
        let py = base.join("py/bin/python3");
        std::fs::write(&script, format!("#!{}\nimport x\n", py.display())).unwrap();
        assert_eq!(
            program_home(&script, None),
            [base.join("venv"), base.join("py")]
        );
        // `#!/usr/bin/env node`: the interpreter is found on PATH.
        std::fs::write(&script, "#!/usr/bin/env -S node --flag\n").unwrap();
        let path = base.join("node/bin").display().to_string();
        assert_eq!(
            program_home(&script, Some(&path)),
            [base.join("venv"), base.join("node")]
        );
    }
}
