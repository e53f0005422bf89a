//! How the listeners treat the connection itself, seen from a raw TCP client: a client
//! that half-closes after its request still gets the answer, and a client whose body is
//! refused (413) while it is still sending it gets the 413, not a reset.

use std::time::Duration;

use botmesh_tests::{MeshSpec, TestMesh};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes, an error, or `bound` passes; returns what came.
async fn read_answer(stream: &mut TcpStream, bound: Duration) -> Vec<u8> {
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
