//! The one record of why an adapter is out of service until an operator acts (a
//! rejected token, a missing intent, an encrypted room): set once by the adapter,
//! logged, and shown by [`crate::platform::ChatPlatform::stopped`] in `/healthz`.

use parking_lot::Mutex;

/// Why the adapter stopped, if it did. The mesh goes on without the platform.
#[derive(Debug, Default)]
pub(crate) struct Stopped(Mutex<Option<String>>);

impl Stopped {
    /// Takes the adapter of `bot` out of service for `why`, logged with the name the
    /// platform goes by in the logs (`qq` for onebot).
    pub(crate) fn stop(&self, bot: &str, platform: &str, why: &str) {
        tracing::error!(
            bot = %bot,
            "{why}; {platform} is stopped for this node, the mesh goes on without it"
        );
        *self.0.lock() = Some(why.to_string());
    }

    /// Why the adapter stopped, if it did.
    pub(crate) fn reason(&self) -> Option<String> {
        self.0.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_is_kept_with_its_reason() {
        let s = Stopped::default();
        assert_eq!(s.reason(), None);
        s.stop("Ada", "qq", "the token was refused");
        assert_eq!(s.reason().as_deref(), Some("the token was refused"));
    }
}
