//! `Reply`: the prompt for a bot's actual message, and the offline stand-in.
//!
//! One LLM call: the persona (from `persona` or role and skills), the colleagues'
//! profiles from peers.toml, the recent transcript, and the message being answered.

use std::sync::Arc;

use crate::config::BotSettings;
use crate::llm::ChatMessage;
use crate::turn::judge::{colleague_profiles, fill, prompt_name, trim, who, JudgeInput};
use crate::wire::envelope::Envelope;

/// Marks every reply written without an LLM, so nobody mistakes it for a model's answer.
pub(crate) const OFFLINE_MARK: &str = "[offline]";

/// The system prompt: who the bot is and how to behave in the group.
pub(crate) fn system_prompt(me: &BotSettings, colleagues: &[BotSettings]) -> String {
    let persona = me.persona.clone().unwrap_or_else(|| {
        let role = if me.role.is_empty() {
            "an assistant".to_string()
        } else {
            me.role.clone()
        };
        if me.skills.is_empty() {
            format!("You are {}, {role}.", me.name)
        } else {
            format!(
                "You are {}, {role}, good at: {}.",
                me.name,
                me.skills.join(", ")
            )
        }
    });
    format!(
        "{persona}\nYou are in a group chat with people and these bot colleagues: {}.\n\
Answer briefly, in the language of the message. To address a colleague write @Name. \
Do not repeat what others said; say only what you add.",
        colleague_profiles(colleagues)
    )
}

/// The messages sent for a reply: system prompt, then the transcript as one user turn.
pub(crate) fn messages(
    me: &BotSettings,
    colleagues: &[BotSettings],
    context: &[Arc<Envelope>],
    trigger: &Envelope,
) -> Vec<ChatMessage> {
    let mut convo = String::from("Recent messages:\n");
    for e in context {
        convo.push_str(&format!("{}: {}\n", who(e), trim(&e.text, 600)));
    }
    convo.push_str(&format!(
        "\nNow reply, as {}, to this message from {}:\n{}",
        me.name,
        prompt_name(&trigger.author.name),
        trigger.text
    ));
    vec![
        ChatMessage::system(system_prompt(me, colleagues)),
        ChatMessage::user(convo),
    ]
}

/// What a drafting judge is told after the reply prompt: the bot's judge template
/// (its `{context}` is the transcript above), then the form of the answer.
const DRAFT_FORM: &str = "Answer in this form: on the first line only that JSON; then, only if \
speak is true, your message to the group from the second line on. If speak is false, write \
nothing after the JSON.";

/// The messages of a drafting judge call (`judge_drafts`): the reply's (persona,
/// colleagues, transcript, the message), then the bot's own judge question about it,
/// asked first, so the answer's first line is the verdict and the rest the reply.
pub(crate) fn drafting_messages(
    me: &BotSettings,
    colleagues: &[BotSettings],
    context: &[Arc<Envelope>],
    trigger: &Envelope,
) -> Vec<ChatMessage> {
    let mut out = messages(me, colleagues, context, trigger);
    let question = fill(
        &JudgeInput {
            me,
            colleagues,
            context: &[],
            msg: trigger,
        },
        "(the recent messages above)",
    );
    if let Some(user) = out.last_mut() {
        user.content.push_str(&format!(
            "\n\nBut first decide whether you should speak at all:\n{question}\n{DRAFT_FORM}"
        ));
    }
    out
}

/// A reply with no LLM configured: clearly marked, and honest about what it is.
pub(crate) fn offline_reply(me: &BotSettings, trigger: &Envelope, why: &str) -> String {
    let skills = if me.skills.is_empty() {
        "general help".to_string()
    } else {
        me.skills.join(", ")
    };
    format!(
        "{OFFLINE_MARK} {} here ({why}). No LLM is configured, so this is a placeholder answer to {}: \"{}\". I can help with {skills}.",
        me.name,
        prompt_name(&trigger.author.name),
        trim(&trigger.text, 80)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::judge::tests::msg as said;
    use crate::turn::judge::{build_prompt, build_shared_prompt};
    use crate::wire::envelope::{Author, AuthorKind, Envelope};

    fn bot(name: &str) -> BotSettings {
        let mut b = BotSettings::from_toml(&format!(
            "name = \"{name}\"\nrole = \"SRE\"\nskills = [\"deploys\"]"
        ))
        .expect("a bot");
        b.judge_prompt = Some("{name} weighs {from}: {message} after {context}. Reply JSON {\"speak\":bool,\"relevance\":0-1}.".into());
        b
    }

    #[test]
    fn a_drafting_call_asks_the_bots_own_judge_question_first_and_sends_the_transcript_once() {
        let me = bot("Atlas");
        let colleagues = vec![bot("Quill")];
        let said = |text: &str| {
            Envelope::message(
                ulid::Ulid::new(),
                0,
                "g",
                "Atlas",
                Author::human("dana"),
                text,
            )
        };
        let earlier = Arc::new(said("the deploy finished at noon"));
        let trigger = said("why is p99 up?");
        let m = drafting_messages(&me, &colleagues, std::slice::from_ref(&earlier), &trigger);
        assert_eq!(m.len(), 2, "system and one user turn, as a reply's");
        assert_eq!(m[0].content, system_prompt(&me, &colleagues));
        let user = &m[1].content;
        // The reply's transcript, once: the judge question points at it.
        assert_eq!(
            user.matches("the deploy finished at noon").count(),
            1,
            "{user}"
        );
        assert!(
            user.contains(
                "Atlas weighs dana: why is p99 up? after (the recent messages above). Reply JSON"
            ),
            "{user}"
        );
        let question = user.find("But first decide").expect("the judge question");
        assert!(question > user.find("Now reply, as Atlas").expect("the reply's ask"));
        assert!(user.ends_with(DRAFT_FORM), "{user}");
    }

    #[test]
    /// The judge's prompts (its own, the shared one) and the reply's show a name
    /// the same way.
    fn prompts_carry_names_cut_to_one_line_of_64_bytes() {
        let me = BotSettings::from_toml("name = \"A\"\nrole = \"r\"\nskills = [\"s\"]").unwrap();
        let long = format!("Mallory\n{}", "名".repeat(70 * 1024));
        let context = vec![said(&long, AuthorKind::Human, "earlier")];
        let new = said(&long, AuthorKind::Bot, "hello");
        let shown = prompt_name(&long);
        assert_eq!(
            shown,
            format!("Mallory {}", "名".repeat(18)),
            "64 bytes would split a character"
        );
        assert!(shown.starts_with("Mallory 名名"), "{shown}");
        let own = build_prompt(&JudgeInput {
            me: &me,
            colleagues: &[],
            context: &context,
            msg: &new,
        });
        let shared = build_shared_prompt(&[&me], &context, &new, 240);
        let reply = messages(&me, &[], &context, &new);
        let offline = offline_reply(&me, &new, "asked");
        for p in [&own, &shared, &reply[1].content, &offline] {
            assert!(p.len() < 1024, "{} bytes", p.len());
            assert!(p.contains(&shown), "{p}");
        }
        assert!(
            own.contains(&format!("New from {shown} (bot): hello")),
            "{own}"
        );
        assert!(own.contains(&format!("{shown}: earlier")), "{own}");
        assert!(reply[1].content.contains(&format!("from {shown}:\nhello")));
    }
}
