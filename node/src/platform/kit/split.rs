//! The one way to cut a long reply into parts a platform accepts: at the best
//! boundary, never inside a character, a code block closed and reopened across parts
//! (Discord's 2,000, Telegram's 4,096, Slack's 4,000 UTF-16 units; WeCom's 20,480
//! UTF-8 bytes).

/// What a platform's limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// UTF-16 code units, as Discord and Telegram count a message (a character
    /// outside the Basic Multilingual Plane counts twice); conservative for Slack.
    Utf16,
    /// UTF-8 bytes, as WeCom counts one (a Chinese character counts three).
    Utf8Bytes,
}

impl Unit {
    /// What `c` counts in this unit.
    fn of(self, c: char) -> usize {
        match self {
            Unit::Utf16 => c.len_utf16(),
            Unit::Utf8Bytes => c.len_utf8(),
        }
    }

    /// The length of `s` in this unit.
    pub(crate) fn len(self, s: &str) -> usize {
        match self {
            Unit::Utf16 => utf16_len(s),
            Unit::Utf8Bytes => s.len(),
        }
    }
}

/// Length in UTF-16 code units ([`Unit::Utf16`]).
pub fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

/// Byte offset of the longest prefix of `s` whose length in `unit` is at most `limit`.
fn prefix_end(s: &str, limit: usize, unit: Unit) -> usize {
    let mut units = 0;
    for (i, c) in s.char_indices() {
        units += unit.of(c);
        if units > limit {
            return i;
        }
    }
    s.len()
}

/// Whether `s` ends inside a ``` fence, and the language of that fence.
fn open_fence(s: &str) -> Option<String> {
    let mut open: Option<String> = None;
    let mut rest = s;
    while let Some(i) = rest.find("```") {
        let after = &rest[i + 3..];
        open = match open {
            Some(_) => None,
            None => Some(
                after
                    .split(|c: char| c.is_whitespace())
                    .next()
                    .unwrap_or("")
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || "+-_#".contains(*c))
                    .take(20)
                    .collect(),
            ),
        };
        rest = after;
    }
    open
}

/// Splits `text` into parts of at most `limit` UTF-16 units ([`split_message_in`]
/// with [`Unit::Utf16`]).
pub fn split_message(text: &str, limit: usize) -> Vec<String> {
    split_message_in(text, limit, Unit::Utf16)
}

/// Splits `text` into parts of at most `limit` in `unit`, each cut at the best
/// boundary in its second half: a blank line, else a line break, else a sentence end,
/// else a space, else anywhere (never inside a character). A part that ends inside a
/// ``` code block closes it, and the next part opens it again with the same language.
pub(crate) fn split_message_in(text: &str, limit: usize, unit: Unit) -> Vec<String> {
    let text = text.trim();
    if unit.len(text) <= limit {
        return if text.is_empty() {
            Vec::new()
        } else {
            vec![text.to_string()]
        };
    }
    // Room for a closing fence and for the next part's reopening one.
    const FENCE_ROOM: usize = 4 + 3 + 20 + 1;
    let budget = limit.saturating_sub(FENCE_ROOM).max(limit / 2).max(1);
    let mut parts = Vec::new();
    let mut reopen = String::new();
    let mut rest = text;
    while !rest.is_empty() {
        let room = budget.saturating_sub(unit.len(&reopen)).max(1);
        let whole = format!("{reopen}{rest}");
        if unit.len(&whole) <= limit {
            parts.push(whole);
            break;
        }
        let end = prefix_end(rest, room, unit);
        let window = &rest[..end];
        let floor = window.len() / 2;
        let cut = [
            "\n\n", "\n", ". ", "! ", "? ", "。", "！", "？", "; ", ", ", " ",
        ]
        .iter()
        .find_map(|sep| {
            window
                .rfind(sep)
                .filter(|&i| i >= floor && i > 0)
                .map(|i| i + sep.len())
        })
        .unwrap_or(if end == 0 {
            rest.chars().next().map_or(rest.len(), char::len_utf8)
        } else {
            end
        });
        let piece = rest[..cut].trim_end();
        let mut part = format!("{reopen}{piece}");
        reopen.clear();
        if let Some(lang) = open_fence(&part) {
            part.push_str("\n```");
            reopen = format!("```{lang}\n");
        }
        if !piece.is_empty() {
            parts.push(part);
        }
        rest = rest[cut..].trim_start_matches([' ', '\n', '\r', '\t']);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_one_part_and_empty_text_none() {
        assert_eq!(split_message("  hi  ", 2000), vec!["hi".to_string()]);
        assert!(split_message("   ", 2000).is_empty());
    }

    #[test]
    fn long_text_splits_at_paragraphs_then_lines_then_spaces() {
        let para = "word ".repeat(300); // 1500 chars
        let text = format!("{}\n\n{}", para.trim(), para.trim());
        let parts = split_message(&text, 2000);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], para.trim());
        assert_eq!(parts[1], para.trim());
        let one_line = "abc ".repeat(1000);
        let parts = split_message(&one_line, 2000);
        assert!(parts.iter().all(|p| utf16_len(p) <= 2000));
        assert!(parts.iter().all(|p| p.ends_with("abc")), "cut at spaces");
        assert_eq!(parts.join(" "), one_line.trim());
    }

    #[test]
    fn no_part_is_over_the_limit_even_without_boundaries_or_with_wide_characters() {
        let text = "😀".repeat(3000);
        let parts = split_message(&text, 2000);
        assert!(
            parts.iter().all(|p| utf16_len(p) <= 2000),
            "{:?}",
            parts.iter().map(|p| utf16_len(p)).collect::<Vec<_>>()
        );
        assert_eq!(parts.concat(), text);
        let cjk = "问".repeat(4500);
        let parts = split_message(&cjk, 2000);
        assert!(parts.iter().all(|p| p.chars().count() <= 2000));
        assert_eq!(parts.concat(), cjk);
    }

    #[test]
    fn a_code_block_cut_in_two_is_closed_and_reopened() {
        let code: String = (0..200).map(|i| format!("let x{i} = {i};\n")).collect();
        let text = format!("Here:\n```rust\n{code}```\nDone.");
        let parts = split_message(&text, 2000);
        assert!(parts.len() >= 2);
        for p in &parts {
            assert!(utf16_len(p) <= 2000);
            assert_eq!(p.matches("```").count() % 2, 0, "balanced fences: {p}");
        }
        assert!(parts[1].starts_with("```rust\n"));
    }

    /// WeCom counts bytes: 20,480 bytes hold 6,826 Chinese characters, not 20,480,
    /// and a cut never falls inside one.
    #[test]
    fn a_byte_limit_counts_utf8_bytes() {
        let cjk = "这是一个很长的中文回答。".repeat(1500); // 18,000 chars, 54,000 bytes
        assert_eq!(
            split_message_in(&cjk, 20_480, Unit::Utf16).len(),
            1,
            "as UTF-16 it fits"
        );
        let parts = split_message_in(&cjk, 20_480, Unit::Utf8Bytes);
        assert_eq!(parts.len(), 3, "54,000 bytes in parts of at most 20,480");
        assert!(parts.iter().all(|p| p.len() <= 20_480));
        assert!(
            parts.iter().all(|p| p.ends_with('。')),
            "cut at sentence ends"
        );
        assert_eq!(parts.concat(), cjk);
        let emoji = "😀".repeat(10_000);
        let parts = split_message_in(&emoji, 20_480, Unit::Utf8Bytes);
        assert!(parts.iter().all(|p| p.len() <= 20_480));
        assert_eq!(parts.concat(), emoji);
    }
}
