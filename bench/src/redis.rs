//! The relay baseline: Redis pub/sub, as earlier designs recommended.
//!
//! `redis-server` runs on 127.0.0.1 at a random port with persistence off
//! (`--save "" --appendonly no`). A minimal RESP client (enough for PING, SUBSCRIBE,
//! PUBLISH and SHUTDOWN) keeps the client side as thin as the HTTP one: one
//! subscriber connection per receiving bot, one pipelined publisher connection.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::procs::Proc;
use crate::record::{PhaseTable, Recorder};

/// The channel every bench message is published on.
pub const CHANNEL: &str = "demo";

/// A RESP value (only what these commands return).
#[derive(Debug)]
pub enum Resp {
    /// `+OK`.
    Simple(String),
    /// `-ERR …`.
    Error(String),
    /// `:n`.
    Int(i64),
    /// `$n` bulk string (None for `$-1`).
    Bulk(Option<Vec<u8>>),
    /// `*n` array (None for `*-1`).
    Array(Option<Vec<Resp>>),
}

/// Encodes one command as a RESP array of bulk strings.
pub fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

type Reader = BufReader<tokio::net::tcp::OwnedReadHalf>;

/// Reads one RESP value.
pub fn read<'a>(
    r: &'a mut Reader,
) -> Pin<Box<dyn Future<Output = anyhow::Result<Resp>> + Send + 'a>> {
    Box::pin(async move {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).await? == 0 {
            bail!("redis closed the connection");
        }
        let body = std::str::from_utf8(line.get(1..line.len().saturating_sub(2)).unwrap_or(&[]))
            .context("non-UTF-8 RESP header")?
            .to_string();
        let n = || body.parse::<i64>().context("bad RESP length");
        Ok(match line.first() {
            Some(b'+') => Resp::Simple(body),
            Some(b'-') => Resp::Error(body),
            Some(b':') => Resp::Int(n()?),
            Some(b'$') => match n()? {
                -1 => Resp::Bulk(None),
                len => {
                    let mut buf = vec![0; len as usize + 2];
                    r.read_exact(&mut buf).await?;
                    buf.truncate(len as usize);
                    Resp::Bulk(Some(buf))
                }
            },
            Some(b'*') => match n()? {
                -1 => Resp::Array(None),
                len => {
                    let mut items = Vec::with_capacity(len as usize);
                    for _ in 0..len {
                        items.push(read(r).await?);
                    }
                    Resp::Array(Some(items))
                }
            },
            _ => bail!("unexpected RESP line {:?}", String::from_utf8_lossy(&line)),
        })
    })
}

async fn connect(port: u16) -> anyhow::Result<(Reader, tokio::net::tcp::OwnedWriteHalf)> {
    let s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.set_nodelay(true)?;
    let (r, w) = s.into_split();
    Ok((BufReader::with_capacity(64 * 1024, r), w))
}

/// A running redis-server.
pub struct RedisServer {
    /// The process.
    pub proc: Proc,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Spawn until PING answered.
    pub startup: Duration,
}

impl RedisServer {
    /// Starts `bin` on a random free port (a few tries), logging to `dir/redis.log`.
    pub async fn start(bin: &Path, dir: &Path) -> anyhow::Result<RedisServer> {
        let mut last = None;
        for _ in 0..3 {
            let port = crate::procs::free_port()?;
            let mut cmd = Command::new(bin);
            cmd.args(["--port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .args(["--daemonize", "no"])
                .args(["--protected-mode", "yes"])
                .arg("--dir")
                .arg(dir);
            let mut proc = Proc::spawn("redis", cmd, Some(&dir.join("redis.log")))?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if ping(port).await.is_ok() {
                    let startup = proc.spawned.elapsed();
                    return Ok(RedisServer {
                        proc,
                        port,
                        startup,
                    });
                }
                if let Err(e) = proc.check_alive() {
                    last = Some(e);
                    break;
                }
                if Instant::now() > deadline {
                    last = Some(anyhow::anyhow!("redis did not answer PING within 10 s"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("redis did not start")))
    }

    /// `SHUTDOWN NOSAVE`, then make sure the process is gone.
    pub async fn stop(mut self) {
        if let Ok((_, mut w)) = connect(self.port).await {
            let _ = w.write_all(&command(&[b"SHUTDOWN", b"NOSAVE"])).await;
        }
        self.proc.stop(Duration::from_secs(3));
    }
}

/// PING → PONG.
pub async fn ping(port: u16) -> anyhow::Result<()> {
    let (mut r, mut w) = connect(port).await?;
    w.write_all(&command(&[b"PING"])).await?;
    match read(&mut r).await? {
        Resp::Simple(s) if s == "PONG" => Ok(()),
        other => bail!("PING answered {other:?}"),
    }
}

/// Subscribes to [`CHANNEL`] as `receiver`; returns once the subscription is confirmed,
/// with the task that records arrivals until aborted.
pub async fn subscribe(
    port: u16,
    receiver: usize,
    recorder: Arc<Recorder>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (mut r, mut w) = connect(port).await?;
    w.write_all(&command(&[b"SUBSCRIBE", CHANNEL.as_bytes()]))
        .await?;
    match read(&mut r).await? {
        Resp::Array(Some(v)) if matches!(v.first(), Some(Resp::Bulk(Some(k))) if k == b"subscribe") =>
            {}
        other => bail!("SUBSCRIBE answered {other:?}"),
    }
    Ok(tokio::spawn(async move {
        let _w = w;
        while let Ok(v) = read(&mut r).await {
            let at = Instant::now();
            if let Resp::Array(Some(items)) = v {
                if let Some(Resp::Bulk(Some(payload))) = items.get(2) {
                    recorder.arrived(receiver, payload, at);
                }
            }
        }
    }))
}

/// How the publisher paces itself.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// Open loop: one message every `1/rate` seconds, whatever the replies do.
    Rate(f64),
    /// Closed loop: at most this many PUBLISHes without a reply.
    Window(usize),
}

/// Publishes `payloads[i]` as message `i` of `table`; returns once every reply came
/// back (or `deadline`). Returns how many PUBLISHes were answered.
pub async fn publish(
    port: u16,
    payloads: Arc<Vec<Bytes>>,
    pace: Pace,
    table: Arc<PhaseTable>,
    deadline: Instant,
) -> anyhow::Result<usize> {
    let (mut r, mut w) = connect(port).await?;
    let window = Arc::new(Semaphore::new(match pace {
        Pace::Window(c) => c,
        Pace::Rate(_) => Semaphore::MAX_PERMITS,
    }));
    let n = payloads.len();
    let replies = {
        let window = window.clone();
        tokio::spawn(async move {
            let mut got = 0;
            while got < n {
                match read(&mut r).await {
                    // The reply is the number of subscribers that got the message.
                    Ok(Resp::Int(k)) if k >= 0 => {
                        got += 1;
                        window.add_permits(1);
                    }
                    Ok(Resp::Error(e)) => {
                        eprintln!("botmesh-bench: redis refused PUBLISH: {e}");
                        break;
                    }
                    _ => break,
                }
            }
            got
        })
    };
    let start = tokio::time::Instant::now();
    for (i, p) in payloads.iter().enumerate() {
        if Instant::now() > deadline {
            break;
        }
        if let Pace::Rate(rate) = pace {
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        }
        window.acquire().await?.forget();
        let cmd = command(&[b"PUBLISH", CHANNEL.as_bytes(), p]);
        table.mark_sent(i);
        w.write_all(&cmd).await?;
    }
    let left = deadline.saturating_duration_since(Instant::now());
    Ok(tokio::time::timeout(left, replies)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands() {
        assert_eq!(
            command(&[b"PUBLISH", b"demo", b"hi"]),
            b"*3\r\n$7\r\nPUBLISH\r\n$4\r\ndemo\r\n$2\r\nhi\r\n".to_vec()
        );
    }
}
