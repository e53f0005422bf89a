//! The group-chat page (`GET /` of the local API) in a real headless Chromium, driven
//! over W3C WebDriver: a person posts from the page, the bot's answer shows up live on
//! both nodes' pages with why it spoke.
//!
//! A second test watches an agent's long turn on the page (issue #35): one status
//! message edited in place, the live progress line, how the turn ended surviving a
//! reload, and no depth badge on the question people must answer.
//!
//! Needs `apt-get install chromium chromium-driver`. Without them the test is skipped
//! with a loud message, except under CI (`CI` set), where it fails.

use std::time::{Duration, Instant};

use botmesh_tests::acp_standin;
use botmesh_tests::webdriver::{self, skip_or_fail, Browser, ENTER};
use botmesh_tests::{MeshSpec, TestMesh};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// Every chat message on the page, as the test sees it.
const MESSAGES_JS: &str = r#"
return Array.from(document.querySelectorAll('#messages .msg')).map(m => ({
  id: m.dataset.id, author: m.dataset.author, kind: m.dataset.kind,
  status: m.classList.contains('status'),
  depth: m.querySelector('.depth') ? m.querySelector('.depth').textContent : null,
  re: m.querySelector('.re') ? m.querySelector('.re').textContent : null,
  why: m.querySelector('.why') ? m.querySelector('.why').textContent : null,
  text: m.querySelector('.body') ? m.querySelector('.body').textContent : null,
  html_children: m.querySelector('.body') ? Array.from(m.querySelector('.body').children).map(c => c.tagName + '.' + c.className) : [],
  turns: Array.from(m.querySelectorAll('.turn')).map(t => t.textContent),
}));
"#;

/// Header state: whose node, whether the live stream is open, the roster.
const HEADER_JS: &str = r#"
return {
  node: document.getElementById('node').textContent,
  conn: document.getElementById('conn').textContent,
  roster: Array.from(document.querySelectorAll('#roster li')).map(li => li.textContent),
  error: document.getElementById('error').textContent,
  name: document.getElementById('name').value,
  text: document.getElementById('text').value,
};
"#;

/// Whether two different ideographs draw differently in the page's own font (false
/// when both fall back to the same missing-glyph box).
const CJK_GLYPHS_JS: &str = r#"
const font = getComputedStyle(document.body).font;
const draw = (ch) => {
  const c = document.createElement('canvas');
  c.width = 48; c.height = 48;
  const g = c.getContext('2d');
  g.font = font.replace(/\d+(\.\d+)?px/, '32px');
  g.fillStyle = '#000';
  g.fillText(ch, 4, 36);
  return Array.from(g.getImageData(0, 0, 48, 48).data).join(',');
};
return draw('小') !== draw('八');
"#;

const HUMAN_TEXT: &str = "@XiaoBa 你好，帮我看下代码";

fn msgs(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

fn human_msg(v: &Value) -> Option<&Value> {
    msgs(v).iter().find(|m| {
        m["kind"] == "human" && m["author"] == "Alice" && m["text"].as_str() == Some(HUMAN_TEXT)
    })
}

fn xiaoba_reply(v: &Value) -> Option<&Value> {
    msgs(v)
        .iter()
        .find(|m| m["author"] == "XiaoBa" && m["kind"] == "bot")
}

fn both_there(v: &Value) -> bool {
    human_msg(v).is_some() && xiaoba_reply(v).is_some()
}

async fn wait_live(b: &Browser, bot: &str) {
    let (h, ok) = b
        .poll(HEADER_JS, WAIT, |h| {
            h["conn"] == "live" && h["node"].as_str().is_some_and(|n| n.contains(bot))
        })
        .await
        .unwrap();
    assert!(ok, "{bot}'s page did not load and go live: {h:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_posts_as_a_human_and_shows_the_bot_reply_live_on_both_nodes() {
    if let Err(why) = webdriver::binaries() {
        if skip_or_fail(&why) {
            return;
        }
    }
    let started = Instant::now();
    let mesh = TestMesh::start(MeshSpec::new(&["XiaoBa", "ErGoz"]).bot(
        "XiaoBa",
        "aliases = [\"小八\"]\nrole = \"研发助手\"\nskills = [\"论文阅读\", \"代码编写\"]",
    ))
    .await;
    let b = Browser::start(1280, 900)
        .await
        .expect("start chromedriver + chromium");

    // Node 0 (XiaoBa) in the first tab, node 1 (ErGoz) in a second, both live before
    // anything is posted, so the messages reach them over the event stream.
    let page0 = b.window().await.unwrap();
    b.emulate_viewport(390, 844, true).await.unwrap(); // a phone
    b.goto(&format!("{}/", mesh.api(0))).await.unwrap();
    wait_live(&b, "XiaoBa").await;
    let h = b.execute(HEADER_JS, vec![]).await.unwrap();
    let roster = h["roster"].to_string();
    assert!(
        roster.contains("XiaoBa") && roster.contains("研发助手") && roster.contains("ErGoz"),
        "roster with roles in the header: {h:#}"
    );
    assert_eq!(h["name"], "human", "default name");
    let page1 = b.new_tab().await.unwrap();
    b.goto(&format!("{}/", mesh.api(1))).await.unwrap();
    wait_live(&b, "ErGoz").await;
    b.switch_to(&page0).await.unwrap();

    // A person types a name and a message and clicks send.
    b.clear("#name").await.unwrap();
    b.send_keys("#name", "Alice").await.unwrap();
    b.send_keys("#text", HUMAN_TEXT).await.unwrap();
    b.click("#send").await.unwrap();

    let (on0, ok) = b.poll(MESSAGES_JS, WAIT, both_there).await.unwrap();
    assert!(
        ok,
        "node 0's page shows the human message and XiaoBa's reply: {on0:#}"
    );
    let human = human_msg(&on0).unwrap().clone();
    let reply = xiaoba_reply(&on0).unwrap().clone();
    assert_eq!(human["why"], Value::Null, "no why on a human message");
    assert_eq!(reply["why"], "mentioned", "why XiaoBa spoke: {reply:#}");
    assert!(
        reply["text"].as_str().unwrap().starts_with("[offline]"),
        "offline provider answered: {reply:#}"
    );
    assert!(
        human["html_children"].to_string().contains("SPAN.mention"),
        "@XiaoBa highlighted: {human:#}"
    );
    let h = b.execute(HEADER_JS, vec![]).await.unwrap();
    assert_eq!(h["text"], "", "text box cleared after sending");
    assert_eq!(h["error"], "", "no error shown");
    let (on0, ok) = b
        .poll(MESSAGES_JS, WAIT, |v| {
            human_msg(v).is_some_and(|m| m["turns"].to_string().contains("XiaoBa"))
        })
        .await
        .unwrap();
    assert!(ok, "XiaoBa's decision shown under the trigger: {on0:#}");
    b.screenshot("/tmp/botmesh-page.png").await.unwrap();
    // The page's CJK is legible: with no CJK font every ideograph is drawn as the same
    // empty box (scripts/test.sh installs fonts-noto-cjk for that reason).
    let glyphs = b.execute(CJK_GLYPHS_JS, vec![]).await.unwrap();
    assert_eq!(
        glyphs,
        Value::Bool(true),
        "小 and 八 render as different glyphs in the page's font"
    );

    // The same two messages reached ErGoz's page over the bridge and its event stream.
    b.switch_to(&page1).await.unwrap();
    let same = |v: &Value| {
        let ids: Vec<&Value> = msgs(v).iter().map(|m| &m["id"]).collect();
        ids.contains(&&human["id"]) && ids.contains(&&reply["id"])
    };
    let (on1, ok) = b.poll(MESSAGES_JS, WAIT, same).await.unwrap();
    assert!(ok, "ErGoz's page shows both messages live: {on1:#}");
    let r1 = msgs(&on1).iter().find(|m| m["id"] == reply["id"]).unwrap();
    assert_eq!(
        (&r1["author"], &r1["kind"], &r1["why"]),
        (&reply["author"], &reply["kind"], &reply["why"])
    );
    b.emulate_viewport(390, 844, true).await.unwrap();
    b.screenshot("/tmp/botmesh-page-ergoz.png").await.unwrap();
    // Reloaded, the page rebuilds from the transcript and shows each message once.
    b.refresh().await.unwrap();
    wait_live(&b, "ErGoz").await;
    let (on1, ok) = b.poll(MESSAGES_JS, WAIT, same).await.unwrap();
    assert!(ok, "ErGoz's page after reload: {on1:#}");
    let mut ids: Vec<String> = msgs(&on1)
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "no duplicate messages: {on1:#}");

    // Untrusted text is shown as text, never parsed as HTML.
    b.switch_to(&page0).await.unwrap();
    let evil = "<img src=x onerror=\"window.__pwned=1\"><b>bold?</b> & @nobody";
    let evil_id = mesh.post_human(0, "mallory", evil).await;
    let (on0, ok) = b
        .poll(MESSAGES_JS, WAIT, |v| {
            msgs(v).iter().any(|m| m["id"].as_str() == Some(&evil_id))
        })
        .await
        .unwrap();
    assert!(ok, "API-posted message shown: {on0:#}");
    let m = msgs(&on0)
        .iter()
        .find(|m| m["id"].as_str() == Some(&evil_id))
        .unwrap();
    assert_eq!(m["text"], evil, "shown verbatim");
    assert!(
        !m["html_children"].to_string().contains("IMG")
            && !m["html_children"].to_string().contains("\"B."),
        "no markup from message text: {m:#}"
    );
    let pwned = b
        .execute("return window.__pwned === undefined;", vec![])
        .await
        .unwrap();
    assert_eq!(pwned, true, "no script ran");

    // Posting as another bot is refused and the API's error is shown; Enter sends.
    b.clear("#name").await.unwrap();
    b.send_keys("#name", "ErGoz").await.unwrap();
    b.send_keys("#text", &format!("pretending{ENTER}"))
        .await
        .unwrap();
    let (h, ok) = b
        .poll(HEADER_JS, WAIT, |h| {
            h["error"]
                .as_str()
                .is_some_and(|e| e.contains("may only post as itself or a human"))
        })
        .await
        .unwrap();
    assert!(ok, "error from the API shown: {h:#}");
    assert_eq!(h["text"], "pretending", "text kept after a failed send");

    // The name is remembered across reloads.
    b.refresh().await.unwrap();
    wait_live(&b, "XiaoBa").await;
    let h = b.execute(HEADER_JS, vec![]).await.unwrap();
    assert_eq!(h["name"], "ErGoz", "name remembered in localStorage");

    // A desktop-sized look as well.
    b.clear_emulation().await.unwrap();
    b.screenshot("/tmp/botmesh-page-desktop.png").await.unwrap();

    b.quit().await.unwrap();
    mesh.shutdown().await;
    eprintln!(
        "browser test took {:.1}s (screenshots: /tmp/botmesh-page.png, /tmp/botmesh-page-desktop.png)",
        started.elapsed().as_secs_f64()
    );
}

/// Coder's status messages on the page.
fn coder_statuses(v: &Value) -> Vec<&Value> {
    msgs(v)
        .iter()
        .filter(|m| m["author"] == "Coder" && m["status"] == true)
        .collect()
}

/// Coder's messages on the page, in the page's order: (is it a status, its text).
fn coder_said(v: &Value) -> Vec<(bool, String)> {
    msgs(v)
        .iter()
        .filter(|m| m["author"] == "Coder")
        .map(|m| {
            (
                m["status"] == true,
                m["text"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The message `id` on the page.
fn msg_by_id<'a>(v: &'a Value, id: &str) -> Option<&'a Value> {
    msgs(v).iter().find(|m| m["id"].as_str() == Some(id))
}

/// The agent's progress lines under the message `trigger` (its decision lines left
/// out): the page keeps one, replaced as the agent goes on.
fn progress_lines(v: &Value, trigger: &str) -> Vec<String> {
    let Some(m) = msg_by_id(v, trigger) else {
        return Vec::new();
    };
    msgs(&m["turns"])
        .iter()
        .filter_map(Value::as_str)
        .filter(|t| {
            [
                "Coder working:",
                "Coder done:",
                "Coder failed:",
                "Coder writing…",
            ]
            .iter()
            .any(|p| t.starts_with(p))
        })
        .map(str::to_string)
        .collect()
}

/// Coder's one status, once it reads `want` and the progress line under `trigger`
/// is `line`: (its id, its text).
async fn status_reading(
    b: &Browser,
    trigger: &str,
    line: &str,
    want: impl Fn(&str) -> bool,
) -> (String, String) {
    let (v, ok) = b
        .poll(MESSAGES_JS, WAIT, |v| {
            let s = coder_statuses(v);
            s.len() == 1
                && s[0]["text"].as_str().is_some_and(&want)
                && progress_lines(v, trigger) == [line]
        })
        .await
        .unwrap();
    assert!(
        ok,
        "one status and the progress line {line:?}: statuses {:#?}, progress {:?}",
        coder_statuses(&v),
        progress_lines(&v, trigger)
    );
    let s = coder_statuses(&v)[0];
    (
        s["id"].as_str().unwrap().to_string(),
        s["text"].as_str().unwrap().to_string(),
    )
}

/// The page's messages once Coder's message reading `text` is among them, and that
/// message.
async fn coder_message(b: &Browser, text: &str) -> (Value, Value) {
    let (v, ok) = b
        .poll(MESSAGES_JS, WAIT, |v| {
            coder_said(v).iter().any(|(_, t)| t == text)
        })
        .await
        .unwrap();
    assert!(
        ok,
        "Coder saying {text:?} on the page: {:#?}",
        coder_said(&v)
    );
    let m = msgs(&v).iter().find(|m| m["text"] == text).unwrap().clone();
    (v, m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_one_status_edited_in_place_and_how_the_turn_ended_after_a_reload() {
    if let Err(why) = webdriver::binaries() {
        if skip_or_fail(&why) {
            return;
        }
    }
    botmesh_tests::init_logs();
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    // A status after 1 s, edited at most every second; execute calls asked in the chat.
    let coder = format!(
        "participation = \"mentions\"\nstatus_after_secs = 1\nstatus_every_secs = 1\n{}",
        acp_standin::agent_table(&dir, ", ask = [\"execute\"], ask_timeout_secs = 20")
    );
    let mesh = TestMesh::start(MeshSpec::new(&["Coder"]).bot("Coder", &coder)).await;
    let b = Browser::start(1280, 900)
        .await
        .expect("start chromedriver + chromium");
    b.goto(&format!("{}/", mesh.api(0))).await.unwrap();
    wait_live(&b, "Coder").await;

    // A slow turn: three tool calls ("step 1", …), each ending on the test's word.
    let asked = mesh.post_human(0, "carol", "@Coder STEPS 3").await;
    acp_standin::logged(&dir, "step 1 ").await;
    let (id, first) = status_reading(&b, &asked, "Coder working: step 1", |t| {
        t.starts_with("Coder is working (") && t.contains("step 1")
    })
    .await;
    acp_standin::next_step(&dir, 1).await;
    let second = status_reading(&b, &asked, "Coder working: step 2", |t| {
        t.starts_with("Coder is working (") && t.contains("step 2")
    })
    .await;
    acp_standin::next_step(&dir, 2).await;
    let third = status_reading(&b, &asked, "Coder working: step 3", |t| {
        t.starts_with("Coder is working (") && t.contains("step 3")
    })
    .await;
    assert_eq!(
        (&second.0, &third.0),
        (&id, &id),
        "one status, edited in place"
    );
    let mut seen = vec![first, second.1, third.1];
    seen.dedup();
    assert_eq!(
        seen.len(),
        3,
        "its text changed as the agent went on: {seen:?}"
    );

    // The turn ends: the status says so, then the answer comes as a new message.
    acp_standin::end_step(&dir, 3);
    let ended = |v: &Value| {
        let said = coder_said(v);
        said.len() == 2
            && said[0].0
            && said[0].1.starts_with("Coder: done in ")
            && said[1] == (false, "all 3 steps done".to_string())
    };
    let (v, ok) = b.poll(MESSAGES_JS, WAIT, ended).await.unwrap();
    assert!(
        ok,
        "one status reading \"done in\", then the answer: {:#?}",
        coder_said(&v)
    );
    let done = coder_said(&v)[0].1.clone();
    assert_eq!(coder_statuses(&v)[0]["id"], id.as_str(), "the same status");
    let line = progress_lines(&v, &asked);
    assert_eq!(line.len(), 1, "one progress line: {line:?}");
    b.screenshot("/tmp/botmesh-page-status.png").await.unwrap();

    // Reloaded, the page shows the same: the status as it ended (not its first
    // "working…" text), once, and the agent's last progress line.
    b.refresh().await.unwrap();
    wait_live(&b, "Coder").await;
    let (v, ok) = b
        .poll(MESSAGES_JS, WAIT, |v| {
            coder_said(v).len() >= 2 && !progress_lines(v, &asked).is_empty()
        })
        .await
        .unwrap();
    assert!(
        ok,
        "the reloaded page shows Coder's messages and the progress line: {v:#}"
    );
    assert_eq!(
        coder_said(&v),
        [(true, done), (false, "all 3 steps done".to_string())],
        "after the reload: one status reading how the turn ended, then the answer"
    );
    assert_eq!(
        progress_lines(&v, &asked),
        line,
        "progress kept over a reload"
    );

    // A question people must answer carries no depth badge; the answer after it does.
    let request = mesh.post_human(0, "carol", "@Coder TOOL execute").await;
    let question = "Coder wants to run `cargo test` — /allow or /deny";
    let (v, q) = coder_message(&b, question).await;
    assert_eq!(
        q["depth"],
        Value::Null,
        "no depth badge on a question: {q:#}"
    );
    assert!(
        q["re"].as_str().is_some_and(|r| r.contains("TOOL execute")),
        "the question replies to its request: {q:#}"
    );
    assert_eq!(
        msg_by_id(&v, &request).unwrap()["depth"],
        "depth 0",
        "a person's message shows its depth"
    );
    mesh.post_human(0, "carol", "/allow").await;
    let allowed = "permission: proceed-once";
    let (_, a) = coder_message(&b, allowed).await;
    assert!(
        a["depth"].as_str().is_some_and(|d| d.starts_with("depth ")),
        "a turn's answer shows its depth: {a:#}"
    );

    // A text-only turn: its progress line says the agent is writing, once.
    let hello = mesh.post_human(0, "carol", "@Coder hello there").await;
    let (v, ok) = b
        .poll(MESSAGES_JS, WAIT, |v| {
            coder_said(v)
                .iter()
                .any(|(s, t)| !s && t.starts_with("echo: ") && t.ends_with("@Coder hello there"))
                && !progress_lines(v, &hello).is_empty()
        })
        .await
        .unwrap();
    assert!(ok, "the echo and its progress line: {v:#}");
    assert_eq!(progress_lines(&v, &hello), ["Coder writing…"]);

    b.quit().await.unwrap();
    mesh.shutdown().await;
    eprintln!(
        "status browser test took {:.1}s (screenshot: /tmp/botmesh-page-status.png)",
        started.elapsed().as_secs_f64()
    );
}
