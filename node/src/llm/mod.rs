//! Client for OpenAI-compatible `/chat/completions` endpoints.
//!
//! A bot node talks to its model for two reasons: a cheap JUDGE call that
//! decides whether the bot should interject (answering
//! `{"speak": bool, "relevance": 0..1}`), and a REPLY call that writes the
//! message itself. Both go through [`LlmClient::complete`], which builds the
//! request, retries transient failures (429, 5xx, refused connections) with
//! capped exponential backoff, and turns whatever the server sent into a
//! [`Completion`] or a classified [`LlmError`]. A drafting call (the verdict
//! line, then the reply, in one streamed answer) goes through [`LlmClient::draft`]
//! (`stream.rs`), which retries by the same schedule.
//!
//! Local servers (Ollama, llama.cpp, vLLM) differ in how well they follow a
//! JSON schema, so [`parse_verdict`] (`verdict.rs`, with the schema a judge call
//! asks for) is deliberately forgiving about the shape of the judge's answer.
//!
//! The API key is sent as a bearer token and is never logged: [`Endpoint`]'s
//! `Debug` output redacts it and tracing events never include it.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::pacing::{Backoff, Jitter};

mod stream;
mod verdict;

pub use verdict::{parse_shared_verdicts, parse_verdict, verdict_schema, Verdict};

/// How much of an error body is kept in [`LlmError::Http`].
const ERROR_BODY_LIMIT: usize = 200;
/// Retry delays: 200 ms doubling per failed attempt, at most 2 s.
const BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), BACKOFF_CAP);
/// Largest computed retry delay.
const BACKOFF_CAP: Duration = Duration::from_secs(2);
/// Largest delay a server may ask for with `Retry-After`.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(5);

/// Settings for one endpoint (judge and reply may use different ones).
#[derive(Clone)]
pub struct Endpoint {
    /// Base of the OpenAI-compatible API, e.g. `http://127.0.0.1:11434/v1`;
    /// requests go to `{base_url}/chat/completions` (a trailing `/` is ignored).
    pub(crate) base_url: String,
    /// Model name sent in every request.
    pub(crate) model: String,
    /// Sent as `Authorization: Bearer <key>` when set and non-empty; never logged.
    pub api_key: Option<String>,
    /// Limit for one whole attempt (connect, send, and reading the body).
    pub timeout: Duration,
    /// Limit for establishing a TCP/TLS connection. reqwest only supports this
    /// per client, so it takes effect through [`LlmClient::build_http`] when
    /// the shared client is built; [`LlmClient::complete`] cannot apply it.
    pub(crate) connect_timeout: Duration,
    /// Upper bound on generated tokens (`max_tokens` in the request).
    pub max_tokens: u32,
    /// Sampling temperature; omitted from the request when `None` so the
    /// server default applies.
    pub temperature: Option<f32>,
    /// Extra attempts after a 429, a 5xx, or a connect error (default 2).
    pub retries: u32,
    /// Send `response_format: json_schema` with [`verdict_schema`] on judge
    /// calls, for servers that support constrained output.
    pub json_schema: bool,
    /// Send `response_format: {"type": "json_object", "schema": …}` on judge calls
    /// instead: the form llama-cpp-python's server accepts (it refuses `json_schema`).
    pub(crate) json_object: bool,
}

impl Endpoint {
    /// Creates an endpoint with the defaults: 30 s timeout, 5 s connect
    /// timeout, 512 max tokens, server-default temperature, 2 retries, no
    /// JSON schema, no API key.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Endpoint {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_tokens: 512,
            temperature: None,
            retries: 2,
            json_schema: false,
            json_object: false,
        }
    }

    /// The full URL of the chat-completions resource.
    fn chat_url(&self) -> String {
        format!("{}/chat/completions", self.base_url.trim_end_matches('/'))
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_tokens", &self.max_tokens)
            .field("temperature", &self.temperature)
            .field("retries", &self.retries)
            .field("json_schema", &self.json_schema)
            .field("json_object", &self.json_object)
            .finish()
    }
}

/// Why a call is made; it changes the request (judge calls may carry a JSON
/// schema) and labels logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// The cheap "should I interject?" decision.
    Judge,
    /// Writing the bot's actual message.
    Reply,
    /// The shared judge (`[mesh] judge = "shared"`): one call answering for every bot.
    SharedJudge,
    /// A drafting judge (a bot's `judge_drafts`): one streamed call whose first line is
    /// the verdict and whose rest is the reply, so the reply is written while the
    /// verdict is acted on. See [`LlmClient::draft`].
    Draft,
}

impl Purpose {
    /// Stable lowercase name for logs and metric labels.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Purpose::Judge => "judge",
            Purpose::Reply => "reply",
            Purpose::SharedJudge => "shared_judge",
            Purpose::Draft => "draft",
        }
    }
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message of the conversation sent to the model, in OpenAI's wire shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub(crate) role: String,
    /// The message text.
    pub content: String,
    /// An `assistant` message's tool calls (the model asked for tools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) tool_calls: Vec<ToolCall>,
    /// A `tool` message's answer to this call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tool_call_id: Option<String>,
}

/// A function call the model asked for (`tool_calls[]` of its answer).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ToolCall {
    /// The call's id, which the `tool` message answering it names.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The function half of a [`ToolCall`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct FunctionCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments as the model wrote them: JSON text.
    #[serde(default)]
    pub arguments: String,
}

fn function_kind() -> String {
    "function".to_string()
}

/// A function tool offered to the model (`tools[]` of the request).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its arguments' JSON schema.
    pub parameters: Value,
}

impl ToolSpec {
    /// The request's shape: `{type: function, function: {name, description, parameters}}`.
    fn wire(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }
}

impl ChatMessage {
    /// A message with an arbitrary role.
    pub(crate) fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// The model's answer that asked for `calls`, as the conversation goes on with it.
    pub(crate) fn assistant_calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Self {
        ChatMessage {
            tool_calls: calls,
            ..Self::new("assistant", content)
        }
    }

    /// A tool's result, answering call `id`.
    pub(crate) fn tool(id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            tool_call_id: Some(id.into()),
            ..Self::new("tool", content)
        }
    }

    /// A `system` message (persona, instructions).
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message (what others said).
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message (what this bot said before).
    #[cfg(test)]
    pub(crate) fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Token accounting reported by the server, for cost metrics; zero when the
/// server does not report it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
}

/// A successful call's result.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The model's answer: `choices[0].message.content`, falling back to
    /// `reasoning_content` when content is null or empty; a leading
    /// `<think>…</think>` block is removed.
    pub text: String,
    /// Token usage of the successful attempt.
    pub usage: Usage,
    /// How many attempts were made, including the successful one (1 = no retry).
    pub attempts: u32,
    /// The tools the model asked to call (its `tool_calls`): none for a plain answer.
    pub tool_calls: Vec<ToolCall>,
}

impl Completion {
    /// An answer no endpoint gave (the offline provider's, the simulator's script, a
    /// replay's verdict): `text`, no usage, one attempt, no tool calls.
    pub fn offline(text: impl Into<String>) -> Completion {
        Completion {
            text: text.into(),
            usage: Usage::default(),
            attempts: 1,
            tool_calls: Vec::new(),
        }
    }
}

/// A drafting call's answer as it comes in ([`LlmClient::draft`]): its first line (the
/// verdict the prompt asks for) as soon as that line is complete, and the rest (the
/// reply) once the model is done.
///
/// Exists so a bot can act on its verdict (claim, wait) while the same request goes on
/// writing its reply: one call instead of a judge call followed by a reply call.
pub struct Drafting {
    /// The answer's first non-empty line, trimmed (a leading `<think>…</think>` block
    /// removed).
    pub head: String,
    /// Everything after that line once the answer is complete, trimmed, with the whole
    /// call's usage. Dropping it unfinished cancels the request.
    pub rest: futures_util::future::BoxFuture<'static, Result<Completion, LlmError>>,
}

/// Splits a whole answer into its verdict line ([`head_and_rest`]) and the rest, both
/// trimmed. A whole answer with no complete first line is all head.
pub fn split_head(text: &str) -> (String, String) {
    match head_and_rest(text) {
        Some((head, rest)) => (head.trim().to_string(), rest.trim().to_string()),
        None => (text.trim().to_string(), String::new()),
    }
}

/// About four characters a token, rounded up: the token count of text a server did
/// not count (a stream without a usage chunk, a drafting call dropped unfinished).
pub(crate) fn estimate_tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX)
}

/// A drafting answer's verdict line and what follows it, once that line is complete
/// (a newline after it): the first non-empty line or, when the answer opens with a code
/// fence (a line starting with three backticks, as models like to wrap JSON), the line
/// inside it, the closing fence left out of the rest.
pub(crate) fn head_and_rest(text: &str) -> Option<(&str, &str)> {
    let text = text.trim_start();
    let (first, after) = text.split_once('\n')?;
    if !first.trim_start().starts_with("```") {
        return Some((first.trim(), after));
    }
    let (head, rest) = after.trim_start().split_once('\n')?;
    let rest = rest.trim_start();
    let rest = match rest.strip_prefix("```") {
        Some(fence) => fence.split_once('\n').map_or("", |(_, r)| r),
        None => rest,
    };
    Some((head.trim(), rest))
}

/// Why a call failed, classified so callers can count failures by kind.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The attempt did not finish within [`Endpoint::timeout`]; never retried.
    #[error("LLM request timed out")]
    Timeout,
    /// The server answered with a non-success status (after any retries).
    #[error("LLM endpoint returned HTTP {status}: {body}")]
    Http {
        /// The HTTP status code.
        status: u16,
        /// Start of the response body (at most 200 characters), for diagnosis.
        body: String,
    },
    /// The request could not be sent or the response not read (refused
    /// connection, reset, TLS failure…).
    #[error("LLM transport error: {0}")]
    Transport(String),
    /// The server answered 200 but the body was not a usable completion.
    #[error("LLM response was unusable: {0}")]
    BadResponse(String),
}

impl LlmError {
    /// Short stable name for metric labels: `timeout`, `http_4xx`, `http_5xx`,
    /// `transport` or `bad_response` (statuses below 500 count as `http_4xx`).
    pub fn label(&self) -> &'static str {
        match self {
            LlmError::Timeout => "timeout",
            LlmError::Http { status, .. } if *status >= 500 => "http_5xx",
            LlmError::Http { .. } => "http_4xx",
            LlmError::Transport(_) => "transport",
            LlmError::BadResponse(_) => "bad_response",
        }
    }
}

/// Calls chat-completions endpoints over one shared HTTP client; cheap to clone.
#[derive(Debug, Clone)]
pub struct LlmClient {
    http: reqwest::Client,
}

/// What one attempt produced, with what the retry loop needs to decide.
struct Attempt<T> {
    status: Option<u16>,
    result: Result<T, LlmError>,
    retryable: bool,
    retry_after: Option<Duration>,
}

impl<T> Attempt<T> {
    fn failed(status: Option<u16>, error: LlmError, retryable: bool) -> Self {
        Attempt {
            status,
            result: Err(error),
            retryable,
            retry_after: None,
        }
    }

    /// A failure read from a non-success response ([`LlmClient::send`]), re-typed for
    /// an attempt of any result.
    fn from_failure(failed: Attempt<std::convert::Infallible>) -> Self {
        Attempt {
            status: failed.status,
            result: failed.result.map(|never| match never {}),
            retryable: failed.retryable,
            retry_after: failed.retry_after,
        }
    }
}

/// What the retry loop hands back on success: the value, the status of the successful
/// attempt, how many attempts were made, and how long the last one took.
struct Succeeded<T> {
    value: T,
    status: Option<u16>,
    attempts: u32,
    latency_ms: u64,
}

impl LlmClient {
    /// Wraps the node's shared reqwest client so connections are pooled across
    /// judge and reply calls.
    pub fn new(http: reqwest::Client) -> Self {
        LlmClient { http }
    }

    /// Builds a reqwest client suitable for [`LlmClient::new`], applying the
    /// connect timeout that reqwest only supports per client (use the largest
    /// [`Endpoint::connect_timeout`] of the endpoints sharing it).
    pub fn build_http(connect_timeout: Duration) -> reqwest::Result<reqwest::Client> {
        reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
    }

    /// Sends `messages` to `ep` and returns the model's answer, retrying 429,
    /// 5xx and connect errors up to `ep.retries` extra times. Timeouts and
    /// other 4xx statuses are returned at once.
    pub async fn complete(
        &self,
        ep: &Endpoint,
        purpose: Purpose,
        messages: &[ChatMessage],
    ) -> Result<Completion, LlmError> {
        self.complete_with_tools(ep, purpose, messages, &[]).await
    }

    /// [`LlmClient::complete`] offering the model `tools` (none: a plain call); the
    /// answer's [`Completion::tool_calls`] are the calls it asks for. Only reply
    /// calls carry tools: a judge's `tools` are ignored.
    pub async fn complete_with_tools(
        &self,
        ep: &Endpoint,
        purpose: Purpose,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<Completion, LlmError> {
        let url = ep.chat_url();
        let mut body = request_body(ep, purpose, messages);
        if purpose == Purpose::Reply && !tools.is_empty() {
            body["tools"] = Value::Array(tools.iter().map(ToolSpec::wire).collect());
        }
        let done = with_retries(ep, purpose, || {
            bounded(ep.timeout, self.exchange(ep, &url, &body))
        })
        .await?;
        let (text, usage, tool_calls) = done.value;
        tracing::debug!(
            purpose = purpose.as_str(),
            model = %ep.model,
            status = done.status,
            attempt = done.attempts,
            latency_ms = done.latency_ms,
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            "llm call succeeded"
        );
        Ok(Completion {
            text,
            usage,
            attempts: done.attempts,
            tool_calls,
        })
    }

    /// A drafting call ([`Purpose::Draft`]): the answer's first line as soon as it is
    /// complete, the rest as a future (see [`Drafting`]). The request streams
    /// (`"stream": true`); how the stream is read, retried, bounded in time and
    /// cancelled is told in [`stream`].
    pub async fn draft(
        &self,
        ep: &Endpoint,
        messages: &[ChatMessage],
    ) -> Result<Drafting, LlmError> {
        stream::draft(self, ep, messages, &[]).await
    }

    /// [`LlmClient::draft`] offering the model `tools`: the rest's
    /// [`Completion::tool_calls`] are the calls it asks for after its verdict line
    /// (streamed as `delta.tool_calls`, accumulated by index).
    pub async fn draft_with_tools(
        &self,
        ep: &Endpoint,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<Drafting, LlmError> {
        stream::draft(self, ep, messages, tools).await
    }

    /// One HTTP exchange: [`LlmClient::send`], then the whole body read and parsed.
    async fn exchange(
        &self,
        ep: &Endpoint,
        url: &str,
        body: &Value,
    ) -> Attempt<(String, Usage, Vec<ToolCall>)> {
        let response = match self.send(ep, url, body, Some(ep.timeout)).await {
            Ok(response) => response,
            Err(failed) => return Attempt::from_failure(failed),
        };
        let status = response.status().as_u16();
        let result = match response.bytes().await {
            Ok(b) => parse_answer(&b),
            Err(e) => Err(classify_transport(&e).0),
        };
        Attempt {
            status: Some(status),
            result,
            retryable: false,
            retry_after: None,
        }
    }

    /// Sends one request (bearer key when set; reqwest's own per-request timeout when
    /// `timeout` is given) and returns the response when its status is a success.
    /// Anything else comes back classified: a transport error (retryable only when
    /// connecting failed), or a non-success status with the start of its body
    /// (retryable for 429 and 5xx, with the server's `Retry-After`).
    async fn send(
        &self,
        ep: &Endpoint,
        url: &str,
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, Attempt<std::convert::Infallible>> {
        let mut request = self.http.post(url).json(body);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        if let Some(key) = ep.api_key.as_deref().filter(|k| !k.is_empty()) {
            request = request.bearer_auth(key);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                let (error, retryable) = classify_transport(&e);
                return Err(Attempt::failed(None, error, retryable));
            }
        };
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        // Always drain the body so the connection can go back to the pool.
        let body = match response.bytes().await {
            Ok(b) => truncate_chars(&String::from_utf8_lossy(&b), ERROR_BODY_LIMIT),
            Err(_) => String::new(),
        };
        let retryable = status == 429 || status >= 500;
        Err(Attempt {
            status: Some(status),
            result: Err(LlmError::Http { status, body }),
            retryable,
            retry_after: if retryable { retry_after } else { None },
        })
    }
}

/// One attempt bounded by `timeout` on tokio's clock (so paused-clock tests see it);
/// running out is [`LlmError::Timeout`], never retried.
async fn bounded<T>(timeout: Duration, attempt: impl Future<Output = Attempt<T>>) -> Attempt<T> {
    match tokio::time::timeout(timeout, attempt).await {
        Ok(attempt) => attempt,
        Err(_) => Attempt::failed(None, LlmError::Timeout, false),
    }
}

/// Runs `attempt` until it succeeds, fails for good, or `ep.retries` extra attempts
/// are spent; between attempts it waits the server's `Retry-After` or the backoff.
/// Every failed attempt is logged with whether it will be retried.
///
/// Exists so plain and drafting calls retry by one schedule.
async fn with_retries<T, Fut>(
    ep: &Endpoint,
    purpose: Purpose,
    mut attempt: impl FnMut() -> Fut,
) -> Result<Succeeded<T>, LlmError>
where
    Fut: Future<Output = Attempt<T>>,
{
    let mut attempt_no: u32 = 0;
    loop {
        attempt_no += 1;
        let started = Instant::now();
        let outcome = attempt().await;
        let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match outcome.result {
            Ok(value) => {
                return Ok(Succeeded {
                    value,
                    status: outcome.status,
                    attempts: attempt_no,
                    latency_ms,
                })
            }
            Err(error) => {
                let retry = outcome.retryable && attempt_no <= ep.retries;
                tracing::debug!(
                    purpose = purpose.as_str(),
                    model = %ep.model,
                    status = outcome.status,
                    attempt = attempt_no,
                    latency_ms,
                    error = %error,
                    retry,
                    "llm call failed"
                );
                if !retry {
                    return Err(error);
                }
                let delay = outcome
                    .retry_after
                    .unwrap_or_else(|| backoff_delay(attempt_no));
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Maps a reqwest error to an [`LlmError`] and whether it may be retried
/// (only failures to connect are: the request never reached the server).
fn classify_transport(e: &reqwest::Error) -> (LlmError, bool) {
    if e.is_connect() {
        (LlmError::Transport(error_chain(e)), true)
    } else if e.is_timeout() {
        (LlmError::Timeout, false)
    } else {
        (LlmError::Transport(error_chain(e)), false)
    }
}

/// An error and its sources joined, since reqwest's own message hides the
/// cause ("connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// Builds the JSON request body for one call.
fn request_body(ep: &Endpoint, purpose: Purpose, messages: &[ChatMessage]) -> Value {
    let mut body = json!({
        "model": ep.model,
        "messages": messages,
        "max_tokens": ep.max_tokens,
        "stream": false,
    });
    if let Some(t) = ep.temperature {
        body["temperature"] = json!(t);
    }
    if purpose == Purpose::Judge && ep.json_schema {
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {
                "name": "verdict",
                "strict": true,
                "schema": verdict_schema(),
            }
        });
    } else if purpose == Purpose::Judge && ep.json_object {
        body["response_format"] = json!({"type": "json_object", "schema": verdict_schema()});
    } else if purpose == Purpose::SharedJudge && (ep.json_schema || ep.json_object) {
        // Bot names are the keys, so the schema cannot list them: not `strict`.
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {
                "name": "verdicts",
                "strict": false,
                "schema": {"type": "object", "additionalProperties": verdict_schema()},
            }
        });
    }
    body
}

/// Extracts the answer text, usage and the tool calls the model asked for from a 200
/// response body (an answer that only calls tools may have no text).
fn parse_answer(bytes: &[u8]) -> Result<(String, Usage, Vec<ToolCall>), LlmError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        LlmError::BadResponse(format!(
            "body is not JSON ({e}): {}",
            truncate_chars(&String::from_utf8_lossy(bytes), ERROR_BODY_LIMIT)
        ))
    })?;
    let message = value
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("message"))
        .ok_or_else(|| match value.get("error") {
            Some(err) => LlmError::BadResponse(format!(
                "error object instead of choices: {}",
                truncate_chars(&err.to_string(), ERROR_BODY_LIMIT)
            )),
            None => LlmError::BadResponse("no choices[0].message".to_string()),
        })?;
    let tool_calls: Vec<ToolCall> = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(calls) => serde_json::from_value(calls.clone()).map_err(|e| {
            LlmError::BadResponse(format!("choices[0].message.tool_calls not understood: {e}"))
        })?,
    };
    let content = message.get("content").and_then(content_text);
    let reasoning = ["reasoning_content", "reasoning"]
        .iter()
        .filter_map(|k| message.get(*k).and_then(Value::as_str))
        .find(|r| !r.trim().is_empty());
    let text = match (content, reasoning) {
        (Some(c), _) if !c.trim().is_empty() => strip_think(&c),
        (_, Some(r)) => r.to_string(),
        (Some(c), None) => c,
        (None, None) if !tool_calls.is_empty() => String::new(),
        (None, None) => {
            return Err(LlmError::BadResponse(
                "choices[0].message has neither content nor reasoning_content".to_string(),
            ))
        }
    };
    Ok((text, usage_of(value.get("usage")), tool_calls))
}

/// The token counts of a `usage` object (missing counts are zero).
fn usage_of(usage: Option<&Value>) -> Usage {
    let count = |key: &str| {
        usage
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Usage {
        prompt_tokens: count("prompt_tokens"),
        completion_tokens: count("completion_tokens"),
    }
}

/// Message content as text: a string, or an array of `{type: text, text}` parts.
fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str).or_else(|| p.as_str()))
                .collect::<Vec<_>>()
                .join(""),
        ),
        _ => None,
    }
}

/// Removes a leading `<think>…</think>` block that some reasoning models put
/// in the content, so it never reaches the chat; text without a complete
/// block is returned unchanged.
fn strip_think(text: &str) -> String {
    let trimmed = text.trim_start();
    if let Some(rest) = trimmed.strip_prefix("<think>") {
        if let Some(end) = rest.find("</think>") {
            let after = rest[end + "</think>".len()..].trim();
            if !after.is_empty() {
                return after.to_string();
            }
        }
    }
    text.to_string()
}

/// Delay before the attempt after `failed_attempts` failures: 200 ms doubling,
/// capped at 2 s, with ±20 % jitter (still capped).
fn backoff_delay(failed_attempts: u32) -> Duration {
    BACKOFF.delay(failed_attempts, Jitter::Scale(0.8..=1.2))
}

/// `Retry-After` in (possibly fractional) seconds, capped at 5 s; HTTP dates
/// and garbage are ignored so the normal backoff applies.
fn parse_retry_after(value: &str) -> Option<Duration> {
    let secs: f64 = value.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(
        secs.min(RETRY_AFTER_CAP.as_secs_f64()),
    ))
}

/// At most `limit` characters of `text` (not bytes, so UTF-8 stays valid).
fn truncate_chars(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((idx, _)) => text[..idx].to_string(),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- request body ----

    fn endpoint() -> Endpoint {
        Endpoint::new("http://127.0.0.1:1/v1/", "m1")
    }

    #[test]
    fn body_for_reply() {
        let mut ep = endpoint();
        ep.json_schema = true;
        ep.max_tokens = 64;
        let body = request_body(
            &ep,
            Purpose::Reply,
            &[ChatMessage::system("s"), ChatMessage::user("u")],
        );
        assert_eq!(body["model"], "m1");
        assert_eq!(body["max_tokens"], 64);
        assert_eq!(body["stream"], false);
        assert_eq!(
            body["messages"],
            json!([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
        );
        assert!(body.get("temperature").is_none());
        assert!(body.get("response_format").is_none());
    }

    #[test]
    fn body_for_judge_with_schema_and_temperature() {
        let mut ep = endpoint();
        ep.json_schema = true;
        ep.temperature = Some(0.5);
        let body = request_body(&ep, Purpose::Judge, &[ChatMessage::assistant("a")]);
        assert_eq!(body["temperature"], 0.5);
        let rf = &body["response_format"];
        assert_eq!(rf["type"], "json_schema");
        assert_eq!(rf["json_schema"]["name"], "verdict");
        assert_eq!(rf["json_schema"]["strict"], true);
        assert_eq!(rf["json_schema"]["schema"], verdict_schema());
    }

    #[test]
    fn body_for_judge_without_schema() {
        let body = request_body(&endpoint(), Purpose::Judge, &[]);
        assert!(body.get("response_format").is_none());
    }

    #[test]
    fn chat_url_ignores_trailing_slash() {
        assert_eq!(
            endpoint().chat_url(),
            "http://127.0.0.1:1/v1/chat/completions"
        );
    }

    #[test]
    fn debug_redacts_api_key() {
        let mut ep = endpoint();
        ep.api_key = Some("sk-secret-123".into());
        let dbg = format!("{ep:?}");
        assert!(!dbg.contains("sk-secret-123"));
        assert!(dbg.contains("<redacted>"));
    }

    // ---- response parsing ----

    #[test]
    fn response_with_tool_calls_and_no_content() {
        let body = br#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_current_time","arguments":"{\"timezone\":\"UTC\"}"}}]},"finish_reason":"tool_calls"}]}"#;
        let (text, _, calls) = parse_answer(body).unwrap();
        assert_eq!(text, "");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].id, "c1");
        assert_eq!(calls[0].function.name, "get_current_time");
        assert_eq!(calls[0].function.arguments, r#"{"timezone":"UTC"}"#);
    }

    #[test]
    fn tool_messages_and_calls_in_the_wire_shape() {
        let call = ToolCall {
            id: "c1".into(),
            kind: "function".into(),
            function: FunctionCall {
                name: "t".into(),
                arguments: "{}".into(),
            },
        };
        let asked = serde_json::to_value(ChatMessage::assistant_calls("", vec![call])).unwrap();
        assert_eq!(
            asked,
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
            ]})
        );
        let result = serde_json::to_value(ChatMessage::tool("c1", "42")).unwrap();
        assert_eq!(
            result,
            json!({"role": "tool", "content": "42", "tool_call_id": "c1"})
        );
        // A plain message keeps its old shape (and its prompt hash).
        let plain = serde_json::to_value(ChatMessage::user("hi")).unwrap();
        assert_eq!(plain, json!({"role": "user", "content": "hi"}));
    }

    #[test]
    fn response_content_and_usage() {
        let body = br#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
        let (text, usage, _) = parse_answer(body).unwrap();
        assert_eq!(text, "hi");
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 12,
                completion_tokens: 3
            }
        );
    }

    #[test]
    fn response_missing_usage_is_zero() {
        let body = br#"{"choices":[{"message":{"content":"hi"}}]}"#;
        assert_eq!(parse_answer(body).unwrap().1, Usage::default());
    }

    #[test]
    fn response_null_content_falls_back_to_reasoning() {
        let body =
            br#"{"choices":[{"message":{"content":null,"reasoning_content":"{\"speak\":true}"}}]}"#;
        assert_eq!(parse_answer(body).unwrap().0, "{\"speak\":true}");
    }

    #[test]
    fn response_content_parts_array() {
        let body = br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#;
        assert_eq!(parse_answer(body).unwrap().0, "ab");
    }

    #[test]
    fn response_think_block_stripped() {
        let body = br#"{"choices":[{"message":{"content":"<think>hmm</think>\n\nHello!"}}]}"#;
        assert_eq!(parse_answer(body).unwrap().0, "Hello!");
    }

    #[test]
    fn response_bad_shapes() {
        for body in [
            &b"not json"[..],
            br#"{"choices":[]}"#,
            br#"{"error":{"message":"boom"}}"#,
            br#"{"choices":[{"message":{"content":null}}]}"#,
        ] {
            let err = parse_answer(body).unwrap_err();
            assert_eq!(err.label(), "bad_response", "{err}");
        }
    }

    // ---- helpers ----

    #[test]
    fn error_labels() {
        assert_eq!(LlmError::Timeout.label(), "timeout");
        assert_eq!(
            LlmError::Http {
                status: 404,
                body: String::new()
            }
            .label(),
            "http_4xx"
        );
        assert_eq!(
            LlmError::Http {
                status: 429,
                body: String::new()
            }
            .label(),
            "http_4xx"
        );
        assert_eq!(
            LlmError::Http {
                status: 503,
                body: String::new()
            }
            .label(),
            "http_5xx"
        );
        assert_eq!(LlmError::Transport("x".into()).label(), "transport");
        assert_eq!(LlmError::BadResponse("x".into()).label(), "bad_response");
    }

    #[test]
    fn a_drafting_answer_splits_at_its_verdict_line_fenced_or_not() {
        let plain = "{\"speak\": true, \"relevance\": 0.8}\nSure, here is how.\nStep two.";
        assert_eq!(
            split_head(plain),
            (
                "{\"speak\": true, \"relevance\": 0.8}".to_string(),
                "Sure, here is how.\nStep two.".to_string()
            )
        );
        let fenced = "\n```json\n{\"speak\": true, \"relevance\": 0.8}\n```\nSure, here is how.";
        assert_eq!(
            split_head(fenced),
            (
                "{\"speak\": true, \"relevance\": 0.8}".to_string(),
                "Sure, here is how.".to_string()
            )
        );
        // While streaming: no head until the line inside the fence is complete.
        assert_eq!(head_and_rest("```json\n{\"speak\": tr"), None);
        assert_eq!(
            head_and_rest("```\n{\"speak\": false}\n").map(|h| h.0),
            Some("{\"speak\": false}")
        );
        assert_eq!(head_and_rest("{\"speak\": false}"), None);
        // A declining answer, whole: all head, no rest.
        assert_eq!(
            split_head("{\"speak\": false, \"relevance\": 0.1}"),
            (
                "{\"speak\": false, \"relevance\": 0.1}".to_string(),
                String::new()
            )
        );
    }

    #[test]
    fn purpose_names() {
        assert_eq!(Purpose::Judge.as_str(), "judge");
        assert_eq!(Purpose::Reply.to_string(), "reply");
        assert_eq!(Purpose::SharedJudge.as_str(), "shared_judge");
        assert_eq!(Purpose::Draft.as_str(), "draft");
    }

    #[test]
    fn backoff_grows_and_caps() {
        for _ in 0..50 {
            let d1 = backoff_delay(1);
            assert!(
                d1 >= Duration::from_millis(160) && d1 <= Duration::from_millis(240),
                "{d1:?}"
            );
            let d2 = backoff_delay(2);
            assert!(
                d2 >= Duration::from_millis(320) && d2 <= Duration::from_millis(480),
                "{d2:?}"
            );
            assert!(backoff_delay(10) <= BACKOFF_CAP);
            assert!(backoff_delay(u32::MAX) <= BACKOFF_CAP);
        }
    }

    #[test]
    fn retry_after_parsing() {
        assert_eq!(parse_retry_after("0"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(" 2 "), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("120"), Some(RETRY_AFTER_CAP));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn truncation_counts_chars() {
        assert_eq!(truncate_chars("héllo", 2), "hé");
        assert_eq!(truncate_chars("abc", 10), "abc");
        assert_eq!(truncate_chars(&"界".repeat(300), 200).chars().count(), 200);
    }
}
