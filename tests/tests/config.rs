//! Configuration mistakes are reported naming the key, before any port is bound.

use std::process::Command;

use botmesh::wire::signing::SigningKey;
use botmesh_tests::botmesh_bin;

struct Case {
    what: &'static str,
    toml: String,
    env: Vec<(&'static str, &'static str)>,
    bot: &'static str,
    expect: &'static [&'static str],
}

fn base(bridge: u16, extra_mesh: &str, bots: &str) -> String {
    format!(
        "[mesh]\ngroup = \"demo\"\nsecret_env = \"TEST_SECRET\"\n{extra_mesh}\n\
[[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:{bridge}\"\napi = \"127.0.0.1:{}\"\n{bots}",
        bridge + 1
    )
}

#[test]
fn config_errors_name_the_key_and_bind_nothing() {
    // Hold the ports the config names: if the binary tried to bind, it would report a
    // bind error instead of the configuration error we expect.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let held2 = std::net::TcpListener::bind(("127.0.0.1", port + 1));
    let pk = SigningKey::generate().public_key().to_whpk();
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let second =
        format!("[[bots]]\nname = \"B\"\nbridge = \"127.0.0.1:{port}\"\napi = \"127.0.0.1:1\"\n");
    let cases = vec![
        Case { what: "unknown bot", toml: base(port, "", ""), env: vec![("TEST_SECRET", secret)], bot: "Zed", expect: &["--bot", "unknown bot \"Zed\"", "A"] },
        Case { what: "two bots on one address", toml: base(port, "", &second), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[1].bridge", "already used by bots[0].bridge"] },
        Case { what: "missing secret", toml: base(port, "", ""), env: vec![], bot: "A", expect: &["mesh.secret_env", "TEST_SECRET is not set"] },
        Case { what: "malformed secret", toml: base(port, "", ""), env: vec![("TEST_SECRET", "hunter2")], bot: "A", expect: &["mesh.secret_env", "whsec_"] },
        Case { what: "malformed public key", toml: base(port, "", "public_key = \"whpk_notbase64!!\"\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].public_key", "not a valid Ed25519 public key"] },
        // The identity point: 32 bytes of valid base64, but a key under which anything verifies.
        Case { what: "small-order public key", toml: base(port, "", "public_key = \"whpk_AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\"\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].public_key", "not a usable Ed25519 public key"] },
        Case { what: "public key without private key", toml: base(port, "", &format!("public_key = \"{pk}\"\n")), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].private_key_env", "needs private_key_env or private_key_file"] },
        Case { what: "private key not matching", toml: base(port, "", &format!("public_key = \"{pk}\"\nprivate_key_env = \"TEST_KEY\"\n")), env: vec![("TEST_SECRET", secret), ("TEST_KEY", "whsk_VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=")], bot: "A", expect: &["bots[0].private_key", "does not match"] },
        Case { what: "bad address", toml: format!("[mesh]\nsecret_env = \"TEST_SECRET\"\n[[bots]]\nname = \"A\"\nbridge = \"localhost-ish\"\napi = \"127.0.0.1:{}\"\n", port + 1), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].bridge", "not an address"] },
        Case { what: "unknown key", toml: base(port, "max_dept = 3", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["max_dept"] },
        Case { what: "threshold above depth", toml: base(port, "max_depth = 2\nllm_threshold = 2", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.llm_threshold", "below mesh.max_depth"] },
        Case { what: "a depth past the wire's bound", toml: base(port, "max_depth = 401", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.max_depth", "at most 400"] },
        Case { what: "a bot name over 64 bytes", toml: format!("[mesh]\nsecret_env = \"TEST_SECRET\"\n[[bots]]\nname = \"{}\"\nbridge = \"127.0.0.1:{port}\"\napi = \"127.0.0.1:{}\"\n", "名".repeat(22), port + 1), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].name", "66 bytes, over 64"] },
        Case { what: "no groups allowed", toml: base(port, "max_groups = 0", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.max_groups", "at least 1"] },
        Case { what: "no transcript files open", toml: base(port, "max_open_transcripts = 0", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.max_open_transcripts", "at least 1"] },
        Case { what: "too many relay hops", toml: base(port, "max_relay_hops = 9", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.max_relay_hops", "at most 3"] },
        Case { what: "batch too large", toml: base(port, "batch_max = 1000", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.batch_max", "1 to 256"] },
        Case { what: "batch of none", toml: base(port, "batch_max = 0", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.batch_max", "1 to 256"] },
        Case { what: "no time for a body", toml: base(port, "body_timeout_ms = 0", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.body_timeout_ms", "at least 1"] },
        Case { what: "a per-source cap of none", toml: base(port, "max_connections_per_source = 0", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.max_connections_per_source", "at least 1"] },
        Case { what: "wrong type", toml: base(port, "max_depth = \"three\"", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["max_depth"] },
        // A table under an array element: the key as written, `bots[1].feishu.app_id`.
        Case { what: "nested table under a bot", toml: base(port, "", "[[bots]]\nname = \"B\"\nbridge = \"127.0.0.1:1\"\napi = \"127.0.0.1:2\"\n[bots.feishu]\napp_id = [\"cli_x\"]\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &[": bots[1].feishu.app_id: invalid type", "key `bots[1].feishu.app_id`"] },
        Case { what: "delays reversed", toml: base(port, "", "min_delay_ms = 5000\nmax_delay_ms = 1000\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].min_delay_ms", "above max_delay_ms"] },
        Case { what: "a bot's daily budget of zero", toml: base(port, "", "daily_calls = 0\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].daily_calls", "must be at least 1"] },
        Case { what: "status messages edited with no pause between edits", toml: base(port, "", "status_every_secs = 0\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].status_every_secs", "1..=600"] },
        Case { what: "a status message after more than an hour", toml: base(port, "", "status_after_secs = 7200\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].status_after_secs", "at most 3600"] },
        Case { what: "a drafting judge that may not write early", toml: base(port, "", "judge_drafts = true\nwrite_early = false\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].judge_drafts", "needs write_early = true"] },
        Case { what: "a drafting judge with a sidecar agent", toml: base(port, "", "judge_drafts = true\n[bots.agent]\nwebhook = \"http://127.0.0.1:9/turn\"\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].judge_drafts", "sidecar agent"] },
        // ACP agents (docs/agents.md).
        Case { what: "an agent with both webhook and acp", toml: base(port, "", "[bots.agent]\nwebhook = \"http://127.0.0.1:9/turn\"\nacp = [\"codex-acp\"]\ncwd = \"/srv\"\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent", "has both `webhook`", "give one of them"] },
        Case { what: "an agent both acp and external", toml: base(port, "", "agent = { acp = [\"codex-acp\"], cwd = \"/srv\", external = true }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent", "has both `acp` and `external`"] },
        Case { what: "an external agent set to false", toml: base(port, "", "agent = { external = false }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent", "`external = false` is no agent"] },
        Case { what: "group tools with an agent", toml: base(port, "", "group_tools = true\nwrite_early = false\nagent = { external = true }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].group_tools", "is for the built-in model"] },
        Case { what: "group tools writing early", toml: base(port, "", "group_tools = true\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].group_tools", "needs write_early = false"] },
        Case { what: "too many asks per turn", toml: base(port, "max_asks_per_turn = 21\n", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.max_asks_per_turn", "at most 20"] },
        Case { what: "an ask timeout of zero", toml: base(port, "ask_timeout_secs = 0\n", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.ask_timeout_secs", "1 to 3600"] },
        Case { what: "an agent with neither webhook nor acp", toml: base(port, "", "agent = { cwd = \"/srv\" }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent", "needs `webhook"] },
        Case { what: "an ACP agent with an empty command", toml: base(port, "", "agent = { acp = [], cwd = \"/srv\" }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent.acp", "is empty"] },
        Case { what: "an ACP agent with a relative cwd", toml: base(port, "", "agent = { acp = [\"codex-acp\"], cwd = \"repo\" }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent.cwd", "not an absolute path"] },
        Case { what: "an ACP kind both allowed and asked", toml: base(port, "", "agent = { acp = [\"codex-acp\"], cwd = \"/srv\", allow = [\"edit\"], ask = [\"edit\"] }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent.ask[0]", "in both allow and ask"] },
        Case { what: "an unknown ACP key", toml: base(port, "", "agent = { acp = [\"codex-acp\"], cwd = \"/srv\", alow = [\"read\"] }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent", "alow"] },
        Case { what: "an ACP env_from variable unset", toml: base(port, "", "agent = { acp = [\"codex-acp\"], cwd = \"/srv\", env_from = { OPENAI_API_KEY = \"TEST_CODER_KEY\" } }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent.env_from.OPENAI_API_KEY", "TEST_CODER_KEY is not set"] },
        Case { what: "a drafting judge with an ACP agent", toml: base(port, "", "judge_drafts = true\nagent = { acp = [\"codex-acp\"], cwd = \"/srv\" }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].judge_drafts", "ACP agent"] },
        Case { what: "a shared judge's verdict timeout out of range", toml: base(port, "judge = \"shared\"\nverdict_timeout_ms = 10\n", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["mesh.verdict_timeout_ms", "100 to 60000"] },
        Case { what: "an unknown judge mode", toml: base(port, "judge = \"sharde\"\n", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["judge", "sharde"] },
        Case { what: "env override validated too", toml: base(port, "", ""), env: vec![("TEST_SECRET", secret), ("BOTMESH__MESH__MAX_DEPTH", "0")], bot: "A", expect: &["mesh.max_depth", "at least 1"] },
        Case { what: "unknown transport", toml: base(port, "transport = \"pigeon\"", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["transport", "pigeon"] },
        Case { what: "redis url not redis", toml: base(port, "transport = \"redis\"\n[redis]\nurl = \"http://127.0.0.1:6379\"", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["redis.url", "not a redis:// URL"] },
        Case { what: "redis password in the file", toml: base(port, "transport = \"redis\"\n[redis]\nurl = \"redis://:hunter2@127.0.0.1:6379\"", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["redis.url", "redis.url_env"] },
        Case { what: "redis stream too short", toml: base(port, "transport = \"redis\"\n[redis]\nmax_len = 10", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["redis.max_len", "at least 100"] },
        Case { what: "redis url env unset", toml: base(port, "transport = \"redis\"\n[redis]\nurl_env = \"TEST_REDIS_URL\"", ""), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["redis.url_env", "TEST_REDIS_URL is not set"] },
        Case { what: "no key at all", toml: format!("[mesh]\n[[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:{port}\"\napi = \"127.0.0.1:{}\"\n", port + 1), env: vec![], bot: "A", expect: &["bots[0].public_key", "mesh.secret_env", "mesh.secret_file"] },
        Case { what: "non-loopback api without token", toml: format!("[mesh]\nsecret_env = \"TEST_SECRET\"\n[[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:{port}\"\napi = \"0.0.0.0:{}\"\n", port + 1), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].api", "bearer token"] },
        // A2A (docs/a2a.md).
        Case { what: "an A2A bot served on a public API without callers", toml: format!("[mesh]\nsecret_env = \"TEST_SECRET\"\napi_token_env = \"TEST_OP\"\n[[bots]]\nname = \"A\"\nbridge = \"127.0.0.1:{port}\"\napi = \"0.0.0.0:{}\"\na2a = {{ serve = true }}\n", port + 1), env: vec![("TEST_SECRET", secret), ("TEST_OP", "op-token")], bot: "A", expect: &["bots[0].a2a.callers", "not loopback"] },
        Case { what: "an A2A caller's token unset", toml: base(port, "", "a2a = { serve = true, callers = { hermes = \"TEST_HERMES_TOKEN\" } }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].a2a.callers.hermes", "TEST_HERMES_TOKEN is not set"] },
        Case { what: "two A2A callers sharing a token", toml: base(port, "", "a2a = { serve = true, callers = { claw = \"TEST_T1\", hermes = \"TEST_T2\" } }\n"), env: vec![("TEST_SECRET", secret), ("TEST_T1", "same"), ("TEST_T2", "same")], bot: "A", expect: &["bots[0].a2a.callers.hermes", "each caller needs its own"] },
        Case { what: "an A2A public URL that is no absolute URL", toml: base(port, "", "a2a = { serve = true, public_url = \"bot.example/api\" }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].a2a.public_url", "absolute http(s) URL"] },
        Case { what: "a remote A2A agent's token unset", toml: base(port, "", "agent = { a2a = \"http://127.0.0.1:9\", token_env = \"TEST_REMOTE\" }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent.token_env", "TEST_REMOTE is not set"] },
        Case { what: "a remote A2A agent that is no URL", toml: base(port, "", "agent = { a2a = \"planner\" }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].agent.a2a"] },
        // MCP tool servers (docs/tools.md).
        Case { what: "an MCP server with neither command nor url", toml: base(port, "", "[[bots.mcp]]\nname = \"t\"\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].mcp[0].command", "set command (a stdio server) or url"] },
        Case { what: "an MCP server with both", toml: base(port, "", "[[bots.mcp]]\nname = \"t\"\ncommand = [\"x\"]\nurl = \"http://127.0.0.1:9/mcp\"\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].mcp[0].url", "not both"] },
        Case { what: "two MCP servers of one name", toml: base(port, "", "[[bots.mcp]]\nname = \"t\"\ncommand = [\"x\"]\n[[bots.mcp]]\nname = \"t\"\ncommand = [\"y\"]\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].mcp[1].name", "names two of this bot's MCP servers"] },
        Case { what: "an https MCP server", toml: base(port, "", "[[bots.mcp]]\nname = \"t\"\nurl = \"https://tools.example/mcp\"\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].mcp[0].url", "plain http only"] },
        Case { what: "an MCP header variable unset", toml: base(port, "", "[[bots.mcp]]\nname = \"t\"\nurl = \"http://127.0.0.1:9/mcp\"\nheaders_env = { Authorization = \"TEST_MCP_TOKEN\" }\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].mcp[0].headers_env.Authorization", "TEST_MCP_TOKEN is not set"] },
        Case { what: "a tool timeout of zero", toml: base(port, "", "tool_timeout_ms = 0\n"), env: vec![("TEST_SECRET", secret)], bot: "A", expect: &["bots[0].tool_timeout_ms", "1..=600000"] },
    ];
    let dir = tempfile::tempdir().unwrap();
    for case in cases {
        let path = dir.path().join("peers.toml");
        std::fs::write(&path, &case.toml).unwrap();
        let out = Command::new(botmesh_bin())
            .args(["run", "--bot", case.bot, "--config"])
            .arg(&path)
            .env_clear()
            .envs(case.env.iter().cloned())
            .env("BOTMESH_LOG", "info")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: should fail", case.what);
        for e in case.expect {
            assert!(
                stderr.contains(e),
                "{}: expected {e:?} in:\n{stderr}",
                case.what
            );
        }
        assert!(
            !stderr.contains("binding"),
            "{}: tried to bind:\n{stderr}",
            case.what
        );
        assert!(
            !stderr.contains("node started"),
            "{}: started:\n{stderr}",
            case.what
        );
    }
    drop((held, held2));
}

/// A file with a mistake is named as the node was given it, whatever the working
/// directory: the config crate alone would say `in ../peers.toml` from a subfolder.
#[test]
fn a_parse_error_names_the_path_the_node_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peers.toml");
    std::fs::write(&path, "[mesh]\nmax_depth = = 3\n").unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let out = Command::new(botmesh_bin())
        .args(["run", "--bot", "A", "--config"])
        .arg(&path)
        .current_dir(&sub)
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{}: ", path.display())),
        "{stderr}"
    );
    assert!(stderr.contains("TOML parse error"), "{stderr}");
    assert!(
        !stderr.contains("../"),
        "a path relative to the working directory: {stderr}"
    );
}

#[test]
fn keygen_makes_keys_that_parse() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("a.key");
    let out = Command::new(botmesh_bin())
        .args(["keygen", "--private-out"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success());
    let public = String::from_utf8(out.stdout).unwrap();
    let private = std::fs::read_to_string(&key).unwrap();
    let sk = SigningKey::parse(private.trim()).unwrap();
    assert_eq!(sk.public_key().to_whpk(), public.trim());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let out = Command::new(botmesh_bin())
        .args(["keygen", "--secret"])
        .output()
        .unwrap();
    let secret = String::from_utf8(out.stdout).unwrap();
    let s = botmesh::wire::signing::HmacSecret::parse(secret.trim()).unwrap();
    s.validate_strength().unwrap();
}
