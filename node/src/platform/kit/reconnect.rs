//! The one reconnect loop for a platform's long connection (Feishu's WebSocket,
//! Discord's gateway, DingTalk's stream, Slack's Socket Mode).
//!
//! An adapter writes one session — connect, serve until the connection ends, and say
//! how it ended ([`Ended`]) — and [`Reconnects::after`] decides what follows: after
//! a drop it waits what the adapter's [`Schedule`] says for the attempt (the count
//! restarts whenever a session got going, so one bad hour does not make the next
//! drop wait the maximum), after the platform's own request to reconnect it pauses
//! briefly, and it stops for good on a failure that retrying cannot fix. Every wait
//! ends at once when the node stops, and every decision is logged with the platform's
//! name.

use std::fmt::Display;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How one session of a long connection ended.
#[derive(Debug)]
pub(crate) enum Ended<E> {
    /// The node is stopping (or the session saw the stop): no reconnect.
    Stopped,
    /// The platform asked the client to reconnect (DingTalk's and Slack's
    /// `disconnect`): a new session after [`Reconnect::asked_pause`], the backoff
    /// count restarted.
    Asked,
    /// The connection failed or dropped; `established` says whether it got going
    /// first (which restarts the backoff count). `why` says why, for the log.
    Dropped {
        /// Why it ended.
        why: String,
        /// Whether the session got going (a handshake done, events flowing) before.
        established: bool,
    },
    /// A failure that retrying cannot fix (a rejected token, a disallowed intent):
    /// the loop ends with it.
    Fatal(E),
}

/// The wait before reconnect attempt `attempt`: 0 is the first after a session that
/// got going (or the first ever), 1 the next if that one failed too, and so on.
pub(crate) type Schedule<'a> = &'a (dyn Fn(u32) -> Duration + Send + Sync);

/// What [`Reconnects`] needs to know of an adapter's long connection.
pub(crate) struct Reconnect<'a> {
    /// The platform, for the logs (`feishu`, `discord`, `dingtalk`, `slack`).
    pub(crate) platform: &'static str,
    /// What the connection is called there (`long connection`, `gateway`, `stream`,
    /// `socket`), for the logs.
    pub(crate) what: &'static str,
    /// The waits between attempts.
    pub(crate) schedule: Schedule<'a>,
    /// The pause after the platform asked for a reconnect, so that a server that says
    /// nothing but goodbye is not asked for connections in a tight loop.
    pub(crate) asked_pause: Duration,
}

/// What a loop does after a session ended ([`Reconnects::after`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next<E> {
    /// Start a new session (the wait is over).
    Again,
    /// Stop: with the fatal error, or `None` when the node stops.
    Stop(Option<E>),
}

/// The state of one long connection's reconnects: the attempt count. An adapter's
/// loop is `loop { let ended = session().await; match reconnects.after(ended,
/// &stop).await { Next::Again => continue, Next::Stop(e) => break e } }`: the session
/// is the adapter's, every decision after it is here.
pub(crate) struct Reconnects<'a> {
    /// The adapter's connection, as described.
    r: Reconnect<'a>,
    /// Attempts since the last session that got going.
    attempt: u32,
}

impl<'a> Reconnects<'a> {
    /// No attempt made yet.
    pub(crate) fn new(r: Reconnect<'a>) -> Self {
        Reconnects { r, attempt: 0 }
    }

    /// After a session `ended`: logs why, waits what the schedule says (a stop ends
    /// the wait at once) and says whether to go again. `waiting` is told the wait
    /// before it starts (for an adapter's health state).
    pub(crate) async fn after<E: Display>(
        &mut self,
        ended: Ended<E>,
        stop: &CancellationToken,
        waiting: impl FnOnce(Duration),
    ) -> Next<E> {
        let r = &self.r;
        let wait = match ended {
            Ended::Stopped => return Next::Stop(None),
            Ended::Fatal(error) => {
                tracing::error!(platform = r.platform, error = %error, "{} {}: stopped (retrying cannot fix this)", r.platform, r.what);
                return Next::Stop(Some(error));
            }
            Ended::Asked => {
                self.attempt = 0;
                tracing::info!(
                    platform = r.platform,
                    "{} {}: the platform asked for a new connection",
                    r.platform,
                    r.what
                );
                r.asked_pause
            }
            Ended::Dropped { why, established } => {
                if established {
                    self.attempt = 0;
                }
                let wait = (r.schedule)(self.attempt);
                tracing::warn!(
                    platform = r.platform,
                    why = %why,
                    attempt = self.attempt,
                    retry_in_ms = wait.as_millis() as u64,
                    "{} {}: connection ended; reconnecting",
                    r.platform,
                    r.what
                );
                self.attempt = self.attempt.saturating_add(1);
                wait
            }
        };
        if stop.is_cancelled() {
            return Next::Stop(None);
        }
        waiting(wait);
        tokio::select! {
            _ = stop.cancelled() => Next::Stop(None),
            _ = tokio::time::sleep(wait) => Next::Again,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;

    fn doubling(attempt: u32) -> Duration {
        Duration::from_secs(1 << attempt.min(5))
    }

    /// The waits the loop takes, by virtual time: the count restarts after a session
    /// that got going, a request to reconnect pauses briefly, a fatal end stops.
    #[tokio::test(start_paused = true)]
    async fn waits_by_attempt_restart_after_a_good_session_and_stop_on_fatal() {
        let script = Arc::new(Mutex::new(vec![
            Ended::Dropped {
                why: "refused".into(),
                established: false,
            },
            Ended::Dropped {
                why: "refused".into(),
                established: false,
            },
            Ended::Dropped {
                why: "dropped".into(),
                established: true,
            },
            Ended::Asked,
            Ended::Dropped {
                why: "refused".into(),
                established: false,
            },
            Ended::Fatal("bad token"),
        ]));
        let starts = Arc::new(Mutex::new(Vec::new()));
        let t0 = Instant::now();
        let (s, st) = (script.clone(), starts.clone());
        let waits = Arc::new(Mutex::new(Vec::new()));
        let w = waits.clone();
        let mut reconnects = Reconnects::new(Reconnect {
            platform: "test",
            what: "socket",
            schedule: &doubling,
            asked_pause: Duration::from_millis(100),
        });
        let stop = CancellationToken::new();
        let fatal = loop {
            st.lock().unwrap().push(t0.elapsed());
            let ended = s.lock().unwrap().remove(0);
            match reconnects
                .after(ended, &stop, |d| w.lock().unwrap().push(d))
                .await
            {
                Next::Again => continue,
                Next::Stop(e) => break e,
            }
        };
        assert_eq!(fatal, Some("bad token"));
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            *waits.lock().unwrap(),
            ms(&[1000, 2000, 1000, 100, 1000]),
            "attempt 0, 1, restarted after the good session, the asked pause, restarted after the ask"
        );
        assert_eq!(
            *starts.lock().unwrap(),
            ms(&[0, 1000, 3000, 4000, 4100, 5100]),
        );
    }

    /// A stop ends the loop in the middle of a wait, and a session that sees the
    /// stop ends it too.
    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_a_wait_at_once() {
        let stop = CancellationToken::new();
        let stopper = stop.clone();
        let t0 = Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            stopper.cancel();
        });
        let mut sessions = 0;
        let mut reconnects = Reconnects::new(Reconnect {
            platform: "test",
            what: "socket",
            schedule: &|_| Duration::from_secs(3600),
            asked_pause: Duration::ZERO,
        });
        let out: Option<&str> = loop {
            sessions += 1;
            let ended = Ended::Dropped {
                why: "refused".into(),
                established: false,
            };
            match reconnects.after(ended, &stop, |_| {}).await {
                Next::Again => continue,
                Next::Stop(e) => break e,
            }
        };
        assert_eq!(out, None);
        assert_eq!(sessions, 1);
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
    }
}
