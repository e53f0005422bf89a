//! The LLM as every reply engine and the judge call it: [`Llm`], the completion the
//! turn code asks for (the node's client, or the simulator's script), and
//! [`MeteredLlm`], the narrow handle an engine takes instead of the whole `Brain`:
//! the LLM, the bot's daily budget and the metrics, so every call an engine makes is
//! counted against the day's budget and in `botmesh_llm_calls_total` the one way.

use std::time::Instant;

use futures_util::future::BoxFuture;

use crate::engine::budget::Budget;
use crate::llm::{
    ChatMessage, Completion, Drafting, Endpoint, LlmClient, LlmError, Purpose, ToolSpec,
};
use crate::telemetry::metrics::Metrics;
use crate::wire::envelope::Envelope;

/// One completion the turn code asks for: the request, whoever answers it.
#[derive(Clone, Copy)]
pub struct LlmCall<'a> {
    /// The endpoint the call goes to.
    pub ep: &'a Endpoint,
    /// What the call is for: the metrics' label, and only a reply or a drafting
    /// call is offered tools.
    pub purpose: Purpose,
    /// The prompt.
    pub messages: &'a [ChatMessage],
    /// The tools the model is offered (none: a plain call): its answer may ask to
    /// call some ([`Completion::tool_calls`]).
    pub tools: &'a [ToolSpec],
    /// The message the call is about (the trigger), which a real endpoint never sees
    /// and a scripted one answers by.
    pub about: &'a Envelope,
}

impl<'a> LlmCall<'a> {
    /// A plain call (no tools) of `messages` at `ep` for `purpose`, about `about`.
    pub fn new(
        ep: &'a Endpoint,
        purpose: Purpose,
        messages: &'a [ChatMessage],
        about: &'a Envelope,
    ) -> LlmCall<'a> {
        LlmCall {
            ep,
            purpose,
            messages,
            tools: &[],
            about,
        }
    }

    /// The same call offering the model `tools`.
    pub fn offering(self, tools: &'a [ToolSpec]) -> LlmCall<'a> {
        LlmCall { tools, ..self }
    }
}

/// An OpenAI-compatible completion, as the turn code asks for one. An implementation
/// that cannot offer tools (the simulator's scripted replies) answers as if none were
/// offered: a plain answer, so the tool loop ends at once.
pub trait Llm: Send + Sync {
    /// Completes `call` whole.
    fn complete<'a>(&'a self, call: LlmCall<'a>) -> BoxFuture<'a, Result<Completion, LlmError>>;

    /// A drafting judge call (`call.purpose` is [`Purpose::Draft`]): the verdict line
    /// first, the reply after it (see [`Drafting`]); the rest's
    /// [`Completion::tool_calls`] are the calls it asks for.
    fn draft<'a>(&'a self, call: LlmCall<'a>) -> BoxFuture<'a, Result<Drafting, LlmError>>;
}

impl Llm for LlmClient {
    fn complete<'a>(&'a self, call: LlmCall<'a>) -> BoxFuture<'a, Result<Completion, LlmError>> {
        Box::pin(self.complete_with_tools(call.ep, call.purpose, call.messages, call.tools))
    }

    fn draft<'a>(&'a self, call: LlmCall<'a>) -> BoxFuture<'a, Result<Drafting, LlmError>> {
        Box::pin(self.draft_with_tools(call.ep, call.messages, call.tools))
    }
}

/// An [`Llm`] with what every call is counted against: the handle a reply engine
/// (the model's tool loop) and the judge make their calls through. Borrowed for one
/// turn; never the whole `Brain`.
#[derive(Clone, Copy)]
pub(crate) struct MeteredLlm<'a> {
    /// The LLM the calls go to.
    pub(crate) llm: &'a dyn Llm,
    /// The bot's daily budget: every call counts, a failed one too.
    pub(crate) budget: &'a Budget,
    /// Where each call is counted (`botmesh_llm_calls_total`, tokens, latency).
    pub(crate) metrics: &'a Metrics,
    /// The bot making the calls (for the log line of a failed call).
    pub(crate) bot: &'a str,
}

impl MeteredLlm<'_> {
    /// Completes `call`, counted: against the day's budget and in the metrics.
    pub(crate) async fn complete(&self, call: LlmCall<'_>) -> Result<Completion, LlmError> {
        let started = Instant::now();
        let result = self.llm.complete(call).await;
        self.count(call.purpose, started, result)
    }

    /// Counts a finished call (made at `started`): against the day's budget, in the
    /// metrics, and logged when it failed.
    fn count(
        &self,
        purpose: Purpose,
        started: Instant,
        result: Result<Completion, LlmError>,
    ) -> Result<Completion, LlmError> {
        // Every call counts against the day's budget, a failed one too (its tokens,
        // unknown, as none).
        self.budget.spend(
            result
                .as_ref()
                .map_or(0, |c| c.usage.prompt_tokens + c.usage.completion_tokens),
        );
        match result {
            Ok(c) => {
                self.metrics.llm_call(
                    purpose.as_str(),
                    "ok",
                    started.elapsed().as_secs_f64(),
                    c.usage.prompt_tokens,
                    c.usage.completion_tokens,
                );
                Ok(c)
            }
            Err(e) => {
                self.metrics.llm_call(
                    purpose.as_str(),
                    e.label(),
                    started.elapsed().as_secs_f64(),
                    0,
                    0,
                );
                tracing::warn!(bot = %self.bot, purpose = purpose.as_str(), error = %e, "LLM call failed");
                Err(e)
            }
        }
    }
}
