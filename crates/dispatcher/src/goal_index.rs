//! The goal index: which goals exist, newest first, by tenant and by status, so that a page of
//! `ListGoals` reads the hundred goals it shows and not every goal stored.
//!
//! **Stored.** The stream `HERMES_GOAL_INDEX` holds one message per goal
//! (`hermes.goalidx.<goal id>`, one message per subject kept): a [`GoalIndexEntry`] with the
//! goal's tenant, status, session and creation time. A dispatcher writes it with the effects of a
//! goal's first transition and of every transition that changes the goal's status, in the same
//! batch as the transition's events, whose acks are awaited together: it costs a message, not a
//! round trip.
//!
//! **Held.** Every dispatcher reads the whole stream at start (before its API serves) and follows
//! it, keeping sorted sets of `(created, goal id)` in memory: all goals, each tenant's, each
//! status's and each tenant's in each status. A page is a walk down one set from the page token,
//! so it costs the same with a hundred goals stored or a million. What a replica writes itself it
//! applies at once, so a goal it accepted is in its next list. Entries carry their stream
//! sequence and an older one never replaces a newer.
//!
//! **Changes.** Each entry applied is also sent to [`GoalIndex::subscribe`]rs: the console's
//! Goals page follows that stream (`GET /v1/changes`) instead of polling.
//!
//! **Upgrade.** A goal store written by an older release has no index. A dispatcher that finds
//! the index empty while goals exist writes an entry for each goal (once; an entry that exists is
//! never replaced by this backfill, so a racing transition's entry wins).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use async_nats::jetstream::{consumer, stream};
use futures::StreamExt as _;
use hermes_core::{Bus, Error, Result};
use hermes_proto::{Approval, GoalIndexEntry, GoalState};
use prost::Message as _;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A goal's place in the order of listing: creation time, then id (both descending).
pub type Place = (u64, Arc<str>);

/// One goal as the index holds it.
struct Indexed {
    seq: u64,
    tenant: Arc<str>,
    status: i32,
    created: u64,
    session: Box<str>,
}

#[derive(Default)]
struct Sets {
    goals: HashMap<Arc<str>, Indexed>,
    all: BTreeSet<Place>,
    by_status: HashMap<i32, BTreeSet<Place>>,
    by_tenant: HashMap<Arc<str>, BTreeSet<Place>>,
    by_tenant_status: HashMap<(Arc<str>, i32), BTreeSet<Place>>,
    tenants: HashMap<Box<str>, Arc<str>>,
}

impl Sets {
    fn unlink(&mut self, id: &Arc<str>, old: &Indexed) {
        let place = (old.created, id.clone());
        self.all.remove(&place);
        remove_from(&mut self.by_status, &old.status, &place);
        remove_from(&mut self.by_tenant, &old.tenant, &place);
        remove_from(&mut self.by_tenant_status, &(old.tenant.clone(), old.status), &place);
    }

    fn link(&mut self, id: Arc<str>, entry: Indexed) {
        let place = (entry.created, id.clone());
        self.all.insert(place.clone());
        self.by_status.entry(entry.status).or_default().insert(place.clone());
        self.by_tenant.entry(entry.tenant.clone()).or_default().insert(place.clone());
        self.by_tenant_status.entry((entry.tenant.clone(), entry.status)).or_default().insert(place);
        self.goals.insert(id, entry);
    }

    fn tenant(&mut self, name: &str) -> Arc<str> {
        if let Some(t) = self.tenants.get(name) {
            return t.clone();
        }
        let t: Arc<str> = Arc::from(name);
        self.tenants.insert(name.into(), t.clone());
        t
    }
}

fn remove_from<K: std::hash::Hash + Eq>(sets: &mut HashMap<K, BTreeSet<Place>>, key: &K, place: &Place) {
    if let Some(set) = sets.get_mut(key) {
        set.remove(place);
        if set.is_empty() {
            sets.remove(key);
        }
    }
}

/// Which goals a page lists.
#[derive(Debug, Default, Clone)]
pub struct PageQuery<'a> {
    /// Only this tenant's goals; `None` is every tenant's (auth off, the platform role).
    pub tenant: Option<&'a str>,
    /// Only goals in this status (a `GoalStatus` number).
    pub status: Option<i32>,
    /// Only goals of this session.
    pub session: Option<&'a str>,
    /// Only goals listed after this place (the previous page's last).
    pub after: Option<(u64, String)>,
}

/// The index, shared by the API and the follower. Cheap to clone.
#[derive(Clone)]
pub struct GoalIndex {
    sets: Arc<RwLock<Sets>>,
    changes: broadcast::Sender<Arc<GoalIndexEntry>>,
    approvals: broadcast::Sender<Arc<Approval>>,
}

impl Default for GoalIndex {
    fn default() -> Self {
        Self {
            sets: Arc::default(),
            changes: broadcast::channel(1024).0,
            approvals: broadcast::channel(256).0,
        }
    }
}

/// The entry of `state` as the index stores it.
pub fn entry_of(state: &GoalState) -> GoalIndexEntry {
    let spec = state.spec.as_ref();
    GoalIndexEntry {
        goal_id: state.goal_id.clone(),
        tenant: hermes_core::access::tenant_of(state).unwrap_or("").to_owned(),
        status: state.status,
        created_unix_ms: state.created_unix_ms,
        session_id: spec.map(|s| s.session_id.clone()).unwrap_or_default(),
        updated_unix_ms: state.updated_unix_ms,
    }
}

impl GoalIndex {
    /// Applies an entry stored at stream sequence `seq`; an older one than the goal's is ignored.
    /// Returns whether it changed the index.
    pub fn apply(&self, entry: GoalIndexEntry, seq: u64) -> bool {
        {
            let Ok(mut sets) = self.sets.write() else { return false };
            let id: Arc<str> = match sets.goals.get_key_value(entry.goal_id.as_str()) {
                Some((_, old)) if old.seq >= seq => return false,
                Some((id, _)) => id.clone(),
                None => Arc::from(entry.goal_id.as_str()),
            };
            if let Some(old) = sets.goals.remove(&id) {
                sets.unlink(&id, &old);
            }
            let tenant = sets.tenant(&entry.tenant);
            let indexed = Indexed {
                seq,
                tenant,
                status: entry.status,
                created: entry.created_unix_ms,
                session: entry.session_id.as_str().into(),
            };
            sets.link(id, indexed);
        }
        // Nobody listening is not an error.
        let _ = self.changes.send(Arc::new(entry));
        true
    }

    /// How many goals the index holds.
    pub fn len(&self) -> usize {
        self.sets.read().map(|s| s.goals.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to `limit` goal ids matching `query`, newest first (creation time, then id, both
    /// descending). Costs the goals walked: `limit` unless a session is asked for.
    pub fn page(&self, query: &PageQuery<'_>, limit: usize) -> Vec<Place> {
        let Ok(sets) = self.sets.read() else { return Vec::new() };
        let set = match (query.tenant, query.status) {
            (None, None) => Some(&sets.all),
            (None, Some(status)) => sets.by_status.get(&status),
            (Some(tenant), None) => sets.by_tenant.get(tenant),
            (Some(tenant), Some(status)) => sets.by_tenant_status.get(&(Arc::<str>::from(tenant), status)),
        };
        let Some(set) = set else { return Vec::new() };
        let walk: Box<dyn Iterator<Item = &Place>> = match &query.after {
            Some((created, id)) => Box::new(set.range(..(*created, Arc::<str>::from(id.as_str()))).rev()),
            None => Box::new(set.iter().rev()),
        };
        walk.filter(|(_, id)| {
            query.session.is_none_or(|s| sets.goals.get(id).is_some_and(|g| &*g.session == s))
        })
        .take(limit)
        .cloned()
        .collect()
    }

    /// The tenant of an indexed goal (empty with auth off), or `None` for a goal not indexed.
    pub fn tenant(&self, goal_id: &str) -> Option<Arc<str>> {
        self.sets.read().ok()?.goals.get(goal_id).map(|g| g.tenant.clone())
    }

    /// Approvals asked for or decided from now on (see [`GoalIndex::follow_approvals`]).
    pub fn subscribe_approvals(&self) -> broadcast::Receiver<Arc<Approval>> {
        self.approvals.subscribe()
    }

    /// Passes every approval written on to [`GoalIndex::subscribe_approvals`] until `stop`,
    /// watching again a second after the watch fails.
    pub async fn follow_approvals(self, bus: Bus, stop: CancellationToken) {
        while !stop.is_cancelled() {
            let changes = match bus.approvals().changes().await {
                Ok(changes) => changes,
                Err(e) => {
                    warn!(error = %e, "cannot watch the approvals; trying again");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
            };
            let mut changes = std::pin::pin!(changes);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    next = changes.next() => match next {
                        Some(approval) => {
                            let _ = self.approvals.send(Arc::new(approval));
                        }
                        None => break,
                    },
                }
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }

    /// Every entry applied from now on (this replica's and the others'), for following changes.
    /// A receiver that falls more than 1,024 entries behind is told it lagged.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<GoalIndexEntry>> {
        self.changes.subscribe()
    }

    /// Opens the index stream (the dispatchers own it), writes the entries of an older release's
    /// goals when the index is empty, reads every entry, then follows the stream until `stop`.
    pub async fn open(bus: &Bus, stop: CancellationToken) -> Result<GoalIndex> {
        let topology = bus.topology();
        let config = stream::Config {
            name: topology.goal_index_stream(),
            description: Some("Hermes goal index: each goal's last status, for listing goals".into()),
            subjects: vec![topology.all_goal_index()],
            retention: stream::RetentionPolicy::Limits,
            max_messages_per_subject: 1,
            duplicate_window: std::time::Duration::from_secs(120),
            num_replicas: bus.config().replicas,
            ..Default::default()
        };
        let mut stream = hermes_core::bus::patiently(|| async {
            bus.jetstream()
                .get_or_create_stream(config.clone())
                .await
                .map_err(|e| Error::JetStream { operation: "create the goal index", reason: e.to_string() })
        })
        .await?;
        let stored = stream.info().await.map_err(|e| js("goal index info", e))?.state.messages;
        if stored == 0 {
            backfill(bus).await?;
        }
        let index = GoalIndex::default();
        let mut messages = ordered(&stream, topology.all_goal_index(), 1).await?;
        let mut next = 1;
        let last = stream.info().await.map_err(|e| js("goal index info", e))?.state.last_sequence;
        // Read up to what was there at start before answering: a list never misses an old goal.
        while next <= last {
            match tokio::time::timeout(std::time::Duration::from_secs(10), messages.next()).await {
                Ok(Some(Ok(message))) => next = index.take(&message).max(next),
                Ok(Some(Err(e))) => return Err(js("read the goal index", e)),
                Ok(None) | Err(_) => break,
            }
        }
        info!(goals = index.len(), "goal index loaded");
        let follower = index.clone();
        let prefix = topology.all_goal_index();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    message = messages.next() => match message {
                        Some(Ok(message)) => next = follower.take(&message).max(next),
                        Some(Err(e)) => {
                            warn!(error = %e, "the goal index follower failed; reading again after the last entry");
                            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                            match ordered(&stream, prefix.clone(), next).await {
                                Ok(fresh) => messages = fresh,
                                Err(e) => warn!(error = %e, "cannot follow the goal index"),
                            }
                        }
                        None => return,
                    },
                }
            }
        });
        Ok(index)
    }
}

fn js(operation: &'static str, e: impl std::fmt::Display) -> Error {
    Error::JetStream { operation, reason: e.to_string() }
}

impl GoalIndex {
    /// Applies one stream message; returns the sequence to read from next.
    fn take(&self, message: &async_nats::jetstream::Message) -> u64 {
        let Ok(info) = message.info() else { return 0 };
        let seq = info.stream_sequence;
        match GoalIndexEntry::decode(message.payload.clone()) {
            Ok(entry) => {
                self.apply(entry, seq);
            }
            Err(e) => warn!(seq, error = %e, "an undecodable goal index entry"),
        }
        seq + 1
    }
}

async fn ordered(
    stream: &stream::Stream,
    filter_subject: String,
    from: u64,
) -> Result<consumer::pull::Ordered> {
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject,
            deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: from.max(1) },
            ..Default::default()
        })
        .await
        .map_err(|e| js("goal index consumer", e))?;
    consumer.messages().await.map_err(|e| js("goal index consumer", e))
}

/// Writes an entry for every stored goal that has none (a goal store from before the index).
async fn backfill(bus: &Bus) -> Result<()> {
    use futures::TryStreamExt as _;
    let goals = bus.goals();
    let keys = hermes_core::bus::kv_keys(goals, "backfill the goal index").await?;
    if keys.is_empty() {
        return Ok(());
    }
    info!(goals = keys.len(), "writing the goal index of goals stored before it existed");
    let topology = bus.topology();
    let written: Vec<()> = futures::stream::iter(keys)
        .map(|key| async move {
            let Some(entry) = goals.entry(&key).await.map_err(|e| js("load goal", e))? else {
                return Ok(());
            };
            if entry.operation != async_nats::jetstream::kv::Operation::Put {
                return Ok(());
            }
            let Ok(state) = GoalState::decode(entry.value) else { return Ok(()) };
            let mut headers = async_nats::HeaderMap::new();
            // Only where the goal has no entry yet: a transition's own entry is newer.
            headers.insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, "0");
            let published = bus
                .jetstream()
                .publish_with_headers(
                    topology.goal_index(&state.goal_id),
                    headers,
                    entry_of(&state).encode_to_vec().into(),
                )
                .await
                .map_err(|e| js("backfill the goal index", e))?;
            // A wrong last sequence means the goal has its entry already.
            let _ = published.await;
            Ok::<(), Error>(())
        })
        .buffer_unordered(64)
        .try_collect()
        .await?;
    info!(goals = written.len(), "goal index written");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, tenant: &str, status: i32, created: u64, session: &str) -> GoalIndexEntry {
        GoalIndexEntry {
            goal_id: id.into(),
            tenant: tenant.into(),
            status,
            created_unix_ms: created,
            session_id: session.into(),
            updated_unix_ms: created,
        }
    }

    fn ids(places: Vec<Place>) -> Vec<String> {
        places.into_iter().map(|(_, id)| id.to_string()).collect()
    }

    #[test]
    fn pages_walk_newest_first_by_tenant_status_and_session() {
        let index = GoalIndex::default();
        index.apply(entry("a", "t1", 2, 10, "s"), 1);
        index.apply(entry("b", "t2", 2, 20, ""), 2);
        index.apply(entry("c", "t1", 3, 30, "s"), 3);
        index.apply(entry("d", "t1", 2, 30, ""), 4);
        let all = PageQuery::default();
        assert_eq!(ids(index.page(&all, 10)), ["d", "c", "b", "a"]);
        assert_eq!(ids(index.page(&all, 2)), ["d", "c"]);
        let after = PageQuery { after: Some((30, "c".into())), ..Default::default() };
        assert_eq!(ids(index.page(&after, 10)), ["b", "a"]);
        let t1 = PageQuery { tenant: Some("t1"), ..Default::default() };
        assert_eq!(ids(index.page(&t1, 10)), ["d", "c", "a"]);
        let t1_running = PageQuery { tenant: Some("t1"), status: Some(2), ..Default::default() };
        assert_eq!(ids(index.page(&t1_running, 10)), ["d", "a"]);
        let running = PageQuery { status: Some(2), ..Default::default() };
        assert_eq!(ids(index.page(&running, 10)), ["d", "b", "a"]);
        let session = PageQuery { session: Some("s"), ..Default::default() };
        assert_eq!(ids(index.page(&session, 10)), ["c", "a"]);
        let nobody = PageQuery { tenant: Some("t3"), ..Default::default() };
        assert!(index.page(&nobody, 10).is_empty());
    }

    #[test]
    fn a_newer_entry_moves_the_goal_and_an_older_one_is_ignored() {
        let index = GoalIndex::default();
        let mut changes = index.subscribe();
        assert!(index.apply(entry("a", "t", 2, 10, ""), 5));
        assert!(index.apply(entry("a", "t", 3, 10, ""), 7));
        assert!(!index.apply(entry("a", "t", 2, 10, ""), 6), "an older entry replaced a newer one");
        assert!(!index.apply(entry("a", "t", 3, 10, ""), 7), "the same entry applied twice");
        let running = PageQuery { status: Some(2), ..Default::default() };
        assert!(index.page(&running, 10).is_empty());
        let done = PageQuery { tenant: Some("t"), status: Some(3), ..Default::default() };
        assert_eq!(ids(index.page(&done, 10)), ["a"]);
        assert_eq!(index.len(), 1);
        assert_eq!(changes.try_recv().unwrap().status, 2);
        assert_eq!(changes.try_recv().unwrap().status, 3);
        assert!(changes.try_recv().is_err(), "an ignored entry was announced");
    }
}
