//! A bot's text as Telegram shows it: sent in HTML parse mode, everything escaped
//! (`&`, `<`, `>`) so that what the bot wrote, `<b>` and all, appears literally;
//! Markdown code (fenced blocks, inline spans) becomes `<pre>`/`<code>`; a
//! colleague's `@Name` becomes its `@handle` (a real mention), a person's
//! `<at user_id="id">Name</at>` a `tg://user` link (a mention without a handle);
//! longer texts go in parts of at most 4,096 characters, as Telegram counts them
//! (UTF-16 code units of the text after entity parsing), cut at natural boundaries.

use std::sync::OnceLock;

use crate::turn::mention::MentionMatcher;

/// Longest message text Telegram accepts, in UTF-16 code units after parsing.
pub const MAX_MESSAGE_UNITS: usize = 4096;

/// `s` escaped for Telegram's HTML parse mode: `&`, `<` and `>` as entities (quotes
/// need none outside attributes).
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// Length as Telegram counts it: UTF-16 code units.
pub fn tg_len(s: &str) -> usize {
    s.encode_utf16().count()
}

/// A part ready to send: its HTML, and the length of the text Telegram will show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The `text` of `sendMessage` with `parse_mode = HTML`.
    pub html: String,
    /// UTF-16 units of the text after entity parsing.
    pub shown: usize,
}

/// A code span or block in a bot's text: where it stands (bytes), its content, and
/// whether it is a fenced block (with its language, if named).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Code {
    /// The span's bytes, backticks included.
    span: std::ops::Range<usize>,
    /// The content's bytes.
    inner: std::ops::Range<usize>,
    /// `Some(language)` for a fenced block (empty when none is named); `None` inline.
    block: Option<String>,
}

/// The Markdown code of `text`: fenced blocks (```` ```lang ````, a line, the code,
/// ```` ``` ````) and inline `` `code` `` on one line. An unclosed fence or backtick
/// is text.
fn code_spans(text: &str) -> Vec<Code> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = text[i..].find('`') {
        let at = i + off;
        if text[at..].starts_with("```") {
            let after = at + 3;
            let line_end = text[after..].find('\n').map(|n| after + n);
            let (lang, body) = match line_end {
                Some(n) => (text[after..n].trim(), n + 1),
                None => ("", after),
            };
            let lang_ok = lang
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-_#.".contains(c));
            let (lang, body) = if lang_ok { (lang, body) } else { ("", after) };
            if let Some(close) = text[body..].find("```").map(|c| body + c) {
                let end = if close > body && text[..close].ends_with('\n') {
                    close - 1
                } else {
                    close
                };
                out.push(Code {
                    span: at..close + 3,
                    inner: body..end.max(body),
                    block: Some(lang.to_string()),
                });
                i = close + 3;
                continue;
            }
            break; // an unclosed fence: the rest is text
        }
        let line_end = text[at + 1..].find('\n').map_or(text.len(), |n| at + 1 + n);
        match text[at + 1..line_end].find('`').map(|c| at + 1 + c) {
            Some(close) if close > at + 1 => {
                out.push(Code {
                    span: at..close + 1,
                    inner: at + 1..close,
                    block: None,
                });
                i = close + 1;
            }
            // "``": nothing inside.
            Some(close) => i = close + 1,
            // No other backtick on this line: none of the line's closes a span.
            None => i = line_end.max(at + 1),
        }
    }
    out
}

/// The HTML of `text`: escaped, Markdown code as Telegram code (`<pre>`, `<code>`),
/// with `@Colleague` as its @handle (`handle_of` gives
/// it, `None` keeps the name) and `<at user_id="…">Name</at>` tags as mentions.
pub(crate) fn render(
    text: &str,
    matcher: &MentionMatcher,
    handle_of: &dyn Fn(&str) -> Option<String>,
) -> Rendered {
    static AT: OnceLock<regex::Regex> = OnceLock::new();
    let at = AT.get_or_init(|| {
        regex::Regex::new(r#"<at user_id="([^"<>]{1,64})">([^<]*)</at>"#).expect("valid")
    });
    // Replacements by byte range: (start, end, html, shown text).
    let mut subs: Vec<(usize, usize, String, String)> = Vec::new();
    for c in code_spans(text) {
        let inner = &text[c.inner.clone()];
        let html = match &c.block {
            Some(lang) if !lang.is_empty() => format!(
                "<pre><code class=\"language-{lang}\">{}</code></pre>",
                escape_html(inner)
            ),
            Some(_) => format!("<pre>{}</pre>", escape_html(inner)),
            None => format!("<code>{}</code>", escape_html(inner)),
        };
        subs.push((c.span.start, c.span.end, html, inner.to_string()));
    }
    let overlaps = |subs: &[(usize, usize, String, String)], s: usize, e: usize| {
        subs.iter().any(|(a, b, _, _)| s < *b && *a < e)
    };
    for c in at.captures_iter(text) {
        let whole = c.get(0).expect("match");
        if overlaps(&subs, whole.start(), whole.end()) {
            continue;
        }
        let (id, name) = (&c[1], &c[2]);
        let (html, shown) = if let Some(handle) = id.strip_prefix('@') {
            (format!("@{}", escape_html(handle)), format!("@{handle}"))
        } else if id.bytes().all(|b| b.is_ascii_digit()) {
            (
                format!("<a href=\"tg://user?id={id}\">{}</a>", escape_html(name)),
                name.to_string(),
            )
        } else {
            (escape_html(name), name.to_string())
        };
        subs.push((whole.start(), whole.end(), html, shown));
    }
    for span in matcher.spans(text, &[]) {
        if overlaps(&subs, span.start, span.end) {
            continue;
        }
        if let Some(handle) = handle_of(&span.member) {
            let shown = format!("@{handle}");
            subs.push((span.start, span.end, escape_html(&shown), shown));
        }
    }
    subs.sort_by_key(|(s, _, _, _)| *s);
    let (mut html, mut shown) = (String::with_capacity(text.len() + 16), 0);
    let mut pos = 0;
    for (s, e, h, t) in subs {
        if s < pos {
            continue;
        }
        html.push_str(&escape_html(&text[pos..s]));
        shown += tg_len(&text[pos..s]);
        html.push_str(&h);
        shown += tg_len(&t);
        pos = e;
    }
    html.push_str(&escape_html(&text[pos..]));
    shown += tg_len(&text[pos..]);
    Rendered { html, shown }
}

/// `text` in parts Telegram accepts (each shown at most `limit` units), cut at
/// paragraph, line, sentence or word boundaries; a part whose mentions made it longer
/// than the limit is cut again, shorter.
pub(crate) fn parts(
    text: &str,
    limit: usize,
    matcher: &MentionMatcher,
    handle_of: &dyn Fn(&str) -> Option<String>,
) -> Vec<Rendered> {
    let mut out = Vec::new();
    for part in crate::platform::kit::split::split_message(text, limit) {
        let r = render(&part, matcher, handle_of);
        if r.shown <= limit || limit < 64 {
            out.push(r);
        } else {
            // Mentions grew it: cut this part again with the room they take.
            let tighter = limit.saturating_sub(r.shown - limit).max(limit / 2);
            out.extend(parts(&part, tighter, matcher, handle_of));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::mention::Member;

    fn matcher() -> MentionMatcher {
        MentionMatcher::new(&[
            Member {
                name: "Alpha".into(),
                ..Default::default()
            },
            Member {
                name: "Beta".into(),
                aliases: vec!["贝塔".into()],
                ..Default::default()
            },
            Member {
                name: "Loc".into(),
                ..Default::default()
            },
        ])
    }

    fn handle_of(name: &str) -> Option<String> {
        (name == "Beta").then(|| "beta_bot".to_string())
    }

    #[test]
    fn html_is_escaped_so_it_shows_literally() {
        let r = render("<b>5 < 6 & \"x\"</b>", &matcher(), &handle_of);
        assert_eq!(r.html, "&lt;b&gt;5 &lt; 6 &amp; \"x\"&lt;/b&gt;");
        assert_eq!(r.shown, tg_len("<b>5 < 6 & \"x\"</b>"));
        assert_eq!(
            escape_html("&amp;"),
            "&amp;amp;",
            "an entity a person wrote stays one"
        );
    }

    #[test]
    fn colleagues_become_handles_and_people_links() {
        let r = render(
            "@贝塔 and @Beta, ask @Loc; thanks <at user_id=\"42\">Dana <3</at> and <at user_id=\"@carol\">@carol</at> `@Beta`",
            &matcher(),
            &handle_of,
        );
        assert_eq!(
            r.html,
            "@beta_bot and @beta_bot, ask @Loc; thanks &lt;at user_id=\"42\"&gt;Dana &lt;3&lt;/at&gt; and @carol <code>@Beta</code>",
            "a tag whose name holds < is no tag: it shows as written"
        );
        let r = render(
            "thanks <at user_id=\"42\">Dana</at>!",
            &matcher(),
            &handle_of,
        );
        assert_eq!(r.html, "thanks <a href=\"tg://user?id=42\">Dana</a>!");
        assert_eq!(r.shown, tg_len("thanks Dana!"));
    }

    #[test]
    fn markdown_code_becomes_telegram_code_and_nothing_else_does() {
        let text =
            "Run `a < b` then:\n```rust\nif x < 1 && y {}\n```\nand **this** stays; a ` alone too";
        let r = render(text, &matcher(), &handle_of);
        assert_eq!(
            r.html,
            "Run <code>a &lt; b</code> then:\n<pre><code class=\"language-rust\">if x &lt; 1 &amp;&amp; y {}</code></pre>\nand **this** stays; a ` alone too"
        );
        assert_eq!(
            r.shown,
            tg_len("Run a < b then:\nif x < 1 && y {}\nand **this** stays; a ` alone too")
        );
        let r = render("```\nplain\n```", &matcher(), &handle_of);
        assert_eq!(r.html, "<pre>plain</pre>");
        let r = render("```never closed <b>", &matcher(), &handle_of);
        assert_eq!(r.html, "```never closed &lt;b&gt;");
    }

    #[test]
    fn long_text_is_split_under_4096_units_at_natural_boundaries() {
        let para = "This sentence explains one more step of the rollout in detail. ".repeat(20);
        let text = [para.trim(); 6].join("\n\n");
        let ps = parts(&text, MAX_MESSAGE_UNITS, &matcher(), &handle_of);
        assert!(ps.len() >= 2);
        for p in &ps {
            assert!(p.shown <= MAX_MESSAGE_UNITS);
            assert!(
                p.html.ends_with("in detail."),
                "{:?}",
                &p.html[p.html.len() - 20..]
            );
        }
        // Emoji count twice: 3,000 of them are 6,000 units, two parts.
        let emoji = "😀".repeat(3000);
        let ps = parts(&emoji, MAX_MESSAGE_UNITS, &matcher(), &handle_of);
        assert_eq!(ps.len(), 2);
        assert!(ps.iter().all(|p| p.shown <= MAX_MESSAGE_UNITS));
        assert_eq!(
            ps.iter().map(|p| p.html.as_str()).collect::<String>(),
            emoji
        );
        // Escaping makes the HTML longer, not the text shown.
        let amp = "& ".repeat(2000);
        let ps = parts(&amp, MAX_MESSAGE_UNITS, &matcher(), &handle_of);
        assert_eq!(
            ps.len(),
            1,
            "4,000 units shown, though the HTML is 12,000 bytes"
        );
        // Mentions that grow past the limit are cut again.
        let many = "@Beta ".repeat(800);
        let ps = parts(&many, MAX_MESSAGE_UNITS, &matcher(), &handle_of);
        assert!(ps.len() >= 2);
        assert!(
            ps.iter().all(|p| p.shown <= MAX_MESSAGE_UNITS),
            "{:?}",
            ps.iter().map(|p| p.shown).collect::<Vec<_>>()
        );
    }
}
