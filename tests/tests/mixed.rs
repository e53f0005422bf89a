//! A mesh across platforms: a Telegram bot, a Slack bot and a local bot, each on its
//! platform's stand-in (tests/src/fake_telegram, tests/src/fake_slack, both proven by
//! the platforms' own Python clients in tests/tests/telegram.rs and slack.rs). Each
//! answers its own people on its own platform, hears its colleagues over the mesh,
//! and records every message once.

use std::collections::HashMap;
use std::time::Duration;

use botmesh::wire::envelope::Envelope;
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::fake_slack::{FakeSlack, Person as SlackPerson, SlackApp};
use botmesh_tests::fake_telegram::{BotAccount, FakeTelegram, Person as TelegramPerson};
use botmesh_tests::{bot_msgs, bot_of, is_judge, MeshSpec};

const TG_CHAT: i64 = -1001234567890;
const ALPHA_ID: i64 = 1111;
const TG_CAROL: i64 = 501;
const SLACK_CHANNEL: &str = "C0700";
const SAM_ID: &str = "U1001";
const SLACK_DAN: &str = "U2002";
const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_telegram_a_slack_and_a_local_bot_each_record_every_message_once() {
    botmesh_tests::init_logs();
    // Mentioned bots answer; nobody interjects.
    let llm = FakeLlm::start(|s| {
        if is_judge(s) {
            Script::reply("{\"speak\": false, \"relevance\": 0.0}")
        } else {
            Script::reply(format!("answer from {}", bot_of(s)))
        }
    })
    .await;
    let tg = FakeTelegram::start(
        vec![BotAccount {
            token: "111:alpha".into(),
            id: ALPHA_ID,
            username: "alpha_bot".into(),
            first_name: "Alpha".into(),
        }],
        vec![TelegramPerson {
            id: TG_CAROL,
            first_name: "Carol".into(),
            last_name: Some("C".into()),
            username: None,
        }],
        &[(TG_CHAT, "Team")],
    )
    .await;
    let slack = FakeSlack::start(
        vec![SlackApp {
            name: "sam".into(),
            user_id: SAM_ID.into(),
            bot_id: "B0001".into(),
            app_id: "A0001".into(),
            bot_token: "xoxb-sam-token".into(),
            app_token: "xapp-sam-token".into(),
        }],
        vec![SlackPerson {
            id: SLACK_DAN.into(),
            name: "dan".into(),
            display_name: "Dan D".into(),
            real_name: "Dan Example".into(),
        }],
        &[SLACK_CHANNEL],
    )
    .await;
    let mut spec = MeshSpec::new(&["Alpha", "Sam", "Loc"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot(
            "Alpha",
            &format!(
                "platform = \"telegram\"\ntelegram = {{ token_env = \"ALPHA_TOKEN\", chat_id = \"{TG_CHAT}\", username = \"alpha_bot\", api_base_url = \"{}\" }}",
                tg.api_base_url
            ),
        )
        .bot(
            "Sam",
            &format!(
                "platform = \"slack\"\nslack = {{ bot_token_env = \"SAM_BOT_TOKEN\", app_token_env = \"SAM_APP_TOKEN\", channel_id = \"{SLACK_CHANNEL}\", user_id = \"{SAM_ID}\", api_base_url = \"{}\" }}",
                slack.api_base_url
            ),
        )
        .bot("Loc", "participation = \"mentions\"");
    spec.env = HashMap::from([
        ("ALPHA_TOKEN".to_string(), "111:alpha".to_string()),
        ("SAM_BOT_TOKEN".to_string(), "xoxb-sam-token".to_string()),
        ("SAM_APP_TOKEN".to_string(), "xapp-sam-token".to_string()),
    ]);
    let mesh = botmesh_tests::TestMesh::start(spec).await;
    slack.wait("Sam connected", |f| f.connected() == 1).await;
    tg.wait("Alpha polling", |f| {
        f.requests()
            .iter()
            .any(|c| c.method == "getwebhookinfo" && c.bot == "alpha_bot")
    })
    .await;

    // Each bot's own people, on its own platform (the local one through the API).
    tg.say(TG_CHAT, TG_CAROL, "@alpha_bot what's the plan?");
    tg.wait("Alpha's answer", |f| f.posted_by(ALPHA_ID).len() == 1)
        .await;
    slack.say(SLACK_CHANNEL, SLACK_DAN, &format!("<@{SAM_ID}> hi there"));
    slack
        .wait("Sam's answer", |f| f.posted_by(SAM_ID).len() == 1)
        .await;
    mesh.post_human(2, "Boss", "@Loc status?").await;

    let all_three = |t: &[Envelope]| bot_msgs(t).len() == 3;
    for i in 0..3 {
        mesh.wait_transcript(i, WAIT, all_three).await;
    }
    mesh.settle(0, Duration::from_secs(1)).await;
    let texts = |t: Vec<Envelope>| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = t
            .iter()
            .filter(|e| e.group == "demo")
            .map(|e| (e.author.name.clone(), e.text.clone()))
            .collect();
        v.sort();
        v
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    let answers = [
        pair("Alpha", "answer from Alpha"),
        pair("Loc", "answer from Loc"),
        pair("Sam", "answer from Sam"),
    ];
    let with = |person: (String, String)| {
        let mut v = vec![person];
        v.extend(answers.clone());
        v.sort();
        v
    };
    // Telegram and Slack show their people to their bots; only the local person's
    // message travels the mesh, to the local bot alone (the others' platforms deliver
    // people themselves and ignore bridge copies).
    assert_eq!(
        texts(mesh.transcript(0).await),
        with(pair("Carol C", "@Alpha what's the plan?")),
        "Alpha (telegram)"
    );
    assert_eq!(
        texts(mesh.transcript(1).await),
        with(pair("Dan D", "@Sam hi there")),
        "Sam (slack)"
    );
    assert_eq!(
        texts(mesh.transcript(2).await),
        with(pair("Boss", "@Loc status?")),
        "Loc (local)"
    );
    // Nothing posted twice on either platform, nothing posted for a colleague.
    assert_eq!(tg.posted_by(ALPHA_ID).len(), 1);
    assert_eq!(slack.posted_by(SAM_ID).len(), 1);
    mesh.shutdown().await;
}
