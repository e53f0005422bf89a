//! Matrix end to end: real nodes with `platform = "matrix"` against a real Synapse
//! homeserver from PyPI (tests/src/synapse.rs: SQLite, registration by shared secret,
//! no federation, 127.0.0.1 only), people played by matrix-nio
//! (tests/py/matrix_person.py). Each test makes its own users and room.

use std::collections::HashMap;
use std::time::Duration;

use botmesh::platform::matrix::api::{ClientApi, RETRY};
use botmesh::wire::envelope::{AuthorKind, Envelope};
use botmesh_tests::fake_llm::{FakeLlm, Script};
use botmesh_tests::synapse::{Account, Person, Synapse};
use botmesh_tests::transcript::assert_each_platform_msg_once;
use botmesh_tests::{bot_of, fetch_json, show, subject, wait_for, MeshSpec, TestMesh};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(40);

/// Replies by what they answer: "echo X" → X; "ask Bix" → a question to Bix full of
/// HTML; "ask Loc" → a question to the local bot; "long answer" → three parts' worth;
/// "slowly" → after 1.5 s (the LLM timeout is 3 s); anything else "answer from <bot>".
async fn llm() -> FakeLlm {
    FakeLlm::start(|s| {
        let about = subject(s);
        let me = bot_of(s);
        let text = if let Some((_, echo)) = about.split_once("echo ") {
            echo.trim().to_string()
        } else if about.contains("ask Bix") {
            "@Bix what do you think of <b>this</b> & <script>alert(1)</script>?".to_string()
        } else if about.contains("ask Loc") {
            "@Loc please share the deploy logs".to_string()
        } else if about.contains("long answer") {
            let para =
                "This paragraph explains one more step of the rollout in detail. ".repeat(20);
            [para.trim(); 9].join("\n\n")
        } else {
            format!("answer from {me}")
        };
        if about.contains("slowly") {
            Script::delay(Duration::from_millis(1500), Script::reply(text))
        } else {
            Script::reply(text)
        }
    })
    .await
}

/// The `[bots.matrix]` lines of a bot on `room` as `account`, its token in `env`.
fn matrix_bot(hs: &Synapse, account: &Account, env: &str, room: &str) -> String {
    format!(
        "platform = \"matrix\"\nmatrix = {{ homeserver = \"{}\", user_id = \"{}\", access_token_env = \"{env}\", room_id = \"{room}\" }}",
        hs.url(),
        account.user_id
    )
}

/// A room with a person (Carol) and bots on Matrix (plus Loc, local), all answering
/// only when mentioned.
struct Room {
    hs: &'static Synapse,
    room: String,
    carol: Account,
    bots: Vec<Account>,
}

impl Room {
    /// Carol makes a room and invites bots named `names` (`encrypted`: the room is).
    async fn new(names: &[&str], encrypted: bool) -> Room {
        let hs = Synapse::shared().await;
        let carol = hs.register("carol", "Carol", false).await;
        let mut bots = Vec::new();
        for n in names {
            bots.push(hs.register(n, n, false).await);
        }
        let invited: Vec<&Account> = bots.iter().collect();
        let room = hs.create_room(&carol, &invited, encrypted).await;
        Room {
            hs,
            room,
            carol,
            bots,
        }
    }

    /// The mesh: bots `names` (those of the room on Matrix, with token `tokens[i]`),
    /// then Loc, local.
    fn spec(&self, names: &[&str], tokens: &[&str], llm: &FakeLlm) -> MeshSpec {
        let mut all: Vec<&str> = names.to_vec();
        all.push("Loc");
        let mut spec = MeshSpec::mentions_only(&all)
            .llm(&llm.base_url)
            .mesh("max_depth = 3")
            .all_bots("min_delay_ms = 100\nmax_delay_ms = 500\njitter_ms = 0");
        let mut env = HashMap::new();
        for (i, n) in names.iter().enumerate() {
            let var = format!("{}_MATRIX_TOKEN", n.to_uppercase());
            spec = spec.bot(n, &matrix_bot(self.hs, &self.bots[i], &var, &self.room));
            env.insert(var, tokens[i].to_string());
        }
        spec.env = env;
        spec
    }

    fn tokens(&self) -> Vec<&str> {
        self.bots.iter().map(|b| b.token.as_str()).collect()
    }
}

/// Node `i`'s transcript of the room.
async fn transcript(mesh: &TestMesh, i: usize, room: &str) -> Vec<Envelope> {
    let v = fetch_json(
        mesh.http
            .get(format!("{}/v1/transcript", mesh.api(i)))
            .query(&[("group", room), ("limit", "2000")]),
    )
    .await;
    serde_json::from_value(v["messages"].clone()).expect("envelopes")
}

/// Waits until node `i`'s transcript of the room satisfies `cond`.
async fn wait_room(
    mesh: &TestMesh,
    i: usize,
    room: &str,
    cond: impl Fn(&[Envelope]) -> bool,
) -> Vec<Envelope> {
    wait_for(
        WAIT,
        Duration::from_millis(50),
        || transcript(mesh, i, room),
        |t| cond(t),
    )
    .await
}

/// Every Matrix event at most once in the transcript.
fn each_once(t: &[Envelope]) {
    assert_each_platform_msg_once(t, "an event");
}

/// Node `i`'s `/healthz` body once `done` holds of its status and body (the test
/// fails, showing the last, when it does not within [`WAIT`]).
async fn health_when(
    mesh: &TestMesh,
    i: usize,
    what: &str,
    done: impl Fn(u16, &str) -> bool,
) -> String {
    let (status, h) = wait_for(
        WAIT,
        Duration::from_millis(50),
        || mesh.health(i),
        |(s, h)| done(*s, &h.to_string()),
    )
    .await;
    let h = h.to_string();
    assert!(done(status, &h), "node {i}: {what}: {status} {h}");
    h
}

/// Waits until the adapter of node `i` syncs (its first long poll is open).
async fn syncing(mesh: &TestMesh, i: usize) {
    health_when(mesh, i, "never synced", |_, h| {
        h.contains("\"syncing\":true")
    })
    .await;
}

/// Node `i`'s `/healthz` once it answers 503 (a stopped platform).
async fn stopped(mesh: &TestMesh, i: usize) -> String {
    health_when(mesh, i, "never stopped", |s, _| s == 503).await
}

const ADA: usize = 0;
const BIX: usize = 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_on_matrix_and_two_matrix_bots_and_a_local_bot_hold_a_conversation() {
    botmesh_tests::init_logs();
    let llm = llm().await;
    let r = Room::new(&["Ada", "Bix"], false).await;
    let mesh = TestMesh::start(r.spec(&["Ada", "Bix"], &r.tokens(), &llm)).await;
    const LOC: usize = 2;
    let mut carol = Person::join(r.hs, &r.carol, &r.room).await;
    syncing(&mesh, ADA).await;
    syncing(&mesh, BIX).await;
    let (ada, bix) = (&r.bots[0].user_id, &r.bots[1].user_id);

    // 1. A pill and m.mentions for Ada, as Element sends them: Ada answers in the room,
    //    replying to it, with a pill for Bix and the HTML of its answer escaped.
    let q = carol
        .send(json!({
            "msgtype": "m.text",
            "body": "Ada: ask Bix about <i>it</i>",
            "format": "org.matrix.custom.html",
            "formatted_body": format!("<a href=\"https://matrix.to/#/{ada}\">Ada</a>: ask Bix about &lt;i&gt;it&lt;/i&gt;"),
            "m.mentions": {"user_ids": [ada]},
        }))
        .await;
    let answers = carol.messages(ada, 1, WAIT).await;
    assert_eq!(answers.len(), 1, "Ada answered once: {answers:#?}");
    let a = &answers[0]["content"];
    assert_eq!(a["msgtype"], "m.text", "an m.text, never an m.notice: {a}");
    assert_eq!(a["m.relates_to"]["m.in_reply_to"]["event_id"], q.as_str());
    assert_eq!(
        a["body"],
        "@Bix what do you think of <b>this</b> & <script>alert(1)</script>?"
    );
    assert_eq!(a["format"], "org.matrix.custom.html");
    assert_eq!(
        a["formatted_body"],
        format!("<a href=\"https://matrix.to/#/{bix}\">Bix</a> what do you think of &lt;b&gt;this&lt;/b&gt; &amp; &lt;script&gt;alert(1)&lt;/script&gt;?"),
        "a pill for Bix, the rest shown literally"
    );
    assert_eq!(a["m.mentions"], json!({"user_ids": [bix]}));
    let ada_event = answers[0]["event_id"].as_str().unwrap().to_string();

    // 2. Bix was mentioned by Ada (a pill and m.mentions) and answers; Bix recorded
    //    Carol's question as a person's, and Ada's answer once (the bridge copy, depth 1).
    let bix_answers = carol.messages(bix, 1, WAIT).await;
    assert_eq!(bix_answers.len(), 1, "{bix_answers:#?}");
    assert_eq!(bix_answers[0]["content"]["body"], "answer from Bix");
    assert_eq!(
        bix_answers[0]["content"]["m.relates_to"]["m.in_reply_to"]["event_id"],
        ada_event.as_str()
    );
    let bix_event = bix_answers[0]["event_id"].as_str().unwrap().to_string();
    let t = wait_room(&mesh, BIX, &r.room, |t| t.len() >= 3).await;
    let t = show(&t);
    assert_eq!(
        t[..3]
            .iter()
            .map(|(a, d, x, _)| (a.as_str(), *d, x.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("Carol", 0, "@Ada: ask Bix about <i>it</i>"),
            (
                "Ada",
                1,
                "@Bix what do you think of <b>this</b> & <script>alert(1)</script>?"
            ),
            ("Bix", 2, "answer from Bix"),
        ],
        "{t:#?}"
    );
    assert_eq!(t[0].3.as_deref(), Some(q.as_str()));
    assert_eq!(t[1].3.as_deref(), Some(ada_event.as_str()));
    let at_ada = wait_room(&mesh, ADA, &r.room, |t| t.len() >= 3).await;
    assert_eq!(at_ada[2].author.kind, AuthorKind::Bot);
    assert_eq!(
        (at_ada[2].depth, at_ada[2].platform_msg_id.as_deref()),
        (2, Some(bix_event.as_str()))
    );

    // 3. m.mentions alone (no pill, no @ in the text) mentions Bix; a reply's fallback
    //    quote is not part of the text.
    let before = carol.messages(bix, 1, WAIT).await.len();
    carol
        .send(json!({
            "msgtype": "m.text",
            "body": "> <@someone:localhost> old words\n\nplease echo <done>",
            "m.mentions": {"user_ids": [bix]},
            "m.relates_to": {"m.in_reply_to": {"event_id": bix_event}},
        }))
        .await;
    let echoed = carol.messages(bix, before + 1, WAIT).await;
    assert_eq!(echoed.len(), before + 1, "{echoed:#?}");
    assert_eq!(echoed[before]["content"]["body"], "<done>");
    let t = wait_room(&mesh, ADA, &r.room, |t| {
        t.iter().any(|e| e.text.contains("please echo"))
    })
    .await;
    let asked = t.iter().find(|e| e.text.contains("please echo")).unwrap();
    assert_eq!(
        asked.text, "@Bix please echo <done>",
        "the quote dropped, the mention kept"
    );

    // 4. The local bot: Ada asks it; it hears Ada over the bridge and answers in the
    //    room's group; both Matrix bots record its answer (the mesh carries it).
    carol
        .send(json!({"msgtype": "m.text", "body": "@Ada ask Loc for the logs"}))
        .await;
    for i in [LOC, ADA, BIX] {
        let t = wait_room(&mesh, i, &r.room, |t| {
            t.iter().any(|e| e.author.name == "Loc")
        })
        .await;
        let said = |who: &str, text: &str| t.iter().any(|e| e.author.name == who && e.text == text);
        assert!(
            said("Ada", "@Loc please share the deploy logs") && said("Loc", "answer from Loc"),
            "node {i}: {:#?}",
            show(&t)
        );
    }

    // Nothing twice, anywhere; the metrics count what came from Matrix.
    for i in [ADA, BIX] {
        let t = transcript(&mesh, i, &r.room).await;
        each_once(&t);
    }
    let m = mesh.metrics(BIX).await;
    assert!(
        m.contains("botmesh_platform_events_total{platform=\"matrix\",result=\"recorded\"}"),
        "{m}"
    );
    assert!(
        m.contains("result=\"bridge_copy\""),
        "Ada's answer came from the room and the mesh: {m}"
    );
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loses_nothing_and_repeats_nothing_even_after_more_than_one_sync_holds() {
    botmesh_tests::init_logs();
    let llm = llm().await;
    let r = Room::new(&["Ada"], false).await;
    let mut carol = Person::join(r.hs, &r.carol, &r.room).await;
    carol.say("@Ada echo said before the bot ever ran").await;
    let mut mesh = TestMesh::start(r.spec(&["Ada"], &r.tokens(), &llm)).await;
    syncing(&mesh, ADA).await;
    let ada = r.bots[0].user_id.clone();

    carol.say("@Ada echo one").await;
    assert_eq!(carol.messages(&ada, 1, WAIT).await.len(), 1);
    mesh.stop(ADA).await;
    // More than one sync returns (its timeline is limited to 50): the gap is read
    // with /messages.
    for n in 0..70 {
        carol.say(&format!("flood {n}")).await;
    }
    carol.say("@Ada echo two, said while it was down").await;
    mesh.restart(ADA).await;
    let got = carol.messages(&ada, 2, WAIT).await;
    let bodies: Vec<&str> = got
        .iter()
        .map(|m| m["content"]["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, vec!["one", "two, said while it was down"]);
    // Another restart with nothing new: nothing is answered again.
    mesh.stop(ADA).await;
    mesh.restart(ADA).await;
    syncing(&mesh, ADA).await;
    carol.say("@Ada echo three").await;
    let got = carol.messages(&ada, 3, WAIT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got_all = carol.messages(&ada, 3, Duration::ZERO).await;
    assert_eq!(got.len(), 3);
    let bodies: Vec<&str> = got_all
        .iter()
        .map(|m| m["content"]["body"].as_str().unwrap())
        .collect();
    assert_eq!(
        bodies,
        vec!["one", "two, said while it was down", "three"],
        "each answered once"
    );
    let t = transcript(&mesh, ADA, &r.room).await;
    each_once(&t);
    let texts: Vec<&str> = t.iter().map(|e| e.text.as_str()).collect();
    assert!(
        !texts.iter().any(|x| x.contains("before the bot")),
        "the history before its first start is skipped: {texts:?}"
    );
    assert_eq!(
        texts.iter().filter(|x| x.contains("echo two")).count(),
        1,
        "{texts:?}"
    );
    let flood: Vec<&str> = texts
        .iter()
        .copied()
        .filter(|x| x.starts_with("flood "))
        .collect();
    let expected: Vec<String> = (0..70).map(|n| format!("flood {n}")).collect();
    assert_eq!(
        flood, expected,
        "every message said while it was down, in order, once"
    );
    assert!(mesh
        .dir
        .path()
        .join("data/Ada")
        .join(botmesh::platform::matrix::SINCE_FILE)
        .exists());
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_long_answer_is_waited_out_and_posted_once_in_parts() {
    botmesh_tests::init_logs();
    let llm = llm().await;
    let r = Room::new(&["Ada"], false).await;
    let mut carol = Person::join(r.hs, &r.carol, &r.room).await;
    let mesh = TestMesh::start(r.spec(&["Ada"], &r.tokens(), &llm)).await;
    syncing(&mesh, ADA).await;
    // One event a second, no burst: the second part is refused with M_LIMIT_EXCEEDED.
    r.hs.limit_messages(&r.bots[0], 1, 1).await;
    carol.say("@Ada a long answer please").await;
    let ada = r.bots[0].user_id.clone();
    let parts = carol.messages(&ada, 3, WAIT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let parts_all = carol.messages(&ada, 3, Duration::ZERO).await;
    assert_eq!(parts.len(), 3, "{parts:#?}");
    assert_eq!(parts_all.len(), 3, "no part twice");
    let text: Vec<String> = parts
        .iter()
        .map(|m| m["content"]["body"].as_str().unwrap().to_string())
        .collect();
    assert!(text[0].starts_with("This paragraph"));
    assert!(
        parts[0]["content"]["m.relates_to"].is_object()
            && parts[1]["content"]["m.relates_to"].is_null(),
        "only the first part replies"
    );
    // Each refused send went again with the same transaction id (the same path) and
    // was then taken: a retry never posts twice.
    let log = r.hs.access_log();
    let sends: Vec<(&str, &str)> = log
        .lines()
        .filter(|l| l.contains(&r.room) && l.contains("/send/m.room.message/botmesh-"))
        .filter_map(|l| {
            let status = if l.contains(" 429 ") {
                "429"
            } else if l.contains(" 200 ") {
                "200"
            } else {
                "other"
            };
            let path = l.split('"').nth(1)?.split(' ').nth(1)?;
            Some((path, status))
        })
        .collect();
    let refused: Vec<&str> = sends
        .iter()
        .filter(|(_, s)| *s == "429")
        .map(|(p, _)| *p)
        .collect();
    assert!(
        !refused.is_empty(),
        "the homeserver refused a part at least once:\n{log}"
    );
    for p in &refused {
        assert!(
            sends.contains(&(p, "200")),
            "{p} was sent again with its transaction id and taken: {sends:#?}"
        );
    }
    let taken = sends.iter().filter(|(_, s)| *s == "200").count();
    assert_eq!(taken, 3, "three parts, each taken once: {sends:#?}");
    let t = transcript(&mesh, ADA, &r.room).await;
    let answer = t.iter().find(|e| e.author.name == "Ada").expect("recorded");
    assert_eq!(
        answer
            .platform_msg_id
            .as_deref()
            .map(|p| p.split(' ').count()),
        Some(3),
        "every part's event id"
    );
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_token_or_another_users_token_stops_matrix_with_the_reason_in_healthz() {
    botmesh_tests::init_logs();
    let llm = llm().await;
    let r = Room::new(&["Ada", "Bix"], false).await;
    // Ada's token is wrong; Bix holds Carol's.
    let wrong = format!("syt_wrong_{}", r.bots[0].token.len());
    let mesh = TestMesh::start(r.spec(&["Ada", "Bix"], &[&wrong, &r.carol.token], &llm)).await;
    let h = stopped(&mesh, ADA).await;
    let why = &h;
    assert!(
        why.contains("rejected the access token")
            && why.contains("M_UNKNOWN_TOKEN")
            && why.contains("matrix.access_token_env"),
        "{why}"
    );
    assert!(!why.contains(&wrong), "the token never shows: {why}");
    let h = stopped(&mesh, BIX).await;
    assert!(
        h.contains(&format!("belongs to {}", r.carol.user_id)),
        "{h}"
    );
    // No retry loop: a few seconds later Ada has asked whoami once and nothing since.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = r.hs.access_log();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Processed request") && l.contains(" 401 "))
        .collect();
    assert_eq!(
        refused
            .iter()
            .filter(|l| l.contains("/account/whoami"))
            .count(),
        1,
        "{refused:#?}"
    );
    assert!(
        !log.contains(&wrong),
        "the token never reaches a logged URL"
    );
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_room_is_refused_at_start_and_said_in_healthz() {
    botmesh_tests::init_logs();
    let llm = llm().await;
    let r = Room::new(&["Ada"], true).await;
    let mesh = TestMesh::start(r.spec(&["Ada"], &r.tokens(), &llm)).await;
    let h = stopped(&mesh, ADA).await;
    assert!(
        h.contains("end-to-end encrypted; botmesh supports unencrypted rooms only"),
        "{h}"
    );
    assert!(
        h.contains("\"syncing\":false"),
        "it reads nothing from the room: {h}"
    );
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matrix_bot_shows_typing_while_it_works_and_edits_are_not_judged_again() {
    botmesh_tests::init_logs();
    let llm = llm().await;
    let r = Room::new(&["Ada"], false).await;
    let mut carol = Person::join(r.hs, &r.carol, &r.room).await;
    let mesh = TestMesh::start(r.spec(&["Ada"], &r.tokens(), &llm)).await;
    syncing(&mesh, ADA).await;
    let ada = r.bots[0].user_id.clone();
    let asked = carol.say("@Ada answer slowly please").await;
    assert!(carol.saw_typing(&ada, WAIT).await, "Carol saw Ada typing");
    let got = carol.messages(&ada, 1, WAIT).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["content"]["body"], "answer from Ada");

    // A person's edit is not judged again: no second answer, no second entry.
    carol
        .send(json!({
            "msgtype": "m.text",
            "body": "* @Ada echo edited",
            "m.new_content": {"msgtype": "m.text", "body": "@Ada echo edited"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": asked},
        }))
        .await;
    // The bot's client edits its own message in place (a status message's form).
    let api = ClientApi::new(&r.hs.url(), &r.bots[0].token, RETRY).unwrap();
    let answer = got[0]["event_id"].as_str().unwrap();
    let new = json!({"msgtype": "m.text", "body": "done in 2s", "m.mentions": {}});
    api.edit(&r.room, "edit-1", answer, &new).await.unwrap();
    let seen = carol.messages(&ada, 2, WAIT).await;
    assert_eq!(seen.len(), 2, "{seen:#?}");
    let edit = &seen[1]["content"];
    assert_eq!(edit["body"], "* done in 2s");
    assert_eq!(edit["m.new_content"], new);
    assert_eq!(
        edit["m.relates_to"],
        json!({"rel_type": "m.replace", "event_id": answer})
    );
    let t = transcript(&mesh, ADA, &r.room).await;
    assert_eq!(
        show(&t).iter().map(|r| r.2.as_str()).collect::<Vec<_>>(),
        vec!["@Ada answer slowly please", "answer from Ada"],
        "the edits are not recorded"
    );
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_removed_from_its_room_or_a_room_encrypted_later_stops_matrix_with_the_reason() {
    botmesh_tests::init_logs();
    let llm = llm().await;
    let r = Room::new(&["Ada", "Bix"], false).await;
    let mesh = TestMesh::start(r.spec(&["Ada", "Bix"], &r.tokens(), &llm)).await;
    syncing(&mesh, ADA).await;
    syncing(&mesh, BIX).await;
    let room = r.room.as_str();
    r.hs.call(
        reqwest::Method::POST,
        &format!("/_matrix/client/v3/rooms/{room}/kick"),
        Some(&r.carol.token),
        Some(json!({"user_id": r.bots[1].user_id, "reason": "test"})),
    )
    .await;
    let h = stopped(&mesh, BIX).await;
    assert!(
        h.contains("no longer in matrix room") && h.contains("membership: leave"),
        "{h}"
    );
    r.hs.call(
        reqwest::Method::PUT,
        &format!("/_matrix/client/v3/rooms/{room}/state/m.room.encryption/"),
        Some(&r.carol.token),
        Some(json!({"algorithm": "m.megolm.v1.aes-sha2"})),
    )
    .await;
    let h = stopped(&mesh, ADA).await;
    assert!(h.contains("end-to-end encrypted"), "{h}");
    mesh.shutdown().await;
}
