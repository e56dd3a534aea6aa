//! Deadline timers. Every goal's next deadline (its own, or the earliest of its dispatched
//! nodes') is computed from its persisted state, never kept only in memory: each dispatcher
//! schedules the goals it writes, rebuilds the schedule from the `hermes_goals` bucket when it
//! starts, and rescans it every minute so goals last written by a replica that died are covered
//! too. The start-up scan also resumes goals a stopped dispatcher left `SUMMARIZING`. When a
//! deadline passes the goal goes through [`engine::expire`] with a compare-and-set
//! like any transition, so two replicas firing the same timer apply it once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use hermes_core::now_unix_ms;
use hermes_proto::GoalState;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::GoalService;
use crate::engine::{self, Applied, Effects};

/// How often due timers are checked.
const TICK: Duration = Duration::from_millis(250);
/// How often the whole bucket is rescanned.
const RESCAN: Duration = Duration::from_secs(60);

/// Goals by their next deadline.
#[derive(Default)]
pub(crate) struct Timers {
    inner: Mutex<Schedule>,
}

#[derive(Default)]
struct Schedule {
    due: BTreeSet<(u64, String)>,
    by_goal: HashMap<String, u64>,
}

impl Timers {
    /// Records `state`'s next deadline (or forgets the goal once it has none).
    pub(crate) fn schedule(&self, state: &GoalState, next: Option<u64>) {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = s.by_goal.remove(&state.goal_id) {
            s.due.remove(&(old, state.goal_id.clone()));
        }
        if let Some(at) = next {
            s.due.insert((at, state.goal_id.clone()));
            s.by_goal.insert(state.goal_id.clone(), at);
        }
    }

    /// Removes and returns the goals due at `now_ms`.
    fn take_due(&self, now_ms: u64) -> Vec<String> {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        while let Some((at, goal)) = s.due.first().cloned() {
            if at > now_ms {
                break;
            }
            s.due.pop_first();
            s.by_goal.remove(&goal);
            out.push(goal);
        }
        out
    }

    pub(crate) fn len(&self) -> usize {
        self.inner.lock().map(|s| s.by_goal.len()).unwrap_or(0)
    }
}

impl GoalService {
    /// Applies the passed deadlines of one goal.
    async fn expire_goal(&self, goal_id: &str) -> crate::Result<()> {
        let human = self.nodes_waiting_on_approval(goal_id).await;
        let limits = self.limits();
        // Commit and publish in order: this goal's events are stored in `seq` order.
        let _order = self.order(goal_id).await;
        let updated = self
            .store
            .update(goal_id, |state| {
                let mut effects = Effects::default();
                let now = now_unix_ms();
                (engine::expire(state, limits, now, &mut effects, &|node| human.contains(node))
                    == Applied::Changed)
                    .then(|| {
                        state.updated_unix_ms = now;
                        effects
                    })
            })
            .await?;
        match updated {
            Some(updated) => {
                info!(goal_id, status = updated.state.status, event = "deadline_passed", "deadline applied");
                self.publish_effects(&updated.state, updated.value).await
            }
            None => {
                // Nothing was due after all (a result arrived, or a person is deciding): look again
                // at the next deadline.
                if let Some((state, _)) = self.store.load(goal_id).await? {
                    self.schedule_timer(&state);
                }
                Ok(())
            }
        }
    }

    /// Nodes of the goal with an approval nobody decided yet.
    async fn nodes_waiting_on_approval(&self, goal_id: &str) -> HashSet<String> {
        self.bus.approvals().pending_nodes(goal_id).await.unwrap_or_default()
    }

    pub(crate) fn schedule_timer(&self, state: &GoalState) {
        self.timers.schedule(state, engine::next_deadline(state, self.limits()));
    }

    /// Schedules every goal in the bucket that has a deadline ahead. At start it also queues the
    /// goals left waiting for their summary by a dispatcher that stopped, and publishes again the
    /// tasks of in-flight attempts (see [`engine::in_flight_tasks`]).
    async fn rescan_timers(&self, resume_summaries: bool) -> crate::Result<()> {
        for key in self.store.keys().await? {
            if let Some((state, _)) = self.store.load(&key).await? {
                self.schedule_timer(&state);
                if resume_summaries && state.status == hermes_proto::GoalStatus::Summarizing as i32 {
                    let _ = self.summaries_tx.send(state.goal_id.clone());
                }
                if resume_summaries {
                    let effects = engine::in_flight_tasks(&state, self.limits());
                    if !effects.tasks.is_empty() {
                        info!(goal_id = %state.goal_id, tasks = effects.tasks.len(), "re-publishing in-flight tasks");
                        self.publish_effects(&state, effects).await?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Fires due timers until `shutdown`.
pub(crate) async fn timers_loop(service: std::sync::Arc<GoalService>, shutdown: CancellationToken) {
    if let Err(e) = service.rescan_timers(true).await {
        warn!(error = %e, "cannot rebuild the deadline timers; retrying at the next rescan");
    }
    info!(goals = service.timers.len(), "deadline timers rebuilt");
    let mut tick = tokio::time::interval(TICK);
    let mut rescan = tokio::time::interval_at(tokio::time::Instant::now() + RESCAN, RESCAN);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = rescan.tick() => {
                if let Err(e) = service.rescan_timers(false).await {
                    warn!(error = %e, "deadline timer rescan failed");
                }
            }
            _ = tick.tick() => {
                for goal_id in service.timers.take_due(now_unix_ms()) {
                    if let Err(e) = service.expire_goal(&goal_id).await {
                        warn!(goal_id, error = %e, "cannot apply a deadline; will retry");
                        service.timers.schedule(
                            &GoalState { goal_id: goal_id.clone(), ..Default::default() },
                            Some(now_unix_ms() + 1000),
                        );
                    }
                }
            }
        }
    }
}
