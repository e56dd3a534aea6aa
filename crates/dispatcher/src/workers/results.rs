//! The results worker: consumes every agent's results from the one shared results consumer and
//! applies them to their goals. Results wait in a per-goal inbox; one task at a time drains a
//! goal's inbox and applies everything in it with one compare-and-set, so a wide fan-out costs
//! one KV write per batch rather than a storm of conflicting writes. Across replicas, the CAS
//! alone keeps updates correct.
//!
//! The consumer's AckWait is short ([`RESULT_ACK_WAIT`]), so the results a killed replica had
//! pulled reach another (or the restarted one) within seconds. A result this replica holds longer,
//! waiting behind its goal's other results or a slow write, is kept by a progress ack every
//! [`PROGRESS_EVERY`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::PullConsumer;
use dashmap::DashMap;
use hermes_core::Delivery;
use hermes_core::bus::Handled;
use hermes_proto::TaskResult;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, warn};

use crate::goals::GoalService;

/// Results of one goal waiting to be applied.
#[derive(Default)]
struct Inbox {
    pending: std::sync::Mutex<Vec<Arc<Delivery<TaskResult>>>>,
    draining: AtomicBool,
}

/// The worker's state: the inboxes of goals with results waiting.
type Inboxes = DashMap<String, Arc<Inbox>>;

/// How long the server waits for this replica to settle a result before it delivers it again.
pub(crate) const RESULT_ACK_WAIT: Duration = Duration::from_secs(3);
/// How often a result held here is kept from redelivery by a progress ack.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// The results pulled and not yet settled, by address, with when the server last heard of each.
type Held = DashMap<usize, (Arc<Delivery<TaskResult>>, Instant)>;

fn key(delivery: &Arc<Delivery<TaskResult>>) -> usize {
    Arc::as_ptr(delivery) as usize
}

/// Sends a progress ack for every result held longer than [`PROGRESS_EVERY`], until `shutdown`.
async fn keep_held(held: Arc<Held>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PROGRESS_EVERY / 2);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let due: Vec<_> = held
            .iter_mut()
            .filter(|e| now.duration_since(e.1) >= PROGRESS_EVERY)
            .map(|mut e| {
                e.1 = now;
                e.0.clone()
            })
            .collect();
        for delivery in due {
            if let Err(e) = delivery.progress().await {
                warn!(error = %e, "cannot keep a held result from redelivery");
            }
        }
    }
}

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
    let held = Arc::new(Held::new());
    let keeper = tokio::spawn(keep_held(held.clone(), shutdown.clone()));
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
            let held = held.clone();
            async move {
                let goal_id = delivery.message.goal_id.clone();
                held.insert(key(&delivery), (delivery.clone(), Instant::now()));
                let inbox = inboxes.entry(goal_id.clone()).or_default().clone();
                inbox.pending.lock().unwrap_or_else(|p| p.into_inner()).push(delivery);
                if !inbox.draining.swap(true, Ordering::AcqRel) {
                    drain(&service, &inboxes, &held, &goal_id, &inbox).await;
                }
                // The inbox's drainer settles it, with the batch it was applied in.
                Handled::Kept
            }
        },
    )
    .await;
    keeper.abort();
}

/// Applies everything in a goal's inbox, batch by batch, until it stays empty. Only the task that
/// set `draining` runs this.
async fn drain(service: &GoalService, inboxes: &Inboxes, held: &Held, goal_id: &str, inbox: &Inbox) {
    loop {
        // What arrives while the goal's last transition is still being published joins this
        // batch (a wide fan-out's first results arrive while its submit publishes the rest).
        service.transitions_published(goal_id).await;
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
        let applied = service.apply_results(goal_id, &results).instrument(span).await;
        match &applied {
            // The slots routing reserved are free again (a result delivered twice frees one
            // too many until the agent's next heartbeat sets its load).
            Ok(_) => {
                for result in &results {
                    if result.routed {
                        service.agents().task_finished(&result.agent_id);
                    }
                    // Routing learns each agent's latency and health from its results
                    // (docs/routing.md, "Latency and health").
                    hermes_registry::observe_result(service.agents(), result);
                }
            }
            Err(e) => warn!(goal_id, error = %e, results = batch.len(), "cannot apply results; will retry"),
        }
        for delivery in &batch {
            let handled = match &applied {
                // Redelivery of an applied result is harmless (it is recognised as stale), so
                // the ack need not wait for the server's confirmation.
                Ok(_) => Handled::DoneUnconfirmed,
                Err(_) => Handled::Retry { after: super::retry_after(delivery.delivered()) },
            };
            delivery.settle(service.bus(), "result", handled).await;
            held.remove(&key(delivery));
        }
    }
    inboxes.remove_if(goal_id, |_, i| {
        !i.draining.load(Ordering::Acquire) && i.pending.lock().map(|p| p.is_empty()).unwrap_or(false)
    });
}
