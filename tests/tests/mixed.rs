//! Meshes across platforms: a Telegram bot, a Slack bot and a local bot; a QQ bot, a
//! Slack bot and a local bot; a WeCom robot, a Feishu bot and a local bot. Each bot is on its platform's stand-in (tests/src/fake_*,
//! each proven by the platform's own Python client in its tests/tests file), answers
//! its own people on its own platform, hears its colleagues over the mesh, and
//! records every message once.

use std::collections::HashMap;
use std::time::Duration;

use botmesh::wire::envelope::Envelope;
use botmesh_tests::fake_feishu::{message_event, FakeApp, FakeFeishu, MessageSpec};
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::fake_onebot::{Account as QqAccount, FakeOnebot, Person as QqPerson};
use botmesh_tests::fake_slack::{FakeSlack, Person as SlackPerson, SlackApp};
use botmesh_tests::fake_telegram::{BotAccount, FakeTelegram, Person as TelegramPerson};
use botmesh_tests::fake_wecom::{FakeWecom, Robot};
use botmesh_tests::{bot_msgs, bot_of, is_judge, MeshSpec, TestMesh};

const TG_CHAT: i64 = -1001234567890;
const ALPHA_ID: i64 = 1111;
const TG_CAROL: i64 = 501;
const QQ_GROUP: i64 = 700100;
const ADA_QQ: i64 = 10001;
const QQ_CAROL: i64 = 20001;
const WECOM_CHAT: &str = "wrkSFfCgAAtEamChAt01";
const WECOM_CAROL: &str = "zhangsan";
const SLACK_CHANNEL: &str = "C0700";
const SAM_ID: &str = "U1001";
const SLACK_DAN: &str = "U2002";
const FAST: &str = "min_delay_ms = 100\nmax_delay_ms = 1000\njitter_ms = 0";
const WAIT: Duration = Duration::from_secs(30);

/// Mentioned bots answer "answer from <bot>"; nobody interjects.
async fn answering_llm() -> FakeLlm {
    FakeLlm::start(|s| {
        if is_judge(s) {
            Script::reply("{\"speak\": false, \"relevance\": 0.0}")
        } else {
            Script::reply(format!("answer from {}", bot_of(s)))
        }
    })
    .await
}

/// Slack's stand-in with the app of bot Sam and one person, Dan (shown as `dan_shown`).
async fn slack_with_sam(dan_shown: &str) -> FakeSlack {
    FakeSlack::start(
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
            display_name: dan_shown.into(),
            real_name: "Dan Example".into(),
        }],
        &[SLACK_CHANNEL],
    )
    .await
}

/// Bot Sam's settings on `slack`.
fn sam_on_slack(slack: &FakeSlack) -> String {
    format!(
        "platform = \"slack\"\nslack = {{ bot_token_env = \"SAM_BOT_TOKEN\", app_token_env = \"SAM_APP_TOKEN\", channel_id = \"{SLACK_CHANNEL}\", user_id = \"{SAM_ID}\", api_base_url = \"{}\" }}",
        slack.api_base_url
    )
}

/// The environment of Sam's tokens and `more`.
fn env_with_sam(more: (&str, String)) -> HashMap<String, String> {
    HashMap::from([
        (more.0.to_string(), more.1),
        ("SAM_BOT_TOKEN".to_string(), "xoxb-sam-token".to_string()),
        ("SAM_APP_TOKEN".to_string(), "xapp-sam-token".to_string()),
    ])
}

/// The mesh group's messages as sorted (author, text) pairs.
fn texts(t: Vec<Envelope>) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = t
        .iter()
        .filter(|e| e.group == "demo")
        .map(|e| (e.author.name.clone(), e.text.clone()))
        .collect();
    v.sort();
    v
}

/// What [`texts`] must be on a bot that saw `person` say `said`: that, and every
/// bot's answer.
fn with_answers(person: &str, said: &str, bots: &[&str]) -> Vec<(String, String)> {
    let mut v = vec![(person.to_string(), said.to_string())];
    v.extend(
        bots.iter()
            .map(|b| (b.to_string(), format!("answer from {b}"))),
    );
    v.sort();
    v
}

/// Dan asks Sam on Slack, then Boss asks Loc on node 2's page, and each waits for the
/// answer (Sam's on Slack; every bot's in every transcript).
async fn dan_asks_sam_and_boss_asks_loc(slack: &FakeSlack, mesh: &TestMesh) {
    slack.say(SLACK_CHANNEL, SLACK_DAN, &format!("<@{SAM_ID}> hi there"));
    slack
        .wait("Sam's answer", |f| f.posted_by(SAM_ID).len() == 1)
        .await;
    mesh.post_human(2, "Boss", "@Loc status?").await;
    three_answers_everywhere(mesh).await;
}

/// Asserts that node `i`'s transcript holds what `people[i]` (`label`, person, text)
/// said and the answers of `bots`, and nothing else: each person reaches only its own
/// bot's node (the platforms deliver their own people and ignore bridge copies).
async fn assert_each_saw_its_person(
    mesh: &TestMesh,
    bots: &[&str],
    people: [(&str, &str, &str); 3],
) {
    for (i, (label, person, said)) in people.into_iter().enumerate() {
        assert_eq!(
            texts(mesh.transcript(i).await),
            with_answers(person, said, bots),
            "{label}"
        );
    }
}

/// Waits (bounded) until each of the three bots has recorded the three answers.
async fn three_answers_everywhere(mesh: &TestMesh) {
    let all_three = |t: &[Envelope]| bot_msgs(t).len() == 3;
    for i in 0..3 {
        mesh.wait_transcript(i, WAIT, all_three).await;
    }
    mesh.settle(0, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_telegram_a_slack_and_a_local_bot_each_record_every_message_once() {
    botmesh_tests::init_logs();
    let llm = answering_llm().await;
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
    let slack = slack_with_sam("Dan D").await;
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
        .bot("Sam", &sam_on_slack(&slack))
        .bot("Loc", "participation = \"mentions\"");
    spec.env = env_with_sam(("ALPHA_TOKEN", "111:alpha".to_string()));
    let mesh = TestMesh::start(spec).await;
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
    dan_asks_sam_and_boss_asks_loc(&slack, &mesh).await;
    // Telegram and Slack show their people to their bots; only the local person's
    // message travels the mesh, to the local bot alone (the others' platforms deliver
    // people themselves and ignore bridge copies).
    assert_each_saw_its_person(
        &mesh,
        &["Alpha", "Loc", "Sam"],
        [
            ("Alpha (telegram)", "Carol C", "@Alpha what's the plan?"),
            ("Sam (slack)", "Dan D", "@Sam hi there"),
            ("Loc (local)", "Boss", "@Loc status?"),
        ],
    )
    .await;
    // Nothing posted twice on either platform, nothing posted for a colleague.
    assert_eq!(tg.posted_by(ALPHA_ID).len(), 1);
    assert_eq!(slack.posted_by(SAM_ID).len(), 1);
    mesh.shutdown().await;
}

/// A QQ bot, a Slack bot and a local bot: each answers its own people on its own
/// platform, hears its colleagues over the mesh, and records every message once.
#[tokio::test]
async fn a_qq_a_slack_and_a_local_bot_each_record_every_message_once() {
    botmesh_tests::init_logs();
    let llm = answering_llm().await;
    let qq = FakeOnebot::start(
        QQ_GROUP,
        vec![QqAccount {
            self_id: ADA_QQ,
            nickname: "ada".into(),
            token: format!("token-{ADA_QQ}"),
            string_form: false,
        }],
        vec![QqPerson {
            user_id: QQ_CAROL,
            nickname: "carol".into(),
            card: "Carol C".into(),
            hidden: false,
        }],
    )
    .await;
    let slack = slack_with_sam("Dan S").await;
    let mut spec = MeshSpec::new(&["Ada", "Sam", "Loc"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot(
            "Ada",
            &format!(
                "platform = \"onebot\"\nonebot = {{ ws_url = \"{}\", access_token_env = \"ADA_ONEBOT_TOKEN\", group_id = \"{QQ_GROUP}\", self_id = \"{ADA_QQ}\", send_interval_ms = 200 }}",
                qq.ws_url(ADA_QQ)
            ),
        )
        .bot("Sam", &sam_on_slack(&slack))
        .bot("Loc", "participation = \"mentions\"");
    spec.env = env_with_sam(("ADA_ONEBOT_TOKEN", format!("token-{ADA_QQ}")));
    let mesh = TestMesh::start(spec).await;
    qq.wait("Ada connected", |f| {
        f.connected() == 1 && f.actions().iter().any(|a| a.1 == "get_login_info")
    })
    .await;
    slack.wait("Sam connected", |f| f.connected() == 1).await;

    qq.say(QQ_CAROL, "@Ada what's the plan?");
    qq.wait("Ada's answer", |f| f.sent_by(ADA_QQ).len() == 1)
        .await;
    dan_asks_sam_and_boss_asks_loc(&slack, &mesh).await;
    assert_each_saw_its_person(
        &mesh,
        &["Ada", "Loc", "Sam"],
        [
            ("Ada (qq)", "Carol C", "@Ada what's the plan?"),
            ("Sam (slack)", "Dan S", "@Sam hi there"),
            ("Loc (local)", "Boss", "@Loc status?"),
        ],
    )
    .await;
    // Nothing sent twice on either platform, nothing sent for a colleague.
    assert_eq!(qq.sent_by(ADA_QQ).len(), 1);
    assert_eq!(qq.messages().len(), 2, "Carol's and Ada's");
    assert_eq!(slack.posted_by(SAM_ID).len(), 1);
    mesh.shutdown().await;
}

/// A WeCom robot, a Feishu bot and a local bot: each answers its own people on its
/// own platform, hears its colleagues over the mesh, and records every message once.
#[tokio::test]
async fn a_wecom_a_feishu_and_a_local_bot_each_record_every_message_once() {
    botmesh_tests::init_logs();
    const FEISHU_CHAT: &str = "oc_team";
    const XB_OPEN_ID: &str = "ou_84aad35d084aa403a838cf73ee18467";
    const APP_ID: &str = "cli_a1b2c3d4e5f6mixd";
    const APP_SECRET: &str = "feishu-app-secret";
    let llm = answering_llm().await;
    let ada_robot = Robot::named("Ada");
    let wecom = FakeWecom::start(vec![ada_robot.clone()]).await;
    let feishu = FakeFeishu::start(FakeApp {
        app_id: APP_ID.into(),
        app_secret: APP_SECRET.into(),
        bot_open_id: XB_OPEN_ID.into(),
        app_name: "XiaoBa".into(),
        expire: 7200,
    })
    .await;
    let mut spec = MeshSpec::new(&["Ada", "XiaoBa", "Loc"])
        .llm(&llm.base_url)
        .all_bots(FAST)
        .bot("Ada", &Robot::settings(&wecom, "Ada", WECOM_CHAT))
        .bot(
            "XiaoBa",
            &format!(
                "platform = \"feishu\"\nfeishu = {{ open_id = \"{XB_OPEN_ID}\", app_id = \"{APP_ID}\", app_secret_env = \"XB_APP_SECRET\", base_url = \"{}\", chat_id = \"{FEISHU_CHAT}\" }}",
                feishu.base_url
            ),
        )
        .bot("Loc", "participation = \"mentions\"");
    spec.env = HashMap::from([
        ("ADA_WECOM_SECRET".to_string(), ada_robot.secret.clone()),
        ("XB_APP_SECRET".to_string(), APP_SECRET.to_string()),
    ]);
    let mesh = TestMesh::start(spec).await;
    wecom
        .wait("Ada logged in", |f| f.connected(&ada_robot.bot_id) == 1)
        .await;
    assert_eq!(
        feishu.wait_connections(1, WAIT).await,
        1,
        "XiaoBa connected"
    );

    wecom.say(WECOM_CAROL, WECOM_CHAT, "@Ada what's the plan?", &["Ada"]);
    wecom
        .wait("Ada's answer", |f| f.shown_by(&ada_robot.bot_id).len() == 1)
        .await;
    feishu.push_event(
        &message_event(&MessageSpec {
            app_id: APP_ID,
            token: "",
            event_id: "ev-mixed-1",
            message_id: "om_mixed_1",
            chat_id: FEISHU_CHAT,
            sender_open_id: "ou_dan",
            sender_type: "user",
            text: "@XiaoBa hi there",
            mentions: &[],
        }),
        1,
    );
    feishu.wait_sent(1, WAIT).await;
    mesh.post_human(2, "Boss", "@Loc status?").await;

    three_answers_everywhere(&mesh).await;
    let texts = |t: Vec<Envelope>| -> Vec<String> {
        let mut v: Vec<String> = t
            .iter()
            .filter(|e| e.group == "demo")
            .map(|e| format!("{}: {}", e.author.name, e.text))
            .collect();
        v.sort();
        v
    };
    let answers = [
        "Ada: answer from Ada",
        "Loc: answer from Loc",
        "XiaoBa: answer from XiaoBa",
    ];
    let ada = texts(mesh.transcript(0).await);
    let xiaoba = texts(mesh.transcript(1).await);
    let loc = texts(mesh.transcript(2).await);
    for (who, t) in [("Ada", &ada), ("XiaoBa", &xiaoba), ("Loc", &loc)] {
        for a in answers {
            assert_eq!(
                t.iter().filter(|l| *l == a).count(),
                1,
                "{who}: {a}: {t:#?}"
            );
        }
    }
    // WeCom's person reaches the mesh through Ada and is carried to the local bot
    // (Feishu delivers its own people and ignores bridge copies); the local person
    // reaches Ada the same way.
    let carol = format!("{WECOM_CAROL}: @Ada what's the plan?");
    assert_eq!(ada.iter().filter(|l| **l == carol).count(), 1, "{ada:#?}");
    assert_eq!(loc.iter().filter(|l| **l == carol).count(), 1, "{loc:#?}");
    assert!(!xiaoba.contains(&carol), "{xiaoba:#?}");
    assert!(ada.contains(&"Boss: @Loc status?".to_string()), "{ada:#?}");
    // Nothing posted twice, nothing posted for a colleague.
    assert_eq!(wecom.shown_by(&ada_robot.bot_id).len(), 1);
    assert_eq!(feishu.sent().len(), 1);
    mesh.shutdown().await;
}
