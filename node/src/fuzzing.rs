//! Fuzz harnesses: one function per fuzz target, each feeding arbitrary bytes to a
//! parser or checker that faces untrusted input and asserting what must hold for
//! every input (no panic, plus invariants stated per target).
//!
//! They live here, in the library, so that the cargo-fuzz targets in `fuzz/` (built
//! with nightly and libFuzzer) and the corpus replay test in the normal test suite
//! (stable, `tests/tests/fuzz_corpus.rs`) run exactly the same code: the committed
//! corpus and every regression input keep being exercised in CI without cargo-fuzz.
//!
//! A harness panics when an invariant breaks; that is how libFuzzer learns of a
//! failure. Inputs are split into fields by simple fixed rules (documented per
//! target) rather than with `arbitrary`, so corpus files stay readable and editable.

use std::collections::HashMap;
use std::sync::OnceLock;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use http::{HeaderMap, HeaderValue};

use crate::platform::feishu::{self, Callback, EventAuth, EventError, MessageReceived};
use crate::turn::mention::{Member, MentionMatcher, PlatformMention};
use crate::wire::envelope::Envelope;
use crate::wire::signing::{
    HmacSecret, PublicKey, Scheme, Signer, SigningKey, Verifier, VerifyError,
};

/// Every fuzz target, by the name used for `fuzz/fuzz_targets/<name>.rs` and
/// `fuzz/corpus/<name>/`; the replay test walks this list so a new target cannot be
/// forgotten there.
pub const TARGETS: [&str; 5] = [
    "envelope_parse",
    "envelope_verify",
    "mention",
    "feishu_event",
    "feishu_decrypt",
];

/// Runs the harness called `target` on `data`; false for an unknown target name.
pub fn run(target: &str, data: &[u8]) -> bool {
    match target {
        "envelope_parse" => envelope_parse(data),
        "envelope_verify" => envelope_verify(data),
        "mention" => mention(data),
        "feishu_event" => feishu_event(data),
        "feishu_decrypt" => feishu_decrypt(data),
        _ => return false,
    }
    true
}

/// The fixed "now" of the signature harnesses (unix seconds), so a run is reproducible.
pub(crate) const NOW: i64 = 1_763_800_000;

/// The app id of the Feishu harnesses' [`EventAuth`].
const APP_ID: &str = "cli_fuzz";

// ---------------------------------------------------------------------------------
// Envelopes
// ---------------------------------------------------------------------------------

/// `Envelope::parse` on arbitrary bytes. For every body it accepts: `check` passes,
/// `to_bytes` parses back to an equal envelope, and serializing that again gives the
/// same bytes (what a node signs is stable).
pub fn envelope_parse(data: &[u8]) {
    let Ok(env) = Envelope::parse(data) else {
        return;
    };
    env.check().expect("a parsed envelope passes check");
    // Well-formed UTF-8 JSON. Not `Value`: a number beyond f64 (`45E535`) in a field
    // this version ignores is valid JSON that `Value` refuses but skipping accepts
    // (fuzz/regressions/envelope_parse/huge-number-in-unknown-field).
    assert!(
        std::str::from_utf8(data).is_ok(),
        "an accepted body is UTF-8"
    );
    assert!(
        serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok(),
        "an accepted body is JSON"
    );
    let bytes = env.to_bytes();
    let back = Envelope::parse(&bytes).expect("an envelope's own bytes parse");
    assert_eq!(back, env, "round trip changes the envelope");
    assert_eq!(back.to_bytes(), bytes, "serialization is not stable");
}

/// The keys of the verifier harness: one mesh secret, and an Ed25519 key for the
/// sender `ed` (so that sender must use `v1a`).
struct Keys {
    /// Signs as a mesh member (`v1`).
    hmac: Signer,
    /// Signs as `ed` (`v1a`).
    ed: Signer,
    /// Knows both.
    verifier: Verifier,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let secret_bytes: Vec<u8> = (0u8..32).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
        let secret = HmacSecret::parse(&format!("whsec_{}", B64.encode(&secret_bytes)))
            .expect("fixed fuzz secret");
        let seed: Vec<u8> = (0u8..32).map(|b| b.wrapping_mul(11) ^ 0xa5).collect();
        let key = SigningKey::parse(&format!("whsk_{}", B64.encode(&seed))).expect("fixed seed");
        let public: PublicKey = key.public_key();
        Keys {
            hmac: Signer {
                pairwise: Default::default(),
                hmac: vec![secret.clone()],
                ed25519: vec![],
            },
            ed: Signer {
                pairwise: Default::default(),
                hmac: vec![],
                ed25519: vec![key],
            },
            verifier: Verifier {
                pairwise: Default::default(),
                hmac: vec![secret],
                ed25519: HashMap::from([("ed".to_string(), vec![public])]),
            },
        }
    })
}

/// `Verifier::verify` on arbitrary header strings and bodies.
///
/// Input: byte 0 selects the sender (`ed`, holding an Ed25519 key, or `mesh`) and
/// which body byte to flip; the rest is split at the first three `\n` into the id,
/// timestamp and signature header values (lossy UTF-8) and the body. Asserts:
/// arbitrary headers never panic and are only accepted with a timestamp inside the
/// window; a signature made over the fuzzed id and body with the right key verifies
/// under the right scheme; flipping one body bit, or signing `ed`'s message with the
/// mesh secret, fails with `BadSignature`.
pub fn envelope_verify(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.splitn(4, |&b| b == b'\n');
    let id = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let ts = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let sig = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let body = parts.next().unwrap_or_default();
    let k = keys();
    let (sender, signer, scheme) = if sel & 1 == 0 {
        ("ed", &k.ed, Scheme::Ed25519)
    } else {
        ("mesh", &k.hmac, Scheme::Hmac)
    };

    // Arbitrary headers: any answer but a panic; acceptance needs a fresh timestamp.
    for (i, t, s) in [
        (Some(id.as_str()), Some(ts.as_str()), Some(sig.as_str())),
        (None, Some(ts.as_str()), Some(sig.as_str())),
        (Some(id.as_str()), None, Some(sig.as_str())),
        (Some(id.as_str()), Some(ts.as_str()), None),
    ] {
        if k.verifier.verify(sender, i, t, s, body, NOW).is_ok() {
            let at: i64 = ts.parse().expect("an accepted timestamp is an integer");
            assert!((NOW - at).abs() <= crate::wire::signing::TOLERANCE_SECS);
        }
    }
    let _ = k
        .verifier
        .verify(&id, Some(&id), Some(&ts), Some(&sig), body, NOW);

    // A genuine signature over the fuzzed id and body verifies.
    let now = NOW.to_string();
    let good = signer.sign(&id, NOW, body);
    assert_eq!(
        k.verifier
            .verify(sender, Some(&id), Some(&now), Some(&good), body, NOW),
        Ok(scheme),
        "a genuine signature must verify"
    );
    // Extra junk entries around it do not hurt (rotation, future schemes).
    let padded = format!("v9,AAAA {good} {sig}");
    if crate::wire::signing::check_entry_counts(&padded).is_ok() {
        assert_eq!(
            k.verifier
                .verify(sender, Some(&id), Some(&now), Some(&padded), body, NOW),
            Ok(scheme),
            "unknown entries must be skipped"
        );
    }
    // One flipped bit anywhere in the body breaks it.
    if !body.is_empty() {
        let mut flipped = body.to_vec();
        let at = (usize::from(sel) >> 3) % flipped.len();
        flipped[at] ^= 1 << (sel & 7);
        assert_eq!(
            k.verifier
                .verify(sender, Some(&id), Some(&now), Some(&good), &flipped, NOW),
            Err(VerifyError::BadSignature { scheme }),
            "a flipped body bit must not verify"
        );
    }
    // The mesh secret cannot speak for a bot that holds its own key.
    let forged = k.hmac.sign(&id, NOW, body);
    assert_eq!(
        k.verifier
            .verify("ed", Some(&id), Some(&now), Some(&forged), body, NOW),
        Err(VerifyError::BadSignature {
            scheme: Scheme::Ed25519
        }),
        "an HMAC signature must not pass for an Ed25519 sender"
    );
}

// ---------------------------------------------------------------------------------
// Mentions
// ---------------------------------------------------------------------------------

/// The roster of the mention harness: overlapping CJK names (`小八`/`小八哥`),
/// Latin prefixes (`Bob`/`Bobby`), multi-word names and open_ids.
fn matcher() -> &'static MentionMatcher {
    static M: OnceLock<MentionMatcher> = OnceLock::new();
    M.get_or_init(|| {
        let m = |name: &str, aliases: &[&str], ids: &[&str]| Member {
            name: name.into(),
            aliases: aliases.iter().map(|s| s.to_string()).collect(),
            open_ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        MentionMatcher::new(&[
            m("XiaoBa", &["小八", "xiaoba"], &["ou_xiaoba"]),
            m("小八哥", &[], &["ou_bro"]),
            m("ErGoz", &["二狗"], &["ou_ergoz"]),
            m("Bob", &["Bob Ross"], &[]),
            m("Bobby", &[], &["ou_bobby"]),
            m("İlkay", &["ǅemal"], &[]),
        ])
    })
}

/// The `mentions[]` of the mention harness: one known open_id, one name-only entry,
/// one stranger.
fn platform() -> Vec<PlatformMention> {
    let p = |key: &str, open_id: &str, name: &str| PlatformMention {
        key: key.into(),
        open_id: open_id.into(),
        name: name.into(),
    };
    vec![
        p("@_user_1", "ou_ergoz", "ErGoz"),
        p("@_user_2", "ou_unknown", "小八"),
        p("@_user_3", "ou_stranger", "Stranger"),
    ]
}

/// Checks what holds for every text: spans lie on char boundaries, in order, without
/// overlap, each starting at `@`, `＠` or `<`; `mentioned` is the spans' members in
/// first-appearance order; `mentions` agrees with it; a rewrite that keeps every
/// mention returns the text unchanged.
fn check_mentions(m: &MentionMatcher, text: &str, pm: &[PlatformMention]) -> Vec<String> {
    let spans = m.spans(text, pm);
    let mut last = 0;
    for s in &spans {
        assert!(s.start >= last && s.start < s.end && s.end <= text.len());
        assert!(text.is_char_boundary(s.start) && text.is_char_boundary(s.end));
        let head = &text[s.start..s.end];
        assert!(
            head.starts_with('@') || head.starts_with('＠') || head.starts_with('<'),
            "span {head:?} does not start a mention"
        );
        last = s.end;
    }
    let mentioned = m.mentioned(text, pm);
    let mut expected: Vec<String> = Vec::new();
    for s in spans {
        if !expected.contains(&s.member) {
            expected.push(s.member);
        }
    }
    assert_eq!(mentioned, expected, "mentioned() disagrees with spans()");
    for name in [
        "XiaoBa",
        "小八",
        "小八哥",
        "ErGoz",
        "Bob",
        "bobby",
        "nobody",
    ] {
        let canonical = m.resolve(name).unwrap_or(name);
        assert_eq!(
            m.mentions(text, pm, name),
            mentioned.iter().any(|n| n == canonical),
            "mentions({name}) disagrees with mentioned()"
        );
    }
    assert_eq!(
        m.rewrite(text, |_| None),
        text,
        "a no-op rewrite changed text"
    );
    mentioned
}

/// Rounds `at` down to a char boundary of `s`.
fn floor_boundary(s: &str, mut at: usize) -> usize {
    at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// `MentionMatcher` on arbitrary text (lossy UTF-8 of the input after two selector
/// bytes). Besides [`check_mentions`] on the text itself: with every backtick removed
/// and the text cut in three at the selector positions (`a`, `x`, `b`), whatever is
/// inside a code span must not matter — `` a`x`b `` and `` a`@XiaoBa…`b `` name the
/// same members, and so do the same with a fenced block — and, in text without `<`,
/// rewriting each plain mention to ` @Name ` keeps the set of members mentioned.
pub fn mention(data: &[u8]) {
    let (sel, rest) = match data {
        [a, b, rest @ ..] => ((*a, *b), rest),
        _ => ((0, 0), data),
    };
    let m = matcher();
    let pm = platform();
    let text = String::from_utf8_lossy(rest);
    let mentioned = check_mentions(m, &text, &pm);

    // Rewriting to the canonical ` @Name ` keeps who is mentioned (placeholders and
    // tags are not rewritten, and a canonical name always resolves to itself). The
    // leading space matters: `x_＠二狗` is a mention but `x_@ErGoz` is an e-mail
    // address (fuzz/regressions/mention).
    // Only for text without `<`: the inserted spaces can turn a malformed `<at …` run
    // around a mention into a well-formed tag that then swallows it
    // (fuzz/regressions/mention/space-completes-at-tag).
    if !text.contains('<') {
        let rewritten = m.rewrite(&text, |name| Some(format!(" @{name} ")));
        let again = check_mentions(m, &rewritten, &pm);
        let mut a = mentioned.clone();
        let mut b = again;
        a.sort();
        b.sort();
        assert_eq!(a, b, "rewrite to canonical names changed who is mentioned");
    }

    let plain: String = text.chars().filter(|&c| c != '`').collect();
    let i = floor_boundary(&plain, usize::from(sel.0) * plain.len() / 255);
    let j = floor_boundary(&plain, usize::from(sel.1) * plain.len() / 255).max(i);
    let (before, after) = (&plain[..i], &plain[j..]);
    // An empty span would glue the two backtick runs into one longer run.
    let inside = Some(&plain[i..j]).filter(|s| !s.is_empty()).unwrap_or(" ");
    let hostile = "@XiaoBa ＠小八 @Bob <at user_id=\"ou_ergoz\">x</at> @_user_1";
    for (open, close) in [("`", "`"), ("``", "``"), ("\n```\n", "\n```\n")] {
        let one = format!("{before}{open}{inside}{close}{after}");
        let two = format!("{before}{open}{hostile}{close}{after}");
        assert_eq!(
            check_mentions(m, &one, &pm),
            check_mentions(m, &two, &pm),
            "text inside a code span changed the result"
        );
    }
}

// ---------------------------------------------------------------------------------
// Feishu
// ---------------------------------------------------------------------------------

/// The Feishu event parser on arbitrary (decrypted) bodies: `parse_callback`, the
/// `im.message.receive_v1` parser, the text extraction and mention resolution never
/// panic; `EventAuth::open` with nothing configured accepts exactly what
/// `parse_callback` accepts (an `encrypt` body aside) and returns the same callback;
/// with a Verification Token configured it accepts only callbacks carrying it.
pub fn feishu_event(data: &[u8]) {
    let parsed = feishu::parse_callback(data);
    if let Ok(Callback::Event { event, .. }) = &parsed {
        if let Ok(msg) = MessageReceived::from_event(event) {
            let text = msg.message.text().unwrap_or_default();
            let pm: Vec<PlatformMention> = msg
                .message
                .mentions
                .iter()
                .map(|x| PlatformMention {
                    key: x.key.clone(),
                    open_id: x.id.open_id.clone(),
                    name: x.name.clone(),
                })
                .collect();
            check_mentions(matcher(), &text, &pm);
        }
    }
    let open = EventAuth {
        app_id: APP_ID.into(),
        verification_token: None,
        encrypt_key: None,
    };
    match open.open(&HeaderMap::new(), data, NOW) {
        Ok(cb) => assert_eq!(
            parsed.as_ref().ok(),
            Some(&cb),
            "open() and parse_callback() disagree"
        ),
        Err(EventError::WrongApp(app)) => assert_ne!(app, APP_ID),
        Err(_) => {}
    }
    let tokened = EventAuth {
        verification_token: Some("tok".into()),
        ..open
    };
    if let Ok(cb) = tokened.open(&HeaderMap::new(), data, NOW) {
        assert_eq!(cb.token(), Some("tok"), "accepted without the token");
    }
}

/// Feishu decryption. Input: byte 0 (mod 33) is the length of the Encrypt Key taken
/// from the following bytes (lossy UTF-8); the rest is the payload. Asserts: decrypt
/// of the payload as text and as base64 never panics; whatever decrypts re-encrypts
/// (same IV) to the same base64; encrypting the payload and decrypting gives it back;
/// and a signed, encrypted callback carrying the payload is opened by `EventAuth`
/// exactly when `parse_callback` accepts the payload, to the same callback.
pub fn feishu_decrypt(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(sel % 33).min(rest.len());
    let key = String::from_utf8_lossy(&rest[..n]).into_owned();
    let payload = &rest[n..];

    let _ = feishu::decrypt(&key, &String::from_utf8_lossy(payload));
    let b64 = B64.encode(payload);
    if let Ok(plain) = feishu::decrypt(&key, &b64) {
        let iv: [u8; 16] = payload[..16]
            .try_into()
            .expect("decrypt checked the length");
        assert_eq!(
            feishu::encrypt(&key, &plain, iv),
            b64,
            "re-encryption differs"
        );
    }

    let mut iv = [0u8; 16];
    for (d, s) in iv.iter_mut().zip(payload.iter().rev()) {
        *d = *s;
    }
    let sealed = feishu::encrypt(&key, payload, iv);
    assert_eq!(
        feishu::decrypt(&key, &sealed).as_deref(),
        Ok(payload),
        "decrypt(encrypt(x)) != x"
    );

    let body = serde_json::json!({ "encrypt": sealed }).to_string();
    let ts = NOW.to_string();
    let mut headers = HeaderMap::new();
    let sig = feishu::signature(&ts, "nonce", &key, body.as_bytes());
    for (name, value) in [
        (feishu::HEADER_TIMESTAMP, ts.as_str()),
        (feishu::HEADER_NONCE, "nonce"),
        (feishu::HEADER_SIGNATURE, sig.as_str()),
    ] {
        headers.insert(name, HeaderValue::from_str(value).expect("ascii header"));
    }
    let auth = EventAuth {
        app_id: APP_ID.into(),
        verification_token: None,
        encrypt_key: Some(key),
    };
    let opened = auth.open(&headers, body.as_bytes(), NOW);
    match (feishu::parse_callback(payload), opened) {
        (Ok(want), Ok(got)) => assert_eq!(want, got, "open() changed the callback"),
        (Ok(Callback::Event { header, .. }), Err(EventError::WrongApp(app))) => {
            assert_eq!(header.app_id.as_deref(), Some(app.as_str()));
            assert_ne!(app, APP_ID);
        }
        (Ok(cb), Err(e)) => panic!("open() refused a good callback {cb:?}: {e}"),
        (Err(_), Ok(cb)) => panic!("open() accepted what parse_callback refuses: {cb:?}"),
        (Err(_), Err(_)) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_runs_on_small_inputs() {
        for t in TARGETS {
            for input in [
                &b""[..],
                b"\0",
                b"{}",
                b"\x01a\n1\nv1,AAAA\nbody",
                "@小八你好`@Bob`".as_bytes(),
            ] {
                assert!(run(t, input), "{t}");
            }
        }
        assert!(!run("nope", b""));
    }
}
