//! WeCom smart robots end to end: real nodes with `platform = "wecom"` against the
//! stand-in long connection of tests/src/fake_wecom.rs, first proven faithful in the
//! same run by WeCom's Python SDK (`wecom-aibot-python-sdk`, tests/requirements.txt).
//!
//! The mesh: Ada, Bo and Cy, three smart robots in one group chat. WeCom shows a
//! person's message only to the robots it @s and never shows robots each other's
//! messages; the bridge closes the gap.

use std::collections::HashMap;
use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::fake_wecom::{FakeWecom, Robot, Shown, Via};
use botmesh_tests::log_check::assert_holds_none;
use botmesh_tests::sdk_client::SdkClient;
use botmesh_tests::{bot_msgs, bot_of, is_judge, metric, subject, MeshSpec, TestMesh};

const CHAT: &str = "wrkSFfCgAAtEamChAt01";
const CAROL: &str = "zhangsan";
const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";
const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------
// The stand-in, proven by the SDK
// ---------------------------------------------------------------------------------

/// WeCom's Python SDK as a robot: logs in (pings every 200 ms), answers the first text
/// callback with a two-frame stream and a proactive markdown send, then waits a few
/// pings and exits. One JSON line per event. 1.0.2 always passes a TLS context, which
/// a ws:// URL refuses: the one-line patch below lets it reach the stand-in.
const SDK_ROBOT: &str = r#"
import asyncio, json, sys
import aibot.ws
aibot.ws._SSL_CONTEXT = None
from aibot import WSClient, WSClientOptions

url, bot_id, secret = sys.argv[1], sys.argv[2], sys.argv[3]

def say(**kw):
    print(json.dumps(kw, ensure_ascii=False), flush=True)

async def main():
    client = WSClient(WSClientOptions(bot_id=bot_id, secret=secret, ws_url=url,
                                      heartbeat_interval=200, max_reconnect_attempts=0))
    done = asyncio.get_running_loop().create_future()
    client.on("authenticated", lambda: say(event="authenticated"))
    def on_error(e):
        say(event="error", error=str(e), connected=client.is_connected)
        if "Authentication failed" in str(e) and not done.done():
            done.set_result(None)
    client.on("error", on_error)
    async def on_text(frame):
        body = frame["body"]
        say(event="message", text=body["text"]["content"], chatid=body["chatid"],
            msgid=body["msgid"], userid=body["from"]["userid"], chattype=body["chattype"])
        await client.reply_stream(frame, "sdk-stream-1", "思考中…", finish=False)
        a = await client.reply_stream(frame, "sdk-stream-1", "pong：你好", finish=True)
        say(event="replied", errcode=a.get("errcode"))
        s = await client.send_message(body["chatid"], {"msgtype": "markdown", "markdown": {"content": "proactive **hello**"}})
        say(event="sent", errcode=s.get("errcode"))
        await asyncio.sleep(0.7)
        if not done.done():
            done.set_result(None)
    client.on("message.text", on_text)
    await client.connect()
    await asyncio.wait_for(done, 30)
    client.disconnect()
    say(event="done")

asyncio.run(main())
"#;

/// The SDK robot `script` logging in at `url` as `bot_id` with `secret`.
fn sdk_robot(script: &std::path::Path, url: &str, bot_id: &str, secret: &str) -> SdkClient {
    let mut cmd = botmesh_tests::sdk_client::loopback_command(botmesh_tests::test_python());
    cmd.arg(script)
        .args([url, bot_id, secret])
        .env("PYTHONIOENCODING", "utf-8");
    SdkClient::start("the sdk", cmd, WAIT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_in_is_faithful_to_the_official_sdk() {
    botmesh_tests::init_logs();
    let py = Robot::named("PyBot");
    let fake = FakeWecom::start(vec![py.clone()]).await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("robot.py");
    std::fs::write(&script, SDK_ROBOT).unwrap();

    // Login, a pushed @-message through its callback, a streamed reply, a proactive send, pings.
    let mut sdk = sdk_robot(&script, &fake.ws_url, &py.bot_id, &py.secret);
    sdk.expect_event("authenticated").await;
    assert_eq!(fake.logins(), vec![(py.bot_id.clone(), 0)]);
    let msgid = fake.say(CAROL, CHAT, "@PyBot ping 你好", &["PyBot"]);
    let m = sdk.expect_event("message").await;
    assert_eq!(m["text"], "@PyBot ping 你好");
    assert_eq!(
        (&m["chatid"], &m["msgid"], &m["userid"], &m["chattype"]),
        (
            &CHAT.into(),
            &msgid.clone().into(),
            &CAROL.into(),
            &"group".into()
        )
    );
    assert_eq!(sdk.expect_event("replied").await["errcode"], 0);
    assert_eq!(sdk.expect_event("sent").await["errcode"], 0);
    sdk.expect_event("done").await;
    sdk.finish().await;
    let shown = fake.shown_by(&py.bot_id);
    assert_eq!(shown.len(), 2, "{shown:#?}");
    assert!(matches!(&shown[0].via, Via::Reply { stream_id, .. } if stream_id == "sdk-stream-1"));
    assert_eq!(
        shown[0].frames,
        ["思考中…", "pong：你好"],
        "the bubble replaced"
    );
    assert!(shown[0].finished);
    assert_eq!(
        (
            shown[1].via.clone(),
            shown[1].chatid.as_str(),
            shown[1].content.as_str()
        ),
        (Via::Send, CHAT, "proactive **hello**")
    );
    assert!(fake.pings(&py.bot_id) >= 2, "pings every 200 ms");
    // The SDK's own frames are the ones botmesh writes (frames::subscribe, request).
    let wire = fake.wire();
    let first: serde_json::Value = serde_json::from_str(&wire[0]).unwrap();
    assert_eq!(first["cmd"], "aibot_subscribe");
    assert!(first["headers"]["req_id"]
        .as_str()
        .unwrap()
        .starts_with("aibot_subscribe_"));
    assert_eq!(
        first["body"],
        serde_json::json!({"bot_id": py.bot_id, "secret": py.secret})
    );
    assert!(wire
        .iter()
        .any(|f| f.contains("\"cmd\": \"ping\"") || f.contains("\"cmd\":\"ping\"")));
    assert!(
        fake.requests().iter().all(|r| r.errcode == 0),
        "{:?}",
        fake.requests()
    );

    // A wrong secret: 853000, as the SDK reads it, and the socket left open.
    fake.wait("the first SDK's socket closed", |f| f.open() == 0)
        .await;
    let mut wrong = sdk_robot(&script, &fake.ws_url, &py.bot_id, "not-the-secret");
    let e = wrong.expect_event("error").await;
    assert!(
        e["error"].as_str().unwrap().contains("853000")
            && e["error"]
                .as_str()
                .unwrap()
                .contains("invalid bot_id or secret"),
        "{e}"
    );
    assert_eq!(
        e["connected"], true,
        "WeCom leaves the refused socket open: {e}"
    );
    wrong.expect_event("done").await;
    wrong.finish().await;
    assert_eq!(fake.logins().last().unwrap().1, 853000);
}

// ---------------------------------------------------------------------------------
// A mesh on WeCom
// ---------------------------------------------------------------------------------

/// The long answer: 1,000 Chinese sentences, 47,893 bytes in one line (17,893
/// characters: one message as UTF-16 would count it, three by WeCom's bytes).
fn long_chinese() -> String {
    (1..=1000)
        .map(|i| format!("第{i}步，这一部分说明计划的细节。"))
        .collect()
}

/// Mentioned bots answer; nobody interjects. Ada asked to ask Bo names Bo once; "ping
/// pong" bots pass the ball to each other forever (depth must end it).
async fn answering_llm() -> FakeLlm {
    FakeLlm::start(|s| {
        let about = subject(s);
        let me = bot_of(s);
        if is_judge(s) {
            Script::reply("{\"speak\": false, \"relevance\": 0.0}")
        } else if me == "Ada" && about.contains("ask Bo please") {
            Script::reply("@Bo what do you think?")
        } else if about.contains("long answer please") {
            Script::reply(long_chinese())
        } else if about.contains("ping pong") || about.contains("your turn") {
            let other = if me == "Ada" { "Bo" } else { "Ada" };
            Script::reply(format!("@{other} your turn"))
        } else {
            Script::reply(format!("answer from {me}"))
        }
    })
    .await
}

fn wecom_bot(fake: &FakeWecom, name: &str) -> String {
    Robot::settings(fake, name, CHAT)
}

fn secret_env(names: &[&str]) -> HashMap<String, String> {
    names
        .iter()
        .map(|n| {
            (
                format!("{}_WECOM_SECRET", n.to_uppercase()),
                Robot::named(n).secret,
            )
        })
        .collect()
}

fn show(t: &[Envelope]) -> Vec<(String, u32, String, Option<String>)> {
    t.iter()
        .map(|e| {
            (
                e.author.name.clone(),
                e.depth,
                e.text.chars().take(60).collect(),
                e.platform_msg_id.clone(),
            )
        })
        .collect()
}

/// Every person's message exactly once in every transcript.
async fn people_once(mesh: &TestMesh, n: usize, fake: &FakeWecom) {
    for i in 0..n {
        let t = mesh.transcript(i).await;
        for said in fake.said() {
            let copies = t
                .iter()
                .filter(|e| e.platform_msg_id.as_deref() == Some(said.msgid.as_str()))
                .count();
            assert_eq!(copies, 1, "node {i}, {}: {:#?}", said.msgid, show(&t));
        }
    }
}

/// What a robot shows, without its frames' history.
fn contents(shown: &[Shown]) -> Vec<(bool, String)> {
    shown
        .iter()
        .map(|s| (s.via == Via::Send, s.content.clone()))
        .collect()
}

/// Three robots in one group: a person's message reaches the robot it @s and is
/// carried to the others once (twice @-ed, still once); answers to people are streams
/// on the callback, finished and never empty; a colleague answers by proactive send;
/// a long Chinese answer goes in parts of at most 20,480 bytes; 45009 is retried and
/// shown once; a stale req_id (846605) falls back to a send; a dropped connection and
/// unanswered pings reconnect; depth ends a loop of bots passing the ball.
#[tokio::test]
async fn three_robots_in_one_group_work_together_through_the_mesh() {
    botmesh_tests::init_logs();
    let llm = answering_llm().await;
    let names = ["Ada", "Bo", "Cy"];
    let fake = FakeWecom::start(names.iter().map(|n| Robot::named(n)).collect()).await;
    let mut spec = MeshSpec::new(&names)
        .llm(&llm.base_url)
        .all_bots(FAST)
        .mesh("max_depth = 4");
    for n in names {
        spec = spec.bot(n, &wecom_bot(&fake, n));
    }
    spec.env = secret_env(&names);
    let mesh = TestMesh::start(spec).await;
    let (ada, bo, cy) = (Robot::id_of("Ada"), Robot::id_of("Bo"), Robot::id_of("Cy"));
    fake.wait("three robots logged in", |f| {
        names.iter().all(|n| f.connected(&Robot::id_of(n)) == 1)
    })
    .await;

    // 1. A person @s Ada: Ada answers on the callback, as a finished stream.
    fake.say(CAROL, CHAT, "@Ada what's 1+1?", &["Ada"]);
    fake.wait("Ada's answer", |f| f.shown_by(&ada).len() == 1)
        .await;
    let a1 = &fake.shown_by(&ada)[0];
    assert!(matches!(a1.via, Via::Reply { .. }), "{a1:?}");
    assert_eq!(a1.chatid, CHAT);
    assert_eq!(a1.content, "answer from Ada");
    assert!(a1.finished, "finish: true");
    for i in 0..3 {
        mesh.wait_transcript(i, WAIT, |t| !bot_msgs(t).is_empty())
            .await;
    }

    // 2. A person @s Ada and Bo: both get the callback, both answer on it, and every
    // transcript keeps the message once.
    fake.say(CAROL, CHAT, "@Ada @Bo both of you?", &["Ada", "Bo"]);
    fake.wait("Ada's and Bo's answers", |f| {
        f.shown_by(&ada).len() == 2 && f.shown_by(&bo).len() == 1
    })
    .await;
    assert!(matches!(fake.shown_by(&bo)[0].via, Via::Reply { .. }));

    // 3. Ada asks Bo: Bo never saw a callback for it, so it answers by proactive send.
    fake.say(CAROL, CHAT, "@Ada ask Bo please", &["Ada"]);
    fake.wait("Bo's answer to Ada", |f| f.shown_by(&bo).len() == 2)
        .await;
    assert_eq!(
        contents(&fake.shown_by(&ada))[2],
        (false, "@Bo what do you think?".to_string())
    );
    let b2 = &fake.shown_by(&bo)[1];
    assert_eq!(
        (b2.via.clone(), b2.chatid.as_str(), b2.content.as_str()),
        (Via::Send, CHAT, "answer from Bo")
    );

    // 4. A long Chinese answer: parts of at most 20,480 bytes, streams on one callback.
    fake.say(CAROL, CHAT, "@Cy a long answer please", &["Cy"]);
    fake.wait("Cy's long answer", |f| f.shown_by(&cy).len() >= 3)
        .await;
    mesh.settle(2, Duration::from_secs(1)).await;
    let parts = fake.shown_by(&cy);
    assert_eq!(parts.len(), 3, "47,893 bytes in three parts");
    for p in &parts {
        assert!(p.content.len() <= 20_480, "{} bytes", p.content.len());
        assert!(p.finished && !p.content.is_empty());
        assert!(matches!(p.via, Via::Reply { .. }));
    }
    let req_ids: Vec<&Via> = parts.iter().map(|p| &p.via).collect();
    assert!(
        req_ids.windows(2).all(|w| match (w[0], w[1]) {
            (Via::Reply { req_id: a, .. }, Via::Reply { req_id: b, .. }) => a == b,
            _ => false,
        }),
        "all on the one callback"
    );
    let joined: String = parts.iter().map(|p| p.content.as_str()).collect();
    assert_eq!(
        joined,
        long_chinese(),
        "nothing lost, nothing cut in a character"
    );

    // 5. 45009 (frequency limit) is retried, and the answer shown once.
    fake.fail_next(&[45009]);
    fake.say(CAROL, CHAT, "@Ada again?", &["Ada"]);
    fake.wait("Ada's answer after 45009", |f| f.shown_by(&ada).len() == 4)
        .await;
    let responds: Vec<i64> = fake
        .requests()
        .iter()
        .filter(|r| r.bot_id == ada && r.cmd == "aibot_respond_msg")
        .map(|r| r.errcode)
        .collect();
    assert_eq!(responds[responds.len() - 2..], [45009, 0]);

    // 6. A req_id WeCom no longer takes (846605): the answer goes as a send.
    fake.fail_next(&[846605]);
    fake.say(CAROL, CHAT, "@Ada stale?", &["Ada"]);
    fake.wait("Ada's answer by send", |f| f.shown_by(&ada).len() == 5)
        .await;
    assert_eq!(
        contents(&fake.shown_by(&ada))[4],
        (true, "answer from Ada".to_string())
    );

    // 7. A dropped connection: logged in again, and the next message answered on its
    // new callback.
    let logins = fake.logins().len();
    fake.drop_connections();
    fake.wait("three robots logged in again", |f| {
        f.logins().len() == logins + 3 && names.iter().all(|n| f.connected(&Robot::id_of(n)) == 1)
    })
    .await;
    fake.say(CAROL, CHAT, "@Bo after the drop?", &["Bo"]);
    fake.wait("Bo's answer after the drop", |f| f.shown_by(&bo).len() == 3)
        .await;
    assert!(matches!(fake.shown_by(&bo)[2].via, Via::Reply { .. }));

    // 8. Pings go unanswered (every 300 ms): after two, the robots reconnect.
    let logins = fake.logins().len();
    fake.pause_pongs(true);
    fake.wait("reconnected after unanswered pings", |f| {
        f.logins().len() >= logins + 3
    })
    .await;
    fake.pause_pongs(false);
    fake.wait("all back", |f| {
        names.iter().all(|n| f.connected(&Robot::id_of(n)) == 1)
    })
    .await;

    // 9. Ada and Bo pass the ball: depth (max 4) ends it.
    let before = |t: &[Envelope]| bot_msgs(t).len();
    let start = before(&mesh.transcript(0).await);
    fake.say(CAROL, CHAT, "@Ada play ping pong with Bo", &["Ada"]);
    mesh.wait_transcript(0, WAIT, |t| before(t) >= start + 2)
        .await;
    mesh.settle(0, Duration::from_secs(3)).await;
    let t = mesh.transcript(0).await;
    let ball: Vec<&Envelope> = bot_msgs(&t)
        .into_iter()
        .filter(|e| e.text.ends_with("your turn"))
        .collect();
    assert!(
        (2..=4).contains(&ball.len()),
        "depth ends the loop: {:#?}",
        show(&t)
    );
    assert!(ball.iter().all(|e| e.depth <= 4));

    // Every person's message once everywhere; people recorded as people.
    people_once(&mesh, 3, &fake).await;
    for i in 0..3 {
        let t = mesh.transcript(i).await;
        let people: Vec<&Envelope> = t
            .iter()
            .filter(|e| e.author.kind == AuthorKind::Human)
            .collect();
        assert_eq!(people.len(), fake.said().len(), "node {i}: {:#?}", show(&t));
        assert!(people.iter().all(|e| e.author.name == CAROL));
        assert_eq!(people[0].text, "@Ada what's 1+1?");
    }
    // No empty bubble, ever.
    assert!(fake
        .shown()
        .iter()
        .all(|s| s.frames.iter().all(|f| !f.trim().is_empty())));
    let m = mesh.metrics(1).await;
    assert!(
        metric(
            &m,
            "botmesh_platform_events_total{platform=\"wecom\",result=\"recorded\"}"
        ) >= 2.0,
        "{m}"
    );
    mesh.shutdown().await;
}

/// A wrong secret (853000) stops the adapter saying what to fix, with no reconnect;
/// so does another client taking the robot (`disconnected_event`), without kicking it
/// back.
#[tokio::test]
async fn a_wrong_secret_or_another_client_stops_the_adapter_without_reconnecting() {
    botmesh_tests::init_logs();
    let llm = answering_llm().await;
    let fake = FakeWecom::start(vec![Robot::named("Ada")]).await;
    let mut spec = MeshSpec::new(&["Ada", "Loc"])
        .llm(&llm.base_url)
        .bot("Ada", &wecom_bot(&fake, "Ada"));
    spec.env = HashMap::from([("ADA_WECOM_SECRET".to_string(), "not-the-secret".to_string())]);
    let mesh = TestMesh::start(spec).await;
    let why = mesh.platform_stopped(0).await;
    assert!(
        why.contains("853000") && why.contains("wecom.secret_env"),
        "{why}"
    );
    assert!(!why.contains("not-the-secret"), "{why}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        fake.logins(),
        vec![(Robot::id_of("Ada"), 853000)],
        "one login, no retry"
    );
    mesh.shutdown().await;

    // The right secret, then another client logs in as Ada.
    let mut spec = MeshSpec::new(&["Ada", "Loc"])
        .llm(&llm.base_url)
        .bot("Ada", &wecom_bot(&fake, "Ada"));
    spec.env = secret_env(&["Ada"]);
    let mesh = TestMesh::start(spec).await;
    fake.wait("Ada logged in", |f| f.connected(&Robot::id_of("Ada")) == 1)
        .await;
    fake.kick(&Robot::id_of("Ada"));
    let why = mesh.platform_stopped(0).await;
    assert!(
        why.contains("another client") && why.contains("disconnected_event"),
        "{why}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        fake.logins().iter().filter(|l| l.1 == 0).count(),
        1,
        "no login after the kick"
    );
    let (status, health) = mesh.health(0).await;
    assert_eq!(status, 503, "{health:#}");
    mesh.shutdown().await;
}

/// A secret distinctive enough to find in a log, as text or as the hex of a frame.
const LOCK_SECRET: &str = "LOCKTEST-wecom-robot-s3cr3t";

/// A WeCom node run as a process with the log at trace (the WebSocket crates' trace
/// lines asked for by name) logs in, answers, and writes the secret nowhere.
#[tokio::test]
async fn the_log_at_trace_holds_no_wecom_secret() {
    let mut ada = Robot::named("Ada");
    ada.secret = LOCK_SECRET.into();
    let fake = FakeWecom::start(vec![ada]).await;
    let wecom = format!(
        "platform = \"wecom\"\nwecom = {{ bot_id = \"{}\", secret_env = \"LOCK_WECOM\", ws_url = \"{}\", chat_id = \"{CHAT}\" }}",
        Robot::id_of("Ada"),
        fake.ws_url
    );
    let mut mesh = botmesh_tests::ProcessMesh::configure(&["Ada"], "", &wecom);
    mesh.spawn_with(
        0,
        &[
            ("LOCK_WECOM", LOCK_SECRET),
            (
                "BOTMESH_LOG",
                "trace,tungstenite=trace,tokio_tungstenite=trace",
            ),
        ],
    )
    .await;
    fake.wait("logged in", |f| f.connected(&Robot::id_of("Ada")) == 1)
        .await;
    mesh.post_from(0, "Ada", "hello from Ada").await;
    fake.wait("Ada's send", |f| {
        !f.shown_by(&Robot::id_of("Ada")).is_empty()
    })
    .await;
    mesh.terminate(0);
    assert!(
        fake.wire()[0].contains(LOCK_SECRET),
        "the secret did go over the wire"
    );
    assert_holds_none(&mesh.log(0), &[LOCK_SECRET]);
}
