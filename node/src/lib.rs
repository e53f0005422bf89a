//! botmesh: a bridge node that lets several LLM bots share one group chat as colleagues.
//!
//! Each bot runs one node: a peer-facing HTTP listener (signed envelopes from the other
//! bots, platform callbacks) and a local API (the page, the CLI, sidecar bots). Data
//! takes one path through a node:
//!
//! ```text
//! ingress (bridge, api) → transcript → policy → judge → scheduler → reply → egress (outbox)
//! ```
//!
//! The source tree is that path, in layers: each folder uses only the folders below
//! it, never one above (`node/tests/layers.rs` fails on an upward import).
//!
//! ```text
//! simulate    botmesh simulate: the production turn code in virtual time, against baselines
//! app         Node (node: its state, recording and publishing; lifecycle: start-up,
//!             shutdown, the two listeners and their routing; ports: what ingress and the
//!             turn code see of it), local API, page, metrics,
//!             reload (SIGHUP, POST /v1/reload, the file watch), people's commands in
//!             the chat (/quiet, /resume, /stop, /why); replay (a bot's decisions over a
//!             recorded transcript, then and now); the group as tools for the bot's
//!             agent (/v1/tools/…: read_group, members, post, ask, wait_for_message)
//! platform    one adapter per chat platform behind ChatPlatform: local, feishu, dingtalk, discord,
//!             slack (slack/: settings, api, socket Socket Mode, inbound, outbound),
//!             telegram (telegram/: settings, api, poll, inbound, outbound, webhook),
//!             onebot (onebot/: settings, conn forward WebSocket, segments, inbound, outbound),
//!             wecom (wecom/: settings, frames, conn long connection, inbound, outbound
//!             streamed answers and sends),
//!             matrix (matrix/: settings, api client-server, sync, inbound, outbound)
//!             (feishu/: api, events, crypto, dedup, inbound, ws the long connection,
//!             content rich text and media, names people by display name, metrics its
//!             own families); kit: what
//!             every adapter shares (the API retry loop and its 429 pause, the token source,
//!             the per-chat pacer, the reconnect loop, the inbound path and the in-order
//!             handler of a connection's events, posting in parts, mentions by id, a
//!             table's and a secret's reads, and the unit tests' peers.toml and sink);
//!             `post` and `edit` (a posted message changed in place) on every adapter
//! ingress     Ingest: admission (verify, dedup, rate limit), HTTP bridge, stream reader, relayed copies
//! turn        mention → policy → judge → scheduler → reply, over the Ports trait; the shared
//!             judge (shared_judge); people's control in the chat (control: /quiet, /stop,
//!             /why… parsed, and the state they switch); a long turn's status message
//!             (status: posted once, edited in place through the platform's `edit`, ended
//!             with how the turn went, its final version recorded as a status that
//!             `replaces` it); the writing step hands the bot's reply engine its turn
//!             (pipeline; engine_host: what the turn offers the engine) and drives the
//!             rest (the claim, the status, /stop, the record)
//! engine      the reply engines behind the ReplyEngine trait, one file each, picked
//!             from the config (one line in engines!), each over a TurnContext (context:
//!             narrow handles, never Brain): the built-in model and its MCP tools' loop
//!             (model, over MeteredLlm: the LLM, the daily budget (budget) and the
//!             metrics, in metered), the sidecar webhook (sidecar), a coding agent over
//!             ACP (acp), an outside agent that takes no turns (external), a remote A2A
//!             agent (a2a)
//! egress      one outbox per peer over a Transport (HTTP peer, Redis stream), relay, claim acks
//! llm         the OpenAI-compatible client (whole answers, and streamed drafts; tool calls)
//! agent       what the engines run: MCP tool servers (rmcp), coding agents hosted over
//!             ACP (their processes and protocol), the Landlock box they and stdio MCP
//!             servers run in (sandbox: `botmesh sandbox`, the node made non-dumpable;
//!             boxing: how the node starts a process in it); the `mesh` MCP server
//!             (`botmesh mcp`, the group tools over stdio)
//! a2a         A2A 1.0 at the mesh's edge: the wire (rpc), the served bot's Agent Card,
//!             its tasks kept on disk, the JSON-RPC endpoint behind the A2aHost handle;
//!             the client of a remote agent and its conversations kept on disk
//! store       transcripts, the outbox log, delivery cursors, the verdict log
//! telemetry   Prometheus metrics, live events, rate-limited refusal logging
//! config      peers.toml → a validated NodeConfig: schema (the typed settings), load (file →
//!             env → overrides), validate (the checks, naming the key), secrets (the
//!             variables and key files the file names), node_config (the bot a node runs);
//!             pacing (backoff, token bucket) for every layer; reload (which changed keys
//!             apply at once, which wait for a restart)
//! wire        envelope, batch, signatures, paths and limits
//! ```
//!
//! - [`wire`] — what travels between nodes and how it is signed.
//! - [`config`] — peers.toml: typed settings (`config/schema.rs`), env overrides
//!   (`load.rs`), validation before binding (`validate.rs`), secrets read for the one
//!   bot a node runs (`secrets.rs`, `node_config.rs`);
//!   `config::pacing`, the one retry schedule and token bucket every layer above shares.
//! - [`telemetry`] — `Metrics` (Prometheus; `telemetry::hot_counters`, the series every
//!   received envelope bumps, looked up once), `EventBus` (the page, SSE), and
//!   `refusals::REFUSALS` (the public listeners' refusals in the log, rate-limited; the
//!   turn code's repeated silences the same way, `refusals::DECISIONS`).
//! - [`store`] — per-group, append-only, deduplicated, durable transcripts (`store::transcript`,
//!   its group-commit writer thread in `store::transcript::writer`, fed by `store::transcript::queue`, waiting for more under load as `store::transcript::commit_delay` decides) and the reads the turn code makes of them (`store::turn_queries`); the outbox log
//!   (`store::outbox_log`); cursors; the verdict log; the bounded file names they all use
//!   (`store::file_names`).
//! - [`llm`] — the OpenAI-compatible client: whole answers (`complete`), and a drafting
//!   judge's streamed verdict line and reply (`draft`, `llm/stream.rs`), and the judge's
//!   verdict: its schema and forgiving parse (`llm/verdict.rs`).
//! - [`a2a`] — A2A at the edge: a bot served as an A2A agent (`a2a::server`, its tasks
//!   in `a2a::tasks`, its card in `a2a::card`, the wire in `a2a::rpc`), and a remote
//!   agent as a bot's brain (`a2a::client`, its conversations in `a2a::conversations`).
//! - [`agent`] — a bot's MCP tool servers (`agent::mcp`) and `agent::acp`, a coding
//!   agent hosted over ACP (its messages the spec maintainers' types, `agent::acp::schema`,
//!   over the node's own JSON-RPC transport): what the reply engines (`engine`) run; `agent::mesh`, the
//!   group tools' MCP server every agent is offered.
//! - [`egress`] — `Outbox` per peer, relaying around a broken link, the Redis stream link.
//! - [`engine`] — the reply engines behind the `engine::ReplyEngine` trait, each picked
//!   from the bot's `agent` setting by its own file: `engine::model` (the built-in
//!   model's tool loop), `engine::sidecar`, `engine::acp`, `engine::external`,
//!   `engine::a2a`; each writes a turn from an `engine::TurnContext` and calls the LLM
//!   through `engine::MeteredLlm` (LLM, `engine::budget`, metrics).
//! - [`turn`] — the bots' manners, talking to the node only through `turn::Ports`;
//!   `turn::shared_judge`, one judge call per message for the whole mesh;
//!   `turn::control`, people's `/quiet`, `/stop`, `/why`… parsed and the state they
//!   switch (carried out by `app::commands`);
//!   `turn::outcome`, how an agent's turn ended: the chat's line ("stopped by Alice",
//!   or the status's final edit when one is up) and what the agent is told at its
//!   next turn.
//! - [`ingress`] — `Ingest`: every inbound path's narrow handle, and the checks.
//! - [`platform`] — `ChatPlatform`: what a chat platform shows to whom, events in, posts out;
//!   `platform::registry` lists the adapters (one line each, each described in its own
//!   folder, its settings file read by config), `platform::kit` holds what they share.
//! - [`app`] — one running node: state, start, routing, the local API, graceful shutdown.
//! - [`simulate`] — `botmesh simulate`.
//! - `fuzzing` — the fuzz harnesses, shared by `fuzz/` and the corpus replay test; only
//!   with the `fuzzing` feature, so they are not part of the production library.

#![forbid(unsafe_code)]
#![deny(missing_docs, unreachable_pub)]
// Most of the crate is private by design and its docs are read with
// `cargo doc --document-private-items`: links into it are meant.
#![allow(rustdoc::private_intra_doc_links)]

pub mod a2a;
pub mod agent;
pub mod app;
pub mod config;
pub(crate) mod egress;
pub(crate) mod engine;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod ingress;
pub mod llm;
pub mod platform;
pub mod simulate;
pub(crate) mod store;
pub mod telemetry;
pub mod turn;
pub mod wire;
