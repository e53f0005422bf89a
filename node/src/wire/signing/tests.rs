//! Tests of envelope signing ([`super`]): pairwise keys, the published Standard
//! Webhooks vectors, both schemes' round trips and rotation, and each way a
//! verification or a key is refused.

use super::keys::{HMAC_SECRET_GENERATED_BYTES, PUBLIC_KEY_PREFIX};
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
const V1A_SIG: &str =
    "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag==";

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
    assert_eq!(at_b.finish(), bad_signature(Scheme::Ed25519));
}

#[test]
fn pairwise_keys_agree_per_direction_and_nobody_else_has_them() {
    let m = pairwise_mesh(&["A", "B", "C"]);
    let body = b"x";
    let only_pairwise = |signer: &Signer, peer: &str| signer.pairwise[peer].entry("e1", NOW, body);
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
        bad_signature(Scheme::Ed25519)
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

/// The answer to a header with no valid signature of `scheme`.
fn bad_signature(scheme: Scheme) -> Result<Scheme, VerifyError> {
    Err(VerifyError::BadSignature { scheme })
}

/// A verifier of one fresh HMAC secret, and that secret's signature header over
/// the body `x` of message `e` at [`NOW`].
fn hmac_signed_x() -> (Verifier, String) {
    let s = HmacSecret::generate();
    let v = hmac_verifier(&[&s]);
    let signer = Signer {
        hmac: vec![s],
        ..Signer::default()
    };
    (v, signer.sign("e", NOW, b"x"))
}

/// [`verify_at`] of the body `x` of message `e` from [`BOT`], sent and checked at
/// [`NOW`], under the signature header `sig`.
fn verify_x(v: &Verifier, sig: &str) -> Result<Scheme, VerifyError> {
    verify_at(v, BOT, "e", &NOW.to_string(), sig, b"x", NOW)
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
    let bad = bad_signature(scheme);
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
        bad_signature(Scheme::Hmac)
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
        bad_signature(Scheme::Ed25519)
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
        bad_signature(Scheme::Hmac)
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
        bad_signature(Scheme::Ed25519)
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
        bad_signature(Scheme::Ed25519)
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
        bad_signature(Scheme::Ed25519)
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
    let (v, good) = hmac_signed_x();
    let header = format!("v1,!!!notbase64 nocomma ,AAAA v1a,%%% v2,AAAA  \t{good} v1,");
    assert_eq!(verify_x(&v, &header), Ok(Scheme::Hmac));
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
            verify_x(&v, junk),
            Err(VerifyError::NoSignature),
            "{junk:?}"
        );
    }
    // Parsable but wrong tag / wrong length / wrong value: bad signature. An entry
    // longer than any signature is decoded past the stack buffer and still counts.
    let overlong = format!("v1,{}", B64.encode([7u8; 100]));
    for wrong in [
        "v2,AAAA",
        "v1,AAAA",
        "v1a,AAAA",
        "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
        &overlong,
    ] {
        assert_eq!(
            verify_x(&v, wrong),
            bad_signature(Scheme::Hmac),
            "{wrong:?}"
        );
    }
    // Too long for the stack buffer and not base64: skipped like any malformed entry.
    let junk = format!("v1,{}", "!".repeat(120));
    assert_eq!(verify_x(&v, &junk), Err(VerifyError::NoSignature));
    assert_eq!(verify_x(&v, &format!("{junk} {good}")), Ok(Scheme::Hmac));
}

#[test]
fn unknown_sender() {
    assert_eq!(
        verify_x(&Verifier::default(), "v1,AAAA"),
        Err(VerifyError::UnknownSender(BOT.to_owned()))
    );
    let v = ed_verifier("bob", &[SigningKey::generate().public_key()]);
    let err = verify_x(&v, "v1,AAAA").unwrap_err();
    assert_eq!(err, VerifyError::UnknownSender(BOT.to_owned()));
    assert_eq!(err.to_string(), "no keys for sender \"alice\"");
    // Unknown sender is reported before signature problems.
    assert_eq!(
        verify_x(&v, "junk"),
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
        0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde,
        0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
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
        bad_signature(Scheme::Ed25519)
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
    let (v, good) = hmac_signed_x();
    // Three `v1` entries (Standard Webhooks' own multi-signature example) are fine.
    let junk = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=";
    let header = format!("{junk} {junk} {good}");
    assert_eq!(verify_x(&v, &header), Ok(Scheme::Hmac));
    // Entries of unknown tags count towards the whole header's limit.
    let filler = vec!["v9,AAAA"; MAX_SIGNATURE_ENTRIES].join(" ");
    assert_eq!(
        verify_x(&v, &format!("{filler} {good}")),
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
    let ts = NOW.to_string();
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
