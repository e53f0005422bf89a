//! Relayed copies arriving at this node (see [`crate::egress::relay`] for the sending
//! side): as the relay, a copy is checked like any delivery and forwarded unaltered
//! to its destination; as the destination, it is admitted and answered with a receipt
//! signed by this node, so the origin knows it really arrived.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::egress::relay::receipt_id;
use crate::ingress::bridge::Reject;
use crate::ingress::ingest::Ingest;
use crate::ingress::server::{self, Body};
use crate::store::transcript::Appended;
use crate::wire::envelope::Envelope;
use crate::wire::limits::{HEADER_HOPS, HEADER_RELAYED_BY, HEADER_RELAY_TO};
use crate::wire::signing::{HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP};

/// A relay request's headers, parsed.
struct RelayHeaders {
    to: String,
    hops: u32,
    relayed_by: Option<String>,
}

fn relay_headers(headers: &HeaderMap) -> Result<RelayHeaders, Reject> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let to = get(HEADER_RELAY_TO)
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            Reject(
                StatusCode::BAD_REQUEST,
                "relay_bad_header",
                format!("{HEADER_RELAY_TO} is empty or not text"),
            )
        })?
        .to_string();
    let hops = get(HEADER_HOPS)
        .and_then(|h| h.trim().parse::<u32>().ok())
        .filter(|h| *h >= 1)
        .ok_or_else(|| {
            Reject(
                StatusCode::BAD_REQUEST,
                "relay_bad_header",
                format!("{HEADER_HOPS} must be a number >= 1"),
            )
        })?;
    Ok(RelayHeaders {
        to,
        hops,
        relayed_by: get(HEADER_RELAYED_BY).map(str::to_string),
    })
}

/// `POST /bridge/v1/envelopes` with `botmesh-relay-to`: this node is either the relay
/// (forward, unaltered) or the destination (admit and answer with a signed receipt).
pub(crate) async fn receive(
    ingest: Ingest,
    req: Request<Incoming>,
    remote: std::net::SocketAddr,
) -> Response<Body> {
    let id = req
        .headers()
        .get(HEADER_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    match receive_inner(&ingest, req, remote).await {
        Ok(resp) => resp,
        Err(reject) => reject.respond(&ingest, remote, &id, true),
    }
}

async fn receive_inner(
    ingest: &Ingest,
    req: Request<Incoming>,
    remote: std::net::SocketAddr,
) -> Result<Response<Body>, Reject> {
    let me = ingest.cfg.bot().name.clone();
    let max = ingest.cfg.mesh().max_relay_hops;
    let relay = relay_headers(req.headers())?;
    let destination = relay.to == me;
    // Cheap refusals first: a relay this node must not perform costs no signature check.
    if !destination {
        if max == 0 {
            ingest
                .metrics
                .relayed("relay", &relay.to, "refused_disabled");
            return Err(Reject(
                StatusCode::FORBIDDEN,
                "relay_disabled",
                "this node relays nothing (mesh.max_relay_hops = 0)".into(),
            ));
        }
        if ingest.cfg.member(&relay.to).is_none() {
            return Err(Reject(
                StatusCode::BAD_REQUEST,
                "relay_unknown_target",
                format!("{:?} is not a bot in peers.toml", relay.to),
            ));
        }
    }
    if relay.hops > max.max(1) {
        ingest.metrics.relayed(
            if destination { "destination" } else { "relay" },
            &relay.to,
            "refused_hop_limit",
        );
        return Err(Reject(
            StatusCode::FORBIDDEN,
            "relay_hop_limit",
            format!(
                "copy has taken {} relay hops; the limit is {}",
                relay.hops,
                max.max(1)
            ),
        ));
    }
    let (parts, body) = crate::ingress::bridge::read_envelope_body(req).await?;
    // The full gauntlet, as for a direct delivery: only the original sender's
    // signature over these exact bytes gets past it.
    let (env, outcome) =
        crate::ingress::bridge::admit_posted(ingest, &parts.headers, &body, remote.ip()).await?;
    let result = match outcome {
        Appended::New => "accepted",
        Appended::Duplicate => "duplicate",
    };
    ingest.metrics.envelope_in(result);
    if destination {
        ingest.metrics.relayed("destination", &env.sender, result);
        tracing::info!(%remote, sender = %env.sender, id = %env.id, relayed_by = relay.relayed_by.as_deref().unwrap_or("-"), hops = relay.hops, result, "relayed envelope (sender's signature verified)");
        return Ok(signed_receipt(ingest, &env, result));
    }
    if env.sender == relay.to {
        return Err(Reject(
            StatusCode::BAD_REQUEST,
            "relay_loop",
            format!(
                "a copy of {}'s envelope cannot be relayed back to it",
                env.sender
            ),
        ));
    }
    Ok(forward(ingest, &parts.headers, body, &env, &relay, &me).await)
}

/// Forwards a verified copy to its destination, untouched, and passes the answer back.
async fn forward(
    ingest: &Ingest,
    headers: &HeaderMap,
    body: Bytes,
    env: &Envelope,
    relay: &RelayHeaders,
    me: &str,
) -> Response<Body> {
    let Some(relayer) = ingest.relay.as_ref() else {
        return server::error(StatusCode::SERVICE_UNAVAILABLE, "relay not started");
    };
    let Some((url, link)) = relayer.direct(&relay.to) else {
        return server::error(StatusCode::BAD_REQUEST, "relay target is this node");
    };
    if let Some(down) = link.failing_for() {
        ingest.metrics.relayed("relay", &relay.to, "unreachable");
        tracing::warn!(sender = %env.sender, id = %env.id, to = %relay.to, down_ms = down.as_millis() as u64, "cannot relay: this node's own link to the destination is failing");
        return server::json(
            StatusCode::BAD_GATEWAY,
            &serde_json::json!({"error": "relay_unreachable", "detail": format!("{me} cannot reach {} either", relay.to)}),
        );
    }
    let mut req = relayer
        .http()
        .post(url)
        .timeout(Duration::from_millis(ingest.cfg.mesh().peer_timeout_ms))
        .header(HEADER_RELAY_TO, &relay.to)
        .header(HEADER_HOPS, relay.hops.to_string())
        .header(HEADER_RELAYED_BY, me)
        .header("content-type", "application/json")
        .body(body);
    for name in [HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE] {
        if let Some(v) = headers.get(name) {
            req = req.header(name, v);
        }
    }
    let sent = req.send().await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            ingest.metrics.relayed("relay", &relay.to, "unreachable");
            tracing::warn!(sender = %env.sender, id = %env.id, to = %relay.to, error = %e, "relay could not reach the destination");
            return server::json(
                StatusCode::BAD_GATEWAY,
                &serde_json::json!({"error": "relay_unreachable", "detail": e.to_string()}),
            );
        }
    };
    let status = resp.status();
    let mut passed = HeaderMap::new();
    for name in [HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE] {
        if let Some(v) = resp.headers().get(name) {
            passed.insert(name, v.clone());
        }
    }
    let bytes = resp.bytes().await.unwrap_or_default();
    let result = if status.is_success() {
        "forwarded"
    } else {
        "refused_by_destination"
    };
    ingest.metrics.relayed("relay", &relay.to, result);
    tracing::info!(sender = %env.sender, id = %env.id, to = %relay.to, status = status.as_u16(), result, "relayed envelope forwarded unaltered");
    let mut out = Response::new(server::full(bytes));
    *out.status_mut() = status;
    out.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    out.headers_mut().extend(passed);
    out
}

/// The destination's answer to a relayed copy, signed with its own key so the origin
/// can tell it really arrived.
fn signed_receipt(ingest: &Ingest, env: &Envelope, result: &str) -> Response<Body> {
    let me = &ingest.cfg.bot().name;
    let id = env.id.to_string();
    let body = serde_json::to_vec(&serde_json::json!({
        result: true,
        "receipt": {"for": id, "by": me, "result": result},
    }))
    .expect("json");
    let rid = receipt_id(&id);
    let ts = crate::wire::signing::unix_now();
    let sig = ingest.cfg.signer.sign(&rid, ts, &body);
    let mut resp = Response::new(server::full(Bytes::from(body)));
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for (name, value) in [
        (HEADER_ID, rid),
        (HEADER_TIMESTAMP, ts.to_string()),
        (HEADER_SIGNATURE, sig),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    resp
}
