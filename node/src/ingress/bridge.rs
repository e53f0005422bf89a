//! The HTTP bridge: `POST /bridge/v1/envelopes` and `POST /bridge/v1/batch` on the
//! peer-facing listener (routed by `app`), and the admission checks every envelope
//! passes, whichever transport carried it.
//!
//! Every request runs the same gauntlet, cheapest check first, and every rejection is
//! counted and logged with its reason, the peer address and the id (never a secret):
//! size (413) → headers (401) → JSON shape (400) → id match (400) → known sender (403)
//! → rate limit of the sender at this source address (429) → signature and timestamp
//! window (401) → author rules (403) → replay/duplicate (200 duplicate) → transcript
//! (200 accepted). The rate limit comes before the signature: an unknown sender, or a
//! source over its limit, costs this node no Ed25519 verification at all.
//!
//! The answer to an admitted claim (new or duplicate) also says whether this node's
//! bot has already committed to answer, or answered, the claim's trigger:
//! `{"accepted": true, "answered": "<bot>"}` (and `"answered"` in a batch item's
//! result). It is read from the claim board *after* the claim is on it, so a commit
//! either saw the claim or is reported here (see `turn::scheduler`, [`crate::egress::acks`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::ingress::ingest::Ingest;
use crate::ingress::server::{self, Body, BodyError};
use crate::store::transcript::{Appended, Received, TranscriptError};
use crate::wire::envelope::{AuthorKind, Envelope, Kind};
use crate::wire::limits::MAX_BODY_BYTES;
use crate::wire::signing::{
    Pending, Scheme, VerifyError, HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP,
};

/// `POST /bridge/v1/envelopes`: one signed envelope (or a relayed copy).
pub(crate) async fn receive(
    ingest: Ingest,
    req: Request<Incoming>,
    remote: SocketAddr,
) -> Response<Body> {
    if req
        .headers()
        .contains_key(crate::wire::limits::HEADER_RELAY_TO)
    {
        return crate::ingress::relayed::receive(ingest, req, remote).await;
    }
    // Kept for a rejection's log line: a header value's clone shares its bytes.
    let header_id = req.headers().get(HEADER_ID).cloned();
    match gauntlet(&ingest, req, remote.ip()).await {
        Ok((env, outcome)) => {
            let result = match outcome {
                Appended::New => "accepted",
                Appended::Duplicate => "duplicate",
            };
            ingest.metrics.envelope_in(result);
            // Routine: every accepted envelope is in the transcript and counted; the log
            // keeps rejections and decisions at info (10 % of a receiver's CPU under load).
            tracing::debug!(%remote, sender = %env.sender, id = %env.id, kind = ?env.kind, group = %env.group, depth = env.depth, result, "envelope");
            let reply = ingest.sink.answer_claim(&env);
            if reply.answered.is_none() && !reply.judging {
                // The usual answer (a message, or a claim with no news): a constant
                // body, no JSON value built per envelope.
                let body: &'static [u8] = match outcome {
                    Appended::New => br#"{"accepted":true}"#,
                    Appended::Duplicate => br#"{"duplicate":true}"#,
                };
                return server::text(StatusCode::OK, "application/json", body);
            }
            let mut answer = match outcome {
                Appended::New => serde_json::json!({"accepted": true}),
                Appended::Duplicate => serde_json::json!({"duplicate": true}),
            };
            if let Some(bot) = reply.answered {
                answer["answered"] = bot.into();
            }
            if reply.judging {
                answer["judging"] = true.into();
            }
            server::json(StatusCode::OK, &answer)
        }
        Err(reject) => {
            let id = header_id.as_ref().and_then(|v| v.to_str().ok());
            reject.respond(&ingest, remote, id.unwrap_or("-"), false)
        }
    }
}

async fn gauntlet(
    ingest: &Ingest,
    req: Request<Incoming>,
    source: IpAddr,
) -> Result<(Arc<Envelope>, Appended), Reject> {
    let (parts, body) = read_envelope_body(req).await?;
    admit_posted(ingest, &parts.headers, &body, source).await
}

/// Reads a posted envelope's body, up to [`MAX_BODY_BYTES`]: a larger one is refused
/// 413 before it is buffered, an unreadable one 400.
pub(crate) async fn read_envelope_body(
    req: Request<Incoming>,
) -> Result<(http::request::Parts, bytes::Bytes), Reject> {
    server::read_body(req, MAX_BODY_BYTES)
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { .. } => {
                Reject(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.to_string())
            }
            BodyError::Read(_) => Reject(StatusCode::BAD_REQUEST, "unreadable", e.to_string()),
        })
}

/// [`admit_many`] for one envelope POSTed to this node from `source`, directly or through a
/// relay ([`crate::egress::relay`]): its signature values are headers, `now` is the
/// wall clock.
pub(crate) async fn admit_posted(
    ingest: &Ingest,
    headers: &http::HeaderMap,
    body: &bytes::Bytes,
    source: IpAddr,
) -> Result<(Arc<Envelope>, Appended), Reject> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let signed = Signed {
        id: header(HEADER_ID),
        timestamp: header(HEADER_TIMESTAMP),
        signature: header(HEADER_SIGNATURE),
    };
    let arrival = Arrival {
        signed,
        body: SignedBytes::Shared(body),
        now: (crate::wire::envelope::now_millis() / 1000) as i64,
    };
    admit_many(ingest, &[arrival], Via::Http { source })
        .await
        .pop()
        .expect("one result per arrival")
}

/// The three Standard Webhooks values that travel beside an envelope's bytes: HTTP
/// headers on the bridge, entry fields on a Redis Stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signed<'a> {
    /// `webhook-id`: must equal the envelope's id.
    pub id: Option<&'a str>,
    /// `webhook-timestamp`: unix seconds when it was signed.
    pub timestamp: Option<&'a str>,
    /// `webhook-signature`: the sender's signatures over `id.timestamp.body`.
    pub signature: Option<&'a str>,
}

/// Which transport carried an envelope. The checks are the same; only what "now" is
/// and whether the per-peer rate limit applies differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// POSTed by a peer: `now` is the wall clock, and the sender is rate-limited per
    /// source address (it pushes, so a flood must be pushed back with 429), before its
    /// signature is checked.
    Http {
        /// The address the request came from (a relay's, for a relayed copy): the
        /// sender's budget is kept per address, so a forger elsewhere who names a peer
        /// as the sender spends its own budget, not the peer's.
        source: IpAddr,
    },
    /// Read from a Redis Stream: `now` is when Redis stored the entry (so a bot that
    /// catches up after downtime still accepts what was fresh when written, while a
    /// re-added old entry is stale), and no rate limit (the node pulls at its own pace).
    Stream,
}

/// A rejected envelope: status (the HTTP answer), reason code for metrics, and a
/// human-readable detail for logs.
#[derive(Debug)]
pub(crate) struct Reject(pub StatusCode, pub &'static str, pub String);

impl Reject {
    /// Counts and logs the rejection, then answers the peer with its status and reason.
    pub(crate) fn respond(
        self,
        ingest: &Ingest,
        remote: SocketAddr,
        id: &str,
        relayed: bool,
    ) -> Response<Body> {
        let Reject(status, code, detail) = self;
        ingest.metrics.envelope_in(code);
        if crate::telemetry::refusals::REFUSALS.admit("bridge", code) {
            tracing::warn!(%remote, id, relayed, status = status.as_u16(), reason = code, %detail, "envelope rejected");
        }
        server::json(
            status,
            &serde_json::json!({"error": code, "detail": detail}),
        )
    }
}

/// An envelope that passed the cheap checks, with its signature check still to do.
pub(crate) struct Prechecked {
    /// The parsed envelope.
    env: Envelope,
    /// Its signature check, to decide on the [`crate::ingress::verify_pool::VerifyPool`].
    signature: Pending,
}

/// [`admit_many`]'s checks up to the signature: headers, JSON shape, id match, known
/// sender, the rate limit (HTTP: a token of the sender's at this source is taken
/// here, before any signature is looked at), timestamp window, and the signature
/// entries' form and number. A batch's items are all prechecked before their
/// signatures are verified together.
pub(crate) fn precheck(
    ingest: &Ingest,
    signed: Signed<'_>,
    body: &[u8],
    now: i64,
    via: Via,
) -> Result<Prechecked, Reject> {
    for (name, value) in [
        (HEADER_ID, signed.id),
        (HEADER_TIMESTAMP, signed.timestamp),
        (HEADER_SIGNATURE, signed.signature),
    ] {
        if value.is_none() {
            return Err(Reject(
                StatusCode::UNAUTHORIZED,
                "missing_header",
                format!("missing {name}"),
            ));
        }
    }
    let env = Envelope::parse(body)
        .map_err(|e| Reject(StatusCode::BAD_REQUEST, "malformed", e.to_string()))?;
    // Compared as text, without an allocation: the signature covers the header's id.
    let mut id_text = [0u8; ulid::ULID_LEN];
    if signed.id != Some(&*env.id.array_to_str(&mut id_text)) {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            "id_mismatch",
            "webhook-id does not equal the body's id".into(),
        ));
    }
    let cfg = &ingest.cfg;
    if via == Via::Stream && env.sender == cfg.bot().name {
        // The stream carries this node's own envelopes back to it.
        return Err(Reject(StatusCode::OK, "own", String::new()));
    }
    let is_peer = |b: &&crate::config::BotSettings| b.name != cfg.bot().name;
    if cfg.member(&env.sender).filter(is_peer).is_none() {
        return Err(Reject(
            StatusCode::FORBIDDEN,
            "unknown_sender",
            format!("sender {:?} is not a peer in peers.toml", env.sender),
        ));
    }
    if let Via::Http { source } = via {
        if !ingest.limiter.allow(&env.sender, source) {
            return Err(Reject(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "{} is over {} envelopes/s from {source}",
                    env.sender,
                    cfg.mesh().peer_rate_limit
                ),
            ));
        }
    }
    let signature = ingest
        .cfg
        .verifier
        .precheck(
            &env.sender,
            signed.id,
            signed.timestamp,
            signed.signature,
            body,
            now,
        )
        .map_err(unauthorized)?;
    Ok(Prechecked { env, signature })
}

fn unauthorized(e: VerifyError) -> Reject {
    Reject(StatusCode::UNAUTHORIZED, e.reason_code(), e.to_string())
}

/// [`admit_many`]'s checks after the signature's `verdict`: author rules, replay cache;
/// nothing is recorded yet.
pub(crate) fn postcheck(
    ingest: &Ingest,
    env: Envelope,
    verdict: Result<Scheme, VerifyError>,
) -> Result<Checked, Reject> {
    let scheme = verdict.map_err(unauthorized)?;
    ingest.metrics.signature_verified(scheme);
    let cfg = &ingest.cfg;
    let Some(sender) = cfg.member(&env.sender) else {
        unreachable!("precheck found the sender among the peers")
    };
    match env.author.kind {
        AuthorKind::Bot if env.author.name != env.sender => {
            return Err(Reject(
                StatusCode::FORBIDDEN,
                "author_not_sender",
                format!("{} may not send as bot {:?}", env.sender, env.author.name),
            ));
        }
        AuthorKind::Human if !ingest.humans.carriers.contains(&sender.name) => {
            return Err(Reject(
                StatusCode::FORBIDDEN,
                "human_from_platform_bot",
                format!(
                    "{} is on {:?}, which shows humans to every bot: they arrive through the platform, not the bridge",
                    env.sender, sender.platform
                ),
            ));
        }
        AuthorKind::Human if cfg.bot_named_like(&env.author.name).is_some() => {
            return Err(Reject(
                StatusCode::FORBIDDEN,
                "human_named_as_bot",
                format!(
                    "a human may not use a name that reads as a bot's ({:?}; case, width and invisible characters aside)",
                    env.author.name
                ),
            ));
        }
        _ => {}
    }
    if ingest.seen.contains(&env.id) {
        return Ok(Checked::Duplicate(Arc::new(env)));
    }
    Ok(Checked::Fresh(Arc::new(env)))
}

/// Records admitted envelopes (each with the bytes it was signed as), in order: claims
/// and verdicts go to the scheduler, messages to the transcript in one durable write.
/// One result per envelope, in the same order.
async fn commit(
    ingest: &Ingest,
    envs: Vec<(Arc<Envelope>, bytes::Bytes)>,
    via: Via,
) -> Vec<Result<Appended, Reject>> {
    let mut out: Vec<Option<Result<Appended, Reject>>> = Vec::with_capacity(envs.len());
    let mut messages = Vec::new();
    let mut slots = Vec::new();
    for (env, signed) in envs {
        match env.kind {
            Kind::Claim | Kind::Verdict => {
                out.push(Some(Ok(if ingest.seen.insert(env.id) {
                    ingest.sink.on_claim(env.clone());
                    Appended::New
                } else {
                    Appended::Duplicate
                })));
            }
            Kind::Message if env.is_human() && ingest.humans.platform_delivers_humans => {
                // This node's platform delivers humans itself; the bridge copy would be a second one.
                ingest.seen.insert(env.id);
                tracing::info!(id = %env.id, sender = %env.sender, "ignoring bridge copy of a human message (platform delivers humans)");
                out.push(Some(Ok(Appended::Duplicate)));
            }
            // A bot's status is recorded (shown as status); triage never takes it up.
            Kind::Message | Kind::Status => {
                slots.push((out.len(), env.id));
                out.push(None);
                messages.push(Received { env, signed });
            }
        }
    }
    if !messages.is_empty() {
        let source = match via {
            Via::Http { .. } => "bridge",
            Via::Stream => "stream",
        };
        let recorded = ingest.sink.record_many(messages, source).await;
        for ((slot, id), r) in slots.into_iter().zip(recorded) {
            out[slot] = Some(match r {
                Ok(outcome) => {
                    ingest.seen.insert(id);
                    Ok(outcome)
                }
                // Permanent for the sender (its outbox gives up on a 400 rather than
                // hold every later envelope behind this one for a day of retries).
                Err(e @ TranscriptError::TooManyGroups { .. }) => Err(Reject(
                    StatusCode::BAD_REQUEST,
                    "too_many_groups",
                    e.to_string(),
                )),
                Err(e) => Err(Reject(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage",
                    e.to_string(),
                )),
            });
        }
    }
    out.into_iter()
        .map(|r| r.expect("every envelope has a result"))
        .collect()
}

/// An envelope that passed every check up to the replay cache.
pub(crate) enum Checked {
    /// Not seen before: to be recorded.
    Fresh(Arc<Envelope>),
    /// Its id was already accepted.
    Duplicate(Arc<Envelope>),
}

/// `POST /bridge/v1/batch` (see [`crate::wire::batch`]): every item runs the same checks as
/// a single post, in order; new messages are recorded in one durable write.
pub(crate) async fn receive_batch(
    ingest: Ingest,
    req: Request<Incoming>,
    remote: SocketAddr,
) -> Response<Body> {
    let refuse = |status: StatusCode, code: &'static str, detail: String| {
        ingest.metrics.envelope_in(code);
        if crate::telemetry::refusals::REFUSALS.admit("bridge", code) {
            tracing::warn!(%remote, status = status.as_u16(), reason = code, %detail, "batch rejected");
        }
        server::json(
            status,
            &serde_json::json!({"error": code, "detail": detail}),
        )
    };
    let body = match server::read_body(req, MAX_BODY_BYTES).await {
        Ok((_, body)) => body,
        Err(e @ BodyError::TooLarge { .. }) => {
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.to_string())
        }
        Err(e) => return refuse(StatusCode::BAD_REQUEST, "unreadable", e.to_string()),
    };
    let batch = match crate::wire::batch::parse(&body) {
        Ok(b) => b,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "malformed_batch",
                format!("not a batch: {e}"),
            )
        }
    };
    if batch.items.is_empty() || batch.items.len() > crate::wire::batch::MAX_ITEMS {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_items",
            format!(
                "{} items; a batch holds 1 to {}",
                batch.items.len(),
                crate::wire::batch::MAX_ITEMS
            ),
        );
    }
    let now = (crate::wire::envelope::now_millis() / 1000) as i64;
    let arrivals: Vec<Arrival> = batch
        .items
        .iter()
        .map(|item| Arrival {
            signed: Signed {
                id: Some(&item.id),
                timestamp: Some(&item.timestamp),
                signature: Some(&item.signature),
            },
            body: SignedBytes::Borrowed(item.body.as_bytes()),
            now,
        })
        .collect();
    let results = admit_many(
        &ingest,
        &arrivals,
        Via::Http {
            source: remote.ip(),
        },
    )
    .await;
    let mut answers = Vec::with_capacity(results.len());
    for (item, r) in batch.items.iter().zip(results) {
        answers.push(answer(&ingest, remote, &item.id, r));
    }
    server::json(StatusCode::OK, &serde_json::json!({ "results": answers }))
}

/// What [`admit_many`] made of one envelope.
pub(crate) type Admitted = Result<(Arc<Envelope>, Appended), Reject>;

/// One envelope of several that arrived together, for [`admit_many`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrival<'a> {
    /// Its signature values.
    pub signed: Signed<'a>,
    /// Its bytes as signed.
    pub body: SignedBytes<'a>,
    /// The time its timestamp is checked against (see [`Via`]).
    pub now: i64,
}

/// An arrival's bytes as signed, and whether the transport read them into a buffer of
/// their own: the transcript line is then that buffer, not a copy.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SignedBytes<'a> {
    /// The request body of a POST, kept whole: the line shares it.
    Shared(&'a bytes::Bytes),
    /// Part of something larger (a batch item, a stream entry): the line is a copy.
    Borrowed(&'a [u8]),
}

impl SignedBytes<'_> {
    /// The bytes, for parsing and the signature check.
    fn bytes(&self) -> &[u8] {
        match self {
            SignedBytes::Shared(b) => b,
            SignedBytes::Borrowed(b) => b,
        }
    }

    /// The bytes as the transcript line: the buffer itself when it is one of its own.
    fn line(&self) -> bytes::Bytes {
        match self {
            SignedBytes::Shared(b) => (*b).clone(),
            SignedBytes::Borrowed(b) => bytes::Bytes::copy_from_slice(b),
        }
    }
}

/// The checks every envelope passes, whichever transport carried it (headers → JSON
/// shape → id match → known sender → rate limit (HTTP) → signature and timestamp
/// window → author rules → replay/duplicate → transcript), for envelopes that arrived
/// together and must be recorded in their order (a single POST, a batch POST, one
/// read of a Redis Stream): the cheap checks of each first (the
/// rate limit among them), then all their signatures in one verification, then the
/// rest of the checks in order, then every new message in one durable write. A
/// retryable rejection (flow control, storage) stops the rest, answered
/// `not_processed`, so nothing overtakes an item that must come again; an item after
/// a rate-limited one is not even prechecked, so a flood over its limit costs no
/// signature check. One result per arrival, in the same order.
///
/// Calling this once per arrival is not the same: an arrival whose signature
/// happened to be decided sooner would be recorded before the ones ahead of it.
pub(crate) async fn admit_many(
    ingest: &Ingest,
    arrivals: &[Arrival<'_>],
    via: Via,
) -> Vec<Admitted> {
    let n = arrivals.len();
    let mut prechecked: Vec<Result<Envelope, Reject>> = Vec::with_capacity(n);
    let mut signatures = Vec::with_capacity(n);
    let mut held_back = false;
    for a in arrivals {
        if held_back {
            prechecked.push(Err(not_processed()));
            continue;
        }
        let pre = precheck(ingest, a.signed, a.body.bytes(), a.now, via);
        if let Err(r) = &pre {
            held_back = holds_back(r.0);
        }
        prechecked.push(pre.map(|p| {
            signatures.push(p.signature);
            p.env
        }));
    }
    let pairs: usize = signatures.iter().map(Pending::ed25519_pairs).sum();
    ingest.metrics.ed25519_checks(pairs);
    let mut verdicts = ingest.verify.verify(signatures).await.into_iter();
    let mut results: Vec<Option<Admitted>> = (0..n).map(|_| None).collect();
    let mut fresh = Vec::new();
    // Where each fresh envelope's result goes, and the envelope for it.
    let mut fresh_at = Vec::new();
    let mut stopped = false;
    for (i, pre) in prechecked.into_iter().enumerate() {
        let pre = pre.map(|env| (env, verdicts.next().expect("a verdict per prechecked item")));
        if stopped {
            results[i] = Some(Err(not_processed()));
            continue;
        }
        match pre.and_then(|(env, verdict)| postcheck(ingest, env, verdict)) {
            Ok(Checked::Fresh(env)) => {
                fresh_at.push((i, env.clone()));
                fresh.push((env, arrivals[i].body.line()));
            }
            Ok(Checked::Duplicate(env)) => results[i] = Some(Ok((env, Appended::Duplicate))),
            Err(r) => {
                // Flow control and storage trouble stop the rest, so nothing behind this
                // item overtakes it; a verdict on this item alone does not.
                stopped = holds_back(r.0);
                results[i] = Some(Err(r));
            }
        }
    }
    let committed = commit(ingest, fresh, via).await;
    let mut storage_failed = false;
    for ((i, env), r) in fresh_at.into_iter().zip(committed) {
        // An item recorded after one that failed to store would overtake it.
        if storage_failed {
            if let Ok(Appended::New) = r {
                tracing::warn!(id = %env.id, "envelope recorded after an earlier one failed to store (it will come again and be a duplicate)");
            }
        }
        storage_failed |= r.is_err();
        results[i] = Some(r.map(|o| (env, o)));
    }
    results
        .into_iter()
        .map(|r| r.expect("every arrival has a result"))
        .collect()
}

/// The reason given for an envelope [`admit_many`] did not look at because one ahead
/// of it must be retried first.
pub(crate) const NOT_PROCESSED: &str = "not_processed";

/// The answer for an envelope behind one that must be retried first.
fn not_processed() -> Reject {
    Reject(
        StatusCode::SERVICE_UNAVAILABLE,
        NOT_PROCESSED,
        "an earlier envelope must be retried first".into(),
    )
}

/// Whether a rejection of one item stops the rest of its batch (retryable conditions).
fn holds_back(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error()
}

/// Counts, logs and words one batch item's result, as [`receive`] does for a single post.
fn answer(
    ingest: &Ingest,
    remote: SocketAddr,
    header_id: &str,
    r: Admitted,
) -> crate::wire::batch::ItemResult {
    match r {
        Ok((env, outcome)) => {
            let result = match outcome {
                Appended::New => "accepted",
                Appended::Duplicate => "duplicate",
            };
            ingest.metrics.envelope_in(result);
            tracing::debug!(%remote, sender = %env.sender, id = %env.id, kind = ?env.kind, group = %env.group, depth = env.depth, result, batch = true, "envelope");
            let reply = ingest.sink.answer_claim(&env);
            crate::wire::batch::ItemResult {
                status: 200,
                result: result.into(),
                detail: None,
                answered: reply.answered,
                judging: reply.judging,
            }
        }
        Err(Reject(status, code, detail)) => {
            ingest.metrics.envelope_in(code);
            if code != NOT_PROCESSED && crate::telemetry::refusals::REFUSALS.admit("bridge", code) {
                tracing::warn!(%remote, id = header_id, status = status.as_u16(), reason = code, %detail, batch = true, "envelope rejected");
            }
            crate::wire::batch::ItemResult {
                status: status.as_u16(),
                result: code.into(),
                detail: Some(detail),
                answered: None,
                judging: false,
            }
        }
    }
}
