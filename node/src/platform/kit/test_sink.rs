//! For adapters' unit tests: a sink that records arrivals the way the transcript does
//! and tells waiters of each new entry as the node's event bus does, and an adapter
//! context around it, and the kit's rule for a colleague's copy checked through an
//! adapter ([`assert_colleague_copy_recorded_once`]). One copy for every adapter's
//! tests.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use ulid::Ulid;

use crate::ingress::ingest::Arrival;
use crate::platform::AdapterContext;
use crate::store::transcript::{platform_ids, Appended, TranscriptError};
use crate::wire::envelope::{Author, AuthorKind, Envelope};

/// A sink that records arrivals the way the transcript does (dedup by id and by each
/// platform id), and tells its event bus, as the node does.
pub(crate) struct TestSink(Mutex<Vec<Envelope>>, crate::telemetry::events::EventBus);

impl Default for TestSink {
    fn default() -> Self {
        TestSink(
            Mutex::default(),
            crate::telemetry::events::EventBus::new(64),
        )
    }
}

impl TestSink {
    /// Records `env` unless its id or one of its platform ids is already recorded.
    pub(crate) fn add(&self, env: Envelope) -> Appended {
        let mut v = self.0.lock();
        let pids: Vec<String> = env
            .platform_msg_id
            .as_deref()
            .map(|p| platform_ids(p).map(str::to_string).collect())
            .unwrap_or_default();
        let dup = v.iter().any(|e| {
            e.id == env.id
                || e.platform_msg_id
                    .as_deref()
                    .is_some_and(|p| platform_ids(p).any(|p| pids.iter().any(|q| q == p)))
        });
        if dup {
            return Appended::Duplicate;
        }
        v.push(env.clone());
        self.1.publish(crate::telemetry::events::Event::Message {
            envelope: Arc::new(env),
        });
        Appended::New
    }
    /// Forgets the newest entry (as if it had never been recorded).
    pub(crate) fn forget_last(&self) {
        self.0.lock().pop();
    }
    /// Everything recorded, oldest first.
    pub(crate) fn all(&self) -> Vec<Envelope> {
        self.0.lock().clone()
    }
}

impl crate::ingress::ingest::Sink for TestSink {
    fn await_platform_msg<'a>(
        &'a self,
        group: &'a str,
        platform_msg_id: &'a str,
        within: Duration,
    ) -> BoxFuture<'a, bool> {
        Box::pin(crate::ingress::ingest::recorded_within(
            self.1.subscribe(),
            move || self.has_platform_msg(group, platform_msg_id),
            group,
            platform_msg_id,
            within,
        ))
    }
    fn record_many(
        &self,
        envs: Vec<crate::store::transcript::Received>,
        _source: crate::ingress::ingest::Source,
    ) -> BoxFuture<'_, Vec<Result<Appended, TranscriptError>>> {
        let out = envs
            .into_iter()
            .map(|r| Ok(self.add((*r.env).clone())))
            .collect();
        Box::pin(async move { out })
    }
    fn arrive(&self, arrival: Arrival) -> BoxFuture<'_, Result<Appended, TranscriptError>> {
        let r = self.add(arrival.env);
        Box::pin(async move { Ok(r) })
    }
    fn on_claim(&self, _env: Arc<Envelope>) {}
    fn answer_claim(&self, _env: &Envelope) -> crate::wire::batch::ClaimReply {
        crate::wire::batch::ClaimReply::default()
    }
    fn has_platform_msg(&self, _group: &str, platform_msg_id: &str) -> bool {
        self.0.lock().iter().any(|e| {
            e.platform_msg_id
                .as_deref()
                .is_some_and(|p| platform_ids(p).any(|p| p == platform_msg_id))
        })
    }
    fn message(&self, _group: &str, id: &Ulid) -> Option<Arc<Envelope>> {
        self.0
            .lock()
            .iter()
            .find(|e| &e.id == id)
            .cloned()
            .map(Arc::new)
    }
}

/// An adapter context around `sink`, for an adapter's inbound rules without a node.
pub(crate) fn ingest(sink: Arc<TestSink>) -> AdapterContext {
    AdapterContext {
        metrics: Arc::new(crate::telemetry::metrics::Metrics::new()),
        accepting: tokio_util::sync::CancellationToken::new(),
        tasks: tokio_util::task::TaskTracker::new(),
        sink,
    }
}

/// Waits until every task the adapter spawned on `ing` has ended (a colleague's copy
/// waiting for its bridge copy), then lets it spawn more.
pub(crate) async fn settle(ing: &AdapterContext) {
    ing.tasks.close();
    ing.tasks.wait().await;
    ing.tasks.reopen();
}

/// The bridge copy of bot `colleague`'s message `text` (depth 1), naming its platform
/// copy `platform_msg_id`.
pub(crate) fn bridge_copy(colleague: &str, text: &str, platform_msg_id: &str) -> Envelope {
    let mut e = Envelope::message(
        Ulid::new(),
        1,
        "team",
        colleague,
        Author::bot(colleague),
        text,
    );
    e.depth = 1;
    e.platform_msg_id = Some(platform_msg_id.into());
    e
}

/// Asserts the kit's rule for a colleague bot's message that arrives both from the
/// platform and over the bridge, through an adapter: it is recorded once, keeping the
/// bridge copy's depth, whether the bridge copy comes first (message 0), during the
/// platform copy's wait (message 1, 2 s in: the wait ends when it is recorded, told,
/// not polled), or never (message 2: after `grace` the platform copy is recorded as
/// context at `max_depth`, which nobody answers). `deliver(n)` hands the adapter the
/// platform's copy of message n, named `pid(n)` on the platform; `colleague` wrote it,
/// and `text` is how the mesh shows it.
pub(crate) async fn assert_colleague_copy_recorded_once<Fut: Future>(
    (sink, ing): (&TestSink, &AdapterContext),
    (colleague, text, max_depth): (&str, &str, u32),
    grace: Duration,
    pid: impl Fn(u32) -> String,
    mut deliver: impl FnMut(u32) -> Fut,
) {
    let before = sink.all().len();
    sink.add(bridge_copy(colleague, text, &pid(0)));
    deliver(0).await;
    settle(ing).await;
    assert_eq!(sink.all().len(), before + 1, "the platform copy is dropped");
    deliver(1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sink.all().len(), before + 1, "the platform copy waits");
    sink.add(bridge_copy(colleague, text, &pid(1)));
    let told = tokio::time::Instant::now();
    settle(ing).await;
    assert_eq!(
        told.elapsed(),
        Duration::ZERO,
        "the wait ends when the bridge copy is recorded (told, not polled)"
    );
    let all = sink.all();
    assert_eq!(all.len(), before + 2);
    assert_eq!(all[before + 1].depth, 1, "the bridge copy's depth");
    let start = tokio::time::Instant::now();
    deliver(2).await;
    settle(ing).await;
    assert!(start.elapsed() >= grace, "the platform copy waited");
    let ctx = sink.all().pop().unwrap();
    assert_eq!(
        (
            ctx.author.name.as_str(),
            ctx.author.kind,
            ctx.depth,
            ctx.text.as_str()
        ),
        (colleague, AuthorKind::Bot, max_depth, text),
        "context nobody answers"
    );
}
