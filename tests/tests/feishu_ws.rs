//! Feishu's long connection end to end.
//!
//! First the stand-in is proven faithful: the official `lark-oapi` Python SDK's
//! `lark.ws.Client` (from the test venv, `BOTMESH_TEST_PYTHON`) connects to the fake,
//! receives a whole and a fragmented event and acknowledges both. Only then is
//! botmesh's own client tested against the same fake: a real node with
//! `mode = "long_connection"` (no Verification Token, no Encrypt Key, no public
//! address) connects, records and acknowledges events, reassembles fragments,
//! records a redelivered event once, comes back after a dropped socket without
//! losing an acknowledged (or unacknowledged) event, and retries a refused handshake.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use botmesh::app::lifecycle::RunningNode;
use botmesh::config::{NodeConfig, Settings};
use botmesh::wire::envelope::Envelope;
use botmesh::wire::signing::HmacSecret;
use botmesh_tests::fake_feishu::ids::{ALICE, CHAT, ERGOZ_IN_XIAOBAS_APP, XIAOBA_OPEN_ID};
use botmesh_tests::fake_feishu::{message_event, FakeApp, FakeFeishu, MessageSpec, Refusal};
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::openmetrics::parse_openmetrics;
use botmesh_tests::{assert_metric, init_logs, metric};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpListener;

const APP_ID: &str = "cli_a1b2c3d4e5f60002";
const APP_SECRET: &str = "ws-app-secret-for-tests";
const WAIT: Duration = Duration::from_secs(20);
/// How long the official SDK may take to start and connect (bounded; a Python import
/// of lark_oapi is slow on a busy machine).
const SDK_START: Duration = Duration::from_secs(90);

fn fake_app() -> FakeApp {
    FakeApp {
        app_id: APP_ID.into(),
        app_secret: APP_SECRET.into(),
        bot_open_id: XIAOBA_OPEN_ID.into(),
        app_name: "XiaoBa".into(),
        expire: 7200,
    }
}

/// A person's message in the team chat, as the long connection carries it.
fn human_event(event_id: &str, message_id: &str, text: &str) -> Value {
    message_event(&MessageSpec::person(
        (APP_ID, "", CHAT),
        ALICE,
        (event_id, message_id),
        text,
    ))
}

// ---------------------------------------------------------------------------------
// The stand-in, proven by the official SDK
// ---------------------------------------------------------------------------------

const SDK_SCRIPT: &str = r#"
import json, sys
import lark_oapi as lark

app_id, app_secret, domain = sys.argv[1], sys.argv[2], sys.argv[3]

def on_message(data):
    m = data.event.message
    print(json.dumps({"message_id": m.message_id, "text": json.loads(m.content)["text"],
                      "event_id": data.header.event_id}), flush=True)

handler = lark.EventDispatcherHandler.builder("", "").register_p2_im_message_receive_v1(on_message).build()
client = lark.ws.Client(app_id, app_secret, event_handler=handler, domain=domain,
                        log_level=lark.LogLevel.DEBUG)
print("starting", flush=True)
client.start()
"#;

/// lark-oapi's API client against the stand-in: it sends a text message to a chat
/// (`im.v1.message.create`) and edits it (`im.v1.message.update`, the "edit message"
/// call a status message uses), and prints what the stand-in answered.
const SDK_EDIT_SCRIPT: &str = r#"
import json, sys
import lark_oapi as lark
from lark_oapi.api.im.v1 import (CreateMessageRequest, CreateMessageRequestBody,
                                 UpdateMessageRequest, UpdateMessageRequestBody)

app_id, app_secret, domain, chat = sys.argv[1:5]
client = lark.Client.builder().app_id(app_id).app_secret(app_secret).domain(domain).build()
created = client.im.v1.message.create(CreateMessageRequest.builder().receive_id_type("chat_id")
    .request_body(CreateMessageRequestBody.builder().receive_id(chat).msg_type("text")
        .content(json.dumps({"text": "working"})).build()).build())
print(json.dumps({"created": created.success(), "code": created.code, "msg": created.msg,
                  "id": created.data.message_id if created.success() else None}), flush=True)
updated = client.im.v1.message.update(UpdateMessageRequest.builder().message_id(created.data.message_id)
    .request_body(UpdateMessageRequestBody.builder().msg_type("text")
        .content(json.dumps({"text": "done in 3s"})).build()).build())
print(json.dumps({"updated": updated.success(), "code": updated.code, "msg": updated.msg,
                  "id": updated.data.message_id if updated.success() else None,
                  "edited": updated.data.updated if updated.success() else None}), flush=True)
"#;

#[tokio::test]
async fn official_sdk_sends_and_edits_a_message_on_the_fake() {
    init_logs();
    let python = botmesh_tests::test_python();
    let fake = FakeFeishu::start(fake_app()).await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sdk_edit.py");
    std::fs::write(&script, SDK_EDIT_SCRIPT).unwrap();
    // Importing lark-oapi alone takes seconds (tens on a loaded machine).
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        botmesh_tests::sdk_client::loopback_command(&python)
            .arg(&script)
            .args([APP_ID, APP_SECRET, &fake.base_url, CHAT])
            .output(),
    )
    .await
    .expect("the SDK finishes")
    .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}\n{stderr}");
    assert_eq!(lines[0]["created"], true, "{stdout}");
    assert_eq!(lines[1]["updated"], true, "{stdout}");
    assert_eq!(lines[1]["id"], lines[0]["id"]);
    assert_eq!(
        lines[1]["edited"], true,
        "the SDK read `updated` as the edit"
    );
    let sent = fake.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (
            sent[0].text.as_str(),
            sent[0].edits,
            sent[0].receive_id.as_str()
        ),
        ("done in 3s", 1, CHAT)
    );
}

#[tokio::test]
async fn official_sdk_receives_events_from_the_fake() {
    init_logs();
    let python = std::env::var("BOTMESH_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("BOTMESH_TEST_PYTHON is not set: scripts/test.sh creates .venv-test from tests/requirements.txt (lark-oapi) and exports it; by hand: python3 -m venv /tmp/v && /tmp/v/bin/pip install -r tests/requirements.txt && BOTMESH_TEST_PYTHON=/tmp/v/bin/python cargo test -p botmesh-tests --test feishu_ws")
    });
    let fake = FakeFeishu::start(fake_app()).await;
    fake.set_client_config(serde_json::json!({"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 1}));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sdk_client.py");
    std::fs::write(&script, SDK_SCRIPT).unwrap();
    let mut child = botmesh_tests::sdk_client::loopback_command(&python)
        .arg(&script)
        .args([APP_ID, APP_SECRET, &fake.base_url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = child.stderr.take().unwrap();
    let sdk_log = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let mut all = String::new();
        while let Ok(Some(l)) = lines.next_line().await {
            all.push_str(&l);
            all.push('\n');
        }
        all
    });

    // The SDK's start: importing lark_oapi alone took 20 s on a loaded 2-core machine.
    let connected = fake.wait_connections(1, SDK_START).await;
    if connected == 0 {
        let _ = child.kill().await;
        panic!(
            "the SDK never connected; its log:\n{}",
            sdk_log.await.unwrap_or_default()
        );
    }
    assert_eq!(
        fake.endpoint_requests(),
        1,
        "the SDK asked the endpoint API"
    );
    let whole = fake.push_event(
        &human_event("ev-sdk-1", "om_sdk_1", "hello from the fake"),
        1,
    );
    let long_text = "fragmented ".repeat(40);
    let split = fake.push_event(&human_event("ev-sdk-2", "om_sdk_2", &long_text), 3);
    let acks = fake
        .wait_acks(WAIT, |a| {
            [&whole, &split]
                .iter()
                .all(|m| a.iter().any(|k| &k.message_id == *m && k.code == 200))
        })
        .await;
    let mut received = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while received.len() < 2 && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(500), stdout.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with('{') => {
                received.push(serde_json::from_str::<Value>(&line).unwrap())
            }
            Ok(Ok(None)) | Ok(Err(_)) => break,
            _ => {}
        }
    }
    // Pings: the SDK pings every PingInterval (1 s here); wait for one, bounded.
    let deadline = tokio::time::Instant::now() + WAIT;
    while fake.pings() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill().await;
    let log = sdk_log.await.unwrap_or_default();
    for m in [&whole, &split] {
        let a: Vec<_> = acks.iter().filter(|a| &a.message_id == m).collect();
        assert_eq!(a.len(), 1, "one answer to {m}: {acks:?}\nSDK log:\n{log}");
        assert_eq!(a[0].code, 200, "{acks:?}");
        assert!(a[0].biz_rt.is_some(), "the SDK adds biz_rt: {acks:?}");
    }
    assert_eq!(
        acks.iter()
            .find(|a| a.message_id == split)
            .unwrap()
            .sum
            .as_deref(),
        Some("3"),
        "the answer echoes the (last) fragment's headers"
    );
    assert!(fake.unacked().is_empty(), "{:?}", fake.unacked());
    let texts: Vec<&str> = received
        .iter()
        .map(|r| r["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        vec!["hello from the fake", long_text.as_str()],
        "SDK log:\n{log}"
    );
    assert!(fake.pings() >= 1, "the SDK pinged; log:\n{log}");
}

// ---------------------------------------------------------------------------------
// botmesh's client against the same fake
// ---------------------------------------------------------------------------------

struct Node {
    _dir: tempfile::TempDir,
    settings: Settings,
    env: HashMap<String, String>,
    node: Option<RunningNode>,
    peer: Option<RunningNode>,
    api: SocketAddr,
    peer_api: SocketAddr,
    bridge: SocketAddr,
    http: reqwest::Client,
    fake: FakeFeishu,
    _llm: FakeLlm,
}

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

impl Node {
    /// Pushes Alice's message `text` (event `ev`, message `om`) in one frame: the
    /// fake's id of the push.
    fn say(&self, ev: &str, om: &str, text: &str) -> String {
        self.fake.push_event(&human_event(ev, om, text), 1)
    }

    /// [`Node::say`], then waits (bounded) until the node acknowledged it once.
    async fn say_acked(&self, ev: &str, om: &str, text: &str) -> String {
        let m = self.say(ev, om, text);
        self.fake.wait_acks(WAIT, |a| acked_ok(a, &m) == 1).await;
        m
    }

    /// XiaoBa on Feishu over the long connection (no token, no key), ErGoz local;
    /// `before` prepares the fake before the node connects.
    async fn start(before: impl FnOnce(&FakeFeishu)) -> Node {
        Node::start_with("-", before).await
    }

    /// [`Node::start`] with the LLM answering `reply`.
    async fn start_with(reply: &'static str, before: impl FnOnce(&FakeFeishu)) -> Node {
        init_logs();
        let fake = FakeFeishu::start(fake_app()).await;
        before(&fake);
        let llm = FakeLlm::start(move |_| Script::reply(reply)).await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("mesh.secret"),
            HmacSecret::generate().to_whsec(),
        )
        .unwrap();
        let (b0, a0, b1, a1) = (bind().await, bind().await, bind().await, bind().await);
        let addr = |l: &TcpListener| l.local_addr().unwrap();
        let toml = format!(
            r#"[mesh]
group = "demo"
data_dir = "data"
secret_file = "mesh.secret"
retry_base_ms = 50
retry_max_ms = 500
shutdown_grace_secs = 2

[llm]
base_url = "{llm}"
model = "test-model"
timeout_ms = 3000

[[bots]]
name = "XiaoBa"
bridge = "{b0}"
api = "{a0}"
platform = "feishu"
participation = "mentions"
feishu = {{ open_id = "{XIAOBA_OPEN_ID}", app_id = "{APP_ID}", app_secret_env = "XIAOBA_APP_SECRET", base_url = "{base}", chat_id = "{CHAT}", peer_open_ids = {{ ErGoz = "{ERGOZ_IN_XIAOBAS_APP}" }} }}

[[bots]]
name = "ErGoz"
bridge = "{b1}"
api = "{a1}"
participation = "mentions"
reply_to = "humans"
"#,
            llm = llm.base_url,
            base = fake.base_url,
            b0 = addr(&b0),
            a0 = addr(&a0),
            b1 = addr(&b1),
            a1 = addr(&a1),
        );
        let path = dir.path().join("peers.toml");
        std::fs::write(&path, &toml).unwrap();
        let settings = Settings::load_with_env(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
        let env: HashMap<String, String> = [("XIAOBA_APP_SECRET", APP_SECRET)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (api, bridge, peer_api) = (addr(&a0), addr(&b0), addr(&a1));
        let start = |name: &str, b, a| {
            let cfg = NodeConfig::resolve(settings.clone(), name, None, &env)
                .unwrap_or_else(|e| panic!("{e}"));
            botmesh::app::lifecycle::start(cfg, b, a)
        };
        let node = start("XiaoBa", b0, a0).await.expect("start XiaoBa");
        let peer = start("ErGoz", b1, a1).await.expect("start ErGoz");
        Node {
            settings: settings.clone(),
            env: env.clone(),
            _dir: dir,
            node: Some(node),
            peer: Some(peer),
            api,
            peer_api,
            bridge,
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            fake,
            _llm: llm,
        }
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .http
            .get(format!("http://{}{path}", self.api))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn transcript(&self) -> Vec<Envelope> {
        self.transcript_of(self.api, "demo").await
    }

    async fn transcript_of(&self, api: SocketAddr, group: &str) -> Vec<Envelope> {
        let r = self
            .http
            .get(format!("http://{api}/v1/transcript"))
            .query(&[("group", group), ("limit", "2000")])
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        serde_json::from_value(v["messages"].clone()).unwrap_or_default()
    }

    async fn wait_transcript(&self, cond: impl Fn(&[Envelope]) -> bool) -> Vec<Envelope> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let t = self.transcript().await;
            if cond(&t) || tokio::time::Instant::now() >= deadline {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn shutdown(mut self) {
        for n in [self.node.take(), self.peer.take()].into_iter().flatten() {
            n.shutdown().await;
        }
    }
}

fn copies<'a>(t: &'a [Envelope], om: &str) -> Vec<&'a Envelope> {
    t.iter()
        .filter(|e| e.platform_msg_id.as_deref() == Some(om))
        .collect()
}

fn acked_ok(acks: &[botmesh_tests::fake_feishu::Ack], message_id: &str) -> usize {
    acks.iter()
        .filter(|a| a.message_id == message_id && a.code == 200)
        .count()
}

#[tokio::test]
async fn events_arrive_over_the_long_connection_and_are_acknowledged_once_recorded() {
    let n = Node::start(|_| {}).await;
    assert_eq!(n.fake.wait_connections(1, WAIT).await, 1, "connected");
    let whole = n.say("ev-1", "om_ws_1", "hello over the socket");
    let long_text = "一段很长的消息 ".repeat(60);
    let split = n
        .fake
        .push_event(&human_event("ev-2", "om_ws_2", &long_text), 4);
    let acks = n
        .fake
        .wait_acks(WAIT, |a| {
            acked_ok(a, &whole) == 1 && acked_ok(a, &split) == 1
        })
        .await;
    assert_eq!(acked_ok(&acks, &whole), 1, "{acks:?}");
    assert_eq!(
        acked_ok(&acks, &split),
        1,
        "one answer for four fragments: {acks:?}"
    );
    assert_eq!(
        acks.len(),
        2,
        "fragments are not answered one by one: {acks:?}"
    );
    assert!(acks.iter().all(|a| a.biz_rt.is_some()), "{acks:?}");
    // Acknowledged means recorded: the transcript has both at once.
    let t = n.transcript().await;
    assert_eq!(copies(&t, "om_ws_1").len(), 1, "{t:?}");
    assert_eq!(copies(&t, "om_ws_1")[0].text, "hello over the socket");
    assert_eq!(copies(&t, "om_ws_2")[0].text, long_text.trim());
    // The client pings, and health and /metrics show the connection.
    let deadline = tokio::time::Instant::now() + WAIT;
    while n.fake.pings() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(n.fake.pings() >= 1);
    let (code, health) = n.get("/healthz").await;
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(code, 200, "{health}");
    let lc = &health["platform"]["feishu"]["long_connection"];
    assert_eq!(health["platform"]["feishu"]["mode"], "long_connection");
    assert_eq!(lc["state"], "connected", "{health}");
    assert_eq!(lc["acked"], 2, "{health}");
    let (_, m) = n.get("/metrics").await;
    assert_metric(&m, r#"botmesh_feishu_connection{state="connected"}"#, 1.0);
    assert_metric(
        &m,
        r#"botmesh_feishu_connection{state="reconnecting"}"#,
        0.0,
    );
    assert_metric(
        &m,
        r#"botmesh_feishu_connects_total{result="connected"}"#,
        1.0,
    );
    assert_metric(&m, r#"botmesh_feishu_events_total{result="message"}"#, 2.0);
    // No webhook in long-connection mode.
    let r = n
        .http
        .post(format!(
            "http://{}{}",
            n.bridge,
            botmesh::platform::feishu::EVENTS_PATH
        ))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    n.shutdown().await;
}

#[tokio::test]
async fn a_redelivered_event_is_recorded_once() {
    let n = Node::start(|_| {}).await;
    n.fake.wait_connections(1, WAIT).await;
    let m = n.say_acked("ev-r", "om_ws_r", "only once please").await;
    n.fake.redeliver(&m);
    let acks = n.fake.wait_acks(WAIT, |a| acked_ok(a, &m) == 2).await;
    assert_eq!(
        acked_ok(&acks, &m),
        2,
        "the repeat is acknowledged too: {acks:?}"
    );
    // A second event after the repeat proves the repeat was fully handled.
    let after = n.say("ev-after", "om_ws_after", "next");
    let t = n
        .wait_transcript(|t| !copies(t, "om_ws_after").is_empty())
        .await;
    assert_eq!(copies(&t, "om_ws_r").len(), 1, "{t:?}");
    assert_eq!(copies(&t, "om_ws_after").len(), 1);
    let _ = after;
    let (_, m) = n.get("/metrics").await;
    assert_metric(
        &m,
        r#"botmesh_feishu_events_total{result="duplicate"}"#,
        1.0,
    );
    n.shutdown().await;
}

#[tokio::test]
async fn a_dropped_socket_is_reconnected_and_nothing_is_lost() {
    let n = Node::start(|_| {}).await;
    n.fake.wait_connections(1, WAIT).await;
    n.say_acked("ev-a", "om_ws_a", "before the drop").await;
    // Dropped while idle; an event comes while nobody is connected.
    n.fake.drop_connection();
    let b = n.say("ev-b", "om_ws_b", "while away");
    assert_eq!(n.fake.wait_connections(2, WAIT).await, 2, "reconnected");
    n.fake.wait_acks(WAIT, |k| acked_ok(k, &b) == 1).await;
    // Dropped right after an event went out, before its answer could be read: Feishu
    // delivers it again on the next connection.
    n.fake.drop_after_next_push();
    let c = n
        .fake
        .push_event(&human_event("ev-c", "om_ws_c", "in flight"), 2);
    assert_eq!(
        n.fake.wait_connections(3, WAIT).await,
        3,
        "reconnected again"
    );
    let acks = n.fake.wait_acks(WAIT, |k| acked_ok(k, &c) >= 1).await;
    assert!(acked_ok(&acks, &c) >= 1, "{acks:?}");
    assert!(n.fake.unacked().is_empty(), "{:?}", n.fake.unacked());
    let t = n.transcript().await;
    for om in ["om_ws_a", "om_ws_b", "om_ws_c"] {
        assert_eq!(copies(&t, om).len(), 1, "{om} exactly once: {t:?}");
    }
    let (_, health) = n.get("/healthz").await;
    let health: Value = serde_json::from_str(&health).unwrap();
    let lc = &health["platform"]["feishu"]["long_connection"];
    assert_eq!(lc["state"], "connected", "{health}");
    assert_eq!(lc["connects"], 3, "{health}");
    let (_, m) = n.get("/metrics").await;
    assert_metric(
        &m,
        r#"botmesh_feishu_connects_total{result="dropped"}"#,
        2.0,
    );
    n.shutdown().await;
}

#[tokio::test]
async fn a_refused_handshake_is_explained_and_retried() {
    let n = Node::start(|f| {
        f.refuse_next_handshakes([
            Refusal::too_many_connections(),
            Refusal::too_many_connections(),
        ]);
    })
    .await;
    assert_eq!(
        n.fake.wait_connections(1, WAIT).await,
        1,
        "connected after the refusals"
    );
    assert_eq!(n.fake.handshakes_refused(), 2);
    assert_eq!(
        n.fake.endpoint_requests(),
        3,
        "a fresh endpoint for every attempt"
    );
    let (_, health) = n.get("/healthz").await;
    let health: Value = serde_json::from_str(&health).unwrap();
    let lc = &health["platform"]["feishu"]["long_connection"];
    let last = lc["last_error"].as_str().unwrap_or_default();
    assert!(
        last.contains("1000040350") && last.contains("too many connections"),
        "{health}"
    );
    let (_, m) = n.get("/metrics").await;
    assert_eq!(
        metric(
            &m,
            r#"botmesh_feishu_connects_total{result="handshake_refused"}"#
        ),
        2.0,
        "{m}"
    );
    // And it works once connected.
    let e = n.say("ev-x", "om_ws_x", "finally");
    let acks = n.fake.wait_acks(WAIT, |a| acked_ok(a, &e) == 1).await;
    assert_eq!(acked_ok(&acks, &e), 1);
    n.shutdown().await;
}

/// `event` with its message's type and content replaced.
fn with_content(mut event: Value, message_type: &str, content: Value) -> Value {
    event["event"]["message"]["message_type"] = message_type.into();
    event["event"]["message"]["content"] = content.to_string().into();
    event
}

#[tokio::test]
async fn rich_text_and_media_are_recorded_readably() {
    let n = Node::start(|_| {}).await;
    n.fake.wait_connections(1, WAIT).await;
    let mut post = with_content(
        human_event("ev-post", "om_post", ""),
        "post",
        serde_json::json!({"title": "Deploy", "content": [
            [{"tag": "at", "user_id": "@_user_1", "user_name": "二狗"},
             {"tag": "text", "text": " see "},
             {"tag": "a", "href": "https://ci.example/7", "text": "build 7"}],
            [{"tag": "code_block", "language": "bash", "text": "echo @XiaoBa\n"}]
        ]}),
    );
    post["event"]["message"]["mentions"] = serde_json::json!([
        {"key": "@_user_1", "id": {"open_id": ERGOZ_IN_XIAOBAS_APP}, "name": "二狗", "tenant_key": "t"}
    ]);
    let file = with_content(
        human_event("ev-file", "om_file", ""),
        "file",
        serde_json::json!({"file_key": "file_v2_1", "file_name": "report.pdf"}),
    );
    let image = with_content(
        human_event("ev-image", "om_image", ""),
        "image",
        serde_json::json!({"image_key": "img_v2_1"}),
    );
    let sticker = with_content(
        human_event("ev-sticker", "om_sticker", ""),
        "sticker",
        serde_json::json!({"file_key": "s"}),
    );
    for e in [&post, &file, &image, &sticker] {
        n.fake.push_event(e, 1);
    }
    let t = n
        .wait_transcript(|t| !copies(t, "om_sticker").is_empty())
        .await;
    let text = |om: &str| copies(&t, om).first().map(|e| e.text.clone());
    assert_eq!(
        text("om_post").as_deref(),
        Some("Deploy\n@ErGoz see [build 7](https://ci.example/7)\n```bash\necho @XiaoBa\n```"),
        "{t:?}"
    );
    assert_eq!(text("om_file").as_deref(), Some("[file report.pdf]"));
    assert_eq!(text("om_image").as_deref(), Some("[image]"));
    assert_eq!(text("om_sticker").as_deref(), Some("[sticker]"));
    // XiaoBa answers mentions only: the one in the code block is no mention.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(n.fake.sent().is_empty(), "{:?}", n.fake.sent());
    n.shutdown().await;
}

#[tokio::test]
async fn a_direct_chat_is_answered_without_a_mention_and_reaches_no_peer() {
    let n = Node::start_with("happy to help", |_| {}).await;
    n.fake.wait_connections(1, WAIT).await;
    let mut dm = human_event("ev-dm", "om_dm", "can you check the build?");
    dm["event"]["message"]["chat_type"] = "p2p".into();
    dm["event"]["message"]["chat_id"] = "oc_p2p_alice_xiaoba".into();
    n.fake.push_event(&dm, 1);
    let sent = n.fake.wait_sent(1, WAIT).await;
    assert_eq!(sent.len(), 1, "answered: {sent:?}");
    assert_eq!(
        sent[0].receive_id, "oc_p2p_alice_xiaoba",
        "in the direct chat"
    );
    assert_eq!(sent[0].text, "happy to help");
    let group = "direct:oc_p2p_alice_xiaoba";
    let mine = n.transcript_of(n.api, group).await;
    assert_eq!(mine.len(), 2, "{mine:?}");
    // The peer hears nothing of it (give a broadcast time to arrive, bounded).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(n.transcript_of(n.peer_api, group).await.is_empty());
    assert!(n.transcript().await.is_empty(), "nothing in the team group");
    n.shutdown().await;
}

/// ErGoz's message as Feishu delivers it to XiaoBa's app (the include_bot scopes).
fn ergoz_on_feishu(event_id: &str, message_id: &str, text: &str) -> Value {
    message_event(&MessageSpec {
        app_id: APP_ID,
        token: "",
        event_id,
        message_id,
        chat_id: CHAT,
        sender_open_id: ERGOZ_IN_XIAOBAS_APP,
        sender_type: "app",
        text,
        mentions: &[],
    })
}

impl Node {
    /// ErGoz publishes a message it posted on Feishu as `om` (as its sidecar would):
    /// the bridge copy, with its depth. Returns its envelope id.
    async fn ergoz_says(&self, text: &str, om: &str) -> String {
        let r: Value = botmesh_tests::fetch_json(
            self.http
                .post(format!("http://{}/v1/messages", self.peer_api))
                .json(&serde_json::json!({"text": text, "from": "ErGoz", "platform_msg_id": om})),
        )
        .await;
        r["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string()
    }
}

#[tokio::test]
async fn a_colleagues_message_from_feishu_and_the_bridge_is_recorded_once_in_either_order() {
    let n = Node::start(|_| {}).await;
    n.fake.wait_connections(1, WAIT).await;
    // Bridge first, Feishu's copy after.
    let first = n.ergoz_says("status: all green", "om_bridge_first").await;
    n.wait_transcript(|t| !copies(t, "om_bridge_first").is_empty())
        .await;
    let m1 = n.fake.push_event(
        &ergoz_on_feishu("ev-bf", "om_bridge_first", "status: all green"),
        1,
    );
    // Feishu's copy first, the bridge copy after.
    let m2 = n.fake.push_event(
        &ergoz_on_feishu("ev-ff", "om_feishu_first", "deploy done"),
        1,
    );
    let acks = n
        .fake
        .wait_acks(WAIT, |a| acked_ok(a, &m1) == 1 && acked_ok(a, &m2) == 1)
        .await;
    assert_eq!(
        (acked_ok(&acks, &m1), acked_ok(&acks, &m2)),
        (1, 1),
        "{acks:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = n.ergoz_says("deploy done", "om_feishu_first").await;
    let t = n
        .wait_transcript(|t| !copies(t, "om_feishu_first").is_empty())
        .await;
    // Wait out the adapter's polling for the bridge copy (bounded by its grace).
    tokio::time::sleep(Duration::from_millis(600)).await;
    let t2 = n.transcript().await;
    for (om, id) in [("om_bridge_first", &first), ("om_feishu_first", &second)] {
        let c = copies(&t2, om);
        assert_eq!(c.len(), 1, "{om} once: {t:?}");
        assert_eq!(
            &c[0].id.to_string(),
            id,
            "{om}: the bridge copy, with its depth, is kept"
        );
        assert_eq!(c[0].author.name, "ErGoz");
    }
    n.shutdown().await;
}

const CAROL: &str = "ou_carol_not_in_any_directory";

#[tokio::test]
async fn people_appear_by_name_and_every_api_call_is_counted() {
    use botmesh_tests::fake_feishu::Directory;
    // No contact scope: names come from the chat's members, listed once.
    let n = Node::start(|f| {
        f.set_directory(Directory {
            contact_scope: false,
            members_scope: true,
            members: vec![(ALICE.to_string(), "Alice Chen".to_string())],
            ..Directory::default()
        })
    })
    .await;
    n.fake.wait_connections(1, WAIT).await;
    n.say("ev-n1", "om_n1", "first");
    n.say("ev-n2", "om_n2", "second");
    let mut carol = human_event("ev-n3", "om_n3", "from a stranger");
    carol["event"]["sender"]["sender_id"]["open_id"] = CAROL.into();
    n.fake.push_event(&carol, 1);
    let mut carol2 = human_event("ev-n4", "om_n4", "again");
    carol2["event"]["sender"]["sender_id"]["open_id"] = CAROL.into();
    n.fake.push_event(&carol2, 1);
    let t = n.wait_transcript(|t| !copies(t, "om_n4").is_empty()).await;
    let author = |om: &str| copies(&t, om)[0].author.name.clone();
    assert_eq!(author("om_n1"), "Alice Chen");
    assert_eq!(author("om_n2"), "Alice Chen");
    assert_eq!(author("om_n3"), CAROL, "no name anywhere: the open_id");
    assert_eq!(author("om_n4"), CAROL);
    let contact = "GET /open-apis/contact/v3/users/";
    let members = "GET /open-apis/im/v1/chats/";
    assert_eq!(
        n.fake.calls_to(contact),
        1,
        "refused once, never asked again"
    );
    assert_eq!(
        n.fake.calls_to(members),
        1,
        "listed once: {:?}",
        n.fake.calls()
    );
    // /metrics counts every call by endpoint, and a health check costs none.
    let before = n.fake.calls().len();
    for _ in 0..3 {
        n.get("/healthz").await;
    }
    assert_eq!(n.fake.calls().len(), before, "health never calls Feishu");
    let (_, m) = n.get("/metrics").await;
    let calls = |e: &str| {
        metric(
            &m,
            &format!("botmesh_feishu_api_calls_total{{endpoint=\"{e}\"}}"),
        )
    };
    assert_eq!(calls("GET /open-apis/contact/v3/users/{id}"), 1.0, "{m}");
    assert_eq!(calls("GET /open-apis/im/v1/chats/{id}/members"), 1.0, "{m}");
    assert_eq!(calls("POST /callback/ws/endpoint"), 1.0, "{m}");
    assert_eq!(
        calls("POST /open-apis/auth/v3/tenant_access_token/internal"),
        n.fake.token_requests() as f64,
        "{m}"
    );
    assert_eq!(
        calls("GET /open-apis/bot/v3/info"),
        n.fake.info_requests() as f64,
        "{m}"
    );
    // A real OpenMetrics parser reads the new families (labels with `/`, `{` and spaces).
    let python = std::env::var("BOTMESH_TEST_PYTHON").expect(
        "BOTMESH_TEST_PYTHON is not set: scripts/test.sh makes .venv-test/ from tests/requirements.txt",
    );
    let parsed = parse_openmetrics(&python, &m);
    let family = |name: &str| {
        parsed
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no family {name} in {parsed}"))
    };
    let api = family("botmesh_feishu_api_calls");
    assert_eq!(api["type"], "counter");
    assert!(
        api["samples"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["labels"]["endpoint"] == "GET /open-apis/contact/v3/users/{id}"),
        "{api}"
    );
    assert_eq!(family("botmesh_feishu_connection")["type"], "gauge");
    assert_eq!(family("botmesh_feishu_connects")["type"], "counter");
    n.shutdown().await;

    // With the contact scope: one look-up per person, then the cache.
    let n = Node::start(|f| {
        f.set_directory(Directory {
            contact_scope: true,
            users: [(ALICE.to_string(), "Alice Chen".to_string())]
                .into_iter()
                .collect(),
            ..Directory::default()
        })
    })
    .await;
    n.fake.wait_connections(1, WAIT).await;
    n.say("ev-c1", "om_c1", "one");
    n.say("ev-c2", "om_c2", "two");
    let t = n.wait_transcript(|t| !copies(t, "om_c2").is_empty()).await;
    assert_eq!(copies(&t, "om_c1")[0].author.name, "Alice Chen");
    assert_eq!(copies(&t, "om_c2")[0].author.name, "Alice Chen");
    assert_eq!(n.fake.calls_to("GET /open-apis/contact/v3/users/"), 1);
    assert_eq!(n.fake.calls_to("GET /open-apis/im/v1/chats/"), 0);
    n.shutdown().await;
}

#[tokio::test]
async fn feishu_ids_prints_colleagues_open_ids_from_recent_mentions() {
    use botmesh_tests::fake_feishu::Directory;
    let n = Node::start(|f| {
        f.set_directory(Directory {
            history_mentions: vec![
                ("ou_alice_here".to_string(), "Alice Chen".to_string()),
                ("ou_ergoz_newest".to_string(), "ergoz".to_string()),
                ("ou_ergoz_older".to_string(), "ErGoz".to_string()),
                (XIAOBA_OPEN_ID.to_string(), "XiaoBa".to_string()),
            ],
            ..Directory::default()
        })
    })
    .await;
    let cfg = NodeConfig::resolve(n.settings.clone(), "XiaoBa", None, &n.env).unwrap();
    let before = n.fake.calls_to("GET /open-apis/im/v1/messages");
    let text = botmesh::platform::feishu_names::colleague_ids(&cfg)
        .await
        .unwrap();
    assert!(
        text.contains(&format!("open_id = \"{XIAOBA_OPEN_ID}\"")),
        "{text}"
    );
    assert!(
        text.contains("ErGoz = \"ou_ergoz_newest\""),
        "the newest mention wins: {text}"
    );
    assert!(
        !text.contains("ou_alice_here"),
        "people are not colleagues: {text}"
    );
    assert_eq!(n.fake.calls_to("GET /open-apis/im/v1/messages"), before + 1);
    n.shutdown().await;
}

/// A handler that cannot take the first delivery of each event, then can.
struct FailsOnce {
    seen: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl botmesh::platform::feishu_ws::EventHandler for FailsOnce {
    fn handle(&self, payload: Vec<u8>) -> futures_util::future::BoxFuture<'_, u16> {
        Box::pin(async move {
            let mut seen = self.seen.lock().unwrap();
            let first = !seen.contains(&payload);
            seen.push(payload);
            if first {
                500
            } else {
                200
            }
        })
    }
}

#[tokio::test]
async fn an_event_the_node_could_not_take_is_answered_500_and_delivered_again() {
    use botmesh::platform::feishu_ws::{run, WsSettings, WsStatus};
    init_logs();
    let fake = FakeFeishu::start(fake_app()).await;
    let handler = std::sync::Arc::new(FailsOnce {
        seen: Default::default(),
    });
    let status = std::sync::Arc::new(WsStatus::new(std::sync::Arc::new(
        botmesh::telemetry::metrics::Metrics::new(),
    )));
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        WsSettings {
            base_url: fake.base_url.clone(),
            app_id: APP_ID.into(),
            app_secret: APP_SECRET.into(),
        },
        handler.clone(),
        status.clone(),
        stop.clone(),
    ));
    fake.wait_connections(1, WAIT).await;
    let m = fake.push_event(&human_event("ev-500", "om_500", "not yet"), 2);
    let acks = fake
        .wait_acks(WAIT, |a| a.iter().any(|k| k.message_id == m))
        .await;
    assert_eq!(acks[0].code, 500, "{acks:?}");
    assert_eq!(fake.unacked(), vec![m.clone()], "Feishu keeps it");
    // Feishu delivers it again (here: on the next connection).
    fake.drop_connection();
    let acks = fake
        .wait_acks(WAIT, |a| {
            a.iter().any(|k| k.message_id == m && k.code == 200)
        })
        .await;
    assert_eq!(
        acks.iter().map(|a| a.code).collect::<Vec<_>>(),
        vec![500, 200],
        "{acks:?}"
    );
    assert!(fake.unacked().is_empty());
    let h = status.health();
    assert_eq!((h.acked, h.refused), (1, 1), "{h:?}");
    stop.cancel();
    task.await.unwrap();
}
