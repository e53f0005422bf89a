//! Callback crypto: AES-256-CBC bodies under the Encrypt Key, and `X-Lark-Signature`.

use base64::Engine;
use cbc::cipher::{block_padding::Pkcs7, BlockDecryptMut, BlockEncryptMut, KeyIvInit};

// ---------------------------------------------------------------------------------
// Crypto
// ---------------------------------------------------------------------------------

/// Why an `encrypt` payload could not be decrypted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CryptoError {
    /// Not base64.
    #[error("not base64")]
    Base64,
    /// Shorter than an IV plus one block, or not whole blocks.
    #[error("ciphertext length {0} is not an IV plus whole AES blocks")]
    Length(usize),
    /// Wrong key, or tampered data: the padding does not check out.
    #[error("bad padding (wrong encrypt key?)")]
    Padding,
}

pub(super) fn aes_key(encrypt_key: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, encrypt_key.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(d.as_ref());
    key
}

/// Decrypts a Feishu `encrypt` field: base64 of IV (16 bytes) + AES-256-CBC ciphertext
/// with key sha256(`encrypt_key`) and PKCS#7 padding.
pub(crate) fn decrypt(encrypt_key: &str, encrypted: &str) -> Result<Vec<u8>, CryptoError> {
    let data = base64::engine::general_purpose::STANDARD
        .decode(encrypted.trim())
        .map_err(|_| CryptoError::Base64)?;
    if data.len() < 32 || data.len() % 16 != 0 {
        return Err(CryptoError::Length(data.len()));
    }
    let (iv, ciphertext) = data.split_at(16);
    cbc::Decryptor::<aes::Aes256>::new_from_slices(&aes_key(encrypt_key), iv)
        .expect("key and IV lengths are fixed")
        .decrypt_padded_vec_mut::<Pkcs7>(ciphertext)
        .map_err(|_| CryptoError::Padding)
}

/// Encrypts like Feishu does (the inverse of [`decrypt`]); for tests and fakes.
pub fn encrypt(encrypt_key: &str, plaintext: &[u8], iv: [u8; 16]) -> String {
    let mut out = iv.to_vec();
    out.extend(
        cbc::Encryptor::<aes::Aes256>::new_from_slices(&aes_key(encrypt_key), &iv)
            .expect("key and IV lengths are fixed")
            .encrypt_padded_vec_mut::<Pkcs7>(plaintext),
    );
    base64::engine::general_purpose::STANDARD.encode(out)
}

/// `X-Lark-Signature`: lowercase hex sha256 of timestamp + nonce + encrypt_key + body.
pub fn signature(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(timestamp.as_bytes());
    ctx.update(nonce.as_bytes());
    ctx.update(encrypt_key.as_bytes());
    ctx.update(body);
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
