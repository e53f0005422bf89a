//! The one way a colleague's `@Name` in a bot's text becomes its platform's mention of
//! the colleague's id ([`by_id`]), for platforms that mention by id in the text
//! (Discord and Slack write `<@id>`), with the ids mentioned for the platform's
//! notification list; and the one log line naming the colleagues a bot cannot
//! mention on its platform ([`log_unmentionable`]).

use std::collections::HashMap;

use crate::config::NodeConfig;
use crate::turn::mention::MentionMatcher;

/// `text` with each colleague's `@Name` (or alias) made `mention(id)`, their id from
/// `ids` (colleague → platform id); bot `me` and anyone without an id keep their plain
/// `@Name`. Returns the text and the ids mentioned, in order, each once.
pub(crate) fn by_id(
    matcher: &MentionMatcher,
    text: &str,
    me: &str,
    ids: &HashMap<String, String>,
    mention: impl Fn(&str) -> String,
) -> (String, Vec<String>) {
    // `rewrite` takes a `Fn`: the list is kept in a cell.
    let mentioned = std::cell::RefCell::new(Vec::<String>::new());
    let text = matcher.rewrite(text, |member| {
        let id = ids.get(member).filter(|_| member != me)?;
        let mut m = mentioned.borrow_mut();
        if !m.contains(id) {
            m.push(id.clone());
        }
        Some(mention(id))
    });
    (text, mentioned.into_inner())
}

/// Logs, at start, the colleagues of `cfg`'s bot that have no id in `ids` (colleague →
/// platform id; `what` says which id and where it is set): their `@Name` stays plain
/// text on `platform`.
pub(crate) fn log_unmentionable(
    cfg: &NodeConfig,
    ids: &HashMap<String, String>,
    what: &str,
    platform: &str,
) {
    let missing: Vec<&str> = cfg
        .peers()
        .map(|p| p.name.as_str())
        .filter(|p| !ids.contains_key(*p))
        .collect();
    if !missing.is_empty() {
        tracing::info!(
            bot = %cfg.bot().name,
            peers = ?missing,
            "no {what} for these colleagues: @mentions of them stay plain text on {platform}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::mention::Member;

    #[test]
    fn colleagues_are_mentioned_by_id_once_each_and_the_bot_itself_never() {
        let member = |name: &str| Member {
            name: name.into(),
            ..Member::default()
        };
        let matcher = MentionMatcher::new(&[member("Ada"), member("Bix"), member("Cy")]);
        let ids = HashMap::from([
            ("Ada".to_string(), "U1".to_string()),
            ("Bix".to_string(), "U2".to_string()),
        ]);
        let (text, mentioned) = by_id(
            &matcher,
            "@Bix and @Ada, @Cy, @Bix again",
            "Ada",
            &ids,
            |id| format!("<@{id}>"),
        );
        assert_eq!(text, "<@U2> and @Ada, @Cy, <@U2> again");
        assert_eq!(mentioned, vec!["U2".to_string()]);
    }
}
