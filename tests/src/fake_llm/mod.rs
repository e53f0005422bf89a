//! A scripted OpenAI-compatible server for tests.
//!
//! [`FakeLlm::start`] binds a real HTTP server on `127.0.0.1:0` that serves
//! `POST /v1/chat/completions` and, for coding agents such as Codex, OpenAI's
//! Responses API `POST /v1/responses` ([`responses`]). For each request a caller-supplied closure
//! looks at what arrived ([`Seen`]) and chooses what to do ([`Script`]):
//! answer, fail with a status, hang, or wait first. Every request is recorded
//! so tests can assert on the model, messages, response format and
//! `Authorization` header the client sent. Other paths get 404.
//!
//! [`BotLlm`] builds the usual script for a mesh of bots (a verdict per bot for judge
//! calls, a text per bot for replies) so tests need not write that closure out.
//!
//! Token usage in replies is a deterministic word count (see
//! [`approx_tokens`]) so tests can predict it.
//!
//! A request with `"stream": true` (a drafting call) is answered as OpenAI streams:
//! `text/event-stream` of `chat.completion.chunk` events, one per word of the scripted
//! text, a last chunk with `finish_reason: "stop"`, a usage chunk when
//! `stream_options.include_usage` is set, then `data: [DONE]`. [`Script::Stream`] may
//! pause after the first line, and [`FakeLlm::streams`] tells how many chunks of each
//! stream were handed to the connection and whether the client went away first.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::serve::{serve_http, HttpServer, Reply};

pub mod responses;

/// Which of the server's APIs a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions` (botmesh, opencode).
    ChatCompletions,
    /// `POST /v1/responses` (Codex): `instructions` and `input` items instead of
    /// `messages`, answered as a stream of `response.*` events.
    Responses,
}

/// What the scripted server does for one request.
#[derive(Clone, Debug)]
pub enum Script {
    /// Answer 200 with this content in a full chat-completion object; usage is
    /// `prompt_tokens` = [`approx_tokens`] summed over the request's message
    /// contents and `completion_tokens` = [`approx_tokens`] of this text.
    Reply(String),
    /// Answer with this status (invalid codes become 500) and an
    /// OpenAI-style JSON error body, without `Retry-After`.
    Status(u16),
    /// Answer with exactly this status, extra headers and body, for cases the
    /// other variants cannot express (`Retry-After`, malformed bodies, null
    /// content…). Invalid header names or values are skipped.
    Raw {
        /// HTTP status code (invalid codes become 500).
        status: u16,
        /// Extra response headers, e.g. `("Retry-After", "0")`.
        headers: Vec<(String, String)>,
        /// Response body sent verbatim (served as `application/json`).
        body: String,
    },
    /// Never answer; the connection stays open until the client gives up or
    /// the server shuts down. Tests client timeouts.
    Hang,
    /// Wait this long, then do the inner script. Tests slow servers.
    Delay(Duration, Box<Script>),
    /// Like [`Script::Reply`], but a streaming request's answer pauses for
    /// `pause_after_head` after the chunk that completes the text's first line (a
    /// non-streaming request gets the whole text at once). Tests drafting calls: what
    /// the client does with the head while the rest is still coming.
    Stream {
        /// The whole answer, first line and rest.
        text: String,
        /// How long the stream stops after the first line.
        pause_after_head: Duration,
    },
    /// Ask for tool calls: `(id, function name, arguments JSON text)` each, with
    /// `finish_reason: "tool_calls"`, after the content `text` (may be empty: then
    /// `content` is null). A streaming request gets them as OpenAI streams them: the
    /// text first, then `delta.tool_calls[{index, id, function{name, arguments}}]`, the
    /// arguments split over several chunks, accumulated by index.
    ToolCalls {
        /// Content before the calls (a drafting answer's verdict line).
        text: String,
        /// The calls.
        calls: Vec<(String, String, String)>,
    },
    /// Answer a streaming request 200 with this raw `text/event-stream` body, sent in
    /// pieces of `piece` bytes (at least 1), to test the client's event parsing.
    RawStream {
        /// The body, sent verbatim.
        body: String,
        /// Bytes per piece.
        piece: usize,
    },
}

impl Script {
    /// Shorthand for [`Script::Reply`].
    pub fn reply(text: impl Into<String>) -> Self {
        Script::Reply(text.into())
    }

    /// Shorthand for [`Script::Delay`].
    pub fn delay(delay: Duration, then: Script) -> Self {
        Script::Delay(delay, Box::new(then))
    }

    /// Shorthand for [`Script::ToolCalls`] with one call.
    pub fn tool_call(id: &str, name: &str, arguments: serde_json::Value) -> Self {
        Script::ToolCalls {
            text: String::new(),
            calls: vec![(id.into(), name.into(), arguments.to_string())],
        }
    }

    /// Shorthand for [`Script::Stream`].
    pub fn stream(text: impl Into<String>, pause_after_head: Duration) -> Self {
        Script::Stream {
            text: text.into(),
            pause_after_head,
        }
    }
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The request's `model` field (empty if missing).
    pub model: String,
    /// `(role, content)` of each message, in order; non-string content is
    /// flattened (text parts joined) so tests can compare plain strings.
    pub messages: Vec<(String, String)>,
    /// `"draft"` when the request streams, else `"judge"` when the body has
    /// `response_format`, else `"reply"`; `None` when the body is not a JSON object.
    pub purpose_hint: Option<String>,
    /// The request asked for a streamed answer (`"stream": true`): a drafting call.
    pub stream: bool,
    /// The whole request body (`Null` if it was not JSON).
    pub body: serde_json::Value,
    /// The raw `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The API the request came to.
    pub api: Api,
}

impl Seen {
    /// The names of the function tools the request offers (`tools[].function.name`;
    /// for the Responses API `tools[].name`).
    pub fn tools(&self) -> Vec<String> {
        self.body
            .get("tools")
            .and_then(Value::as_array)
            .map(|t| {
                t.iter()
                    .filter_map(|t| {
                        t.pointer("/function/name")
                            .or_else(|| t.get("name"))
                            .and_then(Value::as_str)
                    })
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The request's `tool` messages: `(tool_call_id, content)`, in order (for the
    /// Responses API, its `function_call_output` input items: `(call_id, output)`).
    pub fn tool_results(&self) -> Vec<(String, String)> {
        if self.api == Api::Responses {
            return responses::tool_results(&self.body);
        }
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"))
                    .map(|m| {
                        (
                            m.get("tool_call_id")
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_string(),
                            flatten_content(m.get("content")),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn new(body: Value, authorization: Option<String>, api: Api) -> Self {
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if api == Api::Responses {
            return Seen {
                model,
                messages: responses::messages(&body),
                purpose_hint: body.as_object().map(|_| "agent".to_string()),
                stream: body.get("stream").and_then(Value::as_bool) == Some(true),
                body,
                authorization,
                api,
            };
        }
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|m| {
                        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
                        (role.to_string(), flatten_content(m.get("content")))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
        let purpose_hint = body.as_object().map(|o| {
            if stream {
                "draft".to_string()
            } else if o.contains_key("response_format") {
                "judge".to_string()
            } else {
                "reply".to_string()
            }
        });
        Seen {
            model,
            messages,
            purpose_hint,
            stream,
            body,
            authorization,
            api,
        }
    }
}

pub(crate) fn flatten_content(content: Option<&Value>) -> String {
    match content {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        Some(other) => other.to_string(),
    }
}

/// The fake's token count for `text`: its number of whitespace-separated
/// words, so tests can compute expected usage.
pub fn approx_tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// A script that plays `scripts` in order, one per request, then repeats the
/// last one forever (an empty list always answers 500). Handy for "fail, then
/// succeed" retry tests.
pub fn sequence(scripts: Vec<Script>) -> impl Fn(&Seen) -> Script + Send + Sync + 'static {
    let next = AtomicUsize::new(0);
    move |_: &Seen| {
        let i = next.fetch_add(1, Ordering::SeqCst);
        match scripts.get(i).or_else(|| scripts.last()) {
            Some(script) => script.clone(),
            None => Script::Status(500),
        }
    }
}

/// A judge's answer as a model writes it: `{"speak": …, "relevance": …}`.
///
/// Exists so tests script verdicts by value instead of spelling the JSON each time.
pub fn verdict(speak: bool, relevance: f64) -> Script {
    Script::reply(verdict_text(speak, relevance))
}

/// The text [`verdict`] answers, also the first line of a drafting answer.
fn verdict_text(speak: bool, relevance: f64) -> String {
    format!("{{\"speak\": {speak}, \"relevance\": {relevance}}}")
}

/// The LLM of a whole test mesh, scripted by bot: what each bot's judge call says
/// ([`verdict`]) and what its reply call writes. Which bot a request is for is read from
/// its prompt ([`crate::bot_of`]); a judge call is one that asks for a response format
/// ([`crate::is_judge`]).
///
/// Exists because the mesh tests all want this one closure (judge by bot, reply by
/// bot) and used to write it out inline, each a little differently.
#[derive(Clone)]
pub struct BotLlm {
    verdict: (bool, f64),
    verdicts: Vec<(String, (bool, f64))>,
    only_about: Option<String>,
    reply: Arc<dyn Fn(&str) -> String + Send + Sync>,
    reply_scripts: Vec<(String, Script)>,
    /// Bots whose judge answers only after this long (a slow judge).
    judge_delays: Vec<(String, Duration)>,
    /// How long a drafting answer stops after its verdict line.
    draft_pause: Duration,
}

impl BotLlm {
    /// Every bot's judge says `speak` at `relevance`; every reply is `ok` until
    /// [`BotLlm::replies`] says otherwise.
    pub fn judging(speak: bool, relevance: f64) -> BotLlm {
        BotLlm {
            verdict: (speak, relevance),
            verdicts: Vec::new(),
            only_about: None,
            reply: Arc::new(|_| "ok".to_string()),
            reply_scripts: Vec::new(),
            judge_delays: Vec::new(),
            draft_pause: Duration::ZERO,
        }
    }

    /// Drafting answers stop this long after their verdict line before the reply
    /// follows (see [`BotLlm::answer`]).
    pub fn drafts_pausing(mut self, pause: Duration) -> BotLlm {
        self.draft_pause = pause;
        self
    }

    /// Bot `bot`'s judge answers about the scripted message only after `delay`.
    pub fn judge_after(mut self, bot: &str, delay: Duration) -> BotLlm {
        self.judge_delays.push((bot.to_string(), delay));
        self
    }

    /// Bot `bot`'s judge says `speak` at `relevance` instead.
    pub fn judge(mut self, bot: &str, speak: bool, relevance: f64) -> BotLlm {
        self.verdicts.push((bot.to_string(), (speak, relevance)));
        self
    }

    /// Judge calls whose prompt does not contain `marker` say no (`speak: false`,
    /// relevance 0): only the message carrying it gets the verdicts set here.
    pub fn judging_only(mut self, marker: &str) -> BotLlm {
        self.only_about = Some(marker.to_string());
        self
    }

    /// Reply calls write `text(bot)` for the bot they are for.
    pub fn replies(mut self, text: impl Fn(&str) -> String + Send + Sync + 'static) -> BotLlm {
        self.reply = Arc::new(text);
        self
    }

    /// Bot `bot`'s reply calls get `script` instead (a failure, a delay…).
    pub fn reply_with(mut self, bot: &str, script: Script) -> BotLlm {
        self.reply_scripts.push((bot.to_string(), script));
        self
    }

    /// What bot `bot`'s judge says about `seen`: `None` when the call is not about
    /// the scripted message ([`BotLlm::judging_only`]).
    fn verdict_of(&self, seen: &Seen, bot: &str) -> Option<(bool, f64)> {
        let about = self
            .only_about
            .as_deref()
            .is_none_or(|marker| seen.messages.iter().any(|(_, c)| c.contains(marker)));
        about.then(|| {
            self.verdicts
                .iter()
                .find(|(b, _)| *b == bot)
                .map_or(self.verdict, |(_, v)| *v)
        })
    }

    /// What the server answers to `seen`. A drafting (streaming) call gets the bot's
    /// verdict line and, when it speaks, its reply text after it, pausing in between as
    /// [`BotLlm::drafts_pausing`] says and starting after the bot's judge delay; of the
    /// [`BotLlm::reply_with`] scripts, only a [`Script::Reply`] text applies to a draft.
    pub fn answer(&self, seen: &Seen) -> Script {
        if let Some(bots) = crate::shared_judge_bots(seen) {
            // The shared judge: every bot's entry in one object.
            let mut all = serde_json::Map::new();
            for b in bots {
                let (speak, relevance) = self.verdict_of(seen, &b).unwrap_or((false, 0.0));
                all.insert(b, json!({"speak": speak, "relevance": relevance}));
            }
            return Script::Reply(Value::Object(all).to_string());
        }
        let bot = crate::bot_of(seen);
        if crate::is_draft(seen) {
            // A drafting call: the verdict line, then (when speaking) the reply, streamed.
            let (speak, relevance) = self.verdict_of(seen, &bot).unwrap_or((false, 0.0));
            let mut text = verdict_text(speak, relevance);
            if speak {
                text.push('\n');
                match self.reply_scripts.iter().find(|(b, _)| *b == bot) {
                    Some((_, Script::Reply(rest))) => text.push_str(rest),
                    _ => text.push_str(&(self.reply)(&bot)),
                }
            }
            let draft = Script::stream(text, self.draft_pause);
            return match self.judge_delays.iter().find(|(b, _)| *b == bot) {
                Some((_, d)) => Script::delay(*d, draft),
                None => draft,
            };
        }
        if crate::is_judge(seen) {
            let Some((speak, relevance)) = self.verdict_of(seen, &bot) else {
                return verdict(false, 0.0);
            };
            return match self.judge_delays.iter().find(|(b, _)| *b == bot) {
                Some((_, d)) => Script::delay(*d, verdict(speak, relevance)),
                None => verdict(speak, relevance),
            };
        }
        match self.reply_scripts.iter().find(|(b, _)| *b == bot) {
            Some((_, script)) => script.clone(),
            None => Script::Reply((self.reply)(&bot)),
        }
    }

    /// Starts a [`FakeLlm`] answering by this script.
    pub async fn start(self) -> FakeLlm {
        FakeLlm::start(move |seen| self.answer(seen)).await
    }
}

type ScriptFn = dyn Fn(&Seen) -> Script + Send + Sync;

/// What every request handler shares: the script, what was seen, the streams.
pub(crate) struct State {
    script: Box<ScriptFn>,
    seen: Mutex<Vec<Seen>>,
    /// One log per streamed answer, in the order they started.
    streams: Mutex<Vec<Arc<StreamLog>>>,
    next_id: AtomicU64,
}

impl State {
    fn seen(&self) -> MutexGuard<'_, Vec<Seen>> {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn streams(&self) -> MutexGuard<'_, Vec<Arc<StreamLog>>> {
        self.streams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How far one streamed answer got: what [`FakeLlm::streams`] reports.
///
/// Exists so tests can tell that a client that drops a drafting call's rest really
/// closed the connection: the stream stops being sent part-way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Streamed {
    /// Events the answer was made of (every chunk, the usage chunk and `[DONE]`).
    pub chunks: usize,
    /// Events handed to the connection so far.
    pub written: usize,
    /// Every event was handed to the connection.
    pub completed: bool,
    /// The connection let go of the answer before it was complete: the client went away.
    pub abandoned: bool,
}

/// The live counters behind a [`Streamed`].
struct StreamLog {
    chunks: usize,
    written: AtomicUsize,
    completed: AtomicBool,
    closed: AtomicBool,
}

/// The events still to send of one streamed answer; dropped when the connection lets
/// go of the body (at its end, or when the client goes away), which it records.
struct Feed {
    /// Each event with the pause before it.
    events: VecDeque<(Duration, Bytes)>,
    log: Arc<StreamLog>,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.log.closed.store(true, Ordering::SeqCst);
    }
}

/// The body of every answer: whole, or streamed.
pub(crate) type LlmBody = UnsyncBoxBody<Bytes, Infallible>;

/// A running scripted server; stops when shut down or dropped.
pub struct FakeLlm {
    /// Base URL to put in an endpoint config: `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    state: Arc<State>,
    server: HttpServer,
}

impl fmt::Debug for FakeLlm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeLlm")
            .field("base_url", &self.base_url)
            .field("requests", &self.count())
            .finish()
    }
}

impl FakeLlm {
    /// Starts a server whose answer for each request is computed by `script` from the request.
    ///
    /// Panics if it cannot bind a loopback port (test support only).
    pub async fn start(script: impl Fn(&Seen) -> Script + Send + Sync + 'static) -> FakeLlm {
        let state = Arc::new(State {
            script: Box::new(script),
            seen: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
        });
        let handler_state = state.clone();
        let server = serve_http(move |req| handle(handler_state.clone(), req)).await;
        FakeLlm {
            base_url: format!("{}/v1", server.url()),
            state,
            server,
        }
    }

    /// Every chat-completions request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Seen> {
        self.state.seen().clone()
    }

    /// How many connections clients opened so far.
    pub fn connections(&self) -> usize {
        self.server.connections()
    }

    /// How many chat-completions requests were received so far.
    pub fn count(&self) -> usize {
        self.state.seen().len()
    }

    /// Which bot each judge call so far was for, in arrival order.
    ///
    /// Exists because mesh tests count who judged (see [`BotLlm`]).
    pub fn judge_bots(&self) -> Vec<String> {
        self.bots_of(crate::is_judge)
    }

    /// Which bot each reply call so far was for, in arrival order.
    ///
    /// Exists because mesh tests check who wrote an answer (see [`BotLlm`]).
    pub fn reply_bots(&self) -> Vec<String> {
        self.bots_of(|s| !crate::is_draft(s) && !crate::is_judge(s))
    }

    /// Which bot each drafting (streaming) call so far was for, in arrival order.
    ///
    /// Exists because mesh tests with drafting judges count who drafted.
    pub fn draft_bots(&self) -> Vec<String> {
        self.bots_of(crate::is_draft)
    }

    fn bots_of(&self, which: impl Fn(&Seen) -> bool) -> Vec<String> {
        self.state
            .seen()
            .iter()
            .filter(|s| which(s))
            .map(crate::bot_of)
            .collect()
    }

    /// Every streamed answer so far, in the order they were started.
    pub fn streams(&self) -> Vec<Streamed> {
        self.state
            .streams()
            .iter()
            .map(|log| {
                let completed = log.completed.load(Ordering::SeqCst);
                Streamed {
                    chunks: log.chunks,
                    written: log.written.load(Ordering::SeqCst),
                    completed,
                    abandoned: log.closed.load(Ordering::SeqCst) && !completed,
                }
            })
            .collect()
    }

    /// Stops accepting, closes the listening port and drops every open
    /// connection (including hanging ones), then returns.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<LlmBody> {
    let api = match req.uri().path() {
        "/v1/chat/completions" => Api::ChatCompletions,
        "/v1/responses" => Api::Responses,
        _ => return whole(error_response(404, "no such route")),
    };
    if req.method() != Method::POST {
        return whole(error_response(405, "use POST"));
    }
    let authorization = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return whole(error_response(400, "could not read body")),
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let seen = Seen::new(body, authorization, api);
    state.seen().push(seen.clone());
    if !seen.body.is_object() {
        return whole(error_response(400, "body is not a JSON object"));
    }
    let mut script = (state.script)(&seen);
    loop {
        if api == Api::Responses {
            match script {
                Script::Delay(delay, then) => {
                    tokio::time::sleep(delay).await;
                    script = *then;
                    continue;
                }
                Script::Hang => std::future::pending::<()>().await,
                Script::Status(status) => {
                    return whole(error_response(status, "scripted failure"));
                }
                Script::Reply(text) | Script::Stream { text, .. } => {
                    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
                    let items = responses::Output::text(id, &text);
                    return responses::answer(&state, &seen, id, items);
                }
                Script::ToolCalls { text, calls } => {
                    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
                    let items = responses::Output::calls(id, &seen.body, &text, &calls);
                    return responses::answer(&state, &seen, id, items);
                }
                // Raw bodies are the caller's own: sent as they are.
                Script::Raw { .. } | Script::RawStream { .. } => {}
            }
        }
        match script {
            Script::Delay(delay, then) => {
                tokio::time::sleep(delay).await;
                script = *then;
            }
            Script::Hang => std::future::pending::<()>().await,
            Script::Status(status) => {
                return whole(error_response(status, "scripted failure"));
            }
            Script::Raw {
                status,
                headers,
                body,
            } => {
                let mut response = json_response(status, body);
                for (name, value) in headers {
                    if let (Ok(name), Ok(value)) = (
                        HeaderName::from_bytes(name.as_bytes()),
                        HeaderValue::from_str(&value),
                    ) {
                        response.headers_mut().append(name, value);
                    }
                }
                return whole(response);
            }
            Script::Reply(text) | Script::Stream { text, .. } if !seen.stream => {
                let id = state.next_id.fetch_add(1, Ordering::Relaxed);
                return whole(json_response(200, completion_body(id, &seen, &text)));
            }
            Script::Reply(text) => {
                let events = chunk_events(&state, &seen, &text, Duration::ZERO);
                return event_stream(&state, events);
            }
            Script::Stream {
                text,
                pause_after_head,
            } => {
                let events = chunk_events(&state, &seen, &text, pause_after_head);
                return event_stream(&state, events);
            }
            Script::ToolCalls { text, calls } if !seen.stream => {
                let id = state.next_id.fetch_add(1, Ordering::Relaxed);
                return whole(json_response(
                    200,
                    tool_calls_body(id, &seen, &text, &calls),
                ));
            }
            Script::ToolCalls { text, calls } => {
                let events = tool_call_events(&state, &seen, &text, &calls);
                return event_stream(&state, events);
            }
            Script::RawStream { body, piece } => {
                let events = Bytes::from(body)
                    .chunks(piece.max(1))
                    .map(|c| (Duration::ZERO, Bytes::copy_from_slice(c)))
                    .collect();
                return event_stream(&state, events);
            }
        }
    }
}

/// A whole-body answer as the handler's body type.
pub(crate) fn whole(reply: Reply) -> Response<LlmBody> {
    reply.map(BodyExt::boxed_unsync)
}

/// The events of OpenAI's streamed answer with content `text`, one chunk per word (a
/// word keeps the whitespace after it), each with the pause before it: `pause_after_head`
/// before the chunk after the one that completes the first non-empty line.
fn chunk_events(
    state: &State,
    seen: &Seen,
    text: &str,
    pause_after_head: Duration,
) -> VecDeque<(Duration, Bytes)> {
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": format!("chatcmpl-fake-{id}"),
            "object": "chat.completion.chunk",
            "created": created,
            "model": seen.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let mut events = VecDeque::new();
    let mut pause = Duration::ZERO;
    let mut head_done = false;
    let mut so_far = String::new();
    let mut push = |pause: &mut Duration, value: Value| {
        let data = Bytes::from(format!("data: {value}\n\n"));
        events.push_back((std::mem::take(pause), data));
    };
    push(
        &mut pause,
        chunk(json!({"role": "assistant", "content": ""}), None),
    );
    for word in text.split_inclusive(char::is_whitespace) {
        push(&mut pause, chunk(json!({"content": word}), None));
        so_far.push_str(word);
        if !head_done && so_far.trim_start().contains('\n') {
            head_done = true;
            pause = pause_after_head;
        }
    }
    push(&mut pause, chunk(json!({}), Some("stop")));
    if let Some(usage) = usage_chunk(seen, id, approx_tokens(text)) {
        push(&mut pause, usage);
    }
    events.push_back((pause, Bytes::from_static(b"data: [DONE]\n\n")));
    events
}

/// The usage chunk of streamed answer `id` (`completion_tokens` for the answer, the
/// request's [`approx_tokens`] for the prompt), when the request asked for one
/// (`stream_options.include_usage`).
fn usage_chunk(seen: &Seen, id: u64, completion_tokens: u64) -> Option<Value> {
    let include_usage = seen
        .body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        == Some(true);
    let prompt_tokens: u64 = seen.messages.iter().map(|(_, c)| approx_tokens(c)).sum();
    include_usage.then(|| {
        json!({
            "id": format!("chatcmpl-fake-{id}"),
            "object": "chat.completion.chunk",
            "model": seen.model,
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        })
    })
}

/// A 200 `text/event-stream` answer sending `events` one at a time, each after its
/// pause, recorded in a new [`StreamLog`].
pub(crate) fn event_stream(
    state: &State,
    events: VecDeque<(Duration, Bytes)>,
) -> Response<LlmBody> {
    let log = Arc::new(StreamLog {
        chunks: events.len(),
        written: AtomicUsize::new(0),
        completed: AtomicBool::new(false),
        closed: AtomicBool::new(false),
    });
    state.streams().push(log.clone());
    let feed = Feed { events, log };
    let frames = futures_util::stream::unfold(feed, |mut feed| async move {
        let Some((pause, data)) = feed.events.pop_front() else {
            feed.log.completed.store(true, Ordering::SeqCst);
            return None;
        };
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        feed.log.written.fetch_add(1, Ordering::SeqCst);
        Some((Ok::<_, Infallible>(Frame::data(data)), feed))
    });
    let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

/// A chat-completion object asking for `calls` (`finish_reason: "tool_calls"`).
fn tool_calls_body(id: u64, seen: &Seen, text: &str, calls: &[(String, String, String)]) -> String {
    let prompt_tokens: u64 = seen.messages.iter().map(|(_, c)| approx_tokens(c)).sum();
    let completion_tokens: u64 = calls.iter().map(|(_, _, a)| approx_tokens(a) + 1).sum();
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, arguments)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    json!({
        "id": format!("chatcmpl-fake-{id}"),
        "object": "chat.completion",
        "model": seen.model,
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": if text.is_empty() { Value::Null } else { json!(text) },
                "tool_calls": tool_calls,
            },
            "finish_reason": "tool_calls",
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    })
    .to_string()
}

/// The events of a streamed answer asking for `calls`: `text` in one chunk (when not
/// empty), then per call, a first chunk with
/// its index, id, name and the first half of its arguments, then a chunk with the
/// rest (index only, as OpenAI sends them); then `finish_reason: "tool_calls"`, a
/// usage chunk when asked for, and `[DONE]`.
fn tool_call_events(
    state: &State,
    seen: &Seen,
    text: &str,
    calls: &[(String, String, String)],
) -> VecDeque<(Duration, Bytes)> {
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": format!("chatcmpl-fake-{id}"),
            "object": "chat.completion.chunk",
            "model": seen.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let mut events = VecDeque::new();
    let mut push = |value: Value| {
        events.push_back((Duration::ZERO, Bytes::from(format!("data: {value}\n\n"))));
    };
    push(chunk(json!({"role": "assistant", "content": null}), None));
    if !text.is_empty() {
        push(chunk(json!({"content": text}), None));
    }
    for (i, (call_id, name, arguments)) in calls.iter().enumerate() {
        let half = arguments
            .char_indices()
            .nth(arguments.chars().count() / 2)
            .map_or(arguments.len(), |(at, _)| at);
        push(chunk(
            json!({"tool_calls": [{"index": i, "id": call_id, "type": "function",
                "function": {"name": name, "arguments": &arguments[..half]}}]}),
            None,
        ));
        push(chunk(
            json!({"tool_calls": [{"index": i, "function": {"arguments": &arguments[half..]}}]}),
            None,
        ));
    }
    push(chunk(json!({}), Some("tool_calls")));
    let completion_tokens = calls.iter().map(|(_, _, a)| approx_tokens(a) + 1).sum();
    if let Some(usage) = usage_chunk(seen, id, completion_tokens) {
        push(usage);
    }
    events.push_back((Duration::ZERO, Bytes::from_static(b"data: [DONE]\n\n")));
    events
}

/// A chat-completion object shaped like OpenAI's.
fn completion_body(id: u64, seen: &Seen, text: &str) -> String {
    let prompt_tokens: u64 = seen.messages.iter().map(|(_, c)| approx_tokens(c)).sum();
    let completion_tokens = approx_tokens(text);
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({
        "id": format!("chatcmpl-fake-{id}"),
        "object": "chat.completion",
        "created": created,
        "model": seen.model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": text },
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    })
    .to_string()
}

fn error_response(status: u16, message: &str) -> Reply {
    let kind = match status {
        401 | 403 => "authentication_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    let body = json!({
        "error": {
            "message": format!("{message} ({status})"),
            "type": kind,
            "param": null,
            "code": status,
        }
    });
    json_response(status, body.to_string())
}

pub(crate) fn json_response(status: u16, body: String) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
