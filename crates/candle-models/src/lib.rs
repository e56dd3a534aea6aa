//! The model code Hermes's embedded models need, copied from candle-transformers 0.11.1
//! (<https://github.com/huggingface/candle>, MIT OR Apache-2.0) so that a first build compiles
//! these three architectures rather than every model candle-transformers ships (the largest
//! single crate of a cold build, on its critical path). The files are upstream's, unchanged
//! except for module paths and the workspace's `cargo fmt`:
//!
//! - `models/quantized_llama.rs` as [`quantized_llama`] (SmolLM2's GGUF);
//! - `models/bert.rs` as [`bert`] (all-MiniLM-L6-v2);
//! - `models/with_tracing.rs`, `quantized_nn.rs`, `quantized_var_builder.rs` and `utils.rs`,
//!   which those two use (Hermes's own Qwen2 reuses `RmsNorm`, `repeat_kv` and
//!   `build_causal_mask`).
//!
//! To update: copy the same files from the new candle-transformers release and fix the paths.
#![allow(clippy::all, dead_code, unused_imports)]

extern crate candle_core as candle;

pub mod bert;
pub mod quantized_llama;
pub mod quantized_nn;
pub mod quantized_var_builder;
pub mod utils;
pub mod with_tracing;

/// As `candle_transformers::models`, so code written against it keeps its paths.
pub mod models {
    pub use crate::{bert, quantized_llama, with_tracing};
}
