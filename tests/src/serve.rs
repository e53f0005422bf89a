//! The one HTTP/1 server loop behind every fake and proxy of the test support.
//!
//! [`serve_http`] binds `127.0.0.1:0`, accepts connections and serves each with hyper,
//! calling a handler per request. The fakes (LLM, Feishu, DingTalk) and the HTTP proxies differ
//! only in their handlers; the accepting, the connection tasks and the stopping are
//! here once.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::http::request::Parts;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// What a handler answers: a whole body, as every fake here builds it (one name for the
/// type all handlers share).
pub type Reply = Response<Full<Bytes>>;

/// A running server from [`serve_http`]; stops (the port and every open connection)
/// when shut down or dropped.
///
/// Exists so that each fake or proxy holds one value that both says where it listens
/// and takes its connections down with it, instead of each keeping its own accept task.
pub struct HttpServer {
    /// Where it listens (on 127.0.0.1).
    pub addr: SocketAddr,
    task: JoinHandle<()>,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
}

impl HttpServer {
    /// `http://127.0.0.1:PORT`: the base URL to point a client at.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many connections were accepted so far: tests of connection reuse compare it
    /// with the number of requests.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Stops accepting, closes the port and drops every open connection (including
    /// ones whose request is still being answered), then returns.
    pub async fn shutdown(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `handler` over HTTP/1 on a fresh port of 127.0.0.1, one task per connection,
/// with hyper's default header timeout. Handlers mostly answer a whole body ([`Reply`]);
/// any body type may be answered (the fake LLM streams some answers). Connection tasks belong to the server: when it
/// stops, they stop, so a handler that never answers cannot outlive the test's fake.
///
/// Exists because the fake LLM, the fake Feishu and the HTTP proxies each carried their
/// own copy of this accept loop.
///
/// Panics if it cannot bind a loopback port (test support only).
pub async fn serve_http<F, Fut, B>(handler: F) -> HttpServer
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("serve_http: bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("serve_http: local_addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let task = tokio::spawn(accept_loop(listener, Arc::new(handler), accepted.clone()));
    HttpServer {
        addr,
        task,
        accepted,
    }
}

/// A request's head and its whole body (empty when the body cannot be read).
///
/// Exists because every proxy handler reads the whole body before deciding what to do.
pub async fn read_request(req: Request<Incoming>) -> (Parts, Bytes) {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    (parts, body)
}

/// A reply with `status` (which must be valid) and `body`, no headers.
///
/// Exists so handlers that answer raw bytes (the proxies) build a response one way.
pub fn reply(status: u16, body: impl Into<Bytes>) -> Reply {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = StatusCode::from_u16(status).expect("valid status");
    resp
}

/// Sends `request` on to the real receiver and answers with its status and body, or
/// 502 with no body when it cannot be reached.
///
/// Exists because every proxy here ends the same way once it has decided to forward.
pub async fn forward(request: reqwest::RequestBuilder) -> Reply {
    match request.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            reply(status, r.bytes().await.unwrap_or_default())
        }
        Err(_) => reply(502, Bytes::new()),
    }
}

/// Accepts connections until aborted; the connection tasks live in a `JoinSet` owned
/// here, so aborting this task aborts them all.
async fn accept_loop<F, Fut, B>(listener: TcpListener, handler: Arc<F>, opened: Arc<AtomicUsize>)
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    opened.fetch_add(1, Ordering::SeqCst);
                    let handler = handler.clone();
                    connections.spawn(async move {
                        let service = service_fn(move |req| {
                            let reply = handler(req);
                            async move { Ok::<_, Infallible>(reply.await) }
                        });
                        let _ = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                // Transient accept errors (e.g. out of file descriptors).
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Accepts connections on `listener` until the runtime ends, each served on its own
/// task by `serve(stream, state.clone())`; a failed accept is passed over. Exists so
/// the WebSocket stand-ins (tests/src/fake_onebot.rs, fake_wecom.rs) share one accept
/// loop.
pub fn accept_each<S, F, Fut>(listener: TcpListener, state: S, serve: F) -> JoinHandle<()>
where
    S: Clone + Send + 'static,
    F: Fn(TcpStream, S) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(serve(stream, state.clone()));
        }
    })
}
