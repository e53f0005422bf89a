//! Approvals in a group: the people in the chat as the ACP agent's
//! [`PermissionAsker`], and who may answer which question.
//!
//! Each question the agent asks is handed to the node to post ("Coder wants to run: …
//! — /allow or /deny", [`AskedQuestion`], with the id its message will have) and waits
//! here. A person's `/allow` or `/deny` ([`ChatAsker::answer`]) answers a question
//! only when:
//!
//! - it was said after the question was posted in that group (its `sent_at`, the time
//!   the person wrote it on the platform, is not before the question's): an `/allow`
//!   written before the question existed and delivered late, or said before the
//!   question reached the chat, answers nothing;
//! - it replies to that question, or (replying to none of them) the question is the
//!   most recent one waiting in the group;
//! - its author is entitled: the person whose message started the turn (followed back
//!   along the chain when a colleague's message started it), or an operator
//!   (`[mesh] operators`). Without operators the requester alone.
//!
//! Anyone else's is ordinary text, and the bot tells them who may answer.
//! At most one question waits per turn: the agent's next one while one waits is
//! rejected at once (it would be another bot message in the group).
//!
//! # When a question counts as posted
//!
//! From when the platform accepted it: [`ChatAsker::posted`] is told the node's clock
//! once the platform's post (with its 429 retries) is done and before the question is
//! recorded (`Node::publish_own`'s `accepted`), not when it was handed over to be
//! posted. So an answer to what the page, a peer or the chat shows always finds the
//! question posted (noted after the record, a quick `/allow` came before the note
//! and answered nothing). An `/allow` said while the platform still held the question back (a
//! Telegram 429 waited out) was said before anyone could see it, and answers nothing
//! even when it is delivered after the question appeared. The comparison is in
//! milliseconds, `sent_at >= posted_at` ([`said_after`]). A platform that stamps
//! messages to the second (Telegram's `date`) stamps an `/allow` at the start of its
//! second, so one said in the same second as the question was accepted counts as said
//! before it: it answers nothing (it may well have been said before the question
//! appeared, and the safe side is not to run the tool), and the person says it again.
//! The two times come from two clocks, the platform's and the node's: a node clock
//! behind the platform's by a few seconds would let an `/allow` said that long before
//! the question was accepted count (keep the node's clock synchronised).

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use ulid::Ulid;

use crate::agent::acp::{Decision, PermissionAsker, PermissionQuestion};
use crate::turn::control::person_of;
use crate::turn::tuning::Tuning;
use crate::wire::envelope::{AuthorKind, Envelope};

/// The person a turn is for: whose message started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Requester {
    /// Their name as the chat shows it.
    pub(crate) name: String,
    /// Who they are across nodes ([`person_of`]: `local:alice`, `telegram:42`).
    pub(crate) keys: Vec<String>,
}

/// A question to post in its group.
#[derive(Debug, Clone)]
pub(crate) struct AskedQuestion {
    /// What the agent asks.
    pub(crate) question: PermissionQuestion,
    /// The id the question's message is posted with (a `/allow` replying to it names it).
    pub(crate) id: Ulid,
    /// Who may answer besides operators; `None`: operators only.
    pub(crate) requester: Option<Requester>,
    /// The message whose turn asks (the question replies to it); `None` when no turn
    /// was noted for the group.
    pub(crate) trigger: Option<Ulid>,
}

/// One question waiting for an answer.
struct Waiting {
    /// Its message's id.
    id: Ulid,
    /// When the platform accepted its message (ms since the epoch, the node's clock,
    /// taken when the publish returned); `None` until then, and nothing answers it
    /// before.
    posted_at: Option<u64>,
    /// Who may answer besides operators.
    requester: Option<Requester>,
    /// Where the answer goes.
    tx: oneshot::Sender<Decision>,
}

/// What a person's `/allow` or `/deny` came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answered {
    /// It answered the question posted as this message.
    Question(Ulid),
    /// A question waits, but this person may not answer it: only these may.
    NotEntitled {
        /// The question's message.
        question: Ulid,
        /// Who may answer, in words ("alice or an operator").
        who: String,
    },
    /// No question of this bot's agent was posted before it and still waits.
    Nothing,
}

/// The people in the chat as the agent's [`PermissionAsker`].
pub(crate) struct ChatAsker {
    /// The questions waiting, by group, oldest first.
    pending: Mutex<HashMap<String, Vec<Waiting>>>,
    /// The requester and trigger of each group's turn in flight (an ACP turn is one
    /// per group).
    turns: Mutex<HashMap<String, (Option<Requester>, Ulid)>>,
    /// Where questions go to be posted.
    post: mpsc::UnboundedSender<AskedQuestion>,
}

impl ChatAsker {
    /// An asker, and the questions it hands on to be posted.
    pub(crate) fn new() -> (Arc<ChatAsker>, mpsc::UnboundedReceiver<AskedQuestion>) {
        let (post, questions) = mpsc::unbounded_channel();
        let asker = ChatAsker {
            pending: Mutex::new(HashMap::new()),
            turns: Mutex::new(HashMap::new()),
            post,
        };
        (Arc::new(asker), questions)
    }

    /// Notes who `group`'s turn now starting (on message `trigger`) is for: its
    /// questions may be answered by them (and operators), and reply to `trigger`.
    pub(crate) fn turn_started(&self, group: &str, requester: Option<Requester>, trigger: Ulid) {
        self.turns
            .lock()
            .insert(group.to_string(), (requester, trigger));
    }

    /// Notes that the platform accepted question `id` at `at` (ms, the node's clock
    /// once the publish returned; see the module's rules): answers said from then on
    /// count, none said before.
    pub(crate) fn posted(&self, group: &str, id: Ulid, at: u64) {
        if let Some(w) = self
            .pending
            .lock()
            .get_mut(group)
            .and_then(|ws| ws.iter_mut().find(|w| w.id == id))
        {
            w.posted_at = Some(at);
        }
    }

    /// Withdraws question `id` of `group` unposted (the loop brake held it, or it could
    /// not be recorded): the agent gets a rejection at once.
    pub(crate) fn withdraw(&self, group: &str, id: Ulid) {
        let mut pending = self.pending.lock();
        if let Some(ws) = pending.get_mut(group) {
            if let Some(at) = ws.iter().position(|w| w.id == id) {
                let _ = ws.remove(at).tx.send(Decision::Deny { by: None });
            }
        }
    }

    /// Answers the question `cmd` (a person's `/allow` or `/deny` in its group) is for
    /// (see the module's rules), with `decision`.
    pub(crate) fn answer(&self, cmd: &Envelope, decision: Decision, t: &Tuning) -> Answered {
        let mut pending = self.pending.lock();
        let Some(waiting) = pending.get_mut(&cmd.group) else {
            return Answered::Nothing;
        };
        // A question past its timeout (or its turn) has no one waiting any more.
        waiting.retain(|w| !w.tx.is_closed());
        let before = |w: &Waiting| w.posted_at.is_some_and(|at| said_after(cmd.sent_at, at));
        let chosen = match cmd.reply_to {
            Some(to) if waiting.iter().any(|w| w.id == to) => {
                waiting.iter().position(|w| w.id == to && before(w))
            }
            _ => waiting.iter().rposition(before),
        };
        let Some(i) = chosen else {
            return Answered::Nothing;
        };
        let w = &waiting[i];
        if !entitled(cmd, w.requester.as_ref(), t) {
            let who = match (&w.requester, t.mesh.operators.is_some()) {
                (Some(r), true) => format!("{} (who asked) or an operator", r.name),
                (Some(r), false) => format!("{} (who asked)", r.name),
                (None, _) => "an operator".to_string(),
            };
            return Answered::NotEntitled {
                question: w.id,
                who,
            };
        }
        let w = waiting.remove(i);
        let id = w.id;
        if waiting.is_empty() {
            pending.remove(&cmd.group);
        }
        if w.tx.send(decision).is_ok() {
            Answered::Question(id)
        } else {
            Answered::Nothing
        }
    }
}

/// Whether an answer said at `sent_at` (ms, as the platform stamped it) was said after
/// a question the platform accepted at `posted_at` (ms): at or after it. A platform's
/// second-stamped answer in the same second as `posted_at` is before it (the module's
/// rules).
fn said_after(sent_at: u64, posted_at: u64) -> bool {
    sent_at >= posted_at
}

/// Whether the author of `cmd` may answer a question `requester`'s turn asked: an
/// operator, or the requester (the same person: a shared id, or, where neither has
/// one, the same name).
fn entitled(cmd: &Envelope, requester: Option<&Requester>, t: &Tuning) -> bool {
    let keys = person_of(cmd, t);
    if let Some(operators) = &t.mesh.operators {
        if keys.iter().any(|k| operators.contains(k)) {
            return true;
        }
    }
    requester.is_some_and(|r| {
        keys.iter().any(|k| r.keys.contains(k))
            || (keys.is_empty() && r.keys.is_empty() && r.name == cmd.author.name)
    })
}

/// The person whose message started the turn on `trigger`: its author when a person
/// wrote it, else (a colleague's message) the author of the message it replies to,
/// followed back through `before` until a person's. `None` when the chain leaves what
/// is in view or has no person.
pub(crate) fn requester(
    trigger: &Envelope,
    before: &[Arc<Envelope>],
    t: &Tuning,
) -> Option<Requester> {
    let mut at = trigger;
    for _ in 0..=before.len() {
        if at.author.kind == AuthorKind::Human {
            return Some(Requester {
                name: at.author.name.clone(),
                keys: person_of(at, t),
            });
        }
        let to = at.reply_to?;
        at = before.iter().rev().find(|m| m.id == to)?;
    }
    None
}

impl PermissionAsker for ChatAsker {
    fn ask(&self, question: PermissionQuestion) -> BoxFuture<'static, Decision> {
        let (tx, rx) = oneshot::channel();
        let (requester, trigger) = match self.turns.lock().get(&question.group).cloned() {
            Some((requester, trigger)) => (requester, Some(trigger)),
            None => (None, None),
        };
        let id = Ulid::new();
        {
            let mut pending = self.pending.lock();
            let waiting = pending.entry(question.group.clone()).or_default();
            waiting.retain(|w| !w.tx.is_closed());
            // One waiting question per turn (the turn is the group's): another is
            // rejected at once rather than posted.
            if !waiting.is_empty() {
                tracing::warn!(bot = %question.bot, group = %question.group, title = %question.title, "the agent asked again while a question waits: rejected without posting");
                return Box::pin(async { Decision::Deny { by: None } });
            }
            waiting.push(Waiting {
                id,
                posted_at: None,
                requester: requester.clone(),
                tx,
            });
        }
        let _ = self.post.send(AskedQuestion {
            question,
            id,
            requester,
            trigger,
        });
        Box::pin(async move { rx.await.unwrap_or(Decision::Deny { by: None }) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::acp::ToolKind;
    use crate::turn::control::tests::tuning;
    use crate::wire::envelope::Author;

    /// A person's message at `Alice`'s node (a local platform), written at `at` ms.
    fn said(by: &str, text: &str, at: u64) -> Envelope {
        Envelope::message(Ulid::new(), at, "demo", "Alice", Author::human(by), text)
    }

    fn question(title: &str) -> PermissionQuestion {
        PermissionQuestion {
            bot: "Alice".into(),
            group: "demo".into(),
            title: title.into(),
            kind: ToolKind::Execute,
            action: format!("run `{title}`"),
        }
    }

    fn carol(t: &Tuning) -> Option<Requester> {
        requester(&said("carol", "@Alice do it", 1), &[], t)
    }

    /// Asks `title` for a turn `requester` started; the question as posted, recorded at
    /// `at`, and the answer to come.
    fn ask_posted(
        asker: &ChatAsker,
        rx: &mut mpsc::UnboundedReceiver<AskedQuestion>,
        title: &str,
        requester: Option<Requester>,
        at: u64,
    ) -> (Ulid, BoxFuture<'static, Decision>) {
        asker.turn_started("demo", requester, Ulid::new());
        let answer = asker.ask(question(title));
        let q = rx.try_recv().expect("handed on to be posted");
        assert_eq!(q.question.title, title);
        asker.posted("demo", q.id, at);
        (q.id, answer)
    }

    #[tokio::test]
    async fn an_allow_said_before_the_question_was_posted_answers_nothing() {
        let t = tuning(None);
        let (asker, mut rx) = ChatAsker::new();
        asker.turn_started("demo", carol(&t), Ulid::new());
        let answer = asker.ask(question("rm -rf target"));
        let q = rx.try_recv().unwrap();
        // Not yet recorded: nothing answers it, even said "now".
        let early = said("carol", "/allow", 500);
        assert_eq!(asker.answer(&early, Decision::Allow, &t), Answered::Nothing);
        asker.posted("demo", q.id, 1_000);
        // Written before it was posted and delivered late: still nothing.
        assert_eq!(asker.answer(&early, Decision::Allow, &t), Answered::Nothing);
        let late = said("carol", "/allow", 1_000);
        assert_eq!(
            asker.answer(&late, Decision::Allow, &t),
            Answered::Question(q.id)
        );
        assert_eq!(answer.await, Decision::Allow);
        // Answered: a second /allow finds nothing.
        assert_eq!(asker.answer(&late, Decision::Allow, &t), Answered::Nothing);
    }

    #[tokio::test]
    async fn a_question_counts_as_posted_from_when_the_platform_accepted_it() {
        let t = tuning(None);
        let (asker, mut rx) = ChatAsker::new();
        // Handed over to be posted (at 1.2 s, say), held back by the platform (a 429)
        // and accepted at 4.3 s: it counts as posted from 4.3 s.
        let (id, answer) = ask_posted(&asker, &mut rx, "cargo test", carol(&t), 4_300);
        // Telegram-stamped (whole seconds): said during the hold, delivered late.
        let held = said("carol", "/allow", 3_000);
        assert_eq!(asker.answer(&held, Decision::Allow, &t), Answered::Nothing);
        // Said in the second the question was accepted: maybe before it appeared.
        let same_second = said("carol", "/allow", 4_000);
        assert_eq!(
            asker.answer(&same_second, Decision::Allow, &t),
            Answered::Nothing
        );
        // The next second, and the very millisecond it was accepted, count.
        assert!(said_after(4_300, 4_300));
        let next_second = said("carol", "/allow", 5_000);
        assert_eq!(
            asker.answer(&next_second, Decision::Allow, &t),
            Answered::Question(id)
        );
        assert_eq!(answer.await, Decision::Allow);
    }

    #[tokio::test]
    async fn one_question_waits_per_turn_and_a_reply_answers_the_one_it_replies_to() {
        let t = tuning(None);
        let (asker, mut rx) = ChatAsker::new();
        let (first, answer) = ask_posted(&asker, &mut rx, "cargo test", carol(&t), 10);
        // The agent asks again while one waits: rejected at once, never posted.
        assert_eq!(
            asker.ask(question("curl x | sh")).await,
            Decision::Deny { by: None }
        );
        assert!(rx.try_recv().is_err());
        // Another group's question is apart.
        let other = PermissionQuestion {
            group: "ops".into(),
            ..question("deploy")
        };
        let _other_answer = asker.ask(other);
        let other_q = rx.try_recv().unwrap();
        asker.posted("ops", other_q.id, 10);
        // A reply to a question that is not waiting (a bot's message) falls back to the
        // most recent waiting one; a reply to the question answers it.
        let mut reply = said("carol", "/deny", 20);
        reply.reply_to = Some(other_q.id);
        assert_eq!(
            asker.answer(
                &reply,
                Decision::Deny {
                    by: Some("carol".into())
                },
                &t
            ),
            Answered::Question(first),
            "the reply names another group's question: this group's is answered"
        );
        assert_eq!(
            answer.await,
            Decision::Deny {
                by: Some("carol".into())
            }
        );
    }

    #[tokio::test]
    async fn only_the_requester_or_an_operator_answers() {
        for operators in [None, Some(&["local:Boss"][..])] {
            let t = tuning(operators);
            let (asker, mut rx) = ChatAsker::new();
            let (id, answer) = ask_posted(&asker, &mut rx, "make", carol(&t), 10);
            let who = if operators.is_some() {
                "carol (who asked) or an operator"
            } else {
                "carol (who asked)"
            };
            assert_eq!(
                asker.answer(&said("mallory", "/allow", 20), Decision::Allow, &t),
                Answered::NotEntitled {
                    question: id,
                    who: who.into()
                }
            );
            let by = if operators.is_some() { "Boss" } else { "carol" };
            assert_eq!(
                asker.answer(&said(by, "/allow", 20), Decision::Allow, &t),
                Answered::Question(id),
                "{by}"
            );
            assert_eq!(answer.await, Decision::Allow);
        }
    }

    #[test]
    fn the_requester_is_followed_back_through_colleagues() {
        let t = tuning(None);
        let asked = Arc::new(said("carol", "@Bob check the build", 1));
        let mut bob = Envelope::message(
            Ulid::new(),
            2,
            "demo",
            "Bob",
            Author::bot("Bob"),
            "@Alice run it",
        );
        bob.reply_to = Some(asked.id);
        let r = requester(&bob, std::slice::from_ref(&asked), &t).expect("carol");
        assert_eq!(r.name, "carol");
        assert_eq!(r.keys, ["local:carol"]);
        // The chain leaves what is in view: nobody (operators only).
        assert_eq!(requester(&bob, &[], &t), None);
    }
}
