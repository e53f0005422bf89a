//! The judge's verdict: the schema a judge call asks for and the forgiving parse of
//! whatever came back.
//!
//! Local servers (Ollama, llama.cpp, vLLM) differ in how well they follow a JSON
//! schema, so [`parse_verdict`] accepts the verdict in a code fence, inside prose,
//! with Python literals, single quotes, other key spellings, yes/no words or a bare
//! answer, and [`parse_shared_verdicts`] does the same per bot for a shared judge's
//! answer.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// How many `{` positions [`parse_verdict`] tries before giving up.
const MAX_JSON_CANDIDATES: usize = 32;

/// The judge's decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Whether the bot should interject now.
    pub speak: bool,
    /// How relevant the conversation is to this bot, in `[0, 1]`; used to
    /// rank bots that all want to speak.
    pub relevance: f64,
}

/// JSON schema of the judge's answer, sent as `response_format` so servers
/// with constrained decoding can only produce a valid verdict.
pub fn verdict_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "speak": { "type": "boolean" },
            "relevance": { "type": "number", "minimum": 0, "maximum": 1 },
        },
        "required": ["speak", "relevance"],
        "additionalProperties": false,
    })
}

/// Reads a [`Verdict`] out of whatever the judge model wrote, or `None` if it
/// cannot be understood.
///
/// Accepted, in order: a JSON object; the first `{…}` embedded in prose or a
/// code fence that yields a verdict (single quotes, Python literals, bare
/// keys and trailing commas are repaired); a bare yes/no answer (also
/// 是/否, 要/不要). Keys match case- and underscore-insensitively (`speak`,
/// `should_speak`, `relevance`, `relevance_score`). `speak` may be a bool,
/// `"yes"`/`"no"`/`"true"`/`"false"`, or 1/0; `relevance` a number, numeric
/// string or percentage, clamped to `[0, 1]`, and NaN/infinite rejects the
/// object. A missing relevance becomes 0.5 when speaking and 0.0 otherwise; a
/// missing speak becomes `relevance >= 0.5`.
pub fn parse_verdict(text: &str) -> Option<Verdict> {
    let text = text.trim().trim_start_matches('\u{feff}').trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) {
        if let Some(verdict) = verdict_from_object(&map) {
            return Some(verdict);
        }
    }
    for candidate in brace_candidates(text).take(MAX_JSON_CANDIDATES) {
        let parsed = serde_json::from_str::<Value>(candidate)
            .ok()
            .or_else(|| serde_json::from_str::<Value>(&repair_json(candidate)).ok());
        if let Some(Value::Object(map)) = parsed {
            if let Some(verdict) = verdict_from_object(&map) {
                return Some(verdict);
            }
        }
    }
    bare_answer(text)
}

/// Reads the shared judge's answer (`{"Name": {"speak": …, "relevance": …}, …}`) for
/// the bots `names`, with [`parse_verdict`]'s tolerance for each entry. Names match
/// case-insensitively; a bot whose entry is missing or not understood is left out
/// (it judges itself). The first JSON object in the text that names any of the bots wins.
pub fn parse_shared_verdicts(text: &str, names: &[String]) -> BTreeMap<String, Verdict> {
    let text = text.trim().trim_start_matches('\u{feff}').trim();
    let whole = serde_json::from_str::<Value>(text).ok();
    let candidates = whole.into_iter().chain(
        brace_candidates(text)
            .take(MAX_JSON_CANDIDATES)
            .filter_map(|c| {
                serde_json::from_str::<Value>(c)
                    .ok()
                    .or_else(|| serde_json::from_str::<Value>(&repair_json(c)).ok())
            }),
    );
    for value in candidates {
        let Value::Object(map) = value else { continue };
        let mut out = BTreeMap::new();
        for name in names {
            let wanted = normalize_key(name);
            let entry = map.iter().find(|(k, _)| normalize_key(k) == wanted);
            if let Some((_, Value::Object(obj))) = entry {
                if let Some(v) = verdict_from_object(obj) {
                    out.insert(name.clone(), v);
                }
            }
        }
        if !out.is_empty() {
            return out;
        }
    }
    BTreeMap::new()
}

/// The verdict described by one JSON object, if it names speak or relevance.
fn verdict_from_object(map: &Map<String, Value>) -> Option<Verdict> {
    let mut speak_value = None;
    let mut relevance_value = None;
    for (key, value) in map {
        match normalize_key(key).as_str() {
            "speak" | "shouldspeak" => {
                speak_value.get_or_insert(value);
            }
            "relevance" | "relevancescore" => {
                relevance_value.get_or_insert(value);
            }
            _ => {}
        }
    }
    let speak = speak_value.and_then(speak_from_value);
    let relevance = match relevance_value.and_then(relevance_from_value) {
        Some(r) if !r.is_finite() => return None,
        Some(r) => Some(r.clamp(0.0, 1.0)),
        None => None,
    };
    match (speak, relevance) {
        (Some(speak), Some(relevance)) => Some(Verdict { speak, relevance }),
        (Some(speak), None) => Some(Verdict {
            speak,
            relevance: if speak { 0.5 } else { 0.0 },
        }),
        (None, Some(relevance)) => Some(Verdict {
            speak: relevance >= 0.5,
            relevance,
        }),
        (None, None) => None,
    }
}

/// Lowercase alphanumerics only, so `Speak`, `SPEAK` and `should_speak` match.
fn normalize_key(key: &str) -> String {
    key.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

fn speak_from_value(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => {
            let x = n.as_f64()?;
            if x == 1.0 {
                Some(true)
            } else if x == 0.0 {
                Some(false)
            } else {
                None
            }
        }
        Value::String(s) => yes_no(s),
        _ => None,
    }
}

/// The relevance as written (possibly NaN), or `None` if not numeric.
fn relevance_from_value(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => {
            let s = s.trim();
            match s.strip_suffix('%') {
                Some(pct) => pct.trim().parse::<f64>().ok().map(|p| p / 100.0),
                None => s.parse::<f64>().ok(),
            }
        }
        _ => None,
    }
}

/// Interprets a yes/no word (English or Chinese), ignoring case, quotes,
/// markdown emphasis and trailing punctuation.
fn yes_no(word: &str) -> Option<bool> {
    let word = word
        .trim()
        .trim_matches(|c: char| {
            c.is_whitespace()
                || matches!(
                    c,
                    '"' | '\'' | '`' | '*' | '_' | '.' | '!' | ',' | '。' | '！' | '，' | '“' | '”'
                )
        })
        .to_lowercase();
    match word.as_str() {
        "yes" | "true" | "1" | "是" | "要" => Some(true),
        "no" | "false" | "0" | "否" | "不要" => Some(false),
        _ => None,
    }
}

/// A whole answer that is just yes or no (not true/false or digits, which
/// are too ambiguous as bare text).
fn bare_answer(text: &str) -> Option<Verdict> {
    let lowered = text.to_lowercase();
    let core = lowered.trim_matches(|c: char| !c.is_alphanumeric());
    if matches!(core, "true" | "false" | "1" | "0") {
        return None;
    }
    yes_no(text).map(|speak| Verdict {
        speak,
        relevance: if speak { 0.5 } else { 0.0 },
    })
}

/// Every balanced `{…}` span in `text`, in order of its opening brace;
/// braces inside quoted strings are skipped.
fn brace_candidates(text: &str) -> impl Iterator<Item = &str> {
    text.char_indices()
        .filter(|(_, c)| *c == '{')
        .filter_map(move |(start, _)| {
            matching_brace(&text[start..]).map(|end| &text[start..start + end + 1])
        })
}

/// Byte index of the `}` closing the `{` at the start of `text`.
fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Best-effort fix of almost-JSON: single-quoted strings, Python
/// `True`/`False`/`None`, bare words (quoted, so `yes` becomes `"yes"`), and
/// trailing commas.
fn repair_json(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 8);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    if chars[i + 1] == '\'' {
                        out.push('\'');
                    } else {
                        out.push('\\');
                        out.push(chars[i + 1]);
                    }
                    i += 2;
                    continue;
                }
                if chars[i] == '"' {
                    out.push_str("\\\"");
                } else {
                    out.push(chars[i]);
                }
                i += 1;
            }
            out.push('"');
            i += 1;
        } else if c == ',' {
            let next = chars[i + 1..].iter().find(|ch| !ch.is_whitespace());
            if !matches!(next, Some('}') | Some(']')) {
                out.push(',');
            }
            i += 1;
        } else if c.is_ascii_digit() {
            // Copy a whole number (with exponent) so `1e5` is not split.
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric()
                    || chars[i] == '.'
                    || (matches!(chars[i], '+' | '-') && matches!(chars[i - 1], 'e' | 'E')))
            {
                i += 1;
            }
            out.extend(&chars[start..i]);
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            match word.as_str() {
                "true" | "True" => out.push_str("true"),
                "false" | "False" => out.push_str("false"),
                "null" | "None" => out.push_str("null"),
                _ => {
                    out.push('"');
                    out.push_str(&word);
                    out.push('"');
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(speak: bool, relevance: f64) -> Option<Verdict> {
        Some(Verdict { speak, relevance })
    }

    // ---- parse_verdict ----

    /// Every shape of answer a model was seen to give, and what it is read as.
    #[test]
    fn verdicts_as_models_write_them() {
        let cases: &[(&str, &str, Option<Verdict>)] = &[
            ("strict JSON", r#"{"speak": true, "relevance": 0.8}"#, v(true, 0.8)),
            ("strict JSON, no spaces", r#"{"speak":false,"relevance":0.1}"#, v(false, 0.1)),
            ("surrounding whitespace", "\n  {\"speak\": true, \"relevance\": 1}  \n", v(true, 1.0)),
            ("a json fence", "```json\n{\"speak\": true, \"relevance\": 0.7}\n```", v(true, 0.7)),
            ("embedded in prose", "Sure! Here is my decision: {\"speak\": false, \"relevance\": 0.2} Hope that helps.", v(false, 0.2)),
            ("the first object that yields a verdict", r#"Example: {"foo": 1}. Answer: {"speak": true, "relevance": 0.6} or {"speak": false}"#, v(true, 0.6)),
            ("a nested object", r#"{"verdict": {"speak": true, "relevance": 0.9}}"#, v(true, 0.9)),
            ("braces inside strings ignored", r#"{"reason": "mentions {code} }", "speak": true, "relevance": 0.4}"#, v(true, 0.4)),
            ("capitalized keys", r#"{"Speak": true, "Relevance": 0.3}"#, v(true, 0.3)),
            ("upper and snake keys", r#"{"SHOULD_SPEAK": "yes", "relevance_score": 0.75}"#, v(true, 0.75)),
            ("speak as yes", r#"{"speak": "yes", "relevance": 0.6}"#, v(true, 0.6)),
            ("speak as No", r#"{"speak": "No", "relevance": 0.6}"#, v(false, 0.6)),
            ("speak as a true string", r#"{"speak": "true", "relevance": 0.6}"#, v(true, 0.6)),
            ("speak as FALSE", r#"{"speak": "FALSE", "relevance": 0.6}"#, v(false, 0.6)),
            ("speak as 1", r#"{"speak": 1, "relevance": 0.6}"#, v(true, 0.6)),
            ("speak as 0", r#"{"speak": 0, "relevance": 0.6}"#, v(false, 0.6)),
            ("relevance as a numeric string", r#"{"speak": true, "relevance": " 0.65 "}"#, v(true, 0.65)),
            ("relevance as a percent", r#"{"speak": true, "relevance": "80%"}"#, v(true, 0.8)),
            ("relevance clamped above", r#"{"speak": true, "relevance": 7}"#, v(true, 1.0)),
            ("relevance clamped below", r#"{"speak": false, "relevance": -0.5}"#, v(false, 0.0)),
            ("relevance NaN as a string", r#"{"speak": true, "relevance": "NaN"}"#, None),
            ("relevance NaN", r#"{"speak": true, "relevance": NaN}"#, None),
            ("relevance infinite", r#"{"speak": true, "relevance": "inf"}"#, None),
            ("missing relevance, speak", r#"{"speak": true}"#, v(true, 0.5)),
            ("missing relevance, silent", r#"{"speak": false}"#, v(false, 0.0)),
            ("missing speak, at the threshold", r#"{"relevance": 0.5}"#, v(true, 0.5)),
            ("missing speak, under it", r#"{"relevance": 0.49}"#, v(false, 0.49)),
            ("unparseable speak falls back to relevance", r#"{"speak": "maybe", "relevance": 0.9}"#, v(true, 0.9)),
            ("bare yes", "yes", v(true, 0.5)),
            ("bare No.", "No.", v(false, 0.0)),
            ("bare bold YES", "  **YES**  ", v(true, 0.5)),
            ("bare 是", "是", v(true, 0.5)),
            ("bare 否。", "否。", v(false, 0.0)),
            ("bare 要", "要", v(true, 0.5)),
            ("bare 不要", "不要", v(false, 0.0)),
            ("a Python dict, repaired", "{'speak': True, 'relevance': 0.7}", v(true, 0.7)),
            ("bare keys and a trailing comma, repaired", "{speak: yes, relevance: 0.6,}", v(true, 0.6)),
            ("a BOM first", "\u{feff}{\"speak\": true, \"relevance\": 0.2}", v(true, 0.2)),
            ("empty", "", None),
            ("blank", "   ", None),
            ("prose", "I think I should stay quiet here.", None),
            ("yes in prose", "yes, because the topic is mine", None),
            ("unrelated JSON", r#"{"answer": 42}"#, None),
            ("a JSON array", "[1, 2, 3]", None),
            ("cut JSON", "{\"speak\": ", None),
            ("bare true", "true", None),
            ("bare digits", "1", None),
            ("speak as another number, no relevance", r#"{"speak": 2}"#, None),
            ("speak as another number uses relevance", r#"{"speak": 2, "relevance": 0.1}"#, v(false, 0.1)),
        ];
        for (what, text, want) in cases {
            assert_eq!(parse_verdict(text), *want, "{what}: {text:?}");
        }
    }

    // ---- schema ----

    #[test]
    fn schema_shape() {
        let s = verdict_schema();
        assert_eq!(s["type"], "object");
        assert_eq!(s["properties"]["speak"]["type"], "boolean");
        assert_eq!(s["properties"]["relevance"]["type"], "number");
        assert_eq!(s["properties"]["relevance"]["minimum"], 0);
        assert_eq!(s["properties"]["relevance"]["maximum"], 1);
        assert_eq!(s["required"], json!(["speak", "relevance"]));
        assert_eq!(s["additionalProperties"], false);
    }
}
