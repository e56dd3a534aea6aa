//! Recorded model exchanges and agent tool calls (docs/evaluation.md): every exchange with a
//! model during a goal, in the `HERMES_RECORDS` stream on `hermes.record.<goal_id>`, and every
//! tool call of its agent loops on `hermes.record.<goal_id>.tool`, kept as long as the goal's
//! events. The planner hands its exchanges over in its `PlanResult`, the summarizer runs here, and
//! agents report their loops' exchanges and calls as `AgentReport`s checked against the attempt's
//! result token, so the dispatchers are the only writers, as they are of events.
//! `ListModelExchanges` reads a goal's records back, for `hermes replay`. With
//! `dispatcher.record_model_exchanges = false` nothing is written.

use async_nats::jetstream::stream;
use hermes_core::{Bus, Error, Result};
use hermes_proto::{ModelExchange, ToolExchange};

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

    /// Stores one tool call of `task_id`'s agent loop, under its call index so that a repeated
    /// report stores it once.
    pub async fn record_tool(&self, task_id: &str, call: &ToolExchange) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let subject = self.bus.topology().tool_record(&call.goal_id);
        self.bus.publish(subject, call, &format!("record:{task_id}:tool:{}", call.index), None).await?;
        Ok(())
    }

    /// The goal's model exchanges, oldest first.
    pub async fn list(&self, goal_id: &str) -> Result<Vec<ModelExchange>> {
        self.read(self.bus.topology().record(goal_id), "model records").await
    }

    /// The tool calls of the goal's agent loops, oldest first.
    pub async fn list_tools(&self, goal_id: &str) -> Result<Vec<ToolExchange>> {
        self.read(self.bus.topology().tool_record(goal_id), "tool records").await
    }

    async fn read<M: prost::Message + Default>(&self, subject: String, what: &'static str) -> Result<Vec<M>> {
        let stream = self.bus.topology().records_stream();
        let read = hermes_core::bus::read_filtered::<M>(
            self.bus.jetstream(),
            &stream,
            subject,
            1,
            MAX_PER_GOAL,
            what,
        )
        .await?;
        Ok(read.into_iter().map(|(_, record)| record).collect())
    }
}
