//! Tests of the group transcripts: appends, duplicates, the writer's group commit,
//! file names, reloads and the turn queries over them.

use super::writer::{PREALLOCATE_BYTES, PREALLOCATE_FIRST};
use super::*;
use crate::store::file_names::{encode_name, group_of_file, stored_path, MAX_PLAIN_STEM};
use crate::wire::envelope::{Author, AuthorKind};
use std::io::Write;

fn msg(group: &str, text: &str, pid: Option<&str>) -> Envelope {
    let mut env = Envelope::message(Ulid::new(), 0, group, "A", Author::human("human"), text);
    env.platform_msg_id = pid.map(str::to_string);
    env
}

/// `env` as the bridge hands it over: with the bytes it was `signed` as.
fn received(env: &Envelope, signed: &[u8]) -> Received {
    Received {
        env: Arc::new(env.clone()),
        signed: Bytes::copy_from_slice(signed),
    }
}

/// A node with no peers.
struct NoPeers;
impl Fanout for NoPeers {
    fn push(&self, _: LoggedOutbound) {}
    fn delivered_through(&self) -> u64 {
        u64::MAX - 1
    }
}

/// A node whose peers' outboxes record what they were handed and never deliver.
#[derive(Default)]
struct RecordingPeers(Mutex<Vec<LoggedOutbound>>);
impl Fanout for RecordingPeers {
    fn push(&self, entry: LoggedOutbound) {
        self.0.lock().push(entry);
    }
    fn delivered_through(&self) -> u64 {
        0
    }
}

#[tokio::test]
async fn a_failed_sync_refuses_the_batch_but_keeps_what_the_peers_were_handed() {
    let dir = tempfile::tempdir().unwrap();
    // `fdatasync` on /dev/null fails (EINVAL) while writes to it succeed: a disk
    // whose sync fails after the data was written.
    let transcripts = dir.path().join("transcripts");
    std::fs::create_dir_all(&transcripts).unwrap();
    std::os::unix::fs::symlink(
        "/dev/null",
        transcripts.join(format!("{}.jsonl", file_stem("broken"))),
    )
    .unwrap();
    let peers = Arc::new(RecordingPeers::default());
    let (t, _, _) = Transcripts::open(
        dir.path(),
        EventBus::new(16),
        true,
        peers.clone(),
        1,
        TranscriptLimits::UNBOUNDED,
    )
    .unwrap();
    let lost = msg("broken", "said while the disk failed", None);
    let err = t.append_outbound(lost.clone()).await.unwrap_err();
    assert!(err.to_string().contains("fsync failed"), "{err}");
    assert!(t.recent("broken", 10).is_empty(), "refused locally");
    let ok = msg("fine", "said afterwards", None);
    assert_eq!(t.append_outbound(ok.clone()).await.unwrap(), Appended::New);
    let handed: Vec<(u64, String)> = peers
        .0
        .lock()
        .iter()
        .map(|e| (e.seq, e.id.clone()))
        .collect();
    assert_eq!(
        handed,
        vec![(1, lost.id.to_string()), (2, ok.id.to_string())],
        "the peers were handed the message before its sync failed, and its sequence number is not reused"
    );
    t.close();
    drop(t);
    // A restart sends both again (no peer had confirmed either).
    let (_t, _, pending) = load(dir.path());
    let pending: Vec<(u64, String)> = pending.into_iter().map(|e| (e.seq, e.id)).collect();
    assert_eq!(pending, handed, "both stay in the outbox log");
}

#[tokio::test]
async fn dedups_persists_and_restores_and_drops_a_cut_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, _) = load(dir.path());
    let a = msg("g 1", "hello", Some("om_1"));
    assert_eq!(t.append(a.clone()).await.unwrap(), Appended::New);
    assert_eq!(t.append(a.clone()).await.unwrap(), Appended::Duplicate);
    let same_platform = msg("g 1", "hello again", Some("om_1"));
    assert_eq!(t.append(same_platform).await.unwrap(), Appended::Duplicate);
    let b = msg("g 1", "world", None);
    t.append(b.clone()).await.unwrap();
    t.close();
    drop(t);

    // Simulate power loss in the middle of a third line.
    let file = dir
        .path()
        .join("transcripts")
        .join(format!("{}.jsonl", file_stem("g 1")));
    let mut f = OpenOptions::new().append(true).open(&file).unwrap();
    f.write_all(br#"{"v":1,"id":"01J"#).unwrap();
    drop(f);

    let (t, report, _) = load(dir.path());
    assert_eq!(report.dropped_lines, 1);
    let texts: Vec<String> = t.recent("g 1", 10).iter().map(|e| e.text.clone()).collect();
    assert_eq!(texts, vec!["hello", "world"]);
    assert!(t.contains("g 1", &a.id, None));
    assert!(t.contains("g 1", &Ulid::new(), Some("om_1")));
    // The next append starts on a clean line.
    let c = msg("g 1", "after crash", None);
    t.append(c).await.unwrap();
    t.close();
    drop(t);
    let (t, report, _) = load(dir.path());
    assert_eq!(report.dropped_lines, 0);
    assert_eq!(t.recent("g 1", 10).len(), 3);
}

#[tokio::test]
async fn a_damaged_line_in_the_middle_costs_only_that_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("transcripts")).unwrap();
    let mut bytes = Vec::new();
    for line in [
        serde_json::to_vec(&msg("demo", "before", None)).unwrap(),
        b"{\"v\":1,\0\0\0 damaged".to_vec(),
        serde_json::to_vec(&msg("demo", "after", None)).unwrap(),
    ] {
        bytes.extend_from_slice(&line);
        bytes.push(b'\n');
    }
    std::fs::write(dir.path().join("transcripts/demo.jsonl"), &bytes).unwrap();
    let (t, report, _) = load(dir.path());
    assert_eq!(report.dropped_lines, 1);
    assert_eq!(texts(&t, "demo"), ["before", "after"]);
    t.close();
}

#[tokio::test]
async fn answers_due_from_bots_ahead_count_once_recorded_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, _) = load(dir.path());
    let trigger = msg("demo", "@all one risk each", None);
    t.append(trigger.clone()).await.unwrap();
    let reply = |bot: &str| {
        let mut m = msg("demo", &format!("from {bot}"), None);
        m.author = Author {
            name: bot.into(),
            kind: AuthorKind::Bot,
        };
        m.reply_to = Some(trigger.id);
        m.sent_at = 1_000;
        m
    };
    let ahead = ["A".to_string(), "B".to_string()];
    let rate = RateCount {
        limit: 64,
        now_ms: 2_000,
        window_ms: 60_000,
        trigger: &trigger.id,
        ahead: &ahead,
    };
    let count = |t: &Transcripts| t.rate_count("demo", &rate);
    assert_eq!(count(&t), (0, 2), "nothing arrived: both due");
    t.append(reply("A")).await.unwrap();
    assert_eq!(count(&t), (1, 1), "A's answer is a message now, not due");
    // Another bot's message, not an answer to the trigger by a bot ahead.
    t.append(reply("C")).await.unwrap();
    assert_eq!(count(&t), (2, 1));
    t.append(reply("B")).await.unwrap();
    assert_eq!(count(&t), (3, 0));
    assert_eq!(
        t.rate_count("other", &rate),
        (0, 2),
        "a group without messages: everything ahead is due"
    );
    t.close();
}

fn texts(t: &Transcripts, group: &str) -> Vec<String> {
    t.recent(group, 10).iter().map(|e| e.text.clone()).collect()
}

#[tokio::test]
async fn a_received_envelope_is_kept_as_signed_unless_it_spans_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, _) = load(dir.path());
    // As a peer may send it: another key order, a field this version does not know.
    let one = msg("demo", "one", None);
    let mut as_sent: serde_json::Value = serde_json::from_slice(&one.to_bytes()).unwrap();
    as_sent["from_a_newer_version"] = serde_json::json!([1, 2]);
    let signed_one = serde_json::to_vec(&as_sent).unwrap();
    // Pretty-printed: newlines between tokens, which a line must not hold.
    let two = msg("demo", "two\nlines", None);
    let signed_two = serde_json::to_vec_pretty(&two).unwrap();
    assert!(signed_two.contains(&b'\n'));
    let results = t
        .append_many(vec![
            received(&one, &signed_one),
            received(&two, &signed_two),
        ])
        .await;
    assert!(results.iter().all(|r| matches!(r, Ok(Appended::New))));
    t.close();
    let file = std::fs::read(dir.path().join("transcripts/demo.jsonl")).unwrap();
    let lines: Vec<&[u8]> = file
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines.len(), 2, "one line per envelope");
    assert_eq!(lines[0], &signed_one[..], "the signed bytes, as they came");
    assert_eq!(
        lines[1],
        &two.to_bytes()[..],
        "serialized again: it spanned lines"
    );
    let (t, report, _) = load(dir.path());
    assert_eq!(report.dropped_lines, 0);
    assert_eq!(texts(&t, "demo"), ["one", "two\nlines"]);
    t.close();
}

#[tokio::test]
async fn keeps_zeroed_space_ahead_while_running_and_cuts_it_at_stop_or_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let open = load;
    let (t, _, _) = open(dir.path());
    let file = dir.path().join("transcripts/demo.jsonl");
    t.append(msg("demo", "one", None)).await.unwrap();
    t.append(msg("demo", "two", None)).await.unwrap();
    // The space is zeroed after the commit has been answered: wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let bytes = loop {
        let b = std::fs::read(&file).unwrap();
        if b.last() == Some(&0) || std::time::Instant::now() > deadline {
            break b;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    let lines_len = bytes.iter().position(|&b| b == 0).expect("zeroed space");
    assert!(bytes[lines_len..].iter().all(|&b| b == 0));
    let ahead = bytes.len() as u64 - lines_len as u64;
    assert!(
        (PREALLOCATE_FIRST / 4..=PREALLOCATE_FIRST).contains(&ahead),
        "{ahead} zeroed bytes ahead"
    );
    let lines = &bytes[..lines_len];
    assert_eq!(lines.iter().filter(|&&b| b == b'\n').count(), 2);
    assert_eq!(lines.last(), Some(&b'\n'));

    // Two crashes, as the disk may look after one: the zeros still there, and a
    // commit whose pages reached the disk out of order (a gap of zeros in a line).
    let crashed = tempfile::tempdir().unwrap();
    let unsynced = tempfile::tempdir().unwrap();
    for d in [&crashed, &unsynced] {
        std::fs::create_dir_all(d.path().join("transcripts")).unwrap();
    }
    std::fs::write(crashed.path().join("transcripts/demo.jsonl"), &bytes).unwrap();
    let mut gap = lines.to_vec();
    gap.extend_from_slice(&[0; 700]);
    gap.extend_from_slice(&serde_json::to_vec(&msg("demo", "never synced", None)).unwrap());
    gap.extend_from_slice(b"\n");
    gap.extend_from_slice(&[0; 4096]);
    std::fs::write(unsynced.path().join("transcripts/demo.jsonl"), &gap).unwrap();

    // A clean stop gives the space back: the file ends with its last line.
    t.close();
    assert_eq!(std::fs::read(&file).unwrap(), lines);

    // After the crash: both lines, nothing reported dropped, the zeros cut, and the
    // next line follows the last one.
    let (t, report, _) = open(crashed.path());
    assert_eq!(report.dropped_lines, 0);
    assert_eq!(texts(&t, "demo"), ["one", "two"]);
    let cfile = crashed.path().join("transcripts/demo.jsonl");
    assert_eq!(std::fs::read(&cfile).unwrap(), lines);
    assert_eq!(
        append_then_reopen(t, crashed.path(), "three").await,
        (0, vec!["one".into(), "two".into(), "three".into()])
    );

    // A line with NULs in it is unreadable like any damaged line: reported, the
    // lines around it kept; the zeros after the last line are cut quietly.
    let (t, report, _) = open(unsynced.path());
    assert_eq!(report.dropped_lines, 1);
    assert_eq!(texts(&t, "demo"), ["one", "two"]);
    let ufile = unsynced.path().join("transcripts/demo.jsonl");
    let kept = std::fs::read(&ufile).unwrap();
    assert!(kept.starts_with(lines) && kept.ends_with(b"\n"));
    assert_eq!(
        kept.len(),
        gap.len() - 4096,
        "only the zeros after the last line cut"
    );
    assert_eq!(
        append_then_reopen(t, unsynced.path(), "after").await,
        (1, vec!["one".into(), "two".into(), "after".into()])
    );
}

/// Opens the transcripts in `dir` as a node with no peers and no limits would.
fn load(dir: &Path) -> (Transcripts, LoadReport, Vec<LoggedOutbound>) {
    Transcripts::open(
        dir,
        EventBus::new(16),
        true,
        Arc::new(NoPeers),
        1,
        TranscriptLimits::UNBOUNDED,
    )
    .unwrap()
}

/// Opens the transcripts in `dir` with at most `max_groups` groups and
/// `max_open_files` files open.
fn open_with(dir: &Path, max_groups: usize, max_open_files: usize) -> Transcripts {
    let limits = TranscriptLimits {
        max_groups,
        max_open_files,
    };
    Transcripts::open(dir, EventBus::new(16), true, Arc::new(NoPeers), 1, limits)
        .unwrap()
        .0
}

#[tokio::test]
async fn many_groups_through_few_open_files_and_every_one_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let t = open_with(dir.path(), 1_000, 8);
    let mut most_open = 0;
    for round in 0..3 {
        for g in 0..50 {
            t.append(msg(&format!("g{g}"), &format!("{round}"), None))
                .await
                .unwrap();
            most_open = most_open.max(t.open_files());
        }
    }
    // One commit of many groups at once: split into commits of at most 8 groups.
    let many: Vec<_> = (0..50)
        .map(|g| {
            let env = msg(&format!("g{g}"), "3", None);
            let signed = Bytes::from(env.to_bytes());
            Received {
                env: Arc::new(env),
                signed,
            }
        })
        .collect();
    for r in t.append_many(many).await {
        assert_eq!(r.unwrap(), Appended::New);
    }
    most_open = most_open.max(t.open_files());
    assert!(most_open <= 8, "{most_open} files open");
    assert_eq!(t.groups(), 50);
    assert!(t.health_error().is_none());
    t.close();
    // Closed files ended with their last line: every message reads back in order.
    let t = open_with(dir.path(), 1_000, 8);
    for g in 0..50 {
        assert_eq!(texts(&t, &format!("g{g}")), ["0", "1", "2", "3"], "g{g}");
    }
    for f in std::fs::read_dir(dir.path().join("transcripts")).unwrap() {
        let bytes = std::fs::read(f.unwrap().path()).unwrap();
        assert!(!bytes.contains(&0), "no zeros left behind");
    }
    t.close();
}

#[tokio::test]
async fn a_group_past_max_groups_is_refused_and_the_others_carry_on() {
    let dir = tempfile::tempdir().unwrap();
    let t = open_with(dir.path(), 3, 8);
    for g in ["a", "b", "c"] {
        t.append(msg(g, "first", None)).await.unwrap();
    }
    let err = t.append(msg("d", "one too many", None)).await.unwrap_err();
    assert!(
        matches!(&err, TranscriptError::TooManyGroups { max: 3, group } if group == "d"),
        "{err}"
    );
    assert!(err.to_string().contains("max_groups"), "{err}");
    assert!(t.admits("d").is_err() && t.admits("a").is_ok());
    assert_eq!(t.groups(), 3, "the refused group is not kept");
    assert!(t.recent("d", 10).is_empty());
    assert!(
        t.health_error().is_none(),
        "a refusal is not a storage fault"
    );
    t.append(msg("a", "second", None)).await.unwrap();
    assert_eq!(texts(&t, "a"), ["first", "second"]);
    t.close();
    assert!(!dir.path().join("transcripts/d.jsonl").exists());
}

#[tokio::test]
async fn long_and_unusual_group_names_get_bounded_file_names_and_load_back() {
    let dir = tempfile::tempdir().unwrap();
    let cjk = "群".repeat(30);
    let long = "x".repeat(1024);
    let names = [
        cjk.as_str(),
        long.as_str(),
        "../../etc/passwd",
        "demo",
        "群聊 1",
    ];
    let t = load(dir.path()).0;
    for g in names {
        t.append(msg(g, "hello", None)).await.unwrap();
    }
    t.close();
    let files: Vec<String> = std::fs::read_dir(dir.path().join("transcripts"))
        .unwrap()
        .map(|f| f.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files.len(), names.len(), "{files:?}");
    for f in &files {
        assert!(f.len() <= MAX_PLAIN_STEM + ".jsonl".len(), "{f}");
        assert!(!f.contains('/') && !f.starts_with('.'), "{f}");
    }
    for g in ["demo", "群聊 1"] {
        assert!(
            files.contains(&format!("{}.jsonl", encode_name(g))),
            "short names stay readable: {files:?}"
        );
    }
    let t = load(dir.path()).0;
    for g in names {
        assert_eq!(texts(&t, g), ["hello"], "{g}");
        let file = stored_path(&dir.path().join("transcripts"), g, "jsonl");
        assert_eq!(group_of_file(&file).as_deref(), Some(g));
    }
    t.close();
}

#[tokio::test]
async fn a_long_readable_file_name_an_older_version_wrote_stays_the_groups_file() {
    let dir = tempfile::tempdir().unwrap();
    let transcripts = dir.path().join("transcripts");
    std::fs::create_dir_all(&transcripts).unwrap();
    // 20 CJK characters: 180 bytes encoded, readable before names were bounded.
    let group = "群".repeat(20);
    let older = transcripts.join(format!("{}.jsonl", encode_name(&group)));
    let mut line = serde_json::to_vec(&msg(&group, "written by an older version", None)).unwrap();
    line.push(b'\n');
    std::fs::write(&older, &line).unwrap();
    let t = load(dir.path()).0;
    assert_eq!(texts(&t, &group), ["written by an older version"]);
    t.append(msg(&group, "written now", None)).await.unwrap();
    t.close();
    let files = std::fs::read_dir(&transcripts).unwrap().count();
    assert_eq!(files, 1, "the group's messages stay in one file");
    let t = load(dir.path()).0;
    assert_eq!(
        texts(&t, &group),
        ["written by an older version", "written now"]
    );
    t.close();
}

#[tokio::test]
async fn zeroed_space_grows_with_a_groups_activity() {
    let dir = tempfile::tempdir().unwrap();
    let t = load(dir.path()).0;
    let ahead = |group: &str| {
        let b =
            std::fs::read(stored_path(&dir.path().join("transcripts"), group, "jsonl")).unwrap();
        let lines = b.iter().position(|&x| x == 0).unwrap_or(b.len());
        (b.len() - lines) as u64
    };
    t.append(msg("quiet", "once", None)).await.unwrap();
    for i in 0..600 {
        t.append(msg(
            "busy",
            &format!("message {i} {}", "x".repeat(200)),
            None,
        ))
        .await
        .unwrap();
    }
    // The zeroing follows the commit's answer; the next append waits for it.
    t.append(msg("quiet", "twice", None)).await.unwrap();
    assert!(ahead("quiet") <= PREALLOCATE_FIRST, "{}", ahead("quiet"));
    assert!(ahead("busy") > PREALLOCATE_FIRST * 2, "{}", ahead("busy"));
    assert!(ahead("busy") <= PREALLOCATE_BYTES);
    t.close();
}

/// Appends `text` to group `demo`, stops, and opens `dir` again: the lines the
/// restart reports dropped, and the group's texts.
async fn append_then_reopen(t: Transcripts, dir: &Path, text: &str) -> (usize, Vec<String>) {
    t.append(msg("demo", text, None)).await.unwrap();
    t.close();
    let (t, report, _) = load(dir);
    let out = (report.dropped_lines, texts(&t, "demo"));
    t.close();
    out
}

#[tokio::test]
async fn lines_written_together_fail_together_and_leave_other_groups_alone() {
    let dir = tempfile::tempdir().unwrap();
    // Unsynced: a sync of /dev/full fails too, and a failed sync refuses the whole
    // batch (a_failed_sync_refuses_the_batch_…); this test is about the writes.
    let (t, _, _) = Transcripts::open(
        dir.path(),
        EventBus::new(16),
        false,
        Arc::new(NoPeers),
        4,
        TranscriptLimits::UNBOUNDED,
    )
    .unwrap();
    // Writes to /dev/full fail (ENOSPC): a group whose disk is full. Linked after the
    // load, which would read /dev/full's endless zeros.
    let full = dir
        .path()
        .join("transcripts")
        .join(format!("{}.jsonl", file_stem("full")));
    std::os::unix::fs::symlink("/dev/full", &full).unwrap();
    let envs = [
        msg("full", "one", None),
        msg("full", "two", None),
        msg("fine", "three", None),
        msg("fine", "four", None),
        msg("full", "five", None),
    ];
    let results = t
        .append_many(envs.iter().map(|e| received(e, &e.to_bytes())).collect())
        .await;
    let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
    assert_eq!(ok, [false, false, true, true, false], "{results:?}");
    assert!(
        t.recent("full", 10).is_empty(),
        "nothing of a failed write kept"
    );
    assert_eq!(texts(&t, "fine"), ["three", "four"]);
    t.close();
    std::fs::remove_file(&full).unwrap();
    let (t, report, _) = load(dir.path());
    assert_eq!(report.dropped_lines, 0);
    assert_eq!(texts(&t, "fine"), ["three", "four"]);
    t.close();
}

#[tokio::test]
async fn an_append_after_close_is_refused_and_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _, _) = load(dir.path());
    let kept = msg("g", "before the close", None);
    assert_eq!(t.append(kept.clone()).await.unwrap(), Appended::New);
    t.close();
    let late = msg("g", "after the close", None);
    let err = t.append(late.clone()).await.unwrap_err();
    assert!(matches!(err, TranscriptError::Stopped), "{err}");
    assert!(
        !t.contains("g", &late.id, None),
        "a refused message is not kept in memory"
    );
    assert!(t.contains("g", &kept.id, None));
}
