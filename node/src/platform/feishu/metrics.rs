//! Feishu's own metrics: its event callbacks, its long connection and its API calls.
//! Declared here, next to the code that counts them, and registered in the node's
//! [`Metrics`] on first use ([`Metrics::own`]), so the central metrics name no
//! platform. Every platform's messages are also counted in the shared
//! `botmesh_platform_events_total`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::telemetry::metrics::{Metrics, OwnFamilies, ResultLabel};

/// Labels naming a long-connection state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabel {
    /// The state's name (`connecting`, `connected`, `reconnecting`, `stopped`).
    pub(crate) state: String,
}

/// Labels naming a Feishu API endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EndpointLabel {
    /// `METHOD /path`, ids replaced by `{id}`.
    pub(crate) endpoint: String,
}

/// The Feishu families, registered together.
#[derive(Default)]
pub(crate) struct FeishuMetrics {
    /// Feishu/Lark event callbacks, by result (`message`, `challenge`, `duplicate`,
    /// `ignored`, or the rejection reason).
    pub(crate) events: Family<ResultLabel, Counter>,
    /// 1 for the Feishu long connection's current state (`connecting`, `connected`,
    /// `reconnecting`, `stopped`), 0 for the others: an operator sees a bot that
    /// cannot hear Feishu.
    pub(crate) connection: Family<StateLabel, Gauge>,
    /// Feishu long-connection attempts and endings, by result (`connected`,
    /// `handshake_refused`, `endpoint_refused`, `dropped`, …).
    pub(crate) connects: Family<ResultLabel, Counter>,
    /// Every call to the Feishu API, by endpoint (`METHOD /path` with ids as
    /// `{id}`): the quota an operator spends.
    pub(crate) api_calls: Family<EndpointLabel, Counter>,
}

impl OwnFamilies for FeishuMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "botmesh_feishu_events",
            "Feishu/Lark event callbacks, by result",
            self.events.clone(),
        );
        registry.register(
            "botmesh_feishu_connection",
            "1 for the Feishu long connection's current state",
            self.connection.clone(),
        );
        registry.register(
            "botmesh_feishu_connects",
            "Feishu long-connection attempts and endings, by result",
            self.connects.clone(),
        );
        registry.register(
            "botmesh_feishu_api_calls",
            "Calls to the Feishu API, by endpoint",
            self.api_calls.clone(),
        );
    }
}

/// Counts one Feishu event callback.
pub(crate) fn event(metrics: &Metrics, result: &str) {
    metrics
        .own::<FeishuMetrics>()
        .events
        .get_or_create(&ResultLabel {
            result: result.into(),
        })
        .inc();
}

/// Sets the long connection's state gauge for `state`.
pub(crate) fn set_connection(metrics: &Metrics, state: &str, value: i64) {
    metrics
        .own::<FeishuMetrics>()
        .connection
        .get_or_create(&StateLabel {
            state: state.into(),
        })
        .set(value);
}

/// Counts one call to the Feishu API.
pub(crate) fn api_call(metrics: &Metrics, endpoint: &str) {
    metrics
        .own::<FeishuMetrics>()
        .api_calls
        .get_or_create(&EndpointLabel {
            endpoint: endpoint.into(),
        })
        .inc();
}

/// Counts one long-connection attempt or ending.
pub(crate) fn connect(metrics: &Metrics, result: &str) {
    metrics
        .own::<FeishuMetrics>()
        .connects
        .get_or_create(&ResultLabel {
            result: result.into(),
        })
        .inc();
}
