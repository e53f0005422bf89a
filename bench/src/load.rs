//! The load: prepared HTTP POSTs, sent closed-loop (a fixed number in flight) or
//! open-loop at a fixed rate, and the payloads they carry.
//!
//! Requests are built and signed before the clock starts, so the bench's own signing
//! and serialization are not part of what is measured; the identical request list is
//! sent to the mesh and to the bare hyper baseline.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use botmesh::wire::envelope::{now_millis, Author, AuthorKind, Envelope, Kind, PROTOCOL_VERSION};
use botmesh::wire::signing::{Signer, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::record::{text, PhaseTable};

/// Bytes of chat text per message (the "realistic size").
pub const TEXT_BYTES: usize = 500;

/// One prepared POST.
pub struct Post {
    /// Full URL.
    pub url: String,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Bytes,
}

/// The outcome of sending a list of POSTs.
#[derive(Debug, Default, Clone, Serialize)]
pub struct HttpRun {
    /// Requests sent.
    pub sent: usize,
    /// 2xx answers.
    pub ok: usize,
    /// Answers by status code (transport errors under 0).
    pub statuses: BTreeMap<u16, usize>,
    /// From the first send to the last answer.
    #[serde(skip)]
    pub elapsed: Duration,
    /// Round-trip time of each answered request, ns.
    #[serde(skip)]
    pub rtt: Vec<u64>,
}

impl HttpRun {
    fn merge(&mut self, o: HttpRun) {
        self.sent += o.sent;
        self.ok += o.ok;
        for (k, v) in o.statuses {
            *self.statuses.entry(k).or_default() += v;
        }
        self.rtt.extend(o.rtt);
    }

    /// Answered requests per second.
    pub fn per_second(&self) -> f64 {
        per_second(self.ok, self.elapsed)
    }
}

/// `n` per `d`, 0 for an empty span.
pub fn per_second(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

async fn send_one(client: &reqwest::Client, p: &Post, run: &mut HttpRun) {
    let mut req = client
        .post(&p.url)
        .header("content-type", "application/json")
        .body(p.body.clone());
    for (k, v) in &p.headers {
        req = req.header(*k, v);
    }
    let t0 = Instant::now();
    run.sent += 1;
    let status = match req.send().await {
        Ok(r) => {
            let s = r.status().as_u16();
            // Read the answer to the end so the connection is reused.
            let _ = r.bytes().await;
            s
        }
        Err(_) => 0,
    };
    *run.statuses.entry(status).or_default() += 1;
    if (200..300).contains(&status) {
        run.ok += 1;
        run.rtt.push(t0.elapsed().as_nanos() as u64);
    }
}

/// Sends every post with `concurrency` in flight (closed loop); post `i` is marked
/// sent in `table` as message `i`. Stops early at `deadline`.
pub async fn closed_loop(
    client: &reqwest::Client,
    posts: Arc<Vec<Post>>,
    concurrency: usize,
    table: Option<Arc<PhaseTable>>,
    deadline: Instant,
) -> HttpRun {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let (client, posts, next, table) =
            (client.clone(), posts.clone(), next.clone(), table.clone());
        workers.push(tokio::spawn(async move {
            let mut run = HttpRun::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= posts.len() || Instant::now() > deadline {
                    break;
                }
                if let Some(t) = &table {
                    t.mark_sent(i);
                }
                send_one(&client, &posts[i], &mut run).await;
            }
            run
        }));
    }
    let mut total = HttpRun::default();
    for w in workers {
        if let Ok(r) = w.await {
            total.merge(r);
        }
    }
    total.elapsed = start.elapsed();
    total
}

/// Sends post `i` at `start + i / rate` (open loop: a slow answer does not delay the
/// next send), at most `max_in_flight` at once; marks sends in `table`.
pub async fn paced(
    client: &reqwest::Client,
    posts: Arc<Vec<Post>>,
    rate: f64,
    max_in_flight: usize,
    table: Arc<PhaseTable>,
    deadline: Instant,
) -> HttpRun {
    let permits = Arc::new(Semaphore::new(max_in_flight.max(1)));
    let total = Arc::new(Mutex::new(HttpRun::default()));
    let start = tokio::time::Instant::now();
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(posts.len());
    for i in 0..posts.len() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        if Instant::now() > deadline {
            break;
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let (client, posts, table, total) =
            (client.clone(), posts.clone(), table.clone(), total.clone());
        tasks.push(tokio::spawn(async move {
            let mut run = HttpRun::default();
            table.mark_sent(i);
            send_one(&client, &posts[i], &mut run).await;
            total.lock().expect("run lock").merge(run);
            drop(permit);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut run = std::mem::take(&mut *total.lock().expect("run lock"));
    run.elapsed = t0.elapsed();
    run
}

/// `n` posts of a human message to a node's `POST /v1/messages`.
pub fn api_posts(api: &str, phase: u32, n: usize) -> Vec<Post> {
    (0..n)
        .map(|i| Post {
            url: format!("{api}/v1/messages"),
            headers: vec![],
            body: Bytes::from(
                serde_json::to_vec(
                    &serde_json::json!({"text": text(phase, i, TEXT_BYTES), "from": "bench"}),
                )
                .expect("json"),
            ),
        })
        .collect()
}

/// Message `seq` of `phase` as an envelope: a human's (carried by `sender`, depth 0)
/// or `sender`'s own bot message (depth 1).
pub fn envelope(phase: u32, seq: usize, sender: &str, human: bool) -> Envelope {
    let id = ulid::Ulid::new();
    Envelope {
        v: PROTOCOL_VERSION,
        id,
        kind: Kind::Message,
        group: "demo".into(),
        sender: sender.into(),
        author: if human {
            Author {
                name: "bench".into(),
                kind: AuthorKind::Human,
            }
        } else {
            Author {
                name: sender.into(),
                kind: AuthorKind::Bot,
            }
        },
        text: text(phase, seq, TEXT_BYTES),
        depth: if human { 0 } else { 1 },
        reply_to: None,
        root: human.then_some(id),
        platform_msg_id: None,
        person: None,
        sent_at: now_millis(),
        relevance: None,
        why: None,
        verdicts: None,
        turn_end: None,
        replaces: None,
    }
}

/// `n` signed bot envelopes to bot `to` at `bridge` (base URL), exactly as a peer's
/// outbox sends them (with the pairwise entry for `to` when the signer has its key);
/// senders rotate over `senders` (name, signer).
pub fn bridge_posts(
    bridge: &str,
    to: &str,
    phase: u32,
    n: usize,
    senders: &[(String, Signer)],
) -> Vec<Post> {
    let ts = botmesh::wire::signing::unix_now();
    (0..n)
        .map(|i| {
            let (name, signer) = &senders[i % senders.len()];
            let env = envelope(phase, i, name, false);
            let body = env.to_bytes();
            let id = env.id.to_string();
            Post {
                url: format!("{bridge}{}", botmesh::wire::limits::ENVELOPES_PATH),
                headers: vec![
                    (HEADER_ID, id.clone()),
                    (HEADER_TIMESTAMP, ts.to_string()),
                    (HEADER_SIGNATURE, signer.sign_for(to, &id, ts, &body)),
                ],
                body: Bytes::from(body),
            }
        })
        .collect()
}

/// The same posts aimed at another base URL (the hyper baseline gets identical bytes).
pub fn retarget(posts: &[Post], from: &str, to: &str) -> Vec<Post> {
    posts
        .iter()
        .map(|p| Post {
            url: p.url.replacen(from, to, 1),
            headers: p.headers.clone(),
            body: p.body.clone(),
        })
        .collect()
}

/// Average request size (body + extra headers), bytes.
pub fn mean_size(posts: &[Post]) -> usize {
    if posts.is_empty() {
        return 0;
    }
    posts
        .iter()
        .map(|p| {
            p.body.len()
                + p.headers
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 4)
                    .sum::<usize>()
        })
        .sum::<usize>()
        / posts.len()
}
