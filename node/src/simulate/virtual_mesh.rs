//! The botmesh policy in `botmesh simulate`: every bot runs the production turn code
//! (`turn::triage`, `turn::act`, and through them the real `ClaimBoard`, claim
//! acknowledgements, policy and judge prompt) against a virtual-time [`Ports`]:
//! tokio's paused clock, scripted judges and replies with sampled latencies, and the
//! scenario's network (per-link delays, drops retried with the outbox's backoff).
//! Nothing here decides a turn: it only carries messages, claims and answers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use super::{Carry, MidTurnAsk, Network, Post, Tally, World, RUNAWAY_POSTS};
use crate::config::MeshSettings;
use crate::egress::acks::{AckTracker, ClaimAcks, PeerOutcome};
use crate::engine::metered::LlmCall;
use crate::llm::{ChatMessage, Completion, Endpoint, LlmError, Purpose};
use crate::telemetry::events::Event;
use crate::telemetry::metrics::Metrics;
use crate::turn::brain::Tuning;
use crate::turn::ports::SliceLog;
use crate::turn::scheduler::WITHDRAWN;
use crate::turn::{Brain, Llm, Ports, Provider};
use crate::wire::envelope::{Author, AuthorKind, Envelope};

/// What one run shares between its bots: the scenario, the random generator, the
/// network's state, the posts so far and the tally.
struct Run {
    /// The scenario.
    w: World,
    /// Virtual time zero.
    start: tokio::time::Instant,
    /// Everything that changes, behind one lock (never held across an await).
    state: Mutex<RunState>,
    /// The bots, by index (cleared at the end of the run to drop the cycle).
    bots: Mutex<Vec<Arc<SimBot>>>,
    /// Cancelled when the run ends (horizon or runaway).
    done: CancellationToken,
}

/// The changing part of a run.
struct RunState {
    rng: StdRng,
    net: Network,
    posts: Vec<Post>,
    by_id: HashMap<Ulid, usize>,
    tally: Tally,
    next_id: u128,
    /// (bot, trigger) pairs judged once already: a second call is the re-judge.
    judged: HashSet<(usize, Ulid)>,
    /// Replies written (successful reply calls), to count the ones thrown away.
    written: u64,
    /// (agent bot, exchange) pairs whose scripted crash has happened: the agent
    /// recovers for its later turns.
    crashed: HashSet<(usize, usize)>,
    /// The questions agents asked colleagues mid-turn (a scenario's `ask`), to count
    /// the replies to them.
    questions: HashSet<Ulid>,
    /// (agent bot, trigger) turns that asked and have not posted their answer yet.
    asking_turns: HashSet<(usize, Ulid)>,
    trace: Option<Vec<String>>,
}

impl RunState {
    /// [`Network::delay`] with the run's generator.
    fn link(&mut self, w: &World, now: u64, from: &str, to: &str, carry: Carry) -> (u64, u64) {
        self.net.delay(w, &mut self.rng, now, from, to, carry)
    }
}

/// One bot: its brain (the production `Brain`), its transcript and its claims'
/// acknowledgements; the [`Ports`] the turn code runs against.
struct SimBot {
    run: Arc<Run>,
    idx: usize,
    brain: Brain,
    transcript: Mutex<Vec<Arc<Envelope>>>,
    acks: Arc<AckTracker>,
    stopping: CancellationToken,
    /// An agent bot's agent, free or at work: one turn at a time, as one ACP session
    /// per group runs one prompt at a time; a turn that reaches its writing step while
    /// the agent works waits here, holding its claim, for the agent's next turn.
    agent: tokio::sync::Mutex<()>,
}

/// Runs one scenario once under the botmesh policy; with `trace`, the event trace too.
pub(super) fn run(
    w: &World,
    seed: u64,
    trace: bool,
    judge: crate::config::JudgeMode,
    drafting: bool,
) -> (Tally, Option<Vec<String>>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let mut w = w.clone();
    std::sync::Arc::make_mut(&mut w.mesh).judge = judge;
    if drafting {
        // An agent bot's reply is its agent's, never a drafting judge's.
        let agents: Vec<bool> = w.scenario.bots.iter().map(|b| b.agent.is_some()).collect();
        w.bots
            .iter_mut()
            .zip(agents)
            .filter(|(_, agent)| !agent)
            .for_each(|(b, _)| b.judge_drafts = true);
    }
    rt.block_on(run_async(w, seed, trace))
}

async fn run_async(w: World, seed: u64, trace: bool) -> (Tally, Option<Vec<String>>) {
    let end = w.scenario.messages.last().map_or(0, |m| m.at) + w.scenario.timing.horizon_ms;
    let run = Arc::new(Run {
        start: tokio::time::Instant::now(),
        state: Mutex::new(RunState {
            rng: StdRng::seed_from_u64(seed),
            net: Network::default(),
            posts: Vec::new(),
            by_id: HashMap::new(),
            tally: Tally {
                runs: 1,
                ..Tally::default()
            },
            next_id: 1,
            judged: HashSet::new(),
            written: 0,
            crashed: HashSet::new(),
            questions: HashSet::new(),
            asking_turns: HashSet::new(),
            trace: trace.then(Vec::new),
        }),
        bots: Mutex::new(Vec::new()),
        done: CancellationToken::new(),
        w,
    });
    let bots: Vec<Arc<SimBot>> = (0..run.w.bots.len())
        .map(|i| {
            let me = run.w.bots[i].clone();
            let colleagues = run.w.colleagues[i].clone();
            // A remote provider: its calls come to `SimBot::complete`, scripted.
            let provider = Provider::Remote {
                judge: Endpoint::new("sim://judge", "scripted"),
                reply: Endpoint::new("sim://reply", "scripted"),
            };
            let tuning = Tuning {
                me: Arc::new(me),
                colleagues,
                provider,
                mesh: run.w.mesh.clone(),
                budget: Default::default(),
            };
            let brain = Brain::with(tuning, &run.w.bots, Arc::new(Metrics::new()));
            Arc::new(SimBot {
                run: run.clone(),
                idx: i,
                brain,
                transcript: Mutex::new(Vec::new()),
                acks: Arc::new(AckTracker::default()),
                stopping: CancellationToken::new(),
                agent: tokio::sync::Mutex::new(()),
            })
        })
        .collect();
    *run.bots.lock() = bots.clone();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..run.w.scenario.messages.len() {
        let run = run.clone();
        tasks.spawn(async move {
            let at = run.w.scenario.messages[i].at;
            tokio::time::sleep_until(run.start + Duration::from_millis(at)).await;
            run.human(i);
        });
    }
    tokio::select! {
        biased;
        _ = run.done.cancelled() => {}
        _ = tokio::time::sleep_until(run.start + Duration::from_millis(end)) => {}
    }
    for b in &bots {
        b.stopping.cancel();
    }
    run.done.cancel();
    tasks.abort_all();
    run.bots.lock().clear();
    drop(bots);
    let mut st = run.state.lock();
    let posts = std::mem::take(&mut st.posts);
    let mut tally = std::mem::take(&mut st.tally);
    tally.replies_discarded = st.written.saturating_sub(tally.bot_posts);
    let trace = st.trace.take();
    drop(st);
    (super::measure(&run.w, &posts, tally), trace)
}

impl Run {
    /// Virtual milliseconds since the start.
    fn now(&self) -> u64 {
        (tokio::time::Instant::now() - self.start).as_millis() as u64
    }

    fn bot(&self, i: usize) -> Option<Arc<SimBot>> {
        self.bots.lock().get(i).cloned()
    }

    /// Adds a trace line, when tracing.
    fn log(&self, st: &mut RunState, who: Option<usize>, line: impl FnOnce(&RunState) -> String) {
        if st.trace.is_some() {
            let who = who.map_or("", |b| self.w.bots[b].name.as_str());
            let text = format!("{:>7} ms  {who:<8} {}", self.now(), line(st));
            if let Some(trace) = &mut st.trace {
                trace.push(text);
            }
        }
    }

    /// Records a post in the run's registry (for the measures and the scripts).
    fn register(&self, st: &mut RunState, env: Arc<Envelope>, root: usize) {
        let RunState { posts, by_id, .. } = st;
        super::register_post(&self.w, posts, by_id, env, root);
    }

    /// A scripted human message is posted: every bot receives it over its link.
    fn human(self: &Arc<Self>, i: usize) {
        let m = &self.w.scenario.messages[i];
        let mut st = self.state.lock();
        st.next_id += 1;
        let id = Ulid::from_parts(self.now(), st.next_id);
        let env = Arc::new(Envelope::message(
            id,
            self.now(),
            "sim",
            &m.from,
            Author::human(&m.from),
            &m.text,
        ));
        self.register(&mut st, env.clone(), i);
        self.log(&mut st, None, |s| {
            format!("{} {}: {}", num(s, &env.id), env.author.name, env.text)
        });
        for b in 0..self.w.bots.len() {
            let to = self.w.bots[b].name.clone();
            let (d, _) = st.link(&self.w, self.now(), &m.from, &to, Carry::Human);
            self.deliver(b, env.clone(), d);
        }
    }

    /// Delivers `env` to bot `to` after `after_ms`.
    fn deliver(self: &Arc<Self>, to: usize, env: Arc<Envelope>, after_ms: u64) {
        let run = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            if let Some(bot) = run.bot(to) {
                bot.receive(env);
            }
        });
    }
}

/// `#k`: the k-th message posted in the run.
fn num(st: &RunState, id: &Ulid) -> String {
    format!("#{}", st.by_id.get(id).copied().unwrap_or(usize::MAX))
}

impl SimBot {
    fn name(&self) -> &str {
        &self.run.w.bots[self.idx].name
    }

    /// A message reaches this bot: recorded once, observed, then handed to the turn
    /// code as `Node::after_append` does (the local rules at once, a task only for a
    /// turn to act on).
    fn receive(self: &Arc<Self>, env: Arc<Envelope>) {
        {
            let mut t = self.transcript.lock();
            if t.iter().any(|e| e.id == env.id) {
                return;
            }
            t.push(env.clone());
        }
        self.brain.observe(&env);
        if self.stopping.is_cancelled() {
            return;
        }
        // The answer an ask of this bot's agent waits for is handed to it and starts
        // no turn, as `app::group_tools::first_look` does.
        if env.author.name != self.name() {
            let mentions_me = self.brain.matcher.mentions(&env.text, &[], self.name());
            if self.brain.asks.offer(&env, mentions_me) {
                let mut st = self.run.state.lock();
                self.run.log(&mut st, Some(self.idx), |s| {
                    format!(
                        "{}: the answer to its ask, handed to its agent (no turn)",
                        num(s, &env.id)
                    )
                });
                return;
            }
        }
        if self.command(&env) {
            return;
        }
        if let Some(turn) = crate::turn::on_message(self, &env, Vec::new()) {
            tokio::spawn(turn);
        }
    }

    /// A person's command, carried out as `app::commands::handle` does for the ones
    /// the simulator knows (`/stop`: the group's turns in flight drop); `true` when
    /// `env` is a command at all, which then takes no turn.
    fn command(&self, env: &Envelope) -> bool {
        let Some(cmd) = crate::turn::control::parse(env, &self.brain.matcher, &[]) else {
            return false;
        };
        let t = self.brain.tuning();
        if !crate::turn::control::may_command(cmd.verb, env, &t) {
            return false;
        }
        if cmd.addresses(self.name()) && cmd.verb == crate::turn::control::Verb::Stop {
            self.brain.stops.stop(&env.group, &env.author.name);
            let mut st = self.run.state.lock();
            self.run.log(&mut st, Some(self.idx), |_| {
                format!("/stop by {}: drops its turns in flight", env.author.name)
            });
        }
        true
    }

    /// An agent's turn: waits for the agent to be free (its turn before this one),
    /// then works `ms` (sending a progress event every `progress_secs`), then the
    /// text, or `None` when it dies mid-turn. Dropped (a `/stop`, the run ending), it
    /// stops at once and the agent is free again.
    async fn agent_turn(&self, about: &Envelope, ms: u64, text: Option<String>) -> Option<String> {
        let _busy = self.agent.lock().await;
        let agent = self.run.w.scenario.bots[self.idx]
            .agent
            .clone()
            .expect("an agent bot");
        {
            let mut st = self.run.state.lock();
            self.run.log(&mut st, Some(self.idx), |s| {
                format!(
                    "'s agent starts on {} ({} s){}",
                    num(s, &about.id),
                    ms / 1000,
                    if text.is_none() {
                        ", DIES MID-TURN"
                    } else {
                        ""
                    }
                )
            });
        }
        let step = (agent.progress_secs * 1000.0) as u64;
        let start = tokio::time::Instant::now();
        let mut until = start + Duration::from_millis(ms);
        let mut ask = text.as_ref().and_then(|_| self.ask_of(about));
        let mut steps = 0u64;
        loop {
            let next = tokio::time::Instant::now() + Duration::from_millis(step);
            if let Some(a) = ask.take() {
                let at = start + Duration::from_millis((a.after_secs * 1000.0) as u64);
                if at <= next.min(until) {
                    // The agent waits on its tool call: the turn is that much longer.
                    tokio::time::sleep_until(at).await;
                    until += self.ask_colleague(about, &a).await;
                    continue;
                }
                ask = Some(a);
            }
            if next >= until {
                tokio::time::sleep_until(until).await;
                break;
            }
            tokio::time::sleep_until(next).await;
            steps += 1;
            self.event(Event::Progress {
                group: about.group.clone(),
                trigger: about.id.to_string(),
                bot: self.name().to_string(),
                text: format!("working: step {steps}"),
            });
        }
        if text.is_none() {
            let mut st = self.run.state.lock();
            st.tally.agent_crashes += 1;
            self.run.log(&mut st, Some(self.idx), |s| {
                format!("'s agent dies working on {}", num(s, &about.id))
            });
        }
        text
    }

    /// What this agent bot's agent asks a colleague mid-turn on `about` (its
    /// scenario's `ask`), when `about` is the person's message it is scripted for.
    fn ask_of(&self, about: &Envelope) -> Option<MidTurnAsk> {
        if about.author.kind != AuthorKind::Human {
            return None;
        }
        let st = self.run.state.lock();
        let root = st.posts[*st.by_id.get(&about.id)?].root;
        self.run.w.scenario.messages[root]
            .ask
            .get(self.name())
            .cloned()
    }

    /// The `ask` tool, as the node runs it: waits on the colleague's answer through
    /// `turn::asks` before posting "@colleague question" as this bot (replying to the
    /// turn's trigger, one deeper), then waits (at most `ask_timeout_secs`) for it.
    /// How long the agent waited.
    async fn ask_colleague(&self, about: &Envelope, a: &MidTurnAsk) -> Duration {
        let began = tokio::time::Instant::now();
        let Some(me) = self.run.bot(self.idx) else {
            return Duration::ZERO;
        };
        let id = self.new_id();
        let waiting = self.brain.asks.expect(&about.group, id, &a.colleague);
        let mut env = Envelope::message(
            id,
            self.now_millis(),
            about.group.clone(),
            self.name(),
            Author::bot(self.name()),
            format!("@{} {}", a.colleague, a.question),
        );
        env.reply_to = Some(about.id);
        env.depth = crate::wire::envelope::next_depth(about.depth);
        {
            let mut st = self.run.state.lock();
            st.questions.insert(id);
            st.asking_turns.insert((self.idx, about.id));
            st.tally.asks += 1;
        }
        if me.publish(env).await.is_err() {
            return began.elapsed();
        }
        let wait = Duration::from_secs(self.run.w.mesh.ask_timeout_secs);
        let answered = matches!(tokio::time::timeout(wait, waiting).await, Ok(Ok(_)));
        let mut st = self.run.state.lock();
        if answered {
            st.tally.asks_answered += 1;
        }
        self.run.log(&mut st, Some(self.idx), |_| {
            format!(
                "'s ask of {} {}",
                a.colleague,
                if answered {
                    "returns the answer"
                } else {
                    "TIMES OUT"
                }
            )
        });
        began.elapsed()
    }

    /// Sends a claim (or withdrawal) to every peer; with `acks`, each peer's answer
    /// comes back one network delay after the delivery and is reported there.
    fn send_claim(&self, env: &Envelope, acks: Option<&Arc<AckTracker>>) {
        let all: Vec<usize> = (0..self.run.w.bots.len())
            .filter(|p| *p != self.idx)
            .collect();
        self.send_claim_to(&all, env, acks);
    }

    /// [`SimBot::send_claim`] to these peers only.
    fn send_claim_to(&self, to: &[usize], env: &Envelope, acks: Option<&Arc<AckTracker>>) {
        let run = &self.run;
        let env = Arc::new(env.clone());
        let mut st = run.state.lock();
        for &p in to {
            let to = run.w.bots[p].name.clone();
            let (d, back) = st.link(&run.w, run.now(), self.name(), &to, Carry::Claim);
            let (run2, env, acks) = (run.clone(), env.clone(), acks.cloned());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(d)).await;
                let Some(peer) = run2.bot(p) else { return };
                peer.brain.on_claim(&env);
                if env.kind == crate::wire::envelope::Kind::Verdict {
                    return;
                }
                {
                    let mut st = run2.state.lock();
                    let r = env.relevance.unwrap_or(0.0);
                    let trigger = env.reply_to.unwrap_or_default();
                    run2.log(&mut st, Some(p), |s| {
                        if r <= WITHDRAWN {
                            format!(
                                "hears {} withdraw its claim on {}",
                                env.sender,
                                num(s, &trigger)
                            )
                        } else {
                            format!(
                                "hears {}'s claim on {} at {r:.2}",
                                env.sender,
                                num(s, &trigger)
                            )
                        }
                    });
                }
                if let Some(acks) = acks {
                    // The bridge answers from the board, after the claim is on it.
                    let reply = peer.brain.answer_claim(&env);
                    tokio::time::sleep(Duration::from_millis(back)).await;
                    acks.report(
                        &env.id.to_string(),
                        peer.name(),
                        PeerOutcome::Delivered(reply),
                    );
                }
            });
        }
    }

    /// What the scripted judge answers this bot about `msg`; `answered`: its prompt
    /// shows another bot's answer to it.
    fn scripted(&self, st: &RunState, msg: &Envelope, answered: bool) -> crate::llm::Verdict {
        let w = &self.run.w;
        let post = &st.posts[st.by_id[&msg.id]];
        let mentioned = post.mentioned.contains(&self.idx);
        super::scripted_verdict(w, self.idx, msg, post, mentioned, answered)
    }
}

impl SimBot {
    /// A judge call about `about` (counted: human, bot or re-judge; its prompt bytes):
    /// its latency, and the verdict's JSON or `None` if the call fails.
    fn judge_part(
        &self,
        st: &mut RunState,
        messages: &[ChatMessage],
        about: &Envelope,
        what: &str,
    ) -> (u64, Option<String>, crate::llm::Verdict) {
        let w = &self.run.w;
        let prompt_len = messages.iter().map(|m| m.content.len()).sum::<usize>();
        st.tally.prompt_bytes += prompt_len as u64;
        st.tally.sent_bytes += prompt_len as u64;
        st.tally.prompts += 1;
        let rejudge = !st.judged.insert((self.idx, about.id));
        if rejudge {
            st.tally.rejudge += 1;
        } else if about.author.kind == AuthorKind::Bot {
            st.tally.judge_bot += 1;
        } else {
            st.tally.judge_human += 1;
        }
        // The re-judge's prompt shows what was said since the trigger.
        let answered = rejudge
            && self.transcript.lock().iter().any(|e| {
                e.author.kind == AuthorKind::Bot
                    && e.author.name != self.name()
                    && e.reply_to == Some(about.id)
            });
        let v = self.scripted(st, about, answered);
        let p = w.scenario.timing.judge_fail;
        let failed = p > 0.0 && st.rng.gen_bool(p.min(1.0));
        let lat = w.judge_lat[self.idx].sample(&mut st.rng);
        self.run.log(st, Some(self.idx), |s| {
            format!(
                "{}{what} {}: speak={} relevance={:.2} in {lat} ms{} ({prompt_len} B prompt)",
                if rejudge { "re-" } else { "" },
                num(s, &about.id),
                v.speak,
                v.relevance,
                if failed { ", FAILS" } else { "" },
            )
        });
        let text = serde_json::json!({"speak": v.speak, "relevance": v.relevance}).to_string();
        (lat, (!failed).then_some(text), v)
    }

    /// A reply to `about`: its latency, and its text or `None` if the call fails.
    fn reply_part(&self, st: &mut RunState, about: &Envelope, what: &str) -> (u64, Option<String>) {
        let w = &self.run.w;
        let p = w.scenario.timing.reply_fail;
        let mut failed = p > 0.0 && st.rng.gen_bool(p.min(1.0));
        let mut lat = w.reply_lat[self.idx].sample(&mut st.rng);
        let root = st.posts[st.by_id[&about.id]].root;
        if w.scenario.bots[self.idx].agent.is_some()
            && w.scenario.messages[root]
                .crash
                .contains(&w.bots[self.idx].name)
            && st.crashed.insert((self.idx, root))
        {
            // The scripted crash: the agent dies halfway through its turn.
            failed = true;
            lat /= 2;
        }
        // The k-th reply this bot posts in the exchange picks the k-th text.
        let k = st
            .posts
            .iter()
            .filter(|p| {
                p.root == root
                    && p.env.author.name == self.name()
                    && st.posts[st.by_id[&p.env.reply_to.unwrap_or_default()]]
                        .env
                        .author
                        .kind
                        == about.author.kind
            })
            .count();
        let text = super::reply_text(w, self.idx, root, about.author.kind == AuthorKind::Bot, k);
        self.run.log(st, Some(self.idx), |s| {
            format!(
                "{what} {} ({lat} ms){}",
                num(s, &about.id),
                if failed { ", FAILS" } else { "" }
            )
        });
        (lat, (!failed).then_some(text))
    }
}

impl Llm for SimBot {
    fn complete<'a>(&'a self, call: LlmCall<'a>) -> BoxFuture<'a, Result<Completion, LlmError>> {
        let LlmCall {
            purpose,
            messages,
            about,
            ..
        } = call;
        Box::pin(async move {
            let run = &self.run;
            let w = &run.w;
            let (latency, answer) = {
                let mut st = run.state.lock();
                match purpose {
                    Purpose::Judge | Purpose::Draft => {
                        let (lat, text, _) = self.judge_part(&mut st, messages, about, "judges");
                        (lat, text)
                    }
                    Purpose::SharedJudge => {
                        // One call for every bot: counted once, answered from every
                        // bot's script (the parser keeps the bots it asked about).
                        let prompt_len = messages.iter().map(|m| m.content.len()).sum::<usize>();
                        st.tally.prompt_bytes += prompt_len as u64;
                        st.tally.sent_bytes += prompt_len as u64;
                        st.tally.prompts += 1;
                        if about.author.kind == AuthorKind::Bot {
                            st.tally.judge_bot += 1;
                        } else {
                            st.tally.judge_human += 1;
                        }
                        let post = &st.posts[st.by_id[&about.id]];
                        let mut all = serde_json::Map::new();
                        for (i, b) in w.bots.iter().enumerate() {
                            let mentioned = post.mentioned.contains(&i);
                            let v = super::scripted_verdict(w, i, about, post, mentioned, false);
                            all.insert(
                                b.name.clone(),
                                serde_json::json!({"speak": v.speak, "relevance": v.relevance}),
                            );
                        }
                        let p = w.scenario.timing.judge_fail;
                        let failed = p > 0.0 && st.rng.gen_bool(p.min(1.0));
                        let lat = w.judge_lat[self.idx].sample(&mut st.rng);
                        run.log(&mut st, Some(self.idx), |s| {
                            format!(
                                "judges {} for the mesh in {lat} ms{} ({prompt_len} B prompt)",
                                num(s, &about.id),
                                if failed { ", FAILS" } else { "" },
                            )
                        });
                        (
                            lat,
                            (!failed).then(|| serde_json::Value::Object(all).to_string()),
                        )
                    }
                    Purpose::Reply => {
                        st.tally.reply_calls += 1;
                        st.tally.sent_bytes +=
                            messages.iter().map(|m| m.content.len()).sum::<usize>() as u64;
                        self.reply_part(&mut st, about, "writes a reply to")
                    }
                }
            };
            let is_agent = w.scenario.bots[self.idx].agent.is_some();
            let answer = if purpose == Purpose::Reply && is_agent {
                self.agent_turn(about, latency, answer).await
            } else {
                tokio::time::sleep(Duration::from_millis(latency)).await;
                answer
            };
            let text = answer.ok_or(LlmError::Timeout)?;
            if purpose == Purpose::Reply {
                run.state.lock().written += 1;
            }
            Ok(Completion::offline(text))
        })
    }

    /// One call, counted as the judge call it replaces: the verdict line comes after
    /// the judge's latency; a draft (when the verdict says speak) is done at the later
    /// of that and the reply's own latency, which already covers the wait for a first
    /// token that the verdict line paid for. A bot that declines writes nothing more.
    fn draft<'a>(
        &'a self,
        call: LlmCall<'a>,
    ) -> BoxFuture<'a, Result<crate::llm::Drafting, LlmError>> {
        let LlmCall {
            messages, about, ..
        } = call;
        Box::pin(async move {
            let run = self.run.clone();
            let (head_ms, head, rest) = {
                let mut st = run.state.lock();
                let (lat, head, v) = self.judge_part(&mut st, messages, about, "judges and drafts");
                let rest = (head.is_some() && v.speak)
                    .then(|| self.reply_part(&mut st, about, "  drafts a reply to"));
                (lat, head, rest)
            };
            tokio::time::sleep(Duration::from_millis(head_ms)).await;
            let head = head.ok_or(LlmError::Timeout)?;
            let rest: BoxFuture<'static, Result<Completion, LlmError>> = match rest {
                None => Box::pin(async { Ok(Completion::offline("")) }),
                Some((reply_ms, text)) => Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(reply_ms.saturating_sub(head_ms)))
                        .await;
                    let text = text.ok_or(LlmError::Timeout)?;
                    run.state.lock().written += 1;
                    Ok(Completion::offline(text))
                }),
            };
            Ok(crate::llm::Drafting { head, rest })
        })
    }
}

/// The bot's own transcript, in the order its messages reached it.
impl SliceLog for SimBot {
    fn read_log<R>(&self, read: impl FnOnce(&[Arc<Envelope>]) -> R) -> R {
        read(&self.transcript.lock())
    }
}

impl Ports for SimBot {
    fn brain(&self) -> &Brain {
        &self.brain
    }

    fn mesh(&self) -> Arc<MeshSettings> {
        self.run.w.mesh.clone()
    }

    fn llm(&self) -> &dyn Llm {
        self
    }

    fn now_millis(&self) -> u64 {
        self.run.now()
    }

    fn new_id(&self) -> Ulid {
        let mut st = self.run.state.lock();
        st.next_id += 1;
        Ulid::from_parts(self.run.now(), st.next_id)
    }

    fn jitter_ms(&self, max_ms: u64) -> u64 {
        match max_ms {
            0 => 0,
            m => self.run.state.lock().rng.gen_range(0..=m),
        }
    }

    fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    fn broadcast(&self, env: &Envelope) {
        self.send_claim(env, None);
    }

    fn send_to(&self, peers: &[String], env: &Envelope) {
        let to: Vec<usize> = peers
            .iter()
            .filter_map(|n| self.run.w.bots.iter().position(|b| &b.name == n))
            .collect();
        self.send_claim_to(&to, env, None);
    }

    fn broadcast_tracked(&self, env: &Envelope) -> ClaimAcks {
        let peers = (0..self.run.w.bots.len())
            .filter(|p| *p != self.idx)
            .map(|p| self.run.w.bots[p].name.clone())
            .collect();
        let acks = self.acks.track(&env.id.to_string(), peers);
        {
            let mut st = self.run.state.lock();
            let (trigger, r) = (
                env.reply_to.unwrap_or_default(),
                env.relevance.unwrap_or(0.0),
            );
            self.run.log(&mut st, Some(self.idx), |s| {
                format!("claims {} at {r:.2}", num(s, &trigger))
            });
        }
        self.send_claim(env, Some(&self.acks));
        acks
    }

    fn publish(self: Arc<Self>, env: Envelope) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async move {
            let env = Arc::new(env);
            let run = self.run.clone();
            let mut st = run.state.lock();
            let trigger = env.reply_to.unwrap_or_default();
            let root = st.by_id.get(&trigger).map_or(0, |i| st.posts[*i].root);
            run.register(&mut st, env.clone(), root);
            st.tally.bot_posts += 1;
            if st.questions.contains(&trigger) {
                st.tally.ask_replies += 1;
            }
            if !st.questions.contains(&env.id) && st.asking_turns.remove(&(self.idx, trigger)) {
                st.tally.ask_turns_finished += 1;
            }
            run.log(&mut st, Some(self.idx), |s| {
                format!(
                    "{} posts (reply to {}, depth {}): {}",
                    num(s, &env.id),
                    num(s, &trigger),
                    env.depth,
                    env.text
                )
            });
            if st.tally.bot_posts as usize >= RUNAWAY_POSTS {
                st.tally.runaway_runs = 1;
                run.log(&mut st, None, |_| {
                    format!("stopped: {RUNAWAY_POSTS} bot messages")
                });
                run.done.cancel();
            }
            for p in 0..run.w.bots.len() {
                if p == self.idx {
                    continue;
                }
                let to = run.w.bots[p].name.clone();
                let (d, _) = st.link(&run.w, run.now(), self.name(), &to, Carry::Message);
                run.deliver(p, env.clone(), d);
            }
            drop(st);
            // Recorded as `Node::publish` records: the bot's own message, observed.
            self.receive(env);
            Ok(())
        })
    }

    fn event(&self, event: Event) {
        if let Event::Progress { text, trigger, .. } = &event {
            let mut st = self.run.state.lock();
            st.tally.progress_events += 1;
            let id = Ulid::from_string(trigger).unwrap_or_default();
            self.run.log(&mut st, Some(self.idx), |s| {
                format!("{}: progress: {text}", num(s, &id))
            });
            return;
        }
        if let Event::Decision {
            action,
            reason,
            trigger,
            ..
        } = event
        {
            let mut st = self.run.state.lock();
            st.tally.reason(&action, &reason);
            let id = Ulid::from_string(&trigger).unwrap_or_default();
            self.run.log(&mut st, Some(self.idx), |s| {
                format!("{}: {action}/{reason}", num(s, &id))
            });
        }
    }
}
