//! Drafting calls (`LlmClient::draft`, one streamed completion read as a verdict line
//! and a reply) against the scripted fake server's streaming answers.

use std::time::Duration;

use botmesh::llm::{parse_verdict, ChatMessage, Endpoint, LlmClient, LlmError, Verdict};
use botmesh_tests::fake_llm::{approx_tokens, sequence, BotLlm, FakeLlm, Script};
use botmesh_tests::wait_for;

fn client() -> LlmClient {
    LlmClient::new(LlmClient::build_http(Duration::from_secs(2)).expect("http client"))
}

fn endpoint(base_url: &str) -> Endpoint {
    let mut ep = Endpoint::new(base_url, "test-model");
    ep.timeout = Duration::from_secs(30);
    ep
}

fn chat() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("you are a helpful bot"),
        ChatMessage::user("alice: anyone know rust?"),
    ]
}

/// The fake's usage for `chat()` and an answer `text`.
fn prompt_tokens() -> u64 {
    chat().iter().map(|m| approx_tokens(&m.content)).sum()
}

const VERDICT: &str = "{\"speak\": true, \"relevance\": 0.9}";
const REPLY: &str = "Rust is great for this, and\nhere is how I would start.";

/// A drafting answer: the verdict line, then a two-line reply.
fn answer() -> String {
    format!("{VERDICT}\n{REPLY}")
}

/// Starts a drafting call against `fake` and checks its head is the verdict; the
/// drafting, its rest still to come.
async fn draft_verdict(fake: &FakeLlm) -> botmesh::llm::Drafting {
    let drafting = client()
        .draft(&endpoint(&fake.base_url), &chat())
        .await
        .unwrap();
    assert_eq!(drafting.head, VERDICT);
    drafting
}

/// A drafting call against a fake answering `script` to every request: the call's
/// result, and how many requests the fake saw.
async fn drafted(
    script: Script,
    configure: impl FnOnce(&mut Endpoint),
) -> (Result<(String, botmesh::llm::Completion), LlmError>, usize) {
    let fake = FakeLlm::start(move |_| script.clone()).await;
    let mut ep = endpoint(&fake.base_url);
    configure(&mut ep);
    let result = match client().draft(&ep, &chat()).await {
        Ok(drafting) => drafting.rest.await.map(|rest| (drafting.head, rest)),
        Err(e) => Err(e),
    };
    let requests = fake.count();
    fake.shutdown().await;
    (result, requests)
}

#[tokio::test(start_paused = true)]
async fn head_arrives_before_the_rest_is_sent() {
    let fake = FakeLlm::start(|_| Script::stream(answer(), Duration::from_secs(2))).await;
    let mut ep = endpoint(&fake.base_url);
    ep.json_schema = true;
    let drafting = client().draft(&ep, &chat()).await.unwrap();
    assert_eq!(drafting.head, VERDICT);
    assert_eq!(
        parse_verdict(&drafting.head),
        Some(Verdict {
            speak: true,
            relevance: 0.9
        })
    );
    // The head came while the fake was still pausing before the rest.
    let streams = fake.streams();
    assert_eq!(streams.len(), 1);
    assert!(!streams[0].completed, "{streams:?}");
    assert!(streams[0].written < streams[0].chunks, "{streams:?}");

    let rest = drafting.rest.await.unwrap();
    assert_eq!(rest.text, REPLY);
    assert_eq!(rest.attempts, 1);
    assert_eq!(rest.usage.prompt_tokens, prompt_tokens());
    assert_eq!(rest.usage.completion_tokens, approx_tokens(&answer()));
    let streams = fake.streams();
    assert!(streams[0].completed, "{streams:?}");
    assert_eq!(streams[0].written, streams[0].chunks);

    let seen = &fake.requests()[0];
    assert!(seen.stream);
    assert_eq!(seen.purpose_hint.as_deref(), Some("draft"));
    assert_eq!(seen.body["stream"], true);
    assert_eq!(seen.body["stream_options"]["include_usage"], true);
    assert!(seen.body.get("response_format").is_none());
    assert_eq!(seen.model, "test-model");
    fake.shutdown().await;
}

#[tokio::test]
async fn plain_reply_script_streams_without_pause() {
    let (result, requests) = drafted(Script::reply(answer()), |_| {}).await;
    let (head, rest) = result.unwrap();
    assert_eq!(head, VERDICT);
    assert_eq!(rest.text, REPLY);
    assert_eq!(requests, 1);
}

#[tokio::test]
async fn answer_without_newline_is_all_head() {
    let (result, _) = drafted(Script::reply("  {\"speak\": false} "), |_| {}).await;
    let (head, rest) = result.unwrap();
    assert_eq!(head, "{\"speak\": false}");
    assert_eq!(rest.text, "");
    assert_eq!(rest.usage.completion_tokens, 2);
}

#[tokio::test]
async fn server_that_does_not_stream_is_read_whole() {
    let body = serde_json::json!({
        "choices": [{"message": {"role": "assistant", "content": answer()}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 17},
    });
    let (result, requests) = drafted(
        Script::Raw {
            status: 200,
            headers: vec![],
            body: body.to_string(),
        },
        |_| {},
    )
    .await;
    let (head, rest) = result.unwrap();
    assert_eq!(head, VERDICT);
    assert_eq!(rest.text, REPLY);
    assert_eq!(rest.usage.prompt_tokens, 40);
    assert_eq!(rest.usage.completion_tokens, 17);
    assert_eq!(requests, 1);
}

#[tokio::test]
async fn server_error_then_stream_is_retried() {
    let fake = FakeLlm::start(sequence(vec![
        Script::Status(500),
        Script::Status(503),
        Script::reply(answer()),
    ]))
    .await;
    let drafting = draft_verdict(&fake).await;
    let rest = drafting.rest.await.unwrap();
    assert_eq!(rest.attempts, 3);
    assert_eq!(fake.count(), 3);
    fake.shutdown().await;
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let (result, requests) = drafted(Script::Status(400), |_| {}).await;
    match result {
        Err(LlmError::Http { status: 400, .. }) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(requests, 1);
}

#[tokio::test(start_paused = true)]
async fn slow_head_times_out_without_retry() {
    let (result, requests) = drafted(
        Script::delay(Duration::from_secs(60), Script::reply(answer())),
        |ep| ep.timeout = Duration::from_secs(5),
    )
    .await;
    assert!(matches!(result, Err(LlmError::Timeout)), "{result:?}");
    assert_eq!(requests, 1);
}

#[tokio::test(start_paused = true)]
async fn slow_rest_times_out_in_the_rest() {
    let fake = FakeLlm::start(|_| Script::stream(answer(), Duration::from_secs(60))).await;
    let mut ep = endpoint(&fake.base_url);
    ep.timeout = Duration::from_secs(5);
    let drafting = client().draft(&ep, &chat()).await.unwrap();
    assert_eq!(drafting.head, VERDICT);
    let err = drafting.rest.await.unwrap_err();
    assert!(matches!(err, LlmError::Timeout), "{err}");
    assert_eq!(fake.count(), 1);
    fake.shutdown().await;
}

/// A body a server might stream: a comment, a role chunk, reasoning (not part of the
/// answer), content in pieces with CRLF line ends in one event, no usage chunk.
const RAW_BODY: &str = concat!(
    ": ping\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"let me see\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{\\\"speak\\\": tr\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ue}\\n\"}}]}\r\n\r\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"你好, 世界\"},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
);

#[tokio::test]
async fn events_split_across_awkward_pieces() {
    for piece in [1, 2, 3, 7, 64] {
        let (result, _) = drafted(
            Script::RawStream {
                body: RAW_BODY.to_string(),
                piece,
            },
            |_| {},
        )
        .await;
        let (head, rest) = result.unwrap();
        assert_eq!(head, "{\"speak\": true}", "piece {piece}");
        assert_eq!(rest.text, "你好, 世界", "piece {piece}");
        // No usage chunk: estimated at four characters a token, rounded up.
        let prompt_chars: usize = chat().iter().map(|m| m.content.chars().count()).sum();
        assert_eq!(rest.usage.prompt_tokens, prompt_chars.div_ceil(4) as u64);
        let answer_chars = "{\"speak\": true}\n你好, 世界".chars().count();
        assert_eq!(
            rest.usage.completion_tokens,
            answer_chars.div_ceil(4) as u64
        );
    }
}

#[tokio::test]
async fn think_block_is_stripped() {
    let text = format!("<think>the user asks\nabout rust</think>\n\n{}", answer());
    let (result, _) = drafted(Script::reply(text), |_| {}).await;
    let (head, rest) = result.unwrap();
    assert_eq!(head, VERDICT);
    assert_eq!(rest.text, REPLY);
}

#[tokio::test]
async fn error_event_before_the_head_fails_the_call() {
    let body = "data: {\"error\":{\"message\":\"model overloaded\"}}\n\ndata: [DONE]\n\n";
    let (result, requests) = drafted(
        Script::RawStream {
            body: body.into(),
            piece: 1000,
        },
        |_| {},
    )
    .await;
    match result {
        Err(e @ LlmError::BadResponse(_)) => assert!(e.to_string().contains("overloaded"), "{e}"),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(requests, 1, "a failure in a 200 body is not retried");
}

#[tokio::test]
async fn error_event_after_the_head_fails_the_rest() {
    let body = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"{\\\"speak\\\": true}\\n\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n",
        "data: {\"error\":{\"message\":\"context length exceeded\"}}\n\n",
    );
    let fake = FakeLlm::start(move |_| Script::RawStream {
        body: body.into(),
        piece: 1000,
    })
    .await;
    let drafting = client()
        .draft(&endpoint(&fake.base_url), &chat())
        .await
        .unwrap();
    assert_eq!(drafting.head, "{\"speak\": true}");
    let err = drafting.rest.await.unwrap_err();
    assert_eq!(err.label(), "bad_response", "{err}");
    assert!(err.to_string().contains("context length"), "{err}");
    assert_eq!(fake.count(), 1);
    fake.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_rest_closes_the_connection() {
    let long_reply = "word ".repeat(200);
    let text = format!("{VERDICT}\n{long_reply}");
    let fake = FakeLlm::start(move |_| Script::stream(text.clone(), Duration::from_secs(2))).await;
    let drafting = draft_verdict(&fake).await;
    let written_at_head = fake.streams()[0].written;
    drop(drafting.rest);
    let streams = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async { fake.streams() },
        |s| s[0].abandoned,
    )
    .await;
    assert!(
        streams[0].abandoned,
        "the fake never saw the client go: {streams:?}"
    );
    assert!(!streams[0].completed, "{streams:?}");
    assert_eq!(streams[0].written, written_at_head, "{streams:?}");
    assert!(streams[0].written < streams[0].chunks, "{streams:?}");
    fake.shutdown().await;
}

#[tokio::test]
async fn bot_llm_answers_drafting_calls_with_verdict_and_reply() {
    let fake = BotLlm::judging(true, 0.7)
        .judge("Quiet", false, 0.1)
        .replies(|bot| format!("{bot} here"))
        .start()
        .await;
    let ep = endpoint(&fake.base_url);
    let for_bot = |bot: &str| {
        vec![
            ChatMessage::system(format!("You are {bot}, a colleague.")),
            ChatMessage::user("alice: anyone know rust?"),
        ]
    };
    let loud = client().draft(&ep, &for_bot("Loud")).await.unwrap();
    assert_eq!(
        parse_verdict(&loud.head),
        Some(Verdict {
            speak: true,
            relevance: 0.7
        })
    );
    assert_eq!(loud.rest.await.unwrap().text, "Loud here");
    let quiet = client().draft(&ep, &for_bot("Quiet")).await.unwrap();
    assert_eq!(parse_verdict(&quiet.head).map(|v| v.speak), Some(false));
    assert_eq!(quiet.rest.await.unwrap().text, "");
    assert_eq!(fake.draft_bots(), vec!["Loud", "Quiet"]);
    assert!(fake.reply_bots().is_empty());
    assert!(fake.judge_bots().is_empty());
    fake.shutdown().await;
}

#[tokio::test]
async fn event_stream_without_chunks_is_bad_response() {
    let (result, requests) = drafted(
        Script::RawStream {
            body: "{\"error\": \"not an event\"}\n: ping\n\n".into(),
            piece: 1000,
        },
        |_| {},
    )
    .await;
    assert!(
        matches!(result, Err(LlmError::BadResponse(_))),
        "{result:?}"
    );
    assert_eq!(requests, 1);
}

#[tokio::test]
async fn finished_stream_leaves_the_connection_for_the_next_call() {
    let fake = FakeLlm::start(|_| Script::reply(answer())).await;
    let ep = endpoint(&fake.base_url);
    let client = client();
    for _ in 0..3 {
        let drafting = client.draft(&ep, &chat()).await.unwrap();
        assert_eq!(drafting.rest.await.unwrap().text, REPLY);
    }
    assert_eq!(fake.count(), 3);
    assert_eq!(fake.connections(), 1, "each call opened its own connection");
    fake.shutdown().await;
}

#[tokio::test]
async fn rate_limit_with_retry_after_then_stream_is_retried() {
    let fake = FakeLlm::start(sequence(vec![
        Script::Raw {
            status: 429,
            headers: vec![("Retry-After".into(), "0".into())],
            body: "{\"error\":{\"message\":\"slow down\"}}".into(),
        },
        Script::reply(answer()),
    ]))
    .await;
    let drafting = draft_verdict(&fake).await;
    assert_eq!(drafting.rest.await.unwrap().attempts, 2);
    assert_eq!(fake.count(), 2);
    fake.shutdown().await;
}

#[tokio::test]
async fn connection_refused_is_transport_after_retries() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut ep = endpoint(&format!("http://{addr}/v1"));
    ep.retries = 1;
    let err = match client().draft(&ep, &chat()).await {
        Ok(_) => panic!("nothing listens there"),
        Err(e) => e,
    };
    assert_eq!(err.label(), "transport", "{err}");
}

#[tokio::test]
async fn stream_script_answers_a_plain_call_whole() {
    let fake = FakeLlm::start(|_| Script::stream(answer(), Duration::from_secs(60))).await;
    let completion = client()
        .complete(
            &endpoint(&fake.base_url),
            botmesh::llm::Purpose::Reply,
            &chat(),
        )
        .await
        .unwrap();
    assert_eq!(completion.text, answer());
    assert!(!fake.requests()[0].stream);
    assert!(fake.streams().is_empty());
    fake.shutdown().await;
}
