//! Model configuration from flags and environment variables, shared by `hermes up` and the
//! service binaries. The planner and summarizer models are set separately and default to the
//! main model.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::{ChatModel, LlmError, OpenAiChat, OpenAiConfig};

/// Flags for the OpenAI-compatible provider.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LlmArgs {
    /// OpenAI-compatible base URL, e.g. http://localhost:11434/v1 for Ollama. Unset: no LLM.
    #[arg(long, env = "HERMES_LLM_BASE_URL")]
    pub llm_base_url: Option<String>,
    /// Default model name.
    #[arg(long, env = "HERMES_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// Model for planning; defaults to --llm-model.
    #[arg(long, env = "HERMES_PLANNER_MODEL")]
    pub planner_model: Option<String>,
    /// Model for writing goal answers; defaults to --llm-model.
    #[arg(long, env = "HERMES_SUMMARIZER_MODEL")]
    pub summarizer_model: Option<String>,
    /// Environment variable holding the API key.
    #[arg(long, env = "HERMES_LLM_API_KEY_ENV", default_value = "HERMES_LLM_API_KEY")]
    pub llm_api_key_env: String,
    /// File holding the API key (used when the variable is unset), e.g. a mounted secret.
    #[arg(long, env = "HERMES_LLM_API_KEY_FILE")]
    pub llm_api_key_file: Option<PathBuf>,
    /// Per-request timeout in seconds.
    #[arg(long, env = "HERMES_LLM_TIMEOUT_SECS", default_value_t = 60)]
    pub llm_timeout_secs: u64,
}

impl LlmArgs {
    fn model_named(&self, name: Option<&String>) -> Result<Option<Arc<dyn ChatModel>>, LlmError> {
        let Some(base_url) = self.llm_base_url.clone().filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        let model = name.or(self.llm_model.as_ref()).cloned().ok_or_else(|| {
            LlmError::Config("HERMES_LLM_BASE_URL is set but no model is (HERMES_LLM_MODEL)".into())
        })?;
        let mut config = OpenAiConfig::new(base_url, model)
            .with_api_key_from(Some(&self.llm_api_key_env), self.llm_api_key_file.as_deref())?;
        config.timeout = Duration::from_secs(self.llm_timeout_secs.max(1));
        Ok(Some(Arc::new(OpenAiChat::new(config)?)))
    }

    /// The planner's model, or `None` when no LLM is configured.
    pub fn planner_model(&self) -> Result<Option<Arc<dyn ChatModel>>, LlmError> {
        self.model_named(self.planner_model.as_ref())
    }

    /// The summarizer's model, or `None` when no LLM is configured.
    pub fn summarizer_model(&self) -> Result<Option<Arc<dyn ChatModel>>, LlmError> {
        self.model_named(self.summarizer_model.as_ref())
    }
}
