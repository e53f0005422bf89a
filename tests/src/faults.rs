//! Fault layers the tests put between nodes: all in-process, on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::serve::{forward, read_request, reply, serve_http, HttpServer};

/// A TCP forwarder standing for one network link (point a node's view of a peer at it
/// with [`crate::MeshSpec::route`]). [`LinkProxy::cut`] breaks the link: open
/// connections are torn down and new ones are closed at once, as a dead route would;
/// [`LinkProxy::heal`] restores it.
pub struct LinkProxy {
    /// `http://127.0.0.1:port`, to use as a `bridge_url`.
    pub url: String,
    target: Arc<Mutex<Option<SocketAddr>>>,
    broken: watch::Sender<bool>,
    /// Connections forwarded while the link was up.
    pub forwarded: Arc<AtomicUsize>,
    /// Connections refused while the link was cut.
    pub refused: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl LinkProxy {
    /// Starts a proxy with no target yet (see [`LinkProxy::forward_to`]).
    pub async fn start() -> LinkProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let target: Arc<Mutex<Option<SocketAddr>>> = Default::default();
        let (broken, _) = watch::channel(false);
        let forwarded: Arc<AtomicUsize> = Default::default();
        let refused: Arc<AtomicUsize> = Default::default();
        let (t, b, f, r) = (
            target.clone(),
            broken.clone(),
            forwarded.clone(),
            refused.clone(),
        );
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let mut cut = b.subscribe();
                if *cut.borrow() {
                    r.fetch_add(1, Ordering::SeqCst);
                    drop(inbound);
                    continue;
                }
                let Some(addr) = *t.lock().unwrap() else {
                    continue;
                };
                f.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(addr).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        LinkProxy {
            url,
            target,
            broken,
            forwarded,
            refused,
            task,
        }
    }

    /// Where traffic goes while the link is up.
    pub fn forward_to(&self, addr: SocketAddr) {
        *self.target.lock().unwrap() = Some(addr);
    }

    /// Breaks the link: tears down open connections, refuses new ones.
    pub fn cut(&self) {
        self.broken.send_replace(true);
    }

    /// Restores the link.
    pub fn heal(&self) {
        self.broken.send_replace(false);
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An HTTP forwarder standing for a peer that predates batched delivery: it answers
/// `404` to `POST /bridge/v1/batch` (as an older node does for any unknown path) and
/// forwards every other request, headers and body untouched.
pub struct OldReceiverProxy {
    /// `http://127.0.0.1:port`, to use as a `bridge_url`.
    pub url: String,
    target: Arc<Mutex<Option<SocketAddr>>>,
    /// Batches refused with 404.
    pub batches_refused: Arc<AtomicUsize>,
    /// Requests forwarded.
    pub forwarded: Arc<AtomicUsize>,
    _server: HttpServer,
}

impl OldReceiverProxy {
    /// Starts the proxy; set its target with [`OldReceiverProxy::forward_to`].
    pub async fn start() -> OldReceiverProxy {
        let target: Arc<Mutex<Option<SocketAddr>>> = Default::default();
        let refused: Arc<AtomicUsize> = Default::default();
        let forwarded: Arc<AtomicUsize> = Default::default();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let (t, r, f) = (target.clone(), refused.clone(), forwarded.clone());
        let server = serve_http(move |req| {
            let (t, r, f, client) = (t.clone(), r.clone(), f.clone(), client.clone());
            async move {
                let (parts, body) = read_request(req).await;
                if parts.uri.path() == "/bridge/v1/batch" {
                    r.fetch_add(1, Ordering::SeqCst);
                    return reply(404, &b"{\"error\":\"no such endpoint\"}"[..]);
                }
                let addr = (*t.lock().unwrap()).expect("proxy target set");
                let mut fwd = client
                    .request(parts.method.clone(), format!("http://{addr}{}", parts.uri))
                    .body(body);
                for (k, v) in parts.headers.iter() {
                    if k != "host" && k != "content-length" {
                        fwd = fwd.header(k, v);
                    }
                }
                f.fetch_add(1, Ordering::SeqCst);
                forward(fwd).await
            }
        })
        .await;
        OldReceiverProxy {
            url: server.url(),
            target,
            batches_refused: refused,
            forwarded,
            _server: server,
        }
    }

    /// Where forwarded requests go.
    pub fn forward_to(&self, addr: SocketAddr) {
        *self.target.lock().unwrap() = Some(addr);
    }
}
