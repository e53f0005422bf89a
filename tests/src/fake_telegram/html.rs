//! Telegram's text formatting as the stand-in applies it: `mention` and
//! `bot_command` entities found in any text, and the HTML parse mode ("Formatting
//! options" in the Bot API documentation), offsets in UTF-16 code units.

use serde_json::{json, Value};

/// Length in UTF-16 code units, as Telegram counts offsets and lengths.
pub(crate) fn utf16(s: &str) -> usize {
    s.encode_utf16().count()
}

/// `mention` entities for every `@handle` in `text` (5–32 of `A-Za-z0-9_`, not after
/// a word character), and `bot_command` for a leading `/command[@handle]`.
pub(crate) fn detect_entities(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(rest) = text.strip_prefix('/') {
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '@'))
            .map_or(text.len(), |i| i + 1);
        if end > 1 {
            out.push(json!({"type": "bot_command", "offset": 0, "length": utf16(&text[..end])}));
        }
    }
    let mut prev: Option<char> = None;
    for (i, c) in text.char_indices() {
        if c == '@'
            && !prev.is_some_and(|p| p.is_alphanumeric() || p == '_' || p == '/' || p == '.')
        {
            let rest = &text[i + 1..];
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if (5..=32).contains(&len) {
                out.push(
                    json!({"type": "mention", "offset": utf16(&text[..i]), "length": len + 1}),
                );
            }
        }
        prev = Some(c);
    }
    out.sort_by_key(|e| e["offset"].as_u64());
    out
}

/// Telegram's HTML parse mode: the text shown and its entities, or the error
/// Telegram gives ("can't parse entities: …").
pub fn parse_html(html: &str) -> Result<(String, Vec<Value>), String> {
    const TAGS: [&str; 16] = [
        "b",
        "strong",
        "i",
        "em",
        "u",
        "ins",
        "s",
        "strike",
        "del",
        "code",
        "pre",
        "a",
        "tg-spoiler",
        "span",
        "blockquote",
        "tg-emoji",
    ];
    let mut text = String::new();
    let mut entities = Vec::new();
    // Open tags: (name, start offset in UTF-16 units, attributes).
    let mut open: Vec<(String, usize, String)> = Vec::new();
    let b = html.as_bytes();
    let mut i = 0;
    while i < html.len() {
        let c = html[i..].chars().next().unwrap();
        if c == '&' {
            let semi = html[i..].find(';').filter(|&s| s <= 10);
            let decoded = semi.and_then(|s| {
                let name = &html[i + 1..i + s];
                match name {
                    "lt" => Some('<'),
                    "gt" => Some('>'),
                    "amp" => Some('&'),
                    "quot" => Some('"'),
                    n if n.starts_with("#x") => u32::from_str_radix(&n[2..], 16)
                        .ok()
                        .and_then(char::from_u32),
                    n if n.starts_with('#') => n[1..].parse().ok().and_then(char::from_u32),
                    _ => None,
                }
            });
            match (decoded, semi) {
                (Some(ch), Some(s)) => {
                    text.push(ch);
                    i += s + 1;
                }
                _ => {
                    // Telegram keeps an `&` that starts no entity as it is.
                    text.push('&');
                    i += 1;
                }
            }
            continue;
        }
        if c != '<' {
            text.push(c);
            i += c.len_utf8();
            continue;
        }
        let Some(close) = html[i..].find('>') else {
            return Err(format!("Can't find end of the tag at byte offset {i}"));
        };
        let inner = &html[i + 1..i + close];
        if let Some(name) = inner.strip_prefix('/') {
            let name = name.trim().to_ascii_lowercase();
            match open.pop() {
                Some((n, start, attrs)) if n == name => {
                    let length = utf16(&text) - start;
                    let kind = match n.as_str() {
                        "b" | "strong" => "bold",
                        "i" | "em" => "italic",
                        "u" | "ins" => "underline",
                        "s" | "strike" | "del" => "strikethrough",
                        "code" => "code",
                        "pre" => "pre",
                        "blockquote" => "blockquote",
                        "a" => "text_link",
                        _ => "spoiler",
                    };
                    if length > 0 {
                        let mut e = json!({"type": kind, "offset": start, "length": length});
                        if n == "a" {
                            let href = attrs
                                .split("href=\"")
                                .nth(1)
                                .and_then(|r| r.split('"').next())
                                .unwrap_or_default()
                                .to_string();
                            if let Some(id) = href.strip_prefix("tg://user?id=") {
                                let shown: Vec<u16> =
                                    text.encode_utf16().skip(start).take(length).collect();
                                e["type"] = json!("text_mention");
                                e["user"] = json!({
                                    "id": id.parse::<i64>().unwrap_or(0), "is_bot": false,
                                    "first_name": String::from_utf16_lossy(&shown),
                                });
                            } else {
                                e["url"] = json!(href);
                            }
                        }
                        entities.push(e);
                    }
                }
                Some((n, _, _)) => {
                    return Err(format!(
                        "Can't find end tag corresponding to start tag \"{n}\""
                    ))
                }
                None => return Err(format!("Unexpected end tag at byte offset {i}")),
            }
        } else {
            let name: String = inner
                .split(|c: char| c.is_whitespace())
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            if !TAGS.contains(&name.as_str()) || !b[i + 1].is_ascii_alphabetic() {
                return Err(format!(
                    "Unsupported start tag \"{name}\" at byte offset {i}"
                ));
            }
            open.push((name, utf16(&text), inner.to_string()));
        }
        i += close + 1;
    }
    if let Some((n, _, _)) = open.pop() {
        return Err(format!(
            "Can't find end tag corresponding to start tag \"{n}\""
        ));
    }
    entities.extend(detect_entities(&text));
    entities.sort_by_key(|e| e["offset"].as_u64());
    Ok((text, entities))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_parses_as_telegram_parses_it() {
        let (t, e) = parse_html("&lt;b&gt;5 &lt; 6 &amp; \"x\"&lt;/b&gt;").unwrap();
        assert_eq!(t, "<b>5 < 6 & \"x\"</b>");
        assert!(e.is_empty());
        let (t, e) =
            parse_html("😀 <b>bold</b> <a href=\"tg://user?id=42\">Dana</a> @beta_bot").unwrap();
        assert_eq!(t, "😀 bold Dana @beta_bot");
        assert_eq!(e[0], json!({"type": "bold", "offset": 3, "length": 4}));
        assert_eq!(e[1]["type"], "text_mention");
        assert_eq!(e[1]["user"]["id"], 42);
        assert_eq!(e[1]["user"]["first_name"], "Dana");
        assert_eq!(e[2], json!({"type": "mention", "offset": 13, "length": 9}));
        assert!(parse_html("<b>5 < 6</b>")
            .unwrap_err()
            .contains("Unsupported start tag"));
        assert!(parse_html("<blink>x</blink>")
            .unwrap_err()
            .contains("Unsupported start tag \"blink\""));
        assert!(parse_html("<b>x").is_err());
        assert_eq!(parse_html("AT&T").unwrap().0, "AT&T");
    }
}
