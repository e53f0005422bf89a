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

use std::collections::HashMap;
use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::{Signer as _, Verifier as _};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Header carrying the envelope id (also the idempotency key).
pub const HEADER_ID: &str = "webhook-id";
/// Header carrying the attempt time in unix seconds; bounds replay.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Header carrying the space-separated list of versioned signatures.
pub const HEADER_SIGNATURE: &str = "webhook-signature";
/// Largest accepted clock difference, in seconds, in either direction
/// (exactly this many seconds is still accepted).
pub(crate) const TOLERANCE_SECS: i64 = 300;

/// Textual prefix of an HMAC mesh secret.
pub(crate) const HMAC_SECRET_PREFIX: &str = "whsec_";
/// Textual prefix of an Ed25519 private key (its 32-byte seed).
pub(crate) const SIGNING_KEY_PREFIX: &str = "whsk_";
/// Textual prefix of an Ed25519 public key.
pub(crate) const PUBLIC_KEY_PREFIX: &str = "whpk_";

/// Smallest HMAC secret accepted, in bytes (Standard Webhooks: at least 192 bits).
pub(crate) const HMAC_SECRET_MIN_BYTES: usize = 24;
/// Largest HMAC secret accepted, in bytes (Standard Webhooks: at most 512 bits).
pub(crate) const HMAC_SECRET_MAX_BYTES: usize = 64;
/// Size of secrets made by [`HmacSecret::generate`].
pub(crate) const HMAC_SECRET_GENERATED_BYTES: usize = 32;
/// Size of an Ed25519 seed and of an Ed25519 public key.
pub(crate) const ED25519_KEY_BYTES: usize = 32;

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

const TAG_HMAC: &str = "v1";
const TAG_ED25519: &str = "v1a";
const HMAC_TAG_BYTES: usize = 32;

/// Why a textual key or secret was refused. Never contains key material, so it
/// is safe to log.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// The string does not start with the prefix that identifies this key type.
    #[error("key must start with `{expected}`")]
    MissingPrefix {
        /// The prefix that was required.
        expected: &'static str,
    },
    /// The string carries the prefix of a different key type (e.g. a private key
    /// pasted where a public key belongs).
    #[error("expected a `{expected}` key but got a `{got}` key")]
    WrongKeyType {
        /// The prefix that was required.
        expected: &'static str,
        /// The prefix that was found.
        got: &'static str,
    },
    /// The part after the prefix is not valid padded standard base64.
    #[error("key is not valid base64")]
    BadBase64,
    /// The decoded key has the wrong number of bytes.
    #[error("key is {got} bytes, expected {min}..={max} bytes")]
    BadLength {
        /// Decoded length.
        got: usize,
        /// Smallest allowed length.
        min: usize,
        /// Largest allowed length.
        max: usize,
    },
    /// The secret is a placeholder-like value (every byte identical, e.g.
    /// `whsec_AAAA…`), found by [`HmacSecret::validate_strength`].
    #[error("secret is trivially weak (all bytes identical)")]
    WeakSecret,
    /// The 32 bytes are not an Ed25519 public key: not a point on the curve, or a
    /// small-order point under which signatures prove nothing.
    #[error("not a usable Ed25519 public key (not a curve point, or of small order)")]
    NotAPoint,
}

/// Decodes `s` after requiring `prefix`; reports a foreign botmesh prefix as
/// [`KeyError::WrongKeyType`] to help operators who pasted the wrong key.
fn decode_prefixed(s: &str, prefix: &'static str) -> Result<Vec<u8>, KeyError> {
    let s = s.trim();
    match s.strip_prefix(prefix) {
        Some(b64) => B64.decode(b64).map_err(|_| KeyError::BadBase64),
        None => {
            Err(foreign_prefix(s, prefix).unwrap_or(KeyError::MissingPrefix { expected: prefix }))
        }
    }
}

fn foreign_prefix(s: &str, expected: &'static str) -> Option<KeyError> {
    [HMAC_SECRET_PREFIX, SIGNING_KEY_PREFIX, PUBLIC_KEY_PREFIX]
        .into_iter()
        .find(|p| *p != expected && s.starts_with(p))
        .map(|got| KeyError::WrongKeyType { expected, got })
}

fn check_len(got: usize, min: usize, max: usize) -> Result<(), KeyError> {
    if (min..=max).contains(&got) {
        Ok(())
    } else {
        Err(KeyError::BadLength { got, min, max })
    }
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    SystemRandom::new()
        .fill(&mut buf)
        .expect("operating system random number generator failed");
    buf
}

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

/// A shared mesh secret for HMAC-SHA256 (`v1`) signatures, written `whsec_<base64>`.
///
/// The HMAC key is the decoded bytes, exactly as in Standard Webhooks, so the
/// published test vectors apply.
#[derive(Clone)]
pub struct HmacSecret {
    bytes: Vec<u8>,
    key: hmac::Key,
}

impl HmacSecret {
    fn from_bytes(bytes: Vec<u8>) -> Self {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &bytes);
        Self { bytes, key }
    }

    /// Parses `whsec_<base64>`; the prefix is required and the decoded secret
    /// must be 24–64 bytes. Surrounding whitespace is ignored.
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let bytes = decode_prefixed(s, HMAC_SECRET_PREFIX)?;
        check_len(bytes.len(), HMAC_SECRET_MIN_BYTES, HMAC_SECRET_MAX_BYTES)?;
        Ok(Self::from_bytes(bytes))
    }

    /// Makes a fresh random 32-byte secret from the OS RNG.
    ///
    /// # Panics
    /// If the operating system RNG fails, which leaves no safe way to continue.
    pub fn generate() -> Self {
        Self::from_bytes(random_bytes::<HMAC_SECRET_GENERATED_BYTES>().to_vec())
    }

    /// Config-time check that the secret is fit for use: 24–64 bytes and not a
    /// placeholder made of one repeated byte.
    pub fn validate_strength(&self) -> Result<(), KeyError> {
        check_len(
            self.bytes.len(),
            HMAC_SECRET_MIN_BYTES,
            HMAC_SECRET_MAX_BYTES,
        )?;
        if self.bytes.windows(2).all(|w| w[0] == w[1]) {
            return Err(KeyError::WeakSecret);
        }
        Ok(())
    }

    /// Serializes as `whsec_<base64>` for config files. The result is secret.
    pub fn to_whsec(&self) -> String {
        format!("{HMAC_SECRET_PREFIX}{}", B64.encode(&self.bytes))
    }

    /// HMAC-SHA256 of `content`, base64 encoded (without the `v1,` tag).
    pub(crate) fn sign(&self, content: &[u8]) -> String {
        B64.encode(hmac::sign(&self.key, content).as_ref())
    }

    /// Constant-time check of a raw (decoded) tag against `content`.
    fn verify_tag(&self, content: &[u8], tag: &[u8]) -> bool {
        hmac::verify(&self.key, content, tag).is_ok()
    }
}

impl fmt::Debug for HmacSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HmacSecret(<redacted>)")
    }
}

/// A bot's own Ed25519 private key for `v1a` signatures, written
/// `whsk_<base64 of the 32-byte seed>`.
pub struct SigningKey {
    /// The expanded key (ed25519-dalek zeroizes it on drop); the seed is its first half.
    key: ed25519_dalek::SigningKey,
}

impl SigningKey {
    fn from_seed(seed: [u8; ED25519_KEY_BYTES]) -> Self {
        Self {
            key: ed25519_dalek::SigningKey::from_bytes(&seed),
        }
    }

    /// Parses `whsk_<base64 of a 32-byte seed>`; the prefix is required.
    /// Surrounding whitespace is ignored.
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let bytes = decode_prefixed(s, SIGNING_KEY_PREFIX)?;
        let seed: [u8; ED25519_KEY_BYTES] =
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| KeyError::BadLength {
                    got: bytes.len(),
                    min: ED25519_KEY_BYTES,
                    max: ED25519_KEY_BYTES,
                })?;
        Ok(Self::from_seed(seed))
    }

    /// Makes a fresh key from a random seed drawn from the OS RNG.
    ///
    /// # Panics
    /// If the operating system RNG fails, which leaves no safe way to continue.
    pub fn generate() -> Self {
        Self::from_seed(random_bytes::<ED25519_KEY_BYTES>())
    }

    /// The public half, to hand to other bots' verifiers.
    pub fn public_key(&self) -> PublicKey {
        let key = self.key.verifying_key();
        PublicKey {
            bytes: key.to_bytes(),
            key,
        }
    }

    /// Serializes as `whsk_<base64 seed>` for config files. The result is secret.
    pub fn to_whsk(&self) -> String {
        format!("{SIGNING_KEY_PREFIX}{}", B64.encode(self.key.to_bytes()))
    }

    /// Ed25519 signature of `content`, base64 encoded (without the `v1a,` tag).
    pub(crate) fn sign(&self, content: &[u8]) -> String {
        B64.encode(self.key.sign(content).to_bytes())
    }
}

impl Clone for SigningKey {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
        }
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey(<redacted>, public: {})", self.public_key())
    }
}

/// HKDF salt of pairwise keys: names the protocol and its version.
const PAIRWISE_SALT: &[u8] = b"botmesh pairwise v1";

/// The HMAC key for envelopes from one bot to one other bot, which only those two
/// can compute (see the module documentation).
///
/// `X25519(own private, peer public)` (the Ed25519 keys in their Montgomery form, as
/// libsodium's `crypto_sign_ed25519_*_to_curve25519` do; the joint use of one key
/// for Ed25519 and X25519 is analysed in <https://eprint.iacr.org/2021/509>), then
/// HKDF-SHA256 with salt `botmesh pairwise v1` and info `from \0 to \0 from-key
/// to-key`: each direction of each pair gets its own key, bound to both names and
/// both public keys.
#[derive(Clone)]
pub struct PairwiseKey {
    /// The derived 32 bytes, used exactly as a mesh secret is (`v1`).
    secret: HmacSecret,
}

impl PairwiseKey {
    /// The key for envelopes `own_name` sends to `peer_name`. `None` if the agreement
    /// gives no secret (a public key of small order, which peers.toml refuses).
    pub fn sending(
        own: &SigningKey,
        own_name: &str,
        peer: &PublicKey,
        peer_name: &str,
    ) -> Option<Self> {
        Self::derive(own, peer, (own_name, &own.public_key()), (peer_name, peer))
    }

    /// The key for envelopes `peer_name` sends to `own_name`.
    pub fn receiving(
        own: &SigningKey,
        own_name: &str,
        peer: &PublicKey,
        peer_name: &str,
    ) -> Option<Self> {
        Self::derive(own, peer, (peer_name, peer), (own_name, &own.public_key()))
    }

    fn derive(
        own: &SigningKey,
        peer: &PublicKey,
        (from, from_key): (&str, &PublicKey),
        (to, to_key): (&str, &PublicKey),
    ) -> Option<Self> {
        let shared = peer
            .key
            .to_montgomery()
            .mul_clamped(own.key.to_scalar_bytes())
            .to_bytes();
        if shared == [0u8; 32] {
            return None;
        }
        let info = [
            from.as_bytes(),
            b"\0",
            to.as_bytes(),
            b"\0",
            from_key.as_bytes(),
            to_key.as_bytes(),
        ];
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, PAIRWISE_SALT).extract(&shared);
        let mut bytes = vec![0u8; HMAC_SECRET_GENERATED_BYTES];
        prk.expand(&info, hmac::HMAC_SHA256)
            .and_then(|okm| okm.fill(&mut bytes))
            .ok()?;
        Some(PairwiseKey {
            secret: HmacSecret::from_bytes(bytes),
        })
    }

    /// The `v1,<base64 HMAC-SHA256>` entry for an envelope.
    pub(crate) fn entry(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let content = signed_content(id, &timestamp.to_string(), body);
        format!("{TAG_HMAC},{}", self.secret.sign(&content))
    }
}

impl fmt::Debug for PairwiseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairwiseKey(<redacted>)")
    }
}

/// Another bot's Ed25519 public key, written `whpk_<base64>` (bare base64 of
/// 32 bytes is accepted too). Not secret: `Debug`/`Display` show it.
///
/// The curve point is decompressed once, when the key is parsed (at start-up), not
/// on every verification: that is a tenth of a verification's cost, and a key that
/// is not a usable point is refused with the rest of the configuration.
#[derive(Clone)]
pub struct PublicKey {
    /// The key as written: what equality, hashing and `whpk_` text use.
    bytes: [u8; ED25519_KEY_BYTES],
    /// The decompressed point signatures are verified under.
    key: ed25519_dalek::VerifyingKey,
}

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for PublicKey {}

impl std::hash::Hash for PublicKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bytes.hash(state)
    }
}

impl PublicKey {
    /// Parses `whpk_<base64>` or bare base64 of exactly 32 bytes. Surrounding
    /// whitespace is ignored; a `whsk_`/`whsec_` string is refused as the wrong
    /// key type so private material is not mistaken for a public key.
    pub(crate) fn parse(s: &str) -> Result<Self, KeyError> {
        let s = s.trim();
        let b64 = match s.strip_prefix(PUBLIC_KEY_PREFIX) {
            Some(rest) => rest,
            None => {
                if let Some(err) = foreign_prefix(s, PUBLIC_KEY_PREFIX) {
                    return Err(err);
                }
                s
            }
        };
        let raw = B64.decode(b64).map_err(|_| KeyError::BadBase64)?;
        let bytes: [u8; ED25519_KEY_BYTES] =
            raw.as_slice().try_into().map_err(|_| KeyError::BadLength {
                got: raw.len(),
                min: ED25519_KEY_BYTES,
                max: ED25519_KEY_BYTES,
            })?;
        let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes)
            .ok()
            .filter(|k| !k.is_weak())
            .ok_or(KeyError::NotAPoint)?;
        Ok(Self { bytes, key })
    }

    /// Serializes as `whpk_<base64>`.
    pub fn to_whpk(&self) -> String {
        format!("{PUBLIC_KEY_PREFIX}{}", B64.encode(self.bytes))
    }

    /// The raw 32 key bytes.
    pub(crate) fn as_bytes(&self) -> &[u8; ED25519_KEY_BYTES] {
        &self.bytes
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_whpk())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_whpk())
    }
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
    /// The version tag used in the signature header (`v1` or `v1a`).
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Scheme::Hmac | Scheme::Pairwise => TAG_HMAC,
            Scheme::Ed25519 => TAG_ED25519,
        }
    }

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
        let entries: Vec<(&str, Vec<u8>)> = signature
            .split_ascii_whitespace()
            .filter_map(|entry| {
                let (tag, b64) = entry.split_once(',')?;
                let raw = B64.decode(b64).ok().filter(|raw| !raw.is_empty())?;
                (!tag.is_empty()).then_some((tag, raw))
            })
            .collect();
        if entries.is_empty() {
            return Err(VerifyError::NoSignature);
        }

        let content = signed_content(id, ts_raw, body);
        if let (Some(_), Some(keys)) = (sender_keys, self.pairwise.get(sender)) {
            let pairwise_ok = entries.iter().any(|(tag, raw)| {
                *tag == TAG_HMAC
                    && raw.len() == HMAC_TAG_BYTES
                    && keys.iter().any(|k| k.secret.verify_tag(&content, raw))
            });
            if pairwise_ok {
                return Ok(Pending {
                    scheme: Scheme::Pairwise,
                    content,
                    check: Check::Decided(true),
                });
            }
        }
        let wanted = scheme.tag();
        let mut entries = entries.iter().filter(|(tag, _)| *tag == wanted);
        let check = match sender_keys {
            Some(keys) => Check::Ed25519(
                entries
                    .filter_map(|(_, raw)| ed25519_dalek::Signature::from_slice(raw).ok())
                    .flat_map(|sig| keys.iter().map(move |k| (k.key, sig)))
                    .collect(),
            ),
            None => Check::Decided(entries.any(|(_, raw)| {
                raw.len() == HMAC_TAG_BYTES && self.hmac.iter().any(|k| k.verify_tag(&content, raw))
            })),
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

#[cfg(test)]
mod tests {
    use super::*;

    // ---- Published Standard Webhooks vectors ----------------------------------
    // Source: github.com/standard-webhooks/standard-webhooks, libraries/*/ tests.

    /// HMAC vector used by the javascript, python, go, php, ruby, java and csharp
    /// library tests ("sign function works").
    const V1_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const V1_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const V1_TS: i64 = 1614265330;
    const V1_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const V1_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    /// HMAC vector from libraries/rust/src/lib.rs (`test_sign`).
    const V1B_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const V1B_ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const V1B_TS: i64 = 1649367553;
    const V1B_BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const V1B_SIG: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    /// Ed25519 vector from libraries/go/webhook_asymmetric_test.go
    /// (`TestAsymmetricWebhookSign`); the Go test passes the bare base64 seed,
    /// here it carries the `whsk_` prefix. Same id/timestamp/body as `V1_*`.
    const V1A_KEY: &str = "whsk_VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=";
    const V1A_SIG: &str = "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag==";

    const BOT: &str = "alice";
    const NOW: i64 = 1_700_000_000;

    fn hmac_verifier(secrets: &[&HmacSecret]) -> Verifier {
        Verifier {
            hmac: secrets.iter().map(|s| (*s).clone()).collect(),
            ..Verifier::default()
        }
    }

    fn ed_verifier(sender: &str, keys: &[PublicKey]) -> Verifier {
        let mut v = Verifier::default();
        v.ed25519.insert(sender.to_owned(), keys.to_vec());
        v
    }

    /// A mesh of named key holders as config.rs builds it: each bot's signer with
    /// pairwise keys to the others, and its verifier with everyone's public keys and
    /// pairwise keys from everyone.
    fn pairwise_mesh(names: &[&str]) -> HashMap<String, (SigningKey, Signer, Verifier)> {
        let keys: Vec<(String, SigningKey)> = names
            .iter()
            .map(|n| (n.to_string(), SigningKey::generate()))
            .collect();
        keys.iter()
            .map(|(me, key)| {
                let mut signer = Signer {
                    ed25519: vec![key.clone()],
                    ..Signer::default()
                };
                let mut verifier = Verifier::default();
                for (peer, peer_key) in keys.iter().filter(|(p, _)| p != me) {
                    let pk = peer_key.public_key();
                    verifier.ed25519.insert(peer.clone(), vec![pk.clone()]);
                    signer.pairwise.insert(
                        peer.clone(),
                        PairwiseKey::sending(key, me, &pk, peer).unwrap(),
                    );
                    verifier.pairwise.insert(
                        peer.clone(),
                        vec![PairwiseKey::receiving(key, me, &pk, peer).unwrap()],
                    );
                }
                (me.clone(), (key.clone(), signer, verifier))
            })
            .collect()
    }

    fn check(v: &Verifier, sender: &str, sig: &str, body: &[u8]) -> Result<Pending, VerifyError> {
        v.precheck(
            sender,
            Some("e1"),
            Some(&NOW.to_string()),
            Some(sig),
            body,
            NOW,
        )
    }

    #[test]
    fn pairwise_entry_verifies_at_its_peer_without_ed25519_work() {
        let m = pairwise_mesh(&["A", "B", "C"]);
        let body = b"{\"text\":\"hi\"}";
        let for_b = m["A"].1.sign_for("B", "e1", NOW, body);
        assert_eq!(
            for_b.split(' ').count(),
            2,
            "v1a plus the pairwise v1: {for_b}"
        );
        assert!(for_b.contains("v1a,") && for_b.contains("v1,"));
        let at_b = check(&m["B"].2, "A", &for_b, body).unwrap();
        assert!(!at_b.needs_work(), "decided by the pairwise HMAC");
        assert_eq!(at_b.finish(), Ok(Scheme::Pairwise));
        // The copy B got, shown to C (a relay): not C's key, so the v1a signature decides.
        let at_c = check(&m["C"].2, "A", &for_b, body).unwrap();
        assert!(at_c.needs_work());
        assert_eq!(at_c.finish(), Ok(Scheme::Ed25519));
        // Tampering breaks both entries.
        let at_b = check(&m["B"].2, "A", &for_b, b"{\"text\":\"hI\"}").unwrap();
        assert_eq!(
            at_b.finish(),
            Err(VerifyError::BadSignature {
                scheme: Scheme::Ed25519
            })
        );
    }

    #[test]
    fn pairwise_keys_agree_per_direction_and_nobody_else_has_them() {
        let m = pairwise_mesh(&["A", "B", "C"]);
        let body = b"x";
        let only_pairwise =
            |signer: &Signer, peer: &str| signer.pairwise[peer].entry("e1", NOW, body);
        // A -> B alone (no v1a): accepted by B as A's.
        let ab = only_pairwise(&m["A"].1, "B");
        assert_eq!(
            check(&m["B"].2, "A", &ab, body).unwrap().finish(),
            Ok(Scheme::Pairwise)
        );
        // The other direction has its own key: A's entry for B is not B's for A.
        let ba = only_pairwise(&m["B"].1, "A");
        assert_ne!(ab, ba);
        assert!(
            check(&m["A"].2, "B", &ab, body).unwrap().finish().is_err(),
            "reflected"
        );
        assert_eq!(
            check(&m["A"].2, "B", &ba, body).unwrap().finish(),
            Ok(Scheme::Pairwise)
        );
        // C holds keys with A and with B, but cannot make the A -> B key: its best
        // attempt (its own private key under A's name) is refused.
        let c = &m["C"].0;
        let fake = PairwiseKey::sending(c, "A", &m["B"].0.public_key(), "B").unwrap();
        let forged = fake.entry("e1", NOW, body);
        assert_eq!(
            check(&m["B"].2, "A", &forged, body).unwrap().finish(),
            Err(VerifyError::BadSignature {
                scheme: Scheme::Ed25519
            })
        );
        // Nor is C's own key with B accepted under A's name.
        let cb = only_pairwise(&m["C"].1, "B");
        assert!(check(&m["B"].2, "A", &cb, body).unwrap().finish().is_err());
        assert_eq!(
            check(&m["B"].2, "C", &cb, body).unwrap().finish(),
            Ok(Scheme::Pairwise)
        );
    }

    #[test]
    fn pairwise_keys_follow_rotation_and_never_stand_for_the_mesh_secret() {
        let m = pairwise_mesh(&["A", "B"]);
        let (a_old, b) = (SigningKey::generate(), &m["B"].0);
        // B lists A's previous key too (a rotation in progress): A, still on the old
        // key, is accepted through the pairwise key derived from that one.
        let mut v = m["B"].2.clone();
        v.ed25519.get_mut("A").unwrap().push(a_old.public_key());
        v.pairwise
            .get_mut("A")
            .unwrap()
            .push(PairwiseKey::receiving(b, "B", &a_old.public_key(), "A").unwrap());
        let old = PairwiseKey::sending(&a_old, "A", &b.public_key(), "B").unwrap();
        let sig = old.entry("e1", NOW, b"x");
        assert_eq!(
            check(&v, "A", &sig, b"x").unwrap().finish(),
            Ok(Scheme::Pairwise)
        );
        // A mesh secret's v1 entry is not a pairwise one: a key-holding sender still
        // cannot be spoken for with the secret.
        let secret = HmacSecret::generate();
        v.hmac.push(secret.clone());
        let with_secret = Signer {
            hmac: vec![secret],
            ..Signer::default()
        }
        .sign("e1", NOW, b"x");
        assert!(check(&v, "A", &with_secret, b"x")
            .unwrap()
            .finish()
            .is_err());
        // Debug output never shows key material.
        assert_eq!(format!("{old:?}"), "PairwiseKey(<redacted>)");
    }

    fn verify_at(
        v: &Verifier,
        sender: &str,
        id: &str,
        ts: &str,
        sig: &str,
        body: &[u8],
        now: i64,
    ) -> Result<Scheme, VerifyError> {
        v.verify(sender, Some(id), Some(ts), Some(sig), body, now)
    }

    /// Asserts that changing any single byte of body, id or timestamp breaks
    /// the signature (with `now` moved along so the window never interferes).
    fn assert_tamper_rejected(
        v: &Verifier,
        sender: &str,
        id: &str,
        ts: i64,
        body: &[u8],
        sig: &str,
        scheme: Scheme,
    ) {
        let ts_s = ts.to_string();
        assert_eq!(verify_at(v, sender, id, &ts_s, sig, body, ts), Ok(scheme));
        let bad = Err(VerifyError::BadSignature { scheme });
        for i in 0..body.len() {
            let mut b = body.to_vec();
            b[i] ^= 0x01;
            assert_eq!(
                verify_at(v, sender, id, &ts_s, sig, &b, ts),
                bad,
                "body byte {i}"
            );
        }
        for i in 0..id.len() {
            let mut b = id.as_bytes().to_vec();
            b[i] ^= 0x01;
            let id2 = String::from_utf8(b).unwrap();
            assert_eq!(
                verify_at(v, sender, &id2, &ts_s, sig, body, ts),
                bad,
                "id byte {i}"
            );
        }
        for i in 0..ts_s.len() {
            let mut b = ts_s.as_bytes().to_vec();
            b[i] = b'0' + (b[i] - b'0' + 1) % 10;
            let ts2 = String::from_utf8(b).unwrap();
            let now2: i64 = ts2.parse().unwrap();
            assert_eq!(
                verify_at(v, sender, id, &ts2, sig, body, now2),
                bad,
                "timestamp byte {i}"
            );
        }
    }

    #[test]
    fn standard_webhooks_hmac_vectors() {
        for (secret, id, ts, body, expected) in [
            (V1_SECRET, V1_ID, V1_TS, V1_BODY, V1_SIG),
            (V1B_SECRET, V1B_ID, V1B_TS, V1B_BODY, V1B_SIG),
        ] {
            let s = HmacSecret::parse(secret).unwrap();
            s.validate_strength().unwrap();
            assert_eq!(s.to_whsec(), secret);
            let content = signed_content(id, &ts.to_string(), body);
            assert_eq!(format!("v1,{}", s.sign(&content)), expected);
            let signer = Signer {
                hmac: vec![s.clone()],
                ..Signer::default()
            };
            assert_eq!(signer.sign(id, ts, body), expected);
            assert_tamper_rejected(
                &hmac_verifier(&[&s]),
                BOT,
                id,
                ts,
                body,
                expected,
                Scheme::Hmac,
            );
        }
    }

    #[test]
    fn standard_webhooks_ed25519_vector() {
        let k = SigningKey::parse(V1A_KEY).unwrap();
        assert_eq!(k.to_whsk(), V1A_KEY);
        let signer = Signer {
            ed25519: vec![k.clone()],
            ..Signer::default()
        };
        assert_eq!(signer.sign(V1_ID, V1_TS, V1_BODY), V1A_SIG);
        let v = ed_verifier(BOT, &[k.public_key()]);
        assert_tamper_rejected(&v, BOT, V1_ID, V1_TS, V1_BODY, V1A_SIG, Scheme::Ed25519);
    }

    #[test]
    fn standard_webhooks_negative_cases() {
        let v = hmac_verifier(&[&HmacSecret::parse(V1_SECRET).unwrap()]);
        let ts = V1_TS.to_string();
        // python test_invalid_signature_raises_error: last char changed.
        let bad = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA=";
        assert_eq!(
            verify_at(&v, BOT, V1_ID, &ts, bad, V1_BODY, V1_TS),
            Err(VerifyError::BadSignature {
                scheme: Scheme::Hmac
            })
        );
        // multi-sig header from the library tests: valid entry among decoys.
        let multi = format!(
            "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= {V1_SIG} v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
        );
        assert_eq!(
            verify_at(&v, BOT, V1_ID, &ts, &multi, V1_BODY, V1_TS),
            Ok(Scheme::Hmac)
        );
        // partial signatures: "v1," and a truncated entry.
        assert_eq!(
            verify_at(&v, BOT, V1_ID, &ts, "v1,", V1_BODY, V1_TS),
            Err(VerifyError::NoSignature)
        );
        assert_eq!(
            verify_at(&v, BOT, V1_ID, &ts, &V1_SIG[..8], V1_BODY, V1_TS),
            Err(VerifyError::NoSignature)
        );
    }

    #[test]
    fn ed25519_round_trip_and_key_text_round_trip() {
        let k = SigningKey::generate();
        let k2 = SigningKey::parse(&k.to_whsk()).unwrap();
        assert_eq!(k2.public_key(), k.public_key());
        let pk = k.public_key();
        assert_eq!(PublicKey::parse(&pk.to_whpk()).unwrap(), pk);
        let bare = pk.to_whpk()[PUBLIC_KEY_PREFIX.len()..].to_owned();
        assert_eq!(PublicKey::parse(&bare).unwrap(), pk);
        assert_eq!(
            PublicKey::parse(&format!("  {}\n", pk.to_whpk())).unwrap(),
            pk
        );

        let signer = Signer {
            ed25519: vec![k],
            ..Signer::default()
        };
        let body = b"{\"hello\":\"mesh\"}";
        let sig = signer.sign("env_1", NOW, body);
        assert!(sig.starts_with("v1a,"));
        let v = ed_verifier(BOT, &[pk]);
        assert_eq!(
            verify_at(&v, BOT, "env_1", &NOW.to_string(), &sig, body, NOW),
            Ok(Scheme::Ed25519)
        );
        assert_eq!(
            verify_at(&v, BOT, "env_1", &NOW.to_string(), &sig, b"{}", NOW),
            Err(VerifyError::BadSignature {
                scheme: Scheme::Ed25519
            })
        );
    }

    #[test]
    fn hmac_rotation() {
        let old = HmacSecret::generate();
        let new = HmacSecret::generate();
        let sig = Signer {
            hmac: vec![old.clone()],
            ..Signer::default()
        }
        .sign("e", NOW, b"x");
        let ts = NOW.to_string();
        assert_eq!(
            verify_at(
                &hmac_verifier(&[&old, &new]),
                BOT,
                "e",
                &ts,
                &sig,
                b"x",
                NOW
            ),
            Ok(Scheme::Hmac)
        );
        assert_eq!(
            verify_at(
                &hmac_verifier(&[&new, &old]),
                BOT,
                "e",
                &ts,
                &sig,
                b"x",
                NOW
            ),
            Ok(Scheme::Hmac)
        );
        assert_eq!(
            verify_at(&hmac_verifier(&[&new]), BOT, "e", &ts, &sig, b"x", NOW),
            Err(VerifyError::BadSignature {
                scheme: Scheme::Hmac
            })
        );
        // Sender signing with both during rotation is accepted by either side.
        let both = Signer {
            hmac: vec![old.clone(), new.clone()],
            ..Signer::default()
        }
        .sign("e", NOW, b"x");
        assert_eq!(both.split(' ').count(), 2);
        assert_eq!(
            verify_at(&hmac_verifier(&[&new]), BOT, "e", &ts, &both, b"x", NOW),
            Ok(Scheme::Hmac)
        );
        assert_eq!(
            verify_at(&hmac_verifier(&[&old]), BOT, "e", &ts, &both, b"x", NOW),
            Ok(Scheme::Hmac)
        );
    }

    #[test]
    fn ed25519_rotation() {
        let old = SigningKey::generate();
        let new = SigningKey::generate();
        let sig = Signer {
            ed25519: vec![old.clone()],
            ..Signer::default()
        }
        .sign("e", NOW, b"x");
        let ts = NOW.to_string();
        let both = ed_verifier(BOT, &[new.public_key(), old.public_key()]);
        assert_eq!(
            verify_at(&both, BOT, "e", &ts, &sig, b"x", NOW),
            Ok(Scheme::Ed25519)
        );
        let only_new = ed_verifier(BOT, &[new.public_key()]);
        assert_eq!(
            verify_at(&only_new, BOT, "e", &ts, &sig, b"x", NOW),
            Err(VerifyError::BadSignature {
                scheme: Scheme::Ed25519
            })
        );
    }

    #[test]
    fn only_second_entry_valid() {
        let s = HmacSecret::generate();
        let other = HmacSecret::generate();
        let content = signed_content("e", &NOW.to_string(), b"body");
        let header = format!("v1,{} v1,{}", other.sign(&content), s.sign(&content));
        let v = hmac_verifier(&[&s]);
        assert_eq!(
            verify_at(&v, BOT, "e", &NOW.to_string(), &header, b"body", NOW),
            Ok(Scheme::Hmac)
        );

        let k = SigningKey::generate();
        let k_other = SigningKey::generate();
        let header = format!("v1a,{} v1a,{}", k_other.sign(&content), k.sign(&content));
        let v = ed_verifier(BOT, &[k.public_key()]);
        assert_eq!(
            verify_at(&v, BOT, "e", &NOW.to_string(), &header, b"body", NOW),
            Ok(Scheme::Ed25519)
        );
    }

    #[test]
    fn key_holding_sender_rejects_hmac() {
        let mesh = HmacSecret::generate();
        let alice = SigningKey::generate();
        let mut v = hmac_verifier(&[&mesh]);
        v.ed25519.insert(BOT.to_owned(), vec![alice.public_key()]);
        let ts = NOW.to_string();

        let hmac_only = Signer {
            hmac: vec![mesh.clone()],
            ..Signer::default()
        }
        .sign("e", NOW, b"x");
        assert_eq!(
            verify_at(&v, BOT, "e", &ts, &hmac_only, b"x", NOW),
            Err(VerifyError::BadSignature {
                scheme: Scheme::Ed25519
            })
        );
        // Other senders without keys still get in with the mesh secret.
        assert_eq!(
            verify_at(&v, "bob", "e", &ts, &hmac_only, b"x", NOW),
            Ok(Scheme::Hmac)
        );
        // Alice signing with both schemes passes as Ed25519.
        let both = Signer {
            pairwise: Default::default(),
            hmac: vec![mesh],
            ed25519: vec![alice],
        }
        .sign("e", NOW, b"x");
        assert_eq!(
            verify_at(&v, BOT, "e", &ts, &both, b"x", NOW),
            Ok(Scheme::Ed25519)
        );
        // An empty key list counts as no keys.
        v.ed25519.insert("carol".to_owned(), Vec::new());
        assert_eq!(
            verify_at(&v, "carol", "e", &ts, &hmac_only, b"x", NOW),
            Ok(Scheme::Hmac)
        );
    }

    #[test]
    fn other_bots_key_rejected() {
        let alice = SigningKey::generate();
        let mallory = SigningKey::generate();
        let mut v = ed_verifier(BOT, &[alice.public_key()]);
        v.ed25519
            .insert("mallory".to_owned(), vec![mallory.public_key()]);
        let sig = Signer {
            ed25519: vec![mallory],
            ..Signer::default()
        }
        .sign("e", NOW, b"x");
        let ts = NOW.to_string();
        assert_eq!(
            verify_at(&v, BOT, "e", &ts, &sig, b"x", NOW),
            Err(VerifyError::BadSignature {
                scheme: Scheme::Ed25519
            })
        );
        assert_eq!(
            verify_at(&v, "mallory", "e", &ts, &sig, b"x", NOW),
            Ok(Scheme::Ed25519)
        );
    }

    #[test]
    fn timestamp_window() {
        let s = HmacSecret::generate();
        let v = hmac_verifier(&[&s]);
        let signer = Signer {
            hmac: vec![s],
            ..Signer::default()
        };
        let check = |ts: i64| {
            let sig = signer.sign("e", ts, b"x");
            verify_at(&v, BOT, "e", &ts.to_string(), &sig, b"x", NOW)
        };
        assert_eq!(check(NOW), Ok(Scheme::Hmac));
        assert_eq!(check(NOW - 300), Ok(Scheme::Hmac));
        assert_eq!(check(NOW + 300), Ok(Scheme::Hmac));
        let stale = check(NOW - 301).unwrap_err();
        assert_eq!(stale, VerifyError::Stale { age_secs: 301 });
        assert_eq!(
            stale.to_string(),
            "timestamp 301 s in the past (limit 300 s)"
        );
        let future = check(NOW + 301).unwrap_err();
        assert_eq!(future, VerifyError::Future { ahead_secs: 301 });
        assert_eq!(
            future.to_string(),
            "timestamp 301 s in the future (limit 300 s)"
        );
        // Extreme values do not overflow.
        assert_eq!(
            verify_at(&v, BOT, "e", "0", "v1,AAAA", b"x", i64::MIN),
            Err(VerifyError::Future {
                ahead_secs: i64::MAX
            })
        );
        assert_eq!(
            verify_at(
                &v,
                BOT,
                "e",
                &i64::MAX.to_string(),
                "v1,AAAA",
                b"x",
                i64::MIN
            ),
            Err(VerifyError::Future {
                ahead_secs: i64::MAX
            })
        );
    }

    #[test]
    fn missing_headers_in_order() {
        let v = hmac_verifier(&[&HmacSecret::generate()]);
        let ts = NOW.to_string();
        let m = |h| Err(VerifyError::MissingHeader(h));
        assert_eq!(v.verify(BOT, None, None, None, b"", NOW), m(HEADER_ID));
        assert_eq!(
            v.verify(BOT, None, Some(&ts), Some("v1,AAAA"), b"", NOW),
            m(HEADER_ID)
        );
        assert_eq!(
            v.verify(BOT, Some("e"), None, None, b"", NOW),
            m(HEADER_TIMESTAMP)
        );
        assert_eq!(
            v.verify(BOT, Some("e"), None, Some("v1,AAAA"), b"", NOW),
            m(HEADER_TIMESTAMP)
        );
        assert_eq!(
            v.verify(BOT, Some("e"), Some(&ts), None, b"", NOW),
            m(HEADER_SIGNATURE)
        );
        // Missing beats a bad timestamp; a bad timestamp beats an unknown sender.
        assert_eq!(
            Verifier::default().verify(BOT, Some("e"), Some("abc"), None, b"", NOW),
            m(HEADER_SIGNATURE)
        );
        assert_eq!(
            Verifier::default().verify(BOT, Some("e"), Some("abc"), Some("x"), b"", NOW),
            Err(VerifyError::BadTimestamp)
        );
        assert_eq!(
            Verifier::default().verify(BOT, Some("e"), Some("1"), Some("x"), b"", NOW),
            Err(VerifyError::Stale { age_secs: NOW - 1 })
        );
        assert_eq!(
            VerifyError::MissingHeader(HEADER_ID).to_string(),
            "missing header webhook-id"
        );
    }

    #[test]
    fn garbage_timestamps() {
        let v = hmac_verifier(&[&HmacSecret::generate()]);
        for ts in [
            "abc",
            "1.5",
            "",
            " 1700000000",
            "1700000000 ",
            "+1700000000",
            "-5",
            "1e9",
            "0x10",
            "99999999999999999999",
        ] {
            assert_eq!(
                verify_at(&v, BOT, "e", ts, "v1,AAAA", b"x", NOW),
                Err(VerifyError::BadTimestamp),
                "{ts:?}"
            );
        }
    }

    #[test]
    fn malformed_entries_are_skipped() {
        let s = HmacSecret::generate();
        let v = hmac_verifier(&[&s]);
        let good = Signer {
            hmac: vec![s],
            ..Signer::default()
        }
        .sign("e", NOW, b"x");
        let ts = NOW.to_string();
        let header = format!("v1,!!!notbase64 nocomma ,AAAA v1a,%%% v2,AAAA  \t{good} v1,");
        assert_eq!(
            verify_at(&v, BOT, "e", &ts, &header, b"x", NOW),
            Ok(Scheme::Hmac)
        );
        // Only junk: nothing parsable.
        for junk in [
            "",
            "   ",
            "v1,!!!",
            "nocomma",
            "v1,",
            ",AAAA",
            "v1a,@@@@ v1,====",
        ] {
            assert_eq!(
                verify_at(&v, BOT, "e", &ts, junk, b"x", NOW),
                Err(VerifyError::NoSignature),
                "{junk:?}"
            );
        }
        // Parsable but wrong tag / wrong length / wrong value: bad signature.
        for wrong in [
            "v2,AAAA",
            "v1,AAAA",
            "v1a,AAAA",
            "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
        ] {
            assert_eq!(
                verify_at(&v, BOT, "e", &ts, wrong, b"x", NOW),
                Err(VerifyError::BadSignature {
                    scheme: Scheme::Hmac
                }),
                "{wrong:?}"
            );
        }
    }

    #[test]
    fn unknown_sender() {
        let ts = NOW.to_string();
        assert_eq!(
            verify_at(&Verifier::default(), BOT, "e", &ts, "v1,AAAA", b"x", NOW),
            Err(VerifyError::UnknownSender(BOT.to_owned()))
        );
        let v = ed_verifier("bob", &[SigningKey::generate().public_key()]);
        let err = verify_at(&v, BOT, "e", &ts, "v1,AAAA", b"x", NOW).unwrap_err();
        assert_eq!(err, VerifyError::UnknownSender(BOT.to_owned()));
        assert_eq!(err.to_string(), "no keys for sender \"alice\"");
        // Unknown sender is reported before signature problems.
        assert_eq!(
            verify_at(&v, BOT, "e", &ts, "junk", b"x", NOW),
            Err(VerifyError::UnknownSender(BOT.to_owned()))
        );
    }

    #[test]
    fn public_keys_that_are_no_usable_point_are_refused_at_parse() {
        // The identity point (small order: every signature would "verify" under the
        // cofactored equation) and a y with no x on the curve.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let not_on_curve = {
            let mut b = [0u8; 32];
            b[0] = 2;
            b
        };
        for raw in [identity, not_on_curve] {
            let text = format!("whpk_{}", B64.encode(raw));
            assert_eq!(PublicKey::parse(&text), Err(KeyError::NotAPoint), "{text}");
        }
        let good = SigningKey::generate().public_key();
        assert_eq!(PublicKey::parse(&good.to_whpk()), Ok(good));
    }

    #[test]
    fn malleated_ed25519_signature_is_rejected() {
        // s + L is the same signature to a lax verifier; a strict one refuses it, so
        // nobody can mint a second valid signature for an envelope they observed.
        const L: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let key = SigningKey::generate();
        let v = ed_verifier("XiaoBa", &[key.public_key()]);
        let (id, ts, body) = ("msg_1", 1_700_000_000i64, br#"{"text":"hi"}"#);
        let content = signed_content(id, &ts.to_string(), body);
        let sig = B64.decode(key.sign(&content)).unwrap();
        let ok = format!("v1a,{}", B64.encode(&sig));
        assert_eq!(
            verify_at(&v, "XiaoBa", id, &ts.to_string(), &ok, body, ts),
            Ok(Scheme::Ed25519)
        );
        let mut malleated = sig.clone();
        let mut carry = 0u16;
        for i in 0..32 {
            let sum = malleated[32 + i] as u16 + L[i] as u16 + carry;
            malleated[32 + i] = sum as u8;
            carry = sum >> 8;
        }
        assert_eq!(carry, 0, "s + L still fits in 32 bytes");
        let bad = format!("v1a,{}", B64.encode(&malleated));
        assert_eq!(
            verify_at(&v, "XiaoBa", id, &ts.to_string(), &bad, body, ts),
            Err(VerifyError::BadSignature {
                scheme: Scheme::Ed25519
            })
        );
    }

    #[test]
    fn key_parse_errors() {
        let pfx = |expected| Err(KeyError::MissingPrefix { expected });
        assert_eq!(
            HmacSecret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").map(|_| ()),
            pfx("whsec_")
        );
        assert_eq!(
            SigningKey::parse("VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=").map(|_| ()),
            pfx("whsk_")
        );
        assert_eq!(
            HmacSecret::parse(V1A_KEY).map(|_| ()),
            Err(KeyError::WrongKeyType {
                expected: "whsec_",
                got: "whsk_"
            })
        );
        assert_eq!(
            SigningKey::parse(V1_SECRET).map(|_| ()),
            Err(KeyError::WrongKeyType {
                expected: "whsk_",
                got: "whsec_"
            })
        );
        assert_eq!(
            PublicKey::parse(V1A_KEY),
            Err(KeyError::WrongKeyType {
                expected: "whpk_",
                got: "whsk_"
            })
        );

        assert_eq!(
            HmacSecret::parse("whsec_not*base64").map(|_| ()),
            Err(KeyError::BadBase64)
        );
        assert_eq!(
            SigningKey::parse("whsk_@@@@").map(|_| ()),
            Err(KeyError::BadBase64)
        );
        assert_eq!(PublicKey::parse("whpk_@@@@"), Err(KeyError::BadBase64));
        assert_eq!(PublicKey::parse("@@@@"), Err(KeyError::BadBase64));

        let enc = |n: usize| B64.encode(vec![7u8; n]);
        let len = |got, min, max| Err(KeyError::BadLength { got, min, max });
        assert_eq!(
            HmacSecret::parse(&format!("whsec_{}", enc(16))).map(|_| ()),
            len(16, 24, 64)
        );
        assert_eq!(
            HmacSecret::parse(&format!("whsec_{}", enc(65))).map(|_| ()),
            len(65, 24, 64)
        );
        assert_eq!(HmacSecret::parse("whsec_").map(|_| ()), len(0, 24, 64));
        assert!(HmacSecret::parse(&format!("whsec_{}", enc(24))).is_ok());
        assert!(HmacSecret::parse(&format!("whsec_{}", enc(64))).is_ok());
        assert_eq!(
            SigningKey::parse(&format!("whsk_{}", enc(31))).map(|_| ()),
            len(31, 32, 32)
        );
        assert_eq!(
            SigningKey::parse(&format!("whsk_{}", enc(64))).map(|_| ()),
            len(64, 32, 32)
        );
        assert_eq!(
            PublicKey::parse(&format!("whpk_{}", enc(33))).map(|_| ()),
            len(33, 32, 32)
        );
        assert_eq!(PublicKey::parse(&enc(16)).map(|_| ()), len(16, 32, 32));

        // Error text never echoes the input.
        let e = HmacSecret::parse("whsec_c2VjcmV0*")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("c2Vj"), "{e}");
    }

    #[test]
    fn validate_strength() {
        let g = HmacSecret::generate();
        assert_eq!(g.validate_strength(), Ok(()));
        assert_eq!(
            B64.decode(&g.to_whsec()[6..]).unwrap().len(),
            HMAC_SECRET_GENERATED_BYTES
        );
        assert_eq!(
            HmacSecret::parse(&g.to_whsec()).unwrap().to_whsec(),
            g.to_whsec()
        );
        let placeholder = HmacSecret::parse(&format!("whsec_{}", "A".repeat(32))).unwrap();
        assert_eq!(placeholder.validate_strength(), Err(KeyError::WeakSecret));
    }

    #[test]
    fn debug_output_redacts_secrets() {
        let s = HmacSecret::parse(V1_SECRET).unwrap();
        let k = SigningKey::parse(V1A_KEY).unwrap();
        let pk = k.public_key();
        let signer = Signer {
            pairwise: Default::default(),
            hmac: vec![s.clone()],
            ed25519: vec![k.clone()],
        };
        let verifier = Verifier {
            pairwise: Default::default(),
            hmac: vec![s.clone()],
            ed25519: HashMap::from([(BOT.to_owned(), vec![pk.clone()])]),
        };
        for out in [
            format!("{s:?}"),
            format!("{k:?}"),
            format!("{signer:?}"),
            format!("{signer:#?}"),
            format!("{verifier:?}"),
        ] {
            assert!(!out.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "{out}");
            assert!(
                !out.contains("VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk"),
                "{out}"
            );
            assert!(!out.contains("whsec_") && !out.contains("whsk_"), "{out}");
        }
        assert_eq!(format!("{s:?}"), "HmacSecret(<redacted>)");
        assert!(format!("{k:?}").contains(&pk.to_whpk()));
        assert_eq!(format!("{pk:?}"), format!("PublicKey({})", pk.to_whpk()));
    }

    #[test]
    fn signer_output_shape() {
        assert!(Signer::default().is_empty());
        assert_eq!(Signer::default().sign("e", NOW, b"x"), "");
        let signer = Signer {
            pairwise: Default::default(),
            hmac: vec![HmacSecret::generate()],
            ed25519: vec![SigningKey::generate()],
        };
        assert!(!signer.is_empty());
        let h = signer.sign("e", NOW, b"x");
        let tags: Vec<_> = h.split(' ').map(|e| e.split_once(',').unwrap().0).collect();
        assert_eq!(tags, ["v1", "v1a"]);
    }

    #[test]
    fn reason_codes_and_display() {
        let cases = [
            (VerifyError::MissingHeader(HEADER_ID), "missing_header"),
            (VerifyError::BadTimestamp, "bad_timestamp"),
            (VerifyError::Stale { age_secs: 301 }, "stale"),
            (VerifyError::Future { ahead_secs: 301 }, "future"),
            (VerifyError::NoSignature, "no_signature"),
            (
                VerifyError::BadSignature {
                    scheme: Scheme::Hmac,
                },
                "bad_signature",
            ),
            (VerifyError::UnknownSender("x".into()), "unknown_sender"),
            (
                VerifyError::TooManyEntries {
                    what: "v1a entries",
                    limit: 2,
                },
                "too_many_signatures",
            ),
        ];
        for (err, code) in cases {
            assert_eq!(err.reason_code(), code);
            assert!(!err.to_string().is_empty());
        }
        assert_eq!(
            VerifyError::BadSignature {
                scheme: Scheme::Ed25519
            }
            .to_string(),
            "no valid Ed25519 (v1a) signature"
        );
        // Sender names are quoted/escaped so they cannot forge log lines.
        assert_eq!(
            VerifyError::UnknownSender("a\nb".into()).to_string(),
            "no keys for sender \"a\\nb\""
        );
    }

    #[test]
    fn too_many_entries_are_refused_before_any_is_checked() {
        let s = HmacSecret::generate();
        let v = hmac_verifier(&[&s]);
        let good = Signer {
            hmac: vec![s],
            ..Signer::default()
        }
        .sign("e", NOW, b"x");
        let ts = NOW.to_string();
        // Three `v1` entries (Standard Webhooks' own multi-signature example) are fine.
        let junk = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=";
        let header = format!("{junk} {junk} {good}");
        assert_eq!(
            verify_at(&v, BOT, "e", &ts, &header, b"x", NOW),
            Ok(Scheme::Hmac)
        );
        // Entries of unknown tags count towards the whole header's limit.
        let filler = vec!["v9,AAAA"; MAX_SIGNATURE_ENTRIES].join(" ");
        assert_eq!(
            verify_at(&v, BOT, "e", &ts, &format!("{filler} {good}"), b"x", NOW),
            Err(VerifyError::TooManyEntries {
                what: "entries",
                limit: MAX_SIGNATURE_ENTRIES
            })
        );

        // Ed25519: 100 `v1a` entries under a sender with two keys would have been
        // 200 verifications; the header is refused with no pair to verify.
        let (old, new) = (SigningKey::generate(), SigningKey::generate());
        let v = ed_verifier(BOT, &[old.public_key(), new.public_key()]);
        let signed = Signer {
            ed25519: vec![new],
            ..Signer::default()
        }
        .sign("e", NOW, b"x");
        let forged = SigningKey::generate().sign(&signed_content("e", &ts, b"x"));
        let many = vec![format!("v1a,{forged}"); 99].join(" ");
        let header = format!("{many} {signed}");
        let refused = VerifyError::TooManyEntries {
            what: "v1a entries",
            limit: MAX_V1A_ENTRIES,
        };
        assert_eq!(
            v.precheck(BOT, Some("e"), Some(&ts), Some(&header), b"x", NOW)
                .map(|p| p.ed25519_pairs())
                .unwrap_err(),
            refused
        );
        // Two `v1a` entries (a rotation), one forged: at most 2 × 2 pairs, and it verifies.
        let header = format!("v1a,{forged} {signed}");
        let p = v
            .precheck(BOT, Some("e"), Some(&ts), Some(&header), b"x", NOW)
            .unwrap();
        assert_eq!(p.ed25519_pairs(), 4);
        assert_eq!(p.finish(), Ok(Scheme::Ed25519));
        assert!(unix_now() > 1_600_000_000);
    }
}
