//! Telegram end to end: real nodes with `platform = "telegram"` against the Bot API
//! stand-in of tests/src/fake_telegram.rs, first proven faithful by
//! python-telegram-bot itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use botmesh::platform::telegram::api::{BotApi, ReplyParameters, SendMessage, RETRY};
use botmesh::platform::ChatPlatform;
use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::fake_telegram::{BotAccount, FakeTelegram, Person};
use botmesh_tests::sdk_client::SdkClient;
use botmesh_tests::serve::{forward, read_request, serve_http};
use botmesh_tests::transcript::{assert_each_platform_msg_once, author};
use botmesh_tests::{
    bot_msgs, bot_of, is_judge, metric, platform_stopped, show, subject, MeshSpec, TestMesh,
};

const CHAT: i64 = -1001234567890;
const OTHER_CHAT: i64 = -1009876543210;
const ALPHA_ID: i64 = 1111;
const BETA_ID: i64 = 2222;
const HELPER_ID: i64 = 3333;
const PY_ID: i64 = 9999;
const CAROL: i64 = 501;
const DAN: i64 = 502;
const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";
const WAIT: Duration = Duration::from_secs(20);

fn account(token: &str, id: i64, username: &str) -> BotAccount {
    BotAccount {
        token: token.into(),
        id,
        username: username.into(),
        first_name: username.trim_end_matches("_bot").to_string(),
    }
}

fn people() -> Vec<Person> {
    vec![
        Person {
            id: CAROL,
            first_name: "Carol".into(),
            last_name: Some("C".into()),
            username: None,
        },
        Person {
            id: DAN,
            first_name: "Dan".into(),
            last_name: None,
            username: Some("dan_the_man".into()),
        },
    ]
}

fn chats() -> [(i64, &'static str); 2] {
    [(CHAT, "Team"), (OTHER_CHAT, "Elsewhere")]
}

// ---------------------------------------------------------------------------------
// The stand-in, proven by python-telegram-bot
// ---------------------------------------------------------------------------------

/// python-telegram-bot 22 as a client of the stand-in: `Application` with its
/// `base_url` at the stand-in initialises (getMe), starts polling (deleteWebhook,
/// getUpdates with long polls and offsets), receives a person's message with its
/// mention entity, shows typing, replies in HTML quoting it, edits the reply, and
/// confirms its updates when it stops. It prints one JSON line per event.
const PTB_CLIENT: &str = r#"
import asyncio, json, sys
from telegram.ext import Application, MessageHandler, filters

base, token = sys.argv[1:3]

def say(**kw):
    print(json.dumps(kw), flush=True)

done = asyncio.Event()

async def on_message(update, context):
    m = update.effective_message
    say(event="message", id=m.message_id, chat=m.chat_id, chat_type=m.chat.type, text=m.text,
        author=m.from_user.full_name,
        mentions=[m.parse_entity(e) for e in m.entities if e.type == "mention"],
        text_mentions=[e.user.id for e in m.entities if e.type == "text_mention"])
    if m.text == "ping":
        await context.bot.send_chat_action(m.chat_id, "typing")
        r = await m.reply_text("pong <b>5 &lt; 6</b>", parse_mode="HTML", do_quote=True)
        say(event="replied", id=r.message_id, text=r.text,
            reply_to=r.reply_to_message.message_id if r.reply_to_message else None,
            bold=[r.parse_entity(e) for e in r.entities if e.type == "bold"])
        e = await r.edit_text("pong, edited")
        say(event="edited", id=e.message_id, text=e.text)
    if m.text == "done":
        done.set()

async def main():
    app = Application.builder().token(token).base_url(base + "/bot").build()
    app.add_handler(MessageHandler(filters.ALL, on_message))
    async with app:
        say(event="ready", id=app.bot.id, username=app.bot.username)
        await app.start()
        await app.updater.start_polling(poll_interval=0.0, timeout=2)
        await asyncio.wait_for(done.wait(), 60)
        await app.updater.stop()
        await app.stop()
    say(event="closed")

asyncio.run(main())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_in_is_faithful_to_python_telegram_bot() {
    botmesh_tests::init_logs();
    let python = botmesh_tests::test_python();
    let fake = FakeTelegram::start(
        vec![account("999:py-token", PY_ID, "py_bot")],
        people(),
        &chats(),
    )
    .await;
    // A webhook left over from elsewhere: start_polling must delete it first.
    fake.set_webhook("py_bot", "https://old.example.com/hook");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("client.py");
    std::fs::write(&script, PTB_CLIENT).unwrap();
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(&script).arg(&fake.api_base_url).arg("999:py-token");
    let mut sdk = SdkClient::start("python-telegram-bot", cmd, WAIT);
    let ready = sdk.expect_line("ready", |v| v["event"] == "ready").await;
    assert_eq!(
        (ready["id"].as_i64(), ready["username"].as_str()),
        (Some(PY_ID), Some("py_bot"))
    );

    // A mention after an emoji and CJK: the entity's UTF-16 offset lands on it.
    let hi = fake.say(CHAT, DAN, "😀 问 @py_bot hello");
    let m = sdk
        .expect_line("the greeting", |v| v["event"] == "message")
        .await;
    assert_eq!(m["id"], hi);
    assert_eq!(m["chat"], CHAT);
    assert_eq!(m["chat_type"], "supergroup");
    assert_eq!(m["author"], "Dan");
    assert_eq!(m["mentions"], serde_json::json!(["@py_bot"]));
    let ping = fake.say(CHAT, CAROL, "ping");
    let m = sdk
        .expect_line("the ping", |v| {
            v["event"] == "message" && v["text"] == "ping"
        })
        .await;
    assert_eq!(m["author"], "Carol C");
    let r = sdk
        .expect_line("the reply", |v| v["event"] == "replied")
        .await;
    assert_eq!(r["text"], "pong 5 < 6", "HTML parsed, &lt; shown as <");
    assert_eq!(
        r["bold"],
        serde_json::json!(["5 < 6"]),
        "the bold entity in UTF-16 units"
    );
    assert_eq!(r["reply_to"], ping);
    let e = sdk
        .expect_line("the edit", |v| v["event"] == "edited")
        .await;
    assert_eq!(e["text"], "pong, edited");
    assert_eq!(
        fake.actions(),
        vec![("py_bot".to_string(), CHAT, "typing".to_string())]
    );
    let posted = fake.posted_by(PY_ID);
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].text, "pong, edited");
    assert_eq!(posted[0].edits, 1);

    fake.say(CHAT, CAROL, "done");
    sdk.expect_line("a clean close", |v| v["event"] == "closed")
        .await;
    sdk.finish().await;
    let calls: Vec<(String, u16)> = fake
        .requests()
        .into_iter()
        .map(|c| (c.method, c.status))
        .collect();
    assert_eq!(calls[0], ("getme".to_string(), 200));
    assert!(
        calls.contains(&("deletewebhook".to_string(), 200)),
        "{calls:?}"
    );
    assert_eq!(fake.webhook("py_bot"), None);
    assert!(
        calls
            .iter()
            .filter(|(m, s)| m == "getupdates" && *s == 200)
            .count()
            >= 2
    );
    assert_eq!(
        fake.pending("py_bot"),
        0,
        "every update confirmed by the last poll at stop"
    );
}

// ---------------------------------------------------------------------------------
// The Bot API client against the stand-in
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn the_api_client_sends_edits_waits_out_429_and_says_when_its_token_is_rejected() {
    botmesh_tests::init_logs();
    let fake = FakeTelegram::start(
        vec![account("111:alpha", ALPHA_ID, "alpha_bot")],
        people(),
        &chats(),
    )
    .await;
    let api = BotApi::new(&fake.api_base_url, "111:alpha", RETRY).unwrap();
    assert_eq!(
        api.get_me().await.unwrap().username.as_deref(),
        Some("alpha_bot")
    );
    let q = fake.say(CHAT, CAROL, "question");
    fake.rate_limit(2, 1);
    let start = std::time::Instant::now();
    let sent = api
        .send_message(&SendMessage {
            chat_id: CHAT,
            text: "5 &lt; 6".into(),
            parse_mode: Some("HTML"),
            reply_parameters: Some(ReplyParameters {
                message_id: q,
                allow_sending_without_reply: true,
            }),
            link_preview_options: serde_json::json!({"is_disabled": true}),
        })
        .await
        .unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "two retry_after of 1 s waited out"
    );
    let sends: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|c| c.method == "sendmessage")
        .collect();
    assert_eq!(
        sends.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![429, 429, 200],
        "once sent, never twice"
    );
    for w in sends.windows(2) {
        assert!(
            w[1].at.duration_since(w[0].at) >= Duration::from_secs(1),
            "never sooner than retry_after"
        );
    }
    assert_eq!(sent.text.as_deref(), Some("5 < 6"));
    let edited = api
        .edit_message_text(CHAT, sent.message_id, "6 &gt; 5")
        .await
        .unwrap();
    assert_eq!(edited.text.as_deref(), Some("6 > 5"));
    let stored = fake.posted_by(ALPHA_ID);
    assert_eq!(
        (stored[0].text.as_str(), stored[0].reply_to, stored[0].edits),
        ("6 > 5", Some(q), 1)
    );
    let e = api.edit_message_text(CHAT, 9_999, "x").await.unwrap_err();
    assert_eq!(e.code(), Some(400), "{e}");
    let e = api.edit_message_text(CHAT, q, "x").await.unwrap_err();
    assert!(
        e.to_string().contains("can't be edited"),
        "a person's message: {e}"
    );
    assert!(api.send_typing(CHAT).await.unwrap());
    let bad = BotApi::new(&fake.api_base_url, "111:zzz-stale", RETRY).unwrap();
    let e = bad.get_me().await.unwrap_err();
    assert!(
        e.to_string().contains("telegram.token_env") && !e.to_string().contains("zzz-stale"),
        "{e}"
    );
}

/// `ChatPlatform::typing` of a telegram adapter shows "typing" in the group's chat,
/// and asks to be repeated within Telegram's 5 s.
#[tokio::test]
async fn the_adapter_shows_typing_in_its_group() {
    botmesh_tests::init_logs();
    let fake = FakeTelegram::start(
        vec![account("111:alpha", ALPHA_ID, "alpha_bot")],
        people(),
        &chats(),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peers.toml");
    std::fs::write(
        &path,
        format!(
            "[mesh]\nsecret_env = \"S\"\n[[bots]]\nname = \"Alpha\"\nbridge = \"127.0.0.1:7101\"\napi = \"127.0.0.1:8101\"\n{}",
            telegram_bot("ALPHA_TOKEN", "alpha_bot", &fake)
        ),
    )
    .unwrap();
    let settings = botmesh::config::Settings::load_with_env(&path, &[]).unwrap();
    let env: HashMap<String, String> = HashMap::from([
        ("S".into(), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
        ("ALPHA_TOKEN".into(), "111:alpha".into()),
    ]);
    let cfg = botmesh::config::NodeConfig::resolve(settings, "Alpha", None, &env).unwrap();
    let tg = botmesh::platform::telegram::Telegram::from_config(&cfg).unwrap();
    tg.typing("demo").await.unwrap();
    tg.typing(&OTHER_CHAT.to_string()).await.unwrap();
    assert_eq!(
        fake.actions(),
        vec![
            ("alpha_bot".to_string(), CHAT, "typing".to_string()),
            ("alpha_bot".to_string(), OTHER_CHAT, "typing".to_string())
        ],
        "[mesh].group is telegram.chat_id; another group is its chat"
    );
    assert!(tg.typing("not-a-chat").await.is_err());
    assert!(tg.typing_every().unwrap() < Duration::from_secs(5));
}

// ---------------------------------------------------------------------------------
// A mesh on Telegram
// ---------------------------------------------------------------------------------

/// The conversation's LLM: the unmentioned question is Alpha's (0.9) more than Beta's
/// (0.5); "what do you think" bounces between Alpha and Beta; "echo X" answers X;
/// anything else is nobody's business.
async fn conversation_llm() -> FakeLlm {
    FakeLlm::start(|s| {
        let about = subject(s);
        let me = bot_of(s);
        if is_judge(s) {
            let (speak, r) = if about.contains("rotate the keys") {
                match me.as_str() {
                    "Alpha" => (true, 0.9),
                    "Beta" => (true, 0.5),
                    _ => (false, 0.1),
                }
            } else if about.contains("what do you think") {
                (true, 0.9)
            } else {
                (false, 0.0)
            };
            return Script::reply(format!("{{\"speak\": {speak}, \"relevance\": {r}}}"));
        }
        if let Some((_, echo)) = about.split_once("echo ") {
            Script::reply(echo.trim().to_string())
        } else if about.contains("debate") || about.contains("what do you think") {
            let other = if me == "Alpha" { "Beta" } else { "Alpha" };
            Script::reply(format!("@{other}, what do you think?"))
        } else if about.contains("ask Loc") {
            Script::reply("@Loc please share the deploy logs")
        } else if about.contains("long answer") {
            let para = "This paragraph explains one more step of the rollout in detail. ".repeat(9);
            Script::reply([para.trim(); 9].join("\n\n"))
        } else {
            Script::reply(format!("answer from {me}"))
        }
    })
    .await
}

fn telegram_bot(token_env: &str, username: &str, fake: &FakeTelegram) -> String {
    format!(
        "platform = \"telegram\"\ntelegram = {{ token_env = \"{token_env}\", chat_id = \"{CHAT}\", username = \"{username}\", api_base_url = \"{}\" }}",
        fake.api_base_url
    )
}

struct TelegramMesh {
    mesh: TestMesh,
    fake: FakeTelegram,
    _llm: FakeLlm,
}

const ALPHA: usize = 0;
const BETA: usize = 1;
const LOC: usize = 2;

fn accounts() -> Vec<BotAccount> {
    vec![
        account("111:alpha", ALPHA_ID, "alpha_bot"),
        account("222:beta", BETA_ID, "beta_bot"),
        account("333:helper", HELPER_ID, "helper_bot"),
    ]
}

/// Alpha and Beta on Telegram, Loc local; `prepare` sets the stand-in up before the
/// nodes start.
async fn telegram_mesh(prepare: impl FnOnce(&FakeTelegram)) -> TelegramMesh {
    let llm = conversation_llm().await;
    let fake = FakeTelegram::start(accounts(), people(), &chats()).await;
    prepare(&fake);
    let mut spec = MeshSpec::new(&["Alpha", "Beta", "Loc"])
        .llm(&llm.base_url)
        .mesh("max_depth = 3\nllm_threshold = 1")
        .all_bots(FAST)
        .bot("Alpha", &telegram_bot("ALPHA_TOKEN", "alpha_bot", &fake))
        .bot("Beta", &telegram_bot("BETA_TOKEN", "beta_bot", &fake))
        .bot("Loc", "participation = \"mentions\"");
    spec.env = HashMap::from([
        ("ALPHA_TOKEN".to_string(), "111:alpha".to_string()),
        ("BETA_TOKEN".to_string(), "222:beta".to_string()),
    ]);
    let mesh = TestMesh::start(spec).await;
    // getWebhookInfo is answered just before the first long poll (whose answer is
    // logged only when it returns).
    fake.wait("both bots about to poll", |f| {
        let calls = f.requests();
        ["alpha_bot", "beta_bot"].iter().all(|b| {
            calls
                .iter()
                .any(|c| c.method == "getwebhookinfo" && c.bot == *b)
        })
    })
    .await;
    TelegramMesh {
        mesh,
        fake,
        _llm: llm,
    }
}

/// Every Telegram message at most once in node `i`'s transcript.
async fn each_once(mesh: &TestMesh, i: usize) {
    let mut t = mesh.transcript(i).await;
    t.retain(|e| e.group == "demo");
    assert_each_platform_msg_once(&t, &format!("node {i}: a Telegram message"));
}

#[tokio::test]
async fn two_telegram_bots_and_a_local_bot_hold_a_conversation() {
    botmesh_tests::init_logs();
    let TelegramMesh { mesh, fake, _llm } =
        telegram_mesh(|f| f.set_webhook("beta_bot", "https://old.example.com/hook")).await;
    assert_eq!(
        fake.webhook("beta_bot"),
        None,
        "polling deleted the old webhook"
    );

    // 1. A mention after an emoji and CJK (UTF-16 offsets) gets an answer on Telegram,
    //    replying to the message.
    let q = fake.say(CHAT, CAROL, "😀 问 @alpha_bot what's the plan?");
    fake.wait("Alpha's answer", |f| f.posted_by(ALPHA_ID).len() == 1)
        .await;
    let a = &fake.posted_by(ALPHA_ID)[0];
    let req = a.request.as_ref().unwrap();
    assert_eq!(a.text, "answer from Alpha");
    assert_eq!(a.reply_to, Some(q));
    assert_eq!(req["parse_mode"], "HTML");
    let t = mesh
        .wait_transcript(BETA, WAIT, |t| bot_msgs(t).len() == 1)
        .await;
    assert_eq!(author(&t[0]), ("Carol C", AuthorKind::Human));
    assert_eq!(t[0].text, "😀 问 @Alpha what's the plan?");
    assert_eq!(t[0].platform_msg_id, Some(format!("{CHAT}:{q}")));
    let answer = bot_msgs(&t)[0];
    assert_eq!(
        (
            answer.author.name.as_str(),
            answer.depth,
            answer.platform_msg_id.clone()
        ),
        ("Alpha", 1, Some(format!("{CHAT}:{}", a.message_id))),
        "Beta has Alpha's answer from the bridge (Telegram shows bots no bots): {:#?}",
        show(&t)
    );
    let loc = mesh.wait_transcript(LOC, WAIT, |t| !t.is_empty()).await;
    assert_eq!(
        show(&loc)[0].0,
        "Alpha",
        "the local bot hears Alpha over the bridge"
    );

    // 2. Escaping both ways: what a person wrote as HTML is recorded as written, and
    //    comes back on Telegram literally.
    let before = fake.posted_by(ALPHA_ID).len();
    fake.say(CHAT, DAN, "@alpha_bot echo <b>5 < 6 & \"x\"</b>");
    fake.wait("the echo", |f| f.posted_by(ALPHA_ID).len() == before + 1)
        .await;
    let echo = fake.posted_by(ALPHA_ID).pop().unwrap();
    assert_eq!(echo.text, "<b>5 < 6 & \"x\"</b>", "shown literally");
    assert!(echo.entities.is_empty(), "no bold: {:?}", echo.entities);
    let t = mesh.transcript(BETA).await;
    assert!(
        t.iter()
            .any(|e| e.text == "@Alpha echo <b>5 < 6 & \"x\"</b>" && e.author.name == "Dan"),
        "{:#?}",
        show(&t)
    );

    // Markdown code in a bot's text is Telegram code; what is inside still literal.
    let before = fake.posted_by(ALPHA_ID).len();
    fake.say(CHAT, DAN, "@alpha_bot echo run `ls <dir>` & wait");
    fake.wait("the code echo", |f| {
        f.posted_by(ALPHA_ID).len() == before + 1
    })
    .await;
    let echo = fake.posted_by(ALPHA_ID).pop().unwrap();
    assert_eq!(echo.text, "run ls <dir> & wait");
    assert_eq!(
        echo.entities,
        vec![serde_json::json!({"type": "code", "offset": 4, "length": 8})]
    );

    // 3. An unmentioned question: one interjection, from the most relevant bot.
    let before = fake.messages(CHAT).len();
    fake.say(CHAT, DAN, "how do we rotate the keys safely?");
    fake.wait("an interjection", |f| {
        f.messages(CHAT)[before..]
            .iter()
            .any(|m| m.request.is_some())
    })
    .await;
    let t = mesh.settle(BETA, Duration::from_secs(3)).await;
    let said: Vec<_> = fake.messages(CHAT)[before..]
        .iter()
        .filter(|m| m.request.is_some())
        .map(|m| (m.from_id, m.text.clone()))
        .collect();
    assert_eq!(
        said,
        vec![(ALPHA_ID, "answer from Alpha".to_string())],
        "{:#?}",
        show(&t)
    );

    // 4. Alpha asks the local bot (no handle: plain text), which answers over the bridge.
    fake.say(CHAT, CAROL, "@alpha_bot ask Loc for the logs");
    let t = mesh
        .wait_transcript(ALPHA, WAIT, |t| t.iter().any(|e| e.author.name == "Loc"))
        .await;
    let loc_msg = t.iter().find(|e| e.author.name == "Loc").unwrap();
    assert_eq!(
        (loc_msg.depth, loc_msg.text.as_str()),
        (2, "answer from Loc")
    );
    assert_eq!(
        fake.posted_by(ALPHA_ID).last().unwrap().text,
        "@Loc please share the deploy logs"
    );

    // 5. Two bots that @ each other (real @handle mentions) stop at max_depth.
    let start = fake.messages(CHAT).len();
    fake.say(CHAT, CAROL, "@alpha_bot start a debate with Beta");
    let t = mesh.settle(ALPHA, Duration::from_secs(3)).await;
    let on_telegram: Vec<_> = fake.messages(CHAT)[start..]
        .iter()
        .filter(|m| m.request.is_some())
        .map(|m| (m.from_id, m.text.clone(), m.entities.clone()))
        .collect();
    let mention =
        |len: usize| vec![serde_json::json!({"type": "mention", "offset": 0, "length": len})];
    assert_eq!(
        on_telegram,
        vec![
            (
                ALPHA_ID,
                "@beta_bot, what do you think?".to_string(),
                mention(9)
            ),
            (
                BETA_ID,
                "@alpha_bot, what do you think?".to_string(),
                mention(10)
            ),
            (
                ALPHA_ID,
                "@beta_bot, what do you think?".to_string(),
                mention(9)
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
    for i in [ALPHA, BETA] {
        each_once(&mesh, i).await;
    }
    let from_bots = |bot: &str| {
        fake.updates(bot)
            .iter()
            .filter(|u| u["message"]["from"]["is_bot"] == true)
            .count()
    };
    assert_eq!(
        (from_bots("alpha_bot"), from_bots("beta_bot")),
        (0, 0),
        "without bot-to-bot mode Telegram shows bots no bots: the mesh carried it all"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_restart_loses_nothing_and_repeats_nothing() {
    botmesh_tests::init_logs();
    let TelegramMesh {
        mut mesh,
        fake,
        _llm,
    } = telegram_mesh(|_| {}).await;
    fake.say(CHAT, DAN, "before the restart");
    mesh.wait_transcript(ALPHA, WAIT, |t| t.len() == 1).await;
    mesh.stop(ALPHA).await;
    assert_eq!(
        fake.pending("alpha_bot"),
        0,
        "what was recorded is confirmed at shutdown"
    );
    // Said while Alpha is down: Telegram keeps it until Alpha confirms it.
    fake.say(CHAT, CAROL, "while Alpha was away");
    let q = fake.say(CHAT, CAROL, "@alpha_bot are you back?");
    fake.say(OTHER_CHAT, DAN, "over here too");
    assert_eq!(fake.pending("alpha_bot"), 3);
    mesh.restart(ALPHA).await;
    fake.wait("Alpha's answer", |f| f.posted_by(ALPHA_ID).len() == 1)
        .await;
    assert_eq!(fake.posted_by(ALPHA_ID)[0].reply_to, Some(q));
    let humans = |t: &[Envelope]| -> Vec<String> {
        t.iter()
            .filter(|e| e.author.kind == AuthorKind::Human)
            .map(|e| e.text.clone())
            .collect()
    };
    let want = vec![
        "before the restart",
        "while Alpha was away",
        "@Alpha are you back?",
    ];
    let t = mesh
        .wait_transcript(ALPHA, WAIT, |t| humans(t).len() == 3)
        .await;
    assert_eq!(humans(&t), want, "{:#?}", show(&t));
    // The other group is a group named by its chat id.
    let v = botmesh_tests::fetch_json(mesh.http.get(format!(
        "{}/v1/transcript?group={OTHER_CHAT}",
        mesh.api(ALPHA)
    )))
    .await;
    assert_eq!(v["messages"][0]["text"], "over here too");
    // A node that recorded updates but never confirmed them gets them all again: each
    // is still recorded once, and nothing is answered twice.
    fake.wait("confirmed", |f| f.pending("alpha_bot") == 0)
        .await;
    fake.forget_confirmations("alpha_bot");
    assert!(fake.pending("alpha_bot") >= 4);
    fake.wait("confirmed again", |f| f.pending("alpha_bot") == 0)
        .await;
    let t = mesh.settle(ALPHA, Duration::from_secs(2)).await;
    assert_eq!(humans(&t), want, "{:#?}", show(&t));
    assert_eq!(fake.posted_by(ALPHA_ID).len(), 1, "no second answer");
    each_once(&mesh, ALPHA).await;
    mesh.shutdown().await;
}

/// An update that cannot be recorded (a new group past `[mesh] max_groups`) is not
/// confirmed while nothing can be; once a later one is recorded, it is given up, so
/// it holds up nothing behind it.
#[tokio::test]
async fn an_update_past_max_groups_is_taken_and_dropped_and_holds_up_nothing() {
    botmesh_tests::init_logs();
    let llm = conversation_llm().await;
    let fake = FakeTelegram::start(accounts(), people(), &chats()).await;
    let mut spec = MeshSpec::new(&["Alpha", "Beta"])
        .llm(&llm.base_url)
        .mesh("max_groups = 1")
        .all_bots(FAST)
        .bot("Alpha", &telegram_bot("ALPHA_TOKEN", "alpha_bot", &fake))
        .bot("Beta", "participation = \"mentions\"");
    spec.env = HashMap::from([("ALPHA_TOKEN".to_string(), "111:alpha".to_string())]);
    let mesh = TestMesh::start(spec).await;
    fake.say(CHAT, CAROL, "hello");
    mesh.wait_transcript(ALPHA, WAIT, |t| t.len() == 1).await;
    // A second group is one too many: refused for good, so taken (confirmed) and
    // dropped, never delivered again and again (a webhook answers it 200).
    fake.say(OTHER_CHAT, DAN, "over here");
    fake.wait("the refused update confirmed", |f| {
        f.pending("alpha_bot") == 0
    })
    .await;
    fake.say(CHAT, CAROL, "@alpha_bot still there?");
    fake.wait("Alpha's answer", |f| f.posted_by(ALPHA_ID).len() == 1)
        .await;
    fake.wait("all confirmed", |f| f.pending("alpha_bot") == 0)
        .await;
    let t = mesh.transcript(ALPHA).await;
    assert_eq!(
        t.iter().map(|e| e.text.as_str()).collect::<Vec<_>>(),
        vec!["hello", "@Alpha still there?", "answer from Alpha"]
    );
    let m = mesh.metrics(ALPHA).await;
    assert!(
        metric(
            &m,
            r#"botmesh_platform_events_total{platform="telegram",result="refused"}"#
        ) == 1.0,
        "{m}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_429_loses_nothing_and_a_long_answer_goes_in_parts() {
    botmesh_tests::init_logs();
    let TelegramMesh { mesh, fake, _llm } = telegram_mesh(|_| {}).await;
    fake.rate_limit(2, 1);
    let q = fake.say(CHAT, CAROL, "@alpha_bot give me the long answer");
    fake.wait("every part", |f| f.posted_by(ALPHA_ID).len() >= 2)
        .await;
    let t = mesh
        .wait_transcript(BETA, WAIT, |t| bot_msgs(t).len() == 1)
        .await;
    let parts = fake.posted_by(ALPHA_ID);
    assert_eq!(parts.len(), 2, "4,096 units at most each");
    for p in &parts {
        assert!(p.text.encode_utf16().count() <= 4096);
        assert!(
            p.text.ends_with("in detail."),
            "cut at a paragraph: {:?}",
            &p.text[p.text.len() - 30..]
        );
    }
    assert_eq!(parts[0].reply_to, Some(q));
    assert_eq!(parts[1].reply_to, None);
    let sends: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|c| c.method == "sendmessage" && c.bot == "alpha_bot")
        .collect();
    assert_eq!(
        sends.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![429, 429, 200, 200],
        "each part sent once"
    );
    for w in sends.windows(2).take(2) {
        assert!(
            w[1].at.duration_since(w[0].at) >= Duration::from_secs(1),
            "retry_after honoured"
        );
    }
    let answer = bot_msgs(&t)[0];
    let ids: Vec<String> = parts
        .iter()
        .map(|p| format!("{CHAT}:{}", p.message_id))
        .collect();
    assert_eq!(
        answer.platform_msg_id.as_deref(),
        Some(ids.join(" ").as_str())
    );
    assert_eq!(
        answer.text.encode_utf16().count(),
        parts
            .iter()
            .map(|p| p.text.encode_utf16().count())
            .sum::<usize>()
            + 2,
        "the whole answer on the mesh"
    );
    mesh.shutdown().await;
}

/// In bot-to-bot mode Telegram shows each bot the other's messages too: every
/// message is still recorded once, with the bridge copy's depth; a bot outside the
/// mesh is context nobody answers.
#[tokio::test]
async fn in_bot_to_bot_mode_the_platform_copy_and_the_mesh_copy_are_recorded_once() {
    botmesh_tests::init_logs();
    let TelegramMesh { mesh, fake, _llm } = telegram_mesh(|f| {
        f.set_bot_to_bot("alpha_bot", true);
        f.set_bot_to_bot("beta_bot", true);
    })
    .await;
    let start = fake.messages(CHAT).len();
    fake.say(CHAT, CAROL, "@alpha_bot start a debate with Beta");
    fake.wait("three bot turns", |f| {
        f.messages(CHAT)[start..]
            .iter()
            .filter(|m| m.request.is_some())
            .count()
            == 3
    })
    .await;
    let helper = BotApi::new(&fake.api_base_url, "333:helper", RETRY).unwrap();
    helper
        .send_message(&SendMessage {
            chat_id: CHAT,
            text: "@alpha_bot what do you think about the weather".into(),
            parse_mode: None,
            reply_parameters: None,
            link_preview_options: serde_json::json!({}),
        })
        .await
        .unwrap();
    let t = mesh.settle(BETA, Duration::from_secs(3)).await;
    for (i, other) in [(ALPHA, "Beta"), (BETA, "Alpha")] {
        let t = mesh.transcript(i).await;
        let theirs: Vec<u32> = t
            .iter()
            .filter(|e| e.author.name == other)
            .map(|e| e.depth)
            .collect();
        let want = if other == "Alpha" {
            vec![1, 3]
        } else {
            vec![2]
        };
        assert_eq!(
            theirs,
            want,
            "node {i} keeps the bridge copies' depths: {:#?}",
            show(&t)
        );
        let ctx: Vec<_> = t
            .iter()
            .filter(|e| e.author.name.starts_with("bot:"))
            .collect();
        assert_eq!(ctx.len(), 1, "{:#?}", show(&t));
        assert_eq!(
            (ctx[0].author.kind, ctx[0].depth, ctx[0].text.as_str()),
            (
                AuthorKind::Bot,
                3,
                "@Alpha what do you think about the weather"
            )
        );
        each_once(&mesh, i).await;
    }
    let from_bots = |bot: &str| {
        fake.updates(bot)
            .iter()
            .filter(|u| u["message"]["from"]["is_bot"] == true)
            .count()
    };
    assert_eq!(
        (from_bots("alpha_bot"), from_bots("beta_bot")),
        (2, 3),
        "Telegram showed each the other's turns and the outside bot's"
    );
    for (i, bridge_copies) in [(ALPHA, 1.0), (BETA, 2.0)] {
        let m = mesh.metrics(i).await;
        let events = |result: &str| {
            metric(
                &m,
                &format!(
                    "botmesh_platform_events_total{{platform=\"telegram\",result=\"{result}\"}}"
                ),
            )
        };
        assert_eq!(
            (events("bridge_copy"), events("context"), events("recorded")),
            (bridge_copies, 1.0, 1.0),
            "node {i}: {m}"
        );
    }
    assert_eq!(
        fake.messages(CHAT)[start..]
            .iter()
            .filter(|m| m.request.is_some())
            .count(),
        4,
        "nobody answered the outside bot: {:#?}",
        show(&t)
    );
    mesh.shutdown().await;
}

/// A rejected token and a token of another bot than `telegram.username` stop
/// Telegram for that node, which says why in `/healthz` (503), while the bridge works.
#[tokio::test]
async fn a_node_says_why_telegram_stopped_in_healthz() {
    botmesh_tests::init_logs();
    let fake = FakeTelegram::start(accounts(), people(), &chats()).await;
    let mut spec = MeshSpec::new(&["Alpha", "Beta"])
        .bot("Alpha", &telegram_bot("ALPHA_TOKEN", "alpha_bot", &fake))
        .bot("Beta", &telegram_bot("BETA_TOKEN", "beta_bot", &fake));
    spec.env = HashMap::from([
        ("ALPHA_TOKEN".to_string(), "111:zzz-stale".to_string()),
        ("BETA_TOKEN".to_string(), "333:helper".to_string()),
    ]);
    let mesh = TestMesh::start(spec).await;
    let (alpha, beta) = mesh.health_once_both_stopped(ALPHA, BETA, WAIT).await;
    let why = platform_stopped(&alpha);
    assert!(
        why.contains("401") && why.contains("telegram.token_env"),
        "{why}"
    );
    assert!(!why.contains("zzz-stale"), "no token in it: {why}");
    let why = platform_stopped(&beta);
    assert!(
        why.contains("@helper_bot") && why.contains("telegram.username"),
        "{why}"
    );
    assert!(
        !fake
            .requests()
            .iter()
            .any(|c| c.method == "getupdates" || c.method == "getwebhookinfo"),
        "neither polls"
    );
    mesh.shutdown().await;
}

/// Webhook mode: the node registers its URL and secret with `setWebhook`, Telegram
/// posts updates there, and a post without the secret is refused.
#[tokio::test]
async fn webhook_mode_takes_updates_with_the_secret_and_refuses_others() {
    botmesh_tests::init_logs();
    let llm = conversation_llm().await;
    let fake = FakeTelegram::start(accounts(), people(), &chats()).await;
    // The webhook URL must be in peers.toml before the node's port is known: a
    // forwarder in front of it, pointed at the node once it runs.
    let target: Arc<std::sync::OnceLock<String>> = Arc::default();
    let t = target.clone();
    let front = serve_http(move |req| {
        let t = t.clone();
        async move {
            let (parts, body) = read_request(req).await;
            let url = format!(
                "{}{}",
                t.get().cloned().unwrap_or_default(),
                parts.uri.path()
            );
            let mut r = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .post(url)
                .body(body);
            for (k, v) in &parts.headers {
                r = r.header(k, v);
            }
            forward(r).await
        }
    })
    .await;
    let mut spec = MeshSpec::new(&["Alpha", "Beta"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot(
            "Alpha",
            &format!(
                "platform = \"telegram\"\ntelegram = {{ token_env = \"ALPHA_TOKEN\", chat_id = \"{CHAT}\", username = \"alpha_bot\", api_base_url = \"{}\", webhook_url = \"{}/telegram/v1/updates\", secret_token_env = \"HOOK_SECRET\" }}",
                fake.api_base_url,
                front.url()
            ),
        )
        .bot("Beta", "participation = \"mentions\"\ntelegram = { username = \"beta_bot\" }");
    spec.env = HashMap::from([
        ("ALPHA_TOKEN".to_string(), "111:alpha".to_string()),
        ("HOOK_SECRET".to_string(), "hook-secret_1".to_string()),
    ]);
    let mesh = TestMesh::start(spec).await;
    target.set(mesh.bridge(ALPHA)).unwrap();
    fake.wait("the webhook set", |f| f.webhook("alpha_bot").is_some())
        .await;
    fake.say(CHAT, CAROL, "@alpha_bot hello there, and @beta_bot");
    fake.wait("Alpha's answer", |f| f.posted_by(ALPHA_ID).len() == 1)
        .await;
    let t = mesh
        .wait_transcript(ALPHA, WAIT, |t| bot_msgs(t).len() == 1)
        .await;
    assert_eq!(
        t[0].text, "@Alpha hello there, and @Beta",
        "a colleague's handle maps though it is not on telegram"
    );
    assert!(
        fake.deliveries()
            .iter()
            .all(|(b, _, s)| b == "alpha_bot" && *s == 200),
        "{:?}",
        fake.deliveries()
    );
    assert!(
        !fake
            .requests()
            .iter()
            .any(|c| c.method == "getupdates" || c.method == "getwebhookinfo"),
        "no polling beside a webhook"
    );
    // A forged update without the secret: refused, nothing recorded.
    let forged = serde_json::json!({"update_id": 1, "message": {"message_id": 77, "date": 1, "chat": {"id": CHAT, "type": "supergroup"}, "from": {"id": DAN, "is_bot": false, "first_name": "Mallory"}, "text": "@alpha_bot obey"}});
    for secret in [None, Some("wrong")] {
        let mut r = mesh
            .http
            .post(format!("{}/telegram/v1/updates", mesh.bridge(ALPHA)))
            .json(&forged);
        if let Some(s) = secret {
            r = r.header("X-Telegram-Bot-Api-Secret-Token", s);
        }
        assert_eq!(r.send().await.unwrap().status().as_u16(), 401);
    }
    let t = mesh.settle(ALPHA, Duration::from_secs(1)).await;
    assert!(
        !t.iter().any(|e| e.text.contains("obey")),
        "{:#?}",
        show(&t)
    );
    // Delivered again (as Telegram does when an answer is lost): recorded once.
    let delivered = fake.deliveries().len();
    fake.forget_confirmations("alpha_bot");
    fake.wait("the second delivery", |f| {
        f.deliveries().len() > delivered && f.pending("alpha_bot") == 0
    })
    .await;
    let t = mesh.settle(ALPHA, Duration::from_secs(1)).await;
    assert_eq!(
        t.iter()
            .filter(|e| e.author.kind == AuthorKind::Human)
            .count(),
        1,
        "{:#?}",
        show(&t)
    );
    mesh.shutdown().await;
}

/// A mixed mesh: a Telegram bot, a Discord bot and a local bot. Each platform's
/// people reach only the bots on it; every bot's message reaches every bot, and each
/// records every message it sees once.
#[tokio::test]
async fn a_telegram_a_discord_and_a_local_bot_each_record_every_message_once() {
    use botmesh_tests::fake_discord::{
        BotAccount as DiscordBot, FakeDiscord, Person as DiscordPerson,
    };
    const CHANNEL: &str = "1200000000000000001";
    const ADA_ID: &str = "1300000000000000001";
    const EVE_ID: &str = "1400000000000000001";
    botmesh_tests::init_logs();
    let llm = conversation_llm().await;
    let tg = FakeTelegram::start(accounts(), people(), &chats()).await;
    let dc = FakeDiscord::start(
        vec![DiscordBot {
            token: "ada-token".into(),
            user_id: ADA_ID.into(),
            username: "ada".into(),
        }],
        vec![DiscordPerson {
            id: EVE_ID.into(),
            username: "eve".into(),
            global_name: Some("Eve".into()),
            nick: None,
        }],
        &[CHANNEL],
    )
    .await;
    let mut spec = MeshSpec::new(&["Alpha", "Ada", "Loc"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot("Alpha", &telegram_bot("ALPHA_TOKEN", "alpha_bot", &tg))
        .bot(
            "Ada",
            &format!(
                "platform = \"discord\"\ndiscord = {{ token_env = \"ADA_TOKEN\", channel_id = \"{CHANNEL}\", user_id = \"{ADA_ID}\", api_base_url = \"{}\", gateway_url = \"{}\" }}",
                dc.api_base_url, dc.gateway_url
            ),
        )
        .bot("Loc", "participation = \"mentions\"");
    spec.env = HashMap::from([
        ("ALPHA_TOKEN".to_string(), "111:alpha".to_string()),
        ("ADA_TOKEN".to_string(), "ada-token".to_string()),
    ]);
    let mesh = TestMesh::start(spec).await;
    dc.wait("Ada connected", |f| f.connected() == 1).await;
    tg.say(CHAT, CAROL, "@alpha_bot what's the plan?");
    tg.wait("Alpha's answer", |f| f.posted_by(ALPHA_ID).len() == 1)
        .await;
    dc.say(CHANNEL, EVE_ID, &format!("<@{ADA_ID}> hi there"));
    dc.wait("Ada's answer", |f| f.posted_by(ADA_ID).len() == 1)
        .await;
    let texts = |t: &[Envelope]| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = t
            .iter()
            .map(|e| (e.author.name.clone(), e.text.clone()))
            .collect();
        v.sort();
        v
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    let alpha = mesh
        .wait_transcript(0, WAIT, |t| bot_msgs(t).len() == 2)
        .await;
    let ada = mesh
        .wait_transcript(1, WAIT, |t| bot_msgs(t).len() == 2)
        .await;
    let loc = mesh
        .wait_transcript(2, WAIT, |t| bot_msgs(t).len() == 2)
        .await;
    mesh.settle(0, Duration::from_secs(1)).await;
    let answers = [
        pair("Ada", "answer from Ada"),
        pair("Alpha", "answer from Alpha"),
    ];
    let mut want = vec![pair("Carol C", "@Alpha what's the plan?")];
    want.extend(answers.clone());
    want.sort();
    assert_eq!(
        texts(&mesh.transcript(0).await),
        want,
        "Alpha: {:#?}",
        show(&alpha)
    );
    let mut want = vec![pair("Eve", "@Ada hi there")];
    want.extend(answers.clone());
    want.sort();
    assert_eq!(
        texts(&mesh.transcript(1).await),
        want,
        "Ada: {:#?}",
        show(&ada)
    );
    assert_eq!(
        texts(&mesh.transcript(2).await),
        answers.to_vec(),
        "Loc: {:#?}",
        show(&loc)
    );
    mesh.shutdown().await;
}

/// Alpha on Telegram with its replies from the scripted ACP stand-in
/// (tests/py/acp_agent.py), working in `dir` and logging to `dir`/agent.log;
/// `agent_extra` adds keys to its `agent` table (`, ask = […]`).
fn alpha_with_agent(fake: &FakeTelegram, dir: &std::path::Path, agent_extra: &str) -> String {
    format!(
        "{}\nagent = {{ acp = [{:?}, {:?}], cwd = {:?}, env = {{ ACP_STANDIN_LOG = {:?} }}, sandbox = {{ read = [{:?}] }}{agent_extra} }}",
        telegram_bot("ALPHA_TOKEN", "alpha_bot", fake),
        botmesh_tests::test_python(),
        botmesh_tests::acp_standin_script(),
        dir.display().to_string(),
        dir.join("agent.log").display().to_string(),
        botmesh_tests::standin_dir(),
    )
}

/// While a bot's coding agent works, the group sees "typing" (`sendChatAction`) from
/// the moment the bot has its turn until the reply is posted, and none after. The
/// agent is the scripted stand-in tests/py/acp_agent.py (official Python ACP SDK),
/// whose work ends only on the test's word (a file).
#[tokio::test]
async fn a_telegram_bot_shows_typing_while_its_agent_works_and_stops_once_it_posted() {
    botmesh_tests::init_logs();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let agent_log = |dir: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(dir.join("agent.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let fake = FakeTelegram::start(accounts(), people(), &chats()).await;
    let coder = alpha_with_agent(&fake, &dir, "");
    let mut spec = MeshSpec::mentions_only(&["Alpha", "Beta"]).bot("Alpha", &coder);
    spec.env = HashMap::from([("ALPHA_TOKEN".to_string(), "111:alpha".to_string())]);
    let mesh = TestMesh::start(spec).await;
    let q = fake.say(CHAT, CAROL, "@alpha_bot AWAITGO");
    botmesh_tests::wait_for(
        WAIT,
        Duration::from_millis(20),
        || async { agent_log(&dir) },
        |l: &Vec<String>| l.iter().any(|l| l.starts_with("awaiting ")),
    )
    .await;
    fake.wait("typing while the agent works", |f| !f.actions().is_empty())
        .await;
    assert!(fake.posted_by(ALPHA_ID).is_empty(), "nothing posted yet");
    std::fs::write(dir.join("go"), b"").unwrap();
    fake.wait("the reply", |f| f.posted_by(ALPHA_ID).len() == 1)
        .await;
    let reply = fake.posted_by(ALPHA_ID)[0].clone();
    assert_eq!(
        (reply.text.as_str(), reply.reply_to),
        ("built after the signal", Some(q))
    );
    mesh.wait_transcript(0, WAIT, |t| {
        t.iter().any(|e| e.text == "built after the signal")
    })
    .await;
    let actions = fake.actions();
    assert!(
        actions
            .iter()
            .all(|(bot, chat, a)| bot == "alpha_bot" && *chat == CHAT && a == "typing"),
        "{actions:?}"
    );
    // The question is message 1, the reply message 2: every typing came between.
    assert!(
        fake.action_positions().iter().all(|&n| n == 1),
        "typing only between the question and the reply: {:?}",
        fake.action_positions()
    );
    mesh.shutdown().await;
}

/// Seconds since the epoch now, as Telegram dates messages.
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Waits until the wall clock is past second `s`, so a message said now is dated after
/// anything of second `s`.
async fn next_second_after(s: u64) {
    while unix_secs() <= s {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An agent's permission question counts as posted from when Telegram accepted it:
/// the operator's `/allow`, said while a 429 held the question back (and delivered
/// after it appeared, as Telegram may), answers nothing and the tool does not run; an
/// `/allow` said after the question appeared answers it. The agent is the scripted
/// stand-in tests/py/acp_agent.py (official Python ACP SDK).
#[tokio::test]
async fn an_allow_said_while_telegram_held_the_question_back_answers_nothing() {
    botmesh_tests::init_logs();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let agent_log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let fake = FakeTelegram::start(accounts(), people(), &chats()).await;
    // No status message: the question is the turn's only message until answered.
    let coder = format!(
        "status_after_secs = 3600\n{}",
        alpha_with_agent(&fake, &dir, ", ask = [\"execute\"], ask_timeout_secs = 60")
    );
    let mut spec = MeshSpec::mentions_only(&["Alpha", "Beta"])
        .mesh(&format!("operators = [\"telegram:{CAROL}\"]"))
        .bot("Alpha", &coder);
    spec.env = HashMap::from([("ALPHA_TOKEN".to_string(), "111:alpha".to_string())]);
    let mesh = TestMesh::start(spec).await;
    let question = |f: &FakeTelegram| {
        f.posted_by(ALPHA_ID).into_iter().find(|m| {
            m.text.starts_with("Alpha wants to run") && m.text.ends_with("/allow or /deny")
        })
    };

    // Dan's turn asks; Telegram holds the question back 3 s.
    fake.rate_limit(1, 3);
    fake.say(CHAT, DAN, "@alpha_bot TOOL execute");
    fake.wait("the question refused with a 429", |f| {
        f.requests()
            .iter()
            .any(|c| c.method == "sendmessage" && c.status == 429)
    })
    .await;
    // Said in a later second than the node took the question up (so the question's
    // hand-over time would let it count), while the question is not in the chat, and
    // delivered only once it is.
    fake.hold_deliveries();
    next_second_after(unix_secs()).await;
    fake.say(CHAT, CAROL, "/allow");
    assert!(
        question(&fake).is_none(),
        "said before the question appeared"
    );
    fake.wait("the question in the chat", |f| question(f).is_some())
        .await;
    mesh.wait_transcript(0, WAIT, |t| {
        t.iter().any(|e| e.text.starts_with("Alpha wants to run"))
    })
    .await;
    let posted_second = unix_secs();
    fake.deliver_held();
    let nothing_asked = r#"botmesh_chat_commands_total{command="allow",outcome="nothing_asked"}"#;
    let applied = r#"botmesh_chat_commands_total{command="allow",outcome="applied"}"#;
    let (nothing, answered) = botmesh_tests::wait_for(
        WAIT,
        Duration::from_millis(50),
        || async {
            let m = mesh.metrics(0).await;
            (metric(&m, nothing_asked), metric(&m, applied))
        },
        |(nothing, answered)| nothing + answered >= 1.0,
    )
    .await;
    assert_eq!(
        (nothing, answered),
        (1.0, 0.0),
        "the early /allow answered nothing"
    );
    let t = mesh.settle(0, Duration::from_millis(300)).await;
    assert!(
        !agent_log().contains("permission execute"),
        "the early /allow answered the question: {}",
        agent_log()
    );
    assert_eq!(
        fake.posted_by(ALPHA_ID).len(),
        1,
        "only the question: {:#?}",
        show(&t)
    );

    // Said after the question appeared (dated a later second than it was accepted):
    // answers it, and the tool runs.
    next_second_after(posted_second).await;
    fake.say(CHAT, CAROL, "/allow");
    fake.wait("the agent's reply", |f| {
        f.posted_by(ALPHA_ID)
            .iter()
            .any(|m| m.text == "permission: proceed-once")
    })
    .await;
    assert!(agent_log().contains("permission execute proceed-once"));
    let m = mesh.metrics(0).await;
    assert_eq!(
        (metric(&m, nothing_asked), metric(&m, applied)),
        (1.0, 1.0),
        "{m}"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_why_flood_on_telegram_posts_a_bounded_few_and_holds_back_no_real_answer() {
    botmesh_tests::init_logs();
    let llm = conversation_llm().await;
    let fake = FakeTelegram::start(accounts(), people(), &chats()).await;
    let mut spec = MeshSpec::new(&["Alpha", "Beta"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot("Alpha", &telegram_bot("ALPHA_TOKEN", "alpha_bot", &fake))
        .bot("Beta", "participation = \"mentions\"");
    spec.env = HashMap::from([("ALPHA_TOKEN".to_string(), "111:alpha".to_string())]);
    let mesh = TestMesh::start(spec).await;
    // Forty /why from one person: a burst is answered, the rest counted and dropped.
    for _ in 0..40 {
        fake.say(CHAT, CAROL, "/why @alpha_bot");
    }
    let limited = botmesh_tests::wait_for(
        WAIT,
        Duration::from_millis(50),
        || async {
            metric(
                &mesh.metrics(ALPHA).await,
                r#"botmesh_chat_commands_total{command="why",outcome="rate_limited"}"#,
            )
        },
        |n| *n >= 37.0,
    )
    .await;
    assert_eq!(limited, 37.0);
    // A real question right after is answered, not queued behind the flood.
    fake.say(CHAT, DAN, "@alpha_bot still there?");
    fake.wait("Alpha's answer", |f| {
        f.posted_by(ALPHA_ID)
            .iter()
            .any(|m| m.text.contains("answer from Alpha"))
    })
    .await;
    let posted = fake.posted_by(ALPHA_ID);
    assert_eq!(
        posted.len(),
        4,
        "three /why answers and the real one: {posted:#?}"
    );
    mesh.shutdown().await;
}
