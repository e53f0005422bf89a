//! Reading a `GET /metrics` scrape with a real OpenMetrics parser: the Python
//! `prometheus_client` package (in the test venv scripts/test.sh makes), its families
//! given back as JSON.
//!
//! Exists because more than one test (tests/tests/metrics_format.rs, feishu_ws.rs)
//! proves its scrape parses, and each ran its own copy of this.

use std::io::Write;
use std::process::{Command, Stdio};

/// Parses OpenMetrics text from stdin and prints the families as JSON.
const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    out.append({
        "name": f.name,
        "type": f.type,
        "help": f.documentation,
        "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples],
    })
json.dump(out, sys.stdout)
"#;

/// Parses OpenMetrics `text` with `python`'s `prometheus_client`; the families as JSON
/// (`name`, `type`, `help`, `samples`). Panics with the parser's stderr and the scrape
/// if it refuses it.
pub fn parse_openmetrics(python: &str, text: &str) -> serde_json::Value {
    let mut child = Command::new(python)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python} ({e}): run scripts/test.sh"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the scrape:\n{}\n--- scrape:\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("parser output is JSON")
}
