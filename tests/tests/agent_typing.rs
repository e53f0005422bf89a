//! What the chat sees while a bot's coding agent works: on Discord, the typing
//! indicator (`POST /channels/{id}/typing`), from the moment the bot has its turn until
//! the reply is posted, and none after. The agent is the scripted stand-in
//! tests/py/acp_agent.py (official Python ACP SDK) doing long work that ends only on
//! the test's word (a file), so nothing here depends on how long anything takes. The
//! stand-in's typing route is proven by discord.py in tests/tests/discord.rs.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use botmesh_tests::fake_discord::{BotAccount, FakeDiscord, Person};
use botmesh_tests::{acp_standin_script as script, test_python as python, wait_for};
use botmesh_tests::{MeshSpec, TestMesh};

const CHANNEL: &str = "1200000000000000001";
const CODER_ID: &str = "1300000000000000003";
const CAROL_ID: &str = "1400000000000000001";
/// The longest any wait here lasts.
const WAIT: Duration = Duration::from_secs(20);

/// The stand-in agent's log lines so far.
fn agent_log(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("agent.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_discord_bot_shows_typing_while_its_agent_works_and_stops_once_it_posted() {
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
        "platform = \"discord\"\ndiscord = {{ token_env = \"CODER_TOKEN\", channel_id = \"{CHANNEL}\", user_id = \"{CODER_ID}\", api_base_url = \"{}\", gateway_url = \"{}\" }}\n\
         agent = {{ acp = [{:?}, {:?}], cwd = {:?}, env = {{ ACP_STANDIN_LOG = {:?} }}, sandbox = {{ read = [{:?}] }} }}",
        fake.api_base_url,
        fake.gateway_url,
        python(),
        script(),
        dir.display().to_string(),
        dir.join("agent.log").display().to_string(),
        botmesh_tests::standin_dir(),
    );
    let mut spec = MeshSpec::mentions_only(&["Coder", "Ada"]).bot("Coder", &coder);
    spec.env = HashMap::from([("CODER_TOKEN".to_string(), "coder-token".to_string())]);
    let mesh = TestMesh::start(spec).await;
    fake.wait("Coder connected", |f| f.connected() == 1).await;
    assert!(fake.typing().is_empty());

    fake.say(CHANNEL, CAROL_ID, &format!("<@{CODER_ID}> AWAITGO"));
    // The agent is at work, and stays so until the file appears.
    wait_for(
        WAIT,
        Duration::from_millis(20),
        || async { agent_log(&dir) },
        |l: &Vec<String>| l.iter().any(|l| l.starts_with("awaiting ")),
    )
    .await;
    fake.wait("Coder typing while its agent works", |f| {
        !f.typing().is_empty()
    })
    .await;
    let typed = fake.typing();
    assert!(
        typed
            .iter()
            .all(|t| t.channel_id == CHANNEL && t.user_id == CODER_ID),
        "{typed:?}"
    );
    assert!(
        fake.posted_by(CODER_ID).is_empty(),
        "the agent has not finished: nothing is posted yet"
    );
    assert!(
        !agent_log(&dir).iter().any(|l| l.starts_with("finished ")),
        "typing came while the agent still worked"
    );

    // The word: the agent finishes, the reply is posted, the typing stops.
    std::fs::write(dir.join("go"), b"").unwrap();
    fake.wait("Coder's reply", |f| f.posted_by(CODER_ID).len() == 1)
        .await;
    let posted = fake.posted_by(CODER_ID);
    assert_eq!(posted[0].content, "built after the signal");
    let all = fake.all_messages();
    let reply_at = all
        .iter()
        .position(|m| m.id == posted[0].id)
        .expect("the reply is among the messages");
    // Settled: Coder recorded its reply (the mesh's side of the post is done).
    mesh.wait_transcript(0, WAIT, |t| {
        t.iter().any(|e| e.text == "built after the signal")
    })
    .await;
    let typed = fake.typing();
    // The question is the message just before the reply: every typing call came
    // after it and before the reply, none after.
    assert_eq!(all[reply_at - 1].author_id, CAROL_ID);
    assert!(
        typed.iter().all(|t| t.messages_before == reply_at),
        "typing only between the question and the reply (message {reply_at}): {typed:?}"
    );
    mesh.shutdown().await;
}
