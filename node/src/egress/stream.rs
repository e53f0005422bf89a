//! The Redis Streams transport (`transport = "redis"`).
//!
//! Each group is one Redis Stream, `{key_prefix}group:{group}`, carrying the same
//! signed envelopes as the HTTP bridge: every entry holds the envelope's bytes and its
//! Standard Webhooks values (`id`, `ts`, `sig`), so a reader checks it exactly as the
//! bridge checks a batch POST (`bridge::admit_many`: what one XREAD returned is
//! checked together and recorded in stream order, in one durable write). A sender
//! appends once (XADD, with the stream trimmed to `max_len`) instead of posting to
//! every peer; the set `{key_prefix}groups` lists the streams so readers find new groups.
//!
//! Sending goes through an ordinary [`crate::egress::outbox::Outbox`] whose link is the stream:
//! durable (the outbox log), ordered, retried with backoff while Redis is away.
//! Reading is [`crate::ingress::stream::run_reader`]: one blocking XREAD over every group's stream, from a
//! cursor per group kept in `<data_dir>/streams/` and saved after each batch is on
//! disk, so a bot that was down catches up on what it missed and a crash re-reads at
//! most one batch (deduplicated by id). Trimmed entries it never read and streams that
//! restarted behind its cursor are logged and counted, never skipped silently.
//!
//! Freshness: a reader judges an entry's signature timestamp against the time Redis
//! stored it (the entry id), not against its own clock, so a catch-up after hours
//! still verifies while an old envelope re-added to the stream is stale.
//!
//! Claim acknowledgements ([`crate::egress::acks`]): the stream has no per-peer answer, so a
//! claim is counted as delivered to every stream peer once its XADD succeeded, and no
//! `answered` comes back from them. A bot on the stream thus waits for Redis, not for
//! its peers; a stream peer that already answers the trigger is only learned from its
//! answer (a message) or, if late, not at all: the residual window acknowledgements
//! close on HTTP links.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use crate::config::RedisSettings;
use crate::telemetry::metrics::Metrics;

/// Entry field: the envelope id (`webhook-id`).
pub(crate) const FIELD_ID: &str = "id";
/// Entry field: unix seconds the signature was made (`webhook-timestamp`).
pub(crate) const FIELD_TS: &str = "ts";
/// Entry field: the sender's signatures (`webhook-signature`).
pub(crate) const FIELD_SIG: &str = "sig";
/// Entry field: the envelope's JSON bytes, exactly as signed.
pub(crate) const FIELD_BODY: &str = "body";

/// Why an append failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppendError {
    /// Redis is unreachable or timed out: try again later.
    #[error("{0}")]
    Retry(String),
    /// The envelope itself cannot be appended (it has no group): never will be.
    #[error("{0}")]
    Permanent(String),
}

/// A stream entry id, `ms-seq`, ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct EntryId {
    /// Milliseconds of Redis's clock when the entry was added.
    pub ms: u64,
    /// Sequence within that millisecond.
    pub seq: u64,
}

impl EntryId {
    /// Parses `1700000000000-3`.
    pub(crate) fn parse(s: &str) -> Option<EntryId> {
        let (ms, seq) = s.split_once('-')?;
        Some(EntryId {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// What `/healthz` shows about Redis.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct LinkHealth {
    /// Whether the last command (read or write) reached Redis.
    pub connected: bool,
    /// The last failure while not connected.
    pub error: Option<String>,
    /// Groups the reader follows.
    pub groups: usize,
}

/// The node's connection to Redis, shared by its stream outbox (writes) and its
/// reader. Each side has its own connection, since a blocking read would hold up
/// writes on a shared one.
pub(crate) struct StreamLink {
    /// `[redis]` as configured.
    pub(crate) settings: RedisSettings,
    /// Opens connections (no I/O until used).
    client: redis::Client,
    /// The writer's connection, opened on first use and dropped on any failure.
    writer: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    /// Health as last observed.
    pub(crate) health: Mutex<LinkHealth>,
    /// For `redis_up` and incident counters.
    pub(crate) metrics: Arc<Metrics>,
}

impl StreamLink {
    /// A link to the server at `url` (validated with the config).
    pub(crate) fn new(
        url: &str,
        settings: RedisSettings,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<StreamLink>> {
        let client =
            redis::Client::open(url).map_err(|e| anyhow::anyhow!("redis url: {}", e.category()))?;
        metrics.redis_up.set(0);
        Ok(Arc::new(StreamLink {
            settings,
            client,
            writer: tokio::sync::Mutex::new(None),
            health: Mutex::new(LinkHealth::default()),
            metrics,
        }))
    }

    /// The stream of `group`.
    pub(crate) fn stream_key(&self, group: &str) -> String {
        format!("{}group:{group}", self.settings.key_prefix)
    }

    /// The set listing every group that has a stream.
    pub(crate) fn groups_key(&self) -> String {
        format!("{}groups", self.settings.key_prefix)
    }

    /// Health for `/healthz`.
    pub(crate) fn health(&self) -> LinkHealth {
        self.health.lock().clone()
    }

    pub(crate) fn mark_up(&self) {
        let mut h = self.health.lock();
        if !h.connected {
            tracing::info!("redis: connected");
        }
        h.connected = true;
        h.error = None;
        self.metrics.redis_up.set(1);
    }

    pub(crate) fn mark_down(&self, what: &str, e: &redis::RedisError) {
        let mut h = self.health.lock();
        let error = format!("{what}: {e}");
        if h.connected || h.error.is_none() {
            tracing::warn!(%error, "redis: unreachable; retrying with backoff, nothing is lost");
        }
        h.connected = false;
        h.error = Some(error);
        self.metrics.redis_up.set(0);
    }

    pub(crate) async fn connect(
        &self,
        response_timeout: Duration,
    ) -> redis::RedisResult<MultiplexedConnection> {
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Duration::from_secs(2))
            .set_response_timeout(response_timeout);
        self.client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
    }

    /// Appends one signed envelope to its group's stream (trimmed to `max_len`) and
    /// registers the group. A retried append after a lost reply may add the entry
    /// twice; readers drop the second by id.
    pub(crate) async fn append(
        &self,
        id: &str,
        ts: i64,
        sig: &str,
        body: &[u8],
    ) -> Result<(), AppendError> {
        self.append_many(ts, &[(id, sig.to_string(), body)]).await
    }

    /// Appends several signed envelopes (`id`, signature, body), in order, in one
    /// pipelined round trip: all are appended or the call fails (and is retried; a
    /// retry after a lost reply may add some twice, which readers drop by id).
    pub(crate) async fn append_many(
        &self,
        ts: i64,
        items: &[(&str, String, &[u8])],
    ) -> Result<(), AppendError> {
        #[derive(serde::Deserialize)]
        struct GroupOnly<'a> {
            #[serde(borrow)]
            group: std::borrow::Cow<'a, str>,
        }
        // MULTI/EXEC: all or nothing. A plain pipeline can fail in part, e.g. while a
        // restarted Redis is still loading its AOF (`LOADING` for the first commands,
        // success for the later ones), and the one-at-a-time retry of the front item
        // would then land behind items that were appended (seen in the outage test).
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (id, sig, body) in items {
            let group = serde_json::from_slice::<GroupOnly>(body)
                .map_err(|e| AppendError::Permanent(format!("envelope without a group: {e}")))?
                .group;
            pipe.cmd("XADD")
                .arg(self.stream_key(&group))
                .arg("MAXLEN")
                .arg("=")
                .arg(self.settings.max_len)
                .arg("*")
                .arg(FIELD_ID)
                .arg(*id)
                .arg(FIELD_TS)
                .arg(ts)
                .arg(FIELD_SIG)
                .arg(sig.as_str())
                .arg(FIELD_BODY)
                .arg(*body)
                .ignore()
                .cmd("SADD")
                .arg(self.groups_key())
                .arg(group.as_ref())
                .ignore();
        }
        let mut slot = self.writer.lock().await;
        if slot.is_none() {
            match self.connect(Duration::from_secs(3)).await {
                Ok(c) => *slot = Some(c),
                Err(e) => {
                    self.mark_down("connect", &e);
                    self.metrics.stream_event("write_error");
                    return Err(AppendError::Retry(format!("redis connect: {e}")));
                }
            }
        }
        let conn = slot.as_mut().expect("just connected");
        match pipe.query_async::<()>(conn).await {
            Ok(()) => {
                self.mark_up();
                Ok(())
            }
            Err(e) => {
                *slot = None;
                self.mark_down("append", &e);
                self.metrics.stream_event("write_error");
                Err(AppendError::Retry(format!("redis append: {e}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_order_like_redis() {
        let a = EntryId::parse("1700000000000-0").unwrap();
        let b = EntryId::parse("1700000000000-1").unwrap();
        let c = EntryId::parse("1700000000001-0").unwrap();
        assert!(a < b && b < c);
        assert_eq!(c.to_string(), "1700000000001-0");
        assert_eq!(EntryId::default().to_string(), "0-0");
        for bad in ["", "1", "x-1", "1-", "-1", "1-2-3"] {
            assert!(EntryId::parse(bad).is_none(), "{bad:?}");
        }
    }
}
