//! People may not take a bot's name: how two names are compared, and who is who in
//! `[mesh] operators`.
//!
//! Two names are the same when their [`name_key`]s are: NFKC-normalised (so the
//! full-width `ＸｉａｏＢａ` and the ligature `ﬁ` are their plain forms), lower-cased,
//! without the invisible characters (Unicode general category Cf: zero-width spaces
//! and joiners, the soft hyphen, bidi controls, the BOM …) and with runs of white
//! space made one space and trimmed. `xiaoba`, `ＸｉａｏＢａ` and `Xiao\u{200b}Ba` all
//! read as bot XiaoBa in a chat, so all three are refused (or marked) as a person's
//! name.

use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

use super::Platform;

/// `name` as compared with the bots' names and aliases: NFKC, lower case, no format
/// (Cf) characters, white space collapsed.
pub(crate) fn name_key(name: &str) -> String {
    let visible: String = name
        .nfkc()
        .filter(|c| c.general_category() != GeneralCategory::Format)
        .flat_map(char::to_lowercase)
        .collect();
    // NFKC after the removal too: a joiner between a base and its combining mark.
    let folded: String = visible.nfkc().collect();
    folded.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `name` reads as one of `handles` (a bot's name and aliases).
#[cfg(test)]
pub(crate) fn names_collide<'a>(name: &str, handles: impl IntoIterator<Item = &'a str>) -> bool {
    let key = name_key(name);
    !key.is_empty() && handles.into_iter().any(|h| name_key(h) == key)
}

/// A platform person whose display name reads as a bot's (`collides`) is shown with
/// a marker: `XiaoBa (discord user)`. They are a person on the platform, so they are
/// not refused, but nobody (no bot, no prompt) may take them for the bot.
pub(crate) fn marked_person_name(name: &str, platform: Platform, collides: bool) -> String {
    if collides {
        format!("{name} ({} user)", platform.as_str())
    } else {
        name.to_string()
    }
}

/// A person, as `[mesh] operators` names them: `platform:id`, where the id is the
/// platform's (`local`: the name a person posts under on the page or the API).
pub(crate) fn person_key(platform: Platform, id: &str) -> String {
    format!("{}:{id}", platform.as_str())
}

/// Checks one `[mesh] operators` entry: `platform:id` with a non-empty id (whether
/// the platform exists is `platform::registry::check`'s to say). The error says what is wrong, in words an operator can act on.
pub(crate) fn check_operator(entry: &str) -> Result<(), String> {
    let Some((platform, id)) = entry.split_once(':') else {
        return Err(format!(
            "{entry:?} is not \"platform:id\" (e.g. \"local:Boss\", \"discord:5005\")"
        ));
    };
    if platform.trim().is_empty() {
        return Err(format!(
            "{entry:?}: the platform is empty (e.g. \"local:Boss\", \"discord:5005\")"
        ));
    }
    if id.trim().is_empty() {
        return Err(format!("{entry:?}: the person's id is empty"));
    }
    if id.trim() != id {
        return Err(format!(
            "{entry:?}: the person's id has white space around it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_width_and_invisible_characters_do_not_make_a_new_name() {
        let bot = ["XiaoBa", "小八"];
        for taken in [
            "XiaoBa",
            "xiaoba",
            "XIAOBA",
            "ＸｉａｏＢａ",
            "Xiao\u{200b}Ba",
            "\u{feff}Xiao\u{200d}Ba\u{2060}",
            "Xiao\u{00ad}Ba",
            "\u{202e}XiaoBa\u{202c}",
            "\u{2066}XiaoBa\u{2069}",
            "Xiao\u{180e}Ba",
            "  XiaoBa ",
            "小八",
            "小\u{200b}八",
        ] {
            assert!(names_collide(taken, bot), "{taken:?} should read as XiaoBa");
        }
        for free in ["Xiao Ba", "XiaoBa2", "Xiaobai", "小九", "", "\u{200b}"] {
            assert!(!names_collide(free, bot), "{free:?} is another name");
        }
        assert_eq!(name_key("ﬁx  Ｍｅ"), "fix me");
    }

    #[test]
    fn a_colliding_platform_name_is_marked() {
        let bot = ["XiaoBa"];
        let shown =
            |name| marked_person_name(name, Platform::named("discord"), names_collide(name, bot));
        assert_eq!(shown("ｘｉａｏｂａ"), "ｘｉａｏｂａ (discord user)");
        assert_eq!(shown("Carol"), "Carol");
        // The marked name does not collide again.
        assert!(!names_collide(&shown("XiaoBa"), bot));
    }

    #[test]
    fn operator_entries() {
        for ok in [
            "local:Boss",
            "feishu:ou_1",
            "discord:5005",
            "dingtalk:manager1",
        ] {
            assert_eq!(check_operator(ok), Ok(()), "{ok}");
        }
        for bad in ["Boss", "discord:", "local: Boss", ":x"] {
            assert!(check_operator(bad).is_err(), "{bad}");
        }
        assert_eq!(person_key(Platform::LOCAL, "Boss"), "local:Boss");
    }
}
