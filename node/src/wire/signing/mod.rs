//! Envelope signing and verification for botmesh, following
//! [Standard Webhooks](https://www.standardwebhooks.com).
//!
//! Every envelope a bot sends carries three headers:
//!
//! * `webhook-id` — the envelope id,
//! * `webhook-timestamp` — unix seconds when the attempt was made,
//! * `webhook-signature` — a space-separated list of `v1,<base64 HMAC-SHA256>`
//!   and/or `v1a,<base64 Ed25519 signature>` entries.
//!
//! Both schemes sign the same content, `{webhook-id}.{webhook-timestamp}.{raw body}`.
//!
//! Two trust models exist side by side:
//!
//! * **Mesh secrets** (`whsec_…`, HMAC, scheme `v1`): shared by every bot. Anyone
//!   holding one can speak as any bot that has no public key registered.
//! * **Per-bot Ed25519 keys** (`whsk_…` private, `whpk_…` public, scheme `v1a`):
//!   once a verifier knows public keys for a sender, only `v1a` signatures under
//!   those keys are accepted for that sender, so a bot that leaks the mesh secret
//!   cannot impersonate a key-holding bot.
//!
//! * **Pairwise keys** (derived, scheme `v1`): in a per-bot-key mesh, each ordered
//!   pair of bots also shares an HMAC key that only those two can compute: an X25519
//!   agreement between one's Ed25519 private key and the other's public key (both
//!   already in the files), expanded by HKDF-SHA256 with the direction and both
//!   public keys ([`PairwiseKey`]). An outbox adds a `v1` entry under the key for its
//!   peer beside the `v1a` signature, and a receiver that finds one that verifies
//!   needs no Ed25519 arithmetic (about 1 µs instead of 27–40 µs). A bot that knows
//!   the key for A → B is A or B, so the property above holds: C cannot speak as A.
//!   Anything else (no such entry, a receiver or sender that does not derive it,
//!   a key rotated on one side only) falls back to the `v1a` signature.
//!
//! Several keys may be valid at the same time (rotation): the sender signs with
//! all of them and the verifier accepts if any entry verifies under any key.
//!
//! Secret material is never printed: `Debug` on secret types is redacted, and no
//! error message contains key bytes.
//!
//! This file signs ([`Signer`]), reads the header's entries and verifies
//! ([`Verifier`], [`verify_all`]); the keys themselves, their textual forms and the
//! pairwise derivation are in [`keys`].

use std::collections::HashMap;
use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::Verifier as _;

pub use keys::{HmacSecret, KeyError, PairwiseKey, PublicKey, SigningKey};

/// Header carrying the envelope id (also the idempotency key).
pub const HEADER_ID: &str = "webhook-id";
/// Header carrying the attempt time in unix seconds; bounds replay.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Header carrying the space-separated list of versioned signatures.
pub const HEADER_SIGNATURE: &str = "webhook-signature";
/// Largest accepted clock difference, in seconds, in either direction
/// (exactly this many seconds is still accepted).
pub(crate) const TOLERANCE_SECS: i64 = 300;

/// A `webhook-signature` header with more entries than this is refused
/// ([`VerifyError::TooManyEntries`]): a legitimate sender emits one entry per key it
/// holds (a handful), and a header of thousands is only there to cost the receiver.
pub(crate) const MAX_SIGNATURE_ENTRIES: usize = 16;

/// The most `v1a` entries a header may hold; more are refused
/// ([`VerifyError::TooManyEntries`]) before any is checked, so one header costs at
/// most this many Ed25519 verifications per key listed for its sender (one key, two
/// during a rotation). An honest sender makes one, under its own key (two while it
/// rotates). `v1` entries (HMAC, a microsecond each) are bounded only by
/// [`MAX_SIGNATURE_ENTRIES`]: Standard Webhooks' own examples carry three.
pub(crate) const MAX_V1A_ENTRIES: usize = 2;

/// The scheme tag of an HMAC entry (mesh secret or pairwise key).
const TAG_HMAC: &str = "v1";
const TAG_ED25519: &str = "v1a";
const HMAC_TAG_BYTES: usize = 32;

/// The bytes that both schemes sign: `{id}.{timestamp}.{body}`.
///
/// Exposed so callers (and tests) can sign or inspect exactly what is covered.
pub(crate) fn signed_content(id: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
    out.extend_from_slice(id.as_bytes());
    out.push(b'.');
    out.extend_from_slice(timestamp.as_bytes());
    out.push(b'.');
    out.extend_from_slice(body);
    out
}

/// Signs outgoing envelopes with every key this node holds (HMAC secrets and/or its own Ed25519 key(s)).
///
/// Signing with all keys at once is what makes rotation seamless: receivers
/// accept the envelope as long as they still trust any one of them.
#[derive(Clone, Default, Debug)]
pub struct Signer {
    /// Mesh secrets; each adds a `v1` entry.
    pub hmac: Vec<HmacSecret>,
    /// This bot's own private keys; each adds a `v1a` entry.
    pub ed25519: Vec<SigningKey>,
    /// Keys for envelopes to each peer (by name), derived from this bot's key and
    /// the peer's ([`PairwiseKey::sending`]); [`Signer::sign_for`] adds its `v1` entry.
    pub pairwise: HashMap<String, PairwiseKey>,
}

impl Signer {
    /// Builds the full `webhook-signature` header value for an envelope:
    /// `v1,…` entries (one per HMAC secret) then `v1a,…` entries (one per
    /// Ed25519 key), space separated. Empty string if the signer holds no keys.
    ///
    /// `id` should not contain `.`, as recommended by Standard Webhooks.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let content = signed_content(id, &timestamp.to_string(), body);
        let hmac = self
            .hmac
            .iter()
            .map(|k| format!("{TAG_HMAC},{}", k.sign(&content)));
        let ed = self
            .ed25519
            .iter()
            .map(|k| format!("{TAG_ED25519},{}", k.sign(&content)));
        hmac.chain(ed).collect::<Vec<_>>().join(" ")
    }

    /// [`Signer::sign`] for an envelope to `peer`: the entries every peer gets,
    /// plus the `v1` entry under the pairwise key for `peer` when there is one.
    pub fn sign_for(&self, peer: &str, id: &str, timestamp: i64, body: &[u8]) -> String {
        self.add_pairwise(peer, self.sign(id, timestamp, body), id, timestamp, body)
    }

    /// Appends the pairwise entry for `peer` (if any) to an already made header
    /// value `shared` (computed once for every peer, see the outbox's cache).
    pub fn add_pairwise(
        &self,
        peer: &str,
        shared: String,
        id: &str,
        timestamp: i64,
        body: &[u8],
    ) -> String {
        match self.pairwise.get(peer) {
            Some(k) if shared.is_empty() => k.entry(id, timestamp, body),
            Some(k) => format!("{shared} {}", k.entry(id, timestamp, body)),
            None => shared,
        }
    }

    /// True when there is nothing to sign with (the header would be empty).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.hmac.is_empty() && self.ed25519.is_empty()
    }
}

/// Which signature scheme authenticated an envelope (or was required).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `v1`: HMAC-SHA256 under a mesh secret.
    Hmac,
    /// `v1a`: Ed25519 under the sender's own key.
    Ed25519,
    /// `v1` under the pairwise key of the sender and this node, derived from their
    /// Ed25519 keys: stands for the sender's `v1a` signature at a fraction of its cost.
    Pairwise,
}

impl Scheme {
    /// A stable snake_case label for metrics.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Scheme::Hmac => "hmac",
            Scheme::Ed25519 => "ed25519",
            Scheme::Pairwise => "pairwise",
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scheme::Hmac => f.write_str("HMAC (v1)"),
            Scheme::Ed25519 => f.write_str("Ed25519 (v1a)"),
            Scheme::Pairwise => f.write_str("pairwise HMAC (v1)"),
        }
    }
}

/// Why an incoming envelope was refused. `Display` is a short operator-readable
/// reason; [`VerifyError::reason_code`] is a stable label for metrics.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    /// A required header is absent (holds the header name).
    #[error("missing header {0}")]
    MissingHeader(&'static str),
    /// `webhook-timestamp` is not a plain non-negative decimal integer.
    #[error("webhook-timestamp is not a plain integer")]
    BadTimestamp,
    /// The timestamp is more than [`TOLERANCE_SECS`] in the past (possible replay).
    #[error("timestamp {age_secs} s in the past (limit {TOLERANCE_SECS} s)")]
    Stale {
        /// How far in the past, in seconds.
        age_secs: i64,
    },
    /// The timestamp is more than [`TOLERANCE_SECS`] in the future (clock skew or forgery).
    #[error("timestamp {ahead_secs} s in the future (limit {TOLERANCE_SECS} s)")]
    Future {
        /// How far in the future, in seconds.
        ahead_secs: i64,
    },
    /// The signature header is present but holds no `tag,base64` entry that parses.
    #[error("webhook-signature has no parsable entries")]
    NoSignature,
    /// No entry verified under the keys trusted for this sender; `scheme` is the
    /// scheme that was required.
    #[error("no valid {scheme} signature")]
    BadSignature {
        /// The scheme the sender had to use.
        scheme: Scheme,
    },
    /// We hold neither public keys for this sender nor any mesh secret.
    #[error("no keys for sender {0:?}")]
    UnknownSender(String),
    /// The signature header holds more entries than an honest sender makes (in all,
    /// or of one scheme): refused before any of them is checked, so a forger cannot
    /// buy many Ed25519 verifications with one request.
    #[error(
        "webhook-signature holds more than {limit} {what} (one per key; two while a key rotates)"
    )]
    TooManyEntries {
        /// `v1a entries`, or `entries` (in all).
        what: &'static str,
        /// The most allowed.
        limit: usize,
    },
}

impl VerifyError {
    /// Stable snake_case label for metrics and structured logs.
    pub(crate) fn reason_code(&self) -> &'static str {
        match self {
            VerifyError::MissingHeader(_) => "missing_header",
            VerifyError::BadTimestamp => "bad_timestamp",
            VerifyError::Stale { .. } => "stale",
            VerifyError::Future { .. } => "future",
            VerifyError::NoSignature => "no_signature",
            VerifyError::BadSignature { .. } => "bad_signature",
            VerifyError::UnknownSender(_) => "unknown_sender",
            VerifyError::TooManyEntries { .. } => "too_many_signatures",
        }
    }
}

/// The longest decoded signature kept on the stack: an Ed25519 signature.
const ENTRY_BYTES: usize = 64;

/// One `tag,base64` entry of a signature header, decoded without an allocation when
/// it is no longer than a signature.
struct Entry<'a> {
    /// The scheme tag (`v1`, `v1a`, or one this node does not know).
    tag: &'a str,
    /// The decoded bytes.
    decoded: Decoded,
}

/// An entry's decoded bytes: on the stack when they fit, else on the heap.
enum Decoded {
    /// The first `len` bytes of `bytes`.
    Short {
        bytes: [u8; ENTRY_BYTES],
        len: usize,
    },
    /// An entry longer than any signature (it verifies nothing, but counts as an entry).
    Long(Vec<u8>),
}

impl Entry<'_> {
    /// The decoded bytes.
    fn raw(&self) -> &[u8] {
        match &self.decoded {
            Decoded::Short { bytes, len } => &bytes[..*len],
            Decoded::Long(bytes) => bytes,
        }
    }
}

/// The entries of a signature header that are well formed (a non-empty tag, a comma,
/// base64 of at least one byte); the others are skipped.
fn entries(signature: &str) -> impl Iterator<Item = Entry<'_>> {
    signature.split_ascii_whitespace().filter_map(|entry| {
        let (tag, b64) = entry.split_once(',')?;
        if tag.is_empty() {
            return None;
        }
        let mut bytes = [0u8; ENTRY_BYTES];
        let decoded = match B64.decode_slice(b64, &mut bytes) {
            Ok(len) => Decoded::Short { bytes, len },
            Err(base64::DecodeSliceError::OutputSliceTooSmall) => {
                Decoded::Long(B64.decode(b64).ok()?)
            }
            Err(base64::DecodeSliceError::DecodeError(_)) => return None,
        };
        let e = Entry { tag, decoded };
        (!e.raw().is_empty()).then_some(e)
    })
}

/// Refuses a `webhook-signature` value with more than [`MAX_SIGNATURE_ENTRIES`]
/// entries, or more than [`MAX_V1A_ENTRIES`] `v1a` entries. Counting stops at the
/// first limit passed, so a huge header costs one scan of its front.
pub(crate) fn check_entry_counts(signature: &str) -> Result<(), VerifyError> {
    let (mut all, mut ed) = (0usize, 0usize);
    for entry in signature.split_ascii_whitespace() {
        all += 1;
        if entry.split_once(',').map_or(entry, |(tag, _)| tag) == TAG_ED25519 {
            ed += 1;
        }
        let (what, limit) = if ed > MAX_V1A_ENTRIES {
            ("v1a entries", MAX_V1A_ENTRIES)
        } else if all > MAX_SIGNATURE_ENTRIES {
            ("entries", MAX_SIGNATURE_ENTRIES)
        } else {
            continue;
        };
        return Err(VerifyError::TooManyEntries { what, limit });
    }
    Ok(())
}

/// Parses a timestamp header: ASCII digits only (no sign, spaces or fraction)
/// that fit in an `i64`.
fn parse_timestamp(s: &str) -> Result<i64, VerifyError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::BadTimestamp);
    }
    s.parse::<i64>().map_err(|_| VerifyError::BadTimestamp)
}

fn check_window(timestamp: i64, now_unix: i64) -> Result<(), VerifyError> {
    let age = now_unix.saturating_sub(timestamp);
    if age > TOLERANCE_SECS {
        Err(VerifyError::Stale { age_secs: age })
    } else if age < -TOLERANCE_SECS {
        Err(VerifyError::Future {
            ahead_secs: age.saturating_neg(),
        })
    } else {
        Ok(())
    }
}

/// Current unix time in seconds, for [`Verifier::verify`]'s `now_unix`.
pub fn unix_now() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// Verifies incoming envelopes: mesh secrets plus each bot's public keys.
#[derive(Clone, Default, Debug)]
pub struct Verifier {
    /// Mesh secrets accepted for senders that have no public keys listed.
    pub hmac: Vec<HmacSecret>,
    /// Public keys per sender name. A sender listed here with at least one key
    /// must sign with `v1a`; an empty list counts as not listed.
    pub ed25519: HashMap<String, Vec<PublicKey>>,
    /// Keys for envelopes from each key-holding sender to this node
    /// ([`PairwiseKey::receiving`], one per public key listed for the sender): a `v1`
    /// entry under one of them is accepted in place of the `v1a` signature.
    pub pairwise: HashMap<String, Vec<PairwiseKey>>,
}

impl Verifier {
    /// Returns which scheme verified. `id`, `timestamp`, `signature` are the raw header values (None = missing).
    ///
    /// Checks, in order: headers present (id, timestamp, signature), timestamp
    /// is a plain integer within ±[`TOLERANCE_SECS`] of `now_unix`, keys exist
    /// for `sender`, then the signature entries. Unknown tags and malformed
    /// entries are skipped; a header with more entries than [`check_entry_counts`]
    /// allows is refused before any is checked.
    pub fn verify(
        &self,
        sender: &str,
        id: Option<&str>,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now_unix: i64,
    ) -> Result<Scheme, VerifyError> {
        self.precheck(sender, id, timestamp, signature, body, now_unix)?
            .finish()
    }

    /// [`Verifier::verify`] up to the public-key arithmetic: every check but the
    /// Ed25519 verification itself (HMAC is decided here), whose inputs the
    /// [`Pending`] holds for [`Pending::finish`] or [`verify_all`].
    pub fn precheck(
        &self,
        sender: &str,
        id: Option<&str>,
        timestamp: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        now_unix: i64,
    ) -> Result<Pending, VerifyError> {
        let id = id.ok_or(VerifyError::MissingHeader(HEADER_ID))?;
        let ts_raw = timestamp.ok_or(VerifyError::MissingHeader(HEADER_TIMESTAMP))?;
        let signature = signature.ok_or(VerifyError::MissingHeader(HEADER_SIGNATURE))?;

        let ts = parse_timestamp(ts_raw)?;
        check_window(ts, now_unix)?;

        let sender_keys = self.ed25519.get(sender).filter(|keys| !keys.is_empty());
        let scheme = match sender_keys {
            Some(_) => Scheme::Ed25519,
            None if !self.hmac.is_empty() => Scheme::Hmac,
            None => return Err(VerifyError::UnknownSender(sender.to_owned())),
        };

        check_entry_counts(signature)?;
        // One pass over the entries, each decoded once: a pairwise `v1` entry (for a
        // key-holding sender this node shares a pairwise key with), the sender's `v1a`
        // signatures (at most MAX_V1A_ENTRIES, counted above), or `v1` against the mesh
        // secrets (a sender without keys).
        let pairwise_keys = sender_keys.and(self.pairwise.get(sender));
        let hmac_ok = |key: &HmacSecret, raw: &[u8]| {
            raw.len() == HMAC_TAG_BYTES && key.verify_tag(id, ts_raw, body, raw)
        };
        let (mut any, mut pairwise_ok, mut mesh_ok) = (false, false, false);
        let mut signatures = [None; MAX_V1A_ENTRIES];
        let mut signed = 0;
        for e in entries(signature) {
            any = true;
            match (e.tag, sender_keys) {
                (TAG_HMAC, Some(_)) if !pairwise_ok => {
                    pairwise_ok = pairwise_keys
                        .is_some_and(|keys| keys.iter().any(|k| hmac_ok(&k.secret, e.raw())));
                }
                (TAG_HMAC, None) if !mesh_ok => {
                    mesh_ok = self.hmac.iter().any(|k| hmac_ok(k, e.raw()));
                }
                (TAG_ED25519, Some(_)) if signed < MAX_V1A_ENTRIES => {
                    if let Ok(sig) = ed25519_dalek::Signature::from_slice(e.raw()) {
                        signatures[signed] = Some(sig);
                        signed += 1;
                    }
                }
                _ => {}
            }
        }
        if !any {
            return Err(VerifyError::NoSignature);
        }
        if pairwise_ok {
            return Ok(Pending {
                scheme: Scheme::Pairwise,
                content: Vec::new(),
                check: Check::Decided(true),
            });
        }
        let check = match sender_keys {
            Some(keys) => Check::Ed25519(
                signatures
                    .iter()
                    .flatten()
                    .flat_map(|sig| keys.iter().map(move |k| (k.key, *sig)))
                    .collect(),
            ),
            None => Check::Decided(mesh_ok),
        };
        // The content is kept only for the public-key arithmetic still to come.
        let content = match &check {
            Check::Ed25519(pairs) if !pairs.is_empty() => signed_content(id, ts_raw, body),
            _ => Vec::new(),
        };
        Ok(Pending {
            scheme,
            content,
            check,
        })
    }
}

/// A signature check whose cheap part passed ([`Verifier::precheck`]): what is left
/// is the Ed25519 arithmetic, which [`verify_all`] does for many envelopes at once.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The scheme the sender had to use.
    scheme: Scheme,
    /// `{id}.{timestamp}.{body}`: what the signatures cover.
    content: Vec<u8>,
    /// What remains to be decided.
    check: Check,
}

/// The part of a [`Pending`] check still to be done.
#[derive(Debug, Clone)]
enum Check {
    /// Already decided (HMAC is cheap enough to do at once).
    Decided(bool),
    /// Valid if any of these (key, signature) pairs verifies: one pair per `v1a`
    /// entry per trusted key of the sender (one, unless keys are being rotated).
    Ed25519(Vec<(ed25519_dalek::VerifyingKey, ed25519_dalek::Signature)>),
}

impl Pending {
    /// Decides this check on its own.
    pub(crate) fn finish(&self) -> Result<Scheme, VerifyError> {
        let ok = match &self.check {
            Check::Decided(ok) => *ok,
            Check::Ed25519(pairs) => pairs
                .iter()
                .any(|(key, sig)| key.verify(&self.content, sig).is_ok()),
        };
        self.verdict(ok)
    }

    fn verdict(&self, ok: bool) -> Result<Scheme, VerifyError> {
        if ok {
            Ok(self.scheme)
        } else {
            Err(VerifyError::BadSignature {
                scheme: self.scheme,
            })
        }
    }

    /// How many (key, signature) pairs an Ed25519 verification of this check may
    /// try: what a request costs the verifying thread, for
    /// `botmesh_ed25519_checks_total`.
    pub(crate) fn ed25519_pairs(&self) -> usize {
        match &self.check {
            Check::Ed25519(pairs) => pairs.len(),
            Check::Decided(_) => 0,
        }
    }

    /// Whether public-key arithmetic is left to do (HMAC checks are decided at once).
    pub fn needs_work(&self) -> bool {
        matches!(&self.check, Check::Ed25519(pairs) if !pairs.is_empty())
    }

    /// The one (key, signature) pair to verify, when there is exactly one.
    fn single_pair(&self) -> Option<&(ed25519_dalek::VerifyingKey, ed25519_dalek::Signature)> {
        match &self.check {
            Check::Ed25519(pairs) if pairs.len() == 1 => pairs.first(),
            _ => None,
        }
    }
}

/// Decides many checks, the same verdicts as [`Pending::finish`] on each, but the
/// Ed25519 ones together: a batch verification (ed25519-dalek's `verify_batch`, one
/// multi-scalar multiplication) costs about two thirds of verifying them one by one
/// (the bench's signature figures).
/// A batch that fails is split in halves until the bad signatures are found, so a
/// forged envelope costs its honest neighbours a few extra verifications, never
/// their verdict.
///
/// Single and batch verification agree on every signature made by an honest signer.
/// They can disagree only on a signature built from small-order points, which only
/// the holder of the private key can make, and which can then fail one way and pass
/// the other: the key holder can already send different envelopes to different peers,
/// so nothing is gained by it.
pub fn verify_all(checks: &[Pending]) -> Vec<Result<Scheme, VerifyError>> {
    let mut ok: Vec<Option<bool>> = vec![None; checks.len()];
    let batchable: Vec<usize> = (0..checks.len())
        .filter(|&i| checks[i].single_pair().is_some())
        .collect();
    settle(checks, &batchable, &mut ok);
    checks
        .iter()
        .zip(ok)
        .map(|(c, ok)| match ok {
            Some(ok) => c.verdict(ok),
            None => c.finish(),
        })
        .collect()
}

/// Below this many signatures a batch is not worth its set-up: verify one by one.
const MIN_BATCH: usize = 3;

/// Batch-verifies `idx` (checks with a single pair), halving on failure.
fn settle(checks: &[Pending], idx: &[usize], ok: &mut [Option<bool>]) {
    if idx.len() < MIN_BATCH {
        for &i in idx {
            ok[i] = Some(checks[i].finish().is_ok());
        }
        return;
    }
    let mut messages = Vec::with_capacity(idx.len());
    let mut sigs = Vec::with_capacity(idx.len());
    let mut keys = Vec::with_capacity(idx.len());
    for &i in idx {
        let (key, sig) = checks[i].single_pair().expect("batchable");
        messages.push(checks[i].content.as_slice());
        sigs.push(*sig);
        keys.push(*key);
    }
    if ed25519_dalek::verify_batch(&messages, &sigs, &keys).is_ok() {
        for &i in idx {
            ok[i] = Some(true);
        }
    } else {
        let (a, b) = idx.split_at(idx.len() / 2);
        settle(checks, a, ok);
        settle(checks, b, ok);
    }
}

/// Equality of two secrets-derived byte strings whose time depends on neither where
/// they differ nor their lengths (both are hashed first, then compared in full).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let da = ring::digest::digest(&ring::digest::SHA256, a);
    let db = ring::digest::digest(&ring::digest::SHA256, b);
    da.as_ref()
        .iter()
        .zip(db.as_ref())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

mod keys;
#[cfg(test)]
mod tests;
