//! Key material: the mesh's HMAC secrets (`whsec_`), a bot's Ed25519 signing and
//! public keys (`whsk_`, `whpk_`), the pairwise HMAC keys two key-holding bots derive
//! for each other, their textual forms and why one is refused ([`KeyError`]).

use std::fmt;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::Signer as _;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use subtle::ConstantTimeEq as _;

use super::{signed_content, TAG_HMAC};

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

    /// Constant-time check of a raw (decoded) tag against the signed content
    /// `{id}.{timestamp}.{body}`, hashed from its parts (no copy of the body).
    pub(super) fn verify_tag(&self, id: &str, timestamp: &str, body: &[u8], tag: &[u8]) -> bool {
        let mut mac = hmac::Context::with_key(&self.key);
        for part in [id.as_bytes(), b".", timestamp.as_bytes(), b".", body] {
            mac.update(part);
        }
        mac.sign().as_ref().ct_eq(tag).into()
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
    pub(super) secret: HmacSecret,
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
    pub(super) key: ed25519_dalek::VerifyingKey,
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
