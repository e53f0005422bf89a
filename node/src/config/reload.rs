//! Reloading peers.toml into a running node: which keys take effect at once and
//! which wait for a restart.
//!
//! A reload validates the file exactly as start-up does ([`super::NodeConfig`]'s
//! build); then [`merge`] takes from it only what a bot tunes (delays, judge and
//! reply settings, participation, depth rules, the rate cap, `[llm]`, quiet) into the
//! running settings, and [`diff`] names every key that changed, as applied or as
//! waiting for a restart (addresses, keys, the roster, transports, platforms, data
//! folder). Nothing is half applied: a key that needs a restart keeps its running
//! value until the node restarts.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{BotSettings, Settings};

/// What a reload changed, key by key (`mesh.max_depth`, `bots[0].min_delay_ms`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ConfigDiff {
    /// Changed keys now in effect.
    pub(crate) applied: Vec<String>,
    /// Changed keys that take effect only after a restart (the running value stays).
    pub(crate) restart_required: Vec<String>,
}

/// The running settings with every tunable key taken from `file`: the `[mesh]` depth
/// rules, rate cap and staleness, the whole `[llm]` table, every bot's colleague
/// profile (role, skills) and turn-taking keys. Everything else stays as it runs.
/// Bots are matched by name (a renamed bot is a roster change: restart).
pub(crate) fn merge(running: &Settings, file: &Settings) -> Settings {
    let mut out = running.clone();
    let (m, f) = (&mut out.mesh, &file.mesh);
    m.max_depth = f.max_depth;
    m.llm_threshold = f.llm_threshold;
    m.bot_messages_per_minute = f.bot_messages_per_minute;
    m.stale_after_secs = f.stale_after_secs;
    m.judge = f.judge;
    m.verdict_timeout_ms = f.verdict_timeout_ms;
    m.operators = f.operators.clone();
    m.max_asks_per_turn = f.max_asks_per_turn;
    m.ask_timeout_secs = f.ask_timeout_secs;
    out.llm = file.llm.clone();
    for b in &mut out.bots {
        let Some(new) = file.bots.iter().find(|n| n.name == b.name) else {
            continue;
        };
        b.role = new.role.clone();
        b.skills = new.skills.clone();
        // A colleague's delays and prompts matter only on its own node, but taking
        // them here too keeps them out of the restart list.
        tune_bot(b, new);
    }
    out
}

/// A bot's own tunable keys, from `new`.
fn tune_bot(b: &mut BotSettings, new: &BotSettings) {
    b.participation = new.participation;
    b.reply_to = new.reply_to;
    b.min_delay_ms = new.min_delay_ms;
    b.max_delay_ms = new.max_delay_ms;
    b.jitter_ms = new.jitter_ms;
    b.claim_ack_timeout_ms = new.claim_ack_timeout_ms;
    b.judge_word_timeout_ms = new.judge_word_timeout_ms;
    b.write_early = new.write_early;
    b.judge_drafts = new.judge_drafts;
    b.daily_calls = new.daily_calls;
    b.daily_tokens = new.daily_tokens;
    b.context_messages = new.context_messages;
    b.status_after_secs = new.status_after_secs;
    b.status_every_secs = new.status_every_secs;
    b.context_chars = new.context_chars;
    b.min_relevance = new.min_relevance;
    b.judge_prompt = new.judge_prompt.clone();
    b.persona = new.persona.clone();
    b.quiet = new.quiet;
    b.max_tool_rounds = new.max_tool_rounds;
    b.tool_timeout_ms = new.tool_timeout_ms;
    b.tool_result_chars = new.tool_result_chars;
}

/// Every key whose value differs between `running` and `file`, sorted into those
/// `merged` (= [`merge`] of the two) takes from the file and those it keeps.
pub(crate) fn diff(running: &Settings, file: &Settings, merged: &Settings) -> ConfigDiff {
    let (old, new, now) = (flat(running), flat(file), flat(merged));
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let mut d = ConfigDiff::default();
    for k in keys {
        let (o, n) = (old.get(k), new.get(k));
        if o == n {
            continue;
        }
        if now.get(k) == n {
            d.applied.push(k.clone());
        } else {
            d.restart_required.push(k.clone());
        }
    }
    d
}

/// The settings as `key → value`, one entry per leaf (`bots[1].feishu.app_id`); a
/// list of plain values (aliases, skills) is one leaf.
fn flat(s: &Settings) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    let v = serde_json::to_value(s).expect("settings serialize");
    walk(String::new(), v, &mut out);
    out
}

fn walk(at: String, v: serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
    use serde_json::Value;
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let key = if at.is_empty() {
                    k
                } else {
                    format!("{at}.{k}")
                };
                walk(key, v, out);
            }
        }
        Value::Array(items) if items.iter().any(Value::is_object) => {
            for (i, v) in items.into_iter().enumerate() {
                walk(format!("{at}[{i}]"), v, out);
            }
        }
        // An absent table and an empty one read the same.
        Value::Object(_) | Value::Null => {
            out.insert(at, Value::Null);
        }
        v => {
            out.insert(at, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const BASE: &str = "[mesh]\nsecret_env = \"S\"\nmax_depth = 3\n\
        [[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:7101\"\napi = \"127.0.0.1:7201\"\n\
        [[bots]]\nname = \"B\"\nbridge = \"127.0.0.1:7102\"\napi = \"127.0.0.1:7202\"\n";

    fn settings(text: &str) -> Settings {
        Settings::from_toml(text, Path::new("peers.toml")).expect("valid")
    }

    #[test]
    fn tunable_keys_apply_and_addresses_wait_for_a_restart() {
        let old = settings(BASE);
        let text = BASE
            .replace(
                "max_depth = 3",
                "max_depth = 5\nbot_messages_per_minute = 2\noperators = [\"local:Boss\"]",
            )
            .replace(
                "api = \"127.0.0.1:7201\"\n",
                "api = \"127.0.0.1:7301\"\nmin_delay_ms = 10\njudge_prompt = \"x {message}\"\nrole = \"dba\"\n",
            )
            .replace("name = \"B\"\n", "name = \"B\"\nrole = \"ops\"\naliases = [\"bee\"]\n");
        let new = settings(&text);
        let merged = merge(&old, &new);
        let d = diff(&old, &new, &merged);
        assert_eq!(
            d.applied,
            [
                "bots[0].judge_prompt",
                "bots[0].min_delay_ms",
                "bots[0].role",
                "bots[1].role",
                "mesh.bot_messages_per_minute",
                "mesh.max_depth",
                "mesh.operators",
            ]
        );
        assert_eq!(d.restart_required, ["bots[0].api", "bots[1].aliases"]);
        assert_eq!(merged.bots[0].api, "127.0.0.1:7201", "not half applied");
        assert_eq!(merged.bots[0].min_delay_ms, 10);
        // Reloading the same file again: nothing more to apply, the restart still owed.
        let again = diff(&merged, &new, &merge(&merged, &new));
        assert!(again.applied.is_empty(), "{again:?}");
        assert_eq!(again.restart_required, ["bots[0].api", "bots[1].aliases"]);
    }

    #[test]
    fn tool_limits_apply_and_mcp_servers_wait_for_a_restart() {
        let old = settings(BASE);
        let text = BASE.replace(
            "api = \"127.0.0.1:7201\"\n",
            "api = \"127.0.0.1:7201\"\nmax_tool_rounds = 3\ntool_timeout_ms = 500\ntool_result_chars = 900\n\
             [[bots.mcp]]\nname = \"time\"\ncommand = [\"mcp-server-time\"]\n",
        );
        let new = settings(&text);
        let merged = merge(&old, &new);
        let d = diff(&old, &new, &merged);
        assert_eq!(
            d.applied,
            [
                "bots[0].max_tool_rounds",
                "bots[0].tool_result_chars",
                "bots[0].tool_timeout_ms",
            ]
        );
        assert!(
            d.restart_required
                .contains(&"bots[0].mcp[0].command".to_string()),
            "{d:?}"
        );
        assert!(
            d.restart_required
                .iter()
                .all(|k| k.starts_with("bots[0].mcp")),
            "{d:?}"
        );
        assert!(merged.bots[0].mcp.is_empty(), "not half applied");
        assert_eq!(merged.bots[0].max_tool_rounds, 3);
    }

    #[test]
    fn a_colleagues_delays_and_a_whole_llm_table_apply() {
        let old = settings(BASE);
        let text = format!(
            "{}\n[llm]\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"m\"\ndaily_calls = 5\n",
            BASE.replace("name = \"B\"\n", "name = \"B\"\nmin_delay_ms = 5\n")
        );
        let new = settings(&text);
        let d = diff(&old, &new, &merge(&old, &new));
        assert!(d.applied.contains(&"llm.daily_calls".to_string()), "{d:?}");
        assert!(d.applied.contains(&"llm.model".to_string()), "{d:?}");
        assert!(
            d.applied.contains(&"bots[1].min_delay_ms".to_string()),
            "{d:?}"
        );
        assert!(d.restart_required.is_empty(), "{d:?}");
    }

    #[test]
    fn utc_offsets_parse_and_nonsense_is_refused() {
        assert_eq!(super::super::parse_utc_offset("+08:00"), Ok(480));
        assert_eq!(super::super::parse_utc_offset("-05:30"), Ok(-330));
        assert_eq!(super::super::parse_utc_offset("Z"), Ok(0));
        assert!(super::super::parse_utc_offset("Asia/Shanghai").is_err());
        assert!(super::super::parse_utc_offset("+25:00").is_err());
    }
}
