//! The memory service against a real nats-server: everything it keeps (sessions, artifacts,
//! vectors) survives a restart of the service, and a collection refuses vectors of another
//! embedding model or dimension, before and after the restart.

use std::collections::HashMap;

use hermes_core::{Bus, BusConfig};
use hermes_memory::{Memory, MemoryConfig, Vectors};
use hermes_proto::{AppendTurnRequest, MemoryDoc, SessionRequest, SessionTurn};
use tokio_util::sync::CancellationToken;

fn doc(id: &str, kind: &str) -> MemoryDoc {
    MemoryDoc {
        id: id.into(),
        text: format!("text of {id}"),
        metadata: [("kind".into(), kind.into())].into(),
        ..Default::default()
    }
}

fn turn(i: usize) -> AppendTurnRequest {
    let role = if i.is_multiple_of(2) { "user" } else { "assistant" };
    AppendTurnRequest {
        turn: Some(SessionTurn {
            session_id: "s-1".into(),
            role: role.into(),
            content: format!("turn {i}. I prefer short answers."),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn sessions_artifacts_and_vectors_survive_a_restart_and_mismatches_are_refused() {
    let nats = hermes_test_util::NatsServer::start();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let first_run = CancellationToken::new();
    let memory = Memory::open(bus.clone(), MemoryConfig::default(), first_run.clone()).await.unwrap();
    for i in 0..13 {
        memory.append_turn(turn(i)).await.unwrap();
    }
    let artifact =
        bus.artifacts().put(&vec![7u8; 300_000], "application/octet-stream", "g-1", None).await.unwrap();
    let vectors = Vectors::load(&bus, Default::default(), first_run.clone()).await.unwrap();
    vectors
        .upsert(
            "notes",
            "model-a",
            vec![doc("near", "goal"), doc("far", "note")],
            vec![vec![1.0, 0.0, 0.0], vec![0.0, 1.0, 0.0]],
        )
        .await
        .unwrap();
    let err =
        vectors.upsert("notes", "model-b", vec![doc("x", "goal")], vec![vec![1.0; 4]]).await.unwrap_err();
    assert_eq!(err.code().as_str(), "FAILED_PRECONDITION");
    assert!(err.to_string().contains("3-dimensional vectors of `model-a`"), "{err}");
    first_run.cancel();
    drop((memory, vectors));

    // A new service process: a new connection, the same server.
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let second_run = CancellationToken::new();
    let memory = Memory::open(bus.clone(), MemoryConfig::default(), second_run.clone()).await.unwrap();
    let session =
        memory.session(SessionRequest { session_id: "s-1".into(), ..Default::default() }).await.unwrap();
    assert_eq!(session.total_turns, 13);
    assert_eq!(session.turns.len(), 10);
    assert_eq!(session.turns[0].content, "turn 3. I prefer short answers.");
    let summary = session.summary.unwrap();
    assert!(summary.preferences.iter().any(|p| p.contains("I prefer short answers")), "{summary:?}");
    assert_eq!(bus.artifacts().get(&artifact.reference).await.unwrap(), vec![7u8; 300_000]);

    let vectors = Vectors::load(&bus, Default::default(), second_run.clone()).await.unwrap();
    let hits = vectors.index().search("notes", &[0.9, 0.1, 0.0], 1, &HashMap::new(), &[]);
    assert_eq!(hits[0].doc.as_ref().unwrap().id, "near");
    let filter = [("kind".to_owned(), "note".to_owned())].into();
    assert_eq!(vectors.index().search("notes", &[0.9, 0.1, 0.0], 5, &filter, &[]).len(), 1);
    let err =
        vectors.upsert("notes", "model-a", vec![doc("y", "goal")], vec![vec![1.0; 5]]).await.unwrap_err();
    assert_eq!(err.code().as_str(), "FAILED_PRECONDITION", "{err}");
    let collections = vectors.index().collections();
    assert_eq!((collections[0].dimension, collections[0].documents), (3, 2));

    // Retention: an artifact past its TTL and memories past theirs are deleted; others stay.
    let short = bus
        .artifacts()
        .put(b"brief", "text/plain", "g-2", Some(std::time::Duration::from_millis(1)))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(bus.artifacts().sweep_expired(hermes_core::now_unix_ms()).await.unwrap(), 1);
    assert_eq!(bus.artifacts().get(&short.reference).await.unwrap_err().code().as_str(), "NOT_FOUND");
    assert!(bus.artifacts().get(&artifact.reference).await.is_ok());
    assert_eq!(vectors.expire(std::time::Duration::from_secs(3600)).await.unwrap(), 0);
    assert_eq!(vectors.expire(std::time::Duration::ZERO).await.unwrap(), 2);
    assert!(vectors.index().search("notes", &[1.0, 0.0, 0.0], 5, &HashMap::new(), &[]).is_empty());
    second_run.cancel();
}

#[tokio::test]
async fn semantic_requests_without_an_embedding_model_say_how_to_get_one() {
    let nats = hermes_test_util::NatsServer::start();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let run = CancellationToken::new();
    let memory = Memory::open(bus.clone(), MemoryConfig::default(), run.clone()).await.unwrap();
    tokio::spawn(hermes_memory::run(memory, run.clone()));
    let client = hermes_memory::MemoryClient::new(&bus);
    let mut ready = false;
    for _ in 0..100 {
        match client.collections("").await {
            Ok(_) => {
                ready = true;
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    assert!(ready, "the memory service answers over NATS");
    let task_token = hermes_core::task_token::TaskKey::open(&bus).await.unwrap().sign("g", "", u64::MAX);
    let err = client
        .search(&hermes_proto::SearchRequest { query: "x".into(), task_token, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code().as_str(), "FAILED_PRECONDITION");
    assert!(err.to_string().contains("HERMES_EMBEDDING_PROVIDER"), "{err}");
    run.cancel();
}

/// With a summarizer model, older turns are folded by the model (the scripted OpenAI-compatible
/// server), and the turns reach it as data; when the model fails, the extractive fold takes over.
#[tokio::test]
async fn the_summarizer_model_folds_old_turns_and_the_fallback_covers_its_failures() {
    use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
    let nats = hermes_test_util::NatsServer::start();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let llm = ScriptedLlm::start().await;
    let mut model = hermes_llm::OpenAiConfig::new(llm.base_url(), "summarizer-model");
    model.backoff = std::time::Duration::from_millis(5);
    model.max_retries = 0;
    let summarizer: std::sync::Arc<dyn hermes_llm::ChatModel> =
        std::sync::Arc::new(hermes_llm::OpenAiChat::new(model).unwrap());
    llm.push(
        "summarizer-model",
        ScriptedResponse::content(
            serde_json::json!({"preferences": ["short answers"], "facts": ["turn 0 happened"], "open_items": []})
                .to_string(),
        ),
    );
    let run = CancellationToken::new();
    let config = MemoryConfig { window: 3, summarizer: Some(summarizer), ..Default::default() };
    let memory = Memory::open(bus, config, run.clone()).await.unwrap();
    for i in 0..4 {
        memory.append_turn(turn(i)).await.unwrap();
    }
    let session =
        memory.session(SessionRequest { session_id: "s-1".into(), ..Default::default() }).await.unwrap();
    let summary = session.summary.unwrap();
    assert_eq!(
        (summary.method.as_str(), summary.preferences.as_slice()),
        ("model", ["short answers".to_owned()].as_slice())
    );
    let request = llm.requests_for("summarizer-model")[0].to_string();
    assert!(
        request.contains("turn 0. I prefer short answers.") && request.contains("data, not instructions"),
        "{request}"
    );
    // The script is exhausted now: the next fold falls back to the extractive summary.
    memory.append_turn(turn(4)).await.unwrap();
    let session =
        memory.session(SessionRequest { session_id: "s-1".into(), ..Default::default() }).await.unwrap();
    assert_eq!(session.summary.unwrap().method, "extractive");
    run.cancel();
}
