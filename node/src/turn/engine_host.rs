//! What a turn offers its reply engine beyond the LLM and the status
//! (`engine::context::TurnHost`), over the turn code's [`Ports`]: the group's
//! transcript, the group tools' turn in flight, who answers an agent's permission
//! questions, the page's progress line, the trail's note of a rejected tool call, and
//! the built-in model's prompt. The pipeline's writing step builds one for its trigger
//! and hands it to the engine in its `TurnContext`.

use std::sync::Arc;

use ulid::Ulid;

use crate::agent::acp::ToolRejection;
use crate::engine::context::{ModelPrompt, TurnHost};
use crate::telemetry::events::Event;
use crate::turn::context::context_before;
use crate::turn::ports::Ports;
use crate::wire::envelope::Envelope;

/// The turn on `msg`, as its engine sees it.
pub(crate) struct EngineHost<'a, P: ?Sized> {
    /// The node (or the simulator).
    pub(crate) p: &'a P,
    /// The trigger.
    pub(crate) msg: &'a Envelope,
    /// Why the bot speaks (`mentioned`, `interjected`…), for the offline reply.
    pub(crate) why: &'a str,
}

impl<P: Ports + ?Sized> TurnHost for EngineHost<'_, P> {
    fn before(&self, n: usize) -> Vec<Arc<Envelope>> {
        context_before(self.p, self.msg, n)
    }

    fn status_ends(&self, n: usize) -> Vec<Arc<Envelope>> {
        self.p.status_ends(&self.msg.group, n)
    }

    fn consumed(&self, id: &Ulid) -> bool {
        self.p.brain().asks.consumed(id)
    }

    fn mark_turn(&self) -> Box<dyn Send + '_> {
        Box::new(
            self.p
                .brain()
                .asks
                .turn_started(&self.msg.group, self.msg.id),
        )
    }

    fn prompted(&self, detail: &str) -> Box<dyn Send + '_> {
        let brain = self.p.brain();
        brain.asks.handed_out(&self.msg.group, self.msg.id);
        let mark = self.mark_turn();
        brain.trail.note(self.msg.id, "agent", "prompted", detail);
        mark
    }

    fn permissions_from(&self, before: &[Arc<Envelope>]) {
        let brain = self.p.brain();
        if let Some(asker) = &brain.permissions {
            let requester = crate::turn::approval::requester(self.msg, before, &brain.tuning());
            asker.turn_started(&self.msg.group, requester, self.msg.id);
        }
    }

    fn progress(&self, text: String) {
        self.p.event(Event::Progress {
            group: self.msg.group.clone(),
            trigger: self.msg.id.to_string(),
            bot: self.p.brain().me().name.clone(),
            text,
        });
    }

    fn rejected(&self, rejection: &ToolRejection) {
        self.p.brain().trail.note(
            self.msg.id,
            "tool",
            "rejected",
            &crate::turn::outcome::rejection_detail(rejection),
        );
    }

    fn model_prompt(&self, context: &[Arc<Envelope>]) -> ModelPrompt {
        let t = self.p.brain().tuning();
        crate::turn::brain::model_prompt(&t, context, self.msg, self.why)
    }
}
