//! Plan results from the planner: a first plan for a goal given as text, a replan of a failed
//! node, "needs input", or a failure. The plan is validated again here against the live catalogue
//! (it may have changed since the planner looked) before it is applied by compare-and-set.

use std::time::Duration;

use hermes_core::error::wire_error;
use hermes_core::plan::validate_plan;
use hermes_core::{ErrorCode, Result, now_unix_ms};
use hermes_proto::PlanResult;
use hermes_proto::plan_result::Outcome;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing::{info, warn};

use crate::GoalService;
use crate::engine::{self, Applied, Effects};

impl GoalService {
    /// Applies one plan result; stale and duplicate results change nothing.
    pub(crate) async fn apply_plan_result(&self, result: &PlanResult) -> Result<()> {
        let validated = match &result.outcome {
            Some(Outcome::Plan(plan)) => {
                let snapshot = self.catalog.snapshot(plan.nodes.iter().map(|n| n.task_type.as_str())).await?;
                Some(validate_plan(plan, &snapshot, self.config.max_nodes).map_err(|e| e.to_proto()))
            }
            _ => None,
        };
        let limits = self.limits();
        let request_id = result.request_id.as_str();
        // Commit and publish in order: this goal's events are stored in `seq` order.
        let _order = self.order(&result.goal_id).await;
        let updated = self
            .store
            .update(&result.goal_id, |state| {
                if !engine::awaits_plan(state, request_id) {
                    return None;
                }
                let mut effects = Effects::default();
                let now = now_unix_ms();
                if let Some(tokens) = &result.tokens
                    && engine::charge(state, None, tokens, limits, now, &mut effects)
                {
                    state.updated_unix_ms = now;
                    return Some(effects);
                }
                let applied = match (&result.outcome, &validated) {
                    (Some(Outcome::NeedsInput(why)), _) => {
                        engine::needs_input(state, request_id, why, now, &mut effects)
                    }
                    (Some(Outcome::Error(error)), _) => {
                        engine::plan_failed(state, request_id, error.clone(), now, &mut effects)
                    }
                    (Some(Outcome::Plan(_)), Some(Err(error))) => {
                        engine::plan_failed(state, request_id, error.clone(), now, &mut effects)
                    }
                    (Some(Outcome::Plan(_)), Some(Ok(valid)))
                        if state.status == hermes_proto::GoalStatus::Planning as i32 =>
                    {
                        engine::apply_plan(
                            state,
                            request_id,
                            valid.plan.clone(),
                            valid.groups.clone(),
                            limits,
                            now,
                            &mut effects,
                        )
                    }
                    (Some(Outcome::Plan(_)), Some(Ok(valid))) => {
                        let reasoning = valid.plan.reasoning.clone();
                        engine::apply_replan(
                            state,
                            request_id,
                            valid.plan.clone(),
                            reasoning,
                            limits,
                            now,
                            &mut effects,
                        )
                        .unwrap_or_else(|e| {
                            engine::plan_failed(state, request_id, e.to_wire(), now, &mut effects)
                        })
                    }
                    _ => {
                        let error = wire_error(ErrorCode::Internal, "the planner sent an empty plan result");
                        engine::plan_failed(state, request_id, error, now, &mut effects)
                    }
                };
                if applied == Applied::Changed {
                    state.updated_unix_ms = now;
                }
                (applied == Applied::Changed).then_some(effects)
            })
            .await;
        match updated {
            Ok(Some(updated)) => {
                info!(goal_id = %result.goal_id, request_id, corrections = result.corrections, event = "plan_created", "plan result applied");
                self.publish_effects(&updated.state, updated.value).await
            }
            Ok(None) | Err(hermes_core::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Consumes plan results until `shutdown` is cancelled.
pub(crate) async fn plan_results_loop(
    service: std::sync::Arc<GoalService>,
    consumer: async_nats::jetstream::consumer::PullConsumer,
    shutdown: CancellationToken,
) {
    let mut messages = match consumer.stream().max_messages_per_batch(64).messages().await {
        Ok(m) => m,
        Err(e) => {
            warn!(error = %e, "cannot pull plan results");
            return;
        }
    };
    let bus = service.bus.clone();
    hermes_core::bus::consume_concurrently(&bus, "plan_result", &mut messages, 64, &shutdown, |delivery: std::sync::Arc<hermes_core::Delivery<PlanResult>>| {
        let service = service.clone();
        let span = tracing::info_span!("apply_plan", goal_id = %delivery.message.goal_id);
        hermes_core::trace::follow(&span, delivery.trace.as_ref());
        async move {
            match service.apply_plan_result(&delivery.message).await {
                Ok(()) => hermes_core::bus::Handled::Done,
                Err(e) => {
                    warn!(goal_id = %delivery.message.goal_id, error = %e, "cannot apply plan result; will retry");
                    hermes_core::bus::Handled::Retry { after: Duration::from_millis(500) }
                }
            }
        }
        .instrument(span)
    })
    .await;
}
