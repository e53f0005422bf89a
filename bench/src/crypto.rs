//! The price of one signature, in-process: what a node pays per envelope to sign
//! (`Signer::sign`, once per peer per attempt) and to verify (`Verifier::verify`).

use std::collections::HashMap;
use std::time::Instant;

use botmesh::wire::signing::{
    verify_all, HmacSecret, PairwiseKey, Pending, Signer, SigningKey, Verifier,
};
use serde::Serialize;

/// Microseconds per operation on a bench-sized envelope.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CryptoCost {
    /// Operations timed per figure.
    pub iterations: usize,
    /// Bytes of the signed envelope body.
    pub body_bytes: usize,
    /// `Signer::sign` with one Ed25519 key.
    pub ed25519_sign_us: f64,
    /// `Verifier::verify` of that signature (timestamp window, header parsing included).
    pub ed25519_verify_us: f64,
    /// Per envelope, verifying 8 at once (`signing::verify_all`, as a node's
    /// `VerifyPool` does when 8 wait), the cheap checks not included.
    pub ed25519_verify_batch8_us: f64,
    /// The same, 64 at once (a full batch request).
    pub ed25519_verify_batch64_us: f64,
    /// `Verifier::verify` of an Ed25519 sender's envelope carrying the pairwise `v1`
    /// entry for the receiver (what a peer's outbox sends): no Ed25519 arithmetic.
    pub pairwise_verify_us: f64,
    /// Adding that entry for one peer (`Signer::add_pairwise`: one HMAC).
    pub pairwise_sign_us: f64,
    /// `Signer::sign` with the mesh HMAC secret.
    pub hmac_sign_us: f64,
    /// `Verifier::verify` of that signature.
    pub hmac_verify_us: f64,
}

fn time_us(n: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// Times `n` of each operation.
pub fn measure(n: usize) -> CryptoCost {
    let env = crate::load::envelope(999, 0, "node1", false);
    let body = env.to_bytes();
    let id = env.id.to_string();
    let ts = botmesh::wire::signing::unix_now();
    let ts_s = ts.to_string();
    let key = SigningKey::generate();
    let ed = Signer {
        pairwise: Default::default(),
        hmac: vec![],
        ed25519: vec![key.clone()],
    };
    let ed_verifier = Verifier {
        pairwise: Default::default(),
        hmac: vec![],
        ed25519: HashMap::from([("node1".to_string(), vec![key.public_key()])]),
    };
    // node1 sending to node0, each side holding its own key and the other's public key.
    let receiver_key = SigningKey::generate();
    let to_node0 = PairwiseKey::sending(&key, "node1", &receiver_key.public_key(), "node0")
        .expect("pairwise key");
    let pw = Signer {
        pairwise: HashMap::from([("node0".to_string(), to_node0)]),
        hmac: vec![],
        ed25519: vec![key.clone()],
    };
    let pw_verifier = Verifier {
        pairwise: HashMap::from([(
            "node1".to_string(),
            vec![
                PairwiseKey::receiving(&receiver_key, "node0", &key.public_key(), "node1")
                    .expect("pairwise key"),
            ],
        )]),
        ..ed_verifier.clone()
    };
    let secret = HmacSecret::generate();
    let hm = Signer {
        pairwise: Default::default(),
        hmac: vec![secret.clone()],
        ed25519: vec![],
    };
    let hm_verifier = Verifier {
        pairwise: Default::default(),
        hmac: vec![secret],
        ed25519: HashMap::new(),
    };
    let ed_sig = ed.sign(&id, ts, &body);
    let hm_sig = hm.sign(&id, ts, &body);
    let pw_sig = pw.sign_for("node0", &id, ts, &body);
    let check = |v: &Verifier, sig: &str| {
        v.verify("node1", Some(&id), Some(&ts_s), Some(sig), &body, ts)
            .expect("bench signature verifies");
    };
    check(&ed_verifier, &ed_sig);
    check(&hm_verifier, &hm_sig);
    let pairwise_decided = pw_verifier
        .precheck("node1", Some(&id), Some(&ts_s), Some(&pw_sig), &body, ts)
        .expect("bench pairwise signature prechecks");
    assert!(
        !pairwise_decided.needs_work(),
        "the pairwise entry decides without Ed25519"
    );
    // 64 distinct envelopes, prechecked once: what the verify thread receives.
    let pending: Vec<Pending> = (0..64)
        .map(|i| {
            let env = crate::load::envelope(999, i + 1, "node1", false);
            let (id, body) = (env.id.to_string(), env.to_bytes());
            let sig = ed.sign(&id, ts, &body);
            ed_verifier
                .precheck("node1", Some(&id), Some(&ts_s), Some(&sig), &body, ts)
                .expect("bench signature prechecks")
        })
        .collect();
    let batch_us = |size: usize| {
        let rounds = (n / size).max(4);
        let per_round = time_us(rounds, || {
            for chunk in pending.chunks(size) {
                let verdicts = verify_all(chunk);
                assert!(verdicts.iter().all(Result::is_ok), "bench batch verifies");
            }
        });
        per_round / pending.len() as f64
    };
    CryptoCost {
        iterations: n,
        body_bytes: body.len(),
        ed25519_sign_us: time_us(n, || {
            std::hint::black_box(ed.sign(&id, ts, &body));
        }),
        ed25519_verify_us: time_us(n, || check(&ed_verifier, &ed_sig)),
        ed25519_verify_batch8_us: batch_us(8),
        ed25519_verify_batch64_us: batch_us(64),
        hmac_sign_us: time_us(n, || {
            std::hint::black_box(hm.sign(&id, ts, &body));
        }),
        hmac_verify_us: time_us(n, || check(&hm_verifier, &hm_sig)),
        pairwise_verify_us: time_us(n, || check(&pw_verifier, &pw_sig)),
        pairwise_sign_us: time_us(n, || {
            std::hint::black_box(pw.add_pairwise("node0", String::new(), &id, ts, &body));
        }),
    }
}
