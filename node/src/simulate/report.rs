//! Many runs of every scenario under every policy: the measures, the targets, the
//! ablations and the other seeds that make up a [`Report`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::BotSettings;

use super::*;

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
    /// Progress events of agent bots at work (botmesh).
    pub(crate) progress_events: u64,
    /// Agent turns that died mid-turn (botmesh).
    pub(crate) agent_crashes: u64,
    /// Answers to messages that want none (a person `/stop`ped the turn).
    pub(crate) unwanted_answers: u64,
    /// Questions agents asked colleagues mid-turn (a scenario's `ask`; botmesh).
    pub(crate) asks: u64,
    /// … whose answer came back to the waiting ask.
    pub(crate) asks_answered: u64,
    /// Bot messages replying to those questions, by anyone (one per question when
    /// only the colleague answers, once).
    pub(crate) ask_replies: u64,
    /// Asking agent turns that went on to post their answer (the rest orphaned).
    pub(crate) ask_turns_finished: u64,
}

pub(super) fn pct(n: u64, d: u64) -> Option<f64> {
    (d > 0).then(|| 100.0 * n as f64 / d as f64)
}

pub(super) fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
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
            progress_events: t.progress_events,
            agent_crashes: t.agent_crashes,
            unwanted_answers: t.unwanted_answers,
            asks: t.asks,
            asks_answered: t.asks_answered,
            ask_replies: t.ask_replies,
            ask_turns_finished: t.ask_turns_finished,
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

/// The quality bars' numbers for one policy at one base seed (all scenarios together):
/// what `tests/simulate.rs` holds every botmesh policy to (0 duplicates, right bot
/// first ≥ 98 %, unanswered ≤ 0.3 %).
#[derive(Debug, Clone, PartialEq)]
pub struct Bars {
    /// The base seed.
    pub seed: u64,
    /// The policy.
    pub policy: PolicyKind,
    /// Duplicate interjections per human message.
    pub dup_per_human_msg: f64,
    /// Share of one-answer questions first answered by the right bot, %.
    pub right_bot_first_pct: Option<f64>,
    /// Share of questions that needed an answer and got none, %.
    pub unanswered_pct: Option<f64>,
}

impl Report {
    /// The bars' numbers of every row of the seed table.
    pub fn bars(&self) -> Vec<Bars> {
        self.seeds
            .iter()
            .map(|r| Bars {
                seed: r.seed,
                policy: r.policy,
                dup_per_human_msg: r.metrics.dup_per_human_msg,
                right_bot_first_pct: r.metrics.right_bot_first_pct,
                unanswered_pct: r.metrics.unanswered_pct,
            })
            .collect()
    }
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
pub(super) const ABLATIONS: [Knockout; 3] = [
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
pub(super) const MORE_SEEDS: [u64; 4] = [2, 3, 8, 13];

/// Every scenario under `policy`, its tallies summed: the overall measures.
pub(super) fn overall_of(worlds: &[World], policy: PolicyKind, seed: u64, runs: usize) -> Metrics {
    let mut t = Tally::default();
    for w in worlds {
        t.add(&run_many(w, policy, seed, runs));
    }
    Metrics::from_tally(&t)
}

/// botmesh (own judge) with each of [`ABLATIONS`] applied to every bot.
pub(super) fn ablations(worlds: &[World], seed: u64, runs: usize) -> Vec<Ablation> {
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
pub(super) fn seed_rows(
    worlds: &[World],
    overall: &Section,
    seed: u64,
    runs: usize,
) -> Vec<SeedRow> {
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

pub(super) fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

pub(super) fn fnv(s: &str) -> u64 {
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

pub(super) fn targets(overall: &Section, worlds: &[World], scenarios: &[Section]) -> Vec<Target> {
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
