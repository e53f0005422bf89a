//! Test support: start real botmesh meshes on 127.0.0.1, talk HTTP to them.
//!
//! `TestMesh::start(spec)` binds every node's listeners on port 0 first, writes a real
//! peers.toml naming those addresses (keys in files, as an operator would), then starts
//! the nodes in-process. Nodes can be stopped and restarted on the same ports.

pub mod acp_standin;
pub mod command;
pub mod fake_dingtalk;
pub mod fake_discord;
pub mod fake_feishu;
pub mod fake_llm;
pub mod fake_onebot;
pub mod fake_slack;
pub mod fake_telegram;
pub mod fake_wecom;
pub mod faults;
pub mod log_check;
pub mod openmetrics;
pub mod redis_server;
pub mod sdk_client;
pub mod serve;
pub mod synapse;
pub mod transcript;
pub mod webdriver;

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use botmesh::app::lifecycle::RunningNode;
use botmesh::config::{NodeConfig, Settings};
use botmesh::wire::envelope::Envelope;
use botmesh::wire::signing::{HmacSecret, Signer, SigningKey};
use tokio::net::TcpListener;

pub use transcript::{bot_msgs, show};

/// How bots sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Per-bot Ed25519 keys.
    Ed25519,
    /// One mesh-wide HMAC secret.
    Hmac,
}

/// One bot of a test mesh.
#[derive(Debug, Clone)]
pub struct BotSpec {
    /// Name.
    pub name: String,
    /// Extra TOML lines for its `[[bots]]` entry (aliases, role, delays, …).
    pub extra: String,
}

impl BotSpec {
    /// A bot with defaults.
    pub fn new(name: &str) -> Self {
        BotSpec {
            name: name.into(),
            extra: String::new(),
        }
    }
    /// Adds TOML lines to the entry.
    pub fn with(mut self, toml: &str) -> Self {
        self.extra.push_str(toml);
        self.extra.push('\n');
        self
    }
}

/// A whole test mesh's shape.
#[derive(Debug, Clone)]
pub struct MeshSpec {
    /// Its bots.
    pub bots: Vec<BotSpec>,
    /// Extra `[mesh]` lines.
    pub mesh: String,
    /// Extra top-level TOML (e.g. an `[llm]` table).
    pub top: String,
    /// Signing scheme.
    pub scheme: Scheme,
    /// Environment variables the nodes' secrets are read from.
    pub env: std::collections::HashMap<String, String>,
    /// Per-node views of the network: (from, to, url) = bot `from` reaches bot `to`'s
    /// bridge at `url` (a test proxy it can break), everyone else directly.
    pub routes: Vec<(String, String, String)>,
}

impl MeshSpec {
    /// `names` with default settings, Ed25519 keys, fast retries.
    pub fn new(names: &[&str]) -> Self {
        MeshSpec {
            bots: names.iter().map(|n| BotSpec::new(n)).collect(),
            mesh: String::new(),
            top: String::new(),
            scheme: Scheme::Ed25519,
            env: Default::default(),
            routes: Vec::new(),
        }
    }
    /// `names` answering only when mentioned (`participation = "mentions"`), so a test
    /// of transport or security sees only the messages it sends itself.
    ///
    /// Exists because most tests that are not about turn-taking start from this spec.
    pub fn mentions_only(names: &[&str]) -> Self {
        MeshSpec::new(names).all_bots("participation = \"mentions\"")
    }
    /// Makes bot `from` reach bot `to` through `url` (e.g. a [`faults::LinkProxy`]).
    pub fn route(mut self, from: &str, to: &str, url: &str) -> Self {
        self.routes.push((from.into(), to.into(), url.into()));
        self
    }
    /// Adds `[mesh]` lines.
    pub fn mesh(mut self, toml: &str) -> Self {
        self.mesh.push_str(toml);
        self.mesh.push('\n');
        self
    }
    /// Points every bot at an OpenAI-compatible server.
    pub fn llm(self, base_url: &str) -> Self {
        self.llm_with(base_url, "timeout_ms = 3000")
    }
    /// Like [`MeshSpec::llm`] with extra `[llm]` lines.
    pub fn llm_with(mut self, base_url: &str, extra: &str) -> Self {
        self.top.push_str(&format!(
            "[llm]\nbase_url = \"{base_url}\"\nmodel = \"test-model\"\n{extra}\n"
        ));
        self
    }
    /// Adds the same TOML lines to every bot.
    pub fn all_bots(mut self, toml: &str) -> Self {
        for b in &mut self.bots {
            b.extra.push_str(toml);
            b.extra.push('\n');
        }
        self
    }
    /// Changes a bot's entry.
    pub fn bot(mut self, name: &str, toml: &str) -> Self {
        let b = self
            .bots
            .iter_mut()
            .find(|b| b.name == name)
            .expect("bot in spec");
        b.extra.push_str(toml);
        b.extra.push('\n');
        self
    }
}

/// Logs to the test output once per process (`BOTMESH_LOG=debug` for more).
pub fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("BOTMESH_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// A running mesh.
pub struct TestMesh {
    /// Holds peers.toml, keys and data folders.
    pub dir: tempfile::TempDir,
    /// peers.toml.
    pub config_path: PathBuf,
    /// The validated settings.
    pub settings: Settings,
    /// Each bot's node (None while stopped).
    pub nodes: Vec<Option<RunningNode>>,
    /// Each bot's bridge address.
    pub bridges: Vec<std::net::SocketAddr>,
    /// Each bot's API address.
    pub apis: Vec<std::net::SocketAddr>,
    /// Each bot's signer (to forge or replay in tests).
    pub signers: Vec<Signer>,
    /// Environment variables the nodes' secrets are read from.
    pub env: std::collections::HashMap<String, String>,
    /// A plain HTTP client.
    pub http: reqwest::Client,
    /// Per-node bridge URLs (see [`MeshSpec::route`]).
    pub routes: Vec<(String, String, String)>,
}

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0")
}

impl TestMesh {
    /// Writes peers.toml and starts every node.
    pub async fn start(spec: MeshSpec) -> TestMesh {
        init_logs();
        use_sandbox_launcher();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bridges_l = Vec::new();
        let mut apis_l = Vec::new();
        for _ in &spec.bots {
            bridges_l.push(bind().await);
            apis_l.push(bind().await);
        }
        let bridges: Vec<_> = bridges_l.iter().map(|l| l.local_addr().unwrap()).collect();
        let apis: Vec<_> = apis_l.iter().map(|l| l.local_addr().unwrap()).collect();
        let mut toml = String::from("[mesh]\ngroup = \"demo\"\ndata_dir = \"data\"\nretry_base_ms = 50\nretry_max_ms = 500\nshutdown_grace_secs = 2\n");
        let mut signers = Vec::new();
        if spec.scheme == Scheme::Hmac {
            let secret = HmacSecret::generate();
            std::fs::write(dir.path().join("mesh.secret"), secret.to_whsec()).unwrap();
            toml.push_str("secret_file = \"mesh.secret\"\n");
            for _ in &spec.bots {
                signers.push(Signer {
                    hmac: vec![secret.clone()],
                    ed25519: vec![],
                    pairwise: Default::default(),
                });
            }
        }
        toml.push_str(&spec.mesh);
        toml.push('\n');
        toml.push_str(&spec.top);
        toml.push('\n');
        for (i, b) in spec.bots.iter().enumerate() {
            toml.push_str(&format!(
                "[[bots]]\nname = \"{}\"\nbridge = \"{}\"\napi = \"{}\"\n",
                b.name, bridges[i], apis[i]
            ));
            if spec.scheme == Scheme::Ed25519 {
                let key = SigningKey::generate();
                let file = format!("{}.key", b.name.to_lowercase());
                std::fs::write(dir.path().join(&file), key.to_whsk()).unwrap();
                toml.push_str(&format!(
                    "public_key = \"{}\"\nprivate_key_file = \"{file}\"\n",
                    key.public_key().to_whpk()
                ));
                // Signs as an older sender would: `v1a` only, no pairwise entry.
                signers.push(Signer {
                    hmac: vec![],
                    ed25519: vec![key],
                    pairwise: Default::default(),
                });
            }
            toml.push_str(&b.extra);
            toml.push('\n');
        }
        let config_path = dir.path().join("peers.toml");
        std::fs::write(&config_path, &toml).unwrap();
        let settings =
            Settings::load_with_env(&config_path, &[]).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let mut mesh = TestMesh {
            dir,
            config_path,
            settings,
            nodes: Vec::new(),
            bridges,
            apis,
            signers,
            http,
            env: spec.env.clone(),
            routes: spec.routes.clone(),
        };
        for (b, a) in bridges_l.into_iter().zip(apis_l) {
            let i = mesh.nodes.len();
            let node = mesh.start_node(i, b, a).await;
            mesh.nodes.push(Some(node));
        }
        mesh
    }

    async fn start_node(&self, i: usize, bridge: TcpListener, api: TcpListener) -> RunningNode {
        let name = &self.settings.bots[i].name;
        let mut settings = self.settings.clone();
        for (from, to, url) in &self.routes {
            if from == name {
                let b = settings.bots.iter_mut().find(|b| &b.name == to);
                b.expect("routed bot").bridge_url = Some(url.clone());
            }
        }
        let cfg = NodeConfig::resolve(settings, name, None, &self.env).expect("resolve");
        let running = botmesh::app::lifecycle::start(cfg, bridge, api)
            .await
            .expect("start node");
        // A reload reads the node's secrets where it was resolved from.
        running
            .node
            .set_reload_secrets(std::sync::Arc::new(self.env.clone()));
        running
    }

    /// Index of bot `name`.
    pub fn index(&self, name: &str) -> usize {
        self.settings
            .bots
            .iter()
            .position(|b| b.name == name)
            .expect("bot")
    }

    /// The running node `i`.
    pub fn node(&self, i: usize) -> &RunningNode {
        self.nodes[i].as_ref().expect("node running")
    }

    /// Local API base URL of node `i`.
    pub fn api(&self, i: usize) -> String {
        format!("http://{}", self.apis[i])
    }

    /// Bridge base URL of node `i`.
    pub fn bridge(&self, i: usize) -> String {
        format!("http://{}", self.bridges[i])
    }

    /// Stops node `i` gracefully.
    pub async fn stop(&mut self, i: usize) {
        if let Some(n) = self.nodes[i].take() {
            n.shutdown().await;
        }
    }

    /// Starts node `i` again on its old ports and data.
    pub async fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "stop it first");
        let b = rebind(self.bridges[i]).await;
        let a = rebind(self.apis[i]).await;
        let n = self.start_node(i, b, a).await;
        self.nodes[i] = Some(n);
    }

    /// Posts a human message at node `i`; returns its id.
    pub async fn post_human(&self, i: usize, from: &str, text: &str) -> String {
        let r = self
            .http
            .post(format!("{}/v1/messages", self.api(i)))
            .json(&serde_json::json!({"text": text, "from": from}))
            .send()
            .await
            .expect("post");
        let status = r.status();
        let v: serde_json::Value = r.json().await.expect("json");
        assert!(status.is_success(), "post failed: {status} {v}");
        v["id"].as_str().expect("id").to_string()
    }

    /// Node `i`'s transcript of the default group, via the API.
    pub async fn transcript(&self, i: usize) -> Vec<Envelope> {
        let v = fetch_json(self.http.get(format!(
            "{}/v1/transcript?group=demo&limit=2000",
            self.api(i)
        )))
        .await;
        serde_json::from_value(v["messages"].clone()).expect("envelopes")
    }

    /// Waits (up to `timeout`) until `cond` holds for node `i`'s transcript.
    pub async fn wait_transcript(
        &self,
        i: usize,
        timeout: Duration,
        cond: impl Fn(&[Envelope]) -> bool,
    ) -> Vec<Envelope> {
        wait_for(
            timeout,
            Duration::from_millis(25),
            || self.transcript(i),
            |t| cond(t),
        )
        .await
    }

    /// Waits (up to `within`) until node `i`'s transcript holds `n` bot messages, and
    /// returns it (as last seen, for the caller's assertion).
    pub async fn bot_messages(&self, i: usize, n: usize, within: Duration) -> Vec<Envelope> {
        wait_for(
            within,
            Duration::from_millis(50),
            || self.transcript(i),
            |t: &Vec<Envelope>| bot_msgs(t).len() >= n,
        )
        .await
    }

    /// Node `i`'s transcript once it has not grown for `quiet` (waiting at most 30 s).
    ///
    /// Exists because tests that check nothing more happens (no second answer, no
    /// answer at all) wait for the mesh to fall silent; the one bounded loop for it.
    pub async fn settle(&self, i: usize, quiet: Duration) -> Vec<Envelope> {
        let last = std::cell::Cell::new((usize::MAX, tokio::time::Instant::now()));
        wait_for(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || self.transcript(i),
            |t: &Vec<Envelope>| {
                let (len, since) = last.get();
                if t.len() != len {
                    last.set((t.len(), tokio::time::Instant::now()));
                    false
                } else {
                    since.elapsed() >= quiet
                }
            },
        )
        .await
    }

    /// Waits (up to `timeout`) until every outbox of node `i` is empty; true if they are.
    ///
    /// Exists because tests that bring a peer back check, after the transcript, that the
    /// sender has nothing left to send.
    pub async fn wait_outboxes_empty(&self, i: usize, timeout: Duration) -> bool {
        wait_for(
            timeout,
            Duration::from_millis(25),
            || async { self.node(i).node.outboxes.iter().all(|o| o.is_empty()) },
            |empty| *empty,
        )
        .await
    }

    /// Node `i`'s `/healthz`: status and JSON body.
    ///
    /// Exists because several tests check a node's health, some waiting for it to change.
    pub async fn health(&self, i: usize) -> (u16, serde_json::Value) {
        let r = self
            .http
            .get(format!("{}/healthz", self.api(i)))
            .send()
            .await
            .expect("healthz");
        let status = r.status().as_u16();
        (status, r.json().await.expect("health JSON"))
    }

    /// Nodes `a`'s and `b`'s `/healthz` once both answer 503 (each stopped its
    /// platform), else their last answers after `within`, for the caller's assertions.
    pub async fn health_once_both_stopped(
        &self,
        a: usize,
        b: usize,
        within: Duration,
    ) -> ((u16, serde_json::Value), (u16, serde_json::Value)) {
        wait_for(
            within,
            Duration::from_millis(50),
            || async { (self.health(a).await, self.health(b).await) },
            |(x, y)| (x.0, y.0) == (503, 503),
        )
        .await
    }

    /// Why node `i`'s platform stopped, as `/healthz` shows it (bounded: 30 s).
    pub async fn platform_stopped(&self, i: usize) -> String {
        let (_, body) = wait_for(
            Duration::from_secs(30),
            Duration::from_millis(100),
            || self.health(i),
            |(_, body)| body["platform_stopped"].is_string(),
        )
        .await;
        match body["platform_stopped"].as_str() {
            Some(why) => why.to_string(),
            None => panic!("the platform never stopped: {body:#}"),
        }
    }

    /// Metrics text of node `i`.
    pub async fn metrics(&self, i: usize) -> String {
        fetch_text(self.http.get(format!("{}/metrics", self.api(i)))).await
    }

    /// Node `i`'s metrics text once `series` counts at least `least`, polled (bounded,
    /// `within`): a count a node makes after the test's last request (a receipt, a
    /// delivery) may come a moment later.
    pub async fn wait_metric(
        &self,
        i: usize,
        series: &str,
        least: f64,
        within: Duration,
    ) -> String {
        wait_for(
            within,
            Duration::from_millis(50),
            || self.metrics(i),
            |m: &String| metric(m, series) >= least,
        )
        .await
    }

    /// Node `i`'s count of decisions `action`/`reason` (see [`decisions`]), for tests
    /// that check one count without keeping the metrics text.
    pub async fn decisions(&self, i: usize, action: &str, reason: &str) -> f64 {
        decisions(&self.metrics(i).await, action, reason)
    }

    /// Stops everything.
    pub async fn shutdown(mut self) {
        for i in 0..self.nodes.len() {
            self.stop(i).await;
        }
    }
}

/// Asks `probe` every `every` until `done` holds of its answer or `within` has passed,
/// and returns the last answer, so the caller's assertion shows what was last seen.
///
/// Exists because what these tests check arrives eventually (over a bridge, a stream,
/// a restart): every bounded wait for it is this one loop rather than a copy per test.
pub async fn wait_for<T, Fut>(
    within: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Fut,
    done: impl Fn(&T) -> bool,
) -> T
where
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let answer = probe().await;
        if done(&answer) || tokio::time::Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(every).await;
    }
}

/// Sends `request` and reads the answer as JSON, panicking if either fails.
///
/// Exists because tests read many JSON answers from the nodes' APIs and spelled out
/// this send-then-parse chain at each one.
pub async fn fetch_json(request: reqwest::RequestBuilder) -> serde_json::Value {
    request
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("a JSON answer")
}

/// Sends `request` and reads the answer as text, panicking if either fails: the text
/// twin of [`fetch_json`], for pages and metrics.
pub async fn fetch_text(request: reqwest::RequestBuilder) -> String {
    request
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("a text answer")
}

/// Re-binds a port that was just released (retries briefly).
pub async fn rebind(addr: std::net::SocketAddr) -> TcpListener {
    wait_for(
        Duration::from_secs(2),
        Duration::from_millis(20),
        || TcpListener::bind(addr),
        Result::is_ok,
    )
    .await
    .unwrap_or_else(|e| panic!("could not re-bind {addr}: {e}"))
}

/// The count of decisions `action`/`reason` (`botmesh_decisions_total`) in Prometheus
/// text (0 when absent).
///
/// Exists because the turn-taking tests read this one counter family again and again.
pub fn decisions(metrics: &str, action: &str, reason: &str) -> f64 {
    metric(
        metrics,
        &format!("botmesh_decisions_total{{action=\"{action}\",reason=\"{reason}\"}}"),
    )
}

/// 127.0.0.`n`: on Linux every 127.x address is the loopback, so a client bound to one
/// is a source address of its own to a node.
///
/// Exists because the flood tests send from several source addresses at once.
pub fn loopback(n: u8) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, n))
}

/// An HTTP client that sends from `from` and keeps no idle connection (so a node's
/// `botmesh_open_connections` counts only what a test holds open).
///
/// Exists because the flood tests need a peer at an address of its own.
pub fn client_from(from: std::net::IpAddr) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(from)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Reads one counter value out of Prometheus text (0 when absent).
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Why a node stopped its platform, from its `/healthz` answer `health` (status and
/// body), asserting it is the 503 a stopped platform gives.
#[track_caller]
pub fn platform_stopped(health: &(u16, serde_json::Value)) -> &str {
    assert_eq!(health.0, 503, "{health:?}");
    health.1["platform_stopped"]
        .as_str()
        .unwrap_or_else(|| panic!("no platform_stopped in {health:?}"))
}

/// Asserts that `series` in the Prometheus `text` is `want`, showing the text if not.
#[track_caller]
pub fn assert_metric(text: &str, series: &str, want: f64) {
    assert_eq!(metric(text, series), want, "{series} in {text}");
}

/// Asserts that `series` in the Prometheus `text` is at least `least`.
#[track_caller]
pub fn assert_metric_at_least(text: &str, series: &str, least: f64) {
    let got = metric(text, series);
    assert!(got >= least, "{series} is {got}, under {least}, in {text}");
}

/// The test venv's Python (`BOTMESH_TEST_PYTHON`, made by scripts/test.sh with
/// tests/requirements.txt), for the stand-ins written with official SDKs.
///
/// Exists because the ACP tests (the library's and the reply engine's) run the same
/// stand-in with it.
pub fn test_python() -> String {
    std::env::var("BOTMESH_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "BOTMESH_TEST_PYTHON is not set: run scripts/test.sh, which creates .venv-test/ \
             with tests/requirements.txt (agent-client-protocol) and exports it"
        )
    })
}

/// The scripted ACP agent tests/py/acp_agent.py (what each prompt makes it do is
/// listed at its top).
pub fn acp_standin_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("py/acp_agent.py")
        .display()
        .to_string()
}

/// The folder of the scripted stand-ins (tests/py), which a boxed stand-in agent must
/// be able to read: `sandbox = { read = [<this>] }`.
pub fn standin_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("py")
        .display()
        .to_string()
}

/// Tells the nodes this test process starts in-process where the botmesh binary that
/// boxes their agents is (`BOTMESH_SANDBOX_LAUNCHER`: the running executable is the
/// test binary), once, when it is built (a test without agents does not need it).
pub fn use_sandbox_launcher() {
    static SET: Once = Once::new();
    SET.call_once(|| {
        let exe = std::env::current_exe().expect("current exe");
        let bin = exe
            .parent()
            .and_then(|d| d.parent())
            .map(|d| d.join("botmesh"));
        if let Some(bin) = bin.filter(|b| b.exists()) {
            if std::env::var_os(botmesh::agent::sandbox::LAUNCHER_ENV).is_none() {
                std::env::set_var(botmesh::agent::sandbox::LAUNCHER_ENV, bin);
            }
        }
    });
}

/// The `botmesh` binary built next to the running test (scripts/test.sh builds it first).
pub fn botmesh_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    let bin = dir.join("botmesh");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --bins` (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// `botmesh explain --bot BOT --from FROM --config CONFIG TEXT` with an empty
/// environment (explain needs no running node and no secrets): its JSON answer.
/// Panics, with the command's stderr, when it fails.
pub fn explain_cli(
    config: &std::path::Path,
    bot: &str,
    from: &str,
    text: &str,
) -> serde_json::Value {
    let out = std::process::Command::new(botmesh_bin())
        .args(["explain", "--bot", bot, "--from", from, "--config"])
        .arg(config)
        .arg(text)
        .env_clear()
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "explain --bot {bot} {text:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain prints JSON")
}

/// A signed request ready to POST to a bridge: headers and body.
pub struct SignedRequest {
    /// `webhook-id`.
    pub id: String,
    /// `webhook-timestamp`.
    pub timestamp: String,
    /// `webhook-signature`.
    pub signature: String,
    /// The raw body.
    pub body: Vec<u8>,
}

impl SignedRequest {
    /// Signs `env` with `signer` at `now + skew_secs`.
    pub fn new(signer: &Signer, env: &Envelope, skew_secs: i64) -> Self {
        let body = env.to_bytes();
        let ts = botmesh::wire::signing::unix_now() + skew_secs;
        let id = env.id.to_string();
        SignedRequest {
            signature: signer.sign(&id, ts, &body),
            timestamp: ts.to_string(),
            id,
            body,
        }
    }

    /// POSTs it to `bridge` (base URL); returns status and JSON body.
    pub async fn send(&self, http: &reqwest::Client, bridge: &str) -> (u16, serde_json::Value) {
        let r = http
            .post(format!("{bridge}/bridge/v1/envelopes"))
            .header("webhook-id", &self.id)
            .header("webhook-timestamp", &self.timestamp)
            .header("webhook-signature", &self.signature)
            .header("content-type", "application/json")
            .body(self.body.clone())
            .send()
            .await
            .expect("send");
        let status = r.status().as_u16();
        let v = r.json().await.unwrap_or(serde_json::Value::Null);
        (status, v)
    }
}

/// A fresh message envelope from bot `sender` to group `demo`.
pub fn bot_message(sender: &str, text: &str, depth: u32) -> Envelope {
    use botmesh::wire::envelope::{Author, AuthorKind, Kind};
    Envelope {
        v: 1,
        id: ulid::Ulid::new(),
        kind: Kind::Message,
        group: "demo".into(),
        sender: sender.into(),
        author: Author {
            name: sender.into(),
            kind: AuthorKind::Bot,
        },
        text: text.into(),
        depth,
        reply_to: None,
        root: None,
        platform_msg_id: None,
        person: None,
        sent_at: botmesh::wire::envelope::now_millis(),
        relevance: None,
        why: None,
        verdicts: None,
        turn_end: None,
        replaces: None,
    }
}

/// What an LLM request is about: the message a reply call answers ("Now reply, as
/// …:") or the new message a judge call weighs ("New from …: "), for stand-in LLMs
/// that script by content.
pub fn subject(s: &fake_llm::Seen) -> String {
    let text: String = s
        .messages
        .iter()
        .map(|(_, c)| c.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    if let Some(rest) = text.split("\nNow reply, as ").nth(1) {
        return rest
            .split_once(":\n")
            .map(|(_, t)| t)
            .unwrap_or("")
            .to_string();
    }
    if let Some(rest) = text.split("New from ").last() {
        let rest = rest.split_once(": ").map(|(_, t)| t).unwrap_or("");
        return rest.split("\nSpeak only").next().unwrap_or("").to_string();
    }
    String::new()
}

/// Which bot an LLM request is for: the name after "You are " in its prompt.
pub fn bot_of(seen: &fake_llm::Seen) -> String {
    let text: String = seen
        .messages
        .iter()
        .map(|(_, c)| c.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    text.split("You are ")
        .nth(1)
        .map(|rest| {
            rest.split([' ', ',', '('])
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default()
}

/// True when the request is a drafting judge's call (`judge_drafts`): the only call
/// that streams.
pub fn is_draft(seen: &fake_llm::Seen) -> bool {
    seen.stream
}

/// True when the request is a bot's own judge call (it carries a response schema).
pub fn is_judge(seen: &fake_llm::Seen) -> bool {
    seen.purpose_hint.as_deref() == Some("judge") && shared_judge_bots(seen).is_none()
}

/// For a shared judge call (`[mesh] judge = "shared"`), the bots it asks about (the
/// names after "for: " at the end of its prompt); `None` for any other call.
pub fn shared_judge_bots(seen: &fake_llm::Seen) -> Option<Vec<String>> {
    let prompt = &seen.messages.first()?.1;
    if !prompt.starts_with("Bots in a group chat:") {
        return None;
    }
    let list = prompt.rsplit("for: ").next()?.trim_end_matches('.');
    Some(list.split(", ").map(str::to_string).collect())
}

/// An HTTP forwarder put in front of one node's bridge (via `bridge_url`) that
/// interferes with claim envelopes and forwards everything else untouched. Dropping
/// ([`ClaimProxy::dropping`]): it answers a single-posted claim 200 as if delivered
/// but never forwards it, so the receiving bot never learns of the claim. Holding
/// ([`ClaimProxy::holding`]): it holds any request that carries a claim (single or in
/// a batch) for a while before forwarding it, as a slow or lossy link would make a
/// claim late; the sender's outbox, which sends in order, waits behind it.
pub struct ClaimProxy {
    /// Where the proxy listens (use as the bot's `bridge_url`).
    pub url: String,
    target: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    /// How many claims were swallowed or held.
    pub claims: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _server: serve::HttpServer,
}

/// Whether a request body to a bridge carries a claim: a claim envelope, or a batch
/// with one among its items.
fn carries_claim(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let is_claim = |e: &serde_json::Value| e["kind"] == "claim";
    is_claim(&v)
        || v["items"].as_array().is_some_and(|items| {
            items.iter().any(|i| {
                i["body"]
                    .as_str()
                    .and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok())
                    .is_some_and(|e| is_claim(&e))
            })
        })
}

impl ClaimProxy {
    /// A proxy that swallows single-posted claims; set its target with
    /// [`ClaimProxy::forward_to`].
    pub async fn dropping() -> ClaimProxy {
        ClaimProxy::start(None).await
    }

    /// A proxy that forwards requests carrying a claim only after `hold`.
    pub async fn holding(hold: Duration) -> ClaimProxy {
        ClaimProxy::start(Some(hold)).await
    }

    async fn start(hold: Option<Duration>) -> ClaimProxy {
        let target: std::sync::Arc<std::sync::Mutex<Option<String>>> = Default::default();
        let claims: std::sync::Arc<std::sync::atomic::AtomicUsize> = Default::default();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let (t, d) = (target.clone(), claims.clone());
        let server = serve::serve_http(move |req| {
            let (t, d, client) = (t.clone(), d.clone(), client.clone());
            async move {
                let (parts, body) = serve::read_request(req).await;
                if let Some(hold) = hold.filter(|_| carries_claim(&body)) {
                    d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(hold).await;
                }
                let is_claim = serde_json::from_slice::<serde_json::Value>(&body)
                    .map(|v| v["kind"] == "claim")
                    .unwrap_or(false);
                if is_claim && hold.is_none() {
                    d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return serve::reply(200, &b"{\"accepted\":true}"[..]);
                }
                let base = t.lock().unwrap().clone().expect("proxy target set");
                let mut fwd = client
                    .post(format!("{base}{}", parts.uri.path()))
                    .body(body);
                for (k, v) in parts.headers.iter() {
                    if k.as_str().starts_with("webhook-") || k == "content-type" {
                        fwd = fwd.header(k, v);
                    }
                }
                serve::forward(fwd).await
            }
        })
        .await;
        ClaimProxy {
            url: server.url(),
            target,
            claims,
            _server: server,
        }
    }

    /// Where non-claim traffic goes.
    pub fn forward_to(&self, base_url: &str) {
        *self.target.lock().unwrap() = Some(base_url.to_string());
    }
}

/// A mesh of real `botmesh run` processes, as an operator runs them.
pub struct ProcessMesh {
    /// Holds peers.toml, keys and data.
    pub dir: tempfile::TempDir,
    /// peers.toml.
    pub config: PathBuf,
    /// Bot names, in file order.
    pub names: Vec<String>,
    /// Each bot's local API base URL.
    pub apis: Vec<String>,
    /// Each bot's bridge base URL.
    pub bridges: Vec<String>,
    /// The running processes (None while stopped).
    pub procs: Vec<Option<std::process::Child>>,
    /// A plain HTTP client.
    pub http: reqwest::Client,
    /// The open-file limit (`ulimit -n`) the bots are started with; None: inherited.
    pub open_files_limit: Option<u32>,
    /// The uid (and gid) the bots run as (`setpriv`, no supplementary groups), as in
    /// production; None: the test's own. The test makes its files theirs.
    pub as_user: Option<u32>,
}

impl ProcessMesh {
    /// Writes peers.toml (Ed25519 keys from `botmesh keygen`, free ports, `extra_bot`
    /// lines in every bot entry) and starts every bot.
    pub async fn start(names: &[&str], extra_mesh: &str, extra_bot: &str) -> ProcessMesh {
        let mut mesh = ProcessMesh::configure(names, extra_mesh, extra_bot);
        for i in 0..names.len() {
            mesh.spawn(i).await;
        }
        mesh
    }

    /// [`ProcessMesh::start`] without starting anyone, so a test can change how the
    /// bots are started (e.g. [`ProcessMesh::open_files_limit`]) or start them itself
    /// ([`ProcessMesh::spawn_with`]).
    pub fn configure(names: &[&str], extra_mesh: &str, extra_bot: &str) -> ProcessMesh {
        let dir = tempfile::tempdir().unwrap();
        // Every listener is held until all ports are chosen: a port let go at once can
        // be handed out again by the next bind, and two bots (or a bot's bridge and its
        // API) would then be configured on one port.
        let mut held = Vec::new();
        let mut free = || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            held.push(listener);
            port
        };
        let mut toml = format!("[mesh]\ndata_dir = \"data\"\nshutdown_grace_secs = 2\nretry_base_ms = 50\nretry_max_ms = 500\n{extra_mesh}\n");
        let (mut apis, mut bridges) = (Vec::new(), Vec::new());
        for name in names {
            let key = format!("{}.key", name.to_lowercase());
            let out = std::process::Command::new(botmesh_bin())
                .args(["keygen", "--private-out"])
                .arg(dir.path().join(&key))
                .output()
                .unwrap();
            let public = String::from_utf8(out.stdout).unwrap().trim().to_string();
            let (bridge, api) = (free(), free());
            toml.push_str(&format!(
                "[[bots]]\nname = \"{name}\"\nbridge = \"127.0.0.1:{bridge}\"\napi = \"127.0.0.1:{api}\"\npublic_key = \"{public}\"\nprivate_key_file = \"{key}\"\n{extra_bot}\n"
            ));
            apis.push(format!("http://127.0.0.1:{api}"));
            bridges.push(format!("http://127.0.0.1:{bridge}"));
        }
        drop(held);
        let config = dir.path().join("peers.toml");
        std::fs::write(&config, toml).unwrap();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        ProcessMesh {
            dir,
            config,
            names: names.iter().map(|s| s.to_string()).collect(),
            apis,
            bridges,
            procs: names.iter().map(|_| None).collect(),
            http,
            open_files_limit: None,
            as_user: None,
        }
    }

    /// Starts bot `i` and waits until it is healthy.
    pub async fn spawn(&mut self, i: usize) {
        self.spawn_with(i, &[]).await;
    }

    /// [`ProcessMesh::spawn`] with more environment variables (its secrets, or
    /// `BOTMESH_LOG`, `info` otherwise).
    pub async fn spawn_with(&mut self, i: usize, env: &[(&str, &str)]) {
        assert!(self.procs[i].is_none());
        let log =
            std::fs::File::create(self.dir.path().join(format!("{}.log", self.names[i]))).unwrap();
        let mut command = match (self.open_files_limit, self.as_user) {
            (_, Some(uid)) => {
                // A copy in the mesh's folder: the checkout may sit in a folder only
                // root can enter (/root), where `uid` could not start the binary.
                let bin = self.dir.path().join("botmesh");
                if !bin.exists() {
                    std::fs::copy(botmesh_bin(), &bin).expect("copy botmesh for the user");
                }
                let mut setpriv = std::process::Command::new("setpriv");
                setpriv
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .args(["--clear-groups", "--"])
                    .arg(bin);
                setpriv
            }
            (None, None) => std::process::Command::new(botmesh_bin()),
            (Some(n), None) => {
                let mut sh = std::process::Command::new("sh");
                sh.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(botmesh_bin());
                sh
            }
        };
        let child = command
            .args(["run", "--bot", &self.names[i], "--config"])
            .arg(&self.config)
            .env("BOTMESH_LOG", "info")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs[i] = Some(child);
        let healthy = wait_for(
            Duration::from_secs(10),
            Duration::from_millis(25),
            || self.health(i),
            |status| *status == Some(200),
        )
        .await;
        assert!(
            healthy == Some(200),
            "{} never became healthy:\n{}",
            self.names[i],
            self.log(i)
        );
    }

    /// Bot `i`'s `/healthz` status, None while it does not answer: what a wait for a
    /// started process polls.
    pub async fn health(&self, i: usize) -> Option<u16> {
        let r = self
            .http
            .get(format!("{}/healthz", self.apis[i]))
            .send()
            .await
            .ok()?;
        Some(r.status().as_u16())
    }

    /// Bot `i`'s `/metrics` text.
    pub async fn metrics(&self, i: usize) -> String {
        self.http
            .get(format!("{}/metrics", self.apis[i]))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// Whether bot `i`'s process is started and has not exited.
    pub fn running(&mut self, i: usize) -> bool {
        self.procs[i]
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Posts `text` as `from` at node `i` (its bot's own message when `from` is the
    /// bot) and asserts the node accepted it.
    pub async fn post_from(&self, i: usize, from: &str, text: &str) {
        let r = self
            .http
            .post(format!("{}/v1/messages", self.apis[i]))
            .json(&serde_json::json!({"text": text, "from": from}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }

    /// Bot `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{}.log", self.names[i])))
            .unwrap_or_default()
    }

    /// `kill -9`: no shutdown, no flush.
    pub fn kill9(&mut self, i: usize) {
        let mut c = self.procs[i].take().expect("running");
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn terminate(&mut self, i: usize) -> std::process::ExitStatus {
        let mut c = self.procs[i].take().expect("running");
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        c.wait().unwrap()
    }

    /// Posts a human message at bot `i`; the id when accepted, None when refused or down.
    pub async fn post(&self, i: usize, text: &str) -> Option<String> {
        let r = self
            .http
            .post(format!("{}/v1/messages", self.apis[i]))
            .json(&serde_json::json!({"text": text, "from": "alice"}))
            .send()
            .await
            .ok()?;
        if !r.status().is_success() {
            return None;
        }
        let v: serde_json::Value = r.json().await.ok()?;
        v["id"].as_str().map(str::to_string)
    }

    /// Ids in bot `i`'s transcript of the default group, in order.
    pub async fn ids(&self, i: usize) -> Vec<String> {
        let v = fetch_json(
            self.http
                .get(format!("{}/v1/transcript?limit=2000", self.apis[i])),
        )
        .await;
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    }

    /// Waits (up to `timeout`) until `cond` holds for the ids in bot `i`'s transcript:
    /// [`TestMesh::wait_transcript`] for processes, which the crash and process tests
    /// used to write out as loops.
    pub async fn wait_ids(
        &self,
        i: usize,
        timeout: Duration,
        cond: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        wait_for(
            timeout,
            Duration::from_millis(25),
            || self.ids(i),
            |ids| cond(ids),
        )
        .await
    }
}

impl Drop for ProcessMesh {
    fn drop(&mut self) {
        for c in self.procs.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
