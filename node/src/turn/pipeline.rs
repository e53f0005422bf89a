//! Taking turns: what a node does with each new message.
//!
//! `consider` runs the pipeline for one message: policy (depth, quiet, caps, mentions,
//! local filters) → judge (one short LLM call, or the offline overlap judge) →
//! scheduler (relevance-scaled wait with claims, yield, one re-judge) → reply (one
//! LLM call) → for an interjection, the claim's acknowledgements and the commit →
//! publish (transcript + every peer's outbox). Each step logs its decision and counts
//! it in `botmesh_decisions_total{action,reason}`.
//!
//! Before an interjection is posted, the bot waits (at most `claim_ack_timeout_ms`)
//! until its claim has reached every peer ([`crate::egress::acks`]): a peer that already
//! committed to answer says so in its acknowledgement, and the bot yields
//! (`yield_writing/already_answered`). Then it commits on its board
//! ([`crate::turn::scheduler::ClaimBoard::commit`]): behind a better claim that arrived meanwhile it stands
//! by with its written reply; otherwise it is marked as answering, so any claim that
//! reaches it from now on is told so. A claim that is late in transit therefore
//! cannot produce a second answer. If some peer never acknowledges in time, the bot
//! posts anyway, logged at warn and counted as `post/claim_unacked`.
//!
//! Until it posts, a turn can be dropped by a person's `/stop` in its group (the
//! group's stop token, `turn::control`): whatever is in flight (judge, wait, writing,
//! acknowledgements) is abandoned and the claim withdrawn (`withdraw/stopped`).

use std::sync::Arc;
use std::time::Duration;

use crate::egress::acks::ClaimAcks;
use crate::engine::{TurnContext, Written};
use crate::store::turn_queries::RateCount;
use crate::store::verdicts::{VerdictRecord, VERDICT_FORMAT};
use crate::telemetry::events::Event;
use crate::turn::brain::{Brain, Judged, PendingDraft, Reply};
use crate::turn::context::{bots_since_human, context_before, RATE_WINDOW_MS};
use crate::turn::control::{is_command, StopSignal};
use crate::turn::mention::PlatformMention;
use crate::turn::outcome::OutcomeSlot;
use crate::turn::policy::{Action, Decision};
use crate::turn::ports::Ports;
use crate::turn::record::record;
use crate::turn::scheduler::{delay_for, grace_for, Standing, Yield, MIN_CLAIM, WITHDRAWN};
use crate::turn::shared_judge as shared;
use crate::turn::status::StatusFeed;
use crate::turn::typing::typing_while;
use crate::wire::envelope::{Envelope, Kind, Why};

/// A newly recorded message reaches the turn code: the local rules at once
/// ([`triage`], recorded), then, when there is anything to do, the task to spawn — this
/// bot's turn ([`act`]) and, with a shared judge, the verdict this bot was chosen to
/// ask for ([`crate::turn::shared_judge::ask`]). `platform`: the platform's mention list
/// (Feishu `mentions[]`, empty elsewhere). Boxed with an explicit `Send` because
/// replying records a message, which comes back here.
pub(crate) fn on_message<P: Ports>(
    p: &Arc<P>,
    msg: &Arc<Envelope>,
    platform: Vec<PlatformMention>,
) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
    let d = triage(&**p, msg, &platform);
    let duty = shared::duty(&**p, msg, &platform, d.map_or(Action::Silent, |d| d.action));
    if d.is_none() && duty.is_none() {
        return None;
    }
    // The turn holds its group's stop token from now on (taken here, as the message
    // is recorded), so a person's `/stop` drops it even before its task runs.
    let stop = p.brain().stops.token(&msg.group);
    let (p, msg) = (p.clone(), msg.clone());
    Some(Box::pin(async move {
        let asking = async {
            if let Some(duty) = duty {
                shared::ask(&*p, &msg, duty).await;
            }
        };
        // A turn decides again in its task, where a yield that this very message
        // causes (an answer waking a waiting turn, which then passes on the thread)
        // has been taken into account.
        let acting = async {
            if d.is_some() {
                if let Some(d) = triage(&*p, &msg, &platform) {
                    act(p.clone(), msg.clone(), d, stop).await;
                }
            }
        };
        tokio::join!(asking, acting);
    }))
}

/// The local rules for a newly recorded message: `None` when the bot stays silent (the
/// decision is recorded), else what [`act`] is to do. Cheap and synchronous, so the
/// node runs it as the message is recorded and spawns a turn only when there is one.
pub(crate) fn triage<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    platform: &[PlatformMention],
) -> Option<Decision> {
    let brain = p.brain();
    let mesh = p.mesh();
    if msg.kind != Kind::Message || is_command(msg, &brain.tuning()) {
        // A person's command is carried out by the node (`app::commands`), never judged.
        return None;
    }
    let now = p.now_millis();
    let recent_bots = bots_since_human(p, &msg.group, now);
    let mut d = brain.decide(&mesh, msg, platform, recent_bots, p.quiet(&msg.group));
    let age_secs = now.saturating_sub(msg.sent_at) / 1000;
    if d.action != Action::Silent && age_secs > mesh.stale_after_secs {
        // A catch-up after downtime: on record, but the conversation has moved on.
        d.action = Action::Silent;
        d.reason = "stale";
    }
    if d.action != Action::Silent && !brain.engine.takes_turns() {
        // An outside agent takes this bot's turns through `wait_for_message` (the
        // message is in its queue when it addresses the bot): the node never answers.
        d.action = Action::Silent;
        d.reason = "external_agent";
    }
    if d.action != Action::Silent && !within_budget(brain, &d, now) {
        d.action = Action::Silent;
        d.reason = "budget";
    }
    if d.everyone {
        // A round: the colleagues' answers to it are what was asked for, not triggers
        // of their own, so they cost no judge call (unless they mention this bot).
        brain.board.pass(msg.id);
    }
    // From here a peer's claim on it is answered from what this node decided (judging
    // while the judge is out), no longer as a trigger not yet looked at.
    brain.board.decided(msg.id, d.action == Action::Judge);
    if d.reason == "addressed_to_other" {
        // Someone else was asked: the exchange that follows is theirs, so this bot's
        // judge is not asked about the answers to it either (`passed_on_thread`).
        brain.board.pass(msg.id);
    }
    if d.action == Action::Silent {
        // Own messages are not worth a log line each.
        if d.reason != "own_message" {
            record(p, msg, "silent", d.reason, "");
        }
        send_owed_word(p, msg);
        return None;
    }
    Some(d)
}

/// Whether the day's LLM budget lets the bot act on `d`: past it, it judges nothing
/// and answers only mentions that need no judge (or nothing, `over_budget = "silent"`).
fn within_budget(brain: &Brain, d: &Decision, now_ms: u64) -> bool {
    match brain.spent_today(now_ms) {
        None => true,
        Some(over) => {
            over == crate::config::OverBudget::Mentions && d.action == Action::Reply && d.mentioned
        }
    }
}

/// Carries out a [`triage`] decision that is not silence: judge, wait and claim,
/// write, check once more, settle the claim and commit, post. Until it posts, the
/// group's `stop` token (a person's `/stop`) drops the turn: the LLM call or the wait
/// in flight is abandoned, the claim withdrawn ([`stopped`]).
pub(crate) async fn act<P: Ports>(p: Arc<P>, msg: Arc<Envelope>, d: Decision, stop: StopSignal) {
    // How an agent's turn ended, said once it has (`turn::outcome`).
    let slot = OutcomeSlot::default();
    let ready = tokio::select! {
        biased;
        _ = stop.cancelled() => {
            stopped(&*p, &msg);
            let by = stop.by().unwrap_or_else(|| "a person".into());
            if let Some(outcome) = slot.stopped(by) {
                crate::turn::outcome::announce(p, &msg, outcome).await;
            }
            return;
        }
        r = prepare(&*p, &msg, &d, &slot, &stop) => r,
    };
    if let Some((reply, why, reason)) = ready {
        post_step(p.clone(), &msg, reply, why, reason).await;
    }
    if let Some(outcome) = slot.take() {
        crate::turn::outcome::announce(p, &msg, outcome).await;
    }
}

/// A turn dropped by a person's `/stop`: the judge is no longer out, a word owed to
/// claimants is sent, the claim is withdrawn (`withdraw/stopped`), and the decision is
/// recorded (`silent/stopped`).
fn stopped<P: Ports + ?Sized>(p: &P, msg: &Envelope) {
    let brain = p.brain();
    brain.board.set_judging(msg.id, false);
    record(p, msg, "silent", "stopped", "a person's /stop");
    send_owed_word(p, msg);
    withdraw_claim_for(p, msg, "stopped", "a person's /stop");
}

/// [`act`] up to the post: `Some` is the reply to post, why and its short label. An
/// agent's turn leaves how it ended in `slot`; its status names who `stop`ped it.
async fn prepare<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    d: &Decision,
    slot: &OutcomeSlot,
    stop: &StopSignal,
) -> Option<(Reply, Why, &'static str)> {
    let (why, relevance, draft) = judge_step(p, msg, d).await?;
    // The claim's acknowledgements, for an interjection (a round to everyone does not
    // wait for them: nobody yields there).
    let mut acks = None;
    let mut early = Early::NotWritten;
    if let Some(r) = relevance {
        // `None`: the wait ended the turn and withdrew the claim itself.
        let waited = wait_turn(p, msg, r, d.everyone, draft).await?;
        acks = Some(waited.acks).filter(|_| !d.everyone);
        early = waited.reply;
    } else if let Some(draft) = draft {
        // Mentioned past the threshold and the drafting judge agreed: its draft is
        // the answer. Written ahead of the turn's status: its tool calls show nowhere.
        early = match p
            .brain()
            .finish_draft(p.llm(), msg, draft, &StatusFeed::off())
            .await
        {
            Some(r) => Early::Written(r),
            None => Early::Failed,
        };
    }
    // From here on, every way out that posts nothing withdraws this bot's claim, so
    // the bots that stood by behind it re-enter (a yield is not final).
    let claimed = relevance.is_some();
    if p.stopping().is_cancelled() {
        withdraw_if(p, msg, claimed, "shutting down");
        return None;
    }
    let reason = why_label(&why);
    // An ACP agent's turn takes minutes: an interjecting bot wins the turn before it
    // hands the agent the work (the claim settled and committed), so the turn cannot
    // be lost while the agent works. A better claim heard from then on is told the
    // trigger is answered, and that bot yields (see docs/agents.md).
    let mut committed = false;
    if let (Some(r), Some(acks), true) =
        (relevance, acks.as_mut(), p.brain().engine.wins_turn_first())
    {
        let nothing_yet = Reply {
            text: String::new(),
            tokens: 0,
        };
        if !settle_claim(p, msg, acks, &nothing_yet).await
            || !commit_step(p, msg, r, &nothing_yet).await
        {
            return None;
        }
        committed = true;
    }
    let reply = if matches!(early, Early::NotWritten) {
        // The bot has its turn and the reply is still to write (a sidecar, an ACP
        // agent, or a model that did not write while waiting): the chat sees it typing,
        // and a turn that runs long gets its status message.
        let me = p.brain().me();
        let status = Envelope::answer(
            p.new_id(),
            p.now_millis(),
            &me.name,
            msg,
            String::new(),
            why.clone(),
        );
        let (reply, took) = crate::turn::status::with_status(
            p.status_port(),
            crate::turn::status::StatusTiming::of(&me),
            status,
            stop.clone(),
            slot,
            |feed| async move {
                typing_while(
                    p,
                    &msg.group,
                    write_step(p, msg, reason, relevance, early, slot, &feed),
                )
                .await
            },
            Option::is_some,
        )
        .await;
        crate::turn::status::mention_asker(msg, reply?, took)
    } else {
        // Written early: the work is done, there is nothing to show.
        write_step(p, msg, reason, relevance, early, slot, &StatusFeed::off()).await?
    };
    if !last_check_step(p, msg, d, relevance, &reply) {
        return None;
    }
    if let (Some(r), Some(acks), false) = (relevance, acks.as_mut(), committed) {
        if !settle_claim(p, msg, acks, &reply).await || !commit_step(p, msg, r, &reply).await {
            return None;
        }
    }
    Some((reply, why, reason))
}

/// The short name of why the bot speaks, for logs and the sidecar.
fn why_label(why: &Why) -> &'static str {
    match why {
        Why::Mentioned => "mentioned",
        Why::Interjected { .. } => "interjected",
        Why::AlwaysAnswers => "always_answers",
        Why::Posted => "posted",
    }
}

/// Withdraws this bot's claim on `msg` when it `claimed` one.
fn withdraw_if<P: Ports + ?Sized>(p: &P, msg: &Envelope, claimed: bool, why: &str) {
    if claimed {
        withdraw_claim(p, msg, why);
    }
}

/// [`act`]'s first step: why the bot speaks, for an interjection the relevance it
/// claims at (the judge's), and the reply a drafting judge is writing; or `None` when
/// it stays silent (recorded; a word owed to a claimant is sent).
pub(crate) async fn judge_step<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    d: &Decision,
) -> Option<(Why, Option<f64>, Option<PendingDraft>)> {
    let brain = p.brain();
    match d.action {
        Action::Silent => None,
        Action::Reply => {
            record(p, msg, "reply", d.reason, "");
            let why = if d.mentioned {
                Why::Mentioned
            } else {
                Why::AlwaysAnswers
            };
            Some((why, None, None))
        }
        Action::Judge => {
            record(p, msg, "judge", d.reason, "");
            // One snapshot for the step: a reload meanwhile applies from the next one.
            let me = brain.me();
            // While the judge is out, a peer's claim on this trigger is answered
            // `judging`: that peer then waits for this bot's word before it commits.
            // (Triage set it already.)
            brain.board.set_judging(msg.id, true);
            // With a shared judge, its verdict (kept in the verdict log without a prompt
            // hash: replay asks anew or guesses); else, or if none comes, this bot's own.
            // A drafting judge writes the reply in the same call, from the reply's
            // context.
            let (judged, draft) = match shared::verdict_for(p, msg).await {
                Some(v) => (
                    Judged {
                        verdict: Some(v),
                        model: "shared".into(),
                        prompt_hash: None,
                        prompt_bytes: 0,
                    },
                    None,
                ),
                None if me.judge_drafts => {
                    let context = context_before(p, msg, me.context_messages.max(12));
                    brain.judge_drafting(p.llm(), &context, msg).await
                }
                None => {
                    let context = context_before(p, msg, me.context_messages);
                    (brain.judge_traced(p.llm(), &context, msg).await, None)
                }
            };
            brain.board.set_judging(msg.id, false);
            let Some(v) = judged.verdict else {
                keep_verdict(p, msg, &judged, false, ("silent", "judge_failed"), None);
                record(p, msg, "silent", "judge_failed", "");
                send_owed_word(p, msg);
                return None;
            };
            if !v.speak || v.relevance < me.min_relevance {
                if draft.is_some() {
                    // Spoke, but below this bot's bar: the draft goes unfinished.
                    brain.metrics.reply_discarded("draft_dropped", 0);
                }
                keep_verdict(p, msg, &judged, false, ("silent", "judge_declined"), None);
                record(
                    p,
                    msg,
                    "silent",
                    "judge_declined",
                    &format!("speak={} relevance={:.2}", v.speak, v.relevance),
                );
                send_owed_word(p, msg);
                return None;
            }
            if d.mentioned {
                // Mentioned past the threshold, and the judge agreed: answer without a wait.
                keep_verdict(p, msg, &judged, false, ("reply", "mentioned"), None);
                Some((Why::Mentioned, None, draft))
            } else {
                let delay = delay_for(&me, v.relevance.max(MIN_CLAIM), 0);
                keep_verdict(
                    p,
                    msg,
                    &judged,
                    false,
                    ("claim", "interjected"),
                    Some(delay.as_millis() as u64),
                );
                Some((
                    Why::Interjected {
                        relevance: v.relevance,
                    },
                    Some(v.relevance.max(MIN_CLAIM)),
                    draft,
                ))
            }
        }
    }
}

/// Hands a judge answer and what the bot did with it (`action`, `reason`) to
/// [`Ports::judged`]: the node's verdict log, which `botmesh replay` reads.
fn keep_verdict<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    judged: &Judged,
    rejudge: bool,
    (action, reason): (&str, &str),
    delay_ms: Option<u64>,
) {
    let me = p.brain().me();
    p.judged(VerdictRecord {
        v: VERDICT_FORMAT,
        at: p.now_millis(),
        group: msg.group.clone(),
        msg: msg.id,
        from: msg.author.name.clone(),
        rejudge,
        model: judged.model.clone(),
        prompt_hash: judged.prompt_hash.clone(),
        prompt_bytes: judged.prompt_bytes,
        speak: judged.verdict.map(|v| v.speak),
        relevance: judged.verdict.map(|v| v.relevance),
        action: action.into(),
        reason: reason.into(),
        delay_ms,
        min_relevance: Some(me.min_relevance),
    });
}

/// [`act`]'s writing step: the reply written while waiting, else (nothing written
/// early, or that early call failed) the bot's reply engine's, through its one
/// [`crate::engine::ReplyEngine::write`]. `None`: nothing to post (recorded; the
/// claim withdrawn), or the engine answers later (a sidecar, through
/// `POST /v1/messages`). The work's progress (the model's tool calls, an agent's
/// updates) and how it ended go to the turn's status through `feed`, how an agent's
/// turn ended to `slot`.
async fn write_step<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    reason: &str,
    relevance: Option<f64>,
    early: Early,
    slot: &OutcomeSlot,
    feed: &StatusFeed,
) -> Option<Reply> {
    let brain = p.brain();
    let claimed = relevance.is_some();
    match early {
        Early::Written(reply) => return Some(reply),
        Early::Failed => {
            // Writing while waiting (or the drafting judge's draft) runs ahead of the
            // turn, often behind a better claim: its failure is not the turn's. Now that
            // the bot has the turn (its wait is over, or the winner it stood by behind
            // withdrew), it writes once more as a bot that wrote nothing early, instead
            // of leaving a question that it is the fallback for unanswered.
            tracing::info!(bot = %brain.me().name, trigger = %msg.id, "the reply written while waiting failed: writing it again now that this bot has the turn");
        }
        Early::NotWritten => {}
    }
    let me = brain.me();
    let tuning = brain.tuning();
    let host = crate::turn::engine_host::EngineHost {
        p,
        msg,
        why: reason,
    };
    let turn = TurnContext {
        msg,
        why: reason,
        relevance,
        me: &me,
        ask_timeout_secs: tuning.mesh.ask_timeout_secs,
        llm: brain.metered(p.llm(), &me.name),
        status: feed,
        trail: &brain.trail,
        outcome: slot,
        stopping: p.stopping(),
        host: &host,
    };
    match brain.engine.write(&turn).await {
        Written::Reply(reply) => Some(reply),
        Written::Later { detail } => {
            record(p, msg, "reply", "handed_to_agent", detail);
            None
        }
        Written::Silent(s) => {
            record(p, msg, "silent", s.reason, &s.detail);
            withdraw_if(p, msg, claimed, s.withdraw);
            None
        }
    }
}

/// [`act`]'s check after writing: the world may have moved during the LLM call, so
/// the hard rules once more. In a round, the answers of the bots whose claims go
/// first count against the rate cap even before they arrive: they post first
/// whatever happens, so counting only what has arrived would let bots that finish
/// together all pass the cap. `false`: stopped here (recorded, reply discarded).
fn last_check_step<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    d: &Decision,
    relevance: Option<f64>,
    reply: &Reply,
) -> bool {
    let brain = p.brain();
    let ahead = match relevance {
        Some(r) if d.everyone => brain.board.claims_ahead(msg.id, &brain.me().name, r),
        _ => Vec::new(),
    };
    let count = RateCount {
        limit: 64,
        now_ms: p.now_millis(),
        window_ms: RATE_WINDOW_MS,
        trigger: &msg.id,
        ahead: &ahead,
    };
    let (recent_bots, due) = p.rate_count(&msg.group, &count);
    let last = crate::turn::policy::last_check(
        &p.mesh(),
        p.quiet(&msg.group),
        msg.depth,
        recent_bots + due,
    );
    let Some(reason) = last else {
        return true;
    };
    record(
        p,
        msg,
        "silent",
        reason,
        &format!("checked again before sending: {recent_bots} bot messages recorded, {due} due from bots ahead in the round"),
    );
    brain.metrics.reply_discarded(reason, reply.tokens);
    withdraw_if(p, msg, relevance.is_some(), reason);
    false
}

/// [`act`]'s commit for an interjection, in one step with the last standing check.
/// Behind a better claim heard meanwhile it stands by with the text written, and goes
/// on only if that claim is withdrawn (after the hard rules once more), then commits
/// again. `false`: it yielded or a rule stopped it (recorded, reply discarded).
async fn commit_step<P: Ports + ?Sized>(p: &P, msg: &Envelope, r: f64, reply: &Reply) -> bool {
    let brain = p.brain();
    let me = brain.me();
    loop {
        let y = match brain.board.commit(msg.id, &me.name, r) {
            Ok(()) => return true,
            Err(y @ Yield::Answered { .. }) => Some(y),
            Err(Yield::BetterClaim { .. }) => {
                let now = tokio::time::Instant::now();
                let grace = grace_for(&me, r);
                tokio::select! {
                    y = brain.board.wait(msg.id, &me.name, r, now, grace) => y,
                    _ = p.stopping().cancelled() => Some(Yield::Answered { bot: String::new() }),
                }
            }
        };
        if let Some(y) = y {
            let detail = format!("{y:?} while writing");
            let why = "yielded while writing";
            discard_reply(p, msg, ("yield_writing", y.reason()), &detail, reply, why);
            return false;
        }
        record(
            p,
            msg,
            "resume",
            "claim_withdrawn",
            "posting the reply written meanwhile",
        );
        let recent_bots = bots_since_human(p, &msg.group, p.now_millis());
        let last =
            crate::turn::policy::last_check(&p.mesh(), p.quiet(&msg.group), msg.depth, recent_bots);
        if let Some(reason) = last {
            let detail = "checked again before sending";
            discard_reply(p, msg, ("silent", reason), detail, reply, reason);
            return false;
        }
    }
}

/// [`act`]'s last step: the reply as an envelope one turn deeper, published (the
/// platform, the transcript, every peer).
async fn post_step<P: Ports>(p: Arc<P>, msg: &Envelope, reply: Reply, why: Why, reason: &str) {
    let me = p.brain().me().name.clone();
    let env = Envelope::answer(p.new_id(), p.now_millis(), &me, msg, reply.text, why);
    let (id, depth) = (env.id, env.depth);
    match p.publish(env).await {
        Ok(_) => tracing::info!(bot = %me, %id, trigger = %msg.id, depth, reason, "replied"),
        Err(e) => {
            tracing::error!(bot = %me, trigger = %msg.id, error = %e, "reply could not be recorded; not sent")
        }
    }
}

/// How many `claim_ack_timeout_ms` an interjection waits, at most, for the
/// acknowledgement of a peer whose link still works.
const CLAIM_ACK_PATIENCE: u32 = 4;

/// Before an interjection commits: waits until its claim has reached every peer, so
/// that it cannot land on a peer after that peer has answered too (a peer that already
/// answers says so: yield), and for the word of every peer that was still judging when
/// the claim reached it (it may be the more relevant bot). `false`: the turn ended here
/// (yielded or stopping; the claim is withdrawn).
///
/// A claim that a lossy link dropped arrives on a retry a few hundred ms later, so the
/// wait goes on past `claim_ack_timeout_ms` (up to [`CLAIM_ACK_PATIENCE`] times it) for
/// every peer whose link works; a peer whose link has been failing for the whole
/// timeout is taken for down and not waited for (`post/claim_unacked`). If such a peer
/// holds a claim of its own on the trigger, it goes ahead without knowing of this
/// bot, so this bot yields to it instead (`yield_writing/unheard_by_claimant`).
async fn settle_claim<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    acks: &mut ClaimAcks,
    reply: &Reply,
) -> bool {
    let brain = p.brain();
    let timeout = Duration::from_millis(brain.me().claim_ack_timeout_ms);
    let hard = tokio::time::Instant::now() + timeout * CLAIM_ACK_PATIENCE;
    let mut known = tokio::select! {
        a = acks.wait(timeout) => a,
        _ = p.stopping().cancelled() => {
            withdraw_claim(p, msg, "shutting down");
            return false;
        }
    };
    while !known.settled() && !timeout.is_zero() {
        let now = tokio::time::Instant::now();
        let alive = known
            .pending
            .iter()
            .any(|peer| p.link_failing_for(peer).is_none_or(|d| d < timeout));
        if !alive || now >= hard {
            break;
        }
        let step = (hard - now).min(Duration::from_millis(250));
        known = tokio::select! {
            a = acks.wait(step) => a,
            _ = p.stopping().cancelled() => {
                withdraw_claim(p, msg, "shutting down");
                return false;
            }
        };
    }
    if let Some(bot) = known.answered.first() {
        brain.board.answered(msg.id, bot);
        let detail = format!("{bot} answers it, by its acknowledgement of this bot's claim");
        let reason = ("yield_writing", "already_answered");
        discard_reply(p, msg, reason, &detail, reply, "yielded while writing");
        return false;
    }
    if !known.judging.is_empty() {
        // Peers whose judge was still out when this claim reached them: a slower
        // judge may still be the more relevant bot. Wait for each one's word (its
        // claim, its withdrawal, or its answer) before committing.
        let until =
            tokio::time::Instant::now() + Duration::from_millis(brain.me().judge_word_timeout_ms);
        let silent = tokio::select! {
            s = brain.board.await_words(msg.id, &known.judging, until) => s,
            _ = p.stopping().cancelled() => {
                withdraw_claim(p, msg, "shutting down");
                return false;
            }
        };
        if !silent.is_empty() {
            tracing::warn!(bot = %brain.me().name, trigger = %msg.id, silent = ?silent, "peers that were judging sent no word in time; going on");
            record(
                p,
                msg,
                "post",
                "judge_word_missing",
                &format!("no word from {}", silent.join(", ")),
            );
        }
    }
    if !known.pending.is_empty() && !timeout.is_zero() {
        // A peer that has not heard this claim but whose own claim on the trigger is
        // here goes ahead without knowing of this bot (it waits for no word it was not
        // promised, or gives up waiting for one): posting now would answer twice, and
        // this bot's answer would reach it late anyway, behind the claim stuck on the
        // same link. Let it answer; its withdrawal, should its turn fail, comes over
        // the link that brought its claim, and the bots standing by re-enter.
        if let Some(peer) = known
            .pending
            .iter()
            .find(|peer| brain.board.has_claim(msg.id, peer))
        {
            let detail = format!("{peer} claims it too and has not heard this bot's claim");
            let reason = ("yield_writing", "unheard_by_claimant");
            discard_reply(
                p,
                msg,
                reason,
                &detail,
                reply,
                "a claimant has not heard this claim",
            );
            return false;
        }
        tracing::warn!(bot = %brain.me().name, trigger = %msg.id, unacked = ?known.pending, timeout_ms = brain.me().claim_ack_timeout_ms, "claim not acknowledged by every peer in time (their links fail); posting anyway");
        record(
            p,
            msg,
            "post",
            "claim_unacked",
            &format!("no acknowledgement from {}", known.pending.join(", ")),
        );
    }
    true
}

/// A claim envelope for `msg` at `relevance` ([`WITHDRAWN`]: a withdrawal).
fn claim_envelope<P: Ports + ?Sized>(p: &P, msg: &Envelope, relevance: f64) -> Envelope {
    Envelope::claim(
        p.new_id(),
        p.now_millis(),
        &p.brain().me().name,
        msg,
        relevance,
    )
}

/// Throws the written `reply` away: the decision recorded (`action`, `reason`:
/// `detail`), its tokens counted as discarded under `reason`, the claim withdrawn
/// (`why`).
fn discard_reply<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    (action, reason): (&'static str, &'static str),
    detail: &str,
    reply: &Reply,
    why: &str,
) {
    record(p, msg, action, reason, detail);
    p.brain().metrics.reply_discarded(reason, reply.tokens);
    withdraw_claim(p, msg, why);
}

/// Withdraws this bot's claim on `msg` (if it still holds one) and tells the peers,
/// so the bots that stood by behind it re-enter (recorded as `withdraw/claim`).
pub(crate) fn withdraw_claim<P: Ports + ?Sized>(p: &P, msg: &Envelope, why: &str) {
    withdraw_claim_for(p, msg, "claim", why);
}

/// [`withdraw_claim`], recorded as `withdraw/{reason}` with `why` as its detail.
fn withdraw_claim_for<P: Ports + ?Sized>(p: &P, msg: &Envelope, reason: &'static str, why: &str) {
    let brain = p.brain();
    let me = brain.me().name.clone();
    if !brain.board.has_claim(msg.id, &me) {
        return;
    }
    brain.board.withdraw(msg.id, &me);
    if brain.board.answered_by_other(msg.id, &me) {
        // Everyone hears that answer anyway: nobody is left behind this claim.
        return;
    }
    let env = claim_envelope(p, msg, WITHDRAWN);
    p.broadcast(&env);
    p.event(Event::Claim {
        envelope: Arc::new(env),
    });
    record(p, msg, "withdraw", reason, why);
}

/// After local rules or a judge that did not lead to a claim: if this bot told a
/// claimant it was still judging the trigger (or had not looked at it yet), it owes
/// the peers its word, so it sends a withdrawal (relevance 0) and nobody waits on it
/// any longer. One message to each such claimant, only in that case.
fn send_owed_word<P: Ports + ?Sized>(p: &P, msg: &Envelope) {
    let owed = p.brain().board.take_owed_word(msg.id);
    if owed.is_empty() {
        return;
    }
    let env = claim_envelope(p, msg, WITHDRAWN);
    p.send_to(&owed, &env);
    record(
        p,
        msg,
        "withdraw",
        "after_judging",
        &format!("{} waited for this bot's word", owed.join(", ")),
    );
}

/// What a reply written while waiting came to.
enum Early {
    /// Nothing was written early (behind a better claim at the start, a sidecar
    /// agent, or the text went stale): write it now.
    NotWritten,
    /// Written while the wait ran.
    Written(Reply),
    /// The LLM call failed (logged and counted there): [`write_step`] writes once
    /// more when the bot has the turn.
    Failed,
}

/// What [`wait_turn`] hands back when the bot is to go ahead.
struct Waited {
    /// The claim's acknowledgements, to await before posting.
    acks: ClaimAcks,
    /// The reply written while waiting, if any.
    reply: Early,
}

/// Counts a reply that will not be posted: `written` is what the early writing came
/// to (`None`: still in flight, cancelled now by dropping it).
fn discard(brain: &Brain, written: Option<&Option<Reply>>, writing: bool, reason: &str) {
    match written {
        Some(Some(r)) => brain.metrics.reply_discarded(reason, r.tokens),
        None if writing => brain.metrics.reply_discarded("cancelled", 0),
        _ => {}
    }
}

/// Claims the trigger, waits the relevance-scaled delay, stands by behind a better
/// claim (and re-enters if it is withdrawn), yields if the trigger is answered, and
/// re-judges once if other bots spoke in its thread meanwhile. `Some` means: go ahead and reply; it
/// holds the claim's acknowledgements, to await before posting.
///
/// Writing while waiting: when no better claim is on the board as the bot claims
/// (and no sidecar agent writes for it), the reply is written at once, while the delay
/// runs. A yield cancels the LLM request (or throws the text away); if others spoke
/// in the thread meanwhile and the re-judge still says speak, the text is written anew with the
/// fresh context. So the bot posts at the later of its delay's end and its reply.
///
/// On a message that asks everyone (`everyone`), the claim only staggers the answers:
/// nobody yields to a better claim or to another answer, and there is no re-judge
/// (the others' answers are what was asked for).
async fn wait_turn<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    relevance: f64,
    everyone: bool,
    draft: Option<PendingDraft>,
) -> Option<Waited> {
    let brain = p.brain();
    let tuned = brain.me();
    let me = tuned.name.clone();
    let relevance = relevance.max(MIN_CLAIM);
    let delay = delay_for(&tuned, relevance, p.jitter_ms(tuned.jitter_ms));
    brain.board.claim(msg.id, &me, relevance);
    let claim = claim_envelope(p, msg, relevance);
    let acks = p.broadcast_tracked(&claim);
    p.event(Event::Claim {
        envelope: Arc::new(claim),
    });
    // With a shared verdict every bot knows the ranking already: one that it puts
    // behind a colleague does not write before its turn comes.
    // A drafting judge's reply is already being written.
    let early = (draft.is_some() || (brain.engine.writes_early() && brain.me().write_early))
        && (everyone
            || (brain.board.standing(msg.id, &me, relevance) == Standing::Clear
                && shared::ranked_ahead(p, msg, relevance).is_none()));
    tracing::info!(bot = %me, trigger = %msg.id, relevance, delay_ms = delay.as_millis() as u64, everyone, writing = early, "claimed; waiting");
    brain.trail.note(
        msg.id,
        "claim",
        "waiting",
        &format!("relevance={relevance:.2} delay_ms={}", delay.as_millis()),
    );
    if draft.is_some() && !early {
        // Behind a better claim from the start: the draft goes unfinished (if that
        // claim is withdrawn, the reply is written afresh).
        brain.metrics.reply_discarded("draft_dropped", 0);
        tracing::info!(bot = %me, trigger = %msg.id, "a better claim is on the board; the draft is dropped");
    }
    let draft = draft.filter(|_| early);
    // Written while waiting, before the turn has a status: its tool calls show nowhere.
    let writing = async {
        if !early {
            std::future::pending().await
        } else if let Some(draft) = draft {
            brain
                .finish_draft(p.llm(), msg, draft, &StatusFeed::off())
                .await
        } else {
            let context = context_before(p, msg, brain.me().context_messages.max(12));
            brain
                .write_reply(p.llm(), &context, msg, "interjected", &StatusFeed::off())
                .await
        }
    };
    tokio::pin!(writing);
    let mut written: Option<Option<Reply>> = None;
    let deadline = tokio::time::Instant::now() + delay;
    let grace = grace_for(&tuned, relevance);
    // On a message to everyone nobody yields: the wait is the delay alone.
    let wait = async {
        if everyone {
            tokio::time::sleep_until(deadline).await;
            None
        } else {
            brain
                .board
                .wait(msg.id, &me, relevance, deadline, grace)
                .await
        }
    };
    tokio::pin!(wait);
    let outcome = loop {
        tokio::select! {
            biased;
            _ = p.stopping().cancelled() => {
                discard(brain, written.as_ref(), early, "shutting_down");
                withdraw_claim(p, msg, "shutting down");
                return None;
            }
            y = &mut wait => break y,
            r = &mut writing, if early && written.is_none() => written = Some(r),
        }
    };
    if everyone {
        record(
            p,
            msg,
            "judge",
            "everyone_asked",
            "no yield on a message to everyone",
        );
        let reply = finish_writing(p, early, written, writing).await?;
        return Some(Waited { acks, reply });
    }
    if let Some(y) = outcome {
        discard(brain, written.as_ref(), early, y.reason());
        record(p, msg, "yield", y.reason(), &format!("{y:?}"));
        // Gave up for good (answered, or the better claimant vanished): let any bot
        // behind this one go.
        withdraw_claim(p, msg, "yielded");
        return None;
    }
    if brain.board.resumed(msg.id) {
        record(
            p,
            msg,
            "resume",
            "claim_withdrawn",
            "a better claim was withdrawn",
        );
    }
    // Others' bot messages in this trigger's thread since it: what the early text and
    // the first verdict did not see. New questions from people are triggers of their
    // own (judged as they come), and bots' answers in other threads say nothing about
    // this one: neither is a reason to judge again or to throw the text away.
    let thread = msg.root.unwrap_or(msg.id);
    let newer: Vec<Arc<Envelope>> = p
        .since(&msg.group, &msg.id)
        .into_iter()
        .filter(|e| {
            e.author.name != me
                && e.author.kind == crate::wire::envelope::AuthorKind::Bot
                && (e.reply_to == Some(msg.id) || e.root == Some(thread))
        })
        .collect();
    if let Some(last) = newer.last() {
        // The early text did not see what was said since: it goes, whatever the re-judge.
        discard(brain, written.as_ref(), early, "stale");
        let mut fresh = context_before(p, last, brain.me().context_messages);
        fresh.push(last.clone());
        let fresh_context: Vec<Arc<Envelope>> =
            fresh.iter().filter(|e| e.id != msg.id).cloned().collect();
        let judged = brain.judge_traced(p.llm(), &fresh_context, msg).await;
        let speak = judged
            .verdict
            .is_some_and(|v| v.speak && v.relevance >= brain.me().min_relevance);
        let then = if speak {
            ("claim", "rejudged_speak")
        } else {
            ("silent", "rejudged_silent")
        };
        keep_verdict(p, msg, &judged, true, then, None);
        match judged.verdict {
            Some(v) if speak => {
                record(
                    p,
                    msg,
                    "judge",
                    "rejudged_speak",
                    &format!("relevance={:.2}", v.relevance),
                );
                return Some(Waited {
                    acks,
                    reply: Early::NotWritten,
                });
            }
            _ => {
                record(
                    p,
                    msg,
                    "silent",
                    "rejudged_silent",
                    &format!("{} newer messages", newer.len()),
                );
                withdraw_claim(p, msg, "re-judged silent");
                return None;
            }
        }
    }
    let reply = finish_writing(p, early, written, writing).await?;
    Some(Waited { acks, reply })
}

/// The early reply once the wait is over: what it came to, awaiting it if it is still
/// being written (`None`: the node is stopping; the claim is withdrawn).
async fn finish_writing<P: Ports + ?Sized>(
    p: &P,
    early: bool,
    written: Option<Option<Reply>>,
    writing: std::pin::Pin<&mut impl std::future::Future<Output = Option<Reply>>>,
) -> Option<Early> {
    let done = match written {
        Some(done) => done,
        None if !early => return Some(Early::NotWritten),
        None => {
            tokio::select! {
                biased;
                _ = p.stopping().cancelled() => {
                    discard(p.brain(), None, true, "shutting_down");
                    return None;
                }
                r = writing => r,
            }
        }
    };
    Some(match done {
        Some(r) => Early::Written(r),
        None => Early::Failed,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::*;
    use crate::config::BotSettings;
    use crate::turn::test_ports::{count, Clocked};

    /// Bot `A`, as every test here has it.
    fn bot_a() -> BotSettings {
        BotSettings::from_toml("name = \"A\"").expect("bot")
    }

    /// Bot A's claim never reached peer B (B's acknowledgement does not come, though
    /// B's link is not known to fail), but B's own claim on the trigger is on A's
    /// board: B goes ahead without knowing of A, so A yields to it after its patience
    /// instead of posting a second answer (`yield_writing/unheard_by_claimant`). With
    /// no claim of B's on the board, A posts unacknowledged as before.
    #[tokio::test(start_paused = true)]
    async fn a_claim_that_a_claimant_never_heard_yields_to_that_claimant() {
        for b_claims in [true, false] {
            let p = Clocked::alone(&bot_a(), Default::default(), "-");
            let msg = p.question("a question");
            p.brain.board.claim(msg.id, "A", 0.9);
            if b_claims {
                p.brain.board.claim(msg.id, "B", 0.6);
            }
            let tracker = Arc::new(crate::egress::acks::AckTracker::default());
            let mut acks = tracker.track("claim-1", vec!["B".to_string()]);
            let reply = Reply {
                text: "written".into(),
                tokens: 0,
            };
            let go = settle_claim(&p, &msg, &mut acks, &reply).await;
            assert_eq!(go, !b_claims, "b_claims={b_claims}");
            let (yielded, unacked) = (
                count(&p, "yield_writing", "unheard_by_claimant"),
                count(&p, "post", "claim_unacked"),
            );
            assert_eq!((yielded, unacked), if b_claims { (1, 0) } else { (0, 1) });
            if b_claims {
                assert!(
                    p.sent.lock().iter().any(|e| e.relevance == Some(WITHDRAWN)),
                    "A withdraws its claim"
                );
            }
        }
    }

    /// A reply written while waiting that failed is not the end of the turn: the bot
    /// that has the turn writes once more (one LLM call) and has a reply to post, and
    /// records no `silent/reply_failed`. (Before, a runner-up whose early call had
    /// failed while it stood by gave up when the winner withdrew, leaving the question
    /// unanswered: `failures-en-winner-fails` in the simulator.)
    #[tokio::test(start_paused = true)]
    async fn a_failed_early_reply_is_written_again_when_the_bot_has_the_turn() {
        let p = Clocked::alone(&bot_a(), Default::default(), "the answer, written again");
        let msg = p.question("a question");
        let before = p.judge_calls.load(Ordering::SeqCst);
        let reply = write_step(
            &p,
            &msg,
            "interjected",
            None,
            Early::Failed,
            &OutcomeSlot::default(),
            &StatusFeed::off(),
        )
        .await;
        assert_eq!(
            reply.map(|r| r.text).as_deref(),
            Some("the answer, written again")
        );
        assert_eq!(p.judge_calls.load(Ordering::SeqCst), before + 1, "one call");
        assert_eq!(count(&p, "silent", "reply_failed"), 0);
    }
}
