//! The client's views of the goal state, one for every door: what gRPC answers with, and what
//! HTTP and A2A render as JSON. Redaction for the caller has been applied before (the gate's
//! calls); these only choose and shape fields.

use hermes_proto::{Goal, GoalState};

/// The client's view of a goal.
pub(crate) fn to_goal(state: GoalState) -> Goal {
    // `00-<trace id>-<span id>-<flags>`.
    let trace_id = state.traceparent.split('-').nth(1).unwrap_or_default().to_owned();
    Goal {
        trace_id,
        text: state.spec.as_ref().map(|s| s.text.clone()).unwrap_or_default(),
        goal_id: state.goal_id,
        status: state.status,
        output_json: state.output_json,
        error: state.error,
        nodes: state.nodes,
        created_unix_ms: state.created_unix_ms,
        updated_unix_ms: state.updated_unix_ms,
        tokens: state.tokens,
        cost_usd: state.cost_usd,
        max_tokens: state.spec.as_ref().map(|s| s.max_tokens).unwrap_or_default(),
        max_cost_usd: state.spec.as_ref().map(|s| s.max_cost_usd).unwrap_or_default(),
        session_id: state.spec.map(|s| s.session_id).unwrap_or_default(),
        plan: state.plan,
    }
}
