//! OneBot v11 message segments: reading a message in either form (an array of
//! `{type, data}` segments, or a CQ-code string) and building the array a bot sends.
//!
//! In the string form, `&`, `[`, `]` are written `&amp;`, `&#91;`, `&#93;` in text,
//! and `,` too (`&#44;`) inside a CQ code's values; [`parse_cq`] reads them back and
//! [`escape_cq`] writes them. A bot never sends the string form: its text goes in
//! `text` segments, so nothing it says can become a CQ code.

use serde_json::{json, Value};

/// One segment of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Plain text.
    Text(String),
    /// An @ of a QQ number (`all` for @全体成员), with the name some implementations add.
    At {
        /// The QQ number, or `all`.
        qq: String,
        /// The name shown, when the implementation gives it.
        name: Option<String>,
    },
    /// A reply to the message with this id.
    Reply(String),
    /// Anything else, by its type (`image`, `face`, `record`, `file`, …).
    Other(String),
}

/// A value of a segment's `data` as a string (OneBot sends numbers or strings).
fn data_str(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// One `{type, data}` segment.
fn segment(v: &Value) -> Segment {
    let data = &v["data"];
    match v["type"].as_str().unwrap_or_default() {
        "text" => Segment::Text(data_str(&data["text"]).unwrap_or_default()),
        "at" => Segment::At {
            qq: data_str(&data["qq"]).unwrap_or_default(),
            name: data_str(&data["name"]).filter(|n| !n.is_empty()),
        },
        "reply" => Segment::Reply(data_str(&data["id"]).unwrap_or_default()),
        other => Segment::Other(other.to_string()),
    }
}

/// A message as an event carries it: the array form, or the CQ-string form.
pub fn parse(message: &Value) -> Vec<Segment> {
    match message {
        Value::Array(items) => items.iter().map(segment).collect(),
        Value::String(s) => parse_cq(s),
        _ => Vec::new(),
    }
}

/// Text as the string form writes it back to itself.
pub fn unescape_cq(s: &str) -> String {
    s.replace("&#91;", "[")
        .replace("&#93;", "]")
        .replace("&#44;", ",")
        .replace("&amp;", "&")
}

/// Text escaped for the string form (`&`, `[`, `]`, and `,` for values inside a code).
pub fn escape_cq(s: &str, in_code: bool) -> String {
    let s = s
        .replace('&', "&amp;")
        .replace('[', "&#91;")
        .replace(']', "&#93;");
    if in_code {
        s.replace(',', "&#44;")
    } else {
        s
    }
}

/// A message in the CQ-string form (`hi [CQ:at,qq=10001] &#91;x&#93;`).
pub fn parse_cq(s: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("[CQ:") {
        if start > 0 {
            out.push(Segment::Text(unescape_cq(&rest[..start])));
        }
        let Some(len) = rest[start..].find(']') else {
            break;
        };
        let code = &rest[start + 4..start + len];
        let mut parts = code.split(',');
        let kind = parts.next().unwrap_or_default();
        let mut data = serde_json::Map::new();
        for p in parts {
            if let Some((k, v)) = p.split_once('=') {
                data.insert(k.to_string(), Value::String(unescape_cq(v)));
            }
        }
        out.push(segment(&json!({"type": kind, "data": data})));
        rest = &rest[start + len + 1..];
    }
    if !rest.is_empty() {
        out.push(Segment::Text(unescape_cq(rest)));
    }
    out
}

/// The placeholder shown for a segment the mesh does not read.
pub fn placeholder(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "image" => "[image]",
        "face" => "[face]",
        "record" => "[voice]",
        "video" => "[video]",
        "file" => "[file]",
        "forward" => "[forwarded messages]",
        "json" | "xml" => "[card]",
        _ => return None,
    })
}

/// The array a bot sends: a reply to `reply_to` first (when given), then its text with
/// each colleague it names as an at-segment. `parts` is the text cut at mentions:
/// `Ok(text)` is text, `Err(qq)` an at.
pub fn outgoing(reply_to: Option<&str>, parts: &[Result<String, String>]) -> Value {
    let mut segs = Vec::new();
    if let Some(id) = reply_to {
        segs.push(json!({"type": "reply", "data": {"id": id}}));
    }
    for p in parts {
        match p {
            Ok(text) if text.is_empty() => {}
            Ok(text) => segs.push(json!({"type": "text", "data": {"text": text}})),
            Err(qq) => segs.push(json!({"type": "at", "data": {"qq": qq}})),
        }
    }
    Value::Array(segs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_and_string_forms_read_alike() {
        let arr = json!([
            {"type": "at", "data": {"qq": "10001"}},
            {"type": "text", "data": {"text": " a & [b], c"}},
            {"type": "image", "data": {"file": "x.jpg"}},
            {"type": "reply", "data": {"id": 42}}
        ]);
        let want = vec![
            Segment::At {
                qq: "10001".into(),
                name: None,
            },
            Segment::Text(" a & [b], c".into()),
            Segment::Other("image".into()),
            Segment::Reply("42".into()),
        ];
        assert_eq!(parse(&arr), want);
        let s = "[CQ:at,qq=10001] a &amp; &#91;b&#93;, c[CQ:image,file=x.jpg,url=http://x/?a=1&#44;2][CQ:reply,id=42]";
        assert_eq!(parse(&json!(s)), want);
    }

    #[test]
    fn escaping_round_trips_and_text_never_becomes_a_code() {
        let text = "[CQ:at,qq=all] & [x], y";
        assert_eq!(
            parse_cq(&escape_cq(text, false)),
            vec![Segment::Text(text.into())]
        );
        assert_eq!(unescape_cq(&escape_cq(text, true)), text);
        let v = outgoing(
            Some("7"),
            &[Ok(text.into()), Err("10002".into()), Ok(String::new())],
        );
        assert_eq!(
            v,
            json!([
                {"type": "reply", "data": {"id": "7"}},
                {"type": "text", "data": {"text": text}},
                {"type": "at", "data": {"qq": "10002"}}
            ])
        );
    }
}
