//! Model settings (`[llm]`), shared by `hermes up` and the service binaries. The planner and
//! summarizer models are set separately and default to the main model.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::{ChatModel, LlmError, OpenAiChat, OpenAiConfig};

/// The embedded model's GGUF, relative to the working directory: Qwen2.5-Coder-0.5B-Instruct,
/// which `make models` installs. `hermes up` plans text goals with it when no model is configured.
pub const EMBEDDED_MODEL_PATH: &str = ".tools/models/Qwen2.5-Coder-0.5B-Instruct.gguf";

/// The `[llm]` settings: which model, where, and at what price. Loaded by the service runtime
/// (`hermes-runtime`): each key is also a `HERMES_LLM_*` variable and a `--llm-*` flag.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmSettings {
    /// `openai` (any OpenAI-compatible endpoint, needs `base_url`), `local` (the embedded model:
    /// Qwen2.5-Coder-0.5B from `make models`, or another Qwen2.5 Instruct or SmolLM2 GGUF; needs a
    /// build with the `local` feature) or `none` (no LLM: goals must come as plans). Unset:
    /// `openai` when a base URL is given, else no LLM (and `hermes up` plans with the embedded
    /// model when it is installed, see [`LlmSettings::embedded_default`]).
    pub provider: Option<String>,
    /// The local model's GGUF file ([`EMBEDDED_MODEL_PATH`] by default).
    pub local_model: PathBuf,
    /// The local model's family: `auto` (from the GGUF's architecture), `llama` (SmolLM2) or
    /// `qwen2` (Qwen2.5 Instruct, e.g. Qwen2.5-Coder-0.5B/1.5B-Instruct). A family other than
    /// `auto` must match the file.
    pub local_family: String,
    /// OpenAI-compatible base URL, e.g. http://localhost:11434/v1 for Ollama. Unset: no LLM.
    pub base_url: Option<String>,
    /// Default model name.
    pub model: Option<String>,
    /// Model for planning; defaults to `model`.
    pub planner_model: Option<String>,
    /// Model for agent nodes (`agent.run`); defaults to `model`.
    pub agent_model: Option<String>,
    /// Model for writing goal answers; defaults to `model`.
    pub summarizer_model: Option<String>,
    /// The API key itself (a secret: `--print-config` masks it). Unset: read from the variable
    /// named by `api_key_env`, then from `api_key_file`.
    pub api_key: Option<String>,
    /// Environment variable holding the API key.
    pub api_key_env: String,
    /// File holding the API key (used when the variable is unset), e.g. a mounted secret.
    pub api_key_file: Option<PathBuf>,
    /// The context window of the OpenAI-compatible model, in tokens; agents compress their
    /// context when a prompt passes 60% of it.
    pub context_tokens: usize,
    /// Per-request timeout in seconds.
    pub timeout_secs: u64,
    /// US dollars per million input tokens, for goals' estimated cost and cost budgets
    /// (dispatcher; 0: cost is not estimated).
    pub price_input_per_mtok: f64,
    /// US dollars per million output tokens (dispatcher).
    pub price_output_per_mtok: f64,
    /// Fleet-wide limits on model calls, shared through NATS by every process
    /// ([`crate::governor`]).
    pub limits: crate::governor::LimitSettings,
}

impl Default for LlmSettings {
    fn default() -> Self {
        LlmSettings {
            provider: None,
            local_model: EMBEDDED_MODEL_PATH.into(),
            local_family: "auto".to_owned(),
            base_url: None,
            model: None,
            planner_model: None,
            agent_model: None,
            summarizer_model: None,
            api_key: None,
            api_key_env: "HERMES_LLM_API_KEY".to_owned(),
            api_key_file: None,
            context_tokens: crate::DEFAULT_CONTEXT_WINDOW,
            timeout_secs: 60,
            price_input_per_mtok: 0.0,
            price_output_per_mtok: 0.0,
            limits: Default::default(),
        }
    }
}

/// The names earlier releases gave `[llm]` keys, for services whose settings have an `llm`
/// section: `HERMES_PLANNER_MODEL`, `--local-model`, ...
pub const ALIASES: &[(&str, &str)] = &[
    ("local_model", "llm.local_model"),
    ("planner_model", "llm.planner_model"),
    ("agent_model", "llm.agent_model"),
    ("summarizer_model", "llm.summarizer_model"),
];

/// One line of help for each `[llm]` key (`llm.base_url`, ...).
pub fn describe(key: &str) -> Option<&'static str> {
    Some(match key.strip_prefix("llm.")? {
        "provider" => {
            "`openai` (an OpenAI-compatible endpoint), `local` (the embedded model) or `none` (no LLM)."
        }
        "local_model" => "The local model's GGUF file.",
        "local_family" => "Local model family: auto (from the GGUF), llama (SmolLM2) or qwen2 (Qwen2.5).",
        "base_url" => "OpenAI-compatible base URL; unset: no LLM.",
        "model" => "Default model name.",
        "planner_model" => "Model for planning; defaults to llm.model.",
        "agent_model" => "Model for agent nodes (agent.run); defaults to llm.model.",
        "summarizer_model" => "Model for writing goal answers; defaults to llm.model.",
        "api_key" => "The API key (masked by --print-config).",
        "api_key_env" => "Environment variable holding the API key.",
        "api_key_file" => "File holding the API key, used when the variable is unset.",
        "context_tokens" => "The model's context window, in tokens.",
        "timeout_secs" => "Per-request timeout in seconds.",
        "price_input_per_mtok" => "US dollars per million input tokens (0: cost is not estimated).",
        "price_output_per_mtok" => "US dollars per million output tokens.",
        "limits.models" => {
            "Fleet-wide limits by model name (`\"*\"`: any other): max_concurrent, requests_per_minute, tokens_per_minute (docs/llm.md)."
        }
        "limits.tenants" => "Tenants' weights for their shares of each model limit (1 when not named).",
        "limits.lease_ttl_secs" => "Seconds a killed process can keep a model slot before it frees.",
        "limits.default_completion_tokens" => {
            "Completion tokens reserved against tokens_per_minute for a call that sets no max_tokens."
        }
        _ => return None,
    })
}

impl LlmSettings {
    fn model_named(&self, name: Option<&String>) -> Result<Option<Arc<dyn ChatModel>>, LlmError> {
        match self.provider.as_deref() {
            Some("local") => return self.local().map(Some),
            Some("none") => return Ok(None),
            Some("openai") | None => {}
            Some(other) => {
                return Err(LlmError::Config(format!(
                    "unknown LLM provider `{other}`; use `openai`, `local` or `none`"
                )));
            }
        }
        let Some(base_url) = self.base_url.clone().filter(|u| !u.is_empty()) else {
            if self.provider.is_some() {
                return Err(LlmError::Config("the openai provider needs HERMES_LLM_BASE_URL".into()));
            }
            return Ok(None);
        };
        let model = name.or(self.model.as_ref()).cloned().ok_or_else(|| {
            LlmError::Config("HERMES_LLM_BASE_URL is set but no model is (HERMES_LLM_MODEL)".into())
        })?;
        let mut config = OpenAiConfig::new(base_url, model);
        match self.api_key.as_ref().filter(|k| !k.is_empty()) {
            Some(key) => config.api_key = Some(key.clone()),
            None => {
                config = config.with_api_key_from(Some(&self.api_key_env), self.api_key_file.as_deref())?
            }
        }
        config.timeout = Duration::from_secs(self.timeout_secs.max(1));
        config.context_window = match self.context_tokens {
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
        let mut config = crate::local::LocalConfig::new(&self.local_model);
        config.family = self.local_family.parse()?;
        let model: Arc<dyn ChatModel> = Arc::new(crate::local::LocalChat::load(&config)?);
        Ok(LOADED.get_or_init(|| model).clone())
    }

    #[cfg(not(feature = "local"))]
    fn local(&self) -> Result<Arc<dyn ChatModel>, LlmError> {
        Err(LlmError::Config(
            "this build has no local model: build with `--features local` (make build does) or set HERMES_LLM_BASE_URL".into(),
        ))
    }

    /// Whether these settings name no model at all: no provider and no base URL.
    pub fn is_unset(&self) -> bool {
        self.provider.is_none() && self.base_url.as_deref().unwrap_or("").is_empty()
    }

    /// The settings that plan with the embedded model, for `hermes up` when nothing is configured
    /// ([`LlmSettings::is_unset`]): the `local` provider over `llm.local_model`. An error says why
    /// there is none: this build lacks the `local` feature, or the file is not installed.
    pub fn embedded_default(&self) -> Result<LlmSettings, String> {
        if !cfg!(feature = "local") {
            return Err(
                "this build has no embedded model (build with `--features local`; make build does)".into()
            );
        }
        if !self.local_model.is_file() {
            return Err(format!(
                "the embedded model {} is not installed (run `make models`)",
                self.local_model.display()
            ));
        }
        Ok(LlmSettings { provider: Some("local".into()), ..self.clone() })
    }

    /// Installs the fleet-wide limiter of `[llm.limits]` for this process's model calls (nothing
    /// when no model is limited). Services call it once connected to the bus.
    pub async fn govern(&self, bus: &hermes_core::Bus) -> Result<(), LlmError> {
        let governor = crate::governor::Governor::start(bus, &self.limits).await?;
        if governor.is_some() {
            tracing::info!(models = ?self.limits.models.keys().collect::<Vec<_>>(), "model calls are limited fleet-wide");
        }
        crate::governor::install(governor);
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_none_is_no_model_and_an_unknown_one_is_named() {
        let none = LlmSettings {
            provider: Some("none".into()),
            base_url: Some("http://127.0.0.1:1/v1".into()),
            model: Some("m".into()),
            ..Default::default()
        };
        assert!(none.planner_model().unwrap().is_none());
        assert!(!none.is_unset());
        let other = LlmSettings { provider: Some("ollama".into()), ..Default::default() };
        let err = other.planner_model().err().unwrap().to_string();
        assert!(err.contains("unknown LLM provider `ollama`") && err.contains("`none`"), "{err}");
    }

    #[test]
    fn only_settings_naming_nothing_are_unset() {
        assert!(LlmSettings::default().is_unset());
        assert!(LlmSettings { base_url: Some(String::new()), ..Default::default() }.is_unset());
        assert!(!LlmSettings { base_url: Some("http://h/v1".into()), ..Default::default() }.is_unset());
        assert!(!LlmSettings { provider: Some("local".into()), ..Default::default() }.is_unset());
    }

    #[test]
    fn the_embedded_default_names_what_is_missing() {
        let missing = LlmSettings { local_model: "/nonexistent/model.gguf".into(), ..Default::default() };
        let why = missing.embedded_default().unwrap_err();
        if cfg!(feature = "local") {
            assert!(why.contains("/nonexistent/model.gguf is not installed (run `make models`)"), "{why}");
        } else {
            assert!(why.contains("--features local"), "{why}");
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        let present = LlmSettings { local_model: file.path().into(), ..Default::default() };
        let embedded = present.embedded_default();
        if cfg!(feature = "local") {
            let local = embedded.unwrap();
            assert_eq!(local.provider.as_deref(), Some("local"));
            assert_eq!(local.local_model, file.path());
        } else {
            assert!(embedded.is_err());
        }
        assert_eq!(LlmSettings::default().local_model, PathBuf::from(EMBEDDED_MODEL_PATH));
    }
}
