//! The Feishu adapter's unit tests.

use super::*;
use crate::turn::mention::Member;
use base64::Engine;
use http::HeaderMap;
use http::StatusCode;
use std::path::Path;
use std::sync::LazyLock;

use crate::platform::kit::test_config::{assert_mistakes_named, env, peers_toml, settings};
use tokio::time::Instant;

/// Feishu's documented example: encrypt key "test key", plaintext "hello world"
/// (open.feishu.cn event subscription docs; also in many SDKs' tests).
const DOC_KEY: &str = "test key";
const DOC_ENCRYPTED: &str = "P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=";

/// larksuite/oapi-sdk-go event/dispatcher/dispatcher_test.go: `TestDecryptEvent`
/// (encrypt key "1212121212") and `mockEventReq` (the same plaintext as the body,
/// signed with timestamp "timestamp", nonce "nonce", key "1212121212").
const SDK_KEY: &str = "1212121212";
const SDK_ENCRYPTED: &str = "bZ3L7yh6m3Fkuffl4g+3uGjIHnhOm5fVZbKVuyT8t7tcd5ABMYm8l28/X900ZL3knZ7n+sCREu/H2WnIzft0amC7+xWqNH8o25IU63N4BnZWfHh+4hyG76QPd19vkw2bPJCx9aqxK8Nz+xqFNbk0RdgyWhmgd30jSxHtcQXAllkI7FMpGpOCteJad3bLXPDBQIV/xkCtKICCS7Z63gakpxZCLaRZ3qCXP1fapHh+LBIupxenrU6ysc7I3nHmjmKie41IiWwS5puG4zQHhVbq6KWLcgWm/3NBZOPQy53ucMu75SXA55I7jarVLZXWUcqBGrcgE3vouWbtwgZuzmoTQl0GSh5VYSVvpW992BuGxUWj0XjPYdICJm6Cr7xouNXwMcdb7N8caVdkdSZeEnswG19qSyDoQhklwzNGW0yiaayulBqJNjfge/G5V3401c2XaIuAeEIo+QQ4RSNpRGfnHkbu/j55FGQAGWjpuBNaIwZbaUoVP3NkGP+vM5rpEDe3sL2GN+Xsd+g9yBs7FqdMV8mXTGgLjCqjrPrke5/km76Q3Pe6KPs2YexMRG4MkSx3xUTzZnNn7zIzShPcjeSwBd2pxk6ht5N+fzueZdxl6Oo=";
const SDK_PLAIN: &str = r#"{"schema":"2.0","header":{"event_id":"f7984f25108f8137722bb63cee927e66","event_type":"contact.user.created_v3","app_id":"cli_xxxxxxxx","tenant_key":"xxxxxxx","create_time":"1603977298000000","token":"v"},"event":{"object":{"open_id":"ou_7dab8a3d3cdcc9da365777c7ad535d62","union_id":"on_576833b917gda3d939b9a3c2d53e72c8","user_id":"e33ggbyz","name":"张三","employee_no":"employee_no"}},"challenge":"1212","type":"url_verification"}"#;
/// sha256("timestamp" + "nonce" + "1212121212" + SDK_PLAIN), computed independently
/// (Python hashlib) from the SDK's `Signature` definition.
const SDK_SIGNATURE: &str = "4dca085198cb3216defc5b65b0668c1328b038a22dbadf2bc6c4fdc3d32bbc45";

/// The `im.message.receive_v1` example of Feishu's "receive message" docs.
const DOC_MESSAGE_EVENT: &str = r#"{
    "schema": "2.0",
    "header": {
        "event_id": "5e3702a84e847582be8db7fb73283c02",
        "event_type": "im.message.receive_v1",
        "create_time": "1608725989000",
        "token": "rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV",
        "app_id": "cli_9f5343c580712544",
        "tenant_key": "2ca1d211f64f6438"
    },
    "event": {
        "sender": {
            "sender_id": {
                "union_id": "on_8ed6aa67826108097d9ee143816345",
                "user_id": "e33ggbyz",
                "open_id": "ou_84aad35d084aa403a838cf73ee18467"
            },
            "sender_type": "user",
            "tenant_key": "736588c9260f175e"
        },
        "message": {
            "message_id": "om_5ce6d572455d361153b7cb51da133945",
            "root_id": "om_5ce6d572455d361153b7cb5xxfsdfsdfdsf",
            "parent_id": "om_5ce6d572455d361153b7cb5xxfsdfsdfdsf",
            "create_time": "1609073151345",
            "update_time": "1687343654666",
            "chat_id": "oc_5ce6d572455d361153b7xx51da133945",
            "thread_id": "omt_d4be107c616",
            "chat_type": "group",
            "message_type": "text",
            "content": "{\"text\":\"@_user_1 hello\"}",
            "mentions": [
                {
                    "key": "@_user_1",
                    "id": {
                        "union_id": "on_8ed6aa67826108097d9ee143816345",
                        "user_id": "e33ggbyz",
                        "open_id": "ou_84aad35d084aa403a838cf73ee18467"
                    },
                    "name": "Tom",
                    "tenant_key": "736588c9260f175e"
                }
            ],
            "user_agent": "Mozilla/5.0"
        }
    }
}"#;

fn headers(ts: &str, nonce: &str, sig: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(HEADER_TIMESTAMP, ts.parse().unwrap());
    h.insert(HEADER_NONCE, nonce.parse().unwrap());
    h.insert(HEADER_SIGNATURE, sig.parse().unwrap());
    h
}

fn auth(token: Option<&str>, key: Option<&str>) -> EventAuth {
    EventAuth {
        app_id: "cli_9f5343c580712544".into(),
        verification_token: token.map(str::to_string),
        encrypt_key: key.map(str::to_string),
    }
}

#[test]
fn decrypts_feishus_documented_example() {
    assert_eq!(decrypt(DOC_KEY, DOC_ENCRYPTED).unwrap(), b"hello world");
    assert!(
        decrypt("other key", DOC_ENCRYPTED).is_err(),
        "a wrong key fails"
    );
    assert_eq!(decrypt(DOC_KEY, "%%%"), Err(CryptoError::Base64));
    assert_eq!(decrypt(DOC_KEY, "AAAA"), Err(CryptoError::Length(3)));
}

#[test]
fn decrypts_the_sdk_test_vector_into_a_url_verification() {
    let plain = decrypt(SDK_KEY, SDK_ENCRYPTED).unwrap();
    assert_eq!(std::str::from_utf8(&plain).unwrap(), SDK_PLAIN);
    assert_eq!(
        parse_callback(&plain).unwrap(),
        Callback::UrlVerification {
            challenge: "1212".into(),
            token: Some("v".into())
        }
    );
}

#[test]
fn encrypt_round_trips() {
    let enc = encrypt("k", "你好 {\"a\":1}".as_bytes(), [7u8; 16]);
    assert_eq!(decrypt("k", &enc).unwrap(), "你好 {\"a\":1}".as_bytes());
    let mut raw = base64::engine::general_purpose::STANDARD
        .decode(&enc)
        .unwrap();
    let last = raw.len() - 1;
    raw[last] ^= 1;
    let tampered = base64::engine::general_purpose::STANDARD.encode(raw);
    assert_ne!(
        decrypt("k", &tampered).ok(),
        Some("你好 {\"a\":1}".as_bytes().to_vec()),
        "tampering never yields the original"
    );
}

#[test]
fn signature_matches_the_sdk_definition() {
    assert_eq!(
        signature("timestamp", "nonce", SDK_KEY, SDK_PLAIN.as_bytes()),
        SDK_SIGNATURE
    );
}

#[test]
fn signed_callbacks_are_checked_in_time_and_in_content() {
    let a = auth(Some("v"), Some(SDK_KEY));
    let body = SDK_PLAIN.as_bytes();
    let now = 1_700_000_000;
    let ts = now.to_string();
    let sig = signature(&ts, "n1", SDK_KEY, body);
    assert!(matches!(
        a.open(&headers(&ts, "n1", &sig), body, now),
        Ok(Callback::UrlVerification { .. })
    ));
    // Uppercase hex is the same signature.
    assert!(a
        .open(&headers(&ts, "n1", &sig.to_uppercase()), body, now)
        .is_ok());
    let tampered = SDK_PLAIN.replace("1212", "1213");
    assert!(matches!(
        a.open(&headers(&ts, "n1", &sig), tampered.as_bytes(), now),
        Err(EventError::BadSignature)
    ));
    for skew in [301, -301] {
        let ts = (now - skew).to_string();
        let sig = signature(&ts, "n1", SDK_KEY, body);
        let e = a.open(&headers(&ts, "n1", &sig), body, now).unwrap_err();
        assert!(matches!(e, EventError::Stale(_)), "{e}");
        assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
    }
    let ts = (now - 300).to_string();
    let sig = signature(&ts, "n1", SDK_KEY, body);
    assert!(a.open(&headers(&ts, "n1", &sig), body, now).is_ok());
    let mut h = headers(&ts, "n1", &sig);
    h.remove(HEADER_NONCE);
    assert!(matches!(
        a.open(&h, body, now),
        Err(EventError::MissingHeader(HEADER_NONCE))
    ));
}

#[test]
fn with_an_encrypt_key_only_the_encrypted_url_check_may_be_unsigned() {
    let a = auth(Some("v"), Some(SDK_KEY));
    let encrypted = format!("{{\"encrypt\":\"{SDK_ENCRYPTED}\"}}");
    let cb = a.open(&HeaderMap::new(), encrypted.as_bytes(), 0).unwrap();
    assert!(matches!(cb, Callback::UrlVerification { ref challenge, .. } if challenge == "1212"));
    // The same in plaintext proves nothing.
    assert!(matches!(
        a.open(&HeaderMap::new(), SDK_PLAIN.as_bytes(), 0),
        Err(EventError::Unsigned)
    ));
    // An unsigned event, even encrypted under the right key, is refused.
    let event = encrypt(SDK_KEY, DOC_MESSAGE_EVENT.as_bytes(), [1; 16]);
    let body = format!("{{\"encrypt\":\"{event}\"}}");
    let a = auth(None, Some(SDK_KEY));
    assert!(matches!(
        a.open(&HeaderMap::new(), body.as_bytes(), 0),
        Err(EventError::Unsigned)
    ));
    // A wrong key does not decrypt.
    let b = auth(None, Some("another key"));
    let e = b
        .open(&HeaderMap::new(), encrypted.as_bytes(), 0)
        .unwrap_err();
    assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
    // No key configured: encrypted bodies are a configuration problem.
    let c = auth(Some("v"), None);
    assert!(matches!(
        c.open(&HeaderMap::new(), encrypted.as_bytes(), 0),
        Err(EventError::NoEncryptKey)
    ));
}

#[test]
fn verification_token_and_app_are_checked() {
    let a = auth(Some("rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV"), None);
    let cb = a
        .open(&HeaderMap::new(), DOC_MESSAGE_EVENT.as_bytes(), 0)
        .unwrap();
    assert!(
        matches!(cb, Callback::Event { ref header, .. } if header.event_id == "5e3702a84e847582be8db7fb73283c02")
    );
    let wrong = auth(Some("something else"), None);
    assert!(matches!(
        wrong.open(&HeaderMap::new(), DOC_MESSAGE_EVENT.as_bytes(), 0),
        Err(EventError::BadToken)
    ));
    let mut other_app = auth(Some("rvaYgkND1GOiu5MM0E1rncYC6PLtF7JV"), None);
    other_app.app_id = "cli_other".into();
    let e = other_app
        .open(&HeaderMap::new(), DOC_MESSAGE_EVENT.as_bytes(), 0)
        .unwrap_err();
    assert_eq!(e.status(), StatusCode::FORBIDDEN);
    assert!(matches!(
        a.open(&HeaderMap::new(), b"not json", 0),
        Err(EventError::Malformed(_))
    ));
}

#[test]
fn parses_the_documented_message_event() {
    let Callback::Event { header, event } = parse_callback(DOC_MESSAGE_EVENT.as_bytes()).unwrap()
    else {
        panic!("an event")
    };
    assert_eq!(header.event_type, "im.message.receive_v1");
    assert_eq!(header.app_id.as_deref(), Some("cli_9f5343c580712544"));
    let m = MessageReceived::from_event(&event).unwrap();
    assert_eq!(m.sender.sender_type, "user");
    assert_eq!(
        m.sender.sender_id.open_id,
        "ou_84aad35d084aa403a838cf73ee18467"
    );
    assert_eq!(m.message.message_id, "om_5ce6d572455d361153b7cb51da133945");
    assert_eq!(m.message.chat_type, "group");
    assert_eq!(m.message.text().as_deref(), Some("@_user_1 hello"));
    assert_eq!(m.message.mentions[0].key, "@_user_1");
    assert_eq!(m.message.mentions[0].name, "Tom");
    assert_eq!(m.message.create_time.as_deref(), Some("1609073151345"));
    let legacy =
        parse_callback(br#"{"uuid":"u1","token":"t","ts":"1","type":"event_callback","event":{}}"#)
            .unwrap();
    assert_eq!(legacy.token(), Some("t"));
    assert!(matches!(legacy, Callback::Legacy { .. }));
    assert!(matches!(
        parse_callback(br#"{"schema":"2.0","header":{"event_id":"a b","event_type":"x"}}"#),
        Err(EventError::Malformed(_))
    ));
}

fn feishu_for_tests(dir: &Path) -> Feishu {
    Feishu {
        client: FeishuClient::new("http://127.0.0.1:9", "cli_a", "s", RetryPolicy::default())
            .unwrap(),
        auth: auth(None, None),
        dedup: EventDedup::open(&dir.join(DEDUP_FILE), EVENT_ID_TTL, 10, 0).unwrap(),
        me: "XiaoBa".into(),
        open_id: Some("ou_me".into()),
        chat_id: Some("oc_team".into()),
        mesh_group: "demo".into(),
        inbound: crate::platform::kit::inbound::Inbound {
            platform: "feishu",
            me: "XiaoBa".into(),
            max_depth: 3,
            grace: BRIDGE_GRACE,
        },
        bots_by_open_id: [("ou_me", "XiaoBa"), ("ou_ergoz_here", "ErGoz")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        peer_open_ids: [("ErGoz".to_string(), "ou_ergoz_here".to_string())]
            .into_iter()
            .collect(),
        matcher: matcher(),
        ingest: OnceLock::new(),
        mode: FeishuMode::Webhook,
        base_url: "http://127.0.0.1:9".into(),
        app_secret: "s".into(),
        ws: OnceLock::new(),
        names: Default::default(),
    }
}

fn matcher() -> MentionMatcher {
    MentionMatcher::new(&[
        Member {
            name: "XiaoBa".into(),
            aliases: vec!["小八".into()],
            open_ids: vec!["ou_me".into()],
        },
        Member {
            name: "ErGoz".into(),
            aliases: vec!["二狗".into()],
            open_ids: vec!["ou_ergoz_own_app".into()],
        },
        Member {
            name: "Mira".into(),
            aliases: vec![],
            open_ids: vec![],
        },
    ])
}

fn mention(key: &str, open_id: &str, name: &str) -> Mention {
    Mention {
        key: key.into(),
        id: UserIds {
            open_id: open_id.into(),
            ..Default::default()
        },
        name: name.into(),
    }
}

#[test]
fn placeholders_become_names_for_bots_and_tags_for_people() {
    let dir = tempfile::tempdir().unwrap();
    let f = feishu_for_tests(dir.path());
    let m = matcher();
    let mentions = vec![
        mention("@_user_1", "ou_me", "小八机器人"),
        mention("@_user_2", "ou_ergoz_here", "二狗 bot"),
        mention("@_user_3", "ou_bob", "Mira Chen"),
        mention("@_user_10", "ou_unknown_app_id", "Mira"),
    ];
    let text = "@_user_1 @_user_2 看下，cc @_user_3 and @_user_10 @_user_4 @_all";
    let readable = f.readable_text(text, &mentions, &m);
    assert_eq!(
        readable,
        "@XiaoBa @ErGoz 看下，cc <at user_id=\"ou_bob\">Mira Chen</at> and @Mira @_user_4 @_all"
    );
    // The human named like a bot is not a mention of the bot; the bots are.
    assert_eq!(m.mentioned(&readable, &[]), vec!["XiaoBa", "ErGoz", "Mira"]);
    let pm = f.platform_mentions(&mentions, &m);
    assert_eq!(pm[0].name, "XiaoBa");
    assert_eq!(pm[2].open_id, "ou_bob");
    assert!(m.mentions(text, &pm, "XiaoBa"));
    assert!(!m.mentioned(text, &pm[2..3]).contains(&"Mira".to_string()));
}

#[test]
fn outgoing_mentions_of_colleagues_become_at_tags() {
    let dir = tempfile::tempdir().unwrap();
    let f = feishu_for_tests(dir.path());
    let m = matcher();
    assert_eq!(
        f.outgoing_text(&m, "@二狗 请 review，@XiaoBa 是我，@Mira 没有 id，`@ErGoz` 在代码里"),
        "<at user_id=\"ou_ergoz_here\">ErGoz</at> 请 review，@XiaoBa 是我，@Mira 没有 id，`@ErGoz` 在代码里"
    );
    assert_eq!(f.group_for_chat("oc_team"), "demo");
    assert_eq!(f.group_for_chat("oc_other"), "oc_other");
    assert_eq!(f.chat_for_group("demo").as_deref(), Some("oc_team"));
    assert_eq!(f.chat_for_group("oc_other").as_deref(), Some("oc_other"));
    assert_eq!(f.chat_for_group("elsewhere"), None);
    assert_eq!(f.chat_for_group("direct:oc_p2p").as_deref(), Some("oc_p2p"));
    assert_eq!(f.chat_for_group("direct:nope"), None);
}

#[test]
fn event_ids_survive_a_restart_and_expire_after_a_day() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DEDUP_FILE);
    let day = EVENT_ID_TTL.as_secs();
    let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 1000).unwrap();
    assert!(d.first_time("e1", 1000));
    assert!(!d.first_time("e1", 1001));
    assert!(d.first_time("e2", 2000));
    drop(d);
    let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 1500).unwrap();
    assert!(!d.first_time("e1", 1500), "remembered across a restart");
    assert_eq!(d.len(), 2);
    drop(d);
    let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 1000 + day).unwrap();
    assert_eq!(d.len(), 1, "e1 expired");
    assert!(d.first_time("e1", 1000 + day));
    assert!(!d.first_time("e2", 1000 + day));
    // Expiry in memory too, and a bounded size.
    assert!(d.first_time("e2", 2000 + day));
    let small = EventDedup::open(&dir.path().join("small.log"), EVENT_ID_TTL, 2, 0).unwrap();
    for id in ["a", "b", "c"] {
        assert!(small.first_time(id, 5));
    }
    assert_eq!(small.len(), 2);
    assert!(small.first_time("a", 5), "the oldest was forgotten");
}

#[test]
fn dedup_file_is_compacted_and_tolerates_junk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DEDUP_FILE);
    std::fs::write(&path, "garbage\n10 ok1\nx y\n10 ok1\n20 ok2\n").unwrap();
    let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 30).unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "10 ok1\n20 ok2\n");
    for i in 0..1100 {
        d.first_time(&format!("e{i}"), 40);
    }
    let lines = std::fs::read_to_string(&path).unwrap().lines().count();
    assert_eq!(lines, 1102);
    let d = EventDedup::open(&path, EVENT_ID_TTL, 100, 50).unwrap();
    assert_eq!(d.len(), 100, "bounded on load");
}

#[tokio::test(start_paused = true)]
async fn chat_limiter_spaces_sends_per_chat() {
    let l = ChatLimiter::new(5.0);
    let start = Instant::now();
    for _ in 0..5 {
        l.acquire("oc_a").await;
    }
    assert_eq!(start.elapsed(), Duration::ZERO, "a burst of 5 is free");
    l.acquire("oc_b").await;
    assert_eq!(start.elapsed(), Duration::ZERO, "buckets are per chat");
    l.acquire("oc_a").await;
    assert!(
        start.elapsed() >= Duration::from_millis(199),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn retry_delays_grow_and_honour_hints() {
    let p = RetryPolicy {
        attempts: 5,
        base: Duration::from_millis(100),
        max: Duration::from_secs(1),
    };
    assert!(p.delay(1, None) >= Duration::from_millis(100));
    assert!(p.delay(1, None) < Duration::from_millis(121));
    assert!(p.delay(3, None) >= Duration::from_millis(400));
    assert!(p.delay(10, None) <= Duration::from_millis(1200));
    assert_eq!(
        p.delay(1, Some(Duration::from_secs(60))),
        Duration::from_secs(1)
    );
}

/// The shape docs/feishu.md shows, with tables under `[[bots]]`.
static DOCS_CONFIG: LazyLock<String> = LazyLock::new(|| {
    peers_toml(&[
        (
            "XiaoBa",
            r#"
aliases = ["小八"]
platform = "feishu"

[bots.feishu]
mode = "webhook"
open_id = "ou_xiaoba"
app_id = "cli_a1b2c3d4e5f60001"
app_secret_env = "XIAOBA_APP_SECRET"
verification_token_env = "XIAOBA_VERIFICATION_TOKEN"
encrypt_key_env = "XIAOBA_ENCRYPT_KEY"
chat_id = "oc_team"
base_url = "https://open.larksuite.com/"
[bots.feishu.peer_open_ids]
ErGoz = "ou_ergoz_in_xiaoba"
"#,
        ),
        ("ErGoz", ""),
    ])
});

#[test]
fn the_documented_config_loads_and_resolves_its_secrets() {
    let s = settings(&DOCS_CONFIG).unwrap();
    let f: FeishuIds = s.bots[0].table(FEISHU).unwrap();
    assert_eq!(f.base_url(), LARK_BASE_URL);
    assert_eq!(f.peer_open_ids["ErGoz"], "ou_ergoz_in_xiaoba");
    let mut env = env(&[
        ("XIAOBA_APP_SECRET", "app-secret"),
        ("XIAOBA_VERIFICATION_TOKEN", "vt"),
    ]);
    let e = NodeConfig::resolve(s.clone(), "XiaoBa", None, &env).unwrap_err();
    assert_eq!(e.key, "bots[0].feishu.encrypt_key_env");
    assert!(!e.to_string().contains("app-secret"));
    env.insert("XIAOBA_ENCRYPT_KEY".into(), "ek".into());
    let cfg = NodeConfig::resolve(s.clone(), "XiaoBa", None, &env).unwrap();
    let secrets = &FeishuSecrets::of(&cfg);
    assert_eq!(
        (secrets.app_secret.as_str(), secrets.encrypt_key.as_deref()),
        ("app-secret", Some("ek"))
    );
    assert!(!format!("{cfg:?} {secrets:?}").contains("app-secret"));
    let other = NodeConfig::resolve(s, "ErGoz", None, &env).unwrap();
    assert!(
        other.platform_secret("app_secret_env").is_none(),
        "a local bot needs no feishu secrets"
    );
}

#[test]
fn feishu_config_mistakes_name_their_key() {
    let cases = [
        ("app_id = \"cli_a1b2c3d4e5f60001\"\n", "", "bots[0].feishu.app_id"),
        ("app_secret_env = \"XIAOBA_APP_SECRET\"\n", "", "bots[0].feishu.app_secret_env"),
        (
            "verification_token_env = \"XIAOBA_VERIFICATION_TOKEN\"\nencrypt_key_env = \"XIAOBA_ENCRYPT_KEY\"\n",
            "",
            "bots[0].feishu.encrypt_key_env",
        ),
        ("base_url = \"https://open.larksuite.com/\"", "base_url = \"open.feishu.cn\"", "bots[0].feishu.base_url"),
        ("ErGoz = \"ou_ergoz_in_xiaoba\"", "Nobody = \"ou_x\"", "bots[0].feishu.peer_open_ids.Nobody"),
        ("ErGoz = \"ou_ergoz_in_xiaoba\"", "XiaoBa = \"ou_x\"", "bots[0].feishu.peer_open_ids.XiaoBa"),
    ];
    assert_mistakes_named(&DOCS_CONFIG, &cases);
    let e = settings(&DOCS_CONFIG.replace("chat_id = \"oc_team\"", "chat_id = \"\"")).unwrap_err();
    assert_eq!(e.key, "bots[0].feishu.chat_id");
    // The long connection (the default mode) needs neither token nor key.
    let lc = DOCS_CONFIG
        .replace("mode = \"webhook\"\n", "")
        .replace(
            "verification_token_env = \"XIAOBA_VERIFICATION_TOKEN\"\n",
            "",
        )
        .replace("encrypt_key_env = \"XIAOBA_ENCRYPT_KEY\"\n", "");
    let s = settings(&lc).unwrap();
    assert_eq!(
        s.bots[0].table::<FeishuIds>(FEISHU).unwrap().mode,
        FeishuMode::LongConnection
    );
    let e = settings(&DOCS_CONFIG.replace("mode = \"webhook\"", "mode = \"socket\"")).unwrap_err();
    assert_eq!(e.key, "bots[0].feishu.mode", "{e}");
}

#[test]
fn errors_map_to_statuses_and_never_carry_secrets() {
    let e = EventError::BadToken;
    assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(e.reason(), "bad_token");
    let a = auth(Some("super-secret-token"), Some("super-secret-key"));
    assert!(!format!("{a:?}").contains("super-secret"));
}
