//! The adapter's rules without a node: its settings in peers.toml, the text it
//! records, where answers go, and what a failed request means.

use tokio::time::Instant;

use super::conn::SendError;
use super::frames::code;
use super::inbound::{Replies, ReplyTo, REPLIES_REMEMBERED};
use super::*;
use crate::platform::kit::api::Classify;
use crate::platform::kit::test_config::{
    assert_mistakes_named, env, error_without_secrets, node_config, peers_toml,
};
use std::sync::LazyLock;

/// The shape docs/wecom.md shows.
static DOCS_CONFIG: LazyLock<String> = LazyLock::new(|| {
    peers_toml(&[
        (
            "Ada",
            r#"
aliases = ["小A"]
platform = "wecom"

[bots.wecom]
bot_id = "aibAdaXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
secret_env = "ADA_WECOM_SECRET"
chat_id = "wrkSFfCgAAxxxxxx"
"#,
        ),
        (
            "Bo",
            r#"
platform = "wecom"
wecom = { bot_id = "aibBoXXXXXXXXXXXXXXXXXXXXXXXXXXXXX", secret_env = "BO_WECOM_SECRET", chat_id = "wrkSFfCgAAxxxxxx" }
"#,
        ),
        ("Loc", ""),
    ])
});

fn ada() -> Wecom {
    let env = env(&[("ADA_WECOM_SECRET", "ada-robot-secret")]);
    Wecom::from_config(&node_config(&DOCS_CONFIG, "Ada", &env)).unwrap()
}

#[test]
fn the_documented_config_loads_and_names_each_mistake() {
    let a = ada();
    assert_eq!(a.bot_id, "aibAdaXXXXXXXXXXXXXXXXXXXXXXXXXXXX");
    assert_eq!(a.secret, "ada-robot-secret");
    assert_eq!(a.ws_url, "wss://openws.work.weixin.qq.com", "the default");
    assert_eq!(a.heartbeat, std::time::Duration::from_secs(30));
    assert!(
        !format!("{a:?}").contains("ada-robot-secret"),
        "the secret is not in Debug"
    );
    let mistakes = [
        (
            "secret_env = \"ADA_WECOM_SECRET\"\n",
            "secret_env = \"ADA_WECOM_SECRET\"\nws_url = \"https://openws.work.weixin.qq.com\"\n",
            "bots[0].wecom.ws_url",
        ),
        (
            "secret_env = \"ADA_WECOM_SECRET\"\n",
            "",
            "bots[0].wecom.secret_env",
        ),
        (
            "bot_id = \"aibAdaXXXXXXXXXXXXXXXXXXXXXXXXXXXX\"\n",
            "",
            "bots[0].wecom.bot_id",
        ),
        (
            "bot_id = \"aibBoXXXXXXXXXXXXXXXXXXXXXXXXXXXXX\"",
            "bot_id = \"aibAdaXXXXXXXXXXXXXXXXXXXXXXXXXXXX\"",
            "bots[1].wecom.bot_id",
        ),
        (
            "chat_id = \"wrkSFfCgAAxxxxxx\"\n",
            "chat_id = \"wrkSFfCgAAxxxxxx\"\nheartbeat_interval_ms = 5\n",
            "bots[0].wecom.heartbeat_interval_ms",
        ),
        (
            "chat_id = \"wrkSFfCgAAxxxxxx\"\n",
            "chatid = \"wrkSFfCgAAxxxxxx\"\n",
            "bots[0].wecom",
        ),
    ];
    assert_mistakes_named(&DOCS_CONFIG, &mistakes);
    let e = error_without_secrets(&DOCS_CONFIG, "Ada", Wecom::from_config);
    assert!(
        e.contains("ADA_WECOM_SECRET") || e.contains("secret_env"),
        "{e}"
    );
}

#[test]
fn a_callback_addresses_this_bot_and_keeps_the_other_names() {
    let a = ada();
    assert_eq!(a.mesh_text("@Ada @Bo 你们看看"), "@Ada @Bo 你们看看");
    assert_eq!(a.mesh_text("@小A 在吗"), "@小A 在吗", "an alias names it");
    assert_eq!(
        a.mesh_text("@智能助手 帮我问一下 @Bo"),
        "@Ada @智能助手 帮我问一下 @Bo",
        "the robot's WeCom name is not a mesh name: the bot is named in front"
    );
    assert_eq!(a.mesh_text("  "), "");
    assert_eq!(a.group_for("wrkSFfCgAAxxxxxx"), "team");
    assert_eq!(a.group_for("wrkOther"), "wrkOther");
    assert_eq!(a.chatid_for("team").as_deref(), Some("wrkSFfCgAAxxxxxx"));
    assert_eq!(a.chatid_for("wrkOther").as_deref(), Some("wrkOther"));
}

#[tokio::test(start_paused = true)]
async fn a_callback_takes_an_answer_on_its_own_session_within_the_window() {
    let mut r = Replies::default();
    let at = Instant::now();
    let reply = |req_id: &str, session| ReplyTo {
        req_id: req_id.into(),
        session,
        at,
    };
    r.remember("m1", reply("req-1", 1));
    r.remember("m1", reply("req-other", 1));
    assert_eq!(
        r.usable("m1", Some(1)).unwrap().req_id,
        "req-1",
        "the first wins"
    );
    assert!(r.usable("m1", Some(2)).is_none(), "stale after a reconnect");
    assert!(r.usable("m1", None).is_none(), "not while disconnected");
    assert!(r.usable("m2", Some(1)).is_none());
    tokio::time::advance(inbound::REPLY_WINDOW).await;
    assert!(r.usable("m1", Some(1)).is_none(), "past the 24 h window");
    for i in 0..REPLIES_REMEMBERED + 5 {
        r.remember(&format!("x{i}"), reply("q", 1));
    }
    assert_eq!(r.len(), REPLIES_REMEMBERED, "bounded");
    assert!(r.usable("x0", Some(1)).is_none(), "the oldest forgotten");
}

#[test]
fn rate_limits_are_retried_and_what_may_have_been_shown_is_not() {
    let refused = |errcode| SendError::Refused {
        cmd: "aibot_send_msg".into(),
        errcode,
        errmsg: String::new(),
    };
    for c in [code::FREQ_LIMIT, code::CONCURRENCY_LIMIT, code::BUSY] {
        assert!(
            matches!(outbound::classify(refused(c)), Classify::RetryAfter(..)),
            "{c}"
        );
    }
    for c in [code::TOO_LONG, code::INVALID_REQ_ID, 40058] {
        assert!(
            matches!(outbound::classify(refused(c)), Classify::GiveUp(_)),
            "{c}"
        );
    }
    assert!(matches!(
        outbound::classify(SendError::NoAnswer("aibot_respond_msg".into())),
        Classify::GiveUp(_)
    ));
    assert!(matches!(
        outbound::classify(SendError::NotConnected),
        Classify::RetryAfter(..)
    ));
}
