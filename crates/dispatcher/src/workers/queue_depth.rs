//! The queue-depth worker: keeps `hermes_queue_pending`, `hermes_queue_ack_pending` and
//! `hermes_webhook_queue` current.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt as _;
use hermes_core::Bus;
use hermes_core::metrics::{self, labels};
use tokio_util::sync::CancellationToken;

/// How often queue depths are read from the server.
const QUEUE_POLL: Duration = Duration::from_secs(5);

/// Every few seconds, the task stream's consumers are listed and their backlog recorded by task
/// type and consumer. A consumer that disappears (a departed agent) reads 0 afterwards.
pub(crate) async fn run(bus: Bus, shutdown: CancellationToken) {
    let m = metrics::global();
    let mut seen = BTreeSet::new();
    let mut tick = tokio::time::interval(QUEUE_POLL);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Ok(stream) = bus.jetstream().get_stream(bus.topology().tasks_stream()).await else { continue };
        let mut consumers = stream.consumers();
        let mut now = BTreeSet::new();
        while let Some(Ok(info)) = consumers.next().await {
            let Some((task_type, consumer)) = bus.topology().task_consumer_of(&info.config.filter_subject)
            else {
                continue;
            };
            let series = labels(&[("task_type", &task_type), ("consumer", &consumer)]);
            m.queue_pending.get_or_create(&series).set(info.num_pending as i64);
            m.queue_ack_pending.get_or_create(&series).set(info.num_ack_pending as i64);
            now.insert(series);
        }
        for gone in seen.difference(&now) {
            m.queue_pending.get_or_create(gone).set(0);
            m.queue_ack_pending.get_or_create(gone).set(0);
        }
        seen = now;
        if let Ok(mut webhooks) = bus.jetstream().get_stream(bus.topology().webhooks_stream()).await
            && let Ok(info) = webhooks.info().await
        {
            m.webhook_queue.set(info.state.messages as i64);
        }
    }
}
