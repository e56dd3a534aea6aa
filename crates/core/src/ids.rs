//! Identifier newtypes, so a `TaskId` cannot be passed where an `AgentId` is expected.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

id_type!(
    /// A goal, e.g. `g-0193...`. Deterministic from the idempotency key when one is given.
    GoalId
);
id_type!(
    /// A node of a plan, unique within the plan.
    NodeId
);
id_type!(
    /// One attempt at one node: `<goal_id>.<node_id>.<attempt>`.
    TaskId
);
id_type!(
    /// An executor agent.
    AgentId
);

/// Namespace for goal ids derived from idempotency keys (UUID v5).
const GOAL_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6a1c_37f2_5e0b_4a8e_9d3f_8c21_7e44_b0a5);

impl GoalId {
    /// A fresh, time-ordered goal id.
    pub fn generate() -> Self {
        Self(format!("g-{}", uuid::Uuid::now_v7().simple()))
    }

    /// The goal id for an idempotency key: the same key always names the same goal.
    pub fn from_idempotency_key(key: &str) -> Self {
        Self(format!("g-{}", uuid::Uuid::new_v5(&GOAL_NAMESPACE, key.as_bytes()).simple()))
    }
}

impl TaskId {
    /// The deterministic id of an attempt. It is also the `Nats-Msg-Id` of the task message, so a
    /// re-publish of the same attempt deduplicates in JetStream.
    pub fn for_attempt(goal: &GoalId, node: &str, attempt: u32) -> Self {
        Self(format!("{goal}.{node}.{attempt}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_key_gives_a_stable_goal_id() {
        assert_eq!(GoalId::from_idempotency_key("k1"), GoalId::from_idempotency_key("k1"));
        assert_ne!(GoalId::from_idempotency_key("k1"), GoalId::from_idempotency_key("k2"));
        assert_ne!(GoalId::generate(), GoalId::generate());
    }

    #[test]
    fn goal_ids_are_valid_kv_keys_and_subject_tokens() {
        let id = GoalId::generate();
        assert!(id.as_str().chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }
}
