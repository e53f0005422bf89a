//! The adapter's rules without a node: its settings in peers.toml, the text it
//! posts, and how events become transcript entries (against a sink that dedups as the
//! transcript does).

use std::collections::HashMap;
use std::sync::Arc;

use super::inbound::{MessageEvent, BRIDGE_GRACE};
use super::socket::Delivery;
use super::*;
use crate::platform::kit::test_config::{assert_mistakes_named, node_config, peers_toml, settings};
use crate::platform::kit::test_sink::{
    assert_colleague_copy_recorded_once, ingest, settle, TestSink,
};
use crate::wire::envelope::AuthorKind;
use std::sync::LazyLock;

/// The shape docs/slack.md shows.
static DOCS_CONFIG: LazyLock<String> = LazyLock::new(|| {
    peers_toml(&[
        (
            "Ada",
            r#"
platform = "slack"

[bots.slack]
bot_token_env = "ADA_BOT_TOKEN"
app_token_env = "ADA_APP_TOKEN"
channel_id = "C0700"
user_id = "U1001"
"#,
        ),
        (
            "Bix",
            r#"
aliases = ["bixie"]
platform = "slack"
slack = { bot_token_env = "BIX_BOT_TOKEN", app_token_env = "BIX_APP_TOKEN", channel_id = "C0700", user_id = "U1002" }
"#,
        ),
        ("Loc", ""),
    ])
});

fn env() -> HashMap<String, String> {
    crate::platform::kit::test_config::env(&[
        ("ADA_BOT_TOKEN", "xoxb-ada-secret"),
        ("ADA_APP_TOKEN", "xapp-ada-secret"),
    ])
}

fn config() -> NodeConfig {
    node_config(&DOCS_CONFIG, "Ada", &env())
}

fn ada() -> Slack {
    Slack::from_config(&config()).unwrap()
}

#[test]
fn the_documented_config_loads_and_names_each_mistake() {
    let cfg = config();
    let secrets = SlackSecrets::of(&cfg).unwrap();
    assert_eq!(
        (secrets.bot_token.as_str(), secrets.app_token.as_str()),
        ("xoxb-ada-secret", "xapp-ada-secret")
    );
    assert!(!format!("{cfg:?} {secrets:?}").contains("-secret"));
    let mut swapped = env();
    swapped.insert("ADA_APP_TOKEN".into(), "xoxb-ada-secret".into());
    let cfg2 = NodeConfig::resolve(settings(&DOCS_CONFIG).unwrap(), "Ada", None, &swapped).unwrap();
    let e = Slack::from_config(&cfg2).unwrap_err().to_string();
    assert!(
        e.contains("bots[0].slack.app_token_env") && e.contains("xapp-"),
        "{e}"
    );
    let mut no_app = env();
    no_app.remove("ADA_APP_TOKEN");
    let e = NodeConfig::resolve(settings(&DOCS_CONFIG).unwrap(), "Ada", None, &no_app).unwrap_err();
    assert_eq!(e.key, "bots[0].slack.app_token_env", "{e}");
    let loc = NodeConfig::resolve(settings(&DOCS_CONFIG).unwrap(), "Loc", None, &no_app).unwrap();
    assert!(
        loc.platform_secret("bot_token_env").is_none(),
        "a local bot needs no slack tokens"
    );
    let cases = [
        ("channel_id = \"C0700\"\n", "", "bots[0].slack.channel_id"),
        ("user_id = \"U1001\"\n", "user_id = \"ada\"\n", "bots[0].slack.user_id"),
        (
            "slack = { bot_token_env = \"BIX_BOT_TOKEN\", app_token_env = \"BIX_APP_TOKEN\", channel_id = \"C0700\", user_id = \"U1002\" }\n",
            "",
            "bots[1].slack",
        ),
        (
            "user_id = \"U1002\" }",
            "user_id = \"U1002\", api_base_url = \"ftp://x\" }",
            "bots[1].slack.api_base_url",
        ),
    ];
    assert_mistakes_named(&DOCS_CONFIG, &cases);
    let e = settings(&DOCS_CONFIG.replace("bot_token_env = \"ADA", "bot_tokn_env = \"ADA"))
        .unwrap_err();
    assert!(
        e.to_string().contains("unknown field `bot_tokn_env`"),
        "{e}"
    );
    assert_eq!(crate::platform::visibility_of(SLACK), VISIBILITY);
    let ops = DOCS_CONFIG.replace("[mesh]\n", "[mesh]\noperators = [\"slack:U2001\"]\n");
    assert!(settings(&ops).is_ok(), "slack people as operators");
    let twice = DOCS_CONFIG.replace("user_id = \"U1002\"", "user_id = \"U1001\"");
    let e = settings(&twice).unwrap_err();
    assert_eq!(e.key, "bots[1].slack.user_id", "{e}");
}

#[test]
fn posts_escape_and_mention_colleagues_by_user_id() {
    let s = ada();
    let (text, pinged) = s.outgoing_text(
        "@bixie <b>5 < 6 & \"x\"</b>, @Ada is me, @Loc has no id, `@Bix` in code, @here stays text, thanks <at user_id=\"U2001\">Carol</at> \u{E000}U9\u{E001}",
    );
    assert_eq!(
        text,
        "<@U1002> &lt;b&gt;5 &lt; 6 &amp; \"x\"&lt;/b&gt;, @Ada is me, @Loc has no id, `@Bix` in code, @here stays text, thanks <@U2001> U9"
    );
    assert_eq!(pinged, vec!["U1002".to_string()]);
    assert_eq!(s.group_for_channel("C0700"), "team");
    assert_eq!(s.group_for_channel("C0999"), "C0999");
    assert_eq!(s.channel_for_group("team").as_deref(), Some("C0700"));
    assert_eq!(s.channel_for_group("C0999").as_deref(), Some("C0999"));
    assert_eq!(s.channel_for_group("demo"), None);
}

/// An events_api delivery of `event` with `event_id`.
fn delivery(event_id: &str, retry_attempt: u64, event: serde_json::Value) -> Delivery {
    Delivery {
        kind: "events_api".into(),
        payload: serde_json::json!({"type": "event_callback", "event_id": event_id, "event": event}),
        retry_attempt,
        retry_reason: if retry_attempt > 0 {
            "timeout".into()
        } else {
            String::new()
        },
    }
}

/// A message event by `user` (`bot_id` for apps) in the mesh channel.
fn message(user: &str, bot_id: Option<&str>, ts: &str, text: &str) -> serde_json::Value {
    let mut m = serde_json::json!({"type": "message", "channel": "C0700", "channel_type": "channel", "user": user, "ts": ts, "text": text});
    if let Some(b) = bot_id {
        m["bot_id"] = serde_json::json!(b);
        m["bot_profile"] = serde_json::json!({"name": "bix"});
    }
    m
}

/// A person's message is recorded once however often it is delivered (a redelivery,
/// its app_mention); a colleague's is recorded once with the bridge copy in either
/// order, or as context at max_depth when none comes; the bot's own is ignored; edits
/// and other subtypes are not recorded.
#[tokio::test(start_paused = true)]
async fn each_message_is_recorded_once() {
    let s = Arc::new(ada());
    s.names.lock().insert("U2001".into(), "Carol".into());
    s.names.lock().insert("U2002".into(), "Bix <3".into());
    let sink = Arc::new(TestSink::default());
    let ing = ingest(sink.clone());
    let text = "<@U1001> what about <@U2002> &amp; the &lt;plan&gt;?";
    let m = message("U2001", None, "1700000000.000100", text);
    s.on_delivery(&ing, delivery("Ev1", 0, m.clone())).await;
    s.on_delivery(&ing, delivery("Ev1", 1, m.clone())).await;
    let mut mention = m.clone();
    mention["type"] = serde_json::json!("app_mention");
    mention.as_object_mut().unwrap().remove("channel_type");
    s.on_delivery(&ing, delivery("Ev2", 0, mention)).await;
    let all = sink.all();
    assert_eq!(all.len(), 1);
    let h = &all[0];
    assert_eq!(
        h.id,
        crate::wire::envelope::platform_message_id("slack", "1700000000.000100", 1_700_000_000_000),
        "the id every node derives"
    );
    assert_eq!(
        (
            h.author.name.as_str(),
            h.author.kind,
            h.text.as_str(),
            h.root,
            h.person.as_deref()
        ),
        (
            "Carol",
            AuthorKind::Human,
            "@Ada what about <at user_id=\"U2002\">Bix 3</at> & the <plan>?",
            Some(h.id),
            Some("U2001")
        )
    );
    assert_eq!(
        s.matcher.mentioned(&h.text, &[]),
        vec!["Ada"],
        "a person's tag names no bot"
    );
    assert!(crate::turn::policy::asks_everyone(
        &super::inbound::readable_text("<!channel> thoughts?", &HashMap::new(), &HashMap::new())
    ));
    assert_eq!(
        (h.group.as_str(), h.platform_msg_id.as_deref()),
        ("team", Some("1700000000.000100"))
    );

    // A colleague's app_mention without bot_id, before its message: still a bot's
    // copy (context at max_depth when no bridge copy comes), never a person's.
    let mut bot_mention = message("U1002", None, "1700000000.000150", "<@U1001> look");
    bot_mention["type"] = serde_json::json!("app_mention");
    s.on_delivery(&ing, delivery("Ev2b", 0, bot_mention)).await;
    settle(&ing).await;
    let last = sink.all().pop().unwrap();
    assert_eq!(
        (last.author.name.as_str(), last.author.kind, last.depth),
        ("Bix", AuthorKind::Bot, 3)
    );
    sink.forget_last();

    // A colleague's message, recorded once with its bridge copy in either order.
    let ts = |n: u32| format!("1700000000.000{}00", 2 + n);
    assert_colleague_copy_recorded_once(
        (&sink, &ing),
        ("Bix", "@Ada done", 3),
        BRIDGE_GRACE,
        ts,
        |n| {
            let event = message("U1002", Some("B2"), &ts(n), "<@U1001> done");
            s.on_delivery(&ing, delivery(&format!("Ev{}", 3 + n), 0, event))
        },
    )
    .await;
    // Another app: context under its name, after the grace (no colleague to wait for).
    s.on_delivery(
        &ing,
        delivery(
            "Ev6",
            0,
            message("U3000", Some("B3"), "1700000000.000500", "build passed"),
        ),
    )
    .await;
    settle(&ing).await;
    assert_eq!(sink.all().pop().unwrap().author.name, "bot:bix");
    // Its own message, an edit, a join, a direct message: nothing recorded.
    let n = sink.all().len();
    s.on_delivery(
        &ing,
        delivery(
            "Ev7",
            0,
            message("U1001", Some("B1"), "1700000000.000600", "mine"),
        ),
    )
    .await;
    let mut edit = message("U2001", None, "1700000000.000700", "");
    edit["subtype"] = serde_json::json!("message_changed");
    edit["message"] = serde_json::json!({"ts": "1700000000.000100", "text": "edited"});
    s.on_delivery(&ing, delivery("Ev8", 0, edit)).await;
    let mut join = message(
        "U2001",
        None,
        "1700000000.000800",
        "<@U2001> has joined the channel",
    );
    join["subtype"] = serde_json::json!("channel_join");
    s.on_delivery(&ing, delivery("Ev9", 0, join)).await;
    let mut dm = message("U2001", None, "1700000000.000900", "psst");
    dm["channel"] = serde_json::json!("D0001");
    dm["channel_type"] = serde_json::json!("im");
    s.on_delivery(&ing, delivery("Ev10", 0, dm)).await;
    settle(&ing).await;
    assert_eq!(sink.all().len(), n);
    // A thread reply is remembered with its thread, for the answer.
    let mut reply = message("U2001", None, "1700000000.001000", "in a thread");
    reply["thread_ts"] = serde_json::json!("1700000000.000100");
    s.on_delivery(&ing, delivery("Ev11", 0, reply)).await;
    assert_eq!(
        s.threads
            .lock()
            .get(&"1700000000.001000".to_string())
            .map(String::as_str),
        Some("1700000000.000100")
    );
    assert!(MessageEvent::default().subtype.is_none());
}
