//! Goal state in the `hermes_goals` KV bucket. Every change is a compare-and-set on the entry's
//! revision, retried on conflict with the transition recomputed on fresh state, so several
//! dispatcher replicas can work on the same goal without losing an update.

use async_nats::jetstream::kv;
use bytes::Bytes;
use dashmap::DashMap;
use hermes_core::{Error, Result};
use hermes_proto::GoalState;
use prost::Message as _;

/// Conflicting writers give up after this many attempts; each retry reloads the state.
const MAX_CAS_ATTEMPTS: usize = 64;

pub struct GoalStore {
    kv: kv::Store,
    /// Largest value the server accepts.
    max_value_bytes: usize,
    /// The last state and revision this process wrote for each running goal. It saves a read
    /// before every update; when another replica wrote in between, the CAS fails and the state is
    /// read afresh, so a stale entry costs one retry and never a lost update.
    written: DashMap<String, (GoalState, u64)>,
}

/// The outcome of [`GoalStore::update`].
pub struct Updated<T> {
    pub state: GoalState,
    pub value: T,
}

impl GoalStore {
    pub fn new(kv: kv::Store, max_value_bytes: usize) -> Self {
        Self { kv, max_value_bytes, written: DashMap::new() }
    }

    pub async fn load(&self, goal_id: &str) -> Result<Option<(GoalState, u64)>> {
        let entry = self
            .kv
            .entry(goal_id)
            .await
            .map_err(|e| Error::JetStream { operation: "load goal", reason: e.to_string() })?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let state = GoalState::decode(entry.value)
                    .map_err(|e| Error::Decode { kind: "GoalState", reason: e.to_string() })?;
                Ok(Some((state, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Stores a new goal. Returns `false` when a goal with this id already exists.
    pub async fn create(&self, state: &GoalState) -> Result<bool> {
        let value = self.encode(state)?;
        match self.kv.create(&state.goal_id, value).await {
            Ok(revision) => {
                self.remember(state, revision);
                Ok(true)
            }
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::JetStream { operation: "create goal", reason: e.to_string() }),
        }
    }

    /// Loads the goal, applies `change` and writes it back with compare-and-set. `change` returns
    /// `None` to leave the goal untouched. It may run several times, so it must be a pure function
    /// of the state it is given. The transition's events are numbered ([`Effects::number`]) on
    /// the state that is written, so their `seq` commits with it.
    pub async fn update<T: crate::engine::Transition>(
        &self,
        goal_id: &str,
        mut change: impl FnMut(&mut GoalState) -> Option<T>,
    ) -> Result<Option<Updated<T>>> {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let cached = self.written.get(goal_id).map(|e| e.value().clone());
            let from_cache = cached.is_some();
            let (mut state, revision) = match cached {
                Some(entry) => entry,
                None => match self.load(goal_id).await? {
                    Some(entry) => entry,
                    None => {
                        return Err(Error::NotFound { what: "goal", id: goal_id.to_owned() });
                    }
                },
            };
            let status_before = state.status;
            let Some(mut value) = change(&mut state) else {
                if from_cache {
                    // "Nothing to do" on the state this replica wrote last is not proof: another
                    // replica may have written since (dispatched the node this result is for,
                    // say). Only a change is checked by the CAS, so decide again on the stored
                    // state before dropping anything.
                    self.written.remove(goal_id);
                    continue;
                }
                return Ok(None);
            };
            value.effects().number(&mut state);
            value.effects().index |= state.status != status_before;
            let bytes = self.encode(&state)?;
            match self.kv.update(goal_id, bytes, revision).await {
                Ok(revision) => {
                    self.remember(&state, revision);
                    return Ok(Some(Updated { state, value }));
                }
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    // Another writer got there first: read its state and recompute.
                    self.written.remove(goal_id);
                    continue;
                }
                Err(e) => {
                    return Err(Error::JetStream { operation: "update goal", reason: e.to_string() });
                }
            }
        }
        Err(Error::Unavailable(format!("goal {goal_id}: too many concurrent updates")))
    }

    fn remember(&self, state: &GoalState, revision: u64) {
        if crate::engine::is_terminal(state.status) {
            self.written.remove(&state.goal_id);
        } else {
            self.written.insert(state.goal_id.clone(), (state.clone(), revision));
        }
    }

    pub async fn keys(&self) -> Result<Vec<String>> {
        hermes_core::bus::kv_keys(&self.kv, "list goals").await
    }

    fn encode(&self, state: &GoalState) -> Result<Bytes> {
        let bytes = state.encode_to_vec();
        if bytes.len() > self.max_value_bytes {
            return Err(Error::InvalidArgument {
                field: "goal".into(),
                reason: format!(
                    "goal state is {} bytes, over the server's limit of {}; node outputs are too large to keep inline",
                    bytes.len(),
                    self.max_value_bytes
                ),
            });
        }
        Ok(Bytes::from(bytes))
    }
}
