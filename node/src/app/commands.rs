//! People's commands in the chat, carried out by the node (parsed in
//! [`crate::turn::control`]): every node sees a person's message through its usual
//! way in (the page and the bridge on `local`, the platform on Feishu and Discord, a
//! colleague's forward on DingTalk), so each bot acts on the commands addressed to it.
//!
//! - `/quiet`, `/resume`: the quiet switch of the group they are said in (as
//!   `POST /v1/quiet` with that `group`); the operator's node-wide switch is not theirs.
//! - `/stop`: cancels the group's stop token, so every turn of this bot in flight for
//!   the group drops (its LLM call or wait abandoned, its claim withdrawn, recorded as
//!   `silent/stopped` and `withdraw/stopped`). Later messages are taken as usual.
//! - `/why`: posts, in a few lines, the decisions recorded about the last message
//!   (see [`crate::turn::control::why_text`]). The answer carries the mesh's
//!   `max_depth`, so no bot judges or answers it. Only the bot it @-names answers (a
//!   `/why` naming no bot only in a mesh of one), and each person has
//!   `turn::control::WHY_PER_MINUTE` of them per group (`outcome="rate_limited"`).
//! - `/allow`, `/deny`: answer a permission question this bot's ACP agent put in the
//!   group ([`post_questions`] posts them; `turn::approval::ChatAsker` waits): the one
//!   replied to, else the most recent one waiting, and only one posted before the
//!   command was said (posted: accepted by the platform, after any 429 it was held
//!   back by). Only the person whose message started the turn, or an operator,
//!   may answer; anyone else's is ordinary text (`outcome="not_entitled"`) and the
//!   bot says who may answer.
//!
//! With `[mesh] operators` set, `/quiet`, `/resume` and `/stop` are carried out only
//! for an operator (see [`control::may_command`]); anyone else's is ordinary text,
//! taken as any message, logged and counted `outcome="not_operator"`.
//!
//! A command is a message like any other in the transcript; it is never judged.
//! Counted in `botmesh_chat_commands_total{command,outcome}`.

use std::sync::Arc;

use crate::agent::acp::Decision;
use crate::app::node::{Node, RecordAnyway};
use crate::turn::approval::{Answered, AskedQuestion};
use crate::turn::control::{self, Verb};
use crate::turn::mention::PlatformMention;
use crate::wire::envelope::{now_millis, Author, AuthorKind, Envelope};

/// Carries out `env` if it is a person's command addressed to this bot; `true` when it
/// is a command at all (addressed here or not), which then takes no turn.
pub(crate) fn handle(node: &Arc<Node>, env: &Arc<Envelope>, mentions: &[PlatformMention]) -> bool {
    let Some(cmd) = control::parse(env, &node.brain.matcher, mentions) else {
        return false;
    };
    let t = node.brain.tuning();
    let me = t.me.name.clone();
    let verb = cmd.verb.as_str();
    if !control::may_command(cmd.verb, env, &t) {
        let person = control::person_of(env, &t).join(" ");
        tracing::info!(bot = %me, id = %env.id, command = verb, by = %env.author.name, %person, group = %env.group, "not an operator's: taken as ordinary text ([mesh] operators)");
        node.metrics.chat_command(verb, "not_operator");
        return false;
    }
    if !cmd.addresses(&me) {
        tracing::debug!(bot = %me, id = %env.id, command = verb, target = ?cmd.target, "a command for other bots");
        node.metrics.chat_command(verb, "not_addressed");
        return true;
    }
    let age_secs = now_millis().saturating_sub(env.sent_at) / 1000;
    if age_secs > t.mesh.stale_after_secs {
        tracing::info!(bot = %me, id = %env.id, command = verb, age_secs, "an old command (a catch-up after downtime): not carried out");
        node.metrics.chat_command(verb, "stale");
        return true;
    }
    let (by, group) = (&env.author.name, &env.group);
    match cmd.verb {
        Verb::Quiet | Verb::Resume => {
            let on = cmd.verb == Verb::Quiet;
            let was = node.quiet.set_group(group, on);
            let node_wide = node.quiet.node();
            tracing::warn!(bot = %me, quiet = on, was, node_wide, %by, %group, id = %env.id, "the group's quiet switch set by a person's command in the chat");
        }
        Verb::Stop => {
            node.brain.stops.stop(group, by);
            tracing::info!(bot = %me, %by, %group, id = %env.id, "a person's /stop: dropping this bot's turns in flight for the group");
        }
        Verb::Allow | Verb::Deny => {
            let decision = if cmd.verb == Verb::Allow {
                Decision::Allow
            } else {
                Decision::Deny {
                    by: Some(by.clone()),
                }
            };
            let answered = match node.brain.permissions.as_ref() {
                Some(p) => p.answer(env, decision, &t),
                None => Answered::Nothing,
            };
            match answered {
                Answered::Question(question) => {
                    tracing::info!(bot = %me, %by, %group, id = %env.id, %question, command = verb, "a person answered the agent's permission question");
                }
                Answered::NotEntitled { question, who } => {
                    tracing::info!(bot = %me, %by, %group, id = %env.id, %question, command = verb, may_answer = %who, "not entitled to answer the agent's question: taken as ordinary text");
                    node.metrics.chat_command(verb, "not_entitled");
                    node.turns
                        .spawn(tell_who_may_answer(node.clone(), env.clone(), who));
                    return false;
                }
                Answered::Nothing => {
                    tracing::info!(bot = %me, %by, %group, id = %env.id, sent_at = env.sent_at, command = verb, "no question of this bot's agent posted before it (sent_at) is waiting in the group: answers nothing");
                    node.metrics.chat_command(verb, "nothing_asked");
                    return true;
                }
            }
        }
        Verb::Why => {
            // One answer, not one per bot: a `/why` without an @ is answered only in a
            // mesh of one bot.
            if cmd.target == control::Target::All && !t.colleagues.is_empty() {
                tracing::info!(bot = %me, %by, %group, id = %env.id, "a /why that names no bot: answered only by the bot it names");
                node.metrics.chat_command(verb, "not_addressed");
                return true;
            }
            let person = control::person_of(env, &t)
                .first()
                .cloned()
                .unwrap_or_else(|| format!("{}/{}", env.sender, by));
            if let Err(wait) =
                node.brain
                    .why_limits
                    .take(group, &person, tokio::time::Instant::now())
            {
                tracing::info!(bot = %me, %by, %person, %group, id = %env.id, wait_secs = wait.as_secs(), "too many /why from this person in this group: not answered");
                node.metrics.chat_command(verb, "rate_limited");
                return true;
            }
            node.turns.spawn(post_why(node.clone(), env.clone()));
            // Counted once posted (or failed).
            return true;
        }
    }
    node.metrics.chat_command(verb, "applied");
    true
}

/// Posts the ACP agent's permission questions in their groups as the bot, saying what
/// the tool call would do ("Coder wants to edit notes.txt — /allow or /deny",
/// `agent::acp::tool_action`), as a reply to the message whose turn asks (a reply or
/// in its thread where the platform has them), at the depth limit so no bot answers
/// them, until the node stops accepting work.
pub(crate) async fn post_questions(
    node: Arc<Node>,
    mut questions: tokio::sync::mpsc::UnboundedReceiver<AskedQuestion>,
) {
    loop {
        let q = tokio::select! {
            q = questions.recv() => q,
            _ = node.accepting.cancelled() => None,
        };
        let Some(AskedQuestion {
            question: q,
            id,
            requester,
            trigger,
        }) = q
        else {
            return;
        };
        let t = node.brain.tuning();
        let me = t.me.name.clone();
        let text = format!("{me} wants to {} — /allow or /deny", q.action);
        let at = now_millis();
        // A question is a bot message: the loop brake holds it like any other.
        let recent = crate::turn::context::bots_since_human(&*node, &q.group, at);
        if recent >= t.mesh.bot_messages_per_minute as usize {
            tracing::warn!(bot = %me, group = %q.group, %id, title = %q.title, recent_bot_messages = recent, limit = t.mesh.bot_messages_per_minute, "the loop brake is on in this group (bot_messages_per_minute): the agent's permission question is not posted, and rejected");
            node.metrics.decision("silent", "rate_cap");
            if let Some(p) = &node.brain.permissions {
                p.withdraw(&q.group, id);
            }
            continue;
        }
        let text_posted = text.clone();
        let mut env = Envelope::message(id, at, &q.group, &me, Author::bot(&me), text);
        env.depth = t.mesh.max_depth;
        if let Some(trigger) = trigger {
            env.reply_to = Some(trigger);
            env.root = node
                .transcripts
                .recent(&q.group, 256)
                .iter()
                .find(|e| e.id == trigger)
                .map_or(Some(trigger), |e| e.root.or(Some(trigger)));
        }
        // Posted from when the platform accepted it (its 429s waited out), not from
        // `at`: an /allow said while it was held back answers nothing. Noted before
        // the question is recorded, so an answer to what the page or a peer shows
        // always finds it posted.
        let accepted = |ms: u64| {
            if let Some(p) = &node.brain.permissions {
                p.posted(&q.group, id, ms);
            }
        };
        match node.publish_own(env, "self", RecordAnyway, &accepted).await {
            Ok(published) => {
                if let Some(trigger) = node.brain.asks.turn_trigger(&q.group) {
                    // The turn waits for the chat (an A2A task: input required).
                    node.events
                        .publish(crate::telemetry::events::Event::Question {
                            group: q.group.clone(),
                            trigger: trigger.to_string(),
                            bot: me.clone(),
                            text: text_posted.clone(),
                        });
                }
                let may_answer = requester.map_or_else(|| "-".into(), |r| r.name);
                tracing::info!(bot = %me, group = %q.group, %id, kind = %q.kind, title = %q.title, %may_answer, posted_at = published.accepted_at, "asked the chat about the agent's tool call (the requester or an operator answers; an answer said before posted_at answers nothing)")
            }
            Err(e) => {
                tracing::error!(bot = %me, group = %q.group, error = %e, "the agent's permission question could not be recorded: rejected");
                if let Some(p) = &node.brain.permissions {
                    p.withdraw(&q.group, id);
                }
            }
        }
    }
}

/// `me`'s answer to a person's command `cmd`: a reply at the depth limit (a hard
/// rule, so no bot of any version judges or answers it), with no `why`.
fn command_answer(me: &str, cmd: &Envelope, text: String, max_depth: u32) -> Envelope {
    let mut env = Envelope::answer(
        ulid::Ulid::new(),
        now_millis(),
        me,
        cmd,
        text,
        crate::wire::envelope::Why::Posted,
    );
    env.depth = env.depth.max(max_depth);
    env.why = None;
    env
}

/// Tells the author of a `/allow` or `/deny` they may not answer (`cmd`, now taken as
/// ordinary text) who may: a reply at the depth limit, so no bot answers it.
async fn tell_who_may_answer(node: Arc<Node>, cmd: Arc<Envelope>, who: String) {
    let t = node.brain.tuning();
    let me = t.me.name.clone();
    let env = command_answer(
        &me,
        &cmd,
        format!("Only {who} can answer {me}'s question."),
        t.mesh.max_depth,
    );
    if let Err(e) = node.publish(env, "self").await {
        tracing::error!(bot = %me, command = %cmd.id, error = %e, "could not say who may answer the agent's question");
    }
}

/// Posts this bot's answer to `/why` (`cmd`): why it did or did not speak on the last
/// message before the command (people's commands and the answers to them aside).
async fn post_why(node: Arc<Node>, cmd: Arc<Envelope>) {
    let t = node.brain.tuning();
    let me = t.me.name.clone();
    let recent = node.transcripts.recent(&cmd.group, 256);
    let subject = control::why_subject(&recent, &cmd, &t);
    let steps = subject
        .as_ref()
        .map(|s| node.brain.trail.steps(s.id))
        .unwrap_or_default();
    // Its answer carries why it spoke: a permission question or the line saying how
    // an agent's turn ended, replies too, carry none.
    let answer = subject.as_ref().and_then(|s| {
        recent.iter().find(|e| {
            e.author.kind == AuthorKind::Bot
                && e.author.name == me
                && e.reply_to == Some(s.id)
                && e.why.is_some()
        })
    });
    let text = control::why_text(
        &me,
        &node.brain.matcher,
        subject.as_deref(),
        &steps,
        answer.map(|a| &**a),
        node.quiet.by(&cmd.group),
    );
    // An answer is a bot message: the loop brake holds it like any other.
    let recent = crate::turn::context::bots_since_human(&*node, &cmd.group, now_millis());
    if recent >= t.mesh.bot_messages_per_minute as usize {
        tracing::info!(bot = %me, command = %cmd.id, recent_bot_messages = recent, limit = t.mesh.bot_messages_per_minute, "the loop brake is on in this group (bot_messages_per_minute): the /why is not answered");
        node.metrics.chat_command("why", "rate_cap");
        return;
    }
    let env = command_answer(&me, &cmd, text, t.mesh.max_depth);
    let id = env.id;
    match node.publish(env, "self").await {
        Ok(_) => {
            let about = subject.map_or_else(|| "-".to_string(), |s| s.id.to_string());
            tracing::info!(bot = %me, %id, command = %cmd.id, %about, steps = steps.len(), "answered a person's /why");
            node.metrics.chat_command("why", "applied");
        }
        Err(e) => {
            tracing::error!(bot = %me, command = %cmd.id, error = %e, "the answer to a person's /why could not be recorded; not sent");
            node.metrics.chat_command("why", "failed");
        }
    }
}
