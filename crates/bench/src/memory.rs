//! Semantic memory figures: exact search latency at 10k and 100k vectors against a flat-array
//! scan measured in the same run; the HNSW graph at 100k and 1M clustered vectors (recall@10
//! against the exact top 10, latency alone, under load and filtered, build and add rates); a
//! collection's snapshot and the restarts with and without it; upsert throughput against raw KV
//! puts of the same size.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hermes_memory::vectors::{LoadSource, VectorIndex, VectorOptions, Vectors};
use hermes_proto::MemoryDoc;

const DIM: usize = 384;

/// A small deterministic generator, so runs are comparable.
struct Rng(hermes_test_util::XorShift);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        (self.0.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    fn unit_vector(&mut self) -> Vec<f32> {
        let mut v: Vec<f32> = (0..DIM).map(|_| self.next_f32()).collect();
        hermes_llm::embed::normalize(&mut v);
        v
    }
}

/// Clustered unit vectors: Gaussian noise around random centroids, the noise as long as the
/// centroid (a document is about 0.7 similar to its topic, 0.5 to its topic's other documents,
/// about 0 to the rest), like sentence embeddings of texts about many topics. Uniformly random
/// vectors are HNSW's worst case and like no real embedding: in 384 dimensions every pair is
/// about equally far apart.
pub struct Clustered {
    rng: hermes_test_util::XorShift,
    centroids: Vec<Vec<f32>>,
}

impl Clustered {
    pub fn new(centroids: usize, seed: u64) -> Clustered {
        let mut clustered = Clustered { rng: hermes_test_util::XorShift(seed | 1), centroids: Vec::new() };
        clustered.centroids = (0..centroids).map(|_| clustered.gaussian(1.0)).collect();
        clustered
    }

    fn uniform(&mut self) -> f32 {
        ((self.rng.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    /// A unit vector of Gaussian components (Box-Muller), times `length`.
    fn gaussian(&mut self, length: f32) -> Vec<f32> {
        let mut v: Vec<f32> = (0..DIM)
            .map(|_| {
                let (u1, u2) = (self.uniform(), self.uniform());
                (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            })
            .collect();
        hermes_llm::embed::normalize(&mut v);
        v.iter_mut().for_each(|x| *x *= length);
        v
    }

    pub fn next(&mut self) -> Vec<f32> {
        let c = (self.rng.next_u64() % self.centroids.len() as u64) as usize;
        let noise = self.gaussian(1.0);
        let mut v: Vec<f32> = self.centroids[c].iter().zip(noise).map(|(a, b)| a + b).collect();
        hermes_llm::embed::normalize(&mut v);
        v
    }
}

/// Documents per topic of the clustered data: a collection of `n` has `n / TOPIC_SIZE` topics
/// (2,000 at a million), so every size is as hard to search as the others.
const TOPIC_SIZE: usize = 500;

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

/// (index p50, index p99, flat-scan p50, flat-scan p99) in milliseconds for top-5 of `n`.
pub fn search_latency(n: usize, queries: usize) -> (f64, f64, f64, f64) {
    let mut rng = Rng(hermes_test_util::XorShift(0x9e37_79b9_7f4a_7c15 ^ n as u64));
    let index = VectorIndex::default();
    index.set_meta("bench", "random", DIM);
    let mut flat = Vec::with_capacity(n * DIM);
    for i in 0..n {
        let v = rng.unit_vector();
        flat.extend_from_slice(&v);
        let doc = MemoryDoc {
            id: format!("d{i}"),
            metadata: [("kind".to_owned(), "goal".to_owned())].into(),
            ..Default::default()
        };
        index.insert("bench", doc, v);
    }
    let queries: Vec<Vec<f32>> = (0..queries).map(|_| rng.unit_vector()).collect();
    let no_filter = HashMap::new();
    let mut ours = Vec::new();
    let mut floor = Vec::new();
    for q in &queries {
        let started = Instant::now();
        let hits = index.search("bench", q, 5, &no_filter, &[]);
        ours.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(hits.len(), 5);
        let started = Instant::now();
        let mut scores: Vec<(f32, usize)> =
            flat.chunks_exact(DIM).enumerate().map(|(i, v)| (hermes_memory::vectors::dot(q, v), i)).collect();
        scores.select_nth_unstable_by(4, |a, b| b.0.total_cmp(&a.0));
        std::hint::black_box(&scores[..5]);
        floor.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    (
        percentile(&mut ours, 0.5),
        percentile(&mut ours, 0.99),
        percentile(&mut floor, 0.5),
        percentile(&mut floor, 0.99),
    )
}

/// (documents/s through `Vectors::upsert`, values/s through raw KV puts of the same size).
pub async fn upsert_throughput(bus: &hermes_core::Bus, n: usize) -> anyhow::Result<(f64, f64)> {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let vectors = Vectors::load(bus, Default::default(), shutdown.clone()).await?;
    let mut rng = Rng(hermes_test_util::XorShift(42));
    let docs: Vec<(MemoryDoc, Vec<f32>)> = (0..n)
        .map(|i| {
            let doc =
                MemoryDoc { id: format!("u{i}"), text: format!("document number {i}"), ..Default::default() };
            (doc, rng.unit_vector())
        })
        .collect();
    let started = Instant::now();
    for batch in docs.chunks(100) {
        let (d, v): (Vec<_>, Vec<_>) = batch.iter().cloned().unzip();
        vectors.upsert("bench-upsert", "random", d, v).await?;
    }
    let ours = n as f64 / started.elapsed().as_secs_f64();
    let kv = bus
        .jetstream()
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "bench_floor_kv".into(),
            history: 1,
            ..Default::default()
        })
        .await?;
    let value = bytes::Bytes::from(vec![7u8; DIM * 4 + 40]);
    let started = Instant::now();
    for i in 0..n {
        kv.put(format!("k{i}"), value.clone()).await?;
    }
    let floor = n as f64 / started.elapsed().as_secs_f64();
    shutdown.cancel();
    Ok((ours, floor))
}

/// Texts per second through the local MiniLM.
#[cfg(feature = "local")]
pub async fn embedding_throughput() -> Option<f64> {
    let args = hermes_llm::embed::EmbeddingSettings {
        provider: Some("local".into()),
        local_dir: std::env::var_os("HERMES_LOCAL_EMBEDDING_DIR")
            .map(Into::into)
            .unwrap_or_else(|| hermes_llm::embed::DEFAULT_LOCAL_EMBEDDING_DIR.into()),
        ..Default::default()
    };
    let embedder = args.embedder().ok()??;
    let texts: Vec<String> =
        (0..128).map(|i| format!("Goal number {i}: summarise the sales of region {i} for April")).collect();
    let started = Instant::now();
    embedder.embed(&texts).await.ok()?;
    Some(texts.len() as f64 / started.elapsed().as_secs_f64())
}

/// The HNSW figures of one collection size (milliseconds, per second, bytes).
pub struct GraphRun {
    pub options: VectorOptions,
    /// Seconds to build the graph from the collection's vectors, on every core.
    pub build_s: f64,
    /// Vectors added one at a time to the built graph, per second (a live write's path).
    pub add_rate: f64,
    pub graph_bytes: usize,
    /// The distance kernels usearch picked for this CPU.
    pub acceleration: String,
    /// Of the exact top 10, the share the graph's top 10 holds.
    pub recall: f64,
    /// (expansion_search, recall, p50, p99) of the other expansions asked for.
    pub sweep: Vec<(usize, f64, f64, f64)>,
    pub search: (f64, f64),
    /// With as many other threads searching all the while as there are cores.
    pub loaded: (f64, f64),
    /// With a filter one document in ten matches.
    pub filtered: (f64, f64),
    /// With a filter one document in a hundred matches (the walk goes through matches only).
    pub selective: (f64, f64),
    /// With a filter one document in ten thousand matches (the matches are scanned exactly).
    pub rare: (f64, f64),
    /// The flat-array scan of the same vectors (the exact answer's cost).
    pub floor: (f64, f64),
}

fn doc(i: usize) -> MemoryDoc {
    MemoryDoc {
        id: format!("d{i}"),
        metadata: [
            ("group".to_owned(), (i % 10).to_string()),
            ("bucket".to_owned(), (i % 100).to_string()),
            ("rare".to_owned(), (i % 10_000).to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

/// `n` clustered vectors in one collection past the threshold: its graph built, then searched
/// for `queries` top-10s each way.
pub fn graph_run(n: usize, queries: usize, options: VectorOptions, efs: &[usize]) -> GraphRun {
    let mut data = Clustered::new((n / TOPIC_SIZE).max(1), 0x5eed ^ n as u64);
    let index = VectorIndex::new(options.clone());
    index.set_meta("bench", "clustered", DIM);
    let mut flat = Vec::with_capacity(n * DIM);
    for i in 0..n {
        let v = data.next();
        flat.extend_from_slice(&v);
        index.insert("bench", doc(i), v);
    }
    let started = Instant::now();
    assert_eq!(index.build_graphs(), 1, "{n} vectors are past the threshold");
    let build_s = started.elapsed().as_secs_f64();
    let queries: Vec<Vec<f32>> = (0..queries).map(|_| data.next()).collect();
    let none = HashMap::new();
    let top10 = |q: &[f32]| -> Vec<String> {
        index.search("bench", q, 10, &none, &[]).iter().map(|h| h.doc.as_ref().unwrap().id.clone()).collect()
    };

    let mut floor = Vec::new();
    let exact: Vec<Vec<String>> = queries
        .iter()
        .map(|q| {
            let started = Instant::now();
            let mut scores: Vec<(f32, usize)> = flat
                .chunks_exact(DIM)
                .enumerate()
                .map(|(i, v)| (hermes_memory::vectors::dot(q, v), i))
                .collect();
            scores.select_nth_unstable_by(9, |a, b| b.0.total_cmp(&a.0));
            floor.push(started.elapsed().as_secs_f64() * 1000.0);
            scores[..10].iter().map(|(_, i)| format!("d{i}")).collect()
        })
        .collect();
    let recall = || {
        let found: usize = queries
            .iter()
            .zip(&exact)
            .map(|(q, exact)| top10(q).iter().filter(|id| exact.contains(id)).count())
            .sum();
        found as f64 / (10 * queries.len()) as f64
    };
    drop(flat);
    let timed = |filter: &HashMap<String, String>| {
        // Documents 3, 13, 23, ... pass the `group` filter, 3, 103, ... `bucket`, 3, 10003, ... `rare`.
        let matching = |every: usize| n / every + usize::from(n % every > 3);
        let expected = match filter.keys().next().map(String::as_str) {
            Some("group") => 10.min(matching(10)),
            Some("bucket") => 10.min(matching(100)),
            Some("rare") => 10.min(matching(10_000)),
            _ => 10,
        };
        let mut samples: Vec<f64> = queries
            .iter()
            .map(|q| {
                let started = Instant::now();
                let hits = index.search("bench", q, 10, filter, &[]);
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                assert_eq!(hits.len(), expected, "{filter:?}");
                ms
            })
            .collect();
        (percentile(&mut samples, 0.5), percentile(&mut samples, 0.99))
    };
    // Other search expansions on the same graph, for tuning (`HERMES_BENCH_EF=64,128,...`).
    let mut sweep = Vec::new();
    for ef in efs {
        index.set_expansion_search("bench", *ef);
        let (p50, p99) = timed(&none);
        sweep.push((*ef, recall(), p50, p99));
    }
    index.set_expansion_search("bench", options.expansion_search);
    let recall = recall();
    let search = timed(&none);
    let filtered = timed(&[("group".to_owned(), "3".to_owned())].into());
    let selective = timed(&[("bucket".to_owned(), "3".to_owned())].into());
    let rare = timed(&[("rare".to_owned(), "3".to_owned())].into());
    let stop = AtomicBool::new(false);
    let loaded = std::thread::scope(|scope| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for t in 0..cores {
            let (index, queries, stop, none) = (&index, &queries, &stop, &none);
            scope.spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    std::hint::black_box(index.search("bench", &queries[i % queries.len()], 10, none, &[]));
                    i += 1;
                }
            });
        }
        std::thread::sleep(Duration::from_millis(100));
        let loaded = timed(&none);
        stop.store(true, Ordering::Relaxed);
        loaded
    });
    let graph_bytes = index.graph_memory("bench").unwrap_or(0);
    let acceleration = index.graph_acceleration("bench").unwrap_or_default();
    let adds = 2_000;
    let started = Instant::now();
    for i in n..n + adds {
        index.insert("bench", doc(i), data.next());
    }
    let add_rate = adds as f64 / started.elapsed().as_secs_f64();
    GraphRun {
        options,
        build_s,
        add_rate,
        graph_bytes,
        acceleration,
        recall,
        sweep,
        search,
        loaded,
        filtered,
        selective,
        rare,
        floor: (percentile(&mut floor, 0.5), percentile(&mut floor, 0.99)),
    }
}

/// A collection's snapshot and the restarts with and without it (seconds, bytes).
pub struct SnapshotRun {
    pub n: usize,
    /// Writing `n` documents through `Vectors::upsert`, per second (the graph built on the way).
    pub upsert_rate: f64,
    pub write_s: f64,
    pub bytes: usize,
    /// `Vectors::load` with the snapshot, and the stream messages it replayed.
    pub from_snapshot_s: f64,
    pub replayed: u64,
    /// `Vectors::load` without it: every document read from the stream, the graph built again.
    pub from_stream_s: f64,
}

/// `n` clustered documents written to one collection of their own bucket (the `vbench` prefix),
/// snapshotted, then loaded with the snapshot and without it.
pub async fn snapshot_run(nats_url: &str, n: usize, threshold: usize) -> anyhow::Result<SnapshotRun> {
    let mut config = hermes_core::BusConfig::new(nats_url);
    config.topology = hermes_core::Topology::new("vbench")?;
    let bus = hermes_core::Bus::connect(config).await?;
    let options = VectorOptions {
        graph_threshold: threshold,
        snapshot_every: Duration::from_secs(3600),
        ..Default::default()
    };
    let run = tokio_util::sync::CancellationToken::new();
    let vectors = Vectors::load(&bus, options.clone(), run.clone()).await?;
    let mut data = Clustered::new((n / TOPIC_SIZE).max(1), 0xbeef);
    let started = Instant::now();
    for start in (0..n).step_by(500) {
        let ids = start..(start + 500).min(n);
        let vs: Vec<Vec<f32>> = ids.clone().map(|_| data.next()).collect();
        vectors.upsert("bench", "clustered", ids.map(doc).collect(), vs).await?;
    }
    let upsert_rate = n as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    anyhow::ensure!(vectors.snapshot_changed().await == 1, "the snapshot was not written");
    let write_s = started.elapsed().as_secs_f64();
    let snapshots = Vectors::open_snapshots(&bus).await?;
    let bytes = snapshots.info("bench").await?.size;
    run.cancel();
    drop(vectors);

    let run = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let vectors = Vectors::load(&bus, options.clone(), run.clone()).await?;
    let from_snapshot_s = started.elapsed().as_secs_f64();
    let report = vectors.load_report().clone();
    anyhow::ensure!(
        matches!(report.collections[0].source, LoadSource::Snapshot { .. }) && report.graphs_built == 0,
        "the restart did not load the snapshot: {report:?}"
    );
    run.cancel();
    drop(vectors);

    snapshots.delete("bench").await?;
    let run = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let vectors = Vectors::load(&bus, options, run.clone()).await?;
    let from_stream_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(vectors.index().collections()[0].documents as usize == n, "the rebuild lost documents");
    run.cancel();
    Ok(SnapshotRun {
        n,
        upsert_rate,
        write_s,
        bytes,
        from_snapshot_s,
        replayed: report.replayed,
        from_stream_s,
    })
}
