//! The layer rule, executable: a module in one folder of `node/src` may use only the
//! folders below it (see the layer map in `lib.rs`). A new upward import fails here,
//! naming the file, the line and the two layers.

use std::path::{Path, PathBuf};

/// The layers, bottom first: each may use only those before it (and itself).
const LAYERS: &[&str] = &[
    "wire",
    "config",
    "telemetry",
    "store",
    "a2a",
    "agent",
    "llm",
    "egress",
    "engine",
    "turn",
    "ingress",
    "platform",
    "app",
    "simulate",
];

/// Layer of a top-level module name, if it is one.
fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == module)
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reads node/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a line without its `//` comment (good enough for this check: no
/// string in `node/src` spells `crate::` before a `//`).
fn code(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// `(line number, used layer)` for every `crate::<layer>` the file's code names,
/// including `use crate::{a, b}` groups.
fn uses(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_group = false;
    for (n, line) in text.lines().enumerate() {
        let line = code(line);
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            if let Some(group) = after.strip_prefix('{') {
                in_group = true;
                rest = group;
                continue;
            }
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push((n + 1, settings_layer(after).unwrap_or(name)));
            rest = after;
        }
        if in_group {
            for part in line.split([',', '{', '}']) {
                let first = part.trim().split("::").next().unwrap_or("");
                if rank(first).is_some() && !part.contains("crate::") {
                    out.push((n + 1, first.to_string()));
                }
            }
            if line.contains("};") {
                in_group = false;
            }
        }
    }
    out
}

/// An adapter's settings (`platform/<name>/settings.rs`: its `[bots.<name>]` table,
/// validation and secrets) belong to the config layer, though they live in the
/// adapter's folder: they use only the layers config may use, and config reads them.
/// `Some("config")` when `path` (what follows `crate::`) names one.
fn settings_layer(path: &str) -> Option<String> {
    let mut parts = path.split("::");
    (parts.next() == Some("platform")
        && parts.next().is_some_and(|p| !p.is_empty())
        && parts.next().is_some_and(|p| p.starts_with("settings")))
    .then(|| "config".to_string())
}

/// The layer of a file by its path below `src`: its top folder, except an adapter's
/// settings file, which is config ([`settings_layer`]).
fn layer_of(rel: &Path) -> String {
    let parts: Vec<&str> = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .collect();
    if let ["platform", _, "settings.rs"] = parts.as_slice() {
        return "config".to_string();
    }
    parts
        .first()
        .copied()
        .unwrap_or_default()
        .trim_end_matches(".rs")
        .to_string()
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut checked = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).expect("below src");
        let top = layer_of(rel);
        let Some(mine) = rank(&top) else {
            continue; // lib.rs, main.rs, fuzzing.rs sit above every layer
        };
        checked += 1;
        let text = std::fs::read_to_string(file).expect("reads source");
        for (line, used) in uses(&text) {
            if let Some(theirs) = rank(&used) {
                if theirs > mine {
                    violations.push(format!(
                        "{}:{line}: `{top}` uses `{used}`, a layer above it",
                        rel.display()
                    ));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} files found under {src:?}");
    assert!(
        violations.is_empty(),
        "upward imports (the layer map is in node/src/lib.rs):\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_check_sees_upward_imports() {
    let text = "use crate::app::node::Node;\nuse crate::{turn::Brain, wire};\n// crate::app in a comment\nlet x = crate::ingress::bridge::admit;";
    let found: Vec<String> = uses(text).into_iter().map(|(_, l)| l).collect();
    assert_eq!(found, ["app", "turn", "wire", "ingress"]);
}

#[test]
fn an_adapters_settings_are_config() {
    let text = "use crate::platform::telegram::settings::TelegramSettings;\nuse crate::platform::telegram::Telegram;";
    let found: Vec<String> = uses(text).into_iter().map(|(_, l)| l).collect();
    assert_eq!(found, ["config", "platform"]);
    assert_eq!(
        layer_of(Path::new("platform/telegram/settings.rs")),
        "config"
    );
    assert_eq!(layer_of(Path::new("platform/telegram/mod.rs")), "platform");
    assert_eq!(layer_of(Path::new("turn/brain.rs")), "turn");
}
