//! What people see while a bot works (issue #35): a turn that runs past the bot's
//! `status_after_secs` gets ONE status message, edited in place as the agent reports
//! progress, ended "done in …", and then the answer comes as a new message; a
//! colleague never answers the status, and it is recorded once, as status.
//!
//! The agent is the scripted stand-in tests/py/acp_agent.py (official Python ACP SDK)
//! doing `STEPS 3`: three tool calls, each ending only on the test's word (a file), so
//! nothing here depends on how long anything takes but the one-second status timing.
//! Each platform's edit call on its stand-in is proven by the platform's official
//! client in that platform's own test file (python-telegram-bot `edit_text` in
//! tests/tests/telegram.rs, slack_sdk `chat_update` in tests/tests/slack.rs); Matrix
//! is the real Synapse, its `m.replace` edits read back from the room; QQ has no edit,
//! and its stand-in is proven against nonebot in tests/tests/onebot.rs.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use botmesh::telemetry::events::Event;
use botmesh::wire::envelope::{Envelope, Kind};
use botmesh_tests::{acp_standin, wait_for};
use botmesh_tests::{MeshSpec, TestMesh};

/// The longest any wait here lasts.
const WAIT: Duration = Duration::from_secs(20);
/// A quick status: after 1 s, edited at most every second.
const QUICK_STATUS: &str = "status_after_secs = 1\nstatus_every_secs = 1";
/// Ada, the colleague, would interject on anything about "working" (the offline
/// judge weighs the overlap with her skills) — so she would answer a status taken for
/// conversation.
const ADA: &str = "skills = [\"working\"]\nreply_to = \"all\"\nparticipation = \"judge\"\nmin_delay_ms = 100\nmax_delay_ms = 300\njitter_ms = 0\nmin_relevance = 0.0";

/// Coder's `agent` table: the stand-in working in `dir`.
fn agent(dir: &Path) -> String {
    acp_standin::agent_table(dir, "")
}

/// Coder (answering when mentioned, its extra TOML `coder`) and Ada (the colleague
/// who would answer a status taken for conversation).
fn coder_and_ada(coder: &str) -> MeshSpec {
    MeshSpec::new(&["Coder", "Ada"])
        .bot("Coder", coder)
        .bot("Coder", "participation = \"mentions\"")
        .bot("Ada", ADA)
}

/// How a platform shows Coder's messages to the test: each one's id and text now.
trait Shown {
    /// Coder's messages on the platform, in order, as (id, text, edits so far).
    fn coder_messages(&self) -> Vec<(String, String, u32)>;
}

/// Drives the slow turn on a platform already asked `@Coder STEPS 3` and checks what
/// it shows: one status message, edited as each step starts (text changing), ended
/// "done", then one answer. Returns the status message's platform id.
async fn one_status_then_the_answer(dir: &Path, shown: &impl Shown) -> String {
    acp_standin::logged(dir, "step 1 ").await;
    let first = status_when(shown, "the status, working on step 1", |t| {
        t.starts_with("Coder is working (") && t.contains("step 1")
    })
    .await;
    acp_standin::next_step(dir, 1).await;
    let second = status_when(shown, "the status edited: step 2", |t| t.contains("step 2")).await;
    acp_standin::next_step(dir, 2).await;
    let third = status_when(shown, "the status edited: step 3", |t| t.contains("step 3")).await;
    assert_eq!(first.0, third.0, "one status message, edited in place");
    assert_eq!(first.0, second.0, "one status message, edited in place");
    let mut seen = vec![first.1, second.1, third.1];
    seen.dedup();
    assert_eq!(seen.len(), 3, "the text changed with each edit: {seen:?}");
    acp_standin::end_step(dir, 3);
    let done = coder_messages_when(shown, |m| {
        m.len() == 2 && m[0].1.starts_with("Coder: done in")
    })
    .await
    .unwrap_or_else(|m| panic!("the status ended, then the answer: saw {m:?}"));
    assert_eq!(done[0].0, first.0, "the same status message");
    assert_eq!(done[1].1, "all 3 steps done", "the answer, a new message");
    assert!(
        done[0].2 >= 3,
        "at least two progress edits and the final one: {done:?}"
    );
    done[0].0.clone()
}

/// Drives the slow turn on a platform that cannot edit, already asked `@Coder STEPS
/// 3`: one plain "working…" status message, never changed while the agent goes
/// through its steps, then one answer. Returns the status message's platform id.
async fn one_unedited_status_then_the_answer(dir: &Path, shown: &impl Shown) -> String {
    acp_standin::logged(dir, "step 1 ").await;
    let first = status_when(shown, "the working… status", |t| {
        t.starts_with("Coder is working (")
    })
    .await;
    acp_standin::next_step(dir, 1).await;
    acp_standin::next_step(dir, 2).await;
    // Two steps of progress, each past the one-second pace: nothing more is sent.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        shown.coder_messages(),
        vec![first.clone()],
        "one status message, not edited and not followed by notes"
    );
    acp_standin::end_step(dir, 3);
    let done = coder_messages_when(shown, |m| m.len() == 2)
        .await
        .unwrap_or_else(|m| panic!("the answer after the status: saw {m:?}"));
    assert_eq!(done[0], first, "the status as first posted, never changed");
    assert_eq!(done[1].1, "all 3 steps done", "the answer, a new message");
    first.0
}

/// Coder's one message (its status) once its text satisfies `want`.
async fn status_when(
    shown: &impl Shown,
    what: &str,
    want: impl Fn(&str) -> bool,
) -> (String, String, u32) {
    coder_messages_when(shown, |m| m.len() == 1 && want(&m[0].1))
        .await
        .unwrap_or_else(|m| panic!("{what}: saw {m:?}"))
        .remove(0)
}

/// Coder's messages once `done` holds of them (Err: the last seen, in time).
async fn coder_messages_when(
    shown: &impl Shown,
    done: impl Fn(&Vec<(String, String, u32)>) -> bool,
) -> Result<Vec<(String, String, u32)>, Vec<(String, String, u32)>> {
    let got = wait_for(
        WAIT,
        Duration::from_millis(20),
        || async { shown.coder_messages() },
        |m| done(m),
    )
    .await;
    if done(&got) {
        Ok(got)
    } else {
        Err(got)
    }
}

/// Node `i`'s transcript of `group` (the mesh's `demo`, or a platform's own room).
async fn transcript_of(mesh: &TestMesh, i: usize, group: &str) -> Vec<Envelope> {
    let v = botmesh_tests::fetch_json(
        mesh.http
            .get(format!("{}/v1/transcript", mesh.api(i)))
            .query(&[("group", group), ("limit", "2000")]),
    )
    .await;
    serde_json::from_value(v["messages"].clone()).expect("envelopes")
}

/// The status is recorded once, as status, in `group` on Coder's node and on Ada's;
/// Ada never answered it (her only message, if any, answers something else).
async fn recorded_once_as_status_and_unanswered(
    mesh: &TestMesh,
    group: &str,
    platform_id: Option<&str>,
) {
    for i in 0..2 {
        let t = wait_for(
            WAIT,
            Duration::from_millis(25),
            || transcript_of(mesh, i, group),
            |t: &Vec<Envelope>| {
                t.iter().any(|e| e.text == "all 3 steps done")
                    && t.iter().any(|e| e.kind == Kind::Status)
            },
        )
        .await;
        let statuses: Vec<&Envelope> = t.iter().filter(|e| e.kind == Kind::Status).collect();
        assert_eq!(
            statuses.len(),
            1,
            "node {i}: one status, recorded once: {t:#?}"
        );
        assert_eq!(statuses[0].author.name, "Coder");
        if let Some(id) = platform_id {
            assert_eq!(
                statuses[0]
                    .platform_msg_id
                    .as_deref()
                    .map(|p| p.contains(id)),
                Some(true),
                "node {i}: the status carries its platform id: {statuses:?}"
            );
        }
        assert!(
            !t.iter()
                .any(|e| e.kind == Kind::Message && e.reply_to == Some(statuses[0].id)),
            "node {i}: nobody answers a status: {t:#?}"
        );
    }
    // Ada had her chances: settled, she never spoke.
    mesh.settle(1, Duration::from_secs(2)).await;
    let ada = transcript_of(mesh, 1, group).await;
    assert!(
        !ada.iter()
            .any(|e| e.author.name == "Ada" && e.kind == Kind::Message),
        "a colleague never answers a status: {ada:#?}"
    );
}

mod telegram {
    use super::*;
    use botmesh_tests::fake_telegram::{BotAccount, FakeTelegram, Person};

    const CHAT: i64 = -1001234567890;
    const CODER_ID: i64 = 4444;
    const CAROL: i64 = 501;

    impl Shown for FakeTelegram {
        fn coder_messages(&self) -> Vec<(String, String, u32)> {
            self.posted_by(CODER_ID)
                .into_iter()
                .map(|m| (format!("{}:{}", m.chat_id, m.message_id), m.text, m.edits))
                .collect()
        }
    }

    #[tokio::test]
    async fn a_telegram_bot_keeps_one_status_message_while_its_agent_works() {
        botmesh_tests::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let fake = FakeTelegram::start(
            vec![BotAccount {
                token: "444:coder".into(),
                id: CODER_ID,
                username: "coder_bot".into(),
                first_name: "Coder".into(),
            }],
            vec![Person {
                id: CAROL,
                first_name: "Carol".into(),
                last_name: None,
                username: None,
            }],
            &[(CHAT, "Team")],
        )
        .await;
        let coder = format!(
            "platform = \"telegram\"\ntelegram = {{ token_env = \"CODER_TOKEN\", chat_id = \"{CHAT}\", username = \"coder_bot\", api_base_url = \"{}\" }}\n{QUICK_STATUS}\n{}",
            fake.api_base_url,
            agent(&dir),
        );
        let mut spec = coder_and_ada(&coder);
        spec.env = HashMap::from([("CODER_TOKEN".to_string(), "444:coder".to_string())]);
        let mesh = TestMesh::start(spec).await;
        fake.wait("Coder polling", |f| {
            f.requests().iter().any(|c| c.method == "getwebhookinfo")
        })
        .await;

        let asked = fake.say(CHAT, CAROL, "@coder_bot STEPS 3");
        let id = one_status_then_the_answer(&dir, &fake).await;
        let status = fake
            .posted_by(CODER_ID)
            .into_iter()
            .find(|m| format!("{}:{}", m.chat_id, m.message_id) == id)
            .unwrap();
        assert_eq!(
            status.reply_to,
            Some(asked),
            "the status answers the question"
        );
        recorded_once_as_status_and_unanswered(&mesh, "demo", Some(&id)).await;
        let metrics = mesh.metrics(0).await;
        assert!(
            botmesh_tests::metric(
                &metrics,
                r#"botmesh_status_edits_total{bot="Coder",platform="telegram",outcome="edited"}"#
            ) >= 3.0,
            "{metrics}"
        );
        mesh.shutdown().await;
    }
}

mod local {
    use super::*;

    /// The page's view: the status messages recorded and their `status` events.
    struct Page {
        events: std::sync::Mutex<tokio::sync::broadcast::Receiver<Event>>,
        /// (id, text, edits) of Coder's messages, as the page shows them.
        shown: std::sync::Mutex<Vec<(String, String, u32)>>,
    }

    impl Shown for Page {
        fn coder_messages(&self) -> Vec<(String, String, u32)> {
            let mut rx = self.events.lock().unwrap();
            let mut shown = self.shown.lock().unwrap();
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    // A status's final version, recorded: the page shows it in place.
                    Event::Message { envelope } if envelope.author.name == "Coder" => {
                        match envelope.replaces.map(|of| of.to_string()) {
                            Some(of) => {
                                if let Some(m) = shown.iter_mut().find(|m| m.0 == of) {
                                    m.1 = envelope.text.clone();
                                    m.2 += 1;
                                }
                            }
                            None => shown.push((envelope.id.to_string(), envelope.text.clone(), 0)),
                        }
                    }
                    Event::Status { id, text, .. } => {
                        if let Some(m) = shown.iter_mut().find(|m| m.0 == id) {
                            m.1 = text;
                            m.2 += 1;
                        }
                    }
                    _ => {}
                }
            }
            shown.clone()
        }
    }

    /// Coder (its agent working in `dir`) and Ada on the local page, the page
    /// watching, Carol having asked `@Coder STEPS 3`.
    async fn asked_on_the_page(dir: &Path) -> (TestMesh, Page) {
        botmesh_tests::init_logs();
        let spec = coder_and_ada(&format!("{QUICK_STATUS}\n{}", agent(dir)));
        let mesh = TestMesh::start(spec).await;
        let page = Page {
            events: std::sync::Mutex::new(mesh.node(0).node.events.subscribe()),
            shown: Default::default(),
        };
        mesh.post_human(0, "carol", "@Coder STEPS 3").await;
        (mesh, page)
    }

    #[tokio::test]
    async fn the_local_page_shows_the_same_one_status_edited_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let (mesh, page) = asked_on_the_page(&dir).await;
        one_status_then_the_answer(&dir, &page).await;
        recorded_once_as_status_and_unanswered(&mesh, "demo", None).await;
        // The transcript the page loads shows it as status.
        let t = botmesh_tests::fetch_json(
            reqwest::Client::new().get(format!("{}/v1/transcript?group=demo", mesh.api(0))),
        )
        .await;
        let kinds: Vec<&str> = t["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["author"]["name"] == "Coder")
            .map(|m| m["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["status", "message"]);
        // A reloaded page shows how the turn went, not "working…" forever.
        assert!(
            coder_on_reload(&mesh).await[0].starts_with("Coder: done in "),
            "{t}"
        );
        mesh.shutdown().await;
    }

    /// Asked again after a stopped turn, Coder's agent (echoing its prompt) is told
    /// first that its last turn was stopped, then only what came since.
    async fn next_prompt_says_it_was_stopped(mesh: &TestMesh, page: &Page) {
        mesh.post_human(0, "carol", "@Coder next").await;
        let answered = coder_messages_when(page, |m| m.len() == 2)
            .await
            .unwrap_or_else(|m| panic!("the next answer: saw {m:?}"));
        assert_eq!(
            answered[1].1,
            "echo: Your last turn was stopped by Boss.\ncarol: @Coder next"
        );
    }

    /// Coder's messages as a reloaded page shows them: their texts from
    /// `GET /v1/transcript`, in order.
    async fn coder_on_reload(mesh: &TestMesh) -> Vec<String> {
        transcript_of(mesh, 0, "demo")
            .await
            .into_iter()
            .filter(|e| e.author.name == "Coder")
            .map(|e| e.text)
            .collect()
    }

    /// A person's `/stop` ends the status naming them ("Coder: stopped by Boss after
    /// 1s"), edited in place; no answer follows it.
    #[tokio::test]
    async fn a_stopped_turn_s_status_names_who_stopped_it() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let (mesh, page) = asked_on_the_page(&dir).await;
        acp_standin::logged(&dir, "step 1 ").await;
        status_when(&page, "the status, working", |t| {
            t.starts_with("Coder is working (")
        })
        .await;
        mesh.post_human(0, "Boss", "/stop").await;
        let shown = coder_messages_when(&page, |m| {
            m.first()
                .is_some_and(|s| s.1.starts_with("Coder: stopped by Boss after "))
        })
        .await
        .unwrap_or_else(|m| panic!("the status ended by the stop: saw {m:?}"));
        assert!(shown[0].2 >= 1, "edited in place: {shown:?}");
        assert!(
            !shown.iter().any(|m| m.1.contains("all 3 steps done")),
            "no answer after a stop: {shown:?}"
        );
        // Said once: the status says it, no line follows (Ada had time to answer one).
        mesh.settle(0, Duration::from_millis(800)).await;
        let shown = page.coder_messages();
        let stopped: Vec<_> = shown
            .iter()
            .filter(|m| m.1.contains("stopped by"))
            .collect();
        assert_eq!(
            stopped.len(),
            1,
            "one \"stopped by\" in the chat: {shown:?}"
        );
        // A reloaded page shows the same.
        let reloaded = coder_on_reload(&mesh).await;
        assert_eq!(reloaded.len(), 1, "{reloaded:?}");
        assert!(
            reloaded[0].starts_with("Coder: stopped by Boss after "),
            "{reloaded:?}"
        );
        // The agent's next prompt starts after the stopped turn, with how it ended.
        next_prompt_says_it_was_stopped(&mesh, &page).await;
        mesh.shutdown().await;
    }

    /// A turn shorter than `status_after_secs` that is stopped shows no status: one
    /// short line says who stopped it.
    #[tokio::test]
    async fn a_short_stopped_turn_gets_one_line_and_no_status() {
        botmesh_tests::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let spec = coder_and_ada(&format!(
            "status_after_secs = 600\nstatus_every_secs = 1\n{}",
            agent(&dir)
        ));
        let mesh = TestMesh::start(spec).await;
        let page = Page {
            events: std::sync::Mutex::new(mesh.node(0).node.events.subscribe()),
            shown: Default::default(),
        };
        mesh.post_human(0, "carol", "@Coder STEPS 3").await;
        acp_standin::logged(&dir, "step 1 ").await;
        mesh.post_human(0, "Boss", "/stop").await;
        coder_messages_when(&page, |m| !m.is_empty())
            .await
            .unwrap_or_else(|m| panic!("the line: saw {m:?}"));
        mesh.settle(0, Duration::from_millis(800)).await;
        let shown = page.coder_messages();
        assert_eq!(
            shown.iter().map(|m| m.1.as_str()).collect::<Vec<_>>(),
            ["stopped by Boss"],
            "one short line, no status"
        );
        let t = transcript_of(&mesh, 0, "demo").await;
        assert!(!t.iter().any(|e| e.kind == Kind::Status), "{t:#?}");
        next_prompt_says_it_was_stopped(&mesh, &page).await;
        mesh.shutdown().await;
    }
}

mod slack {
    use super::*;
    use botmesh_tests::fake_slack::{FakeSlack, Person, SlackApp};

    const CHANNEL: &str = "C0STATUS1";
    const CODER_ID: &str = "U0CODER01";
    const CAROL_ID: &str = "U0CAROL01";

    impl Shown for FakeSlack {
        fn coder_messages(&self) -> Vec<(String, String, u32)> {
            self.posted_by(CODER_ID)
                .into_iter()
                .map(|m| (m.ts, m.text, m.edits))
                .collect()
        }
    }

    #[tokio::test]
    async fn a_slack_bot_keeps_one_status_message_in_the_thread_while_its_agent_works() {
        botmesh_tests::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let fake = FakeSlack::start(
            vec![SlackApp {
                name: "coder".into(),
                user_id: CODER_ID.into(),
                bot_id: "B0001".into(),
                app_id: "A0001".into(),
                bot_token: "xoxb-coder".into(),
                app_token: "xapp-coder".into(),
            }],
            vec![Person {
                id: CAROL_ID.into(),
                name: "carol".into(),
                display_name: "Carol".into(),
                real_name: "Carol Example".into(),
            }],
            &[CHANNEL],
        )
        .await;
        let coder = format!(
            "platform = \"slack\"\nslack = {{ bot_token_env = \"CODER_BOT\", app_token_env = \"CODER_APP\", channel_id = \"{CHANNEL}\", user_id = \"{CODER_ID}\", api_base_url = \"{}\" }}\n{QUICK_STATUS}\n{}",
            fake.api_base_url,
            agent(&dir),
        );
        let mut spec = coder_and_ada(&coder);
        spec.env = HashMap::from([
            ("CODER_BOT".to_string(), "xoxb-coder".to_string()),
            ("CODER_APP".to_string(), "xapp-coder".to_string()),
        ]);
        let mesh = TestMesh::start(spec).await;
        fake.wait("Coder connected", |f| f.connected() == 1).await;

        fake.say(CHANNEL, CAROL_ID, &format!("<@{CODER_ID}> STEPS 3"));
        let ts = one_status_then_the_answer(&dir, &fake).await;
        recorded_once_as_status_and_unanswered(&mesh, "demo", Some(&ts)).await;
        assert!(
            fake.requests()
                .iter()
                .filter(|(m, status, ok)| m == "chat.update" && *status == 200 && *ok)
                .count()
                >= 3,
            "{:?}",
            fake.requests()
        );
        mesh.shutdown().await;
    }
}

mod discord {
    use super::*;
    use botmesh_tests::fake_discord::{BotAccount, FakeDiscord, Person};

    const CHANNEL: &str = "1200000000000000001";
    const CODER_ID: &str = "1300000000000000003";
    const CAROL_ID: &str = "1400000000000000001";

    impl Shown for FakeDiscord {
        fn coder_messages(&self) -> Vec<(String, String, u32)> {
            self.posted_by(CODER_ID)
                .into_iter()
                .map(|m| (m.id, m.content, m.edits))
                .collect()
        }
    }

    #[tokio::test]
    async fn a_discord_bot_keeps_one_status_message_while_its_agent_works() {
        botmesh_tests::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let fake = FakeDiscord::start(
            vec![BotAccount {
                token: "coder-token".into(),
                user_id: CODER_ID.into(),
                username: "coder".into(),
            }],
            vec![Person {
                id: CAROL_ID.into(),
                username: "carol".into(),
                global_name: Some("Carol".into()),
                nick: None,
            }],
            &[CHANNEL],
        )
        .await;
        let coder = format!(
            "platform = \"discord\"\ndiscord = {{ token_env = \"CODER_TOKEN\", channel_id = \"{CHANNEL}\", user_id = \"{CODER_ID}\", api_base_url = \"{}\", gateway_url = \"{}\" }}\n{QUICK_STATUS}\n{}",
            fake.api_base_url,
            fake.gateway_url,
            agent(&dir),
        );
        let mut spec = coder_and_ada(&coder);
        spec.env = HashMap::from([("CODER_TOKEN".to_string(), "coder-token".to_string())]);
        let mesh = TestMesh::start(spec).await;
        fake.wait("Coder connected", |f| f.connected() == 1).await;

        let asked = fake.say(CHANNEL, CAROL_ID, &format!("<@{CODER_ID}> STEPS 3"));
        let id = one_status_then_the_answer(&dir, &fake).await;
        let status = fake
            .posted_by(CODER_ID)
            .into_iter()
            .find(|m| m.id == id)
            .unwrap();
        let req = status.request.unwrap();
        assert_eq!(
            req["message_reference"]["message_id"],
            asked.as_str(),
            "the status answers the question"
        );
        recorded_once_as_status_and_unanswered(&mesh, "demo", Some(&id)).await;
        mesh.shutdown().await;
    }
}

mod feishu {
    use super::*;
    use botmesh_tests::fake_feishu::{message_event, Callback, FakeApp, FakeFeishu, MessageSpec};
    use botmesh_tests::Scheme;

    const APP_ID: &str = "cli_a1b2c3d4e5f60009";
    const APP_SECRET: &str = "status-app-secret";
    const TOKEN: &str = "rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV";
    const KEY: &str = "a-32-char-encrypt-key-for-tests!";
    const CODER_OPEN_ID: &str = "ou_84aad35d084aa403a838cf73ee18400";
    const CHAT: &str = "oc_5ce6d572455d361153b7xx51da133900";
    const ALICE: &str = "ou_c99c5f35d542efc7ee492afe11af1900";

    impl Shown for FakeFeishu {
        fn coder_messages(&self) -> Vec<(String, String, u32)> {
            self.sent()
                .into_iter()
                .map(|m| (m.message_id, m.text, m.edits))
                .collect()
        }
    }

    #[tokio::test]
    async fn a_feishu_bot_keeps_one_status_message_while_its_agent_works() {
        botmesh_tests::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let fake = FakeFeishu::start(FakeApp {
            app_id: APP_ID.into(),
            app_secret: APP_SECRET.into(),
            bot_open_id: CODER_OPEN_ID.into(),
            app_name: "Coder".into(),
            expire: 7200,
        })
        .await;
        let coder = format!(
            "platform = \"feishu\"\nfeishu = {{ mode = \"webhook\", open_id = \"{CODER_OPEN_ID}\", app_id = \"{APP_ID}\", app_secret_env = \"CODER_APP_SECRET\", verification_token_env = \"CODER_VERIFICATION_TOKEN\", encrypt_key_env = \"CODER_ENCRYPT_KEY\", base_url = \"{}\", chat_id = \"{CHAT}\" }}\n{QUICK_STATUS}\n{}",
            fake.base_url,
            agent(&dir),
        );
        let mut spec = coder_and_ada(&coder);
        spec.scheme = Scheme::Hmac;
        spec.env = [
            ("CODER_APP_SECRET", APP_SECRET),
            ("CODER_VERIFICATION_TOKEN", TOKEN),
            ("CODER_ENCRYPT_KEY", KEY),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mesh = TestMesh::start(spec).await;

        let event = message_event(&MessageSpec {
            app_id: APP_ID,
            token: TOKEN,
            event_id: "ev-status-1",
            message_id: "om_question01",
            chat_id: CHAT,
            sender_open_id: ALICE,
            sender_type: "user",
            text: "@_user_1 STEPS 3",
            mentions: &[("@_user_1", CODER_OPEN_ID, "Coder")],
        });
        let (status, _) = Callback::encrypted_signed(&event, KEY, 0)
            .send(&mesh.http, &mesh.bridge(0))
            .await;
        assert_eq!(status, 200);
        let id = one_status_then_the_answer(&dir, &fake).await;
        recorded_once_as_status_and_unanswered(&mesh, "demo", Some(&id)).await;
        mesh.shutdown().await;
    }
}

mod onebot {
    use super::*;
    use botmesh_tests::fake_onebot::{Account, FakeOnebot, Person};
    use serde_json::json;

    const GROUP: i64 = 735_000_001;
    const CODER_QQ: i64 = 2_000_000_101;
    const CAROL_QQ: i64 = 3_000_000_001;

    impl Shown for FakeOnebot {
        fn coder_messages(&self) -> Vec<(String, String, u32)> {
            self.sent_by(CODER_QQ)
                .into_iter()
                .map(|m| {
                    let text: String = m
                        .message
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|s| s["type"] == "text")
                        .filter_map(|s| s["data"]["text"].as_str())
                        .collect();
                    // QQ cannot edit: a message is as it was sent.
                    (m.message_id.to_string(), text, 0)
                })
                .collect()
        }
    }

    /// QQ has no edit (the stand-in is proven against nonebot in tests/tests/onebot.rs):
    /// a slow turn gets one plain "working…" message, never changed, then the answer.
    #[tokio::test]
    async fn a_qq_bot_posts_one_working_message_and_never_edits_it() {
        botmesh_tests::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let fake = FakeOnebot::start(
            GROUP,
            vec![Account {
                self_id: CODER_QQ,
                nickname: "coder".into(),
                token: "token-coder".into(),
                string_form: false,
            }],
            vec![Person {
                user_id: CAROL_QQ,
                nickname: "Carol".into(),
                card: String::new(),
                hidden: false,
            }],
        )
        .await;
        let coder = format!(
            "platform = \"onebot\"\nonebot = {{ ws_url = \"{}\", access_token_env = \"CODER_ONEBOT_TOKEN\", group_id = \"{GROUP}\", self_id = \"{CODER_QQ}\" }}\n{QUICK_STATUS}\n{}",
            fake.ws_url(CODER_QQ),
            agent(&dir),
        );
        let mut spec = coder_and_ada(&coder);
        spec.env = HashMap::from([("CODER_ONEBOT_TOKEN".to_string(), "token-coder".to_string())]);
        let mesh = TestMesh::start(spec).await;
        fake.wait("Coder connected and identified", |f| {
            f.connected() == 1 && f.actions().iter().any(|a| a.1 == "get_login_info")
        })
        .await;

        let asked = fake.say_segments(
            CAROL_QQ,
            json!([{"type": "at", "data": {"qq": CODER_QQ.to_string()}}, {"type": "text", "data": {"text": " STEPS 3"}}]),
        );
        let id = one_unedited_status_then_the_answer(&dir, &fake).await;
        let status = fake
            .sent_by(CODER_QQ)
            .into_iter()
            .find(|m| m.message_id.to_string() == id)
            .unwrap();
        assert_eq!(
            status.message[0],
            json!({"type": "reply", "data": {"id": asked.to_string()}}),
            "the status answers the question"
        );
        recorded_once_as_status_and_unanswered(&mesh, "demo", Some(&id)).await;
        mesh.shutdown().await;
    }
}

mod matrix {
    use super::*;
    use botmesh_tests::synapse::{Person, Synapse};
    use serde_json::Value;
    use std::sync::{Arc, Mutex};

    /// The room as Carol's client reads it: Coder's messages with their `m.replace`
    /// edits applied, refreshed from Synapse's `/messages` by a task (the helpers
    /// read it synchronously).
    #[derive(Clone, Default)]
    struct RoomView(Arc<Mutex<Vec<(String, String, u32)>>>);

    impl Shown for RoomView {
        fn coder_messages(&self) -> Vec<(String, String, u32)> {
            self.0.lock().unwrap().clone()
        }
    }

    /// Coder's messages in `events` (oldest first): each original with the text of
    /// its latest `m.replace` and how many there were.
    fn with_edits(events: &[Value], coder: &str) -> Vec<(String, String, u32)> {
        let mut shown: Vec<(String, String, u32)> = Vec::new();
        for e in events
            .iter()
            .filter(|e| e["type"] == "m.room.message" && e["sender"] == coder)
        {
            let c = &e["content"];
            if c["m.relates_to"]["rel_type"] == "m.replace" {
                let of = c["m.relates_to"]["event_id"].as_str().unwrap_or_default();
                if let Some(m) = shown.iter_mut().find(|m| m.0 == of) {
                    m.1 = c["m.new_content"]["body"]
                        .as_str()
                        .unwrap_or_default()
                        .into();
                    m.2 += 1;
                }
            } else {
                let body = c["body"].as_str().unwrap_or_default().to_string();
                shown.push((e["event_id"].as_str().unwrap_or_default().into(), body, 0));
            }
        }
        shown
    }

    /// `s` as a path segment (room and event ids carry `!`, `:` and `$`).
    fn escaped(s: &str) -> String {
        s.replace('!', "%21")
            .replace(':', "%3A")
            .replace('$', "%24")
    }

    /// Keeps `view` up to date with the room, read as `token`, every 100 ms.
    fn watch(hs: &'static Synapse, room: &str, token: String, coder: String) -> RoomView {
        let view = RoomView::default();
        let path = format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit=200",
            escaped(room)
        );
        let v = view.clone();
        tokio::spawn(async move {
            loop {
                let got = hs
                    .call(reqwest::Method::GET, &path, Some(&token), None)
                    .await;
                let mut events = got["chunk"].as_array().cloned().unwrap_or_default();
                events.reverse();
                *v.0.lock().unwrap() = with_edits(&events, &coder);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        view
    }

    /// On the real Synapse: one status event, replaced (`m.replace`) as the agent
    /// works, the last replacement "done", then the answer as a new event.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_matrix_bot_keeps_one_status_event_replaced_in_place_while_its_agent_works() {
        botmesh_tests::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let hs = Synapse::shared().await;
        let carol = hs.register("carol", "Carol", false).await;
        let coder_account = hs.register("coder", "Coder", false).await;
        let room = hs.create_room(&carol, &[&coder_account], false).await;
        let mut person = Person::join(hs, &carol, &room).await;
        let coder = format!(
            "platform = \"matrix\"\nmatrix = {{ homeserver = \"{}\", user_id = \"{}\", access_token_env = \"CODER_MATRIX_TOKEN\", room_id = \"{room}\" }}\n{QUICK_STATUS}\n{}",
            hs.url(),
            coder_account.user_id,
            agent(&dir),
        );
        let mut spec = coder_and_ada(&coder);
        spec.env = HashMap::from([(
            "CODER_MATRIX_TOKEN".to_string(),
            coder_account.token.clone(),
        )]);
        let mesh = TestMesh::start(spec).await;
        let (_, health) = wait_for(
            WAIT,
            Duration::from_millis(50),
            || mesh.health(0),
            |(_, h)| h.to_string().contains("\"syncing\":true"),
        )
        .await;
        assert!(health.to_string().contains("\"syncing\":true"), "{health}");
        let view = watch(
            hs,
            &room,
            carol.token.clone(),
            coder_account.user_id.clone(),
        );

        let asked = person.say("@Coder STEPS 3").await;
        let id = one_status_then_the_answer(&dir, &view).await;
        assert!(id.starts_with('$'), "an event id: {id}");
        recorded_once_as_status_and_unanswered(&mesh, &room, Some(&id)).await;
        let status = hs
            .call(
                reqwest::Method::GET,
                &format!(
                    "/_matrix/client/v3/rooms/{}/event/{}",
                    escaped(&room),
                    escaped(&id)
                ),
                Some(&carol.token),
                None,
            )
            .await;
        assert_eq!(
            status["content"]["m.relates_to"]["m.in_reply_to"]["event_id"],
            asked.as_str(),
            "the status answers the question: {status}"
        );
        mesh.shutdown().await;
    }
}

mod dingtalk {
    use super::*;
    use botmesh_tests::fake_dingtalk::{FakeDingTalk, FakeRobot, PersonMessage};

    const CONV: &str = "cidStatusGroup01==";

    /// Coder's robot.
    fn coder() -> FakeRobot {
        FakeRobot {
            client_id: "dingcoder".into(),
            client_secret: "dingcoder-secret".into(),
            robot_code: "dingcoder".into(),
            name: "Coder".into(),
            dingtalk_id: "$:LWCP_v1:$Coder==".into(),
        }
    }

    impl Shown for FakeDingTalk {
        fn coder_messages(&self) -> Vec<(String, String, u32)> {
            // DingTalk's robot messages cannot be edited: each is as it was sent,
            // named by its place in the group.
            self.sent()
                .into_iter()
                .filter(|s| s.robot == "dingcoder" && s.conversation == CONV)
                .enumerate()
                .map(|(i, s)| (i.to_string(), s.text, 0))
                .collect()
        }
    }

    /// DingTalk's robot cannot edit (docs/dingtalk.md; the stand-in is proven against
    /// the official dingtalk-stream SDK in tests/tests/dingtalk.rs): a slow turn gets
    /// one plain "working…" message, never followed by notes, then the answer.
    #[tokio::test]
    async fn a_dingtalk_bot_posts_one_working_message_and_never_edits_it() {
        botmesh_tests::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let robot = coder();
        let fake = FakeDingTalk::start(vec![robot.clone()]).await;
        let coder = format!(
            "platform = \"dingtalk\"\ndingtalk = {{ client_id = \"{}\", client_secret_env = \"CODER_DING_SECRET\", robot_code = \"{}\", conversation_id = \"{CONV}\", api_base_url = \"{}\" }}\n{QUICK_STATUS}\n{}",
            robot.client_id,
            robot.robot_code,
            fake.base_url,
            agent(&dir),
        );
        let mut spec = coder_and_ada(&coder);
        spec.env = HashMap::from([("CODER_DING_SECRET".to_string(), robot.client_secret.clone())]);
        let mesh = TestMesh::start(spec).await;
        assert!(
            fake.wait_for(WAIT, |f| f.connected(&robot.client_id)).await,
            "Coder never connected its stream"
        );
        fake.post(&PersonMessage {
            conversation: CONV,
            sender_nick: "Carol",
            sender_staff_id: "staff-carol",
            text: "@Coder STEPS 3",
            at_robots: &[&robot.client_id],
        });
        one_unedited_status_then_the_answer(&dir, &fake).await;
        recorded_once_as_status_and_unanswered(&mesh, "demo", None).await;
        mesh.shutdown().await;
    }
}

mod wecom {
    use super::*;
    use botmesh_tests::fake_wecom::{FakeWecom, Robot, Via};

    const CHAT: &str = "wrkSFfCgAAtEamStatus1";
    const CODER_BOT_ID: &str = "aibCoder0123456789abcdef";

    impl Shown for FakeWecom {
        fn coder_messages(&self) -> Vec<(String, String, u32)> {
            // A stream's bubble counts once it is finished (the answer); a send is
            // never changed (WeCom's sends cannot be edited).
            self.shown_by(CODER_BOT_ID)
                .into_iter()
                .filter(|s| s.chatid == CHAT && s.finished)
                .enumerate()
                .map(|(i, s)| (i.to_string(), s.content, 0))
                .collect()
        }
    }

    /// WeCom (docs/wecom.md; the stand-in is proven against the official
    /// wecom-aibot-python-sdk in tests/tests/wecom.rs): a slow turn's status is one
    /// plain send, never edited; the callback's stream is kept for the answer.
    #[tokio::test]
    async fn a_wecom_robot_sends_one_working_message_and_answers_on_the_callback_stream() {
        botmesh_tests::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        let fake = FakeWecom::start(vec![Robot {
            name: "Coder".into(),
            bot_id: CODER_BOT_ID.into(),
            secret: "coder-robot-secret".into(),
        }])
        .await;
        let coder = format!(
            "platform = \"wecom\"\nwecom = {{ bot_id = \"{CODER_BOT_ID}\", secret_env = \"CODER_WECOM_SECRET\", ws_url = \"{}\", chat_id = \"{CHAT}\", heartbeat_interval_ms = 300 }}\n{QUICK_STATUS}\n{}",
            fake.ws_url,
            agent(&dir),
        );
        let mut spec = coder_and_ada(&coder);
        spec.env = HashMap::from([(
            "CODER_WECOM_SECRET".to_string(),
            "coder-robot-secret".to_string(),
        )]);
        let mesh = TestMesh::start(spec).await;
        fake.wait("Coder logged in", |f| f.connected(CODER_BOT_ID) == 1)
            .await;
        fake.say("zhangsan", CHAT, "@Coder STEPS 3", &["Coder"]);
        one_unedited_status_then_the_answer(&dir, &fake).await;
        let shown = fake.shown_by(CODER_BOT_ID);
        assert_eq!(
            shown[0].via,
            Via::Send,
            "the status is a plain send: {shown:?}"
        );
        assert!(
            matches!(shown[1].via, Via::Reply { .. }),
            "the answer is on the callback's stream: {shown:?}"
        );
        recorded_once_as_status_and_unanswered(&mesh, "demo", None).await;
        mesh.shutdown().await;
    }
}
