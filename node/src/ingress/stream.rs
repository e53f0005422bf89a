//! The Redis Streams reader (`transport = "redis"`; the sending side and the stream
//! layout are in [`crate::egress::stream`]): one blocking XREAD over every group's
//! stream, from a cursor per group kept in `<data_dir>/streams/` and saved after each
//! read is on disk, so a bot that was down catches up on what it missed and a crash
//! re-reads at most one read (deduplicated by id). Each read is checked as a batch
//! POST is (`bridge::admit_many`) and recorded in stream order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio_util::sync::CancellationToken;

use crate::config::pacing::{Backoff, Jitter};
use crate::egress::stream::{EntryId, StreamLink, FIELD_BODY, FIELD_ID, FIELD_SIG, FIELD_TS};
use crate::ingress::bridge::{
    admit_many, Arrival, Reject, Signed, SignedBytes, Via, NOT_PROCESSED,
};
use crate::ingress::ingest::Ingest;
use crate::store::transcript::Appended;

/// How often the reader looks for groups it does not read yet.
const GROUP_REFRESH: Duration = Duration::from_secs(1);

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

/// Per-group read positions, kept in `<data_dir>/streams/<group>.cursor` (the group's
/// file name as for transcripts, `store::file_names::stored_path`; in a file whose
/// name is hashed, the group follows the entry id's line).
pub(crate) struct Cursors {
    dir: PathBuf,
    /// The last entry processed, by group.
    pub by_group: HashMap<String, EntryId>,
}

impl Cursors {
    /// Loads every saved cursor (creating the folder).
    pub(crate) fn load(data_dir: &Path) -> std::io::Result<Cursors> {
        let dir = data_dir.join("streams");
        std::fs::create_dir_all(&dir)?;
        let mut by_group = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("cursor") {
                continue;
            }
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
            let id = EntryId::parse(first.trim());
            // A hashed file name does not say the group: the rest of the file does.
            let Some(group) = crate::store::file_names::name_of_stem(stem).or_else(|| {
                Some(rest)
                    .filter(|g| crate::store::file_names::file_stem(g) == stem)
                    .map(str::to_string)
            }) else {
                tracing::warn!(path = %path.display(), "stream cursor of an unknown group ignored");
                continue;
            };
            match id {
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

    /// Records and saves `group`'s position, written over the file in place
    /// ([`crate::store::cursor::overwrite`]): a reader saves after every read, on a
    /// mesh of 32 bots about thirty times per message sent, and a new file and a
    /// rename each time cost the file system an inode each. The id is written at its
    /// full width ([`cursor_record`]), so a later id never leaves a shorter one's
    /// digits behind and a crash leaves the old id or the new one (the group's name
    /// after it is the same in both).
    pub(crate) fn save(&mut self, group: &str, id: EntryId) -> std::io::Result<()> {
        self.by_group.insert(group.to_string(), id);
        let path = crate::store::file_names::stored_path(&self.dir, group, "cursor");
        let hashed = crate::store::file_names::name_of_stem(
            path.file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default(),
        )
        .is_none();
        crate::store::cursor::overwrite(
            &path,
            cursor_record(id, hashed.then_some(group)).as_bytes(),
        )
    }
}

/// A stream cursor file's text: the entry id with both numbers at their full 20 digits
/// (what `EntryId::parse` reads like any other), then, in a file whose name is hashed,
/// a line break and the group's name to the end of the file.
fn cursor_record(id: EntryId, group: Option<&str>) -> String {
    let mut text = format!("{:020}-{:020}", id.ms, id.seq);
    if let Some(group) = group {
        text.push('\n');
        text.push_str(group);
    }
    text
}

/// Reads every group's stream until `stop` fires: catches up from the saved cursors,
/// then follows new entries. Redis going away is retried with backoff; the cursor
/// only moves past entries that were handled (recorded on disk or rejected for good).
pub(crate) async fn run_reader(ingest: Ingest, link: Arc<StreamLink>, stop: CancellationToken) {
    let mut cursors = match Cursors::load(&ingest.cfg.data_dir) {
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
            link.health.lock().groups = followed.len();
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
            let last = handle_entries(&ingest, &group, &entries).await;
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

/// Read retries: 200 ms after the first failure, doubling to 5 s, no jitter (one
/// reader per node, nobody to fall into lockstep with).
const READ_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));

/// Retry delay after `failures` (≥ 1) consecutive read failures: [`READ_BACKOFF`].
fn backoff(failures: u32) -> Duration {
    READ_BACKOFF.delay(failures, Jitter::None)
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
async fn handle_entries(ingest: &Ingest, group: &str, entries: &[Entry]) -> Option<EntryId> {
    let arrivals: Vec<Arrival> = entries
        .iter()
        .filter_map(|entry| {
            Some(Arrival {
                signed: Signed {
                    id: entry.text(FIELD_ID),
                    timestamp: entry.text(FIELD_TS),
                    signature: entry.text(FIELD_SIG),
                },
                body: SignedBytes::Borrowed(entry.fields.get(FIELD_BODY)?),
                // When Redis stored it (see `Via::Stream`).
                now: (entry.id.ms / 1000) as i64,
            })
        })
        .collect();
    let mut results = admit_many(ingest, &arrivals, Via::Stream).await.into_iter();
    let mut settled_through = None;
    for entry in entries {
        if !entry.fields.contains_key(FIELD_BODY) {
            ingest.metrics.envelope_in("malformed");
            tracing::warn!(%group, entry = %entry.id, "stream entry without a body ignored");
        } else {
            match results.next().expect("a result per entry with a body") {
                Ok((env, outcome)) => {
                    let result = match outcome {
                        Appended::New => "accepted",
                        Appended::Duplicate => "duplicate",
                    };
                    ingest.metrics.envelope_in(result);
                    tracing::debug!(via = "redis", %group, entry = %entry.id, sender = %env.sender, id = %env.id, kind = ?env.kind, depth = env.depth, result, "envelope");
                }
                Err(Reject(_, "own", _)) => {}
                Err(Reject(_, code @ ("storage" | NOT_PROCESSED), detail)) => {
                    ingest.metrics.envelope_in(code);
                    if code == "storage" {
                        tracing::error!(via = "redis", %group, entry = %entry.id, %detail, "could not record envelope; will read it again");
                    }
                    return settled_through;
                }
                Err(Reject(status, code, detail)) => {
                    ingest.metrics.envelope_in(code);
                    if crate::telemetry::refusals::REFUSALS.admit("redis", code) {
                        tracing::warn!(via = "redis", %group, entry = %entry.id, id = entry.text(FIELD_ID).unwrap_or("-"), status = status.as_u16(), reason = code, %detail, "envelope rejected");
                    }
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
        Value::Map(m) => keyed(m).collect(),
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

/// A RESP3 map's entries whose keys are text (the others are not the reply's).
fn keyed(m: &[(Value, Value)]) -> impl Iterator<Item = (String, &Value)> {
    m.iter().filter_map(|(k, v)| Some((text_of(k)?, v)))
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
        Value::Map(m) => keyed(m).collect(),
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
        // A name too long for a readable file name, with a line break in it.
        let long = format!("{}\n{}", "群".repeat(30), "x".repeat(200));
        c.save(&long, EntryId { ms: 11, seq: 1 }).unwrap();
        c.save(&long, EntryId { ms: 12, seq: 0 }).unwrap();
        std::fs::write(dir.path().join("streams/broken.cursor"), "nope").unwrap();
        let again = Cursors::load(dir.path()).unwrap();
        assert_eq!(again.by_group.len(), 3);
        assert_eq!(again.by_group["demo"], EntryId { ms: 9, seq: 2 });
        assert_eq!(again.by_group["oc_群 1"], EntryId { ms: 10, seq: 0 });
        assert_eq!(again.by_group[&long], EntryId { ms: 12, seq: 0 });
        for f in std::fs::read_dir(dir.path().join("streams")).unwrap() {
            let name = f.unwrap().file_name();
            assert!(name.len() < 80, "{name:?}");
        }
    }

    #[test]
    fn a_save_rewrites_the_cursor_in_place_and_an_older_file_still_reads() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let mut c = Cursors::load(dir.path()).unwrap();
        let long = "群".repeat(100);
        for group in ["demo", long.as_str()] {
            // As an older version wrote it: the short id, then (hashed name) the group.
            let path =
                crate::store::file_names::stored_path(&dir.path().join("streams"), group, "cursor");
            let hashed = group != "demo";
            let old = if hashed {
                format!("7-1\n{group}")
            } else {
                "7-1".to_string()
            };
            std::fs::write(&path, old).unwrap();
            let read = Cursors::load(dir.path()).unwrap();
            assert_eq!(read.by_group[group], EntryId { ms: 7, seq: 1 });
            let inode = std::fs::metadata(&path).unwrap().ino();
            // Long ids, then a shorter one: no digits of the longer are left behind.
            for id in [
                EntryId {
                    ms: 1_732_752_000_000,
                    seq: 12,
                },
                EntryId {
                    ms: u64::MAX,
                    seq: u64::MAX,
                },
                EntryId { ms: 9, seq: 0 },
            ] {
                c.save(group, id).unwrap();
                let again = Cursors::load(dir.path()).unwrap();
                assert_eq!(again.by_group[group], id, "{group}");
                assert_eq!(
                    std::fs::metadata(&path).unwrap().ino(),
                    inode,
                    "written in place"
                );
            }
        }
        let names: Vec<String> = std::fs::read_dir(dir.path().join("streams"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "no temporary files: {names:?}");
        assert!(names.iter().all(|n| n.ends_with(".cursor")), "{names:?}");
    }

    #[test]
    fn backoff_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(30), Duration::from_secs(5));
    }
}
