//! What a tool call runs within, apart from the tools themselves: its typed failure
//! ([`ToolError`]), what it may touch ([`ToolContext`]) and the task it belongs to
//! ([`TaskScope`], with the task's token meter and each call's stable name). `tool.rs` (the
//! registry, which asks for approval before a confirmed call) and `approval.rs` (which reports on
//! the task) both build on these, so neither imports the other's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hermes_core::ErrorCode;
use serde_json::Value;

/// A typed tool failure.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
}

impl ToolError {
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self { code: ErrorCode::InvalidArgument, message: message.into() }
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self { code: ErrorCode::ToolError, message: message.into() }
    }

    pub fn to_proto(&self) -> hermes_proto::Error {
        hermes_core::error::wire_error(self.code, self.message.clone())
    }
}

/// What a tool may touch.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The agent's workspace dir; file tools are confined to it.
    pub workspace: PathBuf,
    /// The task the call belongs to; `None` outside a task (then side effects are not recorded
    /// and calls needing confirmation are denied).
    pub task: Option<TaskScope>,
}

/// The task a tool call belongs to: it names the call in the side-effect ledger and in the
/// approvals bucket. Before a tool with side effects runs, its ledger key (goal, node, call
/// index, arguments hash) is created in `hermes_ledger` with `create`; after it ran, the outcome
/// is stored under the key with the attempt that produced it. A redelivered task, or a new
/// attempt of the node (after its agent died), finds a recorded success and returns it instead of
/// running the tool again. A recorded failure is returned to the same attempt, and a later
/// attempt may try again. A call whose outcome was never recorded (the agent died while the tool
/// ran) is not repeated at all: it fails with a message saying the outcome is unknown.
#[derive(Clone)]
pub struct TaskScope {
    pub bus: hermes_core::Bus,
    pub goal_id: String,
    pub node_id: String,
    pub attempt: u32,
    pub task_id: String,
    /// The attempt's secret from its task message: the dispatchers hear this agent's reports on
    /// the task (events, approvals) only with it.
    pub result_token: String,
    /// The goal's tenant, whose memory the memory tools use (empty with auth off).
    pub tenant: String,
    /// The dispatcher's proof of the task's tenant, which the memory tools send with their
    /// requests (`hermes_core::task_token`).
    pub memory_token: String,
    pub agent_id: String,
    /// Calls made so far in this task, for the call index.
    pub calls: Arc<std::sync::atomic::AtomicU32>,
    /// How long a call needing confirmation waits for a human before it counts as denied.
    pub approval_timeout: Duration,
    /// Cancelled when the goal is cancelled; long-running tools and the agent loop stop at their
    /// next step.
    pub cancel: tokio_util::sync::CancellationToken,
    /// LLM tokens the task's tools used, reported in its result for the goal's accounting.
    pub tokens: Arc<TokenMeter>,
}

/// LLM tokens used by one task, added to by every tool that calls a model.
#[derive(Debug, Default)]
pub struct TokenMeter {
    input: std::sync::atomic::AtomicU64,
    output: std::sync::atomic::AtomicU64,
}

impl TokenMeter {
    pub fn add(&self, usage: hermes_llm::Usage) {
        use std::sync::atomic::Ordering::Relaxed;
        self.input.fetch_add(usage.input_tokens, Relaxed);
        self.output.fetch_add(usage.output_tokens, Relaxed);
    }

    /// What was used, `None` when nothing was.
    pub fn usage(&self) -> Option<hermes_proto::TokenUsage> {
        use std::sync::atomic::Ordering::Relaxed;
        let (input_tokens, output_tokens) = (self.input.load(Relaxed), self.output.load(Relaxed));
        (input_tokens + output_tokens > 0).then_some(hermes_proto::TokenUsage { input_tokens, output_tokens })
    }
}

impl ToolContext {
    /// Counts a model call's tokens toward the task, when there is one.
    pub fn charge(&self, usage: hermes_llm::Usage) {
        if let Some(scope) = &self.task {
            scope.tokens.add(usage);
        }
    }
}

impl std::fmt::Debug for TaskScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TaskScope({}.{}.{})", self.goal_id, self.node_id, self.attempt)
    }
}

/// One call's name, the same for every delivery and attempt of the node: the key of its ledger
/// entry and the id of its approval, so both survive restarts and reassignment.
pub(crate) struct CallIds {
    pub ledger_key: String,
    pub approval_id: String,
}

/// Namespace of ledger argument hashes (UUID v5, stable across releases).
const LEDGER_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x2f9d_61c4_8a0e_4b73_a5c1_0d9e_33f7_41b2);

impl TaskScope {
    pub(crate) fn next_call(&self, tool: &str, args: &Value) -> CallIds {
        let call = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let hash = uuid::Uuid::new_v5(&LEDGER_NAMESPACE, format!("{tool}\n{args}").as_bytes()).simple();
        let id = format!("{}.{}.{call}.{hash}", self.goal_id, self.node_id);
        CallIds { ledger_key: id.clone(), approval_id: id }
    }
}
