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
//! Reading is [`run_reader`]: one blocking XREAD over every group's stream, from a
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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio_util::sync::CancellationToken;

use crate::app::node::Node;
use crate::config::RedisSettings;
use crate::ingress::bridge::{admit_many, Arrival, Reject, Signed, Via, NOT_PROCESSED};
use crate::store::transcript::Appended;
use crate::telemetry::metrics::Metrics;

/// Entry field: the envelope id (`webhook-id`).
const FIELD_ID: &str = "id";
/// Entry field: unix seconds the signature was made (`webhook-timestamp`).
const FIELD_TS: &str = "ts";
/// Entry field: the sender's signatures (`webhook-signature`).
const FIELD_SIG: &str = "sig";
/// Entry field: the envelope's JSON bytes, exactly as signed.
const FIELD_BODY: &str = "body";

/// How often the reader looks for groups it does not read yet.
const GROUP_REFRESH: Duration = Duration::from_secs(1);

/// Why an append failed.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// Redis is unreachable or timed out: try again later.
    #[error("{0}")]
    Retry(String),
    /// The envelope itself cannot be appended (it has no group): never will be.
    #[error("{0}")]
    Permanent(String),
}

/// A stream entry id, `ms-seq`, ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct EntryId {
    /// Milliseconds of Redis's clock when the entry was added.
    pub ms: u64,
    /// Sequence within that millisecond.
    pub seq: u64,
}

impl EntryId {
    /// Parses `1700000000000-3`.
    pub fn parse(s: &str) -> Option<EntryId> {
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
pub struct LinkHealth {
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
pub struct StreamLink {
    /// `[redis]` as configured.
    settings: RedisSettings,
    /// Opens connections (no I/O until used).
    client: redis::Client,
    /// The writer's connection, opened on first use and dropped on any failure.
    writer: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    /// Health as last observed.
    health: Mutex<LinkHealth>,
    /// For `redis_up` and incident counters.
    metrics: Arc<Metrics>,
}

impl StreamLink {
    /// A link to the server at `url` (validated with the config).
    pub fn new(
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
    pub fn stream_key(&self, group: &str) -> String {
        format!("{}group:{group}", self.settings.key_prefix)
    }

    /// The set listing every group that has a stream.
    pub fn groups_key(&self) -> String {
        format!("{}groups", self.settings.key_prefix)
    }

    /// Health for `/healthz`.
    pub fn health(&self) -> LinkHealth {
        self.health.lock().expect("health lock").clone()
    }

    fn mark_up(&self) {
        let mut h = self.health.lock().expect("health lock");
        if !h.connected {
            tracing::info!("redis: connected");
        }
        h.connected = true;
        h.error = None;
        self.metrics.redis_up.set(1);
    }

    fn mark_down(&self, what: &str, e: &redis::RedisError) {
        let mut h = self.health.lock().expect("health lock");
        let error = format!("{what}: {e}");
        if h.connected || h.error.is_none() {
            tracing::warn!(%error, "redis: unreachable; retrying with backoff, nothing is lost");
        }
        h.connected = false;
        h.error = Some(error);
        self.metrics.redis_up.set(0);
    }

    async fn connect(
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
    pub async fn append(
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
    pub async fn append_many(
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

/// One entry as read.
struct Entry {
    id: EntryId,
    fields: HashMap<String, Vec<u8>>,
}

impl Entry {
    fn text(&self, field: &str) -> Option<&str> {
        self.fields
            .get(field)
            .and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// Per-group read positions, kept in `<data_dir>/streams/<group>.cursor`.
pub struct Cursors {
    dir: PathBuf,
    /// The last entry processed, by group.
    pub by_group: HashMap<String, EntryId>,
}

impl Cursors {
    /// Loads every saved cursor (creating the folder).
    pub fn load(data_dir: &Path) -> std::io::Result<Cursors> {
        let dir = data_dir.join("streams");
        std::fs::create_dir_all(&dir)?;
        let mut by_group = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("cursor") {
                continue;
            }
            let Some(group) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(crate::store::transcript::decode_name)
            else {
                continue;
            };
            match std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| EntryId::parse(t.trim()))
            {
                Some(id) => {
                    by_group.insert(group, id);
                }
                None => {
                    tracing::warn!(path = %path.display(), "unreadable stream cursor ignored; that group is re-read from its start (duplicates are dropped by id)")
                }
            }
        }
        Ok(Cursors { dir, by_group })
    }

    /// Records and saves `group`'s position (write to a temporary file, then rename).
    pub fn save(&mut self, group: &str, id: EntryId) -> std::io::Result<()> {
        self.by_group.insert(group.to_string(), id);
        let path = self.dir.join(format!(
            "{}.cursor",
            crate::store::transcript::encode_name(group)
        ));
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, id.to_string())?;
        std::fs::rename(tmp, path)
    }
}

/// Reads every group's stream until `stop` fires: catches up from the saved cursors,
/// then follows new entries. Redis going away is retried with backoff; the cursor
/// only moves past entries that were handled (recorded on disk or rejected for good).
pub async fn run_reader(node: Arc<Node>, link: Arc<StreamLink>, stop: CancellationToken) {
    let mut cursors = match Cursors::load(&node.cfg.data_dir) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "redis: cannot load stream cursors; not reading streams");
            return;
        }
    };
    let block = Duration::from_millis(link.settings.block_ms);
    let mut conn: Option<MultiplexedConnection> = None;
    // Groups read by this run, with their stream keys; checked (gaps, resets) on
    // every (re)connect.
    let mut followed: Vec<String> = Vec::new();
    let mut checked = false;
    let mut last_refresh: Option<tokio::time::Instant> = None;
    let mut failures = 0u32;
    loop {
        if stop.is_cancelled() {
            return;
        }
        let step = async {
            if conn.is_none() {
                conn = Some(link.connect(block + Duration::from_secs(5)).await?);
                checked = false;
            }
            let c = conn.as_mut().expect("connected");
            let refresh_every = if followed.is_empty() {
                GROUP_REFRESH / 5
            } else {
                GROUP_REFRESH
            };
            if last_refresh.is_none_or(|t| t.elapsed() >= refresh_every) {
                let groups: Vec<String> = redis::cmd("SMEMBERS")
                    .arg(link.groups_key())
                    .query_async(c)
                    .await?;
                last_refresh = Some(tokio::time::Instant::now());
                for g in groups {
                    if !followed.contains(&g) {
                        tracing::info!(group = %g, from = %cursors.by_group.get(&g).map(|c| c.to_string()).unwrap_or_else(|| "the start".into()), "redis: following group stream");
                        if checked {
                            check_stream(&link, c, &mut cursors, &g).await?;
                        }
                        followed.push(g);
                    }
                }
            }
            if !checked {
                for g in &followed {
                    check_stream(&link, c, &mut cursors, g).await?;
                }
                checked = true;
            }
            link.mark_up();
            link.health.lock().expect("health lock").groups = followed.len();
            if followed.is_empty() {
                tokio::time::sleep((GROUP_REFRESH / 5).min(block)).await;
                return Ok::<_, redis::RedisError>(Vec::new());
            }
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(link.settings.batch)
                .arg("BLOCK")
                .arg(link.settings.block_ms)
                .arg("STREAMS");
            for g in &followed {
                cmd.arg(link.stream_key(g));
            }
            for g in &followed {
                cmd.arg(
                    cursors
                        .by_group
                        .get(g)
                        .copied()
                        .unwrap_or_default()
                        .to_string(),
                );
            }
            let reply: Value = cmd.query_async(c).await?;
            Ok(parse_xread(&reply))
        };
        let batch = tokio::select! {
            _ = stop.cancelled() => return,
            r = step => r,
        };
        let batch = match batch {
            Ok(b) => {
                failures = 0;
                b
            }
            Err(e) => {
                conn = None;
                failures += 1;
                link.mark_down("read", &e);
                link.metrics.stream_event("read_error");
                let wait = backoff(failures);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
        };
        for (key, entries) in batch {
            let Some(group) = followed.iter().find(|g| link.stream_key(g) == key).cloned() else {
                continue;
            };
            // The whole read is checked and recorded as one batch, in stream order: its
            // signatures verified together, its new messages in one durable write.
            let last = handle_entries(&node, &group, &entries).await;
            let failed = last != entries.last().map(|e| e.id);
            if failed {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
            if let Some(id) = last {
                if let Err(e) = cursors.save(&group, id) {
                    // The position stays in memory; a restart re-reads (ids deduplicate).
                    tracing::warn!(%group, error = %e, "redis: could not save the stream cursor");
                }
            }
        }
    }
}

/// Retry delay after `failures` consecutive read failures: 100 ms doubling to 5 s.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << failures.min(6)).min(5_000))
}

/// Checks a followed stream against its cursor: entries trimmed before this bot read
/// them (a gap: logged and counted), or a stream that restarted behind the cursor
/// (Redis lost its data: the cursor goes back to the start). Redis keeps no record
/// of trimmed ids, so a gap is reported when the entry at the cursor itself was
/// trimmed: at worst one false alarm, never a silent loss.
async fn check_stream(
    link: &StreamLink,
    c: &mut MultiplexedConnection,
    cursors: &mut Cursors,
    group: &str,
) -> redis::RedisResult<()> {
    let Some(cursor) = cursors.by_group.get(group).copied() else {
        return Ok(());
    };
    let info: Value = match redis::cmd("XINFO")
        .arg("STREAM")
        .arg(link.stream_key(group))
        .query_async(c)
        .await
    {
        Ok(v) => v,
        Err(e) if e.kind() == redis::ErrorKind::ResponseError => {
            // No such key: the stream is gone. New entries will be newer than any cursor.
            tracing::warn!(%group, %cursor, "redis: group stream no longer exists (Redis lost its data?); waiting for new entries");
            link.metrics.stream_event("reset");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let fields = map_of(&info);
    let id_of = |name: &str| {
        fields
            .get(name)
            .and_then(|v| text_of(v))
            .and_then(|s| EntryId::parse(&s))
    };
    if let Some(last) = id_of("last-generated-id") {
        if last < cursor {
            tracing::warn!(%group, %cursor, stream_last = %last, "redis: stream restarted behind this bot's cursor; reading it from the start");
            link.metrics.stream_event("reset");
            if let Err(e) = cursors.save(group, EntryId::default()) {
                tracing::warn!(%group, error = %e, "redis: could not save the stream cursor");
            }
            return Ok(());
        }
    }
    // Trimming removes the oldest entries first. When even the entry this bot read
    // last is gone, what followed it may be gone too: say so rather than pretend.
    let first = id_of("recorded-first-entry-id").or_else(|| match fields.get("first-entry") {
        Some(Value::Array(e)) => e.first().and_then(text_of).and_then(|s| EntryId::parse(&s)),
        _ => None,
    });
    if let Some(first) = first.filter(|f| *f > cursor && cursor != EntryId::default()) {
        tracing::error!(%group, %cursor, oldest_left = %first, max_len = link.settings.max_len, "redis: the stream was trimmed past this bot's cursor (down longer than redis.max_len messages): entries after it may be missing from its transcript");
        link.metrics.stream_event("gap");
    }
    Ok(())
}

/// Checks and records one read's entries, in order. Returns the id of the last entry
/// up to which every entry is settled; the entries after it (one could not be stored,
/// so the ones behind it were held back) must be read again. Every other outcome is
/// final and logged.
async fn handle_entries(node: &Arc<Node>, group: &str, entries: &[Entry]) -> Option<EntryId> {
    let arrivals: Vec<Arrival> = entries
        .iter()
        .filter_map(|entry| {
            Some(Arrival {
                signed: Signed {
                    id: entry.text(FIELD_ID),
                    timestamp: entry.text(FIELD_TS),
                    signature: entry.text(FIELD_SIG),
                },
                body: entry.fields.get(FIELD_BODY)?,
                // When Redis stored it (see `Via::Stream`).
                now: (entry.id.ms / 1000) as i64,
            })
        })
        .collect();
    let mut results = admit_many(node, &arrivals, Via::Stream).await.into_iter();
    let mut settled_through = None;
    for entry in entries {
        if !entry.fields.contains_key(FIELD_BODY) {
            node.metrics.envelope_in("malformed");
            tracing::warn!(%group, entry = %entry.id, "stream entry without a body ignored");
        } else {
            match results.next().expect("a result per entry with a body") {
                Ok((env, outcome)) => {
                    let result = match outcome {
                        Appended::New => "accepted",
                        Appended::Duplicate => "duplicate",
                    };
                    node.metrics.envelope_in(result);
                    tracing::debug!(via = "redis", %group, entry = %entry.id, sender = %env.sender, id = %env.id, kind = ?env.kind, depth = env.depth, result, "envelope");
                }
                Err(Reject(_, "own", _)) => {}
                Err(Reject(_, code @ ("storage" | NOT_PROCESSED), detail)) => {
                    node.metrics.envelope_in(code);
                    if code == "storage" {
                        tracing::error!(via = "redis", %group, entry = %entry.id, %detail, "could not record envelope; will read it again");
                    }
                    return settled_through;
                }
                Err(Reject(status, code, detail)) => {
                    node.metrics.envelope_in(code);
                    tracing::warn!(via = "redis", %group, entry = %entry.id, id = entry.text(FIELD_ID).unwrap_or("-"), status = status.as_u16(), reason = code, %detail, "envelope rejected");
                }
            }
        }
        settled_through = Some(entry.id);
    }
    settled_through
}

/// `XREAD`'s reply: `[[key, [[id, [field, value, …]], …]], …]` (RESP2) or a map of
/// key → entries (RESP3).
fn parse_xread(v: &Value) -> Vec<(String, Vec<Entry>)> {
    let pairs: Vec<(String, &Value)> = match v {
        Value::Array(streams) => streams
            .iter()
            .filter_map(|s| match s {
                Value::Array(kv) if kv.len() == 2 => Some((text_of(&kv[0])?, &kv[1])),
                _ => None,
            })
            .collect(),
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((text_of(k)?, v)))
            .collect(),
        _ => Vec::new(),
    };
    pairs
        .into_iter()
        .map(|(key, entries)| {
            let entries = match entries {
                Value::Array(es) => es.iter().filter_map(parse_entry).collect(),
                _ => Vec::new(),
            };
            (key, entries)
        })
        .collect()
}

fn parse_entry(v: &Value) -> Option<Entry> {
    let Value::Array(parts) = v else { return None };
    let id = EntryId::parse(&text_of(parts.first()?)?)?;
    let mut fields = HashMap::new();
    if let Some(Value::Array(kv)) = parts.get(1) {
        for pair in kv.chunks(2) {
            if let [k, v] = pair {
                if let (Some(k), Some(v)) = (text_of(k), bytes_of(v)) {
                    fields.insert(k, v);
                }
            }
        }
    }
    Some(Entry { id, fields })
}

/// A reply's key/value pairs (a RESP2 flat array or a RESP3 map).
fn map_of(v: &Value) -> HashMap<String, &Value> {
    match v {
        Value::Array(kv) => kv
            .chunks(2)
            .filter_map(|p| match p {
                [k, v] => Some((text_of(k)?, v)),
                _ => None,
            })
            .collect(),
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((text_of(k)?, v)))
            .collect(),
        _ => HashMap::new(),
    }
}

fn bytes_of(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

fn text_of(v: &Value) -> Option<String> {
    bytes_of(v).and_then(|b| String::from_utf8(b).ok())
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

    #[test]
    fn parses_an_xread_reply() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("botmesh:group:demo"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk("5-0"),
                    Value::Array(vec![bulk("id"), bulk("01J"), bulk("body"), bulk("{}")]),
                ]),
                Value::Array(vec![bulk("6-1"), Value::Array(vec![bulk("ts")])]),
            ]),
        ])]);
        let parsed = parse_xread(&reply);
        assert_eq!(parsed.len(), 1);
        let (key, entries) = &parsed[0];
        assert_eq!(key, "botmesh:group:demo");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].id, EntryId { ms: 5, seq: 0 });
        assert_eq!(entries[0].text("id"), Some("01J"));
        assert_eq!(entries[0].text("body"), Some("{}"));
        assert!(entries[1].fields.is_empty(), "a dangling field is ignored");
        assert!(parse_xread(&Value::Nil).is_empty());
    }

    #[test]
    fn cursors_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cursors::load(dir.path()).unwrap();
        c.save("demo", EntryId { ms: 9, seq: 2 }).unwrap();
        c.save("oc_群 1", EntryId { ms: 10, seq: 0 }).unwrap();
        std::fs::write(dir.path().join("streams/broken.cursor"), "nope").unwrap();
        let again = Cursors::load(dir.path()).unwrap();
        assert_eq!(again.by_group.len(), 2);
        assert_eq!(again.by_group["demo"], EntryId { ms: 9, seq: 2 });
        assert_eq!(again.by_group["oc_群 1"], EntryId { ms: 10, seq: 0 });
    }

    #[test]
    fn backoff_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(30), Duration::from_secs(5));
    }
}
