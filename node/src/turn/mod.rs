//! The bots' manners: mentions, policy, judge, scheduler, reply.
pub mod judge;
pub mod mention;
pub mod pipeline;
pub mod policy;
pub mod reply;
pub mod scheduler;
pub use pipeline::*;
