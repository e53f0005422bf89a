//! A bot's text as Matrix message content.
//!
//! - `body` is the text as written (a person's `<at user_id="@carol:hs">Carol</at>`
//!   tag shown as `Carol`); `formatted_body` (`org.matrix.custom.html`) is the same
//!   text HTML-escaped — `&`, `<`, `>`, `"` and `'` — so that `<b>`, `&` and
//!   `<script>` in an answer show literally, with line breaks as `<br>`.
//! - `@Colleague` (a mesh bot with a `[bots.matrix] user_id`) and a person's tag
//!   become pills (`<a href="https://matrix.to/#/@u:hs">Name</a>`) and their user ids
//!   go into `m.mentions.user_ids`, so that their clients notify them; this bot never
//!   mentions itself. `m.mentions` is always sent (empty when nobody is mentioned), as
//!   the spec recommends.
//! - The answer is an `m.text` (botmesh bots answer each other, and `m.notice` must
//!   never be answered); the first part answers the trigger with `m.in_reply_to`,
//!   without a reply fallback (none since v1.13).
//! - Text over [`MAX_PART_CHARS`] goes in parts (the kit's split): an event may hold
//!   at most 65,536 bytes, escaped HTML included.

use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::turn::mention::MentionMatcher;

/// The longest part posted, in characters: its body and escaped HTML (up to six
/// bytes a character) stay well under the 65,536-byte event limit.
pub const MAX_PART_CHARS: usize = 4_000;

/// Private-use characters that hold a person's tag through the escaping.
const HOLD_OPEN: char = '\u{E000}';
/// See [`HOLD_OPEN`].
const HOLD_CLOSE: char = '\u{E001}';

/// `s` escaped for HTML text and attribute values.
pub fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// A pill: the link clients show as a mention of `user_id`, reading `shown`.
pub fn pill(user_id: &str, shown: &str) -> String {
    format!(
        "<a href=\"https://matrix.to/#/{}\">{}</a>",
        escape_html(user_id),
        escape_html(shown)
    )
}

/// The `m.room.message` content for one part of a bot's text (module docs):
/// `user_id_of` gives a roster member's Matrix user id (none for this bot itself or a
/// member without one), `reply_to` the event the part answers.
pub(crate) fn content(
    text: &str,
    matcher: &MentionMatcher,
    user_id_of: &dyn Fn(&str) -> Option<String>,
    reply_to: Option<&str>,
) -> Value {
    static AT: OnceLock<regex::Regex> = OnceLock::new();
    let at = AT.get_or_init(|| {
        regex::Regex::new(r#"<at user_id="(@[^"<>\s]{1,255})">([^<]*)</at>"#).expect("valid")
    });
    let text: String = text
        .chars()
        .filter(|c| *c != HOLD_OPEN && *c != HOLD_CLOSE)
        .collect();
    let mut people: Vec<(String, String)> = Vec::new();
    let body = at.replace_all(&text, "$2").into_owned();
    let held = at.replace_all(&text, |c: &regex::Captures<'_>| {
        people.push((c[1].to_string(), c[2].to_string()));
        format!("{HOLD_OPEN}{}{HOLD_CLOSE}", people.len() - 1)
    });
    let mentioned = std::cell::RefCell::new(Vec::<String>::new());
    let note = |id: &str| {
        let mut m = mentioned.borrow_mut();
        if !m.iter().any(|x| x == id) {
            m.push(id.to_string());
        }
    };
    let escaped = escape_html(&held);
    let html = matcher.rewrite(&escaped, |member| {
        let id = user_id_of(member)?;
        note(&id);
        Some(pill(&id, member))
    });
    let mut out = String::with_capacity(html.len());
    let mut rest = html.as_str();
    while let Some(i) = rest.find(HOLD_OPEN) {
        out.push_str(&rest[..i]);
        let after = &rest[i + HOLD_OPEN.len_utf8()..];
        let Some(j) = after.find(HOLD_CLOSE) else {
            break;
        };
        if let Some((id, name)) = after[..j].parse::<usize>().ok().and_then(|n| people.get(n)) {
            note(id);
            out.push_str(&pill(id, name));
        }
        rest = &after[j + HOLD_CLOSE.len_utf8()..];
    }
    out.push_str(rest);
    let html = out.replace('\n', "<br>");
    let mut c = json!({
        "msgtype": "m.text",
        "body": body,
        "format": "org.matrix.custom.html",
        "formatted_body": html,
        "m.mentions": {"user_ids": mentioned.into_inner()},
    });
    if let Some(event_id) = reply_to {
        c["m.relates_to"] = json!({"m.in_reply_to": {"event_id": event_id}});
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::mention::Member;

    fn matcher() -> MentionMatcher {
        let m = |name: &str, aliases: &[&str]| Member {
            name: name.into(),
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
            open_ids: vec![],
        };
        MentionMatcher::new(&[m("Ada", &[]), m("Bix", &["bixie"]), m("Loc", &[])])
    }

    fn ids(name: &str) -> Option<String> {
        match name {
            "Bix" => Some("@bix:hs".into()),
            _ => None, // Ada is this bot; Loc has no Matrix account
        }
    }

    #[test]
    fn colleagues_and_people_become_pills_and_html_shows_literally() {
        let c = content(
            "@bixie look: <b>x</b> & <script>alert(1)</script>\n@Ada is me, @Loc has none, `@Bix` in code, thanks <at user_id=\"@carol:hs\">Carol</at>",
            &matcher(),
            &ids,
            Some("$trigger"),
        );
        assert_eq!(c["msgtype"], "m.text");
        assert_eq!(
            c["body"],
            "@bixie look: <b>x</b> & <script>alert(1)</script>\n@Ada is me, @Loc has none, `@Bix` in code, thanks Carol"
        );
        assert_eq!(
            c["formatted_body"],
            "<a href=\"https://matrix.to/#/@bix:hs\">Bix</a> look: &lt;b&gt;x&lt;/b&gt; &amp; &lt;script&gt;alert(1)&lt;/script&gt;<br>@Ada is me, @Loc has none, `@Bix` in code, thanks <a href=\"https://matrix.to/#/@carol:hs\">Carol</a>"
        );
        assert_eq!(c["m.mentions"]["user_ids"], json!(["@bix:hs", "@carol:hs"]));
        assert_eq!(c["m.relates_to"]["m.in_reply_to"]["event_id"], "$trigger");
        let plain = content("nobody here", &matcher(), &ids, None);
        assert_eq!(plain["m.mentions"], json!({"user_ids": []}), "always sent");
        assert!(plain.get("m.relates_to").is_none());
    }
}
