//! The approval gate: a call to a tool that needs confirmation is parked until a human decides
//! through `Dispatcher.ApproveToolCall` (`hermes approve` / `hermes deny`). The pending approval
//! is stored in the `hermes_approvals` KV bucket under an id that is the same for every attempt of
//! the node, so a restarted or replacement agent finds it and keeps waiting for the same decision.
//! Nobody deciding before the deadline counts as a denial. The task stays alive meanwhile: the
//! agent keeps sending progress acks.

use std::time::Duration;

use hermes_core::{ErrorCode, now_unix_ms};
use hermes_proto::event::Kind;
use hermes_proto::{Approval, ApprovalDecided, ApprovalDecision, ApprovalRequired, Event};
use serde_json::Value;
use tracing::info;

use crate::tool::{TaskScope, ToolError};

/// How often a waiting call looks for the decision.
const POLL: Duration = Duration::from_millis(100);

fn unavailable(e: impl std::fmt::Display) -> ToolError {
    ToolError { code: ErrorCode::Unavailable, message: format!("approvals: {e}") }
}

/// Waits for the decision on `call_id`; `Ok` when approved, `DENIED` otherwise.
pub(crate) async fn gate(
    scope: &TaskScope,
    call_id: &str,
    tool: &str,
    args: &Value,
) -> Result<(), ToolError> {
    let store = scope.bus.approvals();
    let mut approval = match store.load(call_id).await.map_err(unavailable)? {
        Some((found, _)) => found,
        None => ask(scope, call_id, tool, args).await?,
    };
    loop {
        if let Some(decision) = &approval.decision {
            return decided(tool, decision);
        }
        if now_unix_ms() >= approval.expires_unix_ms {
            let timeout = ApprovalDecision {
                approved: false,
                note: "no decision in time".into(),
                decided_unix_ms: now_unix_ms(),
                timed_out: true,
            };
            // The first decision wins: a person deciding at the last moment beats the timeout.
            match store.decide(&scope.goal_id, call_id, timeout).await.map_err(unavailable)? {
                Some(decided_now) => {
                    if decided_now.recorded {
                        publish_decided(scope, call_id, &decided_now.decision).await;
                    }
                    return decided(tool, &decided_now.decision);
                }
                None => return Err(unavailable("the approval vanished")),
            }
        }
        tokio::time::sleep(POLL).await;
        if let Some((latest, _)) = store.load(call_id).await.map_err(unavailable)? {
            approval = latest;
        }
    }
}

/// Stores a pending approval and announces it with `ApprovalRequired` (only the delivery that
/// created it announces it).
async fn ask(scope: &TaskScope, call_id: &str, tool: &str, args: &Value) -> Result<Approval, ToolError> {
    let approval = Approval {
        call_id: call_id.to_owned(),
        goal_id: scope.goal_id.clone(),
        node_id: scope.node_id.clone(),
        tool: tool.to_owned(),
        // Secrets never reach the bucket or the event stream; the call itself keeps them.
        arguments_json: hermes_core::redact::redact(args).to_string(),
        reason: format!("`{tool}` needs confirmation on this agent"),
        expires_unix_ms: now_unix_ms() + scope.approval_timeout.as_millis() as u64,
        decision: None,
    };
    let (approval, _, created) = scope.bus.approvals().create(&approval).await.map_err(unavailable)?;
    if !created {
        return Ok(approval);
    }
    let event = Event {
        seq: 0,
        session_id: String::new(),
        goal_id: scope.goal_id.clone(),
        at_unix_ms: now_unix_ms(),
        kind: Some(Kind::ApprovalRequired(ApprovalRequired {
            call_id: call_id.to_owned(),
            node_id: scope.node_id.clone(),
            tool: tool.to_owned(),
            arguments_json: approval.arguments_json.clone(),
            reason: approval.reason.clone(),
            expires_unix_ms: approval.expires_unix_ms,
        })),
    };
    let msg_id = format!("{}:approval:{call_id}", scope.goal_id);
    scope.bus.publish_event(&event, &msg_id).await.map_err(unavailable)?;
    info!(goal_id = %scope.goal_id, node_id = %scope.node_id, call_id, tool, event = "approval_required", "waiting for approval");
    Ok(approval)
}

async fn publish_decided(scope: &TaskScope, call_id: &str, decision: &ApprovalDecision) {
    let event = Event {
        seq: 0,
        session_id: String::new(),
        goal_id: scope.goal_id.clone(),
        at_unix_ms: now_unix_ms(),
        kind: Some(Kind::ApprovalDecided(ApprovalDecided {
            call_id: call_id.to_owned(),
            approved: decision.approved,
            note: decision.note.clone(),
            timed_out: decision.timed_out,
        })),
    };
    let _ = scope.bus.publish_event(&event, &format!("{}:decided:{call_id}", scope.goal_id)).await;
}

fn decided(tool: &str, decision: &ApprovalDecision) -> Result<(), ToolError> {
    match (decision.approved, decision.timed_out) {
        (true, _) => Ok(()),
        (false, true) => {
            Err(ToolError { code: ErrorCode::Denied, message: format!("`{tool}` was not approved in time") })
        }
        (false, false) => Err(ToolError {
            code: ErrorCode::Denied,
            message: format!(
                "`{tool}` was denied: {}",
                if decision.note.is_empty() { "no reason given" } else { &decision.note }
            ),
        }),
    }
}
