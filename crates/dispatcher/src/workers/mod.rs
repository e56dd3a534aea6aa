//! The dispatcher's background workers. Each is one named task of the service runtime, owns its
//! own state, and is reached only through a channel (the [`Followups`](crate::effects::Followups)
//! handles) or a NATS subscription. Workers call the [`GoalService`](crate::GoalService) to change
//! goals; the service never calls a worker.
//!
//! - [`results`]: the results consumer, with one inbox per goal so a goal's results are applied
//!   in batches, one compare-and-set per batch;
//! - [`plans`]: the plan results consumer;
//! - [`timers`]: goal and attempt deadlines, rebuilt from KV at start and rescanned every minute;
//! - [`takeover`]: agents that went offline, and tasks no live agent serves;
//! - [`reports`]: agents' reports on the attempts they run (tool call events, approvals);
//! - [`dlq`]: poison messages (MaxDeliver advisories) moved to the DLQ;
//! - [`summaries`]: the written answers of goals given as text;
//! - [`queue_depth`]: the task queues' backlog, as metrics.

pub(crate) mod dlq;
pub(crate) mod plans;
pub(crate) mod queue_depth;
pub(crate) mod reports;
pub(crate) mod results;
pub mod summaries;
pub(crate) mod takeover;
pub(crate) mod timers;
