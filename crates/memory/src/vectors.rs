//! Long-term semantic memory: documents with metadata and their embeddings, in named
//! collections, searched by cosine similarity (top-k) with exact metadata filters.
//!
//! Persistence: every document is one entry of the `hermes_vectors` KV bucket
//! (`<collection>.<doc key>` → `StoredDoc`), and each collection's identity (embedding model and
//! dimension) is the entry `<collection>._meta`. Every replica of the memory service follows the
//! bucket's stream with one ordered consumer and applies each change to its in-memory index
//! ([`VectorIndex`]) in stream order, so a write through one replica is searchable on all, and a
//! write returns once this replica has applied it.
//!
//! Search: a collection of up to [`GRAPH_THRESHOLD`] documents is scanned exactly (a dot product
//! per document); past it the collection is searched through an HNSW graph (the `usearch` crate,
//! inner product on unit vectors), built once from its vectors when it crosses the threshold.
//! Metadata filters and exclusions go into the graph's walk, and whenever the graph answers
//! fewer hits than asked for (a selective filter, a failed search) the matching documents are
//! scanned exactly instead, so a search never loses a document to the approximation's shortcuts.
//!
//! Restart: every [`SNAPSHOT_EVERY`] each changed collection is written whole, graph included,
//! to the `hermes_vector_snapshots` object store (format in `snapshot.rs`), with the stream
//! sequence it covers. At start the service loads each collection's snapshot when it matches the
//! collection's `_meta` entry and the stream, replays the stream from the oldest collection's
//! start (skipping what each snapshot already holds), and keeps following it with the same
//! consumer. A collection without a usable snapshot is rebuilt from the stream (logged with the
//! reason), its graph built once at the end of the replay.
//!
//! A collection takes vectors of one embedding model and one dimension. A write or search with a
//! different model or dimension is refused with `FAILED_PRECONDITION`, never mixed in.

mod index;
mod snapshot;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::object_store::{self, ObjectMetadata, ObjectStore};
use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use hermes_core::{Bus, Error, Result, now_unix_ms};
use hermes_proto::{CollectionInfo, MemoryDoc, StoredDoc};
use prost::Message as _;
use tokio::io::AsyncReadExt as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

pub use hermes_clients::memory::DEFAULT_COLLECTION;
pub use index::{
    CONNECTIVITY, EXPANSION_ADD, EXPANSION_SEARCH, GRAPH_THRESHOLD, SNAPSHOT_EVERY, VectorIndex,
    VectorOptions,
};
use index::{Change, Collection, read, write};

const META: &str = "_meta";

/// A collection whose snapshot is older than this many stream messages (or than its own
/// documents, when it holds more) is written again even when it has not changed: the replay at
/// start begins at the oldest snapshot, so one left behind would make every restart read what
/// the other collections wrote since.
const SNAPSHOT_LAG: u64 = 10_000;

/// How long a write waits for this replica's follower to apply it before returning anyway.
const APPLY_WAIT: Duration = Duration::from_secs(10);

/// Chunks of a snapshot no stored object refers to, untouched for this long, are an upload that
/// never finished (its replica stopped mid-put) and are purged; an upload in progress writes a
/// chunk every few milliseconds.
const ORPHAN_AGE: Duration = Duration::from_secs(15 * 60);

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

/// Dot product; equal to cosine similarity for unit vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// How a collection came back at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadSource {
    /// From its snapshot, which held every change up to stream sequence `seq`.
    Snapshot { seq: u64 },
    /// From the stream alone, because of `reason` (no snapshot, or one that could not be used).
    Stream { reason: String },
}

/// One collection's load at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionLoad {
    pub name: String,
    pub source: LoadSource,
    /// Its documents once the replay was done.
    pub documents: usize,
    /// Whether it is searched through a graph.
    pub on_graph: bool,
}

/// What [`Vectors::load`] did: where each collection came from and how much it read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Each collection with a `_meta` entry, by name.
    pub collections: Vec<CollectionLoad>,
    /// The stream sequence the replay started at.
    pub replay_from: u64,
    /// Bucket messages the replay read, those a snapshot already held included.
    pub replayed: u64,
    /// Graphs built at start: collections past the threshold that no snapshot held.
    pub graphs_built: usize,
}

const NO_SNAPSHOT: &str = "no snapshot";

/// The persistent store: the index, its bucket and the snapshots of its collections.
#[derive(Clone)]
pub struct Vectors {
    kv: kv::Store,
    index: VectorIndex,
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    snapshots: ObjectStore,
    snapshots_bucket: String,
    /// Bytes per chunk of a snapshot object (half the server's largest message, at most 1 MiB).
    chunk_size: usize,
    stream_created_unix_ns: i64,
    /// The last stream sequence this replica's follower has applied.
    applied: watch::Receiver<u64>,
    /// One snapshot round at a time (the periodic one and the one at shutdown).
    snapshotting: Arc<tokio::sync::Mutex<()>>,
    report: Arc<LoadReport>,
}

fn jetstream_error(operation: &'static str) -> impl Fn(&dyn std::fmt::Display) -> Error {
    move |e| Error::JetStream { operation, reason: e.to_string() }
}

/// The operation of a KV stream message, as async-nats's KV decodes it: the `KV-Operation`
/// header, else a server marker's reason, else a put.
fn operation(message: &jetstream::Message) -> Option<kv::Operation> {
    let Some(headers) = message.headers.as_ref() else { return Some(kv::Operation::Put) };
    if let Some(op) = headers.get("KV-Operation") {
        return op.as_str().parse().ok();
    }
    match headers.get("Nats-Marker-Reason").map(|r| r.as_str()) {
        Some("MaxAge" | "Purge") => Some(kv::Operation::Purge),
        Some("Remove") => Some(kv::Operation::Delete),
        Some(_) => None,
        None => Some(kv::Operation::Put),
    }
}

/// Decodes one bucket message under `prefix` (`$KV.<bucket>.`): its collection and change.
fn decode_change(prefix: &str, message: &jetstream::Message) -> Option<(String, Change)> {
    let key = message.subject.as_str().strip_prefix(prefix)?;
    let (collection, token) = key.split_once('.')?;
    let change = match operation(message) {
        Some(kv::Operation::Put) if token == META => match CollectionInfo::decode(message.payload.clone()) {
            Ok(info) => Change::Meta { model: info.embedding_model, dimension: info.dimension as usize },
            Err(e) => {
                warn!(key, error = %e, "undecodable collection meta");
                return None;
            }
        },
        Some(kv::Operation::Put) => match StoredDoc::decode(message.payload.clone()) {
            Ok(StoredDoc { doc: Some(doc), vector }) => Change::Put { doc, vector },
            Ok(_) => return None,
            Err(e) => {
                warn!(key, error = %e, "undecodable memory document");
                return None;
            }
        },
        Some(kv::Operation::Delete | kv::Operation::Purge) if token != META => {
            Change::Remove { token: token.to_owned() }
        }
        Some(_) => return None,
        None => {
            warn!(key, "a vectors bucket message of no known operation");
            return None;
        }
    };
    Some((collection.to_owned(), change))
}

/// An ordered consumer of the whole bucket from stream sequence `from`, and how many messages it
/// had pending when created.
async fn follow_from(
    stream: &jetstream::stream::Stream,
    prefix: &str,
    from: u64,
) -> Result<(pull::Ordered, u64)> {
    let policy = DeliverPolicy::ByStartSequence { start_sequence: from.max(1) };
    ordered(stream, format!("{prefix}>"), policy, &jetstream_error("follow vectors")).await
}

/// An ordered consumer of `filter_subject` from `deliver_policy`, and how many messages it had
/// pending when created.
async fn ordered(
    stream: &jetstream::stream::Stream,
    filter_subject: String,
    deliver_policy: DeliverPolicy,
    failed: &impl Fn(&dyn std::fmt::Display) -> Error,
) -> Result<(pull::Ordered, u64)> {
    let mut consumer = stream
        .create_consumer(pull::OrderedConfig { filter_subject, deliver_policy, ..Default::default() })
        .await
        .map_err(|e| failed(&e))?;
    let pending = consumer.info().await.map_err(|e| failed(&e))?.num_pending;
    let messages = consumer.messages().await.map_err(|e| failed(&e))?;
    Ok((messages, pending))
}

/// The next message of a read that must reach the end, with its stream sequence and how many
/// messages are still pending after it; the consumer ending early is an error.
async fn next_of(
    messages: &mut pull::Ordered,
    failed: &impl Fn(&dyn std::fmt::Display) -> Error,
) -> Result<(jetstream::Message, u64, u64)> {
    let message = match messages.next().await {
        Some(Ok(message)) => message,
        Some(Err(e)) => return Err(failed(&e)),
        None => return Err(failed(&"the consumer ended")),
    };
    let info = message.info().map_err(|e| failed(&e))?;
    let (seq, pending) = (info.stream_sequence, info.pending);
    Ok((message, seq, pending))
}

/// The last `_meta` entry of every collection: (collection, identity, its stream sequence).
async fn read_metas(
    stream: &jetstream::stream::Stream,
    prefix: &str,
) -> Result<Vec<(String, CollectionInfo, u64)>> {
    let failed = jetstream_error("read collection metas");
    let filter = format!("{prefix}*.{META}");
    let (mut messages, mut pending) = ordered(stream, filter, DeliverPolicy::LastPerSubject, &failed).await?;
    let mut out = Vec::new();
    while pending > 0 {
        let (message, seq, left) = next_of(&mut messages, &failed).await?;
        pending = left;
        if let Some((collection, Change::Meta { model, dimension })) = decode_change(prefix, &message) {
            let meta = CollectionInfo {
                name: collection.clone(),
                embedding_model: model,
                dimension: dimension as u32,
                documents: 0,
            };
            out.push((collection, meta, seq));
        }
    }
    Ok(out)
}

/// The collection `expected` names, from its snapshot when there is a usable one; otherwise
/// why not.
async fn load_snapshot(
    snapshots: &ObjectStore,
    expected: snapshot::Expected,
    options: &VectorOptions,
) -> std::result::Result<Collection, String> {
    let mut object = match snapshots.get(&expected.collection).await {
        Ok(object) => object,
        Err(e) if e.kind() == object_store::GetErrorKind::NotFound => return Err(NO_SNAPSHOT.into()),
        Err(e) => return Err(format!("unreadable snapshot: {e}")),
    };
    let mut bytes = Vec::with_capacity(object.info().size);
    // The object store checks the object's SHA-256 digest as it reads the last chunk.
    object.read_to_end(&mut bytes).await.map_err(|e| format!("unreadable snapshot: {e}"))?;
    let options = options.clone();
    tokio::task::spawn_blocking(move || snapshot::decode(&bytes, &expected, &options))
        .await
        .map_err(|e| format!("loading the snapshot stopped: {e}"))?
}

impl Vectors {
    /// Opens (creating when missing) the bucket of documents.
    pub async fn open_bucket(bus: &Bus) -> Result<kv::Store> {
        bus.ensure_bucket(kv::Config {
            bucket: bus.topology().vectors_bucket(),
            description: "Hermes semantic memory: documents and their embeddings".into(),
            history: 1,
            num_replicas: bus.config().replicas,
            ..Default::default()
        })
        .await
    }

    /// Opens (creating when missing) the object store of the collections' snapshots.
    pub async fn open_snapshots(bus: &Bus) -> Result<ObjectStore> {
        let config = object_store::Config {
            bucket: bus.topology().vector_snapshots_bucket(),
            description: Some(
                "Hermes semantic memory: snapshots of the vector index, one per collection".into(),
            ),
            num_replicas: bus.config().replicas,
            ..Default::default()
        };
        hermes_core::bus::ensure_object_store(bus.jetstream(), config).await
    }

    /// Loads every collection (from its snapshot where one is usable, then the stream), then
    /// keeps following the bucket and snapshotting changed collections until `shutdown`.
    pub async fn load(bus: &Bus, options: VectorOptions, shutdown: CancellationToken) -> Result<Vectors> {
        let kv = Self::open_bucket(bus).await?;
        let snapshots = Self::open_snapshots(bus).await?;
        let failed = jetstream_error("load vectors");
        let mut stream = bus.jetstream().get_stream(&kv.stream_name).await.map_err(|e| failed(&e))?;
        let info = stream.info().await.map_err(|e| failed(&e))?;
        let stream_created_unix_ns = info.created.unix_timestamp_nanos() as i64;
        let last_seq = info.state.last_sequence;
        let prefix = format!("$KV.{}.", kv.name);
        let index = VectorIndex::new(options.clone());
        let mut report = LoadReport::default();

        // A collection without a snapshot has no change before its `_meta` entry (written
        // first, with `create`): its replay starts there.
        let mut starts = Vec::new();
        for (name, meta, meta_seq) in read_metas(&stream, &prefix).await? {
            let expected = snapshot::Expected {
                collection: name.clone(),
                model: meta.embedding_model.clone(),
                dimension: meta.dimension as usize,
                stream_created_unix_ns,
                stream_last_seq: last_seq,
            };
            let source = match load_snapshot(&snapshots, expected, &options).await {
                Ok(collection) => {
                    let seq = collection.last_change;
                    index.replace(&name, collection);
                    starts.push(seq);
                    LoadSource::Snapshot { seq }
                }
                Err(reason) => {
                    if reason == NO_SNAPSHOT {
                        info!(collection = %name, "no vector snapshot; the collection is rebuilt from the stream");
                    } else {
                        warn!(collection = %name, reason = %reason, "vector snapshot not used; the collection is rebuilt from the stream");
                    }
                    let (model, dimension) = (meta.embedding_model.clone(), meta.dimension as usize);
                    index.apply(&name, Change::Meta { model, dimension }, meta_seq);
                    starts.push(meta_seq);
                    LoadSource::Stream { reason }
                }
            };
            report.collections.push(CollectionLoad { name, source, documents: 0, on_graph: false });
        }

        // One ordered consumer from the oldest start; each collection skips what it holds.
        let from = starts.iter().min().map_or(last_seq + 1, |start| start + 1);
        report.replay_from = from;
        let (mut messages, mut pending) = follow_from(&stream, &prefix, from).await?;
        let mut applied = last_seq.max(from - 1);
        while pending > 0 {
            let (message, seq, left) = next_of(&mut messages, &failed).await?;
            pending = left;
            applied = applied.max(seq);
            report.replayed += 1;
            if let Some((collection, change)) = decode_change(&prefix, &message) {
                index.apply(&collection, change, seq);
            }
        }
        let building = index.clone();
        report.graphs_built = tokio::task::spawn_blocking(move || building.build_graphs()).await.unwrap_or(0);
        for load in &mut report.collections {
            if let Some(c) = index.collection(&load.name) {
                let c = read(&c);
                (load.documents, load.on_graph) = (c.docs.len(), c.graph.is_some());
            }
        }
        info!(
            collections = report.collections.len(),
            from_snapshot =
                report.collections.iter().filter(|c| matches!(c.source, LoadSource::Snapshot { .. })).count(),
            replay_from = report.replay_from,
            replayed = report.replayed,
            graphs_built = report.graphs_built,
            "vector index loaded"
        );

        let (applied_tx, applied_rx) = watch::channel(applied);
        let max_payload = bus.client().server_info().max_payload;
        let vectors = Vectors {
            kv,
            index: index.clone(),
            js: bus.jetstream().clone(),
            stream: stream.clone(),
            snapshots,
            snapshots_bucket: bus.topology().vector_snapshots_bucket(),
            chunk_size: (max_payload / 2).clamp(16 * 1024, 1024 * 1024),
            stream_created_unix_ns,
            applied: applied_rx,
            snapshotting: Default::default(),
            report: Arc::new(report),
        };
        let follower = follow(index, stream, prefix, messages, applied_tx, shutdown.clone());
        tokio::spawn(follower.instrument(info_span!("vector_follower")));
        let snapshotter = vectors.clone();
        tokio::spawn(snapshotter.snapshot_periodically(shutdown).instrument(info_span!("vector_snapshots")));
        Ok(vectors)
    }

    /// The index this store keeps.
    pub fn index(&self) -> &VectorIndex {
        &self.index
    }

    /// What the load at start did.
    pub fn load_report(&self) -> &LoadReport {
        &self.report
    }

    /// Waits until this replica has applied the bucket up to stream sequence `seq` (at most
    /// [`APPLY_WAIT`]: the change is stored either way and is applied when the follower gets it).
    async fn applied_through(&self, seq: u64) {
        let mut applied = self.applied.clone();
        match tokio::time::timeout(APPLY_WAIT, applied.wait_for(|&a| a >= seq)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => debug!(seq, "the vector follower has stopped"),
            Err(_) => warn!(seq, "the vector follower has not applied a write yet"),
        }
    }

    /// Waits until this replica has applied every change the bucket holds now.
    pub async fn caught_up(&self) -> Result<()> {
        let mut stream = self.stream.clone();
        let last =
            stream.info().await.map_err(|e| jetstream_error("vectors stream")(&e))?.state.last_sequence;
        self.applied_through(last).await;
        Ok(())
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
        }
        if !old.is_empty() {
            self.caught_up().await?;
        }
        Ok(old.len())
    }

    /// Stores documents with their vectors (unit length, one per document, from `model`), and
    /// returns once this replica's index holds them.
    pub async fn upsert(
        &self,
        collection: &str,
        model: &str,
        docs: Vec<MemoryDoc>,
        vectors: Vec<Vec<f32>>,
    ) -> Result<usize> {
        validate_collection(collection)?;
        let dimension = vectors.first().map(Vec::len).unwrap_or(0);
        if vectors.iter().any(|v| v.len() != dimension) || dimension == 0 || vectors.len() != docs.len() {
            return Err(Error::InvalidArgument {
                field: "vectors".into(),
                reason: "empty, of mixed lengths or not one per document".into(),
            });
        }
        if let Some(doc) = docs.iter().find(|d| d.id.is_empty()) {
            return Err(Error::InvalidArgument {
                field: "id".into(),
                reason: format!(
                    "a document has no id (text `{}`)",
                    doc.text.chars().take(40).collect::<String>()
                ),
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
        let mut last = match self.kv.create(&meta_key, meta.encode_to_vec().into()).await {
            Ok(revision) => revision,
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
                0
            }
            Err(e) => return Err(Error::JetStream { operation: "create collection", reason: e.to_string() }),
        };
        let count = docs.len();
        for (mut doc, vector) in docs.into_iter().zip(vectors) {
            doc.updated_unix_ms = now_unix_ms();
            let key = format!("{collection}.{}", doc_key(&doc.id));
            let stored = StoredDoc { doc: Some(doc), vector };
            last = self
                .kv
                .put(key, stored.encode_to_vec().into())
                .await
                .map_err(|e| Error::JetStream { operation: "upsert memory", reason: e.to_string() })?;
        }
        // The follower applies every write, this one's included, in the stream's order.
        self.applied_through(last).await;
        Ok(count)
    }

    /// Snapshots changed collections every `snapshot_every` until `shutdown`.
    async fn snapshot_periodically(self, shutdown: CancellationToken) {
        let every = self.index.options().snapshot_every;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.snapshot_changed().await;
            match self.purge_orphan_chunks(ORPHAN_AGE).await {
                Ok(0) => {}
                Ok(purged) => info!(purged, "chunks of unfinished vector snapshots purged"),
                Err(e) => debug!(error = %e, "cannot look for unfinished vector snapshots"),
            }
        }
    }

    /// Purges the chunks of snapshot uploads that never finished: chunk subjects that no stored
    /// snapshot refers to and that have had no chunk for `older_than`; how many it purged.
    pub async fn purge_orphan_chunks(&self, older_than: Duration) -> Result<usize> {
        use futures::TryStreamExt as _;
        let failed = jetstream_error("purge unfinished snapshots");
        let bucket = &self.snapshots_bucket;
        let stream = self.js.get_stream(format!("OBJ_{bucket}")).await.map_err(|e| failed(&e))?;
        async fn subjects(stream: &jetstream::stream::Stream, filter: String) -> Result<Vec<String>> {
            let failed = jetstream_error("purge unfinished snapshots");
            let found = stream.info_with_subjects(filter).await.map_err(|e| failed(&e))?;
            found.map_ok(|(subject, _)| subject).try_collect().await.map_err(|e| failed(&e))
        }
        let chunks = subjects(&stream, format!("$O.{bucket}.C.>")).await?;
        if chunks.is_empty() {
            return Ok(0);
        }
        // Every object's meta names the chunks it is made of.
        let mut referenced = std::collections::HashSet::new();
        for meta in subjects(&stream, format!("$O.{bucket}.M.>")).await? {
            let last = stream.direct_get_last_for_subject(meta).await.map_err(|e| failed(&e))?;
            let info: object_store::ObjectInfo =
                serde_json::from_slice(&last.payload).map_err(|e| failed(&e))?;
            referenced.insert(info.nuid);
        }
        let mut purged = 0;
        for subject in chunks {
            let nuid = subject.rsplit('.').next().unwrap_or_default();
            if referenced.contains(nuid) {
                continue;
            }
            let last = stream.direct_get_last_for_subject(subject.as_str()).await.map_err(|e| failed(&e))?;
            let age_ms = now_unix_ms().saturating_sub((last.time.unix_timestamp_nanos() / 1_000_000) as u64);
            if age_ms >= older_than.as_millis() as u64 {
                stream.purge().filter(subject.as_str()).await.map_err(|e| failed(&e))?;
                purged += 1;
            }
        }
        Ok(purged)
    }

    /// Writes the snapshot of every collection that changed since its last one (or has none,
    /// or whose snapshot lags the stream by more than [`SNAPSHOT_LAG`] or its own size); how
    /// many it wrote. A collection that cannot be written is logged and tried next round.
    pub async fn snapshot_changed(&self) -> usize {
        let _one_round = self.snapshotting.lock().await;
        let mut written = 0;
        for (name, collection) in self.index.all() {
            let applied = *self.applied.borrow();
            let due = {
                let c = read(&collection);
                !c.model.is_empty()
                    && match c.snapshot_seq {
                        None => true,
                        Some(seq) => {
                            c.last_change > seq
                                || applied.saturating_sub(seq) > SNAPSHOT_LAG.max(c.docs.len() as u64)
                        }
                    }
            };
            if !due {
                continue;
            }
            match self.snapshot(&name, collection).await {
                Ok(true) => written += 1,
                Ok(false) => {}
                Err(e) => warn!(collection = %name, error = %e, "cannot snapshot a vector collection"),
            }
        }
        written
    }

    /// Writes one collection's snapshot; false when another replica had already stored it as
    /// far as this one holds it.
    async fn snapshot(
        &self,
        name: &str,
        collection: Arc<std::sync::RwLock<Collection>>,
    ) -> std::result::Result<bool, String> {
        let covered = (*self.applied.borrow()).max(read(&collection).last_change);
        let stored_seq = |info: &object_store::ObjectInfo| {
            let created = info.metadata.get("stream_created").and_then(|v| v.parse::<i64>().ok());
            let seq = info.metadata.get("seq").and_then(|v| v.parse::<u64>().ok());
            seq.filter(|_| created == Some(self.stream_created_unix_ns))
        };
        // Every replica follows the same stream: the first to write a state saves the others.
        if let Ok(info) = self.snapshots.info(name).await
            && stored_seq(&info).is_some_and(|seq| seq >= covered)
        {
            let mut c = write(&collection);
            c.snapshot_seq = Some(c.snapshot_seq.unwrap_or(0).max(covered));
            return Ok(false);
        }
        let (created, applied, encoding) =
            (self.stream_created_unix_ns, self.applied.clone(), collection.clone());
        let owned_name = name.to_owned();
        let (seq, bytes) = tokio::task::spawn_blocking(move || {
            let c = read(&encoding);
            let seq = (*applied.borrow()).max(c.last_change);
            snapshot::encode(&owned_name, &c, seq, created).map(|bytes| (seq, bytes))
        })
        .await
        .map_err(|e| e.to_string())??;
        let size = bytes.len();
        let started = std::time::Instant::now();
        let meta = ObjectMetadata {
            name: name.to_owned(),
            description: Some(format!("snapshot of vector collection {name} through stream sequence {seq}")),
            chunk_size: Some(self.chunk_size),
            metadata: [
                ("seq".to_owned(), seq.to_string()),
                ("stream_created".to_owned(), created.to_string()),
                ("format".to_owned(), snapshot::FORMAT.to_string()),
            ]
            .into(),
            headers: None,
        };
        let put = self.snapshots.put(meta, &mut bytes.as_slice()).await.map_err(|e| e.to_string())?;
        drop(bytes);
        // Two replicas writing at once each purge the chunks of the object they replaced; the
        // chunks of the object that lost the race are purged by their writer, or nothing would.
        if let Ok(now) = self.snapshots.info(name).await
            && now.nuid != put.nuid
        {
            let chunks = format!("$O.{}.C.{}", self.snapshots_bucket, put.nuid);
            let stream = self.js.get_stream(format!("OBJ_{}", self.snapshots_bucket)).await;
            if let Err(e) = match stream {
                Ok(stream) => stream.purge().filter(chunks).await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            } {
                warn!(collection = %name, error = %e, "cannot purge the chunks of a superseded snapshot");
            }
        }
        let mut c = write(&collection);
        c.snapshot_seq = Some(c.snapshot_seq.unwrap_or(0).max(seq));
        info!(collection = %name, seq, bytes = size, ms = started.elapsed().as_millis() as u64, "vector snapshot written");
        Ok(true)
    }
}

/// Applies every bucket change from `messages` on, in stream order, until `shutdown`; builds a
/// collection's graph when a change takes it past the threshold; after a failure follows again
/// from the change after the last applied one.
async fn follow(
    index: VectorIndex,
    stream: jetstream::stream::Stream,
    prefix: String,
    mut messages: pull::Ordered,
    applied: watch::Sender<u64>,
    shutdown: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            next = messages.next() => next,
        };
        let error = match next {
            Some(Ok(message)) => {
                let Ok(info) = message.info() else { continue };
                let seq = info.stream_sequence;
                if let Some((collection, change)) = decode_change(&prefix, &message) {
                    index.apply(&collection, change, seq);
                    if index.graph_due(&collection) {
                        let building = index.clone();
                        let _ = tokio::task::spawn_blocking(move || building.build_graph_if_due(&collection))
                            .await;
                    }
                }
                applied.send_replace(seq);
                continue;
            }
            Some(Err(e)) => e.to_string(),
            None => "the consumer ended".to_owned(),
        };
        warn!(error, "the vector follower lost its consumer; following again");
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let from = *applied.borrow() + 1;
            match follow_from(&stream, &prefix, from).await {
                Ok((fresh, _)) => {
                    messages = fresh;
                    break;
                }
                Err(e) => debug!(error = %e, "the vector follower is still down"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

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
