//! The adapter's rules without a node: the documented settings, their mistakes, and
//! the inbound recording of people's and colleagues' messages.

use super::*;
use crate::platform::kit::test_config::{assert_mistakes_named, node_config, peers_toml, settings};
use crate::platform::kit::test_sink::{
    assert_colleague_copy_recorded_once, ingest, settle, TestSink,
};
use std::sync::LazyLock;

/// The shape docs/telegram.md shows.
static DOCS_CONFIG: LazyLock<String> = LazyLock::new(|| {
    peers_toml(&[
        (
            "Alpha",
            r#"
platform = "telegram"

[bots.telegram]
token_env = "ALPHA_TOKEN"
chat_id = "-1001234567890"
username = "alpha_bot"
"#,
        ),
        (
            "Beta",
            r#"
aliases = ["贝塔"]
platform = "telegram"
telegram = { token_env = "BETA_TOKEN", chat_id = "-1001234567890", username = "beta_bot" }
"#,
        ),
        ("Loc", ""),
    ])
});

fn env() -> HashMap<String, String> {
    crate::platform::kit::test_config::env(&[
        ("ALPHA_TOKEN", "111:alpha-token"),
        ("BETA_TOKEN", "222:beta-token"),
        ("HOOK_SECRET", "s3cret_-token"),
    ])
}

fn alpha() -> Telegram {
    let t = Telegram::from_config(&node_config(&DOCS_CONFIG, "Alpha", &env())).unwrap();
    t.handles.write().me = Some((111, "Alpha".into()));
    t
}

#[test]
fn the_documented_config_loads_and_resolves_its_token() {
    let s = settings(&DOCS_CONFIG).unwrap();
    let t = s.bots[0].table::<TelegramSettings>(TELEGRAM).unwrap();
    assert_eq!(t.api_base_url(), settings::TELEGRAM_API_BASE_URL);
    assert_eq!(t.chat(), Some(-1001234567890));
    let cfg = NodeConfig::resolve(s.clone(), "Alpha", None, &env()).unwrap();
    let secrets = TelegramSecrets::of(&cfg).unwrap();
    assert_eq!(secrets.token, "111:alpha-token");
    assert!(!format!("{cfg:?} {secrets:?}").contains("alpha-token"));
    let mut no_token = env();
    no_token.remove("ALPHA_TOKEN");
    let e = NodeConfig::resolve(s.clone(), "Alpha", None, &no_token).unwrap_err();
    assert_eq!(e.key, "bots[0].telegram.token_env");
    NodeConfig::resolve(s, "Loc", None, &no_token).expect("a local bot needs no telegram token");
    assert_eq!(crate::platform::visibility_of(TELEGRAM), VISIBILITY);
    assert!(
        crate::platform::registry::adapter(TELEGRAM).is_some(),
        "registered"
    );
}

#[test]
fn telegram_config_mistakes_name_their_key() {
    let cases = [
        ("token_env = \"ALPHA_TOKEN\"\n", "", "bots[0].telegram.token_env"),
        ("chat_id = \"-1001234567890\"\nusername", "username", "bots[0].telegram.chat_id"),
        ("chat_id = \"-1001234567890\"\nusername", "chat_id = \"@mygroup\"\nusername", "bots[0].telegram.chat_id"),
        ("username = \"alpha_bot\"\n", "", "bots[0].telegram.username"),
        ("username = \"alpha_bot\"\n", "username = \"@alpha_bot\"\n", "bots[0].telegram.username"),
        ("username = \"alpha_bot\"\n", "username = \"alpha\"\n", "bots[0].telegram.username"),
        ("username = \"beta_bot\" }", "username = \"Alpha_Bot\" }", "bots[1].telegram.username"),
        ("username = \"alpha_bot\"\n", "username = \"alpha_bot\"\napi_base_url = \"api.telegram.org\"\n", "bots[0].telegram.api_base_url"),
        ("username = \"alpha_bot\"\n", "username = \"alpha_bot\"\nwebhook_url = \"https://bots.example.com/telegram/v1/updates\"\n", "bots[0].telegram.secret_token_env"),
        ("username = \"alpha_bot\"\n", "username = \"alpha_bot\"\nsecret_token_env = \"HOOK_SECRET\"\n", "bots[0].telegram.secret_token_env"),
        ("telegram = { token_env = \"BETA_TOKEN\", chat_id = \"-1001234567890\", username = \"beta_bot\" }\n", "", "bots[1].telegram"),
    ];
    assert_mistakes_named(&DOCS_CONFIG, &cases);
    let e =
        settings(&DOCS_CONFIG.replace("token_env = \"ALPHA", "tokn_env = \"ALPHA")).unwrap_err();
    assert!(e.to_string().contains("unknown field `tokn_env`"), "{e}");
    // A colleague on another platform may carry only its handle.
    let loc_handle = DOCS_CONFIG.to_string() + "telegram = { username = \"loc_bot\" }\n";
    settings(&loc_handle).unwrap();
    // Webhook mode reads its secret; a bad one names the key.
    let hook = DOCS_CONFIG.replacen(
        "username = \"alpha_bot\"\n",
        "username = \"alpha_bot\"\nwebhook_url = \"https://bots.example.com/telegram/v1/updates\"\nsecret_token_env = \"HOOK_SECRET\"\n",
        1,
    );
    let cfg = NodeConfig::resolve(settings(&hook).unwrap(), "Alpha", None, &env()).unwrap();
    let secrets = TelegramSecrets::of(&cfg).unwrap();
    assert_eq!(secrets.secret_token.as_deref(), Some("s3cret_-token"));
    assert!(!format!("{secrets:?}").contains("s3cret"));
    let mut bad = env();
    bad.insert("HOOK_SECRET".into(), "has spaces in it".into());
    let cfg = NodeConfig::resolve(settings(&hook).unwrap(), "Alpha", None, &bad).unwrap();
    let e = Telegram::from_config(&cfg).unwrap_err();
    assert!(e.to_string().contains("telegram.secret_token_env"), "{e}");
    let mut unset = env();
    unset.remove("HOOK_SECRET");
    let e = NodeConfig::resolve(settings(&hook).unwrap(), "Alpha", None, &unset).unwrap_err();
    assert_eq!(e.key, "bots[0].telegram.secret_token_env");
}

#[test]
fn groups_map_to_chats_and_back() {
    let t = alpha();
    assert_eq!(t.group_for_chat(-1001234567890), "team");
    assert_eq!(t.group_for_chat(-1009), "-1009");
    assert_eq!(t.chat_for_group("team"), Some(-1001234567890));
    assert_eq!(t.chat_for_group("-1009"), Some(-1009));
    assert_eq!(t.chat_for_group("demo"), None);
    assert_eq!(t.handle_for("Beta").as_deref(), Some("beta_bot"));
    assert_eq!(t.handle_for("Alpha"), None, "never itself");
    assert_eq!(t.handle_for("Loc"), None);
}

/// A message in the group by user `from` (`is_bot`, `username`).
fn message(id: i64, from: serde_json::Value, text: &str, entities: serde_json::Value) -> Message {
    serde_json::from_value(serde_json::json!({
        "message_id": id, "date": 1_767_000_000,
        "chat": {"id": -1001234567890i64, "type": "supergroup", "title": "Team"},
        "from": from, "text": text, "entities": entities,
    }))
    .unwrap()
}

fn beta_user() -> serde_json::Value {
    serde_json::json!({"id": 222, "is_bot": true, "first_name": "Beta", "username": "beta_bot"})
}

/// In bot-to-bot mode a colleague's message is recorded once, keeping the bridge copy
/// (its depth), whether the bridge copy comes before the Telegram copy, during its
/// wait, or never (then the Telegram copy is context at max_depth). Own messages are
/// ignored; a person's message delivered twice is recorded once.
#[tokio::test(start_paused = true)]
async fn a_colleagues_message_is_recorded_once_in_either_order() {
    let t = Arc::new(alpha());
    let sink = Arc::new(TestSink::default());
    let ing = ingest(sink.clone());
    let done = serde_json::json!([{"type": "mention", "offset": 0, "length": 10}]);
    assert_colleague_copy_recorded_once(
        (&sink, &ing),
        ("Beta", "@Alpha done", 3),
        BRIDGE_GRACE,
        |n| format!("-1001234567890:{}", 10 + n),
        |n| {
            let (t, ing) = (&t, &ing);
            let m = message(10 + n as i64, beta_user(), "@alpha_bot done", done.clone());
            async move { assert!(t.on_message(ing, m).await, "confirmed") }
        },
    )
    .await;
    // Its own message: ignored.
    let own = serde_json::json!({"id": 111, "is_bot": true, "first_name": "Alpha", "username": "alpha_bot"});
    t.on_message(&ing, message(13, own, "mine", serde_json::json!([])))
        .await;
    settle(&ing).await;
    assert_eq!(sink.all().len(), 3);
    // A person's message, twice: once, with the id every node derives.
    let carol =
        serde_json::json!({"id": 501, "is_bot": false, "first_name": "Carol", "last_name": "C"});
    let text = "😀 问 @beta_bot and @Alpha_bot";
    let ents = serde_json::json!([
        {"type": "mention", "offset": 5, "length": 9},
        {"type": "mention", "offset": 19, "length": 10},
    ]);
    let m = message(14, carol, text, ents);
    assert!(t.on_message(&ing, m.clone()).await);
    assert!(t.on_message(&ing, m).await);
    let all = sink.all();
    assert_eq!(all.len(), 4);
    let h = &all[3];
    assert_eq!(h.id, envelope_id(-1001234567890, 14, 1_767_000_000_000));
    assert_eq!(
        (
            h.author.name.as_str(),
            h.text.as_str(),
            h.root,
            h.person.as_deref()
        ),
        ("Carol C", "😀 问 @Beta and @Alpha", Some(h.id), Some("501"))
    );
    // Private chats and service messages are not the mesh's.
    let mut dm = message(
        15,
        serde_json::json!({"id": 501, "is_bot": false, "first_name": "Carol"}),
        "psst",
        serde_json::json!([]),
    );
    dm.chat.kind = "private".into();
    t.on_message(&ing, dm).await;
    let join: Message = serde_json::from_value(serde_json::json!({
        "message_id": 16, "date": 1, "chat": {"id": -1001234567890i64, "type": "supergroup"},
        "from": {"id": 501, "is_bot": false, "first_name": "Carol"},
        "new_chat_members": [{"id": 502, "is_bot": false, "first_name": "Dan"}],
    }))
    .unwrap();
    t.on_message(&ing, join).await;
    assert_eq!(sink.all().len(), 4);
}

#[test]
fn every_node_names_a_telegram_message_alike() {
    let a = envelope_id(-100, 7, 1_700_000_000_000);
    assert_eq!(a, envelope_id(-100, 7, 1_700_000_000_000));
    assert_ne!(
        a,
        envelope_id(-101, 7, 1_700_000_000_000),
        "message ids are per chat"
    );
    assert_eq!(a.timestamp_ms(), 1_700_000_000_000);
}
