//! The `mesh` MCP server (`botmesh mcp`): the group as tools for an agent —
//! `read_group`, `members`, `post`, `ask`, `wait_for_message` (docs/agents.md, "Working
//! together") — over stdio, built on the official Rust SDK (`rmcp`'s server).
//!
//! It holds no state and no secret of the node: each tool call is one
//! `POST /v1/tools/<name>` to the running node's local API, which does the work
//! (`app::group_tools`). A hosted agent is handed this server in its `session/new`,
//! with `--api` and a credential for its bot and group in [`TOKEN_ENV`]; an agent
//! outside the mesh (Claude Code, Codex in a terminal) starts it with `--config`,
//! reaching the API with the bot's (or the operator's) `api_token_env` token.
//!
//! A refusal of the node (`{error, code}`), a node that cannot be reached, or an
//! unknown tool is a tool result with `isError: true` that says what happened, never a
//! protocol error the model cannot read.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};

/// The env var holding the credential `botmesh mcp --api` uses.
pub const TOKEN_ENV: &str = "BOTMESH_MCP_TOKEN";

/// How much longer than its own wait a waiting tool's HTTP call may take.
const WAIT_MARGIN: Duration = Duration::from_secs(30);

/// The longest any tool call waits for the node (an `ask` or `wait_for_message` waits
/// at most `[mesh] ask_timeout_secs`, at most 3,600 s).
const LONGEST_CALL: Duration = Duration::from_secs(3_600);

/// A call that does not wait answers within this.
const QUICK_CALL: Duration = Duration::from_secs(30);

/// Where the tools go: a running node's local API.
#[derive(Debug, Clone)]
pub struct MeshTarget {
    /// The API's base URL (`http://127.0.0.1:8101`).
    pub api: String,
    /// The bearer token: a group credential, the bot's sidecar token or the
    /// operator's; none when the API needs none.
    pub token: Option<String>,
    /// The group the tools act in; absent: the credential's, else `[mesh].group`.
    pub group: Option<String>,
}

/// The URL that reaches a local API listening on `addr` from the same host (loopback
/// when it listens on every address).
pub fn api_url(addr: std::net::SocketAddr) -> String {
    let ip = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => std::net::Ipv4Addr::LOCALHOST.into(),
        ip if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", std::net::SocketAddr::new(ip, addr.port()))
}

impl MeshTarget {
    /// The running node of `cfg`'s bot: its API address (loopback when it listens on
    /// every address) and token — the bot's sidecar token (`[[bots]] api_token_env`),
    /// else the operator's (`[mesh] api_token_env`), else none.
    pub fn of(cfg: &crate::config::NodeConfig, group: Option<String>) -> MeshTarget {
        let tokens = &cfg.api_tokens;
        MeshTarget {
            api: api_url(cfg.api_addr),
            token: tokens.sidecar.clone().or_else(|| tokens.operator.clone()),
            group,
        }
    }
}

/// The server: see the module documentation.
#[derive(Clone)]
pub struct MeshServer {
    /// The node's API and how to reach it.
    target: Arc<MeshTarget>,
    /// One HTTP client for every call.
    http: reqwest::Client,
    /// The bot the tools act as (for the server's name).
    bot: String,
    /// The tools offered, when not all five (`--only`: the built-in model's
    /// `read_group`, `members`, `ask`).
    only: Option<Vec<String>>,
}

/// A JSON Schema object for a tool's arguments.
fn schema(properties: Value, required: &[&str]) -> Arc<serde_json::Map<String, Value>> {
    let v = json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false});
    match v {
        Value::Object(m) => Arc::new(m),
        _ => unreachable!("a JSON object literal"),
    }
}

/// The five tools, as `tools/list` shows them.
pub fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "read_group",
            "Read the group chat's messages, oldest first: {messages: [{id, from, kind: person|bot, text, at}]}. Page back with `before` (a message id).",
            schema(
                json!({
                    "limit": {"type": "integer", "minimum": 1, "description": "how many messages (default 20)"},
                    "before": {"type": "string", "description": "only messages before this message id"}
                }),
                &[],
            ),
        ),
        Tool::new(
            "members",
            "Your colleagues (the other bots: name, role, skills, state ready|busy|quiet|unreachable) and the people who spoke in the group recently.",
            schema(json!({}), &[]),
        ),
        Tool::new(
            "post",
            "Post a message to the group now, as yourself (a progress note, a partial result), without ending your turn. Returns {id}.",
            schema(
                json!({
                    "text": {"type": "string", "description": "the message"},
                    "reply_to": {"type": "string", "description": "the id of the message this answers"}
                }),
                &["text"],
            ),
        ),
        Tool::new(
            "ask",
            "Ask a colleague in the group (posts \"@colleague question\" everyone sees) and wait for its answer: {answer, from, id}. Errors when it cannot answer (unknown, quiet, busy past the timeout, depth limit, too many asks in this turn).",
            schema(
                json!({
                    "colleague": {"type": "string", "description": "the colleague's name (see members)"},
                    "question": {"type": "string", "description": "what to ask"},
                    "timeout_secs": {"type": "integer", "minimum": 1, "description": "how long to wait for the answer"}
                }),
                &["colleague", "question"],
            ),
        ),
        Tool::new(
            "wait_for_message",
            "Wait for the oldest message addressed to you (a mention or a reply, from people or colleagues) not handed out yet: {message: {id, from, kind, text, at}}, or {timed_out: true}.",
            schema(
                json!({
                    "timeout_secs": {"type": "integer", "minimum": 0, "description": "how long to wait (default 30)"}
                }),
                &[],
            ),
        ),
    ]
}

/// An `isError` result saying `text`.
fn failed(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

impl MeshServer {
    /// A server for `bot`'s tools at `target`.
    pub fn new(bot: &str, target: MeshTarget) -> reqwest::Result<MeshServer> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(MeshServer {
            target: Arc::new(target),
            http,
            bot: bot.to_string(),
            only: None,
        })
    }

    /// Offers only the tools named in `only` (unknown names are an error naming them).
    pub fn only(mut self, only: Vec<String>) -> anyhow::Result<MeshServer> {
        let known = tools();
        if let Some(bad) = only.iter().find(|n| !known.iter().any(|t| t.name == **n)) {
            anyhow::bail!(
                "--only: no tool {bad:?} (read_group, members, post, ask, wait_for_message)"
            );
        }
        self.only = Some(only);
        Ok(self)
    }

    /// The tools this server offers.
    fn offered(&self) -> Vec<Tool> {
        tools()
            .into_iter()
            .filter(|t| {
                self.only
                    .as_ref()
                    .is_none_or(|o| o.iter().any(|n| *n == t.name))
            })
            .collect()
    }

    /// Runs one tool call on the node: its result, or an `isError` result saying why.
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
    ) -> CallToolResult {
        if !self.offered().iter().any(|t| t.name == tool) {
            return failed(format!(
                "no tool {tool:?}: read_group, members, post, ask, wait_for_message"
            ));
        }
        let mut body = arguments;
        if let Some(g) = &self.target.group {
            body.entry("group").or_insert_with(|| json!(g));
        }
        let waits = body
            .get("timeout_secs")
            .and_then(Value::as_u64)
            .map(Duration::from_secs);
        let timeout = match tool {
            "ask" | "wait_for_message" => waits.map_or(LONGEST_CALL, |w| w + WAIT_MARGIN),
            _ => QUICK_CALL,
        };
        let url = format!("{}/v1/tools/{tool}", self.target.api.trim_end_matches('/'));
        let mut req = self.http.post(&url).timeout(timeout).json(&body);
        if let Some(t) = &self.target.token {
            req = req.bearer_auth(t);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                return failed(format!(
                    "the botmesh node at {} did not answer: {e}",
                    self.target.api
                ))
            }
        };
        let status = resp.status();
        let answer: Value = match resp.json().await {
            Ok(v) => v,
            Err(e) => return failed(format!("the node's answer ({status}) was not JSON: {e}")),
        };
        if status.is_success() {
            CallToolResult::structured(answer)
        } else {
            let why = answer
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("refused")
                .to_string();
            match answer.get("code").and_then(Value::as_str) {
                Some(code) => CallToolResult::structured_error(json!({"error": why, "code": code})),
                None => failed(format!("{why} ({status})")),
            }
        }
    }

    /// Serves the tools on this process's stdin and stdout until the client leaves.
    pub async fn serve_stdio(self) -> anyhow::Result<()> {
        let running = self.serve(rmcp::transport::stdio()).await?;
        running.waiting().await?;
        Ok(())
    }
}

impl ServerHandler for MeshServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "botmesh-mesh",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(format!(
                "You are {} in a group chat with people and colleague bots. These tools act through the group: everything you post or ask is a message everyone sees.",
                self.bot
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.offered()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        Ok(self.call(&request.name, arguments).await.into())
    }
}
