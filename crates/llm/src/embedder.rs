//! What an embedding model is, for the providers (`embed`, `local_embed`) to implement: the one
//! module both depend on, so neither depends on the other.

use futures::future::BoxFuture;

use crate::LlmError;

/// Turns texts into vectors. Every vector of one embedder has the same length.
pub trait Embedder: Send + Sync {
    /// The model's name, recorded with every collection it fills.
    fn model(&self) -> &str;
    fn embed<'a>(&'a self, texts: &'a [String]) -> BoxFuture<'a, Result<Vec<Vec<f32>>, LlmError>>;
}

/// Scales `v` to unit length (a zero vector stays zero), so cosine similarity is a dot product.
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}
