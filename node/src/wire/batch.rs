//! Batched delivery: several signed envelopes in one `POST /bridge/v1/batch`.
//!
//! A batch is only a container: it is not signed itself. Each item carries the three
//! Standard Webhooks values that a single `POST /bridge/v1/envelopes` carries as
//! headers (`id`, `timestamp`, `signature`, verbatim) and the envelope's exact bytes as
//! a JSON string, so the receiver runs the same [`crate::ingress::bridge::admit_many`] checks on every
//! item, with the same rejection codes, as if it had been posted alone:
//!
//! ```json
//! {"items": [{"id": "01JD…", "timestamp": "1763800000", "signature": "v1a,…",
//!             "body": "{\"v\":1,\"id\":\"01JD…\",…}"}, …]}
//! ```
//!
//! The answer is `200` with one result per item, in order:
//!
//! ```json
//! {"results": [{"status": 200, "result": "accepted"},
//!              {"status": 200, "result": "duplicate"},
//!              {"status": 200, "result": "accepted", "answered": "Mid"},
//!              {"status": 401, "result": "bad_signature", "detail": "…"},
//!              {"status": 503, "result": "not_processed", "detail": "…"}]}
//! ```
//!
//! The receiver handles the items in order. A verdict on one item (400, 401, 403, 413)
//! does not hold back the items behind it. An item answered 429 or 5xx (rate limit,
//! storage) stops the batch: every later item is answered `503 not_processed`, so no
//! item overtakes one that must be retried. The sender pops the answered prefix
//! (200 delivered, 400/413 given up, as for single posts) up to the first item to
//! retry, and sends the rest again. The request as a whole is refused with `413` over
//! 256 KiB or [`MAX_ITEMS`] items and `400` when it is not this shape. A receiver that
//! predates batches answers `404`: the sender then posts one envelope at a time.
//!
//! An accepted (or duplicate) *claim* whose trigger this node's bot has committed to
//! answer, or answered, carries `"answered": "<bot>"` (as a single post's answer does,
//! see [`crate::egress::acks`]): the claimant then yields instead of posting a second answer.
//! Senders that predate it ignore the field; receivers that predate it never send it.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// The bridge path batches are posted to.
pub(crate) const BATCH_PATH: &str = "/bridge/v1/batch";

/// The most items a receiver accepts in one batch (a sender sends at most
/// `mesh.batch_max`, 64 by default).
pub(crate) const MAX_ITEMS: usize = 256;

/// A sender keeps an encoded batch under this many bytes, well under the receiver's
/// 256 KiB body limit.
pub(crate) const MAX_BATCH_BYTES: usize = 128 * 1024;

/// One envelope in a batch: its signature values and exact bytes.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Item<'a> {
    /// `webhook-id`: must equal the envelope's id.
    #[serde(borrow)]
    pub id: Cow<'a, str>,
    /// `webhook-timestamp`: unix seconds, as text.
    #[serde(borrow)]
    pub timestamp: Cow<'a, str>,
    /// `webhook-signature`: over `id.timestamp.body`.
    #[serde(borrow)]
    pub signature: Cow<'a, str>,
    /// The envelope JSON, byte for byte.
    #[serde(borrow)]
    pub body: Cow<'a, str>,
}

/// What a node answers a peer's claim: whether its bot already answers the trigger,
/// or is still judging it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimReply {
    /// This node's bot, when it committed to answer (or answered) the trigger.
    pub answered: Option<String>,
    /// This node's judge about the trigger is still out: it owes the claimant a word.
    pub judging: bool,
}

/// A batch request.
#[derive(Debug, Deserialize)]
pub(crate) struct Request<'a> {
    /// The envelopes, in send order.
    #[serde(borrow)]
    pub items: Vec<Item<'a>>,
}

/// The answer for one item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ItemResult {
    /// The HTTP status a single post of this item would have got.
    pub status: u16,
    /// `accepted`, `duplicate` or the rejection reason code.
    pub result: String,
    /// Why, for rejections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For an admitted claim: the receiving node's bot, when it has already committed
    /// to answer (or answered) the claim's trigger, so the claimant yields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered: Option<String>,
    /// For a claim: the receiving node's own judge about the trigger is still out, so
    /// the claimant waits for its word (claim or withdrawal) before it commits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub judging: bool,
}

/// A batch answer.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Response {
    /// One result per item, in the items' order.
    pub results: Vec<ItemResult>,
}

/// Builds a batch body incrementally, keeping it under a byte limit.
pub(crate) struct Encoder {
    buf: Vec<u8>,
    count: usize,
    limit: usize,
}

const HEAD: &[u8] = b"{\"items\":[";
const TAIL: &[u8] = b"]}";

impl Encoder {
    /// An empty batch that will stay under `limit` bytes.
    pub(crate) fn new(limit: usize) -> Encoder {
        let mut buf = Vec::with_capacity(limit.min(64 * 1024));
        buf.extend_from_slice(HEAD);
        Encoder {
            buf,
            count: 0,
            limit,
        }
    }

    /// Adds an item; false (and nothing added) when it would pass the limit or the
    /// body is not UTF-8 (such an envelope goes alone, as a single post).
    pub(crate) fn push(&mut self, id: &str, timestamp: i64, signature: &str, body: &[u8]) -> bool {
        let Ok(body) = std::str::from_utf8(body) else {
            return false;
        };
        let ts = timestamp.to_string();
        let item = Item {
            id: Cow::Borrowed(id),
            timestamp: Cow::Borrowed(&ts),
            signature: Cow::Borrowed(signature),
            body: Cow::Borrowed(body),
        };
        let Ok(bytes) = serde_json::to_vec(&item) else {
            return false;
        };
        let sep = usize::from(self.count > 0);
        if self.buf.len() + sep + bytes.len() + TAIL.len() > self.limit {
            return false;
        }
        if sep == 1 {
            self.buf.push(b',');
        }
        self.buf.extend_from_slice(&bytes);
        self.count += 1;
        true
    }

    /// Items added so far.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// True before the first item.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The request body.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.buf.extend_from_slice(TAIL);
        self.buf
    }
}

/// Parses a batch request body.
pub(crate) fn parse(body: &[u8]) -> Result<Request<'_>, serde_json::Error> {
    serde_json::from_slice(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_exact_bytes_including_escapes_and_unicode() {
        let bodies: [&[u8]; 3] = [
            br#"{"v":1,"id":"A","text":"plain"}"#,
            "{\"v\":1,\"id\":\"B\",\"text\":\"quote \\\" backslash \\\\ 中文 \\n\"}".as_bytes(),
            b"{}",
        ];
        let mut e = Encoder::new(MAX_BATCH_BYTES);
        for (i, b) in bodies.iter().enumerate() {
            assert!(e.push(
                &format!("id{i}"),
                1_763_800_000 + i as i64,
                "v1a,sig== v1,x",
                b
            ));
        }
        assert_eq!(e.len(), 3);
        let wire = e.finish();
        let req = parse(&wire).unwrap();
        assert_eq!(req.items.len(), 3);
        for (i, (item, b)) in req.items.iter().zip(bodies).enumerate() {
            assert_eq!(item.id, format!("id{i}"));
            assert_eq!(item.timestamp, (1_763_800_000 + i as i64).to_string());
            assert_eq!(item.signature, "v1a,sig== v1,x");
            assert_eq!(item.body.as_bytes(), b, "exact body bytes");
        }
    }

    #[test]
    fn stays_under_the_byte_limit_and_refuses_non_utf8() {
        let body = vec![b'x'; 1000];
        let mut e = Encoder::new(4096);
        let mut n = 0;
        while e.push("id", 1, "v1,s", &body) {
            n += 1;
        }
        assert!((3..=4).contains(&n), "{n} items of 1000 B in 4096 B");
        let wire = e.finish();
        assert!(wire.len() <= 4096, "{}", wire.len());
        assert_eq!(parse(&wire).unwrap().items.len(), n);

        let mut e = Encoder::new(4096);
        assert!(!e.push("id", 1, "v1,s", &[0xff, 0xfe]));
        assert!(e.is_empty());
        // One item larger than the limit does not fit at all.
        assert!(!Encoder::new(100).push("id", 1, "v1,s", &body));
    }

    #[test]
    fn results_parse_with_and_without_detail() {
        let r: Response = serde_json::from_str(
            r#"{"results":[{"status":200,"result":"accepted"},{"status":401,"result":"bad_signature","detail":"no"}]}"#,
        )
        .unwrap();
        assert_eq!(r.results[0].detail, None);
        assert_eq!(r.results[0].answered, None);
        assert_eq!(r.results[1].status, 401);
        let back = serde_json::to_string(&r.results[0]).unwrap();
        assert_eq!(back, r#"{"status":200,"result":"accepted"}"#);
        let claim: ItemResult =
            serde_json::from_str(r#"{"status":200,"result":"duplicate","answered":"Mid"}"#)
                .unwrap();
        assert_eq!(claim.answered.as_deref(), Some("Mid"));
        assert_eq!(
            serde_json::to_string(&claim).unwrap(),
            r#"{"status":200,"result":"duplicate","answered":"Mid"}"#
        );
    }
}
