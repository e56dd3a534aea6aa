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

/// How a client-supplied id may be spelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdShape {
    /// `[A-Za-z0-9_-]`: goal, agent, artifact ids.
    Word,
    /// Words joined by single dots, none empty: call ids (`<goal>.<node>.<n>.<hash>`), session ids.
    Dotted,
    /// Any printable text without control characters: idempotency keys (hashed before use).
    Printable,
}

/// Checks a client-supplied id before it reaches a subject, a key or a message, so that NATS
/// wildcards (`*`, `>`), separators (`.` where not allowed, `/`, spaces), `..`, NUL and other
/// control characters are refused with `INVALID_ARGUMENT` naming the field and the id, never
/// with a retryable error.
pub fn check_id(field: &str, value: &str, max_len: usize, shape: IdShape) -> crate::Result<()> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let reason = if value.is_empty() {
        Some("is empty".to_owned())
    } else if value.len() > max_len {
        Some(format!("is longer than {max_len} bytes"))
    } else {
        match shape {
            IdShape::Word if !value.chars().all(word) => {
                Some("may contain only letters, digits, `_` and `-`".to_owned())
            }
            IdShape::Dotted if !value.split('.').all(|seg| !seg.is_empty() && seg.chars().all(word)) => {
                Some("must be words of letters, digits, `_` and `-` joined by single dots".to_owned())
            }
            IdShape::Printable if value.chars().any(char::is_control) => {
                Some("may not contain control characters".to_owned())
            }
            _ => None,
        }
    };
    match reason {
        None => Ok(()),
        Some(reason) => Err(crate::Error::InvalidArgument {
            field: field.to_owned(),
            reason: format!(
                "`{}` {reason}",
                crate::topology::truncate_for_message(&value.escape_default().to_string())
            ),
        }),
    }
}

#[cfg(test)]
mod check_id_tests {
    use super::*;

    #[test]
    fn hostile_ids_are_invalid_arguments_naming_the_id() {
        for bad in ["../a", "a..b", "a\0b", "a.*", "a.>", "a b", "a/b", ".a", "a.", "", "a\nb"] {
            let err = check_id("call_id", bad, 256, IdShape::Dotted).unwrap_err();
            assert_eq!(err.code(), crate::ErrorCode::InvalidArgument, "{bad:?}");
            assert!(err.to_string().contains("call_id"), "{err}");
        }
        check_id("call_id", "g-1.n1.0.abc123", 256, IdShape::Dotted).unwrap();
        check_id("goal_id", "g-0193abc", 128, IdShape::Word).unwrap();
        assert!(check_id("goal_id", "g.1", 128, IdShape::Word).is_err());
        assert!(check_id("idempotency_key", "k\0", 256, IdShape::Printable).is_err());
        check_id("idempotency_key", "order 42 / retry *", 256, IdShape::Printable).unwrap();
        assert!(check_id("goal_id", &"a".repeat(129), 128, IdShape::Word).is_err());
    }
}
