//! How a goal looks in A2A 1.0 (docs/a2a.md): its task, its state, and the stream responses of
//! its events. Pure functions of the goal and its events, shared by the A2A door (`http/a2a.rs`)
//! and the webhooks sent to A2A push-notification endpoints (`webhooks.rs`).

use hermes_proto::event::Kind;
use hermes_proto::{Approval, Event, GoalState, GoalStatus};
use serde_json::{Value, json};

pub(crate) fn is_final(state: &GoalState) -> bool {
    matches!(
        GoalStatus::try_from(state.status),
        Ok(GoalStatus::Completed | GoalStatus::Failed | GoalStatus::Cancelled | GoalStatus::NeedsInput)
    )
}

/// The A2A task state of a goal; `waiting` says a call of it waits for a person.
pub(crate) fn a2a_state(state: &GoalState, waiting: bool) -> &'static str {
    match GoalStatus::try_from(state.status).unwrap_or(GoalStatus::Unspecified) {
        GoalStatus::Completed => "TASK_STATE_COMPLETED",
        GoalStatus::Failed => "TASK_STATE_FAILED",
        GoalStatus::Cancelled => "TASK_STATE_CANCELED",
        GoalStatus::NeedsInput => "TASK_STATE_REJECTED",
        _ if waiting => "TASK_STATE_INPUT_REQUIRED",
        GoalStatus::Pending | GoalStatus::Unspecified => "TASK_STATE_SUBMITTED",
        GoalStatus::Running | GoalStatus::Planning | GoalStatus::Replanning | GoalStatus::Summarizing => {
            "TASK_STATE_WORKING"
        }
    }
}

pub(crate) fn context_id(state: &GoalState) -> &str {
    match state.spec.as_ref().map(|s| s.session_id.as_str()) {
        Some(session) if !session.is_empty() => session,
        _ => &state.goal_id,
    }
}

fn timestamp(unix_ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(unix_ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// An agent message of the task, saying `text` (and `data`, when given).
fn agent_message(state: &GoalState, id: String, text: String, data: Option<Value>) -> Value {
    let mut parts = vec![json!({"text": text})];
    if let Some(data) = data {
        parts.push(json!({"data": data, "mediaType": "application/json"}));
    }
    json!({"messageId": id, "contextId": context_id(state), "taskId": state.goal_id, "role": "ROLE_AGENT", "parts": parts})
}

/// What the task's status says in words: the error, the planner's reason, the call waiting.
fn status_message(state: &GoalState, pending: &[Approval]) -> Option<Value> {
    let id = format!("{}-status-{}", state.goal_id, state.event_seq);
    if let Some(approval) = pending.first() {
        return Some(approval_message(
            state,
            id,
            approval.call_id.clone(),
            &approval.tool,
            &approval.node_id,
            &approval.arguments_json,
            approval.expires_unix_ms,
        ));
    }
    let error = state.error.as_ref().filter(|e| !e.message.is_empty())?;
    Some(agent_message(state, id, format!("{}: {}", error.code, error.message), None))
}

fn approval_message(
    state: &GoalState,
    id: String,
    call_id: String,
    tool: &str,
    node: &str,
    arguments: &str,
    expires: u64,
) -> Value {
    let arguments: Value = serde_json::from_str(arguments).unwrap_or(Value::String(arguments.to_owned()));
    let text = format!(
        "Approval needed: node `{node}` wants to call `{tool}` with {arguments}. Reply on this task with `approve` or `deny <reason>` before {}.",
        timestamp(expires)
    );
    let data = json!({"callId": call_id, "nodeId": node, "tool": tool, "arguments": arguments, "expiresAt": timestamp(expires)});
    agent_message(state, id, text, Some(data))
}

/// The goal's output as an A2A artifact: text when it is a string, else JSON; an output kept
/// as a Hermes artifact is a URL part to fetch it.
fn output_artifact(state: &GoalState, base: &str, output_json: &str) -> Option<Value> {
    if output_json.is_empty() {
        return None;
    }
    let value: Value =
        serde_json::from_str(output_json).unwrap_or_else(|_| Value::String(output_json.to_owned()));
    let part = if let Some(reference) = hermes_core::artifacts::stub_reference(&value) {
        let media = value.get("content_type").and_then(Value::as_str).unwrap_or("application/octet-stream");
        json!({"url": format!("{base}/v1/goals/{}/artifacts/{reference}", state.goal_id), "mediaType": media, "filename": reference})
    } else if let Value::String(text) = &value {
        json!({"text": text})
    } else {
        json!({"data": value, "mediaType": "application/json"})
    };
    Some(
        json!({"artifactId": "output", "name": "output", "description": "The goal's output", "parts": [part]}),
    )
}

pub(crate) fn task_value(state: &GoalState, pending: &[Approval], base: &str) -> Value {
    let mut status = json!({"state": a2a_state(state, !pending.is_empty()), "timestamp": timestamp(state.updated_unix_ms)});
    if let Some(message) = status_message(state, pending) {
        status["message"] = message;
    }
    let artifacts: Vec<Value> = output_artifact(state, base, &state.output_json).into_iter().collect();
    json!({
        "id": state.goal_id,
        "contextId": context_id(state),
        "status": status,
        "artifacts": artifacts,
        "metadata": {"hermes": {
            "status": GoalStatus::try_from(state.status).map(|s| s.as_str_name()).unwrap_or("GOAL_STATUS_UNSPECIFIED"),
            "eventSeq": state.event_seq.to_string(),
            "goal": format!("{base}/v1/goals/{}", state.goal_id),
        }},
    })
}

/// The A2A stream responses of one goal event, and whether the stream ends with them; `decided`
/// says an approval request was answered since.
pub(crate) fn stream_responses(
    state: &GoalState,
    event: &Event,
    base: &str,
    decided: bool,
) -> (Vec<Value>, bool) {
    let hermes = serde_json::to_value(event).unwrap_or(Value::Null);
    let id = format!(
        "{}-event-{}",
        state.goal_id,
        if event.seq > 0 { event.seq.to_string() } else { format!("at-{}", event.at_unix_ms) }
    );
    let update = |task_state: &str, text: String, data: Option<Value>| {
        json!({"statusUpdate": {
            "taskId": state.goal_id,
            "contextId": context_id(state),
            "status": {"state": task_state, "message": agent_message(state, id.clone(), text, data), "timestamp": timestamp(event.at_unix_ms)},
            "metadata": {"hermesEvent": hermes},
        }})
    };
    let working = |text: String| (vec![update("TASK_STATE_WORKING", text, None)], false);
    let Some(kind) = &event.kind else { return (Vec::new(), false) };
    match kind {
        Kind::GoalAccepted(_) => working("accepted".into()),
        Kind::PlanRequested(_) => working("planning".into()),
        Kind::PlanCreated(p) => {
            working(format!("planned {} step(s)", p.plan.as_ref().map_or(0, |p| p.nodes.len())))
        }
        Kind::PlanPatched(p) => working(format!("replanned after `{}` failed", p.failed_node_id)),
        Kind::TaskDispatched(t) => working(format!(
            "`{}` ({}) dispatched{}",
            t.node_id,
            t.task_type,
            if t.agent_id.is_empty() { String::new() } else { format!(" to {}", t.agent_id) }
        )),
        Kind::TaskSucceeded(t) => working(format!("`{}` succeeded in {} ms", t.node_id, t.elapsed_ms)),
        Kind::TaskFailed(t) => working(format!(
            "`{}` failed: {}",
            t.node_id,
            t.error.as_ref().map_or("", |e| e.message.as_str())
        )),
        Kind::TaskRetrying(t) => working(format!("`{}` retrying", t.node_id)),
        Kind::ToolCalled(t) => working(format!("`{}` called {}", t.node_id, t.tool)),
        Kind::ModelWaiting(w) if w.waiting => {
            working(format!("`{}` is waiting for a model slot of {} ({})", w.node_id, w.model, w.reason))
        }
        Kind::ModelWaiting(w) => {
            working(format!("`{}` got a model slot after {} ms", w.node_id, w.waited_ms))
        }
        Kind::ApprovalDecided(d) => {
            working(format!("call `{}` {}", d.call_id, if d.approved { "approved" } else { "denied" }))
        }
        Kind::ApprovalRequired(a) if decided => {
            working(format!("call `{}` ({}) asked for approval and has been decided", a.call_id, a.tool))
        }
        Kind::ApprovalRequired(a) => {
            let message = approval_message(
                state,
                id.clone(),
                a.call_id.clone(),
                &a.tool,
                &a.node_id,
                &a.arguments_json,
                a.expires_unix_ms,
            );
            let update = json!({"statusUpdate": {
                "taskId": state.goal_id,
                "contextId": context_id(state),
                "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": message, "timestamp": timestamp(event.at_unix_ms)},
                "metadata": {"hermesEvent": hermes},
            }});
            (vec![update], true)
        }
        Kind::GoalCompleted(c) => {
            let mut out = Vec::new();
            if let Some(artifact) = output_artifact(state, base, &c.output_json) {
                out.push(json!({"artifactUpdate": {"taskId": state.goal_id, "contextId": context_id(state), "artifact": artifact, "append": false, "lastChunk": true}}));
            }
            out.push(update("TASK_STATE_COMPLETED", "completed".into(), None));
            (out, true)
        }
        Kind::GoalFailed(f) => {
            let error = f.error.clone().unwrap_or_default();
            (vec![update("TASK_STATE_FAILED", format!("{}: {}", error.code, error.message), None)], true)
        }
        Kind::GoalCancelled(c) => {
            (vec![update("TASK_STATE_CANCELED", format!("cancelled: {}", c.reason), None)], true)
        }
        Kind::GoalNeedsInput(n) => (vec![update("TASK_STATE_REJECTED", n.explanation.clone(), None)], true),
    }
}
