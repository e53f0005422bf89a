//! `[[bots]] a2a`: the bot served as an A2A agent at its local API (docs/a2a.md) —
//! its Agent Card and the JSON-RPC endpoint an outside agent (Hermes, OpenClaw, any
//! A2A 1.0 client) sends its tasks to. The caller's tokens are read from the variables
//! `callers` names, when the node starts ([`read_callers`]).

use std::collections::BTreeMap;

use serde::Deserialize;

/// The prefix of an A2A caller's name in the group (`a2a:hermes`): reserved, so no
/// person posting through the local API can pass for a caller.
pub const CALLER_PREFIX: &str = "a2a:";

/// The caller's name when no `callers` are set (a loopback API only): whoever can
/// reach the loopback API.
pub(crate) const LOCAL_CALLER: &str = "local";

/// Longest caller name.
const MAX_CALLER_NAME: usize = 64;

/// `[[bots]] a2a = { serve = true, group = "…", callers = { hermes = "HERMES_A2A_TOKEN" },
/// public_url = "https://bot.example/api" }`.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct A2aServe {
    /// Whether the bot is served: `false` keeps the table but serves nothing.
    pub(crate) serve: bool,
    /// The group a caller's messages are posted in (default `[mesh].group`).
    #[serde(default)]
    pub(crate) group: Option<String>,
    /// The callers, by the name they get in the group (`a2a:<name>`): the variable
    /// holding each one's bearer token. Empty: no token, allowed on a loopback API only.
    #[serde(default)]
    pub(crate) callers: BTreeMap<String, String>,
    /// The API's address as callers reach it (`https://bot.example/api`, behind a proxy
    /// that ends TLS): the card's interface is `<public_url>/a2a`. Unset: `http://` and
    /// the `Host` the caller reached.
    #[serde(default)]
    pub(crate) public_url: Option<String>,
}

/// `[[bots]] agent = { a2a = "http://…", token_env = "…" }`: the bot's replies written
/// by a remote A2A agent (docs/a2a.md, "A remote agent as a colleague").
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct A2aAgentSettings {
    /// The agent's base URL: its card is at `<a2a>/.well-known/agent-card.json`, and
    /// names the endpoint.
    pub(crate) a2a: String,
    /// The variable holding the bearer token the node presents to it.
    #[serde(default)]
    pub(crate) token_env: Option<String>,
    /// How long one turn may take before it is cancelled at the agent.
    #[serde(default = "default_turn_timeout_secs")]
    pub(crate) turn_timeout_secs: u64,
}

fn default_turn_timeout_secs() -> u64 {
    900
}

/// One A2A caller as the node knows it at run time: its name and its token.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct A2aCaller {
    /// The name it has in the group after `a2a:` (`hermes`).
    pub(crate) name: String,
    /// The bearer token it presents.
    pub(crate) token: String,
}

impl std::fmt::Debug for A2aCaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aCaller")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl A2aServe {
    /// What is wrong with the table, as `(key under bots[i].a2a, problem)`; `loopback`:
    /// whether the bot's API listens on loopback only.
    pub(crate) fn problem(&self, loopback: bool) -> Option<(String, String)> {
        if let Some(g) = &self.group {
            if g.trim().is_empty() || g.len() > 256 || g.starts_with('\0') {
                return Some(("group".into(), "must be 1..=256 bytes, not blank".into()));
            }
        }
        if let Some(url) = &self.public_url {
            if let Err(p) = crate::config::check_url(url) {
                return Some(("public_url".into(), format!("{p}: the API's address as callers reach it, an absolute http(s) URL (\"https://bot.example/api\")")));
            }
        }
        for (name, var) in &self.callers {
            let ok = !name.is_empty()
                && name.len() <= MAX_CALLER_NAME
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                return Some((
                    format!("callers.{name}"),
                    format!("{name:?} is not a caller name: 1..={MAX_CALLER_NAME} letters, digits, '-', '_' or '.'"),
                ));
            }
            if var.trim().is_empty() {
                return Some((
                    format!("callers.{name}"),
                    "must name the environment variable holding the caller's token".into(),
                ));
            }
        }
        if self.serve && self.callers.is_empty() && !loopback {
            return Some((
                "callers".into(),
                "the bot's API is not loopback, so serving it over A2A needs callers with tokens: callers = { hermes = \"HERMES_A2A_TOKEN\" }".into(),
            ));
        }
        None
    }
}

/// Reads each caller's token from the variable it names: with `secrets` (a running
/// node) every one must be set, non-empty and its own (two callers sharing one token
/// could not be told apart). `Err((key under bots[i].a2a, problem))`.
pub(crate) fn read_callers(
    serve: &A2aServe,
    var: &dyn Fn(&str) -> Option<String>,
    secrets: bool,
) -> Result<Vec<A2aCaller>, (String, String)> {
    let mut out: Vec<A2aCaller> = Vec::new();
    if !serve.serve {
        return Ok(out);
    }
    for (name, env) in &serve.callers {
        let key = format!("callers.{name}");
        match var(env).filter(|t| !t.trim().is_empty()) {
            Some(token) => {
                if let Some(twin) = out.iter().find(|c| c.token == token) {
                    return Err((
                        key,
                        format!("{env} holds the same token as caller {:?}'s: each caller needs its own", twin.name),
                    ));
                }
                out.push(A2aCaller {
                    name: name.clone(),
                    token,
                });
            }
            None if secrets => {
                return Err((
                    key,
                    format!("environment variable {env} is not set or empty (the caller's bearer token is read from it)"),
                ))
            }
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(callers: &[(&str, &str)]) -> A2aServe {
        A2aServe {
            serve: true,
            group: None,
            public_url: None,
            callers: callers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn without_callers_only_a_loopback_api_may_serve() {
        assert_eq!(serve(&[]).problem(true), None);
        assert_eq!(serve(&[]).problem(false).unwrap().0, "callers");
        assert_eq!(serve(&[("hermes", "H")]).problem(false), None);
        let off = A2aServe {
            serve: false,
            ..serve(&[])
        };
        assert_eq!(off.problem(false), None);
        assert_eq!(
            serve(&[("bad name", "H")]).problem(true).unwrap().0,
            "callers.bad name"
        );
    }

    #[test]
    fn a_public_url_must_be_an_absolute_http_url() {
        let with = |u: &str| A2aServe {
            public_url: Some(u.into()),
            ..serve(&[])
        };
        assert_eq!(with("https://bot.example/api").problem(true), None);
        assert_eq!(with("http://10.0.0.2:8080").problem(true), None);
        for bad in [
            "bot.example/api",
            "/api",
            "ftp://bot.example",
            "https://",
            "",
        ] {
            let (key, why) = with(bad).problem(true).expect(bad);
            assert_eq!(key, "public_url", "{bad}");
            assert!(why.contains("absolute http(s) URL"), "{why}");
        }
    }

    #[test]
    fn every_caller_needs_its_own_token_when_the_node_runs() {
        let s = serve(&[("hermes", "H"), ("claw", "C")]);
        let env = |v: &str| match v {
            "H" => Some("t1".to_string()),
            "C" => Some("t1".to_string()),
            _ => None,
        };
        let e = read_callers(&s, &env, true).unwrap_err();
        assert_eq!(e.0, "callers.hermes", "{e:?}");
        let env = |v: &str| (v == "H").then(|| "t1".to_string());
        assert_eq!(read_callers(&s, &env, true).unwrap_err().0, "callers.claw");
        let read = read_callers(&s, &env, false).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].name, "hermes");
        assert!(!format!("{:?}", read[0]).contains("t1"), "no token in logs");
    }
}
