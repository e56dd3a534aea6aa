//! The summarizing step: a goal given as text completes with the summarizer's answer.

use super::*;

/// Completes a summarizing goal with the summarizer's answer.
pub fn finish_summary(
    state: &mut GoalState,
    output_json: String,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    if state.status != GoalStatus::Summarizing as i32 {
        return Applied::Stale;
    }
    state.status = GoalStatus::Completed as i32;
    state.output_json = output_json.clone();
    state.updated_unix_ms = now_ms;
    effects.event(&state.goal_id.clone(), now_ms, Kind::GoalCompleted(GoalCompleted { output_json }));
    Applied::Changed
}
