//! The fleet-wide limiter (`hermes_llm::governor`) in one process, against a real nats-server
//! and an OpenAI-compatible mock that refuses calls over its limit: many callers at once fill
//! every slot and never pass the limit, their changes to the shared entry being combined; a
//! caller that stops waiting leaves the line. (Several processes: tests/tests/e2e/model_limits.rs.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use hermes_core::{Bus, BusConfig};
use hermes_llm::governor::{self, Governor, LimitSettings, ModelLimits};
use hermes_llm::openai::{OpenAiChat, OpenAiConfig};
use hermes_llm::{ChatModel, ChatRequest, Message};
use hermes_test_util::NatsServer;
use hermes_test_util::provider::LimitedProvider;

async fn limited(nats: &NatsServer, provider: &LimitedProvider, max: u32) -> Arc<OpenAiChat> {
    let bus = Bus::connect(BusConfig::new(nats.url())).await.expect("bus");
    let settings = LimitSettings {
        models: [("m".to_owned(), ModelLimits { max_concurrent: Some(max), ..Default::default() })].into(),
        lease_ttl_secs: 5,
        ..Default::default()
    };
    governor::install(Governor::start(&bus, &settings).await.expect("governor"));
    let mut config = OpenAiConfig::new(provider.base_url(), "m");
    config.max_concurrency = 64;
    config.max_retries = 0;
    Arc::new(OpenAiChat::new(config).expect("client"))
}

fn ping() -> ChatRequest {
    ChatRequest { messages: vec![Message::user("ping")], max_tokens: Some(4), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_at_once_fill_every_slot_and_never_pass_the_limit() {
    let nats = NatsServer::start();
    // The mock takes up to 24 at once: only the limiter holds the calls to 3.
    let provider = LimitedProvider::start(24, Duration::from_millis(30)).await;
    let model = limited(&nats, &provider, 3).await;
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..24 {
        let model = model.clone();
        callers.spawn(async move {
            for _ in 0..2 {
                model.chat(ping()).await?;
            }
            Ok::<_, hermes_llm::LlmError>(())
        });
    }
    let started = Instant::now();
    while let Some(done) = callers.join_next().await {
        done.expect("caller").expect("every call is admitted in the end");
    }
    assert_eq!(provider.served(), 48);
    assert_eq!(provider.max_in_flight(), 3, "the limit is held, and its slots are used");
    assert_eq!(provider.over_limit(), 0);
    // 16 rounds of 30 ms at 3 at once; a limiter that leaves slots empty, or serialises callers
    // on write conflicts, takes several times that.
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_stops_waiting_leaves_the_line() {
    let nats = NatsServer::start();
    let provider = LimitedProvider::start(1, Duration::from_millis(600)).await;
    let model = limited(&nats, &provider, 1).await;
    let holder = tokio::spawn({
        let model = model.clone();
        async move { model.chat(ping()).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Waits behind the holder, then gives up: its place in line must go with it.
    let gave_up = tokio::time::timeout(Duration::from_millis(150), model.chat(ping())).await;
    assert!(gave_up.is_err(), "the second call waited for the only slot");
    let bus = Bus::connect(BusConfig::new(nats.url())).await.expect("bus");
    let store = bus.jetstream().get_key_value(governor::BUCKET).await.expect("bucket");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut keys = store.keys().await.expect("keys");
        let key = futures::StreamExt::next(&mut keys).await.expect("the model's entry").expect("key");
        let entry = store.get(&key).await.expect("get").expect("entry");
        let state: serde_json::Value = serde_json::from_slice(&entry).expect("json");
        if state["waiting"].as_object().is_none_or(|w| w.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "the abandoned ticket stayed: {state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holder.await.expect("holder").expect("the holder's call");
    model.chat(ping()).await.expect("the slot is free again");
    assert_eq!(provider.over_limit(), 0);
}
