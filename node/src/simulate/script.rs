//! The scripted LLM: what each bot's judge answers and what it writes.

use crate::llm::Verdict;
use crate::wire::envelope::{AuthorKind, Envelope};

use super::*;

/// How a judge that already sees another bot's answer to the trigger answers when
/// the scenario does not say (`after_answer`): it declines, at half the relevance.
pub(super) const AFTER_ANSWER_SCALE: f64 = 0.5;

/// The judge's default answer when a bot is @mentioned past `llm_threshold` and the
/// scenario gives no `bot_judge` entry for it: a direct question is worth answering.
pub(super) const MENTIONED_DEFAULT: Verdict = Verdict {
    speak: true,
    relevance: 0.7,
};

/// What the scripted judge answers bot `b` about `msg` (`post`: its registry entry);
/// `answered`: the prompt shows another bot's answer to it.
pub(super) fn scripted_verdict(
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
pub(super) fn reply_text(w: &World, b: usize, root: usize, to_bot: bool, k: usize) -> String {
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
