//! HTTP plumbing shared by both listeners: accept loop, limits, graceful shutdown.
//!
//! hyper 1 with `TokioIo`, `http1::Builder` with a timer (header timeouts need one),
//! a cap on open connections, and `GracefulShutdown` so in-flight requests finish
//! when the node stops.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The response body type of every handler (full bodies and SSE streams alike).
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Limits applied to every connection of a listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Open connections at most; further ones wait in the kernel backlog.
    pub max_connections: usize,
    /// Time allowed to send the request head (slowloris guard).
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
        }
    }
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
pub(crate) async fn read_body(
    req: Request<Incoming>,
    limit: usize,
) -> Result<(http::request::Parts, Bytes), BodyError> {
    let (parts, mut body) = req.into_parts();
    if let Some(len) = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            linger(&parts, body);
            return Err(BodyError::TooLarge { limit });
        }
    }
    // Chunks as they came: a body of one chunk (the usual case) is returned without a copy.
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            if len > limit {
                linger(&parts, body);
                return Err(BodyError::TooLarge { limit });
            }
            chunks.push(data);
        }
    }
    let bytes = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().expect("one chunk"),
        _ => Bytes::from(chunks.concat()),
    };
    Ok((parts, bytes))
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
/// finish for up to `grace`.
pub(crate) async fn serve<F, Fut>(
    name: &'static str,
    listener: TcpListener,
    limits: Limits,
    shutdown: CancellationToken,
    grace: Duration,
    handler: F,
) where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
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
        let _ = stream.set_nodelay(true);
        let h = handler.clone();
        let svc = hyper::service::service_fn(move |req| {
            let h = h.clone();
            async move { Ok::<_, Infallible>(h(req, peer).await) }
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
