//! What one run counts: the posts it made and their raw tally.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use ulid::Ulid;

use crate::wire::envelope::{AuthorKind, Envelope};

use super::*;

/// One message posted in a run, human or bot, as the measures and the scripts see it.
pub(super) struct Post {
    /// The message.
    pub(super) env: Arc<Envelope>,
    /// The scripted human message whose exchange it belongs to (index in the scenario).
    pub(super) root: usize,
    /// The bots it @mentions (by the real matcher), by index.
    pub(super) mentioned: Vec<usize>,
}

/// Records a post in a run's registry (for the measures and the scripts): who it
/// mentions, by the real matcher, and which human message's exchange it belongs to.
pub(super) fn register_post(
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
    /// Progress events of agent bots at work (botmesh).
    pub progress_events: u64,
    /// Agent turns that died mid-turn (a scenario's `crash`; botmesh).
    pub agent_crashes: u64,
    /// Answers to messages that want none (`want = "none"`: a person `/stop`ped the
    /// turn).
    pub unwanted_answers: u64,
    /// Questions agents asked colleagues mid-turn (a scenario's `ask`; botmesh).
    pub asks: u64,
    /// … whose answer came back to the waiting ask.
    pub asks_answered: u64,
    /// Bot messages replying to those questions (by anyone): one per question when
    /// only the colleague answers, once.
    pub ask_replies: u64,
    /// Asking agent turns that went on to post their answer (none orphaned).
    pub ask_turns_finished: u64,
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
        self.progress_events += o.progress_events;
        self.agent_crashes += o.agent_crashes;
        self.unwanted_answers += o.unwanted_answers;
        self.asks += o.asks;
        self.asks_answered += o.asks_answered;
        self.ask_replies += o.ask_replies;
        self.ask_turns_finished += o.ask_turns_finished;
        for (k, v) in &o.reasons {
            *self.reasons.entry(k.clone()).or_default() += v;
        }
    }

    pub(super) fn reason(&mut self, action: &str, reason: &str) {
        *self
            .reasons
            .entry(format!("{action}/{reason}"))
            .or_default() += 1;
    }
}

/// Adds the measures of one run (its posts, in order) to its tally.
pub(super) fn measure(w: &World, posts: &[Post], mut tally: Tally) -> Tally {
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
                // A bot whose agent is scripted to die on this message cannot answer
                // it: the right bot is the most relevant of the others.
                let able: Vec<(usize, f64)> = speakers
                    .iter()
                    .copied()
                    .filter(|s| !sm.crash.contains(&w.bots[s.0].name))
                    .collect();
                let speakers = able;
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
            Want::None => tally.unwanted_answers += rs.len() as u64,
        }
    }
    tally.dup_interjections = dup;
    tally.runs_with_dup = u64::from(dup > 0);
    tally
}
