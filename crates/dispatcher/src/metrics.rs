//! The dispatcher's metrics, counted from the events of each committed transition: goals by
//! outcome, node attempts by task type with their duration from dispatch to result, and retries.
//! Counting at publish time means a transition is counted once, by the replica that made it.
//! (The queue depths are the `queue_depth` worker's.)

use hermes_core::metrics::{self, labels};
use hermes_proto::event::Kind;
use hermes_proto::{Event, GoalState};

fn task_type<'a>(state: &'a GoalState, node_id: &str) -> &'a str {
    state
        .plan
        .as_ref()
        .and_then(|p| p.nodes.iter().find(|n| n.id == node_id))
        .map(|n| n.task_type.as_str())
        .unwrap_or("")
}

/// Seconds from the attempt's dispatch to its result, when the node still shows that attempt;
/// else the agent's own run time.
fn node_seconds(state: &GoalState, node_id: &str, attempt: u32, at_ms: u64, elapsed_ms: u64) -> f64 {
    let node = state.nodes.iter().find(|n| n.node_id == node_id);
    match node {
        Some(n) if n.attempt == attempt && n.dispatched_unix_ms > 0 && at_ms >= n.dispatched_unix_ms => {
            metrics::seconds(at_ms - n.dispatched_unix_ms)
        }
        _ => metrics::seconds(elapsed_ms),
    }
}

/// Counts what `events` (just committed for `state`) say happened.
pub(crate) fn record(state: &GoalState, events: &[Event]) {
    let m = metrics::global();
    for event in events {
        let goal = |status: &str| m.goals.get_or_create(&labels(&[("status", status)])).inc();
        match &event.kind {
            Some(Kind::GoalAccepted(_)) => {
                goal("accepted");
            }
            Some(Kind::GoalCompleted(_)) => {
                goal("completed");
            }
            Some(Kind::GoalFailed(_)) => {
                goal("failed");
            }
            Some(Kind::GoalCancelled(_)) => {
                goal("cancelled");
            }
            Some(Kind::GoalNeedsInput(_)) => {
                goal("needs_input");
            }
            Some(Kind::TaskSucceeded(s)) => {
                let seconds = node_seconds(state, &s.node_id, s.attempt, event.at_unix_ms, s.elapsed_ms);
                let series = labels(&[("task_type", task_type(state, &s.node_id)), ("status", "succeeded")]);
                m.node_duration.get_or_create(&series).observe(seconds);
            }
            Some(Kind::TaskFailed(f)) => {
                let seconds = node_seconds(state, &f.node_id, f.attempt, event.at_unix_ms, f.elapsed_ms);
                let series = labels(&[("task_type", task_type(state, &f.node_id)), ("status", "failed")]);
                m.node_duration.get_or_create(&series).observe(seconds);
            }
            Some(Kind::TaskRetrying(r)) => {
                m.retries.get_or_create(&labels(&[("task_type", task_type(state, &r.node_id))])).inc();
            }
            _ => {}
        }
    }
}
