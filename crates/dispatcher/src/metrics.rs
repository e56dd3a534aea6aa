//! The dispatcher's metrics, counted from the events of each committed transition: goals by
//! outcome, node attempts by task type with their duration from dispatch to result, and retries.
//! Counting at publish time means a transition is counted once, by the replica that made it.
//! (The queue depths are the `queue_depth` worker's.)

use std::collections::HashMap;

use hermes_core::metrics::{self, labels};
use hermes_proto::event::Kind;
use hermes_proto::{Event, GoalState};

/// Where a node is in the goal's node table (and its plan's, which runs parallel to it), found
/// through an index when a transition has many events, so a wide batch of results is counted
/// in one pass.
struct Nodes<'a> {
    state: &'a GoalState,
    index: HashMap<&'a str, usize>,
}

impl<'a> Nodes<'a> {
    fn new(state: &'a GoalState, events: usize) -> Self {
        let index = match events {
            0..=8 => HashMap::new(),
            _ => state.nodes.iter().enumerate().map(|(i, n)| (n.node_id.as_str(), i)).collect(),
        };
        Nodes { state, index }
    }

    fn position(&self, node_id: &str) -> Option<usize> {
        match self.index.is_empty() {
            true => self.state.nodes.iter().position(|n| n.node_id == node_id),
            false => self.index.get(node_id).copied(),
        }
    }

    fn task_type(&self, node_id: &str) -> &'a str {
        let plan = self.state.plan.as_ref();
        self.position(node_id)
            .and_then(|i| plan.and_then(|p| p.nodes.get(i)))
            .filter(|n| n.id == node_id)
            .or_else(|| plan.and_then(|p| p.nodes.iter().find(|n| n.id == node_id)))
            .map(|n| n.task_type.as_str())
            .unwrap_or("")
    }

    /// Seconds from the attempt's dispatch to its result, when the node still shows that
    /// attempt; else the agent's own run time.
    fn seconds(&self, node_id: &str, attempt: u32, at_ms: u64, elapsed_ms: u64) -> f64 {
        match self.position(node_id).map(|i| &self.state.nodes[i]) {
            Some(n) if n.attempt == attempt && n.dispatched_unix_ms > 0 && at_ms >= n.dispatched_unix_ms => {
                metrics::seconds(at_ms - n.dispatched_unix_ms)
            }
            _ => metrics::seconds(elapsed_ms),
        }
    }
}

/// Counts what `events` (just committed for `state`) say happened.
pub(crate) fn record(state: &GoalState, events: &[Event]) {
    let m = metrics::global();
    let nodes = Nodes::new(state, events.len());
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
                let seconds = nodes.seconds(&s.node_id, s.attempt, event.at_unix_ms, s.elapsed_ms);
                let series = labels(&[("task_type", nodes.task_type(&s.node_id)), ("status", "succeeded")]);
                m.node_duration.get_or_create(&series).observe(seconds);
            }
            Some(Kind::TaskFailed(f)) => {
                let seconds = nodes.seconds(&f.node_id, f.attempt, event.at_unix_ms, f.elapsed_ms);
                let series = labels(&[("task_type", nodes.task_type(&f.node_id)), ("status", "failed")]);
                m.node_duration.get_or_create(&series).observe(seconds);
            }
            Some(Kind::TaskRetrying(r)) => {
                m.retries.get_or_create(&labels(&[("task_type", nodes.task_type(&r.node_id))])).inc();
            }
            _ => {}
        }
    }
}

/// Counts a webhook attempt by outcome.
pub(crate) fn webhook_attempt(outcome: &str) {
    metrics::global().webhook_attempts.get_or_create(&labels(&[("outcome", outcome)])).inc();
}
