//! A minimal W3C WebDriver client for browser tests: starts `chromedriver` on a free
//! 127.0.0.1 port, opens one headless Chromium session and speaks plain HTTP to it.
//!
//! Binaries default to Debian's `/usr/bin/chromedriver` and `/usr/bin/chromium`
//! (`apt-get install chromium chromium-driver`); `BOTMESH_CHROMEDRIVER` and
//! `BOTMESH_CHROMIUM` override them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

/// The W3C key code for Enter, for [`Browser::send_keys`].
pub const ENTER: &str = "\u{E007}";

/// The W3C element reference key.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where chromedriver and Chromium are, or why they cannot be used.
pub fn binaries() -> std::result::Result<(PathBuf, PathBuf), String> {
    let driver = std::env::var_os("BOTMESH_CHROMEDRIVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromedriver"));
    let browser = std::env::var_os("BOTMESH_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let missing: Vec<String> = [&driver, &browser]
        .iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        Ok((driver, browser))
    } else {
        Err(format!(
            "{} not found (install with `apt-get install chromium chromium-driver`, \
             or set BOTMESH_CHROMEDRIVER / BOTMESH_CHROMIUM)",
            missing.join(" and ")
        ))
    }
}

/// Whether a browser test is skipped without Chromium (`why`): loudly, and never under
/// CI (`CI` set), where it fails instead.
///
/// Exists because more than one test file drives Chromium.
pub fn skip_or_fail(why: &str) -> bool {
    if std::env::var_os("CI").is_some() {
        panic!("browser test cannot run under CI: {why}");
    }
    eprintln!(
        "\n{}\nSKIPPING the browser test: {why}\n{}\n",
        "!".repeat(72),
        "!".repeat(72)
    );
    true
}

/// A chromedriver process with one open browser session. Dropping it ends the session
/// (closing Chromium) and kills chromedriver.
pub struct Browser {
    child: Child,
    base: String,
    session: Option<String>,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a fresh profile and a
    /// `width`x`height` window.
    pub async fn start(width: u32, height: u32) -> Result<Browser> {
        let (driver, chromium) = binaries().map_err(|e| anyhow!(e))?;
        let port = free_port()?;
        let profile = tempfile::tempdir().context("profile dir")?;
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawn {}", driver.display()))?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()?;
        let mut b = Browser {
            child,
            base: format!("http://127.0.0.1:{port}"),
            session: None,
            http,
            _profile: profile,
        };
        b.wait_ready().await?;
        b.new_session(&chromium, width, height).await?;
        Ok(b)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("chromedriver exited early: {status}");
            }
            if let Ok(r) = self.http.get(format!("{}/status", self.base)).send().await {
                if let Ok(v) = r.json::<Value>().await {
                    if v["value"]["ready"] == true {
                        return Ok(());
                    }
                }
            }
            if std::time::Instant::now() > deadline {
                bail!("chromedriver did not become ready on {}", self.base);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn new_session(&mut self, chromium: &Path, width: u32, height: u32) -> Result<()> {
        let args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--no-proxy-server".into(),
            "--disable-dev-shm-usage".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", self._profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium.display().to_string(), "args": args},
        }}});
        let v = self.call("POST", "/session", Some(caps)).await?;
        let id = v["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("no sessionId in {v}"))?;
        self.session = Some(id.to_string());
        Ok(())
    }

    /// One WebDriver command; returns its `value`.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.http.get(&url),
            "DELETE" => self.http.delete(&url),
            _ => self
                .http
                .post(&url)
                .json(&body.unwrap_or_else(|| json!({}))),
        };
        let r = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = r.status();
        let v: Value = r
            .json()
            .await
            .with_context(|| format!("{method} {path}: not JSON"))?;
        let value = v.get("value").cloned().unwrap_or(Value::Null);
        if !status.is_success() {
            bail!(
                "{method} {path}: {status} {}: {}",
                value["error"].as_str().unwrap_or("?"),
                value["message"].as_str().unwrap_or("")
            );
        }
        Ok(value)
    }

    /// A command on the current session.
    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let id = self
            .session
            .as_deref()
            .ok_or_else(|| anyhow!("no session"))?;
        self.call(method, &format!("/session/{id}{path}"), body)
            .await
    }

    /// Navigates the current window to `url` (returns once the page has loaded).
    pub async fn goto(&self, url: &str) -> Result<()> {
        self.cmd("POST", "/url", Some(json!({ "url": url })))
            .await
            .map(drop)
    }

    /// Reloads the current page.
    pub async fn refresh(&self) -> Result<()> {
        self.cmd("POST", "/refresh", None).await.map(drop)
    }

    /// The first element matching a CSS selector (its WebDriver id).
    pub async fn find(&self, css: &str) -> Result<String> {
        let v = self
            .cmd(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await
            .with_context(|| format!("find {css:?}"))?;
        v[ELEMENT_KEY]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no element reference in {v}"))
    }

    /// Clears an input or textarea.
    pub async fn clear(&self, css: &str) -> Result<()> {
        let e = self.find(css).await?;
        self.cmd("POST", &format!("/element/{e}/clear"), None)
            .await
            .map(drop)
    }

    /// Types `text` into the element (W3C key codes such as [`ENTER`] allowed).
    pub async fn send_keys(&self, css: &str, text: &str) -> Result<()> {
        let e = self.find(css).await?;
        self.cmd(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        )
        .await
        .map(drop)
    }

    /// Clicks the element.
    pub async fn click(&self, css: &str) -> Result<()> {
        let e = self.find(css).await?;
        self.cmd("POST", &format!("/element/{e}/click"), None)
            .await
            .map(drop)
    }

    /// Runs synchronous JavaScript (`return …;`) and returns its result.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Polls `script` every 100 ms until `done` accepts its result or `timeout` passes;
    /// returns the last result either way, with whether `done` held.
    pub async fn poll(
        &self,
        script: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Result<(Value, bool)> {
        // An error ends the wait at once: it is returned, not retried.
        let v = crate::wait_for(
            timeout,
            Duration::from_millis(100),
            || self.execute(script, vec![]),
            |v| v.as_ref().map_or(true, &done),
        )
        .await?;
        let held = done(&v);
        Ok((v, held))
    }

    /// Resizes the window.
    pub async fn set_window_size(&self, width: u32, height: u32) -> Result<()> {
        self.cmd(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await
        .map(drop)
    }

    /// Emulates a `width`x`height` viewport (CSS pixels) in the current tab, as a phone
    /// when `mobile` (headless windows cannot be narrower than about 500 px).
    pub async fn emulate_viewport(&self, width: u32, height: u32, mobile: bool) -> Result<()> {
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        )
        .await
        .map(drop)
    }

    /// Ends [`Browser::emulate_viewport`] in the current tab.
    pub async fn clear_emulation(&self) -> Result<()> {
        self.cdp("Emulation.clearDeviceMetricsOverride", json!({}))
            .await
            .map(drop)
    }

    /// A Chrome DevTools Protocol command on the current tab (chromedriver extension).
    pub async fn cdp(&self, cmd: &str, params: Value) -> Result<Value> {
        self.cmd(
            "POST",
            "/goog/cdp/execute",
            Some(json!({"cmd": cmd, "params": params})),
        )
        .await
    }

    /// Opens a new tab and switches to it; returns its handle.
    pub async fn new_tab(&self) -> Result<String> {
        let v = self
            .cmd("POST", "/window/new", Some(json!({"type": "tab"})))
            .await?;
        let h = v["handle"]
            .as_str()
            .ok_or_else(|| anyhow!("no handle in {v}"))?
            .to_string();
        self.switch_to(&h).await?;
        Ok(h)
    }

    /// The current window's handle.
    pub async fn window(&self) -> Result<String> {
        let v = self.cmd("GET", "/window", None).await?;
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no handle in {v}"))
    }

    /// Switches to the window or tab `handle`.
    pub async fn switch_to(&self, handle: &str) -> Result<()> {
        self.cmd("POST", "/window", Some(json!({ "handle": handle })))
            .await
            .map(drop)
    }

    /// Saves a PNG screenshot of the current viewport.
    pub async fn screenshot(&self, path: impl AsRef<Path>) -> Result<()> {
        let v = self.cmd("GET", "/screenshot", None).await?;
        let b64 = v
            .as_str()
            .ok_or_else(|| anyhow!("screenshot not a string"))?;
        let png = base64_decode(b64)?;
        std::fs::write(path.as_ref(), png)
            .with_context(|| format!("write {}", path.as_ref().display()))
    }

    /// Ends the session cleanly (closes Chromium); chromedriver is killed on drop.
    pub async fn quit(mut self) -> Result<()> {
        if let Some(id) = self.session.take() {
            self.call("DELETE", &format!("/session/{id}"), None).await?;
        }
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Possibly inside a panicking async test: blocking requests on a plain socket
        // end the session (closing Chromium) and then chromedriver itself, so neither
        // outlives the test; a kill is the last resort.
        let addr = self.base.trim_start_matches("http://").to_string();
        if let Some(id) = self.session.take() {
            let _ = raw_request(&addr, "DELETE", &format!("/session/{id}"));
        }
        let _ = raw_request(&addr, "GET", "/shutdown");
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a bodiless HTTP/1.1 request and waits for the start of the reply.
fn raw_request(addr: &str, method: &str, path: &str) -> std::io::Result<()> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = [0u8; 512];
    s.read(&mut buf).map(drop)
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Standard base64 (with padding), as WebDriver returns screenshots.
fn base64_decode(s: &str) -> Result<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c).ok_or_else(|| anyhow!("bad base64 byte {c}"))? << (18 - 6 * i);
        }
        let take = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => bail!("truncated base64"),
        };
        out.extend_from_slice(&n.to_be_bytes()[1..1 + take]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn decodes_base64() {
        assert_eq!(super::base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(super::base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(super::base64_decode("aGV5").unwrap(), b"hey");
        assert!(super::base64_decode("a").is_err());
    }
}
