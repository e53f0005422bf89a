//! `HotCounters`: the series a node bumps for every envelope it receives, each
//! looked up in its family once.
//!
//! A `Family::get_or_create` costs a label `String`, a hash and a read lock per call;
//! the receive path counts each envelope three to four times (its result, its
//! signature scheme, its transcript append, the decision about it). A handle kept
//! from the first lookup shares the family's value, so `/metrics` reads the same
//! numbers, and a series still appears only once it has counted something.

use std::collections::HashMap;
use std::sync::OnceLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// The series the receive path bumps for every envelope, each looked up in its family
/// once, at its first use (so a series still appears only once it has counted
/// something): a family lookup costs a label `String`, a hash and a read lock per
/// call. The handles share the family's values, so a scrape reads them as before.
#[derive(Default)]
pub(crate) struct HotCounters {
    /// `botmesh_envelopes_in_total{result="accepted"}`.
    pub(crate) accepted: OnceLock<Counter>,
    /// `botmesh_envelopes_in_total{result="duplicate"}`.
    pub(crate) duplicate: OnceLock<Counter>,
    /// `botmesh_signatures_verified_total{scheme}`, by [`scheme_index`].
    pub(crate) schemes: [OnceLock<Counter>; 3],
    /// `botmesh_transcript_appends_total{result="bridge"}`.
    pub(crate) appends_bridge: OnceLock<Counter>,
    /// `botmesh_decisions_total{action,reason}` by its two names: a node decides
    /// about every message it records, and the names are a short fixed list.
    pub(crate) decisions: parking_lot::RwLock<HashMap<(&'static str, &'static str), Counter>>,
}

/// `family`'s series for `labels`, looked up once and kept in `cell`.
pub(crate) fn resolved<'a, S>(
    cell: &'a OnceLock<Counter>,
    family: &Family<S, Counter>,
    labels: impl FnOnce() -> S,
) -> &'a Counter
where
    S: Clone + std::hash::Hash + Eq,
{
    cell.get_or_init(|| family.get_or_create(&labels()).clone())
}

/// The slot of `scheme` in [`HotCounters::schemes`].
pub(crate) fn scheme_index(scheme: crate::wire::signing::Scheme) -> usize {
    use crate::wire::signing::Scheme;
    match scheme {
        Scheme::Pairwise => 0,
        Scheme::Ed25519 => 1,
        Scheme::Hmac => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::Metrics;
    use crate::wire::signing::Scheme;

    #[test]
    fn kept_handles_count_into_the_families_and_appear_only_once_used() {
        let m = Metrics::new();
        let before = m.render();
        assert!(
            !before.contains(r#"result="accepted""#),
            "no series before its first count:\n{before}"
        );
        for _ in 0..3 {
            m.envelope_in("accepted");
            m.signature_verified(Scheme::Pairwise);
            m.transcript_append("bridge");
            m.decision("silent", "not_mentioned");
        }
        m.envelope_in("duplicate");
        m.envelope_in("rate_limited");
        m.signature_verified(Scheme::Ed25519);
        m.transcript_append("api");
        m.decision("reply", "mentioned");
        let text = m.render();
        for line in [
            r#"botmesh_envelopes_in_total{result="accepted"} 3"#,
            r#"botmesh_envelopes_in_total{result="duplicate"} 1"#,
            r#"botmesh_envelopes_in_total{result="rate_limited"} 1"#,
            r#"botmesh_signatures_verified_total{scheme="pairwise"} 3"#,
            r#"botmesh_signatures_verified_total{scheme="ed25519"} 1"#,
            r#"botmesh_transcript_appends_total{result="bridge"} 3"#,
            r#"botmesh_transcript_appends_total{result="api"} 1"#,
            r#"botmesh_decisions_total{action="silent",reason="not_mentioned"} 3"#,
            r#"botmesh_decisions_total{action="reply",reason="mentioned"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains(r#"scheme="hmac""#), "unused: no series");
    }

    #[test]
    fn every_scheme_has_its_own_slot() {
        let slots: std::collections::HashSet<usize> =
            [Scheme::Pairwise, Scheme::Ed25519, Scheme::Hmac]
                .into_iter()
                .map(scheme_index)
                .collect();
        assert_eq!(slots.len(), 3);
        assert!(slots
            .iter()
            .all(|&i| i < HotCounters::default().schemes.len()));
    }
}
