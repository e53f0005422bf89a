//! The turn-taking simulator behind `botmesh simulate`.
//!
//! Several bots, scripted humans and a scripted judge, in virtual time. Each
//! scenario file (`scenarios/*.toml`) gives the bots, the human messages with their
//! times, what each bot's judge would answer about each message, LLM latency and
//! network delay/drop distributions. The simulator then runs the scenario under
//! botmesh's own policy and under three baselines that reproduce earlier systems
//! (XiaoBa's bridge, the nanobot relay, the review panel), and measures duplicate
//! interjections, whether the right bot answered, time to first answer, bot-only
//! chains, LLM calls and judge prompt sizes.
//!
//! Under botmesh's own policy every bot runs the production turn code (`turn::triage`,
//! `turn::act`) against a virtual-time `turn::Ports` on tokio's paused clock
//! ([`virtual_mesh`]); only the LLM and the network are scripted. The baselines are a
//! discrete-event loop over virtual milliseconds (a heap of timed events) sharing the
//! same network model, mention matcher and judge prompts. A run is fully determined by
//! its seed.
//!
//! `botmesh replay` (`app::replay`) runs the same production code for one bot over
//! a recorded transcript instead of a scenario, with changed settings.

mod baseline;
mod network;
mod policy;
mod render;
mod report;
mod scenario;
mod script;
mod tally;
#[cfg(test)]
mod tests;
mod virtual_mesh;

use baseline::Sim;
use network::{Carry, Network};
use script::{reply_text, scripted_verdict};
use tally::{measure, register_post, Post};

pub use policy::PolicyKind;
pub use render::*;
pub use report::*;
pub use scenario::*;
pub use tally::Tally;

/// A run stops early once this many bot messages were posted (a runaway loop).
pub(crate) const RUNAWAY_POSTS: usize = 200;

/// Runs one scenario once under one policy.
pub fn run_once(w: &World, policy: PolicyKind, seed: u64) -> Tally {
    match policy {
        p if p.is_botmesh() => virtual_mesh::run(w, seed, false, p.judge_mode(), p.drafting()).0,
        _ => Sim::new(w, policy, seed).run().0,
    }
}

/// Runs one scenario once under one policy and returns the event trace too: every
/// message, judge call, claim, wait, yield and decision, in virtual time.
pub fn trace_once(w: &World, policy: PolicyKind, seed: u64) -> (Tally, Vec<String>) {
    if policy.is_botmesh() {
        let (t, lines) = virtual_mesh::run(w, seed, true, policy.judge_mode(), policy.drafting());
        return (t, lines.unwrap_or_default());
    }
    let mut sim = Sim::new(w, policy, seed);
    sim.trace = Some(Vec::new());
    let (t, lines) = sim.run();
    (t, lines.unwrap_or_default())
}
