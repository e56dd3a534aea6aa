//! `bus::kv_keys` lists every key of a bucket while other keys are being written, against a real
//! nats-server. `kv::Store::keys`, which Hermes used before, missed a key in about a quarter of
//! the listings of this very test.

use hermes_core::{Bus, BusConfig};
use hermes_test_util::NatsServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_key_is_listed_while_others_are_written() {
    let nats = NatsServer::start();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let kv = bus.goals().clone();
    let keys = ["g1", "g2", "g3"];
    for key in keys {
        kv.put(key, "0".into()).await.unwrap();
    }
    kv.put("gone", "0".into()).await.unwrap();
    kv.delete("gone").await.unwrap();

    let stop = tokio_util::sync::CancellationToken::new();
    let writer = tokio::spawn({
        let (kv, stop) = (kv.clone(), stop.clone());
        async move {
            let mut i = 0u64;
            while !stop.is_cancelled() {
                i += 1;
                kv.put(keys[(i % 3) as usize], i.to_string().into()).await.unwrap();
            }
            i
        }
    });
    for listing in 0..300 {
        let mut listed = hermes_core::bus::kv_keys(&kv, "list goals").await.unwrap();
        listed.sort();
        // A deleted key is listed (reading it finds nothing); every live key is, whatever changes.
        assert_eq!(listed, ["g1", "g2", "g3", "gone"], "listing {listing}");
    }
    stop.cancel();
    let writes = writer.await.unwrap();
    assert!(writes > 300, "the keys were written while listed ({writes} writes)");
    assert!(kv.get("gone").await.unwrap().is_none());
}
