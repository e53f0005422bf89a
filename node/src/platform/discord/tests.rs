//! Tests of the Discord adapter: config, mentions both ways, a colleague's message
//! recorded once in either order, snowflakes and nonces.

use super::*;
use crate::platform::kit::test_config::{assert_mistakes_named, node_config, peers_toml, settings};
use crate::platform::kit::test_sink::{
    assert_colleague_copy_recorded_once, ingest, settle, TestSink,
};
use crate::wire::envelope::Author;
use std::sync::LazyLock;

/// The shape docs/discord.md shows.
static DOCS_CONFIG: LazyLock<String> = LazyLock::new(|| {
    peers_toml(&[
        (
            "Ada",
            r#"
platform = "discord"

[bots.discord]
token_env = "ADA_DISCORD_TOKEN"
channel_id = "1200000000000000001"
user_id = "1300000000000000001"
[bots.discord.peer_user_ids]
Bix = "1300000000000000002"
"#,
        ),
        (
            "Bix",
            r#"
aliases = ["bixie"]
platform = "discord"
discord = { token_env = "BIX_DISCORD_TOKEN", channel_id = "1200000000000000001", user_id = "1300000000000000002" }
"#,
        ),
        ("Loc", ""),
    ])
});

fn env() -> HashMap<String, String> {
    crate::platform::kit::test_config::env(&[
        ("ADA_DISCORD_TOKEN", "ada-token-value"),
        ("BIX_DISCORD_TOKEN", "bix-token-value"),
    ])
}

fn ada() -> Discord {
    Discord::from_config(&node_config(&DOCS_CONFIG, "Ada", &env())).unwrap()
}

#[test]
fn the_documented_config_loads_and_resolves_its_token() {
    let s = settings(&DOCS_CONFIG).unwrap();
    let d: DiscordSettings = s.bots[0].table(DISCORD).unwrap();
    assert_eq!(d.api_base_url(), DISCORD_API_BASE_URL);
    assert_eq!(d.peer_user_ids["Bix"], "1300000000000000002");
    let cfg = NodeConfig::resolve(s.clone(), "Ada", None, &env()).unwrap();
    assert_eq!(DiscordSecrets::of(&cfg).token, "ada-token-value");
    assert!(!format!("{cfg:?} {:?}", DiscordSecrets::of(&cfg)).contains("ada-token-value"));
    let mut no_token = env();
    no_token.remove("ADA_DISCORD_TOKEN");
    let e = NodeConfig::resolve(s.clone(), "Ada", None, &no_token).unwrap_err();
    assert_eq!(e.key, "bots[0].discord.token_env");
    let loc = NodeConfig::resolve(s, "Loc", None, &no_token).unwrap();
    assert!(
        loc.platform_secret("token_env").is_none(),
        "a local bot needs no discord token"
    );
    assert_eq!(
        crate::platform::visibility_of(DISCORD),
        Visibility {
            humans_reach_every_bot: true,
            bots_see_bots: true
        }
    );
}

#[test]
fn discord_config_mistakes_name_their_key() {
    let cases = [
        (
            "token_env = \"ADA_DISCORD_TOKEN\"\n",
            "",
            "bots[0].discord.token_env",
        ),
        (
            "channel_id = \"1200000000000000001\"\nuser_id",
            "user_id",
            "bots[0].discord.channel_id",
        ),
        (
            "channel_id = \"1200000000000000001\"\nuser_id",
            "channel_id = \"#general\"\nuser_id",
            "bots[0].discord.channel_id",
        ),
        (
            "user_id = \"1300000000000000001\"\n",
            "",
            "bots[0].discord.user_id",
        ),
        (
            "user_id = \"1300000000000000001\"\n",
            "user_id = \"ada\"\n",
            "bots[0].discord.user_id",
        ),
        (
            "Bix = \"1300000000000000002\"",
            "Nobody = \"1\"",
            "bots[0].discord.peer_user_ids.Nobody",
        ),
        (
            "Bix = \"1300000000000000002\"",
            "Ada = \"1\"",
            "bots[0].discord.peer_user_ids.Ada",
        ),
        (
            "Bix = \"1300000000000000002\"",
            "Bix = \"<@1>\"",
            "bots[0].discord.peer_user_ids.Bix",
        ),
        (
            "Bix = \"1300000000000000002\"",
            "Bix = \"1300000000000000001\"",
            "bots[0].discord.peer_user_ids.Bix",
        ),
        (
            "token_env = \"ADA_DISCORD_TOKEN\"\n",
            "token_env = \"ADA_DISCORD_TOKEN\"\napi_base_url = \"discord.com/api\"\n",
            "bots[0].discord.api_base_url",
        ),
        (
            "token_env = \"ADA_DISCORD_TOKEN\"\n",
            "token_env = \"ADA_DISCORD_TOKEN\"\ngateway_url = \"http://127.0.0.1:9\"\n",
            "bots[0].discord.gateway_url",
        ),
        (
            "discord = { token_env = \"BIX_DISCORD_TOKEN\", channel_id = \"1200000000000000001\", user_id = \"1300000000000000002\" }\n",
            "",
            "bots[1].discord",
        ),
    ];
    assert_mistakes_named(&DOCS_CONFIG, &cases);
    let e = settings(&DOCS_CONFIG.replace("token_env = \"ADA", "tokn_env = \"ADA")).unwrap_err();
    assert!(e.to_string().contains("unknown field `tokn_env`"), "{e}");
}

fn message(content: &str, mentions: serde_json::Value) -> MessageCreate {
    serde_json::from_value(serde_json::json!({
        "id": "1500000000000000001", "channel_id": "1200000000000000001",
        "guild_id": "1100000000000000001", "type": 0, "content": content,
        "author": {"id": "1400000000000000001", "username": "carol", "global_name": "Carol", "avatar": null},
        "member": {"nick": "Carol C", "roles": []},
        "mentions": mentions, "mention_roles": [], "mention_everyone": false,
    }))
    .unwrap()
}

#[test]
fn mentions_become_roster_names_tags_for_people_and_everyone_for_roles() {
    let d = ada();
    let m = message(
        "<@1300000000000000001> <@!1300000000000000002> ask <@1400000000000000002> and <@1400000000000000003>, cc <@&1600000000000000001>",
        serde_json::json!([
            {"id": "1400000000000000002", "username": "ada_fan", "global_name": "Ada", "member": {"nick": null}},
            {"id": "1400000000000000003", "username": "eve", "global_name": null, "member": {"nick": "Eve <3"}},
        ]),
    );
    let text = d.readable_text(&m);
    assert_eq!(
        text,
        "@Ada @Bix ask <at user_id=\"1400000000000000002\">Ada</at> and <at user_id=\"1400000000000000003\">Eve 3</at>, cc @everyone"
    );
    assert_eq!(m.author.display_name(m.member.as_ref()), "Carol C");
    let matcher = MentionMatcher::new(&crate::turn::roster(&settings(&DOCS_CONFIG).unwrap().bots));
    assert_eq!(
        matcher.mentioned(&text, &[]),
        vec!["Ada", "Bix"],
        "the person called Ada is nobody's mention"
    );
    assert!(
        crate::turn::policy::asks_everyone(&text),
        "a role mention asks everyone"
    );
    assert!(crate::turn::policy::asks_everyone(&d.readable_text(
        &message("@here anyone?", serde_json::json!([]))
    )));
}

#[test]
fn outgoing_mentions_of_colleagues_become_pings() {
    let d = ada();
    let (text, pinged) = d.outgoing_text(
        "@bixie please review, @Ada is me, @Loc has no id, `@Bix` in code, thanks <at user_id=\"1400000000000000001\">Carol C</at>",
    );
    assert_eq!(
        text,
        "<@1300000000000000002> please review, @Ada is me, @Loc has no id, `@Bix` in code, thanks <@1400000000000000001>"
    );
    assert_eq!(pinged, vec!["1300000000000000002".to_string()]);
    assert_eq!(d.group_for_channel("1200000000000000001"), "team");
    assert_eq!(
        d.group_for_channel("1200000000000000009"),
        "1200000000000000009"
    );
    assert_eq!(
        d.channel_for_group("team").as_deref(),
        Some("1200000000000000001")
    );
    assert_eq!(
        d.channel_for_group("1200000000000000009").as_deref(),
        Some("1200000000000000009")
    );
    assert_eq!(d.channel_for_group("demo"), None);
    let own = Envelope::message(Ulid::new(), 1, "team", "Ada", Author::bot("Ada"), "hi");
    assert!(d.should_post(&own));
    let mut posted = own.clone();
    posted.platform_msg_id = Some("1".into());
    assert!(!d.should_post(&posted));
    assert!(!d.should_post(&Envelope::message(
        Ulid::new(),
        1,
        "team",
        "Ada",
        Author::human("x"),
        "hi"
    )));
}

/// A message by Bix (a colleague bot) on Discord, with id `id`.
fn from_bix(id: &str) -> MessageCreate {
    serde_json::from_value(serde_json::json!({
        "id": id, "channel_id": "1200000000000000001", "guild_id": "1100000000000000001",
        "type": 0, "content": "<@1300000000000000001> done",
        "author": {"id": "1300000000000000002", "username": "bix", "global_name": null, "avatar": null, "bot": true},
        "mentions": [], "mention_roles": [], "mention_everyone": false,
    }))
    .unwrap()
}

/// A colleague's message is recorded once, keeping the bridge copy (its depth),
/// whether the bridge copy comes before the Discord copy, during its wait, or never
/// (then the Discord copy is context at max_depth). Own messages are ignored; a
/// person's message replayed after a RESUME is recorded once.
#[tokio::test(start_paused = true)]
async fn a_colleagues_message_is_recorded_once_in_either_order() {
    let d = Arc::new(ada());
    let sink = Arc::new(TestSink::default());
    let ing = ingest(sink.clone());
    let pid = |n: u32| format!("15000000000000000{}", 10 + n);
    assert_colleague_copy_recorded_once(
        (&sink, &ing),
        ("Bix", "@Ada done", 3),
        BRIDGE_GRACE,
        pid,
        |n| d.on_message(&ing, from_bix(&pid(n))),
    )
    .await;
    // Its own message: ignored.
    let mut own = from_bix("1500000000000000013");
    own.author.user.id = "1300000000000000001".into();
    d.on_message(&ing, own).await;
    settle(&ing).await;
    assert_eq!(sink.all().len(), 3);
    // A person's message, twice (a replay): once, with the id every node derives.
    let m = message("hello <@1300000000000000001>", serde_json::json!([]));
    d.on_message(&ing, m.clone()).await;
    d.on_message(&ing, m).await;
    let all = sink.all();
    assert_eq!(all.len(), 4);
    let h = &all[3];
    assert_eq!(h.id, envelope_id("1500000000000000001"));
    assert_eq!(
        (h.author.name.as_str(), h.text.as_str(), h.root),
        ("Carol C", "hello @Ada", Some(h.id))
    );
    // Each one counted once, by what became of it.
    let text = ing.metrics.render();
    for (result, n) in [
        ("bridge_copy", 2),
        ("context", 1),
        ("recorded", 1),
        ("duplicate", 1),
    ] {
        let line = format!(
            "botmesh_platform_events_total{{platform=\"discord\",result=\"{result}\"}} {n}"
        );
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    // DMs and system messages are not the mesh's.
    let mut dm = message("psst", serde_json::json!([]));
    dm.id = "1500000000000000099".into();
    dm.guild_id = None;
    d.on_message(&ing, dm).await;
    let mut join = message("joined", serde_json::json!([]));
    join.id = "1500000000000000098".into();
    join.kind = 7;
    d.on_message(&ing, join).await;
    assert_eq!(sink.all().len(), 4);
}

#[test]
fn snowflakes_carry_their_time() {
    // Discord's docs: 175928847299117063 was made at 2016-04-30 11:18:25.796 UTC.
    assert_eq!(
        snowflake_millis("175928847299117063"),
        Some(1_462_015_105_796)
    );
    assert_eq!(snowflake_millis("x"), None);
}

#[test]
fn every_node_names_a_discord_message_alike() {
    let a = envelope_id("175928847299117063");
    assert_eq!(a, envelope_id("175928847299117063"));
    assert_ne!(a, envelope_id("175928847299117064"));
    assert_eq!(a.timestamp_ms(), 1_462_015_105_796);
}

#[test]
fn nonces_fit_discords_limit_and_differ_per_part() {
    let id = Ulid::new();
    let a = Discord::nonce(&id, 0);
    assert!(a.len() <= 25);
    assert_ne!(a, Discord::nonce(&id, 1));
    assert_eq!(a, Discord::nonce(&id, 0));
}
