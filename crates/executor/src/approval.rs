//! The approval gate: a call to a tool that needs confirmation is parked until a human decides
//! through `Dispatcher.ApproveToolCall` (`hermes approve` / `hermes deny`). The pending approval
//! is stored in the `hermes_approvals` KV bucket under an id that is the same for every attempt of
//! the node, so a restarted or replacement agent finds it and keeps waiting for the same decision.
//! Nobody deciding before the deadline counts as a denial. The task stays alive meanwhile: the
//! agent keeps sending progress acks. The agent only reads the bucket: a dispatcher stores the
//! request and records the timeout for it ([`report`]), so an agent cannot approve its own calls.

use std::time::Duration;

use hermes_core::{ErrorCode, now_unix_ms};
use hermes_proto::agent_report::Kind;
use hermes_proto::{AgentReport, AgentReportReply, Approval, ApprovalDecision};
use prost::Message as _;
use serde_json::Value;
use tracing::info;

use crate::scope::{TaskScope, ToolError};

/// How often a waiting call looks for the decision.
const POLL: Duration = Duration::from_millis(100);
/// How long an agent waits for a dispatcher to answer a report.
const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

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
            // A dispatcher records the timeout; the first decision wins, so a person deciding
            // at the last moment beats it.
            let reported = report(scope, Kind::ApprovalTimedOut(call_id.to_owned())).await?;
            let decision =
                reported.and_then(|a| a.decision).ok_or_else(|| unavailable("no decision came back"))?;
            return decided(tool, &decision);
        }
        tokio::time::sleep(POLL).await;
        if let Some((latest, _)) = store.load(call_id).await.map_err(unavailable)? {
            approval = latest;
        }
    }
}

/// Asks a dispatcher to store a pending approval and announce it with `ApprovalRequired` (only
/// the first request for a call announces it); returns the approval as stored.
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
    let stored = report(scope, Kind::RequestApproval(approval)).await?;
    let stored = stored.ok_or_else(|| unavailable("no approval came back"))?;
    info!(goal_id = %scope.goal_id, node_id = %scope.node_id, call_id, tool, event = "approval_required", "waiting for approval");
    Ok(stored)
}

/// Sends an `AgentReport` about the scope's attempt to a dispatcher and waits for its answer:
/// agents publish no goal events and write no approvals themselves (`docs/security.md`).
pub(crate) async fn report(scope: &TaskScope, kind: Kind) -> Result<Option<Approval>, ToolError> {
    let request = AgentReport {
        goal_id: scope.goal_id.clone(),
        node_id: scope.node_id.clone(),
        task_id: scope.task_id.clone(),
        result_token: scope.result_token.clone(),
        agent_id: scope.agent_id.clone(),
        kind: Some(kind),
    };
    let subject = scope.bus.topology().agent_report();
    let answer = tokio::time::timeout(
        REPORT_TIMEOUT,
        scope.bus.client().request(subject, request.encode_to_vec().into()),
    )
    .await
    .map_err(|_| unavailable("no dispatcher answered the report in time"))?
    .map_err(|e| unavailable(format!("no dispatcher answered the report: {e}")))?;
    let reply = AgentReportReply::decode(answer.payload)
        .map_err(|e| unavailable(format!("unreadable answer: {e}")))?;
    match reply.error {
        Some(error) => Err(ToolError {
            code: ErrorCode::parse(&error.code).unwrap_or(ErrorCode::Unavailable),
            message: format!("the dispatcher refused the report: {}", error.message),
        }),
        None => Ok(reply.approval),
    }
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

/// Reports a task's model calls waiting for the fleet's model limits as `ModelWaiting` events
/// (docs/llm.md). Best effort, in the background: the call does not wait for the report.
pub(crate) struct WaitReporter(pub TaskScope);

impl WaitReporter {
    fn send(&self, model: &str, reason: &str, waiting: bool, waited_ms: u64) {
        let scope = self.0.clone();
        let event = hermes_proto::Event {
            goal_id: scope.goal_id.clone(),
            at_unix_ms: now_unix_ms(),
            kind: Some(hermes_proto::event::Kind::ModelWaiting(hermes_proto::ModelWaiting {
                node_id: scope.node_id.clone(),
                attempt: scope.attempt,
                model: model.to_owned(),
                reason: reason.to_owned(),
                waiting,
                waited_ms,
            })),
            ..Default::default()
        };
        tokio::spawn(async move {
            if let Err(e) = report(&scope, Kind::Event(event)).await {
                tracing::warn!(error = %e.message, "cannot report a model call's wait");
            }
        });
    }
}

impl hermes_llm::governor::WaitObserver for WaitReporter {
    fn waiting(&self, model: &str, reason: hermes_llm::governor::WaitReason) {
        info!(goal_id = %self.0.goal_id, node_id = %self.0.node_id, model, reason = reason.as_str(), event = "model_waiting", "waiting for a model slot");
        self.send(model, reason.as_str(), true, 0);
    }

    fn resumed(&self, model: &str, waited: Duration) {
        self.send(model, "", false, waited.as_millis() as u64);
    }
}
