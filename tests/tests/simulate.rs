//! The turn-taking simulator on a few shipped scenarios: botmesh gives one answer where
//! XiaoBa's random delays give two, chains stop at max_depth, and a seed fixes the result.
//! (The full run is `botmesh simulate`; these use a small subset to stay fast.)

use std::path::PathBuf;

use std::sync::OnceLock;

use botmesh::simulate::{
    load_dir, render_doc, run_once, simulate, PolicyKind, Report, Tally, World,
};

fn scenario(name: &str) -> World {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(format!("{name}.toml"));
    World::load(&path).unwrap()
}

#[test]
fn two_relevant_bots_one_answer_under_botmesh_duplicates_under_xiaoba() {
    // Two questions, each with judges at 0.9 and 0.6 (one answer suffices).
    let w = scenario("collision-zh-two-relevant");
    let mut xiaoba_dups = 0;
    for seed in 0..30 {
        let t = run_once(&w, PolicyKind::Botmesh, seed);
        assert_eq!(t.dup_interjections, 0, "seed {seed}: {t:?}");
        assert_eq!(t.bot_posts, 2, "one answer per question, seed {seed}");
        assert_eq!(t.right_first, 2, "the 0.9 bot answers, seed {seed}");
        let x = run_once(&w, PolicyKind::Xiaoba, seed);
        if x.dup_interjections > 0 {
            xiaoba_dups += 1;
        }
    }
    assert!(
        xiaoba_dups > 0,
        "uniform 1–3 s delays should let both bots answer in some seeds"
    );
}

#[test]
fn botmesh_chains_never_exceed_max_depth() {
    for name in [
        "bot-chain-zh-ping-pong",
        "bot-chain-en-round-robin",
        "bot-chain-en-interjections",
    ] {
        let w = scenario(name);
        let max = w.mesh.max_depth;
        let mut xiaoba_longest = 0;
        for seed in 0..10 {
            let t = run_once(&w, PolicyKind::Botmesh, seed);
            assert!(t.longest_chain <= max, "{name} seed {seed}: {t:?}");
            assert_eq!(t.over_max_depth, 0, "{name} seed {seed}");
            xiaoba_longest =
                xiaoba_longest.max(run_once(&w, PolicyKind::Xiaoba, seed).longest_chain);
        }
        if name != "bot-chain-en-interjections" {
            // The scenario really is a loop: without a depth brake it runs past max_depth.
            assert!(
                xiaoba_longest > max,
                "{name}: xiaoba chain {xiaoba_longest}"
            );
        }
    }
}

#[test]
fn a_seed_fixes_the_report() {
    let worlds: Vec<World> = [
        "collision-en-close-call",
        "burst-zh-followup",
        "network-zh-claim-drops",
    ]
    .iter()
    .map(|n| scenario(n))
    .collect();
    let a = simulate(&worlds, &PolicyKind::ALL, 7, 3);
    let b = simulate(&worlds, &PolicyKind::ALL, 7, 3);
    assert_eq!(a, b);
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    let c = simulate(&worlds, &PolicyKind::ALL, 8, 3);
    assert_ne!(
        a.overall.get(PolicyKind::Xiaoba).unwrap().ttfa_p50_ms,
        None,
        "questions get answered"
    );
    assert_ne!(a, c, "another seed draws other latencies");
    let doc = render_doc(&a);
    assert_eq!(doc, render_doc(&b));
    for part in [
        "| botmesh |",
        "| xiaoba |",
        "| nanobot |",
        "| review-panel |",
        "seed 000",
        "seed 002",
        "seed 004",
    ] {
        assert!(doc.contains(part), "doc lacks {part}");
    }
}

#[test]
fn shipped_scenarios_are_valid() {
    let worlds = load_dir(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")).unwrap();
    assert!(worlds.len() >= 20, "{} scenarios", worlds.len());
    for w in &worlds {
        let n = w.bots.len();
        assert!((3..=8).contains(&n), "{}: {n} bots", w.scenario.name);
    }
    for lang in ["zh", "en"] {
        assert!(
            worlds.iter().any(|w| w.scenario.lang == lang),
            "no {lang} scenario"
        );
    }
}

#[test]
fn rounds_to_everyone_and_withdrawn_claims_under_botmesh() {
    // "Everyone, name one risk": each bot with something to say speaks.
    let w = scenario("multi-en-brainstorm");
    for seed in 0..10 {
        let t = run_once(&w, PolicyKind::Botmesh, seed);
        assert!(t.all_wanted > 0);
        assert_eq!(t.all_spoke, t.all_wanted, "seed {seed}: {t:?}");
    }
    // A failed winner withdraws and a bot that stood by answers instead.
    let w = scenario("failures-en-winner-fails");
    let mut t = Tally::default();
    for seed in 0..50 {
        t.add(&run_once(&w, PolicyKind::Botmesh, seed));
    }
    assert!(
        t.reasons
            .get("resume/claim_withdrawn")
            .copied()
            .unwrap_or(0)
            > 0,
        "{:?}",
        t.reasons
    );
    assert!(
        t.unanswered * 10 < t.expected,
        "{} of {} unanswered",
        t.unanswered,
        t.expected
    );
}

/// The report `botmesh simulate --seed 1 --runs 50` computes over the shipped
/// scenarios: computed once, shared by the tests that read it (the doc's own run).
fn shipped_report() -> &'static Report {
    static REPORT: OnceLock<Report> = OnceLock::new();
    REPORT.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let worlds = load_dir(&root.join("scenarios")).unwrap();
        simulate(&worlds, &PolicyKind::ALL, 1, 50)
    })
}

#[test]
fn the_shipped_report_is_what_the_simulator_writes() {
    // docs/turn-taking.md must be regenerated whenever the simulator or the scenarios
    // change: `botmesh simulate --seed 1 --runs 50 --write-doc docs/turn-taking.md`.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let report = shipped_report();
    let shipped = std::fs::read_to_string(root.join("docs/turn-taking.md")).unwrap();
    assert!(
        render_doc(report) == shipped,
        "docs/turn-taking.md is stale: regenerate it with \
         `botmesh simulate --seed 1 --runs 50 --write-doc docs/turn-taking.md`"
    );
    let botmesh = report.overall.get(PolicyKind::Botmesh).unwrap();
    assert_eq!(
        botmesh.dup_per_human_msg, 0.0,
        "no duplicate interjection in any scenario"
    );
}

/// A claim that a lossy link dropped arrives on a retry: a bot whose claim is not yet
/// acknowledged by a peer whose link works keeps waiting for it instead of posting
/// after `claim_ack_timeout_ms`, so no run of the lossy scenarios gives a second
/// answer, at any of these seeds (seeds 8 and 13 gave one before).
#[test]
fn lossy_links_give_no_duplicate_answer_at_any_seed() {
    for name in ["network-zh-claim-drops", "network-zh-lossy-links"] {
        let w = scenario(name);
        for seed in [1, 8, 13, 21, 34] {
            let t = botmesh::simulate::run_many(&w, PolicyKind::Botmesh, seed, 10);
            assert_eq!(t.dup_interjections, 0, "{name} seed {seed}: {t:?}");
        }
    }
}

/// The most relevant bot's judge is slow (heavy-tailed): the others' claims reach it
/// while it is still judging, it answers them `judging`, and they wait for its word
/// before committing — so it still answers first.
#[test]
fn a_slow_judge_on_the_most_relevant_bot_still_answers_first_in_the_simulator() {
    let w = scenario("network-en-slow-judge");
    let t = botmesh::simulate::run_many(&w, PolicyKind::Botmesh, 1, 50);
    assert!(t.expected > 0);
    assert!(
        t.right_first * 100 >= t.expected * 98,
        "right bot first {} of {}: {:?}",
        t.right_first,
        t.expected,
        t.reasons
    );
}

/// Writing while waiting: the winner's reply request goes out right after its claim,
/// in the same virtual millisecond, not after its relevance-scaled delay.
#[test]
fn the_winner_writes_its_reply_while_its_delay_runs() {
    let w = scenario("collision-zh-two-relevant");
    let (_, trace) = botmesh::simulate::trace_once(&w, PolicyKind::Botmesh, 1);
    let at = |line: &str| -> u64 { line.split_whitespace().next().unwrap().parse().unwrap() };
    let claim = trace
        .iter()
        .find(|l| l.contains("ErGoz") && l.contains("claims #0"))
        .unwrap_or_else(|| panic!("no claim by ErGoz: {trace:#?}"));
    let write = trace
        .iter()
        .find(|l| l.contains("ErGoz") && l.contains("writes a reply to #0"))
        .unwrap_or_else(|| panic!("no reply by ErGoz: {trace:#?}"));
    assert_eq!(at(claim), at(write), "{claim}\n{write}");
}

/// The quality bars, for every botmesh policy at every seed of the doc's seed table
/// (1, 2, 3, 8, 13; 50 runs of every shipped scenario each, the agent scenarios
/// included): no duplicate interjection, the right bot first on ≥ 98 % of the
/// questions, ≤ 0.3 % unanswered. Reads the doc's own run (`shipped_report`), so it
/// costs no simulation of its own.
#[test]
fn every_botmesh_policy_meets_the_bars_at_every_seed() {
    let report = shipped_report();
    let bars = report.bars();
    let policies = [
        PolicyKind::Botmesh,
        PolicyKind::BotmeshDrafting,
        PolicyKind::BotmeshShared,
    ];
    for seed in [1, 2, 3, 8, 13] {
        for policy in policies {
            let b = bars
                .iter()
                .find(|b| b.seed == seed && b.policy == policy)
                .unwrap_or_else(|| panic!("no row for {policy:?} at seed {seed}"));
            assert_eq!(b.dup_per_human_msg, 0.0, "{b:?}");
            assert!(b.right_bot_first_pct.unwrap() >= 98.0, "{b:?}");
            assert!(b.unanswered_pct.unwrap() <= 0.3, "{b:?}");
        }
    }
}

/// An agent asks a colleague mid-turn (the `ask` tool, modelled as it is on the wire:
/// its bot's "@colleague question" posted while the turn is in flight, the answer
/// handed back through the node's `turn::asks`), en and zh, at several seeds: the
/// colleague answers once and nobody else does, the answer reaches the waiting ask,
/// the asking turn posts its answer (none orphaned), no duplicate.
#[test]
fn an_agent_asks_a_colleague_mid_turn_and_finishes_its_turn() {
    for name in ["agent-en-ask-colleague", "agent-zh-ask-colleague"] {
        for seed in [1, 2, 3] {
            let t = botmesh::simulate::run_many(&scenario(name), PolicyKind::Botmesh, seed, 20);
            assert_eq!(t.asks, 20, "{name}@{seed}: one ask per run: {t:?}");
            assert_eq!(t.asks_answered, 20, "{name}@{seed}: {t:?}");
            assert_eq!(
                t.ask_replies, 20,
                "{name}@{seed}: one reply to each question: {t:?}"
            );
            assert_eq!(
                t.ask_turns_finished, 20,
                "{name}@{seed}: no orphaned turn: {t:?}"
            );
            assert_eq!(
                t.bot_posts,
                3 * 20,
                "{name}@{seed}: the question, its answer, the agent's answer: {t:?}"
            );
            assert_eq!(t.dup_interjections, 0, "{name}@{seed}: {t:?}");
            assert_eq!(t.right_first, t.expected, "{name}@{seed}: {t:?}");
        }
    }
}

/// Agent bots: a question to a busy agent waits for its next turn and is answered
/// by it; two relevant agents give one answer; a crashed agent's colleague answers
/// and the agent answers the next question; `/stop` posts nothing for the stopped
/// turn. Ten-minute turns cost no wall time (tokio's paused clock).
#[test]
fn agent_bots_take_long_turns_yield_crash_and_stop() {
    for name in ["agent-en-ask-while-working", "agent-zh-ask-while-working"] {
        let t = botmesh::simulate::run_many(&scenario(name), PolicyKind::Botmesh, 1, 20);
        assert_eq!(t.right_first, t.expected, "{name}: {t:?}");
        assert_eq!(
            t.bot_posts,
            3 * 20,
            "{name}: one answer each, the queued one too"
        );
        assert!(t.progress_events > 20, "{name}: progress while working");
    }
    for name in ["agent-en-two-agents", "agent-zh-two-agents"] {
        let t = botmesh::simulate::run_many(&scenario(name), PolicyKind::Botmesh, 1, 20);
        assert_eq!(t.dup_interjections, 0, "{name}: {t:?}");
        assert_eq!(t.right_first, t.expected, "{name}: {t:?}");
        let x = botmesh::simulate::run_many(&scenario(name), PolicyKind::Nanobot, 1, 20);
        assert!(x.dup_interjections > 0, "{name}: nanobot answers twice");
    }
    for name in ["agent-en-crash", "agent-zh-crash"] {
        let t = botmesh::simulate::run_many(&scenario(name), PolicyKind::Botmesh, 1, 20);
        assert_eq!(t.agent_crashes, 20, "{name}: {t:?}");
        assert_eq!(t.unanswered, 0, "{name}: a colleague answers: {t:?}");
        assert_eq!(t.right_first, t.expected, "{name}: {t:?}");
        assert_eq!(t.reasons.get("silent/reply_failed"), Some(&20), "{name}");
    }
    for name in ["agent-en-stop", "agent-zh-stop"] {
        let t = botmesh::simulate::run_many(&scenario(name), PolicyKind::Botmesh, 1, 20);
        assert_eq!(
            t.unwanted_answers, 0,
            "{name}: the stopped turn posts nothing"
        );
        assert_eq!(t.reasons.get("silent/stopped"), Some(&20), "{name}: {t:?}");
        assert_eq!(
            t.right_first, t.expected,
            "{name}: the next request is answered"
        );
        let x = botmesh::simulate::run_many(&scenario(name), PolicyKind::Nanobot, 1, 20);
        assert!(x.unwanted_answers > 0, "{name}: nanobot has no /stop");
    }
}

/// A scenario's agent table is checked: the ranges, and no model-only settings.
#[test]
fn a_bad_agent_table_is_refused_with_a_clear_error() {
    let base = |agent: &str| {
        format!(
            "group = \"t\"\n[[bots]]\nname = \"A\"\nagent = {agent}\n[[bots]]\nname = \"B\"\n\
             [[messages]]\nat = 0\nfrom = \"u\"\ntext = \"hi\"\n"
        )
    };
    let dir = std::env::temp_dir().join(format!("botmesh-sim-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (agent, says) in [
        ("{ min_secs = 0, max_secs = 10 }", "agent.min_secs"),
        (
            "{ min_secs = 60, max_secs = 10 }",
            "agent.max_secs (10) must be at least",
        ),
        ("{ min_secs = 10, max_secs = 7200 }", "an hour"),
        (
            "{ min_secs = 10, max_secs = 60, progress_secs = 0 }",
            "progress_secs",
        ),
        ("{ min_secs = 10, max = 60 }", "unknown field"),
    ] {
        let path = dir.join("bad.toml");
        std::fs::write(&path, base(agent)).unwrap();
        let err = format!("{:#}", World::load(&path).err().expect("refused"));
        assert!(err.contains(says), "{agent}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
