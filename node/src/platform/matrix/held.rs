//! Pieces of text kept out of a rewrite ([`Held`]): a pill while the rest of a
//! formatted body is stripped of its tags, a person's pill while an answer is
//! HTML-escaped. Each piece is replaced by a placeholder made of two private-use
//! characters around its number, which no input can forge (they are removed from
//! the input first), and put back once the rewrite is done.

/// Opens a placeholder.
const OPEN: char = '\u{E000}';
/// Closes a placeholder.
const CLOSE: char = '\u{E001}';

/// The pieces held so far, by number.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Each held piece, as it is to be put back.
    pieces: Vec<String>,
}

impl Held {
    /// `text` without the placeholder characters (so that none come from outside).
    pub(crate) fn clean(text: &str) -> String {
        text.chars().filter(|c| *c != OPEN && *c != CLOSE).collect()
    }

    /// Keeps `piece`; returns the placeholder that stands for it.
    pub(crate) fn hold(&mut self, piece: String) -> String {
        self.pieces.push(piece);
        format!("{OPEN}{}{CLOSE}", self.pieces.len() - 1)
    }

    /// `text` with every placeholder replaced by its piece.
    pub(crate) fn restore(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(i) = rest.find(OPEN) {
            out.push_str(&rest[..i]);
            let after = &rest[i + OPEN.len_utf8()..];
            let Some(j) = after.find(CLOSE) else {
                break;
            };
            if let Some(p) = after[..j]
                .parse::<usize>()
                .ok()
                .and_then(|n| self.pieces.get(n))
            {
                out.push_str(p);
            }
            rest = &after[j + CLOSE.len_utf8()..];
        }
        out.push_str(rest);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_come_back_and_forged_placeholders_do_not() {
        let mut h = Held::default();
        let input = Held::clean("a\u{E000}0\u{E001}b");
        assert_eq!(input, "a0b");
        let text = format!("<{}> & <{}>", h.hold("x<y".into()), h.hold("z".into()));
        assert_eq!(h.restore(&text.replace('<', "[")), "[x<y> & [z>");
    }
}
