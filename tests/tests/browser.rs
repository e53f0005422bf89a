//! The group-chat page (`GET /` of the local API) in a real headless Chromium, driven
//! over W3C WebDriver: a person posts from the page, the bot's answer shows up live on
//! both nodes' pages with why it spoke.
//!
//! Needs `apt-get install chromium chromium-driver`. Without them the test is skipped
//! with a loud message, except under CI (`CI` set), where it fails.

use std::time::{Duration, Instant};

use botmesh_tests::webdriver::{self, skip_or_fail, Browser, ENTER};
use botmesh_tests::{MeshSpec, TestMesh};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

/// Every chat message on the page, as the test sees it.
const MESSAGES_JS: &str = r#"
return Array.from(document.querySelectorAll('#messages .msg')).map(m => ({
  id: m.dataset.id, author: m.dataset.author, kind: m.dataset.kind,
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
