//! `agent = { acp = [...], ... }`: the settings of a bot whose replies come from a coding
//! agent hosted over ACP (Agent Client Protocol), read by `agent::acp`.
//!
//! ```toml
//! agent = { acp = ["codex-acp", "--flag"], cwd = "/srv/repo", env = { CODEX_HOME = "/srv/codex" },
//!           allow = ["read", "search", "think"], ask = ["edit", "execute"],
//!           turn_timeout_secs = 900, ask_timeout_secs = 300 }
//! ```
//!
//! The agent process gets a clean environment (PATH, HOME, LANG and `env`, nothing else)
//! and runs in a Landlock box (`sandbox`, see `agent::sandbox`; `run_as` a user);
//! its tool permissions are answered by the tool call's kind: `allow` → allowed, `ask` →
//! the people in the chat decide, any other kind → rejected.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

/// The kind of an agent's tool call, as ACP names it (`ToolKind`): what permissions
/// are decided by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Reading files or data.
    Read,
    /// Modifying files or content.
    Edit,
    /// Removing files or data.
    Delete,
    /// Moving or renaming files.
    Move,
    /// Searching for information.
    Search,
    /// Running commands or code.
    Execute,
    /// Internal reasoning or planning.
    Think,
    /// Retrieving external data (the network).
    Fetch,
    /// Anything else, and a tool call whose kind the agent did not say.
    Other,
}

impl ToolKind {
    /// Every kind, in ACP's order.
    pub const ALL: [ToolKind; 9] = [
        ToolKind::Read,
        ToolKind::Edit,
        ToolKind::Delete,
        ToolKind::Move,
        ToolKind::Search,
        ToolKind::Execute,
        ToolKind::Think,
        ToolKind::Fetch,
        ToolKind::Other,
    ];

    /// The kind's ACP name (`read`, `execute`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ToolKind::Read => "read",
            ToolKind::Edit => "edit",
            ToolKind::Delete => "delete",
            ToolKind::Move => "move",
            ToolKind::Search => "search",
            ToolKind::Execute => "execute",
            ToolKind::Think => "think",
            ToolKind::Fetch => "fetch",
            ToolKind::Other => "other",
        }
    }
}

impl<'de> Deserialize<'de> for ToolKind {
    /// A kind ACP defines; any other name is refused listing the kinds there are.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        ToolKind::ALL
            .into_iter()
            .find(|k| k.as_str() == name)
            .ok_or_else(|| {
                let kinds: Vec<&str> = ToolKind::ALL.iter().map(|k| k.as_str()).collect();
                serde::de::Error::custom(format!(
                    "`{name}` is not a tool kind; the kinds are {}",
                    kinds.join(", ")
                ))
            })
    }
}

impl fmt::Display for ToolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_turn_timeout() -> u64 {
    900
}

fn default_ask_timeout() -> u64 {
    300
}

fn default_init_timeout() -> u64 {
    60
}

fn default_max_reply_chars() -> usize {
    20_000
}

fn default_max_title_chars() -> usize {
    200
}

/// How to run a bot's ACP agent and what it may do without asking.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AcpSettings {
    /// The agent's command line: program, then arguments (`["codex-acp", "-c", "…"]`).
    /// The program is looked up on PATH.
    pub acp: Vec<String>,
    /// The absolute directory the agent works in: its process's working directory and
    /// every session's `cwd`.
    pub cwd: PathBuf,
    /// Variables added to the agent's otherwise clean environment (only PATH, HOME and
    /// LANG come from the node's), e.g. `CODEX_HOME`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables the agent gets from the node's environment, read when the node
    /// starts (`{ OPENAI_API_KEY = "CODER_OPENAI_KEY" }`: the agent's name, then the
    /// node's variable), so a key need not be written in peers.toml. Only these pass.
    /// The node reads them into `env` when it starts the agent (the library itself
    /// passes only `env`).
    #[serde(default)]
    pub env_from: BTreeMap<String, String>,
    /// Tool-call kinds the agent may run without asking anyone.
    #[serde(default)]
    pub allow: Vec<ToolKind>,
    /// Tool-call kinds the people in the chat are asked about; every kind in neither
    /// list is rejected.
    #[serde(default)]
    pub ask: Vec<ToolKind>,
    /// The longest a turn may take, seconds: then it is cancelled and lost.
    #[serde(default = "default_turn_timeout")]
    pub turn_timeout_secs: u64,
    /// How long the people in the chat have to answer a permission question, seconds;
    /// no answer rejects the tool call.
    #[serde(default = "default_ask_timeout")]
    pub ask_timeout_secs: u64,
    /// How long the agent has to answer `initialize`, seconds (opencode needs a few):
    /// then it is stopped and started again with backoff, while the node serves and
    /// `/healthz` says why the bot is not ready.
    #[serde(default = "default_init_timeout")]
    pub init_timeout_secs: u64,
    /// The longest reply an agent turn posts, characters: the rest is not even kept
    /// (a 60 MiB answer costs no memory) and the reply says it was cut.
    #[serde(default = "default_max_reply_chars")]
    pub max_reply_chars: usize,
    /// The longest tool-call title shown (progress, permission questions), characters.
    #[serde(default = "default_max_title_chars")]
    pub max_title_chars: usize,
    /// The agent's box (docs/security.md): on by default, widened by `read` and
    /// `write`, or `"off"` (a warning at every start).
    #[serde(default)]
    pub sandbox: SandboxSetting,
    /// The user the agent runs as, when the node runs as root (the launcher drops to
    /// it after entering the box).
    #[serde(default)]
    pub run_as: Option<String>,
}

/// `sandbox = { read = [...], write = [...] }` or `sandbox = "off"`: whether the
/// agent runs in its Landlock box (`agent::sandbox`), and what it may touch beyond
/// its `cwd`, its temp dir and the system's program folders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxSetting {
    /// Boxed (the default), with these roots besides the defaults.
    Boxed {
        /// More read-only roots (a toolchain, a shared checkout).
        read: Vec<PathBuf>,
        /// More read-write roots (the agent's own settings folder, e.g. `CODEX_HOME`).
        write: Vec<PathBuf>,
    },
    /// Not boxed: the agent can reach whatever the node's user can.
    Off,
}

impl SandboxSetting {
    /// What is wrong with it, as (key relative to the table holding `sandbox`,
    /// problem): every `read` and `write` path must be absolute.
    pub(crate) fn problems(&self) -> Vec<(String, String)> {
        let SandboxSetting::Boxed { read, write } = self else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (list, paths) in [("read", read), ("write", write)] {
            for (i, p) in paths.iter().enumerate() {
                if !p.is_absolute() {
                    out.push((
                        format!("sandbox.{list}[{i}]"),
                        format!("{p:?} is not an absolute path"),
                    ));
                }
            }
        }
        out
    }
}

impl Default for SandboxSetting {
    fn default() -> Self {
        SandboxSetting::Boxed {
            read: Vec::new(),
            write: Vec::new(),
        }
    }
}

/// The table form of [`SandboxSetting`], as written.
#[derive(Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct SandboxTable {
    #[serde(default)]
    read: Vec<PathBuf>,
    #[serde(default)]
    write: Vec<PathBuf>,
}

impl<'de> Deserialize<'de> for SandboxSetting {
    /// `"off"`, or a table of `read` and `write`; anything else is refused saying so.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Word(String),
            Table(SandboxTable),
        }
        let shapes = "write \"off\" or { read = [...], write = [...] } (absolute paths)";
        match Written::deserialize(d)
            .map_err(|_| serde::de::Error::custom(format!("is not a sandbox: {shapes}")))?
        {
            Written::Word(w) if w == "off" => Ok(SandboxSetting::Off),
            Written::Word(w) => Err(serde::de::Error::custom(format!(
                "`{w}` is not a sandbox: {shapes}"
            ))),
            Written::Table(t) => Ok(SandboxSetting::Boxed {
                read: t.read,
                write: t.write,
            }),
        }
    }
}

impl serde::Serialize for SandboxSetting {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SandboxSetting::Off => s.serialize_str("off"),
            SandboxSetting::Boxed { read, write } => SandboxTable {
                read: read.clone(),
                write: write.clone(),
            }
            .serialize(s),
        }
    }
}

/// One thing wrong with an [`AcpSettings`]: the key (relative to the `agent` table)
/// and the problem, for the caller to report as `bots[i].agent.<key>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpProblem {
    /// The key, e.g. `acp`, `env.PATH`, `ask[1]`.
    pub key: String,
    /// What is wrong, in words an operator can act on.
    pub problem: String,
}

impl fmt::Display for AcpProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.problem)
    }
}

impl AcpSettings {
    /// Every problem with these settings (an unknown kind is already refused when the
    /// file is read, naming the kinds there are). Empty: the settings are usable.
    pub fn validate(&self) -> Result<(), Vec<AcpProblem>> {
        let mut problems = Vec::new();
        let mut bad = |key: String, problem: String| problems.push(AcpProblem { key, problem });
        match self.acp.first() {
            None => bad(
                "acp".into(),
                "is empty: give the agent's command, e.g. [\"codex-acp\"]".into(),
            ),
            Some(program) if program.trim().is_empty() => {
                bad("acp[0]".into(), "the agent's program name is empty".into())
            }
            Some(_) => {}
        }
        for (i, arg) in self.acp.iter().enumerate() {
            if arg.contains('\0') {
                bad(format!("acp[{i}]"), "contains a NUL byte".into());
            }
        }
        if !self.cwd.is_absolute() {
            bad(
                "cwd".into(),
                format!(
                    "{:?} is not an absolute path (ACP sessions need one)",
                    self.cwd
                ),
            );
        }
        for (name, value) in &self.env {
            if !env_name_ok(name) {
                bad(
                    format!("env.{name}"),
                    "is not a usable environment variable name".into(),
                );
            }
            if value.contains('\0') {
                bad(
                    format!("env.{name}"),
                    "the value contains a NUL byte".into(),
                );
            }
        }
        for (name, var) in &self.env_from {
            if self.env.contains_key(name) {
                bad(
                    format!("env_from.{name}"),
                    "is also in env: say where its value comes from once".into(),
                );
            }
            if !env_name_ok(name) || !env_name_ok(var) {
                bad(
                    format!("env_from.{name}"),
                    "is not a usable environment variable name".into(),
                );
            }
        }
        for (i, kind) in self.ask.iter().enumerate() {
            if self.allow.contains(kind) {
                bad(
                    format!("ask[{i}]"),
                    format!("`{kind}` is in both allow and ask: say which one"),
                );
            }
        }
        if self.turn_timeout_secs == 0 {
            bad(
                "turn_timeout_secs".into(),
                "must be at least 1 second".into(),
            );
        }
        if self.max_reply_chars == 0 {
            bad("max_reply_chars".into(), "must be at least 1".into());
        }
        if self.max_title_chars == 0 {
            bad("max_title_chars".into(), "must be at least 1".into());
        }
        if self.init_timeout_secs == 0 {
            bad(
                "init_timeout_secs".into(),
                "must be at least 1 second".into(),
            );
        }
        if self.ask_timeout_secs == 0 {
            bad(
                "ask_timeout_secs".into(),
                "must be at least 1 second".into(),
            );
        }
        match &self.sandbox {
            SandboxSetting::Boxed { .. } => {
                for (key, problem) in self.sandbox.problems() {
                    bad(key, problem);
                }
            }
            SandboxSetting::Off => {
                if self.run_as.is_some() {
                    bad(
                        "run_as".into(),
                        "needs the sandbox (the launcher drops to the user): remove sandbox = \"off\"".into(),
                    );
                }
            }
        }
        if self.run_as.as_ref().is_some_and(|u| u.trim().is_empty()) {
            bad("run_as".into(), "is empty: name a user".into());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// Whether `name` can name an environment variable.
fn env_name_ok(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('=')
        && !name.contains('\0')
        && !name.chars().next().is_some_and(|c| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Bot {
        agent: AcpSettings,
    }

    fn parse(toml_agent: &str) -> Result<AcpSettings, String> {
        let text = format!("agent = {toml_agent}\n");
        let source = config::File::from_str(&text, config::FileFormat::Toml);
        config::Config::builder()
            .add_source(source)
            .build()
            .and_then(|c| c.try_deserialize::<Bot>())
            .map(|b| b.agent)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_issue_shape_reads_and_validates() {
        let s = parse(
            r#"{ acp = ["codex-acp", "--flag"], cwd = "/srv/repo", env = { CODEX_HOME = "/srv/codex" }, allow = ["read", "search", "think"], ask = ["edit", "execute"], turn_timeout_secs = 900, ask_timeout_secs = 300 }"#,
        )
        .expect("parses");
        assert_eq!(s.acp, ["codex-acp", "--flag"]);
        assert_eq!(s.env["CODEX_HOME"], "/srv/codex");
        assert_eq!(s.allow, [ToolKind::Read, ToolKind::Search, ToolKind::Think]);
        assert_eq!(s.ask, [ToolKind::Edit, ToolKind::Execute]);
        assert_eq!(s.validate(), Ok(()));
        let d = parse(r#"{ acp = ["a"], cwd = "/x" }"#).expect("defaults");
        assert_eq!((d.turn_timeout_secs, d.ask_timeout_secs), (900, 300));
        assert!(d.allow.is_empty() && d.ask.is_empty());
    }

    #[test]
    fn an_unknown_kind_or_key_is_refused_naming_it() {
        let e = parse(r#"{ acp = ["a"], cwd = "/x", allow = ["writ"] }"#).unwrap_err();
        assert!(e.contains("writ") && e.contains("execute"), "{e}");
        let e = parse(r#"{ acp = ["a"], cwd = "/x", alow = ["read"] }"#).unwrap_err();
        assert!(e.contains("alow"), "{e}");
    }

    #[test]
    fn validate_names_every_problem() {
        let s = parse(
            r#"{ acp = [], cwd = "rel", env = { "A=B" = "x" }, allow = ["edit"], ask = ["read", "edit"], turn_timeout_secs = 0, ask_timeout_secs = 0 }"#,
        )
        .expect("parses");
        let keys: Vec<String> = s
            .validate()
            .unwrap_err()
            .into_iter()
            .map(|p| p.key)
            .collect();
        assert_eq!(
            keys,
            [
                "acp",
                "cwd",
                "env.A=B",
                "ask[1]",
                "turn_timeout_secs",
                "ask_timeout_secs"
            ]
        );
    }

    #[test]
    fn the_sandbox_is_on_by_default_widened_by_a_table_or_off_by_word() {
        let d = parse(r#"{ acp = ["a"], cwd = "/x" }"#).unwrap();
        assert_eq!(d.sandbox, SandboxSetting::default());
        assert_eq!(
            (d.init_timeout_secs, d.max_reply_chars, d.max_title_chars),
            (60, 20_000, 200)
        );
        let w = parse(r#"{ acp = ["a"], cwd = "/x", sandbox = { read = ["/opt/t"], write = ["/srv/codex"] }, run_as = "agent" }"#).unwrap();
        assert_eq!(
            w.sandbox,
            SandboxSetting::Boxed {
                read: vec!["/opt/t".into()],
                write: vec!["/srv/codex".into()]
            }
        );
        assert_eq!(w.run_as.as_deref(), Some("agent"));
        assert_eq!(w.validate(), Ok(()));
        let off = parse(r#"{ acp = ["a"], cwd = "/x", sandbox = "off" }"#).unwrap();
        assert_eq!(off.sandbox, SandboxSetting::Off);
        for bad in [r#""of""#, r#"{ reed = ["/x"] }"#, "true"] {
            let e = parse(&format!(
                r#"{{ acp = ["a"], cwd = "/x", sandbox = {bad} }}"#
            ))
            .unwrap_err();
            assert!(
                e.contains("not a sandbox") && e.contains("\"off\""),
                "{bad}: {e}"
            );
        }
        let keys = |toml: &str| -> Vec<String> {
            parse(toml)
                .unwrap()
                .validate()
                .unwrap_err()
                .into_iter()
                .map(|p| p.key)
                .collect()
        };
        assert_eq!(
            keys(
                r#"{ acp = ["a"], cwd = "/x", sandbox = { read = ["rel"], write = ["/ok", "also"] } }"#
            ),
            ["sandbox.read[0]", "sandbox.write[1]"]
        );
        assert_eq!(
            keys(
                r#"{ acp = ["a"], cwd = "/x", sandbox = "off", run_as = "agent", max_reply_chars = 0 }"#
            ),
            ["max_reply_chars", "run_as"]
        );
    }

    #[test]
    fn kinds_round_trip_and_unknown_names_are_refused_naming_the_kinds() {
        for k in ToolKind::ALL {
            let back: ToolKind = serde_json::from_value(serde_json::json!(k.as_str())).unwrap();
            assert_eq!(back, k);
        }
        let err = serde_json::from_value::<ToolKind>(serde_json::json!("teleport"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`teleport` is not a tool kind") && err.contains("execute"),
            "{err}"
        );
    }
}
