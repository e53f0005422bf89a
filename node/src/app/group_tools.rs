//! The group as tools (docs/agents.md, "Working together"): `read_group`, `members`,
//! `post`, `ask` and `wait_for_message`, served on the local API as
//! `POST /v1/tools/<name>` for the `mesh` MCP server (`botmesh mcp`, `agent::mesh`),
//! which every hosted agent is offered and an outside agent starts itself.
//!
//! Every tool acts through the group: a post or an ask is a message of this bot that
//! everyone sees, recorded, broadcast and posted to the platform as any reply is, and
//! counted by the depth rules and the loop brake. An `ask` waits for the colleague's
//! answer through `turn::asks`; that answer is handed to the tool call and consumed (it
//! starts no turn of this bot, and its agent's next prompt leaves it out).
//!
//! A refusal is a [`ToolError`] (422 with `{error, code}`; the MCP server makes it an
//! `isError` result): checked before anything is posted, so no message is posted for
//! nothing. No call waits longer than `[mesh] ask_timeout_secs`, nor past shutdown.
//!
//! Who may call: the operator's and the sidecar's tokens, for any group; a hosted
//! agent's `mesh` server holds a [`ToolTokens`] credential instead, which opens these
//! endpoints only, for one bot and one group (never the mesh secret, the LLM key or
//! the operator's token).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{json, Value};
use ulid::Ulid;

use crate::agent::acp::schema::{EnvVariable, McpServer, McpServerStdio};
use crate::app::gate::Scope;
use crate::app::node::Node;
use crate::ingress::server::{self, Body};
use crate::store::transcript::MEMORY_MESSAGES;
use crate::turn::Ports;
use crate::wire::envelope::{
    next_depth, now_millis, Author, AuthorKind, Envelope, Kind, Why, MAX_TEXT_BYTES,
};

/// What `wait_for_message` waits when the agent names no `timeout_secs`.
const WAIT_DEFAULT_SECS: u64 = 30;

/// What `read_group` returns when the agent names no `limit`, and the most it may.
const READ_DEFAULT: usize = 20;

/// A group tool refused: `code` for the agent (and the tests) to branch on, `message`
/// for it to read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct ToolError {
    /// `unknown_colleague`, `quiet`, `unreachable`, `budget`, `depth_limit`,
    /// `loop_brake`, `too_many_asks`, `timeout`, `bad_arguments`, `not_found`,
    /// `post_failed`, `shutting_down`.
    pub(crate) code: &'static str,
    /// What happened and what the agent can do.
    pub(crate) message: String,
}

fn refuse(code: &'static str, message: impl Into<String>) -> ToolError {
    ToolError {
        code,
        message: message.into(),
    }
}

/// The credential a hosted agent's `mesh` server holds: `bmt1.<group>.<tag>`, the
/// group in base64url and an HMAC-SHA256 tag over the bot and the group under a key
/// drawn when the node starts (so it dies with the node, and is worth nothing to any
/// other bot or group, or on any other endpoint).
pub(crate) struct ToolTokens {
    /// The key of the tags (random, this process only).
    key: ring::hmac::Key,
    /// The bot whose tools the tokens open.
    bot: String,
}

/// The prefix that tells a group-tools credential from the API's other tokens.
const TOKEN_PREFIX: &str = "bmt1.";

/// What an every-group credential's tag is over instead of a group name (a NUL
/// first: no group name starts with one, the API refuses it).
const ALL_GROUPS: &str = "\0all groups";

impl ToolTokens {
    /// Tokens for `bot`, under a fresh random key.
    pub(crate) fn new(bot: &str) -> ToolTokens {
        let rng = ring::rand::SystemRandom::new();
        let key = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng)
            .expect("the system's random number generator");
        ToolTokens {
            key,
            bot: bot.to_string(),
        }
    }

    fn tagged(&self, group: &str) -> Vec<u8> {
        let mut m = self.bot.as_bytes().to_vec();
        m.push(0);
        m.extend_from_slice(group.as_bytes());
        m
    }

    /// The credential for every group's tools, for the built-in model's `mesh` server
    /// (a child of the node, whose turns are in any group): `bmt1.*.<tag>`.
    pub(crate) fn mint_all(&self) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let tag = ring::hmac::sign(&self.key, &self.tagged(ALL_GROUPS));
        format!("{TOKEN_PREFIX}*.{}", b64.encode(tag.as_ref()))
    }

    /// The credential for `group`'s tools.
    pub(crate) fn mint(&self, group: &str) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let tag = ring::hmac::sign(&self.key, &self.tagged(group));
        format!(
            "{TOKEN_PREFIX}{}.{}",
            b64.encode(group),
            b64.encode(tag.as_ref())
        )
    }

    /// The group `token` opens (`Some(None)`: every group), when it is one of these
    /// credentials and its tag verifies (constant time).
    pub(crate) fn group_of(&self, token: &str) -> Option<Option<String>> {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let (group, tag) = token.strip_prefix(TOKEN_PREFIX)?.split_once('.')?;
        let tag = b64.decode(tag).ok()?;
        if group == "*" {
            ring::hmac::verify(&self.key, &self.tagged(ALL_GROUPS), &tag).ok()?;
            return Some(None);
        }
        let group = String::from_utf8(b64.decode(group).ok()?).ok()?;
        ring::hmac::verify(&self.key, &self.tagged(&group), &tag).ok()?;
        Some(Some(group))
    }
}

/// `read_group`'s arguments. (Every tool may also carry `group`, taken out before its
/// own are read: absent, the one its credential is for, else `[mesh].group`.)
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadGroup {
    /// How many messages.
    limit: Option<usize>,
    /// Only messages before this one.
    before: Option<Ulid>,
}

/// `members` takes no arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Members {}

/// `post`'s arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Post {
    /// The message.
    text: String,
    /// The message it answers.
    reply_to: Option<Ulid>,
}

/// `ask`'s arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ask {
    /// The colleague's name or alias.
    colleague: String,
    /// What to ask.
    question: String,
    /// How long to wait for the answer (default `[mesh] ask_timeout_secs`).
    timeout_secs: Option<u64>,
}

/// `wait_for_message`'s arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wait {
    /// How long to wait (default 30 s).
    timeout_secs: Option<u64>,
}

/// `POST /v1/tools/<tool>`: runs the tool for the caller's scope. 200 with the
/// tool's result, 422 `{error, code}` for a refusal, 400 for arguments that do not
/// parse, 403 for a group the credential does not open, 404 for an unknown tool.
pub(crate) async fn handle(
    node: &Arc<Node>,
    tool: &str,
    req: Request<Incoming>,
    scope: &Scope,
) -> Response<Body> {
    let body: Value = match crate::app::api::read_json(req).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut body = match body {
        Value::Object(m) => m,
        _ => {
            return server::error(
                StatusCode::BAD_REQUEST,
                "the arguments must be a JSON object",
            )
        }
    };
    let group_arg = match body.remove("group") {
        None | Some(Value::Null) => None,
        Some(Value::String(g)) => Some(g),
        Some(_) => return server::error(StatusCode::BAD_REQUEST, "group must be a string"),
    };
    let body = Value::Object(body);
    let group = match (scope, group_arg) {
        (Scope::Tools(Some(mine)), Some(g)) if &g != mine => {
            return server::error(
                StatusCode::FORBIDDEN,
                format!("this credential opens the tools of group {mine:?} only"),
            )
        }
        (Scope::Tools(Some(mine)), _) => mine.clone(),
        (_, Some(g)) => g,
        (_, None) => node.cfg.mesh().group.clone(),
    };
    if group.starts_with('\0') {
        return server::error(StatusCode::BAD_REQUEST, "group must not start with NUL");
    }
    if group.is_empty() || group.len() > 256 {
        return server::error(StatusCode::BAD_REQUEST, "group must be 1..=256 bytes");
    }
    let outcome = match tool {
        "read_group" => match parse::<ReadGroup>(body) {
            Ok(a) => read_group(node, &group, a),
            Err(r) => return r,
        },
        "members" => match parse::<Members>(body) {
            Ok(_) => Ok(members(node, &group)),
            Err(r) => return r,
        },
        "post" => match parse::<Post>(body) {
            Ok(a) => post(node, &group, a).await,
            Err(r) => return r,
        },
        "ask" => match parse::<Ask>(body) {
            Ok(a) => ask(node, &group, a).await,
            Err(r) => return r,
        },
        "wait_for_message" => match parse::<Wait>(body) {
            Ok(a) => wait_for_message(node, &group, a).await,
            Err(r) => return r,
        },
        _ => {
            return server::error(
                StatusCode::NOT_FOUND,
                format!("no tool {tool:?}: read_group, members, post, ask, wait_for_message"),
            )
        }
    };
    let bot = &node.cfg.bot().name;
    match outcome {
        Ok(v) => {
            let timed_out = v.get("timed_out").is_some();
            count(node, tool, if timed_out { "timed_out" } else { "ok" });
            server::json(StatusCode::OK, &v)
        }
        Err(e) => {
            tracing::info!(bot = %bot, %group, tool, code = e.code, why = %e.message, "group tool refused");
            count(node, tool, e.code);
            server::json(
                StatusCode::UNPROCESSABLE_ENTITY,
                &json!({"error": e.message, "code": e.code}),
            )
        }
    }
}

/// A tool's arguments, or 400 naming what is wrong.
#[allow(clippy::result_large_err)]
fn parse<T: for<'de> Deserialize<'de>>(body: Value) -> Result<T, Response<Body>> {
    serde_json::from_value(body)
        .map_err(|e| server::error(StatusCode::BAD_REQUEST, format!("bad arguments: {e}")))
}

/// Counts a group tool's call in `botmesh_tool_calls` (server `mesh`) by outcome.
fn count(node: &Node, tool: &str, outcome: &str) {
    node.metrics
        .tool_call(&node.cfg.bot().name, "mesh", tool, outcome);
}

/// A message as the tools show it: `{id, from, kind: person|bot, text, at}`.
fn shown(m: &Envelope) -> Value {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(m.sent_at);
    json!({
        "id": m.id.to_string(),
        "from": m.author.name,
        "kind": if m.author.kind == AuthorKind::Bot { "bot" } else { "person" },
        "text": m.text,
        "at": humantime::format_rfc3339_millis(at).to_string(),
    })
}

/// `read_group {limit?, before?}`: the group's messages, oldest first, the last
/// `limit` (default 20) or those before the message `before`.
fn read_group(node: &Node, group: &str, a: ReadGroup) -> Result<Value, ToolError> {
    let limit = a.limit.unwrap_or(READ_DEFAULT);
    if !(1..=MEMORY_MESSAGES).contains(&limit) {
        return Err(refuse(
            "bad_arguments",
            format!("limit must be 1..={MEMORY_MESSAGES}"),
        ));
    }
    let all: Vec<Arc<Envelope>> = node
        .transcripts
        .recent(group, MEMORY_MESSAGES)
        .into_iter()
        .filter(|m| m.kind == Kind::Message)
        .collect();
    let end = match a.before {
        None => all.len(),
        Some(id) => all.iter().position(|m| m.id == id).ok_or_else(|| {
            refuse(
                "not_found",
                format!("message {id} is not among the group's last {MEMORY_MESSAGES}"),
            )
        })?,
    };
    let messages: Vec<Value> = all[end.saturating_sub(limit)..end]
        .iter()
        .map(|m| shown(m))
        .collect();
    Ok(json!({ "messages": messages }))
}

/// A colleague's state as this node sees it: `unreachable` (its link is failing),
/// `quiet` (its own `quiet` switch, or the group's), `busy` (an ask of this bot waits
/// on it), else `ready`.
fn state_of(node: &Node, group: &str, bot: &crate::config::BotSettings) -> &'static str {
    if node.link_failing_for(&bot.name).is_some() {
        "unreachable"
    } else if bot.quiet || node.quiet.in_group(group) {
        "quiet"
    } else if node.brain.asks.waiting_on(group, &bot.name) {
        "busy"
    } else {
        "ready"
    }
}

/// `members {}`: the colleagues (not this bot) and the people who spoke recently.
fn members(node: &Node, group: &str) -> Value {
    let cfg = node.reloader.running();
    let me = &cfg.bot().name;
    let bots: Vec<Value> = cfg
        .settings
        .bots
        .iter()
        .filter(|b| &b.name != me)
        .map(|b| {
            json!({"name": b.name, "role": b.role, "skills": b.skills, "state": state_of(node, group, b)})
        })
        .collect();
    let mut people: Vec<String> = Vec::new();
    for m in node.transcripts.recent(group, 200).iter().rev() {
        if m.kind == Kind::Message
            && m.author.kind == AuthorKind::Human
            && !people.contains(&m.author.name)
        {
            people.push(m.author.name.clone());
        }
    }
    let people: Vec<Value> = people
        .into_iter()
        .map(|name| json!({"name": name}))
        .collect();
    let mut answer = json!({"bots": bots, "people": people});
    if !node.brain.engine.takes_turns() {
        // This bot's turns are an outside agent's: say whether one is attached.
        answer["you"] =
            json!({"name": me, "agent": "external", "attached": node.brain.asks.attached()});
    }
    answer
}

/// What a message of this bot posted by a tool continues: the message it replies to
/// (`reply_to`, which must be in the group), else the turn in flight's trigger, else the
/// group's latest message.
fn base_of(
    node: &Node,
    group: &str,
    reply_to: Option<Ulid>,
) -> Result<Option<Arc<Envelope>>, ToolError> {
    if let Some(id) = reply_to {
        return node.transcripts.get(group, &id).map(Some).ok_or_else(|| {
            refuse(
                "not_found",
                format!("reply_to {id} is not in group {group:?}"),
            )
        });
    }
    Ok(node
        .brain
        .asks
        .turn_trigger(group)
        .and_then(|t| node.transcripts.get(group, &t))
        .or_else(|| node.transcripts.recent(group, 1).pop()))
}

/// The rules any message of this bot meets, checked before a tool posts one: the
/// group not quiet, the depth under `max_depth` (for an ask, the colleague's answer
/// too), the loop brake's count of bot messages. The new message's depth.
fn hard_rules(
    node: &Node,
    group: &str,
    base: Option<&Envelope>,
    answered: bool,
) -> Result<u32, ToolError> {
    let mesh = node.mesh();
    let base_depth = base.map_or(0, |b| b.depth);
    let depth = if base.is_some() {
        next_depth(base_depth)
    } else {
        1
    };
    // An ask's answer is one deeper again: the colleague would not give it at max_depth.
    let deepest = if answered { next_depth(depth) } else { depth };
    if deepest > mesh.max_depth {
        return Err(refuse(
            "depth_limit",
            format!(
                "this would be a message at depth {depth} (bot turns since the last person spoke){}; max_depth is {}: a person has to speak first",
                if answered { ", answered at one more" } else { "" },
                mesh.max_depth
            ),
        ));
    }
    let recent_bots = crate::turn::context::bots_since_human(node, group, node.now_millis());
    match crate::turn::policy::last_check(&mesh, node.quiet.in_group(group), base_depth, recent_bots) {
        Some("quiet") => Err(refuse("quiet", "the bots are quiet in this group (/quiet): nothing is posted")),
        Some("rate_cap") => Err(refuse(
            "loop_brake",
            format!(
                "{recent_bots} bot messages in the last minute with no person in between (bot_messages_per_minute is {}): wait for a person",
                mesh.bot_messages_per_minute
            ),
        )),
        _ => Ok(depth),
    }
}

/// Posts `text` to the group as this bot, continuing `base`; records it as handed out
/// by a tool, so the agent's next prompt does not count it as a turn's end.
#[allow(clippy::too_many_arguments)]
async fn publish_as_me(
    node: &Arc<Node>,
    group: &str,
    id: Ulid,
    text: String,
    base: Option<&Envelope>,
    reply_to: Option<Ulid>,
    depth: u32,
) -> Result<Arc<Envelope>, ToolError> {
    if text.trim().is_empty() {
        return Err(refuse("bad_arguments", "text must not be empty"));
    }
    if text.len() > MAX_TEXT_BYTES {
        return Err(refuse(
            "bad_arguments",
            format!("text over {MAX_TEXT_BYTES} bytes"),
        ));
    }
    if node.accepting.is_cancelled() {
        return Err(refuse("shutting_down", "the node is stopping"));
    }
    let me = node.cfg.bot().name.clone();
    let author = Author {
        name: me.clone(),
        kind: AuthorKind::Bot,
    };
    let mut env = Envelope::message(id, now_millis(), group.to_string(), me, author, text);
    env.depth = depth;
    env.reply_to = reply_to;
    env.root = base.and_then(|b| b.root.or(Some(b.id)));
    env.why = Some(Why::Posted);
    node.brain.asks.consume(id);
    let posted = Arc::new(env.clone());
    node.publish(env, "tools").await.map_err(|e| {
        refuse(
            "post_failed",
            format!("the message could not be recorded: {e}"),
        )
    })?;
    Ok(posted)
}

/// `post {text, reply_to?}`: posts to the group as this bot now, without ending the
/// turn. `{id}`.
async fn post(node: &Arc<Node>, group: &str, a: Post) -> Result<Value, ToolError> {
    let base = base_of(node, group, a.reply_to)?;
    let depth = hard_rules(node, group, base.as_deref(), false)?;
    let posted = publish_as_me(
        node,
        group,
        Ulid::new(),
        a.text,
        base.as_deref(),
        a.reply_to,
        depth,
    )
    .await?;
    Ok(json!({"id": posted.id.to_string()}))
}

/// `ask {colleague, question, timeout_secs?}`: see the module documentation.
/// `{answer, from, id}`.
async fn ask(node: &Arc<Node>, group: &str, a: Ask) -> Result<Value, ToolError> {
    let cfg = node.reloader.running();
    let me = cfg.bot().name.clone();
    let mesh = node.mesh();
    let colleague = node
        .brain
        .matcher
        .resolve(a.colleague.trim().trim_start_matches(['@', '＠']))
        .filter(|n| *n != me)
        .and_then(|n| cfg.settings.bots.iter().find(|b| b.name == n))
        .ok_or_else(|| {
            let names: Vec<&str> = cfg
                .settings
                .bots
                .iter()
                .map(|b| b.name.as_str())
                .filter(|n| *n != me)
                .collect();
            refuse(
                "unknown_colleague",
                format!(
                    "no colleague {:?} in this mesh: ask one of {names:?}",
                    a.colleague
                ),
            )
        })?;
    let timeout_secs = a.timeout_secs.unwrap_or(mesh.ask_timeout_secs);
    if !(1..=mesh.ask_timeout_secs).contains(&timeout_secs) {
        return Err(refuse(
            "bad_arguments",
            format!(
                "timeout_secs must be 1..={} (ask_timeout_secs)",
                mesh.ask_timeout_secs
            ),
        ));
    }
    if a.question.trim().is_empty() {
        return Err(refuse("bad_arguments", "question must not be empty"));
    }
    match state_of(node, group, colleague) {
        "unreachable" => {
            return Err(refuse(
                "unreachable",
                format!(
                    "{} cannot be reached now (its link is failing): nothing was posted",
                    colleague.name
                ),
            ))
        }
        "quiet" => {
            return Err(refuse(
                "quiet",
                format!(
                    "{} is quiet in this group: it would not answer, so nothing was posted",
                    colleague.name
                ),
            ))
        }
        _ => {}
    }
    if let Some(limit) = node
        .brain
        .budget
        .status(&node.brain.tuning().budget, now_millis())
        .exhausted
    {
        return Err(refuse(
            "budget",
            format!("{me}'s daily LLM budget ({limit}) is spent: no asks until it renews"),
        ));
    }
    let base = base_of(node, group, None)?;
    let depth = hard_rules(node, group, base.as_deref(), true)?;
    node.brain
        .asks
        .count_ask(group, mesh.max_asks_per_turn)
        .map_err(|s| {
            refuse(
                "too_many_asks",
                format!(
                    "{} asks in this turn already (max_asks_per_turn): answer with what you have",
                    s.max
                ),
            )
        })?;
    let question = format!("@{} {}", colleague.name, a.question.trim());
    // Waiting on the colleague starts before the question is posted, so its answer
    // cannot come first.
    let id = Ulid::new();
    let waiting = node.brain.asks.expect(group, id, &colleague.name);
    let posted = publish_as_me(node, group, id, question, base.as_deref(), None, depth).await?;
    tracing::info!(bot = %me, %group, colleague = %colleague.name, question = %posted.id, timeout_secs, "asked a colleague; waiting for the answer");
    let answer = tokio::select! {
        a = tokio::time::timeout(Duration::from_secs(timeout_secs), waiting) => a,
        _ = node.accepting.cancelled() => return Err(refuse("shutting_down", "the node is stopping")),
    };
    match answer {
        Ok(Ok(env)) => {
            tracing::info!(bot = %me, %group, colleague = %colleague.name, answer = %env.id, "the colleague answered the ask");
            Ok(json!({"answer": env.text, "from": env.author.name, "id": env.id.to_string()}))
        }
        _ => Err(refuse(
            "timeout",
            format!(
                "{} did not answer within {timeout_secs} s (busy?); its answer, when it comes, is in your next prompt",
                colleague.name
            ),
        )),
    }
}

/// `wait_for_message {timeout_secs?}`: the oldest message addressed to this bot not
/// handed out yet, or `{timed_out: true}`.
async fn wait_for_message(node: &Arc<Node>, group: &str, a: Wait) -> Result<Value, ToolError> {
    let max = node.mesh().ask_timeout_secs;
    let secs = a.timeout_secs.unwrap_or(WAIT_DEFAULT_SECS.min(max));
    if secs > max {
        return Err(refuse(
            "bad_arguments",
            format!("timeout_secs must be 0..={max} (ask_timeout_secs)"),
        ));
    }
    let next = tokio::select! {
        m = node.brain.asks.next_addressed(group, Duration::from_secs(secs)) => m,
        _ = node.accepting.cancelled() => return Err(refuse("shutting_down", "the node is stopping")),
    };
    Ok(match next {
        Some(m) => json!({"message": shown(&m)}),
        None => json!({"timed_out": true}),
    })
}

/// A new message, before the commands and the turn code see it: `true` when it is the
/// answer an `ask` of this bot waits for (handed to it: no turn). Otherwise a message
/// addressed to this bot — a mention, a reply to one of its messages, a person in a
/// direct chat — also joins the queue `wait_for_message` reads.
pub(crate) fn first_look(
    node: &Node,
    env: &Arc<Envelope>,
    platform: &[crate::turn::mention::PlatformMention],
) -> bool {
    let me = &node.cfg.bot().name;
    if env.kind != Kind::Message || &env.author.name == me {
        return false;
    }
    let mentions_me = node.brain.matcher.mentions(&env.text, platform, me);
    if node.brain.asks.offer(env, mentions_me) {
        tracing::info!(bot = %me, group = %env.group, from = %env.author.name, answer = %env.id, "a colleague's answer to an ask: handed to the waiting tool call, no turn");
        return true;
    }
    let replies_to_me = env
        .reply_to
        .and_then(|p| node.transcripts.get(&env.group, &p))
        .is_some_and(|p| &p.author.name == me);
    let direct =
        crate::wire::envelope::is_direct_group(&env.group) && env.author.kind == AuthorKind::Human;
    let command = crate::turn::control::is_command(env, &node.brain.tuning());
    if (mentions_me || replies_to_me || direct) && !command {
        node.brain.asks.addressed(env.clone());
    }
    false
}

/// The command that runs `botmesh mcp` for this node's bot: `[mesh] mcp_command`,
/// else this executable when it is botmesh; `None` (logged) when neither.
fn mcp_command(cfg: &crate::config::NodeConfig) -> Option<String> {
    let command = match cfg.mesh().mcp_command.clone() {
        Some(c) => c,
        // Only the botmesh binary serves `botmesh mcp` (a program embedding the node,
        // such as a test, is not it).
        None => match std::env::current_exe() {
            Ok(c)
                if c.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("botmesh")) =>
            {
                c
            }
            found => {
                tracing::warn!(bot = %cfg.bot().name, exe = ?found, "no `mesh` MCP server: this program is not botmesh (set [mesh] mcp_command)");
                return None;
            }
        },
    };
    Some(command.display().to_string())
}

/// The built-in model's `mesh` server (`[[bots]] group_tools = true`): `botmesh mcp`
/// offering `read_group`, `members` and `ask` only, with a credential for every group
/// of the bot (the tool loop names the turn's group in each call). `None` without
/// `group_tools` or a command.
pub(crate) fn model_mesh_server(
    cfg: &crate::config::NodeConfig,
    api: std::net::SocketAddr,
    tokens: &ToolTokens,
) -> Option<crate::config::McpServerSettings> {
    let bot = cfg.bot();
    if !bot.group_tools {
        return None;
    }
    let command = mcp_command(cfg)?;
    let url = crate::agent::mesh::api_url(api);
    let args = [
        "mcp",
        "--bot",
        &bot.name,
        "--api",
        &url,
        "--only",
        &crate::engine::model::MODEL_GROUP_TOOLS.join(","),
    ];
    Some(crate::config::McpServerSettings {
        name: "mesh".into(),
        command: std::iter::once(command)
            .chain(args.iter().map(|a| a.to_string()))
            .collect(),
        env: [(crate::agent::mesh::TOKEN_ENV.to_string(), tokens.mint_all())].into(),
        url: None,
        headers_env: Default::default(),
        // Boxed like any stdio server: it needs only its own program and loopback.
        sandbox: Default::default(),
    })
}

/// The `mesh` MCP server to hand the bot's ACP agent in each group's `session/new`:
/// `botmesh mcp` over stdio (`[mesh] mcp_command`, else this executable when it is
/// botmesh), pointed at
/// this node's local API (`api`) with that group's [`ToolTokens`] credential in its
/// environment. `None` (logged) when no executable is known.
pub(crate) fn mesh_server(
    cfg: &crate::config::NodeConfig,
    api: std::net::SocketAddr,
    tokens: Arc<ToolTokens>,
) -> Option<crate::agent::acp::GroupServers> {
    cfg.bot().agent.as_ref().and_then(|a| a.acp())?;
    let command = mcp_command(cfg)?;
    let url = crate::agent::mesh::api_url(api);
    let bot = cfg.bot().name.clone();
    Some(crate::agent::acp::GroupServers::new(
        vec![command.clone()],
        move |group: &str| {
            let args = [
                "mcp",
                "--bot",
                bot.as_str(),
                "--group",
                group,
                "--api",
                url.as_str(),
            ];
            vec![McpServer::Stdio(
                McpServerStdio::new("mesh", &command)
                    .args(args.map(str::to_string).to_vec())
                    .env(vec![EnvVariable::new(
                        crate::agent::mesh::TOKEN_ENV,
                        tokens.mint(group),
                    )]),
            )]
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_token_opens_its_group_only_and_only_under_its_key() {
        let tokens = ToolTokens::new("Coder");
        let t = tokens.mint("room 1");
        assert!(t.starts_with(TOKEN_PREFIX));
        assert_eq!(tokens.group_of(&t), Some(Some("room 1".into())));
        // The every-group credential: its own tag, not a group's.
        assert_eq!(tokens.group_of(&tokens.mint_all()), Some(None));
        assert_eq!(ToolTokens::new("Coder").group_of(&tokens.mint_all()), None);
        let group_tag = t.rsplit('.').next().unwrap();
        assert_eq!(
            tokens.group_of(&format!("{TOKEN_PREFIX}*.{group_tag}")),
            None
        );
        // Another node's key, another bot, a forged group, junk: nothing.
        assert_eq!(ToolTokens::new("Coder").group_of(&t), None);
        assert_eq!(ToolTokens::new("Reviewer").group_of(&t), None);
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let tag = t.rsplit('.').next().unwrap();
        let forged = format!("{TOKEN_PREFIX}{}.{tag}", b64.encode("room 2"));
        assert_eq!(tokens.group_of(&forged), None);
        for junk in ["", "bmt1.", "bmt1.x.y", "Bearer x", "bmt1.!!!.???"] {
            assert_eq!(tokens.group_of(junk), None, "{junk:?}");
        }
    }
}
