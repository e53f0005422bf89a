//! `Reply`: the prompt for a bot's actual message, and the offline stand-in.
//!
//! One LLM call: the persona (from `persona` or role and skills), the colleagues'
//! profiles from peers.toml, the recent transcript, and the message being answered.

use std::sync::Arc;

use crate::config::BotSettings;
use crate::llm::ChatMessage;
use crate::turn::judge::{colleague_profiles, trim};
use crate::wire::envelope::{AuthorKind, Envelope};

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
        let who = match e.author.kind {
            AuthorKind::Bot => format!("{} (bot)", e.author.name),
            AuthorKind::Human => e.author.name.clone(),
        };
        convo.push_str(&format!("{who}: {}\n", trim(&e.text, 600)));
    }
    convo.push_str(&format!(
        "\nNow reply, as {}, to this message from {}:\n{}",
        me.name, trigger.author.name, trigger.text
    ));
    vec![
        ChatMessage::system(system_prompt(me, colleagues)),
        ChatMessage::user(convo),
    ]
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
        trigger.author.name,
        trim(&trigger.text, 80)
    )
}
