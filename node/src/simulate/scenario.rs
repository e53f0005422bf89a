//! Scenario files (`scenarios/*.toml`) and the world a run is built from: the bots,
//! the scripted humans and judges, the latencies and the network.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::config::{BotSettings, MeshSettings};
use crate::llm::Verdict;
use crate::turn::mention::MentionMatcher;
use crate::turn::roster;

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
    /// Nobody should answer: a person `/stop`s the turn it starts (an answer that is
    /// posted anyway counts as `unwanted`).
    None,
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
    /// Agent bots whose agent dies mid-turn on this message (their first agent turn
    /// in the exchange ends silent); the right bot to answer first is then the most
    /// relevant one of the others.
    #[serde(default)]
    pub(crate) crash: Vec<String>,
    /// Agent bot → the colleague its agent asks mid-turn while it works on this
    /// message (the `ask` group tool), modelled as what it is on the wire: the agent
    /// bot's message "@colleague question", replying to this message, posted while the
    /// turn is in flight; the colleague's answer is handed to the waiting ask through
    /// the node's own `turn::asks` (no turn of the asker), and the turn goes on.
    #[serde(default)]
    pub(crate) ask: BTreeMap<String, MidTurnAsk>,
}

/// A question an agent bot's agent asks a colleague mid-turn (`ask = { Coder = {
/// colleague = "Sage", question = "…", after_secs = 30 } }`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MidTurnAsk {
    /// The colleague asked (a bot of the scenario, not the asker).
    pub(crate) colleague: String,
    /// The question (posted as "@colleague question").
    pub(crate) question: String,
    /// Seconds into the agent's turn when it asks (before the turn would end).
    pub(crate) after_secs: f64,
}

/// A bot whose reply engine is a coding agent (`[[bots]] agent = { acp = … }` in
/// peers.toml): its turn takes from seconds to many minutes and shows progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentBot {
    /// Shortest turn, seconds.
    pub(crate) min_secs: f64,
    /// Longest turn, seconds (at most an hour); a turn's length is drawn uniformly.
    pub(crate) max_secs: f64,
    /// Seconds between two progress events while the agent works.
    #[serde(default = "d_progress_secs")]
    pub(crate) progress_secs: f64,
}

pub(super) fn d_progress_secs() -> f64 {
    30.0
}

/// The longest agent turn a scenario may give, seconds.
const MAX_AGENT_SECS: f64 = 3600.0;

impl AgentBot {
    /// Checks the ranges, with a message naming the bot and the key.
    fn check(&self, bot: &str) -> anyhow::Result<()> {
        let AgentBot {
            min_secs,
            max_secs,
            progress_secs,
        } = *self;
        if !(min_secs.is_finite() && min_secs > 0.0) {
            bail!("bot {bot}: agent.min_secs must be a number of seconds above 0, not {min_secs}");
        }
        if !(max_secs.is_finite() && max_secs >= min_secs) {
            bail!("bot {bot}: agent.max_secs ({max_secs}) must be at least agent.min_secs ({min_secs})");
        }
        if max_secs > MAX_AGENT_SECS {
            bail!("bot {bot}: agent.max_secs ({max_secs}) is past {MAX_AGENT_SECS} s (an hour)");
        }
        if !(progress_secs.is_finite() && progress_secs >= 1.0) {
            bail!("bot {bot}: agent.progress_secs must be at least 1 second, not {progress_secs}");
        }
        Ok(())
    }

    /// How long its turns take, in virtual milliseconds.
    pub(crate) fn duration(&self) -> Dist {
        Dist::Uniform {
            min: self.min_secs * 1000.0,
            max: self.max_secs * 1000.0,
        }
    }
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
    /// Its replies come from a coding agent: long turns, progress, `/stop`, crashes.
    #[serde(default)]
    pub(crate) agent: Option<AgentBot>,
}

pub(super) fn d_judge() -> Dist {
    Dist::Uniform {
        min: 400.0,
        max: 1200.0,
    }
}
pub(super) fn d_reply() -> Dist {
    Dist::Lognormal {
        median: 2500.0,
        sigma: 0.35,
        max: Some(20_000.0),
    }
}
pub(super) fn d_network() -> Dist {
    Dist::Uniform {
        min: 20.0,
        max: 150.0,
    }
}
pub(super) fn d_horizon() -> u64 {
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
    pub(super) colleagues: Vec<Vec<BotSettings>>,
    pub(super) matcher: MentionMatcher,
    pub(super) judge_lat: Vec<Dist>,
    pub(super) reply_lat: Vec<Dist>,
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
            if let Some(agent) = &b.agent {
                agent.check(&b.name)?;
                if b.reply_latency.is_some() {
                    bail!("bot {}: an agent bot's reply takes agent.min_secs..max_secs; give no reply_latency", b.name);
                }
                for key in ["write_early", "judge_drafts"] {
                    if b.settings.get(key) == Some(&serde_json::Value::Bool(true)) {
                        bail!("bot {}: settings.{key} = true, but an agent is handed the turn only once the bot is to speak", b.name);
                    }
                }
            }
            let mut obj = b.settings.clone();
            if let Some(agent) = &b.agent {
                // As the node runs an ACP bot: nothing is written before it has the turn.
                obj.insert("write_early".into(), false.into());
                obj.insert("judge_drafts".into(), false.into());
                // Its `[[bots]] agent` as peers.toml gives it, so its colleagues know
                // how long its turns may last; the simulator's own brain for it keeps
                // the scripted engine (`Brain::with`), whose reply is the agent's turn.
                obj.insert(
                    "agent".into(),
                    serde_json::json!({
                        "acp": ["simulated-agent"],
                        "cwd": ".",
                        "turn_timeout_secs": agent.max_secs.ceil() as u64,
                    }),
                );
            }
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
            for (asker, a) in &m.ask {
                match scenario.bots.iter().find(|b| &b.name == asker) {
                    None => bail!("message {i}: ask names {asker:?}, which is not a bot of the scenario"),
                    Some(b) => match &b.agent {
                        None => bail!("message {i}: ask names {asker:?}, which is not an agent bot (give it agent = {{ min_secs, max_secs }})"),
                        Some(agent) if !(a.after_secs >= 0.0 && a.after_secs < agent.min_secs) => bail!(
                            "message {i}: ask.{asker}.after_secs must be 0 or more and under its agent's min_secs ({}), so the ask comes mid-turn",
                            agent.min_secs
                        ),
                        Some(_) => {}
                    },
                }
                if &a.colleague == asker || !names.contains(&a.colleague.as_str()) {
                    bail!("message {i}: ask.{asker}.colleague {:?} must be another bot of the scenario", a.colleague);
                }
                if a.question.trim().is_empty() {
                    bail!("message {i}: ask.{asker}.question must not be empty");
                }
            }
            for c in &m.crash {
                match scenario.bots.iter().find(|b| &b.name == c) {
                    None => {
                        bail!("message {i}: crash names {c:?}, which is not a bot of the scenario")
                    }
                    Some(b) if b.agent.is_none() => {
                        bail!("message {i}: crash names {c:?}, which is not an agent bot (give it agent = {{ min_secs, max_secs }})")
                    }
                    Some(_) => {}
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
            .map(|b| match &b.agent {
                Some(agent) => agent.duration(),
                None => b.reply_latency.clone().unwrap_or_else(|| t.reply.clone()),
            })
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
