//! `botmesh replay`: a bot's decisions over a recorded transcript, then and now.
//!
//! Each message of the transcript is handed, in order and at its recorded time (a
//! virtual clock: `now` is the message's `sent_at`), to the production decision code
//! — `turn::triage` (policy, mentions, caps, staleness) and the judge step of
//! `turn::act` (the judge prompt as the node builds it, `min_relevance`, the
//! relevance-scaled delay) — through a [`Ports`] whose transcript is the recording up
//! to that message. The settings are the bot's from peers.toml with `--set KEY=VALUE`
//! and `--judge-prompt-file` on top, so an operator sees what a change would do
//! before making it.
//!
//! The judge is answered by a scripted [`Llm`]: in `recorded` mode from the node's
//! verdict log (`store::verdicts`) when a verdict for the same message and the same
//! prompt hash exists (no LLM call), otherwise by the fallback (`offline`: the offline
//! lexical judge guesses; `live`: the configured LLM is asked anew); in `live` mode the
//! configured LLM answers every call, in `offline` mode the offline judge does.
//! What the bot did then comes from the verdict log (the judge's answer and the action
//! that followed) and, for messages without a record, from the transcript (whether
//! the bot's reply to it is there).
//!
//! Not replayed: the wait, the claims of other bots and yielding, the re-judge after
//! others spoke, and the reply itself. "Speaks" means the bot would answer (mentioned)
//! or claim the message (interject after its delay), which is what `min_relevance`,
//! the judge prompt and the policy decide; whether a better claim would then win is
//! the mesh's business (`botmesh simulate`). Platform mention lists (Feishu
//! `mentions[]`) are not in the transcript, and the quiet switch is taken as off.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::config::{MeshSettings, NodeConfig, Settings};
use crate::egress::acks::{AckTracker, ClaimAcks};
use crate::engine::metered::LlmCall;
use crate::llm::{Completion, Endpoint, LlmClient, LlmError, Purpose};
use crate::store::file_names::stored_path;
use crate::store::transcript::read_only;
use crate::store::verdicts::{self, VerdictRecord};
use crate::telemetry::events::Event;
use crate::telemetry::metrics::Metrics;
use crate::turn::judge::{offline_verdict, prompt_hash, trim};
use crate::turn::ports::SliceLog;
use crate::turn::{Brain, Llm, Ports, Provider};
use crate::wire::envelope::{AuthorKind, Envelope, Kind};

/// Where the judge's answers come from during a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmMode {
    /// Reuse the recorded verdict when the prompt is unchanged, else the fallback.
    Recorded,
    /// Ask the configured LLM for every judge call.
    Live,
    /// The offline lexical judge for every call.
    Offline,
}

impl LlmMode {
    /// Parses `recorded`, `live` or `offline`.
    pub fn parse(s: &str) -> anyhow::Result<LlmMode> {
        Ok(match s {
            "recorded" => LlmMode::Recorded,
            "live" => LlmMode::Live,
            "offline" => LlmMode::Offline,
            other => bail!("--llm {other:?}: expected recorded, live or offline"),
        })
    }
}

/// What `botmesh replay` is asked to do.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// peers.toml.
    pub config: PathBuf,
    /// The bot to replay.
    pub bot: String,
    /// A transcript file (the format of `<data_dir>/transcripts/*.jsonl`).
    pub transcript: Option<PathBuf>,
    /// Or a group, whose transcript is read from the bot's data folder.
    pub group: Option<String>,
    /// The bot's data folder (default: as `botmesh run` picks it).
    pub data_dir: Option<PathBuf>,
    /// A verdict log file (default: the group's, in the data folder).
    pub verdicts: Option<PathBuf>,
    /// `KEY=VALUE` settings on top of the bot's entry.
    pub sets: Vec<String>,
    /// A judge prompt template replacing the bot's.
    pub judge_prompt_file: Option<PathBuf>,
    /// Where judge answers come from.
    pub llm: LlmMode,
    /// In `recorded` mode, what answers a judge call with no recorded verdict:
    /// `Offline` (guess) or `Live` (ask anew).
    pub fallback: LlmMode,
    /// Keep each message's judge prompt in the report.
    pub show_prompt: bool,
    /// Environment the LLM key variables are read from.
    pub env: Vec<(String, String)>,
}

/// What the bot did about a message when it was recorded.
#[derive(Debug, Clone, Serialize)]
pub struct Then {
    /// Whether the verdict log has a record of the judge about it.
    pub record: bool,
    /// `claim`, `reply`, `silent` (from the record); without a record `reply` when
    /// the transcript holds the bot's answer to it, else absent ("no record").
    pub action: Option<String>,
    /// Why (from the record, or `answered` from the transcript).
    pub reason: Option<String>,
    /// The judge's relevance.
    pub relevance: Option<f64>,
    /// The judge's speak.
    pub speak: Option<bool>,
    /// The delay it claimed with, ms (without jitter).
    pub delay_ms: Option<u64>,
    /// The re-judge after the wait, when there was one: its reason.
    pub rejudge: Option<String>,
    /// Whether the transcript holds the bot's answer to it.
    pub answered: bool,
}

/// What the bot would do about a message now.
#[derive(Debug, Clone, Serialize)]
pub struct Now {
    /// `reply`, `claim` or `silent`.
    pub action: String,
    /// Why (the decision's reason code).
    pub reason: String,
    /// The judge's relevance, when judged.
    pub relevance: Option<f64>,
    /// The judge's speak, when judged.
    pub speak: Option<bool>,
    /// The delay it would claim with, ms (without jitter).
    pub delay_ms: Option<u64>,
    /// Where the verdict came from: `recorded`, `live`, `offline` (absent when not judged).
    pub verdict: Option<&'static str>,
    /// The judge prompt's size, bytes.
    pub prompt_bytes: Option<usize>,
    /// The judge prompt (with `--show-prompt`).
    pub prompt: Option<String>,
}

/// One message of the replay.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The message id.
    pub id: String,
    /// Its author.
    pub from: String,
    /// Its depth.
    pub depth: u32,
    /// Its text, trimmed to one short line.
    pub text: String,
    /// What the bot did then.
    pub then: Then,
    /// What it would do now.
    pub now: Now,
    /// `now_speaks` or `no_longer_speaks` when the two differ on speaking.
    pub change: Option<&'static str>,
}

/// The replay's totals.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Messages replayed (the bot's own are skipped).
    pub messages: usize,
    /// Messages the bot would now speak on and did not then.
    pub now_speaks: Vec<String>,
    /// Messages the bot spoke on then and would not now.
    pub no_longer_speaks: Vec<String>,
    /// Messages it speaks on, then and now.
    pub speaks_then: usize,
    /// Messages it speaks on now.
    pub speaks_now: usize,
    /// Judge calls the replay made.
    pub judge_calls: u64,
    /// Of those, answered from the verdict log (no LLM call).
    pub reused: u64,
    /// Of those, asked anew of the LLM.
    pub asked: u64,
    /// Of those, guessed by the offline judge.
    pub guessed: u64,
    /// Of those, failed (the LLM did not answer): the bot stays silent.
    pub failed: u64,
    /// Bytes of judge prompts built.
    pub prompt_bytes: u64,
    /// Records in the verdict log.
    pub verdict_records: usize,
    /// Lines of the transcript or verdict log that could not be read.
    pub unreadable_lines: usize,
}

/// The whole replay.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// The bot.
    pub bot: String,
    /// The group.
    pub group: String,
    /// The transcript read.
    pub transcript: String,
    /// The verdict log read.
    pub verdict_log: String,
    /// The judge mode.
    pub llm: LlmMode,
    /// Its fallback (recorded mode).
    pub fallback: LlmMode,
    /// The settings changed (`--set`, and `judge_prompt=<file>`).
    pub changes: Vec<String>,
    /// Message by message.
    pub messages: Vec<Row>,
    /// Totals.
    pub summary: Summary,
}

/// Runs a replay (see the module docs).
pub async fn replay(opts: &ReplayOptions) -> anyhow::Result<ReplayReport> {
    let cfg = settings(opts)?;
    let (transcript_path, group) = transcript_of(opts, &cfg)?;
    let (mut messages, unreadable) = read_only(&transcript_path)
        .with_context(|| format!("reading the transcript {}", transcript_path.display()))?;
    messages.retain(|e| e.kind == Kind::Message);
    let group = group
        .or_else(|| messages.first().map(|e| e.group.clone()))
        .unwrap_or_else(|| cfg.mesh().group.clone());
    let verdict_path = opts
        .verdicts
        .clone()
        .unwrap_or_else(|| verdicts::verdict_path(&cfg.data_dir, &group));
    let loaded = verdicts::load(&verdict_path)
        .with_context(|| format!("reading the verdict log {}", verdict_path.display()))?;

    let live = match (&cfg.settings.llm, needs_live(opts)) {
        (_, false) => None,
        (None, true) => bail!(
            "--llm live (or --fallback live) needs an [llm] section in {}",
            opts.config.display()
        ),
        (Some(_), true) => Some(LlmClient::new(
            LlmClient::build_http(Duration::from_secs(3)).context("building the LLM client")?,
        )),
    };
    // The replay always builds the judge prompt (to hash, measure and show it); the
    // scripted LLM decides who answers it.
    let endpoint = match &cfg.settings.llm {
        Some(llm) => crate::turn::brain::endpoints(llm, &cfg.llm_keys).0,
        None => Endpoint::new("offline://judge", "offline"),
    };
    let mut tuning = crate::turn::brain::Tuning::of(&cfg);
    tuning.provider = Provider::Remote {
        judge: endpoint.clone(),
        reply: endpoint,
    };
    // A replay asks the bot's own judge (or its record): no shared verdict would come.
    Arc::make_mut(&mut tuning.mesh).judge = crate::config::JudgeMode::Own;
    let mesh = tuning.mesh.clone();
    let brain = Brain::with(tuning, &cfg.settings.bots, Arc::new(Metrics::new()));

    let mut recorded = HashMap::new();
    let mut records: HashMap<Ulid, (VerdictRecord, Option<String>)> = HashMap::new();
    for r in &loaded.records {
        if let (Some(hash), Some(speak), Some(relevance)) = (&r.prompt_hash, r.speak, r.relevance) {
            recorded.insert(
                (r.msg, hash.clone()),
                crate::llm::Verdict { speak, relevance },
            );
        }
        match records.get_mut(&r.msg) {
            None if !r.rejudge => {
                records.insert(r.msg, (r.clone(), None));
            }
            Some((_, rejudge)) if r.rejudge => *rejudge = Some(r.reason.clone()),
            _ => {}
        }
    }
    let me = brain.me().name.clone();
    let ports = Arc::new(ReplayPorts {
        mesh,
        llm: ReplayLlm {
            me: (*brain.me()).clone(),
            mode: opts.llm,
            fallback: opts.fallback,
            recorded,
            live,
            calls: Counts::default(),
            last: Mutex::new(None),
        },
        brain,
        transcript: messages.clone(),
        upto: AtomicUsize::new(0),
        now: AtomicU64::new(0),
        stopping: CancellationToken::new(),
        acks: Arc::new(AckTracker::default()),
        seen: Mutex::new(Seen::default()),
    });

    let mut rows = Vec::new();
    let mut summary = Summary {
        verdict_records: loaded.records.len(),
        unreadable_lines: unreadable + loaded.skipped,
        ..Summary::default()
    };
    for (i, msg) in messages.iter().enumerate() {
        ports.upto.store(i + 1, Ordering::SeqCst);
        ports.now.store(msg.sent_at, Ordering::SeqCst);
        *ports.seen.lock() = Seen::default();
        *ports.llm.last.lock() = None;
        ports.brain.observe(msg);
        if msg.author.kind == AuthorKind::Bot && msg.author.name == me {
            continue;
        }
        if let Some(d) = crate::turn::pipeline::triage(&*ports, msg, &[]) {
            let _ = crate::turn::pipeline::judge_step(&*ports, msg, &d).await;
        }
        let seen = std::mem::take(&mut *ports.seen.lock());
        let last = ports.llm.last.lock().take();
        let now = now_row(seen, last, opts.show_prompt);
        let answered = messages.iter().any(|e| {
            e.author.kind == AuthorKind::Bot && e.author.name == me && e.reply_to == Some(msg.id)
        });
        let then = then_row(records.get(&msg.id), answered);
        let spoke = speaks(then.action.as_deref());
        let speaks_now = speaks(Some(&now.action));
        let change = match (spoke, speaks_now) {
            (false, true) => Some("now_speaks"),
            (true, false) => Some("no_longer_speaks"),
            _ => None,
        };
        summary.messages += 1;
        summary.speaks_then += usize::from(spoke);
        summary.speaks_now += usize::from(speaks_now);
        match change {
            Some("now_speaks") => summary.now_speaks.push(msg.id.to_string()),
            Some(_) => summary.no_longer_speaks.push(msg.id.to_string()),
            None => {}
        }
        rows.push(Row {
            id: msg.id.to_string(),
            from: msg.author.name.clone(),
            depth: msg.depth,
            text: trim(&msg.text, 60),
            then,
            now,
            change,
        });
    }
    let c = &ports.llm.calls;
    summary.judge_calls = c.judge.load(Ordering::SeqCst);
    summary.reused = c.reused.load(Ordering::SeqCst);
    summary.asked = c.asked.load(Ordering::SeqCst);
    summary.guessed = c.guessed.load(Ordering::SeqCst);
    summary.failed = c.failed.load(Ordering::SeqCst);
    summary.prompt_bytes = c.prompt_bytes.load(Ordering::SeqCst);
    let mut changes = opts.sets.clone();
    if let Some(f) = &opts.judge_prompt_file {
        changes.push(format!("judge_prompt=<{}>", f.display()));
    }
    Ok(ReplayReport {
        bot: me,
        group,
        transcript: transcript_path.display().to_string(),
        verdict_log: verdict_path.display().to_string(),
        llm: opts.llm,
        fallback: opts.fallback,
        changes,
        messages: rows,
        summary,
    })
}

/// `POST /v1/replay` (the page's "what if" panel): what the running node's bot would
/// do over a group's recorded transcript with `sets`, from its own data folder and the
/// peers.toml it was started from (as that file is now). Never calls an LLM: `llm` is
/// `recorded` (default; unrecorded prompts are guessed offline) or `offline`. With
/// `changed_only`, the report keeps only the messages whose outcome changes.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayQuery {
    /// The group (default `[mesh].group`).
    #[serde(default)]
    pub group: Option<String>,
    /// `KEY=VALUE` settings, as `--set`.
    #[serde(default)]
    pub set: Vec<String>,
    /// `recorded` or `offline`.
    #[serde(default)]
    pub llm: Option<String>,
    /// Keep only the rows that change.
    #[serde(default)]
    pub changed_only: bool,
}

/// Runs a [`ReplayQuery`] for the node's bot, off the async workers (it reads files).
pub(crate) async fn replay_live(cfg: &NodeConfig, q: ReplayQuery) -> anyhow::Result<ReplayReport> {
    let llm = LlmMode::parse(q.llm.as_deref().unwrap_or("recorded"))?;
    if llm == LlmMode::Live {
        bail!("a live replay costs LLM calls: run `botmesh replay --llm live` instead");
    }
    let opts = ReplayOptions {
        config: cfg.settings.path.clone(),
        bot: cfg.bot().name.clone(),
        transcript: None,
        group: q.group.filter(|g| !g.is_empty()),
        data_dir: Some(cfg.data_dir.clone()),
        verdicts: None,
        sets: q.set,
        judge_prompt_file: None,
        llm,
        fallback: LlmMode::Offline,
        show_prompt: false,
        env: std::env::vars().collect(),
    };
    let handle = tokio::runtime::Handle::current();
    let mut report = tokio::task::spawn_blocking(move || handle.block_on(replay(&opts)))
        .await
        .context("the replay task failed")??;
    if q.changed_only {
        report.messages.retain(|r| r.change.is_some());
    }
    Ok(report)
}

/// Whether an action means the bot speaks on the message (answers or claims it).
fn speaks(action: Option<&str>) -> bool {
    matches!(action, Some("reply" | "claim"))
}

/// Whether the replay may call the configured LLM.
fn needs_live(opts: &ReplayOptions) -> bool {
    opts.llm == LlmMode::Live || (opts.llm == LlmMode::Recorded && opts.fallback == LlmMode::Live)
}

/// The bot's configuration with the replay's changes, validated as peers.toml is.
fn settings(opts: &ReplayOptions) -> anyhow::Result<NodeConfig> {
    let mut settings = Settings::load_with_sets(&opts.config, &opts.env, &opts.bot, &opts.sets)
        .with_context(|| match opts.sets.is_empty() {
            true => format!("reading {}", opts.config.display()),
            false => format!("with --set {}", opts.sets.join(" --set ")),
        })?;
    if let Some(file) = &opts.judge_prompt_file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading --judge-prompt-file {}", file.display()))?;
        let (me, _) = settings
            .bot(&opts.bot)
            .with_context(|| format!("unknown bot {:?}", opts.bot))?;
        settings.bots[me].judge_prompt = Some(text);
        settings
            .validate()
            .with_context(|| format!("--judge-prompt-file {}", file.display()))?;
    }
    crate::platform::registry::check(&settings)?;
    let env: HashMap<String, String> = opts.env.iter().cloned().collect();
    let mut cfg = NodeConfig::without_secrets(settings, &opts.bot, &env)?;
    if let Some(d) = &opts.data_dir {
        cfg.data_dir = d.clone();
    }
    Ok(cfg)
}

/// The transcript file to read, and the group when it was named.
fn transcript_of(
    opts: &ReplayOptions,
    cfg: &NodeConfig,
) -> anyhow::Result<(PathBuf, Option<String>)> {
    match (&opts.transcript, &opts.group) {
        (Some(_), Some(_)) => bail!("pass either --transcript or --group, not both"),
        (Some(file), None) => Ok((file.clone(), None)),
        (None, group) => {
            let group = group.clone().unwrap_or_else(|| cfg.mesh().group.clone());
            let dir = cfg.data_dir.join("transcripts");
            let path = stored_path(&dir, &group, "jsonl");
            if !path.exists() {
                bail!(
                    "no transcript of group {group:?} in {} (groups there: {})",
                    dir.display(),
                    groups_in(&dir)
                );
            }
            Ok((path, Some(group)))
        }
    }
}

/// The groups with a transcript in `dir`, for an error message.
fn groups_in(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .filter_map(|p| crate::store::file_names::group_of_file(&p))
        .collect();
    names.sort();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The "now" column from what the production code decided.
fn now_row(seen: Seen, last: Option<LastCall>, show_prompt: bool) -> Now {
    let (mut action, mut reason) = seen
        .decisions
        .last()
        .cloned()
        .unwrap_or_else(|| ("silent".into(), "own_message".into()));
    if let Some(r) = &seen.verdict {
        action = r.action.clone();
        reason = r.reason.clone();
    }
    Now {
        action,
        reason,
        relevance: seen.verdict.as_ref().and_then(|r| r.relevance),
        speak: seen.verdict.as_ref().and_then(|r| r.speak),
        delay_ms: seen.verdict.as_ref().and_then(|r| r.delay_ms),
        verdict: last.as_ref().map(|l| l.source),
        prompt_bytes: seen.verdict.as_ref().map(|r| r.prompt_bytes),
        prompt: last.filter(|_| show_prompt).map(|l| l.prompt),
    }
}

/// The "then" column from the verdict log and the transcript.
fn then_row(record: Option<&(VerdictRecord, Option<String>)>, answered: bool) -> Then {
    match record {
        Some((r, rejudge)) => Then {
            record: true,
            action: Some(r.action.clone()),
            reason: Some(r.reason.clone()),
            relevance: r.relevance,
            speak: r.speak,
            delay_ms: r.delay_ms,
            rejudge: rejudge.clone(),
            answered,
        },
        None => Then {
            record: false,
            action: answered.then(|| "reply".to_string()),
            reason: answered.then(|| "answered".to_string()),
            relevance: None,
            speak: None,
            delay_ms: None,
            rejudge: None,
            answered,
        },
    }
}

/// What the turn code told the replay's ports about one message.
#[derive(Default)]
struct Seen {
    /// Decisions (action, reason), in order.
    decisions: Vec<(String, String)>,
    /// The judge's answer and what followed.
    verdict: Option<VerdictRecord>,
}

/// The last judge call: its prompt and where its answer came from.
struct LastCall {
    prompt: String,
    source: &'static str,
}

/// The replay's judge-call counters.
#[derive(Default)]
struct Counts {
    judge: AtomicU64,
    reused: AtomicU64,
    asked: AtomicU64,
    guessed: AtomicU64,
    failed: AtomicU64,
    prompt_bytes: AtomicU64,
}

/// The scripted LLM of a replay (see the module docs).
struct ReplayLlm {
    /// The bot (for the offline judge).
    me: crate::config::BotSettings,
    mode: LlmMode,
    fallback: LlmMode,
    /// Recorded verdicts by (message, prompt hash).
    recorded: HashMap<(Ulid, String), crate::llm::Verdict>,
    /// The configured LLM, when the replay may call it.
    live: Option<LlmClient>,
    calls: Counts,
    last: Mutex<Option<LastCall>>,
}

impl ReplayLlm {
    /// The offline judge's answer, as the offline provider gives it.
    fn guess(&self, about: &Envelope) -> crate::llm::Verdict {
        if about.author.kind == AuthorKind::Bot {
            crate::llm::Verdict {
                speak: false,
                relevance: 0.0,
            }
        } else {
            offline_verdict(&self.me, &about.text)
        }
    }
}

fn answer(v: crate::llm::Verdict) -> Completion {
    Completion::offline(serde_json::json!({"speak": v.speak, "relevance": v.relevance}).to_string())
}

impl Llm for ReplayLlm {
    fn complete<'a>(&'a self, call: LlmCall<'a>) -> BoxFuture<'a, Result<Completion, LlmError>> {
        // Only judge calls are replayed: nothing else is recorded.
        let (ep, purpose, messages, about) = (call.ep, call.purpose, call.messages, call.about);
        Box::pin(async move {
            if purpose != Purpose::Judge {
                return Err(LlmError::Timeout);
            }
            let c = &self.calls;
            c.judge.fetch_add(1, Ordering::SeqCst);
            let bytes: usize = messages.iter().map(|m| m.content.len()).sum();
            c.prompt_bytes.fetch_add(bytes as u64, Ordering::SeqCst);
            let prompt = messages
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n");
            let mode = match self.mode {
                LlmMode::Recorded => {
                    let key = (about.id, prompt_hash(messages));
                    if let Some(v) = self.recorded.get(&key) {
                        c.reused.fetch_add(1, Ordering::SeqCst);
                        *self.last.lock() = Some(LastCall {
                            prompt,
                            source: "recorded",
                        });
                        return Ok(answer(*v));
                    }
                    self.fallback
                }
                m => m,
            };
            let (source, result) = match (mode, &self.live) {
                (LlmMode::Live, Some(client)) => {
                    c.asked.fetch_add(1, Ordering::SeqCst);
                    ("live", client.complete(ep, purpose, messages).await)
                }
                _ => {
                    c.guessed.fetch_add(1, Ordering::SeqCst);
                    ("offline", Ok(answer(self.guess(about))))
                }
            };
            if result.is_err() {
                c.failed.fetch_add(1, Ordering::SeqCst);
            }
            *self.last.lock() = Some(LastCall { prompt, source });
            result
        })
    }

    /// A drafting bot's call is judged like any other: its verdict line is the
    /// recorded (or asked, or guessed) verdict; replay writes no reply.
    fn draft<'a>(
        &'a self,
        call: LlmCall<'a>,
    ) -> BoxFuture<'a, Result<crate::llm::Drafting, LlmError>> {
        Box::pin(async move {
            let judged = LlmCall {
                purpose: Purpose::Judge,
                ..call
            };
            let verdict = self.complete(judged).await?;
            // Never read: replay stops at the verdict.
            let nothing = Completion::offline("");
            Ok(crate::llm::Drafting {
                head: verdict.text,
                rest: Box::pin(async move { Ok(nothing) }),
            })
        })
    }
}

/// The turn code's view during a replay: the recording up to the current message, a
/// clock at its time, no peers.
struct ReplayPorts {
    brain: Brain,
    mesh: Arc<MeshSettings>,
    llm: ReplayLlm,
    /// The whole recording, oldest first.
    transcript: Vec<Arc<Envelope>>,
    /// How many of its messages have "arrived" (the current one included).
    upto: AtomicUsize,
    /// The virtual clock: the current message's `sent_at`.
    now: AtomicU64,
    /// Never cancelled.
    stopping: CancellationToken,
    /// For claims nobody acknowledges (no peers).
    acks: Arc<AckTracker>,
    /// What the turn code reported about the current message.
    seen: Mutex<Seen>,
}

/// What has arrived so far of the recorded transcript: the log the decisions read.
impl SliceLog for ReplayPorts {
    fn read_log<R>(&self, read: impl FnOnce(&[Arc<Envelope>]) -> R) -> R {
        read(&self.transcript[..self.upto.load(Ordering::SeqCst)])
    }
}

impl Ports for ReplayPorts {
    fn brain(&self) -> &Brain {
        &self.brain
    }

    fn mesh(&self) -> Arc<MeshSettings> {
        self.mesh.clone()
    }

    fn llm(&self) -> &dyn Llm {
        &self.llm
    }

    fn now_millis(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn new_id(&self) -> Ulid {
        Ulid::new()
    }

    fn jitter_ms(&self, _max_ms: u64) -> u64 {
        0
    }

    fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    fn broadcast(&self, _env: &Envelope) {}

    fn send_to(&self, _peers: &[String], _env: &Envelope) {}

    fn broadcast_tracked(&self, env: &Envelope) -> ClaimAcks {
        self.acks.track(&env.id.to_string(), Vec::new())
    }

    fn publish(self: Arc<Self>, _env: Envelope) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Err("a replay posts nothing".to_string()) })
    }

    fn event(&self, event: Event) {
        if let Event::Decision { action, reason, .. } = event {
            self.seen.lock().decisions.push((action, reason));
        }
    }

    fn judged(&self, record: VerdictRecord) {
        self.seen.lock().verdict = Some(record);
    }
}

/// The report as text: one block per message, then the summary.
pub fn render_text(r: &ReplayReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "replay of {} over group {:?}: {} messages, {} verdict records; llm {}{}",
        r.bot,
        r.group,
        r.summary.messages,
        r.summary.verdict_records,
        mode_name(r.llm),
        if r.llm == LlmMode::Recorded {
            format!(" (fallback {})", mode_name(r.fallback))
        } else {
            String::new()
        }
    );
    if !r.changes.is_empty() {
        let _ = writeln!(out, "changes: {}", r.changes.join(", "));
    }
    for row in &r.messages {
        let mark = match row.change {
            Some("now_speaks") => "  <- now speaks",
            Some(_) => "  <- no longer speaks",
            None => "",
        };
        let _ = writeln!(
            out,
            "\n{} {} (depth {}): {}{mark}",
            row.id, row.from, row.depth, row.text
        );
        let t = &row.then;
        let then = match (&t.action, t.record) {
            (Some(a), true) => decision_text(
                a,
                t.reason.as_deref().unwrap_or(""),
                t.relevance,
                t.delay_ms,
            ),
            _ => "no record".to_string(),
        };
        let _ = writeln!(
            out,
            "  then: {then}{}{}",
            t.rejudge
                .as_ref()
                .map(|r| format!(", re-judged: {r}"))
                .unwrap_or_default(),
            if t.answered {
                ", answered (its reply is in the transcript)"
            } else {
                ""
            }
        );
        let n = &row.now;
        let _ = writeln!(
            out,
            "  now:  {}{}",
            decision_text(&n.action, &n.reason, n.relevance, n.delay_ms),
            n.verdict
                .map(|v| format!(" [verdict {v}]"))
                .unwrap_or_default()
        );
        if let Some(p) = &n.prompt {
            let _ = writeln!(out, "  prompt ({} bytes):", p.len());
            for l in p.lines() {
                let _ = writeln!(out, "    | {l}");
            }
        }
    }
    let s = &r.summary;
    let _ = writeln!(
        out,
        "\nsummary: speaks on {} then, {} now; now speaks on {}: {}; no longer speaks on {}: {}",
        s.speaks_then,
        s.speaks_now,
        s.now_speaks.len(),
        list(&s.now_speaks),
        s.no_longer_speaks.len(),
        list(&s.no_longer_speaks)
    );
    let _ = writeln!(
        out,
        "judge calls: {} ({} from the verdict log, {} asked anew, {} guessed offline, {} failed); prompt bytes: {}",
        s.judge_calls, s.reused, s.asked, s.guessed, s.failed, s.prompt_bytes
    );
    if s.unreadable_lines > 0 {
        let _ = writeln!(out, "unreadable lines skipped: {}", s.unreadable_lines);
    }
    out
}

fn mode_name(m: LlmMode) -> &'static str {
    match m {
        LlmMode::Recorded => "recorded",
        LlmMode::Live => "live",
        LlmMode::Offline => "offline",
    }
}

fn list(ids: &[String]) -> String {
    if ids.is_empty() {
        "-".into()
    } else {
        ids.join(" ")
    }
}

fn decision_text(action: &str, reason: &str, relevance: Option<f64>, delay: Option<u64>) -> String {
    let mut s = format!("{action} {reason}");
    if let Some(r) = relevance {
        let _ = std::fmt::Write::write_fmt(&mut s, format_args!(" relevance={r:.2}"));
    }
    if let Some(d) = delay {
        let _ = std::fmt::Write::write_fmt(&mut s, format_args!(" delay={d}ms"));
    }
    s
}
