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

/// An OpenAI-compatible completion, as the turn code asks for one.
pub trait Llm: Send + Sync {
    /// Completes `messages` at `ep` for `purpose`. `about` is the message the call is
    /// about (the trigger), which a real endpoint never sees and a scripted one
    /// answers by.
    fn complete<'a>(
        &'a self,
        ep: &'a Endpoint,
        purpose: Purpose,
        messages: &'a [ChatMessage],
        about: &'a Envelope,
    ) -> BoxFuture<'a, Result<Completion, LlmError>>;

    /// A reply call ([`Purpose::Reply`]) offering the model `tools`: its answer may ask
    /// to call some ([`Completion::tool_calls`]). An implementation that cannot offer
    /// tools (the simulator's scripted replies) answers as [`Llm::complete`] does,
    /// which is a plain answer: the tool loop then ends at once.
    fn complete_with_tools<'a>(
        &'a self,
        ep: &'a Endpoint,
        messages: &'a [ChatMessage],
        tools: &'a [ToolSpec],
        about: &'a Envelope,
    ) -> BoxFuture<'a, Result<Completion, LlmError>> {
        let _ = tools;
        self.complete(ep, Purpose::Reply, messages, about)
    }

    /// A drafting judge call ([`Purpose::Draft`]) at `ep`: the verdict line first, the
    /// reply after it (see [`Drafting`]). `about` as for [`Llm::complete`].
    fn draft<'a>(
        &'a self,
        ep: &'a Endpoint,
        messages: &'a [ChatMessage],
        about: &'a Envelope,
    ) -> BoxFuture<'a, Result<Drafting, LlmError>>;

    /// [`Llm::draft`] offering the model `tools` (none: a plain drafting call); the
    /// rest's [`Completion::tool_calls`] are the calls it asks for. An implementation
    /// that cannot offer tools answers as [`Llm::draft`] does.
    fn draft_with_tools<'a>(
        &'a self,
        ep: &'a Endpoint,
        messages: &'a [ChatMessage],
        tools: &'a [ToolSpec],
        about: &'a Envelope,
    ) -> BoxFuture<'a, Result<Drafting, LlmError>> {
        let _ = tools;
        self.draft(ep, messages, about)
    }
}

impl Llm for LlmClient {
    fn complete<'a>(
        &'a self,
        ep: &'a Endpoint,
        purpose: Purpose,
        messages: &'a [ChatMessage],
        _about: &'a Envelope,
    ) -> BoxFuture<'a, Result<Completion, LlmError>> {
        Box::pin(LlmClient::complete(self, ep, purpose, messages))
    }

    fn complete_with_tools<'a>(
        &'a self,
        ep: &'a Endpoint,
        messages: &'a [ChatMessage],
        tools: &'a [ToolSpec],
        _about: &'a Envelope,
    ) -> BoxFuture<'a, Result<Completion, LlmError>> {
        Box::pin(LlmClient::complete_with_tools(
            self,
            ep,
            Purpose::Reply,
            messages,
            tools,
        ))
    }

    fn draft<'a>(
        &'a self,
        ep: &'a Endpoint,
        messages: &'a [ChatMessage],
        _about: &'a Envelope,
    ) -> BoxFuture<'a, Result<Drafting, LlmError>> {
        Box::pin(LlmClient::draft(self, ep, messages))
    }

    fn draft_with_tools<'a>(
        &'a self,
        ep: &'a Endpoint,
        messages: &'a [ChatMessage],
        tools: &'a [ToolSpec],
        _about: &'a Envelope,
    ) -> BoxFuture<'a, Result<Drafting, LlmError>> {
        Box::pin(LlmClient::draft_with_tools(self, ep, messages, tools))
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
    /// Completes `messages` at `ep` for `purpose`, counted.
    pub(crate) async fn complete(
        &self,
        ep: &Endpoint,
        purpose: Purpose,
        messages: &[ChatMessage],
        about: &Envelope,
    ) -> Result<Completion, LlmError> {
        let started = Instant::now();
        let result = self.llm.complete(ep, purpose, messages, about).await;
        self.count(purpose, started, result)
    }

    /// A reply call offering `tools` (one round of the tool loop), counted as every
    /// reply call is: against the day's budget and in the metrics.
    pub(crate) async fn complete_with_tools(
        &self,
        ep: &Endpoint,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        about: &Envelope,
    ) -> Result<Completion, LlmError> {
        let started = Instant::now();
        let result = self
            .llm
            .complete_with_tools(ep, messages, tools, about)
            .await;
        self.count(Purpose::Reply, started, result)
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
