//! The adapter's rules without a node: its settings in peers.toml, the text it reads
//! and the segments it sends, and the pace of its sends.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::segments::{self, Segment};
use super::*;
use crate::platform::kit::test_config::{
    assert_mistakes_named, env, error_without_secrets, node_config, peers_toml,
};
use std::sync::LazyLock;

/// The shape docs/qq.md shows.
static DOCS_CONFIG: LazyLock<String> = LazyLock::new(|| {
    peers_toml(&[
        (
            "Ada",
            r#"
platform = "onebot"

[bots.onebot]
ws_url = "ws://127.0.0.1:3001/"
access_token_env = "ADA_ONEBOT_TOKEN"
group_id = "700100"
self_id = "10001"
send_interval_ms = 1000
"#,
        ),
        (
            "Bix",
            r#"
platform = "onebot"
onebot = { ws_url = "ws://127.0.0.1:3002/", access_token_env = "BIX_ONEBOT_TOKEN", group_id = "700100", self_id = "10002" }
"#,
        ),
        ("Loc", ""),
    ])
});

fn ada() -> Onebot {
    let env = env(&[("ADA_ONEBOT_TOKEN", "secret-token")]);
    Onebot::from_config(&node_config(&DOCS_CONFIG, "Ada", &env)).unwrap()
}

#[test]
fn the_documented_config_loads_and_names_each_mistake() {
    let a = ada();
    assert_eq!(
        (a.self_id.as_str(), a.group_id.as_str()),
        ("10001", "700100")
    );
    assert_eq!(a.token, "secret-token");
    assert_eq!(a.peer_qq.get("Bix").map(String::as_str), Some("10002"));
    let mistakes = [
        (
            "ws_url = \"ws://127.0.0.1:3001/\"",
            "ws_url = \"http://127.0.0.1:3001/\"",
            "bots[0].onebot.ws_url",
        ),
        (
            "group_id = \"700100\"\n",
            "group_id = \"team\"\n",
            "bots[0].onebot.group_id",
        ),
        (
            "self_id = \"10001\"",
            "self_id = \"10002\"",
            "bots[1].onebot.self_id",
        ),
        (
            "self_id = \"10001\"",
            "self_id = \"qq\"",
            "bots[0].onebot.self_id",
        ),
        (
            "send_interval_ms = 1000",
            "send_interval_ms = 0",
            "bots[0].onebot.send_interval_ms",
        ),
        (
            "access_token_env = \"ADA_ONEBOT_TOKEN\"\n",
            "",
            "bots[0].onebot.access_token_env",
        ),
    ];
    assert_mistakes_named(&DOCS_CONFIG, &mistakes);
    let e = error_without_secrets(&DOCS_CONFIG, "Ada", Onebot::from_config);
    assert!(
        e.contains("ADA_ONEBOT_TOKEN") || e.contains("access_token_env"),
        "{e}"
    );
}

#[test]
fn segments_read_as_the_mesh_reads_them() {
    let a = ada();
    a.names
        .lock()
        .insert(("700100".into(), "20001".into()), "Carol C".into());
    let segs = segments::parse(&json!([
        {"type": "reply", "data": {"id": "9"}},
        {"type": "at", "data": {"qq": "10002"}},
        {"type": "text", "data": {"text": " look"}},
        {"type": "face", "data": {"id": "14"}},
        {"type": "at", "data": {"qq": "20001"}},
        {"type": "at", "data": {"qq": "30003", "name": "Eve"}},
        {"type": "at", "data": {"qq": "all"}},
        {"type": "image", "data": {"file": "a.jpg"}},
        {"type": "record", "data": {"file": "a.amr"}},
        {"type": "file", "data": {"file": "a.pdf"}}
    ]));
    assert_eq!(
        a.readable("700100", &segs),
        "@Bix look[face]@Carol C @Eve @everyone [image][voice][file]"
    );
    let cq = segments::parse(&json!("[CQ:at,qq=10001] 1 &amp; &#91;2&#93;&#44; 3"));
    assert_eq!(a.readable("700100", &cq), "@Ada 1 & [2], 3");
    assert_eq!(segments::parse(&json!(42)), Vec::<Segment>::new());
    let code = segments::parse(&json!([
        {"type": "at", "data": {"qq": "10002"}},
        {"type": "text", "data": {"text": "\n    indented  twice"}}
    ]));
    assert_eq!(
        a.readable("700100", &code),
        "@Bix\n    indented  twice",
        "the text's own spacing is kept"
    );
}

#[test]
fn colleagues_become_at_segments_and_text_stays_text() {
    let a = ada();
    let parts = a.outgoing_parts("@Bix, see [CQ:at,qq=all] & @Ada \u{E000}x");
    assert_eq!(
        parts,
        vec![
            Ok(String::new()),
            Err("10002".to_string()),
            Ok(", see [CQ:at,qq=all] & @Ada x".to_string()),
        ],
        "a colleague is an at; the bot itself and CQ-looking text stay text"
    );
    let msg = segments::outgoing(None, &parts);
    assert_eq!(
        msg,
        json!([
            {"type": "at", "data": {"qq": "10002"}},
            {"type": "text", "data": {"text": ", see [CQ:at,qq=all] & @Ada x"}}
        ])
    );
    assert_eq!(a.group_id_for("team").as_deref(), Some("700100"));
    assert_eq!(a.group_id_for("800200").as_deref(), Some("800200"));
    assert_eq!(a.group_id_for("not a group"), None);
    assert_eq!(a.group_for("700100"), "team");
}

#[tokio::test(start_paused = true)]
async fn sends_to_one_group_are_a_second_apart_and_groups_do_not_wait() {
    let a = ada();
    let start = Instant::now();
    a.pacer.acquire("700100").await;
    a.pacer.acquire("800200").await;
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the first send of each group"
    );
    a.pacer.acquire("700100").await;
    assert!(
        start.elapsed() >= Duration::from_millis(999),
        "{:?}",
        start.elapsed()
    );
    a.pacer.acquire("700100").await;
    assert!(
        start.elapsed() >= Duration::from_millis(1999),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn failed_actions_are_retried_unless_refused_or_perhaps_done() {
    use super::conn::ActionError;
    use crate::platform::kit::api::Classify;
    let failed = |retcode| ActionError::Failed {
        action: "send_group_msg".into(),
        retcode,
        message: String::new(),
    };
    assert!(matches!(
        outbound::classify(failed(1200)),
        Classify::RetryAfter(None, _)
    ));
    assert!(matches!(
        outbound::classify(failed(100)),
        Classify::RetryAfter(None, _)
    ));
    assert!(matches!(
        outbound::classify(failed(1403)),
        Classify::GiveUp(_)
    ));
    assert!(matches!(
        outbound::classify(ActionError::NotConnected),
        Classify::RetryAfter(None, _)
    ));
    assert!(matches!(
        outbound::classify(ActionError::NoAnswer("send_group_msg".into())),
        Classify::GiveUp(_)
    ));
}
