//! Long-term semantic memory: documents with metadata and their embeddings, in named
//! collections, searched by cosine similarity (top-k) with exact metadata filters.
//!
//! Persistence: every document is one entry of the `hermes_vectors` KV bucket
//! (`<collection>.<doc key>` → `StoredDoc`), and each collection's identity (embedding model and
//! dimension) is the entry `<collection>._meta`. The in-memory index is rebuilt from the bucket on
//! start and then follows it with a watch, so every replica of the memory service serves every
//! write, and a restart loses nothing.
//!
//! Search is exact: a brute-force scan over unit vectors (a dot product per document), which is
//! fast enough to a few hundred thousand vectors per collection on one core (see `make bench`).
//! Past that the plan is an HNSW index (the `hnsw_rs` crate) behind the same [`VectorIndex`]
//! interface, or Qdrant for collections that outgrow one node; neither is built.
//!
//! A collection takes vectors of one embedding model and one dimension. A write or search with a
//! different model or dimension is refused with `FAILED_PRECONDITION`, never mixed in.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_nats::jetstream::kv;
use futures::StreamExt;
use hermes_core::{Error, Result, now_unix_ms};
use hermes_proto::{CollectionInfo, MemoryDoc, SearchHit, StoredDoc};
use prost::Message as _;
use tracing::warn;

pub use hermes_clients::memory::DEFAULT_COLLECTION;
const META: &str = "_meta";

#[derive(Default)]
struct Collection {
    model: String,
    dimension: usize,
    docs: HashMap<String, (MemoryDoc, Vec<f32>)>,
}

/// The in-memory index, shared by the request handlers and the bucket watcher.
#[derive(Clone, Default)]
pub struct VectorIndex {
    collections: Arc<RwLock<HashMap<String, Collection>>>,
}

/// Checks a collection name: `[a-z0-9_-]{1,64}`.
pub fn validate_collection(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name != META
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            field: "collection".into(),
            reason: format!("`{name}` is not [a-z0-9_-]{{1,64}}"),
        })
    }
}

/// A KV key token for a document id: the id when it is one, else `x` and its hex.
fn doc_key(id: &str) -> String {
    if !id.is_empty()
        && id.len() <= 200
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        id.to_owned()
    } else {
        format!("x{}", id.bytes().map(|b| format!("{b:02x}")).collect::<String>())
    }
}

fn mismatch(collection: &str, have_model: &str, have_dim: usize, model: &str, dim: usize) -> Error {
    Error::FailedPrecondition(format!(
        "embedding mismatch: collection `{collection}` holds {have_dim}-dimensional vectors of `{have_model}`, \
         and these are {dim}-dimensional vectors of `{model}`; use a new collection or re-embed it"
    ))
}

impl VectorIndex {
    /// Checks that `model`/`dimension` fit `collection` (a new collection fits anything).
    pub fn check(&self, collection: &str, model: &str, dimension: usize) -> Result<()> {
        let collections =
            self.collections.read().map_err(|_| Error::Unavailable("the vector index".into()))?;
        match collections.get(collection) {
            Some(c) if !c.model.is_empty() && (c.model != model || c.dimension != dimension) => {
                Err(mismatch(collection, &c.model, c.dimension, model, dimension))
            }
            _ => Ok(()),
        }
    }

    /// Records a collection's model and dimension (what the bucket's `_meta` entry says).
    pub fn set_meta(&self, collection: &str, model: &str, dimension: usize) {
        if let Ok(mut collections) = self.collections.write() {
            let c = collections.entry(collection.to_owned()).or_default();
            c.model = model.to_owned();
            c.dimension = dimension;
        }
    }

    /// Adds or replaces a document in memory only (persisting is [`Vectors::upsert`]'s job).
    pub fn insert(&self, collection: &str, doc: MemoryDoc, vector: Vec<f32>) {
        if let Ok(mut collections) = self.collections.write() {
            let c = collections.entry(collection.to_owned()).or_default();
            c.docs.insert(doc.id.clone(), (doc, vector));
        }
    }

    fn remove(&self, collection: &str, key: &str) {
        if let Ok(mut collections) = self.collections.write()
            && let Some(c) = collections.get_mut(collection)
        {
            c.docs.retain(|id, _| doc_key(id) != key);
        }
    }

    /// The `top_k` documents most similar to `query` (a unit vector) that match `filter`.
    pub fn search(
        &self,
        collection: &str,
        query: &[f32],
        top_k: usize,
        filter: &HashMap<String, String>,
        exclude_ids: &[String],
    ) -> Vec<SearchHit> {
        let Ok(collections) = self.collections.read() else { return Vec::new() };
        let Some(c) = collections.get(collection) else { return Vec::new() };
        let mut scored: Vec<(f32, &MemoryDoc)> = c
            .docs
            .values()
            .filter(|(doc, _)| {
                !exclude_ids.contains(&doc.id) && filter.iter().all(|(k, v)| doc.metadata.get(k) == Some(v))
            })
            .map(|(doc, vector)| (dot(query, vector), doc))
            .collect();
        let k = top_k.min(scored.len());
        if k == 0 {
            return Vec::new();
        }
        scored.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
        scored.truncate(k);
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        scored.into_iter().map(|(score, doc)| SearchHit { doc: Some(doc.clone()), score }).collect()
    }

    /// Documents (collection, id) last written before `cutoff_unix_ms`.
    fn older_than(&self, cutoff_unix_ms: u64) -> Vec<(String, String)> {
        let Ok(collections) = self.collections.read() else { return Vec::new() };
        collections
            .iter()
            .flat_map(|(name, c)| {
                c.docs
                    .values()
                    .filter(|(doc, _)| doc.updated_unix_ms < cutoff_unix_ms)
                    .map(move |(doc, _)| (name.clone(), doc.id.clone()))
            })
            .collect()
    }

    pub fn get(&self, collection: &str, id: &str) -> Option<MemoryDoc> {
        let collections = self.collections.read().ok()?;
        collections.get(collection)?.docs.get(id).map(|(doc, _)| doc.clone())
    }

    pub fn collections(&self) -> Vec<CollectionInfo> {
        let Ok(collections) = self.collections.read() else { return Vec::new() };
        let mut out: Vec<CollectionInfo> = collections
            .iter()
            .map(|(name, c)| CollectionInfo {
                name: name.clone(),
                embedding_model: c.model.clone(),
                dimension: c.dimension as u32,
                documents: c.docs.len() as u64,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Applies one bucket entry (from the rebuild or the watch).
    fn apply(&self, entry: &kv::Entry) {
        let Some((collection, key)) = entry.key.split_once('.') else { return };
        match entry.operation {
            kv::Operation::Put if key == META => match CollectionInfo::decode(entry.value.clone()) {
                Ok(info) => self.set_meta(collection, &info.embedding_model, info.dimension as usize),
                Err(e) => warn!(key = %entry.key, error = %e, "undecodable collection meta"),
            },
            kv::Operation::Put => match StoredDoc::decode(entry.value.clone()) {
                Ok(StoredDoc { doc: Some(doc), vector }) => self.insert(collection, doc, vector),
                Ok(_) => {}
                Err(e) => warn!(key = %entry.key, error = %e, "undecodable memory document"),
            },
            kv::Operation::Delete | kv::Operation::Purge => self.remove(collection, key),
        }
    }
}

/// Dot product; equal to cosine similarity for unit vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The persistent store: the index plus its bucket.
#[derive(Clone)]
pub struct Vectors {
    kv: kv::Store,
    index: VectorIndex,
}

impl Vectors {
    pub async fn open_bucket(bus: &hermes_core::Bus) -> Result<kv::Store> {
        bus.ensure_bucket(kv::Config {
            bucket: bus.topology().vectors_bucket(),
            description: "Hermes semantic memory: documents and their embeddings".into(),
            history: 1,
            num_replicas: bus.config().replicas,
            ..Default::default()
        })
        .await
    }

    /// Loads every document, then keeps following the bucket until `shutdown`.
    pub async fn load(kv: kv::Store, shutdown: tokio_util::sync::CancellationToken) -> Result<Vectors> {
        let index = VectorIndex::default();
        let mut watch = kv
            .watch_with_history(">")
            .await
            .map_err(|e| Error::JetStream { operation: "watch vectors", reason: e.to_string() })?;
        // The watch first replays the last value of every key; `delta` counts what is left.
        let has_any = kv.status().await.map(|s| s.values() > 0).unwrap_or(false);
        if has_any {
            while let Some(entry) = watch.next().await {
                let entry = entry
                    .map_err(|e| Error::JetStream { operation: "watch vectors", reason: e.to_string() })?;
                index.apply(&entry);
                if entry.delta == 0 {
                    break;
                }
            }
        }
        let follower = index.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    next = watch.next() => match next {
                        Some(Ok(entry)) => follower.apply(&entry),
                        Some(Err(e)) => warn!(error = %e, "vector watch error"),
                        None => break,
                    },
                }
            }
        });
        Ok(Vectors { kv, index })
    }

    pub fn index(&self) -> &VectorIndex {
        &self.index
    }

    /// Deletes documents last written more than `ttl` ago; returns how many.
    pub async fn expire(&self, ttl: std::time::Duration) -> Result<usize> {
        let cutoff = now_unix_ms().saturating_sub(ttl.as_millis() as u64);
        let old = self.index.older_than(cutoff);
        for (collection, id) in &old {
            self.kv
                .delete(format!("{collection}.{}", doc_key(id)))
                .await
                .map_err(|e| Error::JetStream { operation: "expire memory", reason: e.to_string() })?;
            self.index.remove(collection, &doc_key(id));
        }
        Ok(old.len())
    }

    /// Stores documents with their vectors (unit length, one per document, from `model`).
    pub async fn upsert(
        &self,
        collection: &str,
        model: &str,
        docs: Vec<MemoryDoc>,
        vectors: Vec<Vec<f32>>,
    ) -> Result<usize> {
        validate_collection(collection)?;
        let dimension = vectors.first().map(Vec::len).unwrap_or(0);
        if vectors.iter().any(|v| v.len() != dimension) || dimension == 0 {
            return Err(Error::InvalidArgument {
                field: "vectors".into(),
                reason: "empty or of mixed lengths".into(),
            });
        }
        self.index.check(collection, model, dimension)?;
        let meta_key = format!("{collection}.{META}");
        let meta = CollectionInfo {
            name: collection.to_owned(),
            embedding_model: model.to_owned(),
            dimension: dimension as u32,
            documents: 0,
        };
        // `create` decides the collection's identity once, even with racing replicas.
        match self.kv.create(&meta_key, meta.encode_to_vec().into()).await {
            Ok(_) => {}
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                let stored =
                    self.kv.get(&meta_key).await.ok().flatten().and_then(|v| CollectionInfo::decode(v).ok());
                if let Some(stored) = stored
                    && (stored.embedding_model != model || stored.dimension as usize != dimension)
                {
                    return Err(mismatch(
                        collection,
                        &stored.embedding_model,
                        stored.dimension as usize,
                        model,
                        dimension,
                    ));
                }
            }
            Err(e) => return Err(Error::JetStream { operation: "create collection", reason: e.to_string() }),
        }
        self.index.set_meta(collection, model, dimension);
        let count = docs.len();
        for (mut doc, vector) in docs.into_iter().zip(vectors) {
            if doc.id.is_empty() {
                return Err(Error::InvalidArgument {
                    field: "id".into(),
                    reason: "a document has no id".into(),
                });
            }
            doc.updated_unix_ms = now_unix_ms();
            let stored = StoredDoc { doc: Some(doc.clone()), vector: vector.clone() };
            self.kv
                .put(format!("{collection}.{}", doc_key(&doc.id)), stored.encode_to_vec().into())
                .await
                .map_err(|e| Error::JetStream { operation: "upsert memory", reason: e.to_string() })?;
            self.index.insert(collection, doc, vector);
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(id: &str, kind: &str) -> MemoryDoc {
        MemoryDoc {
            id: id.into(),
            metadata: [("kind".to_owned(), kind.to_owned())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn search_ranks_by_cosine_and_filters_exactly() {
        let index = VectorIndex::default();
        index.set_meta("c", "m", 2);
        index.insert("c", doc("near", "goal"), vec![1.0, 0.0]);
        index.insert("c", doc("mid", "goal"), vec![0.6, 0.8]);
        index.insert("c", doc("far", "note"), vec![0.0, 1.0]);
        let hits = index.search("c", &[1.0, 0.0], 2, &HashMap::new(), &[]);
        let ids: Vec<&str> = hits.iter().map(|h| h.doc.as_ref().unwrap().id.as_str()).collect();
        assert_eq!(ids, ["near", "mid"]);
        let filter = [("kind".to_owned(), "note".to_owned())].into();
        assert_eq!(index.search("c", &[1.0, 0.0], 5, &filter, &[]).len(), 1);
        assert_eq!(index.search("c", &[1.0, 0.0], 5, &HashMap::new(), &["near".into()]).len(), 2);
        assert!(index.check("c", "m", 2).is_ok());
        let err = index.check("c", "other", 3).unwrap_err();
        assert!(err.to_string().contains("2-dimensional vectors of `m`"), "{err}");
    }
}
