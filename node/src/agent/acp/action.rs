//! What a tool call would do, in the words people read in the chat ("edit
//! notes.txt", "run `cargo test`", "fetch https://…"): the permission question
//! ("Coder wants to edit notes.txt") and the line saying a call was rejected
//! ("couldn't fetch https://…: not allowed here") both use [`tool_action`].
//!
//! It is made from the ACP tool call's `kind`, and what its kind makes the best
//! object: the first of its `locations` (a file, shown relative to the agent's `cwd`
//! when inside it) for file kinds, `rawInput.command` for `execute`, `rawInput.url`
//! for `fetch`; its `title` when the agent gave nothing better.

use std::path::Path;

use serde_json::Value;

use super::messages::schema::ToolCallLocation;
use super::ToolKind;

/// The most characters of an action's object (a path, a command, a URL) shown.
const MAX_OBJECT_CHARS: usize = 120;

/// What the agent said a tool call works on, as last given (by its `tool_call`
/// updates or the permission request): what [`tool_action`] names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolObject {
    /// The files it touches (ACP's `locations`).
    pub locations: Vec<ToolCallLocation>,
    /// Its input as the agent gave it (ACP's `rawInput`: any JSON, by the spec).
    pub raw_input: Option<Value>,
}

/// The tool call's action as a verb phrase: `edit notes.txt`, ``run `cargo test` ``,
/// `fetch https://example.com`, `use <title>` for a kind without a verb of its own.
/// `title` is already bounded.
pub fn tool_action(kind: ToolKind, title: &str, call: &ToolObject, cwd: &Path) -> String {
    let title = if title.trim().is_empty() {
        "an untitled tool"
    } else {
        title.trim()
    };
    let path = first_location(&call.locations, cwd);
    let input = |key: &str| -> Option<String> {
        match call.raw_input.as_ref()?.get(key)? {
            Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
            // A command given as its argument list.
            Value::Array(parts) if !parts.is_empty() => Some(
                parts
                    .iter()
                    .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_string))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            _ => None,
        }
    };
    let object = |found: Option<String>| shorten(&found.unwrap_or_else(|| title.to_string()));
    match kind {
        ToolKind::Edit => format!("edit {}", object(path)),
        ToolKind::Read => format!("read {}", object(path)),
        ToolKind::Delete => format!("delete {}", object(path)),
        ToolKind::Move => format!("move {}", object(path)),
        ToolKind::Search => format!("search {}", object(input("query").or(path))),
        ToolKind::Execute => format!("run `{}`", object(input("command")).replace('`', "'")),
        ToolKind::Fetch => format!("fetch {}", object(input("url"))),
        ToolKind::Think | ToolKind::Other => format!("use {}", shorten(title)),
    }
}

/// The first of the call's `locations` as a path, relative to `cwd` when inside it.
fn first_location(locations: &[ToolCallLocation], cwd: &Path) -> Option<String> {
    let path = &locations.first()?.path;
    let shown = path
        .strip_prefix(cwd)
        .ok()
        .filter(|rel| !rel.as_os_str().is_empty())
        .unwrap_or(path);
    Some(shown.display().to_string())
}

/// `text` on one line, at most [`MAX_OBJECT_CHARS`] characters (`…` when cut).
fn shorten(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= MAX_OBJECT_CHARS {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(MAX_OBJECT_CHARS - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The action of a call described the way an agent sends it (`locations`,
    /// `rawInput`), read as ACP's tool call fields.
    fn action(kind: ToolKind, title: &str, call: Value) -> String {
        let fields: crate::agent::acp::schema::ToolCallUpdateFields =
            serde_json::from_value(call).expect("tool call fields");
        let object = ToolObject {
            locations: fields.locations.unwrap_or_default(),
            raw_input: fields.raw_input,
        };
        tool_action(kind, title, &object, Path::new("/work/repo"))
    }

    #[test]
    fn each_kind_says_what_it_would_do_with_its_best_object() {
        let file = json!({"locations": [{"path": "/work/repo/notes.txt"}]});
        assert_eq!(
            action(ToolKind::Edit, "Edit", file.clone()),
            "edit notes.txt"
        );
        assert_eq!(
            action(ToolKind::Read, "Read", file.clone()),
            "read notes.txt"
        );
        assert_eq!(action(ToolKind::Delete, "rm", file), "delete notes.txt");
        let outside = json!({"locations": [{"path": "/etc/passwd", "line": 3}]});
        assert_eq!(action(ToolKind::Read, "Read", outside), "read /etc/passwd");
        assert_eq!(
            action(
                ToolKind::Execute,
                "bash",
                json!({"rawInput": {"command": "cargo test"}})
            ),
            "run `cargo test`"
        );
        assert_eq!(
            action(
                ToolKind::Execute,
                "bash",
                json!({"rawInput": {"command": ["git", "status"]}})
            ),
            "run `git status`"
        );
        assert_eq!(
            action(
                ToolKind::Fetch,
                "webfetch",
                json!({"rawInput": {"url": "https://example.com/a"}})
            ),
            "fetch https://example.com/a"
        );
        assert_eq!(
            action(
                ToolKind::Search,
                "grep",
                json!({"rawInput": {"query": "TODO"}})
            ),
            "search TODO"
        );
        // Without a better object, the title; a kind without a verb is "use".
        assert_eq!(
            action(ToolKind::Edit, "Edit a.rs", json!({})),
            "edit Edit a.rs"
        );
        assert_eq!(
            action(ToolKind::Execute, "ls `x`", json!({})),
            "run `ls 'x'`"
        );
        assert_eq!(
            action(ToolKind::Other, "mcp: time", json!({})),
            "use mcp: time"
        );
        assert_eq!(
            action(ToolKind::Think, "  ", json!({})),
            "use an untitled tool"
        );
    }

    #[test]
    fn a_long_object_is_cut_on_one_line() {
        let long = format!("echo {}\nrm -rf /", "x".repeat(500));
        let said = action(
            ToolKind::Execute,
            "bash",
            json!({"rawInput": {"command": long}}),
        );
        assert!(said.chars().count() <= MAX_OBJECT_CHARS + 6, "{said}");
        assert!(said.ends_with("…`") && !said.contains('\n'), "{said}");
    }
}
