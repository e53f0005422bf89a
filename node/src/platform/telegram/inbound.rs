//! An update's message as the mesh records it: Telegram's `Message` object, its
//! entities read in UTF-16 code units (as Telegram counts offsets and lengths: an
//! emoji outside the BMP is two units, a CJK character one), mentions resolved to
//! roster names, media as placeholders.

use std::collections::HashMap;

use serde::Deserialize;

use super::api::User;

/// One `Update` (only `message` is asked for; anything else is logged and confirmed).
#[derive(Debug, Clone, Deserialize)]
pub struct Update {
    /// Its id: `getUpdates`' offset confirms every update below it.
    pub update_id: i64,
    /// A new message in a chat the bot is in.
    #[serde(default)]
    pub message: Option<Message>,
}

/// A chat.
#[derive(Debug, Clone, Deserialize)]
pub struct Chat {
    /// The chat's id (a group's is negative: `-100…` for a supergroup).
    pub id: i64,
    /// `private`, `group`, `supergroup` or `channel`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A group's title.
    #[serde(default)]
    pub title: Option<String>,
}

/// A `MessageEntity`: a span of the text with a meaning, in UTF-16 code units.
#[derive(Debug, Clone, Deserialize)]
pub struct Entity {
    /// `mention`, `text_mention`, `bot_command`, `code`, `pre`, `bold`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// Start, in UTF-16 code units.
    pub offset: usize,
    /// Length, in UTF-16 code units.
    pub length: usize,
    /// The person a `text_mention` names (people without a @handle).
    #[serde(default)]
    pub user: Option<User>,
    /// A `pre` block's language.
    #[serde(default)]
    pub language: Option<String>,
}

/// The fields of a `Message` the mesh uses.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// Its id, unique within its chat.
    pub message_id: i64,
    /// When it was sent, unix seconds.
    #[serde(default)]
    pub date: i64,
    /// The chat it is in.
    pub chat: Chat,
    /// Who sent it (absent in channels).
    #[serde(default)]
    pub from: Option<User>,
    /// The chat it was sent on behalf of (an anonymous admin posts as the group).
    #[serde(default)]
    pub sender_chat: Option<Chat>,
    /// The text of a text message.
    #[serde(default)]
    pub text: Option<String>,
    /// The text's entities.
    #[serde(default)]
    pub entities: Vec<Entity>,
    /// A media message's caption.
    #[serde(default)]
    pub caption: Option<String>,
    /// The caption's entities.
    #[serde(default)]
    pub caption_entities: Vec<Entity>,
    /// The message this one answers.
    #[serde(default)]
    pub reply_to_message: Option<Box<Message>>,
    /// The group became a supergroup with this id (a service message).
    #[serde(default)]
    pub migrate_to_chat_id: Option<i64>,
    /// Every other field: which kind of media it carries.
    #[serde(flatten)]
    pub rest: HashMap<String, serde_json::Value>,
}

/// The media kinds shown as placeholders, with their names in the text.
const MEDIA: [(&str, &str); 9] = [
    ("photo", "[image]"),
    ("video", "[video]"),
    ("animation", "[animation]"),
    ("document", "[file]"),
    ("audio", "[audio]"),
    ("voice", "[voice message]"),
    ("video_note", "[video message]"),
    ("sticker", "[sticker]"),
    ("poll", "[poll]"),
];

/// The byte offset in `text` of every UTF-16 offset, indexed by UTF-16 offset
/// (`None` inside a surrogate pair), with one entry past the end.
fn utf16_to_byte(text: &str) -> Vec<Option<usize>> {
    let mut map = Vec::with_capacity(text.len() + 1);
    for (i, c) in text.char_indices() {
        map.push(Some(i));
        if c.len_utf16() == 2 {
            map.push(None);
        }
    }
    map.push(Some(text.len()));
    map
}

/// The byte range of an entity (UTF-16 `offset`, `length`) in `text`; `None` when it
/// falls outside the text or inside a character.
pub fn entity_range(text: &str, offset: usize, length: usize) -> Option<std::ops::Range<usize>> {
    let map = utf16_to_byte(text);
    let start = (*map.get(offset)?)?;
    let end = (*map.get(offset.checked_add(length)?)?)?;
    (start <= end).then_some(start..end)
}

/// What the mesh's names are on Telegram: @handle (lower-case) → bot name, and this
/// bot's own user id once `getMe` said it.
#[derive(Debug, Clone, Default)]
pub struct Handles {
    /// Lower-cased @handle → roster name.
    pub bots: HashMap<String, String>,
    /// This bot's own Telegram user id and roster name.
    pub me: Option<(i64, String)>,
}

impl Handles {
    /// The roster name of `@handle` (without `@`), if a bot of the mesh has it.
    pub fn bot(&self, handle: &str) -> Option<&str> {
        self.bots
            .get(&handle.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// Whether `c` continues a @handle.
fn handle_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `text` with plain `@handle`s of the mesh's bots written `@Name` (a handle after a
/// letter, digit, `_`, `.` or `@` is part of an email or a word, and is kept).
fn plain_handles(text: &str, handles: &Handles) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut prev: Option<char> = None;
    while let Some(i) = rest.find('@') {
        let before = &rest[..i];
        out.push_str(before);
        let last = before.chars().next_back().or(prev);
        let after = &rest[i + 1..];
        let len = after.find(|c: char| !handle_char(c)).unwrap_or(after.len());
        let word = &after[..len];
        let boundary = !last.is_some_and(|c| handle_char(c) || c == '.' || c == '@');
        match handles.bot(word).filter(|_| boundary && len >= 5) {
            Some(name) => {
                out.push('@');
                out.push_str(name);
            }
            None => {
                out.push('@');
                out.push_str(word);
            }
        }
        prev = Some(word.chars().next_back().unwrap_or('@'));
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// The text as the mesh records it: `mention` entities and plain @handles of the
/// mesh's bots become `@Name`; `text_mention`s (people without a handle) become
/// `<at user_id="id">Name</at>`, and a person's @handle that reads as a bot's name
/// `<at user_id="@handle">@handle</at>`, which names no bot; `/cmd@handle` becomes
/// `/cmd @Name`; `code` and `pre` spans are fenced with backticks (so a mention inside
/// code is none). `is_member` says whether a word reads as a roster name or alias.
pub fn readable_text(
    text: &str,
    entities: &[Entity],
    handles: &Handles,
    is_member: &dyn Fn(&str) -> bool,
) -> String {
    let mut spans: Vec<(std::ops::Range<usize>, &Entity)> = entities
        .iter()
        .filter(|e| {
            matches!(
                e.kind.as_str(),
                "mention" | "text_mention" | "bot_command" | "code" | "pre"
            )
        })
        .filter_map(|e| Some((entity_range(text, e.offset, e.length)?, e)))
        .collect();
    spans.sort_by_key(|(r, _)| (r.start, std::cmp::Reverse(r.end)));
    let mut out = String::with_capacity(text.len() + 16);
    let mut at = 0;
    for (r, e) in spans {
        if r.start < at {
            continue; // inside a span already written (a mention in a code block)
        }
        out.push_str(&plain_handles(&text[at..r.start], handles));
        let slice = &text[r.clone()];
        match e.kind.as_str() {
            "mention" => {
                let handle = slice.trim_start_matches('@');
                match handles.bot(handle) {
                    Some(name) => {
                        out.push('@');
                        out.push_str(name);
                    }
                    None if is_member(handle) => {
                        out.push_str(&format!("<at user_id=\"@{handle}\">@{handle}</at>"))
                    }
                    None => out.push_str(slice),
                }
            }
            "text_mention" => {
                let id = e.user.as_ref().map(|u| u.id).unwrap_or_default();
                let me = handles.me.as_ref().filter(|(mine, _)| *mine == id);
                match me {
                    Some((_, name)) => {
                        out.push('@');
                        out.push_str(name);
                    }
                    None => {
                        let name: String =
                            slice.chars().filter(|c| !matches!(c, '<' | '>')).collect();
                        out.push_str(&format!("<at user_id=\"{id}\">{name}</at>"));
                    }
                }
            }
            "bot_command" => match slice.split_once('@') {
                Some((cmd, handle)) => match handles.bot(handle) {
                    Some(name) => out.push_str(&format!("{cmd} @{name}")),
                    None => out.push_str(slice),
                },
                None => out.push_str(slice),
            },
            "code" => {
                out.push('`');
                out.push_str(slice);
                out.push('`');
            }
            _ => {
                out.push_str("```");
                out.push_str(e.language.as_deref().unwrap_or(""));
                out.push('\n');
                out.push_str(slice);
                out.push_str("\n```");
            }
        }
        at = r.end;
    }
    out.push_str(&plain_handles(&text[at..], handles));
    out
}

impl Message {
    /// The message's text and the placeholder of its media, if any: `[image] caption`.
    pub fn text_and_media(&self, handles: &Handles, is_member: &dyn Fn(&str) -> bool) -> String {
        let media = MEDIA
            .iter()
            .find(|(k, _)| self.rest.contains_key(*k))
            .map(|(_, p)| *p);
        let body = match (&self.text, &self.caption) {
            (Some(t), _) => readable_text(t, &self.entities, handles, is_member),
            (None, Some(c)) => readable_text(c, &self.caption_entities, handles, is_member),
            (None, None) => String::new(),
        };
        match media {
            Some(m) if body.is_empty() => m.to_string(),
            Some(m) => format!("{m} {body}"),
            None => body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handles() -> Handles {
        Handles {
            bots: [("alpha_bot", "Alpha"), ("beta_bot", "Beta")]
                .into_iter()
                .map(|(h, n)| (h.to_string(), n.to_string()))
                .collect(),
            me: Some((111, "Alpha".into())),
        }
    }

    /// An entity over `needle` in `text`, its offset and length counted as Telegram
    /// counts them (UTF-16 code units).
    fn entity(text: &str, needle: &str, kind: &str) -> Entity {
        let start = text.find(needle).unwrap();
        Entity {
            kind: kind.into(),
            offset: text[..start].encode_utf16().count(),
            length: needle.encode_utf16().count(),
            user: None,
            language: None,
        }
    }

    fn none(_: &str) -> bool {
        false
    }

    #[test]
    fn entity_offsets_are_utf16_code_units() {
        let text = "😀😀 问题 @beta_bot 看下";
        let e = entity(text, "@beta_bot", "mention");
        assert_eq!(
            e.offset, 8,
            "two emoji are four units, 问题 and the spaces four"
        );
        assert_eq!(
            &text[entity_range(text, e.offset, e.length).unwrap()],
            "@beta_bot"
        );
        assert_eq!(entity_range(text, 1, 2), None, "inside a surrogate pair");
        assert_eq!(entity_range(text, 100, 1), None, "past the end");
        assert_eq!(
            readable_text(text, &[e], &handles(), &none),
            "😀😀 问题 @Beta 看下"
        );
    }

    #[test]
    fn mentions_of_people_commands_and_code_are_read_as_the_mesh_reads_them() {
        let text = "hi @Alpha_Bot and @carol and @beta, ask Dana; /why@beta_bot run(@beta_bot) mail x@beta_bot.dev";
        let mut dana = entity(text, "Dana", "text_mention");
        dana.user = Some(User {
            id: 42,
            first_name: "Dana".into(),
            ..Default::default()
        });
        let ents = vec![
            entity(text, "@Alpha_Bot", "mention"),
            entity(text, "@carol", "mention"),
            entity(text, "@beta,", "mention"),
            dana,
            entity(text, "/why@beta_bot", "bot_command"),
            entity(text, "run(@beta_bot)", "code"),
        ];
        // "@beta," is not a real entity (Telegram would stop at the comma), but a
        // person called @beta is, and must not read as bot Beta.
        let mut ents = ents;
        ents[2].length = 5;
        let is_member = |w: &str| w.eq_ignore_ascii_case("beta");
        let got = readable_text(text, &ents, &handles(), &is_member);
        assert_eq!(
            got,
            "hi @Alpha and @carol and <at user_id=\"@beta\">@beta</at>, ask <at user_id=\"42\">Dana</at>; /why @Beta `run(@beta_bot)` mail x@beta_bot.dev"
        );
    }

    #[test]
    fn plain_handles_without_entities_are_mentions_too_but_not_emails() {
        let got = readable_text(
            "@beta_bot look, cc@alpha_bot, 问@alpha_bot吧",
            &[],
            &handles(),
            &none,
        );
        assert_eq!(got, "@Beta look, cc@alpha_bot, 问@Alpha吧");
    }

    #[test]
    fn media_become_placeholders_with_their_caption() {
        let m: Message = serde_json::from_value(serde_json::json!({
            "message_id": 5, "date": 1, "chat": {"id": -100, "type": "supergroup"},
            "photo": [{"file_id": "x", "file_unique_id": "y", "width": 1, "height": 1}],
            "caption": "look @beta_bot", "caption_entities": [{"type": "mention", "offset": 5, "length": 9}],
        }))
        .unwrap();
        assert_eq!(m.text_and_media(&handles(), &none), "[image] look @Beta");
        let s: Message = serde_json::from_value(serde_json::json!({
            "message_id": 6, "date": 1, "chat": {"id": -100, "type": "supergroup"},
            "sticker": {"file_id": "x"},
        }))
        .unwrap();
        assert_eq!(s.text_and_media(&handles(), &none), "[sticker]");
    }
}
