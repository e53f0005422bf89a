//! A real `redis-server` (Debian's package) on 127.0.0.1, started and stopped by the
//! test that owns it. Append-only persistence is on, as in production, so a restart
//! keeps the streams; the data lives in the server's own temporary folder.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One redis-server process and its data folder.
pub struct RedisServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its data folder (AOF files, log).
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub async fn start() -> RedisServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut s = RedisServer {
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        s.resume().await;
        s
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Starts the server (again) on the same port and data.
    pub async fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): install it with `apt-get install redis-server` (scripts/test.sh does)")
            });
        self.child = Some(child);
        let up = crate::wait_for(
            Duration::from_secs(5),
            Duration::from_millis(25),
            || self.ping(),
            |up| *up,
        )
        .await;
        assert!(
            up,
            "redis-server on port {} never answered:\n{}",
            self.port,
            std::fs::read_to_string(self.log_path()).unwrap_or_default()
        );
    }

    /// Kills the server at once (its appended data stays on disk).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A client connection for inspecting or tampering with the streams.
    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test redis")
    }

    async fn ping(&self) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await else {
            return false;
        };
        if s.write_all(b"PING\r\n").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await,
            Ok(Ok(n)) if buf[..n].starts_with(b"+PONG")
        )
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
