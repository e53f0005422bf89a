//! The shared judge (`[mesh] judge = "shared"`): one LLM call per message for the
//! whole mesh instead of one per bot.
//!
//! For each message one bot is chosen from the message id among the bots that may
//! judge it (rendezvous hashing over the roster, the same on every node, so all agree
//! without talking). The chosen bot works out which bots' local rules say "judge" about
//! the message, asks the LLM once for all of them (`judge::build_shared_prompt`, the
//! same colleague profiles as a bot's own prompt), and broadcasts the answers as a
//! signed `verdict` envelope. Every bot that would judge waits for it (at most
//! `verdict_timeout_ms`) and applies its own entry with its own `min_relevance`, delays
//! and hard rules; depth, the rate cap, quiet and mentions still rule, as a verdict is
//! advice, never an order. A bot that gets no entry in time (the chosen bot is down,
//! slow, or its call failed: then it broadcasts an empty verdict at once) asks its own
//! judge. Verdicts are logged where they are sent and where they are heard, with the
//! sender, so a bad one is traceable.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::{BotSettings, JudgeMode};
use crate::llm::Verdict;
use crate::turn::context::context_before;
use crate::turn::mention::PlatformMention;
use crate::turn::policy::Action;
use crate::turn::ports::Ports;
use crate::turn::record::record;
use crate::wire::envelope::{AuthorKind, BotVerdict, Envelope, Kind};

/// The bot that asks the shared judge about `msg`: of `names` (the roster) less the
/// message's own bot author, the one whose hash with the message id is highest.
pub(crate) fn chosen_judge<'a>(msg: &Envelope, names: &[&'a str]) -> Option<&'a str> {
    let author = (msg.author.kind == AuthorKind::Bot).then_some(msg.author.name.as_str());
    names
        .iter()
        .filter(|n| Some(**n) != author)
        .max_by_key(|n| {
            let d =
                ring::digest::digest(&ring::digest::SHA256, format!("{}\n{n}", msg.id).as_bytes());
            let mut first = [0u8; 8];
            first.copy_from_slice(&d.as_ref()[..8]);
            (u64::from_be_bytes(first), **n)
        })
        .copied()
}

/// Whether this mesh shares one judge.
pub(crate) fn shared<P: Ports + ?Sized>(p: &P) -> bool {
    p.mesh().judge == JudgeMode::Shared
}

/// The bots that may judge `msg` for the mesh: this one and every colleague, but for a
/// person's message only the colleagues that see the people this node sees (`sees`).
/// Every node that sees the message computes the same set.
fn candidates<'a>(
    me: &'a BotSettings,
    colleagues: &'a [BotSettings],
    msg: &Envelope,
    sees: impl Fn(&BotSettings) -> bool,
) -> Vec<&'a BotSettings> {
    let human = msg.author.kind == AuthorKind::Human;
    std::iter::once(me)
        .chain(colleagues.iter().filter(|c| !human || sees(c)))
        .collect()
}

/// The bot chosen to judge `msg` for the mesh.
fn chosen_for<P: Ports + ?Sized>(p: &P, msg: &Envelope) -> Option<String> {
    let t = p.brain().tuning();
    let names: Vec<&str> = candidates(&t.me, &t.colleagues, msg, |c| p.sees_my_humans(c))
        .into_iter()
        .map(|b| b.name.as_str())
        .collect();
    chosen_judge(msg, &names).map(str::to_string)
}

/// What the bot chosen to judge a message for the mesh is to do.
pub(crate) struct Duty {
    /// The bots whose local rules, as far as this node can tell, say "judge".
    bots: Vec<BotSettings>,
    /// This node never saw the message this one answers (a person on a platform it
    /// does not see): it cannot tell who passed on the thread nor give the judge its
    /// context, so it asks nothing and broadcasts an empty verdict.
    blind: bool,
}

/// When this bot is the one chosen to judge `msg` for the mesh: its [`Duty`] (this
/// bot's own decision is `mine`). `None`: own mode, not chosen, a stale or direct
/// message, or nobody judges it (no call, no verdict).
pub(crate) fn duty<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    platform: &[PlatformMention],
    mine: Action,
) -> Option<Duty> {
    if !shared(p) || msg.kind != Kind::Message || crate::wire::envelope::is_direct_group(&msg.group)
    {
        return None;
    }
    let brain = p.brain();
    if chosen_for(p, msg).as_deref() != Some(brain.me().name.as_str()) {
        return None;
    }
    let now = p.now_millis();
    if now.saturating_sub(msg.sent_at) / 1000 > p.mesh().stale_after_secs {
        return None;
    }
    let recent_bots = crate::turn::context::bots_since_human(p, &msg.group, now);

    let mut bots = Vec::new();
    if mine == Action::Judge {
        bots.push((*brain.me()).clone());
    }
    // Who passed on the message this one answers, as each bot's own board would say:
    // a bot that judged it (declined, yielded, or answered it: with a shared judge,
    // the bots its verdict has an entry for), or one it did not address.
    let parent = msg
        .reply_to
        .and_then(|id| p.recent(&msg.group, 64).into_iter().find(|e| e.id == id));
    let judged_parent = parent
        .as_ref()
        .and_then(|parent| brain.verdicts.get(&parent.id, &chosen_for(p, parent)?))
        .map(|h| h.entries)
        .unwrap_or_default();
    let t = brain.tuning();
    let human = msg.author.kind == AuthorKind::Human;
    for c in t
        .colleagues
        .iter()
        .filter(|c| !human || p.sees_my_humans(c))
    {
        // A colleague's quiet switch is its own: the verdict asks about it anyway,
        // and it applies its own rules to its entry.
        let passed = judged_parent.contains_key(&c.name)
            || parent.as_ref().is_some_and(|parent| {
                brain
                    .decide_as(c, &t.mesh, parent, &[], 0, false, false)
                    .reason
                    == "addressed_to_other"
            });
        let d = brain.decide_as(c, &t.mesh, msg, platform, recent_bots, false, passed);
        if d.action == Action::Judge {
            bots.push(c.clone());
        }
    }
    let blind = msg.reply_to.is_some() && parent.is_none();
    (!bots.is_empty()).then_some(Duty { bots, blind })
}

/// The chosen bot's part: asks the LLM once about `msg` for `bots`, keeps the verdict
/// and broadcasts it (an empty one if the call failed, so nobody waits for it).
pub(crate) async fn ask<P: Ports + ?Sized>(p: &P, msg: &Envelope, duty: Duty) {
    let Duty { bots, blind } = duty;
    let brain = p.brain();
    let spent = brain.spent_today(p.now_millis()).is_some();
    // Past its own daily budget, or blind to the thread, the chosen bot asks nothing:
    // its empty verdict has every bot judge itself at once.
    let answer = if spent || blind {
        None
    } else {
        let context = context_before(p, msg, brain.me().context_messages);
        let asked: Vec<&BotSettings> = bots.iter().collect();
        brain.judge_all(p.llm(), &context, msg, &asked).await
    };
    let entries: BTreeMap<String, BotVerdict> = answer
        .unwrap_or_default()
        .into_iter()
        .map(|(name, v)| {
            (
                name,
                BotVerdict {
                    speak: v.speak,
                    relevance: v.relevance,
                },
            )
        })
        .collect();
    let names: Vec<&str> = bots.iter().map(|b| b.name.as_str()).collect();
    let (reason, detail) = if blind {
        (
            "no_context",
            format!(
                "asked for {}; this bot never saw the message it answers: every bot judges itself",
                names.join(", ")
            ),
        )
    } else if spent {
        (
            "over_budget",
            format!(
                "asked for {}; this bot's daily LLM budget is spent: every bot judges itself",
                names.join(", ")
            ),
        )
    } else if entries.is_empty() {
        (
            "failed",
            format!("asked for {}; every bot judges itself", names.join(", ")),
        )
    } else {
        ("sent", format!("{entries:?}"))
    };
    record(p, msg, "verdict", reason, &detail);
    brain
        .verdicts
        .put(msg.id, &brain.me().name, entries.clone());
    let env = Envelope::verdict(p.new_id(), p.now_millis(), &brain.me().name, msg, entries);
    p.broadcast(&env);
}

/// This bot's verdict about `msg` from the shared judge, waiting for it at most
/// `verdict_timeout_ms`. `None`: judge yourself (own mode, no entry for this bot, the
/// call failed, the chosen bot is unreachable or too slow — recorded).
pub(crate) async fn verdict_for<P: Ports + ?Sized>(p: &P, msg: &Envelope) -> Option<Verdict> {
    if !shared(p) {
        return None;
    }
    let brain = p.brain();
    let chosen = chosen_for(p, msg)?;
    let timeout = Duration::from_millis(p.mesh().verdict_timeout_ms);
    let failing = p.link_failing_for(&chosen).filter(|d| *d >= timeout);
    if let Some(d) = failing
        .filter(|_| chosen != brain.me().name && brain.verdicts.get(&msg.id, &chosen).is_none())
    {
        record(
            p,
            msg,
            "judge",
            "shared_judge_unreachable",
            &format!("the link to {chosen} has failed for {d:?}: judging itself"),
        );
        return None;
    }
    let until = tokio::time::Instant::now() + timeout;
    let heard = tokio::select! {
        h = brain.verdicts.wait(&msg.id, &chosen, until) => h,
        _ = p.stopping().cancelled() => return None,
    };
    let strays = brain.verdicts.others(&msg.id, &chosen);
    if !strays.is_empty() {
        tracing::warn!(bot = %brain.me().name, trigger = %msg.id, %chosen, ignored = ?strays, "verdicts from bots not chosen to judge this message ignored");
    }
    match heard {
        Some(h) => match h.entries.get(&brain.me().name) {
            Some(v) => {
                tracing::debug!(bot = %brain.me().name, trigger = %msg.id, from = %h.from, speak = v.speak, relevance = v.relevance, "applying the shared verdict");
                Some(Verdict {
                    speak: v.speak,
                    relevance: v.relevance,
                })
            }
            None => {
                record(
                    p,
                    msg,
                    "judge",
                    "shared_verdict_missing",
                    &format!("{}'s verdict has no entry for this bot", h.from),
                );
                None
            }
        },
        None => {
            tracing::warn!(bot = %brain.me().name, trigger = %msg.id, %chosen, timeout_ms = timeout.as_millis() as u64, "no shared verdict in time; judging itself");
            record(
                p,
                msg,
                "judge",
                "shared_verdict_late",
                &format!("nothing from {chosen} in {timeout:?}"),
            );
            None
        }
    }
}

/// With the shared verdict about `msg` at hand: the colleague it ranks ahead of this
/// bot at `relevance` (one whose entry clears that colleague's own `min_relevance`
/// and beats this bot's claim), if any. Such a bot claims first; this one writes
/// only if that claim is withdrawn.
pub(crate) fn ranked_ahead<P: Ports + ?Sized>(
    p: &P,
    msg: &Envelope,
    relevance: f64,
) -> Option<String> {
    if !shared(p) {
        return None;
    }
    let brain = p.brain();
    let heard = brain.verdicts.get(&msg.id, &chosen_for(p, msg)?)?;
    let t = brain.tuning();
    let me = &t.me.name;
    t.colleagues
        .iter()
        .filter_map(|c| {
            let v = heard.entries.get(&c.name)?;
            let r = v.relevance.max(crate::turn::scheduler::MIN_CLAIM);
            (v.speak
                && v.relevance >= c.min_relevance
                && crate::turn::scheduler::beats((&c.name, r), (me, relevance)))
            .then(|| c.name.clone())
        })
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::heard_verdicts::Verdicts;
    use crate::wire::envelope::Author;
    use std::collections::HashMap;
    use std::sync::Arc;
    use ulid::Ulid;

    fn msg(author: Author) -> Envelope {
        Envelope::message(Ulid::new(), 1, "g", "x", author, "hello")
    }

    #[test]
    fn every_node_chooses_the_same_judge_and_never_the_author() {
        let names = ["Ada", "Bix", "Cyd", "Dot"];
        let mut chosen = HashMap::new();
        for _ in 0..400 {
            let m = msg(Author::human("h"));
            let a = chosen_judge(&m, &names).unwrap();
            // Order of the roster does not matter.
            let mut rev = names;
            rev.reverse();
            assert_eq!(chosen_judge(&m, &rev), Some(a));
            *chosen.entry(a).or_insert(0) += 1;
            let b = msg(Author::bot(a));
            assert_ne!(chosen_judge(&b, &names), Some(a));
        }
        // The load spreads over every bot (each gets roughly a quarter).
        for n in names {
            assert!(chosen[n] > 50, "{chosen:?}");
        }
        assert_eq!(chosen_judge(&msg(Author::bot("Ada")), &["Ada"]), None);
    }

    #[test]
    fn a_persons_message_is_judged_among_the_bots_that_see_that_person() {
        let bot = |n: &str| BotSettings::from_toml(&format!("name = \"{n}\"")).unwrap();
        let (me, others) = (bot("Ada"), vec![bot("Bix"), bot("Cyd")]);
        let sees = |c: &BotSettings| c.name != "Cyd";
        let names = |v: Vec<&BotSettings>| v.iter().map(|b| b.name.clone()).collect::<Vec<_>>();
        let person = msg(Author::human("h"));
        assert_eq!(
            names(candidates(&me, &others, &person, sees)),
            ["Ada", "Bix"]
        );
        // Every bot sees the bots' messages (the bridge carries them).
        let colleague = msg(Author::bot("Bix"));
        assert_eq!(
            names(candidates(&me, &others, &colleague, sees)),
            ["Ada", "Bix", "Cyd"]
        );
    }

    /// Bot A of A and B in a shared-judge mesh, with `daily_calls` and an LLM that rates
    /// B at 0.8.
    fn chosen(daily_calls: Option<u64>) -> Arc<crate::turn::test_ports::Clocked> {
        use crate::turn::brain::{Brain, Tuning};
        let bot = |n: &str| BotSettings::from_toml(&format!("name = \"{n}\"")).unwrap();
        let mesh = crate::config::MeshSettings {
            judge: JudgeMode::Shared,
            ..Default::default()
        };
        let tuning = Tuning {
            me: Arc::new(bot("A")),
            colleagues: vec![bot("B")],
            provider: crate::turn::Provider::Remote {
                judge: crate::llm::Endpoint::new("test://judge", "m"),
                reply: crate::llm::Endpoint::new("test://reply", "m"),
            },
            mesh: Arc::new(mesh),
            budget: crate::engine::budget::Limits {
                calls: daily_calls,
                ..Default::default()
            },
        };
        let brain = Brain::with(
            tuning,
            &[bot("A"), bot("B")],
            Arc::new(crate::telemetry::metrics::Metrics::new()),
        );
        Arc::new(crate::turn::test_ports::Clocked::new(
            brain,
            1_767_308_400_000,
            r#"{"B": {"speak": true, "relevance": 0.8}}"#,
        ))
    }

    /// The entries of the verdicts `p` broadcast, in order.
    fn verdicts_sent(p: &crate::turn::test_ports::Clocked) -> Vec<BTreeMap<String, BotVerdict>> {
        p.sent
            .lock()
            .iter()
            .filter(|e| e.kind == Kind::Verdict)
            .map(|e| e.verdicts.clone().unwrap_or_default())
            .collect()
    }

    #[tokio::test]
    async fn a_chosen_bot_past_its_budget_or_blind_to_the_thread_asks_nothing_and_says_so() {
        use crate::turn::test_ports::count;
        let b = || BotSettings::from_toml("name = \"B\"").unwrap();
        let p = chosen(Some(1));
        let duty = |blind| Duty {
            bots: vec![b()],
            blind,
        };
        ask(&*p, &msg(Author::human("h")), duty(false)).await;
        assert_eq!(p.judge_calls.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(verdicts_sent(&p)[0]["B"].relevance, 0.8);
        assert_eq!(count(&p, "verdict", "sent"), 1);
        // The day's one call is spent: the next duty costs nothing and says so at once.
        ask(&*p, &msg(Author::human("h")), duty(false)).await;
        assert_eq!(p.judge_calls.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert!(verdicts_sent(&p)[1].is_empty());
        assert_eq!(count(&p, "verdict", "over_budget"), 1);
        // Blind to the thread (never saw the message answered): no call, empty verdict.
        let p = chosen(None);
        ask(&*p, &msg(Author::bot("B")), duty(true)).await;
        assert_eq!(p.judge_calls.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert!(verdicts_sent(&p)[0].is_empty());
        assert_eq!(count(&p, "verdict", "no_context"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_wakes_on_the_verdict_or_at_its_deadline() {
        let v = Arc::new(Verdicts::default());
        let t = Ulid::new();
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        let v2 = v.clone();
        // Waits for Bix's verdict: one from Cyd (not chosen) does not end the wait.
        let waiter = tokio::spawn(async move { v2.wait(&t, "Bix", until).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut e = BTreeMap::new();
        e.insert(
            "Ada".to_string(),
            BotVerdict {
                speak: true,
                relevance: 0.7,
            },
        );
        v.put(t, "Cyd", e.clone());
        v.put(t, "Bix", e);
        let h = waiter.await.unwrap().expect("heard");
        assert_eq!(h.from, "Bix");
        assert_eq!(h.entries["Ada"].relevance, 0.7);
        assert_eq!(v.others(&t, "Bix"), vec!["Cyd".to_string()]);
        // Nothing comes for another trigger: the wait ends at its deadline.
        let start = tokio::time::Instant::now();
        let none = v
            .wait(&Ulid::new(), "Bix", start + Duration::from_millis(800))
            .await;
        assert!(none.is_none());
        assert_eq!(start.elapsed(), Duration::from_millis(800));
    }
}
