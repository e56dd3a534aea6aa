//! The plans worker: consumes plan results from the planner (a first plan for a goal given as
//! text, a replan of a failed node, "needs input", or a failure) and applies them through
//! [`GoalService::apply_plan_result`].

use std::sync::Arc;

use async_nats::jetstream::consumer::PullConsumer;
use hermes_core::Delivery;
use hermes_core::bus::Handled;
use hermes_proto::PlanResult;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, warn};

use crate::goals::GoalService;

/// At most this many plan results are applied at once.
const CONCURRENCY: usize = 64;

/// Consumes plan results until `shutdown` is cancelled.
pub(crate) async fn run(service: Arc<GoalService>, consumer: PullConsumer, shutdown: CancellationToken) {
    let mut messages = match hermes_core::bus::pull(&consumer, CONCURRENCY).await {
        Ok(m) => m,
        Err(e) => {
            warn!(error = %e, "cannot pull plan results");
            return;
        }
    };
    let bus = service.bus().clone();
    hermes_core::bus::consume_concurrently(
        &bus,
        "plan_result",
        &mut messages,
        CONCURRENCY,
        &shutdown,
        |delivery: Arc<Delivery<PlanResult>>| {
            let service = service.clone();
            let span = tracing::info_span!("apply_plan", goal_id = %delivery.message.goal_id);
            hermes_core::trace::follow(&span, delivery.trace.as_ref());
            async move {
                match service.apply_plan_result(&delivery.message).await {
                    Ok(()) => Handled::Done,
                    Err(e) => {
                        warn!(goal_id = %delivery.message.goal_id, error = %e, "cannot apply plan result; will retry");
                        Handled::Retry { after: super::retry_after(delivery.delivered()) }
                    }
                }
            }
            .instrument(span)
        },
    )
    .await;
}
