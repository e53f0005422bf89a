//! The file a group's (or a peer's) data is stored under: a name-safe, bounded file
//! stem ([`file_stem`]), the path that keeps an older version's file
//! ([`stored_path`]), and the way back from a file to its group ([`group_of_file`]).
//! Used by transcripts, delivery cursors, the verdict log and ingress streams alike.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::wire::envelope::Envelope;

/// The longest file stem a name keeps in readable form ([`file_stem`]); longer ones
/// are hashed. Far below the 255 bytes most file systems allow for a file name, so a
/// suffix (`.jsonl.1`, `.cursor`, `.tmp`) always fits.
pub(super) const MAX_PLAIN_STEM: usize = 128;

/// Starts every hashed file stem: percent-encoding never writes it (`~` is `%7E`
/// there), so a hashed stem cannot equal a readable one.
pub(super) const HASHED_PREFIX: char = '~';

/// The file stem a group (or a peer) is stored under, bounded whatever the name: its
/// percent-encoding when that is at most [`MAX_PLAIN_STEM`] bytes (so `/`, `..`,
/// control bytes and the like never reach the file system, and the names older
/// versions wrote stay the same), else `~` and the first 32 hex digits of its
/// SHA-256 (a 30-character CJK name is 270 bytes encoded; a file name may not be over
/// 255). [`name_of_stem`] reverses a readable stem; a hashed one names no group, so a
/// transcript's group is read from its lines ([`group_of_file`]).
pub(crate) fn file_stem(name: &str) -> String {
    let plain = encode_name(name);
    if plain.len() <= MAX_PLAIN_STEM {
        return plain;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let mut out = String::from(HASHED_PREFIX);
    for b in &digest.as_ref()[..16] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The file in `dir` where `name`'s data with extension `ext` is kept: `<stem>.<ext>`
/// ([`file_stem`]), or, for a hashed stem, the file an older version named with the
/// whole percent-encoding when that exists, so a group's data never splits over two
/// files. A name that was too long for the file system then has no such file.
pub(crate) fn stored_path(dir: &Path, name: &str, ext: &str) -> PathBuf {
    let stem = file_stem(name);
    if stem.starts_with(HASHED_PREFIX) {
        let older = dir.join(format!("{}.{ext}", encode_name(name)));
        if older.exists() {
            return older;
        }
    }
    dir.join(format!("{stem}.{ext}"))
}

/// The name a readable [`file_stem`] stands for; `None` for a hashed stem (or one no
/// version wrote).
pub(crate) fn name_of_stem(stem: &str) -> Option<String> {
    if stem.starts_with(HASHED_PREFIX) {
        return None;
    }
    decode_name(stem)
}

/// The group a transcript file holds: its name's, when readable ([`name_of_stem`]),
/// else the group of its first readable line (`None` when it has none, or for a name
/// no version wrote). For listing groups (`botmesh replay`).
pub(crate) fn group_of_file(path: &Path) -> Option<String> {
    let stem = path.file_stem()?.to_str()?;
    if let Some(group) = name_of_stem(stem) {
        return Some(group);
    }
    if !stem.starts_with(HASHED_PREFIX) {
        return None;
    }
    let file = File::open(path).ok()?;
    BufReader::new(file)
        .split(b'\n')
        .map_while(Result::ok)
        .find_map(|line| serde_json::from_slice::<Envelope>(&line).ok())
        .map(|env| env.group)
        .filter(|group| file_stem(group) == stem)
}

/// File-name-safe form of a name (percent-encoding of anything unusual), unbounded:
/// [`file_stem`] bounds it.
pub(super) fn encode_name(group: &str) -> String {
    let mut out = String::new();
    for b in group.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Inverse of [`encode_name`].
fn decode_name(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for g in ["demo", "oc_abc-1", "群聊 1/..", "%"] {
            assert_eq!(name_of_stem(&file_stem(g)).as_deref(), Some(g));
            assert!(!file_stem(g).contains('/'));
        }
    }
}
