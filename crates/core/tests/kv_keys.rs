//! `bus::kv_keys` lists every key of a bucket while other keys are being written and created,
//! once each, against a real nats-server. `kv::Store::keys`, which Hermes used before, missed a
//! key in about a quarter of the listings of this very test.

use hermes_core::{Bus, BusConfig};
use hermes_test_util::NatsServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_key_is_listed_once_while_others_are_written_and_created() {
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
                // New keys too, sorting before and after the others.
                if i.is_multiple_of(5) {
                    kv.put(format!("a{i:06}"), "new".into()).await.unwrap();
                    kv.put(format!("z{i:06}"), "new".into()).await.unwrap();
                }
            }
            i
        }
    });
    for listing in 0..300 {
        let listed = hermes_core::bus::kv_keys(&kv, "list goals").await.unwrap();
        // A deleted key is listed (reading it finds nothing); every live key is, whatever changes.
        for key in ["g1", "g2", "g3", "gone"] {
            assert!(listed.iter().any(|k| k == key), "listing {listing} lacks {key}: {listed:?}");
        }
        let mut once = listed.clone();
        once.dedup();
        assert_eq!(once, listed, "listing {listing} is sorted and has no key twice");
    }
    stop.cancel();
    let writes = writer.await.unwrap();
    assert!(writes > 300, "the keys were written while listed ({writes} writes)");
    assert!(kv.get("gone").await.unwrap().is_none());
}
