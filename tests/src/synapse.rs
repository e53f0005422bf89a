//! A real Synapse homeserver (PyPI `matrix-synapse`, in the test venv) on
//! 127.0.0.1, started once per test binary by tests/py/synapse_env.py (SQLite,
//! registration by shared secret, no federation listener) and stopped when the test
//! process ends (the script stops Synapse when its stdin closes). Each test makes
//! its own users and room ([`Synapse::register`], [`Synapse::create_room`]), so tests
//! share the server but nothing in it. People are played by matrix-nio
//! ([`Person`], tests/py/matrix_person.py).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The shared secret registration is signed with.
const SHARED_SECRET: &str = "botmesh-test-registration-secret";

/// One Synapse process: its port and folder, kept for the test binary's life.
pub struct Synapse {
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// Its folder (config, SQLite database, logs).
    pub dir: std::path::PathBuf,
    /// The script's stdin: closing it (the process ending) stops Synapse.
    _stdin: Mutex<ChildStdin>,
    /// The script's process.
    _child: Mutex<Child>,
    /// A plain HTTP client, keeping no idle connection.
    http: reqwest::Client,
    /// An admin user (rate-limit overrides).
    admin: OnceLock<Account>,
}

/// A registered user: what a node or a person needs to act as them.
#[derive(Debug, Clone)]
pub struct Account {
    /// `@localpart:localhost`.
    pub user_id: String,
    /// Its access token.
    pub token: String,
    /// Its device (transaction ids are per device).
    pub device_id: String,
}

/// Users made so far in this process (so every localpart is new).
static USERS: AtomicU32 = AtomicU32::new(0);

impl Synapse {
    /// The binary's Synapse, started on first use (about 5 s; more on a busy machine).
    pub async fn shared() -> &'static Synapse {
        static SHARED: OnceLock<Synapse> = OnceLock::new();
        tokio::task::spawn_blocking(|| SHARED.get_or_init(Synapse::start_blocking))
            .await
            .expect("start synapse")
    }

    fn start_blocking() -> Synapse {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::Builder::new()
            .prefix("botmesh-synapse-")
            .tempdir()
            .unwrap()
            .keep();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/synapse_env.py");
        let mut child = Command::new(crate::test_python())
            .arg(&script)
            .arg(&dir)
            .arg(port.to_string())
            .arg(SHARED_SECRET)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tests/py/synapse_env.py");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .expect("read synapse_env.py");
        assert_eq!(
            first.trim(),
            "ready",
            "Synapse did not start (is matrix-synapse in the test venv? scripts/test.sh installs it):\n{}",
            std::fs::read_to_string(dir.join("homeserver.log")).unwrap_or_default()
        );
        Synapse {
            port,
            dir,
            _stdin: Mutex::new(child.stdin.take().unwrap()),
            _child: Mutex::new(child),
            // Tests run on runtimes of their own: a connection kept idle by one
            // would be dead for the next (its runtime gone), so none is kept.
            http: reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            admin: OnceLock::new(),
        }
    }

    /// `http://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Synapse's access log ("Processed request" lines, tokens redacted).
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default()
    }

    /// Calls the client-server (or admin) API as `token`; panics on an error answer.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url()));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.expect("synapse request");
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "{method} {path}: {status} {v}");
        v
    }

    /// Registers a new user whose localpart starts with `prefix`, shown as
    /// `displayname` (shared-secret registration: HMAC-SHA1 over nonce, user,
    /// password and admin flag).
    pub async fn register(&self, prefix: &str, displayname: &str, admin: bool) -> Account {
        let n = USERS.fetch_add(1, Ordering::SeqCst);
        let user = format!("{}{n}x{}", prefix.to_lowercase(), std::process::id());
        let password = format!("pw-{user}");
        let nonce = self
            .call(
                reqwest::Method::GET,
                "/_synapse/admin/v1/register",
                None,
                None,
            )
            .await["nonce"]
            .as_str()
            .unwrap()
            .to_string();
        let key = ring::hmac::Key::new(
            ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            SHARED_SECRET.as_bytes(),
        );
        let flag = if admin { "admin" } else { "notadmin" };
        let msg = format!("{nonce}\0{user}\0{password}\0{flag}");
        let mac: String = ring::hmac::sign(&key, msg.as_bytes())
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let v = self
            .call(
                reqwest::Method::POST,
                "/_synapse/admin/v1/register",
                None,
                Some(json!({"nonce": nonce, "username": user, "displayname": displayname, "password": password, "admin": admin, "mac": mac})),
            )
            .await;
        Account {
            user_id: v["user_id"].as_str().unwrap().to_string(),
            token: v["access_token"].as_str().unwrap().to_string(),
            device_id: v["device_id"].as_str().unwrap().to_string(),
        }
    }

    /// A new room made by `creator` with `invite` invited (unencrypted unless
    /// `encrypted`: then it holds `m.room.encryption` from the start).
    pub async fn create_room(
        &self,
        creator: &Account,
        invite: &[&Account],
        encrypted: bool,
    ) -> String {
        let mut body = json!({
            "preset": "private_chat",
            "name": "botmesh test",
            "invite": invite.iter().map(|a| a.user_id.clone()).collect::<Vec<_>>(),
        });
        if encrypted {
            body["initial_state"] = json!([{"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}]);
        }
        let v = self
            .call(
                reqwest::Method::POST,
                "/_matrix/client/v3/createRoom",
                Some(&creator.token),
                Some(body),
            )
            .await;
        v["room_id"].as_str().unwrap().to_string()
    }

    /// Limits `user`'s events to `per_second` after a burst of `burst` (admin API:
    /// the rate-limit override of that user).
    pub async fn limit_messages(&self, user: &Account, per_second: u32, burst: u32) {
        if self.admin.get().is_none() {
            let a = self.register("admin", "Admin", true).await;
            let _ = self.admin.set(a);
        }
        let admin = self.admin.get().unwrap();
        let path = format!(
            "/_synapse/admin/v1/users/{}/override_ratelimit",
            user.user_id
        );
        self.call(
            reqwest::Method::POST,
            &path,
            Some(&admin.token),
            Some(json!({"messages_per_second": per_second, "burst_count": burst})),
        )
        .await;
    }
}

/// A person in a room, played by matrix-nio (tests/py/matrix_person.py).
pub struct Person {
    /// Who they are.
    pub account: Account,
    /// The script's process (killed when dropped).
    _child: tokio::process::Child,
    /// Commands in.
    stdin: tokio::process::ChildStdin,
    /// Answers out.
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Person {
    /// Starts matrix-nio as `account` in `room` (it joins, syncs, and says ready).
    pub async fn join(hs: &Synapse, account: &Account, room: &str) -> Person {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/matrix_person.py");
        let mut child = tokio::process::Command::new(crate::test_python())
            .arg(script)
            .args([
                &hs.url(),
                &account.user_id,
                &account.token,
                &account.device_id,
                room,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start matrix_person.py");
        let stdin = child.stdin.take().unwrap();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut p = Person {
            account: account.clone(),
            _child: child,
            stdin,
            lines,
        };
        let ready = p.answer().await;
        assert_eq!(ready["event"], "ready", "matrix-nio: {ready}");
        p
    }

    async fn answer(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(90), self.lines.next_line())
            .await
            .expect("matrix-nio answers in time")
            .expect("read matrix-nio")
            .expect("matrix-nio exited");
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"))
    }

    async fn command(&mut self, cmd: Value) -> Value {
        let mut line = cmd.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to matrix-nio");
        self.answer().await
    }

    /// Sends an `m.room.message` with this content; returns its event id.
    pub async fn send(&mut self, content: Value) -> String {
        let v = self
            .command(json!({"op": "send", "content": content}))
            .await;
        v["event_id"]
            .as_str()
            .unwrap_or_else(|| panic!("send: {v}"))
            .to_string()
    }

    /// Sends plain text.
    pub async fn say(&mut self, text: &str) -> String {
        self.send(json!({"msgtype": "m.text", "body": text})).await
    }

    /// The messages from `sender` this person has seen, once there are `n` (or
    /// after `within`).
    pub async fn messages(&mut self, sender: &str, n: usize, within: Duration) -> Vec<Value> {
        let v = self
            .command(json!({"op": "messages", "sender": sender, "n": n, "timeout": within.as_secs_f64()}))
            .await;
        v["messages"].as_array().cloned().unwrap_or_default()
    }

    /// Whether this person saw `user` typing (waiting up to `within`).
    pub async fn saw_typing(&mut self, user: &str, within: Duration) -> bool {
        let v = self
            .command(json!({"op": "typing", "user": user, "timeout": within.as_secs_f64()}))
            .await;
        v["typing"].as_bool().unwrap_or(false)
    }
}
