//! Room events → readable text (the Matrix part of the inbound path; the kit's
//! [`crate::platform::kit::inbound`] records what this makes).
//!
//! - A message's text is its `formatted_body` (HTML, `format:
//!   org.matrix.custom.html`) made plain when it has one — pills become `@Name` for a
//!   mesh bot and `<at user_id="@carol:hs">Carol</at>` for anyone else (a tag that
//!   names no bot, which the outbound side turns back into a pill), code stays code,
//!   links show their address, entities are unescaped — else its `body`. A reply's
//!   fallback (a leading `<mx-reply>` element, leading `> ` lines of `body`) is
//!   dropped, or the quoted message would land in the transcript and the mention
//!   matcher.
//! - `m.mentions.user_ids` naming a mesh bot mentions it even when the text holds no
//!   pill for it (the adapter adds `@Name`); `room: true` is `@everyone`.
//! - `m.image`, `m.file`, `m.audio`, `m.video` and `m.location` become placeholders
//!   (`[image]`, …); `m.emote` reads as `* text`.

use std::sync::OnceLock;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use super::held::Held;

/// A room event as sync's timeline and state carry it (the fields the adapter reads).
#[derive(Debug, Clone, Deserialize)]
pub struct RoomEvent {
    /// `m.room.message`, `m.room.member`, `m.room.encryption`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The event's id (`$…`), unique on the homeserver.
    #[serde(default)]
    pub event_id: String,
    /// Who sent it.
    #[serde(default)]
    pub sender: String,
    /// When, by the sender's homeserver (ms since the epoch).
    #[serde(default)]
    pub origin_server_ts: u64,
    /// The event's content.
    #[serde(default)]
    pub content: Value,
    /// Set for state events (`m.room.member`'s is the member's user id).
    #[serde(default)]
    pub state_key: Option<String>,
}

impl RoomEvent {
    /// The `msgtype` of a message.
    pub fn msgtype(&self) -> &str {
        self.content["msgtype"].as_str().unwrap_or_default()
    }

    /// Whether this message replaces another (an edit, `m.replace`).
    pub fn is_edit(&self) -> bool {
        self.content["m.relates_to"]["rel_type"].as_str() == Some("m.replace")
    }

    /// The user ids `m.mentions` names, and whether it mentions the room.
    pub fn intentional_mentions(&self) -> (Vec<String>, bool) {
        let m = &self.content["m.mentions"];
        let users = m["user_ids"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|u| u.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        (users, m["room"].as_bool() == Some(true))
    }
}

/// The user id a pill's `href` links to: `https://matrix.to/#/@u:hs` (maybe
/// percent-encoded, maybe with `?via=`) or the Matrix URI `matrix:u/u:hs`.
pub fn pill_target(href: &str) -> Option<String> {
    let raw = if let Some(rest) = href.strip_prefix("https://matrix.to/#/") {
        rest.to_string()
    } else if let Some(rest) = href.strip_prefix("matrix:u/") {
        format!("@{rest}")
    } else {
        return None;
    };
    let raw = raw.split('?').next().unwrap_or_default();
    let decoded: String =
        form_urlencoded::parse(format!("u={}", raw.replace('+', "%2B")).as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
    super::settings::is_user_id(&decoded).then_some(decoded)
}

/// `body` without a reply fallback: its leading `> ` lines and the blank line after.
pub fn strip_reply_fallback(body: &str) -> &str {
    if !body.starts_with("> ") {
        return body;
    }
    let mut rest = body;
    while rest.starts_with("> ") || rest.starts_with(">\n") {
        rest = rest.split_once('\n').map_or("", |(_, r)| r);
    }
    rest.strip_prefix('\n').unwrap_or(rest)
}

/// Unescapes the HTML entities a formatted body uses (and
/// [`super::outbound::escape_html`] writes).
pub(crate) fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&")
}

/// `html` (a `formatted_body`) as plain text: the reply fallback dropped, each pill
/// replaced by `pill(user_id, shown)` (kept as written), line breaks and code kept,
/// other links as `label (url)`, every other tag dropped, entities unescaped.
pub fn html_to_text(html: &str, pill: &dyn Fn(&str, &str) -> String) -> String {
    static RE: OnceLock<[Regex; 6]> = OnceLock::new();
    let [reply, anchor, pre_open, pre_close, breaks, tags] = RE.get_or_init(|| {
        [
            Regex::new(r"(?s)^\s*<mx-reply>.*?</mx-reply>").expect("valid"),
            Regex::new(r#"(?s)<a\s[^>]*?href="([^"]*)"[^>]*>(.*?)</a>"#).expect("valid"),
            Regex::new(r#"<pre>\s*<code(?:\s+class="language-([A-Za-z0-9+#_-]{1,20})")?[^>]*>"#)
                .expect("valid"),
            Regex::new(r"</code>\s*</pre>").expect("valid"),
            Regex::new(r"(?i)<br\s*/?>|</p>|</li>|</h[1-6]>|</blockquote>").expect("valid"),
            Regex::new(r"<[^>]*>").expect("valid"),
        ]
    });
    let html = Held::clean(html);
    let html = reply.replace(&html, "");
    let mut held = Held::default();
    let html = anchor.replace_all(&html, |c: &regex::Captures<'_>| {
        let href = unescape(&c[1]);
        let shown = unescape(&tags.replace_all(&c[2], ""));
        let out = match pill_target(&href) {
            Some(user) => pill(&user, shown.trim()),
            None if shown.trim() == href || shown.trim().is_empty() => href,
            None => format!("{} ({href})", shown.trim()),
        };
        held.hold(out)
    });
    let html = pre_open.replace_all(&html, |c: &regex::Captures<'_>| {
        format!("```{}\n", c.get(1).map_or("", |m| m.as_str()))
    });
    let html = pre_close.replace_all(&html, "\n```");
    let html = html.replace("<code>", "`").replace("</code>", "`");
    let html = breaks.replace_all(&html, "\n");
    let html = html.replace("<li>", "- ");
    let text = unescape(&tags.replace_all(&html, ""));
    held.restore(&text).trim().to_string()
}

/// The readable text of a message's content (module docs), pills made by `pill`.
pub fn message_text(content: &Value, pill: &dyn Fn(&str, &str) -> String) -> String {
    let msgtype = content["msgtype"].as_str().unwrap_or_default();
    let placeholder = match msgtype {
        "m.image" => Some("[image]"),
        "m.file" => Some("[file]"),
        "m.audio" => Some("[audio]"),
        "m.video" => Some("[video]"),
        "m.location" => Some("[location]"),
        _ => None,
    };
    if let Some(p) = placeholder {
        return p.to_string();
    }
    let html = (content["format"].as_str() == Some("org.matrix.custom.html"))
        .then(|| content["formatted_body"].as_str())
        .flatten();
    let text = match html {
        Some(h) => html_to_text(h, pill),
        None => strip_reply_fallback(content["body"].as_str().unwrap_or_default())
            .trim()
            .to_string(),
    };
    if msgtype == "m.emote" && !text.is_empty() {
        format!("* {text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pill(user: &str, shown: &str) -> String {
        if user == "@ada:hs" {
            "@Ada".into()
        } else {
            format!("<at user_id=\"{user}\">{shown}</at>")
        }
    }

    #[test]
    fn pills_and_html_become_readable_text() {
        let html = "<mx-reply><blockquote>In reply to <a href=\"https://matrix.to/#/@bix:hs\">Bix</a> old</blockquote></mx-reply>\
                    <a href=\"https://matrix.to/#/%40ada%3Ahs\">Ada</a>: see <code>&lt;b&gt;</code> &amp; <a href=\"https://ex.org/a?b=1&amp;c=2\">docs</a><br>\
                    <pre><code class=\"language-rust\">let a = 1 &lt; 2;\n</code></pre>thanks <a href=\"matrix:u/carol:hs\">Carol &lt;3</a>";
        assert_eq!(
            html_to_text(html, &pill),
            "@Ada: see `<b>` & docs (https://ex.org/a?b=1&c=2)\n```rust\nlet a = 1 < 2;\n\n```thanks <at user_id=\"@carol:hs\">Carol <3</at>"
        );
        // A pill's shown name cannot smuggle holding characters.
        assert_eq!(html_to_text("a\u{E000}0\u{E001}b", &pill), "a0b");
    }

    #[test]
    fn reply_fallbacks_and_kinds() {
        assert_eq!(
            strip_reply_fallback("> <@bix:hs> old\n> more\n\nnew text"),
            "new text"
        );
        assert_eq!(strip_reply_fallback("no > quote"), "no > quote");
        let c = serde_json::json!({"msgtype": "m.text", "body": "> <@bix:hs> q\n\n@Ada hi"});
        assert_eq!(message_text(&c, &pill), "@Ada hi");
        let c = serde_json::json!({"msgtype": "m.image", "body": "cat.png"});
        assert_eq!(message_text(&c, &pill), "[image]");
        let c = serde_json::json!({"msgtype": "m.emote", "body": "waves"});
        assert_eq!(message_text(&c, &pill), "* waves");
        let c = serde_json::json!({"msgtype": "m.text", "body": "<b>x</b>", "format": "org.matrix.custom.html", "formatted_body": "&lt;b&gt;x&lt;/b&gt;"});
        assert_eq!(message_text(&c, &pill), "<b>x</b>", "escaped HTML is text");
    }

    #[test]
    fn pill_targets() {
        assert_eq!(
            pill_target("https://matrix.to/#/@ada:hs").as_deref(),
            Some("@ada:hs")
        );
        assert_eq!(
            pill_target("https://matrix.to/#/%40ada%3Ahs?via=hs").as_deref(),
            Some("@ada:hs")
        );
        assert_eq!(pill_target("matrix:u/ada:hs").as_deref(), Some("@ada:hs"));
        assert_eq!(pill_target("https://matrix.to/#/!room:hs"), None);
        assert_eq!(pill_target("https://example.org"), None);
    }

    #[test]
    fn intentional_mentions_are_read() {
        let e: RoomEvent = serde_json::from_value(serde_json::json!({
            "type": "m.room.message", "event_id": "$1", "sender": "@c:hs", "origin_server_ts": 5,
            "content": {"msgtype": "m.text", "body": "hi", "m.mentions": {"user_ids": ["@ada:hs"], "room": true}}
        }))
        .unwrap();
        assert_eq!(
            e.intentional_mentions(),
            (vec!["@ada:hs".to_string()], true)
        );
        assert!(!e.is_edit());
    }
}
