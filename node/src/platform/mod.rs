//! Chat platforms.
pub mod feishu;
