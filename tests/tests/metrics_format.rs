//! `GET /metrics` is OpenMetrics text and says so: a real OpenMetrics parser (the Python
//! `prometheus_client` package, installed into .venv-test/ by scripts/test.sh) reads a scrape
//! and finds the counters with their help text and samples.

use std::time::Duration;

use botmesh_tests::openmetrics::parse_openmetrics;
use botmesh_tests::{metric, MeshSpec, TestMesh};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The interpreter of the venv scripts/test.sh makes.
fn test_python() -> String {
    std::env::var("BOTMESH_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "BOTMESH_TEST_PYTHON is not set: run scripts/test.sh, which creates .venv-test/ \
             with the Python packages this test needs (prometheus_client) and sets it"
        )
    })
}

#[tokio::test]
async fn metrics_are_openmetrics_that_a_real_parser_reads() {
    let python = test_python();
    let mesh = TestMesh::start(MeshSpec::new(&["A", "B"])).await;
    mesh.post_human(0, "alice", "hello, colleagues").await;
    // Wait (a bounded number of scrapes) until B has counted the envelope A broadcast.
    for _ in 0..200 {
        let m = mesh.metrics(1).await;
        if metric(&m, r#"botmesh_envelopes_in_total{result="accepted"}"#) >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let resp = mesh
        .http
        .get(format!("{}/metrics", mesh.api(1)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some(OPENMETRICS),
        "the body is OpenMetrics text and must be served as such"
    );
    let text = resp.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");

    let families = parse_openmetrics(&python, &text);
    let families = families.as_array().expect("a list of families");
    let family = |name: &str| {
        families
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no family {name} in the parsed scrape:\n{text}"))
    };

    let env_in = family("botmesh_envelopes_in");
    assert_eq!(env_in["type"], "counter", "{env_in}");
    assert!(
        !env_in["help"].as_str().unwrap_or("").is_empty(),
        "help text: {env_in}"
    );
    let accepted = env_in["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "botmesh_envelopes_in_total" && s["labels"]["result"] == "accepted")
        .unwrap_or_else(|| panic!("no accepted sample: {env_in}"));
    assert!(accepted["value"].as_f64().unwrap() >= 1.0, "{accepted}");

    // Every counter the node exports parses as one, with help text; the ones with
    // samples name them `<family>_total` (or `_created`).
    let counters: Vec<_> = families.iter().filter(|f| f["type"] == "counter").collect();
    assert!(counters.len() >= 5, "counters: {counters:?}");
    for f in counters {
        let name = f["name"].as_str().unwrap();
        assert!(!name.ends_with("_total"), "family name without _total: {f}");
        assert!(!f["help"].as_str().unwrap_or("").is_empty(), "help: {f}");
        for s in f["samples"].as_array().unwrap() {
            let sample = s["name"].as_str().unwrap();
            assert!(
                sample == format!("{name}_total") || sample == format!("{name}_created"),
                "sample {sample} of counter {name}"
            );
        }
    }
    mesh.shutdown().await;
}
