//! Test support: [`Clocked`], the smallest [`Ports`] the turn code runs against — one
//! bot with a virtual clock and an LLM that always gives the same answer — for unit
//! tests of the pipeline's parts (the budget's day, the shared judge's duty).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use ulid::Ulid;

use crate::config::{BotSettings, MeshSettings};
use crate::egress::acks::ClaimAcks;
use crate::engine::budget::Limits;
use crate::engine::metered::LlmCall;
use crate::llm::{Completion, Endpoint, LlmError, Usage};
use crate::telemetry::events::Event;
use crate::telemetry::metrics::{DecisionLabel, Metrics};
use crate::turn::brain::{Brain, Tuning};
use crate::turn::ports::SliceLog;
use crate::turn::{Llm, Ports, Provider};
use crate::wire::envelope::{Author, Envelope};

/// One bot, a virtual clock, an LLM that answers every call with `answer` (40 prompt
/// and 8 completion tokens), and the ephemeral envelopes it broadcast. It takes no
/// turn that needs a claim or a post: those panic.
pub(crate) struct Clocked {
    /// The bot.
    pub(crate) brain: Brain,
    /// Unix milliseconds now.
    pub(crate) now: AtomicU64,
    /// LLM calls made.
    pub(crate) judge_calls: AtomicU64,
    /// What every LLM call answers.
    answer: String,
    /// Never cancelled.
    stop: CancellationToken,
    /// Claims and verdicts broadcast, in order.
    pub(crate) sent: Mutex<Vec<Envelope>>,
}

impl Clocked {
    /// `brain` at `now_ms`, its LLM answering `answer`.
    pub(crate) fn new(brain: Brain, now_ms: u64, answer: &str) -> Clocked {
        Clocked {
            brain,
            now: AtomicU64::new(now_ms),
            judge_calls: AtomicU64::new(0),
            answer: answer.to_string(),
            stop: CancellationToken::new(),
            sent: Mutex::new(Vec::new()),
        }
    }

    /// Bot `me` alone with a remote LLM answering `answer`, on the daily budget
    /// `limits`, at 2026-01-01 23:00 UTC.
    pub(crate) fn alone(me: &BotSettings, limits: Limits, answer: &str) -> Clocked {
        let tuning = Tuning {
            me: Arc::new(me.clone()),
            colleagues: Vec::new(),
            provider: Provider::Remote {
                judge: Endpoint::new("test://judge", "m"),
                reply: Endpoint::new("test://reply", "m"),
            },
            mesh: Arc::new(MeshSettings::default()),
            budget: limits,
        };
        let brain = Brain::with(tuning, std::slice::from_ref(me), Arc::new(Metrics::new()));
        Clocked::new(brain, 1_767_308_400_000, answer)
    }

    /// Alice's message `text` in group `demo`, now.
    pub(crate) fn question(&self, text: &str) -> Envelope {
        Envelope::message(
            Ulid::new(),
            self.now_millis(),
            "demo",
            "A",
            Author::human("alice"),
            text,
        )
    }
}

/// How many times `p`'s bot decided `action`/`reason`.
pub(crate) fn count(p: &Clocked, action: &str, reason: &str) -> u64 {
    p.brain
        .metrics
        .decisions
        .get_or_create(&DecisionLabel {
            action: action.into(),
            reason: reason.into(),
        })
        .get()
}

impl Llm for Clocked {
    fn complete<'a>(&'a self, _call: LlmCall<'a>) -> BoxFuture<'a, Result<Completion, LlmError>> {
        self.judge_calls.fetch_add(1, Ordering::Relaxed);
        let text = self.answer.clone();
        Box::pin(async move {
            Ok(Completion {
                text,
                usage: Usage {
                    prompt_tokens: 40,
                    completion_tokens: 8,
                },
                attempts: 1,
                tool_calls: Vec::new(),
            })
        })
    }

    fn draft<'a>(
        &'a self,
        call: LlmCall<'a>,
    ) -> BoxFuture<'a, Result<crate::llm::Drafting, LlmError>> {
        Box::pin(async move {
            let head = self.complete(call).await?.text;
            Ok(crate::llm::Drafting {
                head,
                rest: Box::pin(async { Ok(Completion::offline("drafted")) }),
            })
        })
    }
}

/// No context: the bot has seen nothing but the message it is given.
impl SliceLog for Clocked {
    fn read_log<R>(&self, read: impl FnOnce(&[Arc<Envelope>]) -> R) -> R {
        read(&[])
    }
}

impl Ports for Clocked {
    fn brain(&self) -> &Brain {
        &self.brain
    }
    fn mesh(&self) -> Arc<MeshSettings> {
        self.brain.tuning().mesh.clone()
    }
    fn llm(&self) -> &dyn Llm {
        self
    }
    fn now_millis(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }
    fn new_id(&self) -> Ulid {
        Ulid::new()
    }
    fn jitter_ms(&self, _max_ms: u64) -> u64 {
        0
    }
    fn stopping(&self) -> &CancellationToken {
        &self.stop
    }
    fn broadcast(&self, env: &Envelope) {
        self.sent.lock().push(env.clone());
    }
    fn send_to(&self, _peers: &[String], env: &Envelope) {
        self.sent.lock().push(env.clone());
    }
    fn broadcast_tracked(&self, _env: &Envelope) -> ClaimAcks {
        unreachable!("Clocked takes no turn that claims")
    }
    fn publish(self: Arc<Self>, _env: Envelope) -> BoxFuture<'static, Result<(), String>> {
        unreachable!("Clocked takes no turn that posts")
    }
    fn event(&self, _event: Event) {}
}
