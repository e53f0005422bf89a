//! The one way an adapter gets an HTTP client for its platform's API.

use std::time::Duration;

/// How long a platform API request may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// To open the connection.
    pub(crate) connect: Duration,
    /// For the whole request, answer included.
    pub(crate) whole: Duration,
}

/// A client for the platform API at `base_url`, built once per adapter and shared by
/// its calls: timeouts always set, the user agent the platform asks for (`None`:
/// reqwest's), and never through a proxy when `base_url` is this machine (a stand-in
/// under test: [`is_loopback`]), whatever the environment says. Fails on a `base_url`
/// that is not a URL.
pub(crate) fn client(
    base_url: &str,
    timeouts: Timeouts,
    user_agent: Option<&str>,
) -> anyhow::Result<reqwest::Client> {
    reqwest::Url::parse(base_url).map_err(|e| anyhow::anyhow!("{base_url:?} is not a URL: {e}"))?;
    let mut builder = reqwest::Client::builder()
        .connect_timeout(timeouts.connect)
        .timeout(timeouts.whole);
    if let Some(agent) = user_agent {
        builder = builder.user_agent(agent);
    }
    if is_loopback(base_url) {
        builder = builder.no_proxy();
    }
    Ok(builder.build()?)
}

/// Whether `base_url`'s host is this machine (`127.0.0.1`, `localhost`, `::1`): a
/// platform stand-in under test, reached without a proxy. An unparsable URL is not.
pub(crate) fn is_loopback(base_url: &str) -> bool {
    reqwest::Url::parse(base_url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .is_some_and(|h| matches!(h.as_str(), "127.0.0.1" | "localhost" | "[::1]" | "::1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_and_bad_urls() {
        assert!(is_loopback("http://127.0.0.1:9/api"));
        assert!(is_loopback("http://localhost"));
        assert!(is_loopback("http://[::1]:80/"));
        assert!(!is_loopback("https://discord.com/api/v10"));
        assert!(!is_loopback("not a url"));
        let t = Timeouts {
            connect: Duration::from_secs(1),
            whole: Duration::from_secs(2),
        };
        assert!(client("not a url", t, None).is_err());
        assert!(client("https://slack.com/api/", t, Some("botmesh")).is_ok());
    }
}
