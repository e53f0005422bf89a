//! Feishu message content as text the mesh records: nothing silently dropped.
//!
//! - `text`: its text.
//! - `post` (rich text): the title, then each paragraph on its own line; `at`
//!   elements become mentions (through the message's `mentions[]`), links stay
//!   readable as `[text](href)`, code blocks stay code (a fence the mention matcher
//!   skips, so nothing inside one is a mention), images, videos and emoji become
//!   short placeholders.
//! - `image`, `file`, `audio`, `media`, `sticker`, `share_chat`, `share_user`,
//!   `interactive` and any other type: a short placeholder such as `[image]` or
//!   `[file report.pdf]`, so the conversation shows that something was sent.

use serde_json::Value;

/// How the caller resolves what the content refers to.
pub(crate) struct Resolve<'a> {
    /// Plain text, with `@_user_N` placeholders still in it, as the mesh shows it.
    pub(crate) text: &'a dyn Fn(&str) -> String,
    /// An `at` element: its `user_id` (a placeholder like `@_user_1`, an open_id, or
    /// `all`) and `user_name`.
    pub(crate) at: &'a dyn Fn(&str, &str) -> String,
}

/// The message as text (empty only when a text or post message is empty).
pub(crate) fn flatten(message_type: &str, content: &str, r: &Resolve<'_>) -> String {
    let v: Value = serde_json::from_str(content).unwrap_or(Value::Null);
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().trim();
    let named = |kind: &str, name: &str| {
        if name.is_empty() {
            format!("[{kind}]")
        } else {
            format!("[{kind} {}]", clean(name))
        }
    };
    match message_type {
        "text" => (r.text)(v.get("text").and_then(Value::as_str).unwrap_or_default()),
        "post" => post(&v, r),
        "image" => "[image]".into(),
        "file" => named("file", s("file_name")),
        "audio" => match v.get("duration").and_then(Value::as_u64) {
            Some(ms) if ms > 0 => format!("[audio {}s]", ms.div_ceil(1000)),
            _ => "[audio]".into(),
        },
        "media" => named("video", s("file_name")),
        "sticker" => "[sticker]".into(),
        "share_chat" => named("shared chat", s("chat_id")),
        "share_user" => named("shared contact", s("user_id")),
        "interactive" => named("card", card_title(&v).as_str()),
        "" => "[message]".into(),
        other => format!("[{}]", clean(other)),
    }
}

/// Keeps a placeholder's name on one line and free of brackets.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '[' | ']' | '\n' | '\r' => ' ',
            c => c,
        })
        .collect::<String>()
        .trim()
        .to_string()
}

fn card_title(v: &Value) -> String {
    let direct = v.get("title").and_then(Value::as_str);
    let header = v.pointer("/header/title/content").and_then(Value::as_str);
    direct.or(header).unwrap_or_default().trim().to_string()
}

/// The body of a post: `{title, content}` itself, or under a locale key.
fn post_body(v: &Value) -> Option<&Value> {
    if v.get("content").is_some() {
        return Some(v);
    }
    let obj = v.as_object()?;
    ["zh_cn", "en_us", "ja_jp"]
        .iter()
        .find_map(|k| obj.get(*k))
        .or_else(|| obj.values().find(|b| b.get("content").is_some()))
}

fn post(v: &Value, r: &Resolve<'_>) -> String {
    let Some(body) = post_body(v) else {
        return "[post]".into();
    };
    let mut lines: Vec<String> = Vec::new();
    let title = body
        .get("title")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .trim();
    if !title.is_empty() {
        lines.push((r.text)(title));
    }
    for paragraph in body
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut line = String::new();
        for el in paragraph.as_array().into_iter().flatten() {
            element(el, r, &mut line);
        }
        lines.push(line);
    }
    while lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    lines.join("\n").trim().to_string()
}

fn element(el: &Value, r: &Resolve<'_>, out: &mut String) {
    let s = |k: &str| el.get(k).and_then(Value::as_str).unwrap_or_default();
    match s("tag") {
        "text" => out.push_str(&(r.text)(s("text"))),
        "md" => out.push_str(&(r.text)(s("text"))),
        "a" => {
            let (text, href) = (s("text").trim(), s("href").trim());
            if text.is_empty() || text == href {
                out.push_str(href);
            } else {
                out.push_str(&format!("[{text}]({href})"));
            }
        }
        "at" => out.push_str(&(r.at)(s("user_id"), s("user_name"))),
        "img" => out.push_str("[image]"),
        "media" => out.push_str("[video]"),
        "emotion" => out.push_str(&format!(":{}:", s("emoji_type"))),
        "hr" => out.push_str("---"),
        "code_block" => {
            let code = s("text");
            // A fence longer than any backtick run inside keeps the block closed.
            let longest = code.split(|c| c != '`').map(str::len).max().unwrap_or(0);
            let fence = "`".repeat(longest.max(2) + 1);
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!(
                "{fence}{}\n{}\n{fence}",
                s("language").to_ascii_lowercase(),
                code.trim_end_matches('\n')
            ));
        }
        "" => {}
        other => out.push_str(&format!("[{}]", clean(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::mention::{Member, MentionMatcher};

    fn flat(kind: &str, content: &Value) -> String {
        let text = |t: &str| t.replace("@_user_1", "@ErGoz");
        let at = |id: &str, name: &str| match id {
            "@_user_1" => "@ErGoz".to_string(),
            _ => format!("<at user_id=\"{id}\">{name}</at>"),
        };
        flatten(
            kind,
            &content.to_string(),
            &Resolve {
                text: &text,
                at: &at,
            },
        )
    }

    #[test]
    fn a_post_keeps_mentions_links_and_code() {
        // The shape of a received post (Feishu's im.message.receive_v1 docs).
        let post = serde_json::json!({
            "title": "Release",
            "content": [
                [{"tag": "at", "user_id": "@_user_1", "user_name": "二狗"},
                 {"tag": "text", "text": " please check "},
                 {"tag": "a", "href": "https://ci.example/1", "text": "the build"},
                 {"tag": "emotion", "emoji_type": "SMILE"}],
                [{"tag": "code_block", "language": "RUST", "text": "let who = \"@ErGoz\";\n// ```\n"}],
                [{"tag": "img", "image_key": "img_v2_1"}, {"tag": "at", "user_id": "ou_bob", "user_name": "Bob"}],
                []
            ]
        });
        let text = flat("post", &post);
        assert_eq!(
            text,
            "Release\n@ErGoz please check [the build](https://ci.example/1):SMILE:\n````rust\nlet who = \"@ErGoz\";\n// ```\n````\n[image]<at user_id=\"ou_bob\">Bob</at>"
        );
        let m = MentionMatcher::new(&[Member {
            name: "ErGoz".into(),
            aliases: vec![],
            open_ids: vec![],
        }]);
        assert_eq!(
            m.mentioned(&text, &[]),
            vec!["ErGoz"],
            "once: not in the code"
        );
        let code_only = flat(
            "post",
            &serde_json::json!({"zh_cn": {"title": "", "content": [[{"tag": "code_block", "language": "", "text": "@ErGoz"}]]}}),
        );
        assert_eq!(code_only, "```\n@ErGoz\n```", "a localized post");
        assert!(m.mentioned(&code_only, &[]).is_empty());
    }

    #[test]
    fn media_become_placeholders_and_nothing_is_dropped() {
        let cases = [
            (
                "image",
                serde_json::json!({"image_key": "img_1"}),
                "[image]",
            ),
            (
                "file",
                serde_json::json!({"file_key": "f", "file_name": "report.pdf"}),
                "[file report.pdf]",
            ),
            (
                "audio",
                serde_json::json!({"file_key": "f", "duration": 2500}),
                "[audio 3s]",
            ),
            (
                "media",
                serde_json::json!({"file_key": "f", "file_name": "demo.mp4"}),
                "[video demo.mp4]",
            ),
            ("sticker", serde_json::json!({"file_key": "f"}), "[sticker]"),
            (
                "share_chat",
                serde_json::json!({"chat_id": "oc_1"}),
                "[shared chat oc_1]",
            ),
            (
                "interactive",
                serde_json::json!({"title": "Deploy?", "elements": []}),
                "[card Deploy?]",
            ),
            ("interactive", serde_json::json!({}), "[card]"),
            ("merge_forward", serde_json::json!({}), "[merge_forward]"),
            (
                "text",
                serde_json::json!({"text": "@_user_1 hi"}),
                "@ErGoz hi",
            ),
            ("post", serde_json::json!("junk"), "[post]"),
        ];
        for (kind, content, want) in cases {
            assert_eq!(flat(kind, &content), want, "{kind}");
        }
    }
}
