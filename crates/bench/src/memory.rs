//! Semantic memory figures: exact search latency at 10k and 100k vectors against a flat-array
//! scan measured in the same run, and upsert throughput against raw KV puts of the same size.

use std::collections::HashMap;
use std::time::Instant;

use hermes_memory::vectors::{VectorIndex, Vectors};
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
