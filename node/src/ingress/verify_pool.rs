//! `VerifyPool`: Ed25519 verification off the async workers, many signatures at once.
//!
//! Verifying an Ed25519 signature costs tens of µs, more than everything else a
//! receiver does for an envelope. Envelopes from peers' outboxes carry a pairwise
//! entry that is checked instead ([`crate::wire::signing::PairwiseKey`]); what comes here
//! is the rest: Redis Stream entries, copies at a relay, older senders. A
//! batch verification of a few signatures costs about two thirds of verifying them
//! one by one ([`crate::wire::signing::verify_all`]; the bench reports both figures).
//! Envelopes arrive one per request, so the pool
//! *coalesces*: one thread takes every check waiting in its queue, up to
//! [`MAX_COALESCED`] envelopes, and decides them in one call. Under load the queue
//! fills while a batch is being verified, so batches grow with the load; a lone
//! envelope is verified alone, at once (nothing waits for company).
//!
//! A `POST /bridge/v1/batch` hands all its items in one job, so they are verified
//! together whatever else is queued.

use std::sync::mpsc;

use tokio::sync::oneshot;

use crate::wire::signing::{verify_all, Pending, Scheme, VerifyError};

/// The most envelopes one coalesced verification takes (a job is never split, so
/// one batch request can make it larger).
pub(crate) const MAX_COALESCED: usize = 64;

/// One request's checks and where their verdicts go.
struct Job {
    /// The checks, in the caller's order.
    checks: Vec<Pending>,
    /// Receives one verdict per check, in the same order.
    reply: oneshot::Sender<Vec<Result<Scheme, VerifyError>>>,
}

/// The handle to the verifying thread. Dropping the last handle ends the thread.
pub(crate) struct VerifyPool {
    /// Jobs for the thread.
    jobs: mpsc::Sender<Job>,
}

impl VerifyPool {
    /// Starts the verifying thread, named after the bot for `top -H`.
    pub(crate) fn start(bot: &str) -> std::io::Result<VerifyPool> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(format!("verify-{bot}"))
            .spawn(move || run(queue))?;
        Ok(VerifyPool { jobs })
    }

    /// Decides `checks` (see [`verify_all`]), on the pool's thread, together with
    /// whatever other checks are waiting there.
    pub(crate) async fn verify(&self, checks: Vec<Pending>) -> Vec<Result<Scheme, VerifyError>> {
        if !checks.iter().any(Pending::needs_work) {
            // HMAC only (or nothing): already decided, not worth a trip to the thread
            // (nor a batch's set-up).
            return checks.iter().map(Pending::finish).collect();
        }
        let (reply, verdicts) = oneshot::channel();
        match self.jobs.send(Job { checks, reply }) {
            Ok(()) => verdicts
                .await
                .expect("the verify thread answers every job it takes"),
            // The thread is gone (it never exits while a handle exists, so only a
            // panic in it gets here): decide on this thread rather than fail.
            Err(mpsc::SendError(job)) => verify_all(&job.checks),
        }
    }
}

/// The thread: take one job, then every job already queued (up to the cap), verify
/// them in one batch, answer each.
fn run(queue: mpsc::Receiver<Job>) {
    while let Ok(first) = queue.recv() {
        let mut jobs = vec![first];
        let mut n = jobs[0].checks.len();
        while n < MAX_COALESCED {
            match queue.try_recv() {
                Ok(job) => {
                    n += job.checks.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let sizes: Vec<usize> = jobs.iter().map(|j| j.checks.len()).collect();
        let (all, replies): (Vec<Vec<Pending>>, Vec<_>) =
            jobs.into_iter().map(|j| (j.checks, j.reply)).unzip();
        let all: Vec<Pending> = all.into_iter().flatten().collect();
        let mut verdicts = verify_all(&all).into_iter();
        for (size, reply) in sizes.into_iter().zip(replies) {
            // A caller that gave up (its request was dropped) just misses its answer.
            let _ = reply.send(verdicts.by_ref().take(size).collect());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::signing::{Signer, SigningKey, Verifier};
    use std::collections::HashMap;

    fn checks(verifier: &Verifier, signer: &Signer, n: usize, forged: &[usize]) -> Vec<Pending> {
        let now = 1_763_800_000;
        (0..n)
            .map(|i| {
                let id = format!("msg_{i}");
                let body = format!("{{\"n\":{i}}}");
                let sig = signer.sign(&id, now, body.as_bytes());
                let body = if forged.contains(&i) {
                    format!("{{\"n\":{}}}", i + 1000)
                } else {
                    body
                };
                verifier
                    .precheck(
                        "A",
                        Some(&id),
                        Some(&now.to_string()),
                        Some(&sig),
                        body.as_bytes(),
                        now,
                    )
                    .expect("cheap checks pass")
            })
            .collect()
    }

    fn ed_mesh() -> (Verifier, Signer) {
        let key = SigningKey::generate();
        let verifier = Verifier {
            pairwise: Default::default(),
            hmac: vec![],
            ed25519: HashMap::from([("A".to_string(), vec![key.public_key()])]),
        };
        let signer = Signer {
            pairwise: Default::default(),
            hmac: vec![],
            ed25519: vec![key],
        };
        (verifier, signer)
    }

    #[tokio::test]
    async fn coalesced_verdicts_match_single_ones_and_find_every_forgery() {
        let (verifier, signer) = ed_mesh();
        let pool = VerifyPool::start("t").unwrap();
        for (n, forged) in [
            (1, vec![]),
            (1, vec![0]),
            (2, vec![1]),
            (64, vec![]),
            (64, vec![0, 31, 63]),
            (100, vec![5, 6, 7, 99]),
            (9, (0..9).collect()),
        ] {
            let c = checks(&verifier, &signer, n, &forged);
            let single: Vec<_> = c.iter().map(Pending::finish).collect();
            let got = pool.verify(c).await;
            assert_eq!(got, single, "n={n} forged={forged:?}");
            for (i, v) in got.iter().enumerate() {
                assert_eq!(v.is_err(), forged.contains(&i), "n={n} item {i}");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_callers_each_get_their_own_verdicts() {
        let (verifier, signer) = ed_mesh();
        let pool = std::sync::Arc::new(VerifyPool::start("t").unwrap());
        let mut tasks = Vec::new();
        for t in 0..16usize {
            // Every third caller sends one forged envelope among its own.
            let forged: Vec<usize> = if t % 3 == 0 { vec![t % 4] } else { vec![] };
            let c = checks(&verifier, &signer, 4, &forged);
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move { (forged, pool.verify(c).await) }));
        }
        for t in tasks {
            let (forged, got) = t.await.unwrap();
            assert_eq!(got.len(), 4);
            for (i, v) in got.iter().enumerate() {
                assert_eq!(v.is_err(), forged.contains(&i), "{forged:?} {got:?}");
            }
        }
    }

    #[tokio::test]
    async fn rotation_and_hmac_checks_pass_through_the_pool() {
        // Two keys (a rotation) give two candidate pairs: verified one by one.
        let old = SigningKey::generate();
        let new = SigningKey::generate();
        let verifier = Verifier {
            pairwise: Default::default(),
            hmac: vec![],
            ed25519: HashMap::from([("A".to_string(), vec![old.public_key(), new.public_key()])]),
        };
        let signer = Signer {
            pairwise: Default::default(),
            hmac: vec![],
            ed25519: vec![new],
        };
        let pool = VerifyPool::start("t").unwrap();
        let got = pool.verify(checks(&verifier, &signer, 5, &[2])).await;
        let bad: Vec<bool> = got.iter().map(Result::is_err).collect();
        assert_eq!(bad, [false, false, true, false, false]);

        let secret = crate::wire::signing::HmacSecret::generate();
        let verifier = Verifier {
            pairwise: Default::default(),
            hmac: vec![secret.clone()],
            ed25519: HashMap::new(),
        };
        let signer = Signer {
            pairwise: Default::default(),
            hmac: vec![secret],
            ed25519: vec![],
        };
        let got = pool.verify(checks(&verifier, &signer, 3, &[0])).await;
        assert_eq!(
            got,
            vec![
                Err(VerifyError::BadSignature {
                    scheme: Scheme::Hmac
                }),
                Ok(Scheme::Hmac),
                Ok(Scheme::Hmac)
            ]
        );
    }
}
