//! DingTalk end to end: real nodes with `platform = "dingtalk"` against the stand-in
//! DingTalk of `botmesh_tests::fake_dingtalk` (Stream gateway, token, session webhook
//! and group-send APIs), itself proven faithful in the same run by DingTalk's official
//! Python SDK (`dingtalk-stream`, from tests/requirements.txt).
//!
//! The mesh: Ada and Bo, two DingTalk robots in one group, and (where a test says so)
//! Cy on the local platform. DingTalk shows a person's message only to the robots it
//! @-mentions and never shows robots each other's messages; the bridge closes the gap.

use std::process::Stdio;
use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_dingtalk::{FakeDingTalk, FakeRobot, PersonMessage, Via};
use botmesh_tests::fake_llm::{BotLlm, FakeLlm};
use botmesh_tests::transcript::bot_authored;
use botmesh_tests::{bot_of, is_judge, metric, wait_for, MeshSpec, TestMesh};
use tokio::io::{AsyncBufReadExt, BufReader};

const WAIT: Duration = Duration::from_secs(15);
const CONV: &str = "cid6KeBBLoveMJOGXoYKF5x7EeiodoA==";
const ALICE: &str = "Alice";
const ALICE_STAFF: &str = "manager4512";
const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";

fn robot(name: &str) -> FakeRobot {
    let id = format!("ding{}", name.to_lowercase());
    FakeRobot {
        client_id: id.clone(),
        client_secret: format!("{id}-secret"),
        robot_code: id.clone(),
        name: name.into(),
        dingtalk_id: format!("$:LWCP_v1:${name}=="),
    }
}

/// The `[[bots]]` lines of a DingTalk bot against `fake`.
fn dingtalk_bot(fake: &FakeDingTalk, r: &FakeRobot, peer: &FakeRobot) -> String {
    format!(
        "platform = \"dingtalk\"\ndingtalk = {{ client_id = \"{id}\", client_secret_env = \"{env}\", robot_code = \"{code}\", conversation_id = \"{CONV}\", api_base_url = \"{base}\", peer_user_ids = {{ {peer_name} = \"{peer_id}\" }} }}",
        id = r.client_id,
        env = secret_env(r),
        code = r.robot_code,
        base = fake.base_url,
        peer_name = peer.name,
        peer_id = peer.dingtalk_id,
    )
}

fn secret_env(r: &FakeRobot) -> String {
    format!("{}_CLIENT_SECRET", r.name.to_uppercase())
}

/// The scripted LLM of these tests: judges weigh only Alice's messages (each listed bot
/// says `(speak, relevance)`, the others no), replies say `reply(bot)`.
fn llm(
    judge: &[(&str, bool, f64)],
    reply: impl Fn(&str) -> String + Send + Sync + 'static,
) -> BotLlm {
    judge
        .iter()
        .fold(
            BotLlm::judging(false, 0.0).judging_only(&format!("New from {ALICE}:")),
            |l, (bot, speak, relevance)| l.judge(bot, *speak, *relevance),
        )
        .replies(reply)
}

struct Setup {
    fake: FakeDingTalk,
    mesh: TestMesh,
    ada: FakeRobot,
    bo: FakeRobot,
}

/// Ada and Bo on DingTalk (and Cy on the local platform when `with_local`).
async fn setup(llm: &FakeLlm, with_local: bool) -> Setup {
    setup_with(llm, with_local, "", "").await
}

/// [`setup`] with extra lines for Bo's entry and for `[mesh]`.
async fn setup_with(llm: &FakeLlm, with_local: bool, bo_extra: &str, mesh_extra: &str) -> Setup {
    let (ada, bo) = (robot("Ada"), robot("Bo"));
    let fake = FakeDingTalk::start(vec![ada.clone(), bo.clone()]).await;
    let names: &[&str] = if with_local {
        &["Ada", "Bo", "Cy"]
    } else {
        &["Ada", "Bo"]
    };
    let mut spec = MeshSpec::new(names)
        .llm(&llm.base_url)
        .mesh(mesh_extra)
        .all_bots(FAST)
        .bot("Ada", &dingtalk_bot(&fake, &ada, &bo))
        .bot("Bo", &dingtalk_bot(&fake, &bo, &ada))
        .bot("Bo", bo_extra);
    if with_local {
        spec = spec.bot("Cy", "participation = \"mentions\"");
    }
    for r in [&ada, &bo] {
        spec.env.insert(secret_env(r), r.client_secret.clone());
    }
    let mesh = TestMesh::start(spec).await;
    for r in [&ada, &bo] {
        assert!(
            fake.wait_for(WAIT, |f| f.connected(&r.client_id)).await,
            "{} never connected its stream",
            r.name
        );
        assert_eq!(
            fake.subscriptions(&r.client_id),
            serde_json::json!([{"type": "CALLBACK", "topic": "/v1.0/im/bot/messages/get"}])
        );
    }
    Setup {
        fake,
        mesh,
        ada,
        bo,
    }
}

fn with_msg_id<'a>(t: &'a [Envelope], msg_id: &str) -> Vec<&'a Envelope> {
    t.iter()
        .filter(|e| e.platform_msg_id.as_deref() == Some(msg_id))
        .collect()
}

// ---------------------------------------------------------------------------------
// The stand-in, proven by the official SDK
// ---------------------------------------------------------------------------------

/// The interpreter of the venv scripts/test.sh makes.
fn test_python() -> String {
    std::env::var("BOTMESH_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "BOTMESH_TEST_PYTHON is not set: run scripts/test.sh, which creates .venv-test/ \
             with the Python packages this test needs (dingtalk-stream) and sets it"
        )
    })
}

/// A bot written with DingTalk's official Stream SDK: prints each robot message it
/// receives as JSON, answers it through its session webhook with the SDK's
/// `reply_text`, and acknowledges it (the SDK does, after `process`).
const SDK_BOT: &str = r#"
import json, sys
import dingtalk_stream
from dingtalk_stream import AckMessage

class Handler(dingtalk_stream.ChatbotHandler):
    async def process(self, callback):
        msg = dingtalk_stream.ChatbotMessage.from_dict(callback.data)
        print(json.dumps({
            "msgId": msg.message_id,
            "senderNick": msg.sender_nick,
            "senderStaffId": msg.sender_staff_id,
            "text": msg.text.content,
            "conversationId": msg.conversation_id,
            "conversationType": msg.conversation_type,
            "isInAtList": msg.is_in_at_list,
            "atUsers": [u.dingtalk_id for u in msg.at_users],
        }), flush=True)
        self.reply_text("pong from the sdk", msg)
        return AckMessage.STATUS_OK, "OK"

client = dingtalk_stream.DingTalkStreamClient(dingtalk_stream.Credential(sys.argv[1], sys.argv[2]))
client.register_callback_handler(dingtalk_stream.ChatbotMessage.TOPIC, Handler())
client.start_forever()
"#;

#[tokio::test]
async fn the_official_sdk_connects_to_the_stand_in_and_receives_answers_and_acknowledges() {
    let python = test_python();
    let sdk = robot("Sdk");
    let fake = FakeDingTalk::start(vec![sdk.clone()]).await;
    let mut cmd = botmesh_tests::sdk_client::loopback_command(&python);
    cmd.args(["-c", SDK_BOT, &sdk.client_id, &sdk.client_secret])
        .env("DINGTALK_OPENAPI_ENDPOINT", &fake.base_url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python} ({e}): run scripts/test.sh"));
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = child.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        let mut all = String::new();
        while let Ok(Some(l)) = lines.next_line().await {
            all.push_str(&l);
            all.push('\n');
        }
        all
    });

    let connected = fake
        .wait_for(Duration::from_secs(30), |f| f.connected(&sdk.client_id))
        .await;
    if !connected {
        let _ = child.kill().await;
        panic!(
            "the SDK never opened a stream to the stand-in:\n{}",
            log.await.unwrap()
        );
    }
    assert_eq!(
        fake.subscriptions(&sdk.client_id),
        serde_json::json!([{"type": "CALLBACK", "topic": "/v1.0/im/bot/messages/get"}])
    );

    // A ping is acknowledged with its own data.
    let ping = fake.ping(&sdk.client_id, "opaque-7");
    assert!(
        fake.wait_for(WAIT, |f| f
            .acks(&sdk.client_id)
            .iter()
            .any(|a| a["headers"]["messageId"] == ping.as_str()))
            .await
    );
    let ack = fake
        .acks(&sdk.client_id)
        .into_iter()
        .find(|a| a["headers"]["messageId"] == ping.as_str())
        .unwrap();
    assert_eq!(ack["code"], 200);
    let data: serde_json::Value = serde_json::from_str(ack["data"].as_str().unwrap()).unwrap();
    assert_eq!(data["opaque"], "opaque-7");

    // A person's message @-mentioning the robot.
    let msg_id = fake.post(&PersonMessage {
        conversation: CONV,
        sender_nick: ALICE,
        sender_staff_id: ALICE_STAFF,
        text: "@Sdk are you there?",
        at_robots: &[&sdk.client_id],
    });
    let line = tokio::time::timeout(WAIT, stdout.next_line())
        .await
        .ok()
        .and_then(|l| l.ok().flatten());
    let Some(line) = line else {
        let _ = child.kill().await;
        panic!("the SDK printed nothing:\n{}", log.await.unwrap());
    };
    let seen: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        seen,
        serde_json::json!({
            "msgId": msg_id,
            "senderNick": ALICE,
            "senderStaffId": ALICE_STAFF,
            "text": " are you there?",
            "conversationId": CONV,
            "conversationType": "2",
            "isInAtList": true,
            "atUsers": [sdk.dingtalk_id],
        })
    );
    // Acknowledged, so nothing is pending; answered through the session webhook.
    assert!(
        fake.wait_for(WAIT, |f| f.pending(&sdk.client_id) == 0
            && !f.sent().is_empty())
            .await,
        "pending {} sent {:?}",
        fake.pending(&sdk.client_id),
        fake.sent()
    );
    let acked: Vec<_> = fake
        .acks(&sdk.client_id)
        .into_iter()
        .filter(|a| a["headers"]["messageId"] != ping.as_str())
        .collect();
    assert_eq!(acked.len(), 1, "{acked:?}");
    assert_eq!(acked[0]["code"], 200);
    assert_eq!(acked[0]["headers"]["contentType"], "application/json");
    let sent = fake.sent();
    assert_eq!(
        (
            sent[0].via,
            sent[0].robot.as_str(),
            sent[0].conversation.as_str(),
            sent[0].text.as_str(),
            sent[0].at_user_ids.clone()
        ),
        (
            Via::Session,
            sdk.client_id.as_str(),
            CONV,
            "pong from the sdk",
            vec![ALICE_STAFF.to_string()]
        )
    );
    let _ = child.kill().await;
}

// ---------------------------------------------------------------------------------
// The mesh on DingTalk
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_person_mentions_one_robot_it_answers_and_the_other_records_the_message() {
    let llm = llm(&[("Ada", true, 0.9), ("Bo", false, 0.1)], |bot| {
        format!("@{ALICE} {bot} here: the build is green")
    })
    .start()
    .await;
    let s = setup(&llm, false).await;
    let msg_id = s.fake.post(&PersonMessage {
        conversation: CONV,
        sender_nick: ALICE,
        sender_staff_id: ALICE_STAFF,
        text: "@Ada is the build green?",
        at_robots: &[&s.ada.client_id],
    });
    assert!(
        s.fake.wait_for(WAIT, |f| !f.sent().is_empty()).await,
        "nobody answered on dingtalk"
    );
    let t = s.mesh.settle(1, Duration::from_secs(2)).await;

    // Ada answered on DingTalk through the message's session webhook, with a real @.
    let sent = s.fake.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        (
            sent[0].via,
            sent[0].robot.as_str(),
            sent[0].text.as_str(),
            sent[0].at_user_ids.clone()
        ),
        (
            Via::Session,
            s.ada.client_id.as_str(),
            format!("@{ALICE_STAFF} Ada here: the build is green").as_str(),
            vec![ALICE_STAFF.to_string()]
        )
    );

    // Bo, which DingTalk never showed the message, has it from Ada, once, under the
    // person's name and DingTalk's msgId, and Ada's answer after it.
    assert_eq!(s.fake.connections(&s.bo.client_id), 1);
    assert!(
        s.fake.acks(&s.bo.client_id).is_empty(),
        "Bo got nothing from DingTalk"
    );
    let human = with_msg_id(&t, &msg_id);
    assert_eq!(human.len(), 1, "{t:#?}");
    assert_eq!(
        (
            human[0].author.name.as_str(),
            human[0].author.kind,
            human[0].sender.as_str(),
            human[0].text.as_str(),
            human[0].depth
        ),
        (ALICE, AuthorKind::Human, "Ada", "is the build green?", 0)
    );
    let bots = bot_authored(&t);
    assert_eq!(bots.len(), 1, "{t:#?}");
    assert_eq!(bots[0].author.name, "Ada");
    assert_eq!(bots[0].reply_to, Some(human[0].id));
    assert_eq!(
        bots[0].text,
        format!("@{ALICE} Ada here: the build is green")
    );
    // Ada's own transcript: the same two messages; its stream acknowledged the frame.
    let t0 = s.mesh.settle(0, Duration::from_millis(500)).await;
    assert_eq!(with_msg_id(&t0, &msg_id).len(), 1);
    assert_eq!(bot_authored(&t0).len(), 1);
    assert_eq!(s.fake.pending(&s.ada.client_id), 0);
    // Bo was asked (it judged the question: it saw it) and declined.
    assert!(llm
        .requests()
        .iter()
        .any(|r| is_judge(r) && bot_of(r) == "Bo"));
    s.mesh.shutdown().await;
}

#[tokio::test]
async fn a_question_for_the_other_robot_gets_one_answer_from_it() {
    // Both would speak; Bo is the more relevant.
    let llm = llm(&[("Bo", true, 0.9), ("Ada", true, 0.6)], |bot| {
        format!("{bot}: add an index on conversation_id")
    })
    .start()
    .await;
    let s = setup(&llm, false).await;
    // Alice has to @ some robot to be heard at all; she picks Ada, but it is Bo's field.
    let msg_id = s.fake.post(&PersonMessage {
        conversation: CONV,
        sender_nick: ALICE,
        sender_staff_id: ALICE_STAFF,
        text: "@Ada why is the transcript query slow?",
        at_robots: &[&s.ada.client_id],
    });
    assert!(s.fake.wait_for(WAIT, |f| !f.sent().is_empty()).await);
    let t = s.mesh.settle(0, Duration::from_secs(3)).await;
    let bots = bot_authored(&t);
    assert_eq!(
        bots.iter()
            .map(|e| (e.author.name.as_str(), e.text.as_str()))
            .collect::<Vec<_>>(),
        vec![("Bo", "Bo: add an index on conversation_id")],
        "one answer, from Bo"
    );
    assert_eq!(
        bots[0].reply_to,
        Some(with_msg_id(&t, &msg_id)[0].id),
        "an answer to Alice's question"
    );
    // Bo never received the message from DingTalk, so it has no session webhook: it
    // posts with the group-send API and an access token.
    let sent = s.fake.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        (
            sent[0].via,
            sent[0].robot.as_str(),
            sent[0].conversation.as_str()
        ),
        (Via::GroupSend, s.bo.client_id.as_str(), CONV)
    );
    assert_eq!(s.fake.token_requests(), 1);
    let m = s.mesh.metrics(1).await;
    assert_eq!(
        botmesh_tests::metric(&m, r#"botmesh_dingtalk_events_total{result="send_group"}"#),
        1.0,
        "{m}"
    );
    // Ada, which received the question, stood back: behind Bo's better claim, or (on
    // a slow machine) before Bo's answer itself.
    let m = s.mesh.metrics(0).await;
    let yields: f64 = m
        .lines()
        .filter(|l| l.starts_with(r#"botmesh_decisions_total{action="yield"#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(yields, 1.0, "{m}");
    // Bo wrote its reply once; Ada, if it wrote while waiting, threw its text away and
    // says so in its metrics.
    let replies = llm.reply_bots();
    assert_eq!(
        replies.iter().filter(|b| *b == "Bo").count(),
        1,
        "{replies:?}"
    );
    let ada_wrote = replies.iter().filter(|b| *b == "Ada").count() as f64;
    let ada_discarded: f64 = m
        .lines()
        .filter(|l| l.starts_with("botmesh_replies_discarded_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(ada_discarded, ada_wrote, "{m}");
    s.mesh.shutdown().await;
}

#[tokio::test]
async fn a_message_mentioning_both_robots_is_recorded_once_everywhere() {
    // Nobody speaks: the point is the record.
    let llm = llm(&[], |bot| format!("{bot} should not speak"))
        .start()
        .await;
    let s = setup(&llm, true).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let text = format!("@Ada @Bo status update {i}, please note");
        ids.push(s.fake.post(&PersonMessage {
            conversation: CONV,
            sender_nick: ALICE,
            sender_staff_id: ALICE_STAFF,
            text: &text,
            at_robots: &[&s.ada.client_id, &s.bo.client_id],
        }));
    }
    for i in 0..3 {
        let t = s
            .mesh
            .wait_transcript(i, WAIT, |t| {
                ids.iter().all(|id| !with_msg_id(t, id).is_empty())
            })
            .await;
        let t = {
            // Both copies have had time to arrive everywhere.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let _ = t;
            s.mesh.transcript(i).await
        };
        for id in &ids {
            let copies = with_msg_id(&t, id);
            assert_eq!(copies.len(), 1, "node {i}, {id}: {t:#?}");
            assert_eq!(copies[0].author.name, ALICE);
        }
        assert_eq!(t.len(), 3, "node {i}: {t:#?}");
    }
    // Both robots received and acknowledged every message, and each forwarded it: Cy
    // (local) got two envelopes per message and kept one.
    for r in [&s.ada, &s.bo] {
        assert_eq!(s.fake.pending(&r.client_id), 0);
        assert_eq!(
            s.fake
                .acks(&r.client_id)
                .iter()
                .filter(|a| a["code"] == 200)
                .count(),
            3
        );
    }
    let m = s.mesh.metrics(2).await;
    let bridged: f64 =
        botmesh_tests::metric(&m, r#"botmesh_transcript_appends_total{result="bridge"}"#);
    assert_eq!(bridged, 3.0, "{m}");
    assert!(s.fake.sent().is_empty());
    s.mesh.shutdown().await;
}

#[tokio::test]
async fn a_dropped_socket_loses_nothing() {
    let llm = llm(&[], |bot| format!("{bot} should not speak"))
        .start()
        .await;
    let s = setup(&llm, false).await;
    let ada = &s.ada.client_id;
    let post = |text: &str| {
        s.fake.post(&PersonMessage {
            conversation: CONV,
            sender_nick: ALICE,
            sender_staff_id: ALICE_STAFF,
            text,
            at_robots: &[ada],
        })
    };
    // 1. Cut right after a message is sent, before its acknowledgement: delivered again
    //    on the next connection, recorded once.
    s.fake.cut_after_next(ada);
    let m1 = post("@Ada first");
    // 2. Cut while idle (the first message redelivered and acknowledged), and a
    //    message arrives while the robot is away.
    assert!(
        s.fake
            .wait_for(WAIT, |f| f.connections(ada) >= 2
                && f.connected(ada)
                && f.pending(ada) == 0)
            .await
    );
    s.fake.cut(ada);
    let m2 = post("@Ada second");
    // 3. The gateway says goodbye (the second message delivered and acknowledged):
    //    acknowledged, and a new connection follows.
    assert!(
        s.fake
            .wait_for(WAIT, |f| f.connections(ada) >= 3
                && f.connected(ada)
                && f.pending(ada) == 0)
            .await
    );
    s.fake.say_disconnect(ada);
    assert!(
        s.fake
            .wait_for(WAIT, |f| f.connections(ada) >= 4 && f.connected(ada))
            .await
    );
    let m3 = post("@Ada third");
    // 4. Pings are answered with their own data.
    let ping = s.fake.ping(ada, "still-there");
    assert!(
        s.fake
            .wait_for(WAIT, |f| f.pending(ada) == 0
                && f.acks(ada)
                    .iter()
                    .any(|a| a["headers"]["messageId"] == ping.as_str()
                        && a["data"] == "{\"opaque\":\"still-there\"}"))
            .await,
        "acks: {:?}",
        s.fake.acks(ada)
    );
    for i in 0..2 {
        let t = s
            .mesh
            .wait_transcript(i, WAIT, |t| {
                [&m1, &m2, &m3]
                    .iter()
                    .all(|id| !with_msg_id(t, id).is_empty())
            })
            .await;
        let texts: Vec<&str> = t.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts, vec!["first", "second", "third"], "node {i}");
    }
    // The first message really went out twice (its first acknowledgement was lost with
    // the socket), and every message ended acknowledged.
    assert_eq!(s.fake.frames_sent(ada), 4);
    let acked = s
        .fake
        .acks(ada)
        .iter()
        .filter(|a| a["code"] == 200 && a["data"] == "{\"response\":\"OK\"}")
        .count();
    assert_eq!(acked, 3, "{:?}", s.fake.acks(ada));
    // And Ada's metrics tell the story: three messages, one redelivery recognised,
    // the goodbye, the ping, four connections.
    let m = s.mesh.metrics(0).await;
    let count = |result: &str| {
        botmesh_tests::metric(
            &m,
            &format!("botmesh_dingtalk_events_total{{result=\"{result}\"}}"),
        )
    };
    assert_eq!(
        (
            count("message"),
            count("duplicate"),
            count("disconnect"),
            count("ping"),
            count("connected")
        ),
        (3.0, 1.0, 1.0, 1.0, 4.0),
        "{m}"
    );
    s.mesh.shutdown().await;
}

#[tokio::test]
async fn an_expired_session_webhook_falls_back_to_group_send_and_a_refused_token_is_renewed() {
    let llm = llm(&[("Ada", true, 0.9), ("Bo", false, 0.1)], |bot| {
        format!("@{ALICE} {bot} on it")
    })
    .start()
    .await;
    let s = setup(&llm, false).await;
    // The webhook DingTalk hands out has already expired: Ada must use the API.
    s.fake.set_session_ttl(-1_000);
    s.fake.post(&PersonMessage {
        conversation: CONV,
        sender_nick: ALICE,
        sender_staff_id: ALICE_STAFF,
        text: "@Ada first question",
        at_robots: &[&s.ada.client_id],
    });
    assert!(s.fake.wait_for(WAIT, |f| f.sent().len() == 1).await);
    assert_eq!(s.fake.token_requests(), 1);
    // DingTalk forgets the token before it was due: refused, fetched again, sent. The
    // group-send API cannot @ anyone: the person's name stays as written.
    s.fake.revoke_tokens();
    s.fake.post(&PersonMessage {
        conversation: CONV,
        sender_nick: ALICE,
        sender_staff_id: ALICE_STAFF,
        text: "@Ada second question",
        at_robots: &[&s.ada.client_id],
    });
    assert!(
        s.fake.wait_for(WAIT, |f| f.sent().len() == 2).await,
        "{:?}",
        s.fake.sent()
    );
    let sent = s.fake.sent();
    assert!(
        sent.iter().all(|m| m.via == Via::GroupSend
            && m.robot == s.ada.client_id
            && m.text == format!("@{ALICE} Ada on it")
            && m.at_user_ids.is_empty()),
        "{sent:?}"
    );
    assert_eq!(s.fake.token_requests(), 2);
    // The transcript carries DingTalk's processQueryKey as the answers' platform ids.
    let t = s.mesh.settle(1, Duration::from_millis(500)).await;
    let answers = bot_authored(&t);
    assert_eq!(answers.len(), 2);
    assert!(answers.iter().all(|e| e
        .platform_msg_id
        .as_deref()
        .is_some_and(|p| p.starts_with("pqk"))));
    s.mesh.shutdown().await;
}

#[tokio::test]
async fn rich_text_and_pictures_are_recorded_as_text_and_direct_messages_are_not() {
    let llm = llm(&[], |bot| format!("{bot} should not speak"))
        .start()
        .await;
    let s = setup(&llm, false).await;
    let ada = &s.ada.client_id;
    let base = |msg_id: &str| {
        serde_json::json!({
            "conversationId": CONV,
            "conversationType": "2",
            "msgId": msg_id,
            "senderNick": ALICE,
            "senderStaffId": ALICE_STAFF,
            "isInAtList": true,
            "atUsers": [{"dingtalkId": s.ada.dingtalk_id}],
            "createAt": 1_700_000_000_000u64,
            "robotCode": ada,
        })
    };
    let mut rich = base("msgRich1");
    rich["msgtype"] = "richText".into();
    rich["content"] = serde_json::json!({"richText": [
        {"text": "the dashboard looks like this"},
        {"pictureDownloadCode": "pdc", "downloadCode": "dc", "type": "picture"},
        {"text": "\nwhat is that spike?"},
    ]});
    let mut picture = base("msgPic1");
    picture["msgtype"] = "picture".into();
    picture["content"] = serde_json::json!({"downloadCode": "dc2", "pictureDownloadCode": "pdc2"});
    let mut direct = base("msgDirect1");
    direct["conversationType"] = "1".into();
    direct["conversationId"] = "cidDirectChat==".into();
    direct["msgtype"] = "text".into();
    direct["text"] = serde_json::json!({"content": "just between us"});
    for data in [&rich, &picture, &direct] {
        s.fake.push_callback(ada, data);
    }
    assert!(
        s.fake
            .wait_for(WAIT, |f| f.pending(ada) == 0 && f.acks(ada).len() == 3)
            .await,
        "every frame acknowledged, the direct message included: {:?}",
        s.fake.acks(ada)
    );
    let t = s.mesh.wait_transcript(1, WAIT, |t| t.len() >= 2).await;
    let texts: Vec<(&str, &str)> = t
        .iter()
        .map(|e| (e.platform_msg_id.as_deref().unwrap_or(""), e.text.as_str()))
        .collect();
    assert_eq!(
        texts,
        vec![
            (
                "msgRich1",
                "the dashboard looks like this [image]\nwhat is that spike?"
            ),
            ("msgPic1", "[image]"),
        ]
    );
    assert!(t.iter().all(|e| e.author.name == ALICE));
    let m = s.mesh.metrics(0).await;
    assert_eq!(
        botmesh_tests::metric(&m, r#"botmesh_dingtalk_events_total{result="ignored"}"#),
        1.0,
        "{m}"
    );
    s.mesh.shutdown().await;
}

#[tokio::test]
async fn a_mentions_only_robot_answers_its_dingtalk_at_and_the_judging_one_stands_back() {
    // Ada's judge would gladly answer; Bo only ever answers when addressed.
    let llm = llm(&[("Ada", true, 0.9), ("Bo", true, 0.9)], |bot| {
        format!("{bot} answering")
    })
    .start()
    .await;
    let s = setup_with(&llm, false, "participation = \"mentions\"", "").await;
    let msg_id = s.fake.post(&PersonMessage {
        conversation: CONV,
        sender_nick: ALICE,
        sender_staff_id: ALICE_STAFF,
        text: "@Bo can you check the deploy?",
        at_robots: &[&s.bo.client_id],
    });
    assert!(s.fake.wait_for(WAIT, |f| !f.sent().is_empty()).await);
    let t = s.mesh.settle(0, Duration::from_secs(2)).await;
    // DingTalk left Bo's @ out; Bo put it back, so Ada sees whom Alice addressed.
    let human = with_msg_id(&t, &msg_id);
    assert_eq!(human.len(), 1, "{t:#?}");
    assert_eq!(human[0].text, "@Bo can you check the deploy?");
    let bots = bot_authored(&t);
    assert_eq!(
        bots.iter()
            .map(|e| (e.author.name.as_str(), e.text.as_str()))
            .collect::<Vec<_>>(),
        vec![("Bo", "Bo answering")]
    );
    assert_eq!(bots[0].why, Some(botmesh::wire::envelope::Why::Mentioned));
    assert_eq!(
        s.mesh.decisions(0, "silent", "addressed_to_other").await,
        1.0,
        "Ada stood back"
    );
    s.mesh.shutdown().await;
}

#[tokio::test]
async fn a_command_addresses_exactly_the_robots_dingtalk_delivered_it_to() {
    let llm = llm(&[], |bot| format!("{bot} here")).start().await;
    let s = setup(&llm, false).await;
    // DingTalk leaves Ada's @ out of the text it shows Ada: the command still names her.
    let msg_id = s.fake.post(&PersonMessage {
        conversation: CONV,
        sender_nick: ALICE,
        sender_staff_id: ALICE_STAFF,
        text: "/quiet",
        at_robots: &[&s.ada.client_id],
    });
    let health = wait_for(
        WAIT,
        Duration::from_millis(20),
        || s.mesh.health(0),
        |(_, h)| h["quiet_groups"].as_array().is_some_and(|g| g.len() == 1),
    )
    .await;
    // Quiet in the conversation the command was said in, not everywhere.
    assert_eq!(
        health.1["quiet_groups"].as_array().map(Vec::len),
        Some(1),
        "Ada is quiet"
    );
    assert_eq!(health.1["quiet"], false, "Ada is not quiet everywhere");
    // Bo has the command from Ada (recorded the same way) and was not addressed.
    let t = wait_for(
        WAIT,
        Duration::from_millis(20),
        || s.mesh.transcript(1),
        |t: &Vec<Envelope>| !with_msg_id(t, &msg_id).is_empty(),
    )
    .await;
    assert_eq!(with_msg_id(&t, &msg_id)[0].text, "@Ada /quiet");
    assert_eq!(
        s.mesh.health(1).await.1["quiet_groups"],
        serde_json::json!([]),
        "Bo goes on"
    );
    s.mesh.settle(1, Duration::from_millis(500)).await;
    assert!(
        s.fake.sent().is_empty() && llm.count() == 0,
        "nobody answered or judged the command"
    );
    s.mesh.shutdown().await;
}

/// With `[mesh] operators`, a DingTalk person is known by their staff id, on the robot
/// DingTalk delivered the command to and on the colleague it carries it to: Cy, on
/// `local`, believes Ada (a DingTalk robot) about DingTalk's people.
#[tokio::test]
async fn only_an_operators_command_is_carried_out_and_a_dingtalk_robot_vouches_for_its_people() {
    let llm = llm(&[], |bot| format!("{bot} here")).start().await;
    let s = setup_with(
        &llm,
        true,
        "",
        &format!("operators = [\"dingtalk:{ALICE_STAFF}\"]"),
    )
    .await;
    const ADA: usize = 0;
    const CY: usize = 2;
    let count = |i: usize, outcome: &'static str| {
        let mesh = &s.mesh;
        async move {
            metric(
                &mesh.metrics(i).await,
                &format!("botmesh_chat_commands_total{{command=\"quiet\",outcome=\"{outcome}\"}}"),
            )
        }
    };
    // Dan is no operator, though he uses Alice's display name; Alice is, by her staff
    // id: Ada and Cy (carried by Ada) switch the group quiet.
    for (staff, outcome, quiet_groups) in
        [("dan77", "not_operator", 0), (ALICE_STAFF, "applied", 1)]
    {
        s.fake.post(&PersonMessage {
            conversation: CONV,
            sender_nick: ALICE,
            sender_staff_id: staff,
            text: "/quiet @Cy",
            at_robots: &[&s.ada.client_id],
        });
        for i in [ADA, CY] {
            let n = wait_for(
                WAIT,
                Duration::from_millis(20),
                || count(i, outcome),
                |n| *n == 1.0,
            )
            .await;
            assert_eq!(n, 1.0, "node {i}: {staff}'s /quiet is {outcome}");
            let groups = &s.mesh.health(i).await.1["quiet_groups"];
            assert_eq!(
                groups.as_array().map(Vec::len),
                Some(quiet_groups),
                "node {i}: {groups}"
            );
        }
    }
    s.mesh.shutdown().await;
}
