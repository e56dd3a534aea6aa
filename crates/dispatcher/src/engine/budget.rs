//! Token and cost budgets: every LLM step's tokens are charged to the goal, which ends with
//! `BUDGET_EXCEEDED` once it is over its budget.

use super::*;

/// Adds an LLM step's tokens to the goal (and to node `index`, when given) and ends the goal
/// with `BUDGET_EXCEEDED` when that takes it over its token or cost budget. Returns whether the
/// goal ended.
pub fn charge(
    state: &mut GoalState,
    index: Option<usize>,
    tokens: &TokenUsage,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> bool {
    if tokens.input_tokens == 0 && tokens.output_tokens == 0 {
        return false;
    }
    let total = state.tokens.get_or_insert_with(Default::default);
    total.input_tokens += tokens.input_tokens;
    total.output_tokens += tokens.output_tokens;
    let used = total.input_tokens + total.output_tokens;
    state.cost_usd += (tokens.input_tokens as f64 * limits.prices.input_per_mtok
        + tokens.output_tokens as f64 * limits.prices.output_per_mtok)
        / 1_000_000.0;
    if let Some(node) = index.and_then(|i| state.nodes.get_mut(i)) {
        let node_tokens = node.tokens.get_or_insert_with(Default::default);
        node_tokens.input_tokens += tokens.input_tokens;
        node_tokens.output_tokens += tokens.output_tokens;
    }
    if is_terminal(state.status) {
        return false;
    }
    let spec = state.spec.clone().unwrap_or_default();
    let over = if spec.max_tokens > 0 && used > spec.max_tokens {
        format!("the goal used {used} tokens, over its budget of {}", spec.max_tokens)
    } else if spec.max_cost_usd > 0.0 && state.cost_usd > spec.max_cost_usd {
        format!(
            "the goal cost an estimated ${:.4}, over its budget of ${:.4}",
            state.cost_usd, spec.max_cost_usd
        )
    } else {
        return false;
    };
    let error = wire_error(ErrorCode::BudgetExceeded, over);
    let event = Kind::GoalFailed(GoalFailed { error: Some(error.clone()) });
    end_goal(state, GoalStatus::Failed, error, event, now_ms, effects);
    true
}
