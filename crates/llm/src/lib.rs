//! The LLM layer, shared by the planner, the summarizer and (later) agent nodes.
//!
//! [`ChatModel`] is chat with optional tools and a JSON-Schema response format, returning token
//! usage. [`openai::OpenAiChat`] speaks the OpenAI Chat Completions protocol, which OpenAI, vLLM,
//! Ollama, llama.cpp server, DeepSeek and Qwen all serve. Model output is never trusted as is:
//! [`repair`] fixes the common ways models break JSON without changing meaning, [`react`] parses
//! the ReAct text protocol for models without tool calling, and [`params`] maps near-miss
//! parameter names onto a schema.

pub mod bounds;
pub mod config;
pub mod embed;
mod embedder;
pub mod governor;
#[cfg(feature = "local")]
pub mod local;
#[cfg(feature = "local")]
pub mod local_embed;
mod observe;
pub mod openai;
pub mod params;
#[cfg(feature = "local")]
mod qwen2;
pub mod react;
pub mod record;
pub mod repair;

use futures::future::BoxFuture;
use hermes_core::ErrorCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use openai::{OpenAiChat, OpenAiConfig};

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// Tool calls the assistant made in this message.
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the call this message answers.
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self { role: Role::System, content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self { role: Role::User, content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self { role: Role::Assistant, content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

/// A call the model asked for. `arguments` is the raw text the model produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A chat completion request.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    /// Ask for JSON matching this schema (`response_format: json_schema`), with a name.
    pub response_schema: Option<(String, Value)>,
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
}

/// Tokens a call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }
}

/// What the model answered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatResponse {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub finish_reason: String,
    pub model: String,
}

/// Failures of the LLM layer.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("invalid LLM configuration: {0}")]
    Config(String),
    #[error("the model endpoint answered HTTP {status}: {body}")]
    Http { status: u16, body: String },
    #[error("the model did not answer within {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    #[error("cannot reach the model endpoint: {0}")]
    Transport(String),
    #[error("the model's answer is not usable: {0}")]
    Parse(String),
    #[error("waited {waited_ms} ms for the fleet's limits on `{model}` ({reason}) and the deadline passed")]
    Saturated { model: String, reason: &'static str, waited_ms: u64 },
}

impl LlmError {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            LlmError::Config(_) => ErrorCode::FailedPrecondition,
            LlmError::Http { status, .. } if *status == 429 || *status >= 500 => ErrorCode::Unavailable,
            LlmError::Http { .. } => ErrorCode::InvalidArgument,
            LlmError::Timeout { .. } => ErrorCode::Timeout,
            LlmError::Transport(_) => ErrorCode::Unavailable,
            LlmError::Parse(_) => ErrorCode::LlmParseError,
            LlmError::Saturated { .. } => ErrorCode::Timeout,
        }
    }

    /// Whether the same request may succeed if sent again.
    pub fn retryable(&self) -> bool {
        self.code().retryable()
    }
}

/// Chat with a model. Implementations: [`OpenAiChat`].
/// The window assumed for a model that does not say.
pub const DEFAULT_CONTEXT_WINDOW: usize = 8192;

/// About four characters a token, rounded up: a cautious estimate for prompts to models whose
/// tokenizer is not at hand.
pub fn estimate_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}

pub trait ChatModel: Send + Sync {
    /// `openai`, `local`, ... for telemetry.
    fn provider(&self) -> &str;
    fn model(&self) -> &str;
    /// Tokens the model can attend to, prompt and answer together.
    fn context_window(&self) -> usize {
        DEFAULT_CONTEXT_WINDOW
    }
    /// Tokens `text` takes in this model's prompt. The default estimates about four
    /// characters a token, which errs high for English; models with a tokenizer count exactly.
    fn count_tokens(&self, text: &str) -> usize {
        estimate_tokens(text)
    }
    fn chat<'a>(&'a self, request: ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>>;
    /// Reads `system`, a system message later requests will start with, ahead of them, so that
    /// the first of them does not pay for it. Only a model that caches prompt prefixes itself
    /// (the local one) does anything; the default returns at once.
    fn warm<'a>(&'a self, system: &'a str) -> BoxFuture<'a, Result<(), LlmError>> {
        let _ = system;
        Box::pin(async { Ok(()) })
    }
}
