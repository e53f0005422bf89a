//! The checks of a loaded peers.toml that need no secret: each mistake is a
//! [`ConfigError`] naming its key, found before any port is bound. What only the
//! platforms know is checked by `platform::registry::check`.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::{names, AgentEngine, BotSettings, ConfigError, JudgeMode, Settings, Transport};
use crate::wire::signing::PublicKey;

impl Settings {
    /// A [`ConfigError`] about `key` of this file.
    pub(crate) fn err(&self, key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.path.display().to_string(),
            key: key.into(),
            problem: problem.into(),
        }
    }

    /// Checks everything that can be checked without secrets.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let m = &self.mesh;
        if self.bots.is_empty() {
            return Err(self.err(
                "bots",
                "no [[bots]] entries: the mesh needs at least one bot",
            ));
        }
        if m.group.trim().is_empty() {
            return Err(self.err("mesh.group", "must not be empty"));
        }
        self.validate_redis()?;
        self.validate_api()?;
        for (i, entry) in m.operators.iter().flatten().enumerate() {
            names::check_operator(entry)
                .map_err(|problem| self.err(format!("mesh.operators[{i}]"), problem))?;
        }
        if m.max_depth == 0 {
            return Err(self.err(
                "mesh.max_depth",
                "must be at least 1 (0 would silence every bot)",
            ));
        }
        if m.max_depth > crate::wire::limits::MAX_DEPTH {
            return Err(self.err(
                "mesh.max_depth",
                format!(
                    "must be at most {} (peers refuse deeper envelopes)",
                    crate::wire::limits::MAX_DEPTH
                ),
            ));
        }
        if m.llm_threshold >= m.max_depth {
            return Err(self.err(
                "mesh.llm_threshold",
                format!(
                    "{} must be below mesh.max_depth ({})",
                    m.llm_threshold, m.max_depth
                ),
            ));
        }
        if m.outbox_capacity == 0 {
            return Err(self.err("mesh.outbox_capacity", "must be at least 1"));
        }
        if m.batch_max == 0 || m.batch_max > crate::wire::batch::MAX_ITEMS {
            return Err(self.err(
                "mesh.batch_max",
                format!("must be 1 to {}", crate::wire::batch::MAX_ITEMS),
            ));
        }
        if m.max_relay_hops > crate::wire::limits::MAX_HOPS_LIMIT {
            return Err(self.err(
                "mesh.max_relay_hops",
                format!("must be at most {}", crate::wire::limits::MAX_HOPS_LIMIT),
            ));
        }
        if m.retry_base_ms == 0 || m.retry_max_ms < m.retry_base_ms {
            return Err(self.err(
                "mesh.retry_max_ms",
                "needs 0 < retry_base_ms <= retry_max_ms",
            ));
        }
        if m.max_connections == 0 || m.header_timeout_ms == 0 {
            return Err(self.err(
                "mesh.max_connections",
                "max_connections and header_timeout_ms must be at least 1",
            ));
        }
        for (key, value) in [
            ("max_groups", m.max_groups),
            ("max_open_transcripts", m.max_open_transcripts),
        ] {
            if value == 0 {
                return Err(self.err(format!("mesh.{key}"), "must be at least 1"));
            }
        }
        if m.body_timeout_ms == 0 {
            return Err(self.err(
                "mesh.body_timeout_ms",
                "must be at least 1 (the time a client has to send a request's body)",
            ));
        }
        if m.max_connections_per_source == 0 {
            return Err(self.err(
                "mesh.max_connections_per_source",
                "must be at least 1 (open connections one address may hold on the bridge)",
            ));
        }
        if m.peer_rate_limit == 0 {
            return Err(self.err("mesh.peer_rate_limit", "must be at least 1"));
        }
        if m.max_asks_per_turn > 20 {
            return Err(self.err(
                "mesh.max_asks_per_turn",
                "must be at most 20 (each ask is a message everyone in the group reads)",
            ));
        }
        if !(1..=3600).contains(&m.ask_timeout_secs) {
            return Err(self.err(
                "mesh.ask_timeout_secs",
                "must be 1 to 3600 (how long an ask may wait for a colleague's answer)",
            ));
        }
        if m.judge == JudgeMode::Shared && !(100..=60_000).contains(&m.verdict_timeout_ms) {
            return Err(self.err(
                "mesh.verdict_timeout_ms",
                "must be 100 to 60000 with judge = \"shared\" (how long a bot waits for the shared verdict)",
            ));
        }
        if m.secret_env.is_some() && m.secret_file.is_some() {
            return Err(self.err(
                "mesh.secret_file",
                "set either mesh.secret_env or mesh.secret_file, not both",
            ));
        }
        if let Some(llm) = &self.llm {
            check_url(&llm.base_url).map_err(|p| self.err("llm.base_url", p))?;
            if llm.model.trim().is_empty() {
                return Err(self.err("llm.model", "must not be empty"));
            }
            parse_utc_offset(&llm.budget_utc_offset)
                .map_err(|p| self.err("llm.budget_utc_offset", p))?;
            for (key, limit) in [
                ("daily_calls", llm.daily_calls),
                ("daily_tokens", llm.daily_tokens),
            ] {
                if limit == Some(0) {
                    return Err(self.err(
                        format!("llm.{key}"),
                        "must be at least 1 (leave it out for no limit; quiet silences a bot)",
                    ));
                }
            }
            for (name, o) in [("judge", &llm.judge), ("reply", &llm.reply)] {
                if let Some(url) = o.as_ref().and_then(|o| o.base_url.as_ref()) {
                    check_url(url).map_err(|p| self.err(format!("llm.{name}.base_url"), p))?;
                }
            }
        }
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut addrs: HashMap<SocketAddr, String> = HashMap::new();
        let hmac = m.secret_env.is_some() || m.secret_file.is_some();
        for (i, b) in self.bots.iter().enumerate() {
            let at = |k: &str| format!("bots[{i}].{k}");
            for (key, limit) in [
                ("daily_calls", b.daily_calls),
                ("daily_tokens", b.daily_tokens),
            ] {
                if limit == Some(0) {
                    return Err(self.err(
                        at(key),
                        "must be at least 1 (leave it out for [llm]'s limit; quiet silences a bot)",
                    ));
                }
            }
            if b.name.trim().is_empty() || b.name.trim() != b.name {
                return Err(self.err(at("name"), "must be non-empty without surrounding spaces"));
            }
            if b.name.len() > crate::wire::limits::MAX_NAME_BYTES {
                return Err(self.err(
                    at("name"),
                    format!(
                        "{} bytes, over {} (peers refuse longer author names)",
                        b.name.len(),
                        crate::wire::limits::MAX_NAME_BYTES
                    ),
                ));
            }
            if b.name.starts_with('@') || b.name.contains(['<', '>', '"']) {
                return Err(self.err(
                    at("name"),
                    format!("{:?} may not start with @ or contain <, >, \"", b.name),
                ));
            }
            for (j, handle) in std::iter::once(&b.name).chain(b.aliases.iter()).enumerate() {
                let key = if j == 0 {
                    at("name")
                } else {
                    at(&format!("aliases[{}]", j - 1))
                };
                if handle.trim().is_empty() {
                    return Err(self.err(key, "must not be empty"));
                }
                if let Some(&other) = names.get(&handle.to_lowercase()) {
                    if other != i {
                        return Err(self.err(
                            key,
                            format!(
                                "{handle:?} is already a name or alias of bots[{other}] ({})",
                                self.bots[other].name
                            ),
                        ));
                    }
                }
                names.insert(handle.to_lowercase(), i);
            }
            for (key, value) in [("bridge", &b.bridge), ("api", &b.api)] {
                let addr: SocketAddr = value.parse().map_err(|_| {
                    self.err(
                        at(key),
                        format!("{value:?} is not an address like 127.0.0.1:7101"),
                    )
                })?;
                if addr.port() != 0 {
                    if let Some(owner) = addrs.insert(addr, at(key)) {
                        return Err(self.err(at(key), format!("{addr} is already used by {owner}")));
                    }
                }
            }
            if let Some(url) = &b.bridge_url {
                check_url(url).map_err(|p| self.err(at("bridge_url"), p))?;
            }
            if b.min_delay_ms > b.max_delay_ms {
                return Err(self.err(
                    at("min_delay_ms"),
                    format!(
                        "{} is above max_delay_ms ({})",
                        b.min_delay_ms, b.max_delay_ms
                    ),
                ));
            }
            if b.max_delay_ms > 600_000 {
                return Err(self.err(
                    at("max_delay_ms"),
                    "above 10 minutes; the conversation will have moved on",
                ));
            }
            if !(0.0..=1.0).contains(&b.min_relevance) {
                return Err(self.err(at("min_relevance"), "must be within 0..1"));
            }
            if b.context_messages > 200 {
                return Err(self.err(at("context_messages"), "at most 200"));
            }
            if b.status_after_secs > 3_600 {
                return Err(self.err(
                    at("status_after_secs"),
                    "at most 3600 (an hour); 0 turns the status message off",
                ));
            }
            if b.status_every_secs == 0 || b.status_every_secs > 600 {
                return Err(self.err(
                    at("status_every_secs"),
                    "must be 1..=600: the least time between two edits of a status message",
                ));
            }
            if b.judge_drafts && !b.write_early {
                return Err(self.err(
                    at("judge_drafts"),
                    "a drafting judge writes the reply while the bot waits, which needs write_early = true",
                ));
            }
            if b.group_tools && b.agent.is_some() {
                return Err(self.err(
                    at("group_tools"),
                    "is for the built-in model: this bot's agent is offered the group tools (the mesh server) anyway",
                ));
            }
            if b.group_tools && b.write_early {
                return Err(self.err(
                    at("group_tools"),
                    "needs write_early = false: an ask posts to the group at once, so the reply may be written only once the bot has the turn",
                ));
            }
            if b.judge_drafts && b.agent.is_some() {
                return Err(self.err(
                    at("judge_drafts"),
                    "this bot's replies come from its agent (a sidecar agent or an ACP agent), so its judge has nothing to draft",
                ));
            }
            if let Some(t) = &b.judge_prompt {
                if !t.contains("{message}") {
                    return Err(self.err(at("judge_prompt"), "the template must contain {message}"));
                }
            }
            for (k, key) in b.public_key.iter().map(|k| (k, at("public_key"))).chain(
                b.previous_public_keys
                    .iter()
                    .enumerate()
                    .map(|(j, k)| (k, at(&format!("previous_public_keys[{j}]")))),
            ) {
                PublicKey::parse(k)
                    .map_err(|e| self.err(key, format!("not a valid Ed25519 public key: {e}")))?;
            }
            if b.private_key_env.is_some() && b.private_key_file.is_some() {
                return Err(self.err(
                    at("private_key_file"),
                    "set either private_key_env or private_key_file, not both",
                ));
            }
            if b.public_key.is_none() && !hmac {
                return Err(self.err(
                    at("public_key"),
                    format!("{} has no public_key and neither mesh.secret_env nor mesh.secret_file is set: its envelopes could never be verified", b.name),
                ));
            }
            match &b.agent {
                Some(AgentEngine::Webhook(a)) => {
                    check_url(&a.webhook).map_err(|p| self.err(at("agent.webhook"), p))?;
                }
                Some(AgentEngine::Acp(a)) => {
                    if let Err(problems) = a.validate() {
                        let first = &problems[0];
                        return Err(self.err(at(&format!("agent.{}", first.key)), &first.problem));
                    }
                }
                Some(AgentEngine::A2a(a)) => {
                    check_url(&a.a2a).map_err(|p| self.err(at("agent.a2a"), p))?;
                    if a.turn_timeout_secs == 0 {
                        return Err(self.err(at("agent.turn_timeout_secs"), "must be at least 1"));
                    }
                }
                Some(AgentEngine::External(_)) | None => {}
            }
            self.validate_mcp(i, b)?;
        }
        Ok(())
    }

    /// `bots[i].feishu`: the app settings a feishu bot needs, and well-formed peer ids.
    /// A bot's `[[bots.mcp]]` servers and tool limits.
    fn validate_mcp(&self, i: usize, b: &BotSettings) -> Result<(), ConfigError> {
        let at = |k: &str| format!("bots[{i}].{k}");
        if b.max_tool_rounds > 64 {
            return Err(self.err(at("max_tool_rounds"), "at most 64"));
        }
        if b.tool_timeout_ms == 0 || b.tool_timeout_ms > 600_000 {
            return Err(self.err(at("tool_timeout_ms"), "must be within 1..=600000"));
        }
        if b.tool_result_chars < 100 {
            return Err(self.err(at("tool_result_chars"), "at least 100"));
        }
        let mut names = std::collections::HashSet::new();
        for (j, m) in b.mcp.iter().enumerate() {
            let at = |k: &str| format!("bots[{i}].mcp[{j}].{k}");
            if m.name.trim().is_empty() {
                return Err(self.err(at("name"), "an MCP server needs a name"));
            }
            if !names.insert(m.name.as_str()) {
                return Err(self.err(
                    at("name"),
                    format!("{:?} names two of this bot's MCP servers", m.name),
                ));
            }
            match (m.command.is_empty(), &m.url) {
                (true, None) => {
                    return Err(self.err(
                        at("command"),
                        "set command (a stdio server) or url (a streamable-HTTP server)",
                    ))
                }
                (false, Some(_)) => {
                    return Err(self.err(at("url"), "set either command or url, not both"))
                }
                (false, None) => {
                    if m.command[0].trim().is_empty() {
                        return Err(self.err(at("command"), "the program name is empty"));
                    }
                    if !m.headers_env.is_empty() {
                        return Err(self.err(
                            at("headers_env"),
                            "headers are for a url server; a stdio server gets env",
                        ));
                    }
                    if let Some((key, problem)) = m.sandbox.problems().into_iter().next() {
                        return Err(self.err(at(&key), problem));
                    }
                }
                (true, Some(url)) => {
                    check_url(url).map_err(|p| self.err(at("url"), p))?;
                    if url.starts_with("https://") {
                        return Err(self.err(
                            at("url"),
                            "https MCP servers are not supported by this build (plain http only, e.g. a local gateway)",
                        ));
                    }
                    if !m.env.is_empty() {
                        return Err(self.err(
                            at("env"),
                            "env is for a stdio server; a url server gets headers_env",
                        ));
                    }
                    if m.sandbox != crate::config::acp::SandboxSetting::default() {
                        return Err(self.err(
                            at("sandbox"),
                            "a url server is not a process of the node's: sandbox is for a stdio server",
                        ));
                    }
                    for h in m.headers_env.keys() {
                        if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                            return Err(self.err(
                                at("headers_env"),
                                format!("{h:?} is not a valid header name"),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The local API's keys of every bot: `api_public_host` is a bare host name, and a
    /// sidecar token (`api_token_env`) comes with the operator's (`mesh.api_token_env`).
    fn validate_api(&self) -> Result<(), ConfigError> {
        for (i, b) in self.bots.iter().enumerate() {
            if let Some(h) = &b.api_public_host {
                let ok = !h.is_empty()
                    && h.len() <= 253
                    && !h.starts_with(['-', '.'])
                    && h.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
                if !ok {
                    return Err(self.err(
                        format!("bots[{i}].api_public_host"),
                        format!("{h:?} is not a host name: letters, digits, '-' and '.' only, no scheme, port or path (e.g. \"botmesh.example.com\")"),
                    ));
                }
            }
            if let Some(serve) = &b.a2a {
                let loopback = b
                    .api
                    .parse::<SocketAddr>()
                    .is_ok_and(|a| a.ip().is_loopback());
                if let Some((key, problem)) = serve.problem(loopback) {
                    return Err(self.err(format!("bots[{i}].a2a.{key}"), problem));
                }
            }
            if b.api_token_env.is_some() && self.mesh.api_token_env.is_none() {
                return Err(self.err(
                    format!("bots[{i}].api_token_env"),
                    "a sidecar token needs the operator's too: set mesh.api_token_env (else nobody could quiet or reload this bot through its API)",
                ));
            }
        }
        Ok(())
    }

    /// `[redis]`, checked when any bot uses it.
    fn validate_redis(&self) -> Result<(), ConfigError> {
        if !self
            .bots
            .iter()
            .any(|b| self.transport_of(b) == Transport::Redis)
        {
            return Ok(());
        }
        let r = &self.redis;
        if r.url_env.is_none() {
            redis::Client::open(r.url.as_str()).map_err(|e| {
                self.err(
                    "redis.url",
                    format!("{:?} is not a redis:// URL: {e}", r.url),
                )
            })?;
            if r.url.contains('@') {
                return Err(self.err(
                    "redis.url",
                    "holds a password: put the URL in an env var and name it in redis.url_env",
                ));
            }
        }
        if r.key_prefix.is_empty() || r.key_prefix.contains(char::is_whitespace) {
            return Err(self.err("redis.key_prefix", "must be non-empty, without spaces"));
        }
        if r.max_len < 100 {
            return Err(self.err(
                "redis.max_len",
                "at least 100: a shorter stream loses messages while a bot restarts",
            ));
        }
        if r.block_ms == 0 || r.block_ms > 60_000 {
            return Err(self.err("redis.block_ms", "must be within 1..=60000"));
        }
        if r.batch == 0 || r.batch > 10_000 {
            return Err(self.err("redis.batch", "must be within 1..=10000"));
        }
        Ok(())
    }
}

/// Checks that `url` is an http(s) URL with a host.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} must start with http:// or https://"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("{url:?} has no host"));
    }
    reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    Ok(())
}
/// Minutes east of UTC for a `budget_utc_offset` (`+08:00`, `-05:30`, `Z`, `UTC`).
pub(crate) fn parse_utc_offset(s: &str) -> Result<i64, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("z") || t.eq_ignore_ascii_case("utc") {
        return Ok(0);
    }
    let bad = || format!("{s:?} is not a UTC offset like \"+08:00\" or \"-05:00\"");
    let (sign, rest) = match t.as_bytes().first() {
        Some(b'+') => (1, &t[1..]),
        Some(b'-') => (-1, &t[1..]),
        _ => return Err(bad()),
    };
    let (h, m) = rest.split_once(':').ok_or_else(bad)?;
    let (h, m): (i64, i64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if !(0..=14).contains(&h) || !(0..60).contains(&m) {
        return Err(bad());
    }
    Ok(sign * (h * 60 + m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn operators_are_platform_qualified_person_ids() {
        let toml = |ops: &str| {
            format!(
                "[mesh]\nsecret_env = \"BOTMESH_SECRET\"\noperators = {ops}\n[[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:1\"\napi = \"127.0.0.1:2\"\n"
            )
        };
        let ok = Settings::from_toml(
            &toml(r#"["local:Boss", "discord:5005", "feishu:ou_1", "dingtalk:m1"]"#),
            Path::new("peers.toml"),
        )
        .expect("valid");
        assert_eq!(ok.mesh.operators.as_ref().map(Vec::len), Some(4));
        let e = Settings::from_toml(&toml(r#"["Boss"]"#), Path::new("peers.toml")).unwrap_err();
        assert!(e.problem.contains("platform:id"), "{e}");
        let e = Settings::from_toml(&toml(r#"["discord:"]"#), Path::new("peers.toml")).unwrap_err();
        assert!(e.problem.contains("empty"), "{e}");
    }
}
