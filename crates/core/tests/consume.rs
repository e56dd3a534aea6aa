//! The consumer loop settles what handlers return, against a real nats-server: done is not
//! delivered again, a retry is, a rejection goes to the DLQ, an undecodable message goes to the
//! DLQ without reaching the handler, and a shutdown hands back what was pulled but not started.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hermes_core::bus::{ConsumerSpec, Handled};
use hermes_core::{Bus, BusConfig, Delivery};
use hermes_proto::PlanRequest;
use hermes_test_util::NatsServer;
use tokio_util::sync::CancellationToken;

async fn setup(nats: &NatsServer) -> (Bus, async_nats::jetstream::consumer::PullConsumer) {
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let topology = bus.topology().clone();
    let consumer = bus
        .durable_consumer(ConsumerSpec {
            stream: topology.plans_stream(),
            name: "consume_test".into(),
            filter_subject: topology.plan_request(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            max_ack_pending: 100,
        })
        .await
        .unwrap();
    (bus, consumer)
}

async fn request(bus: &Bus, id: &str) {
    let message = PlanRequest { goal_id: format!("g-{id}"), request_id: id.into(), ..Default::default() };
    bus.publish(bus.topology().plan_request(), &message, id, None).await.unwrap();
}

async fn dead_letters(bus: &Bus) -> u64 {
    let mut stream = bus.jetstream().get_stream(bus.topology().dlq_stream()).await.unwrap();
    stream.info().await.unwrap().state.messages
}

#[tokio::test]
async fn handlers_say_and_the_loop_settles() {
    let nats = NatsServer::start();
    let (bus, consumer) = setup(&nats).await;
    for id in ["done", "retry", "reject"] {
        request(&bus, id).await;
    }
    bus.client().publish(bus.topology().plan_request(), "not protobuf \u{ff}".into()).await.unwrap();
    bus.client().flush().await.unwrap();
    let seen: Arc<std::sync::Mutex<Vec<(String, i64)>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let mut messages = consumer.messages().await.unwrap();
    let (record, stop) = (seen.clone(), shutdown.clone());
    let run = tokio::spawn({
        let bus = bus.clone();
        async move {
            hermes_core::bus::consume_concurrently(
                &bus,
                "plan_request",
                &mut messages,
                4,
                &stop,
                |d: Arc<Delivery<PlanRequest>>| {
                    let record = record.clone();
                    async move {
                        record.lock().unwrap().push((d.message.request_id.clone(), d.delivered()));
                        match (d.message.request_id.as_str(), d.delivered()) {
                            ("retry", 1) => Handled::Retry { after: Duration::from_millis(100) },
                            ("reject", _) => Handled::Reject { reason: "cannot ever work".into() },
                            _ => Handled::Done,
                        }
                    }
                },
            )
            .await
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().len() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", seen.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut got = seen.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, [("done".into(), 1), ("reject".into(), 1), ("retry".into(), 1), ("retry".into(), 2)]);
    // The rejected one and the undecodable one are in the DLQ; nothing is pending.
    assert_eq!(dead_letters(&bus).await, 2);
    shutdown.cancel();
    run.await.unwrap();
    let info = bus.jetstream().get_stream(bus.topology().plans_stream()).await.unwrap();
    let consumer =
        info.get_consumer::<async_nats::jetstream::consumer::pull::Config>("consume_test").await.unwrap();
    let mut consumer = consumer;
    let state = consumer.info().await.unwrap().clone();
    assert_eq!((state.num_pending, state.num_ack_pending), (0, 0));
}

#[tokio::test]
async fn a_shutdown_hands_back_unstarted_messages_once() {
    let nats = NatsServer::start();
    let (bus, consumer) = setup(&nats).await;
    for i in 0..6 {
        request(&bus, &format!("r{i}")).await;
    }
    let started = Arc::new(AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let mut messages = consumer.stream().max_messages_per_batch(4).messages().await.unwrap();
    let (count, stop) = (started.clone(), shutdown.clone());
    let run = tokio::spawn({
        let bus = bus.clone();
        async move {
            hermes_core::bus::consume_concurrently(
                &bus,
                "plan_request",
                &mut messages,
                2,
                &stop,
                move |_d: Arc<Delivery<PlanRequest>>| {
                    let count = count.clone();
                    async move {
                        count.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        Handled::Done
                    }
                },
            )
            .await
        }
    });
    while started.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), run).await.expect("the loop drains").unwrap();
    assert_eq!(started.load(Ordering::SeqCst), 2, "nothing new starts after shutdown");
    // The four not started are back with the consumer, none dead-lettered for too many deliveries.
    let info = bus.jetstream().get_stream(bus.topology().plans_stream()).await.unwrap();
    let mut consumer =
        info.get_consumer::<async_nats::jetstream::consumer::pull::Config>("consume_test").await.unwrap();
    let state = consumer.info().await.unwrap().clone();
    assert_eq!(state.num_pending + state.num_ack_pending as u64, 4, "{state:?}");
    assert_eq!(dead_letters(&bus).await, 0);
}

/// A consumer created fresh has no differences to report; one bound with other settings keeps
/// the settings it was created with (what the warning says).
#[tokio::test]
async fn a_bound_consumer_keeps_the_settings_it_was_created_with() {
    let nats = NatsServer::start();
    let (bus, first) = setup(&nats).await;
    assert_eq!(first.cached_info().config.ack_wait, Duration::from_secs(30));
    let topology = bus.topology().clone();
    let spec = ConsumerSpec {
        stream: topology.plans_stream(),
        name: "consume_test".into(),
        filter_subject: topology.plan_request(),
        ack_wait: Duration::from_secs(5),
        max_deliver: 7,
        max_ack_pending: 100,
    };
    let bound = bus.durable_consumer(spec.clone()).await.unwrap();
    let config = &bound.cached_info().config;
    assert_eq!((config.ack_wait, config.max_deliver), (Duration::from_secs(30), 5));
    let differs = hermes_core::bus::config_differences(config, &spec);
    assert_eq!(differs, ["ack_wait: 30s (wanted 5s)", "max_deliver: 5 (wanted 7)"]);
    // Deleted and made again with these settings, it has them (a work queue has one consumer
    // per subject).
    let stream = bus.jetstream().get_stream(topology.plans_stream()).await.unwrap();
    stream.delete_consumer("consume_test").await.unwrap();
    let fresh = bus.durable_consumer(spec.clone()).await.unwrap();
    assert!(hermes_core::bus::config_differences(&fresh.cached_info().config, &spec).is_empty());
}
