//! An OpenAI-compatible Chat Completions client: tools, JSON-Schema response format, a
//! per-request timeout, retries with backoff on 429 and 5xx that honour `Retry-After`, a
//! per-process concurrency limit, and the fleet's limits ([`crate::governor`]) when a governor is
//! installed and limits the model: each try is admitted by it, and a 429 or 503 with
//! `Retry-After` sets the cooldown every process honours.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::{ChatModel, ChatRequest, ChatResponse, LlmError, Message, Role, ToolCall, Usage};

/// Longest wait honoured from a `Retry-After` header.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// How to reach an OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// e.g. `https://api.openai.com/v1`, `http://localhost:11434/v1` (Ollama),
    /// `http://localhost:8000/v1` (vLLM).
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer`; none for local servers.
    pub api_key: Option<String>,
    pub timeout: Duration,
    /// Retries after the first try, on 429, 5xx, timeouts and connection errors.
    pub max_retries: u32,
    /// First backoff; doubles each retry unless the server says `Retry-After`.
    pub backoff: Duration,
    /// Requests in flight at once from this process.
    pub max_concurrency: usize,
    /// The model's context window in tokens, for agents that keep their context under it.
    pub context_window: usize,
}

impl OpenAiConfig {
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Duration::from_secs(60),
            max_retries: 3,
            backoff: Duration::from_millis(500),
            max_concurrency: 8,
            context_window: crate::DEFAULT_CONTEXT_WINDOW,
        }
    }

    /// Reads the API key from the environment variable `env`, or else from the file at `file`
    /// (trailing whitespace trimmed). Neither being set is fine for local servers.
    pub fn with_api_key_from(
        mut self,
        env: Option<&str>,
        file: Option<&std::path::Path>,
    ) -> Result<Self, LlmError> {
        if let Some(key) = env.and_then(|name| std::env::var(name).ok()).filter(|k| !k.is_empty()) {
            self.api_key = Some(key);
        } else if let Some(path) = file {
            let key = std::fs::read_to_string(path).map_err(|e| {
                LlmError::Config(format!("cannot read the API key file {}: {e}", path.display()))
            })?;
            self.api_key = Some(key.trim().to_owned());
        }
        Ok(self)
    }
}

/// The client. Cheap to clone.
#[derive(Clone)]
pub struct OpenAiChat {
    config: Arc<OpenAiConfig>,
    http: reqwest::Client,
    permits: Arc<Semaphore>,
}

impl OpenAiChat {
    pub fn new(config: OpenAiConfig) -> Result<Self, LlmError> {
        if config.base_url.is_empty() || config.model.is_empty() {
            return Err(LlmError::Config("base_url and model are required".into()));
        }
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|e| LlmError::Config(e.to_string()))?;
        let permits = Arc::new(Semaphore::new(config.max_concurrency.max(1)));
        Ok(Self { config: Arc::new(config), http, permits })
    }

    fn body(&self, request: &ChatRequest) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.config.model));
        body.insert("messages".into(), Value::Array(request.messages.iter().map(message_json).collect()));
        if !request.tools.is_empty() {
            let tools = request
                .tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect();
            body.insert("tools".into(), Value::Array(tools));
        }
        if let Some((name, schema)) = &request.response_schema {
            body.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": false}}),
            );
        }
        if let Some(t) = request.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(n) = request.max_tokens {
            body.insert("max_tokens".into(), json!(n));
        }
        Value::Object(body)
    }

    async fn send_once(&self, body: &Value) -> Result<ChatResponse, (LlmError, Option<Duration>)> {
        let url = format!("{}/chat/completions", self.config.base_url.trim_end_matches('/'));
        let mut req = self.http.post(&url).json(body);
        if let Some(key) = &self.config.api_key {
            req = req.bearer_auth(key);
        }
        let response = req.send().await.map_err(|e| {
            let err = if e.is_timeout() {
                LlmError::Timeout { timeout_ms: self.config.timeout.as_millis() as u64 }
            } else {
                LlmError::Transport(e.to_string())
            };
            (err, None)
        })?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let text = response.text().await.map_err(|e| (LlmError::Transport(e.to_string()), None))?;
        if !status.is_success() {
            let body = hermes_core::topology::truncate_for_message(&text);
            return Err((LlmError::Http { status: status.as_u16(), body }, retry_after));
        }
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| (LlmError::Parse(format!("the endpoint's reply is not JSON: {e}")), None))?;
        parse_response(&value).map_err(|e| (e, None))
    }
}

impl ChatModel for OpenAiChat {
    fn provider(&self) -> &str {
        "openai"
    }

    fn model(&self) -> &str {
        &self.config.model
    }

    fn context_window(&self) -> usize {
        self.config.context_window
    }

    fn chat<'a>(&'a self, request: ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        let call = async move {
            let _permit = self.permits.acquire().await.map_err(|e| LlmError::Config(e.to_string()))?;
            let body = self.body(&request);
            let governor = crate::governor::installed().filter(|g| g.limits(&self.config.model).is_some());
            let reservation = governor.as_ref().map_or(0, |g| g.reservation(&request));
            let mut attempt = 0;
            loop {
                let sent = match &governor {
                    None => self.send_once(&body).await,
                    Some(governor) => {
                        let lease =
                            governor.admit(&self.config.base_url, &self.config.model, reservation).await?;
                        let sent = self.send_once(&body).await;
                        let used = sent.as_ref().map_or(0, |r| r.usage.input_tokens + r.usage.output_tokens);
                        lease.finish(used).await;
                        if let Err((LlmError::Http { status: 429 | 503, .. }, Some(retry_after))) = &sent {
                            governor.cool_down(&self.config.base_url, &self.config.model, *retry_after).await;
                        }
                        sent
                    }
                };
                match sent {
                    Ok(response) => return Ok(response),
                    Err((err, retry_after)) if err.retryable() && attempt < self.config.max_retries => {
                        let delay = retry_after
                            .unwrap_or_else(|| self.config.backoff * 2u32.saturating_pow(attempt))
                            .min(MAX_RETRY_AFTER);
                        warn!(error = %err, attempt, delay_ms = delay.as_millis() as u64, "llm call failed; retrying");
                        tokio::time::sleep(delay).await;
                        attempt += 1;
                    }
                    Err((err, _)) => return Err(err),
                }
            }
        };
        Box::pin(crate::observe::observed(self.provider(), self.model(), call))
    }
}

fn message_json(message: &Message) -> Value {
    let role = match message.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut m = json!({"role": role, "content": message.content});
    if !message.tool_calls.is_empty() {
        m["tool_calls"] = message
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    if let Some(id) = &message.tool_call_id {
        m["tool_call_id"] = json!(id);
    }
    m
}

/// `Retry-After` in seconds (the HTTP-date form is not honoured; the backoff applies instead).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    let seconds: f64 = value.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

fn parse_response(value: &Value) -> Result<ChatResponse, LlmError> {
    let choice = value
        .get("choices")
        .and_then(|c| c.get(0))
        .ok_or_else(|| LlmError::Parse("the reply has no choices".into()))?;
    let message = choice.get("message").ok_or_else(|| LlmError::Parse("the choice has no message".into()))?;
    let tool_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| ToolCall {
                    id: c.get("id").and_then(Value::as_str).unwrap_or_default().to_owned(),
                    name: c.pointer("/function/name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                    arguments: match c.pointer("/function/arguments") {
                        Some(Value::String(s)) => s.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    },
                })
                .collect()
        })
        .unwrap_or_default();
    let usage = Usage {
        input_tokens: value.pointer("/usage/prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        output_tokens: value.pointer("/usage/completion_tokens").and_then(Value::as_u64).unwrap_or(0),
    };
    debug!(input_tokens = usage.input_tokens, output_tokens = usage.output_tokens, "llm call done");
    Ok(ChatResponse {
        content: message.get("content").and_then(Value::as_str).map(str::to_owned),
        tool_calls,
        usage,
        finish_reason: choice.get("finish_reason").and_then(Value::as_str).unwrap_or_default().to_owned(),
        model: value.get("model").and_then(Value::as_str).unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
    use std::time::Instant;

    fn client(url: &str) -> OpenAiChat {
        let mut config = OpenAiConfig::new(url, "test-model");
        config.backoff = Duration::from_millis(10);
        config.timeout = Duration::from_secs(5);
        OpenAiChat::new(config).unwrap()
    }

    #[tokio::test]
    async fn parses_content_tool_calls_and_usage() {
        let server = ScriptedLlm::start().await;
        server.push("test-model", ScriptedResponse::content("hello").with_usage(12, 3));
        server.push("test-model", ScriptedResponse::tool_call("math.evaluate", r#"{"expression":"1+1"}"#));
        let llm = client(&server.base_url());
        let request =
            ChatRequest { messages: vec![Message::user("hi")], temperature: Some(0.2), ..Default::default() };
        let first = llm.chat(request.clone()).await.unwrap();
        assert_eq!(first.content.as_deref(), Some("hello"));
        assert_eq!(first.usage, Usage { input_tokens: 12, output_tokens: 3 });
        let second = llm.chat(request).await.unwrap();
        assert_eq!(second.tool_calls[0].name, "math.evaluate");
        assert_eq!(second.tool_calls[0].arguments, r#"{"expression":"1+1"}"#);
        let received = server.requests();
        assert_eq!(received[0]["messages"][0]["content"], "hi");
        assert_eq!(received[0]["model"], "test-model");
    }

    #[tokio::test]
    async fn a_429_is_retried_after_the_stated_delay() {
        let server = ScriptedLlm::start().await;
        server.push("test-model", ScriptedResponse::status(429, "slow down").with_header("Retry-After", "1"));
        server.push("test-model", ScriptedResponse::content("done"));
        let llm = client(&server.base_url());
        let start = Instant::now();
        let response =
            llm.chat(ChatRequest { messages: vec![Message::user("x")], ..Default::default() }).await.unwrap();
        assert_eq!(response.content.as_deref(), Some("done"));
        assert!(start.elapsed() >= Duration::from_secs(1), "retried after {:?}", start.elapsed());
        let times = server.request_times();
        assert!(times[1].duration_since(times[0]) >= Duration::from_secs(1));
    }

    #[tokio::test]
    async fn client_errors_are_not_retried_and_server_errors_give_up() {
        let server = ScriptedLlm::start().await;
        server.push("test-model", ScriptedResponse::status(400, "bad request"));
        let llm = client(&server.base_url());
        let err = llm.chat(ChatRequest::default()).await.unwrap_err();
        assert!(matches!(err, LlmError::Http { status: 400, .. }), "{err}");
        assert_eq!(server.requests().len(), 1);
        for _ in 0..4 {
            server.push("test-model", ScriptedResponse::status(503, "down"));
        }
        let err = llm.chat(ChatRequest::default()).await.unwrap_err();
        assert!(matches!(err, LlmError::Http { status: 503, .. }));
        assert_eq!(server.requests().len(), 1 + 4, "one try plus three retries");
    }
}
