//! The LLM client exercised against the scripted fake server.

use std::time::{Duration, Instant};

use botmesh::llm::{parse_verdict, ChatMessage, Endpoint, LlmClient, LlmError, Purpose, Verdict};
use botmesh_tests::fake_llm::{approx_tokens, sequence, BotLlm, FakeLlm, Script};

fn client() -> LlmClient {
    LlmClient::new(LlmClient::build_http(Duration::from_secs(2)).expect("http client"))
}

fn endpoint(base_url: &str) -> Endpoint {
    let mut ep = Endpoint::new(base_url, "test-model");
    ep.timeout = Duration::from_secs(5);
    ep
}

fn chat() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("you are a helpful bot"),
        ChatMessage::user("alice: anyone know rust?"),
    ]
}

/// A reply call through an endpoint set up by `configure`, against a fake that answers
/// `script` to every request: the error the call ends in, and how many requests the
/// fake saw.
///
/// Exists because the failure tests differ only in the script, the endpoint and what
/// they check of the error.
async fn failed_reply(script: Script, configure: impl FnOnce(&mut Endpoint)) -> (LlmError, usize) {
    let fake = FakeLlm::start(move |_| script.clone()).await;
    let mut ep = endpoint(&fake.base_url);
    configure(&mut ep);
    let err = client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap_err();
    let requests = fake.count();
    fake.shutdown().await;
    (err, requests)
}

/// What a call that succeeded after retries came to ([`retried`]).
struct Retried {
    text: String,
    attempts: u32,
    /// Requests the fake saw.
    requests: usize,
    elapsed: Duration,
}

/// A call of `purpose` through an endpoint set up by `configure`, against a fake that
/// plays `scripts` in order ([`sequence`]); the call must succeed in the end.
///
/// Exists because the retry tests differ only in the scripts played before the answer,
/// the endpoint and the timing they check.
async fn retried(
    scripts: Vec<Script>,
    purpose: Purpose,
    configure: impl FnOnce(&mut Endpoint),
) -> Retried {
    let fake = FakeLlm::start(sequence(scripts)).await;
    let mut ep = endpoint(&fake.base_url);
    configure(&mut ep);
    let started = Instant::now();
    let completion = client().complete(&ep, purpose, &chat()).await.unwrap();
    let elapsed = started.elapsed();
    let requests = fake.count();
    fake.shutdown().await;
    Retried {
        text: completion.text,
        attempts: completion.attempts,
        requests,
        elapsed,
    }
}

/// A port on 127.0.0.1 that nothing listens on.
async fn closed_port_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/v1")
}

#[tokio::test]
async fn judge_sends_response_format_and_parses() {
    let fake = BotLlm::judging(true, 0.8)
        .replies(|_| "not a verdict".into())
        .start()
        .await;
    let mut ep = endpoint(&fake.base_url);
    ep.json_schema = true;
    ep.max_tokens = 32;
    ep.temperature = Some(0.0);
    let completion = client()
        .complete(&ep, Purpose::Judge, &chat())
        .await
        .unwrap();
    assert_eq!(
        parse_verdict(&completion.text),
        Some(Verdict {
            speak: true,
            relevance: 0.8
        })
    );
    assert_eq!(completion.attempts, 1);

    let seen = &fake.requests()[0];
    assert_eq!(seen.purpose_hint.as_deref(), Some("judge"));
    assert_eq!(seen.model, "test-model");
    assert_eq!(
        seen.messages[1],
        ("user".to_string(), "alice: anyone know rust?".to_string())
    );
    let rf = &seen.body["response_format"];
    assert_eq!(rf["type"], "json_schema");
    assert_eq!(rf["json_schema"]["name"], "verdict");
    assert_eq!(rf["json_schema"]["strict"], true);
    assert_eq!(rf["json_schema"]["schema"], botmesh::llm::verdict_schema());
    assert_eq!(seen.body["max_tokens"], 32);
    assert_eq!(seen.body["temperature"], 0.0);
    assert_eq!(seen.body["stream"], false);
    fake.shutdown().await;
}

#[tokio::test]
async fn reply_never_sends_response_format() {
    let fake = FakeLlm::start(|_| Script::reply("hello")).await;
    let mut ep = endpoint(&fake.base_url);
    ep.json_schema = true;
    let completion = client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap();
    assert_eq!(completion.text, "hello");
    let seen = &fake.requests()[0];
    assert_eq!(seen.purpose_hint.as_deref(), Some("reply"));
    assert!(seen.body.get("response_format").is_none());
    assert!(seen.body.get("temperature").is_none());
    fake.shutdown().await;
}

#[tokio::test]
async fn judge_without_schema_still_parses_prose() {
    let fake = FakeLlm::start(|_| Script::reply("Sure:\n```json\n{\"Speak\": \"no\"}\n```")).await;
    let ep = endpoint(&fake.base_url);
    let completion = client()
        .complete(&ep, Purpose::Judge, &chat())
        .await
        .unwrap();
    assert!(fake.requests()[0].body.get("response_format").is_none());
    assert_eq!(
        parse_verdict(&completion.text),
        Some(Verdict {
            speak: false,
            relevance: 0.0
        })
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn usage_is_returned() {
    let fake = FakeLlm::start(|_| Script::reply("one two three")).await;
    let completion = client()
        .complete(&endpoint(&fake.base_url), Purpose::Reply, &chat())
        .await
        .unwrap();
    let expected_prompt: u64 = chat().iter().map(|m| approx_tokens(&m.content)).sum();
    assert_eq!(completion.usage.prompt_tokens, expected_prompt);
    assert_eq!(completion.usage.completion_tokens, 3);
    fake.shutdown().await;
}

#[tokio::test]
async fn server_error_then_success_is_retried() {
    let call = retried(
        vec![Script::Status(500), Script::reply("ok")],
        Purpose::Reply,
        |_| {},
    )
    .await;
    assert_eq!(call.text, "ok");
    assert_eq!(call.attempts, 2);
    assert_eq!(call.requests, 2);
}

fn rate_limited(retry_after: &str) -> Script {
    Script::Raw {
        status: 429,
        headers: vec![("Retry-After".into(), retry_after.into())],
        body: "{\"error\":{\"message\":\"slow down\"}}".into(),
    }
}

#[tokio::test]
async fn rate_limit_with_retry_after_zero_is_retried_at_once() {
    let call = retried(
        vec![
            rate_limited("0"),
            rate_limited("0"),
            rate_limited("0"),
            Script::reply("ok"),
        ],
        Purpose::Judge,
        |ep| ep.retries = 3,
    )
    .await;
    assert_eq!(call.attempts, 4);
    assert_eq!(call.requests, 4);
    // Computed backoff would total at least 160 + 320 + 640 ms; Retry-After: 0 wins.
    assert!(
        call.elapsed < Duration::from_millis(700),
        "{:?}",
        call.elapsed
    );
}

#[tokio::test]
async fn retry_after_seconds_is_honored() {
    let call = retried(
        vec![rate_limited("1"), Script::reply("ok")],
        Purpose::Reply,
        |_| {},
    )
    .await;
    assert_eq!(call.attempts, 2);
    assert!(
        call.elapsed >= Duration::from_millis(950),
        "{:?}",
        call.elapsed
    );
}

#[tokio::test]
async fn rate_limit_without_retry_after_uses_backoff() {
    let call = retried(
        vec![Script::Status(429), Script::reply("ok")],
        Purpose::Reply,
        |_| {},
    )
    .await;
    assert_eq!(call.attempts, 2);
    assert!(
        call.elapsed >= Duration::from_millis(150),
        "{:?}",
        call.elapsed
    );
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let (err, requests) = failed_reply(Script::Status(400), |_| {}).await;
    assert!(matches!(err, LlmError::Http { status: 400, .. }), "{err}");
    assert_eq!(err.label(), "http_4xx");
    assert_eq!(requests, 1);
}

#[tokio::test]
async fn persistent_server_error_exhausts_retries() {
    let (err, requests) = failed_reply(Script::Status(503), |ep| ep.retries = 2).await;
    assert!(matches!(err, LlmError::Http { status: 503, .. }), "{err}");
    assert_eq!(err.label(), "http_5xx");
    assert_eq!(requests, 3);
}

#[tokio::test]
async fn zero_retries_means_one_attempt() {
    let (err, requests) = failed_reply(Script::Status(502), |ep| ep.retries = 0).await;
    assert_eq!(err.label(), "http_5xx");
    assert_eq!(requests, 1);
}

#[tokio::test]
async fn error_body_is_truncated() {
    let long = "x".repeat(1000);
    let (err, _) = failed_reply(
        Script::Raw {
            status: 422,
            headers: vec![],
            body: long,
        },
        |_| {},
    )
    .await;
    match err {
        LlmError::Http { status, body } => {
            assert_eq!(status, 422);
            assert_eq!(body.chars().count(), 200);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn hang_times_out_without_retry() {
    let fake = FakeLlm::start(|_| Script::Hang).await;
    let mut ep = endpoint(&fake.base_url);
    ep.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let err = client()
        .complete(&ep, Purpose::Judge, &chat())
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(err, LlmError::Timeout), "{err}");
    assert_eq!(err.label(), "timeout");
    assert!(elapsed >= Duration::from_millis(290), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
    assert_eq!(fake.count(), 1);
    fake.shutdown().await;
}

#[tokio::test]
async fn slow_answer_within_timeout_succeeds() {
    let fake = FakeLlm::start(|_| {
        Script::delay(Duration::from_millis(100), Script::reply("late but fine"))
    })
    .await;
    let mut ep = endpoint(&fake.base_url);
    ep.timeout = Duration::from_millis(1000);
    let completion = client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap();
    assert_eq!(completion.text, "late but fine");
    fake.shutdown().await;
}

#[tokio::test]
async fn delay_past_timeout_is_a_timeout() {
    let (err, requests) = failed_reply(
        Script::delay(Duration::from_secs(5), Script::reply("too late")),
        |ep| ep.timeout = Duration::from_millis(200),
    )
    .await;
    assert!(matches!(err, LlmError::Timeout), "{err}");
    assert_eq!(requests, 1);
}

#[tokio::test]
async fn connection_refused_is_transport_after_retries() {
    let url = closed_port_url().await;
    let mut ep = endpoint(&url);
    ep.retries = 2;
    let started = Instant::now();
    let err = client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(err, LlmError::Transport(_)), "{err}");
    assert_eq!(err.label(), "transport");
    // Two backoffs happened: >= 160 ms + 320 ms with jitter.
    assert!(elapsed >= Duration::from_millis(450), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
}

#[tokio::test]
async fn connection_refused_without_retries_fails_fast() {
    let url = closed_port_url().await;
    let mut ep = endpoint(&url);
    ep.retries = 0;
    let started = Instant::now();
    let err = client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Transport(_)), "{err}");
    // No backoff sleep at all (the first one alone would be >= 160 ms).
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn bearer_header_sent_when_key_set() {
    let fake = FakeLlm::start(|_| Script::reply("ok")).await;
    let mut ep = endpoint(&fake.base_url);
    ep.api_key = Some("sk-test-key".into());
    client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap();
    assert_eq!(
        fake.requests()[0].authorization.as_deref(),
        Some("Bearer sk-test-key")
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn no_authorization_header_without_key() {
    let fake = FakeLlm::start(|_| Script::reply("ok")).await;
    let mut ep = endpoint(&fake.base_url);
    client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap();
    ep.api_key = Some(String::new());
    client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap();
    let seen = fake.requests();
    assert_eq!(seen[0].authorization, None);
    assert_eq!(seen[1].authorization, None, "empty key sends no header");
    fake.shutdown().await;
}

#[tokio::test]
async fn non_json_success_is_bad_response_and_not_retried() {
    let (err, requests) = failed_reply(
        Script::Raw {
            status: 200,
            headers: vec![],
            body: "<html>oops</html>".into(),
        },
        |_| {},
    )
    .await;
    assert!(matches!(err, LlmError::BadResponse(_)), "{err}");
    assert_eq!(err.label(), "bad_response");
    assert_eq!(requests, 1);
}

#[tokio::test]
async fn null_content_falls_back_to_reasoning_content() {
    let fake = FakeLlm::start(|_| Script::Raw {
        status: 200,
        headers: vec![],
        body: r#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,"reasoning_content":"{\"speak\": false, \"relevance\": 0.1}"},"finish_reason":"stop"}]}"#.into(),
    })
    .await;
    let completion = client()
        .complete(&endpoint(&fake.base_url), Purpose::Judge, &chat())
        .await
        .unwrap();
    assert_eq!(
        parse_verdict(&completion.text),
        Some(Verdict {
            speak: false,
            relevance: 0.1
        })
    );
    assert_eq!(completion.usage.prompt_tokens, 0, "missing usage is zero");
    fake.shutdown().await;
}

#[tokio::test]
async fn base_url_with_trailing_slash_works() {
    let fake = FakeLlm::start(|_| Script::reply("ok")).await;
    let ep = endpoint(&format!("{}/", fake.base_url));
    let completion = client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap();
    assert_eq!(completion.text, "ok");
    fake.shutdown().await;
}

#[tokio::test]
async fn shutdown_closes_the_port() {
    let fake = FakeLlm::start(|_| Script::reply("ok")).await;
    let ep = endpoint(&fake.base_url);
    client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap();
    fake.shutdown().await;
    let mut ep = ep;
    ep.retries = 0;
    let err = client()
        .complete(&ep, Purpose::Reply, &chat())
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Transport(_)), "{err}");
}

#[tokio::test]
async fn shutdown_releases_hanging_requests() {
    let fake = FakeLlm::start(|_| Script::Hang).await;
    let mut ep = endpoint(&fake.base_url);
    ep.timeout = Duration::from_secs(30);
    ep.retries = 0;
    let call = tokio::spawn(async move { client().complete(&ep, Purpose::Reply, &chat()).await });
    while fake.count() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    fake.shutdown().await;
    let result = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("hanging call released by shutdown")
        .unwrap();
    assert!(matches!(result, Err(LlmError::Transport(_))), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}
