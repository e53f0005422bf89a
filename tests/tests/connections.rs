//! How the listeners treat the connection itself, seen from a raw TCP client: a client
//! that half-closes after its request still gets the answer, a client whose body is
//! refused (413) while it is still sending it gets the 413, not a reset, and slow-body
//! floods (from other loopback addresses, 127.0.0.2 and up) neither outlast the body
//! deadline nor lock a peer out.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use botmesh::telemetry::refusals::FIRST;
use botmesh_tests::{
    bot_message, client_from, loopback, metric, wait_for, MeshSpec, ProcessMesh, SignedRequest,
    TestMesh,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpSocket, TcpStream};

/// Reads until the server closes, an error, or `bound` passes; returns what came.
async fn read_answer(stream: &mut (impl AsyncRead + Unpin), bound: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(bound, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    // The head and a short body are enough to judge by.
                    if got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() > 64 {
                        break;
                    }
                }
            }
        }
    })
    .await;
    got
}

fn status_line(answer: &[u8]) -> String {
    String::from_utf8_lossy(answer)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Sends `request`, half-closes (`shutdown(SHUT_WR)`: nothing more will come) and
/// returns the status line of the answer ("" when the connection closed without one).
async fn half_closed_request(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    s.shutdown().await.unwrap();
    status_line(&read_answer(&mut s, Duration::from_secs(10)).await)
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let mut spec = MeshSpec::new(&["A"]);
    spec.bots[0]
        .extra
        .push_str("participation = \"mentions\"\n");
    let mesh = TestMesh::start(spec).await;
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec();
    // A request with a body is where the half-close used to be taken for an abort: the
    // end of the body is read, then the EOF right behind it, before the answer is written.
    let message = post("/v1/messages", r#"{"text": "hello", "from": "alice"}"#);
    let envelope = post("/bridge/v1/envelopes", r#"{"unsigned": true}"#);
    let cases = [
        ("api GET /healthz", mesh.apis[0], &healthz, "HTTP/1.1 200"),
        (
            "bridge GET /healthz",
            mesh.bridges[0],
            &healthz,
            "HTTP/1.1 200",
        ),
        (
            "api POST /v1/messages",
            mesh.apis[0],
            &message,
            "HTTP/1.1 200",
        ),
        // Unsigned: refused, but answered.
        (
            "bridge POST /bridge/v1/envelopes",
            mesh.bridges[0],
            &envelope,
            "HTTP/1.1 4",
        ),
    ];
    for (what, addr, request, expect) in cases {
        for attempt in 0..5 {
            let status = half_closed_request(addr, request).await;
            assert!(
                status.starts_with(expect),
                "{what}, attempt {attempt}: expected {expect:?} after a half-close, got {status:?}"
            );
        }
    }
    mesh.shutdown().await;
}

/// An envelope whose body comes in three writes (so in several frames) is read whole:
/// its signature covers every byte, so a body put together wrongly would be refused.
#[tokio::test]
async fn an_envelope_body_that_arrives_in_pieces_is_read_whole() {
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B"])).await;
    let signed = SignedRequest::new(
        &mesh.signers[1],
        &bot_message("B", "sent in three pieces", 1),
        0,
    );
    let head = format!(
        "POST /bridge/v1/envelopes HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         webhook-id: {}\r\nwebhook-timestamp: {}\r\nwebhook-signature: {}\r\n\
         Content-Length: {}\r\n\r\n",
        signed.id,
        signed.timestamp,
        signed.signature,
        signed.body.len()
    );
    let mut s = TcpStream::connect(mesh.bridges[0]).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let third = signed.body.len() / 3;
    for piece in [
        &signed.body[..third],
        &signed.body[third..2 * third],
        &signed.body[2 * third..],
    ] {
        s.write_all(piece).await.unwrap();
        s.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer =
        String::from_utf8_lossy(&read_answer(&mut s, Duration::from_secs(10)).await).to_string();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#"{"accepted":true}"#), "{answer}");
    // Recorded: the same envelope again is a duplicate.
    let (status, again) = signed.send(&mesh.http, &mesh.bridge(0)).await;
    assert_eq!((status, again["duplicate"].as_bool()), (200, Some(true)));
    mesh.shutdown().await;
}

const MIB: usize = 1024 * 1024;

fn oversized_head() -> String {
    format!(
        "POST /bridge/v1/envelopes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {MIB}\r\n\r\n"
    )
}

/// Writes `len` bytes in 64 KiB writes, as a simple client sends a body; the first error.
async fn write_body(s: &mut TcpStream, len: usize) -> Option<std::io::Error> {
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < len {
        let n = chunk.len().min(len - sent);
        match tokio::time::timeout(Duration::from_secs(10), s.write_all(&chunk[..n])).await {
            Ok(Ok(())) => sent += n,
            Ok(Err(e)) => return Some(e),
            Err(_) => return Some(std::io::Error::other("write stalled for 10 s")),
        }
    }
    None
}

#[tokio::test]
async fn an_oversized_body_still_being_sent_gets_its_413() {
    let mesh = TestMesh::start(MeshSpec::new(&["A"])).await;
    // As a simple client (urllib) does: headers, the whole body, then read the answer.
    // The node refuses the body after the headers; it must go on reading (and dropping)
    // the body, or the client's writes fail on a reset connection, and a client that
    // gives up on a failed write never reads the 413.
    let mut outcomes = Vec::new();
    for _ in 0..20 {
        let mut s = TcpStream::connect(mesh.bridges[0]).await.unwrap();
        s.write_all(oversized_head().as_bytes()).await.unwrap();
        let write_error = write_body(&mut s, MIB).await;
        let answer = read_answer(&mut s, Duration::from_secs(10)).await;
        outcomes.push((status_line(&answer), write_error.map(|e| e.to_string())));
    }
    assert!(
        outcomes
            .iter()
            .all(|(status, err)| status.starts_with("HTTP/1.1 413") && err.is_none()),
        "every oversized POST must be read to its end and get its 413: {outcomes:?}"
    );

    // The same, one step at a time: the 413 is out before the body is sent at all, and
    // the body is still taken in whole afterwards (the connection is not closed on it).
    for attempt in 0..5 {
        let mut s = TcpStream::connect(mesh.bridges[0]).await.unwrap();
        s.write_all(oversized_head().as_bytes()).await.unwrap();
        let answer = read_answer(&mut s, Duration::from_secs(10)).await;
        assert!(
            status_line(&answer).starts_with("HTTP/1.1 413"),
            "attempt {attempt}: {:?}",
            String::from_utf8_lossy(&answer)
        );
        let write_error = write_body(&mut s, MIB).await;
        assert!(
            write_error.is_none(),
            "attempt {attempt}: the body after the 413 was refused: {write_error:?}"
        );
    }
    mesh.shutdown().await;
}

/// A slow-body client, as a flood sends them: a request head announcing a 1000-byte
/// body, then one byte a second (at most 40), from its own source address.
struct SlowBody {
    /// Where the answer comes.
    reader: OwnedReadHalf,
    /// Sends the head and the trickle; stopped on drop.
    trickle: tokio::task::JoinHandle<()>,
}

impl SlowBody {
    async fn start(from: IpAddr, to: SocketAddr, path: &str) -> SlowBody {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(from, 0)).unwrap();
        let stream = socket.connect(to).await.unwrap();
        let (reader, mut writer) = stream.into_split();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {to}\r\nContent-Type: application/json\r\n\
             Content-Length: 1000\r\n\r\n{{"
        );
        let trickle = tokio::spawn(async move {
            if writer.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if writer.write_all(b" ").await.is_err() {
                    return;
                }
            }
        });
        SlowBody { reader, trickle }
    }

    /// The answer's status line; "" when the node closed the connection without one;
    /// `None` when it did neither within `bound` (the connection is still held).
    async fn answer(&mut self, bound: Duration) -> Option<String> {
        let got = read_answer(&mut self.reader, bound).await;
        if !got.is_empty() {
            return Some(status_line(&got));
        }
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(10), self.reader.read(&mut byte)).await {
            Ok(Ok(0) | Err(_)) => Some(String::new()),
            _ => None,
        }
    }
    /// Asserts the node answered `status` (or, if the reset of the unread request beat
    /// the answer, just closed the connection) within `bound`.
    async fn assert_cut(&mut self, bound: Duration, status: &str, what: &str) {
        let answer = self.answer(bound).await;
        assert!(
            answer.as_deref() == Some(status) || answer.as_deref() == Some(""),
            "{what}: {answer:?}"
        );
    }
}

impl Drop for SlowBody {
    fn drop(&mut self) {
        self.trickle.abort();
    }
}

/// `botmesh_open_connections{listener}` of node 0.
async fn open_connections(mesh: &TestMesh, listener: &str) -> f64 {
    metric(
        &mesh.metrics(0).await,
        &format!("botmesh_open_connections{{listener=\"{listener}\"}}"),
    )
}

/// Waits (at most 10 s) for node 0's bridge to hold no connection.
async fn bridge_connections_fall_to_zero(mesh: &TestMesh) {
    let open = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || open_connections(mesh, "bridge"),
        |&open| open == 0.0,
    )
    .await;
    assert_eq!(open, 0.0, "connections still open on the bridge");
}

/// `botmesh_http_refusals_total{listener,reason}` of node 0.
async fn refusals(mesh: &TestMesh, listener: &str, reason: &str) -> f64 {
    metric(
        &mesh.metrics(0).await,
        &format!("botmesh_http_refusals_total{{listener=\"{listener}\",reason=\"{reason}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_flood_from_a_few_addresses_cannot_lock_a_peer_out() {
    // 40 connections in all, 16 per address: two flooding addresses hold 32 at most.
    // The body deadline is long here, so what keeps the peer served is the cap alone.
    let mesh = TestMesh::start(MeshSpec::mentions_only(&["A", "B"]).mesh(
        "max_connections = 40\nmax_connections_per_source = 16\nbody_timeout_ms = 60000\nheader_timeout_ms = 60000",
    ))
    .await;
    let bridge = mesh.bridges[0];
    assert_eq!(open_connections(&mesh, "bridge").await, 0.0);
    let mut flood = Vec::new();
    for i in 0..60 {
        flood.push(
            SlowBody::start(loopback(2 + (i % 2) as u8), bridge, "/bridge/v1/envelopes").await,
        );
    }
    let held = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            (
                open_connections(&mesh, "bridge").await,
                refusals(&mesh, "bridge", "source_connections").await,
            )
        },
        |&(open, refused)| open == 32.0 && refused == 28.0,
    )
    .await;
    assert_eq!(held, (32.0, 28.0), "16 held per address, the rest refused");

    // The 17th connection from one address is refused at once; another address is served.
    let mut extra = SlowBody::start(loopback(2), bridge, "/bridge/v1/envelopes").await;
    extra
        .assert_cut(
            Duration::from_secs(5),
            "HTTP/1.1 503 Service Unavailable",
            "the 17th",
        )
        .await;
    let other = client_from(loopback(4))
        .get(format!("{}/healthz", mesh.bridge(0)))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);

    // A real peer (from 127.0.0.1) gets its envelopes accepted while the flood holds on.
    let peer = client_from(loopback(1));
    for text in ["during the flood 1", "during the flood 2"] {
        let (status, answer) = SignedRequest::new(&mesh.signers[1], &bot_message("B", text, 1), 0)
            .send(&peer, &mesh.bridge(0))
            .await;
        assert_eq!(
            (status, &answer["accepted"]),
            (200, &serde_json::json!(true)),
            "{answer}"
        );
    }
    // (The peer's own connections may not be seen closed yet: at least the flood's.)
    let open = open_connections(&mesh, "bridge").await;
    assert!(
        open >= 32.0,
        "the flood was still holding its connections: {open}"
    );

    // The flood ends: the gauge falls back to 0.
    drop((flood, extra));
    bridge_connections_fall_to_zero(&mesh).await;
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_the_deadline_is_answered_408_counted_and_closed() {
    let mesh =
        TestMesh::start(MeshSpec::mentions_only(&["A", "B"]).mesh("body_timeout_ms = 2000")).await;
    // 20 slow bodies on the bridge, one on the local API, each a byte a second for up
    // to 40 s: every one is cut after the 2 s deadline.
    let mut slow = Vec::new();
    for i in 0..20 {
        slow.push(
            SlowBody::start(
                loopback(2 + (i % 4) as u8),
                mesh.bridges[0],
                "/bridge/v1/envelopes",
            )
            .await,
        );
    }
    let mut api = SlowBody::start(loopback(1), mesh.apis[0], "/v1/messages").await;
    for (i, s) in slow.iter_mut().chain([&mut api]).enumerate() {
        s.assert_cut(
            Duration::from_secs(20),
            "HTTP/1.1 408 Request Timeout",
            &format!("slow body {i}"),
        )
        .await;
    }
    assert_eq!(refusals(&mesh, "bridge", "body_timeout").await, 20.0);
    assert_eq!(refusals(&mesh, "api", "body_timeout").await, 1.0);
    bridge_connections_fall_to_zero(&mesh).await;
    // The node is none the worse: a peer's envelope is accepted.
    let (status, _) = SignedRequest::new(&mesh.signers[1], &bot_message("B", "after", 1), 0)
        .send(&mesh.http, &mesh.bridge(0))
        .await;
    assert_eq!(status, 200);
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_past_the_first_few_are_counted_not_logged() {
    // A real process, to read its log: more slow bodies within one warning interval
    // than are logged whole.
    let mut mesh = ProcessMesh::start(&["A"], "body_timeout_ms = 300", "").await;
    let api: SocketAddr = mesh.apis[0].trim_start_matches("http://").parse().unwrap();
    let mut slow = Vec::new();
    for _ in 0..FIRST + 3 {
        slow.push(SlowBody::start(loopback(1), api, "/v1/messages").await);
    }
    for (i, s) in slow.iter_mut().enumerate() {
        let answer = s.answer(Duration::from_secs(10)).await;
        assert!(answer.is_some(), "slow body {i} still open");
    }
    let metrics = mesh.metrics(0).await;
    assert_eq!(
        metric(
            &metrics,
            r#"botmesh_http_refusals_total{listener="api",reason="body_timeout"}"#
        ),
        f64::from(FIRST + 3)
    );
    let log = mesh.log(0);
    assert_eq!(
        log.matches("request body not received in time").count(),
        FIRST as usize,
        "the first few warned about, the rest only counted:\n{log}"
    );
    mesh.terminate(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_junk_signatures_is_all_counted_and_logged_a_few_times() {
    // A real process, to read its log. The peer rate limit is out of the way so that
    // every refusal is for the signature.
    const FLOOD: usize = 500;
    let mut mesh = ProcessMesh::start(&["A", "B"], "peer_rate_limit = 100000", "").await;
    let body = bot_message("B", "forged", 1).to_bytes();
    let ts = botmesh::wire::signing::unix_now().to_string();
    for i in 0..FLOOD {
        let r = mesh
            .http
            .post(format!("{}/bridge/v1/envelopes", mesh.bridges[0]))
            .header("webhook-id", format!("junk-{i}"))
            .header("webhook-timestamp", &ts)
            .header("webhook-signature", "v1a,bm90IGEgc2lnbmF0dXJl")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("send");
        assert!(r.status().is_client_error(), "junk {i}: {}", r.status());
    }
    let metrics = mesh.metrics(0).await;
    let refused: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("botmesh_envelopes_in_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(refused, FLOOD as f64, "every refusal counted:\n{metrics}");
    let log = mesh.log(0);
    let lines = log.matches("envelope rejected").count();
    assert!(
        (1..=FIRST as usize * 2).contains(&lines),
        "{lines} refusal lines for {FLOOD} refusals:\n{log}"
    );
    assert!(
        log.contains("counted, not logged"),
        "the hold-back is said:\n{log}"
    );
    mesh.terminate(0);
    mesh.terminate(1);
}
