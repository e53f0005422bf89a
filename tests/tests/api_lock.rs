//! The local API against web pages in the user's browser and other local processes
//! (docs/security.md, "The local API"): each attack of issue 26 is refused, what the
//! page and the API's own clients do still works, and no token reaches the log.

use std::collections::HashMap;
use std::time::Duration;

use botmesh::wire::signing::HmacSecret;
use botmesh_tests::fake_dingtalk::{FakeDingTalk, FakeRobot};
use botmesh_tests::fake_discord::{BotAccount, FakeDiscord};
use botmesh_tests::fake_feishu::{FakeApp, FakeFeishu};
use botmesh_tests::log_check::assert_holds_none;
use botmesh_tests::{botmesh_bin, fetch_json, wait_for, MeshSpec, ProcessMesh, TestMesh};

/// Whether node 0's operator switch is on, as `/v1/info` says.
async fn is_quiet(mesh: &TestMesh) -> bool {
    let v = fetch_json(mesh.http.get(format!("{}/v1/info", mesh.api(0)))).await;
    v["quiet"].as_bool().expect("quiet in /v1/info")
}

/// Status and JSON body of a request.
async fn send(r: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
    let r = r.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn a_body_not_declared_json_is_refused_so_a_no_cors_page_cannot_post() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A"])).await;
    let api = mesh.api(0);
    // What `fetch(url, {mode: 'no-cors', body: '{"quiet":true}'})` sends.
    let plain = |path: &str, body: &str| {
        mesh.http
            .post(format!("{api}{path}"))
            .header("content-type", "text/plain;charset=UTF-8")
            .body(body.to_string())
    };
    let (status, v) = send(plain("/v1/quiet", r#"{"quiet":true}"#)).await;
    assert_eq!(status, 415, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("application/json"),
        "{v}"
    );
    assert!(
        !is_quiet(&mesh).await,
        "the refused POST switched the bot quiet"
    );
    let (status, _) = send(plain("/v1/messages", r#"{"text":"forged","from":"alice"}"#)).await;
    assert_eq!(status, 415);
    // A form post, the other body a page may send without asking.
    let form = mesh
        .http
        .post(format!("{api}/v1/messages"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("text=forged");
    assert_eq!(send(form).await.0, 415);
    // A JSON endpoint refuses a body that declares nothing, too.
    let bare = mesh
        .http
        .post(format!("{api}/v1/quiet"))
        .body(r#"{"quiet":true}"#);
    assert_eq!(send(bare).await.0, 415);
    // Reload reads no body: bare is fine, a declared non-JSON body is not.
    assert_eq!(send(plain("/v1/reload", "x")).await.0, 415);
    assert_eq!(
        send(mesh.http.post(format!("{api}/v1/reload"))).await.0,
        200
    );
    assert!(
        mesh.transcript(0).await.is_empty(),
        "a refused post was recorded"
    );
    // The API's own clients send JSON and pass.
    let (status, v) = send(
        mesh.http
            .post(format!("{api}/v1/quiet"))
            .json(&serde_json::json!({"quiet": true})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(is_quiet(&mesh).await);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_foreign_origin_is_refused_and_the_pages_own_origin_accepted() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A"])).await;
    let api = mesh.api(0);
    let port = mesh.apis[0].port();
    let quiet_from = |origin: &str| {
        mesh.http
            .post(format!("{api}/v1/quiet"))
            .header("origin", origin)
            .json(&serde_json::json!({"quiet": true}))
    };
    for origin in [
        "http://evil.example",
        "null",
        &format!("http://127.0.0.1:{}", port.wrapping_add(1)),
        &format!("http://localhost:{port}"),
        "file://",
    ] {
        let (status, v) = send(quiet_from(origin)).await;
        assert_eq!(status, 403, "Origin {origin}: {v}");
        assert!(v["error"].as_str().unwrap().contains("Origin"), "{v}");
    }
    // Reads too: a page elsewhere cannot even start the event stream.
    let read = mesh
        .http
        .get(format!("{api}/v1/transcript"))
        .header("origin", "http://evil.example");
    assert_eq!(send(read).await.0, 403);
    assert!(
        !is_quiet(&mesh).await,
        "a foreign page switched the bot quiet"
    );
    // The page's own origin, as the browser sends it with the page's POSTs.
    let (status, v) = send(quiet_from(&api)).await;
    assert_eq!(status, 200, "{v}");
    assert!(is_quiet(&mesh).await);
    // The page opened as http://localhost:PORT posts with that origin.
    let local = mesh
        .http
        .post(format!("{api}/v1/quiet"))
        .header("host", format!("localhost:{port}"))
        .header("origin", format!("http://localhost:{port}"))
        .json(&serde_json::json!({"quiet": false}));
    assert_eq!(send(local).await.0, 200);
    assert!(!is_quiet(&mesh).await);
    let m = mesh.metrics(0).await;
    assert!(
        botmesh_tests::metric(&m, "botmesh_api_requests_total{result=\"bad_origin\"}") >= 6.0,
        "{m}"
    );
    mesh.shutdown().await;
}

/// A GET of node 0's transcript sent with `Host: host`.
fn with_host(mesh: &TestMesh, host: &str) -> reqwest::RequestBuilder {
    mesh.http
        .get(format!("{}/v1/transcript", mesh.api(0)))
        .header("host", host.to_string())
}

#[tokio::test]
async fn a_rebinding_host_is_refused_and_the_listen_address_and_localhost_accepted() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A"])).await;
    let port = mesh.apis[0].port();
    for host in [
        format!("evil.example:{port}"),
        "evil.example".into(),
        format!("localhost.evil.example:{port}"),
        format!("10.1.2.3:{port}"),
    ] {
        let (status, v) = send(with_host(&mesh, &host)).await;
        assert_eq!(status, 421, "Host {host}: {v}");
        assert!(v["error"].as_str().unwrap().contains("Host"), "{v}");
    }
    let post = mesh
        .http
        .post(format!("{}/v1/messages", mesh.api(0)))
        .header("host", format!("evil.example:{port}"))
        .json(&serde_json::json!({"text": "rebound", "from": "alice"}));
    assert_eq!(send(post).await.0, 421);
    assert!(
        mesh.transcript(0).await.is_empty(),
        "a rebound post was recorded"
    );
    for host in [
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("127.0.0.1:{port}"),
    ] {
        let (status, v) = send(with_host(&mesh, &host)).await;
        assert_eq!(status, 200, "Host {host}: {v}");
    }
    let m = mesh.metrics(0).await;
    assert!(
        botmesh_tests::metric(&m, "botmesh_api_requests_total{result=\"bad_host\"}") >= 5.0,
        "{m}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_configured_public_name_is_accepted_behind_a_tls_proxy() {
    let mesh = TestMesh::start(
        MeshSpec::mentions_only(&["A"]).bot("A", "api_public_host = \"bots.example.org\""),
    )
    .await;
    let port = mesh.apis[0].port();
    for host in [
        "bots.example.org".to_string(),
        format!("Bots.Example.Org:{port}"),
    ] {
        let (status, v) = send(with_host(&mesh, &host)).await;
        assert_eq!(status, 200, "Host {host}: {v}");
    }
    assert_eq!(send(with_host(&mesh, "other.example.org")).await.0, 421);
    // The page under the public name posts with its https origin.
    let proxied = |origin: &str| {
        mesh.http
            .post(format!("{}/v1/messages", mesh.api(0)))
            .header("host", "bots.example.org")
            .header("origin", origin.to_string())
            .json(&serde_json::json!({"text": "through the proxy", "from": "alice"}))
    };
    assert_eq!(send(proxied("https://bots.example.org")).await.0, 200);
    assert_eq!(send(proxied("https://other.example.org")).await.0, 403);
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_page_and_every_answer_carry_the_browser_hardening_headers() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A"])).await;
    for path in ["/", "/v1/info", "/nope"] {
        let r = mesh
            .http
            .get(format!("{}{path}", mesh.api(0)))
            .send()
            .await
            .unwrap();
        let h = r.headers();
        let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert_eq!(get("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(get("referrer-policy"), "no-referrer", "{path}");
        let csp = get("content-security-policy");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(csp.contains("script-src 'sha256-"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
    }
    // Refusals too.
    let r = mesh
        .http
        .get(format!("{}/", mesh.api(0)))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 421);
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    mesh.shutdown().await;
}

/// A configuration that must stop the node: what it is, the file, the environment and
/// what the error must say.
type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, &'a [&'a str]);

/// The node's exit status and stderr when started with `toml` and `env`; fails the
/// test if it is still running after 10 s (it started serving).
fn run_to_exit(toml: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peers.toml");
    std::fs::write(&path, toml).unwrap();
    let log = dir.path().join("stderr");
    let mut child = std::process::Command::new(botmesh_bin())
        .args(["run", "--bot", "A", "--config"])
        .arg(&path)
        .env_clear()
        .envs(env.iter().copied())
        .env("BOTMESH_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "the node kept running:\n{}",
                std::fs::read_to_string(&log).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, std::fs::read_to_string(&log).unwrap())
}

#[test]
fn a_token_variable_named_but_unset_stops_the_node_naming_it() {
    let secret = HmacSecret::generate().to_whsec();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let toml = |mesh: &str, bot: &str| {
        format!(
            "[mesh]\nsecret_env = \"LOCK_SECRET\"\n{mesh}\n[[bots]]\nname = \"A\"\n\
             bridge = \"127.0.0.1:{port}\"\napi = \"127.0.0.1:{}\"\n{bot}\n",
            port + 1
        )
    };
    let operator = "api_token_env = \"LOCK_OPERATOR_TOKEN\"";
    let sidecar = "api_token_env = \"LOCK_SIDECAR_TOKEN\"";
    let cases: [Case; 5] = [
        (
            "operator's unset",
            toml(operator, ""),
            vec![],
            &["mesh.api_token_env", "LOCK_OPERATOR_TOKEN is not set"],
        ),
        (
            "operator's set empty",
            toml(operator, ""),
            vec![("LOCK_OPERATOR_TOKEN", " ")],
            &["mesh.api_token_env", "LOCK_OPERATOR_TOKEN is not set"],
        ),
        (
            "sidecar's unset",
            toml(operator, sidecar),
            vec![("LOCK_OPERATOR_TOKEN", "op")],
            &["bots[0].api_token_env", "LOCK_SIDECAR_TOKEN is not set"],
        ),
        (
            "sidecar's without the operator's",
            toml("", sidecar),
            vec![("LOCK_SIDECAR_TOKEN", "side")],
            &["bots[0].api_token_env", "mesh.api_token_env"],
        ),
        (
            "sidecar's the same as the operator's",
            toml(operator, sidecar),
            vec![
                ("LOCK_OPERATOR_TOKEN", "same"),
                ("LOCK_SIDECAR_TOKEN", "same"),
            ],
            &["bots[0].api_token_env", "same token"],
        ),
    ];
    for (what, toml, mut env, expect) in cases {
        env.push(("LOCK_SECRET", &secret));
        let (status, stderr) = run_to_exit(&toml, &env);
        assert!(!status.success(), "{what}: should fail");
        for e in expect {
            assert!(stderr.contains(e), "{what}: expected {e:?} in:\n{stderr}");
        }
        assert!(
            !stderr.contains("node started"),
            "{what}: started:\n{stderr}"
        );
    }
    let bad_host = toml("", "api_public_host = \"https://bots.example\"");
    let (status, stderr) = run_to_exit(&bad_host, &[("LOCK_SECRET", &secret)]);
    assert!(!status.success());
    assert!(
        stderr.contains("bots[0].api_public_host") && stderr.contains("not a host name"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_sidecar_token_posts_as_its_bot_and_reads_but_cannot_quiet_or_reload() {
    let mut spec = MeshSpec::mentions_only(&["A"])
        .mesh("api_token_env = \"LOCK_OPERATOR\"")
        .bot("A", "api_token_env = \"LOCK_SIDECAR\"");
    spec.env = HashMap::from([
        ("LOCK_OPERATOR".to_string(), "operator-token".to_string()),
        ("LOCK_SIDECAR".to_string(), "sidecar-token".to_string()),
    ]);
    let mesh = TestMesh::start(spec).await;
    let api = mesh.api(0);
    let post = |token: &str, path: &str, body: serde_json::Value| {
        mesh.http
            .post(format!("{api}{path}"))
            .bearer_auth(token)
            .json(&body)
    };
    let get = |token: &str, path: &str| mesh.http.get(format!("{api}{path}")).bearer_auth(token);
    let side = "sidecar-token";
    let (status, v) = send(post(
        side,
        "/v1/messages",
        serde_json::json!({"text": "from the sidecar", "from": "A"}),
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = send(post(
        side,
        "/v1/messages",
        serde_json::json!({"text": "pretending", "from": "alice"}),
    ))
    .await;
    assert_eq!(status, 403, "a sidecar posts as its bot only: {v}");
    let (status, v) = send(get(side, "/v1/transcript")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["messages"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(send(get(side, "/v1/info")).await.0, 200);
    let (status, v) = send(post(
        side,
        "/v1/explain",
        serde_json::json!({"text": "@A hello", "from": "alice"}),
    ))
    .await;
    assert_eq!(status, 200, "{v}");
    let events = get(side, "/v1/events").send().await.unwrap();
    assert_eq!(events.status().as_u16(), 200);
    drop(events);
    for (path, body) in [
        ("/v1/quiet", serde_json::json!({"quiet": true})),
        ("/v1/reload", serde_json::json!({})),
    ] {
        let (status, v) = send(post(side, path, body.clone())).await;
        assert_eq!(status, 403, "{path}: {v}");
        assert!(v["error"].as_str().unwrap().contains("operator"), "{v}");
        // The operator's token opens them; none or a wrong one is 401.
        assert_eq!(
            send(post("operator-token", path, body.clone())).await.0,
            200
        );
        assert_eq!(send(post("wrong", path, body.clone())).await.0, 401);
        let none = mesh.http.post(format!("{api}{path}")).json(&body);
        assert_eq!(send(none).await.0, 401);
    }
    assert!(is_quiet_with(&mesh, "operator-token").await);
    mesh.shutdown().await;
}

/// [`is_quiet`] with a token.
async fn is_quiet_with(mesh: &TestMesh, token: &str) -> bool {
    let v = fetch_json(
        mesh.http
            .get(format!("{}/v1/info", mesh.api(0)))
            .bearer_auth(token),
    )
    .await;
    v["quiet"].as_bool().expect("quiet")
}

#[tokio::test]
async fn the_cli_switches_quiet_and_reloads_through_the_locked_api() {
    let mut mesh = ProcessMesh::configure(
        &["A"],
        "api_token_env = \"LOCK_CLI_TOKEN\"",
        "participation = \"mentions\"",
    );
    mesh.spawn_with(0, &[("LOCK_CLI_TOKEN", "cli-token")]).await;
    for args in [&["quiet", "--bot", "A"][..], &["reload", "--bot", "A"]] {
        let out = std::process::Command::new(botmesh_bin())
            .args(args)
            .arg("--config")
            .arg(&mesh.config)
            .env("LOCK_CLI_TOKEN", "cli-token")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "botmesh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let info = fetch_json(
        mesh.http
            .get(format!("{}/v1/info", mesh.apis[0]))
            .bearer_auth("cli-token"),
    )
    .await;
    assert_eq!(info["quiet"], true, "{info}");
    mesh.terminate(0);
}

/// A distinctive Discord token: found in the log in any of the forms a frame logger
/// prints it (as text, or as the hex of the frame's bytes).
const DISCORD_TOKEN: &str = "LOCKTEST.discord-bot-token.s3cr3t";

/// Bot Ada alone on a platform (its `[[bots]]` lines), run as a process with `env` at
/// `BOTMESH_LOG` `filter` (trace or more); returned once `line` is in its log.
async fn at_trace(platform: &str, env: &[(&str, &str)], filter: &str, line: &str) -> ProcessMesh {
    let mut mesh = ProcessMesh::configure(&["Ada"], "", platform);
    let mut env = env.to_vec();
    env.push(("BOTMESH_LOG", filter));
    mesh.spawn_with(0, &env).await;
    let log = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { mesh.log(0) },
        |log| log.contains(line),
    )
    .await;
    assert!(log.contains(line), "no {line:?} in:\n{log}");
    mesh
}

/// Stops the process of [`at_trace`] and returns its whole log.
fn stop(mut mesh: ProcessMesh) -> String {
    mesh.terminate(0);
    mesh.log(0)
}

#[tokio::test]
async fn the_log_at_trace_holds_no_discord_token() {
    const ADA_ID: &str = "1300000000000000001";
    const CHANNEL: &str = "1200000000000000001";
    let fake = FakeDiscord::start(
        vec![BotAccount {
            token: DISCORD_TOKEN.into(),
            user_id: ADA_ID.into(),
            username: "ada".into(),
        }],
        vec![],
        &[CHANNEL],
    )
    .await;
    let discord = format!(
        "platform = \"discord\"\ndiscord = {{ token_env = \"LOCK_DISCORD_TOKEN\", channel_id = \"{CHANNEL}\", user_id = \"{ADA_ID}\", api_base_url = \"{}\", gateway_url = \"{}\" }}",
        fake.api_base_url, fake.gateway_url
    );
    // Even a filter that asks for the WebSocket crates' trace lines by name.
    let mesh = at_trace(
        &discord,
        &[("LOCK_DISCORD_TOKEN", DISCORD_TOKEN)],
        "trace,tungstenite=trace,tokio_tungstenite=trace",
        "discord gateway: READY",
    )
    .await;
    // A post as the bot goes out over REST (`Authorization: Bot <token>`).
    mesh.post_from(0, "Ada", "hello from Ada").await;
    fake.wait("the bot's post reached discord", |f| {
        !f.posted_by(ADA_ID).is_empty()
    })
    .await;
    assert_holds_none(&stop(mesh), &[DISCORD_TOKEN]);
}

#[tokio::test]
async fn the_log_at_trace_holds_no_dingtalk_secret_or_ticket() {
    const SECRET: &str = "LOCKTEST-dingtalk-client-secret";
    let fake = FakeDingTalk::start(vec![FakeRobot {
        client_id: "dingada".into(),
        client_secret: SECRET.into(),
        robot_code: "dingada".into(),
        name: "Ada".into(),
        dingtalk_id: "$:LWCP_v1:$Ada==".into(),
    }])
    .await;
    let dingtalk = format!(
        "platform = \"dingtalk\"\ndingtalk = {{ client_id = \"dingada\", client_secret_env = \"LOCK_DINGTALK_SECRET\", robot_code = \"dingada\", conversation_id = \"cidLOCKTEST==\", api_base_url = \"{}\" }}",
        fake.base_url
    );
    let mesh = at_trace(
        &dingtalk,
        &[("LOCK_DINGTALK_SECRET", SECRET)],
        "trace",
        "dingtalk stream connected",
    )
    .await;
    // The one-time ticket travels in the connection URL's query.
    assert_holds_none(&stop(mesh), &[SECRET, "ticket="]);
}

#[tokio::test]
async fn the_log_at_trace_holds_no_feishu_secret_or_connection_keys() {
    const APP_SECRET: &str = "LOCKTEST-feishu-app-secret";
    let fake = FakeFeishu::start(FakeApp {
        app_id: "cli_a1b2c3d4e5f6lock".into(),
        app_secret: APP_SECRET.into(),
        bot_open_id: "ou_84aad35d084aa403a838cf73ee18467".into(),
        app_name: "Ada".into(),
        expire: 7200,
    })
    .await;
    let feishu = format!(
        "platform = \"feishu\"\nfeishu = {{ open_id = \"ou_84aad35d084aa403a838cf73ee18467\", app_id = \"cli_a1b2c3d4e5f6lock\", app_secret_env = \"LOCK_FEISHU_SECRET\", base_url = \"{}\", chat_id = \"oc_lock\" }}",
        fake.base_url
    );
    let mesh = at_trace(
        &feishu,
        &[("LOCK_FEISHU_SECRET", APP_SECRET)],
        "trace",
        "feishu long connection open",
    )
    .await;
    // The connection URL carries an access key and a ticket in its query.
    assert_holds_none(&stop(mesh), &[APP_SECRET, "access_key=", "ticket="]);
}

/// The page of another site: the attack of issue 26, as a real browser runs it, on the
/// API at `api`. Sets `window.done` once every request has settled.
fn attacking_page(api: &str) -> String {
    format!(
        r#"<!doctype html><title>elsewhere</title><script>
const api = "{api}";
Promise.allSettled([
  fetch(api + "/v1/quiet", {{method: "POST", mode: "no-cors", body: '{{"quiet":true}}'}}),
  fetch(api + "/v1/messages", {{method: "POST", mode: "no-cors",
    headers: {{"Content-Type": "text/plain"}}, body: '{{"text":"forged","from":"alice"}}'}}),
  fetch(api + "/v1/reload", {{method: "POST", mode: "no-cors"}}),
]).then(() => {{ window.done = true; }});
</script>"#
    )
}

#[tokio::test]
async fn a_page_on_another_site_in_a_real_browser_cannot_drive_the_api() {
    if let Err(why) = botmesh_tests::webdriver::binaries() {
        if botmesh_tests::webdriver::skip_or_fail(&why) {
            return;
        }
    }
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A"])).await;
    let page = attacking_page(&mesh.api(0));
    let elsewhere = botmesh_tests::serve::serve_http(move |_req| {
        let page = page.clone();
        async move {
            let mut r = botmesh_tests::serve::Reply::new(page.into());
            r.headers_mut()
                .insert("content-type", "text/html".parse().unwrap());
            r
        }
    })
    .await;
    let b = botmesh_tests::webdriver::Browser::start(800, 600)
        .await
        .expect("start chromedriver + chromium");
    b.goto(&format!("{}/", elsewhere.url())).await.unwrap();
    let (_, done) = b
        .poll(
            "return window.done === true;",
            Duration::from_secs(10),
            |v| v == true,
        )
        .await
        .unwrap();
    assert!(done, "the page's requests never settled");
    assert!(
        !is_quiet(&mesh).await,
        "a page elsewhere switched the bot quiet"
    );
    assert!(
        mesh.transcript(0).await.is_empty(),
        "a page elsewhere posted"
    );
    let m = mesh.metrics(0).await;
    assert_eq!(
        botmesh_tests::metric(&m, "botmesh_api_requests_total{result=\"bad_origin\"}"),
        3.0,
        "each request refused on its Origin:\n{m}"
    );
    b.quit().await.ok();
    mesh.shutdown().await;
}
