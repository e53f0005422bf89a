//! The turn-taking simulator behind `botmesh simulate`.
//!
//! Several bots, scripted humans and a scripted judge, in virtual time. Each
//! scenario file (`scenarios/*.toml`) gives the bots, the human messages with their
//! times, what each bot's judge would answer about each message, LLM latency and
//! network delay/drop distributions. The simulator then runs the scenario under
//! botmesh's own policy and under three baselines that reproduce earlier systems
//! (XiaoBa's bridge, the nanobot relay, the review panel), and measures duplicate
//! interjections, whether the right bot answered, time to first answer, bot-only
//! chains, LLM calls and judge prompt sizes.
//!
//! Under botmesh's own policy every bot runs the production turn code (`turn::triage`,
//! `turn::act`) against a virtual-time `turn::Ports` on tokio's paused clock
//! ([`virtual_mesh`]); only the LLM and the network are scripted. The baselines are a
//! discrete-event loop over virtual milliseconds (a heap of timed events) sharing the
//! same network model, mention matcher and judge prompts. A run is fully determined by
//! its seed.
//!
//! `botmesh replay` (`app::replay`) runs the same production code for one bot over
//! a recorded transcript instead of a scenario, with changed settings.

mod virtual_mesh;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use crate::config::{BotSettings, MeshSettings};
use crate::llm::Verdict;
use crate::turn::judge::{build_prompt, JudgeInput};
use crate::turn::mention::MentionMatcher;
use crate::turn::roster;
use crate::wire::envelope::{Author, AuthorKind, Envelope};

/// A run stops early once this many bot messages were posted (a runaway loop).
pub(crate) const RUNAWAY_POSTS: usize = 200;

/// How a judge that already sees another bot's answer to the trigger answers when
/// the scenario does not say (`after_answer`): it declines, at half the relevance.
const AFTER_ANSWER_SCALE: f64 = 0.5;

/// The judge's default answer when a bot is @mentioned past `llm_threshold` and the
/// scenario gives no `bot_judge` entry for it: a direct question is worth answering.
const MENTIONED_DEFAULT: Verdict = Verdict {
    speak: true,
    relevance: 0.7,
};

// ---------------------------------------------------------------------------
// Scenario files
// ---------------------------------------------------------------------------

/// A latency or delay distribution, in virtual milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case")]
pub enum Dist {
    /// Always the same.
    Fixed {
        /// The delay.
        ms: f64,
    },
    /// Uniform in `[min, max]`.
    Uniform {
        /// Smallest value.
        min: f64,
        /// Largest value.
        max: f64,
    },
    /// Log-normal: `median × e^(sigma·z)`, z standard normal, optionally capped.
    Lognormal {
        /// The median.
        median: f64,
        /// Sigma of the underlying normal (0.3 = mild spread, 1.0 = heavy tail).
        sigma: f64,
        /// Upper cap (a timeout).
        #[serde(default)]
        max: Option<f64>,
    },
}

impl Dist {
    /// Draws one value, in whole milliseconds (at least 0).
    pub(crate) fn sample(&self, rng: &mut impl Rng) -> u64 {
        let v = match *self {
            Dist::Fixed { ms } => ms,
            Dist::Uniform { min, max } => {
                if max > min {
                    rng.gen_range(min..=max)
                } else {
                    min
                }
            }
            Dist::Lognormal { median, sigma, max } => {
                // Box–Muller; u1 in (0, 1] so ln is finite.
                let u1: f64 = 1.0 - rng.gen::<f64>();
                let u2: f64 = rng.gen();
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                let x = median * (sigma * z).exp();
                max.map_or(x, |m| x.min(m))
            }
        };
        v.max(0.0).round() as u64
    }

    /// A short human description, for the docs.
    pub fn describe(&self) -> String {
        match self {
            Dist::Fixed { ms } => format!("{ms:.0} ms"),
            Dist::Uniform { min, max } => format!("U({min:.0}–{max:.0}) ms"),
            Dist::Lognormal { median, sigma, max } => match max {
                Some(m) => format!("logN(median {median:.0} ms, σ {sigma}, ≤{m:.0})"),
                None => format!("logN(median {median:.0} ms, σ {sigma})"),
            },
        }
    }
}

/// What the scripted judge answers for one bot.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Answer {
    /// `0.9`: speak, at this relevance.
    Speak(f64),
    /// `{ speak = false, relevance = 0.4 }`.
    Full {
        /// Whether the judge says to speak.
        speak: bool,
        /// Its relevance, 0..1.
        relevance: f64,
    },
}

impl Answer {
    /// As the judge's verdict.
    pub(crate) fn verdict(&self) -> Verdict {
        match *self {
            Answer::Speak(r) => Verdict {
                speak: true,
                relevance: r,
            },
            Answer::Full { speak, relevance } => Verdict { speak, relevance },
        }
    }
}

/// Scripted reply text: one text, or a list used in turn (the k-th reply a bot
/// posts in the exchange uses entry k; the last one repeats).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Replies {
    /// Always this text.
    One(String),
    /// Successive texts.
    Many(Vec<String>),
}

impl Replies {
    /// The text for the k-th reply.
    pub(crate) fn pick(&self, k: usize) -> &str {
        match self {
            Replies::One(s) => s,
            Replies::Many(v) => v
                .get(k)
                .or(v.last())
                .map(String::as_str)
                .unwrap_or_default(),
        }
    }
}

/// How many answers a human message wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Want {
    /// One good answer suffices (a second unmentioned answer is a duplicate).
    #[default]
    One,
    /// Everyone with something to say should answer ("大家都说说").
    All,
}

/// One scripted human message and what the bots' judges say about its exchange.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedMessage {
    /// When it is posted, virtual ms from the start.
    pub(crate) at: u64,
    /// The human's name (must not be a bot's).
    pub(crate) from: String,
    /// The text; whom it mentions is found by the real matcher.
    pub(crate) text: String,
    /// One answer suffices, or everyone should speak.
    #[serde(default)]
    pub(crate) want: Want,
    /// bot → the judge's answer about this message (absent: no).
    #[serde(default)]
    pub(crate) judge: BTreeMap<String, Answer>,
    /// bot → the judge's answer once its prompt shows another bot's answer to this
    /// message (absent: declines, at half the relevance).
    #[serde(default)]
    pub(crate) after_answer: BTreeMap<String, Answer>,
    /// bot → its reply text to this message (absent: a plain synthetic answer).
    #[serde(default)]
    pub(crate) reply: BTreeMap<String, Replies>,
    /// bot → the judge's answer about any bot message in this exchange that does not
    /// @mention another bot (absent: no, or speak at 0.7 when it @mentions this bot).
    /// A bot message @addressed to another bot is always declined.
    #[serde(default)]
    pub(crate) bot_judge: BTreeMap<String, Answer>,
    /// bot → its reply texts to bot messages in this exchange.
    #[serde(default)]
    pub(crate) bot_reply: BTreeMap<String, Replies>,
}

/// One bot of a scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedBot {
    /// Canonical name.
    pub(crate) name: String,
    /// Aliases (mentions by alias count).
    #[serde(default)]
    pub(crate) aliases: Vec<String>,
    /// Role, shown to colleagues' judges.
    #[serde(default)]
    pub(crate) role: String,
    /// Skills.
    #[serde(default)]
    pub(crate) skills: Vec<String>,
    /// Any other `[[bots]]` keys of peers.toml (min_delay_ms, min_relevance, …).
    #[serde(default)]
    pub(crate) settings: serde_json::Map<String, serde_json::Value>,
    /// This bot's judge latency, instead of the scenario's.
    #[serde(default)]
    pub(crate) judge_latency: Option<Dist>,
    /// This bot's reply latency, instead of the scenario's.
    #[serde(default)]
    pub(crate) reply_latency: Option<Dist>,
}

fn d_judge() -> Dist {
    Dist::Uniform {
        min: 400.0,
        max: 1200.0,
    }
}
fn d_reply() -> Dist {
    Dist::Lognormal {
        median: 2500.0,
        sigma: 0.35,
        max: Some(20_000.0),
    }
}
fn d_network() -> Dist {
    Dist::Uniform {
        min: 20.0,
        max: 150.0,
    }
}
fn d_horizon() -> u64 {
    60_000
}

/// Latencies, network and how long to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timing {
    /// Judge LLM call latency.
    #[serde(default = "d_judge")]
    pub(crate) judge: Dist,
    /// Reply LLM call latency.
    #[serde(default = "d_reply")]
    pub(crate) reply: Dist,
    /// Delivery delay of every envelope (and of human messages from the platform).
    #[serde(default = "d_network")]
    pub(crate) network: Dist,
    /// Probability a delivery attempt of a bot message fails (it is retried, see `Sim::link`).
    #[serde(default)]
    pub(crate) drop: f64,
    /// Probability a delivery attempt of a claim fails (it is retried).
    #[serde(default)]
    pub(crate) claim_drop: f64,
    /// Probability a delivery attempt of a human message fails (it is retried).
    #[serde(default)]
    pub(crate) human_drop: f64,
    /// Probability a judge call fails or times out (the bot stays silent).
    #[serde(default)]
    pub(crate) judge_fail: f64,
    /// Probability a reply call fails or times out (the bot stays silent).
    #[serde(default)]
    pub(crate) reply_fail: f64,
    /// How long to run after the last human message.
    #[serde(default = "d_horizon")]
    pub(crate) horizon_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            judge: d_judge(),
            reply: d_reply(),
            network: d_network(),
            drop: 0.0,
            claim_drop: 0.0,
            human_drop: 0.0,
            judge_fail: 0.0,
            reply_fail: 0.0,
            horizon_ms: d_horizon(),
        }
    }
}

/// Network overrides for one direction (`"*"` matches anyone; the last match wins).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Sender (bot or human name, or `*`).
    pub(crate) from: String,
    /// Receiver (bot name, or `*`).
    pub(crate) to: String,
    /// Delay instead of `timing.network`.
    #[serde(default)]
    pub(crate) delay: Option<Dist>,
    /// Drop probability of messages (and human messages) on this link.
    #[serde(default)]
    pub(crate) drop: Option<f64>,
    /// Drop probability of claims on this link.
    #[serde(default)]
    pub(crate) claim_drop: Option<f64>,
}

/// One scenario file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name (default: the file stem).
    #[serde(default)]
    pub name: String,
    /// The scenario group its results are reported under.
    pub(crate) group: String,
    /// `zh` or `en` (the language of synthetic replies).
    #[serde(default)]
    pub lang: String,
    /// What it exercises.
    #[serde(default)]
    pub(crate) description: String,
    /// `[mesh]` keys of peers.toml (max_depth, llm_threshold, bot_messages_per_minute).
    #[serde(default)]
    pub(crate) mesh: serde_json::Map<String, serde_json::Value>,
    /// Latencies and network.
    #[serde(default)]
    pub(crate) timing: Timing,
    /// Per-link network overrides.
    #[serde(default)]
    pub(crate) links: Vec<Link>,
    /// The bots (3–8 in the shipped scenarios).
    pub(crate) bots: Vec<ScriptedBot>,
    /// The human messages, in time order.
    pub(crate) messages: Vec<ScriptedMessage>,
}

/// A scenario checked and compiled into the real settings types.
#[derive(Clone)]
pub struct World {
    /// The scenario as written.
    pub scenario: Scenario,
    /// Its mesh settings (defaults of peers.toml plus the scenario's `[mesh]`).
    pub mesh: Arc<MeshSettings>,
    /// Its bots as peers.toml would configure them.
    pub bots: Vec<BotSettings>,
    colleagues: Vec<Vec<BotSettings>>,
    matcher: MentionMatcher,
    judge_lat: Vec<Dist>,
    reply_lat: Vec<Dist>,
}

impl World {
    /// Parses and checks a scenario from TOML text.
    pub(crate) fn parse(text: &str, default_name: &str) -> anyhow::Result<World> {
        let value: serde_json::Value = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .context("reading TOML")?
            .try_deserialize()
            .context("reading TOML")?;
        let mut scenario: Scenario = serde_json::from_value(value).context("scenario shape")?;
        if scenario.name.is_empty() {
            scenario.name = default_name.to_string();
        }
        World::compile(scenario)
    }

    /// Reads one scenario file.
    pub fn load(path: &Path) -> anyhow::Result<World> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        World::parse(&text, &stem).with_context(|| format!("scenario {}", path.display()))
    }

    /// Checks a scenario and builds the real settings from it.
    pub(crate) fn compile(scenario: Scenario) -> anyhow::Result<World> {
        let mesh: MeshSettings =
            serde_json::from_value(serde_json::Value::Object(scenario.mesh.clone()))
                .context("[mesh]")?;
        if scenario.bots.is_empty() || scenario.messages.is_empty() {
            bail!("a scenario needs bots and messages");
        }
        let mut bots = Vec::new();
        for b in &scenario.bots {
            let mut obj = b.settings.clone();
            obj.insert("name".into(), b.name.clone().into());
            obj.insert("aliases".into(), serde_json::json!(b.aliases));
            obj.insert("role".into(), b.role.clone().into());
            obj.insert("skills".into(), serde_json::json!(b.skills));
            obj.entry("bridge").or_insert("127.0.0.1:1".into());
            obj.entry("api").or_insert("127.0.0.1:2".into());
            let s: BotSettings = serde_json::from_value(serde_json::Value::Object(obj))
                .with_context(|| format!("bot {}", b.name))?;
            bots.push(s);
        }
        let names: Vec<&str> = bots.iter().map(|b| b.name.as_str()).collect();
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                bail!("bot {n} is listed twice");
            }
        }
        let mut last_at = 0;
        for (i, m) in scenario.messages.iter().enumerate() {
            if names.contains(&m.from.as_str()) {
                bail!(
                    "message {i}: from {:?} is a bot; scripted messages are human",
                    m.from
                );
            }
            if m.at < last_at {
                bail!("message {i}: messages must be in time order");
            }
            last_at = m.at;
            let tables = [
                ("judge", m.judge.keys().collect::<Vec<_>>()),
                ("after_answer", m.after_answer.keys().collect()),
                ("reply", m.reply.keys().collect()),
                ("bot_judge", m.bot_judge.keys().collect()),
                ("bot_reply", m.bot_reply.keys().collect()),
            ];
            for (t, keys) in tables {
                if let Some(k) = keys.iter().find(|k| !names.contains(&k.as_str())) {
                    bail!("message {i}: {t} names {k:?}, which is not a bot of the scenario");
                }
            }
        }
        for l in &scenario.links {
            if l.to != "*" && !names.contains(&l.to.as_str()) {
                bail!("link to {:?}: not a bot", l.to);
            }
        }
        let colleagues = (0..bots.len())
            .map(|i| {
                bots.iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, b)| b.clone())
                    .collect()
            })
            .collect();
        let t = &scenario.timing;
        let judge_lat = scenario
            .bots
            .iter()
            .map(|b| b.judge_latency.clone().unwrap_or_else(|| t.judge.clone()))
            .collect();
        let reply_lat = scenario
            .bots
            .iter()
            .map(|b| b.reply_latency.clone().unwrap_or_else(|| t.reply.clone()))
            .collect();
        Ok(World {
            matcher: MentionMatcher::new(&roster(&bots)),
            mesh: Arc::new(mesh),
            bots,
            colleagues,
            judge_lat,
            reply_lat,
            scenario,
        })
    }
}

/// Loads every `*.toml` in `dir`, sorted by file name.
pub fn load_dir(dir: &Path) -> anyhow::Result<Vec<World>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        bail!("no *.toml scenarios in {}", dir.display());
    }
    paths.iter().map(|p| World::load(p)).collect()
}

// ---------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------

/// A turn-taking policy the simulator can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// botmesh itself: docs/design.md steps 2–6, through the real code (`[mesh] judge = "own"`).
    Botmesh,
    /// botmesh with one judge call per message for the whole mesh (`judge = "shared"`).
    BotmeshShared,
    /// botmesh with every bot's own judge drafting its reply in the same call
    /// (`judge_drafts = true`).
    BotmeshDrafting,
    /// XiaoBa's HTTP bridge with the interjection judge (seed 004).
    Xiaoba,
    /// The nanobot Feishu relay with its depth stop policy (seed 000, transcript 001).
    Nanobot,
    /// The review panel that ignores bot messages (seed 002).
    ReviewPanel,
}

impl PolicyKind {
    /// Every policy, botmesh first.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Botmesh,
        PolicyKind::BotmeshDrafting,
        PolicyKind::BotmeshShared,
        PolicyKind::Xiaoba,
        PolicyKind::Nanobot,
        PolicyKind::ReviewPanel,
    ];

    /// The CLI / report name.
    pub fn as_str(&self) -> &'static str {
        match self {
            PolicyKind::Botmesh => "botmesh",
            PolicyKind::BotmeshShared => "botmesh-shared",
            PolicyKind::BotmeshDrafting => "botmesh-drafting",
            PolicyKind::Xiaoba => "xiaoba",
            PolicyKind::Nanobot => "nanobot",
            PolicyKind::ReviewPanel => "review-panel",
        }
    }

    /// Whether this is botmesh (any judge mode) rather than a baseline.
    pub fn is_botmesh(&self) -> bool {
        matches!(
            self,
            PolicyKind::Botmesh | PolicyKind::BotmeshShared | PolicyKind::BotmeshDrafting
        )
    }

    /// Whether every bot's judge drafts its reply under this policy.
    fn drafting(&self) -> bool {
        *self == PolicyKind::BotmeshDrafting
    }

    /// The judge mode botmesh runs with under this policy.
    fn judge_mode(&self) -> crate::config::JudgeMode {
        match self {
            PolicyKind::BotmeshShared => crate::config::JudgeMode::Shared,
            _ => crate::config::JudgeMode::Own,
        }
    }

    /// Parses `all` or one name into the policies to run.
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<PolicyKind>> {
        if s == "all" {
            return Ok(PolicyKind::ALL.to_vec());
        }
        PolicyKind::ALL
            .iter()
            .find(|p| p.as_str() == s)
            .map(|p| vec![*p])
            .with_context(|| {
                format!("unknown policy {s:?} (all, botmesh, botmesh-drafting, botmesh-shared, xiaoba, nanobot, review-panel)")
            })
    }

    /// The bot's settings as this policy's judge prompt would be built: botmesh
    /// uses the bot as configured; a baseline gets its estimated template and
    /// context (see the docs: "Judge prompt bytes").
    fn prompt_bot(&self, b: &BotSettings) -> BotSettings {
        let mut b = b.clone();
        match self {
            PolicyKind::Botmesh | PolicyKind::BotmeshShared | PolicyKind::BotmeshDrafting => {}
            PolicyKind::Xiaoba => {
                b.judge_prompt = Some(XIAOBA_JUDGE_PROMPT.into());
                b.context_messages = 10;
                b.context_chars = 1 << 20;
            }
            PolicyKind::Nanobot => {
                b.judge_prompt = Some(NANOBOT_JUDGE_PROMPT.into());
                b.context_messages = 20;
                b.context_chars = 1 << 20;
            }
            PolicyKind::ReviewPanel => {
                b.judge_prompt = Some(PANEL_JUDGE_PROMPT.into());
                b.context_messages = 0;
                b.context_chars = 1 << 20;
            }
        }
        b
    }
}

/// Estimated XiaoBa judge prompt (seed 004 P0: a short prompt with the last 5–10
/// broadcasts, the bot's profile and, per P1, the colleague table; yes/no answer).
pub(crate) const XIAOBA_JUDGE_PROMPT: &str = "你是 {name}（{role}，擅长：{skills}）。\n\
群里的同事：{colleagues}\n最近的群聊记录：\n{context}\n新消息（{from}）：{message}\n\
这条消息跟你有没有关系，你该不该主动回应？只回答 yes 或 no。";

/// Estimated nanobot relevance / stop-policy prompt (seed 000 §4.4: recent
/// transcript, the current message and the agent's role → YES/NO; seed 001: the
/// transcript is read with `get_recent(max_messages=20)`, untrimmed).
pub(crate) const NANOBOT_JUDGE_PROMPT: &str =
    "You are {name}, {role}.\nRecent group conversation:\n\
{context}\nNew message from {from}: {message}\n\
Is it necessary for you to respond to this message? Decline courtesy replies \
(ok/thanks), messages without substance and finished conversations. Answer YES or NO.";

/// Estimated review-panel `should_respond` prompt (seed 002 §8.1: the judge's
/// instruction; §4.1: the message alone, no history).
pub(crate) const PANEL_JUDGE_PROMPT: &str = "You are {name} ({role}) in a multi-agent panel.\n\
YOUR ROLE:\n- {skills}\nRULES:\n1. Keep responses under 150 words\n\
2. Use send_channel_message to respond\n3. Only respond to human messages\n\
4. Ask 1-2 probing questions per response\n5. Focus on {skills}\n\
Message from {from}: {message}\nShould you respond? Answer yes or no.";

// ---------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Judge,
    Wait,
    Write,
}

struct Task {
    bot: usize,
    msg: Arc<Envelope>,
    stage: Stage,
    verdict: Verdict,
    wait_start: u64,
    /// Generation of the one step that is still due (see [`Sim::schedule`]).
    gen: u32,
    done: bool,
    /// The LLM call in flight fails.
    failed: bool,
}

enum Event {
    Human(usize),
    Deliver {
        to: usize,
        env: Arc<Envelope>,
    },
    /// Task `.0`'s next step, valid while the task's generation is still `.1`.
    Step(usize, u32),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Carry {
    Human,
    Message,
    Claim,
}

struct Post {
    env: Arc<Envelope>,
    root: usize,
    mentioned: Vec<usize>,
}

/// Records a post in a run's registry (for the measures and the scripts): who it
/// mentions, by the real matcher, and which human message's exchange it belongs to.
fn register_post(
    w: &World,
    posts: &mut Vec<Post>,
    by_id: &mut HashMap<Ulid, usize>,
    env: Arc<Envelope>,
    root: usize,
) {
    let names = w.matcher.mentioned(&env.text, &[]);
    let mentioned = w
        .bots
        .iter()
        .enumerate()
        .filter(|(_, b)| names.contains(&b.name))
        .map(|(i, _)| i)
        .collect();
    by_id.insert(env.id, posts.len());
    posts.push(Post {
        env,
        root,
        mentioned,
    });
}

struct BotState {
    transcript: Vec<Arc<Envelope>>,
    arrived: Vec<u64>,
    /// (root message, replying to a bot message) → replies posted so far.
    replies: HashMap<(usize, bool), usize>,
}

/// Raw counts of one or more runs; summed, then turned into [`Metrics`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Tally {
    /// Runs counted.
    pub(crate) runs: u64,
    /// Runs with at least one duplicate interjection.
    pub(crate) runs_with_dup: u64,
    /// Runs stopped at [`RUNAWAY_POSTS`] bot messages.
    pub(crate) runaway_runs: u64,
    /// Human messages posted.
    pub(crate) human_msgs: u64,
    /// Bot messages posted.
    pub bot_posts: u64,
    /// Unmentioned answers beyond the one needed, over all one-answer triggers.
    pub dup_interjections: u64,
    /// One-answer human messages with a defined right answerer.
    pub expected: u64,
    /// … whose first answer came from that bot (the mentioned one, else the most relevant).
    pub right_first: u64,
    /// … that got no answer at all.
    pub unanswered: u64,
    /// Bots that should speak on "everyone" messages.
    pub all_wanted: u64,
    /// … and did.
    pub all_spoke: u64,
    /// Time to first answer of every answered human message, virtual ms.
    pub(crate) ttfa: Vec<u64>,
    /// Deepest bot message (bot turns since the last human).
    pub longest_chain: u32,
    /// Bot messages deeper than the scenario's `max_depth`.
    pub over_max_depth: u64,
    /// Judge calls about human messages.
    pub judge_human: u64,
    /// Judge calls about bot messages.
    pub judge_bot: u64,
    /// Re-judges after the wait (botmesh).
    pub rejudge: u64,
    /// Reply calls.
    pub reply_calls: u64,
    /// Reply calls whose text was thrown away (yield or rule at the last check).
    pub(crate) replies_discarded: u64,
    /// Sum of judge prompt bytes.
    pub(crate) prompt_bytes: u64,
    /// Judge prompts built.
    pub(crate) prompts: u64,
    /// Bytes of every prompt sent (judge, shared judge, drafting judge and reply
    /// calls): what the calls cost in input. Counted for botmesh only (the baselines'
    /// reply prompts are not built).
    pub(crate) sent_bytes: u64,
    /// Decisions by `action/reason`.
    pub reasons: BTreeMap<String, u64>,
}

impl Tally {
    /// Adds another tally to this one.
    pub fn add(&mut self, o: &Tally) {
        self.runs += o.runs;
        self.runs_with_dup += o.runs_with_dup;
        self.runaway_runs += o.runaway_runs;
        self.human_msgs += o.human_msgs;
        self.bot_posts += o.bot_posts;
        self.dup_interjections += o.dup_interjections;
        self.expected += o.expected;
        self.right_first += o.right_first;
        self.unanswered += o.unanswered;
        self.all_wanted += o.all_wanted;
        self.all_spoke += o.all_spoke;
        self.ttfa.extend_from_slice(&o.ttfa);
        self.longest_chain = self.longest_chain.max(o.longest_chain);
        self.over_max_depth += o.over_max_depth;
        self.judge_human += o.judge_human;
        self.judge_bot += o.judge_bot;
        self.rejudge += o.rejudge;
        self.reply_calls += o.reply_calls;
        self.replies_discarded += o.replies_discarded;
        self.prompt_bytes += o.prompt_bytes;
        self.prompts += o.prompts;
        self.sent_bytes += o.sent_bytes;
        for (k, v) in &o.reasons {
            *self.reasons.entry(k.clone()).or_default() += v;
        }
    }

    fn reason(&mut self, action: &str, reason: &str) {
        *self
            .reasons
            .entry(format!("{action}/{reason}"))
            .or_default() += 1;
    }
}

/// The scenario's network as the outboxes see it: one delivery task per link, one
/// envelope at a time and in order; a dropped attempt is retried after the outbox's
/// backoff. Shared by the baselines' event loop and the botmesh runner.
#[derive(Default)]
struct Network {
    /// (sender, receiver) → when that outbox's delivery task is free again.
    link_free: HashMap<(String, String), u64>,
}

impl Network {
    /// Delay until one envelope from `from` to `to`, queued at `now`, is delivered,
    /// and the network delay of the answer that acknowledges it.
    ///
    /// As the real outbox does (`egress::outbox::Outbox::run`): one delivery task per
    /// peer, one envelope at a time and in order, so an envelope waits for the ones
    /// queued before it (until their answer comes back, one more network delay). A
    /// "dropped" attempt fails: the sender learns it after a round trip and retries
    /// after `RetryPolicy::backoff` (exponential from `retry_base_ms`, capped at
    /// `retry_max_ms`, jitter in [d/2, d]), drawing loss and delay afresh. Nothing
    /// accepted is lost: a drop makes an envelope late, never absent.
    fn delay(
        &mut self,
        w: &World,
        rng: &mut StdRng,
        now: u64,
        from: &str,
        to: &str,
        carry: Carry,
    ) -> (u64, u64) {
        let t = &w.scenario.timing;
        let l = w
            .scenario
            .links
            .iter()
            .rev()
            .find(|l| (l.from == "*" || l.from == from) && (l.to == "*" || l.to == to));
        let p = match carry {
            Carry::Human => l.and_then(|l| l.drop).unwrap_or(t.human_drop),
            Carry::Message => l.and_then(|l| l.drop).unwrap_or(t.drop),
            Carry::Claim => l.and_then(|l| l.claim_drop).unwrap_or(t.claim_drop),
        };
        let dist = l.and_then(|l| l.delay.as_ref()).unwrap_or(&t.network);
        let key = (from.to_string(), to.to_string());
        let mut at = now.max(self.link_free.get(&key).copied().unwrap_or(0));
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let lost = p > 0.0 && rng.gen_bool(p.min(1.0));
            let d = dist.sample(rng);
            if !lost {
                self.link_free.insert(key, at + 2 * d);
                return (at + d - now, d);
            }
            let exp = w
                .mesh
                .retry_base_ms
                .saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
            let b = exp.min(w.mesh.retry_max_ms);
            at += 2 * d + b / 2 + rng.gen_range(0..=b / 2);
        }
    }
}

/// What the scripted judge answers bot `b` about `msg` (`post`: its registry entry);
/// `answered`: the prompt shows another bot's answer to it.
fn scripted_verdict(
    w: &World,
    b: usize,
    msg: &Envelope,
    post: &Post,
    mentioned: bool,
    answered: bool,
) -> Verdict {
    let name = &w.bots[b].name;
    let sm = &w.scenario.messages[post.root];
    let human = msg.author.kind == AuthorKind::Human;
    let table = if human { &sm.judge } else { &sm.bot_judge };
    let addressed_elsewhere = !human && !mentioned && !post.mentioned.is_empty();
    let base = match table.get(name) {
        // A bot message @addressed to another bot is not this bot's to answer.
        _ if addressed_elsewhere => Verdict {
            speak: false,
            relevance: 0.1,
        },
        Some(a) => a.verdict(),
        None if mentioned => MENTIONED_DEFAULT,
        None => Verdict {
            speak: false,
            relevance: 0.0,
        },
    };
    if !answered || mentioned {
        return base;
    }
    match sm.after_answer.get(name).filter(|_| human) {
        Some(a) => a.verdict(),
        None => Verdict {
            speak: false,
            relevance: base.relevance * AFTER_ANSWER_SCALE,
        },
    }
}

/// Bot `b`'s `k`-th reply text in the exchange of human message `root` (to a bot
/// message when `to_bot`): the scenario's, else a plain synthetic answer.
fn reply_text(w: &World, b: usize, root: usize, to_bot: bool, k: usize) -> String {
    let me = &w.bots[b];
    let sm = &w.scenario.messages[root];
    let table = if to_bot { &sm.bot_reply } else { &sm.reply };
    match table.get(&me.name) {
        Some(r) => r.pick(k).to_string(),
        None if w.scenario.lang == "zh" => {
            format!(
                "（{} 的回答）我来补充我这边的看法和做法，第 {} 条。",
                me.name,
                k + 1
            )
        }
        None => format!(
            "{} here: my take on this, with details ({}).",
            me.name,
            k + 1
        ),
    }
}

struct Sim<'w> {
    w: &'w World,
    policy: PolicyKind,
    prompt_bots: Vec<BotSettings>,
    rng: StdRng,
    now: u64,
    queue: BinaryHeap<Reverse<(u64, usize)>>,
    events: Vec<Option<Event>>,
    tasks: Vec<Task>,
    bots: Vec<BotState>,
    posts: Vec<Post>,
    by_id: HashMap<Ulid, usize>,
    net: Network,
    next_id: u128,
    tally: Tally,
    trace: Option<Vec<String>>,
}

/// Runs one scenario once under one policy.
pub fn run_once(w: &World, policy: PolicyKind, seed: u64) -> Tally {
    match policy {
        p if p.is_botmesh() => virtual_mesh::run(w, seed, false, p.judge_mode(), p.drafting()).0,
        _ => Sim::new(w, policy, seed).run().0,
    }
}

/// Runs one scenario once under one policy and returns the event trace too: every
/// message, judge call, claim, wait, yield and decision, in virtual time.
pub fn trace_once(w: &World, policy: PolicyKind, seed: u64) -> (Tally, Vec<String>) {
    if policy.is_botmesh() {
        let (t, lines) = virtual_mesh::run(w, seed, true, policy.judge_mode(), policy.drafting());
        return (t, lines.unwrap_or_default());
    }
    let mut sim = Sim::new(w, policy, seed);
    sim.trace = Some(Vec::new());
    let (t, lines) = sim.run();
    (t, lines.unwrap_or_default())
}

impl<'w> Sim<'w> {
    fn new(w: &'w World, policy: PolicyKind, seed: u64) -> Sim<'w> {
        Sim {
            w,
            policy,
            prompt_bots: w.bots.iter().map(|b| policy.prompt_bot(b)).collect(),
            rng: StdRng::seed_from_u64(seed),
            now: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            tasks: Vec::new(),
            bots: w
                .bots
                .iter()
                .map(|_| BotState {
                    transcript: Vec::new(),
                    arrived: Vec::new(),
                    replies: HashMap::new(),
                })
                .collect(),
            posts: Vec::new(),
            by_id: HashMap::new(),
            net: Network::default(),
            next_id: 1,
            tally: Tally {
                runs: 1,
                ..Tally::default()
            },
            trace: None,
        }
    }

    fn at(&mut self, t: u64, ev: Event) {
        self.events.push(Some(ev));
        self.queue.push(Reverse((t, self.events.len() - 1)));
    }

    fn run(mut self) -> (Tally, Option<Vec<String>>) {
        let sc = &self.w.scenario;
        for (i, m) in sc.messages.iter().enumerate() {
            self.at(m.at, Event::Human(i));
        }
        let end = sc.messages.last().map_or(0, |m| m.at) + sc.timing.horizon_ms;
        while let Some(Reverse((t, seq))) = self.queue.pop() {
            if t > end {
                break;
            }
            if self.tally.bot_posts as usize >= RUNAWAY_POSTS {
                self.tally.runaway_runs = 1;
                self.log(None, |_| format!("stopped: {RUNAWAY_POSTS} bot messages"));
                break;
            }
            self.now = t;
            match self.events[seq].take().expect("each event runs once") {
                Event::Human(i) => self.human(i),
                Event::Deliver { to, env } => self.deliver(to, env),
                Event::Step(id, gen) if self.tasks[id].gen == gen => self.step(id),
                Event::Step(..) => {} // superseded by a later schedule
            }
        }
        let trace = self.trace.take();
        (self.finish(), trace)
    }

    // --- the network -------------------------------------------------------

    /// Delay until one envelope from `from` to `to`, queued now, is delivered.
    fn link(&mut self, from: &str, to: &str, carry: Carry) -> u64 {
        self.net
            .delay(self.w, &mut self.rng, self.now, from, to, carry)
            .0
    }

    fn envelope(&mut self, author: Author, text: String, trigger: Option<&Envelope>) -> Envelope {
        self.next_id += 1;
        let id = Ulid::from_parts(self.now, self.next_id);
        let sender = author.name.clone();
        let mut env = Envelope::message(id, self.now, "sim", sender, author, text);
        if let Some(t) = trigger {
            env.depth = t.depth + 1;
            env.reply_to = Some(t.id);
            env.root = t.root.or(Some(t.id));
        }
        env
    }

    fn register(&mut self, env: Arc<Envelope>, root: usize) {
        register_post(self.w, &mut self.posts, &mut self.by_id, env, root);
    }

    fn post_of(&self, id: &Ulid) -> &Post {
        &self.posts[self.by_id[id]]
    }

    fn human(&mut self, i: usize) {
        let m = &self.w.scenario.messages[i];
        let env = Arc::new(self.envelope(
            Author {
                name: m.from.clone(),
                kind: AuthorKind::Human,
            },
            m.text.clone(),
            None,
        ));
        self.register(env.clone(), i);
        self.log(None, |s| {
            format!("{} {}: {}", s.num(&env.id), env.author.name, env.text)
        });
        for b in 0..self.w.bots.len() {
            let d = self.link(&m.from, &self.w.bots[b].name, Carry::Human);
            self.at(
                self.now + d,
                Event::Deliver {
                    to: b,
                    env: env.clone(),
                },
            );
        }
    }

    /// A message reaches bot `to`: recorded, observed, then considered.
    fn deliver(&mut self, to: usize, env: Arc<Envelope>) {
        let st = &mut self.bots[to];
        st.transcript.push(env.clone());
        st.arrived.push(self.now);
        match self.policy {
            PolicyKind::Botmesh | PolicyKind::BotmeshShared | PolicyKind::BotmeshDrafting => {
                unreachable!("botmesh runs in virtual_mesh")
            }
            PolicyKind::Xiaoba => self.consider_xiaoba(to, env),
            PolicyKind::Nanobot => self.consider_nanobot(to, env),
            PolicyKind::ReviewPanel => self.consider_panel(to, env),
        }
    }

    // --- tasks -------------------------------------------------------------

    fn new_task(&mut self, bot: usize, msg: Arc<Envelope>) -> usize {
        self.tasks.push(Task {
            bot,
            msg,
            stage: Stage::Judge,
            verdict: Verdict {
                speak: false,
                relevance: 0.0,
            },
            wait_start: 0,
            gen: 0,
            done: false,
            failed: false,
        });
        self.tasks.len() - 1
    }

    /// Up to `k` messages before `id` in bot `b`'s transcript (turn::context_before).
    fn context_before(&self, b: usize, id: &Ulid, k: usize) -> Vec<Arc<Envelope>> {
        let t = &self.bots[b].transcript;
        let end = t.iter().position(|e| &e.id == id).unwrap_or(t.len());
        t[end.saturating_sub(k)..end].to_vec()
    }

    /// What the scripted judge answers bot `b` about `msg`, given the prompt's context.
    fn scripted(
        &self,
        b: usize,
        msg: &Envelope,
        context: &[Arc<Envelope>],
        mentioned: bool,
    ) -> Verdict {
        let name = &self.w.bots[b].name;
        let answered = context.iter().any(|e| {
            e.author.kind == AuthorKind::Bot && &e.author.name != name && e.reply_to == Some(msg.id)
        });
        scripted_verdict(self.w, b, msg, self.post_of(&msg.id), mentioned, answered)
    }

    fn start_judge(&mut self, id: usize, context: &[Arc<Envelope>], rejudge: bool) {
        let b = self.tasks[id].bot;
        let msg = self.tasks[id].msg.clone();
        let prompt = build_prompt(&JudgeInput {
            me: &self.prompt_bots[b],
            colleagues: &self.w.colleagues[b],
            context,
            msg: &msg,
        });
        self.tally.prompt_bytes += prompt.len() as u64;
        self.tally.prompts += 1;
        if rejudge {
            self.tally.rejudge += 1;
        } else if msg.author.kind == AuthorKind::Bot {
            self.tally.judge_bot += 1;
        } else {
            self.tally.judge_human += 1;
        }
        let mentioned = self.post_of(&msg.id).mentioned.contains(&b);
        let v = self.scripted(b, &msg, context, mentioned);
        let failed = self.fails(self.w.scenario.timing.judge_fail);
        let t = &mut self.tasks[id];
        t.verdict = v;
        t.failed = failed;
        t.stage = Stage::Judge;
        let lat = self.w.judge_lat[b].sample(&mut self.rng);
        self.log(Some(b), |s| {
            format!(
                "{} {}: speak={} relevance={:.2} in {lat} ms{} ({} B prompt)",
                if rejudge { "re-judges" } else { "judges" },
                s.num(&msg.id),
                v.speak,
                v.relevance,
                if failed { ", FAILS" } else { "" },
                prompt.len()
            )
        });
        self.schedule(id, self.now + lat);
    }

    fn start_reply(&mut self, id: usize) {
        self.tally.reply_calls += 1;
        self.tasks[id].failed = self.fails(self.w.scenario.timing.reply_fail);
        self.tasks[id].stage = Stage::Write;
        let lat = self.w.reply_lat[self.tasks[id].bot].sample(&mut self.rng);
        let (b, trigger, failed) = (
            self.tasks[id].bot,
            self.tasks[id].msg.id,
            self.tasks[id].failed,
        );
        self.log(Some(b), |s| {
            format!(
                "writes a reply to {} ({lat} ms){}",
                s.num(&trigger),
                if failed { ", FAILS" } else { "" }
            )
        });
        self.schedule(id, self.now + lat);
    }

    fn start_wait(&mut self, id: usize, ms: u64) {
        let (b, trigger) = (self.tasks[id].bot, self.tasks[id].msg.id);
        self.log(Some(b), |s| format!("waits {ms} ms on {}", s.num(&trigger)));
        self.tasks[id].stage = Stage::Wait;
        self.tasks[id].wait_start = self.now;
        self.schedule(id, self.now + ms);
    }

    /// Schedules task `id`'s next step at `t`, superseding any step scheduled before.
    fn schedule(&mut self, id: usize, t: u64) {
        self.tasks[id].gen += 1;
        let gen = self.tasks[id].gen;
        self.at(t, Event::Step(id, gen));
    }

    fn fails(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.gen_bool(p.min(1.0))
    }

    fn step(&mut self, id: usize) {
        if self.tasks[id].done {
            return;
        }
        if self.tasks[id].failed {
            // An LLM failure or timeout means silence (docs/design.md step 4; turn.rs).
            match self.tasks[id].stage {
                Stage::Write => self.silent(id, "reply_failed"),
                _ => self.silent(id, "judge_failed"),
            }
            return;
        }
        match self.policy {
            PolicyKind::Botmesh | PolicyKind::BotmeshShared | PolicyKind::BotmeshDrafting => {
                unreachable!("botmesh runs in virtual_mesh")
            }
            PolicyKind::Xiaoba => self.step_xiaoba(id),
            PolicyKind::Nanobot => self.step_nanobot(id),
            PolicyKind::ReviewPanel => self.step_panel(id),
        }
    }

    fn silent(&mut self, id: usize, reason: &str) {
        self.tasks[id].done = true;
        self.note(self.tasks[id].bot, self.tasks[id].msg.id, "silent", reason);
    }

    /// Counts a decision (and traces it).
    fn note(&mut self, b: usize, trigger: Ulid, action: &str, reason: &str) {
        self.tally.reason(action, reason);
        self.log(Some(b), |s| {
            format!("{}: {action}/{reason}", s.num(&trigger))
        });
    }

    /// Adds a trace line, when tracing.
    fn log(&mut self, b: Option<usize>, f: impl FnOnce(&Self) -> String) {
        if self.trace.is_some() {
            let who = b.map_or("", |b| self.w.bots[b].name.as_str());
            let line = format!("{:>7} ms  {who:<8} {}", self.now, f(self));
            if let Some(t) = self.trace.as_mut() {
                t.push(line);
            }
        }
    }

    /// `#k`: the k-th message posted in the run.
    fn num(&self, id: &Ulid) -> String {
        format!("#{}", self.by_id.get(id).copied().unwrap_or(usize::MAX))
    }

    /// Posts bot `b`'s reply to the task's trigger and sends it to every peer.
    fn post(&mut self, id: usize) {
        self.tasks[id].done = true;
        let b = self.tasks[id].bot;
        let trigger = self.tasks[id].msg.clone();
        let root = self.post_of(&trigger.id).root;
        let to_bot = trigger.author.kind == AuthorKind::Bot;
        let k = {
            let c = self.bots[b].replies.entry((root, to_bot)).or_default();
            *c += 1;
            *c - 1
        };
        let text = reply_text(self.w, b, root, to_bot, k);
        let me = &self.w.bots[b];
        let name = me.name.clone();
        let env = Arc::new(self.envelope(
            Author {
                name: name.clone(),
                kind: AuthorKind::Bot,
            },
            text,
            Some(&trigger),
        ));
        self.register(env.clone(), root);
        self.tally.bot_posts += 1;
        self.log(Some(b), |s| {
            format!(
                "{} posts (reply to {}, depth {}): {}",
                s.num(&env.id),
                s.num(&trigger.id),
                env.depth,
                env.text
            )
        });
        let st = &mut self.bots[b];
        st.transcript.push(env.clone());
        st.arrived.push(self.now);
        for p in 0..self.w.bots.len() {
            if p == b {
                continue;
            }
            let d = self.link(&name, &self.w.bots[p].name, Carry::Message);
            self.at(
                self.now + d,
                Event::Deliver {
                    to: p,
                    env: env.clone(),
                },
            );
        }
    }

    fn is_own(&self, b: usize, env: &Envelope) -> bool {
        env.author.kind == AuthorKind::Bot && env.author.name == self.w.bots[b].name
    }

    fn mentioned(&self, b: usize, env: &Envelope) -> (bool, bool) {
        let names = self.w.matcher.mentioned(&env.text, &[]);
        let me = names.iter().any(|n| n == &self.w.bots[b].name);
        (me, !me && !names.is_empty())
    }

    // --- XiaoBa (seed 004) -------------------------------------------------

    fn consider_xiaoba(&mut self, b: usize, env: Arc<Envelope>) {
        if self.is_own(b, &env) {
            return;
        }
        let (mentioned, _) = self.mentioned(b, &env);
        let id = self.new_task(b, env.clone());
        if mentioned {
            // "被@则触发推理": full reasoning at once, no depth limit.
            self.note(b, env.id, "reply", "mentioned");
            return self.start_reply(id);
        }
        // Every broadcast is judged, with the last 5–10 messages as context.
        self.note(b, env.id, "judge", "every_message");
        let ctx = self.context_before(b, &env.id, self.prompt_bots[b].context_messages);
        self.start_judge(id, &ctx, false);
    }

    fn step_xiaoba(&mut self, id: usize) {
        let b = self.tasks[id].bot;
        match self.tasks[id].stage {
            Stage::Judge => {
                if !self.tasks[id].verdict.speak {
                    return self.silent(id, "judge_declined");
                }
                let ms = self.rng.gen_range(1000..=3000);
                self.start_wait(id, ms);
            }
            Stage::Wait => {
                let start = self.tasks[id].wait_start;
                let me = &self.w.bots[b].name;
                let st = &self.bots[b];
                let heard = st.transcript.iter().zip(&st.arrived).any(|(e, at)| {
                    *at > start && e.author.kind == AuthorKind::Bot && &e.author.name != me
                });
                if heard {
                    return self.silent(id, "broadcast_during_wait");
                }
                self.start_reply(id);
            }
            Stage::Write => self.post(id),
        }
    }

    // --- nanobot relay (seed 000) ------------------------------------------

    fn consider_nanobot(&mut self, b: usize, env: Arc<Envelope>) {
        if self.is_own(b, &env) {
            return;
        }
        let (mentioned, _) = self.mentioned(b, &env);
        if env.author.kind == AuthorKind::Human {
            let id = self.new_task(b, env.clone());
            if mentioned {
                self.note(b, env.id, "reply", "mentioned");
                return self.start_reply(id);
            }
            self.note(b, env.id, "judge", "check_relevance");
            let ctx = self.context_before(b, &env.id, self.prompt_bots[b].context_messages);
            return self.start_judge(id, &ctx, false);
        }
        if !mentioned {
            return self.note(b, env.id, "silent", "bot_not_mentioned");
        }
        // Depth = trailing bot messages in the transcript, this one included (§4.2).
        let depth = self.bots[b]
            .transcript
            .iter()
            .rev()
            .take_while(|e| e.author.kind == AuthorKind::Bot)
            .count() as u32;
        let mesh = &self.w.mesh;
        if depth >= mesh.max_depth {
            return self.note(b, env.id, "silent", "max_bot_reply_depth");
        }
        let id = self.new_task(b, env.clone());
        if depth <= mesh.llm_threshold {
            self.note(b, env.id, "reply", "mentioned_shallow");
            return self.start_reply(id);
        }
        self.note(b, env.id, "judge", "mentioned_llm_check");
        let ctx = self.context_before(b, &env.id, self.prompt_bots[b].context_messages);
        self.start_judge(id, &ctx, false);
    }

    fn step_nanobot(&mut self, id: usize) {
        match self.tasks[id].stage {
            Stage::Judge => {
                if self.tasks[id].verdict.speak {
                    self.start_reply(id)
                } else {
                    self.silent(id, "judge_declined")
                }
            }
            Stage::Write => self.post(id),
            Stage::Wait => {
                unreachable!("nanobot never waits")
            }
        }
    }

    // --- review panel (seed 002) -------------------------------------------

    fn consider_panel(&mut self, b: usize, env: Arc<Envelope>) {
        if env.author.kind == AuthorKind::Bot {
            // "来自Agent → 调用finish()": no LLM call at all.
            if !self.is_own(b, &env) {
                self.note(b, env.id, "silent", "ignores_bots");
            }
            return;
        }
        let (mentioned, _) = self.mentioned(b, &env);
        let id = self.new_task(b, env.clone());
        if mentioned {
            self.note(b, env.id, "reply", "mentioned");
            let ms = self.rng.gen_range(2000..=4000);
            return self.start_wait(id, ms);
        }
        self.note(b, env.id, "judge", "should_respond");
        self.start_judge(id, &[], false);
    }

    fn step_panel(&mut self, id: usize) {
        match self.tasks[id].stage {
            Stage::Judge => {
                if !self.tasks[id].verdict.speak {
                    return self.silent(id, "judge_declined");
                }
                let ms = self.rng.gen_range(2000..=4000);
                self.start_wait(id, ms);
            }
            Stage::Wait => self.start_reply(id),
            Stage::Write => self.post(id),
        }
    }

    // --- measuring ---------------------------------------------------------

    fn finish(self) -> Tally {
        measure(self.w, &self.posts, self.tally)
    }
}

/// Adds the measures of one run (its posts, in order) to its tally.
fn measure(w: &World, posts: &[Post], mut tally: Tally) -> Tally {
    let mut replies: HashMap<Ulid, Vec<usize>> = HashMap::new();
    for (i, p) in posts.iter().enumerate() {
        if let Some(t) = p.env.reply_to {
            replies.entry(t).or_default().push(i);
        }
    }
    let bot_index = |name: &str| w.bots.iter().position(|b| b.name == name);
    let mut dup = 0u64;
    for p in posts {
        let human = p.env.author.kind == AuthorKind::Human;
        let sm = &w.scenario.messages[p.root];
        if !human {
            tally.longest_chain = tally.longest_chain.max(p.env.depth);
            if p.env.depth > w.mesh.max_depth {
                tally.over_max_depth += 1;
            }
        } else {
            tally.human_msgs += 1;
        }
        let rs: Vec<usize> = replies
            .get(&p.env.id)
            .map(|v| {
                v.iter()
                    .filter_map(|i| bot_index(&posts[*i].env.author.name))
                    .collect()
            })
            .unwrap_or_default();
        let want = if human { sm.want } else { Want::One };
        if want == Want::One {
            let mentioned_spoke = rs.iter().any(|b| p.mentioned.contains(b));
            let unmentioned = rs.iter().filter(|b| !p.mentioned.contains(b)).count() as u64;
            dup += if mentioned_spoke {
                unmentioned
            } else {
                unmentioned.saturating_sub(1)
            };
        }
        if !human {
            continue;
        }
        if let Some(first) = replies.get(&p.env.id).and_then(|v| v.first()) {
            tally.ttfa.push(posts[*first].env.sent_at - p.env.sent_at);
        }
        let speakers: Vec<(usize, f64)> = sm
            .judge
            .iter()
            .filter_map(|(n, a)| {
                let v = a.verdict();
                (v.speak).then(|| (bot_index(n).expect("checked"), v.relevance))
            })
            .collect();
        match want {
            Want::One => {
                let expected: Vec<usize> = if !p.mentioned.is_empty() {
                    p.mentioned.clone()
                } else {
                    let best = speakers.iter().map(|s| s.1).fold(f64::MIN, f64::max);
                    speakers
                        .iter()
                        .filter(|s| s.1 == best)
                        .map(|s| s.0)
                        .collect()
                };
                if expected.is_empty() {
                    continue;
                }
                tally.expected += 1;
                match rs.first() {
                    None => tally.unanswered += 1,
                    Some(b) if expected.contains(b) => tally.right_first += 1,
                    Some(_) => {}
                }
            }
            Want::All => {
                tally.all_wanted += speakers.len() as u64;
                tally.all_spoke += speakers.iter().filter(|s| rs.contains(&s.0)).count() as u64;
            }
        }
    }
    tally.dup_interjections = dup;
    tally.runs_with_dup = u64::from(dup > 0);
    tally
}

// ---------------------------------------------------------------------------
// Many runs, and the report
// ---------------------------------------------------------------------------

/// The measures of one policy over a set of runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Metrics {
    /// Runs (scenarios × seeds).
    pub(crate) runs: u64,
    /// Human messages over all runs.
    pub(crate) human_messages: u64,
    /// Duplicate interjections per human message.
    pub dup_per_human_msg: f64,
    /// Share of runs with at least one duplicate, %.
    pub(crate) runs_with_dup_pct: f64,
    /// One-answer human messages whose first answer came from the right bot, %.
    pub(crate) right_bot_first_pct: Option<f64>,
    /// One-answer human messages that needed an answer and got none, %.
    pub(crate) unanswered_pct: Option<f64>,
    /// "Everyone" messages: share of the bots with something to say that spoke, %.
    pub(crate) want_all_coverage_pct: Option<f64>,
    /// Time to first answer, median, virtual ms.
    pub ttfa_p50_ms: Option<u64>,
    /// Time to first answer, 95th percentile, virtual ms.
    pub(crate) ttfa_p95_ms: Option<u64>,
    /// Deepest bot-only chain (bot turns since the last human).
    pub(crate) longest_chain: u32,
    /// Bot messages deeper than `max_depth`.
    pub(crate) over_max_depth: u64,
    /// Runs stopped as runaway loops.
    pub(crate) runaway_runs: u64,
    /// LLM calls (judge + re-judge + reply) per human message.
    pub(crate) llm_calls_per_human_msg: f64,
    /// Judge calls about human messages, per human message.
    pub(crate) judge_human_per_msg: f64,
    /// Judge calls about bot messages, per human message.
    pub(crate) judge_bot_per_msg: f64,
    /// Re-judges, per human message.
    pub(crate) rejudge_per_msg: f64,
    /// Reply calls, per human message.
    pub(crate) reply_per_msg: f64,
    /// Reply calls thrown away at the last check, per human message.
    pub(crate) discarded_per_msg: f64,
    /// Bot messages per human message.
    pub(crate) bot_posts_per_msg: f64,
    /// Mean judge prompt size, bytes.
    pub(crate) judge_prompt_bytes_mean: Option<f64>,
    /// Prompt bytes of every LLM call per human message (botmesh only).
    pub(crate) prompt_bytes_per_human_msg: Option<f64>,
    /// Decisions by action/reason, summed.
    pub(crate) reasons: BTreeMap<String, u64>,
}

fn pct(n: u64, d: u64) -> Option<f64> {
    (d > 0).then(|| 100.0 * n as f64 / d as f64)
}

fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

impl Metrics {
    /// Turns raw counts into the reported measures.
    pub(crate) fn from_tally(t: &Tally) -> Metrics {
        let h = t.human_msgs.max(1) as f64;
        let mut ttfa = t.ttfa.clone();
        ttfa.sort_unstable();
        let per = |x: u64| x as f64 / h;
        Metrics {
            runs: t.runs,
            human_messages: t.human_msgs,
            dup_per_human_msg: per(t.dup_interjections),
            runs_with_dup_pct: pct(t.runs_with_dup, t.runs).unwrap_or(0.0),
            right_bot_first_pct: pct(t.right_first, t.expected),
            unanswered_pct: pct(t.unanswered, t.expected),
            want_all_coverage_pct: pct(t.all_spoke, t.all_wanted),
            ttfa_p50_ms: percentile(&ttfa, 50.0),
            ttfa_p95_ms: percentile(&ttfa, 95.0),
            longest_chain: t.longest_chain,
            over_max_depth: t.over_max_depth,
            runaway_runs: t.runaway_runs,
            llm_calls_per_human_msg: per(t.judge_human + t.judge_bot + t.rejudge + t.reply_calls),
            judge_human_per_msg: per(t.judge_human),
            judge_bot_per_msg: per(t.judge_bot),
            rejudge_per_msg: per(t.rejudge),
            reply_per_msg: per(t.reply_calls),
            discarded_per_msg: per(t.replies_discarded),
            bot_posts_per_msg: per(t.bot_posts),
            judge_prompt_bytes_mean: (t.prompts > 0)
                .then(|| t.prompt_bytes as f64 / t.prompts as f64),
            prompt_bytes_per_human_msg: (t.sent_bytes > 0).then(|| per(t.sent_bytes)),
            reasons: t.reasons.clone(),
        }
    }
}

/// One policy's measures.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PolicyMetrics {
    /// The policy.
    pub(crate) policy: PolicyKind,
    /// Its measures.
    pub(crate) metrics: Metrics,
}

/// Measures of every policy over a set of scenarios.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Section {
    /// "overall", a group name or a scenario name.
    pub(crate) name: String,
    /// The scenario group (for a scenario section).
    pub(crate) group: String,
    /// Scenarios counted.
    pub(crate) scenarios: usize,
    /// One entry per policy run.
    pub(crate) policies: Vec<PolicyMetrics>,
}

impl Section {
    /// The measures of `p`, if it was run.
    pub fn get(&self, p: PolicyKind) -> Option<&Metrics> {
        self.policies
            .iter()
            .find(|m| m.policy == p)
            .map(|m| &m.metrics)
    }
}

/// A target botmesh's policy is held to, and whether it was met.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Target {
    /// The target.
    pub target: String,
    /// Met or not.
    pub met: bool,
    /// The numbers behind the verdict.
    pub detail: String,
}

/// Everything one `botmesh simulate` computed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// Base seed.
    pub(crate) seed: u64,
    /// Runs per scenario and policy.
    pub(crate) runs: usize,
    /// All scenarios together.
    pub overall: Section,
    /// Per scenario group.
    pub(crate) groups: Vec<Section>,
    /// Per scenario.
    pub(crate) scenarios: Vec<Section>,
    /// botmesh's targets (empty when botmesh was not run).
    pub targets: Vec<Target>,
    /// Scenario summaries (name, group, lang, bots, messages, description).
    pub(crate) catalogue: Vec<ScenarioInfo>,
    /// botmesh with one mechanism turned off at a time (empty when botmesh was not run).
    pub(crate) ablations: Vec<Ablation>,
    /// The headline measures of botmesh (both modes) and nanobot at several seeds.
    pub(crate) seeds: Vec<SeedRow>,
}

/// botmesh over every scenario with one mechanism turned off.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Ablation {
    /// What was turned off, and how (the setting).
    pub(crate) name: String,
    /// All scenarios together.
    pub(crate) metrics: Metrics,
}

/// One policy's overall measures at one base seed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SeedRow {
    /// The base seed.
    pub(crate) seed: u64,
    /// The policy.
    pub(crate) policy: PolicyKind,
    /// All scenarios together.
    pub(crate) metrics: Metrics,
}

/// A mechanism turned off: its name and the setting every bot gets for it.
type Knockout = (&'static str, fn(&mut BotSettings));

/// The mechanisms the report measures by turning each off, as settings every bot gets.
const ABLATIONS: [Knockout; 3] = [
    ("no writing while waiting (`write_early = false`)", |b| {
        b.write_early = false
    }),
    (
        "no waiting for a judging peer's word (`judge_word_timeout_ms = 0`)",
        |b| b.judge_word_timeout_ms = 0,
    ),
    (
        "no claim acknowledgements (`claim_ack_timeout_ms = 0`)",
        |b| b.claim_ack_timeout_ms = 0,
    ),
];

/// The base seeds the report's seed table covers (besides the report's own).
const MORE_SEEDS: [u64; 4] = [2, 3, 8, 13];

/// Every scenario under `policy`, its tallies summed: the overall measures.
fn overall_of(worlds: &[World], policy: PolicyKind, seed: u64, runs: usize) -> Metrics {
    let mut t = Tally::default();
    for w in worlds {
        t.add(&run_many(w, policy, seed, runs));
    }
    Metrics::from_tally(&t)
}

/// botmesh (own judge) with each of [`ABLATIONS`] applied to every bot.
fn ablations(worlds: &[World], seed: u64, runs: usize) -> Vec<Ablation> {
    ABLATIONS
        .iter()
        .map(|(name, off)| {
            let changed: Vec<World> = worlds
                .iter()
                .map(|w| {
                    let mut w = w.clone();
                    w.bots.iter_mut().for_each(off);
                    w
                })
                .collect();
            Ablation {
                name: name.to_string(),
                metrics: overall_of(&changed, PolicyKind::Botmesh, seed, runs),
            }
        })
        .collect()
}

/// botmesh in each judge mode and nanobot at the report's seed and [`MORE_SEEDS`].
fn seed_rows(worlds: &[World], overall: &Section, seed: u64, runs: usize) -> Vec<SeedRow> {
    let mut rows = Vec::new();
    for s in std::iter::once(seed).chain(MORE_SEEDS.into_iter().filter(|s| *s != seed)) {
        for policy in [
            PolicyKind::Botmesh,
            PolicyKind::BotmeshDrafting,
            PolicyKind::BotmeshShared,
            PolicyKind::Nanobot,
        ] {
            let metrics = match overall.get(policy) {
                Some(m) if s == seed => m.clone(),
                _ => overall_of(worlds, policy, s, runs),
            };
            rows.push(SeedRow {
                seed: s,
                policy,
                metrics,
            });
        }
    }
    rows
}

/// A line of the scenario catalogue.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ScenarioInfo {
    /// Name.
    pub(crate) name: String,
    /// Group.
    pub(crate) group: String,
    /// Language.
    pub(crate) lang: String,
    /// Number of bots.
    pub(crate) bots: usize,
    /// Number of human messages.
    pub(crate) messages: usize,
    /// What it exercises.
    pub(crate) description: String,
    /// It loses claims or messages on the network.
    pub(crate) lossy: bool,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The seed of run `run` of `scenario` (the same for every policy, so policies
/// meet the same latencies as far as their event orders allow).
pub fn run_seed(seed: u64, scenario: &str, run: usize) -> u64 {
    splitmix(seed ^ splitmix(fnv(scenario) ^ splitmix(run as u64)))
}

/// Sums `runs` runs of one scenario under one policy.
pub fn run_many(w: &World, policy: PolicyKind, seed: u64, runs: usize) -> Tally {
    let mut t = Tally::default();
    for r in 0..runs {
        t.add(&run_once(w, policy, run_seed(seed, &w.scenario.name, r)));
    }
    t
}

/// Runs every scenario under every policy and gathers the report.
pub fn simulate(worlds: &[World], policies: &[PolicyKind], seed: u64, runs: usize) -> Report {
    let mut per: Vec<Vec<Tally>> = Vec::new();
    for w in worlds {
        per.push(
            policies
                .iter()
                .map(|p| run_many(w, *p, seed, runs))
                .collect(),
        );
    }
    let section = |name: &str, group: &str, idx: &[usize]| Section {
        name: name.into(),
        group: group.into(),
        scenarios: idx.len(),
        policies: policies
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let mut t = Tally::default();
                for i in idx {
                    t.add(&per[*i][k]);
                }
                PolicyMetrics {
                    policy: *p,
                    metrics: Metrics::from_tally(&t),
                }
            })
            .collect(),
    };
    let all: Vec<usize> = (0..worlds.len()).collect();
    let mut group_names: Vec<&str> = worlds.iter().map(|w| w.scenario.group.as_str()).collect();
    group_names.sort_unstable();
    group_names.dedup();
    let groups = group_names
        .iter()
        .map(|g| {
            let idx: Vec<usize> = all
                .iter()
                .copied()
                .filter(|i| worlds[*i].scenario.group == *g)
                .collect();
            section(g, g, &idx)
        })
        .collect();
    let scenarios: Vec<Section> = worlds
        .iter()
        .enumerate()
        .map(|(i, w)| section(&w.scenario.name, &w.scenario.group, &[i]))
        .collect();
    let overall = section("overall", "", &all);
    let targets = targets(&overall, worlds, &scenarios);
    let with_botmesh = policies.contains(&PolicyKind::Botmesh);
    let (ablations, seeds) = if with_botmesh && policies.len() == PolicyKind::ALL.len() {
        (
            ablations(worlds, seed, runs),
            seed_rows(worlds, &overall, seed, runs),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    Report {
        ablations,
        seeds,
        seed,
        runs,
        overall,
        groups,
        scenarios,
        targets,
        catalogue: worlds
            .iter()
            .map(|w| ScenarioInfo {
                name: w.scenario.name.clone(),
                group: w.scenario.group.clone(),
                lang: w.scenario.lang.clone(),
                bots: w.bots.len(),
                messages: w.scenario.messages.len(),
                description: w.scenario.description.clone(),
                lossy: {
                    let t = &w.scenario.timing;
                    t.drop > 0.0
                        || t.claim_drop > 0.0
                        || w.scenario.links.iter().any(|l| {
                            l.drop.is_some_and(|p| p > 0.0) || l.claim_drop.is_some_and(|p| p > 0.0)
                        })
                },
            })
            .collect(),
    }
}

fn targets(overall: &Section, worlds: &[World], scenarios: &[Section]) -> Vec<Target> {
    let Some(bm) = overall.get(PolicyKind::Botmesh) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let dup_scen: Vec<&str> = scenarios
        .iter()
        .filter(|s| {
            s.get(PolicyKind::Botmesh)
                .is_some_and(|m| m.dup_per_human_msg > 0.0)
        })
        .map(|s| s.name.as_str())
        .collect();
    out.push(Target {
        target: "zero duplicate interjections where one bot suffices".into(),
        met: bm.dup_per_human_msg == 0.0,
        detail: format!(
            "{:.3} per human message; runs with a duplicate {:.1}%{}",
            bm.dup_per_human_msg,
            bm.runs_with_dup_pct,
            if dup_scen.is_empty() {
                String::new()
            } else {
                format!(" (in {})", dup_scen.join(", "))
            }
        ),
    });
    let right = bm.right_bot_first_pct.unwrap_or(100.0);
    out.push(Target {
        target: "the most relevant (or mentioned) bot answers ≥ 95%".into(),
        met: right >= 95.0,
        detail: format!(
            "{right:.1}% answered first by the right bot; {:.1}% unanswered",
            bm.unanswered_pct.unwrap_or(0.0)
        ),
    });
    let lo = worlds.iter().map(|w| w.mesh.max_depth).min().unwrap_or(0);
    let hi = worlds.iter().map(|w| w.mesh.max_depth).max().unwrap_or(0);
    let max_depth = if lo == hi {
        format!("max_depth {hi}")
    } else {
        format!("max_depth {lo}–{hi}")
    };
    if let Some(nano) = overall.get(PolicyKind::Nanobot).and_then(|m| m.ttfa_p50_ms) {
        for (policy, mode) in [
            (PolicyKind::Botmesh, "own judge"),
            (PolicyKind::BotmeshDrafting, "own drafting judge"),
            (PolicyKind::BotmeshShared, "shared judge"),
        ] {
            if let Some(p50) = overall.get(policy).and_then(|m| m.ttfa_p50_ms) {
                out.push(Target {
                    target: format!("first answer p50 no later than nanobot's ({mode})"),
                    met: p50 <= nano,
                    detail: format!("{p50} ms against nanobot's {nano} ms"),
                });
            }
        }
    }
    for (policy, mode, most) in [
        (PolicyKind::Botmesh, "own judge", 4.81),
        (PolicyKind::BotmeshDrafting, "own drafting judge", 4.81),
        (PolicyKind::BotmeshShared, "shared judge", 2.0),
    ] {
        if let Some(m) = overall.get(policy) {
            out.push(Target {
                target: format!(
                    "at most {most:.2} LLM calls per human message, discarded replies included ({mode})"
                ),
                met: m.llm_calls_per_human_msg <= most,
                detail: format!(
                    "{:.2} ({:.2} discarded replies)",
                    m.llm_calls_per_human_msg, m.discarded_per_msg
                ),
            });
        }
    }
    out.push(Target {
        target: "no bot-only chain longer than max_depth".into(),
        met: bm.over_max_depth == 0,
        detail: format!(
            "longest chain {} ({}); {} bot messages past their scenario's max_depth",
            bm.longest_chain, max_depth, bm.over_max_depth
        ),
    });
    let baselines: Vec<&PolicyMetrics> = overall
        .policies
        .iter()
        .filter(|p| !p.policy.is_botmesh())
        .collect();
    if !baselines.is_empty() {
        let worse: Vec<String> = baselines
            .iter()
            .filter(|p| p.metrics.llm_calls_per_human_msg <= bm.llm_calls_per_human_msg)
            .map(|p| {
                format!(
                    "{} {:.2}",
                    p.policy.as_str(),
                    p.metrics.llm_calls_per_human_msg
                )
            })
            .collect();
        out.push(Target {
            target: "fewer LLM calls per human message than every baseline".into(),
            met: worse.is_empty(),
            detail: if worse.is_empty() {
                format!("botmesh {:.2}", bm.llm_calls_per_human_msg)
            } else {
                format!(
                    "botmesh {:.2}; not fewer than: {}",
                    bm.llm_calls_per_human_msg,
                    worse.join(", ")
                )
            },
        });
    }
    out
}

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

fn opt_pct(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.1}%"))
}

fn opt_ms(x: Option<u64>) -> String {
    x.map_or("–".into(), |v| format!("{v}"))
}

fn chain(m: &Metrics) -> String {
    if m.runaway_runs > 0 {
        format!("{}+ ({} runaway)", m.longest_chain, m.runaway_runs)
    } else {
        m.longest_chain.to_string()
    }
}

/// The headline table: one row per policy.
pub fn headline_table(s: &Section) -> String {
    let mut out = String::from(
        "| policy | dup. interjections / human msg | runs with a dup. | right bot first | unanswered | first answer p50 / p95 (ms) | longest bot chain | LLM calls / human msg (judge + reply) | judge prompt bytes (mean) |\n\
|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in &s.policies {
        let m = &p.metrics;
        let judge = m.judge_human_per_msg + m.judge_bot_per_msg + m.rejudge_per_msg;
        let _ = writeln!(
            out,
            "| {} | {:.3} | {:.1}% | {} | {} | {} / {} | {} | {:.2} ({:.2} + {:.2}) | {} |",
            p.policy.as_str(),
            m.dup_per_human_msg,
            m.runs_with_dup_pct,
            opt_pct(m.right_bot_first_pct),
            opt_pct(m.unanswered_pct),
            opt_ms(m.ttfa_p50_ms),
            opt_ms(m.ttfa_p95_ms),
            chain(m),
            m.llm_calls_per_human_msg,
            judge,
            m.reply_per_msg,
            m.judge_prompt_bytes_mean
                .map_or("–".into(), |b| format!("{b:.0}")),
        );
    }
    out
}

/// One row of the mechanism and seed tables: the measures the targets are about.
fn measures_cells(m: &Metrics) -> String {
    format!(
        "{:.3} | {} | {} | {} / {} | {:.2} ({:.2} discarded)",
        m.dup_per_human_msg,
        opt_pct(m.right_bot_first_pct),
        opt_pct(m.unanswered_pct),
        opt_ms(m.ttfa_p50_ms),
        opt_ms(m.ttfa_p95_ms),
        m.llm_calls_per_human_msg,
        m.discarded_per_msg,
    )
}

/// botmesh with each mechanism on, one turned off at a time, and the shared judge.
fn mechanism_table(r: &Report) -> String {
    let Some(bm) = r.overall.get(PolicyKind::Botmesh) else {
        return String::new();
    };
    if r.ablations.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n### What each mechanism buys (all scenarios, one turned off at a time)\n\n\
| botmesh | dup. / human msg | right bot first | unanswered | first answer p50 / p95 (ms) | LLM calls / human msg |\n\
|---|---:|---:|---:|---:|---:|\n",
    );
    let _ = writeln!(
        out,
        "| everything on (own judge) | {} |",
        measures_cells(bm)
    );
    for a in &r.ablations {
        let _ = writeln!(out, "| {} | {} |", a.name, measures_cells(&a.metrics));
    }
    if let Some(sh) = r.overall.get(PolicyKind::BotmeshShared) {
        let _ = writeln!(
            out,
            "| shared judge (`[mesh] judge = \"shared\"`) | {} |",
            measures_cells(sh)
        );
    }
    out
}

/// The headline measures at several base seeds.
fn seed_table(r: &Report) -> String {
    if r.seeds.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n### The same measures at other seeds (50 runs of every scenario each)\n\n\
| seed | policy | dup. / human msg | right bot first | unanswered | first answer p50 / p95 (ms) | LLM calls / human msg |\n\
|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for row in &r.seeds {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            row.seed,
            row.policy.as_str(),
            measures_cells(&row.metrics)
        );
    }
    out
}

fn group_table(groups: &[Section]) -> String {
    let mut out = String::from(
        "| group | policy | dup. / human msg | right bot first | unanswered | \"everyone\" coverage | first answer p50 / p95 (ms) | longest chain | LLM calls / human msg | prompt bytes |\n\
|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for g in groups {
        for (i, p) in g.policies.iter().enumerate() {
            let m = &p.metrics;
            let _ = writeln!(
                out,
                "| {} | {} | {:.3} | {} | {} | {} | {} / {} | {} | {:.2} | {} |",
                if i == 0 {
                    format!("**{}** ({})", g.name, g.scenarios)
                } else {
                    String::new()
                },
                p.policy.as_str(),
                m.dup_per_human_msg,
                opt_pct(m.right_bot_first_pct),
                opt_pct(m.unanswered_pct),
                opt_pct(m.want_all_coverage_pct),
                opt_ms(m.ttfa_p50_ms),
                opt_ms(m.ttfa_p95_ms),
                chain(m),
                m.llm_calls_per_human_msg,
                m.judge_prompt_bytes_mean
                    .map_or("–".into(), |b| format!("{b:.0}")),
            );
        }
    }
    out
}

fn scenario_table(scenarios: &[Section]) -> String {
    let pols: Vec<PolicyKind> = scenarios
        .first()
        .map(|s| s.policies.iter().map(|p| p.policy).collect())
        .unwrap_or_default();
    let mut out = String::from("| scenario | group |");
    for p in &pols {
        let _ = write!(out, " {} dup / right / chain / calls |", p.as_str());
    }
    out.push_str("\n|---|---|");
    for _ in &pols {
        out.push_str("---|");
    }
    out.push('\n');
    for s in scenarios {
        let _ = write!(out, "| {} | {} |", s.name, s.group);
        for p in &s.policies {
            let m = &p.metrics;
            let _ = write!(
                out,
                " {:.2} / {} / {} / {:.1} |",
                m.dup_per_human_msg,
                m.right_bot_first_pct
                    .map_or("–".into(), |v| format!("{v:.0}%")),
                chain(m),
                m.llm_calls_per_human_msg
            );
        }
        out.push('\n');
    }
    out
}

fn breakdown_table(s: &Section) -> String {
    let mut out = String::from(
        "| policy | judge: human msgs | judge: bot msgs | re-judge | reply calls | of which discarded | bot messages posted |\n\
|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in &s.policies {
        let m = &p.metrics;
        let _ = writeln!(
            out,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            p.policy.as_str(),
            m.judge_human_per_msg,
            m.judge_bot_per_msg,
            m.rejudge_per_msg,
            m.reply_per_msg,
            m.discarded_per_msg,
            m.bot_posts_per_msg
        );
    }
    out
}

/// The whole `docs/turn-taking.md`, from a report.
pub fn render_doc(r: &Report) -> String {
    let mut d = String::new();
    let _ = write!(
        d,
        "# Turn-taking: botmesh against earlier policies, simulated\n\n\
<!-- Generated by `botmesh simulate --seed {seed} --runs {runs} --write-doc docs/turn-taking.md`. \
Do not edit by hand: change the simulator or the scenarios and regenerate. -->\n\n\
Generated by `botmesh simulate --seed {seed} --runs {runs} --write-doc docs/turn-taking.md` \
({n} scenarios in `scenarios/`, each run {runs} times per policy with seeds derived from {seed}; \
the same command gives the same file).\n\n",
        seed = r.seed,
        runs = r.runs,
        n = r.catalogue.len()
    );
    d.push_str(DOC_METHOD);
    let _ = write!(
        d,
        "\n## Results: all scenarios\n\n{}\n",
        headline_table(&r.overall)
    );
    if !r.targets.is_empty() {
        d.push_str(
            "\n### botmesh against its targets\n\n| target | met | numbers |\n|---|---|---|\n",
        );
        for t in &r.targets {
            let _ = writeln!(
                d,
                "| {} | {} | {} |",
                t.target,
                if t.met { "yes" } else { "**no**" },
                t.detail
            );
        }
    }
    let _ = write!(
        d,
        "\n### Where the LLM calls go (per human message)\n\n{}",
        breakdown_table(&r.overall)
    );
    if let Some(bm) = r.overall.get(PolicyKind::Botmesh) {
        d.push_str(
            "\n### botmesh's decisions (all runs)\n\n| action/reason | count |\n|---|---:|\n",
        );
        for (k, v) in &bm.reasons {
            let _ = writeln!(d, "| {k} | {v} |");
        }
    }
    d.push_str(&mechanism_table(r));
    d.push_str(&seed_table(r));
    d.push_str(&findings(r));
    let _ = write!(
        d,
        "\n## Results per scenario group\n\n{}",
        group_table(&r.groups)
    );
    let _ = write!(
        d,
        "\n## Results per scenario\n\nEach cell: duplicate interjections per human message / right bot first / longest chain / LLM calls per human message.\n\n{}",
        scenario_table(&r.scenarios)
    );
    d.push_str("\n## The scenarios\n\n| scenario | group | lang | bots | human msgs | what it exercises |\n|---|---|---|---:|---:|---|\n");
    for s in &r.catalogue {
        let _ = writeln!(
            d,
            "| {} | {} | {} | {} | {} | {} |",
            s.name,
            s.group,
            s.lang,
            s.bots,
            s.messages,
            s.description.replace('|', "\\|")
        );
    }
    d.push_str(DOC_FORMAT);
    d
}

/// Data-driven observations: only what the numbers of this report support.
fn findings(r: &Report) -> String {
    let mut d = String::from("\n### Findings\n\n");
    let Some(bm) = r.overall.get(PolicyKind::Botmesh) else {
        d.push_str("botmesh was not run.\n");
        return d;
    };
    let reason = |k: &str| bm.reasons.get(k).copied().unwrap_or(0);
    let info = |name: &str| r.catalogue.iter().find(|c| c.name == name);
    for t in r.targets.iter().filter(|t| !t.met) {
        let _ = writeln!(d, "- **Missed: {}** — {}.", t.target, t.detail);
    }

    // Duplicates.
    let dup_scen: Vec<&Section> = r
        .scenarios
        .iter()
        .filter(|s| {
            s.get(PolicyKind::Botmesh)
                .is_some_and(|m| m.dup_per_human_msg > 0.0)
        })
        .collect();
    if !dup_scen.is_empty() {
        let all_lossy = dup_scen
            .iter()
            .all(|s| info(&s.name).is_some_and(|c| c.lossy));
        let _ = writeln!(
            d,
            "- botmesh's duplicates all come from {}. A bot posts an interjection only once its claim has reached every \
peer, so a late claim cannot land after the peer's answer, except when the acknowledgements do not all come back \
within `claim_ack_timeout_ms`: the bot then posts anyway (`post/claim_unacked`: {} times), and a claim still in \
transit can meet the other bot's answer.",
            if all_lossy {
                "scenarios that lose claims or messages"
            } else {
                "these scenarios (not all of them lossy)"
            },
            reason("post/claim_unacked")
        );
    } else {
        let network = r
            .groups
            .iter()
            .find(|g| g.name == "network")
            .and_then(|g| g.get(PolicyKind::Botmesh))
            .and_then(|m| m.right_bot_first_pct);
        let _ = writeln!(
            d,
            "- botmesh posted no duplicate interjection in any run. Under loss a claim can need several retries \
(200, 400, 800 ms …) and arrive late; what keeps a late claim from producing a second answer is the claim's \
acknowledgement: a bot posts an interjection only once its own claim has reached every peer, and then commits \
on its board in one step with the last check (`ClaimBoard::commit`). A peer that committed first says so in its \
acknowledgement, and the bot throws its written reply away (`yield_writing/already_answered`, which also counts \
answers heard as messages while writing: {} times); a \
better claim that arrived before the commit makes it stand by with its reply (`yield_writing/better_claim`: {} \
times). A claim that a lossy link dropped comes on a retry, so the bot waits for the acknowledgement of every \
peer whose link works, past `claim_ack_timeout_ms` (up to four times it); only a peer whose link has failed for \
the whole timeout is not waited for ({} posts went out that way, `post/claim_unacked`; none made a duplicate). \
The price is the ranking under loss: when the more relevant bot's claim is the late one, the less relevant bot \
may commit first and answer alone{}.",
            reason("yield_writing/already_answered"),
            reason("yield_writing/better_claim"),
            reason("post/claim_unacked"),
            network.map_or(String::new(), |p| format!(
                " (right bot first in the network group: {p:.1}%)"
            ))
        );
    }

    // Right bot first, per group.
    let weak: Vec<String> = r
        .groups
        .iter()
        .filter_map(|g| {
            let m = g.get(PolicyKind::Botmesh)?;
            let right = m.right_bot_first_pct?;
            (right < 95.0).then(|| {
                format!(
                    "{} {right:.1}% (unanswered {:.1}%)",
                    g.name,
                    m.unanswered_pct.unwrap_or(0.0)
                )
            })
        })
        .collect();
    if !weak.is_empty() {
        let _ = writeln!(
            d,
            "- Groups where botmesh's right-bot-first rate is below 95%: {}.",
            weak.join("; ")
        );
    }
    let words = reason("withdraw/after_judging");
    let _ = writeln!(
        d,
        "- A slow judge keeps its rank: a node whose judge about the trigger is still out (or that has not applied \
its rules to it yet) answers a peer's claim `judging`, and the claimant waits for that node's word before it \
commits — its claim (then it stands by behind a better one) or, if it declines, a withdrawal sent to the claimants \
alone ({words} such withdrawals over all runs: one envelope to a waiting claimant, never a round per bot). \
`network-en-slow-judge` shows it: {}% right bot first with heavy-tailed judge latency. Words that never came in \
`judge_word_timeout_ms`: {}.",
        r.scenarios
            .iter()
            .find(|s| s.name == "network-en-slow-judge")
            .and_then(|s| s.get(PolicyKind::Botmesh))
            .and_then(|m| m.right_bot_first_pct)
            .map_or("–".to_string(), |p| format!("{p:.1}")),
        reason("post/judge_word_missing")
    );
    let withdrawn = reason("withdraw/claim");
    if withdrawn > 0 {
        let _ = writeln!(
            d,
            "- A yield is not final: a winner that fails to answer after others stood by behind its claim (reply call \
failed, re-judge declined, a hard rule at the last check) withdraws it ({withdrawn} withdrawals over all runs), and \
the best bot still standing by re-enters after a grace of a quarter of its delay ({} re-entries). botmesh leaves \
{:.1}% of the questions that needed an answer unanswered overall{}: what remains are runs where the calls \
(judge or reply) of every relevant bot failed. When the best bot's call fails and the next best answers, the \
question is answered but not by the most relevant bot, which is why the failures group stays below 95% on \
\"right bot first\" (`--trace failures-en-winner-fails`).",
            reason("resume/claim_withdrawn"),
            bm.unanswered_pct.unwrap_or(0.0),
            r.groups
                .iter()
                .find(|g| g.name == "failures")
                .and_then(|g| g.get(PolicyKind::Botmesh))
                .and_then(|m| m.unanswered_pct)
                .map_or(String::new(), |u| format!(" and {u:.1}% in the failures group"))
        );
    }

    // LLM calls.
    let cheaper: Vec<&PolicyMetrics> = r
        .overall
        .policies
        .iter()
        .filter(|p| {
            !p.policy.is_botmesh()
                && p.metrics.llm_calls_per_human_msg <= bm.llm_calls_per_human_msg
        })
        .collect();
    if !cheaper.is_empty() {
        let names: Vec<String> = cheaper
            .iter()
            .map(|p| {
                format!(
                    "{} {:.2} ({:.2} judge on bot messages, {:.2} replies)",
                    p.policy.as_str(),
                    p.metrics.llm_calls_per_human_msg,
                    p.metrics.judge_bot_per_msg,
                    p.metrics.reply_per_msg
                )
            })
            .collect();
        let _ = writeln!(
            d,
            "- Why botmesh is not the cheapest: every bot reply is judged by every other bot it does not address \
(`interject_check` applies to bot messages too when `reply_to = \"all\"`), so each bot message costs up to n − 1 \
judge calls: {:.2} per human message here, plus {:.2} re-judges. Cheaper: {}. Those baselines never judge \
unmentioned bot messages, so they can never interject on them either. Without the judge calls on bot messages \
botmesh would make {:.2} calls per human message.",
            bm.judge_bot_per_msg,
            bm.rejudge_per_msg,
            names.join("; "),
            bm.llm_calls_per_human_msg - bm.judge_bot_per_msg
        );
    }
    if r.overall
        .policies
        .iter()
        .all(|p| p.metrics.reply_per_msg >= bm.reply_per_msg)
    {
        let _ = writeln!(
            d,
            "- botmesh makes the fewest reply calls ({:.2} per human message): it saves on replies and spends on judging.",
            bm.reply_per_msg
        );
    }
    let _ = writeln!(
        d,
        "- Local filters saved {} judge calls on acknowledgements and {} on messages addressed to someone else (over all runs).",
        reason("silent/acknowledgement"),
        reason("silent/addressed_to_other")
    );
    let ablation = |prefix: &str| r.ablations.iter().find(|a| a.name.starts_with(prefix));
    let group_p50 = |group: &str, policy: PolicyKind| {
        r.groups
            .iter()
            .find(|g| g.name == group)
            .and_then(|g| g.get(policy))
            .and_then(|m| m.ttfa_p50_ms)
            .map_or("–".to_string(), |v| v.to_string())
    };
    let p50 = |m: &Metrics| m.ttfa_p50_ms.map_or(0, |v| v as i64);
    if let (Some(nb), Some(off)) = (
        r.overall.get(PolicyKind::Nanobot),
        ablation("no writing while waiting"),
    ) {
        let _ = writeln!(
            d,
            "- Writing while waiting: a bot starts its reply as it claims (when no better claim is on its board) and posts \
at the later of its delay's end and its reply; a yield cancels the request or throws the text away \
(`botmesh_replies_discarded_total`). Turned off (`write_early = false`), the median first answer is {} ms instead of {} ms \
and the LLM calls {:.2} instead of {:.2} per human message ({:.2} replies written and thrown away). Its median first \
answer still comes {} ms after nanobot's: nanobot's first answer is the fastest of every bot that judged \
\"yes\" (in the collision group, the quickest of several independent judge + reply latencies), botmesh's is the \
most relevant bot's own judge and reply; in the single-bot groups the two are level (see the per-group table).",
            p50(&off.metrics),
            p50(bm),
            off.metrics.llm_calls_per_human_msg,
            bm.llm_calls_per_human_msg,
            bm.discarded_per_msg,
            p50(bm) - p50(nb),
        );
    }
    let kb = |m: &Metrics| m.prompt_bytes_per_human_msg.unwrap_or(0.0) / 1000.0;
    if let (Some(nb), Some(dr)) = (
        r.overall.get(PolicyKind::Nanobot),
        r.overall.get(PolicyKind::BotmeshDrafting),
    ) {
        let _ = writeln!(
            d,
            "- The drafting judge (`judge_drafts = true` on every bot: the botmesh-drafting rows): a bot's judge call is one streamed call to its reply model whose first line is the verdict and whose rest is the reply, so the reply is written from the moment the message arrives instead of from the verdict; a bot that declines stops after the verdict line, and one behind a better claim drops the call. Median first answer {} ms instead of {} ms (nanobot {} ms), {:.2} LLM calls per human message instead of {:.2} (an interjection needs no reply call of its own), {:.3} duplicates, right bot first {}, unanswered {}; {:.2} drafts per human message were written and then thrown away. The price is input and the model: the call's prompt is the reply's plus the judge's question ({:.0} bytes on average against {:.0} for the judge's alone), every bot that judges a message sends it, and the reply model does the judging. The prompts of all calls come to {:.1} KB per human message against {:.1} KB with separate judge and reply calls ({:.1} KB with the shared judge). In the model, the verdict line comes after the judge's latency and the draft at the later of that and the reply's own latency (the reply's latency already includes the wait for its first token).",
            p50(dr),
            p50(bm),
            p50(nb),
            dr.llm_calls_per_human_msg,
            bm.llm_calls_per_human_msg,
            dr.dup_per_human_msg,
            opt_pct(dr.right_bot_first_pct),
            opt_pct(dr.unanswered_pct),
            dr.discarded_per_msg,
            dr.judge_prompt_bytes_mean.unwrap_or(0.0),
            bm.judge_prompt_bytes_mean.unwrap_or(0.0),
            kb(dr),
            kb(bm),
            r.overall
                .get(PolicyKind::BotmeshShared)
                .map_or(0.0, kb),
        );
    }
    if let Some(off) = ablation("no waiting for a judging peer") {
        let _ = writeln!(
            d,
            "- Waiting for a judging peer's word, turned off (`judge_word_timeout_ms = 0`): right bot first {} instead of {}, \
for {} ms of median first answer.",
            opt_pct(off.metrics.right_bot_first_pct),
            opt_pct(bm.right_bot_first_pct),
            p50(bm) - p50(&off.metrics),
        );
    }
    if let Some(off) = ablation("no claim acknowledgements") {
        let _ = writeln!(
            d,
            "- Claim acknowledgements, turned off (`claim_ack_timeout_ms = 0`): {:.3} duplicate interjections per human \
message instead of {:.3} ({:.1}% of runs with one): without them a claim that is late in transit can reach a peer \
after that peer answered.",
            off.metrics.dup_per_human_msg,
            bm.dup_per_human_msg,
            off.metrics.runs_with_dup_pct,
        );
    }
    if let Some(sh) = r.overall.get(PolicyKind::BotmeshShared) {
        let _ = writeln!(
            d,
            "- The shared judge (`[mesh] judge = \"shared\"`): one bot per message, chosen from the message id, asks once \
for every bot whose rules say judge, and broadcasts the answers as a signed `verdict`; {:.2} LLM calls per human \
message instead of {:.2} ({:.2} judge calls instead of {:.2}), {:.3} duplicates, right bot first {}, unanswered {}, \
median first answer {} ms ({} ms more than with every bot's own judge: the verdict travels one more network hop). \
Knowing the whole ranking, a bot that the verdict puts behind a colleague does not write early, so hardly a reply \
is thrown away ({:.2} per human message); the price is in the failures group, where the runner-up only starts \
writing once the winner's reply has failed (unanswered {} there against {} with own judges). What a team gives up: \
per-bot `judge_prompt`s do not apply, and one model call ranks everyone. Its first answer cannot come before \
nanobot's within two calls per message: it is one judge call, one network hop for the verdict, then the winner's \
reply, where a nanobot bot that does not wait answers after its own judge and reply (in the single-bot groups \
{} ms against nanobot's {} ms), and in a collision the quickest of several does. Writing before the verdict would \
take a speculative reply call from bots that then stay silent, for which two calls per message leave no room.",
            sh.llm_calls_per_human_msg,
            bm.llm_calls_per_human_msg,
            sh.judge_human_per_msg + sh.judge_bot_per_msg + sh.rejudge_per_msg,
            bm.judge_human_per_msg + bm.judge_bot_per_msg + bm.rejudge_per_msg,
            sh.dup_per_human_msg,
            opt_pct(sh.right_bot_first_pct),
            opt_pct(sh.unanswered_pct),
            p50(sh),
            p50(sh) - p50(bm),
            sh.discarded_per_msg,
            r.groups
                .iter()
                .find(|g| g.name == "failures")
                .and_then(|g| g.get(PolicyKind::BotmeshShared))
                .map_or("–".into(), |m| opt_pct(m.unanswered_pct)),
            r.groups
                .iter()
                .find(|g| g.name == "failures")
                .and_then(|g| g.get(PolicyKind::Botmesh))
                .map_or("–".into(), |m| opt_pct(m.unanswered_pct)),
            group_p50("single", PolicyKind::BotmeshShared),
            group_p50("single", PolicyKind::Nanobot),
        );
    }
    let _ = writeln!(
        d,
        "- Two rules keep judge calls off answers nobody needs to weigh: a bot re-judges after its wait only when other \
bots spoke in the trigger's own thread (new questions from people are judged as they come, and answers in other \
threads say nothing about this one: before, in `burst`, every bot threw its early text away and judged and wrote \
again whenever the next question arrived), and a bot that a message did not address (`addressed_to_other`) passes \
on the exchange that follows it (`passed_on_thread`), as it does on what it declined."
    );
    if let Some(c) = bm.want_all_coverage_pct {
        let _ = writeln!(
            d,
            "- On messages that ask everyone to speak (\"大家都说说\", \"@all\", \"everyone, …\": `policy::asks_everyone`, an \
explicit list), botmesh lets {c:.1}% of the bots with something to say speak, staggered by relevance and still under \
`max_depth` and the group's rate cap; claims order the answers but make nobody yield, and the answers in the round \
cost no judge call of their own (`judge/everyone_asked`: {} turns).",
            reason("judge/everyone_asked")
        );
    }
    d
}

const DOC_METHOD: &str = r#"## What is simulated

`botmesh simulate` runs in virtual milliseconds, so one seed gives one result. Each scenario names 3–8 bots, human
messages at given times, what each bot's judge LLM would answer about each message (`speak` and
`relevance`, optionally a different answer once the judge's prompt already shows another bot's answer),
reply texts (which may @mention other bots, so bots talk to bots), LLM latency distributions for judge
and reply calls, and network delay/drop (global or per link, with a separate claim drop rate).
Every message, the humans' and the bots', is delivered to each node with its own delay, so each node
has its own transcript and its own view of claims.

The network is the real outbox's: one delivery task per peer, sending one envelope at a time and in
order (claims share the queue with messages), each waiting for the previous one's answer. A "drop"
is a failed attempt, not a lost envelope: the sender notices after a round trip and retries after
`RetryPolicy::backoff` (from `retry_base_ms` 200, doubling up to `retry_max_ms`, jitter in [d/2, d]),
drawing loss and delay afresh, until it gets through. (Before this model, the simulator dropped
claims outright, which the real mesh never does: a dropped claim there is a late one.) Relaying
around a broken link is not modelled.

Under the botmesh policy every bot runs the production turn code itself: each simulated node is a
`turn::Ports` (the same trait the real node implements) on tokio's paused clock, and each message it
receives goes through `turn::triage` and `turn::act` exactly as on a node (`Node::after_append`). So
the mention matcher, `policy::decide` and `policy::last_check`, `judge::build_prompt` (whose length in
bytes is what the tables report), `scheduler::delay_for` (its jitter drawn from the run's seeded
generator through `Ports::jitter_ms`), each node's own `scheduler::ClaimBoard` and its `wait`, the
claim acknowledgements (`egress::acks::AckTracker`, `ClaimAcks::wait`), `ClaimBoard::commit`, the
re-judge, the withdrawals and every decision's reason are the real ones. The `Ports` of a simulated
node only carries things: its transcript, the clock, the scripted LLM (judge verdicts and reply texts
after sampled latencies, failing at the scenario's rates) and the network above, on which each peer's
answer to a claim travels back one network delay after the delivery and carries what the receiving
node's board says at that moment (`Brain::answering`, as the bridge answers). The baselines are a
discrete-event loop over the same network, mention matcher, judge prompts and scripts.

Defaults unless a scenario says otherwise: `max_depth = 3`, `llm_threshold = 1`, 6 bot messages a
minute, delays 1000–3000 ms with 150 ms jitter, `min_relevance = 0.3`, 8 messages of judge context;
judge latency U(400–1200) ms, reply latency log-normal (median 2500 ms, σ 0.35, ≤ 20 s), network
U(20–150) ms, no failed deliveries, no LLM failures (a failed call means silence); a run ends 60 s (virtual) after the last human message, or at 200 bot messages.

## The policies

| policy | follows | on a human message | on a bot message | delay and collisions | loop brake |
|---|---|---|---|---|---|
| **botmesh** | docs/design.md, "What a node does with each message"; the real code | mentioned → reply at once; addressed to someone else / acknowledgement → silent; else judge → claim → wait `min + (1 − r)(max − min)` + jitter | same rules (mentioned at depth > `llm_threshold` → judge first) | stands by behind a better claim, re-enters if it is withdrawn, yields once the trigger is answered; re-judges once if other bots spoke in the trigger's thread meanwhile; posts only once every peer acknowledged its claim (or after `claim_ack_timeout_ms`) and none answered, committing atomically; on a message to everyone nobody yields | `depth ≥ max_depth` never; per-group bot message cap |
| **botmesh-shared** | the same code with `[mesh] judge = "shared"` | as botmesh, but one bot per message (chosen from its id) asks the judge once for every bot whose rules say judge and broadcasts the answers as a `verdict`; each bot applies its own entry (or judges itself if none comes in `verdict_timeout_ms`) | same | as botmesh; a bot that the verdict ranks behind a colleague does not write while it waits | as botmesh |
| **botmesh-drafting** | the same code with `judge_drafts = true` on every bot | as botmesh, but each bot's judge call is one streamed call whose first line is the verdict and whose rest is the reply: the bot claims and waits on the verdict while the reply goes on being written; one that declines stops after the verdict line | same | as botmesh; the draft is the reply written while waiting (dropped behind a better claim) | as botmesh |
| **xiaoba** | seed 004 (XiaoBa bot2bot bridge, P0 judge) as docs/design.md describes it, and the weaknesses listed there ("random 1–3 s delays that let two bots answer the same question", "LLM-only loop guards") | mentioned → full reply at once ("被@则触发推理"); else judge with the last 10 messages | every broadcast is judged the same way | uniform random 1–3 s; silent if any bot broadcast arrived during the wait; no check after writing | none but the LLM (seed 004 §四.2: "两个 bot 互相@会无限循环") |
| **nanobot** | seed 000 (Feishu relay, stop policy §4), seed 001 (transcript `get_recent(20)` for the relevance check) | mentioned → reply; else `_check_relevance` (judge) → reply; no delay | not mentioned → ignored (never interjects on bots); mentioned → depth = trailing bot messages in the transcript incl. this one: `≥ max` reject, `≤ threshold` reply, else LLM YES/NO | none: everyone who passes replies at once | the depth rule above (`max_bot_reply_depth` 3, `bot_reply_llm_threshold` 1: same numbers as botmesh) |
| **review-panel** | seed 002 (review panel protocol §3.1, §4.1, §8.1) | `should_respond` (judge on the message alone) → random 2–4 s (`reaction_delay: random(2, 4)`) → reply; mentioned → reply after the delay without judging | ignored, no LLM call (`finish()`) | none: every judge that says yes speaks | ignoring bots |

Seed 004's P0 plan goes further than the XiaoBa baseline: relevance-scaled delays ("相关度高的延迟短") and a
re-judge after seeing the other bot's reply. That plan is what botmesh implements (and extends with
claims); the baseline is the bridge as docs/design.md and its weakness list describe it.

The scripted judge answers the same for every policy (the scenario's `judge` / `bot_judge` tables),
and its answer depends only on what its prompt shows: if the prompt's context already contains
another bot's reply to the message, the `after_answer` entry applies (by default: decline); a bot
message that @mentions another bot is declined by every judge but the mentioned bot's. Where a
baseline's source leaves a detail open, the simulator picks the reading that favours the baseline:
XiaoBa's judge sees replies that arrived before it was asked (so it can decline); the review panel
skips the judge when mentioned. Every policy uses the same mention matcher, latencies and network.

## The measures

- **duplicate interjections per human message**: for every message (human or bot) where one answer
  suffices, the answers by bots it did not mention, beyond the first (or all of them, if a mentioned bot
  answered); summed and divided by the number of human messages. Messages marked `want = "all"`
  ("大家都说说") are excluded; for them the tables give **"everyone" coverage**, the share of bots
  with something to say (judge `speak`) that did speak.
- **right bot first**: of the one-answer human messages that need an answer (someone is mentioned, or
  some bot's judge says `speak`), the share whose first answer came from the mentioned bot or, if none
  is mentioned, from the bot with the highest scripted relevance. **unanswered**: the share that got
  no answer at all.
- **first answer p50 / p95**: virtual ms from a human message to the first bot reply to it.
- **longest bot chain**: the deepest bot message, in bot turns since the last human message (a reply
  to a message of depth d has depth d + 1). "N+ (k runaway)" means k runs were stopped at 200 bot
  messages, so the chain could have gone on.
- **LLM calls per human message**: judge calls (including botmesh's re-judge) plus reply calls, over
  human messages. A reply call whose text is thrown away at the last check still counts.
- **judge prompt bytes**: the mean UTF-8 size of every judge prompt built. For botmesh it is the real
  `judge::build_prompt` output with the bot's 8-message context (each message trimmed to 240 chars).
  The baselines' prompts are estimates, built with the same function from a template written after
  their descriptions (the templates are `XIAOBA_JUDGE_PROMPT`, `NANOBOT_JUDGE_PROMPT` and
  `PANEL_JUDGE_PROMPT` in `node/src/simulate.rs`):
  - XiaoBa (seed 004 P0 + P1): the bot's profile, the colleague table (P1 puts it in the prompt),
    the last **10** messages untrimmed (the seed says 5–10; 10 is the upper end) and the new one,
    answer yes/no.
  - nanobot (seed 000 §4.4 + seed 001): the role, the last **20** transcript messages untrimmed
    (`get_recent(max_messages=20)`) and the new one, answer YES/NO. No colleague profiles.
  - review panel (seed 002 §8.1 + §4.1): the judge's instruction block and the message alone (the
    panel keeps no history), answer yes/no.
"#;

const DOC_FORMAT: &str = r#"
## Scenario files

`scenarios/*.toml`, one scenario each (`botmesh simulate --scenarios DIR` reads another folder):

```toml
group = "collision"            # results are also reported per group
lang = "zh"                    # language of the synthetic replies
description = "…"
[mesh]                         # optional: any [mesh] key of peers.toml
max_depth = 3
[timing]                       # optional; distributions: fixed {ms}, uniform {min,max}, lognormal {median,sigma,max}
judge = { dist = "uniform", min = 400, max = 1200 }
reply = { dist = "lognormal", median = 2500, sigma = 0.35, max = 20000 }
network = { dist = "uniform", min = 20, max = 150 }
drop = 0.0                     # failed delivery attempts of bot messages (retried with backoff)
claim_drop = 0.0               # failed delivery attempts of claims (retried with backoff)
judge_fail = 0.0               # judge calls that fail or time out (silence)
reply_fail = 0.0               # reply calls that fail or time out (silence)
[[links]]                      # optional per-direction overrides; "*" matches anyone
from = "XiaoBa"
to = "*"
claim_drop = 0.5
[[bots]]
name = "XiaoBa"
aliases = ["小八"]
role = "研发助手"
skills = ["论文阅读", "代码编写"]
settings = { min_delay_ms = 1000 }   # optional: any [[bots]] key of peers.toml
[[messages]]
at = 0                         # virtual ms
from = "老师"                   # a human
text = "有人读过 Raft 那篇论文吗？"
want = "one"                   # or "all"
judge = { XiaoBa = 0.9, ErGoz = 0.6, Lina = { speak = false, relevance = 0.2 } }
after_answer = { ErGoz = 0.2 } # once the prompt shows another bot's answer (default: decline)
reply = { XiaoBa = "读过。@ErGoz 实现上你怎么看？" }
bot_judge = { ErGoz = 0.3 }    # about bot messages in this exchange (default: no; 0.7 if mentioned)
bot_reply = { ErGoz = ["…", "…"] }   # successive replies to bot messages in this exchange
```
"#;

#[cfg(test)]
mod tests {
    use super::*;

    const MINI: &str = r#"
group = "t"
lang = "en"
[[bots]]
name = "A"
skills = ["x"]
[[bots]]
name = "B"
[[bots]]
name = "C"
[[messages]]
at = 0
from = "h"
text = "question about x"
judge = { A = 0.9, B = 0.6, C = { speak = false, relevance = 0.1 } }
"#;

    #[test]
    fn parses_and_compiles() {
        let w = World::parse(MINI, "mini").unwrap();
        assert_eq!(w.scenario.name, "mini");
        assert_eq!(w.bots.len(), 3);
        assert_eq!(w.bots[0].min_delay_ms, 1000, "peers.toml defaults apply");
        assert_eq!(
            w.scenario.messages[0].judge["C"].verdict(),
            Verdict {
                speak: false,
                relevance: 0.1
            }
        );
        assert!(World::parse(&MINI.replace("C = {", "D = {"), "x").is_err());
    }

    #[test]
    fn distributions_stay_in_range() {
        let mut rng = StdRng::seed_from_u64(7);
        let u = Dist::Uniform {
            min: 10.0,
            max: 20.0,
        };
        let l = Dist::Lognormal {
            median: 1000.0,
            sigma: 0.5,
            max: Some(3000.0),
        };
        let mut ls = Vec::new();
        for _ in 0..2000 {
            assert!((10..=20).contains(&u.sample(&mut rng)));
            let x = l.sample(&mut rng);
            assert!(x <= 3000);
            ls.push(x);
        }
        ls.sort_unstable();
        let median = ls[ls.len() / 2];
        assert!((850..1150).contains(&median), "median {median}");
    }

    #[test]
    fn one_interjection_under_botmesh() {
        let w = World::parse(MINI, "mini").unwrap();
        for seed in 0..20 {
            let t = run_once(&w, PolicyKind::Botmesh, seed);
            assert_eq!(t.bot_posts, 1, "seed {seed}");
            assert_eq!(t.right_first, 1, "seed {seed}");
        }
    }
}
