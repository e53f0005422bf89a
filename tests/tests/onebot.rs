//! QQ through OneBot v11 end to end: real nodes with `platform = "onebot"` against the
//! stand-in implementation of tests/src/fake_onebot.rs, first proven faithful by
//! NoneBot's OneBot v11 adapter connecting to it in forward WebSocket mode.

use std::collections::HashMap;
use std::time::Duration;

use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::fake_onebot::{Account, FakeOnebot, Person};
use botmesh_tests::sdk_client::SdkClient;
use botmesh_tests::transcript::assert_each_platform_msg_once;
use botmesh_tests::{bot_msgs, bot_of, is_judge, metric, show, MeshSpec, TestMesh};
use serde_json::json;

const GROUP: i64 = 700100;
const ADA_QQ: i64 = 10001;
const BIX_QQ: i64 = 10002;
const PY_QQ: i64 = 10009;
const CAROL_QQ: i64 = 20001;
const DAN_QQ: i64 = 20002;
const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";
const WAIT: Duration = Duration::from_secs(30);

fn account(self_id: i64, nickname: &str) -> Account {
    Account {
        self_id,
        nickname: nickname.into(),
        token: format!("token-{self_id}"),
        string_form: false,
    }
}

fn people() -> Vec<Person> {
    vec![
        Person {
            user_id: CAROL_QQ,
            nickname: "carol".into(),
            card: "Carol C".into(),
            hidden: false,
        },
        Person {
            user_id: DAN_QQ,
            nickname: "Dan D".into(),
            card: String::new(),
            hidden: true,
        },
    ]
}

// ---------------------------------------------------------------------------------
// The stand-in, proven by NoneBot
// ---------------------------------------------------------------------------------

/// NoneBot 2 with its OneBot v11 adapter, connecting to the stand-in in forward mode
/// (`ONEBOT_WS_URLS`, `ONEBOT_ACCESS_TOKEN`, the websockets driver): it reports its
/// connect, every group message as the adapter parsed it, answers "ping" with a reply
/// segment and text full of CQ's special characters, and exits at "done". One JSON
/// line per event.
const NONEBOT_CLIENT: &str = r#"
import json, os, sys
import nonebot
from nonebot.adapters.onebot.v11 import Adapter, Bot, GroupMessageEvent, Message, MessageSegment

nonebot.init()
driver = nonebot.get_driver()
driver.register_adapter(Adapter)

def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()

@driver.on_bot_connect
async def connected(bot: Bot):
    say(event="connected", self_id=bot.self_id)

from nonebot import on_message
m = on_message(priority=1, block=False)

@m.handle()
async def handle(bot: Bot, event: GroupMessageEvent):
    text = event.get_plaintext()
    say(event="message", text=text, raw=event.raw_message, to_me=event.to_me,
        user=event.user_id, card=event.sender.card, nickname=event.sender.nickname,
        message_id=event.message_id, group=event.group_id)
    if text == "ping":
        r = await bot.send_group_msg(group_id=event.group_id, message=Message([
            MessageSegment.reply(event.message_id), MessageSegment.text("pong & [x], y")]))
        say(event="posted", message_id=r["message_id"])
    if text == "done":
        say(event="done")
        os._exit(0)

nonebot.run()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_in_is_faithful_to_nonebot() {
    botmesh_tests::init_logs();
    let fake = FakeOnebot::start(GROUP, vec![account(PY_QQ, "pybot")], people()).await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("bot.py");
    std::fs::write(&script, NONEBOT_CLIENT).unwrap();
    let mut cmd = tokio::process::Command::new(botmesh_tests::test_python());
    cmd.arg(&script)
        .current_dir(dir.path())
        .env("DRIVER", "~websockets")
        .env("ONEBOT_WS_URLS", format!("[\"{}\"]", fake.ws_url(PY_QQ)))
        .env("ONEBOT_ACCESS_TOKEN", format!("token-{PY_QQ}"))
        .env("LOG_LEVEL", "INFO");
    let mut sdk = SdkClient::start("nonebot", cmd, WAIT);
    let c = sdk
        .expect_line("connect", |v| v["event"] == "connected")
        .await;
    assert_eq!(c["self_id"], PY_QQ.to_string());
    assert_eq!(fake.accepted(PY_QQ), 1, "the token was accepted");

    // An at-segment for the bot and CQ's special characters, parsed by NoneBot.
    fake.say_segments(
        CAROL_QQ,
        json!([{"type": "at", "data": {"qq": PY_QQ.to_string()}}, {"type": "text", "data": {"text": " 1 & [2], 3"}}]),
    );
    let m = sdk
        .expect_line("the at message", |v| v["event"] == "message")
        .await;
    assert_eq!(m["to_me"], true, "{m}");
    assert_eq!(m["text"], "1 & [2], 3", "{m}");
    assert_eq!(
        m["raw"],
        format!("[CQ:at,qq={PY_QQ}] 1 &amp; &#91;2&#93;, 3")
    );
    assert_eq!(
        (m["card"].as_str(), m["user"].as_i64()),
        (Some("Carol C"), Some(CAROL_QQ))
    );

    // A message answered with send_group_msg: a reply segment and text, by echo.
    let ping = fake.say(CAROL_QQ, "ping");
    let posted = sdk
        .expect_line("the answer", |v| v["event"] == "posted")
        .await;
    let sent = fake.sent_by(PY_QQ);
    assert_eq!(sent.len(), 1);
    assert_eq!(posted["message_id"], sent[0].message_id);
    assert_eq!(
        sent[0].message,
        json!([{"type": "reply", "data": {"id": ping.to_string()}}, {"type": "text", "data": {"text": "pong & [x], y"}}])
    );
    assert_eq!(
        sent[0].raw,
        format!("[CQ:reply,id={ping}]pong &amp; &#91;x&#93;, y")
    );

    fake.say(DAN_QQ, "done");
    sdk.expect_line("done", |v| v["event"] == "done").await;
    sdk.finish().await;
    assert!(
        fake.actions().iter().all(|a| a.2 == "ok"),
        "every action answered ok: {:?}",
        fake.actions()
    );
}

// ---------------------------------------------------------------------------------
// A mesh on QQ
// ---------------------------------------------------------------------------------

/// Mentioned bots answer, with CQ's special characters; nobody interjects. Asked to
/// "ask Bix please", Ada names Bix (once: not after it asked).
async fn answering_llm() -> FakeLlm {
    FakeLlm::start(|s| {
        let prompt: String = s.messages.iter().map(|(_, c)| c.as_str()).collect();
        if is_judge(s) {
            Script::reply("{\"speak\": false, \"relevance\": 0.0}")
        } else if bot_of(s) == "Ada"
            && prompt.contains("ask Bix please")
            && !prompt.contains("what do you think")
        {
            Script::reply("@Bix what do you think?")
        } else if prompt.contains("long answer please") && !prompt.contains("Step 1.") {
            let para: String = (1..=8)
                .map(|i| {
                    format!(
                        "Step {i}. {}",
                        "This explains one more part of the plan. ".repeat(20)
                    )
                })
                .collect::<Vec<_>>()
                .join("\n\n");
            Script::reply(para)
        } else {
            Script::reply(format!("answer from {} & [x], y", bot_of(s)))
        }
    })
    .await
}

fn qq_bot(fake: &FakeOnebot, name: &str, qq: i64) -> String {
    format!(
        "platform = \"onebot\"\nonebot = {{ ws_url = \"{}\", access_token_env = \"{}_ONEBOT_TOKEN\", group_id = \"{GROUP}\", self_id = \"{qq}\", send_interval_ms = 200 }}",
        fake.ws_url(qq),
        name.to_uppercase()
    )
}

const ADA: usize = 0;
const BIX: usize = 1;

async fn qq_mesh(llm: &FakeLlm, fake: &FakeOnebot) -> TestMesh {
    let mut spec = MeshSpec::new(&["Ada", "Bix", "Loc"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot("Ada", &qq_bot(fake, "Ada", ADA_QQ))
        .bot("Bix", &qq_bot(fake, "Bix", BIX_QQ))
        .bot("Loc", "participation = \"mentions\"");
    spec.env = HashMap::from([
        ("ADA_ONEBOT_TOKEN".to_string(), format!("token-{ADA_QQ}")),
        ("BIX_ONEBOT_TOKEN".to_string(), format!("token-{BIX_QQ}")),
    ]);
    let mesh = TestMesh::start(spec).await;
    fake.wait("both bots connected and identified", |f| {
        f.connected() == 2
            && f.actions()
                .iter()
                .filter(|a| a.1 == "get_login_info")
                .count()
                == 2
    })
    .await;
    mesh
}

/// Every QQ message at most once in each QQ bot's transcript.
async fn each_message_once(mesh: &TestMesh) {
    for i in [ADA, BIX] {
        let t = mesh.transcript(i).await;
        assert_each_platform_msg_once(&t, &format!("node {i}: a QQ message"));
    }
}

/// Two QQ bots (Bix's implementation sends the CQ-string form): an at-segment and a typed @Name each reach their bot; answers go as
/// a reply segment and text segments (CQ's characters as text both ways); each bot
/// records every message once (its colleague's with the bridge copy, its own echo not
/// again); a failed send is retried once and posted once; a dropped connection and a
/// missed heartbeat each reconnect; a reply naming a colleague carries its at-segment.
#[tokio::test]
async fn two_qq_bots_answer_and_record_every_message_once() {
    botmesh_tests::init_logs();
    let llm = answering_llm().await;
    let fake = FakeOnebot::start(
        GROUP,
        vec![
            account(ADA_QQ, "ada"),
            Account {
                string_form: true,
                ..account(BIX_QQ, "bix")
            },
        ],
        people(),
    )
    .await;
    let mesh = qq_mesh(&llm, &fake).await;

    // 1. A person's at-segment for Ada, with CQ's special characters.
    let q1 = fake.say_segments(
        CAROL_QQ,
        json!([{"type": "at", "data": {"qq": ADA_QQ.to_string()}}, {"type": "text", "data": {"text": " what's 1 & [2], 3?"}}]),
    );
    fake.wait("Ada's answer", |f| f.sent_by(ADA_QQ).len() == 1)
        .await;
    let a1 = &fake.sent_by(ADA_QQ)[0];
    assert_eq!(
        a1.message,
        json!([{"type": "reply", "data": {"id": q1.to_string()}}, {"type": "text", "data": {"text": "answer from Ada & [x], y"}}]),
        "a reply segment, then the text as text"
    );
    assert!(
        a1.raw.ends_with("answer from Ada &amp; &#91;x&#93;, y"),
        "{}",
        a1.raw
    );

    // 2. A typed @Name, from a person whose events carry no name (get_group_member_info).
    fake.say(DAN_QQ, "@Bix hello there");
    fake.wait("Bix's answer", |f| f.sent_by(BIX_QQ).len() == 1)
        .await;

    let two_answers = |t: &[Envelope]| bot_msgs(t).len() == 2;
    for i in [ADA, BIX] {
        mesh.wait_transcript(i, WAIT, two_answers).await;
    }
    mesh.settle(ADA, Duration::from_secs(1)).await;
    for i in [ADA, BIX] {
        let t = mesh.transcript(i).await;
        let people: Vec<(String, String)> = t
            .iter()
            .filter(|e| e.author.kind == AuthorKind::Human)
            .map(|e| (e.author.name.clone(), e.text.clone()))
            .collect();
        assert_eq!(
            people,
            vec![
                ("Carol C".to_string(), "@Ada what's 1 & [2], 3?".to_string()),
                ("Dan D".to_string(), "@Bix hello there".to_string()),
            ],
            "node {i}: {:#?}",
            show(&t)
        );
        let bots: Vec<(String, String)> = bot_msgs(&t)
            .iter()
            .map(|e| (e.author.name.clone(), e.text.clone()))
            .collect();
        assert_eq!(
            bots,
            vec![
                ("Ada".to_string(), "answer from Ada & [x], y".to_string()),
                ("Bix".to_string(), "answer from Bix & [x], y".to_string()),
            ],
            "node {i}"
        );
    }
    each_message_once(&mesh).await;
    for i in [ADA, BIX] {
        let m = mesh.metrics(i).await;
        assert_eq!(
            metric(
                &m,
                "botmesh_platform_events_total{platform=\"onebot\",result=\"own\"}"
            ),
            1.0,
            "node {i}: its own message_sent echo, not recorded again"
        );
        assert_eq!(
            metric(
                &m,
                "botmesh_platform_events_total{platform=\"onebot\",result=\"bridge_copy\"}"
            ),
            1.0,
            "node {i}: the colleague's QQ copy, recorded with the bridge copy"
        );
    }
    // Carol's card came with her events; Dan's name was asked for once by each bot.
    let asked = |who: i64| {
        fake.actions()
            .iter()
            .filter(|a| a.0 == who && a.1 == "get_group_member_info" && a.2 == "ok")
            .count()
    };
    assert_eq!((asked(ADA_QQ), asked(BIX_QQ)), (1, 1));

    // 3. A failed send (status: failed) is tried again, and posted once.
    fake.fail_sends(1);
    fake.say_segments(CAROL_QQ, json!([{"type": "at", "data": {"qq": ADA_QQ.to_string()}}, {"type": "text", "data": {"text": " again?"}}]));
    fake.wait("Ada's second answer", |f| f.sent_by(ADA_QQ).len() == 2)
        .await;
    let sends: Vec<String> = fake
        .actions()
        .into_iter()
        .filter(|a| a.0 == ADA_QQ && a.1 == "send_group_msg")
        .map(|a| a.2)
        .collect();
    assert_eq!(sends, ["ok", "failed", "ok"], "one failure, retried once");

    // 4. A dropped connection: reconnected, and the next mention answered.
    fake.drop_connections();
    fake.wait("both reconnected", |f| {
        f.accepted(ADA_QQ) == 2 && f.accepted(BIX_QQ) == 2 && f.connected() == 2
    })
    .await;
    fake.wait("identified again", |f| {
        f.actions()
            .iter()
            .filter(|a| a.1 == "get_login_info")
            .count()
            == 4
    })
    .await;
    fake.say(DAN_QQ, "@Bix after the drop?");
    fake.wait("Bix's answer after the drop", |f| {
        f.sent_by(BIX_QQ).len() == 2
    })
    .await;

    // 5. Heartbeats stop (interval 1 s): the bots give the silent connection up.
    fake.pause_heartbeats(true);
    fake.wait("both reconnected after missed heartbeats", |f| {
        f.accepted(ADA_QQ) >= 3 && f.accepted(BIX_QQ) >= 3
    })
    .await;
    fake.pause_heartbeats(false);
    assert!(
        fake.sent_by(ADA_QQ).len() == 2 && fake.sent_by(BIX_QQ).len() == 2,
        "nothing posted twice"
    );
    assert_eq!(
        (asked(ADA_QQ), asked(BIX_QQ)),
        (1, 1),
        "Dan's name was cached"
    );

    // 6. A reply naming a colleague: an at-segment of its QQ number, read back as @Bix.
    let q6 = fake.say(CAROL_QQ, "@Ada ask Bix please");
    fake.wait("Ada's question to Bix", |f| f.sent_by(ADA_QQ).len() == 3)
        .await;
    assert_eq!(
        fake.sent_by(ADA_QQ)[2].message,
        json!([
            {"type": "reply", "data": {"id": q6.to_string()}},
            {"type": "at", "data": {"qq": BIX_QQ.to_string()}},
            {"type": "text", "data": {"text": " what do you think?"}}
        ])
    );
    fake.wait("Bix answers Ada", |f| f.sent_by(BIX_QQ).len() == 3)
        .await;
    mesh.settle(BIX, Duration::from_secs(1)).await;
    let t = mesh.transcript(BIX).await;
    let from_ada: Vec<&str> = bot_msgs(&t)
        .iter()
        .filter(|e| e.author.name == "Ada")
        .map(|e| e.text.as_str())
        .collect();
    assert_eq!(
        from_ada.last().copied(),
        Some("@Bix what do you think?"),
        "{:#?}",
        show(&t)
    );

    // 7. A long answer goes in parts, each at least send_interval_ms (200) after the last.
    let before = fake.sent_by(BIX_QQ).len();
    fake.say(CAROL_QQ, "@Bix a long answer please");
    fake.wait("Bix's long answer in parts", |f| {
        f.sent_by(BIX_QQ).len() >= before + 3
    })
    .await;
    mesh.settle(BIX, Duration::from_secs(1)).await;
    let parts: Vec<_> = fake.sent_by(BIX_QQ).into_iter().skip(before).collect();
    assert!(parts.len() >= 3, "{} parts", parts.len());
    for w in parts.windows(2) {
        let gap = w[1].at.duration_since(w[0].at);
        assert!(gap >= Duration::from_millis(190), "parts {gap:?} apart");
    }
    assert!(
        parts[0].raw.starts_with("[CQ:reply"),
        "the first part replies"
    );
    assert!(!parts[1].raw.contains("[CQ:reply"), "later parts do not");
    each_message_once(&mesh).await;
    each_message_once(&mesh).await;
    mesh.shutdown().await;
}

/// A QQ account other than `onebot.self_id`, or a refused access token, stops the
/// adapter with what to fix, and it does not reconnect.
#[tokio::test]
async fn another_account_or_a_wrong_token_stops_the_adapter_with_a_clear_error() {
    botmesh_tests::init_logs();
    let llm = answering_llm().await;
    let fake = FakeOnebot::start(
        GROUP,
        vec![account(ADA_QQ, "ada"), account(BIX_QQ, "bix")],
        people(),
    )
    .await;
    // Ada's settings point at Bix's account.
    let wrong = qq_bot(&fake, "Ada", ADA_QQ).replace(&fake.ws_url(ADA_QQ), &fake.ws_url(BIX_QQ));
    let mut spec = MeshSpec::new(&["Ada", "Loc"])
        .llm(&llm.base_url)
        .bot("Ada", &wrong);
    spec.env = HashMap::from([("ADA_ONEBOT_TOKEN".to_string(), format!("token-{BIX_QQ}"))]);
    let mesh = TestMesh::start(spec).await;
    let why = mesh.platform_stopped(0).await;
    assert!(
        why.contains("onebot.self_id in peers.toml is 10001")
            && why.contains("set onebot.self_id to 10002"),
        "{why}"
    );
    assert_eq!(
        fake.accepted(BIX_QQ),
        1,
        "no reconnect after a fatal mismatch"
    );
    mesh.shutdown().await;

    // The right account, the wrong token.
    let mut spec = MeshSpec::new(&["Ada", "Loc"])
        .llm(&llm.base_url)
        .bot("Ada", &qq_bot(&fake, "Ada", ADA_QQ));
    spec.env = HashMap::from([("ADA_ONEBOT_TOKEN".to_string(), "not-the-token".to_string())]);
    let mesh = TestMesh::start(spec).await;
    let why = mesh.platform_stopped(0).await;
    assert!(
        why.contains("refused the access token") && why.contains("401"),
        "{why}"
    );
    assert_eq!(
        (fake.accepted(ADA_QQ), fake.refused()),
        (0, 1),
        "no retry with a refused token"
    );
    mesh.shutdown().await;
}
