//! The in-memory index of semantic memory: each collection's documents, searched by an exact scan
//! while the collection is small and by an HNSW graph (the `usearch` crate) once it has grown
//! past [`GRAPH_THRESHOLD`] documents.
//!
//! Every document has a per-collection `u64` key, given out in increasing order: the graph knows
//! documents by key, the collection maps keys to documents and documents' KV keys to keys. A
//! replaced document gets a new key and its old one leaves the graph, so a replaced or deleted
//! document is never returned. Once on the graph a collection holds no second copy of its
//! vectors: the exact fallbacks read them back from the graph.
//!
//! Each collection has its own lock, so building one collection's graph (or writing to it) does
//! not hold up searches of the others.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use hermes_core::Result;
use hermes_proto::{CollectionInfo, MemoryDoc, SearchHit};
// Documents by key are looked up by the graph's filter predicate for every node a filtered
// search visits (tens of thousands per search): a fast hash for the keys Hermes gives out.
use rustc_hash::{FxHashMap, FxHashSet};
use tracing::{debug, info, warn};

use super::{doc_key, dot, mismatch};

/// Documents at which a collection leaves the exact scan for the HNSW graph. Below it an exact
/// scan (one dot product per document, about 1.6 ms for 10,000 384-dimensional vectors on one
/// core) is as fast as the graph and never misses; past it the scan grows linearly and the
/// graph does not. The graph is built once, from the collection's vectors, when a write takes
/// the collection past this size, and kept from then on.
pub const GRAPH_THRESHOLD: usize = 10_000;

/// HNSW connectivity (the graph's `M`: neighbours per node on the upper levels, twice that on
/// the base level). With [`EXPANSION_ADD`] and [`EXPANSION_SEARCH`] it was tuned on clustered
/// 384-dimensional vectors (`make bench`, docs/memory.md): at a million of them recall@10 is
/// 0.97 with a 2.7 ms p99; 16 stops near 0.92 however wide the search, 32 gains nothing more.
pub const CONNECTIVITY: usize = 24;
/// Candidates kept while a document is added (`efConstruction`): 96 builds a better graph
/// (recall@10 0.98 with a narrower search) but takes half as long again to build.
pub const EXPANSION_ADD: usize = 64;
/// Candidates kept while searching (`ef`); a search for more than this many hits keeps `top_k`.
/// At a million vectors 64 finds 0.84 of the exact top 10, 128 0.90, 256 0.97.
pub const EXPANSION_SEARCH: usize = 256;

/// How often a changed collection is written to the snapshot store.
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(60);

/// How the vector index is built and kept.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorOptions {
    /// Documents at which a collection switches to the HNSW graph ([`GRAPH_THRESHOLD`]).
    pub graph_threshold: usize,
    /// The graph's connectivity ([`CONNECTIVITY`]).
    pub connectivity: usize,
    /// Candidates kept while adding ([`EXPANSION_ADD`]).
    pub expansion_add: usize,
    /// Candidates kept while searching ([`EXPANSION_SEARCH`]).
    pub expansion_search: usize,
    /// How often changed collections are snapshotted ([`SNAPSHOT_EVERY`]).
    pub snapshot_every: Duration,
}

impl Default for VectorOptions {
    fn default() -> Self {
        VectorOptions {
            graph_threshold: GRAPH_THRESHOLD,
            connectivity: CONNECTIVITY,
            expansion_add: EXPANSION_ADD,
            expansion_search: EXPANSION_SEARCH,
            snapshot_every: SNAPSHOT_EVERY,
        }
    }
}

/// Concurrent searches one graph serves: usearch needs a context per searching thread reserved
/// ahead, and a search finding none free fails (it then goes to the exact scan). Searches run on
/// the runtime's threads, so a few per core is plenty.
pub(super) fn search_threads() -> usize {
    (4 * cores()).max(16)
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// A document and, while it is not on the graph, its vector.
pub(super) struct Entry {
    pub(super) doc: MemoryDoc,
    /// Empty once the vector is on the graph.
    pub(super) vector: Vec<f32>,
}

/// One collection: its identity, documents and (past the threshold) graph.
#[derive(Default)]
pub(super) struct Collection {
    pub(super) model: String,
    pub(super) dimension: usize,
    /// Documents by key.
    pub(super) docs: FxHashMap<u64, Entry>,
    /// Keys by the document's KV key (`doc_key` of its id): what deletes name.
    pub(super) keys: HashMap<String, u64>,
    pub(super) next_key: u64,
    pub(super) graph: Option<usearch::Index>,
    /// Keys of documents whose vectors the graph refused (logged), scanned exactly beside it.
    pub(super) overflow: FxHashSet<u64>,
    /// The stream sequence of the last change applied to this collection.
    pub(super) last_change: u64,
    /// The sequence the stored snapshot covers (`None`: no snapshot of it is stored).
    pub(super) snapshot_seq: Option<u64>,
}

/// Whether `doc` has every `filter` pair.
fn matches_filter(doc: &MemoryDoc, filter: &HashMap<String, String>) -> bool {
    filter.iter().all(|(k, v)| doc.metadata.get(k) == Some(v))
}

/// A new, empty graph for `dimension`-dimensional unit vectors, with room for `capacity`.
pub(super) fn new_graph(
    dimension: usize,
    options: &VectorOptions,
    capacity: usize,
) -> std::result::Result<usearch::Index, String> {
    let graph = usearch::Index::new(&usearch::IndexOptions {
        dimensions: dimension,
        // Inner product: the distance is 1 - dot, so the score is 1 - distance.
        metric: usearch::MetricKind::IP,
        quantization: usearch::ScalarKind::F32,
        connectivity: options.connectivity,
        expansion_add: options.expansion_add,
        expansion_search: options.expansion_search,
        multi: false,
    })
    .map_err(|e| e.to_string())?;
    graph.reserve_capacity_and_threads(capacity.max(1024), search_threads()).map_err(|e| e.to_string())?;
    Ok(graph)
}

/// Adds one vector, doubling the graph's capacity first when it is full (under the collection's
/// write lock: no search runs on it meanwhile).
fn add_to_graph(graph: &usearch::Index, key: u64, vector: &[f32]) -> std::result::Result<(), String> {
    if graph.size() >= graph.capacity() {
        let capacity = (graph.capacity() * 2).max(1024);
        graph.reserve_capacity_and_threads(capacity, search_threads()).map_err(|e| e.to_string())?;
    }
    graph.add(key, vector).map_err(|e| e.to_string())
}

impl Collection {
    /// The key of the document `id`, if it is here.
    fn key_of(&self, id: &str) -> Option<u64> {
        let key = *self.keys.get(&doc_key(id))?;
        (self.docs.get(&key)?.doc.id == id).then_some(key)
    }

    pub(super) fn get(&self, id: &str) -> Option<&MemoryDoc> {
        self.key_of(id).and_then(|key| self.docs.get(&key)).map(|e| &e.doc)
    }

    /// Adds or replaces a document. A vector of another dimension than the collection's is
    /// dropped with a warning (the store refuses those before they are written).
    pub(super) fn put(&mut self, doc: MemoryDoc, vector: Vec<f32>) {
        if self.dimension == 0 {
            self.dimension = vector.len();
        }
        if vector.len() != self.dimension || vector.is_empty() {
            warn!(id = %doc.id, dimension = vector.len(), expected = self.dimension, "a memory document of another dimension is ignored");
            return;
        }
        let token = doc_key(&doc.id);
        self.remove(&token);
        let key = self.next_key;
        self.next_key += 1;
        self.keys.insert(token, key);
        let vector = match &self.graph {
            None => vector,
            Some(graph) => match add_to_graph(graph, key, &vector) {
                Ok(()) => Vec::new(),
                Err(e) => {
                    warn!(id = %doc.id, error = %e, "the vector graph refused a document; it is scanned exactly");
                    self.overflow.insert(key);
                    vector
                }
            },
        };
        self.docs.insert(key, Entry { doc, vector });
    }

    /// Puts a document under a known key (from a snapshot): its vector, when it has one, is
    /// added to the graph (or kept for the scan when there is no graph).
    pub(super) fn restore(&mut self, key: u64, doc: MemoryDoc, vector: Vec<f32>) {
        self.next_key = self.next_key.max(key + 1);
        self.keys.insert(doc_key(&doc.id), key);
        let vector = match &self.graph {
            Some(graph) if !vector.is_empty() => match add_to_graph(graph, key, &vector) {
                Ok(()) => Vec::new(),
                Err(_) => {
                    self.overflow.insert(key);
                    vector
                }
            },
            _ => vector,
        };
        self.docs.insert(key, Entry { doc, vector });
    }

    /// Removes the document stored under the KV key `token`, if any.
    pub(super) fn remove(&mut self, token: &str) {
        let Some(key) = self.keys.remove(token) else { return };
        self.docs.remove(&key);
        if !self.overflow.remove(&key)
            && let Some(graph) = &self.graph
            && let Err(e) = graph.remove(key)
        {
            warn!(key, error = %e, "the vector graph did not remove a document");
        }
    }

    /// Whether the collection has grown past `threshold` while still scanned exactly.
    pub(super) fn graph_due(&self, threshold: usize) -> bool {
        self.graph.is_none() && self.docs.len() > threshold
    }

    /// Builds the graph from the documents' vectors, adding from every core (usearch's add is
    /// thread safe with a thread context each), and drops the vectors it took.
    pub(super) fn build_graph(&mut self, options: &VectorOptions) -> std::result::Result<(), String> {
        let graph = new_graph(self.dimension, options, self.docs.len() * 2)?;
        let work: Vec<(u64, Vec<f32>)> =
            self.docs.iter_mut().map(|(key, entry)| (*key, std::mem::take(&mut entry.vector))).collect();
        let threads = cores().min(work.len()).max(1);
        let mut parts: Vec<Vec<(u64, Vec<f32>)>> = Vec::with_capacity(threads);
        let mut rest = work;
        for i in (1..threads).rev() {
            let at = rest.len() * i / threads;
            parts.push(rest.split_off(at));
        }
        parts.push(rest);
        let refused: Vec<(u64, Vec<f32>, String)> = std::thread::scope(|scope| {
            let graph = &graph;
            let running: Vec<_> = parts
                .into_iter()
                .map(|part| {
                    scope.spawn(move || {
                        let mut refused = Vec::new();
                        // Each vector is dropped once added, so the copy shrinks as the graph grows.
                        for (key, vector) in part {
                            if let Err(e) = graph.add(key, &vector) {
                                refused.push((key, vector, e.to_string()));
                            }
                        }
                        refused
                    })
                })
                .collect();
            running.into_iter().flat_map(|t| t.join().unwrap_or_default()).collect()
        });
        for (key, vector, error) in refused {
            warn!(key, error = %error, "the vector graph refused a document; it is scanned exactly");
            if let Some(entry) = self.docs.get_mut(&key) {
                entry.vector = vector;
                self.overflow.insert(key);
            }
        }
        self.graph = Some(graph);
        Ok(())
    }

    /// The vector of `key`: the entry's own, or read back from the graph into `buf`.
    fn vector<'a>(&'a self, key: u64, entry: &'a Entry, buf: &'a mut Vec<f32>) -> Option<&'a [f32]> {
        if !entry.vector.is_empty() {
            return Some(&entry.vector);
        }
        let graph = self.graph.as_ref()?;
        buf.resize(self.dimension, 0.0);
        match graph.get(key, buf.as_mut_slice()) {
            Ok(1) => Some(buf.as_slice()),
            _ => None,
        }
    }

    /// The `top_k` best (score, key) of the documents `allowed` lets through, by an exact scan.
    fn scan(&self, query: &[f32], top_k: usize, allowed: impl Fn(u64, &Entry) -> bool) -> Vec<(f32, u64)> {
        let mut buf = Vec::new();
        let mut scored: Vec<(f32, u64)> = Vec::new();
        for (&key, entry) in &self.docs {
            if !allowed(key, entry) {
                continue;
            }
            if let Some(vector) = self.vector(key, entry, &mut buf) {
                scored.push((dot(query, vector), key));
            }
        }
        best(scored, top_k)
    }

    /// The `top_k` (score, key) the graph finds, with the refused documents scanned beside it;
    /// `None` when the graph fails or finds fewer than `wanted`.
    fn search_graph(
        &self,
        graph: &usearch::Index,
        query: &[f32],
        top_k: usize,
        wanted: usize,
        allowed: &impl Fn(u64, &Entry) -> bool,
        restricted: bool,
    ) -> Option<Vec<(f32, u64)>> {
        let scored = |found: usearch::ffi::Matches| -> Vec<(f32, u64)> {
            let mut hits: Vec<(f32, u64)> = found
                .keys
                .iter()
                .zip(&found.distances)
                .filter(|(key, _)| self.docs.get(key).is_some_and(|e| allowed(**key, e)))
                .map(|(&key, &distance)| (1.0 - distance, key))
                .collect();
            for &key in &self.overflow {
                if let Some(entry) = self.docs.get(&key)
                    && allowed(key, entry)
                {
                    hits.push((dot(query, &entry.vector), key));
                }
            }
            best(hits, top_k)
        };
        let failed =
            |e: &dyn std::fmt::Display| debug!(error = %e, "a graph search failed; scanning exactly");
        // A search keeps `expansion_search` candidates whatever it is asked for, so asking for
        // all of them costs what asking for `top_k` does. When a filter lets `top_k` of those
        // through, they are its answer: a filter most documents pass costs one plain search,
        // where the filtered walk below would visit about as many nodes again per match missed.
        let candidates = if restricted { graph.expansion_search().max(top_k) } else { top_k };
        let hits = match graph.search(query, candidates) {
            Ok(found) => scored(found),
            Err(e) => {
                failed(&e);
                return None;
            }
        };
        if hits.len() >= wanted || !restricted {
            return (hits.len() >= wanted).then_some(hits);
        }
        // A selective filter: walk the graph through the matching documents only. The
        // predicate is called from C++ through an `extern "C"` trampoline: nothing in it panics.
        match graph.filtered_search(query, top_k, |key| self.docs.get(&key).is_some_and(|e| allowed(key, e)))
        {
            Ok(found) => Some(scored(found)).filter(|hits| hits.len() >= wanted),
            Err(e) => {
                failed(&e);
                None
            }
        }
    }

    /// The `top_k` documents most similar to `query` that have every `filter` pair and are not
    /// in `exclude_ids`.
    pub(super) fn search(
        &self,
        query: &[f32],
        top_k: usize,
        filter: &HashMap<String, String>,
        exclude_ids: &[String],
    ) -> Vec<SearchHit> {
        if top_k == 0 || self.docs.is_empty() || query.len() != self.dimension {
            return Vec::new();
        }
        let excluded: FxHashSet<u64> = exclude_ids.iter().filter_map(|id| self.key_of(id)).collect();
        let allowed = |key: u64, entry: &Entry| {
            (excluded.is_empty() || !excluded.contains(&key)) && matches_filter(&entry.doc, filter)
        };
        let restricted = !filter.is_empty() || !excluded.is_empty();
        let hits = match &self.graph {
            None => self.scan(query, top_k, allowed),
            // A selective filter can leave the graph's walk with fewer than `top_k` hits that
            // exist: then the matching documents are scanned exactly, so none is lost.
            Some(graph) => {
                let wanted = if restricted { top_k } else { top_k.min(self.docs.len()) };
                self.search_graph(graph, query, top_k, wanted, &allowed, restricted)
                    .unwrap_or_else(|| self.scan(query, top_k, allowed))
            }
        };
        hits.into_iter()
            .filter_map(|(score, key)| Some(SearchHit { doc: Some(self.docs.get(&key)?.doc.clone()), score }))
            .collect()
    }
}

/// The `top_k` highest scores, best first.
fn best(mut scored: Vec<(f32, u64)>, top_k: usize) -> Vec<(f32, u64)> {
    let k = top_k.min(scored.len());
    if k == 0 {
        return Vec::new();
    }
    scored.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
    scored.truncate(k);
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored
}

pub(super) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // A panic while a lock was held leaves a collection as it was between two statements;
    // serving it beats refusing every later call.
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(super) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One change of the bucket, decoded.
pub(super) enum Change {
    /// The collection's `_meta` entry: its model and dimension.
    Meta {
        model: String,
        dimension: usize,
    },
    Put {
        doc: MemoryDoc,
        vector: Vec<f32>,
    },
    /// A delete or purge of the document with this KV key.
    Remove {
        token: String,
    },
}

/// The in-memory index, shared by the request handlers, the follower of the bucket and the
/// snapshot writer.
#[derive(Clone, Default)]
pub struct VectorIndex {
    collections: Arc<RwLock<HashMap<String, Arc<RwLock<Collection>>>>>,
    options: Arc<VectorOptions>,
}

impl VectorIndex {
    /// An empty index built and kept as `options` say.
    pub fn new(options: VectorOptions) -> VectorIndex {
        VectorIndex { collections: Default::default(), options: Arc::new(options) }
    }

    /// How this index is built.
    pub fn options(&self) -> &VectorOptions {
        &self.options
    }

    pub(super) fn collection(&self, name: &str) -> Option<Arc<RwLock<Collection>>> {
        read(&self.collections).get(name).cloned()
    }

    pub(super) fn collection_or_new(&self, name: &str) -> Arc<RwLock<Collection>> {
        if let Some(c) = self.collection(name) {
            return c;
        }
        write(&self.collections).entry(name.to_owned()).or_default().clone()
    }

    /// Every collection, by name.
    pub(super) fn all(&self) -> Vec<(String, Arc<RwLock<Collection>>)> {
        read(&self.collections).iter().map(|(name, c)| (name.clone(), c.clone())).collect()
    }

    /// Puts a collection loaded whole (from a snapshot), replacing any of that name.
    pub(super) fn replace(&self, name: &str, collection: Collection) {
        write(&self.collections).insert(name.to_owned(), Arc::new(RwLock::new(collection)));
    }

    /// Checks that `model`/`dimension` fit `collection` (a new collection fits anything).
    pub fn check(&self, collection: &str, model: &str, dimension: usize) -> Result<()> {
        let Some(c) = self.collection(collection) else { return Ok(()) };
        let c = read(&c);
        if !c.model.is_empty() && (c.model != model || c.dimension != dimension) {
            return Err(mismatch(collection, &c.model, c.dimension, model, dimension));
        }
        Ok(())
    }

    /// Records a collection's model and dimension (what the bucket's `_meta` entry says).
    pub fn set_meta(&self, collection: &str, model: &str, dimension: usize) {
        let c = self.collection_or_new(collection);
        let mut c = write(&c);
        c.model = model.to_owned();
        c.dimension = dimension;
    }

    /// Applies the bucket change at stream sequence `seq` to `collection`, unless the
    /// collection already holds it (its snapshot covers `seq`, or the consumer delivered it
    /// again after a reconnect).
    pub(super) fn apply(&self, collection: &str, change: Change, seq: u64) {
        let c = self.collection_or_new(collection);
        let mut c = write(&c);
        if seq <= c.last_change {
            return;
        }
        c.last_change = seq;
        match change {
            Change::Meta { model, dimension } => {
                c.model = model;
                c.dimension = dimension;
            }
            Change::Put { doc, vector } => c.put(doc, vector),
            Change::Remove { token } => c.remove(&token),
        }
    }

    /// Whether `collection` has outgrown the exact scan and has no graph yet.
    pub(super) fn graph_due(&self, collection: &str) -> bool {
        self.collection(collection).is_some_and(|c| read(&c).graph_due(self.options.graph_threshold))
    }

    /// Adds or replaces a document in memory only (persisting is [`super::Vectors::upsert`]'s
    /// job). It stays on the exact scan until [`VectorIndex::build_graphs`], however large the
    /// collection grows.
    pub fn insert(&self, collection: &str, doc: MemoryDoc, vector: Vec<f32>) {
        let c = self.collection_or_new(collection);
        write(&c).put(doc, vector);
    }

    /// Builds the graph of `collection` if it has grown past the threshold; whether it did.
    /// Blocks for as long as the build takes (about a second per 10,000 documents on one core).
    pub fn build_graph_if_due(&self, collection: &str) -> bool {
        let Some(c) = self.collection(collection) else { return false };
        if !read(&c).graph_due(self.options.graph_threshold) {
            return false;
        }
        let mut c = write(&c);
        if !c.graph_due(self.options.graph_threshold) {
            return false;
        }
        let (docs, started) = (c.docs.len(), std::time::Instant::now());
        match c.build_graph(&self.options) {
            Ok(()) => {
                info!(collection, docs, ms = started.elapsed().as_millis() as u64, "vector graph built");
                true
            }
            Err(e) => {
                warn!(collection, error = %e, "cannot build a vector graph; the collection stays on the exact scan");
                false
            }
        }
    }

    /// Builds the graph of every collection past the threshold; how many it built.
    pub fn build_graphs(&self) -> usize {
        let names: Vec<String> = self.all().into_iter().map(|(name, _)| name).collect();
        names.iter().filter(|name| self.build_graph_if_due(name)).count()
    }

    /// The bytes `collection`'s graph takes (its vectors included), when it has one.
    pub fn graph_memory(&self, collection: &str) -> Option<usize> {
        self.collection(collection).and_then(|c| read(&c).graph.as_ref().map(|g| g.memory_usage()))
    }

    /// Sets the candidates `collection`'s graph keeps while searching (for measuring other values
    /// than the options' on one graph).
    pub fn set_expansion_search(&self, collection: &str, expansion: usize) {
        if let Some(c) = self.collection(collection)
            && let Some(graph) = &write(&c).graph
        {
            graph.change_expansion_search(expansion);
        }
    }

    /// The SIMD kernels `collection`'s graph computes distances with (e.g. `haswell`, `serial`).
    pub fn graph_acceleration(&self, collection: &str) -> Option<String> {
        self.collection(collection).and_then(|c| read(&c).graph.as_ref().map(|g| g.hardware_acceleration()))
    }

    /// Whether `collection` is searched through its graph.
    pub fn on_graph(&self, collection: &str) -> bool {
        self.collection(collection).is_some_and(|c| read(&c).graph.is_some())
    }

    /// The `top_k` documents most similar to `query` (a unit vector) that match `filter` and are
    /// not in `exclude_ids`, best first. Never fails: a collection that is not there, or a
    /// query of another dimension, has no hits.
    pub fn search(
        &self,
        collection: &str,
        query: &[f32],
        top_k: usize,
        filter: &HashMap<String, String>,
        exclude_ids: &[String],
    ) -> Vec<SearchHit> {
        let Some(c) = self.collection(collection) else { return Vec::new() };
        let c = read(&c);
        c.search(query, top_k, filter, exclude_ids)
    }

    /// The same search by an exact scan whatever the collection's size: what recall is measured
    /// against.
    pub fn search_exact(&self, collection: &str, query: &[f32], top_k: usize) -> Vec<SearchHit> {
        let Some(c) = self.collection(collection) else { return Vec::new() };
        let c = read(&c);
        if query.len() != c.dimension {
            return Vec::new();
        }
        c.scan(query, top_k, |_, _| true)
            .into_iter()
            .filter_map(|(score, key)| Some(SearchHit { doc: Some(c.docs.get(&key)?.doc.clone()), score }))
            .collect()
    }

    /// Documents (collection, id) last written before `cutoff_unix_ms`.
    pub(super) fn older_than(&self, cutoff_unix_ms: u64) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (name, c) in self.all() {
            let c = read(&c);
            out.extend(
                c.docs
                    .values()
                    .filter(|e| e.doc.updated_unix_ms < cutoff_unix_ms)
                    .map(|e| (name.clone(), e.doc.id.clone())),
            );
        }
        out
    }

    /// The document `id` of `collection`.
    pub fn get(&self, collection: &str, id: &str) -> Option<MemoryDoc> {
        let c = self.collection(collection)?;
        let c = read(&c);
        c.get(id).cloned()
    }

    /// Every collection with its model, dimension and size, by name.
    pub fn collections(&self) -> Vec<CollectionInfo> {
        let mut out: Vec<CollectionInfo> = self
            .all()
            .into_iter()
            .map(|(name, c)| {
                let c = read(&c);
                CollectionInfo {
                    name,
                    embedding_model: c.model.clone(),
                    dimension: c.dimension as u32,
                    documents: c.docs.len() as u64,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Clustered unit vectors: Gaussian noise around `centroids` random directions, like
    /// embeddings of texts about a few topics (uniform random vectors are HNSW's worst case and
    /// like no real embedding).
    pub(crate) struct Clustered {
        rng: hermes_test_util::XorShift,
        centroids: Vec<Vec<f32>>,
        spread: f32,
    }

    impl Clustered {
        pub(crate) fn new(dimension: usize, centroids: usize, seed: u64) -> Clustered {
            let mut clustered = Clustered {
                rng: hermes_test_util::XorShift(seed | 1),
                centroids: Vec::new(),
                spread: 1.0 / (dimension as f32).sqrt(),
            };
            clustered.centroids = (0..centroids).map(|_| clustered.noise(dimension, 1.0)).collect();
            clustered
        }

        fn uniform(&mut self) -> f32 {
            ((self.rng.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
        }

        /// A normalised vector of Gaussian components (Box-Muller).
        fn noise(&mut self, dimension: usize, scale: f32) -> Vec<f32> {
            let mut v: Vec<f32> = (0..dimension)
                .map(|_| {
                    let (u1, u2) = (self.uniform(), self.uniform());
                    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos() * scale
                })
                .collect();
            if scale == 1.0 {
                normalize(&mut v);
            }
            v
        }

        pub(crate) fn next(&mut self) -> Vec<f32> {
            let c = (self.rng.next_u64() % self.centroids.len() as u64) as usize;
            let noise = self.noise(self.centroids[c].len(), self.spread);
            let mut v: Vec<f32> = self.centroids[c].iter().zip(noise).map(|(a, b)| a + b).collect();
            normalize(&mut v);
            v
        }
    }

    fn normalize(v: &mut [f32]) {
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
        v.iter_mut().for_each(|x| *x /= norm);
    }

    fn doc(i: usize) -> MemoryDoc {
        let mut metadata: HashMap<String, String> =
            [("group".to_owned(), (i % 10).to_string()), ("bucket".to_owned(), (i % 100).to_string())].into();
        if i == 1234 {
            metadata.insert("rare".into(), "yes".into());
        }
        MemoryDoc { id: format!("d{i}"), metadata, ..Default::default() }
    }

    fn ids(hits: &[SearchHit]) -> Vec<String> {
        hits.iter().map(|h| h.doc.as_ref().unwrap().id.clone()).collect()
    }

    const DIM: usize = 96;

    /// An index of `n` clustered documents, switched to its graph (threshold 1,000).
    fn graph_index(n: usize) -> (VectorIndex, Clustered, Vec<Vec<f32>>) {
        let index = VectorIndex::new(VectorOptions { graph_threshold: 1000, ..Default::default() });
        index.set_meta("c", "m", DIM);
        let mut data = Clustered::new(DIM, 40, 7);
        let vectors: Vec<Vec<f32>> = (0..n).map(|_| data.next()).collect();
        for (i, v) in vectors.iter().enumerate() {
            index.insert("c", doc(i), v.clone());
        }
        assert!(!index.on_graph("c"), "inserts alone keep the exact scan");
        assert_eq!(index.build_graphs(), 1);
        assert!(index.on_graph("c"));
        (index, data, vectors)
    }

    #[test]
    fn the_graph_scores_as_the_exact_dot_product() {
        let graph = new_graph(3, &VectorOptions::default(), 8).unwrap();
        let (a, b) = ([0.6f32, 0.8, 0.0], [0.0f32, 0.6, 0.8]);
        graph.add(1, &a).unwrap();
        graph.add(2, &b).unwrap();
        let query = [0.0f32, 1.0, 0.0];
        let found = graph.search(&query, 2).unwrap();
        assert_eq!(found.keys, [1, 2]);
        // IP distance is 1 - dot: the score 1 - distance is the exact scan's `dot`.
        assert!((1.0 - found.distances[0] - dot(&query, &a)).abs() < 1e-6, "{:?}", found.distances);
        assert!((1.0 - found.distances[1] - dot(&query, &b)).abs() < 1e-6, "{:?}", found.distances);
    }

    #[test]
    fn graph_search_agrees_with_the_exact_scan() {
        let (index, mut data, vectors) = graph_index(4000);
        let (mut found, mut wanted) = (0, 0);
        for _ in 0..100 {
            let query = data.next();
            let exact = ids(&index.search_exact("c", &query, 10));
            let hits = index.search("c", &query, 10, &HashMap::new(), &[]);
            let approx = ids(&hits);
            found += exact.iter().filter(|id| approx.contains(id)).count();
            wanted += exact.len();
            for (hit, id) in hits.iter().zip(&approx) {
                let i: usize = id[1..].parse().unwrap();
                assert!((dot(&query, &vectors[i]) - hit.score).abs() < 1e-4, "{id}");
            }
        }
        let recall = found as f64 / wanted as f64;
        assert!(recall >= 0.95, "recall@10 {recall}");
    }

    #[test]
    fn deleted_and_replaced_documents_are_never_returned() {
        let (index, mut data, vectors) = graph_index(3000);
        let query = data.next();
        let before = ids(&index.search("c", &query, 10, &HashMap::new(), &[]));
        let c = index.collection("c").unwrap();
        // Delete the first five hits; move the next five far away (their replaced vectors must
        // not answer for them).
        let far: Vec<f32> = query.iter().map(|x| -x).collect();
        for (n, id) in before.iter().enumerate() {
            let i: usize = id[1..].parse().unwrap();
            let seq = 10_000 + n as u64;
            if n < 5 {
                index.apply("c", Change::Remove { token: id.clone() }, seq);
            } else {
                index.apply("c", Change::Put { doc: doc(i), vector: far.clone() }, seq);
            }
            assert_ne!(vectors[i], far);
        }
        assert_eq!(read(&c).docs.len(), 2995);
        for top_k in [10, 100, 3000] {
            let hits = index.search("c", &query, top_k, &HashMap::new(), &[]);
            let now = ids(&hits);
            assert!(before[..5].iter().all(|id| !now.contains(id)), "a deleted document came back: {now:?}");
            for hit in &hits {
                let id = &hit.doc.as_ref().unwrap().id;
                if before[5..].contains(id) {
                    assert!(
                        (hit.score - dot(&query, &far)).abs() < 1e-4,
                        "{id} answered with its old vector"
                    );
                }
            }
            if top_k == 3000 {
                assert_eq!(hits.len(), 2995, "every live document is found, once");
            }
        }
        // Filters and exclusions see the same documents.
        let excluded = [before[6].clone()];
        let hits = ids(&index.search("c", &query, 3000, &HashMap::new(), &excluded));
        assert_eq!(hits.len(), 2994);
        assert!(!hits.contains(&before[6]) && !hits.contains(&before[0]));
    }

    #[test]
    fn filters_are_honoured_however_selective() {
        let (index, mut data, _) = graph_index(3000);
        let group: HashMap<String, String> = [("group".to_owned(), "3".to_owned())].into();
        let rare: HashMap<String, String> = [("rare".to_owned(), "yes".to_owned())].into();
        let none: HashMap<String, String> = [("group".to_owned(), "11".to_owned())].into();
        // One in ten passes `group` (the plain walk's candidates hold ten of them), one in a
        // hundred `bucket` (they do not: the walk goes through the matching documents only).
        let bucket: HashMap<String, String> = [("bucket".to_owned(), "7".to_owned())].into();
        let c = index.collection("c").unwrap();
        let (mut found, mut wanted) = (0, 0);
        for _ in 0..20 {
            let query = data.next();
            for filter in [&group, &bucket] {
                let hits = ids(&index.search("c", &query, 10, filter, &[]));
                let c = read(&c);
                let exact: Vec<String> = c
                    .scan(&query, 10, |_, e| matches_filter(&e.doc, filter))
                    .into_iter()
                    .map(|(_, key)| c.docs[&key].doc.id.clone())
                    .collect();
                assert_eq!(hits.len(), 10);
                found += exact.iter().filter(|id| hits.contains(id)).count();
                wanted += 10;
            }
            let hits = index.search("c", &query, 10, &group, &[]);
            assert!(hits.iter().all(|h| h.doc.as_ref().unwrap().metadata["group"] == "3"));
            let hits = index.search("c", &query, 10, &bucket, &[]);
            assert!(hits.iter().all(|h| h.doc.as_ref().unwrap().metadata["bucket"] == "7"));
            // One document in 3,000 matches: the graph's walk may miss it, the scan may not.
            assert_eq!(ids(&index.search("c", &query, 5, &rare, &[])), ["d1234"]);
            assert!(index.search("c", &query, 5, &none, &[]).is_empty());
            let excluded = ["d1234".to_owned()];
            assert!(index.search("c", &query, 5, &rare, &excluded).is_empty());
        }
        assert!(found as f64 / wanted as f64 >= 0.95, "filtered recall@10 {found}/{wanted}");
    }

    #[test]
    fn searches_past_the_reserved_threads_still_answer() {
        let (index, mut data, _) = graph_index(2000);
        let queries: Vec<Vec<f32>> = (0..4 * search_threads()).map(|_| data.next()).collect();
        let answered = std::thread::scope(|scope| {
            let running: Vec<_> = queries
                .iter()
                .map(|q| {
                    let index = &index;
                    scope.spawn(move || {
                        (0..20).all(|_| index.search("c", q, 10, &HashMap::new(), &[]).len() == 10)
                    })
                })
                .collect();
            running.into_iter().all(|t| t.join().unwrap())
        });
        assert!(answered, "every concurrent search answered its 10 hits");
    }

    #[test]
    fn a_collection_switches_to_its_graph_past_the_threshold_and_grows_on_it() {
        let index = VectorIndex::new(VectorOptions { graph_threshold: 100, ..Default::default() });
        index.apply("c", Change::Meta { model: "m".into(), dimension: DIM }, 1);
        let mut data = Clustered::new(DIM, 5, 3);
        for i in 0..100 {
            index.apply("c", Change::Put { doc: doc(i), vector: data.next() }, 2 + i as u64);
        }
        assert!(!index.graph_due("c"), "at the threshold it is still scanned");
        index.apply("c", Change::Put { doc: doc(100), vector: data.next() }, 200);
        assert!(index.graph_due("c"));
        assert!(index.build_graph_if_due("c"));
        let c = index.collection("c").unwrap();
        assert!(read(&c).docs.values().all(|e| e.vector.is_empty()), "no second copy of the vectors");
        // Past the graph's initial capacity (1,024), adds grow it.
        for i in 101..3000 {
            index.apply("c", Change::Put { doc: doc(i), vector: data.next() }, 200 + i as u64);
        }
        assert_eq!(read(&c).graph.as_ref().unwrap().size(), 3000);
        assert!(read(&c).overflow.is_empty());
        // A change the collection already holds is not applied again.
        index.apply("c", Change::Remove { token: "d5".into() }, 7);
        assert!(index.get("c", "d5").is_some());
        assert_eq!(index.search("c", &data.next(), 3000, &HashMap::new(), &[]).len(), 3000);
    }
}
