//! Semantic search with the real all-MiniLM-L6-v2 (feature `local`, `make models`): an earlier
//! goal, asked about again in other words, ranks first among 200 unrelated goals; the ranking
//! survives a restart of the service.
#![cfg(feature = "local")]

use std::path::PathBuf;

use hermes_core::{Bus, BusConfig};
use hermes_memory::{Memory, MemoryConfig};
use hermes_proto::{MemoryDoc, SearchRequest, UpsertRequest};
use tokio_util::sync::CancellationToken;

fn model_dir() -> PathBuf {
    std::env::var_os("HERMES_LOCAL_EMBEDDING_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/models/all-MiniLM-L6-v2")
    })
}

fn config() -> MemoryConfig {
    let args = hermes_llm::embed::EmbeddingSettings {
        provider: Some("local".into()),
        local_dir: model_dir(),
        ..Default::default()
    };
    MemoryConfig {
        embedder: args.embedder().expect("the local embedding model loads (make models)"),
        ..Default::default()
    }
}

/// 200 goals about anything but sales.
fn unrelated() -> Vec<String> {
    let actions = [
        "Translate",
        "Proofread",
        "Schedule",
        "Book",
        "Plan",
        "Draft",
        "Review",
        "Archive",
        "Rename",
        "Compress",
    ];
    let things = [
        "the wedding invitation for my cousin",
        "a dentist appointment next Tuesday",
        "the hiking trip to the Alps in July",
        "the kubernetes upgrade runbook",
        "the birthday party playlist",
        "my grandmother's soup recipe",
        "the photos from the beach holiday",
        "the bug report about the login page crash",
        "a poem about autumn leaves",
        "the chess club newsletter",
        "the onboarding guide for new engineers",
        "a flight from Oslo to Lisbon",
        "the garden watering plan",
        "the podcast episode transcript",
        "the research paper on protein folding",
        "the car maintenance checklist",
        "the weekly yoga class timetable",
        "the legal contract for the apartment lease",
        "the astronomy night observation notes",
        "the bicycle repair instructions",
    ];
    actions.iter().flat_map(|a| things.iter().map(move |t| format!("Goal: {a} {t}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paraphrased_earlier_goal_ranks_first_among_200_unrelated_ones() {
    let nats = hermes_test_util::NatsServer::start();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let run = CancellationToken::new();
    let memory = Memory::open(bus.clone(), config(), run.clone()).await.unwrap();
    let mut docs: Vec<MemoryDoc> = unrelated()
        .into_iter()
        .enumerate()
        .map(|(i, text)| MemoryDoc { id: format!("g{i}"), text, ..Default::default() })
        .collect();
    assert_eq!(docs.len(), 200);
    docs.insert(
        97,
        MemoryDoc {
            id: "target".into(),
            text: "Goal: Compute total April revenue for each product category from sales.csv\nAnswer: toys 17, books 5".into(),
            ..Default::default()
        },
    );
    memory.upsert(UpsertRequest { collection: String::new(), docs, ..Default::default() }).await.unwrap();
    let query = SearchRequest {
        query: "how much money did we make in April, broken down by kind of product?".into(),
        top_k: 3,
        ..Default::default()
    };
    let hits = memory.search(query.clone()).await.unwrap().hits;
    assert_eq!(hits[0].doc.as_ref().unwrap().id, "target", "{hits:?}");
    assert!(hits[0].score > hits[1].score + 0.1, "{hits:?}");
    run.cancel();

    // A restarted service ranks the same from what it persisted.
    let run = CancellationToken::new();
    let memory = Memory::open(Bus::connect(BusConfig::new(nats.url())).await.unwrap(), config(), run.clone())
        .await
        .unwrap();
    let again = memory.search(query).await.unwrap().hits;
    assert_eq!(again[0].doc.as_ref().unwrap().id, "target");
    assert!((again[0].score - hits[0].score).abs() < 1e-5);
    run.cancel();
}
