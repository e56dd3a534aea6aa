//! Goal state in the `hermes_goals` KV bucket. Every change is a compare-and-set on the entry's
//! revision, retried on conflict with the transition recomputed on fresh state, so several
//! dispatcher replicas can work on the same goal without losing an update.
//!
//! Every write carries the goal's index entry in its headers (`goal_index::headers`), so the
//! goal index follows the bucket from headers alone and is never behind what was stored; what
//! this replica writes it indexes at once.

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
    /// Writes go through JetStream directly, to carry the index entry's headers.
    js: async_nats::jetstream::Context,
    /// Largest value the server accepts.
    max_value_bytes: usize,
    /// The last state and revision this process wrote for each running goal. It saves a read
    /// before every update; when another replica wrote in between, the CAS fails and the state is
    /// read afresh, so a stale entry costs one retry and never a lost update.
    written: DashMap<String, (GoalState, u64)>,
    index: crate::goal_index::GoalIndex,
}

/// The outcome of [`GoalStore::update`].
pub struct Updated<T> {
    pub state: GoalState,
    pub value: T,
}

impl GoalStore {
    pub fn new(
        kv: kv::Store,
        js: async_nats::jetstream::Context,
        max_value_bytes: usize,
        index: crate::goal_index::GoalIndex,
    ) -> Self {
        Self { kv, js, max_value_bytes, written: DashMap::new(), index }
    }

    /// The goal index, which every write of this store keeps current.
    pub fn index(&self) -> &crate::goal_index::GoalIndex {
        &self.index
    }

    /// Writes `state` if the goal's last revision is `revision` (0: the goal does not exist),
    /// with its index entry in the headers. `Ok(None)` when the revision was not the last.
    async fn write(&self, state: &GoalState, value: Bytes, revision: u64) -> Result<Option<u64>> {
        use async_nats::jetstream::context::PublishErrorKind;
        let entry = crate::goal_index::entry_of(state);
        let mut headers = crate::goal_index::headers(&entry);
        headers
            .insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, revision.to_string().as_str());
        let subject = format!("{}{}", self.kv.put_prefix.as_ref().unwrap_or(&self.kv.prefix), state.goal_id);
        let failed =
            |e: &dyn std::fmt::Display| Error::JetStream { operation: "write goal", reason: e.to_string() };
        let ack = self.js.publish_with_headers(subject, headers, value).await.map_err(|e| failed(&e))?;
        match ack.await {
            Ok(ack) => {
                self.index.apply(entry, ack.sequence);
                Ok(Some(ack.sequence))
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(None),
            Err(e) => Err(failed(&e)),
        }
    }

    /// The goal as a replica of the bucket has it, for views (`GetGoal`, pages of goals): a
    /// direct get, answered by whichever replica is fastest. In a cluster that may be one still
    /// catching up after a pause or a partition, so the state can be older than the last write.
    /// A decision (is this result stale, which tasks are in flight) reads [`Self::load_current`].
    pub async fn load(&self, goal_id: &str) -> Result<Option<(GoalState, u64)>> {
        let entry = self
            .kv
            .entry(goal_id)
            .await
            .map_err(|e| Error::JetStream { operation: "load goal", reason: e.to_string() })?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok(Some((decode(entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// The goal as the bucket's stream leader has it: what every write so far acknowledged left.
    /// Decisions read this, not [`Self::load`]: a result judged stale on an older state would be
    /// dropped, and a goal's in-flight tasks taken from one would miss the task in flight now.
    /// (The compare-and-set guards only what is written, not a decision to write nothing.)
    pub async fn load_current(&self, goal_id: &str) -> Result<Option<(GoalState, u64)>> {
        let Some((value, revision)) = hermes_core::bus::kv_current(&self.kv, goal_id, "load goal").await?
        else {
            return Ok(None);
        };
        Ok(Some((decode(value)?, revision)))
    }

    /// Stores a new goal. Returns `false` when a goal with this id already exists.
    pub async fn create(&self, state: &GoalState) -> Result<bool> {
        let value = self.encode(state)?;
        // Goals are never deleted, so "no revision yet" is the one way to create (no marker).
        match self.write(state, value, 0).await? {
            Some(revision) => {
                self.remember(state, revision);
                Ok(true)
            }
            None => Ok(false),
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
                None => match self.load_current(goal_id).await? {
                    Some(entry) => entry,
                    None => {
                        return Err(Error::NotFound { what: "goal", id: goal_id.to_owned() });
                    }
                },
            };
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
            let bytes = self.encode(&state)?;
            match self.write(&state, bytes, revision).await? {
                Some(revision) => {
                    self.remember(&state, revision);
                    return Ok(Some(Updated { state, value }));
                }
                None => {
                    // Another writer got there first: read its state and recompute.
                    self.written.remove(goal_id);
                    continue;
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

/// A stored goal's state; one that does not decode is a `Decode` error, naming it.
fn decode(value: Bytes) -> Result<GoalState> {
    GoalState::decode(value).map_err(|e| Error::Decode { kind: "GoalState", reason: e.to_string() })
}
