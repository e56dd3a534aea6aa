//! Recorded model exchanges (docs/evaluation.md): every exchange with a model during a goal, in
//! the `HERMES_RECORDS` stream on `hermes.record.<goal_id>`, kept as long as the goal's events.
//! The planner hands its exchanges over in its `PlanResult` and the summarizer runs here, so the
//! dispatchers are the only writers, as they are of events. `ListModelExchanges` reads a goal's
//! records back, for `hermes replay`. With `dispatcher.record_model_exchanges = false` nothing is
//! written.

use async_nats::jetstream::stream;
use hermes_core::{Bus, Error, Result};
use hermes_proto::ModelExchange;

/// Most records read back for one goal.
const MAX_PER_GOAL: usize = 10_000;

/// Appends and reads records. Cheap to clone.
#[derive(Clone)]
pub struct Records {
    bus: Bus,
    enabled: bool,
}

impl Records {
    /// Opens the records stream, creating it on the first start (the dispatchers own it).
    pub async fn open(bus: Bus, enabled: bool) -> Result<Records> {
        let topology = bus.topology();
        let config = stream::Config {
            name: topology.records_stream(),
            description: Some("Hermes recorded model exchanges, for hermes replay".into()),
            subjects: vec![topology.all_records()],
            retention: stream::RetentionPolicy::Limits,
            max_age: bus.config().events_max_age,
            duplicate_window: std::time::Duration::from_secs(120),
            num_replicas: bus.config().replicas,
            ..Default::default()
        };
        hermes_core::bus::patiently(|| async {
            bus.jetstream().get_or_create_stream(config.clone()).await.map_err(|e| Error::JetStream {
                operation: "create the records stream",
                reason: e.to_string(),
            })
        })
        .await?;
        Ok(Records { bus, enabled })
    }

    /// Stores `exchanges`, each under `<id>:<index>` so that a retry stores it once.
    pub async fn record(&self, goal_id: &str, id: &str, exchanges: &[ModelExchange]) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let subject = self.bus.topology().record(goal_id);
        for (i, exchange) in exchanges.iter().enumerate() {
            let exchange = ModelExchange { goal_id: goal_id.to_owned(), ..exchange.clone() };
            self.bus.publish(subject.clone(), &exchange, &format!("record:{id}:{i}"), None).await?;
        }
        Ok(())
    }

    /// The goal's records, oldest first.
    pub async fn list(&self, goal_id: &str) -> Result<Vec<ModelExchange>> {
        let topology = self.bus.topology();
        let read = hermes_core::bus::read_filtered::<ModelExchange>(
            self.bus.jetstream(),
            &topology.records_stream(),
            topology.record(goal_id),
            1,
            MAX_PER_GOAL,
            "model records",
        )
        .await?;
        Ok(read.into_iter().map(|(_, record)| record).collect())
    }
}
