//! Policy: the rules that decide, before any LLM call, whether a bot may take a turn.
//!
//! Everything here is plain code over numbers and flags, so no prompt — however it is
//! worded — can make a bot answer past `max_depth`, past the group's bot-message cap,
//! or while the operator's quiet switch is on.

use crate::config::{BotSettings, MeshSettings, Participation, ReplyTo};
use crate::wire::envelope::{AuthorKind, Envelope};

/// What the node will do about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Answer now (mentioned, or always-answer).
    Reply,
    /// Ask the judge first.
    Judge,
    /// Do nothing.
    Silent,
}

impl Action {
    /// Label used in metrics, logs and explain output.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Action::Reply => "reply",
            Action::Judge => "judge",
            Action::Silent => "silent",
        }
    }
}

/// The outcome of the local rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    /// What to do.
    pub action: Action,
    /// Stable snake_case reason.
    pub reason: &'static str,
    /// Whether this bot was @mentioned.
    pub mentioned: bool,
    /// The message asks everyone to speak ([`asks_everyone`]): claims on it stagger
    /// the answers but make nobody yield.
    pub everyone: bool,
}

/// What the rules look at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts<'a> {
    /// The deciding bot.
    pub me: &'a BotSettings,
    /// Mesh-wide limits.
    pub mesh: &'a MeshSettings,
    /// The message.
    pub msg: &'a Envelope,
    /// This bot is mentioned.
    pub mentioned: bool,
    /// Someone else (and not this bot) is mentioned.
    pub mentions_others: bool,
    /// The operator's quiet switch.
    pub quiet: bool,
    /// Bot messages in the group within the last minute with no human in between.
    pub recent_bot_messages: usize,
    /// This bot already passed on the message this one replies to (declined it or
    /// yielded it to a better bot): a colleague's answer to it needs no judge call.
    pub passed_on_parent: bool,
}

/// Applies the rules in order; the first that fires decides.
pub(crate) fn decide(f: &Facts<'_>) -> Decision {
    if let Some(d) = silenced_whoever_is_mentioned(f) {
        return d;
    }
    let d = |action, reason| Decision {
        action,
        reason,
        mentioned: f.mentioned,
        everyone: f.msg.author.kind == AuthorKind::Human && asks_everyone(&f.msg.text),
    };
    let is_bot = f.msg.author.kind == AuthorKind::Bot;
    if f.mentioned {
        // Past the threshold even a mention needs the judge's agreement.
        return if f.msg.depth > f.mesh.llm_threshold {
            d(Action::Judge, "mentioned_deep")
        } else {
            d(Action::Reply, "mentioned")
        };
    }
    if f.me.participation == Participation::Mentions {
        return d(Action::Silent, "not_mentioned");
    }
    if f.mentions_others {
        return d(Action::Silent, "addressed_to_other");
    }
    if is_acknowledgement(&f.msg.text) {
        return d(Action::Silent, "acknowledgement");
    }
    if is_bot && f.passed_on_parent {
        return d(Action::Silent, "passed_on_thread");
    }
    if f.me.participation == Participation::Always && !is_bot {
        return d(Action::Reply, "always_answers");
    }
    d(Action::Judge, "interject_check")
}

/// The first rules of [`decide`], which do not look at mentions (`f.mentioned` and
/// `f.mentions_others` are not read): its own message, the quiet switch, a bot
/// ignoring bots, the depth limit, the rate cap. `None` when none fires.
pub(crate) fn silenced_whoever_is_mentioned(f: &Facts<'_>) -> Option<Decision> {
    let is_bot = f.msg.author.kind == AuthorKind::Bot;
    let reason = if is_bot && f.msg.author.name == f.me.name {
        "own_message"
    } else if f.quiet {
        "quiet"
    } else if is_bot && f.me.reply_to == ReplyTo::Humans {
        "ignores_bots"
    } else if f.msg.depth >= f.mesh.max_depth {
        "max_depth"
    } else if f.recent_bot_messages >= f.mesh.bot_messages_per_minute as usize {
        "rate_cap"
    } else {
        return None;
    };
    Some(Decision {
        action: Action::Silent,
        reason,
        mentioned: f.mentioned,
        everyone: f.msg.author.kind == AuthorKind::Human && asks_everyone(&f.msg.text),
    })
}

/// The hard rules once more, right before a written reply is sent (the world may
/// have moved during the LLM call). `Some(reason)` means: do not send.
pub(crate) fn last_check(
    mesh: &MeshSettings,
    quiet: bool,
    depth: u32,
    recent_bot_messages: usize,
) -> Option<&'static str> {
    if quiet {
        Some("quiet")
    } else if depth >= mesh.max_depth {
        Some("max_depth")
    } else if recent_bot_messages >= mesh.bot_messages_per_minute as usize {
        Some("rate_cap")
    } else {
        None
    }
}

/// A bare acknowledgement ("好的", "thanks!", "ok 👍") that nobody needs to answer.
pub(crate) fn is_acknowledgement(text: &str) -> bool {
    const ACKS: &[&str] = &[
        "好的",
        "好",
        "好滴",
        "好嘞",
        "谢谢",
        "多谢",
        "感谢",
        "收到",
        "了解",
        "明白",
        "明白了",
        "知道了",
        "嗯",
        "嗯嗯",
        "行",
        "可以",
        "没问题",
        "辛苦了",
        "ok",
        "okay",
        "k",
        "kk",
        "thanks",
        "thank you",
        "thx",
        "ty",
        "got it",
        "noted",
        "sure",
        "cool",
        "great",
        "nice",
        "roger",
        "ack",
        "👍",
        "🙏",
        "👌",
        "好的谢谢",
        "ok thanks",
        "thanks a lot",
    ];
    let cleaned: String = text
        .trim()
        .trim_matches(|c: char| {
            c.is_ascii_punctuation() || "，。！？～~、…!  ".contains(c) || c.is_whitespace()
        })
        .to_lowercase();
    let cleaned = cleaned
        .trim_end_matches(['!', '！', '.', '。', '~', '～'])
        .trim();
    if cleaned.is_empty() {
        return true;
    }
    if ACKS.contains(&cleaned) {
        return true;
    }
    // "好的，谢谢！" / "ok, thanks" — every piece an acknowledgement.
    let pieces: Vec<&str> = cleaned
        .split(|c: char| c.is_whitespace() || ",，、!！.。~～".contains(c))
        .filter(|p| !p.is_empty())
        .collect();
    pieces.len() <= 4 && !pieces.is_empty() && pieces.iter().all(|p| ACKS.contains(p))
}

/// `@all`-style forms: Latin ones need a boundary after them (`@allison` is not `@all`).
const EVERYONE_AT: &[&str] = &[
    "@all",
    "@everyone",
    "@here",
    "@_all",
    "@所有人",
    "@全体成员",
];

/// Chinese phrases that ask every member for their own answer.
const EVERYONE_ZH: &[&str] = &[
    "大家都说说",
    "大家说说",
    "大家都谈谈",
    "大家谈谈",
    "大家都聊聊",
    "大家分别",
    "大家各自",
    "大家都来说",
    "大家都讲讲",
    "各位都说",
    "各位分别",
    "各位说说",
    "每人说",
    "每人讲",
    "每人谈",
    "每个人都说",
    "每个人说",
    "每个人都谈",
    "每个人都讲",
    "都说一下",
    "都说说",
    "都评一下",
    "都表个态",
    "请每个人",
    "请大家都",
    "从自己的角度",
    "从各自的角度",
];

/// English phrases (whole words, lowercase) that ask every member for their own answer.
const EVERYONE_EN: &[&str] = &[
    r"^(everyone|everybody|all)\s*[,:;—-]",
    r"\b(everyone|everybody)\s+(please\s+)?(name|share|give|tell|say|list|pick|post|weigh|chime|add|suggest|propose|vote|introduce|send|write)\b",
    r"\beach of you\b",
    r"\ball of you\b",
    r"\bgo around the (room|table)\b",
    r"\bquick round\b",
    r"\bround[- ]robin\b",
];

/// Whether a message asks everyone to speak ("@all", "@所有人", "大家都说说",
/// "everyone, …"): then each bot with something relevant to say may answer, not just
/// the best claimant. An explicit list, not a judge call: a greeting such as
/// "大家好" or "hi everyone, …" asks one question, not a round.
pub(crate) fn asks_everyone(text: &str) -> bool {
    static EN: std::sync::OnceLock<regex::RegexSet> = std::sync::OnceLock::new();
    let lower = text.trim().to_lowercase().replace('＠', "@");
    let at = EVERYONE_AT.iter().any(|form| {
        lower.match_indices(form).any(|(i, m)| {
            let after = lower[i + m.len()..].chars().next();
            let before = lower[..i].chars().next_back();
            let latin = m.is_ascii();
            let glued_before =
                latin && before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_');
            let glued_after = latin && after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            !glued_before && !glued_after
        })
    });
    if at || lower.contains("user_id=\"all\"") {
        return true;
    }
    let squeezed: String = lower.chars().filter(|c| !c.is_whitespace()).collect();
    if EVERYONE_ZH.iter().any(|p| squeezed.contains(p)) {
        return true;
    }
    EN.get_or_init(|| regex::RegexSet::new(EVERYONE_EN).expect("valid patterns"))
        .is_match(&lower)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::turn_queries::recent_bot_messages;
    use crate::wire::envelope::Author;

    fn bot(name: &str) -> BotSettings {
        BotSettings::from_toml(&format!("name = \"{name}\"")).unwrap()
    }

    fn msg(author: &str, kind: AuthorKind, depth: u32, text: &str) -> Envelope {
        let who = Author {
            name: author.into(),
            kind,
        };
        let mut env = Envelope::message(ulid::Ulid::new(), 0, "g", author, who, text);
        env.depth = depth;
        env
    }

    #[test]
    fn rules_in_order() {
        let mesh = MeshSettings::default(); // max_depth 3, threshold 1, cap 6
        let me = bot("A");
        let mut humans_only = bot("A");
        humans_only.reply_to = ReplyTo::Humans;
        let mut always = bot("A");
        always.participation = Participation::Always;
        let mut mentions_only = bot("A");
        mentions_only.participation = Participation::Mentions;
        let human = msg("h", AuthorKind::Human, 0, "how do I parse this?");
        let b1 = msg("B", AuthorKind::Bot, 1, "thoughts?");
        let own = msg("A", AuthorKind::Bot, 1, "mine");
        let deep3 = msg("B", AuthorKind::Bot, 3, "x");
        let deep2 = msg("B", AuthorKind::Bot, 2, "x");
        let ack = msg("B", AuthorKind::Bot, 1, "好的");
        let f = |me, msg, mentioned, others, quiet, recent| Facts {
            me,
            mesh: &mesh,
            msg,
            mentioned,
            mentions_others: others,
            quiet,
            recent_bot_messages: recent,
            passed_on_parent: false,
        };
        let cases: Vec<(Facts, Action, &str)> = vec![
            (
                f(&me, &own, true, false, false, 0),
                Action::Silent,
                "own_message",
            ),
            (
                f(&me, &human, true, false, true, 0),
                Action::Silent,
                "quiet",
            ),
            (
                f(&humans_only, &b1, true, false, false, 0),
                Action::Silent,
                "ignores_bots",
            ),
            (
                f(&humans_only, &human, false, false, false, 0),
                Action::Judge,
                "interject_check",
            ),
            (
                f(&me, &deep3, true, false, false, 0),
                Action::Silent,
                "max_depth",
            ),
            (
                f(&me, &b1, true, false, false, 6),
                Action::Silent,
                "rate_cap",
            ),
            (
                f(&me, &human, true, false, false, 0),
                Action::Reply,
                "mentioned",
            ),
            (
                f(&me, &b1, true, false, false, 0),
                Action::Reply,
                "mentioned",
            ),
            (
                f(&me, &deep2, true, false, false, 0),
                Action::Judge,
                "mentioned_deep",
            ),
            (
                f(&mentions_only, &human, false, false, false, 0),
                Action::Silent,
                "not_mentioned",
            ),
            (
                f(&me, &human, false, true, false, 0),
                Action::Silent,
                "addressed_to_other",
            ),
            (
                f(&me, &ack, false, false, false, 0),
                Action::Silent,
                "acknowledgement",
            ),
            (
                f(&always, &human, false, false, false, 0),
                Action::Reply,
                "always_answers",
            ),
            (
                f(&always, &b1, false, false, false, 0),
                Action::Judge,
                "interject_check",
            ),
            (
                f(&me, &human, false, false, false, 0),
                Action::Judge,
                "interject_check",
            ),
        ];
        for (i, (facts, action, reason)) in cases.iter().enumerate() {
            let d = decide(facts);
            assert_eq!((d.action, d.reason), (*action, *reason), "case {i}");
        }
        // A colleague's answer to something this bot passed on costs no judge call,
        // unless it mentions this bot.
        let mut passed = f(&me, &b1, false, false, false, 0);
        passed.passed_on_parent = true;
        assert_eq!(decide(&passed).reason, "passed_on_thread");
        passed.mentioned = true;
        assert_eq!(decide(&passed).reason, "mentioned");
        let mut human_passed = f(&me, &human, false, false, false, 0);
        human_passed.passed_on_parent = true;
        assert_eq!(
            decide(&human_passed).reason,
            "interject_check",
            "humans are always judged"
        );
    }

    #[test]
    fn acknowledgements() {
        for t in [
            "好的",
            "好的！",
            "谢谢",
            "收到。",
            "ok",
            "OK!",
            "Thanks",
            "thanks!",
            "ok, thanks",
            "好的，谢谢！",
            "👍",
            "  ",
            "got it.",
        ] {
            assert!(is_acknowledgement(t), "{t:?}");
        }
        for t in [
            "好的，那 PR 里的锁要怎么改？",
            "ok so what about the parser",
            "thanks, but why?",
            "谢谢，另外帮我看下日志",
            "no",
        ] {
            assert!(!is_acknowledgement(t), "{t:?}");
        }
    }

    #[test]
    fn messages_that_ask_everyone() {
        for t in [
            "@all 周五前把周报发一下",
            "＠所有人 大家看看这个方案",
            "@所有人：新版本上线了，各自说一下风险",
            "老师@所有人 看一下",
            "大家都说说自己的看法",
            "大家分别从自己的角度评一下这个新架构方案，每人说一点",
            "这个需求大家怎么看？每个人都说一句",
            "各位分别讲讲下周的计划",
            "老师请每个人都从自己的角度评一下",
            "@everyone what's your top risk?",
            "@All, standup in 5",
            "Everyone, one sentence on the outage please",
            "everybody: your favourite crate?",
            "Quick round: everyone name one risk for the Q3 launch.",
            "I'd like each of you to review the doc",
            "let's go around the room on this",
            "<at user_id=\"all\">所有人</at> 看一下",
        ] {
            assert!(asks_everyone(t), "{t:?}");
        }
        for t in [
            "大家好",
            "大家好，有人读过 Raft 那篇论文吗？",
            "谢谢大家",
            "Hi everyone, how do I reset the cache?",
            "does everyone know where the runbook is?",
            "thanks all",
            "ask @allison about it",
            "mail ops@all.dev",
            "@Bob can you check the logs?",
            "who can help with the deploy?",
            "每位用户的配额是多少？",
        ] {
            assert!(!asks_everyone(t), "{t:?}");
        }
        // Only for human messages: a bot asking "everyone" does not open a round.
        let mesh = MeshSettings::default();
        let me = bot("A");
        let f = |msg| Facts {
            me: &me,
            mesh: &mesh,
            msg,
            mentioned: false,
            mentions_others: false,
            quiet: false,
            recent_bot_messages: 0,
            passed_on_parent: false,
        };
        let h = msg("h", AuthorKind::Human, 0, "大家都说说");
        let d = decide(&f(&h));
        assert_eq!(
            (d.action, d.reason, d.everyone),
            (Action::Judge, "interject_check", true)
        );
        let b = msg("B", AuthorKind::Bot, 1, "大家都说说");
        assert!(!decide(&f(&b)).everyone);
    }

    #[test]
    fn counts_bot_run_since_last_human_in_window() {
        let mut v = vec![msg("h", AuthorKind::Human, 0, "q")];
        for (i, t) in [10_000u64, 50_000, 55_000, 59_000].iter().enumerate() {
            let mut m = msg(if i % 2 == 0 { "A" } else { "B" }, AuthorKind::Bot, 1, "x");
            m.sent_at = *t;
            v.push(m);
        }
        let v: Vec<_> = v.into_iter().map(std::sync::Arc::new).collect();
        assert_eq!(recent_bot_messages(v.iter(), 60_000, 60_000), 4);
        assert_eq!(recent_bot_messages(v.iter(), 75_000, 60_000), 3);
        assert_eq!(recent_bot_messages(v[..1].iter(), 60_000, 60_000), 0);
    }
}
