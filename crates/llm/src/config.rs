//! Model configuration from flags and environment variables, shared by `hermes up` and the
//! service binaries. The planner and summarizer models are set separately and default to the
//! main model.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::{ChatModel, LlmError, OpenAiChat, OpenAiConfig};

/// Flags choosing and configuring the model.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LlmArgs {
    /// `openai` (any OpenAI-compatible endpoint, needs --llm-base-url) or `local` (the embedded
    /// SmolLM2 model; needs a build with the `local` feature and `make models`). Unset: `openai`
    /// when a base URL is given, else no LLM.
    #[arg(long, env = "HERMES_LLM_PROVIDER")]
    pub llm_provider: Option<String>,
    /// The local model's GGUF file.
    #[arg(long, env = "HERMES_LOCAL_MODEL", default_value = ".tools/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub local_model: PathBuf,
    /// OpenAI-compatible base URL, e.g. http://localhost:11434/v1 for Ollama. Unset: no LLM.
    #[arg(long, env = "HERMES_LLM_BASE_URL")]
    pub llm_base_url: Option<String>,
    /// Default model name.
    #[arg(long, env = "HERMES_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// Model for planning; defaults to --llm-model.
    #[arg(long, env = "HERMES_PLANNER_MODEL")]
    pub planner_model: Option<String>,
    /// Model for agent nodes (`agent.run`); defaults to --llm-model.
    #[arg(long, env = "HERMES_AGENT_MODEL")]
    pub agent_model: Option<String>,
    /// Model for writing goal answers; defaults to --llm-model.
    #[arg(long, env = "HERMES_SUMMARIZER_MODEL")]
    pub summarizer_model: Option<String>,
    /// Environment variable holding the API key.
    #[arg(long, env = "HERMES_LLM_API_KEY_ENV", default_value = "HERMES_LLM_API_KEY")]
    pub llm_api_key_env: String,
    /// File holding the API key (used when the variable is unset), e.g. a mounted secret.
    #[arg(long, env = "HERMES_LLM_API_KEY_FILE")]
    pub llm_api_key_file: Option<PathBuf>,
    /// The context window of the OpenAI-compatible model, in tokens; agents compress their
    /// context when a prompt passes 60% of it.
    #[arg(long, env = "HERMES_LLM_CONTEXT_TOKENS", default_value_t = crate::DEFAULT_CONTEXT_WINDOW)]
    pub llm_context_tokens: usize,
    /// Per-request timeout in seconds.
    #[arg(long, env = "HERMES_LLM_TIMEOUT_SECS", default_value_t = 60)]
    pub llm_timeout_secs: u64,
    /// US dollars per million input tokens, for goals' estimated cost and cost budgets
    /// (dispatcher; 0: cost is not estimated).
    #[arg(long, env = "HERMES_LLM_PRICE_INPUT_PER_MTOK", default_value_t = 0.0)]
    pub price_input_per_mtok: f64,
    /// US dollars per million output tokens (dispatcher).
    #[arg(long, env = "HERMES_LLM_PRICE_OUTPUT_PER_MTOK", default_value_t = 0.0)]
    pub price_output_per_mtok: f64,
}

impl LlmArgs {
    fn model_named(&self, name: Option<&String>) -> Result<Option<Arc<dyn ChatModel>>, LlmError> {
        match self.llm_provider.as_deref() {
            Some("local") => return self.local().map(Some),
            Some("openai") | None => {}
            Some(other) => {
                return Err(LlmError::Config(format!(
                    "unknown LLM provider `{other}`; use `openai` or `local`"
                )));
            }
        }
        let Some(base_url) = self.llm_base_url.clone().filter(|u| !u.is_empty()) else {
            if self.llm_provider.is_some() {
                return Err(LlmError::Config("the openai provider needs HERMES_LLM_BASE_URL".into()));
            }
            return Ok(None);
        };
        let model = name.or(self.llm_model.as_ref()).cloned().ok_or_else(|| {
            LlmError::Config("HERMES_LLM_BASE_URL is set but no model is (HERMES_LLM_MODEL)".into())
        })?;
        let mut config = OpenAiConfig::new(base_url, model)
            .with_api_key_from(Some(&self.llm_api_key_env), self.llm_api_key_file.as_deref())?;
        config.timeout = Duration::from_secs(self.llm_timeout_secs.max(1));
        config.context_window = match self.llm_context_tokens {
            0 => crate::DEFAULT_CONTEXT_WINDOW,
            tokens => tokens.max(256),
        };
        Ok(Some(Arc::new(OpenAiChat::new(config)?)))
    }

    /// The local model, loaded once per process and shared by the planner and the summarizer.
    #[cfg(feature = "local")]
    fn local(&self) -> Result<Arc<dyn ChatModel>, LlmError> {
        static LOADED: std::sync::OnceLock<Arc<dyn ChatModel>> = std::sync::OnceLock::new();
        if let Some(model) = LOADED.get() {
            return Ok(model.clone());
        }
        let model: Arc<dyn ChatModel> =
            Arc::new(crate::local::LocalChat::load(&crate::local::LocalConfig::new(&self.local_model))?);
        Ok(LOADED.get_or_init(|| model).clone())
    }

    #[cfg(not(feature = "local"))]
    fn local(&self) -> Result<Arc<dyn ChatModel>, LlmError> {
        Err(LlmError::Config(
            "this build has no local model: build with `--features local` (make build does) or set HERMES_LLM_BASE_URL".into(),
        ))
    }

    /// The planner's model, or `None` when no LLM is configured.
    pub fn planner_model(&self) -> Result<Option<Arc<dyn ChatModel>>, LlmError> {
        self.model_named(self.planner_model.as_ref())
    }

    /// The model of agent nodes, or `None` when no LLM is configured.
    pub fn agent_model(&self) -> Result<Option<Arc<dyn ChatModel>>, LlmError> {
        self.model_named(self.agent_model.as_ref())
    }

    /// A model by name on the configured provider (an agent config naming its own model), or
    /// the agent model when `name` is `None`. The local provider has one model and ignores it.
    pub fn agent_model_named(&self, name: Option<&str>) -> Result<Option<Arc<dyn ChatModel>>, LlmError> {
        match name {
            Some(name) => self.model_named(Some(&name.to_owned())),
            None => self.agent_model(),
        }
    }

    /// The summarizer's model, or `None` when no LLM is configured.
    pub fn summarizer_model(&self) -> Result<Option<Arc<dyn ChatModel>>, LlmError> {
        self.model_named(self.summarizer_model.as_ref())
    }
}
