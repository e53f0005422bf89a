//! The baselines' discrete-event loop: XiaoBa, nanobot and the review panel over
//! virtual milliseconds (a heap of timed events), on the shared network, mention
//! matcher and judge prompts.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ulid::Ulid;

use crate::config::BotSettings;
use crate::llm::Verdict;
use crate::turn::judge::{build_prompt, JudgeInput};
use crate::wire::envelope::{Author, AuthorKind, Envelope};

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    Judge,
    Wait,
    Write,
}

pub(super) struct Task {
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

pub(super) enum Event {
    Human(usize),
    Deliver {
        to: usize,
        env: Arc<Envelope>,
    },
    /// Task `.0`'s next step, valid while the task's generation is still `.1`.
    Step(usize, u32),
}

pub(super) struct BotState {
    transcript: Vec<Arc<Envelope>>,
    arrived: Vec<u64>,
    /// (root message, replying to a bot message) → replies posted so far.
    replies: HashMap<(usize, bool), usize>,
}

pub(super) struct Sim<'w> {
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
    pub(super) trace: Option<Vec<String>>,
}

impl<'w> Sim<'w> {
    pub(super) fn new(w: &'w World, policy: PolicyKind, seed: u64) -> Sim<'w> {
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

    pub(super) fn run(mut self) -> (Tally, Option<Vec<String>>) {
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
            env.depth = crate::wire::envelope::next_depth(t.depth);
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
