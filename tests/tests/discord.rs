//! Discord end to end: real nodes with `platform = "discord"` against the stand-in
//! of tests/src/fake_discord.rs, first proven faithful by discord.py itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use botmesh::platform::discord::gateway::{Gateway, GatewayError, WsConnector};
use botmesh::wire::envelope::AuthorKind;
use botmesh_tests::fake_discord::{BotAccount, FakeDiscord, Limit, Person};
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::sdk_client::SdkClient;
use botmesh_tests::transcript::bot_authored;
use botmesh_tests::{
    bot_of, is_judge, metric, platform_stopped, show, subject, MeshSpec, TestMesh,
};
use tokio_util::sync::CancellationToken;

const CHANNEL: &str = "1200000000000000001";
const OTHER_CHANNEL: &str = "1200000000000000002";
const ADA_ID: &str = "1300000000000000001";
const BIX_ID: &str = "1300000000000000002";
const PY_ID: &str = "1300000000000000009";
const CAROL_ID: &str = "1400000000000000001";
const DAN_ID: &str = "1400000000000000002";
const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";
const WAIT: Duration = Duration::from_secs(20);

fn account(token: &str, id: &str, name: &str) -> BotAccount {
    BotAccount {
        token: token.into(),
        user_id: id.into(),
        username: name.into(),
    }
}

fn people() -> Vec<Person> {
    vec![
        Person {
            id: CAROL_ID.into(),
            username: "carol".into(),
            global_name: Some("Carol".into()),
            nick: Some("Carol C".into()),
        },
        Person {
            id: DAN_ID.into(),
            username: "dan".into(),
            global_name: None,
            nick: None,
        },
    ]
}

// ---------------------------------------------------------------------------------
// The stand-in, proven by discord.py
// ---------------------------------------------------------------------------------

/// discord.py 2.x as a client of the stand-in: it logs in (GET /users/@me), connects
/// to the gateway, gets READY and GUILD_CREATE, reads a MESSAGE_CREATE, shows itself
/// typing (POST .../typing), replies (POST with message_reference) and edits its
/// reply (`Message.edit`: PATCH .../messages/{id}), survives a dropped connection by RESUMEing and
/// gets the message sent while it was away. It prints one JSON line per event.
const DISCORD_PY_CLIENT: &str = r#"
import asyncio, json, sys
import yarl
import discord
from discord.http import Route
from discord.gateway import DiscordWebSocket

api, gateway, token = sys.argv[1:4]
Route.BASE = api
DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway + "/")

def say(**kw):
    print(json.dumps(kw), flush=True)

intents = discord.Intents.default()
intents.message_content = True
client = discord.Client(intents=intents)
# Set when the gateway delivered the bot's own reply: the edit waits for it, else the
# MESSAGE_UPDATE may reach discord.py's cached message before on_message reads it.
own_seen = asyncio.Event()

@client.event
async def on_ready():
    say(event="ready", user=str(client.user.id), name=client.user.name,
        guilds=[str(g.id) for g in client.guilds],
        channels=[str(c.id) for g in client.guilds for c in g.text_channels])

@client.event
async def on_resumed():
    say(event="resumed")

@client.event
async def on_message(m):
    if m.author.id == client.user.id:
        say(event="own", id=str(m.id), content=m.content,
            reference=str(m.reference.message_id) if m.reference else None)
        own_seen.set()
        return
    say(event="message", id=str(m.id), content=m.content, author=m.author.display_name,
        channel=str(m.channel.id), mentions=[str(u.id) for u in m.mentions])
    if m.content == "ping":
        await m.channel.typing()
        r = await m.reply("pong", mention_author=True)
        say(event="replied", id=str(r.id))
        await asyncio.wait_for(own_seen.wait(), timeout=30)
        e = await r.edit(content="pong, edited")
        say(event="edited", id=str(e.id), content=e.content, edited=e.edited_at is not None)
    if m.content == "done":
        await client.close()

async def main():
    async with client:
        await asyncio.wait_for(client.start(token), timeout=60)

asyncio.run(main())
say(event="closed")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_in_is_faithful_to_discord_py() {
    botmesh_tests::init_logs();
    let python = botmesh_tests::test_python();
    let fake = FakeDiscord::start(
        vec![account("py-token", PY_ID, "pybot")],
        people(),
        &[CHANNEL],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("client.py");
    std::fs::write(&script, DISCORD_PY_CLIENT).unwrap();
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(&script)
        .arg(&fake.api_base_url)
        .arg(&fake.gateway_url)
        .arg("py-token");
    let mut sdk = SdkClient::start("discord.py", cmd, WAIT);
    let ready = sdk.expect_line("ready", |v| v["event"] == "ready").await;
    assert_eq!(ready["user"], PY_ID);
    assert_eq!(
        ready["channels"],
        serde_json::json!([CHANNEL]),
        "GUILD_CREATE was understood"
    );

    let ping = fake.say(CHANNEL, CAROL_ID, "ping");
    let m = sdk
        .expect_line("the ping", |v| v["event"] == "message")
        .await;
    assert_eq!(m["id"], ping.as_str());
    assert_eq!(m["author"], "Carol C", "member.nick is the display name");
    assert_eq!(m["channel"], CHANNEL);
    sdk.expect_line("the reply", |v| v["event"] == "replied")
        .await;
    let own = sdk
        .expect_line("its own reply", |v| v["event"] == "own")
        .await;
    assert_eq!(own["content"], "pong");
    assert_eq!(own["reference"], ping.as_str());
    let edited = sdk
        .expect_line("the edit", |v| v["event"] == "edited")
        .await;
    assert_eq!(
        (edited["content"].as_str(), edited["edited"].as_bool()),
        (Some("pong, edited"), Some(true)),
        "discord.py read the edited message the stand-in answered"
    );
    let posted = fake.posted_by(PY_ID);
    assert_eq!(posted.len(), 1);
    assert_eq!(
        (posted[0].content.as_str(), posted[0].edits),
        ("pong, edited", 1)
    );
    assert_eq!(edited["id"], posted[0].id.as_str());
    // discord.py's `await channel.typing()` took the stand-in's 204 (no body).
    let typed = fake.typing();
    assert_eq!(typed.len(), 1, "{typed:?}");
    assert_eq!(
        (typed[0].channel_id.as_str(), typed[0].user_id.as_str()),
        (CHANNEL, PY_ID)
    );
    let req = posted[0].request.as_ref().unwrap();
    // discord.py sends the id as a number, which Discord accepts as well as a string.
    assert_eq!(
        req["message_reference"]["message_id"]
            .to_string()
            .trim_matches('"'),
        ping
    );

    // A drop: discord.py resumes and gets what was said meanwhile.
    fake.drop_connections();
    let while_away = fake.say(CHANNEL, DAN_ID, &format!("while away <@{PY_ID}>"));
    // Discord replays what was missed, then says RESUMED.
    let m = sdk
        .expect_line("the replayed message", |v| v["event"] == "message")
        .await;
    sdk.expect_line("RESUMED", |v| v["event"] == "resumed")
        .await;
    assert_eq!(m["id"], while_away.as_str());
    assert_eq!(m["author"], "dan");
    assert_eq!(m["mentions"], serde_json::json!([PY_ID]));
    let (identifies, resumes, heartbeats, _) = fake.gateway_counts();
    assert_eq!(
        (identifies, resumes),
        (1, 1),
        "resumed, not identified again"
    );
    assert!(heartbeats >= 2, "discord.py heartbeats on every connection");

    fake.say(CHANNEL, CAROL_ID, "done");
    sdk.expect_line("a clean close", |v| v["event"] == "closed")
        .await;
    sdk.finish().await;
    // The same messages, one each, on the REST side.
    assert_eq!(fake.messages(CHANNEL).len(), 4);
}

// ---------------------------------------------------------------------------------
// Gateway close codes against the stand-in
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_bad_token_4004_and_a_missing_intent_4014_stop_with_clear_errors() {
    botmesh_tests::init_logs();
    let fake = FakeDiscord::start(vec![account("good", ADA_ID, "ada")], people(), &[CHANNEL]).await;
    let run = |token: &str| {
        let g = Gateway::new(
            Arc::new(WsConnector),
            fake.gateway_url.clone(),
            token.into(),
        );
        async move {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::time::timeout(WAIT, g.run(tx, CancellationToken::new()))
                .await
                .expect("the gateway stops by itself")
        }
    };
    let e = run("wrong").await.unwrap_err();
    assert_eq!(e, GatewayError::AuthenticationFailed);
    assert!(
        e.to_string().contains("4004") && e.to_string().contains("token"),
        "{e}"
    );
    fake.set_message_content_enabled(false);
    let e = run("good").await.unwrap_err();
    assert_eq!(e, GatewayError::DisallowedIntents);
    assert!(
        e.to_string().contains("4014") && e.to_string().contains("MESSAGE CONTENT"),
        "{e}"
    );
    assert_eq!(
        fake.gateway_counts().0,
        2,
        "one IDENTIFY each, no retry loop"
    );
}

/// The same at node level: a rejected token (401 from `GET /users/@me`) and a
/// disabled MESSAGE CONTENT intent (4014) stop Discord for that node, which says why
/// in `/healthz` (503), while the bridge keeps working.
#[tokio::test]
async fn a_node_says_why_discord_stopped_in_healthz() {
    botmesh_tests::init_logs();
    let fake = FakeDiscord::start(
        vec![
            account("ada-token", ADA_ID, "ada"),
            account("bix-token", BIX_ID, "bix"),
        ],
        people(),
        &[CHANNEL],
    )
    .await;
    fake.set_message_content_enabled(false);
    let mut spec = MeshSpec::new(&["Ada", "Bix"])
        .bot("Ada", &discord_bot("ADA_TOKEN", ADA_ID, &fake))
        .bot("Bix", &discord_bot("BIX_TOKEN", BIX_ID, &fake));
    spec.env = HashMap::from([
        ("ADA_TOKEN".to_string(), "reset-long-ago".to_string()),
        ("BIX_TOKEN".to_string(), "bix-token".to_string()),
    ]);
    let mesh = TestMesh::start(spec).await;
    let (ada, bix) = mesh.health_once_both_stopped(ADA, BIX, WAIT).await;
    assert_eq!(ada.0, 503, "{ada:?}");
    assert_eq!(
        ada.1["platform_stopped"],
        ada.1["platform"]["discord"]["stopped"]
    );
    let why = ada.1["platform_stopped"].as_str().unwrap();
    assert!(
        why.contains("401") && why.contains("discord.token_env"),
        "{why}"
    );
    let why = platform_stopped(&bix);
    assert!(
        why.contains("4014") && why.contains("MESSAGE CONTENT INTENT"),
        "{why}"
    );
    assert_eq!(bix.1["platform"]["discord"]["connected"], false);
    mesh.shutdown().await;
}

// ---------------------------------------------------------------------------------
// A mesh on Discord
// ---------------------------------------------------------------------------------

/// The conversation's LLM: the unmentioned question is Ada's (0.9) more than Bix's
/// (0.5); "what do you think" bounces between Ada and Bix; anything else is nobody's
/// business. Replies name their bot, except the bouncing ones and a long answer.
async fn conversation_llm() -> FakeLlm {
    FakeLlm::start(|s| {
        let about = subject(s);
        let me = bot_of(s);
        if is_judge(s) {
            let (speak, r) = if about.contains("rotate the keys") {
                match me.as_str() {
                    "Ada" => (true, 0.9),
                    "Bix" => (true, 0.5),
                    _ => (false, 0.1),
                }
            } else if about.contains("what do you think") {
                (true, 0.9)
            } else {
                (false, 0.0)
            };
            return Script::reply(format!("{{\"speak\": {speak}, \"relevance\": {r}}}"));
        }
        if about.contains("debate") || about.contains("what do you think") {
            let other = if me == "Ada" { "Bix" } else { "Ada" };
            Script::reply(format!("@{other}, what do you think?"))
        } else if about.contains("ask Loc") {
            Script::reply("@Loc please share the deploy logs")
        } else if about.contains("long answer") {
            let para = "This paragraph explains one more step of the rollout in detail. ".repeat(9);
            Script::reply([para.trim(); 8].join("\n\n"))
        } else {
            Script::reply(format!("answer from {me}"))
        }
    })
    .await
}

fn discord_bot(token_env: &str, id: &str, fake: &FakeDiscord) -> String {
    format!(
        "platform = \"discord\"\ndiscord = {{ token_env = \"{token_env}\", channel_id = \"{CHANNEL}\", user_id = \"{id}\", api_base_url = \"{}\", gateway_url = \"{}\" }}",
        fake.api_base_url, fake.gateway_url
    )
}

struct DiscordMesh {
    mesh: TestMesh,
    fake: FakeDiscord,
    _llm: FakeLlm,
}

const ADA: usize = 0;
const BIX: usize = 1;
const LOC: usize = 2;

async fn discord_mesh() -> DiscordMesh {
    discord_mesh_with(conversation_llm().await, "").await
}

/// [`discord_mesh`] on `llm`, with more `[mesh]` settings.
async fn discord_mesh_with(llm: FakeLlm, extra_mesh: &str) -> DiscordMesh {
    let fake = FakeDiscord::start(
        vec![
            account("ada-token", ADA_ID, "ada"),
            account("bix-token", BIX_ID, "bix"),
        ],
        people(),
        &[CHANNEL, OTHER_CHANNEL],
    )
    .await;
    let mut spec = MeshSpec::new(&["Ada", "Bix", "Loc"])
        .llm(&llm.base_url)
        .mesh(&format!("max_depth = 3\nllm_threshold = 1\n{extra_mesh}"))
        .all_bots(FAST)
        .bot("Ada", &discord_bot("ADA_TOKEN", ADA_ID, &fake))
        .bot("Bix", &discord_bot("BIX_TOKEN", BIX_ID, &fake))
        .bot("Loc", "participation = \"mentions\"");
    spec.env = HashMap::from([
        ("ADA_TOKEN".to_string(), "ada-token".to_string()),
        ("BIX_TOKEN".to_string(), "bix-token".to_string()),
    ]);
    let mesh = TestMesh::start(spec).await;
    fake.wait("both bots connected", |f| f.connected() == 2)
        .await;
    DiscordMesh {
        mesh,
        fake,
        _llm: llm,
    }
}

#[tokio::test]
async fn two_discord_bots_and_a_local_bot_hold_a_conversation() {
    botmesh_tests::init_logs();
    let DiscordMesh { mesh, fake, _llm } = discord_mesh().await;

    // 1. A mention gets an answer on Discord: a reply to the message, pinging its author.
    let q = fake.say(CHANNEL, CAROL_ID, &format!("<@{ADA_ID}> what's the plan?"));
    fake.wait("Ada's answer", |f| f.posted_by(ADA_ID).len() == 1)
        .await;
    let a = &fake.posted_by(ADA_ID)[0];
    let req = a.request.as_ref().unwrap();
    assert_eq!(a.content, "answer from Ada");
    assert_eq!(req["message_reference"]["message_id"], q.as_str());
    assert_eq!(req["allowed_mentions"]["parse"], serde_json::json!([]));
    assert_eq!(
        req["allowed_mentions"]["users"],
        serde_json::json!([CAROL_ID])
    );
    assert_eq!(req["allowed_mentions"]["replied_user"], true);
    let t = mesh
        .wait_transcript(BIX, WAIT, |t| bot_authored(t).len() == 1)
        .await;
    assert_eq!(t[0].author.name, "Carol C");
    assert_eq!(t[0].author.kind, AuthorKind::Human);
    assert_eq!(t[0].text, "@Ada what's the plan?");
    assert_eq!(t[0].platform_msg_id.as_deref(), Some(q.as_str()));
    let answer = bot_authored(&t)[0];
    assert_eq!(
        (
            answer.author.name.as_str(),
            answer.depth,
            answer.platform_msg_id.as_deref()
        ),
        ("Ada", 1, Some(a.id.as_str())),
        "Bix keeps the bridge copy (depth 1) of what it also saw on Discord: {:#?}",
        show(&t)
    );
    let loc = mesh.wait_transcript(LOC, WAIT, |t| !t.is_empty()).await;
    assert_eq!(
        show(&loc)[0].0,
        "Ada",
        "the local bot hears Ada over the bridge"
    );

    // 2. An unmentioned question: one interjection, from the most relevant bot.
    let before = fake.messages(CHANNEL).len();
    fake.say(CHANNEL, DAN_ID, "how do we rotate the keys safely?");
    fake.wait("an interjection", |f| {
        f.messages(CHANNEL)[before..]
            .iter()
            .any(|m| m.request.is_some())
    })
    .await;
    let t = mesh.settle(BIX, Duration::from_secs(3)).await;
    let said: Vec<_> = fake.messages(CHANNEL)[before..]
        .iter()
        .filter(|m| m.request.is_some())
        .map(|m| (m.author_id.clone(), m.content.clone()))
        .collect();
    assert_eq!(
        said,
        vec![(ADA_ID.to_string(), "answer from Ada".to_string())],
        "{:#?}",
        show(&t)
    );

    // Loc never sees Discord's people, so it does not make Ada wait for its judge.
    let m = mesh.metrics(ADA).await;
    assert_eq!(
        metric(
            &m,
            r#"botmesh_decisions_total{action="post",reason="judge_word_missing"}"#
        ),
        0.0,
        "{m}"
    );

    // 3. Ada asks the local bot, which answers over the bridge (depth 2).
    fake.say(
        CHANNEL,
        CAROL_ID,
        &format!("<@{ADA_ID}> ask Loc for the logs"),
    );
    let t = mesh
        .wait_transcript(ADA, WAIT, |t| t.iter().any(|e| e.author.name == "Loc"))
        .await;
    let loc_msg = t.iter().find(|e| e.author.name == "Loc").unwrap();
    assert_eq!(
        (loc_msg.depth, loc_msg.text.as_str()),
        (2, "answer from Loc")
    );
    let ask = fake.posted_by(ADA_ID).last().unwrap().content.clone();
    assert_eq!(
        ask, "@Loc please share the deploy logs",
        "no Discord id for Loc: plain text"
    );

    // 4. Two bots that @ each other stop at max_depth.
    let start = fake.messages(CHANNEL).len();
    fake.say(
        CHANNEL,
        CAROL_ID,
        &format!("<@{ADA_ID}> start a debate with Bix"),
    );
    let t = mesh.settle(ADA, Duration::from_secs(3)).await;
    let on_discord: Vec<_> = fake.messages(CHANNEL)[start..]
        .iter()
        .filter(|m| m.request.is_some())
        .map(|m| (m.author_id.clone(), m.content.clone()))
        .collect();
    assert_eq!(
        on_discord,
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
    let first = &fake.messages(CHANNEL)[start + 1];
    let users = &first.request.as_ref().unwrap()["allowed_mentions"]["users"];
    assert_eq!(
        users,
        &serde_json::json!([BIX_ID, CAROL_ID]),
        "the colleague named and the person answered, nobody else"
    );
    let depths: Vec<u32> = t
        .iter()
        .filter(|e| e.text.contains("what do you think"))
        .map(|e| e.depth)
        .collect();
    assert_eq!(depths, vec![1, 2, 3], "{:#?}", show(&t));
    // Every message once in each Discord bot's transcript.
    for i in [ADA, BIX] {
        let t = mesh.transcript(i).await;
        let mut ids: Vec<&str> = t
            .iter()
            .filter_map(|e| e.platform_msg_id.as_deref())
            .collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(
            ids.len(),
            n,
            "a Discord message recorded twice: {:#?}",
            show(&t)
        );
    }
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_dropped_gateway_resumes_with_no_message_lost_or_doubled() {
    botmesh_tests::init_logs();
    let DiscordMesh { mesh, fake, _llm } = discord_mesh().await;
    fake.say(CHANNEL, DAN_ID, "before the drop");
    mesh.wait_transcript(ADA, WAIT, |t| t.len() == 1).await;
    fake.drop_connections();
    // Said while both bots are disconnected: replayed on RESUME.
    let q = fake.say(
        CHANNEL,
        CAROL_ID,
        &format!("<@{ADA_ID}> are you still there?"),
    );
    fake.say(OTHER_CHANNEL, DAN_ID, "over here too");
    fake.wait("Ada's answer", |f| f.posted_by(ADA_ID).len() == 1)
        .await;
    let a = &fake.posted_by(ADA_ID)[0];
    assert_eq!(
        a.request.as_ref().unwrap()["message_reference"]["message_id"],
        q.as_str()
    );
    let (identifies, resumes, _, _) = fake.gateway_counts();
    assert_eq!(
        identifies, 2,
        "one session per bot, resumed rather than identified again"
    );
    assert!(resumes >= 2, "both bots resumed ({resumes})");
    fake.wait("reconnected", |f| f.connected() == 2).await;
    // A second drop, with a close code that keeps the session.
    fake.close_connections(4000);
    fake.say(CHANNEL, DAN_ID, "after the second drop");
    for i in [ADA, BIX] {
        let t = mesh
            .wait_transcript(i, WAIT, |t| {
                t.iter().any(|e| e.text == "after the second drop") && bot_authored(t).len() == 1
            })
            .await;
        let humans: Vec<&str> = t
            .iter()
            .filter(|e| e.author.kind == AuthorKind::Human)
            .map(|e| e.text.as_str())
            .collect();
        assert_eq!(
            humans,
            vec![
                "before the drop",
                "@Ada are you still there?",
                "after the second drop"
            ],
            "node {i}: {:#?}",
            show(&t)
        );
    }
    // The other channel is a group named by its id.
    let v: serde_json::Value = botmesh_tests::fetch_json(mesh.http.get(format!(
        "{}/v1/transcript?group={OTHER_CHANNEL}",
        mesh.api(BIX)
    )))
    .await;
    assert_eq!(v["messages"][0]["text"], "over here too");
    assert_eq!(fake.gateway_counts().0, 2);
    // Edited and deleted later: logged, not judged again, the transcript unchanged.
    fake.edit(&q, &format!("<@{ADA_ID}> are you still there? (edited)"));
    fake.delete(&q);
    fake.say(CHANNEL, DAN_ID, "last");
    let t = mesh
        .wait_transcript(ADA, WAIT, |t| t.iter().any(|e| e.text == "last"))
        .await;
    assert_eq!(
        t.iter().filter(|e| e.text.contains("still there")).count(),
        1,
        "{:#?}",
        show(&t)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        fake.posted_by(ADA_ID).len(),
        1,
        "no second answer to the edit"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_429_burst_loses_nothing_and_a_long_answer_goes_in_parts() {
    botmesh_tests::init_logs();
    let DiscordMesh { mesh, fake, _llm } = discord_mesh().await;
    fake.rate_limit(
        3,
        Limit {
            retry_after: 0.2,
            global: false,
        },
    );
    fake.rate_limit(
        2,
        Limit {
            retry_after: 0.1,
            global: true,
        },
    );
    fake.empty_bucket_after_each_post(0.3);
    let q = fake.say(
        CHANNEL,
        CAROL_ID,
        &format!("<@{ADA_ID}> give me the long answer"),
    );
    fake.wait("every part", |f| f.posted_by(ADA_ID).len() >= 3)
        .await;
    let t = mesh
        .wait_transcript(BIX, WAIT, |t| bot_authored(t).len() == 1)
        .await;
    let parts = fake.posted_by(ADA_ID);
    assert_eq!(parts.len(), 3, "2,000 characters at most each");
    for p in &parts {
        assert!(p.content.chars().count() <= 2000);
        assert!(
            p.content.ends_with("in detail."),
            "cut at a paragraph: {:?}",
            &p.content[p.content.len() - 30..]
        );
    }
    assert_eq!(
        parts[0].request.as_ref().unwrap()["message_reference"]["message_id"],
        q.as_str()
    );
    for w in parts.windows(2) {
        assert!(
            w[1].at.duration_since(w[0].at) >= Duration::from_millis(290),
            "the empty bucket's X-RateLimit-Reset-After was waited out"
        );
    }
    assert!(parts[1]
        .request
        .as_ref()
        .unwrap()
        .get("message_reference")
        .is_none());
    let statuses: Vec<u16> = fake
        .requests()
        .into_iter()
        .filter(|(r, _)| r.starts_with("POST ") && r.ends_with("/messages"))
        .map(|(_, s)| s)
        .collect();
    assert_eq!(statuses, vec![429, 429, 429, 429, 429, 200, 200, 200]);
    // Bix recorded Ada's answer once, from the bridge, though it saw three parts.
    let answer = bot_authored(&t)[0];
    let ids: Vec<String> = parts.iter().map(|p| p.id.clone()).collect();
    assert_eq!(
        answer.platform_msg_id.as_deref(),
        Some(ids.join(" ").as_str())
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(bot_authored(&mesh.transcript(BIX).await).len(), 1);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_persons_why_for_one_discord_bot_is_answered_on_discord_and_by_nobody_else() {
    let DiscordMesh {
        mesh,
        fake,
        _llm: llm,
    } = discord_mesh().await;
    fake.say(CHANNEL, CAROL_ID, &format!("<@{ADA_ID}> what's the plan?"));
    fake.wait("Ada's answer", |f| f.posted_by(ADA_ID).len() == 1)
        .await;
    mesh.settle(BIX, Duration::from_secs(1)).await;
    let calls = llm.count();

    // Discord's `<@id>` after the command addresses Bix alone.
    let cmd = fake.say(CHANNEL, CAROL_ID, &format!("/why <@{BIX_ID}>"));
    fake.wait("Bix's answer", |f| f.posted_by(BIX_ID).len() == 1)
        .await;
    let why = fake.posted_by(BIX_ID)[0].clone();
    assert!(
        why.content.starts_with("Bix, on ") && why.content.contains("- spoke: no"),
        "{}",
        why.content
    );
    let req = why.request.as_ref().unwrap();
    assert_eq!(req["message_reference"]["message_id"], cmd.as_str());
    // Ada sees Bix's answer (on Discord and over the bridge) and leaves it alone;
    // nothing of it reached an LLM.
    let t = mesh.settle(ADA, Duration::from_secs(2)).await;
    assert_eq!(fake.posted_by(ADA_ID).len(), 1, "{:#?}", show(&t));
    assert_eq!(fake.posted_by(BIX_ID).len(), 1);
    let recorded = t
        .iter()
        .find(|e| e.platform_msg_id.as_deref() == Some(cmd.as_str()))
        .expect("the command is on record");
    assert_eq!(recorded.text, "/why @Bix");
    assert_eq!(
        llm.count(),
        calls,
        "no LLM call for the command or its answer"
    );
    let m = mesh.metrics(ADA).await;
    assert_eq!(
        metric(
            &m,
            r#"botmesh_chat_commands_total{command="why",outcome="not_addressed"}"#
        ),
        1.0,
        "{m}"
    );
    // Loc, on the local platform, never sees Discord's people: nor their commands.
    let m = mesh.metrics(LOC).await;
    assert!(!m.contains("botmesh_chat_commands_total{"), "{m}");
    mesh.shutdown().await;
}

/// With a shared judge, a Discord person's message is judged by Ada or Bix, never by
/// Loc, whose local platform never shows Discord's people: no bot waits for a verdict
/// that cannot come, and each question costs one judge call for the whole mesh.
#[tokio::test]
async fn a_shared_judge_is_chosen_among_the_bots_that_see_discords_people() {
    let llm = FakeLlm::start(|s| {
        if let Some(bots) = botmesh_tests::shared_judge_bots(s) {
            let mut all = serde_json::Map::new();
            for b in bots {
                let r = match b.as_str() {
                    "Ada" => 0.9,
                    "Bix" => 0.5,
                    _ => 0.0,
                };
                all.insert(b, serde_json::json!({"speak": r > 0.0, "relevance": r}));
            }
            return Script::reply(serde_json::Value::Object(all).to_string());
        }
        if is_judge(s) {
            return Script::reply("{\"speak\": false, \"relevance\": 0}");
        }
        Script::reply(format!("answer from {}", bot_of(s)))
    })
    .await;
    let DiscordMesh { mesh, fake, _llm } =
        discord_mesh_with(llm, "judge = \"shared\"\nverdict_timeout_ms = 20000").await;
    const QUESTIONS: usize = 6;
    for k in 0..QUESTIONS {
        let before = fake.posted_by(ADA_ID).len();
        fake.say(
            CHANNEL,
            DAN_ID,
            &format!("how do we rotate the keys safely, part {k}?"),
        );
        fake.wait("Ada's interjection", |f| {
            f.posted_by(ADA_ID).len() == before + 1
        })
        .await;
    }
    mesh.settle(BIX, Duration::from_secs(2)).await;
    assert!(fake.posted_by(BIX_ID).is_empty(), "Bix yields every time");
    let seen = _llm.requests();
    let shared: Vec<Vec<String>> = seen
        .iter()
        .filter_map(botmesh_tests::shared_judge_bots)
        .filter(|bots| !bots.is_empty())
        .collect();
    let about_questions = seen
        .iter()
        .filter(|s| {
            botmesh_tests::shared_judge_bots(s).is_some()
                && s.messages.iter().any(|(_, c)| {
                    c.contains("New from dan: how do we rotate the keys safely, part")
                })
        })
        .count();
    assert_eq!(
        about_questions, QUESTIONS,
        "one judge call per question: {shared:?}"
    );
    assert!(
        shared.iter().all(|bots| !bots.contains(&"Loc".to_string())),
        "Loc is never asked about Discord's people: {shared:?}"
    );
    let own = seen.iter().filter(|s| is_judge(s)).count();
    assert_eq!(own, 0, "no bot judged itself");
    let mut sent = 0.0;
    for i in [ADA, BIX, LOC] {
        let m = mesh.metrics(i).await;
        sent += metric(
            &m,
            r#"botmesh_decisions_total{action="verdict",reason="sent"}"#,
        );
        assert_eq!(
            metric(
                &m,
                r#"botmesh_decisions_total{action="judge",reason="shared_verdict_late"}"#
            ),
            0.0,
            "node {i} waited for a verdict in vain"
        );
    }
    // One verdict per question; the answers need none (Bix passed on the thread, Loc
    // answers mentions only).
    assert_eq!(sent, QUESTIONS as f64);
    mesh.shutdown().await;
}
