//! The vector index's snapshots against a real nats-server: a restart loads a collection's
//! graph from its snapshot instead of rebuilding it and replays only the changes made after it;
//! a corrupt snapshot, or one of a bucket since created again, is rebuilt from the stream.

use std::collections::HashMap;
use std::time::Duration;

use hermes_core::{Bus, BusConfig};
use hermes_memory::Vectors;
use hermes_memory::vectors::{LoadSource, VectorOptions, dot};
use hermes_proto::MemoryDoc;
use tokio_util::sync::CancellationToken;

const DIM: usize = 32;

/// A low threshold, and no periodic snapshot: the test takes them.
fn options() -> VectorOptions {
    VectorOptions { graph_threshold: 300, snapshot_every: Duration::from_secs(3600), ..Default::default() }
}

/// Unit vectors around 8 directions, deterministic in `seed`.
fn unit_vectors(n: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = hermes_test_util::XorShift(seed | 1);
    let mut uniform = move || ((rng.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32 - 0.5;
    let centroids: Vec<Vec<f32>> = (0..8).map(|_| (0..DIM).map(|_| uniform()).collect()).collect();
    (0..n)
        .map(|i| {
            let mut v: Vec<f32> = centroids[i % 8].iter().map(|c| c + 0.3 * uniform()).collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter_mut().for_each(|x| *x /= norm);
            v
        })
        .collect()
}

fn docs(ids: std::ops::Range<usize>) -> Vec<MemoryDoc> {
    ids.map(|i| MemoryDoc { id: format!("d{i}"), text: format!("document {i}"), ..Default::default() })
        .collect()
}

async fn upsert(
    vectors: &Vectors,
    collection: &str,
    ids: std::ops::Range<usize>,
    seed: u64,
) -> Vec<Vec<f32>> {
    let vs = unit_vectors(ids.len(), seed);
    for (d, v) in docs(ids).chunks(100).zip(vs.chunks(100)) {
        vectors.upsert(collection, "model-a", d.to_vec(), v.to_vec()).await.unwrap();
    }
    vs
}

fn source<'a>(vectors: &'a Vectors, collection: &str) -> &'a LoadSource {
    &vectors.load_report().collections.iter().find(|c| c.name == collection).unwrap().source
}

#[tokio::test]
async fn a_restart_loads_the_graph_from_its_snapshot_and_replays_only_later_writes() {
    let nats = hermes_test_util::NatsServer::start();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let first_run = CancellationToken::new();
    let vectors = Vectors::load(&bus, options(), first_run.clone()).await.unwrap();
    assert_eq!(vectors.load_report().collections.len(), 0);
    let first = upsert(&vectors, "big", 0..400, 1).await;
    upsert(&vectors, "small", 0..5, 2).await;
    assert!(vectors.index().on_graph("big") && !vectors.index().on_graph("small"));
    assert_eq!(vectors.snapshot_changed().await, 2);
    assert_eq!(vectors.snapshot_changed().await, 0, "nothing changed since");

    // After the snapshot: 10 new documents, 5 deleted, 3 replaced by vectors far from the rest.
    let later = upsert(&vectors, "big", 400..410, 3).await;
    let kv = Vectors::open_bucket(&bus).await.unwrap();
    for i in 0..5 {
        kv.delete(format!("big.d{i}")).await.unwrap();
    }
    let far: Vec<f32> = first[10].iter().map(|x| -x).collect();
    vectors.upsert("big", "model-a", docs(10..13), vec![far.clone(); 3]).await.unwrap();
    vectors.caught_up().await.unwrap();
    first_run.cancel();
    drop(vectors);

    let second_run = CancellationToken::new();
    let vectors = Vectors::load(&bus, options(), second_run.clone()).await.unwrap();
    let report = vectors.load_report();
    assert!(matches!(source(&vectors, "big"), LoadSource::Snapshot { .. }), "{report:?}");
    assert!(matches!(source(&vectors, "small"), LoadSource::Snapshot { .. }), "{report:?}");
    assert_eq!(report.graphs_built, 0, "the graph came from the snapshot, not a rebuild: {report:?}");
    // 10 puts, 5 deletes and 3 replaces since the snapshot, and nothing else read again.
    assert_eq!(report.replayed, 18, "{report:?}");
    let big = report.collections.iter().find(|c| c.name == "big").unwrap();
    assert_eq!((big.documents, big.on_graph), (405, true));

    let index = vectors.index();
    let none = HashMap::new();
    for i in 0..5 {
        assert!(index.get("big", &format!("d{i}")).is_none(), "d{i} was deleted after the snapshot");
    }
    let hits = index.search("big", &later[4], 1, &none, &[]);
    assert_eq!(hits[0].doc.as_ref().unwrap().id, "d404", "a document written after the snapshot");
    let hits = index.search("big", &far, 3, &none, &[]);
    let mut replaced: Vec<String> = hits.iter().map(|h| h.doc.as_ref().unwrap().id.clone()).collect();
    replaced.sort();
    assert_eq!(replaced, ["d10", "d11", "d12"]);
    assert!(hits.iter().all(|h| (h.score - dot(&far, &far)).abs() < 1e-4));
    let all = index.search("big", &first[20], 1000, &none, &[]);
    assert_eq!(all.len(), 405, "every live document once, none deleted");

    // Writes keep flowing into the loaded graph, and the next snapshot covers them.
    upsert(&vectors, "big", 410..420, 4).await;
    assert_eq!(index.collections().iter().find(|c| c.name == "big").unwrap().documents, 415);
    assert_eq!(vectors.snapshot_changed().await, 1);
    second_run.cancel();
}

#[tokio::test]
async fn a_corrupt_or_stale_snapshot_is_rebuilt_from_the_stream() {
    let nats = hermes_test_util::NatsServer::start();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let run = CancellationToken::new();
    let vectors = Vectors::load(&bus, options(), run.clone()).await.unwrap();
    let first = upsert(&vectors, "big", 0..400, 1).await;
    assert_eq!(vectors.snapshot_changed().await, 1);
    run.cancel();
    drop(vectors);

    // Corrupt: the object is not a snapshot at all.
    let snapshots = Vectors::open_snapshots(&bus).await.unwrap();
    snapshots.put("big", &mut &b"not a snapshot"[..]).await.unwrap();
    let run = CancellationToken::new();
    let vectors = Vectors::load(&bus, options(), run.clone()).await.unwrap();
    match source(&vectors, "big") {
        LoadSource::Stream { reason } => assert!(reason.contains("not a vector snapshot"), "{reason}"),
        other => panic!("a corrupt snapshot was used: {other:?}"),
    }
    assert_eq!(vectors.load_report().graphs_built, 1);
    assert!(vectors.index().on_graph("big"));
    let hits = vectors.index().search("big", &first[7], 1, &HashMap::new(), &[]);
    assert_eq!(hits[0].doc.as_ref().unwrap().id, "d7");
    // A good snapshot again, of this bucket.
    assert_eq!(vectors.snapshot_changed().await, 1);
    run.cancel();
    drop(vectors);

    // Stale: the bucket is deleted and created again; its sequences start over, so the
    // snapshot of the old one says nothing about the new one.
    bus.jetstream().delete_key_value(bus.topology().vectors_bucket()).await.unwrap();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let run = CancellationToken::new();
    let vectors = Vectors::load(&bus, options(), run.clone()).await.unwrap();
    upsert(&vectors, "big", 1000..1350, 5).await;
    run.cancel();
    drop(vectors);
    let run = CancellationToken::new();
    let vectors = Vectors::load(&bus, options(), run.clone()).await.unwrap();
    match source(&vectors, "big") {
        LoadSource::Stream { reason } => assert!(reason.contains("created again"), "{reason}"),
        other => panic!("a snapshot of the old bucket was used: {other:?}"),
    }
    let infos = vectors.index().collections();
    assert_eq!(infos[0].documents, 350);
    assert!(vectors.index().get("big", "d7").is_none() && vectors.index().get("big", "d1007").is_some());
    run.cancel();
}

/// The memory service's NATS user in `deploy/nats/accounts.conf` may do everything the index
/// does: follow the bucket, write a snapshot, purge an unfinished upload's chunks and load the
/// snapshot at the next start.
#[tokio::test]
async fn the_memory_user_may_follow_the_bucket_and_write_and_read_snapshots() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut config = std::fs::read_to_string(root.join("deploy/nats/accounts.conf")).unwrap();
    for user in ["dispatcher", "registry", "planner", "memory", "agent", "nats_sys"] {
        let var = if user == "nats_sys" {
            "$NATS_SYS_PASSWORD".to_owned()
        } else {
            format!("$HERMES_{}_NATS_PASSWORD", user.to_ascii_uppercase())
        };
        config = config.replace(&var, &format!("\"{user}-secret\""));
    }
    let nats = hermes_test_util::NatsServer::start_with_config(&config);
    let url = |user: &str| format!("nats://{user}:{user}-secret@127.0.0.1:{}", nats.port());
    // The dispatcher creates the shared streams; memory creates its own buckets.
    Bus::connect(BusConfig::new(url("dispatcher"))).await.unwrap();
    let bus = Bus::connect(BusConfig::new(url("memory"))).await.unwrap();
    let run = CancellationToken::new();
    let vectors = Vectors::load(&bus, options(), run.clone()).await.unwrap();
    upsert(&vectors, "big", 0..400, 1).await;
    assert_eq!(vectors.snapshot_changed().await, 1);
    // An upload that stopped before its object was written leaves chunks nothing refers to:
    // those go, the stored snapshot's stay.
    let chunk = "$O.hermes_vector_snapshots.C.abandoned-upload";
    bus.jetstream().publish(chunk, vec![1u8; 1000].into()).await.unwrap().await.unwrap();
    let purged = vectors.purge_orphan_chunks(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(purged, 0, "a recent one may be in progress");
    assert_eq!(vectors.purge_orphan_chunks(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(vectors.purge_orphan_chunks(Duration::ZERO).await.unwrap(), 0);
    run.cancel();
    drop(vectors);
    let run = CancellationToken::new();
    let vectors = Vectors::load(&bus, options(), run.clone()).await.unwrap();
    assert!(matches!(source(&vectors, "big"), LoadSource::Snapshot { .. }), "{:?}", vectors.load_report());
    upsert(&vectors, "big", 400..410, 2).await;
    run.cancel();
    let refused: Vec<String> =
        nats.log().lines().filter(|l| l.contains("Violation")).map(str::to_owned).collect();
    assert!(refused.is_empty(), "the server refused the memory user:\n{}", refused.join("\n"));
}
