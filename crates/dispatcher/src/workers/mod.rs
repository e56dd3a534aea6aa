//! The dispatcher's background workers. Each is one named task of the service runtime, owns its
//! own state, and is reached only through a channel (the [`Followups`](crate::effects::Followups)
//! handles) or a NATS subscription. Workers call the [`GoalService`](crate::goals::GoalService) to change
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
//! - [`queue_depth`]: the task queues' backlog, as metrics;
//! - [`webhooks`]: webhook deliveries, sent signed, retried on their schedule.

pub(crate) mod dlq;
pub(crate) mod plans;
pub(crate) mod queue_depth;
pub(crate) mod reports;
pub(crate) mod results;
pub mod summaries;
pub(crate) mod takeover;
pub(crate) mod timers;
pub(crate) mod webhooks;

use std::time::Duration;

/// How many times a task result or a plan result is delivered before it is dead-lettered. With
/// [`retry_after`]'s back-off, a result waits out more than a minute of failed applies (a
/// JetStream cluster electing a leader for the goals bucket) first.
pub(crate) const APPLY_MAX_DELIVER: i64 = 20;

/// The nak delay after the `delivered`th failed apply of a result: 250 ms, doubling up to 5 s.
pub(crate) fn retry_after(delivered: i64) -> Duration {
    let doublings = delivered.clamp(1, 6) as u32 - 1;
    (Duration::from_millis(250) * 2u32.pow(doublings)).min(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_applies_back_off_to_five_seconds_and_outlast_a_minute() {
        assert_eq!(retry_after(1), Duration::from_millis(250));
        assert_eq!(retry_after(2), Duration::from_millis(500));
        assert_eq!(retry_after(5), Duration::from_secs(4));
        assert_eq!(retry_after(6), Duration::from_secs(5));
        assert_eq!(retry_after(30), Duration::from_secs(5));
        let waited: Duration = (1..APPLY_MAX_DELIVER).map(retry_after).sum();
        assert!(waited > Duration::from_secs(60), "{waited:?}");
    }
}
