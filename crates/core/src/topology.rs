//! Names of every stream, subject, consumer and KV bucket, derived from one configurable prefix,
//! and the validation of the user-supplied tokens (task types, agent ids) that go into them.
//!
//! Task subjects put the routing token before the task type so that dotted task types such as
//! `table.aggregate` keep working with wildcards, and so that pool and directed consumers can never
//! overlap on the work-queue stream:
//!
//! * `hermes.task.pool.<task_type>`: the shared pool of a task type;
//! * `hermes.task.direct.<agent_id>.<task_type>`: work routed to one agent.

use crate::error::{Error, Result};

/// Upper bound for a task type name; it becomes part of subjects and consumer names.
pub const MAX_TASK_TYPE_LEN: usize = 64;
/// Upper bound for an agent id; it becomes part of subjects and consumer names.
pub const MAX_AGENT_ID_LEN: usize = 64;

/// The JetStream layout for one prefix (default `hermes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    prefix: String,
}

impl Default for Topology {
    fn default() -> Self {
        Self { prefix: "hermes".to_owned() }
    }
}

impl Topology {
    /// A layout for `prefix`, which must be a single lowercase subject token.
    pub fn new(prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        let valid = !prefix.is_empty()
            && prefix.len() <= 32
            && prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            return Err(Error::InvalidArgument {
                field: "prefix".into(),
                reason: format!("`{prefix}` must be 1-32 characters of [a-z0-9-]"),
            });
        }
        Ok(Self { prefix })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn stream_name(&self, what: &str) -> String {
        format!("{}_{what}", self.prefix.to_ascii_uppercase().replace('-', "_"))
    }

    fn bucket_name(&self, what: &str) -> String {
        format!("{}_{what}", self.prefix.replace('-', "_"))
    }

    pub fn tasks_stream(&self) -> String {
        self.stream_name("TASKS")
    }
    pub fn results_stream(&self) -> String {
        self.stream_name("RESULTS")
    }
    pub fn events_stream(&self) -> String {
        self.stream_name("EVENTS")
    }
    /// Recorded model exchanges (owned by the dispatchers).
    pub fn records_stream(&self) -> String {
        self.stream_name("RECORDS")
    }
    pub fn all_records(&self) -> String {
        format!("{}.record.>", self.prefix)
    }
    /// Where a goal's model exchanges are recorded.
    pub fn record(&self, goal_id: &str) -> String {
        format!("{}.record.{goal_id}", self.prefix)
    }
    /// Where the tool calls of a goal's agent loops are recorded.
    pub fn tool_record(&self, goal_id: &str) -> String {
        format!("{}.record.{goal_id}.tool", self.prefix)
    }
    /// The append-only audit trail (owned by the dispatchers).
    pub fn audit_stream(&self) -> String {
        self.stream_name("AUDIT")
    }
    /// Where an audited action of `tenant` is appended (`_` with auth off).
    pub fn audit(&self, tenant: Option<&str>) -> String {
        format!("{}.audit.{}", self.prefix, tenant.unwrap_or("_"))
    }
    pub fn all_audit(&self) -> String {
        format!("{}.audit.>", self.prefix)
    }
    /// Webhook deliveries waiting to be sent (owned by the dispatchers; docs/webhooks.md).
    pub fn webhooks_stream(&self) -> String {
        self.stream_name("WEBHOOKS")
    }
    pub fn all_webhooks(&self) -> String {
        format!("{}.webhook.>", self.prefix)
    }
    /// Where a goal's deliveries to one endpoint wait, in order.
    pub fn webhook(&self, endpoint_id: &str, goal_id: &str) -> String {
        format!("{}.webhook.{endpoint_id}.{goal_id}", self.prefix)
    }
    /// Webhook endpoints, with their signing secrets.
    pub fn webhooks_bucket(&self) -> String {
        self.bucket_name("webhooks")
    }
    /// Webhook deliveries' records, with every attempt.
    pub fn webhook_deliveries_bucket(&self) -> String {
        self.bucket_name("webhook_deliveries")
    }
    pub fn webhooks_consumer(&self) -> &'static str {
        "webhooks"
    }
    pub fn dlq_stream(&self) -> String {
        self.stream_name("DLQ")
    }
    pub fn plans_stream(&self) -> String {
        self.stream_name("PLANS")
    }
    pub fn goals_bucket(&self) -> String {
        self.bucket_name("goals")
    }
    /// Tenants' running goals and daily usage, for their quotas (owned by the dispatchers).
    pub fn tenants_bucket(&self) -> String {
        self.bucket_name("tenants")
    }
    pub fn approvals_bucket(&self) -> String {
        self.bucket_name("approvals")
    }
    pub fn ledger_bucket(&self) -> String {
        self.bucket_name("ledger")
    }
    pub fn agents_bucket(&self) -> String {
        self.bucket_name("agents")
    }
    /// The key dispatchers sign tasks' memory tokens with (`crate::task_token`).
    pub fn task_keys_bucket(&self) -> String {
        self.bucket_name("task_keys")
    }
    /// Sessions' recent turns and summaries.
    pub fn sessions_bucket(&self) -> String {
        self.bucket_name("sessions")
    }
    /// Semantic memory: documents with their embeddings.
    pub fn vectors_bucket(&self) -> String {
        self.bucket_name("vectors")
    }
    /// Snapshots of semantic memory's index, one object per collection, so a restart loads a
    /// collection's HNSW graph instead of rebuilding it (owner: memory).
    pub fn vector_snapshots_bucket(&self) -> String {
        self.bucket_name("vector_snapshots")
    }
    /// The memory service's own note of each running goal's text and tenant, written from
    /// `GoalAccepted` and read at `GoalCompleted` to remember the goal (owner: memory).
    pub fn memory_goals_bucket(&self) -> String {
        self.bucket_name("memory_goals")
    }
    /// The memory service's request/reply subject for `method` (e.g. `context`).
    pub fn memory_rpc(&self, method: &str) -> String {
        format!("{}.memory.rpc.{method}", self.prefix)
    }
    /// Every memory request subject, which the service subscribes to.
    pub fn all_memory_rpc(&self) -> String {
        format!("{}.memory.rpc.*", self.prefix)
    }
    /// The queue group dispatcher replicas share max-deliveries advisories in.
    pub fn dlq_queue_group(&self) -> String {
        format!("{}-dlq", self.prefix)
    }
    /// The queue group memory service replicas share requests in.
    pub fn memory_queue_group(&self) -> String {
        format!("{}-memory", self.prefix)
    }
    /// The memory service's durable consumer of goal events.
    pub fn memory_consumer(&self) -> &'static str {
        "memory"
    }
    /// The object store of large payloads.
    pub fn artifacts_bucket(&self) -> String {
        self.bucket_name("artifacts")
    }

    pub fn all_tasks(&self) -> String {
        format!("{}.task.>", self.prefix)
    }
    pub fn pool_task(&self, task_type: &str) -> String {
        format!("{}.task.pool.{task_type}", self.prefix)
    }
    pub fn direct_task(&self, agent_id: &str, task_type: &str) -> String {
        format!("{}.task.direct.{agent_id}.{task_type}", self.prefix)
    }
    pub fn direct_tasks_of(&self, agent_id: &str) -> String {
        format!("{}.task.direct.{agent_id}.>", self.prefix)
    }
    /// What a task consumer serves, from its filter subject: `(task_type, "pool")` for a pool
    /// consumer, `(task_type, "lane:<tenant>")` for a tenant's lane, `("*", agent_id)` for an
    /// agent's directed consumer.
    pub fn task_consumer_of(&self, filter_subject: &str) -> Option<(String, String)> {
        if let Some(task_type) = filter_subject.strip_prefix(&self.pool_task("")) {
            return Some((task_type.to_owned(), "pool".to_owned()));
        }
        if let Some(lane) = filter_subject.strip_prefix(&format!("{}.task.lane.", self.prefix)) {
            let (tenant, task_type) = lane.split_once('.')?;
            return Some((task_type.to_owned(), format!("lane:{tenant}")));
        }
        let agent =
            filter_subject.strip_prefix(&format!("{}.task.direct.", self.prefix))?.strip_suffix(".>")?;
        Some(("*".to_owned(), agent.to_owned()))
    }
    /// Durable consumer shared by every agent serving `task_type` from the pool.
    pub fn pool_consumer(&self, task_type: &str) -> String {
        format!("pool_{}", task_type.replace('.', "_"))
    }

    /// The pool subject of a task of `tenant`: each tenant's pooled tasks wait in a lane of
    /// their own, which agents serve by weighted fair queuing (`docs/security.md`, "Fair
    /// dispatch"), so a flood from one tenant queues in its lane and not ahead of every other
    /// tenant's tasks. Tasks without a tenant (auth off) use the plain pool.
    pub fn pool_task_of(&self, task_type: &str, tenant: Option<&str>) -> String {
        match tenant {
            Some(tenant) => self.lane_task(tenant, task_type),
            None => self.pool_task(task_type),
        }
    }
    /// `hermes.task.lane.<tenant>.<task_type>`: a tenant is one word (`check_id`), so the
    /// subject names exactly one tenant and type.
    pub fn lane_task(&self, tenant: &str, task_type: &str) -> String {
        format!("{}.task.lane.{tenant}.{task_type}", self.prefix)
    }
    /// The consumer of `tenant`'s lane of a task type, shared like its pool consumer:
    /// `lane_<task type with . as _>__<tenant>`. A task type has no `_` and no empty segment,
    /// so the first `__` ends it and no two (tenant, type) pairs share a name.
    pub fn lane_consumer(&self, tenant: &str, task_type: &str) -> String {
        format!("lane_{}__{tenant}", task_type.replace('.', "_"))
    }
    /// The tenants whose lanes agents serve, each with its weight (`crate::lanes`).
    pub fn lanes_bucket(&self) -> String {
        self.bucket_name("lanes")
    }
    /// Durable consumer of one agent's directed work.
    pub fn agent_consumer(&self, agent_id: &str) -> String {
        format!("agent_{agent_id}")
    }
    /// Durable consumer a dispatcher uses to take over an offline agent's directed work.
    pub fn reassign_consumer(&self, agent_id: &str) -> String {
        format!("reassign_{agent_id}")
    }

    pub fn all_results(&self) -> String {
        format!("{}.result.>", self.prefix)
    }
    pub fn result(&self, goal_id: &str) -> String {
        format!("{}.result.{goal_id}", self.prefix)
    }
    /// The one consumer every dispatcher replica shares, so any replica applies any result.
    pub fn results_consumer(&self) -> &'static str {
        "dispatcher"
    }

    pub fn all_events(&self) -> String {
        format!("{}.event.>", self.prefix)
    }
    pub fn event(&self, goal_id: &str) -> String {
        format!("{}.event.{goal_id}", self.prefix)
    }

    pub fn all_plans(&self) -> String {
        format!("{}.plan.>", self.prefix)
    }
    pub fn plan_request(&self) -> String {
        format!("{}.plan.request", self.prefix)
    }
    pub fn plan_result(&self) -> String {
        format!("{}.plan.result", self.prefix)
    }
    /// The consumer planners share on plan requests.
    pub fn planner_consumer(&self) -> &'static str {
        "planner"
    }
    /// The consumer dispatchers share on plan results.
    pub fn plan_results_consumer(&self) -> &'static str {
        "dispatcher_plans"
    }

    pub fn all_dlq(&self) -> String {
        format!("{}.dlq.>", self.prefix)
    }
    pub fn dlq(&self, kind: &str) -> String {
        format!("{}.dlq.{kind}", self.prefix)
    }

    pub fn heartbeat(&self, agent_id: &str) -> String {
        format!("{}.registry.heartbeat.{agent_id}", self.prefix)
    }
    pub fn all_heartbeats(&self) -> String {
        format!("{}.registry.heartbeat.*", self.prefix)
    }
    pub fn route(&self) -> String {
        format!("{}.registry.route", self.prefix)
    }
    /// Where a dispatcher tells agents to abandon a cancelled goal's tasks (core NATS).
    pub fn cancel(&self, goal_id: &str) -> String {
        format!("{}.cancel.{goal_id}", self.prefix)
    }
    /// Every goal's cancel subject, which agents subscribe to.
    pub fn all_cancels(&self) -> String {
        format!("{}.cancel.*", self.prefix)
    }
    /// Where the registry announces agents that went offline (TTL expired or deregistered).
    pub fn agent_offline(&self) -> String {
        format!("{}.registry.offline", self.prefix)
    }
    pub fn catalog(&self) -> String {
        format!("{}.registry.catalog", self.prefix)
    }
    /// Asked for every agent the registry knows, online or not (`ListAgentsResponse`).
    pub fn agents_list(&self) -> String {
        format!("{}.registry.agents", self.prefix)
    }
    /// Where agents send `AgentReport`s about the attempts they run: the events of their agent
    /// loops and their approvals, which agents may not publish or write themselves (core NATS
    /// request/reply, answered by one dispatcher of [`Topology::dispatcher_queue`]).
    pub fn agent_report(&self) -> String {
        format!("{}.agent.report", self.prefix)
    }
    /// Queue group shared by dispatcher replicas for agent reports.
    pub fn dispatcher_queue(&self) -> String {
        format!("{}-dispatcher", self.prefix)
    }
    /// Queue group shared by registry replicas.
    pub fn registry_queue(&self) -> String {
        format!("{}-registry", self.prefix)
    }
}

/// Checks a task type: dot-separated segments of `[a-z0-9-]`, each starting with a letter or digit.
/// Underscores are excluded because `.` maps to `_` in consumer names, which must stay unique.
pub fn validate_task_type(task_type: &str) -> Result<()> {
    let reason = if task_type.is_empty() {
        Some("is empty".to_owned())
    } else if task_type.len() > MAX_TASK_TYPE_LEN {
        Some(format!("is longer than {MAX_TASK_TYPE_LEN} characters"))
    } else if !task_type.split('.').all(|seg| {
        seg.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && seg.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    }) {
        Some("must be dot-separated segments of [a-z0-9-]".to_owned())
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidArgument {
            field: "task_type".into(),
            reason: format!("`{}` {reason}", truncate_for_message(task_type)),
        }),
        None => Ok(()),
    }
}

/// Checks an agent id: 1-64 characters of `[A-Za-z0-9_-]`.
pub fn validate_agent_id(agent_id: &str) -> Result<()> {
    let valid = !agent_id.is_empty()
        && agent_id.len() <= MAX_AGENT_ID_LEN
        && agent_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            field: "agent_id".into(),
            reason: format!(
                "`{}` must be 1-{MAX_AGENT_ID_LEN} characters of [A-Za-z0-9_-]",
                truncate_for_message(agent_id)
            ),
        })
    }
}

/// Keeps user-controlled text in error messages short.
pub fn truncate_for_message(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(MAX).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_types_that_are_safe_subject_tokens_pass() {
        for ok in ["math.evaluate", "table.aggregate", "a", "web-search.v2"] {
            validate_task_type(ok).unwrap();
        }
        for bad in ["", "Math.x", "a..b", "a.*", "a.>", "a b", "a_b", ".a", "a."] {
            assert!(validate_task_type(bad).is_err(), "{bad} should be rejected");
        }
    }

    /// Tenants and task types whose flat forms could run together (`a_b` + `c`, `a` + `b.c`)
    /// still get lanes of their own: no two tenants share one.
    #[test]
    fn every_tenant_and_type_has_a_lane_consumer_of_its_own() {
        let t = Topology::default();
        let tenants = ["a", "a_b", "b", "a__b", "_", "__", "a-b", "b_c"];
        let types = ["c", "b.c", "a.b.c", "b-c", "c.b"];
        let mut names = std::collections::HashSet::new();
        let mut subjects = std::collections::HashSet::new();
        for tenant in tenants {
            for task_type in types {
                validate_task_type(task_type).unwrap();
                assert!(names.insert(t.lane_consumer(tenant, task_type)), "{tenant} {task_type}");
                assert!(subjects.insert(t.lane_task(tenant, task_type)), "{tenant} {task_type}");
            }
        }
    }

    #[test]
    fn pool_and_direct_subjects_never_overlap() {
        let t = Topology::default();
        assert_eq!(t.pool_task("math.evaluate"), "hermes.task.pool.math.evaluate");
        assert_eq!(t.direct_task("a1", "math.evaluate"), "hermes.task.direct.a1.math.evaluate");
        assert!(t.pool_task("x").starts_with("hermes.task.pool."));
        assert_eq!(t.pool_consumer("math.evaluate"), "pool_math_evaluate");
        assert_eq!(t.lane_task("team-a", "math.evaluate"), "hermes.task.lane.team-a.math.evaluate");
        assert_eq!(t.pool_task_of("math.evaluate", Some("team-a")), "hermes.task.lane.team-a.math.evaluate");
        assert_eq!(t.lane_consumer("team-a", "math.evaluate"), "lane_math_evaluate__team-a");
        assert_eq!(t.pool_task_of("math.evaluate", None), "hermes.task.pool.math.evaluate");
        assert_eq!(
            t.task_consumer_of("hermes.task.lane.team-a.math.evaluate"),
            Some(("math.evaluate".to_owned(), "lane:team-a".to_owned()))
        );
        assert_eq!(t.tasks_stream(), "HERMES_TASKS");
        assert_eq!(t.goals_bucket(), "hermes_goals");
    }

    #[test]
    fn agent_ids_are_checked() {
        validate_agent_id("exec-1_a").unwrap();
        assert!(validate_agent_id("").is_err());
        assert!(validate_agent_id("a.b").is_err());
        assert!(validate_agent_id(&"x".repeat(65)).is_err());
    }
}
