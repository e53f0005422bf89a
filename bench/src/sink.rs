//! The ceiling baseline: a bare hyper 1 server that reads every request body to the
//! end and answers `200 {"accepted":true}` — no auth, no parsing, no storage.
//!
//! It runs as its own process (`botmesh-bench sink --addr …`) so that its CPU time and
//! RSS are measured exactly like a node's. It uses the same building blocks as a node's
//! listener (tokio multi-thread runtime, hyper http1, `TokioIo`, `TCP_NODELAY`).

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

const ACCEPTED: &[u8] = br#"{"accepted":true}"#;

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Read the whole body, as a real receiver must before it can answer.
    let _ = req.into_body().collect().await;
    let mut r = Response::new(Full::new(Bytes::from_static(ACCEPTED)));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

/// Serves on `addr` until the process is killed.
pub fn run(addr: SocketAddr) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(x) => x,
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(handle))
                    .await;
            });
        }
    })
}
