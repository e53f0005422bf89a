//! HTTP plumbing shared by both listeners: accept loop, limits, graceful shutdown.
//!
//! hyper 1 with `TokioIo`, `http1::Builder` with a timer (header timeouts need one),
//! a cap on open connections, and `GracefulShutdown` so in-flight requests finish
//! when the node stops.
//!
//! A client cannot hold a connection for long without sending what it owes: the
//! request head must come within `header_timeout`, the whole body within
//! `body_timeout` (else `408` and the connection is closed), and one source address
//! may hold at most `per_source` connections (further ones are answered `503` and
//! closed at once), so a flood of slow clients from one address cannot fill
//! `max_connections` and lock the real peers out. Each refusal is counted in
//! `botmesh_http_refusals_total{listener,reason}` and logged rate-limited per
//! listener and reason ([`crate::telemetry::refusals`]); `botmesh_open_connections{listener}`
//! shows the connections held.

use std::cell::Cell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::telemetry::metrics::Metrics;
use crate::telemetry::refusals::REFUSALS;

/// The response body type of every handler (full bodies and SSE streams alike).
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Limits applied to every connection of a listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Open connections at most; further ones wait in the kernel backlog.
    pub max_connections: usize,
    /// Time allowed to send the request head (slowloris guard).
    pub header_timeout: Duration,
    /// Time allowed to send a request's whole body, from when the handler starts
    /// reading it ([`read_body`]); a body still incomplete then is answered `408` and
    /// its connection closed (slow-body guard).
    pub body_timeout: Duration,
    /// Open connections one source address may hold at most; `None`: no such cap
    /// (the local API, whose clients all come from the host itself).
    pub per_source: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            per_source: None,
        }
    }
}

/// One listener's shared state: its name and limits, its open connections per source
/// address, and the alarms of its refusals.
struct Listener {
    /// `bridge` or `api`, for logs and metric labels.
    name: &'static str,
    /// The limits it enforces.
    limits: Limits,
    /// Where connections and refusals are counted.
    metrics: Arc<Metrics>,
    /// Open connections per source address (only with a per-source cap).
    sources: Mutex<HashMap<IpAddr, usize>>,
}

/// One open connection, counted in `botmesh_open_connections` and against its source
/// address until dropped.
struct Open {
    /// The listener it belongs to.
    listener: Arc<Listener>,
    /// Where it comes from.
    source: IpAddr,
}

impl Listener {
    /// Counts a new connection from `source`, or says how many that source already
    /// holds when it is at its cap.
    fn open(self: &Arc<Self>, source: IpAddr) -> Result<Open, usize> {
        if let Some(cap) = self.limits.per_source {
            let mut sources = self.sources.lock();
            let held = sources.entry(source).or_insert(0);
            if *held >= cap {
                return Err(*held);
            }
            *held += 1;
        }
        self.metrics.add_open_connections(self.name, 1);
        Ok(Open {
            listener: self.clone(),
            source,
        })
    }

    /// Counts, and warns about (rate-limited), a refused connection from `source`,
    /// which holds `held` connections already.
    fn refuse_connection(&self, source: IpAddr, held: usize) {
        self.metrics.http_refused(self.name, "source_connections");
        if REFUSALS.admit(self.name, "source_connections") {
            tracing::warn!(
                listener = self.name,
                %source,
                open = held,
                limit = self.limits.per_source.unwrap_or(usize::MAX),
                "refusing connections: too many open from one address (mesh.max_connections_per_source)"
            );
        }
    }

    /// Counts, and warns about (rate-limited), a request from `peer` whose body did
    /// not come within the deadline; the answer to send.
    fn body_timed_out(&self, peer: SocketAddr) -> Response<Body> {
        self.metrics.http_refused(self.name, "body_timeout");
        let within = self.limits.body_timeout.as_millis();
        if REFUSALS.admit(self.name, "body_timeout") {
            tracing::warn!(
                listener = self.name,
                %peer,
                body_timeout_ms = within as u64,
                "request body not received in time: answered 408 and closed (mesh.body_timeout_ms)"
            );
        }
        let mut r = error(
            StatusCode::REQUEST_TIMEOUT,
            format!("request body not received within {within} ms"),
        );
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let l = &self.listener;
        l.metrics.add_open_connections(l.name, -1);
        if l.limits.per_source.is_some() {
            let mut sources = l.sources.lock();
            if let Some(held) = sources.get_mut(&self.source) {
                *held -= 1;
                if *held == 0 {
                    sources.remove(&self.source);
                }
            }
        }
    }
}

/// The answer to a connection over its source's cap, written (if the socket takes it
/// at once) before the connection is closed.
fn crowded_answer() -> Vec<u8> {
    let body = r#"{"error":"too_many_connections"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What [`serve`] gives each request's handling (a task-local value, set around the
/// handler's future) for [`read_body`]: how long the body may take, and where a missed
/// deadline is noted for the answer. Task-local rather than in the request's
/// extensions: no allocation per request (a map, a box and a shared flag).
#[derive(Debug)]
struct BodyDeadline {
    /// The whole body's time.
    within: Duration,
    /// Set when the body missed it.
    missed: Cell<bool>,
}

tokio::task_local! {
    /// The deadline of the request whose handler runs in this task ([`serve`]).
    static BODY_DEADLINE: BodyDeadline;
}

/// A full body from bytes.
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

/// A JSON response.
pub(crate) fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(serde_json::to_vec(value).expect("json value")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A JSON error `{"error": reason}`.
pub(crate) fn error(status: StatusCode, reason: impl std::fmt::Display) -> Response<Body> {
    json(status, &serde_json::json!({ "error": reason.to_string() }))
}

/// A plain-text response.
pub(crate) fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// Declared or actual length over the limit (413).
    #[error("body larger than {limit} bytes")]
    TooLarge {
        /// The limit that was exceeded.
        limit: usize,
    },
    /// The client went away or sent a broken body (400).
    #[error("could not read body: {0}")]
    Read(String),
}

/// How much of a refused body is still read, and thrown away, after the 413 ([`linger`]).
const LINGER_BYTES: usize = 4 * 1024 * 1024;
/// How long a refused body is still read after the 413 ([`linger`]).
const LINGER_TIME: Duration = Duration::from_secs(2);

/// Reads a body of at most `limit` bytes; a larger declared Content-Length is refused
/// before a single body byte is kept. What is left of a refused body is read and thrown
/// away in the background (a lingering close) so the refusal reaches the client.
///
/// The whole body must come within the listener's `body_timeout` (see [`serve`]);
/// otherwise this fails with [`BodyError::Read`], and whatever the handler answers,
/// [`serve`] answers `408` and closes the connection. The deadline is the handler
/// task's ([`BODY_DEADLINE`]): a handler reads the body before it hands work to
/// another task (every handler does), or the body is read without one.
pub(crate) async fn read_body(
    req: Request<Incoming>,
    limit: usize,
) -> Result<(http::request::Parts, Bytes), BodyError> {
    let (parts, mut body) = req.into_parts();
    let read = collect(&parts, &mut body, limit);
    let read = match BODY_DEADLINE.try_with(|d| d.within) {
        Ok(within) => match tokio::time::timeout(within, read).await {
            Ok(read) => read,
            Err(_) => {
                BODY_DEADLINE.with(|d| d.missed.set(true));
                return Err(BodyError::Read(format!(
                    "body not received within {} ms",
                    within.as_millis()
                )));
            }
        },
        Err(_) => read.await,
    };
    match read {
        Ok(bytes) => Ok((parts, bytes)),
        Err(e) => {
            if let BodyError::TooLarge { .. } = e {
                linger(&parts, body);
            }
            Err(e)
        }
    }
}

/// [`read_body`]'s reading: the body's bytes, or why not.
async fn collect(
    parts: &http::request::Parts,
    body: &mut Incoming,
    limit: usize,
) -> Result<Bytes, BodyError> {
    if let Some(len) = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(BodyError::TooLarge { limit });
        }
    }
    // Chunks as they came: a body of one chunk (the usual case) is returned without a
    // copy, and without a list of chunks.
    let mut first: Option<Bytes> = None;
    let mut more: Vec<Bytes> = Vec::new();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            if len > limit {
                return Err(BodyError::TooLarge { limit });
            }
            match first {
                None => first = Some(data),
                Some(_) => more.push(data),
            }
        }
    }
    Ok(match (first, more.is_empty()) {
        (None, _) => Bytes::new(),
        (Some(one), true) => one,
        (Some(one), false) => {
            let mut all = Vec::with_capacity(len);
            all.extend_from_slice(&one);
            for chunk in &more {
                all.extend_from_slice(chunk);
            }
            Bytes::from(all)
        }
    })
}

/// Lingering close, as nginx does it: reads and drops the rest of a refused body (up to
/// [`LINGER_BYTES`], for up to [`LINGER_TIME`]) in the background while the answer is
/// written. Closing the connection on an unread body makes the kernel answer the body's
/// bytes with RST: the client's writes fail and most clients (urllib, …) then give up
/// without reading the answer that was already sent. A client that waits for
/// `100 Continue` has sent no body: there is nothing to read.
fn linger(parts: &http::request::Parts, mut body: Incoming) {
    let expects_continue = parts
        .headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        return;
    }
    tokio::spawn(async move {
        let mut left = LINGER_BYTES;
        let _ = tokio::time::timeout(LINGER_TIME, async {
            while let Some(Ok(frame)) = body.frame().await {
                let n = frame.data_ref().map_or(0, |d| d.len());
                if n >= left {
                    break;
                }
                left -= n;
            }
        })
        .await;
    });
}

/// Serves `handler` on `listener` until `shutdown` fires, then lets in-flight requests
/// finish for up to `grace`. Open connections and refusals are counted in `metrics`
/// under `name`.
pub(crate) async fn serve<F, Fut>(
    name: &'static str,
    listener: TcpListener,
    limits: Limits,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    grace: Duration,
    handler: F,
) where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let state = Arc::new(Listener {
        name,
        limits,
        metrics,
        sources: Mutex::new(HashMap::new()),
    });
    // The gauge is there from the start, at 0, for dashboards and alerts.
    state.metrics.add_open_connections(name, 0);
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => p.expect("semaphore never closed"),
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(listener = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let open = match state.open(peer.ip()) {
            Ok(open) => open,
            Err(held) => {
                state.refuse_connection(peer.ip(), held);
                // At once and without waiting: a refusal must cost less than a connection.
                let _ = stream.try_write(&crowded_answer());
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let h = handler.clone();
        let st = state.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (h, st) = (h.clone(), st.clone());
            let deadline = BodyDeadline {
                within: st.limits.body_timeout,
                missed: Cell::new(false),
            };
            BODY_DEADLINE.scope(deadline, async move {
                let answer = h(req, peer).await;
                let missed = BODY_DEADLINE.with(|d| d.missed.get());
                Ok::<_, Infallible>(if missed {
                    st.body_timed_out(peer)
                } else {
                    answer
                })
            })
        });
        // half_close: a client may send its request and then shut down its write side
        // (`shutdown(SHUT_WR)`) while it waits; without this, hyper takes that EOF for an
        // aborted request and closes the connection without writing the answer.
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .half_close(true)
            .header_read_timeout(limits.header_timeout)
            .serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(listener = name, %peer, error = %e, "connection ended with an error");
            }
            drop(open);
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "connections still open after the grace period; closing them"
        );
    }
}

/// Query parameters as pairs.
pub(crate) fn query(req_uri: &http::Uri) -> Vec<(String, String)> {
    req_uri
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// First value of query parameter `key`.
pub(crate) fn query_param(req_uri: &http::Uri, key: &str) -> Option<String> {
    query(req_uri)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}
