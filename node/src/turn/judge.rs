//! `Judge`: the one short "should I interject?" question, and its offline stand-in.
//!
//! The prompt is a template (per bot: `judge_prompt`) filled with the bot's profile,
//! its colleagues, the last K messages (each trimmed) and the new message; the answer
//! is `{"speak": bool, "relevance": 0..1}`. Placeholders: `{name}`, `{role}`,
//! `{skills}`, `{colleagues}`, `{context}`, `{from}`, `{message}`.

use std::collections::HashSet;
use std::sync::Arc;

use crate::config::BotSettings;
use crate::llm::{ChatMessage, Verdict};
use crate::wire::envelope::{cut_name, AuthorKind, Envelope};

/// The built-in judge prompt. Kept small on purpose: it is sent for every message
/// that does not mention the bot (its size is measured in the tests and docs).
pub(crate) const DEFAULT_JUDGE_PROMPT: &str =
    "You are {name} ({role}; skills: {skills}) in a group chat.\n\
Colleagues: {colleagues}\n\
Recent:\n{context}\n\
New from {from}: {message}\n\
Speak only if your skills add something the others won't. \
Reply JSON {\"speak\":bool,\"relevance\":0-1}.";

/// Everything the judge prompt is made of.
pub(crate) struct JudgeInput<'a> {
    /// The judging bot.
    pub me: &'a BotSettings,
    /// The other bots.
    pub colleagues: &'a [BotSettings],
    /// Messages before the new one, oldest first (already limited to K).
    pub context: &'a [Arc<Envelope>],
    /// The new message.
    pub msg: &'a Envelope,
}

/// Cuts `text` to at most `max` characters, marking the cut, on one line.
pub(crate) fn trim(text: &str, max: usize) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut s: String = one_line.chars().take(max).collect();
        s.push('…');
        s
    }
}

/// How a prompt names the author of `e`: [`prompt_name`], marked `(bot)` for a bot.
pub(crate) fn who(e: &Envelope) -> String {
    let name = prompt_name(&e.author.name);
    match e.author.kind {
        AuthorKind::Bot => format!("{name} (bot)"),
        AuthorKind::Human => name,
    }
}

/// A name as prompts show it: on one line and cut to the 64-byte name limit
/// ([`cut_name`]). Peers and the local API refuse longer names, but a transcript
/// written by an older version, or a name from a platform, is not bound by that.
pub(crate) fn prompt_name(name: &str) -> String {
    let one_line = name.split_whitespace().collect::<Vec<_>>().join(" ");
    cut_name(&one_line).to_string()
}

/// One line per colleague: `Name (role): skills`.
pub(crate) fn colleague_profiles(colleagues: &[BotSettings]) -> String {
    colleagues
        .iter()
        .map(|b| {
            let mut s = b.name.clone();
            if !b.role.is_empty() {
                s.push_str(&format!(" ({})", b.role));
            }
            if !b.skills.is_empty() {
                s.push_str(&format!(": {}", b.skills.join(", ")));
            }
            s
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Fills the bot's template (or the default).
pub(crate) fn build_prompt(input: &JudgeInput<'_>) -> String {
    let me = input.me;
    let context = if input.context.is_empty() {
        "(none)".to_string()
    } else {
        input
            .context
            .iter()
            .map(|e| format!("{}: {}", who(e), trim(&e.text, me.context_chars)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    fill(input, &context)
}

/// The bot's template (or the default) with `context` for `{context}`.
pub(crate) fn fill(input: &JudgeInput<'_>, context: &str) -> String {
    let me = input.me;
    let template = me.judge_prompt.as_deref().unwrap_or(DEFAULT_JUDGE_PROMPT);
    // Replace the message last so text inside it is never treated as a placeholder.
    template
        .replace("{name}", &me.name)
        .replace(
            "{role}",
            if me.role.is_empty() {
                "assistant"
            } else {
                &me.role
            },
        )
        .replace("{skills}", &me.skills.join(", "))
        .replace("{colleagues}", &colleague_profiles(input.colleagues))
        .replace("{context}", context)
        .replace("{from}", &who(input.msg))
        .replace("{message}", &trim(&input.msg.text, me.context_chars * 2))
}

/// The shared judge's prompt (`[mesh] judge = "shared"`): every bot asked about,
/// with its profile, the recent messages and the new one, in one call. `context_chars`
/// trims each message as a bot's own prompt does. Per-bot `judge_prompt`s do not apply.
pub(crate) fn build_shared_prompt(
    bots: &[&BotSettings],
    context: &[Arc<Envelope>],
    msg: &Envelope,
    context_chars: usize,
) -> String {
    let mut p = String::from("Bots in a group chat:\n");
    for b in bots {
        p.push_str("- ");
        p.push_str(&colleague_profiles(std::slice::from_ref(*b)));
        p.push('\n');
    }
    p.push_str("Recent:\n");
    if context.is_empty() {
        p.push_str("(none)\n");
    }
    for e in context {
        p.push_str(&format!("{}: {}\n", who(e), trim(&e.text, context_chars)));
    }
    p.push_str(&format!(
        "New from {}: {}\n",
        who(msg),
        trim(&msg.text, context_chars * 2)
    ));
    let names: Vec<&str> = bots.iter().map(|b| b.name.as_str()).collect();
    p.push_str(&format!(
        "For each bot: speak only if its skills add something the others won't. \
Reply JSON {{\"<bot>\":{{\"speak\":bool,\"relevance\":0-1}}}} for: {}.",
        names.join(", ")
    ));
    p
}

/// The hash the verdict log keeps of a judge call (`store::verdicts`): lowercase hex
/// of the first 16 bytes of SHA-256 over each message's role, a NUL, its content and a
/// NUL, in order. Equal hashes mean the very same prompt was sent, so `botmesh replay`
/// may reuse the recorded answer.
pub(crate) fn prompt_hash(messages: &[ChatMessage]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for m in messages {
        ctx.update(m.role.as_bytes());
        ctx.update(&[0]);
        ctx.update(m.content.as_bytes());
        ctx.update(&[0]);
    }
    ctx.finish().as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Words of a text for lexical overlap: lowercase Latin words of 2+ letters, and CJK
/// character bigrams (Chinese has no spaces between words).
pub(crate) fn terms(text: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut word = String::new();
    let mut cjk: Vec<char> = Vec::new();
    let flush_cjk = |cjk: &mut Vec<char>, out: &mut HashSet<String>| {
        for w in cjk.windows(2) {
            out.insert(w.iter().collect());
        }
        if cjk.len() == 1 {
            out.insert(cjk[0].to_string());
        }
        cjk.clear();
    };
    for c in text.chars() {
        if is_cjk(c) {
            if word.chars().count() >= 2 {
                out.insert(std::mem::take(&mut word));
            }
            word.clear();
            cjk.push(c);
        } else if c.is_alphanumeric() {
            flush_cjk(&mut cjk, &mut out);
            word.extend(c.to_lowercase());
        } else {
            flush_cjk(&mut cjk, &mut out);
            if word.chars().count() >= 2 {
                out.insert(std::mem::take(&mut word));
            }
            word.clear();
        }
    }
    flush_cjk(&mut cjk, &mut out);
    if word.chars().count() >= 2 {
        out.insert(word);
    }
    out
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x2FFFF)
}

/// The offline judge: speak when the message shares words with the bot's skills or
/// role; relevance grows with the overlap.
pub(crate) fn offline_verdict(me: &BotSettings, text: &str) -> Verdict {
    let mut profile = String::new();
    for s in &me.skills {
        profile.push_str(s);
        profile.push(' ');
    }
    profile.push_str(&me.role);
    let skills = terms(&profile);
    let msg = terms(text);
    let hits = skills.intersection(&msg).count();
    if hits == 0 {
        Verdict {
            speak: false,
            relevance: 0.0,
        }
    } else {
        Verdict {
            speak: true,
            relevance: (0.4 + 0.15 * hits as f64).min(1.0),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::envelope::Author;

    fn bot(name: &str, role: &str, skills: &[&str]) -> BotSettings {
        let skills = skills
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(",");
        BotSettings::from_toml(&format!(
            "name = \"{name}\"\nrole = \"{role}\"\nskills = [{skills}]"
        ))
        .unwrap()
    }

    pub(crate) fn msg(author: &str, kind: AuthorKind, text: &str) -> Arc<Envelope> {
        let who = Author {
            name: author.into(),
            kind,
        };
        Arc::new(Envelope::message(
            ulid::Ulid::new(),
            0,
            "g",
            author,
            who,
            text,
        ))
    }

    #[test]
    fn offline_overlap() {
        let me = bot("XiaoBa", "研发助手", &["论文阅读", "代码编写", "任务执行"]);
        let v = offline_verdict(&me, "谁能帮我读一下这篇论文？");
        assert!(v.speak && v.relevance > 0.4, "{v:?}");
        assert!(!offline_verdict(&me, "今天天气不错").speak);
        let en = bot("Rev", "reviewer", &["code review", "security"]);
        assert!(offline_verdict(&en, "can someone do a security review of this?").speak);
        assert!(!offline_verdict(&en, "lunch at noon?").speak);
    }

    #[test]
    fn default_prompt_is_small_and_complete() {
        let me = bot("XiaoBa", "研发助手", &["论文阅读", "代码编写", "任务执行"]);
        let colleagues = vec![
            bot("ErGoz", "代码审查师", &["代码审查", "架构评估", "安全检查"]),
            bot("Lina", "product manager", &["requirements", "roadmap"]),
        ];
        let typical = [
            (
                "老师",
                AuthorKind::Human,
                "大家早，今天把 bridge 的重试逻辑过一遍",
            ),
            (
                "ErGoz",
                AuthorKind::Bot,
                "我看了 outbox.rs，退避上限 30 秒，建议加 jitter",
            ),
            (
                "老师",
                AuthorKind::Human,
                "好，那签名那块呢？有没有重放保护",
            ),
            (
                "ErGoz",
                AuthorKind::Bot,
                "有 seen-cache，TTL 15 分钟，大于两倍时间窗",
            ),
            (
                "Lina",
                AuthorKind::Bot,
                "From the product side we need this before the Feishu launch next week.",
            ),
            (
                "老师",
                AuthorKind::Human,
                "OK. Can someone summarize the open risks?",
            ),
            (
                "ErGoz",
                AuthorKind::Bot,
                "Risks: clock skew on hosts, key rotation docs, outbox persistence.",
            ),
            (
                "老师",
                AuthorKind::Human,
                "好的，@XiaoBa 你那边论文那个实验跑完了吗",
            ),
        ];
        let context: Vec<_> = typical.iter().map(|(a, k, t)| msg(a, *k, t)).collect();
        let new = msg(
            "老师",
            AuthorKind::Human,
            "有人读过 Raft 的那篇论文吗？想确认一下 leader lease 的细节",
        );
        let p = build_prompt(&JudgeInput {
            me: &me,
            colleagues: &colleagues,
            context: &context,
            msg: &new,
        });
        for part in [
            "XiaoBa",
            "研发助手",
            "ErGoz (代码审查师)",
            "leader lease",
            "outbox.rs",
            "\"speak\"",
        ] {
            assert!(p.contains(part), "missing {part}: {p}");
        }
        // The number the docs report (docs/llm.md); a regression guard, not a timing.
        eprintln!(
            "default judge prompt, 8 typical messages: {} bytes",
            p.len()
        );
        assert!(
            p.len() < 1500,
            "default judge prompt grew to {} bytes",
            p.len()
        );
    }

    #[test]
    fn shared_prompt_names_every_bot_once_and_the_message() {
        let a = bot("XiaoBa", "研发助手", &["论文阅读"]);
        let b = bot("ErGoz", "代码审查师", &["代码审查"]);
        let context = vec![msg("老师", AuthorKind::Human, "早")];
        let new = msg("老师", AuthorKind::Human, "谁能审查一下这个 PR？");
        let p = build_shared_prompt(&[&a, &b], &context, &new, 240);
        for part in [
            "- XiaoBa (研发助手): 论文阅读",
            "- ErGoz (代码审查师): 代码审查",
            "老师: 早",
            "New from 老师: 谁能审查一下这个 PR？",
            "for: XiaoBa, ErGoz.",
        ] {
            assert!(p.contains(part), "missing {part}: {p}");
        }
    }

    #[test]
    fn prompt_hash_changes_with_any_byte_and_the_role() {
        let a = prompt_hash(&[ChatMessage::user("hello")]);
        assert_eq!(a.len(), 32);
        assert_eq!(a, prompt_hash(&[ChatMessage::user("hello")]));
        assert_ne!(a, prompt_hash(&[ChatMessage::user("hello ")]));
        assert_ne!(a, prompt_hash(&[ChatMessage::new("system", "hello")]));
        assert_ne!(
            prompt_hash(&[ChatMessage::user("ab"), ChatMessage::user("c")]),
            prompt_hash(&[ChatMessage::user("a"), ChatMessage::user("bc")])
        );
    }

    #[test]
    fn message_text_cannot_inject_placeholders() {
        let me = bot("A", "r", &["s"]);
        let m = msg("h", AuthorKind::Human, "{context} {name}");
        let p = build_prompt(&JudgeInput {
            me: &me,
            colleagues: &[],
            context: &[],
            msg: &m,
        });
        assert!(p.contains("New from h: {context} {name}"));
    }
}
