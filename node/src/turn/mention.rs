//! Finding whom a chat message @-mentions.
//!
//! Several bots share one group chat, and each must decide whether a message
//! is addressed to it. [`MentionMatcher`] is built once from the whole roster
//! (names, aliases and platform open_ids) and answers "who is mentioned here?"
//! with a single left-to-right scan of the text.
//!
//! # Rules
//!
//! * `@` and the full-width `＠` (U+FF20) introduce a mention. The name must
//!   follow immediately: `@ Bob` is not a mention.
//! * Names and aliases match case-insensitively (per-character Unicode
//!   lowercase). At each `@` the **longest** roster key that matches and
//!   satisfies its boundary rule wins, so with `小八` and `小八哥` in the roster
//!   `@小八哥` names only `小八哥`, and `@Bob Ross` prefers `Bob Ross` to `Bob`.
//! * A key that ends in a handle character (`[A-Za-z0-9_-]`, i.e. a Latin
//!   name) must be followed by a character that cannot continue a handle, or by
//!   the end of the text: `@Bob` is not found in `@Bobby`, `@Bob-ross`,
//!   `@Bob_2`, but is in `@Bob你好`, `@Bob，`, `@Bob.`. A key ending in anything
//!   else (CJK) needs no boundary: `@小八你看下` names `小八`.
//! * An ASCII `@` glued to a preceding `[A-Za-z0-9._+%-]` is an e-mail address
//!   (`ops@xiaoba.dev`), not a mention — unless that preceding character ends a
//!   mention just found (`@Bob@Alice` names both). The full-width `＠` never
//!   occurs in addresses, so it is exempt from this rule.
//! * Nothing inside inline code (`` `…` ``, ``` ``…`` ```), fenced code
//!   (```` ``` ````, an unclosed fence runs to the end of the text) or a URL
//!   counts. A URL is a run starting with `http://`, `https://` or `www.` (not
//!   glued to a preceding ASCII letter/digit) that ends at whitespace, at one of
//!   `<>"` and backtick, or at CJK/full-width punctuation such as `，` or `。`.
//! * Feishu rich-text tags `<at user_id="ou_…">Name</at>`, `<at id=ou_…>` and
//!   `<at open_id='ou_…'/>` name the member holding that open_id (a member may
//!   have one per Feishu app). Unknown open_ids name nobody.
//! * Feishu `@_user_N` placeholders are resolved through the event's
//!   `mentions[]` array ([`PlatformMention`]): by open_id first, else by the
//!   display name matched exactly (case-insensitively) against names and
//!   aliases. A placeholder is never read as a plain `@name`.
//!
//! # Why not regex `\b`
//!
//! Rust's `regex` treats every Unicode letter — CJK ideographs included — as a
//! word character, so `\b小八\b` does not match in `问小八吧` (there is no word
//! boundary between `问` and `小`). It is wrong for Latin names too: `@Bob\b`
//! misses `@Bob你好` (`你` is a word character) yet matches `@Bob-ross` (`-` is
//! not); an ASCII-only `\b` would still accept `@Bob-ross`. The boundary wanted
//! here is narrower and ASCII-shaped (`[A-Za-z0-9_-]` continues a handle,
//! anything else ends it), and it applies only after Latin names. A hand-written
//! scanner states exactly that, runs in time linear in the text (times the
//! longest roster key), and cannot blow up on hostile input.

use std::collections::HashMap;

/// One roster member as the matcher needs it: everything a message may use to
/// address this bot.
#[derive(Debug, Clone, Default)]
pub(crate) struct Member {
    /// Canonical name; reported back verbatim when the member is mentioned.
    pub name: String,
    /// Other names people type after `@` (nicknames, Chinese names, …).
    pub aliases: Vec<String>,
    /// Platform user ids (Feishu open_ids differ per app, hence several) used by
    /// `<at>` tags and the `mentions[]` array.
    pub open_ids: Vec<String>,
}

/// A Feishu `mentions[]` entry: placeholder key, the open_id, the display name.
/// Needed to resolve the `@_user_N` placeholders Feishu puts in message text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlatformMention {
    /// Placeholder as it appears in the text, e.g. `@_user_1`.
    pub key: String,
    /// Open_id of the mentioned user; matched against [`Member::open_ids`] first.
    pub open_id: String,
    /// Display name; matched against names and aliases when the open_id is unknown.
    pub name: String,
}

/// Where a mention stands in the text (byte offsets), and whom it names; lets
/// callers highlight or rewrite mentions (the DingTalk adapter removes its robots' @s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MentionSpan {
    /// Byte offset of the first byte of the mention (the `@`, `＠` or `<`).
    pub start: usize,
    /// Byte offset just past the mention.
    pub end: usize,
    /// Canonical name of the member mentioned.
    pub member: String,
}

/// What form a found mention took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Typed `@Name` / `＠alias`.
    Plain,
    /// Feishu `<at …>` tag.
    Tag,
    /// Feishu `@_user_N` placeholder.
    Placeholder,
}

/// A mention found by the scanner; `member` indexes `MentionMatcher::names`.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(test, derive(PartialEq, Eq))]
struct Found {
    start: usize,
    end: usize,
    member: usize,
    kind: Kind,
}

/// A roster key ends at this trie node.
#[derive(Debug, Clone, Copy)]
struct Terminal {
    member: usize,
    needs_boundary: bool,
}

/// Finds which roster members a message mentions. Build it once per roster
/// change with [`MentionMatcher::new`]; all queries take `&self`.
#[derive(Debug, Clone)]
pub(crate) struct MentionMatcher {
    /// Canonical names, indexed by member number.
    names: Vec<String>,
    /// Trie over lowercased keys: (node, char) -> child node. Node 0 is the root.
    edges: HashMap<(usize, char), usize>,
    /// Per trie node: the key ending there, if any.
    terminals: Vec<Option<Terminal>>,
    /// Lowercased name/alias -> member, for exact lookups.
    by_key: HashMap<String, usize>,
    /// Open_id -> member.
    by_open_id: HashMap<String, usize>,
}

impl Default for MentionMatcher {
    /// A matcher with an empty roster: it finds nobody.
    fn default() -> Self {
        Self::new(&[])
    }
}

impl MentionMatcher {
    /// Builds the matcher from the whole roster. Empty names/aliases are
    /// ignored (a member without a name is skipped). When two members claim
    /// the same key, a canonical name beats an alias, then roster order wins.
    pub(crate) fn new(members: &[Member]) -> Self {
        let mut m = MentionMatcher {
            names: Vec::new(),
            edges: HashMap::new(),
            terminals: vec![None],
            by_key: HashMap::new(),
            by_open_id: HashMap::new(),
        };
        let kept: Vec<&Member> = members
            .iter()
            .filter(|mb| !clean_key(&mb.name).is_empty())
            .collect();
        m.names = kept.iter().map(|mb| mb.name.clone()).collect();
        for (idx, mb) in kept.iter().enumerate() {
            m.insert_key(&mb.name, idx);
        }
        for (idx, mb) in kept.iter().enumerate() {
            for alias in &mb.aliases {
                m.insert_key(alias, idx);
            }
        }
        for (idx, mb) in kept.iter().enumerate() {
            for id in &mb.open_ids {
                let id = id.trim();
                if !id.is_empty() {
                    m.by_open_id.entry(id.to_string()).or_insert(idx);
                }
            }
        }
        m
    }

    /// The member whose name or alias `name` reads as, case, width and invisible
    /// characters aside ([`crate::config::names::name_key`]): a person shown under it
    /// must be told apart from the bot.
    pub(crate) fn reads_as_member(&self, name: &str) -> Option<&str> {
        let key = crate::config::names::name_key(name);
        if key.is_empty() {
            return None;
        }
        self.by_key
            .iter()
            .find(|(k, _)| crate::config::names::name_key(k) == key)
            .map(|(_, &idx)| self.names[idx].as_str())
    }

    /// Canonical names of the members mentioned, first-appearance order, each once.
    pub(crate) fn mentioned(&self, text: &str, platform: &[PlatformMention]) -> Vec<String> {
        let mut seen = vec![false; self.names.len()];
        let mut out: Vec<String> = Vec::new();
        for f in self.scan(text, platform) {
            if !seen[f.member] {
                seen[f.member] = true;
                let name = &self.names[f.member];
                if !out.contains(name) {
                    out.push(name.clone());
                }
            }
        }
        out
    }

    /// Whether `name` (canonical) is mentioned. An alias or a differently cased
    /// name is first resolved to its canonical member.
    pub(crate) fn mentions(&self, text: &str, platform: &[PlatformMention], name: &str) -> bool {
        let target = self.resolve(name).unwrap_or(name);
        self.scan(text, platform)
            .iter()
            .any(|f| self.names[f.member] == target)
    }

    /// The @name / ＠alias / <at …> / @_user_N spans found (for rewriting text),
    /// in order of appearance, repeated mentions included.
    pub(crate) fn spans(&self, text: &str, platform: &[PlatformMention]) -> Vec<MentionSpan> {
        self.scan(text, platform)
            .into_iter()
            .map(|f| MentionSpan {
                start: f.start,
                end: f.end,
                member: self.names[f.member].clone(),
            })
            .collect()
    }

    /// Rewrites each plain-text `@Name` span with `f(member)` (e.g. into Feishu
    /// `<at user_id="ou_…">Name</at>`), leaving code, URLs, emails and existing
    /// `<at>` tags untouched. Where `f` returns `None` the text is kept as is.
    pub(crate) fn rewrite(&self, text: &str, f: impl Fn(&str) -> Option<String>) -> String {
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for found in self.scan(text, &[]) {
            if found.kind != Kind::Plain {
                continue;
            }
            if let Some(rep) = f(&self.names[found.member]) {
                out.push_str(&text[last..found.start]);
                out.push_str(&rep);
                last = found.end;
            }
        }
        out.push_str(&text[last..]);
        out
    }

    /// Maps a canonical name, or any name/alias in any case, to the canonical
    /// name; `None` if nobody in the roster answers to it. Useful for callers
    /// that accept user-typed names.
    pub(crate) fn resolve(&self, name_or_alias: &str) -> Option<&str> {
        if let Some(n) = self.names.iter().find(|n| *n == name_or_alias) {
            return Some(n);
        }
        self.lookup_key(name_or_alias)
            .map(|m| self.names[m].as_str())
    }

    /// Adds one name or alias to the trie and the exact-lookup table.
    fn insert_key(&mut self, raw: &str, member: usize) {
        let key = clean_key(raw);
        let Some(last) = key.chars().next_back() else {
            return;
        };
        let folded = fold(key);
        self.by_key.entry(folded.clone()).or_insert(member);
        let mut node = 0;
        for c in folded.chars() {
            node = match self.edges.get(&(node, c)) {
                Some(&next) => next,
                None => {
                    let next = self.terminals.len();
                    self.terminals.push(None);
                    self.edges.insert((node, c), next);
                    next
                }
            };
        }
        if self.terminals[node].is_none() {
            self.terminals[node] = Some(Terminal {
                member,
                needs_boundary: is_handle_char(last),
            });
        }
    }

    /// Exact, case-insensitive name/alias lookup.
    fn lookup_key(&self, name: &str) -> Option<usize> {
        let key = clean_key(name);
        if key.is_empty() {
            return None;
        }
        self.by_key.get(&fold(key)).copied()
    }

    /// The single left-to-right scan behind every public query.
    fn scan(&self, text: &str, platform: &[PlatformMention]) -> Vec<Found> {
        self.scan_with(text, platform, true)
    }

    /// [`MentionMatcher::scan`]; `skip: false` decodes every character instead of
    /// jumping to the next byte that may start a token (what tests compare it with).
    fn scan_with(&self, text: &str, platform: &[PlatformMention], skip: bool) -> Vec<Found> {
        // Every mention starts at an `@`, a `＠` or a `<` (a tag): a text with none of
        // them names nobody, and most chat text is such (one pass of `memchr`-like
        // searches instead of the scan below).
        if skip && !may_hold_mention(text) {
            return Vec::new();
        }
        let code = code_ranges(text);
        let mut ci = 0;
        let mut out: Vec<Found> = Vec::new();
        let mut last_end: Option<usize> = None;
        let mut i = 0;
        while i < text.len() {
            while ci < code.len() && code[ci].1 <= i {
                ci += 1;
            }
            let lim = match code.get(ci) {
                Some(&(start, end)) if start <= i => {
                    i = end;
                    continue;
                }
                Some(&(start, _)) => start,
                None => text.len(),
            };
            let rest = &text[i..lim];
            // Only a few bytes can start a URL, a tag or a mention; every other
            // character is passed over without decoding it (the scan runs on every
            // message a node receives).
            let bytes = text.as_bytes();
            let skip = if !skip {
                0
            } else {
                rest.bytes()
                    .enumerate()
                    .position(|(k, b)| may_start_token(b, (i + k).checked_sub(1).map(|p| bytes[p])))
                    .unwrap_or(rest.len())
            };
            if skip > 0 {
                i += skip;
                continue;
            }
            let Some(c) = rest.chars().next() else {
                break;
            };
            let prev = text[..i].chars().next_back();

            if matches!(c, 'h' | 'H' | 'w' | 'W')
                && !prev.is_some_and(|p| p.is_ascii_alphanumeric())
            {
                if let Some(n) = url_len(rest) {
                    i += n;
                    continue;
                }
            }

            if c == '<' {
                if let Some((n, member)) = self.at_tag(rest) {
                    if let Some(member) = member {
                        out.push(Found {
                            start: i,
                            end: i + n,
                            member,
                            kind: Kind::Tag,
                        });
                        last_end = Some(i + n);
                    }
                    i += n;
                    continue;
                }
            }

            if c == '@' || c == '＠' {
                let at_len = c.len_utf8();
                let after = &rest[at_len..];
                if let Some(n) = placeholder_len(after) {
                    let end = i + at_len + n;
                    if let Some(member) = self.resolve_placeholder(&after[..n], platform) {
                        out.push(Found {
                            start: i,
                            end,
                            member,
                            kind: Kind::Placeholder,
                        });
                        last_end = Some(end);
                    }
                    i = end;
                    continue;
                }
                let email = c == '@' && prev.is_some_and(is_email_char) && last_end != Some(i);
                if !email {
                    if let Some((n, member)) = self.match_name(after) {
                        let end = i + at_len + n;
                        out.push(Found {
                            start: i,
                            end,
                            member,
                            kind: Kind::Plain,
                        });
                        last_end = Some(end);
                        i = end;
                        continue;
                    }
                }
                i += at_len;
                continue;
            }

            i += c.len_utf8();
        }
        out
    }

    /// Longest roster key at the start of `s` whose boundary rule holds:
    /// (byte length, member). Walks at most as far as the longest key.
    fn match_name(&self, s: &str) -> Option<(usize, usize)> {
        let mut node = 0;
        let mut best = None;
        for (off, c) in s.char_indices() {
            for lc in c.to_lowercase() {
                match self.edges.get(&(node, lc)) {
                    Some(&next) => node = next,
                    None => return best,
                }
            }
            if let Some(t) = self.terminals[node] {
                let end = off + c.len_utf8();
                if !t.needs_boundary || !s[end..].chars().next().is_some_and(is_handle_char) {
                    best = Some((end, t.member));
                }
            }
        }
        best
    }

    /// Resolves a `_user_N` placeholder through the platform mentions array.
    fn resolve_placeholder(&self, key: &str, platform: &[PlatformMention]) -> Option<usize> {
        let pm = platform
            .iter()
            .find(|pm| pm.key.trim().trim_start_matches(['@', '＠']) == key)?;
        let id = pm.open_id.trim();
        if let Some(&m) = self.by_open_id.get(id) {
            return Some(m);
        }
        self.lookup_key(&pm.name)
    }

    /// Parses a Feishu `<at …>` tag at the start of `s`: (byte length, member
    /// if its id is known). `None` if `s` does not start with a well-formed tag.
    /// Never looks past the next `<` after the opening one, so repeated
    /// attempts stay linear overall.
    fn at_tag(&self, s: &str) -> Option<(usize, Option<usize>)> {
        let b = s.as_bytes();
        if b.len() < 4 || !b[..3].eq_ignore_ascii_case(b"<at") {
            return None;
        }
        if !(b[3].is_ascii_whitespace() || b[3] == b'>' || b[3] == b'/') {
            return None;
        }
        let mut p = 3;
        let mut ids: Vec<&str> = Vec::new();
        let mut self_closing = false;
        loop {
            while p < b.len() && b[p].is_ascii_whitespace() {
                p += 1;
            }
            match *b.get(p)? {
                b'>' => {
                    p += 1;
                    break;
                }
                b'/' => {
                    p += 1;
                    if b.get(p) == Some(&b'>') {
                        p += 1;
                        self_closing = true;
                        break;
                    }
                    continue;
                }
                _ => {}
            }
            let name_start = p;
            while p < b.len()
                && (b[p].is_ascii_alphanumeric() || matches!(b[p], b'_' | b'-' | b':'))
            {
                p += 1;
            }
            if p == name_start {
                return None;
            }
            let name = &s[name_start..p];
            while p < b.len() && b[p].is_ascii_whitespace() {
                p += 1;
            }
            let mut value = None;
            if b.get(p) == Some(&b'=') {
                p += 1;
                while p < b.len() && b[p].is_ascii_whitespace() {
                    p += 1;
                }
                let q = *b.get(p)?;
                if q == b'"' || q == b'\'' {
                    let start = p + 1;
                    let mut e = start;
                    while e < b.len() && b[e] != q {
                        if b[e] == b'<' {
                            return None;
                        }
                        e += 1;
                    }
                    if e >= b.len() {
                        return None;
                    }
                    value = Some(&s[start..e]);
                    p = e + 1;
                } else {
                    let start = p;
                    while p < b.len()
                        && !b[p].is_ascii_whitespace()
                        && !matches!(b[p], b'>' | b'<' | b'"' | b'\'')
                    {
                        p += 1;
                    }
                    let mut v = &s[start..p];
                    if b.get(p) == Some(&b'>') {
                        if let Some(stripped) = v.strip_suffix('/') {
                            v = stripped;
                            self_closing = true;
                        }
                    }
                    value = Some(v);
                }
            }
            let is_id = ["user_id", "open_id", "id"]
                .iter()
                .any(|a| a.eq_ignore_ascii_case(name));
            if let Some(v) = value.filter(|_| is_id) {
                ids.push(v.trim());
            }
        }
        let mut end = p;
        if !self_closing {
            if let Some(lt) = s[p..].find('<') {
                let close = p + lt;
                if b.len() >= close + 5 && b[close..close + 5].eq_ignore_ascii_case(b"</at>") {
                    end = close + 5;
                }
            }
        }
        let member = ids.iter().find_map(|id| self.by_open_id.get(*id).copied());
        Some((end, member))
    }
}

/// Trims whitespace and a leading `@`/`＠` from a configured name or alias.
fn clean_key(raw: &str) -> &str {
    raw.trim().trim_start_matches(['@', '＠']).trim()
}

/// Per-character Unicode lowercase, the same folding applied to text while matching.
fn fold(s: &str) -> String {
    s.chars().flat_map(char::to_lowercase).collect()
}

/// Characters that can continue a Latin handle; a Latin name must not be followed by one.
fn is_handle_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// Characters that, right before an ASCII `@`, make it an e-mail address.
fn is_email_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | '%')
}

/// Byte length of the Feishu placeholder body (`_user_` + digits) at the start of `s`.
fn placeholder_len(s: &str) -> Option<usize> {
    let digits = s.strip_prefix("_user_")?;
    let n = digits.bytes().take_while(u8::is_ascii_digit).count();
    (n > 0).then_some("_user_".len() + n)
}

/// Byte length of the URL starting at `s`, if `s` starts with one.
fn url_len(s: &str) -> Option<usize> {
    let starts = |p: &str| s.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p));
    if !(starts("http://") || starts("https://") || starts("www.")) {
        return None;
    }
    Some(
        s.char_indices()
            .find(|&(_, c)| ends_url(c))
            .map_or(s.len(), |(k, _)| k),
    )
}

/// Whether `text` holds a character a mention can start with (`@`, `＠`, or the `<`
/// of a Feishu `<at>` tag); without one, [`MentionMatcher::scan`] finds nothing.
fn may_hold_mention(text: &str) -> bool {
    memchr::memchr2(b'@', b'<', text.as_bytes()).is_some() || text.contains('＠')
}

/// Whether byte `b` (after byte `prev`) can begin something [`MentionMatcher::scan`]
/// looks at: a URL (`h`, `w`, not inside a word: the scan's own rule), a tag (`<`), a
/// mention (`@`, or 0xEF, the lead byte of `＠`). None of them is a UTF-8 continuation
/// byte, so skipping to one stays on a char boundary; a non-ASCII character before an
/// `h` ends in a continuation byte, which is not ASCII alphanumeric, as the scan's
/// check of the previous character expects.
fn may_start_token(b: u8, prev: Option<u8>) -> bool {
    match b {
        b'<' | b'@' | 0xEF => true,
        b'h' | b'H' | b'w' | b'W' => !prev.is_some_and(|p| p.is_ascii_alphanumeric()),
        _ => false,
    }
}

/// Characters that end a URL: whitespace, a few ASCII characters URLs never
/// contain raw, and CJK/full-width punctuation (`，。：？）` …; not `＠`).
fn ends_url(c: char) -> bool {
    c.is_whitespace()
        || matches!(c, '<' | '>' | '"' | '`')
        || matches!(c,
            '\u{3000}'..='\u{303F}'
            | '\u{FF01}'..='\u{FF0F}'
            | '\u{FF1A}'..='\u{FF1F}'
            | '\u{FF3B}'..='\u{FF40}'
            | '\u{FF5B}'..='\u{FF65}')
}

/// Byte ranges covered by code: inline spans (a run of one or two backticks
/// closed by the next run of the same length; unclosed runs are literal) and
/// fences (a run of three or more, closed by the next run at least as long,
/// else running to the end of the text). Linear: an unclosed inline run of a
/// given length means no later run of that length exists.
fn code_ranges(text: &str) -> Vec<(usize, usize)> {
    let b = text.as_bytes();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'`' {
            let start = i;
            while i < b.len() && b[i] == b'`' {
                i += 1;
            }
            runs.push((start, i - start));
        } else {
            i += 1;
        }
    }
    let mut out = Vec::new();
    let mut exhausted = [false; 3];
    let mut k = 0;
    while k < runs.len() {
        let (start, n) = runs[k];
        if n >= 3 {
            match runs[k + 1..].iter().position(|&(_, m)| m >= n) {
                Some(off) => {
                    let (cs, cn) = runs[k + 1 + off];
                    out.push((start, cs + cn));
                    k += off + 2;
                }
                None => {
                    out.push((start, b.len()));
                    break;
                }
            }
        } else if exhausted[n] {
            k += 1;
        } else {
            match runs[k + 1..].iter().position(|&(_, m)| m == n) {
                Some(off) => {
                    let (cs, cn) = runs[k + 1 + off];
                    out.push((start, cs + cn));
                    k += off + 2;
                }
                None => {
                    exhausted[n] = true;
                    k += 1;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    type Pm<'a> = &'a [(&'a str, &'a str, &'a str)];

    fn member(name: &str, aliases: &[&str], open_ids: &[&str]) -> Member {
        Member {
            name: name.to_string(),
            aliases: aliases.iter().map(|s| s.to_string()).collect(),
            open_ids: open_ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn skipping_to_token_bytes_finds_what_a_full_scan_finds() {
        // Texts built from pieces that matter to the scan, in every order a small
        // deterministic generator makes; both scans must agree on all of them.
        const PIECES: &[&str] = &[
            "h",
            "H",
            "w",
            "W",
            "http://x.io/@Bob",
            "https://a.b",
            "www.c.d",
            "@",
            "＠",
            "小八",
            "小八哥",
            "Bob",
            "bobby",
            "xiaoba",
            "ops@",
            "a",
            "1",
            " ",
            "é",
            "看",
            "\n",
            "`",
            "``",
            "```",
            "<at user_id=\"ou_ergoz\">",
            "</at>",
            "<",
            "@_user_1",
            "，",
            "。",
            "(",
            "Alice",
            "爱丽丝",
            "_",
            ".",
            "-",
            "ｈ",
        ];
        let m = roster();
        let pm = platform(U1_U2);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            let mut text = String::new();
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = 1 + (state % 12) as usize;
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push_str(PIECES[(state % PIECES.len() as u64) as usize]);
            }
            assert_eq!(
                m.scan_with(&text, &pm, true),
                m.scan_with(&text, &pm, false),
                "{text:?}"
            );
        }
    }

    fn roster() -> MentionMatcher {
        MentionMatcher::new(&[
            member("XiaoBa", &["小八", "xiaoba"], &["ou_xiaoba"]),
            member("ErGoz", &["二狗"], &["ou_ergoz"]),
            member("Bob", &[], &[]),
            member("Bobby", &[], &[]),
            member("小八哥", &[], &[]),
            member("Alice", &["爱丽丝"], &[]),
        ])
    }

    #[test]
    fn a_name_that_reads_as_a_member_is_found_whatever_its_case_width_or_invisibles() {
        let m = roster();
        for (name, bot) in [
            ("ｘｉａｏｂａ", "XiaoBa"),
            ("Xiao\u{200b}Ba", "XiaoBa"),
            ("小\u{200d}八", "XiaoBa"),
            ("ERGOZ", "ErGoz"),
            ("二狗", "ErGoz"),
        ] {
            assert_eq!(m.reads_as_member(name), Some(bot), "{name:?}");
        }
        for name in ["Xiao Ba", "Carol", "", "\u{200b}", "Bobb"] {
            assert_eq!(m.reads_as_member(name), None, "{name:?}");
        }
    }

    fn platform(p: Pm) -> Vec<PlatformMention> {
        p.iter()
            .map(|&(key, open_id, name)| PlatformMention {
                key: key.to_string(),
                open_id: open_id.to_string(),
                name: name.to_string(),
            })
            .collect()
    }

    const NONE: Pm = &[];
    const U1_ERGOZ: Pm = &[("@_user_1", "ou_ergoz", "ErGoz")];
    const U1_BOB_BY_NAME: Pm = &[("@_user_1", "ou_somebody", "bob")];
    const U1_XIAOBA_BY_ALIAS: Pm = &[("@_user_1", "", "小八")];
    const U1_STRANGER: Pm = &[("@_user_1", "ou_stranger", "Carol")];
    const U1_U2: Pm = &[
        ("@_user_1", "ou_xiaoba", "XiaoBa"),
        ("@_user_2", "ou_ergoz", "二狗"),
    ];
    const U1_XIAOBA: Pm = &[("@_user_1", "ou_xiaoba", "XiaoBa")];

    #[rustfmt::skip]
    const CASES: &[(&str, Pm, &[&str])] = &[
        // CJK, aliases, full-width at
        ("问@小八吧", NONE, &["XiaoBa"]),
        ("＠小八 你好", NONE, &["XiaoBa"]),
        ("@小八你看下", NONE, &["XiaoBa"]),
        ("@小八八", NONE, &["XiaoBa"]),
        ("@小八哥", NONE, &["小八哥"]),
        ("@小八哥你好", NONE, &["小八哥"]),
        ("@小八哥哥", NONE, &["小八哥"]),
        ("@小八 @小八哥", NONE, &["XiaoBa", "小八哥"]),
        ("@小 八", NONE, &[]),
        ("@爱丽丝 你好", NONE, &["Alice"]),
        ("@二狗和@小八", NONE, &["ErGoz", "XiaoBa"]),
        ("＠小八＠二狗", NONE, &["XiaoBa", "ErGoz"]),
        ("请@Alice、@Bob处理", NONE, &["Alice", "Bob"]),
        ("@小八：帮忙", NONE, &["XiaoBa"]),
        // Latin case-insensitivity
        ("@xiaoba 在吗", NONE, &["XiaoBa"]),
        ("@XIAOBA", NONE, &["XiaoBa"]),
        ("@XiaoBa", NONE, &["XiaoBa"]),
        ("@ERGOZ", NONE, &["ErGoz"]),
        ("@BOB", NONE, &["Bob"]),
        ("@bobby", NONE, &["Bobby"]),
        ("＠Bob", NONE, &["Bob"]),
        // Latin boundary
        ("@Bob，你看", NONE, &["Bob"]),
        ("@Bob-ross", NONE, &[]),
        ("@Bob-", NONE, &[]),
        ("@Bobby", NONE, &["Bobby"]),
        ("@Bobbyx", NONE, &[]),
        ("@Bob_x", NONE, &[]),
        ("@Bob2", NONE, &[]),
        ("@Ergozz", NONE, &[]),
        ("@Bob你好", NONE, &["Bob"]),
        ("@Bob?", NONE, &["Bob"]),
        ("@Bob.", NONE, &["Bob"]),
        ("@Bob ", NONE, &["Bob"]),
        ("hi @Bob", NONE, &["Bob"]),
        ("@Bob's idea", NONE, &["Bob"]),
        ("@Bob\t", NONE, &["Bob"]),
        ("\n@Bob\n", NONE, &["Bob"]),
        ("@Bob！", NONE, &["Bob"]),
        ("@Bob。", NONE, &["Bob"]),
        ("@Bob）好", NONE, &["Bob"]),
        ("@Carol", NONE, &[]),
        ("Bob", NONE, &[]),
        ("no mention here", NONE, &[]),
        ("", NONE, &[]),
        // what precedes the @
        ("ops@xiaoba.dev", NONE, &[]),
        ("bob@Bob.com", NONE, &[]),
        ("a.b@Bob", NONE, &[]),
        ("x_@Bob x-@Bob", NONE, &[]),
        ("x+@Bob x%@Bob", NONE, &[]),
        ("7@Bob", NONE, &[]),
        ("email alice@example.com @Alice", NONE, &["Alice"]),
        ("(@Bob)", NONE, &["Bob"]),
        ("好的，@Bob", NONE, &["Bob"]),
        ("cc:@Alice", NONE, &["Alice"]),
        ("Tab\t@Alice", NONE, &["Alice"]),
        ("x＠Bob", NONE, &["Bob"]),
        ("@@Bob", NONE, &["Bob"]),
        ("@Bob@Alice", NONE, &["Bob", "Alice"]),
        // URLs
        ("https://x.com/@Bob", NONE, &[]),
        ("http://a/b?u=@Bob", NONE, &[]),
        ("www.x.com/@Bob", NONE, &[]),
        ("HTTPS://X.COM/@Bob", NONE, &[]),
        ("看https://x.com/@小八", NONE, &[]),
        ("see https://x.com/@Bob and @Alice", NONE, &["Alice"]),
        ("www.x.com/a @Bob", NONE, &["Bob"]),
        ("链接https://x.com/a，@小八 看下", NONE, &["XiaoBa"]),
        // code
        ("`@Bob`", NONE, &[]),
        ("``@Bob``", NONE, &[]),
        ("`` a ` @Bob ``", NONE, &[]),
        ("`code` @Bob", NONE, &["Bob"]),
        ("@Bob`x`", NONE, &["Bob"]),
        ("it`s @Bob", NONE, &["Bob"]),
        ("```\n@Bob\n```", NONE, &[]),
        ("```\n@Bob\n```\n@Alice", NONE, &["Alice"]),
        ("```rust\nlet a = \"@Bob\";\n", NONE, &[]),
        ("@Alice ```@Bob", NONE, &["Alice"]),
        ("``` @Bob ``` @Alice", NONE, &["Alice"]),
        ("````\n```\n@Bob\n````\n@Alice", NONE, &["Alice"]),
        // Feishu <at> tags
        ("<at user_id=\"ou_ergoz\">ErGoz</at>", NONE, &["ErGoz"]),
        ("<at id=ou_xiaoba></at>", NONE, &["XiaoBa"]),
        ("<at id=\"ou_xiaoba\">", NONE, &["XiaoBa"]),
        ("<at id='ou_ergoz'>二狗</at> 看下", NONE, &["ErGoz"]),
        ("<at id=ou_ergoz/>", NONE, &["ErGoz"]),
        ("<AT USER_ID=\"ou_ergoz\">x</AT>", NONE, &["ErGoz"]),
        ("<at user_id=\"ou_unknown\">Bob</at>", NONE, &[]),
        ("<atx id=ou_ergoz>", NONE, &[]),
        ("<at user_id=\"ou_ergoz\"", NONE, &[]),
        ("`<at user_id=\"ou_ergoz\">ErGoz</at>`", NONE, &[]),
        ("<at user_id=\"ou_ergoz\">ErGoz</at>@Bob", NONE, &["ErGoz", "Bob"]),
        // Feishu placeholders
        ("@_user_1 看下", U1_ERGOZ, &["ErGoz"]),
        ("@_user_2", U1_ERGOZ, &[]),
        ("@_user_1", NONE, &[]),
        ("@_user_12", U1_ERGOZ, &[]),
        ("@_user_1", U1_BOB_BY_NAME, &["Bob"]),
        ("@_user_1", U1_XIAOBA_BY_ALIAS, &["XiaoBa"]),
        ("@_user_1", U1_STRANGER, &[]),
        ("@_user_1 @_user_2 请看", U1_U2, &["XiaoBa", "ErGoz"]),
        ("hi@_user_1", U1_ERGOZ, &["ErGoz"]),
        ("`@_user_1`", U1_ERGOZ, &[]),
        // several, duplicates
        ("@Bob @Alice", NONE, &["Bob", "Alice"]),
        ("@Alice @Bob @Alice", NONE, &["Alice", "Bob"]),
        ("@小八 @xiaoba @XiaoBa <at user_id=\"ou_xiaoba\">x</at>", NONE, &["XiaoBa"]),
        ("@_user_1 和 @小八", U1_XIAOBA, &["XiaoBa"]),
        // lone and trailing @
        ("@", NONE, &[]),
        ("＠", NONE, &[]),
        ("hello @", NONE, &[]),
        ("@ Bob", NONE, &[]),
        ("＠ 小八", NONE, &[]),
        // emoji and combining characters
        ("👋@Bob", NONE, &["Bob"]),
        ("@Bob👍", NONE, &["Bob"]),
        ("@小八😀", NONE, &["XiaoBa"]),
        ("👨‍👩‍👧@小八👨‍👩‍👧@Alice", NONE, &["XiaoBa", "Alice"]),
        ("e\u{301}@Bob", NONE, &["Bob"]),
        ("@Bob\u{301}", NONE, &["Bob"]),
        ("@小八\u{301}", NONE, &["XiaoBa"]),
        ("@\u{301}Bob", NONE, &[]),
    ];

    #[test]
    fn table() {
        let m = roster();
        assert!(CASES.len() >= 70, "only {} cases", CASES.len());
        let mut failures = Vec::new();
        for (text, pm, want) in CASES {
            let got = m.mentioned(text, &platform(pm));
            if got != *want {
                failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn overlapping_latin_names_with_spaces() {
        let m = MentionMatcher::new(&[
            member("Bob", &[], &[]),
            member("Bob Ross", &["@painter "], &[]),
            member("", &["ghost"], &["ou_ghost"]),
            member("Eve", &["", "  "], &[]),
        ]);
        let cases: &[(&str, &[&str])] = &[
            ("@Bob Ross", &["Bob Ross"]),
            ("@bob ross，你好", &["Bob Ross"]),
            ("@Bob Rossi", &["Bob"]),
            ("@Bob  Ross", &["Bob"]),
            ("@painter!", &["Bob Ross"]),
            ("@ghost <at id=ou_ghost>", &[]),
            ("@Eve @", &["Eve"]),
        ];
        for (text, want) in cases {
            assert_eq!(m.mentioned(text, &[]), *want, "{text:?}");
        }
    }

    #[test]
    fn mentions_and_resolve() {
        let m = roster();
        assert!(m.mentions("问@小八吧", &[], "XiaoBa"));
        assert!(m.mentions("问@小八吧", &[], "小八"));
        assert!(m.mentions("问@小八吧", &[], "xiaoba"));
        assert!(!m.mentions("问@小八吧", &[], "小八哥"));
        assert!(!m.mentions("ops@xiaoba.dev", &[], "XiaoBa"));
        assert!(!m.mentions("@Bob", &[], "Nobody"));
        assert_eq!(m.resolve("爱丽丝"), Some("Alice"));
        assert_eq!(m.resolve("@bobby"), Some("Bobby"));
        assert_eq!(m.resolve("Carol"), None);
        assert!(MentionMatcher::default().mentioned("@Bob", &[]).is_empty());
    }

    #[test]
    fn span_offsets() {
        let m = roster();
        let text = "hi @Bob，＠小八 <at user_id=\"ou_ergoz\">E</at> @_user_1! `@Alice` @Bob";
        let pm = platform(U1_XIAOBA);
        let spans = m.spans(text, &pm);
        let tag_start = text.find("<at").unwrap();
        let tag_end = text.find("</at>").unwrap() + 5;
        let ph = text.find("@_user_1").unwrap();
        let last = text.rfind("@Bob").unwrap();
        let want = vec![
            (3, 7, "Bob"),
            (10, 19, "XiaoBa"),
            (tag_start, tag_end, "ErGoz"),
            (ph, ph + 8, "XiaoBa"),
            (last, last + 4, "Bob"),
        ];
        let got: Vec<(usize, usize, &str)> = spans
            .iter()
            .map(|s| (s.start, s.end, s.member.as_str()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(&text[3..7], "@Bob");
        assert_eq!(&text[10..19], "＠小八");
        assert_eq!(&text[ph..ph + 8], "@_user_1");
        assert_eq!(m.mentioned(text, &pm), vec!["Bob", "XiaoBa", "ErGoz"]);
    }

    #[test]
    fn rewrite_replaces_only_plain_mentions() {
        let m = roster();
        let f = |name: &str| match name {
            "Bob" => Some("<at user_id=\"ou_bob\">Bob</at>".to_string()),
            "XiaoBa" => Some("<at user_id=\"ou_xiaoba\">XiaoBa</at>".to_string()),
            _ => None,
        };
        let text = "@bob 看下 `@Bob` https://x.com/@Bob ops@xiaoba.dev <at id=ou_ergoz>E</at> ＠小八，@Alice @_user_1";
        let want = "<at user_id=\"ou_bob\">Bob</at> 看下 `@Bob` https://x.com/@Bob ops@xiaoba.dev <at id=ou_ergoz>E</at> <at user_id=\"ou_xiaoba\">XiaoBa</at>，@Alice @_user_1";
        assert_eq!(m.rewrite(text, f), want);
        assert_eq!(m.rewrite(text, |_| None), text);
        assert_eq!(m.rewrite("", f), "");
        assert_eq!(
            m.rewrite("@Bobby@Bob", f),
            "@Bobby<at user_id=\"ou_bob\">Bob</at>"
        );
    }

    #[test]
    fn hostile_megabyte_inputs_finish() {
        let m = roster();
        let pm = platform(U1_ERGOZ);
        let mib = 1 << 20;
        let rep = |s: &str| s.repeat(mib / s.len() + 1);
        let inputs = [
            rep("@"),
            rep("＠"),
            rep("@Bo"),
            rep("@Bob"),
            rep("＠小八"),
            rep("`"),
            rep("`a"),
            rep("``a`"),
            rep("```a``"),
            rep("<at "),
            rep("<at id="),
            rep("<at id=\"ou_ergoz"),
            rep("<at a a a "),
            rep("<at id=ou_ergoz>"),
            rep("https://"),
            rep("www."),
            rep("@_user_"),
            rep("@_user_1"),
            rep("a@"),
            format!("``{}", rep("a ` @Bob ")),
            format!("{}@Bob", rep("`` ")),
        ];
        let started = std::time::Instant::now();
        for text in &inputs {
            let _ = m.mentioned(text, &pm);
            let _ = m.rewrite(text, |n| Some(n.to_string()));
        }
        // Quadratic behaviour on 1 MiB would take hours; this only guards against that.
        assert!(
            started.elapsed().as_secs() < 120,
            "took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn random_inputs_never_panic_and_spans_are_sane() {
        let m = roster();
        let pm = platform(U1_U2);
        let tokens = [
            "@",
            "＠",
            "Bob",
            "bobby",
            "小八",
            "哥",
            "`",
            "``",
            "```",
            " ",
            "\n",
            "https://",
            "www.",
            "<at id=",
            "<at user_id=\"",
            "ou_ergoz",
            "\"",
            "'",
            ">",
            "</at>",
            "<",
            "/",
            "_user_",
            "1",
            "2",
            "é",
            "\u{301}",
            "😀",
            ".",
            "-",
            "a",
            "，",
            "Alice",
            "二狗",
        ];
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..3000 {
            let len = (next() % 24) as usize;
            let text: String = (0..len)
                .map(|_| tokens[(next() % tokens.len() as u64) as usize])
                .collect();
            let spans = m.spans(&text, &pm);
            let mut prev_end = 0;
            for s in &spans {
                assert!(
                    s.start >= prev_end && s.start < s.end && s.end <= text.len(),
                    "{text:?}"
                );
                assert!(text.is_char_boundary(s.start) && text.is_char_boundary(s.end));
                prev_end = s.end;
            }
            assert_eq!(m.rewrite(&text, |_| None), text);
            let _ = m.rewrite(&text, |n| Some(format!("[{n}]")));
            for (k, _) in text.char_indices() {
                let _ = m.mentioned(&text[k..], &pm);
            }
        }
    }
}
