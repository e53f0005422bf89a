//! Slack end to end: real nodes with `platform = "slack"` against the stand-in of
//! tests/src/fake_slack.rs, first proven faithful by slack_sdk itself.

use std::collections::HashMap;
use std::time::Duration;

use botmesh::wire::envelope::AuthorKind;
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::fake_slack::{FakeSlack, Person, SlackApp};
use botmesh_tests::log_check::assert_holds_none;
use botmesh_tests::sdk_client::SdkClient;
use botmesh_tests::transcript::{assert_each_platform_msg_once, bot_authored};
use botmesh_tests::{
    bot_of, is_judge, metric, platform_stopped, show, subject, MeshSpec, TestMesh,
};

const CHANNEL: &str = "C0700";
const OTHER_CHANNEL: &str = "C0701";
const ADA_ID: &str = "U1001";
const BIX_ID: &str = "U1002";
const CY_ID: &str = "U1003";
const PY_ID: &str = "U1009";
const CAROL_ID: &str = "U2001";
const DAN_ID: &str = "U2002";
const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";
const WAIT: Duration = Duration::from_secs(20);

fn app(name: &str, user_id: &str, n: u32) -> SlackApp {
    SlackApp {
        name: name.into(),
        user_id: user_id.into(),
        bot_id: format!("B{n:04}"),
        app_id: format!("A{n:04}"),
        bot_token: format!("xoxb-{name}-token"),
        app_token: format!("xapp-{name}-token"),
    }
}

fn people() -> Vec<Person> {
    vec![
        Person {
            id: CAROL_ID.into(),
            name: "carol".into(),
            display_name: "Carol C".into(),
            real_name: "Carol Example".into(),
        },
        Person {
            id: DAN_ID.into(),
            name: "dan".into(),
            display_name: String::new(),
            real_name: "Dan".into(),
        },
    ]
}

// ---------------------------------------------------------------------------------
// The stand-in, proven by slack_sdk
// ---------------------------------------------------------------------------------

/// slack_sdk as a client of the stand-in: `WebClient(base_url=…)` checks who it is
/// (auth.test) and names a person (users.info); the built-in `SocketModeClient`
/// connects (apps.connections.open, then the WebSocket), acknowledges every
/// envelope, answers "ping" in its thread with chat.postMessage, reconnects through a
/// new apps.connections.open after a `disconnect`, and stops at "done". One JSON
/// line per event.
const SLACK_SDK_CLIENT: &str = r#"
import json, sys, threading
from slack_sdk.web import WebClient
from slack_sdk.socket_mode import SocketModeClient
from slack_sdk.socket_mode.response import SocketModeResponse

api, bot_token, app_token, person = sys.argv[1:5]

out = threading.Lock()

def say(**kw):
    # Listeners run on a thread pool: one whole line at a time.
    with out:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()

web = WebClient(token=bot_token, base_url=api)
me = web.auth_test()
say(event="auth", user=me["user_id"], bot=me["bot_id"])
u = web.users_info(user=person)
say(event="user", name=u["user"]["profile"]["display_name"], real=u["user"]["real_name"])

client = SocketModeClient(app_token=app_token, web_client=web)
done = threading.Event()

def on_request(c, req):
    if req.type != "events_api":
        return
    c.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))
    ev = req.payload["event"]
    say(event="event", type=ev["type"], text=ev.get("text"), user=ev.get("user"),
        bot_id=ev.get("bot_id"), thread_ts=ev.get("thread_ts"), retry=req.retry_attempt,
        event_id=req.payload["event_id"])
    if ev["type"] != "message" or ev.get("bot_id"):
        return
    if ev.get("text") == "ping" and not req.retry_attempt:
        r = c.web_client.chat_postMessage(channel=ev["channel"], text="pong &lt;3", thread_ts=ev["ts"])
        say(event="posted", ts=r["ts"], ok=r["ok"])
        u = c.web_client.chat_update(channel=ev["channel"], ts=r["ts"], text="pong, edited")
        say(event="updated", ts=u["ts"], text=u["text"], ok=u["ok"])
    if ev.get("text") == "done":
        done.set()

client.socket_mode_request_listeners.append(on_request)
client.connect()
say(event="connected")
done.wait(60)
client.close()
say(event="closed")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_in_is_faithful_to_slack_sdk() {
    botmesh_tests::init_logs();
    let python = botmesh_tests::test_python();
    let fake = FakeSlack::start(vec![app("pybot", PY_ID, 9)], people(), &[CHANNEL]).await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("client.py");
    std::fs::write(&script, SLACK_SDK_CLIENT).unwrap();
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(&script)
        .arg(&fake.api_base_url)
        .arg("xoxb-pybot-token")
        .arg("xapp-pybot-token")
        .arg(CAROL_ID);
    let mut sdk = SdkClient::start("slack_sdk", cmd, WAIT);
    let stand_in = || format!("stand-in: {:#?} {:#?}", fake.log(), fake.requests());
    let auth = sdk
        .expect_seen_or_next("auth.test", &stand_in, |v| v["event"] == "auth")
        .await;
    assert_eq!(
        (auth["user"].as_str(), auth["bot"].as_str()),
        (Some(PY_ID), Some("B0009"))
    );
    let user = sdk
        .expect_seen_or_next("users.info", &stand_in, |v| v["event"] == "user")
        .await;
    assert_eq!(
        (user["name"].as_str(), user["real"].as_str()),
        (Some("Carol C"), Some("Carol Example"))
    );
    sdk.expect_seen_or_next("connected", &stand_in, |v| v["event"] == "connected")
        .await;
    fake.wait("the socket", |f| f.connections() == 1).await;

    // A person's message: received, acknowledged, answered in its thread.
    let ping = fake.say(CHANNEL, CAROL_ID, "ping");
    let ev = sdk
        .expect_seen_or_next("the ping", &stand_in, |v| {
            v["event"] == "event" && v["text"] == "ping"
        })
        .await;
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["user"].as_str(),
            ev["retry"].as_u64()
        ),
        (Some("message"), Some(CAROL_ID), Some(0))
    );
    let posted = sdk
        .expect_seen_or_next("the reply", &stand_in, |v| v["event"] == "posted")
        .await;
    assert_eq!(posted["ok"], true);
    // Its own message comes back as an event (maybe before chat.postMessage returned).
    let own = sdk
        .expect_seen_or_next("its own reply as an event", &stand_in, |v| {
            v["event"] == "event" && v["user"] == PY_ID
        })
        .await;
    assert_eq!(
        (
            own["text"].as_str(),
            own["bot_id"].as_str(),
            own["thread_ts"].as_str()
        ),
        (Some("pong &lt;3"), Some("B0009"), Some(ping.as_str()))
    );
    // chat_update edits it in place.
    let updated = sdk
        .expect_seen_or_next("the edit", &stand_in, |v| v["event"] == "updated")
        .await;
    assert_eq!(
        (
            updated["ok"].as_bool(),
            updated["ts"].as_str(),
            updated["text"].as_str()
        ),
        (Some(true), posted["ts"].as_str(), Some("pong, edited"))
    );
    let reply = &fake.posted_by(PY_ID)[0];
    assert_eq!(
        (reply.thread_ts.as_deref(), reply.text.as_str(), reply.edits),
        (Some(ping.as_str()), "pong, edited", 1)
    );
    fake.wait("every envelope acknowledged", |f| f.unacked() == 0)
        .await;

    // Slack asks for a new connection: slack_sdk opens one with a new URL.
    fake.disconnect("refresh_requested");
    fake.wait("a second apps.connections.open", |f| f.opens() == 2)
        .await;
    fake.wait("the new connection, and the old one closed", |f| {
        f.connections() == 1 && f.log().iter().filter(|l| l.starts_with("hello ")).count() == 2
    })
    .await;
    fake.say(CHANNEL, DAN_ID, &format!("after the refresh <@{PY_ID}>"));
    let ev = sdk
        .expect_seen_or_next("a message on the new connection", &stand_in, |v| {
            v["event"] == "event" && v["type"] == "message" && v["user"] == DAN_ID
        })
        .await;
    assert_eq!(ev["text"], format!("after the refresh <@{PY_ID}>"));
    sdk.expect_seen_or_next("its app_mention", &stand_in, |v| {
        v["event"] == "event" && v["type"] == "app_mention"
    })
    .await;
    // A redelivery carries retry_attempt.
    let first = fake.events_for(PY_ID)[0].clone();
    fake.redeliver(&first);
    let again = sdk
        .expect_seen_or_next("the redelivery", &stand_in, |v| {
            v["event"] == "event"
                && v["event_id"] == first.as_str()
                && v["retry"].as_u64() == Some(1)
        })
        .await;
    assert_eq!(again["text"], "ping");

    fake.say(CHANNEL, CAROL_ID, "done");
    sdk.expect_seen_or_next("a clean close", &stand_in, |v| v["event"] == "closed")
        .await;
    sdk.finish().await;
    let methods: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.2)
        .map(|r| r.0)
        .collect();
    for m in [
        "auth.test",
        "users.info",
        "apps.connections.open",
        "chat.postMessage",
    ] {
        assert!(
            methods.iter().any(|x| x == m),
            "{m} answered ok: {methods:?}"
        );
    }
    assert!(
        fake.requests().iter().all(|r| r.2),
        "no method failed: {:?}",
        fake.requests()
    );
}

// ---------------------------------------------------------------------------------
// A mesh on Slack
// ---------------------------------------------------------------------------------

/// The conversation's LLM: "what do you think" bounces between Ada and Bix; "escape"
/// answers with markup-looking text; "long answer" is long; anything else unmentioned
/// is nobody's business.
async fn conversation_llm() -> FakeLlm {
    FakeLlm::start(|s| {
        let about = subject(s);
        let me = bot_of(s);
        if is_judge(s) {
            let speak = about.contains("what do you think");
            return Script::reply(format!("{{\"speak\": {speak}, \"relevance\": 0.9}}"));
        }
        if about.contains("debate") || about.contains("what do you think") {
            let other = if me == "Ada" { "Bix" } else { "Ada" };
            Script::reply(format!("@{other}, what do you think?"))
        } else if about.contains("escape") {
            Script::reply("<b>5 < 6 & \"x\"</b> <!channel> @here")
        } else if about.contains("long answer") {
            let para =
                "This paragraph explains one more step of the rollout in detail. ".repeat(20);
            Script::reply([para.trim(); 5].join("\n\n"))
        } else {
            Script::reply(format!("answer from {me}"))
        }
    })
    .await
}

fn slack_bot(name: &str, id: &str, fake: &FakeSlack) -> String {
    let upper = name.to_uppercase();
    format!(
        "platform = \"slack\"\nslack = {{ bot_token_env = \"{upper}_BOT_TOKEN\", app_token_env = \"{upper}_APP_TOKEN\", channel_id = \"{CHANNEL}\", user_id = \"{id}\", api_base_url = \"{}\" }}",
        fake.api_base_url
    )
}

struct SlackMesh {
    mesh: TestMesh,
    fake: FakeSlack,
    _llm: FakeLlm,
}

const ADA: usize = 0;
const BIX: usize = 1;
const LOC: usize = 2;

async fn slack_mesh() -> SlackMesh {
    let llm = conversation_llm().await;
    let fake = FakeSlack::start(
        vec![app("ada", ADA_ID, 1), app("bix", BIX_ID, 2)],
        people(),
        &[CHANNEL, OTHER_CHANNEL],
    )
    .await;
    let mut spec = MeshSpec::new(&["Ada", "Bix", "Loc"])
        .llm(&llm.base_url)
        .mesh("max_depth = 3\nllm_threshold = 1")
        .all_bots(FAST)
        .bot("Ada", &slack_bot("Ada", ADA_ID, &fake))
        .bot("Bix", &slack_bot("Bix", BIX_ID, &fake))
        .bot("Loc", "participation = \"mentions\"");
    spec.env = HashMap::new();
    for n in ["ada", "bix"] {
        let upper = n.to_uppercase();
        spec.env
            .insert(format!("{upper}_BOT_TOKEN"), format!("xoxb-{n}-token"));
        spec.env
            .insert(format!("{upper}_APP_TOKEN"), format!("xapp-{n}-token"));
    }
    let mesh = TestMesh::start(spec).await;
    fake.wait("both bots connected", |f| f.connected() == 2)
        .await;
    SlackMesh {
        mesh,
        fake,
        _llm: llm,
    }
}

/// Every platform message at most once in each bot's transcript.
async fn each_message_once(mesh: &TestMesh) {
    for i in [ADA, BIX] {
        let t = mesh.transcript(i).await;
        assert_each_platform_msg_once(&t, &format!("node {i}: a Slack message"));
    }
}

/// Two Slack bots: a mention is answered (ack before the answer; its thread kept;
/// the person named by users.info; escaping both ways), a colleague is mentioned by
/// user id, two bots that @ each other stop at max_depth, and each bot records every
/// message once, the colleague's with the bridge copy's depth.
#[tokio::test]
async fn two_slack_bots_hold_a_conversation() {
    botmesh_tests::init_logs();
    let SlackMesh { mesh, fake, _llm } = slack_mesh().await;

    // 1. A mention in a thread: answered in the thread, acked before the answer.
    let top = fake.say(CHANNEL, DAN_ID, "a thread starts here");
    let q = fake.say_in_thread(
        CHANNEL,
        CAROL_ID,
        &format!(
            "<@{ADA_ID}> what's the plan for 5 &lt; 6 &amp;&amp; <https://example.com|the docs>?"
        ),
        Some(&top),
    );
    fake.wait("Ada's answer", |f| f.posted_by(ADA_ID).len() == 1)
        .await;
    let a = fake.posted_by(ADA_ID)[0].clone();
    assert_eq!(a.text, "answer from Ada");
    assert_eq!(
        a.thread_ts.as_deref(),
        Some(top.as_str()),
        "answered in the trigger's thread"
    );
    // Every envelope Ada got before answering was acknowledged, each within Slack's 3 s
    // (the stand-in redelivers a late one, as Slack does: none was).
    fake.wait("every envelope acknowledged", |f| f.unacked() == 0)
        .await;
    let log = fake.log();
    let post_at = log.iter().position(|l| l.starts_with("post 0 ")).unwrap();
    let delivered: Vec<&str> = log[..post_at]
        .iter()
        .filter(|l| l.starts_with("deliver 0 "))
        .map(|l| l.split(' ').nth(2).unwrap())
        .collect();
    assert!(
        delivered.len() >= 3,
        "a message, a thread reply and its app_mention: {log:#?}"
    );
    for env in &delivered {
        assert!(
            log.iter().any(|l| l == &format!("ack 0 {env}")),
            "{env}: {log:#?}"
        );
    }
    let t = mesh
        .wait_transcript(BIX, WAIT, |t| bot_authored(t).len() == 1)
        .await;
    let human = t
        .iter()
        .find(|e| e.platform_msg_id.as_deref() == Some(q.as_str()))
        .unwrap();
    assert_eq!(human.author.name, "Carol C", "users.info's display name");
    assert_eq!(
        human.text,
        "@Ada what's the plan for 5 < 6 && the docs (https://example.com)?"
    );
    let answer = bot_authored(&t)[0];
    assert_eq!(
        (
            answer.author.name.as_str(),
            answer.depth,
            answer.platform_msg_id.as_deref()
        ),
        ("Ada", 1, Some(a.ts.as_str())),
        "Bix keeps the bridge copy (depth 1) of what it also saw on Slack: {:#?}",
        show(&t)
    );
    // Loc, a local bot, hears Ada over the bridge and never Slack's people.
    let loc = mesh.wait_transcript(LOC, WAIT, |t| !t.is_empty()).await;
    assert_eq!(
        show(&loc)
            .into_iter()
            .map(|(who, depth, text, _)| (who, depth, text))
            .collect::<Vec<_>>(),
        vec![("Ada".to_string(), 1, "answer from Ada".to_string())]
    );

    // 2. Escaping out: what the LLM wrote is shown literally, nobody pinged.
    fake.say(CHANNEL, CAROL_ID, &format!("<@{BIX_ID}> escape this"));
    fake.wait("Bix's answer", |f| f.posted_by(BIX_ID).len() == 1)
        .await;
    let b = fake.posted_by(BIX_ID)[0].clone();
    assert_eq!(
        b.text,
        "&lt;b&gt;5 &lt; 6 &amp; \"x\"&lt;/b&gt; &lt;!channel&gt; @here"
    );
    assert_eq!(
        b.thread_ts, None,
        "a top-level question gets a top-level answer"
    );
    let t = mesh
        .wait_transcript(ADA, WAIT, |t| {
            t.iter()
                .any(|e| e.platform_msg_id.as_deref() == Some(b.ts.as_str()))
        })
        .await;
    let seen_by_ada = t
        .iter()
        .find(|e| e.platform_msg_id.as_deref() == Some(b.ts.as_str()))
        .unwrap();
    assert_eq!(
        seen_by_ada.text, "<b>5 < 6 & \"x\"</b> <!channel> @here",
        "the bridge copy, as written"
    );

    // 3. Two bots that @ each other stop at max_depth, mentioning by user id.
    let start = fake.messages(CHANNEL).len();
    fake.say(
        CHANNEL,
        CAROL_ID,
        &format!("<@{ADA_ID}> start a debate with Bix"),
    );
    let t = mesh.settle(ADA, Duration::from_secs(3)).await;
    let on_slack: Vec<(String, String)> = fake.messages(CHANNEL)[start..]
        .iter()
        .filter(|m| m.request.is_some())
        .map(|m| (m.user.clone(), m.text.clone()))
        .collect();
    assert_eq!(
        on_slack,
        vec![
            (
                ADA_ID.to_string(),
                format!("<@{BIX_ID}>, what do you think?")
            ),
            (
                BIX_ID.to_string(),
                format!("<@{ADA_ID}>, what do you think?")
            ),
            (
                ADA_ID.to_string(),
                format!("<@{BIX_ID}>, what do you think?")
            ),
        ],
        "{:#?}",
        show(&t)
    );
    let depths: Vec<u32> = t
        .iter()
        .filter(|e| e.text.contains("what do you think"))
        .map(|e| e.depth)
        .collect();
    assert_eq!(depths, vec![1, 2, 3], "{:#?}", show(&t));
    each_message_once(&mesh).await;
    assert_eq!(fake.unacked(), 0, "every envelope acknowledged");
    let log = fake.log();
    assert!(
        !log.iter().any(|l| l.starts_with("late ")),
        "no ack came late: {log:#?}"
    );
    // Ada's answers reached Bix on Slack too, and were dropped for their bridge copies.
    let m = mesh.metrics(BIX).await;
    assert!(
        metric(
            &m,
            r#"botmesh_platform_events_total{platform="slack",result="bridge_copy"}"#
        ) >= 2.0,
        "{m}"
    );
    mesh.shutdown().await;
}

/// Slack's redelivery of an event is recorded once; after a `disconnect` and after a
/// dropped connection the bots reconnect through a new apps.connections.open and
/// nothing is lost (an envelope unacknowledged at the drop comes again) or doubled;
/// edits and deletions are not judged again.
#[tokio::test]
async fn reconnects_and_redeliveries_lose_nothing_and_double_nothing() {
    botmesh_tests::init_logs();
    let SlackMesh { mesh, fake, _llm } = slack_mesh().await;
    let q = fake.say(CHANNEL, CAROL_ID, &format!("<@{ADA_ID}> are you there?"));
    fake.wait("Ada's answer", |f| f.posted_by(ADA_ID).len() == 1)
        .await;
    for e in fake.events_for(ADA_ID) {
        fake.redeliver(&e);
    }
    fake.disconnect("refresh_requested");
    fake.wait("new connections", |f| f.opens() >= 4 && f.connected() == 2)
        .await;
    fake.say(CHANNEL, DAN_ID, "after the refresh");
    fake.disconnect("warning");
    fake.wait("new connections again", |f| {
        f.opens() >= 6 && f.connected() == 2
    })
    .await;
    fake.drop_connections();
    fake.say(CHANNEL, DAN_ID, "while the link was down");
    fake.wait("reconnected after the drop", |f| {
        f.opens() >= 8 && f.connected() == 2
    })
    .await;
    fake.say(CHANNEL, DAN_ID, "after the drop");
    for i in [ADA, BIX] {
        let t = mesh
            .wait_transcript(i, WAIT, |t| {
                t.iter().any(|e| e.text == "after the drop")
                    && t.iter().any(|e| e.text == "while the link was down")
            })
            .await;
        let humans: Vec<&str> = t
            .iter()
            .filter(|e| e.author.kind == AuthorKind::Human)
            .map(|e| e.text.as_str())
            .collect();
        let mut sorted = humans.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            vec![
                "@Ada are you there?",
                "after the drop",
                "after the refresh",
                "while the link was down"
            ],
            "node {i}: {:#?}",
            show(&t)
        );
    }
    fake.edit(CHANNEL, &q, &format!("<@{ADA_ID}> are you there? (edited)"));
    fake.delete(CHANNEL, &q);
    fake.say(CHANNEL, DAN_ID, "last");
    let t = mesh
        .wait_transcript(ADA, WAIT, |t| t.iter().any(|e| e.text == "last"))
        .await;
    assert_eq!(
        t.iter()
            .filter(|e| e.text.contains("are you there"))
            .count(),
        1,
        "{:#?}",
        show(&t)
    );
    mesh.settle(ADA, Duration::from_millis(500)).await;
    assert_eq!(
        fake.posted_by(ADA_ID).len(),
        1,
        "one answer: not again for the redelivery or the edit"
    );
    each_message_once(&mesh).await;
    let m = mesh.metrics(ADA).await;
    assert!(
        metric(
            &m,
            r#"botmesh_platform_events_total{platform="slack",result="duplicate"}"#
        ) >= 3.0,
        "the redeliveries and app_mentions, counted: {m}"
    );
    let retried = fake
        .log()
        .iter()
        .filter(|l| l.starts_with("deliver") && !l.ends_with(" 0"))
        .count();
    assert!(retried > 0, "the stand-in did redeliver");
    // The other channel is a group named by its id.
    fake.say(OTHER_CHANNEL, DAN_ID, "over here too");
    let v: serde_json::Value = loop {
        let v: serde_json::Value = botmesh_tests::fetch_json(mesh.http.get(format!(
            "{}/v1/transcript?group={OTHER_CHANNEL}",
            mesh.api(BIX)
        )))
        .await;
        if v["messages"].as_array().is_some_and(|m| !m.is_empty()) {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(v["messages"][0]["text"], "over here too");
    mesh.shutdown().await;
}

/// A 429 on chat.postMessage is waited out (its Retry-After, once) and a long answer
/// goes in parts cut at paragraphs, each recognised by the colleague.
#[tokio::test]
async fn a_429_is_waited_out_and_a_long_answer_goes_in_parts() {
    botmesh_tests::init_logs();
    let SlackMesh { mesh, fake, _llm } = slack_mesh().await;
    fake.rate_limit(1, 1);
    fake.say(
        CHANNEL,
        CAROL_ID,
        &format!("<@{ADA_ID}> give me the long answer"),
    );
    fake.wait("every part", |f| f.posted_by(ADA_ID).len() >= 2)
        .await;
    let t = mesh
        .wait_transcript(BIX, WAIT, |t| bot_authored(t).len() == 1)
        .await;
    let parts = fake.posted_by(ADA_ID);
    assert_eq!(parts.len(), 2, "4,000 characters at most each");
    for p in &parts {
        assert!(p.text.chars().count() <= 4000);
        assert!(p.text.ends_with("in detail."), "cut at a paragraph");
    }
    let posts: Vec<(u16, bool)> = fake
        .requests()
        .into_iter()
        .filter(|r| r.0 == "chat.postMessage")
        .map(|r| (r.1, r.2))
        .collect();
    assert_eq!(
        posts,
        vec![(429, false), (200, true), (200, true)],
        "one 429, then each part once"
    );
    let ts: Vec<String> = parts.iter().map(|p| p.ts.clone()).collect();
    assert_eq!(
        bot_authored(&t)[0].platform_msg_id.as_deref(),
        Some(ts.join(" ").as_str())
    );
    mesh.settle(BIX, Duration::from_millis(500)).await;
    assert_eq!(bot_authored(&mesh.transcript(BIX).await).len(), 1);
    each_message_once(&mesh).await;
    mesh.shutdown().await;
}

/// A refused bot token, a user id that is not the token's, and Slack's
/// `disconnect: link_disabled` each stop Slack for that node, saying why in `/healthz`
/// (503), with no retry.
#[tokio::test]
async fn a_refused_token_a_wrong_user_id_or_link_disabled_stops_with_a_clear_reason() {
    botmesh_tests::init_logs();
    let fake = FakeSlack::start(
        vec![
            app("ada", ADA_ID, 1),
            app("bix", BIX_ID, 2),
            app("cy", CY_ID, 3),
        ],
        people(),
        &[CHANNEL],
    )
    .await;
    let mut spec = MeshSpec::new(&["Ada", "Bix", "Cy"])
        .bot("Ada", &slack_bot("Ada", ADA_ID, &fake))
        .bot("Bix", &slack_bot("Bix", "U7777", &fake))
        .bot("Cy", &slack_bot("Cy", CY_ID, &fake));
    spec.env = HashMap::from([
        ("ADA_BOT_TOKEN".to_string(), "xoxb-revoked".to_string()),
        ("ADA_APP_TOKEN".to_string(), "xapp-ada-token".to_string()),
        ("BIX_BOT_TOKEN".to_string(), "xoxb-bix-token".to_string()),
        ("BIX_APP_TOKEN".to_string(), "xapp-bix-token".to_string()),
        ("CY_BOT_TOKEN".to_string(), "xoxb-cy-token".to_string()),
        ("CY_APP_TOKEN".to_string(), "xapp-cy-token".to_string()),
    ]);
    let mesh = TestMesh::start(spec).await;
    let (ada, bix) = mesh.health_once_both_stopped(ADA, BIX, WAIT).await;
    let why = platform_stopped(&ada);
    assert!(
        why.contains("invalid_auth") && why.contains("slack.bot_token_env"),
        "{why}"
    );
    let why = platform_stopped(&bix);
    assert!(
        why.contains("U7777") && why.contains(BIX_ID) && why.contains("slack.user_id"),
        "{why}"
    );
    // Cy connects; Slack then disables its Socket Mode link: stopped, not retried.
    fake.wait("Cy connected", |f| f.connected() == 1).await;
    assert_eq!(fake.opens(), 1, "no socket without a confirmed identity");
    assert_eq!(mesh.health(2).await.0, 200);
    fake.disconnect("link_disabled");
    let deadline = tokio::time::Instant::now() + WAIT;
    let cy = loop {
        let c = mesh.health(2).await;
        if c.0 == 503 || tokio::time::Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let why = platform_stopped(&cy);
    assert!(
        why.contains("link_disabled") && why.contains("Socket Mode"),
        "{why}"
    );
    assert_eq!(cy.1["platform"]["slack"]["connected"], false);
    fake.wait("Cy's socket closed", |f| f.connections() == 0)
        .await;
    assert_eq!(fake.opens(), 1, "no reconnect after link_disabled");
    mesh.shutdown().await;
}

/// Bot tokens distinctive enough to find in a log, in any form a frame logger prints
/// them (as text, or as the hex of a frame's bytes).
const LOCK_BOT_TOKEN: &str = "xoxb-LOCKTEST-slack-bot-token-s3cr3t";
/// See [`LOCK_BOT_TOKEN`].
const LOCK_APP_TOKEN: &str = "xapp-LOCKTEST-slack-app-token-s3cr3t";

/// A Slack node run as a process with the log at trace (the WebSocket crates' trace
/// lines asked for by name) connects, posts, and writes neither token anywhere.
#[tokio::test]
async fn the_log_at_trace_holds_no_slack_token() {
    let mut ada = app("ada", ADA_ID, 1);
    ada.bot_token = LOCK_BOT_TOKEN.into();
    ada.app_token = LOCK_APP_TOKEN.into();
    let fake = FakeSlack::start(vec![ada], people(), &[CHANNEL]).await;
    let slack = format!(
        "platform = \"slack\"\nslack = {{ bot_token_env = \"LOCK_BOT\", app_token_env = \"LOCK_APP\", channel_id = \"{CHANNEL}\", user_id = \"{ADA_ID}\", api_base_url = \"{}\" }}",
        fake.api_base_url
    );
    let mut mesh = botmesh_tests::ProcessMesh::configure(&["Ada"], "", &slack);
    mesh.spawn_with(
        0,
        &[
            ("LOCK_BOT", LOCK_BOT_TOKEN),
            ("LOCK_APP", LOCK_APP_TOKEN),
            (
                "BOTMESH_LOG",
                "trace,tungstenite=trace,tokio_tungstenite=trace",
            ),
        ],
    )
    .await;
    fake.wait("the socket", |f| f.connected() == 1).await;
    mesh.post_from(0, "Ada", "hello from Ada").await;
    fake.wait("the bot's post reached slack", |f| {
        !f.posted_by(ADA_ID).is_empty()
    })
    .await;
    mesh.terminate(0);
    assert_holds_none(&mesh.log(0), &[LOCK_BOT_TOKEN, LOCK_APP_TOKEN]);
}
