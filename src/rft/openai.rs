//! A client for OpenAI-compatible chat-completions endpoints (the teacher servers labs run
//! themselves). Plain HTTP to the address the user gives, nothing else; bounded retries on
//! time-outs and server errors.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::chat::Message;

/// An error talking to the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Network failure or time-out.
    #[error("{url}: {msg}")]
    Transport {
        /// The endpoint.
        url: String,
        /// What happened.
        msg: String,
    },
    /// The server answered with an error status.
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        /// The endpoint.
        url: String,
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The answer was not the JSON the API defines.
    #[error("{url}: malformed response: {msg}")]
    Malformed {
        /// The endpoint.
        url: String,
        /// What is wrong.
        msg: String,
    },
}

/// Settings of the client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientConfig {
    /// Base URL, e.g. `http://10.0.0.5:8000/v1`.
    pub base_url: String,
    /// Model name sent in requests.
    pub model: String,
    /// Bearer token, if the server wants one.
    pub api_key: Option<String>,
    /// Time-out of one request.
    pub timeout_secs: f64,
    /// Retries after a time-out or a 5xx answer.
    pub retries: usize,
}

/// One chat-completion request.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Completions wanted.
    pub n: usize,
    /// Sampling temperature.
    pub temperature: f32,
    /// Most tokens per completion.
    pub max_tokens: usize,
    /// Seed, for servers that honour it.
    pub seed: Option<u64>,
}

/// A blocking client.
pub struct ChatClient {
    cfg: ClientConfig,
    agent: ureq::Agent,
}

impl ChatClient {
    /// A client for an endpoint.
    pub fn new(cfg: ClientConfig) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(cfg.timeout_secs.max(0.001))))
            .http_status_as_error(false)
            .build()
            .into();
        Self { cfg, agent }
    }

    fn url(&self) -> String {
        format!(
            "{}/chat/completions",
            self.cfg.base_url.trim_end_matches('/')
        )
    }

    /// Sends one request; returns the completions' texts.
    pub fn complete(&self, req: &ChatRequest) -> Result<Vec<String>, ClientError> {
        let url = self.url();
        let mut body = serde_json::json!({
            "model": self.cfg.model,
            "messages": req.messages,
            "n": req.n,
            "temperature": req.temperature,
            "max_tokens": req.max_tokens,
        });
        if let Some(s) = req.seed {
            body["seed"] = s.into();
        }
        let mut last = None;
        for attempt in 0..=self.cfg.retries {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(50 << attempt.min(6)));
            }
            match self.send(&url, &body) {
                Ok(v) => return parse_choices(&url, &v),
                Err(e) => {
                    let retry = matches!(&e, ClientError::Transport { .. })
                        || matches!(&e, ClientError::Status { status, .. } if *status >= 500);
                    last = Some(e);
                    if !retry {
                        break;
                    }
                }
            }
        }
        Err(last.unwrap_or(ClientError::Transport {
            url,
            msg: "no attempt made".into(),
        }))
    }

    fn send(&self, url: &str, body: &Value) -> Result<Value, ClientError> {
        let mut r = self
            .agent
            .post(url)
            .header("Content-Type", "application/json");
        if let Some(k) = &self.cfg.api_key {
            r = r.header("Authorization", &format!("Bearer {k}"));
        }
        let mut resp = r.send_json(body).map_err(|e| ClientError::Transport {
            url: url.to_string(),
            msg: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Transport {
                url: url.to_string(),
                msg: e.to_string(),
            })?;
        if status != 200 {
            return Err(ClientError::Status {
                url: url.to_string(),
                status,
                body: text.chars().take(200).collect(),
            });
        }
        serde_json::from_str(&text).map_err(|e| ClientError::Malformed {
            url: url.to_string(),
            msg: e.to_string(),
        })
    }
}

fn parse_choices(url: &str, v: &Value) -> Result<Vec<String>, ClientError> {
    let bad = |msg: &str| ClientError::Malformed {
        url: url.to_string(),
        msg: msg.to_string(),
    };
    let choices = v
        .get("choices")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no \"choices\" array"))?;
    choices
        .iter()
        .map(|c| {
            c.get("message")
                .and_then(|m| m.get("content"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad("a choice has no message.content string"))
        })
        .collect()
}
