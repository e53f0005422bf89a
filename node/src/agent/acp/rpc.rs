//! JSON-RPC 2.0 over newline-delimited JSON: ACP's transport over an agent's stdio.
//!
//! One [`Connection`] per agent process. Outgoing requests get integer ids and their
//! answers are matched by id; the agent's own requests (ids may be integers or strings)
//! are answered by a [`Handler`] with the id echoed back exactly, each in its own task
//! (a permission question may wait minutes for a person); its notifications are handled
//! in order, on the reader, so every `session/update` of a turn is seen before the
//! turn's answer. A line that is not JSON, a message over [`MAX_MESSAGE`], the end of
//! the agent's output or the process's exit kill the connection: every call pending
//! then, and every later one, fails with the [`Death`].
//!
//! Why a transport of the node's own, when the messages are the spec maintainers'
//! (`super::messages`): their connection (`agent-client-protocol`'s
//! `ClientSideConnection`) spawns its work as `!Send` futures (`LocalBoxFuture`, a
//! local executor on one thread), while the node's agent handle, its permission
//! questions (which wait minutes for a person) and its supervisor are tasks on the
//! multi-threaded runtime; and it neither bounds a line nor ties a connection's death
//! to the process's exit status, which this one does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

/// The longest message accepted from an agent: a tool call's diff can be large, but a
/// line without end is not a message.
pub(crate) const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// How long the reader keeps reading after the process exited, for its last lines
/// (a grandchild may hold the pipe open for ever).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);

/// Why a connection died when the agent's output ended.
const OUTPUT_ENDED: &str = "its output ended";

/// JSON-RPC's "method not found".
pub(crate) const METHOD_NOT_FOUND: i64 = -32601;

/// An error object of JSON-RPC, sent or received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RpcError {
    /// The error code (`-32601` method not found, …).
    pub(crate) code: i64,
    /// The message that came with it.
    pub(crate) message: String,
}

impl RpcError {
    /// The answer to a method this client does not implement.
    pub(crate) fn method_not_found(method: &str) -> RpcError {
        RpcError {
            code: METHOD_NOT_FOUND,
            message: format!("method not found: {method}"),
        }
    }
}

/// Why a connection is dead: what was seen, and the process's exit status when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Death {
    /// What ended it (`its output ended`, `a line that is not JSON: …`).
    pub(crate) reason: String,
    /// The exit status, e.g. `exit status: 3`, when the process had exited by then.
    pub(crate) status: Option<String>,
}

/// How a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The agent answered with a JSON-RPC error.
    Rpc(RpcError),
    /// The connection died before the answer came.
    Dead(Death),
}

/// One message read from the agent.
#[derive(Debug, PartialEq)]
pub(crate) enum Incoming {
    /// A request: answer it with the same id.
    Request {
        /// The id, an integer or a string, echoed back exactly.
        id: Value,
        /// The method.
        method: String,
        /// Its params (`null` when absent).
        params: Value,
    },
    /// A notification: no answer.
    Notification {
        /// The method.
        method: String,
        /// Its params (`null` when absent).
        params: Value,
    },
    /// The answer to one of this side's requests.
    Response {
        /// The id of the request it answers.
        id: Value,
        /// Its result or error.
        result: Result<Value, RpcError>,
    },
}

/// Reads one line: `Ok(None)` at a JSON value that is not a JSON-RPC message (logged
/// and skipped by the reader), `Err` when the line is not JSON at all (the stream can
/// no longer be trusted).
pub(crate) fn parse_line(line: &str) -> Result<Option<Incoming>, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let Value::Object(mut obj) = value else {
        return Ok(None);
    };
    let params = obj.remove("params").unwrap_or(Value::Null);
    let id = obj.remove("id");
    if let Some(Value::String(method)) = obj.remove("method") {
        return Ok(Some(match id {
            Some(id) if id.is_string() || id.is_number() => {
                Incoming::Request { id, method, params }
            }
            Some(_) => return Ok(None),
            None => Incoming::Notification { method, params },
        }));
    }
    let Some(id) = id else { return Ok(None) };
    let result = match (obj.remove("result"), obj.remove("error")) {
        (_, Some(error)) => Err(RpcError {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(-32603),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)")
                .to_string(),
        }),
        (Some(result), None) => Ok(result),
        (None, None) => Ok(Value::Null),
    };
    Ok(Some(Incoming::Response { id, result }))
}

/// What the agent's requests and notifications are handed to.
pub(crate) trait Handler: Send + Sync + 'static {
    /// Answers a request; [`RpcError::method_not_found`] for a method not implemented.
    fn request(&self, method: &str, params: Value) -> BoxFuture<'static, Result<Value, RpcError>>;
    /// Takes a notification (on the reader: must not block).
    fn notification(&self, method: &str, params: Value);
}

/// A line for the writer, or the order to close the agent's input.
enum Outgoing {
    Line(String),
    Close,
}

/// Calls in flight and whether the connection is dead, under one lock, so a call
/// never starts after the death that would have failed it.
#[derive(Default)]
struct Calls {
    pending: HashMap<u64, oneshot::Sender<Result<Value, CallError>>>,
    dead: Option<Death>,
}

/// State shared by the connection's handle and its reader and writer tasks.
struct Shared {
    calls: Mutex<Calls>,
    /// Set once the client closed the agent's input (it is being stopped): the end of
    /// the connection that follows is expected, not a death worth a warning.
    closing: std::sync::atomic::AtomicBool,
    died: watch::Sender<Option<Death>>,
    /// The process's exit status once it exited (`None` before, and for a test's pipe).
    exit: watch::Receiver<Option<String>>,
}

impl Shared {
    /// Marks the connection dead (once) and fails every pending call.
    fn die(&self, reason: String) {
        let death = Death {
            reason,
            status: self.exit.borrow().clone(),
        };
        let pending = {
            let mut calls = self.calls.lock();
            if calls.dead.is_some() {
                return;
            }
            calls.dead = Some(death.clone());
            std::mem::take(&mut calls.pending)
        };
        for (_, tx) in pending {
            let _ = tx.send(Err(CallError::Dead(death.clone())));
        }
        self.died.send_replace(Some(death));
    }
}

/// One JSON-RPC connection to an agent.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    out: mpsc::UnboundedSender<Outgoing>,
    next_id: AtomicU64,
}

/// Removes a call's entry when its future is dropped before the answer (a turn lost).
struct PendingGuard<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.calls.lock().pending.remove(&self.id);
    }
}

impl Connection {
    /// Starts the reader and the writer over `reader` (the agent's stdout) and
    /// `writer` (its stdin). `exit` carries the process's exit status once it exits.
    pub(crate) fn start(
        reader: impl AsyncRead + Send + Unpin + 'static,
        writer: impl AsyncWrite + Send + Unpin + 'static,
        handler: Arc<dyn Handler>,
        exit: watch::Receiver<Option<String>>,
        label: String,
    ) -> Arc<Connection> {
        let shared = Arc::new(Shared {
            calls: Mutex::new(Calls::default()),
            closing: std::sync::atomic::AtomicBool::new(false),
            died: watch::Sender::new(None),
            exit,
        });
        let (out, rx) = mpsc::unbounded_channel();
        let conn = Arc::new(Connection {
            shared: shared.clone(),
            out: out.clone(),
            next_id: AtomicU64::new(0),
        });
        tokio::spawn(write_loop(writer, rx, shared.clone(), label.clone()));
        tokio::spawn(read_loop(
            BufReader::new(reader),
            shared,
            handler,
            out,
            label,
        ));
        conn
    }

    /// Sends a request and waits for its answer.
    pub(crate) async fn call(&self, method: &str, params: Value) -> Result<Value, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut calls = self.shared.calls.lock();
            if let Some(death) = &calls.dead {
                return Err(CallError::Dead(death.clone()));
            }
            calls.pending.insert(id, tx);
        }
        let _guard = PendingGuard {
            shared: &self.shared,
            id,
        };
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(line);
        match rx.await {
            Ok(answer) => answer,
            Err(_) => Err(CallError::Dead(self.death().unwrap_or(Death {
                reason: "the connection was dropped".into(),
                status: None,
            }))),
        }
    }

    /// Sends a notification (no answer). Synchronous, so a drop guard can send it.
    pub(crate) fn notify(&self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    fn send(&self, message: Value) {
        // A send after the writer ended is lost on purpose: the connection is dead or
        // closing, and the reader reports it.
        let _ = self.out.send(Outgoing::Line(message.to_string()));
    }

    /// Closes the agent's input once what was sent before is written.
    pub(crate) fn close_input(&self) {
        self.shared
            .closing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.out.send(Outgoing::Close);
    }

    /// Why the connection died, if it has.
    pub(crate) fn death(&self) -> Option<Death> {
        self.shared.calls.lock().dead.clone()
    }

    /// Waits until the connection is dead and says why.
    pub(crate) async fn dead(&self) -> Death {
        let mut rx = self.shared.died.subscribe();
        let death = match rx.wait_for(Option::is_some).await {
            Ok(death) => death.clone(),
            Err(_) => None,
        };
        death.unwrap_or_else(unreachable_death)
    }
}

/// The sender lives in `Shared`, which this very handle holds: the channel cannot close.
fn unreachable_death() -> Death {
    Death {
        reason: "the connection's state was dropped".into(),
        status: None,
    }
}

/// Writes lines to the agent until told to close its input or the pipe breaks.
async fn write_loop(
    mut writer: impl AsyncWrite + Unpin,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    shared: Arc<Shared>,
    label: String,
) {
    while let Some(out) = rx.recv().await {
        let Outgoing::Line(mut line) = out else {
            tracing::debug!(agent = %label, "closing the ACP agent's input");
            break;
        };
        line.push('\n');
        let written = async {
            writer.write_all(line.as_bytes()).await?;
            writer.flush().await
        };
        if let Err(e) = written.await {
            shared.die(format!("writing to its input failed: {e}"));
            break;
        }
    }
    let _ = writer.shutdown().await;
}

/// Reads one `\n`-ended line into `buf` (without the `\n`), keeping at most `max`
/// bytes and discarding the rest of a longer line. `Ok(None)` at the end of the
/// stream; `Ok(Some(true))` when the line was cut.
pub(crate) async fn read_bounded_line(
    reader: &mut (impl AsyncBufRead + Unpin),
    max: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut cut = false;
    let mut any = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(any.then_some(cut));
        }
        any = true;
        let (part, used, end) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], i + 1, true),
            None => (chunk, chunk.len(), false),
        };
        let room = max.saturating_sub(buf.len());
        if part.len() > room {
            cut = true;
        }
        buf.extend_from_slice(&part[..part.len().min(room)]);
        reader.consume(used);
        if end {
            return Ok(Some(cut));
        }
    }
}

/// Reads the agent's messages and dispatches them until the connection dies.
async fn read_loop(
    mut reader: impl AsyncBufRead + Unpin,
    shared: Arc<Shared>,
    handler: Arc<dyn Handler>,
    out: mpsc::UnboundedSender<Outgoing>,
    label: String,
) {
    let mut exit = shared.exit.clone();
    let mut exited: Option<tokio::time::Instant> = None;
    let mut watching = true;
    let mut buf = Vec::new();
    let reason = loop {
        // One read per line, never dropped half way: the exit only starts a deadline.
        let line = {
            let read = read_bounded_line(&mut reader, MAX_MESSAGE, &mut buf);
            tokio::pin!(read);
            loop {
                let drained = async {
                    match exited {
                        Some(deadline) => tokio::time::sleep_until(deadline).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    line = &mut read => break Some(line),
                    seen = exit.wait_for(Option::is_some), if exited.is_none() && watching => {
                        // A closed channel (no process behind the pipes) is no exit.
                        match seen {
                            Ok(_) => exited = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT),
                            Err(_) => watching = false,
                        }
                    }
                    _ = drained => break None,
                }
            }
        };
        let Some(line) = line else {
            break "it exited".to_string();
        };
        match line {
            Err(e) => break format!("reading its output failed: {e}"),
            Ok(None) => break OUTPUT_ENDED.to_string(),
            Ok(Some(true)) => break format!("it sent a message over {MAX_MESSAGE} bytes"),
            Ok(Some(false)) => {}
        }
        let text = String::from_utf8_lossy(&buf);
        if text.trim().is_empty() {
            continue;
        }
        match parse_line(&text) {
            Err(e) => {
                break format!(
                    "it sent a line that is not JSON ({e}): {:?}",
                    text.chars().take(120).collect::<String>()
                )
            }
            Ok(None) => {
                tracing::warn!(agent = %label, "ignoring a JSON line that is not a JSON-RPC message")
            }
            Ok(Some(message)) => dispatch(message, &shared, &handler, &out, &label),
        }
    };
    let ended = reason == OUTPUT_ENDED;
    if ended && exited.is_none() && shared.exit.borrow().is_none() {
        // The output ended first: the exit status usually follows at once.
        let mut exit = shared.exit.clone();
        let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, exit.wait_for(Option::is_some)).await;
    }
    let status = shared.exit.borrow().clone();
    if shared.closing.load(std::sync::atomic::Ordering::Relaxed) {
        // Stopped by the client (the node shutting down, or a restart): expected.
        tracing::info!(agent = %label, reason = %reason, ?status, "the ACP connection ended after its input was closed");
    } else {
        tracing::warn!(agent = %label, reason = %reason, ?status, "the ACP connection is dead");
    }
    shared.die(reason);
}

/// Hands one message to its place: a pending call, the handler, or the log.
fn dispatch(
    message: Incoming,
    shared: &Arc<Shared>,
    handler: &Arc<dyn Handler>,
    out: &mpsc::UnboundedSender<Outgoing>,
    label: &str,
) {
    match message {
        Incoming::Response { id, result } => {
            let tx = id
                .as_u64()
                .and_then(|n| shared.calls.lock().pending.remove(&n));
            match tx {
                Some(tx) => {
                    let _ = tx.send(result.map_err(CallError::Rpc));
                }
                None => {
                    tracing::debug!(agent = %label, id = %id, "an answer to no pending call (a call given up)")
                }
            }
        }
        Incoming::Notification { method, params } => handler.notification(&method, params),
        Incoming::Request { id, method, params } => {
            let answer = handler.request(&method, params);
            let out = out.clone();
            tokio::spawn(async move {
                let message = match answer.await {
                    Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                    Err(e) => json!({"jsonrpc": "2.0", "id": id,
                        "error": {"code": e.code, "message": e.message}}),
                };
                let _ = out.send(Outgoing::Line(message.to_string()));
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncWriteExt, DuplexStream};

    /// Answers `echo` with its params; nothing else.
    struct Echo {
        seen: Mutex<Vec<String>>,
    }

    impl Handler for Echo {
        fn request(
            &self,
            method: &str,
            params: Value,
        ) -> BoxFuture<'static, Result<Value, RpcError>> {
            let answer = if method == "echo" {
                Ok(params)
            } else {
                Err(RpcError::method_not_found(method))
            };
            Box::pin(async move { answer })
        }
        fn notification(&self, method: &str, _params: Value) {
            self.seen.lock().push(method.to_string());
        }
    }

    /// A connection and the agent's ends of its pipes: the connection, the agent's
    /// output (to write to it), what it sent (to read), the handler, its exit status.
    type Pipe = (
        Arc<Connection>,
        DuplexStream,
        tokio::io::Lines<BufReader<DuplexStream>>,
        Arc<Echo>,
        watch::Sender<Option<String>>,
    );

    /// A connection over in-memory pipes: (connection, the agent's end to write to it,
    /// the agent's end to read what it sent, the handler).
    fn pipe() -> Pipe {
        let (client_out, agent_in) = tokio::io::duplex(1 << 16);
        let (agent_out, client_in) = tokio::io::duplex(1 << 16);
        let handler = Arc::new(Echo {
            seen: Mutex::new(Vec::new()),
        });
        let (exit_tx, exit) = watch::channel(None);
        let conn = Connection::start(client_in, client_out, handler.clone(), exit, "t".into());
        (
            conn,
            agent_out,
            BufReader::new(agent_in).lines(),
            handler,
            exit_tx,
        )
    }

    /// Calls `method` in a task, so the test can play the agent meanwhile.
    fn call_in_task(
        conn: &Arc<Connection>,
        method: &'static str,
    ) -> tokio::task::JoinHandle<Result<Value, CallError>> {
        let conn = conn.clone();
        tokio::spawn(async move { conn.call(method, json!({})).await })
    }

    /// How the call failed (within 5 s).
    async fn death_of(call: tokio::task::JoinHandle<Result<Value, CallError>>) -> Death {
        match tokio::time::timeout(Duration::from_secs(5), call).await {
            Ok(Ok(Err(CallError::Dead(death)))) => death,
            other => panic!("the call should fail with the connection: {other:?}"),
        }
    }

    async fn next_json(lines: &mut tokio::io::Lines<BufReader<DuplexStream>>) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line())
            .await
            .expect("a line in time")
            .expect("reads")
            .expect("not at the end");
        serde_json::from_str(&line).expect("JSON")
    }

    #[tokio::test]
    async fn answers_are_matched_by_id_in_any_order() {
        let (conn, mut agent, mut sent, _, _exit) = pipe();
        let a = call_in_task(&conn, "first");
        let first = next_json(&mut sent).await;
        let b = call_in_task(&conn, "second");
        let second = next_json(&mut sent).await;
        assert_eq!(first["method"], "first");
        assert_eq!(first["jsonrpc"], "2.0");
        assert_ne!(first["id"], second["id"]);
        let answer = format!(
            "{}\n{}\n",
            json!({"jsonrpc": "2.0", "id": second["id"], "result": "two"}),
            json!({"jsonrpc": "2.0", "id": first["id"], "error": {"code": -32000, "message": "no"}})
        );
        agent.write_all(answer.as_bytes()).await.unwrap();
        assert_eq!(b.await.unwrap(), Ok(json!("two")));
        assert_eq!(
            a.await.unwrap(),
            Err(CallError::Rpc(RpcError {
                code: -32000,
                message: "no".into()
            }))
        );
    }

    #[tokio::test]
    async fn incoming_ids_are_echoed_exactly_and_unknown_methods_get_32601() {
        let (_conn, mut agent, mut sent, handler, _exit) = pipe();
        let lines = [
            json!({"jsonrpc": "2.0", "id": "3f2c-uuid", "method": "echo", "params": {"x": 1}}),
            json!({"jsonrpc": "2.0", "id": 0, "method": "fs/read_text_file", "params": {}}),
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {}}),
        ];
        for l in &lines {
            agent.write_all(format!("{l}\n").as_bytes()).await.unwrap();
        }
        let mut answers = [next_json(&mut sent).await, next_json(&mut sent).await];
        answers.sort_by_key(|a| a["id"].is_string());
        assert_eq!(answers[0]["id"], json!(0));
        assert_eq!(answers[0]["error"]["code"], json!(METHOD_NOT_FOUND));
        assert_eq!(answers[1]["id"], json!("3f2c-uuid"));
        assert_eq!(answers[1]["result"], json!({"x": 1}));
        assert_eq!(*handler.seen.lock(), ["session/update"]);
    }

    #[tokio::test]
    async fn a_garbage_line_kills_the_connection_and_every_pending_call() {
        let (conn, mut agent, mut sent, _, _exit) = pipe();
        let call = call_in_task(&conn, "slow");
        next_json(&mut sent).await;
        agent
            .write_all(b"Traceback (most recent call last):\n")
            .await
            .unwrap();
        let death = death_of(call).await;
        assert!(death.reason.contains("not JSON"), "{death:?}");
        assert_eq!(conn.dead().await, death);
        assert!(matches!(
            conn.call("later", json!({})).await,
            Err(CallError::Dead(_))
        ));
    }

    #[tokio::test]
    async fn the_end_of_output_kills_it_with_the_exit_status() {
        let (conn, agent, mut sent, _, exit) = pipe();
        let call = call_in_task(&conn, "x");
        next_json(&mut sent).await;
        exit.send_replace(Some("exit status: 3".into()));
        drop(agent);
        let death = death_of(call).await;
        assert_eq!(death.status.as_deref(), Some("exit status: 3"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_exit_kills_it_even_when_a_grandchild_keeps_the_output_open() {
        let (conn, agent, mut sent, _, exit) = pipe();
        let call = call_in_task(&conn, "x");
        next_json(&mut sent).await;
        exit.send_replace(Some("signal: 9 (SIGKILL)".into()));
        let death = death_of(call).await;
        assert_eq!(death.reason, "it exited");
        assert_eq!(death.status.as_deref(), Some("signal: 9 (SIGKILL)"));
        drop(agent); // held open until here, like a grandchild would
    }

    #[tokio::test]
    async fn a_bounded_line_reader_cuts_long_lines_and_goes_on() {
        let data: &[u8] = b"short\nlonger line\nlast";
        let mut reader = BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        let mut got = Vec::new();
        while let Some(cut) = read_bounded_line(&mut reader, 6, &mut buf).await.unwrap() {
            got.push((String::from_utf8(buf.clone()).unwrap(), cut));
        }
        assert_eq!(
            got,
            [
                ("short".to_string(), false),
                ("longer".to_string(), true),
                ("last".to_string(), false)
            ]
        );
    }
}
