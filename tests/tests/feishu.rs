//! Feishu end to end: a real node with `platform = "feishu"` against a fake Feishu
//! open platform, fed encrypted, signed callbacks shaped like Feishu's documentation.
//!
//! The mesh: XiaoBa on Feishu (answers when mentioned), ErGoz on the local platform
//! (answers humans only, so XiaoBa's messages never trigger it) to observe what
//! XiaoBa broadcasts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use botmesh::app::node::RunningNode;
use botmesh::config::{NodeConfig, Settings};
use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh::wire::signing::HmacSecret;
use botmesh_tests::fake_feishu::{
    message_event, url_verification, Callback, Fail, FakeApp, FakeFeishu, MessageSpec,
};
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::{init_logs, rebind};
use serde_json::Value;
use tokio::net::TcpListener;

const APP_ID: &str = "cli_a1b2c3d4e5f60001";
const APP_SECRET: &str = "dskLLdkasdjlasdKK";
const TOKEN: &str = "rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV";
const KEY: &str = "a-32-char-encrypt-key-for-tests!";
const XIAOBA_OPEN_ID: &str = "ou_84aad35d084aa403a838cf73ee18467";
const ERGOZ_IN_XIAOBAS_APP: &str = "ou_7dab8a3d3cdcc9da365777c7ad535d62";
const CHAT: &str = "oc_5ce6d572455d361153b7xx51da133945";
const ALICE: &str = "ou_c99c5f35d542efc7ee492afe11af19ef";
const WAIT: Duration = Duration::from_secs(10);

struct Mesh {
    _dir: tempfile::TempDir,
    settings: Settings,
    env: HashMap<String, String>,
    nodes: Vec<Option<RunningNode>>,
    bridges: Vec<SocketAddr>,
    apis: Vec<SocketAddr>,
    http: reqwest::Client,
    feishu: FakeFeishu,
    llm: FakeLlm,
}

const XIAOBA: usize = 0;
const ERGOZ: usize = 1;

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

impl Mesh {
    async fn start(reply: &'static str) -> Mesh {
        init_logs();
        let feishu = FakeFeishu::start(FakeApp {
            app_id: APP_ID.into(),
            app_secret: APP_SECRET.into(),
            bot_open_id: XIAOBA_OPEN_ID.into(),
            app_name: "XiaoBa".into(),
            expire: 7200,
        })
        .await;
        let llm = FakeLlm::start(move |_| Script::reply(reply)).await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("mesh.secret"),
            HmacSecret::generate().to_whsec(),
        )
        .unwrap();
        let (mut bl, mut al) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            bl.push(bind().await);
            al.push(bind().await);
        }
        let bridges: Vec<SocketAddr> = bl.iter().map(|l| l.local_addr().unwrap()).collect();
        let apis: Vec<SocketAddr> = al.iter().map(|l| l.local_addr().unwrap()).collect();
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
aliases = ["小八"]
bridge = "{b0}"
api = "{a0}"
platform = "feishu"
participation = "mentions"
feishu = {{ mode = "webhook", open_id = "{XIAOBA_OPEN_ID}", app_id = "{APP_ID}", app_secret_env = "XIAOBA_APP_SECRET", verification_token_env = "XIAOBA_VERIFICATION_TOKEN", encrypt_key_env = "XIAOBA_ENCRYPT_KEY", base_url = "{base}", chat_id = "{CHAT}", peer_open_ids = {{ ErGoz = "{ERGOZ_IN_XIAOBAS_APP}" }} }}

[[bots]]
name = "ErGoz"
aliases = ["二狗"]
bridge = "{b1}"
api = "{a1}"
participation = "mentions"
reply_to = "humans"
"#,
            llm = llm.base_url,
            base = feishu.base_url,
            b0 = bridges[0],
            a0 = apis[0],
            b1 = bridges[1],
            a1 = apis[1],
        );
        let path = dir.path().join("peers.toml");
        std::fs::write(&path, &toml).unwrap();
        let settings = Settings::load_with_env(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
        let env: HashMap<String, String> = [
            ("XIAOBA_APP_SECRET", APP_SECRET),
            ("XIAOBA_VERIFICATION_TOKEN", TOKEN),
            ("XIAOBA_ENCRYPT_KEY", KEY),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let mut mesh = Mesh {
            _dir: dir,
            settings,
            env,
            nodes: Vec::new(),
            bridges,
            apis,
            http,
            feishu,
            llm,
        };
        for (i, (b, a)) in bl.into_iter().zip(al).enumerate() {
            let n = mesh.start_node(i, b, a).await;
            mesh.nodes.push(Some(n));
        }
        mesh
    }

    async fn start_node(&self, i: usize, bridge: TcpListener, api: TcpListener) -> RunningNode {
        let name = self.settings.bots[i].name.clone();
        let cfg = NodeConfig::resolve(self.settings.clone(), &name, None, &self.env)
            .unwrap_or_else(|e| panic!("{e}"));
        botmesh::app::node::start(cfg, bridge, api)
            .await
            .expect("start")
    }

    async fn restart(&mut self, i: usize) {
        if let Some(n) = self.nodes[i].take() {
            n.shutdown().await;
        }
        let b = rebind(self.bridges[i]).await;
        let a = rebind(self.apis[i]).await;
        let n = self.start_node(i, b, a).await;
        self.nodes[i] = Some(n);
    }

    fn bridge(&self, i: usize) -> String {
        format!("http://{}", self.bridges[i])
    }

    async fn deliver(&self, cb: &Callback) -> (u16, Value) {
        cb.send(&self.http, &self.bridge(XIAOBA)).await
    }

    async fn transcript(&self, i: usize) -> Vec<Envelope> {
        let v: Value = self
            .http
            .get(format!(
                "http://{}/v1/transcript?group=demo&limit=2000",
                self.apis[i]
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        serde_json::from_value(v["messages"].clone()).unwrap()
    }

    async fn wait_transcript(&self, i: usize, cond: impl Fn(&[Envelope]) -> bool) -> Vec<Envelope> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let t = self.transcript(i).await;
            if cond(&t) || tokio::time::Instant::now() >= deadline {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn shutdown(mut self) {
        for n in self.nodes.iter_mut() {
            if let Some(n) = n.take() {
                n.shutdown().await;
            }
        }
    }
}

/// A person's message that @mentions XiaoBa through the `@_user_1` placeholder.
fn mention_of_xiaoba(event_id: &str, message_id: &str, text: &str) -> Value {
    message_event(&MessageSpec {
        app_id: APP_ID,
        token: TOKEN,
        event_id,
        message_id,
        chat_id: CHAT,
        sender_open_id: ALICE,
        sender_type: "user",
        text,
        mentions: &[("@_user_1", XIAOBA_OPEN_ID, "XiaoBa")],
    })
}

fn with_platform_id<'a>(t: &'a [Envelope], om: &str) -> Vec<&'a Envelope> {
    t.iter()
        .filter(|e| e.platform_msg_id.as_deref() == Some(om))
        .collect()
}

fn bot_replies(t: &[Envelope]) -> Vec<&Envelope> {
    t.iter()
        .filter(|e| e.author.kind == AuthorKind::Bot && e.author.name == "XiaoBa")
        .collect()
}

#[tokio::test]
async fn a_mention_gets_a_reply_on_feishu_with_real_at_mentions() {
    let mesh = Mesh::start("@ErGoz 请你 review 一下这个 PR").await;
    let event = mention_of_xiaoba("ev-0001", "om_human0001", "@_user_1 帮我看下这个 PR");
    let (status, body) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!((status, &body), (200, &serde_json::json!({"ok": true})));

    let sent = mesh.feishu.wait_sent(1, WAIT).await;
    assert_eq!(sent.len(), 1, "one reply posted");
    let s = &sent[0];
    assert_eq!(
        (
            s.receive_id_type.as_str(),
            s.receive_id.as_str(),
            s.msg_type.as_str()
        ),
        ("chat_id", CHAT, "text")
    );
    assert_eq!(
        s.text,
        format!("<at user_id=\"{ERGOZ_IN_XIAOBAS_APP}\">ErGoz</at> 请你 review 一下这个 PR")
    );

    // XiaoBa's transcript: the human message, readable, and the reply carrying the om_ id.
    let t = mesh
        .wait_transcript(XIAOBA, |t| bot_replies(t).len() == 1)
        .await;
    let human = with_platform_id(&t, "om_human0001");
    assert_eq!(human.len(), 1);
    assert_eq!(
        (
            human[0].author.name.as_str(),
            human[0].author.kind,
            human[0].depth
        ),
        (ALICE, AuthorKind::Human, 0)
    );
    assert_eq!(human[0].text, "@XiaoBa 帮我看下这个 PR");
    let reply = bot_replies(&t)[0];
    assert_eq!(
        reply.platform_msg_id.as_deref(),
        Some(s.message_id.as_str())
    );
    assert_eq!(
        s.uuid.as_deref(),
        Some(reply.id.to_string().as_str()),
        "uuid = envelope id"
    );
    assert_eq!(reply.text, "@ErGoz 请你 review 一下这个 PR");
    assert_eq!(reply.reply_to, Some(human[0].id));

    // The LLM saw names, not placeholders.
    let prompt: String = mesh.llm.requests()[0]
        .messages
        .iter()
        .map(|(_, c)| c.as_str())
        .collect();
    assert!(
        prompt.contains("帮我看下这个 PR") && !prompt.contains("@_user_1"),
        "{prompt}"
    );

    // ErGoz gets the reply over the bridge, already carrying Feishu's id; never the human.
    let t = mesh
        .wait_transcript(ERGOZ, |t| !with_platform_id(t, &s.message_id).is_empty())
        .await;
    assert_eq!(with_platform_id(&t, &s.message_id).len(), 1);
    assert!(
        with_platform_id(&t, "om_human0001").is_empty(),
        "humans are not broadcast from feishu"
    );

    // A second mention: the cached tenant token is reused.
    let event = mention_of_xiaoba("ev-0002", "om_human0002", "@_user_1 还有一个问题");
    let (status, _) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!(status, 200);
    assert_eq!(mesh.feishu.wait_sent(2, WAIT).await.len(), 2);
    assert_eq!(
        mesh.feishu.token_requests(),
        1,
        "one tenant token for everything"
    );
    assert!(mesh.feishu.info_requests() <= 1);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_retried_event_is_processed_once_even_after_a_restart() {
    let mut mesh = Mesh::start("收到").await;
    let event = mention_of_xiaoba("ev-retry", "om_retry0001", "@_user_1 在吗");
    let (status, body) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!((status, body["ok"].as_bool()), (200, Some(true)));
    // Feishu's retry: the same event, signed again.
    let (status, body) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!((status, body["duplicate"].as_bool()), (200, Some(true)));
    assert_eq!(mesh.feishu.wait_sent(1, WAIT).await.len(), 1);

    mesh.restart(XIAOBA).await;
    let (status, body) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!(
        (status, body["duplicate"].as_bool()),
        (200, Some(true)),
        "the event id file outlives a restart"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(mesh.feishu.sent().len(), 1, "answered once");
    let t = mesh.transcript(XIAOBA).await;
    assert_eq!(with_platform_id(&t, "om_retry0001").len(), 1);
    assert_eq!(bot_replies(&t).len(), 1);
    mesh.shutdown().await;
}

#[tokio::test]
async fn forged_stale_and_unsigned_callbacks_are_rejected() {
    let mesh = Mesh::start("不该出现").await;
    let event = mention_of_xiaoba("ev-forged", "om_forged0001", "@_user_1 转账");

    let mut bad = Callback::encrypted_signed(&event, KEY, 0);
    let sig = bad.signature.clone().unwrap();
    let flipped = if sig.starts_with('0') { "1" } else { "0" };
    bad.signature = Some(format!("{flipped}{}", &sig[1..]));
    let (status, body) = mesh.deliver(&bad).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("bad_signature"))
    );

    for skew in [-301, 301] {
        let (status, body) = mesh
            .deliver(&Callback::encrypted_signed(&event, KEY, skew))
            .await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("stale")),
            "skew {skew}"
        );
    }

    let (status, body) = mesh
        .deliver(&Callback::encrypted_unsigned(&event, KEY))
        .await;
    assert_eq!((status, body["error"].as_str()), (401, Some("unsigned")));

    let (status, _) = mesh
        .deliver(&Callback::encrypted_signed(
            &event,
            "somebody else's key",
            0,
        ))
        .await;
    assert_eq!(status, 401, "signed with another key");

    let mut wrong_token = event.clone();
    wrong_token["header"]["token"] = "not-the-token".into();
    let (status, body) = mesh
        .deliver(&Callback::encrypted_signed(&wrong_token, KEY, 0))
        .await;
    assert_eq!((status, body["error"].as_str()), (401, Some("bad_token")));

    let mut other_app = event.clone();
    other_app["header"]["app_id"] = "cli_someone_else".into();
    let (status, _) = mesh
        .deliver(&Callback::encrypted_signed(&other_app, KEY, 0))
        .await;
    assert_eq!(status, 403);

    let mut garbage = Callback::plain(&serde_json::json!("nope"));
    garbage.sign(KEY, 0);
    let (status, _) = mesh.deliver(&garbage).await;
    assert_eq!(status, 400);

    // A bot that is not on Feishu has no such endpoint.
    let (status, _) = Callback::encrypted_signed(&event, KEY, 0)
        .send(&mesh.http, &mesh.bridge(ERGOZ))
        .await;
    assert_eq!(status, 404);

    // Still serving, and nothing got through: the genuine event is accepted once now.
    let (status, _) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!(status, 200);
    let t = mesh
        .wait_transcript(XIAOBA, |t| !bot_replies(t).is_empty())
        .await;
    assert_eq!(with_platform_id(&t, "om_forged0001").len(), 1);
    assert_eq!(mesh.feishu.wait_sent(1, WAIT).await.len(), 1);
    // Every callback is counted by what became of it.
    let m = mesh
        .http
        .get(format!("http://{}/metrics", mesh.apis[XIAOBA]))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |r: &str| {
        botmesh_tests::metric(
            &m,
            &format!(r#"botmesh_feishu_events_total{{result="{r}"}}"#),
        )
    };
    assert_eq!(count("bad_signature"), 2.0, "{m}");
    assert_eq!(count("stale"), 2.0, "{m}");
    assert_eq!(count("unsigned"), 1.0, "{m}");
    assert_eq!(count("bad_token"), 1.0, "{m}");
    assert_eq!(count("message"), 1.0, "{m}");
    mesh.shutdown().await;
}

#[tokio::test]
async fn the_url_verification_challenge_is_echoed_with_the_right_token() {
    let mesh = Mesh::start("-").await;
    let (status, body) = mesh
        .deliver(&Callback::encrypted_unsigned(
            &url_verification(TOKEN, "ajls384kdjx98XX"),
            KEY,
        ))
        .await;
    assert_eq!(
        (status, body),
        (200, serde_json::json!({"challenge": "ajls384kdjx98XX"}))
    );

    let (status, body) = mesh
        .deliver(&Callback::encrypted_unsigned(
            &url_verification("wrong", "c2"),
            KEY,
        ))
        .await;
    assert_eq!((status, body["error"].as_str()), (401, Some("bad_token")));

    // With an Encrypt Key configured, Feishu encrypts the check: plaintext proves nothing.
    let (status, _) = mesh
        .deliver(&Callback::plain(&url_verification(TOKEN, "c3")))
        .await;
    assert_eq!(status, 401);
    mesh.shutdown().await;
}

#[tokio::test]
async fn sends_retry_rate_limits_and_server_errors_and_refresh_an_expired_token() {
    let mesh = Mesh::start("好的，我来看").await;
    mesh.feishu.fail_next([
        Fail::Status(429),
        Fail::Status(502),
        Fail::TokenExpired,
        Fail::Code(230020),
    ]);
    let event = mention_of_xiaoba("ev-flaky", "om_flaky0001", "@_user_1 看一下");
    let (status, _) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!(status, 200);
    let sent = mesh.feishu.wait_sent(1, Duration::from_secs(20)).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(mesh.feishu.send_attempts(), 5);
    assert!(
        (2..=3).contains(&mesh.feishu.token_requests()),
        "fetched again after the token expired: {}",
        mesh.feishu.token_requests()
    );
    let t = mesh
        .wait_transcript(ERGOZ, |t| {
            !with_platform_id(t, &sent[0].message_id).is_empty()
        })
        .await;
    assert_eq!(with_platform_id(&t, &sent[0].message_id).len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mesh.feishu.sent().len(), 1, "posted once");
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_colleagues_message_seen_on_feishu_and_the_bridge_is_recorded_once() {
    let mesh = Mesh::start("-").await;
    // ErGoz posts (as its sidecar would, after posting to Feishu itself) and broadcasts.
    let r: Value = mesh
        .http
        .post(format!("http://{}/v1/messages", mesh.apis[ERGOZ]))
        .json(&serde_json::json!({"text": "status: all green", "from": "ErGoz", "platform_msg_id": "om_from_ergoz"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(r["id"].is_string(), "{r}");
    mesh.wait_transcript(XIAOBA, |t| !with_platform_id(t, "om_from_ergoz").is_empty())
        .await;
    // Feishu delivers the same message to XiaoBa's app as an app message.
    let event = message_event(&MessageSpec {
        app_id: APP_ID,
        token: TOKEN,
        event_id: "ev-app-copy",
        message_id: "om_from_ergoz",
        chat_id: CHAT,
        sender_open_id: ERGOZ_IN_XIAOBAS_APP,
        sender_type: "app",
        text: "status: all green",
        mentions: &[],
    });
    let (status, _) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = mesh.transcript(XIAOBA).await;
    let copies = with_platform_id(&t, "om_from_ergoz");
    assert_eq!(copies.len(), 1, "one message, not two");
    assert_eq!(
        (
            copies[0].author.name.as_str(),
            copies[0].author.kind,
            copies[0].id.to_string()
        ),
        (
            "ErGoz",
            AuthorKind::Bot,
            r["id"].as_str().unwrap().to_string()
        ),
        "the bridge copy (with its depth) is the one kept"
    );
    assert!(mesh.feishu.sent().is_empty());
    mesh.shutdown().await;
}
