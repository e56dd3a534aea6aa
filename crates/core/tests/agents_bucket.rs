//! The agents bucket's entries, and the delete markers agents leave when they go, expire a day
//! after their last write: a new bucket is made so, and one made by an older release is given
//! its max age (by the registry at start, through `AgentStore::expire_entries`). Against a real
//! nats-server.

use hermes_core::{Bus, BusConfig};
use hermes_test_util::NatsServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_agents_bucket_forgets_entries_and_markers_a_day_after_their_last_write() {
    // A bucket as an older release made it: no max age, a marker of an agent that left.
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let old = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "hermes_agents".into(),
            history: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    old.put("gone-pod", "x".into()).await.unwrap();
    old.delete("gone-pod").await.unwrap();
    let max_age = |js: async_nats::jetstream::Context| async move {
        js.get_stream("KV_hermes_agents").await.unwrap().info().await.unwrap().config.max_age
    };
    assert_eq!(max_age(js.clone()).await, std::time::Duration::ZERO);

    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    assert!(bus.agents().expire_entries(bus.jetstream()).await.unwrap(), "the old bucket was changed");
    assert_eq!(max_age(js.clone()).await, hermes_core::agents::MAX_AGE);
    assert!(!bus.agents().expire_entries(bus.jetstream()).await.unwrap(), "once is enough");
    // The marker is still there, and goes with the max age like any entry.
    let entry = bus.agents().all().await.unwrap();
    assert!(entry.is_empty(), "{entry:?}");

    // A new deployment's bucket is made with it.
    let fresh = NatsServer::start();
    let bus = Bus::connect(BusConfig::new(fresh.url())).await.unwrap();
    assert!(!bus.agents().expire_entries(bus.jetstream()).await.unwrap());
    let client = async_nats::connect(fresh.url()).await.unwrap();
    assert_eq!(max_age(async_nats::jetstream::new(client)).await, hermes_core::agents::MAX_AGE);
}
