//! A bot's MCP tool servers (`[[bots.mcp]]`, docs/tools.md), over the official Rust
//! SDK `rmcp`: stdio child processes and streamable-HTTP endpoints.
//!
//! [`McpTools::start`] gives each server a supervisor task: it connects, lists the
//! tools, re-lists them on `notifications/tools/list_changed`, and when the server will
//! not start or goes away, marks it down (its tools are not offered; a warning says
//! so) and connects again after a [`Backoff`] delay. A tool call ([`McpTools::call`])
//! is bounded in time and its result in size; whatever happens, the model gets a
//! result to read ([`ToolResult`]).
//!
//! A stdio server starts with a clean environment: PATH, HOME and LANG of the node
//! and the `env` configured for it, nothing else (the node's secrets never reach it).
//! It runs in the node's working directory, in the same Landlock box as an ACP agent
//! (`agent::boxing`): that directory read-only, a private temp dir and `sandbox.write`
//! read-write, nothing of the node's data, config, key or secret files; `sandbox =
//! "off"` runs it unboxed. An HTTP server gets only its configured headers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, ContentBlock, Tool};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, Peer, RoleClient};
use serde_json::{Map, Value};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::agent::acp::schema::{
    EnvVariable, HttpHeader, McpServer, McpServerHttp, McpServerStdio,
};
use crate::agent::boxing::{boxed_command, Boxing, Launch, TempDir};
use crate::config::pacing::{Backoff, Jitter};
use crate::config::McpServerSettings;
use crate::telemetry::metrics::Metrics;

/// The delays between attempts to (re)connect a server.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
/// How long connecting (start, `initialize`) and listing tools may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Environment variables of the node a stdio server inherits.
const INHERITED_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

/// A tool as the reply model is offered it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolInfo {
    /// The server offering it.
    pub(crate) server: String,
    /// The tool's name (what the model calls).
    pub(crate) name: String,
    /// What it does, for the model.
    pub(crate) description: String,
    /// Its input JSON schema (the function's `parameters`).
    pub(crate) parameters: Value,
}

/// What a tool call came to, as the model reads it and `/why` shows it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolResult {
    /// The server the call went to (empty when no server offers the tool).
    pub(crate) server: String,
    /// The tool called.
    pub(crate) tool: String,
    /// ok, error (`isError`), timeout, failed, unavailable, unknown_tool.
    pub(crate) outcome: &'static str,
    /// The text the model gets: the tool's text content, or why there is none.
    pub(crate) text: String,
    /// Whether the text was cut at the result cap.
    pub(crate) capped: bool,
    /// How long the call took.
    pub(crate) ms: u64,
}

impl ToolResult {
    /// Whether the model should read this as an error (any outcome but ok).
    pub(crate) fn is_error(&self) -> bool {
        self.outcome != "ok"
    }
}

/// What a server is, as its supervisor last saw it.
#[derive(Clone)]
enum State {
    /// Its first connection is under way.
    Starting,
    /// Connected: the peer to call, the tools it lists, and the token that ends the
    /// connection (so a broken one is reconnected).
    Up {
        /// The connection's handle for requests.
        peer: Peer<RoleClient>,
        /// Its tools, as last listed.
        tools: Arc<Vec<Tool>>,
        /// Ends the connection.
        end: CancellationToken,
    },
    /// Not connected: why.
    Down(String),
}

/// One configured server and its state.
struct Server {
    /// Its settings.
    settings: McpServerSettings,
    /// Its state, written by its supervisor.
    state: watch::Sender<State>,
}

/// A bot's MCP servers.
pub(crate) struct McpTools {
    /// The bot, for logs and metrics.
    bot: String,
    /// Its servers, in configuration order (the first to offer a tool name wins).
    servers: Vec<Arc<Server>>,
    /// Ends every supervisor and connection.
    stop: CancellationToken,
    /// Counts tool calls.
    metrics: Arc<Metrics>,
}

impl Drop for McpTools {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Tells the supervisor that the server's tool list changed.
struct Handler {
    /// Notified on `notifications/tools/list_changed`.
    changed: Arc<Notify>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }
}

impl McpTools {
    /// Starts a supervisor for each of `bot`'s `servers` (`headers`: the HTTP servers'
    /// headers, by server name; `boxing`: how stdio servers are boxed, proven at
    /// start). Must be called within a tokio runtime.
    pub(crate) fn start(
        bot: &str,
        servers: &[McpServerSettings],
        headers: &HashMap<String, Vec<(String, String)>>,
        boxing: Boxing,
        metrics: Arc<Metrics>,
    ) -> Arc<McpTools> {
        let stop = CancellationToken::new();
        let servers: Vec<Arc<Server>> = servers
            .iter()
            .map(|s| {
                Arc::new(Server {
                    settings: s.clone(),
                    state: watch::Sender::new(State::Starting),
                })
            })
            .collect();
        for server in &servers {
            let headers = headers
                .get(&server.settings.name)
                .cloned()
                .unwrap_or_default();
            metrics.mcp_tools(bot, &server.settings.name, 0);
            tokio::spawn(supervise(
                bot.to_string(),
                server.clone(),
                (headers, boxing.clone()),
                stop.clone(),
                metrics.clone(),
            ));
        }
        Arc::new(McpTools {
            bot: bot.to_string(),
            servers,
            stop,
            metrics,
        })
    }

    /// Whether the bot has any server.
    pub(crate) fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Waits up to `wait` for servers still making their first connection, then gives
    /// the tools of the servers that are up (a name two servers offer: the first's)
    /// and the names of those that are not, with why.
    pub(crate) async fn tools(&self, wait: Duration) -> (Vec<ToolInfo>, Vec<(String, String)>) {
        let deadline = tokio::time::Instant::now() + wait;
        let mut out: Vec<ToolInfo> = Vec::new();
        let mut down = Vec::new();
        for server in &self.servers {
            let mut rx = server.state.subscribe();
            let _ =
                tokio::time::timeout_at(deadline, rx.wait_for(|s| !matches!(s, State::Starting)))
                    .await;
            let state = server.state.borrow().clone();
            let name = &server.settings.name;
            match state {
                State::Up { tools, .. } => {
                    for t in tools.iter() {
                        if out.iter().any(|o| o.name == t.name) {
                            tracing::warn!(bot = %self.bot, server = %name, tool = %t.name, "two MCP servers offer this tool; the first one's is used");
                            continue;
                        }
                        out.push(ToolInfo {
                            server: name.clone(),
                            name: t.name.to_string(),
                            description: t.description.as_deref().unwrap_or_default().to_string(),
                            parameters: Value::Object((*t.input_schema).clone()),
                        });
                    }
                }
                State::Starting => down.push((name.clone(), "still starting".to_string())),
                State::Down(why) => down.push((name.clone(), why)),
            }
        }
        (out, down)
    }

    /// Calls `tool` with `arguments` (the model's JSON text) on the server that offers
    /// it, within `timeout`, its text cut at `cap` characters. Logged and counted.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: &str,
        timeout: Duration,
        cap: usize,
    ) -> ToolResult {
        let started = Instant::now();
        let found = self.servers.iter().find_map(|s| match &*s.state.borrow() {
            State::Up { peer, tools, end } if tools.iter().any(|t| t.name == tool) => {
                Some((s.clone(), peer.clone(), end.clone()))
            }
            _ => None,
        });
        let mut result = match found {
            None => ToolResult {
                server: String::new(),
                tool: tool.to_string(),
                outcome: "unknown_tool",
                text: format!("no connected tool server offers a tool named {tool:?}"),
                capped: false,
                ms: 0,
            },
            Some((server, peer, end)) => {
                let (outcome, text) = call_on(&peer, &end, tool, arguments, timeout).await;
                if end.is_cancelled() {
                    // The connection broke: no tools from it until it is back (its
                    // supervisor reconnects).
                    let why = "the connection broke during a tool call".to_string();
                    server.state.send_replace(State::Down(why));
                    self.metrics.mcp_tools(&self.bot, &server.settings.name, 0);
                }
                let (text, capped) = cap_text(text, cap);
                ToolResult {
                    server: server.settings.name.clone(),
                    tool: tool.to_string(),
                    outcome,
                    text,
                    capped,
                    ms: 0,
                }
            }
        };
        result.ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.metrics
            .tool_call(&self.bot, &result.server, &result.tool, result.outcome);
        tracing::info!(bot = %self.bot, server = %result.server, tool = %result.tool, outcome = result.outcome, ms = result.ms, capped = result.capped, result_chars = result.text.chars().count(), "tool call");
        result
    }

    /// The bot's servers as ACP's `McpServer`s, for an ACP agent's `session/new`
    /// (`headers`: the HTTP servers' headers, by server name): stdio `{name, command,
    /// args, env: [{name, value}]}` (its env: the configured one; the agent process
    /// starts it), http `{type: "http", name, url, headers: [{name, value}]}`.
    pub(crate) fn acp_servers(
        servers: &[McpServerSettings],
        headers: &HashMap<String, Vec<(String, String)>>,
    ) -> Vec<McpServer> {
        servers
            .iter()
            .map(|s| match &s.url {
                Some(url) => {
                    let h = headers.get(&s.name).map(Vec::as_slice).unwrap_or_default();
                    McpServer::Http(
                        McpServerHttp::new(&s.name, url)
                            .headers(h.iter().map(|(n, v)| HttpHeader::new(n, v)).collect()),
                    )
                }
                None => McpServer::Stdio(
                    McpServerStdio::new(&s.name, s.command.first().cloned().unwrap_or_default())
                        .args(s.command.iter().skip(1).cloned().collect())
                        .env(s.env.iter().map(|(n, v)| EnvVariable::new(n, v)).collect()),
                ),
            })
            .collect()
    }
}

/// One `tools/call` on `peer`: the outcome label and the text for the model. A
/// transport failure ends the connection (`end`), so the supervisor reconnects.
async fn call_on(
    peer: &Peer<RoleClient>,
    end: &CancellationToken,
    tool: &str,
    arguments: &str,
    timeout: Duration,
) -> (&'static str, String) {
    let arguments = if arguments.trim().is_empty() {
        Map::new()
    } else {
        match serde_json::from_str::<Value>(arguments) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return ("failed", "the arguments must be a JSON object".to_string()),
            Err(e) => return ("failed", format!("the arguments are not JSON: {e}")),
        }
    };
    let mut params = CallToolRequestParams::new(tool.to_string());
    params.arguments = Some(arguments);
    match tokio::time::timeout(timeout, peer.call_tool(params)).await {
        Err(_) => (
            "timeout",
            format!("the tool did not answer within {} ms", timeout.as_millis()),
        ),
        Ok(Err(e)) => {
            if matches!(
                e,
                rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)
            ) {
                end.cancel();
            }
            ("failed", format!("the tool call failed: {e}"))
        }
        Ok(Ok(r)) => {
            let mut text: Vec<String> = r
                .content
                .iter()
                .map(|c| match c {
                    ContentBlock::Text(t) => t.text.clone(),
                    other => serde_json::to_string(other).unwrap_or_default(),
                })
                .collect();
            if text.is_empty() {
                if let Some(s) = &r.structured_content {
                    text.push(s.to_string());
                }
            }
            let outcome = if r.is_error == Some(true) {
                "error"
            } else {
                "ok"
            };
            (outcome, text.join("\n"))
        }
    }
}

/// `text` cut at `cap` characters, with a note saying so; and whether it was cut.
pub(crate) fn cap_text(text: String, cap: usize) -> (String, bool) {
    match text.char_indices().nth(cap) {
        None => (text, false),
        Some((at, _)) => {
            let total = text.chars().count();
            let mut out = text[..at].to_string();
            out.push_str(&format!(
                "\n[result cut: {cap} of {total} characters shown]"
            ));
            (out, true)
        }
    }
}

/// Keeps one server connected until `stop`: connect, list, re-list on change; on a
/// failure or the end of the connection, wait the backoff and connect again.
async fn supervise(
    bot: String,
    server: Arc<Server>,
    (headers, boxing): (Vec<(String, String)>, Boxing),
    stop: CancellationToken,
    metrics: Arc<Metrics>,
) {
    let name = server.settings.name.clone();
    let mut failures: u32 = 0;
    loop {
        let changed = Arc::new(Notify::new());
        let handler = Handler {
            changed: changed.clone(),
        };
        let connecting = tokio::time::timeout(
            CONNECT_TIMEOUT,
            connect(&bot, &server.settings, (&headers, &boxing), handler),
        );
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            c = connecting => c.unwrap_or_else(|_| Err(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()))),
        };
        let why = match connected {
            Err(e) => e,
            Ok((running, _temp)) => {
                // `_temp`, the server's private temp dir, lives as long as the connection.
                let why = serve(&bot, &server, running, &changed, &stop, &metrics).await;
                if stop.is_cancelled() {
                    return;
                }
                failures = 0;
                why
            }
        };
        failures += 1;
        let delay = RECONNECT.delay(failures, Jitter::Scale(0.8..=1.0));
        tracing::warn!(bot = %bot, server = %name, error = %why, retry_in_ms = delay.as_millis() as u64, "MCP server unavailable: the bot answers without its tools until it is back");
        server.state.send_replace(State::Down(why));
        metrics.mcp_tools(&bot, &name, 0);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Runs one connection: lists its tools, re-lists them when they change, until it
/// ends (or `stop`). Gives why it ended.
async fn serve(
    bot: &str,
    server: &Server,
    running: RunningService<RoleClient, Handler>,
    changed: &Notify,
    stop: &CancellationToken,
    metrics: &Metrics,
) -> String {
    let name = &server.settings.name;
    let peer = running.peer().clone();
    let end = CancellationToken::new();
    let ct = running.cancellation_token();
    let done = running.waiting();
    tokio::pin!(done);
    let mut listed = false;
    loop {
        let tools = match tokio::time::timeout(CONNECT_TIMEOUT, peer.list_all_tools()).await {
            Ok(Ok(tools)) => tools,
            Ok(Err(e)) => {
                ct.cancel();
                let _ = done.await;
                return format!("listing tools failed: {e}");
            }
            Err(_) => {
                ct.cancel();
                let _ = done.await;
                return "listing tools took too long".to_string();
            }
        };
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        tracing::info!(bot = %bot, server = %name, tools = ?names, "MCP server {}", if listed { "changed its tools" } else { "connected" });
        listed = true;
        metrics.mcp_tools(bot, name, tools.len());
        server.state.send_replace(State::Up {
            peer: peer.clone(),
            tools: Arc::new(tools),
            end: end.clone(),
        });
        tokio::select! {
            _ = stop.cancelled() => {
                ct.cancel();
                let _ = done.await;
                return "the node is stopping".to_string();
            }
            _ = end.cancelled() => {
                ct.cancel();
                let _ = done.await;
                return "the connection broke".to_string();
            }
            reason = &mut done => return format!("the connection ended ({reason:?})"),
            _ = changed.notified() => {}
        }
    }
}

/// Starts (stdio, boxed as `boxing` and its `sandbox` say) or reaches (HTTP) the
/// server and runs `initialize`; a boxed server's temp dir comes with the connection.
async fn connect(
    bot: &str,
    s: &McpServerSettings,
    (headers, boxing): (&[(String, String)], &Boxing),
    handler: Handler,
) -> Result<(RunningService<RoleClient, Handler>, Option<TempDir>), String> {
    match &s.url {
        None => {
            let mut env: Vec<(String, String)> = INHERITED_ENV
                .iter()
                .filter(|k| !s.env.contains_key(**k))
                .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
                .collect();
            env.extend(s.env.iter().map(|(k, v)| (k.clone(), v.clone())));
            let cwd = std::env::current_dir()
                .map_err(|e| format!("the node's working directory is unreadable: {e}"))?;
            let (cmd, temp) = boxed_command(
                boxing,
                Launch {
                    who: &format!("{bot}-mcp-{}", s.name),
                    program: &s.command[0],
                    args: &s.command[1..],
                    cwd: &cwd,
                    cwd_write: false,
                    env,
                    sandbox: &s.sandbox,
                    run_as: None,
                },
            )
            .map_err(|e| format!("could not start {:?}: {e}", s.command[0]))?;
            let (transport, stderr) = rmcp::transport::TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("could not start {:?}: {e}", s.command[0]))?;
            if let Some(stderr) = stderr {
                let label: std::sync::Arc<str> = format!("mcp/{}", s.name).into();
                tokio::spawn(crate::agent::stderr::log_lines(
                    stderr,
                    label,
                    crate::agent::stderr::Level::Info,
                ));
            }
            let running = rmcp::serve_client(handler, transport)
                .await
                .map_err(|e| format!("initialize failed: {e}"))?;
            Ok((running, temp))
        }
        Some(url) => {
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let mut custom = HashMap::new();
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (
                    http::HeaderName::from_bytes(k.as_bytes()),
                    http::HeaderValue::from_str(v),
                ) {
                    custom.insert(k, v);
                }
            }
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
            let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
            let running = rmcp::serve_client(handler, transport)
                .await
                .map_err(|e| format!("initialize failed: {e}"))?;
            Ok((running, None))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stdio() -> McpServerSettings {
        McpServerSettings {
            name: "time".into(),
            command: vec![
                "mcp-server-time".into(),
                "--local-timezone".into(),
                "UTC".into(),
            ],
            env: [("TZ".to_string(), "UTC".to_string())]
                .into_iter()
                .collect(),
            url: None,
            headers_env: Default::default(),
            sandbox: Default::default(),
        }
    }

    fn http() -> McpServerSettings {
        McpServerSettings {
            name: "web".into(),
            command: vec![],
            env: Default::default(),
            url: Some("http://127.0.0.1:8811/mcp".into()),
            headers_env: [("Authorization".to_string(), "WEB_TOKEN".to_string())]
                .into_iter()
                .collect(),
            sandbox: Default::default(),
        }
    }

    #[test]
    fn acp_schema_of_stdio_and_http_servers() {
        let headers: HashMap<String, Vec<(String, String)>> = [(
            "web".to_string(),
            vec![("Authorization".to_string(), "Bearer t".to_string())],
        )]
        .into_iter()
        .collect();
        let out = serde_json::to_value(McpTools::acp_servers(&[stdio(), http()], &headers))
            .expect("serializes");
        assert_eq!(
            out,
            json!([
                {
                    "name": "time",
                    "command": "mcp-server-time",
                    "args": ["--local-timezone", "UTC"],
                    "env": [{"name": "TZ", "value": "UTC"}],
                },
                {
                    "type": "http",
                    "name": "web",
                    "url": "http://127.0.0.1:8811/mcp",
                    "headers": [{"name": "Authorization", "value": "Bearer t"}],
                },
            ])
        );
    }

    #[test]
    fn acp_schema_without_headers_or_env() {
        let mut s = stdio();
        s.env.clear();
        let out = serde_json::to_value(McpTools::acp_servers(&[s, http()], &HashMap::new()))
            .expect("serializes");
        assert_eq!(out[0]["env"], json!([]));
        assert_eq!(out[1]["headers"], json!([]));
    }

    #[test]
    fn results_are_cut_at_the_cap_in_characters() {
        let (text, capped) = cap_text("é".repeat(10), 4);
        assert!(capped);
        assert!(text.starts_with("éééé\n[result cut: 4 of 10"));
        let (text, capped) = cap_text("short".into(), 5);
        assert!(!capped);
        assert_eq!(text, "short");
    }
}
