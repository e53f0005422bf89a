//! The daily LLM budget (`engine::budget`) through the real pipeline
//! (`consider_with`) over a [`crate::turn::Ports`] whose clock is virtual: N judged
//! messages spend the budget, the next one is not judged, and past local midnight the
//! bot judges again.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ulid::Ulid;

use crate::config::BotSettings;
use crate::config::OverBudget;
use crate::engine::budget::Limits;
use crate::turn::Ports;
use crate::wire::envelope::{Author, Envelope};

use crate::turn::test_ports::{count, Clocked};

async fn message(p: &Arc<Clocked>, text: &str) {
    let env = p.question(text);
    if let Some(turn) = crate::turn::on_message(p, &Arc::new(env), Vec::new()) {
        turn.await;
    }
}

/// [`Clocked::alone`], shared with the turns it starts.
fn clocked(me: &BotSettings, limits: Limits, answer: &str) -> Arc<Clocked> {
    Arc::new(Clocked::alone(me, limits, answer))
}

#[tokio::test(start_paused = true)]
async fn a_drafting_call_that_declines_counts_its_prompt_against_the_days_tokens() {
    let me = BotSettings::from_toml("name = \"A\"\njudge_drafts = true").expect("bot");
    let limits = Limits {
        calls: None,
        tokens: Some(1_000_000),
        over: OverBudget::Mentions,
        offset_min: 0,
    };
    let head = r#"{"speak": false, "relevance": 0.1}"#;
    let p = clocked(&me, limits, head);
    message(&p, "question 0").await;
    assert_eq!(count(&p, "silent", "judge_declined"), 1);
    // The prompt the drafting call sent (no context: Clocked keeps none).
    let sent = Envelope::message(
        Ulid::new(),
        0,
        "demo",
        "A",
        Author::human("alice"),
        "question 0",
    );
    let prompt: usize = crate::turn::reply::drafting_messages(&me, &[], &[], &sent)
        .iter()
        .map(|m| m.content.chars().count())
        .sum();
    let status = p
        .brain
        .budget
        .status(&p.brain.tuning().budget, p.now_millis());
    assert_eq!(status.calls, 1);
    assert_eq!(
        status.tokens,
        crate::llm::estimate_tokens(prompt) + crate::llm::estimate_tokens(head.len()),
        "the declined call's prompt and verdict line, estimated: its usage never comes"
    );
}

#[tokio::test(start_paused = true)]
async fn n_calls_judge_the_next_message_is_not_judged_and_midnight_resumes() {
    let me = BotSettings::from_toml("name = \"A\"").expect("bot");
    let limits = Limits {
        calls: Some(3),
        tokens: None,
        over: OverBudget::Mentions,
        offset_min: 0,
    };
    // 2026-01-01 23:00 UTC.
    let p = clocked(&me, limits, r#"{"speak": false, "relevance": 0.1}"#);
    for i in 0..3 {
        message(&p, &format!("question {i}")).await;
    }
    assert_eq!(p.judge_calls.load(Ordering::Relaxed), 3);
    assert_eq!(count(&p, "silent", "judge_declined"), 3);
    message(&p, "question 3").await;
    assert_eq!(p.judge_calls.load(Ordering::Relaxed), 3, "not judged");
    assert_eq!(count(&p, "silent", "budget"), 1);
    assert_eq!(
        p.brain
            .metrics
            .budget_exhausted
            .get_or_create(&crate::telemetry::metrics::ResultLabel {
                result: "calls".into()
            })
            .get(),
        1
    );
    // 59 minutes later, still the same day.
    p.now.fetch_add(59 * 60_000, Ordering::Relaxed);
    message(&p, "question 4").await;
    assert_eq!(count(&p, "silent", "budget"), 2);
    // Past midnight: a new day, judged again.
    p.now.fetch_add(60_000, Ordering::Relaxed);
    message(&p, "question 5").await;
    assert_eq!(
        p.judge_calls.load(Ordering::Relaxed),
        4,
        "judged the next day"
    );
    assert_eq!(count(&p, "silent", "judge_declined"), 4);
    let status = p
        .brain
        .budget
        .status(&p.brain.tuning().budget, p.now_millis());
    assert_eq!(
        (status.calls, status.tokens, status.exhausted),
        (1, 48, None)
    );
}
