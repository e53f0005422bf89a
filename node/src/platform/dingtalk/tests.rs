//! Tests of the DingTalk adapter: config, robots' @s removed or kept, outgoing @s of
//! people.

use super::inbound::strip_mentions;
use super::*;
use crate::platform::kit::test_config::{
    assert_mistakes_named, env, node_config_in, peers_toml, settings,
};
use std::sync::LazyLock;

/// The shape docs/dingtalk.md shows.
static DOCS_CONFIG: LazyLock<String> = LazyLock::new(|| {
    peers_toml(&[
        (
            "XiaoBa",
            r#"
aliases = ["小八"]
platform = "dingtalk"

[bots.dingtalk]
client_id = "dingxiaoba0000001"
client_secret_env = "XIAOBA_CLIENT_SECRET"
robot_code = "dingxiaoba0000001"
conversation_id = "cid6KeBBLoveMJOGXoYKF5x7EeiodoA=="
[bots.dingtalk.peer_user_ids]
ErGoz = "$:LWCP_v1:$ergoz=="
"#,
        ),
        (
            "ErGoz",
            r#"
aliases = ["二狗"]
"#,
        ),
    ])
});

#[test]
fn the_documented_config_loads_and_resolves_its_secret() {
    let s = settings(&DOCS_CONFIG).unwrap();
    let d: DingTalkIds = s.bots[0].table(DINGTALK).unwrap();
    assert_eq!(d.api_base_url(), settings::DINGTALK_BASE_URL);
    assert_eq!(d.peer_user_ids["ErGoz"], "$:LWCP_v1:$ergoz==");
    let mut vars = env(&[]);
    let e = NodeConfig::resolve(s.clone(), "XiaoBa", None, &vars).unwrap_err();
    assert_eq!(e.key, "bots[0].dingtalk.client_secret_env");
    vars.insert("XIAOBA_CLIENT_SECRET".into(), "the-client-secret".into());
    let cfg = NodeConfig::resolve(s.clone(), "XiaoBa", None, &vars).unwrap();
    let secret = &DingTalkSecrets::of(&cfg);
    assert_eq!(secret.client_secret, "the-client-secret");
    assert!(!format!("{cfg:?} {secret:?}").contains("the-client-secret"));
    let other = NodeConfig::resolve(s, "ErGoz", None, &vars).unwrap();
    assert!(
        other.platform_secret("client_secret_env").is_none(),
        "a local bot needs no dingtalk secret"
    );
    // The adapter builds from it, maps groups and conversations both ways.
    let dir = tempfile::tempdir().unwrap();
    let cfg = node_config_in(&DOCS_CONFIG, "XiaoBa", dir.path(), &vars);
    let d = DingTalk::from_config(&cfg).unwrap();
    assert_eq!(
        d.group_for_conversation("cid6KeBBLoveMJOGXoYKF5x7EeiodoA=="),
        "team"
    );
    assert_eq!(d.group_for_conversation("cidOther=="), "cidOther==");
    assert_eq!(
        d.conversation_for_group("team").as_deref(),
        Some("cid6KeBBLoveMJOGXoYKF5x7EeiodoA==")
    );
    assert_eq!(
        d.conversation_for_group("cidOther==").as_deref(),
        Some("cidOther==")
    );
    assert_eq!(d.conversation_for_group("elsewhere"), None);
    assert_eq!(
        crate::platform::visibility_of(DINGTALK),
        Visibility {
            humans_reach_every_bot: false,
            bots_see_bots: false
        }
    );
    // ErGoz may carry humans to XiaoBa only if ErGoz is on a platform like this one.
    let rules = crate::platform::human_rules(&cfg);
    assert!(!rules.platform_delivers_humans);
    assert!(rules.carriers.contains("ErGoz"), "ErGoz is local");
}

#[test]
fn dingtalk_config_mistakes_name_their_key() {
    let cases = [
        (
            "client_id = \"dingxiaoba0000001\"\n",
            "",
            "bots[0].dingtalk.client_id",
        ),
        (
            "client_secret_env = \"XIAOBA_CLIENT_SECRET\"\n",
            "",
            "bots[0].dingtalk.client_secret_env",
        ),
        (
            "robot_code = \"dingxiaoba0000001\"\n",
            "",
            "bots[0].dingtalk.robot_code",
        ),
        (
            "conversation_id = \"cid6KeBBLoveMJOGXoYKF5x7EeiodoA==\"\n",
            "conversation_id = \" \"\n",
            "bots[0].dingtalk.conversation_id",
        ),
        (
            "ErGoz = \"$:LWCP_v1:$ergoz==\"",
            "Nobody = \"x\"",
            "bots[0].dingtalk.peer_user_ids.Nobody",
        ),
        (
            "ErGoz = \"$:LWCP_v1:$ergoz==\"",
            "XiaoBa = \"x\"",
            "bots[0].dingtalk.peer_user_ids.XiaoBa",
        ),
        (
            "ErGoz = \"$:LWCP_v1:$ergoz==\"",
            "ErGoz = \"\"",
            "bots[0].dingtalk.peer_user_ids.ErGoz",
        ),
        (
            "robot_code = \"dingxiaoba0000001\"\n",
            "robot_code = \"dingxiaoba0000001\"\napi_base_url = \"api.dingtalk.com\"\n",
            "bots[0].dingtalk.api_base_url",
        ),
        (
            "robot_code = \"dingxiaoba0000001\"\n",
            "robot_code = \"dingxiaoba0000001\"\nrobotcode = \"typo\"\n",
            "bots[0].dingtalk",
        ),
    ];
    assert_mistakes_named(&DOCS_CONFIG, &cases);
    let without_table = peers_toml(&[("XiaoBa", "platform = \"dingtalk\""), ("ErGoz", "")]);
    let e = settings(&without_table).unwrap_err();
    assert_eq!(e.key, "bots[0].dingtalk", "{e}");
}

fn adapter() -> (tempfile::TempDir, DingTalk) {
    let dir = tempfile::tempdir().unwrap();
    let vars = env(&[("XIAOBA_CLIENT_SECRET", "s")]);
    let cfg = node_config_in(&DOCS_CONFIG, "XiaoBa", dir.path(), &vars);
    let d = DingTalk::from_config(&cfg).unwrap();
    (dir, d)
}

#[test]
fn dingtalk_ats_of_robots_are_removed_and_typed_mentions_kept() {
    let (_dir, d) = adapter();
    let m = &d.matcher;
    assert_eq!(
        strip_mentions(m, "@ErGoz please check @小八 too", &["ErGoz", "XiaoBa"]),
        "please check too"
    );
    assert_eq!(
        strip_mentions(m, "ask @ErGoz about it", &["XiaoBa"]),
        "ask @ErGoz about it",
        "a typed @ that DingTalk did not deliver to stays a mention"
    );
    assert_eq!(
        strip_mentions(m, "`@ErGoz` in code", &["ErGoz"]),
        "`@ErGoz` in code"
    );
    // A person's command keeps the @ of each robot it reached: they are whom it
    // addresses (the same text on every robot that carries it).
    assert_eq!(
        d.mesh_text("/why @小八", &["XiaoBa"]),
        "@XiaoBa /why",
        "DingTalk delivered it to XiaoBa alone"
    );
    assert_eq!(
        d.mesh_text("@ErGoz /stop", &["XiaoBa", "ErGoz"]),
        d.mesh_text("/stop", &["ErGoz", "XiaoBa"]),
    );
    assert_eq!(
        d.mesh_text("/stop", &["XiaoBa", "ErGoz"]),
        "@ErGoz @XiaoBa /stop"
    );
}

#[test]
fn a_mentions_only_robot_keeps_its_dingtalk_at_and_a_judging_one_loses_it() {
    let vars = env(&[("XIAOBA_CLIENT_SECRET", "s")]);
    let dir = tempfile::tempdir().unwrap();
    let toml = DOCS_CONFIG.replace(
        "aliases = [\"二狗\"]\n",
        "aliases = [\"二狗\"]\nparticipation = \"mentions\"\n",
    );
    assert_ne!(toml, *DOCS_CONFIG);
    let cfg = node_config_in(&toml, "XiaoBa", dir.path(), &vars);
    let d = DingTalk::from_config(&cfg).unwrap();
    // XiaoBa's copy: DingTalk left out XiaoBa's own @ and kept ErGoz's.
    let from_xiaoba = d.mesh_text("@ErGoz what broke?", &["ErGoz", "XiaoBa"]);
    assert_eq!(from_xiaoba, "@ErGoz what broke?");
    // Only XiaoBa was picked: nothing to keep.
    assert_eq!(d.mesh_text("what broke?", &["XiaoBa"]), "what broke?");
    // A copy that lost ErGoz's @ gets it back, in front.
    assert_eq!(d.mesh_text("what broke?", &["ErGoz"]), "@ErGoz what broke?");
    // A judging robot's own @ typed again in the text goes too.
    assert_eq!(
        d.mesh_text("@XiaoBa @ErGoz what broke?", &["XiaoBa", "ErGoz"]),
        "@ErGoz what broke?"
    );
}

#[test]
fn outgoing_ats_of_known_people_become_real_ats_and_robots_stay_text() {
    let (_dir, d) = adapter();
    let learn = |nick: &str, staff: &str| {
        d.learn(&RobotMessage {
            conversation_id: "cid1".into(),
            msg_id: "m".into(),
            sender_nick: nick.into(),
            sender_staff_id: Some(staff.into()),
            session_webhook: Some("http://127.0.0.1:1/hook".into()),
            session_webhook_expired_time: Some(10_000_000),
            ..Default::default()
        })
    };
    learn("Mira", "staff-mira");
    learn("Mira Chen", "staff-chen");
    learn("ErGoz", "not-a-person");
    let out = d.outgoing("@Mira Chen and ＠Mira: ask @ErGoz, not @Miranda or mira@corp.com");
    assert_eq!(
        out.text,
        "@staff-chen and @staff-mira: ask @ErGoz, not @Miranda or mira@corp.com"
    );
    assert_eq!(out.at_user_ids, vec!["staff-chen", "staff-mira"]);
    // The session webhook is used while it has more than a minute left.
    assert!(d.valid_webhook("cid1", 10_000_000 - 61_000).is_some());
    assert!(d.valid_webhook("cid1", 10_000_000 - 59_000).is_none());
    assert!(d.valid_webhook("cid2", 0).is_none());
}
