//! Feishu end to end: a real node with `platform = "feishu"` against a fake Feishu
//! open platform, fed encrypted, signed callbacks shaped like Feishu's documentation.
//!
//! The mesh: XiaoBa on Feishu (answers when mentioned), ErGoz on the local platform
//! (answers humans only, so XiaoBa's messages never trigger it) to observe what
//! XiaoBa broadcasts.

use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_feishu::ids::{ALICE, CHAT, ERGOZ_IN_XIAOBAS_APP, XIAOBA_OPEN_ID};
use botmesh_tests::fake_feishu::{
    message_event, url_verification, Callback, Fail, FakeApp, FakeFeishu, MessageSpec,
};
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::transcript::author;
use botmesh_tests::{fetch_json, MeshSpec, Scheme, TestMesh};
use serde_json::Value;

const APP_ID: &str = "cli_a1b2c3d4e5f60001";
const APP_SECRET: &str = "dskLLdkasdjlasdKK";
const TOKEN: &str = "rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV";
const KEY: &str = "a-32-char-encrypt-key-for-tests!";
const WAIT: Duration = Duration::from_secs(10);

const XIAOBA: usize = 0;
const ERGOZ: usize = 1;

/// The two-bot mesh of this file ([`TestMesh`] on an HMAC secret), with the fake Feishu
/// XiaoBa posts to and the LLM that always answers the same.
struct Mesh {
    mesh: TestMesh,
    feishu: FakeFeishu,
    llm: FakeLlm,
}

impl std::ops::Deref for Mesh {
    type Target = TestMesh;
    fn deref(&self) -> &TestMesh {
        &self.mesh
    }
}

impl Mesh {
    async fn start(reply: &'static str) -> Mesh {
        let feishu = FakeFeishu::start(FakeApp {
            app_id: APP_ID.into(),
            app_secret: APP_SECRET.into(),
            bot_open_id: XIAOBA_OPEN_ID.into(),
            app_name: "XiaoBa".into(),
            expire: 7200,
        })
        .await;
        let llm = FakeLlm::start(move |_| Script::reply(reply)).await;
        let mut spec = MeshSpec::new(&["XiaoBa", "ErGoz"])
            .llm(&llm.base_url)
            .bot(
                "XiaoBa",
                &format!(
                    r#"aliases = ["小八"]
platform = "feishu"
participation = "mentions"
feishu = {{ mode = "webhook", open_id = "{XIAOBA_OPEN_ID}", app_id = "{APP_ID}", app_secret_env = "XIAOBA_APP_SECRET", verification_token_env = "XIAOBA_VERIFICATION_TOKEN", encrypt_key_env = "XIAOBA_ENCRYPT_KEY", base_url = "{base}", chat_id = "{CHAT}", peer_open_ids = {{ ErGoz = "{ERGOZ_IN_XIAOBAS_APP}" }} }}"#,
                    base = feishu.base_url,
                ),
            )
            .bot(
                "ErGoz",
                "aliases = [\"二狗\"]\nparticipation = \"mentions\"\nreply_to = \"humans\"",
            );
        spec.scheme = Scheme::Hmac;
        spec.env = [
            ("XIAOBA_APP_SECRET", APP_SECRET),
            ("XIAOBA_VERIFICATION_TOKEN", TOKEN),
            ("XIAOBA_ENCRYPT_KEY", KEY),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Mesh {
            mesh: TestMesh::start(spec).await,
            feishu,
            llm,
        }
    }

    /// Stops node `i` and starts it again on its ports and data.
    async fn restart(&mut self, i: usize) {
        self.mesh.stop(i).await;
        self.mesh.restart(i).await;
    }

    async fn deliver(&self, cb: &Callback) -> (u16, Value) {
        cb.send(&self.http, &self.bridge(XIAOBA)).await
    }

    /// Node `i`'s transcript once `cond` holds of it (or after [`WAIT`]).
    async fn wait_transcript(&self, i: usize, cond: impl Fn(&[Envelope]) -> bool) -> Vec<Envelope> {
        self.mesh.wait_transcript(i, WAIT, cond).await
    }

    async fn shutdown(self) {
        self.mesh.shutdown().await;
    }
}

/// A person's message that @mentions XiaoBa through the `@_user_1` placeholder.
fn mention_of_xiaoba(event_id: &str, message_id: &str, text: &str) -> Value {
    message_event(&MessageSpec {
        mentions: &[("@_user_1", XIAOBA_OPEN_ID, "XiaoBa")],
        ..MessageSpec::person((APP_ID, TOKEN, CHAT), ALICE, (event_id, message_id), text)
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
    let m = mesh.metrics(XIAOBA).await;
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
    let r = fetch_json(
        mesh.http
            .post(format!("{}/v1/messages", mesh.api(ERGOZ)))
            .json(&serde_json::json!({"text": "status: all green", "from": "ErGoz", "platform_msg_id": "om_from_ergoz"})),
    )
    .await;
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
    assert_eq!(author(copies[0]), ("ErGoz", AuthorKind::Bot));
    assert_eq!(
        copies[0].id.to_string(),
        r["id"].as_str().unwrap(),
        "the bridge copy (with its depth) is the one kept"
    );
    assert!(mesh.feishu.sent().is_empty());
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_persons_why_through_a_feishu_at_asks_that_bot_and_reaches_no_llm() {
    let mesh = Mesh::start("好的，我看看").await;
    let event = mention_of_xiaoba("ev-0101", "om_human0101", "@_user_1 帮我看下这个 PR");
    let (status, _) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!(status, 200);
    mesh.feishu.wait_sent(1, WAIT).await;
    let calls = mesh.llm.count();
    // The bot is addressed by Feishu's `@_user_1` placeholder, in front of the command.
    let event = mention_of_xiaoba("ev-0102", "om_human0102", "@_user_1 /why");
    let (status, _) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!(status, 200);
    let sent = mesh.feishu.wait_sent(2, WAIT).await;
    assert_eq!(sent.len(), 2, "the answer to /why is posted to the chat");
    let why = &sent[1].text;
    assert!(
        why.starts_with("XiaoBa, on ") && why.contains("帮我看下这个 PR"),
        "{why}"
    );
    assert!(why.contains("- mentioned: yes"), "{why}");
    assert!(why.contains("reply (mentioned)"), "{why}");
    assert!(why.contains("- spoke: \"好的，我看看\""), "{why}");
    assert_eq!(mesh.llm.count(), calls, "the command reached no LLM");
    let t = mesh
        .wait_transcript(XIAOBA, |t| bot_replies(t).len() == 2)
        .await;
    let cmd = with_platform_id(&t, "om_human0102");
    assert_eq!(cmd[0].text, "@XiaoBa /why", "recorded as people read it");
    assert_eq!(bot_replies(&t)[1].reply_to, Some(cmd[0].id));
    mesh.shutdown().await;
}

/// A Feishu person whose name reads as a bot's is recorded with a marker, and their
/// Feishu ids (the open_id in XiaoBa's app, the union_id) travel as `person`, what
/// `[mesh] operators` knows them by.
#[tokio::test]
async fn a_person_named_like_a_bot_is_marked_and_known_by_their_feishu_ids() {
    use botmesh_tests::fake_feishu::Directory;
    let mesh = Mesh::start("好的").await;
    mesh.feishu.set_directory(Directory {
        contact_scope: true,
        users: [(ALICE.to_string(), "ｘｉａｏ\u{200b}ｂａ".to_string())].into(),
        ..Directory::default()
    });
    let event = message_event(&MessageSpec {
        app_id: APP_ID,
        token: TOKEN,
        event_id: "ev-0201",
        message_id: "om_human0201",
        chat_id: CHAT,
        sender_open_id: ALICE,
        sender_type: "user",
        text: "hello from a look-alike",
        mentions: &[],
    });
    let (status, _) = mesh
        .deliver(&Callback::encrypted_signed(&event, KEY, 0))
        .await;
    assert_eq!(status, 200);
    let t = mesh
        .wait_transcript(XIAOBA, |t| !with_platform_id(t, "om_human0201").is_empty())
        .await;
    let m = with_platform_id(&t, "om_human0201")[0];
    assert_eq!(
        (m.author.name.as_str(), m.author.kind),
        ("ｘｉａｏ\u{200b}ｂａ (feishu user)", AuthorKind::Human)
    );
    assert_eq!(
        m.person.as_deref(),
        Some(format!("{ALICE} on_8ed6aa67826108097d9ee143816345").as_str())
    );
    mesh.shutdown().await;
}
