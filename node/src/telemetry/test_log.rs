//! Tests' view of the log: what a piece of code logged and at which level, so a test
//! can tell a warning an operator would act on from routine debug without parsing a
//! process's output.

use std::sync::Arc;

use parking_lot::Mutex;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// One logged event: its level and its message.
pub(crate) type Line = (tracing::Level, String);

/// The levels and messages of what `f` logs on this thread, in order.
pub(crate) fn logged(f: impl FnOnce()) -> Vec<Line> {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Keep(kept.clone()));
    tracing::subscriber::with_default(subscriber, f);
    let lines = kept.lock().clone();
    lines
}

/// A layer that keeps every event it sees.
struct Keep(Arc<Mutex<Vec<Line>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Keep {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0.lock().push((*event.metadata().level(), message.0));
    }
}

/// Reads an event's `message` field (its text).
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}
