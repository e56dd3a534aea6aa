//! The snapshot of one collection, as stored in the `hermes_vector_snapshots` object store so a
//! restart loads the collection (its HNSW graph included) instead of rebuilding it from every
//! document in the bucket.
//!
//! The layout, all integers little-endian:
//!
//! ```text
//! "HRMSVSNP"                      8 bytes, the magic
//! format                          u32, FORMAT
//! header length, header           u32, then a SnapshotHeader (protobuf)
//! header.docs documents           each a length-delimited SnapshotDoc (protobuf)
//! header.graph_bytes              the usearch graph as `save_to_buffer` wrote it
//! ```
//!
//! The graph is raw bytes after the protobuf parts, not a protobuf field: a million 384-dimensional
//! vectors make 1.5 GB of graph, and protobuf lengths stop at 2 GB. Documents are one message
//! each for the same reason. The messages are declared here, not in `proto/`: this is the memory
//! service's private storage format (versioned by `FORMAT`), never sent between services.

use hermes_proto::MemoryDoc;

use super::index::{Collection, VectorOptions, new_graph, search_threads};

const MAGIC: &[u8; 8] = b"HRMSVSNP";
/// The snapshot format; a snapshot of another format is rebuilt from the stream.
pub(super) const FORMAT: u32 = 1;

/// What a snapshot says about itself.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct SnapshotHeader {
    #[prost(string, tag = "1")]
    pub collection: String,
    #[prost(string, tag = "2")]
    pub model: String,
    #[prost(uint32, tag = "3")]
    pub dimension: u32,
    /// The KV stream sequence up to which the snapshot holds every change of the collection.
    #[prost(uint64, tag = "4")]
    pub seq: u64,
    /// The KV stream's creation time (Unix nanoseconds): a stream deleted and created again
    /// starts its sequences over, and a snapshot of the old one means nothing for it.
    #[prost(int64, tag = "5")]
    pub stream_created_unix_ns: i64,
    #[prost(uint64, tag = "6")]
    pub docs: u64,
    #[prost(uint64, tag = "7")]
    pub next_key: u64,
    /// Bytes of graph after the documents; 0 for a collection on the exact scan.
    #[prost(uint64, tag = "8")]
    pub graph_bytes: u64,
}

/// One document with its key, and its vector when the graph does not hold it.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct SnapshotDoc {
    #[prost(uint64, tag = "1")]
    pub key: u64,
    #[prost(message, optional, tag = "2")]
    pub doc: Option<MemoryDoc>,
    #[prost(float, repeated, tag = "3")]
    pub vector: Vec<f32>,
}

/// What a snapshot must agree with to be loaded: the collection's `_meta` entry and the stream.
pub(super) struct Expected {
    pub collection: String,
    pub model: String,
    pub dimension: usize,
    pub stream_created_unix_ns: i64,
    pub stream_last_seq: u64,
}

/// The snapshot of `collection` (read-locked by the caller) as of stream sequence `seq`.
pub(super) fn encode(
    name: &str,
    collection: &Collection,
    seq: u64,
    stream_created_unix_ns: i64,
) -> Result<Vec<u8>, String> {
    use prost::Message as _;
    let graph_bytes = collection.graph.as_ref().map_or(0, |g| g.serialized_length());
    let header = SnapshotHeader {
        collection: name.to_owned(),
        model: collection.model.clone(),
        dimension: collection.dimension as u32,
        seq,
        stream_created_unix_ns,
        docs: collection.docs.len() as u64,
        next_key: collection.next_key,
        graph_bytes: graph_bytes as u64,
    };
    let header = header.encode_to_vec();
    let mut out = Vec::with_capacity(16 + header.len() + collection.docs.len() * 256 + graph_bytes);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    for (&key, entry) in &collection.docs {
        let doc = SnapshotDoc { key, doc: Some(entry.doc.clone()), vector: entry.vector.clone() };
        doc.encode_length_delimited(&mut out).map_err(|e| e.to_string())?;
    }
    if let Some(graph) = &collection.graph {
        let at = out.len();
        out.resize(at + graph_bytes, 0);
        graph.save_to_buffer(&mut out[at..]).map_err(|e| format!("saving the graph: {e}"))?;
    }
    Ok(out)
}

/// Reads `n` bytes at `*at`, moving it on.
fn take<'a>(bytes: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], String> {
    let end = at.checked_add(n).filter(|&end| end <= bytes.len()).ok_or("the snapshot is truncated")?;
    let out = &bytes[*at..end];
    *at = end;
    Ok(out)
}

/// The collection a snapshot holds, when it is whole and agrees with `expected`; otherwise why
/// not (the caller then rebuilds the collection from the stream).
pub(super) fn decode(
    bytes: &[u8],
    expected: &Expected,
    options: &VectorOptions,
) -> Result<Collection, String> {
    use prost::Message as _;
    let mut at = 0;
    if take(bytes, &mut at, 8)? != MAGIC {
        return Err("not a vector snapshot".into());
    }
    let format = u32::from_le_bytes(take(bytes, &mut at, 4)?.try_into().unwrap_or_default());
    if format != FORMAT {
        return Err(format!("snapshot format {format}, this service reads {FORMAT}"));
    }
    let header_len = u32::from_le_bytes(take(bytes, &mut at, 4)?.try_into().unwrap_or_default());
    let header = SnapshotHeader::decode(take(bytes, &mut at, header_len as usize)?)
        .map_err(|e| format!("undecodable header: {e}"))?;
    if header.collection != expected.collection {
        return Err(format!("a snapshot of `{}`", header.collection));
    }
    if header.model != expected.model || header.dimension as usize != expected.dimension {
        return Err(format!(
            "a snapshot of {}-dimensional `{}` vectors, the collection holds {}-dimensional `{}` ones",
            header.dimension, header.model, expected.dimension, expected.model
        ));
    }
    if header.stream_created_unix_ns != expected.stream_created_unix_ns {
        return Err("a snapshot of an earlier stream of the bucket (it was created again)".into());
    }
    if header.seq > expected.stream_last_seq {
        return Err(format!(
            "the snapshot covers sequence {}, past the stream's last {}",
            header.seq, expected.stream_last_seq
        ));
    }
    let mut collection = Collection {
        model: header.model,
        dimension: header.dimension as usize,
        next_key: header.next_key,
        last_change: header.seq,
        snapshot_seq: Some(header.seq),
        ..Default::default()
    };
    let mut docs = Vec::with_capacity(header.docs.min(bytes.len() as u64) as usize);
    let mut rest = &bytes[at..];
    for _ in 0..header.docs {
        let doc = SnapshotDoc::decode_length_delimited(&mut rest)
            .map_err(|e| format!("undecodable document: {e}"))?;
        docs.push(doc);
    }
    at = bytes.len() - rest.len();
    let graph = take(bytes, &mut at, header.graph_bytes as usize)?;
    if at != bytes.len() {
        return Err("bytes after the graph".into());
    }
    let on_graph = docs.iter().filter(|d| d.vector.is_empty()).count();
    if header.graph_bytes > 0 {
        let meta = usearch::Index::metadata_from_buffer(graph).map_err(|e| format!("graph header: {e}"))?;
        if meta.dimensions as usize != collection.dimension || meta.count_present as usize != on_graph {
            return Err(format!(
                "the graph holds {} {}-dimensional vectors, the documents say {on_graph}",
                meta.count_present, meta.dimensions
            ));
        }
        let index = new_graph(collection.dimension, options, 0)?;
        index.load_from_buffer(graph).map_err(|e| format!("loading the graph: {e}"))?;
        // The loaded graph has room for what it holds; keep room to grow and the search threads.
        index
            .reserve_capacity_and_threads((index.size() * 2).max(1024), search_threads())
            .map_err(|e| e.to_string())?;
        index.change_expansion_search(options.expansion_search);
        index.change_expansion_add(options.expansion_add);
        if index.size() != on_graph || docs.iter().any(|d| d.vector.is_empty() && !index.contains(d.key)) {
            return Err("the graph and the documents disagree".into());
        }
        collection.graph = Some(index);
    } else if on_graph > 0 {
        return Err("documents without vectors and no graph".into());
    }
    for SnapshotDoc { key, doc, vector } in docs {
        let Some(doc) = doc else { return Err("a document entry without its document".into()) };
        if !vector.is_empty() && vector.len() != collection.dimension {
            return Err(format!("a {}-dimensional vector", vector.len()));
        }
        collection.restore(key, doc, vector);
    }
    collection.next_key = collection.next_key.max(header.next_key);
    Ok(collection)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::vectors::index::Change;
    use crate::vectors::index::tests::Clustered;
    use crate::vectors::{VectorIndex, index::read};

    fn expected(last_seq: u64) -> Expected {
        Expected {
            collection: "c".into(),
            model: "m".into(),
            dimension: 32,
            stream_created_unix_ns: 77,
            stream_last_seq: last_seq,
        }
    }

    /// A collection of 1,500 documents on its graph, 20 of them deleted and 20 replaced.
    fn collection(options: &VectorOptions) -> (VectorIndex, Clustered) {
        let index = VectorIndex::new(options.clone());
        index.apply("c", Change::Meta { model: "m".into(), dimension: 32 }, 1);
        let mut data = Clustered::new(32, 10, 11);
        let doc =
            |i: usize| MemoryDoc { id: format!("d{i}"), text: format!("text {i}"), ..Default::default() };
        for i in 0..1500 {
            index.apply("c", Change::Put { doc: doc(i), vector: data.next() }, 2 + i as u64);
        }
        assert!(index.build_graph_if_due("c"));
        for i in 0..20 {
            index.apply("c", Change::Remove { token: format!("d{i}") }, 2000 + 2 * i as u64);
            index.apply("c", Change::Put { doc: doc(100 + i), vector: data.next() }, 2001 + 2 * i as u64);
        }
        (index, data)
    }

    #[test]
    fn a_snapshot_loads_the_same_collection_and_a_wrong_one_says_why_not() {
        let options = VectorOptions { graph_threshold: 1000, ..Default::default() };
        let (index, mut data) = collection(&options);
        let c = index.collection("c").unwrap();
        let bytes = encode("c", &read(&c), 2039, 77).unwrap();

        let loaded = decode(&bytes, &expected(5000), &options).unwrap();
        assert_eq!((loaded.last_change, loaded.snapshot_seq), (2039, Some(2039)));
        assert_eq!(loaded.docs.len(), 1480);
        assert!(loaded.graph.is_some() && loaded.docs.values().all(|e| e.vector.is_empty()));
        let restored = VectorIndex::new(options.clone());
        restored.replace("c", loaded);
        for _ in 0..20 {
            let query = data.next();
            let none = HashMap::new();
            assert_eq!(
                restored.search("c", &query, 10, &none, &[]),
                index.search("c", &query, 10, &none, &[])
            );
        }
        assert!(restored.get("c", "d5").is_none() && restored.get("c", "d105").is_some());
        // New documents get keys past every key the snapshot gave out.
        restored.apply(
            "c",
            Change::Put { doc: MemoryDoc { id: "new".into(), ..Default::default() }, vector: data.next() },
            2040,
        );
        assert_eq!(restored.collections()[0].documents, 1481);

        let refused = |bytes: &[u8], expected: Expected| decode(bytes, &expected, &options).err().unwrap();
        assert!(refused(&bytes, expected(2000)).contains("past the stream's last 2000"));
        assert!(
            refused(&bytes, Expected { model: "other".into(), ..expected(5000) }).contains("`m` vectors")
        );
        assert!(
            refused(&bytes, Expected { stream_created_unix_ns: 78, ..expected(5000) })
                .contains("created again")
        );
        assert!(
            refused(&bytes, Expected { collection: "d".into(), ..expected(5000) })
                .contains("a snapshot of `c`")
        );
        assert!(refused(&bytes[..bytes.len() - 10], expected(5000)).contains("truncated"));
        assert!(refused(b"garbage!garbage!garbage", expected(5000)).contains("not a vector snapshot"));
        let mut flipped = bytes;
        let at = flipped.len() - 100;
        flipped.truncate(at);
        flipped.extend_from_slice(&[0xff; 100]);
        // Bytes the graph's own checks cannot see are caught by the object store's digest; the
        // decoder must at least never crash on them.
        let _ = decode(&flipped, &expected(5000), &options);
    }

    #[test]
    fn a_small_collection_is_snapshotted_with_its_vectors() {
        let options = VectorOptions::default();
        let index = VectorIndex::new(options.clone());
        index.apply("c", Change::Meta { model: "m".into(), dimension: 32 }, 1);
        let mut data = Clustered::new(32, 3, 5);
        for i in 0..50 {
            let doc = MemoryDoc { id: format!("d{i}"), ..Default::default() };
            index.apply("c", Change::Put { doc, vector: data.next() }, 2 + i as u64);
        }
        let c = index.collection("c").unwrap();
        let loaded = decode(&encode("c", &read(&c), 51, 77).unwrap(), &expected(51), &options).unwrap();
        assert!(loaded.graph.is_none());
        let restored = VectorIndex::new(options);
        restored.replace("c", loaded);
        let query = data.next();
        let none = HashMap::new();
        assert_eq!(restored.search("c", &query, 50, &none, &[]), index.search("c", &query, 50, &none, &[]));
    }
}
