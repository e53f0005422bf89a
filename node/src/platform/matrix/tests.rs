//! Tests of the Matrix adapter: its settings' checks, and the room events it reads.

use super::*;
use crate::config::Settings;

/// The file's own checks, then the platforms'.
fn load(bots: &str) -> Result<Settings, crate::config::ConfigError> {
    let text = format!(
        "[mesh]\nsecret_env = \"S\"\n\
         [[bots]]\nname = \"Ada\"\nbridge = \"127.0.0.1:1\"\napi = \"127.0.0.1:2\"\n{bots}"
    );
    Settings::from_toml(&text, std::path::Path::new("peers.toml"))
        .and_then(|s| crate::platform::registry::check(&s).map(|()| s))
}

const ADA: &str = "platform = \"matrix\"\n[bots.matrix]\nhomeserver = \"https://hs.example\"\n\
                   user_id = \"@ada:hs.example\"\naccess_token_env = \"ADA_TOKEN\"\nroom_id = \"!r:hs.example\"\n";

#[test]
fn each_mistake_names_its_key() {
    load(ADA).expect("valid");
    for (from, to, key, says) in [
        (
            "room_id = \"!r:hs.example\"\n",
            "",
            "bots[0].matrix.room_id",
            "the id of the room",
        ),
        (
            "!r:hs.example",
            "#r:hs.example",
            "bots[0].matrix.room_id",
            "not a room id",
        ),
        (
            "@ada:hs.example",
            "ada",
            "bots[0].matrix.user_id",
            "not a Matrix user id",
        ),
        (
            "https://hs.example",
            "hs.example",
            "bots[0].matrix.homeserver",
            "http",
        ),
        (
            "access_token_env = \"ADA_TOKEN\"\n",
            "",
            "bots[0].matrix.access_token_env",
            "env var",
        ),
    ] {
        let e = load(&ADA.replace(from, to)).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        assert!(e.problem.contains(says), "{e}");
    }
    let e = load("platform = \"matrix\"\n").unwrap_err();
    assert_eq!(e.key, "bots[0].matrix", "{e}");
    let twice = format!(
        "{ADA}[[bots]]\nname = \"Bix\"\nbridge = \"127.0.0.1:3\"\napi = \"127.0.0.1:4\"\nmatrix = {{ user_id = \"@ada:hs.example\" }}\n"
    );
    let e = load(&twice).unwrap_err();
    assert_eq!(e.key, "bots[1].matrix.user_id", "{e}");
    assert!(
        e.problem.contains("already the matrix.user_id of Ada"),
        "{e}"
    );
}

/// Ada on Matrix, Bix a Matrix colleague, Loc local.
fn ada() -> Arc<Matrix> {
    let text = format!(
        "[mesh]\nsecret_env = \"S\"\nmax_depth = 3\n\
         [[bots]]\nname = \"Ada\"\nbridge = \"127.0.0.1:1\"\napi = \"127.0.0.1:2\"\n{ADA}\
         [[bots]]\nname = \"Bix\"\nbridge = \"127.0.0.1:3\"\napi = \"127.0.0.1:4\"\nmatrix = {{ user_id = \"@bix:hs.example\" }}\n\
         [[bots]]\nname = \"Loc\"\nbridge = \"127.0.0.1:5\"\napi = \"127.0.0.1:6\"\n"
    );
    let settings = Settings::from_toml(&text, std::path::Path::new("peers.toml")).unwrap();
    let env: std::collections::HashMap<String, String> = [
        ("S", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        ("ADA_TOKEN", "syt_secret"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cfg = NodeConfig::resolve(settings, "Ada", None, &env).unwrap();
    Arc::new(Matrix::from_config(&cfg).unwrap())
}

fn event(sender: &str, id: &str, content: serde_json::Value) -> RoomEvent {
    serde_json::from_value(serde_json::json!({
        "type": "m.room.message", "event_id": id, "sender": sender,
        "origin_server_ts": 1_700_000_000_000u64, "content": content,
    }))
    .unwrap()
}

/// What is recorded of people, outside bots, this bot's own messages and edits.
#[tokio::test]
async fn who_sent_what_is_read_as_the_adapter_docs_say() {
    use crate::platform::kit::test_sink::{ingest, TestSink};
    use crate::wire::envelope::AuthorKind;
    let mx = ada();
    assert!(!format!("{mx:?}").contains("syt_secret"));
    let sink = Arc::new(TestSink::default());
    let ing = ingest(sink.clone());
    let member: RoomEvent = serde_json::from_value(serde_json::json!({
        "type": "m.room.member", "state_key": "@carol:hs.example", "sender": "@carol:hs.example",
        "content": {"membership": "join", "displayname": "Carol C"},
    }))
    .unwrap();
    mx.on_member(&member);
    // A person: a pill for Bix, m.mentions for Ada without a pill.
    let c = serde_json::json!({
        "msgtype": "m.text", "body": "hi Bix", "format": "org.matrix.custom.html",
        "formatted_body": "hi <a href=\"https://matrix.to/#/@bix:hs.example\">Bix</a>",
        "m.mentions": {"user_ids": ["@ada:hs.example"]},
    });
    assert!(
        mx.on_message(&ing, event("@carol:hs.example", "$1", c))
            .await
    );
    // Another account's notice: a bot's, context nobody answers.
    let notice = serde_json::json!({"msgtype": "m.notice", "body": "build passed"});
    assert!(
        mx.on_message(&ing, event("@ci:hs.example", "$2", notice))
            .await
    );
    // This bot's own message and an edit: nothing recorded.
    let own = serde_json::json!({"msgtype": "m.text", "body": "mine"});
    assert!(
        mx.on_message(&ing, event("@ada:hs.example", "$3", own))
            .await
    );
    let edit = serde_json::json!({"msgtype": "m.text", "body": "* @Ada again",
        "m.new_content": {"msgtype": "m.text", "body": "@Ada again"},
        "m.relates_to": {"rel_type": "m.replace", "event_id": "$1"}});
    assert!(
        mx.on_message(&ing, event("@carol:hs.example", "$4", edit))
            .await
    );
    let all = sink.all();
    let got: Vec<_> = all
        .iter()
        .map(|e| {
            (
                e.author.name.as_str(),
                e.author.kind,
                e.depth,
                e.text.as_str(),
                e.platform_msg_id.as_deref(),
                e.person.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "Carol C",
                AuthorKind::Human,
                0,
                "@Ada hi @Bix",
                Some("$1"),
                Some("@carol:hs.example")
            ),
            (
                "bot:ci",
                AuthorKind::Bot,
                3,
                "build passed",
                Some("$2"),
                None
            ),
        ]
    );
    assert_eq!(all[0].group, "!r:hs.example", "the group is the room id");
}
