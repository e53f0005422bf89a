//! The sidecar webhook (`[[bots]] agent = { webhook, timeout_ms }`, docs/sidecar.md):
//! the node POSTs a turn to an external bot and takes its answer from the response,
//! or later through `POST /v1/messages`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::AgentSettings;

/// A bot's sidecar webhook: where turns go and the client that takes them there.
pub(crate) struct Webhook {
    /// Bounded by the configured `timeout_ms`; no proxy (the sidecar is local).
    client: reqwest::Client,
    /// Where turns are POSTed.
    url: String,
}

/// What the webhook made of a turn.
#[derive(Debug, PartialEq)]
pub(crate) enum Answer {
    /// It answered in the response: the text to post.
    Now(String),
    /// It will answer later through `POST /v1/messages` (202 or 204, or an answer
    /// without text).
    Later,
}

impl Webhook {
    /// The webhook `settings` describe.
    pub(crate) fn new(settings: &AgentSettings) -> reqwest::Result<Webhook> {
        Ok(Webhook {
            client: reqwest::Client::builder()
                .no_proxy()
                .connect_timeout(Duration::from_secs(3))
                .timeout(Duration::from_millis(settings.timeout_ms))
                .build()?,
            url: settings.webhook.clone(),
        })
    }

    /// POSTs `turn` and reads the answer. `Err`: why the webhook failed (transport,
    /// a non-success status with the start of its body, an answer that is not
    /// `{"text": …}`).
    pub(crate) async fn ask(&self, turn: &impl Serialize) -> Result<Answer, String> {
        let resp = self
            .client
            .post(&self.url)
            .json(turn)
            .send()
            .await
            .map_err(|e| format!("transport: {e}"))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("reading body: {e}"))?;
        if status == reqwest::StatusCode::ACCEPTED || status == reqwest::StatusCode::NO_CONTENT {
            return Ok(Answer::Later);
        }
        if !status.is_success() {
            return Err(format!(
                "status {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ));
        }
        /// The agent's in-response answer.
        #[derive(Deserialize)]
        struct AgentAnswer {
            text: Option<String>,
        }
        let a: AgentAnswer = serde_json::from_slice(&body)
            .map_err(|e| format!("answer is not {{\"text\": …}}: {e}"))?;
        Ok(a.text
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .map_or(Answer::Later, Answer::Now))
    }
}
