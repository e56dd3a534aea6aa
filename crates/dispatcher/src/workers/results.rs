//! The results worker: consumes every agent's results from the one shared results consumer and
//! applies them to their goals. Results wait in a per-goal inbox; one task at a time drains a
//! goal's inbox and applies everything in it with one compare-and-set, so a wide fan-out costs
//! one KV write per batch rather than a storm of conflicting writes. Across replicas, the CAS
//! alone keeps updates correct.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use dashmap::DashMap;
use hermes_core::Delivery;
use hermes_core::bus::Handled;
use hermes_proto::TaskResult;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, warn};

use crate::GoalService;

/// Results of one goal waiting to be applied.
#[derive(Default)]
struct Inbox {
    pending: std::sync::Mutex<Vec<Arc<Delivery<TaskResult>>>>,
    draining: AtomicBool,
}

/// The worker's state: the inboxes of goals with results waiting.
type Inboxes = DashMap<String, Arc<Inbox>>;

/// Consumes results until `shutdown`; then hands back what was pulled but not started, for
/// another replica, and finishes what is being applied.
pub(crate) async fn run(service: Arc<GoalService>, consumer: PullConsumer, shutdown: CancellationToken) {
    let concurrency = service.config().result_concurrency;
    let mut messages = match hermes_core::bus::pull(&consumer, concurrency).await {
        Ok(m) => m,
        Err(e) => {
            warn!(error = %e, "cannot pull results");
            return;
        }
    };
    let inboxes = Arc::new(Inboxes::new());
    let bus = service.bus().clone();
    hermes_core::bus::consume_concurrently(
        &bus,
        "result",
        &mut messages,
        concurrency,
        &shutdown,
        |delivery: Arc<Delivery<TaskResult>>| {
            let service = service.clone();
            let inboxes = inboxes.clone();
            async move {
                let goal_id = delivery.message.goal_id.clone();
                let inbox = inboxes.entry(goal_id.clone()).or_default().clone();
                inbox.pending.lock().unwrap_or_else(|p| p.into_inner()).push(delivery);
                if !inbox.draining.swap(true, Ordering::AcqRel) {
                    drain(&service, &inboxes, &goal_id, &inbox).await;
                }
                // The inbox's drainer settles it, with the batch it was applied in.
                Handled::Kept
            }
        },
    )
    .await;
}

/// Applies everything in a goal's inbox, batch by batch, until it stays empty. Only the task that
/// set `draining` runs this.
async fn drain(service: &GoalService, inboxes: &Inboxes, goal_id: &str, inbox: &Inbox) {
    loop {
        let batch = std::mem::take(&mut *inbox.pending.lock().unwrap_or_else(|p| p.into_inner()));
        if batch.is_empty() {
            inbox.draining.store(false, Ordering::Release);
            // A result may have arrived between the take and the store; take it over unless
            // another task already did.
            let empty = inbox.pending.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
            if empty || inbox.draining.swap(true, Ordering::AcqRel) {
                break;
            }
            continue;
        }
        let results: Vec<TaskResult> = batch.iter().map(|d| d.message.clone()).collect();
        // The batch is applied under the span of its first result's task; the others are
        // linked, so each agent task's trace shows where its result went.
        let span = tracing::info_span!("apply_results", goal_id, results = batch.len());
        hermes_core::trace::follow(&span, batch[0].trace.as_ref());
        for other in &batch[1..] {
            hermes_core::trace::link(&span, other.trace.as_ref());
        }
        let handled = match service.apply_results(goal_id, &results).instrument(span).await {
            // Redelivery of an applied result is harmless (it is recognised as stale), so the
            // ack need not wait for the server's confirmation.
            Ok(_) => Handled::DoneUnconfirmed,
            Err(e) => {
                warn!(goal_id, error = %e, results = batch.len(), "cannot apply results; will retry");
                Handled::Retry { after: Duration::from_millis(500) }
            }
        };
        for delivery in &batch {
            delivery.settle(service.bus(), "result", handled.clone()).await;
        }
    }
    inboxes.remove_if(goal_id, |_, i| {
        !i.draining.load(Ordering::Acquire) && i.pending.lock().map(|p| p.is_empty()).unwrap_or(false)
    });
}
