//! The fake server's own contract: response shape, routing, recording.

use std::time::Duration;

use botmesh_tests::fake_llm::{sequence, FakeLlm, Script};
use botmesh_tests::wait_for;
use serde_json::{json, Value};

#[tokio::test]
async fn reply_has_openai_shape() {
    let fake = FakeLlm::start(|_| Script::reply("hi there")).await;
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/chat/completions", fake.base_url))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "a b c"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body: Value = resp.json().await.unwrap();
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(body["model"], "m");
    assert_eq!(body["choices"][0]["index"], 0);
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], "hi there");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    assert_eq!(body["usage"]["completion_tokens"], 2);
    assert_eq!(body["usage"]["total_tokens"], 5);
    fake.shutdown().await;
}

#[tokio::test]
async fn status_has_json_error_body() {
    let fake = FakeLlm::start(|_| Script::Status(503)).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", fake.base_url))
        .json(&json!({"model": "m", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], 503);
    assert_eq!(body["error"]["type"], "server_error");
    fake.shutdown().await;
}

#[tokio::test]
async fn other_paths_are_404_and_not_recorded() {
    let fake = FakeLlm::start(|_| Script::reply("x")).await;
    let http = reqwest::Client::new();
    let resp = http
        .get(format!("{}/models", fake.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let resp = http
        .get(format!("{}/chat/completions", fake.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 405);
    assert_eq!(fake.count(), 0);
    fake.shutdown().await;
}

#[tokio::test]
async fn non_json_body_is_recorded_and_rejected() {
    let fake = FakeLlm::start(|_| Script::reply("x")).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", fake.base_url))
        .body("garbage")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let seen = fake.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, Value::Null);
    assert_eq!(seen[0].purpose_hint, None);
    fake.shutdown().await;
}

#[tokio::test]
async fn sequence_repeats_last_script() {
    let script = sequence(vec![Script::Status(500), Script::reply("ok")]);
    let fake = FakeLlm::start(script).await;
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let resp = http
            .post(format!("{}/chat/completions", fake.base_url))
            .json(&json!({"model": "m", "messages": []}))
            .send()
            .await
            .unwrap();
        statuses.push(resp.status().as_u16());
    }
    assert_eq!(statuses, vec![500, 200, 200]);
    fake.shutdown().await;
}

#[tokio::test]
async fn drop_stops_the_server() {
    let fake = FakeLlm::start(|_| Script::reply("x")).await;
    let url = format!("{}/chat/completions", fake.base_url);
    drop(fake);
    // Abort is asynchronous; give the runtime a moment to drop the listener.
    let refused = wait_for(
        Duration::from_secs(5),
        Duration::from_millis(10),
        || async {
            let result = reqwest::Client::new()
                .post(&url)
                .json(&json!({}))
                .timeout(Duration::from_millis(500))
                .send()
                .await;
            matches!(&result, Err(e) if e.is_connect())
        },
        |refused| *refused,
    )
    .await;
    assert!(refused, "listener still open after drop");
}
