//! Drafting calls: one streamed chat completion read as a verdict line and a reply.
//!
//! [`draft`] sends the request `request_body` builds for [`Purpose::Draft`] with
//! `"stream": true` and `"stream_options": {"include_usage": true}`, and reads the
//! server-sent events of OpenAI's streaming format (`data: {chunk}` events separated by
//! blank lines, ended by `data: [DONE]`). It returns as soon as the answer holds a
//! complete first line; the rest of the same response is read by [`Drafting::rest`].
//!
//! - Retries: as for [`LlmClient::complete`] (429, 5xx, failures to connect; same
//!   `ep.retries`, backoff and `Retry-After`), but only until a success status arrives:
//!   once a 200 body is being read, a failure is final (the head's, or the rest's).
//! - Time: `ep.timeout` bounds each attempt up to its head, and the whole call (head and
//!   rest) from the start of the attempt that produced the head; both are tokio timers.
//! - Cancelling: the rest future owns the response; dropping it unfinished drops the
//!   body, which closes the connection, so the server stops generating.
//! - A server that ignores `stream` and answers `application/json` is read whole and
//!   split with [`split_head`].
//! - Only `choices[0].delta.content` is the answer (`reasoning_content` is skipped), and
//!   a leading `<think>…</think>` block is removed as [`LlmClient::complete`] does.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::time::Instant as TokioInstant;

use super::{
    bounded, classify_transport, content_text, estimate_tokens, head_and_rest, parse_answer,
    request_body, split_head, strip_think, truncate_chars, usage_of, with_retries, Attempt,
    ChatMessage, Completion, Drafting, Endpoint, LlmClient, LlmError, Purpose, ToolCall, ToolSpec,
    Usage, ERROR_BODY_LIMIT,
};

/// Most bytes a drafting response body may hold; past it the answer is unusable
/// ([`LlmError::BadResponse`]), so a runaway server cannot fill memory.
const MAX_STREAM_BYTES: usize = 4 << 20;
/// How long a finished answer's body is read on after `[DONE]` for its end
/// ([`DraftStream::release`]).
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// What an attempt of a drafting call came to once it had a head (or had ended).
enum Opened {
    /// The server answered `application/json`: the whole answer, already read (its
    /// tool calls too).
    Whole(String, Usage, Vec<ToolCall>),
    /// A stream whose first line is complete: the head, and the stream to read on.
    Streaming(String, Box<DraftStream>),
    /// A stream that ended before any line was complete: its whole answer and usage.
    Ended(Box<DraftStream>),
}

/// See the module documentation.
pub(super) async fn draft(
    client: &LlmClient,
    ep: &Endpoint,
    messages: &[ChatMessage],
    tools: &[ToolSpec],
) -> Result<Drafting, LlmError> {
    let url = ep.chat_url();
    let mut body = request_body(ep, Purpose::Draft, messages);
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools.iter().map(ToolSpec::wire).collect());
    }
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let prompt_chars: usize = messages.iter().map(|m| m.content.chars().count()).sum();
    let mut deadline = TokioInstant::now();
    let done = with_retries(ep, Purpose::Draft, || {
        deadline = TokioInstant::now() + ep.timeout;
        bounded(ep.timeout, open(client, ep, &url, &body))
    })
    .await?;
    let attempts = done.attempts;
    let log_done = |usage: &Usage, how: &str| {
        tracing::debug!(
            purpose = Purpose::Draft.as_str(),
            model = %ep.model,
            status = done.status,
            attempt = attempts,
            latency_ms = done.latency_ms,
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            how,
            "llm draft complete"
        );
    };
    let (head, rest) = match done.value {
        Opened::Whole(text, usage, calls) => {
            log_done(&usage, "not streamed: whole answer split");
            let (head, rest) = split_head(&text);
            (head, ready(rest, usage, attempts, calls))
        }
        Opened::Ended(stream) => {
            let (head, rest, usage) = stream.answer.finish(prompt_chars);
            log_done(&usage, "stream ended with the head");
            let calls = stream.answer.tool_calls();
            (head, ready(rest, usage, attempts, calls))
        }
        Opened::Streaming(head, mut stream) => {
            tracing::debug!(
                purpose = Purpose::Draft.as_str(),
                model = %ep.model,
                status = done.status,
                attempt = attempts,
                head_latency_ms = done.latency_ms,
                "llm draft head arrived"
            );
            let model = ep.model.clone();
            let unfinished = Unfinished(Some(model.clone()));
            let rest = async move {
                let mut unfinished = unfinished;
                let started = Instant::now();
                let read = tokio::time::timeout_at(deadline, stream.read_to_end()).await;
                let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                let outcome = match read {
                    Ok(Ok(())) => {
                        stream.release().await;
                        let (_, text, usage) = stream.answer.finish(prompt_chars);
                        Ok(Completion {
                            text,
                            usage,
                            attempts,
                            tool_calls: stream.answer.tool_calls(),
                        })
                    }
                    Ok(Err(error)) => Err(error),
                    Err(_) => Err(LlmError::Timeout),
                };
                match &outcome {
                    Ok(c) => tracing::debug!(
                        purpose = Purpose::Draft.as_str(),
                        model = %model,
                        rest_latency_ms = latency_ms,
                        prompt_tokens = c.usage.prompt_tokens,
                        completion_tokens = c.usage.completion_tokens,
                        "llm draft complete"
                    ),
                    Err(error) => tracing::debug!(
                        purpose = Purpose::Draft.as_str(),
                        model = %model,
                        rest_latency_ms = latency_ms,
                        error = %error,
                        "llm draft failed after its head"
                    ),
                }
                unfinished.disarm();
                outcome
            };
            (head, Box::pin(rest) as _)
        }
    };
    Ok(Drafting { head, rest })
}

/// Held by a drafting call's rest until it finishes; dropped before that (the caller
/// gave up on the reply), it logs that the request was cancelled, since nothing else
/// would tell.
struct Unfinished(Option<String>);

impl Unfinished {
    /// The rest finished: nothing to log.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(model) = self.0.take() {
            tracing::debug!(
                purpose = Purpose::Draft.as_str(),
                model = %model,
                "llm draft dropped before its end: request cancelled, connection closed"
            );
        }
    }
}

/// A rest that is already known.
fn ready(
    text: String,
    usage: Usage,
    attempts: u32,
    tool_calls: Vec<ToolCall>,
) -> futures_util::future::BoxFuture<'static, Result<Completion, LlmError>> {
    Box::pin(async move {
        Ok(Completion {
            text,
            usage,
            attempts,
            tool_calls,
        })
    })
}

/// One attempt: send, then read up to the head (or the end, or the whole JSON body).
async fn open(client: &LlmClient, ep: &Endpoint, url: &str, body: &Value) -> Attempt<Opened> {
    let response = match client.send(ep, url, body, None).await {
        Ok(response) => response,
        Err(failed) => return Attempt::from_failure(failed),
    };
    let status = Some(response.status().as_u16());
    let streaming = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("event-stream"));
    let result = if streaming {
        let mut stream = DraftStream::new(response);
        match stream.until_head().await {
            Ok(Some(head)) => Ok(Opened::Streaming(head, Box::new(stream))),
            Ok(None) if stream.answer.chunks == 0 => Err(LlmError::BadResponse(
                "the event stream ended without a completion chunk".to_string(),
            )),
            Ok(None) => Ok(Opened::Ended(Box::new(stream))),
            Err(error) => Err(error),
        }
    } else {
        match response.bytes().await {
            Ok(b) => parse_answer(&b).map(|(text, usage, calls)| Opened::Whole(text, usage, calls)),
            Err(e) => Err(classify_transport(&e).0),
        }
    };
    Attempt {
        status,
        result,
        retryable: false,
        retry_after: None,
    }
}

/// A streaming response being read: the body, its events, and the answer so far.
pub(super) struct DraftStream {
    /// The response whose body is read; `None` once it has ended (or `[DONE]` came).
    /// Dropping it unfinished closes the connection.
    response: Option<reqwest::Response>,
    /// Splits the body into events.
    sse: SseParser,
    /// What the events said.
    answer: StreamAnswer,
    /// Body bytes read so far, against [`MAX_STREAM_BYTES`].
    read: usize,
}

impl DraftStream {
    fn new(response: reqwest::Response) -> Self {
        DraftStream {
            response: Some(response),
            sse: SseParser::default(),
            answer: StreamAnswer::default(),
            read: 0,
        }
    }

    /// The next event's data, reading the body as needed; `None` at its end.
    async fn next_data(&mut self) -> Result<Option<String>, LlmError> {
        loop {
            if let Some(data) = self.sse.next_data() {
                return Ok(Some(data));
            }
            let Some(response) = self.response.as_mut() else {
                return Ok(None);
            };
            match response.chunk().await {
                Ok(Some(bytes)) => {
                    self.read += bytes.len();
                    if self.read > MAX_STREAM_BYTES {
                        return Err(LlmError::BadResponse(format!(
                            "streamed body exceeds {MAX_STREAM_BYTES} bytes"
                        )));
                    }
                    self.sse.push(&bytes);
                }
                Ok(None) => {
                    self.sse.finish();
                    self.response = None;
                }
                Err(e) => return Err(classify_transport(&e).0),
            }
        }
    }

    /// Reads events until the answer's first line is complete (`Some(head)`) or the
    /// stream ends (`None`).
    async fn until_head(&mut self) -> Result<Option<String>, LlmError> {
        while !self.answer.done {
            let Some(data) = self.next_data().await? else {
                break;
            };
            self.answer.apply(&data)?;
            if let Some(head) = self.answer.head() {
                return Ok(Some(head));
            }
        }
        self.release().await;
        Ok(None)
    }

    /// Reads events to the end of the answer.
    async fn read_to_end(&mut self) -> Result<(), LlmError> {
        while !self.answer.done {
            let Some(data) = self.next_data().await? else {
                break;
            };
            self.answer.apply(&data)?;
        }
        Ok(())
    }

    /// Lets go of the response once the answer is complete. What follows `[DONE]`
    /// (normally only the end of the body) is read for at most [`DRAIN_GRACE`] first,
    /// since a connection whose body was read to its end goes back to the pool and the
    /// next call skips a new connection (and TLS handshake).
    async fn release(&mut self) {
        if let Some(mut response) = self.response.take() {
            let drain = async { while let Ok(Some(_)) = response.chunk().await {} };
            let _ = tokio::time::timeout(DRAIN_GRACE, drain).await;
        }
    }
}

/// The answer of a streamed completion as its chunks arrive.
#[derive(Debug, Default)]
pub(super) struct StreamAnswer {
    /// `choices[0].delta.content` of every chunk so far, concatenated.
    raw: String,
    /// The usage chunk's counts, when the server sent one.
    usage: Option<Usage>,
    /// `data: [DONE]` arrived.
    done: bool,
    /// How many chunks (JSON events) arrived: none means the server sent no answer.
    chunks: usize,
    /// The tool calls of `choices[0].delta.tool_calls`, accumulated by their `index`:
    /// the first piece of a call brings its id and name, the arguments come in pieces.
    tool_calls: Vec<ToolCall>,
}

impl StreamAnswer {
    /// Takes in one event's data: a `chat.completion.chunk`, `[DONE]`, or an error
    /// object ([`LlmError::BadResponse`], as is data that is not JSON).
    pub(super) fn apply(&mut self, data: &str) -> Result<(), LlmError> {
        match data.trim() {
            "[DONE]" => {
                self.done = true;
                return Ok(());
            }
            // An event with no data (a keep-alive some servers send) says nothing.
            "" => return Ok(()),
            _ => {}
        }
        let value: Value = serde_json::from_str(data).map_err(|e| {
            LlmError::BadResponse(format!(
                "stream event is not JSON ({e}): {}",
                truncate_chars(data, ERROR_BODY_LIMIT)
            ))
        })?;
        if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
            return Err(LlmError::BadResponse(format!(
                "error event in the stream: {}",
                truncate_chars(&error.to_string(), ERROR_BODY_LIMIT)
            )));
        }
        self.chunks += 1;
        if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage_of(Some(usage)));
        }
        if let Some(text) = value
            .pointer("/choices/0/delta/content")
            .and_then(content_text)
        {
            self.raw.push_str(&text);
        }
        if let Some(calls) = value
            .pointer("/choices/0/delta/tool_calls")
            .and_then(Value::as_array)
        {
            for piece in calls {
                self.add_tool_call_piece(piece)?;
            }
        }
        Ok(())
    }

    /// Takes in one `delta.tool_calls[]` piece: `{index, id?, function: {name?,
    /// arguments?}}` (a piece without `index` is the next call's first).
    fn add_tool_call_piece(&mut self, piece: &Value) -> Result<(), LlmError> {
        let index = match piece.get("index").and_then(Value::as_u64) {
            Some(i) => usize::try_from(i).unwrap_or(usize::MAX),
            None => self.tool_calls.len(),
        };
        if index > self.tool_calls.len() + 64 {
            return Err(LlmError::BadResponse(format!(
                "tool call index {index} in the stream is out of range"
            )));
        }
        while self.tool_calls.len() <= index {
            self.tool_calls.push(ToolCall {
                kind: "function".to_string(),
                ..ToolCall::default()
            });
        }
        let call = &mut self.tool_calls[index];
        if let Some(id) = piece.get("id").and_then(Value::as_str) {
            call.id.push_str(id);
        }
        if let Some(name) = piece.pointer("/function/name").and_then(Value::as_str) {
            call.function.name.push_str(name);
        }
        if let Some(args) = piece.pointer("/function/arguments").and_then(Value::as_str) {
            call.function.arguments.push_str(args);
        }
        Ok(())
    }

    /// The tool calls the answer asked for (those with a name).
    pub(super) fn tool_calls(&self) -> Vec<ToolCall> {
        self.tool_calls
            .iter()
            .filter(|c| !c.function.name.is_empty())
            .cloned()
            .collect()
    }

    /// The answer without a leading `<think>…</think>` block, trimmed at the start;
    /// `None` while such a block (or what may become its opening tag) is unfinished.
    fn visible(&self) -> Option<&str> {
        let text = self.raw.trim_start();
        if text.len() < "<think>".len() && !text.is_empty() && "<think>".starts_with(text) {
            return None;
        }
        match text.strip_prefix("<think>") {
            Some(inner) => {
                let end = inner.find("</think>")?;
                Some(inner[end + "</think>".len()..].trim_start())
            }
            None => Some(text),
        }
    }

    /// The answer's first line, trimmed, once a newline follows some text.
    pub(super) fn head(&self) -> Option<String> {
        let (line, _) = head_and_rest(self.visible()?)?;
        Some(line.to_string())
    }

    /// The head, the rest and the usage of the whole answer. Usage is the server's when
    /// it sent a usage chunk; otherwise an estimate of about four characters a token:
    /// prompt = the request messages' characters / 4, completion = the answer's / 4
    /// (rounded up), since a server that streams without `include_usage` reports none.
    pub(super) fn finish(&self, prompt_chars: usize) -> (String, String, Usage) {
        let (head, rest) = split_head(&strip_think(&self.raw));
        let usage = self.usage.clone().unwrap_or_else(|| Usage {
            prompt_tokens: estimate_tokens(prompt_chars),
            completion_tokens: estimate_tokens(self.raw.chars().count()),
        });
        (head, rest, usage)
    }
}

/// Splits a `text/event-stream` body, fed in arbitrary pieces, into the data of its
/// events. Lines end in `\n` or `\r\n`; a blank line ends an event; `data:` lines of one
/// event are joined with `\n`; comments (`:`) and other fields are ignored. Bytes are
/// decoded a whole line at a time, so a UTF-8 character split across pieces is intact.
#[derive(Debug, Default)]
pub(super) struct SseParser {
    /// Bytes of the line not yet ended.
    partial: Vec<u8>,
    /// The data of the event being read, if it has any.
    data: Option<String>,
    /// Data of complete events not yet taken.
    ready: VecDeque<String>,
}

impl SseParser {
    /// Takes in the next piece of the body.
    pub(super) fn push(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|b| *b == b'\n') {
            self.partial.extend_from_slice(&rest[..pos]);
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
            rest = &rest[pos + 1..];
        }
        self.partial.extend_from_slice(rest);
    }

    /// The body ended: a last unterminated line and event count as complete.
    pub(super) fn finish(&mut self) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
        }
        if let Some(data) = self.data.take() {
            self.ready.push_back(data);
        }
    }

    /// The data of the next complete event, in order.
    pub(super) fn next_data(&mut self) -> Option<String> {
        self.ready.pop_front()
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                self.ready.push_back(data);
            }
            return;
        }
        if line.starts_with(b":") {
            return;
        }
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        if field != b"data" {
            return;
        }
        let value = String::from_utf8_lossy(value);
        match &mut self.data {
            Some(data) => {
                data.push('\n');
                data.push_str(&value);
            }
            None => self.data = Some(value.into_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_tool_calls_accumulate_by_index() {
        let mut a = StreamAnswer::default();
        for data in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"{\"speak\": true}\n"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"get_current_time","arguments":"{\"time"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"c2","function":{"name":"ok","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"zone\": \"UTC\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            "[DONE]",
        ] {
            a.apply(data).unwrap();
        }
        assert!(a.done);
        let calls = a.tool_calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "c1");
        assert_eq!(calls[0].kind, "function");
        assert_eq!(calls[0].function.name, "get_current_time");
        assert_eq!(calls[0].function.arguments, r#"{"timezone": "UTC"}"#);
        assert_eq!(calls[1].id, "c2");
        assert_eq!(calls[1].function.name, "ok");
        assert_eq!(a.head().as_deref(), Some(r#"{"speak": true}"#));
    }

    #[test]
    fn a_wild_tool_call_index_is_refused() {
        let mut a = StreamAnswer::default();
        let err = a
            .apply(
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":100000,"id":"x"}]}}]}"#,
            )
            .unwrap_err();
        assert!(matches!(err, LlmError::BadResponse(_)), "{err:?}");
    }

    /// A body as a server streams it: two content chunks across the head, a reasoning
    /// chunk, a comment, a usage chunk, CRLF line ends in one event, a multi-byte
    /// character, then `[DONE]`.
    const SAMPLE: &str = concat!(
        ": keep-alive\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{\\\"speak\\\": true}\"}}]}\n\n",
        "event: message\r\nid: 7\r\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\nHéllo \"}}]}\r\n\r\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"wörld\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":4}}\n\n",
        "data: [DONE]\n\n",
    );

    /// Feeds `pieces` to a parser and applies every event to an answer.
    fn feed(pieces: &[&[u8]]) -> StreamAnswer {
        let mut sse = SseParser::default();
        let mut answer = StreamAnswer::default();
        for piece in pieces {
            sse.push(piece);
            while let Some(data) = sse.next_data() {
                answer.apply(&data).unwrap();
            }
        }
        sse.finish();
        while let Some(data) = sse.next_data() {
            answer.apply(&data).unwrap();
        }
        answer
    }

    #[test]
    fn sse_split_at_every_position_reads_the_same() {
        let bytes = SAMPLE.as_bytes();
        for cut in 0..=bytes.len() {
            let answer = feed(&[&bytes[..cut], &bytes[cut..]]);
            assert!(answer.done, "cut {cut}");
            assert_eq!(answer.raw, "{\"speak\": true}\nHéllo wörld", "cut {cut}");
            assert_eq!(answer.head().as_deref(), Some("{\"speak\": true}"));
            let (head, rest, usage) = answer.finish(0);
            assert_eq!(
                (head.as_str(), rest.as_str()),
                ("{\"speak\": true}", "Héllo wörld")
            );
            assert_eq!(
                usage,
                Usage {
                    prompt_tokens: 11,
                    completion_tokens: 4
                }
            );
        }
    }

    #[test]
    fn sse_byte_at_a_time_reads_the_same() {
        let pieces: Vec<&[u8]> = SAMPLE.as_bytes().chunks(1).collect();
        let answer = feed(&pieces);
        assert_eq!(answer.raw, "{\"speak\": true}\nHéllo wörld");
    }

    #[test]
    fn sse_multi_line_data_and_unterminated_last_event() {
        let mut sse = SseParser::default();
        sse.push(b"data: a\ndata:b\n\nretry: 10\ndata: last");
        assert_eq!(sse.next_data().as_deref(), Some("a\nb"));
        assert_eq!(sse.next_data(), None);
        sse.finish();
        assert_eq!(sse.next_data().as_deref(), Some("last"));
    }

    #[test]
    fn head_waits_for_a_newline_after_text() {
        let mut answer = StreamAnswer {
            raw: "\n\n  ".into(),
            ..StreamAnswer::default()
        };
        assert_eq!(answer.head(), None);
        answer.raw.push_str("{\"speak\": false}");
        assert_eq!(answer.head(), None);
        answer.raw.push_str(" \nrest");
        assert_eq!(answer.head().as_deref(), Some("{\"speak\": false}"));
    }

    #[test]
    fn think_block_is_skipped_before_the_head() {
        let mut answer = StreamAnswer::default();
        for (piece, head) in [
            ("<thi", None),
            ("nk>line one\nline two\n", None),
            ("</think>\n\n", None),
            ("{\"speak\": true}\n", Some("{\"speak\": true}")),
        ] {
            answer.raw.push_str(piece);
            assert_eq!(answer.head().as_deref(), head, "after {piece:?}");
        }
        answer.raw.push_str("the reply");
        let (head, rest, _) = answer.finish(0);
        assert_eq!(head, "{\"speak\": true}");
        assert_eq!(rest, "the reply");
    }

    #[test]
    fn error_event_is_bad_response() {
        let mut answer = StreamAnswer::default();
        let err = answer
            .apply(r#"{"error":{"message":"model overloaded","type":"server_error"}}"#)
            .unwrap_err();
        assert_eq!(err.label(), "bad_response", "{err}");
        assert!(err.to_string().contains("model overloaded"), "{err}");
        answer.apply("  ").unwrap();
        assert_eq!(answer.chunks, 0, "an empty event is no chunk");
        let err = answer.apply("not json").unwrap_err();
        assert_eq!(err.label(), "bad_response", "{err}");
    }

    #[test]
    fn usage_is_estimated_without_a_usage_chunk() {
        let mut answer = StreamAnswer::default();
        answer
            .apply(r#"{"choices":[{"delta":{"content":"yes\n12345678"}}]}"#)
            .unwrap();
        let (_, rest, usage) = answer.finish(10);
        assert_eq!(rest, "12345678");
        // 12 answer characters, 10 prompt characters.
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 3,
                completion_tokens: 3
            }
        );
    }
}
