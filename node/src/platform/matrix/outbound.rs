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

use super::held::Held;
use crate::turn::mention::MentionMatcher;

/// The longest part posted, in characters: its body and escaped HTML (up to six
/// bytes a character) stay well under the 65,536-byte event limit.
pub const MAX_PART_CHARS: usize = 4_000;

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
    static PILL: OnceLock<regex::Regex> = OnceLock::new();
    let at = AT.get_or_init(|| {
        regex::Regex::new(r#"<at user_id="(@[^"<>\s]{1,255})">([^<]*)</at>"#).expect("valid")
    });
    let text = Held::clean(text);
    let body = at.replace_all(&text, "$2").into_owned();
    let mut held = Held::default();
    let kept = at.replace_all(&text, |c: &regex::Captures<'_>| {
        held.hold(pill(&c[1], &c[2]))
    });
    let escaped = escape_html(&kept);
    let html = held.restore(&matcher.rewrite(&escaped, |member| {
        user_id_of(member).map(|id| pill(&id, member))
    }));
    // Whom the pills name, in order, each once: every `<a` here is a pill (the text
    // itself is escaped).
    let mut mentioned: Vec<String> = Vec::new();
    for c in PILL
        .get_or_init(|| {
            regex::Regex::new(r#"<a href="https://matrix\.to/#/([^"]+)">"#).expect("valid")
        })
        .captures_iter(&html)
    {
        let id = super::inbound::unescape(&c[1]);
        if !mentioned.contains(&id) {
            mentioned.push(id);
        }
    }
    let html = html.replace('\n', "<br>");
    let mut c = json!({
        "msgtype": "m.text",
        "body": body,
        "format": "org.matrix.custom.html",
        "formatted_body": html,
        "m.mentions": {"user_ids": mentioned},
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
