//! The timers worker: goal and attempt deadlines. Every goal's next deadline (its own, or the
//! earliest of its dispatched nodes') is computed from its persisted state, never kept only in
//! memory: the effects publisher sends the deadline of every goal this dispatcher writes, the
//! worker rebuilds the schedule from the `hermes_goals` bucket's unfinished goals (those the goal
//! index holds in a status that is not terminal) when it starts, and rescans them every minute so
//! goals last written by a replica that died are covered too. The start-up scan also
//! resumes goals a stopped dispatcher left `SUMMARIZING` and publishes again the tasks of in-flight
//! attempts. When a deadline passes the goal goes through [`GoalService::expire`], a
//! compare-and-set like any transition, so two replicas firing the same timer apply it once.
//!
//! When the NATS connection comes back after a loss, the worker publishes the in-flight tasks
//! again too: a nats-server killed with `kill -9` can lose the last messages it acknowledged (a
//! task, or an agent's result) before they reached its store, and without this their nodes would
//! wait for their deadlines. Publishing again is safe for the same reasons as at start. Likewise
//! for a goal whose committed transition's tasks could not be published at all (a JetStream
//! cluster without a leader for longer than the effects publisher waits): its in-flight tasks are
//! published again every [`UNSENT_RETRY`] until that succeeds.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt as _;
use hermes_core::now_unix_ms;
use hermes_proto::GoalStatus;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::effects::Deadline;
use crate::goals::GoalService;

/// How often due timers are checked.
const TICK: Duration = Duration::from_millis(250);
/// How often the unfinished goals are rescanned.
const RESCAN: Duration = Duration::from_secs(60);
/// How soon a deadline that could not be applied is tried again.
const RETRY_MS: u64 = 1000;
/// How often the in-flight tasks of a goal whose effects could not be published are sent again.
const UNSENT_RETRY: Duration = Duration::from_secs(1);
/// How many goals a rescan reads at once.
const RESCAN_READS: usize = 32;

/// Goals by their next deadline: the worker's state.
#[derive(Default)]
struct Schedule {
    due: BTreeSet<(u64, String)>,
    by_goal: HashMap<String, u64>,
}

impl Schedule {
    /// Records a goal's next deadline, or forgets the goal once it has none.
    fn set(&mut self, goal_id: &str, at: Option<u64>) {
        if let Some(old) = self.by_goal.remove(goal_id) {
            self.due.remove(&(old, goal_id.to_owned()));
        }
        if let Some(at) = at {
            self.due.insert((at, goal_id.to_owned()));
            self.by_goal.insert(goal_id.to_owned(), at);
        }
    }

    /// Removes and returns the goals due at `now_ms`.
    fn take_due(&mut self, now_ms: u64) -> Vec<String> {
        let mut out = Vec::new();
        while let Some((at, _)) = self.due.first() {
            if *at > now_ms {
                break;
            }
            let (_, goal) = self.due.pop_first().expect("first exists");
            self.by_goal.remove(&goal);
            out.push(goal);
        }
        out
    }
}

/// Fires due deadlines until `shutdown`.
pub(crate) async fn run(
    service: Arc<GoalService>,
    mut deadlines: UnboundedReceiver<Deadline>,
    mut unsent: UnboundedReceiver<String>,
    shutdown: CancellationToken,
) {
    let mut schedule = Schedule::default();
    let mut unsent_goals = std::collections::HashSet::<String>::new();
    let mut resend = tokio::time::interval(UNSENT_RETRY);
    if let Err(e) = rescan(&service, &mut schedule, Rescan::Starting).await {
        warn!(error = %e, "cannot rebuild the deadline timers; retrying at the next rescan");
    }
    info!(goals = schedule.by_goal.len(), "deadline timers rebuilt");
    let mut tick = tokio::time::interval(TICK);
    let mut rescans = tokio::time::interval_at(tokio::time::Instant::now() + RESCAN, RESCAN);
    let statistics = service.bus().client().statistics();
    let mut connects = statistics.connects.load(Ordering::Relaxed);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(deadline) = deadlines.recv() => schedule.set(&deadline.goal_id, deadline.at),
            Some(goal_id) = unsent.recv() => {
                unsent_goals.insert(goal_id);
            }
            _ = resend.tick(), if !unsent_goals.is_empty() => {
                let mut sent = Vec::new();
                for goal_id in &unsent_goals {
                    match republish(&service, goal_id).await {
                        Ok(()) => sent.push(goal_id.clone()),
                        Err(e) => warn!(goal_id, error = %e, "cannot publish the in-flight tasks of a goal whose effects were not sent; will retry"),
                    }
                }
                for goal_id in sent {
                    unsent_goals.remove(&goal_id);
                }
            }
            _ = rescans.tick() => {
                if let Err(e) = rescan(&service, &mut schedule, Rescan::Periodic).await {
                    warn!(error = %e, "deadline timer rescan failed");
                }
            }
            _ = tick.tick() => {
                let now_connects = statistics.connects.load(Ordering::Relaxed);
                if now_connects != connects {
                    info!(event = "nats_reconnected", "NATS is back; publishing in-flight tasks again");
                    // The bucket may have lost writes the index read (docs/operations.md).
                    service.index().reread();
                    match rescan(&service, &mut schedule, Rescan::Reconnected).await {
                        Ok(()) => connects = now_connects,
                        Err(e) => warn!(error = %e, "cannot publish in-flight tasks after a reconnect; will retry"),
                    }
                }
                for goal_id in schedule.take_due(now_unix_ms()) {
                    match service.expire(&goal_id).await {
                        Ok(Some(next)) => schedule.set(&goal_id, Some(next)),
                        Ok(None) => {}
                        Err(e) => {
                            warn!(goal_id, error = %e, "cannot apply a deadline; will retry");
                            schedule.set(&goal_id, Some(now_unix_ms() + RETRY_MS));
                        }
                    }
                }
            }
        }
    }
}

/// Publishes again the in-flight tasks of one goal, as stored now.
async fn republish(service: &GoalService, goal_id: &str) -> hermes_core::Result<()> {
    match service.store().load_current(goal_id).await? {
        Some((state, _)) => service.republish_unsent(&state).await,
        None => Ok(()),
    }
}

/// Why the bucket is scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rescan {
    /// The dispatcher starts: also resume summaries and publish in-flight tasks again.
    Starting,
    /// The NATS connection came back: also publish in-flight tasks again.
    Reconnected,
    /// The minute's rescan, for goals last written by a replica that died.
    Periodic,
}

/// Schedules every unfinished goal that has a deadline ahead; see [`Rescan`] for which goals are
/// read and what else is done. Goals are read [`RESCAN_READS`] at a time, each through the
/// bucket stream's leader, and handled in order. A goal that cannot be decoded is skipped with a
/// warning: one bad value must not keep every goal after it unscheduled.
/// Every scan also gives the tenants' running-goal places of goals that ended (or are gone) back,
/// in case the dispatcher that ended them died before it could.
async fn rescan(service: &GoalService, schedule: &mut Schedule, why: Rescan) -> hermes_core::Result<()> {
    let scanned_from = hermes_core::now_unix_ms();
    let mut running: std::collections::HashMap<String, std::collections::HashSet<String>> =
        Default::default();
    // Starting and the minute's rescan read only the goals the index holds unfinished: a goal that
    // ended has no deadline, no running place and no task in flight, and the index has read the
    // whole bucket before the timers start. After a reconnect (when the index may have missed
    // writes) every goal of the bucket is read.
    let keys = match why {
        Rescan::Starting | Rescan::Periodic => service.index().unfinished(),
        Rescan::Reconnected => service.store().keys().await?,
    };
    let mut reads = futures::stream::iter(keys)
        .map(|key| async move {
            let loaded = service.store().load_current(&key).await;
            (key, loaded)
        })
        .buffered(RESCAN_READS);
    while let Some((key, loaded)) = reads.next().await {
        let state = match loaded {
            Ok(Some((state, _))) => state,
            Ok(None) => continue,
            Err(e @ hermes_core::Error::Decode { .. }) => {
                warn!(goal_id = key, error = %e, "an undecodable goal has no deadline timers");
                continue;
            }
            Err(e) => return Err(e),
        };
        if !crate::engine::is_terminal(state.status)
            && let Some(tenant) = hermes_core::access::tenant_of(&state)
        {
            running.entry(tenant.to_owned()).or_default().insert(state.goal_id.clone());
        }
        schedule.set(&state.goal_id, service.next_deadline(&state));
        if why == Rescan::Starting && state.status == GoalStatus::Summarizing as i32 {
            service.followups().summarize(&state.goal_id);
        }
        if why != Rescan::Periodic {
            service.republish_in_flight(&state).await?;
        }
    }
    service.quotas().reconcile(&running, scanned_from).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_goals_come_out_in_deadline_order_and_a_new_deadline_replaces_the_old() {
        let mut s = Schedule::default();
        s.set("a", Some(30));
        s.set("b", Some(10));
        s.set("c", Some(20));
        s.set("a", Some(5));
        s.set("c", None);
        assert_eq!(s.take_due(9), vec!["a".to_owned()]);
        assert_eq!(s.take_due(100), vec!["b".to_owned()]);
        assert!(s.take_due(1000).is_empty());
        assert!(s.by_goal.is_empty());
    }
}
