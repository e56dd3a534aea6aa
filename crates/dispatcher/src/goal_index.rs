//! The goal index: which goals exist, newest first, by tenant and by status, so that a page of
//! `ListGoals` reads the hundred goals it shows and not every goal stored.
//!
//! **Stored with the goal.** Every write of a goal to the `hermes_goals` bucket (`store.rs`)
//! carries the goal's [`GoalIndexEntry`] in its headers (`Hermes-Goal-Status`, `-Created`,
//! `-Tenant`, `-Session`): nothing is written beside the goal, and the index is never behind or
//! ahead of what is stored.
//!
//! **Held.** Every dispatcher reads the bucket's stream at start, headers only, before its API
//! serves, and follows it, keeping sorted sets of `(created, goal id)` in memory: all goals, each
//! tenant's, each status's and each tenant's in each status. A page is a walk down one set from
//! the page token, so it costs the same with a hundred goals stored or a million. What a replica
//! writes it applies at once, so a goal it accepted is in its next list. Entries carry their
//! stream sequence and an older one never replaces a newer.
//!
//! **After a reconnect** the index reads the bucket again ([`GoalIndex::reread`]): a nats-server
//! killed before it wrote its last acknowledged messages to its files comes back without them,
//! and gives their sequence numbers to new writes, which the index would take for older writes
//! of their goals and ignore.
//!
//! **Changes.** A goal created or changing status is also sent to [`GoalIndex::subscribe`]rs:
//! `GET /v1/changes`, which the console's Goals page follows instead of polling.
//!
//! **Upgrade.** A goal last written by an older release has no such headers: its entry is read
//! from the goal itself, once, when the index meets it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use async_nats::jetstream::{consumer, kv, stream};
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
    /// Asks the follower to read the bucket again from its start ([`GoalIndex::reread`]).
    reread: Arc<tokio::sync::Notify>,
}

impl Default for GoalIndex {
    fn default() -> Self {
        Self {
            sets: Arc::default(),
            changes: broadcast::channel(1024).0,
            approvals: broadcast::channel(256).0,
            reread: Arc::default(),
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
    /// Returns whether it was applied; a new goal or status is also sent to subscribers.
    pub fn apply(&self, entry: GoalIndexEntry, seq: u64) -> bool {
        let changed = {
            let Ok(mut sets) = self.sets.write() else { return false };
            if let Some(old) = sets.goals.get_mut(entry.goal_id.as_str()) {
                if old.seq >= seq {
                    return false;
                }
                // Most writes (a node's result, say) leave the goal where it is listed.
                if old.status == entry.status
                    && old.created == entry.created_unix_ms
                    && *old.tenant == *entry.tenant
                    && *old.session == *entry.session_id
                {
                    old.seq = seq;
                    return true;
                }
            }
            let id: Arc<str> = match sets.goals.get_key_value(entry.goal_id.as_str()) {
                Some((id, _)) => id.clone(),
                None => Arc::from(entry.goal_id.as_str()),
            };
            let old = sets.goals.remove(&id);
            let changed = old.as_ref().is_none_or(|old| old.status != entry.status);
            if let Some(old) = old {
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
            changed
        };
        // Only a new goal or a new status is news; nobody listening is not an error.
        if changed {
            let _ = self.changes.send(Arc::new(entry));
        }
        true
    }

    /// Removes a goal deleted from the bucket (stream sequence `seq`).
    fn remove(&self, goal_id: &str, seq: u64) {
        let Ok(mut sets) = self.sets.write() else { return };
        let Some((id, old)) = sets.goals.remove_entry(goal_id) else { return };
        if old.seq >= seq {
            sets.goals.insert(id, old);
            return;
        }
        sets.unlink(&id, &old);
    }

    /// Begins reading the bucket again over what the index holds: every entry forgets its
    /// stream sequence, so whatever is applied next replaces it, whether the pass reads it or
    /// this replica writes it meanwhile. (A write the server lost may have left a sequence above
    /// anything the bucket now holds.)
    fn forget_seqs(&self) {
        let Ok(mut sets) = self.sets.write() else { return };
        sets.goals.values_mut().for_each(|g| g.seq = 0);
    }

    /// Ends a pass read to the stream's end: removes the goals nothing was applied to since it
    /// began, which the bucket no longer holds.
    fn sweep(&self) {
        let Ok(mut sets) = self.sets.write() else { return };
        let gone: Vec<Arc<str>> =
            sets.goals.iter().filter(|(_, g)| g.seq == 0).map(|(id, _)| id.clone()).collect();
        for id in gone {
            if let Some(old) = sets.goals.remove(&id) {
                sets.unlink(&id, &old);
            }
        }
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

    /// Every indexed goal that has not ended (its status is not terminal), oldest first: what
    /// the timers' minute rescan reads instead of the whole bucket.
    pub fn unfinished(&self) -> Vec<String> {
        let Ok(sets) = self.sets.read() else { return Vec::new() };
        let mut places: Vec<&Place> = sets
            .by_status
            .iter()
            .filter(|(status, _)| !crate::engine::is_terminal(**status))
            .flat_map(|(_, set)| set.iter())
            .collect();
        places.sort();
        places.into_iter().map(|(_, id)| id.to_string()).collect()
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

    /// Reads the goals bucket's stream, headers only, up to its end at the call, then follows it
    /// until `stop`.
    pub async fn open(bus: &Bus, stop: CancellationToken) -> Result<GoalIndex> {
        let index = GoalIndex::default();
        let goals = bus.goals().clone();
        let stream = goals.stream.clone();
        let filter = format!("{}>", goals.prefix);
        let (mut messages, mut next) = index.load(&goals, &stream, &filter, false).await?;
        info!(goals = index.len(), "goal index loaded");
        let follower = index.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = follower.reread.notified() => {
                        match follower.load(&goals, &stream, &filter, true).await {
                            Ok((fresh_messages, fresh_next)) => {
                                (messages, next) = (fresh_messages, fresh_next);
                                info!(goals = follower.len(), "goal index read again");
                            }
                            Err(e) => {
                                warn!(error = %e, "cannot read the goal index again; trying again");
                                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                                follower.reread.notify_one();
                            }
                        }
                    }
                    message = messages.next() => match message {
                        Some(Ok(message)) => next = follower.take(&goals, &message).await.max(next),
                        Some(Err(e)) => {
                            warn!(error = %e, "the goal index follower failed; reading again after the last goal");
                            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                            match ordered(&stream, filter.clone(), next).await {
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

impl GoalIndex {
    /// Reads the bucket's stream from its start up to its end at the call into this index; returns
    /// the consumer, to follow on from, and the sequence it reads next. `again`: the index
    /// already holds goals, and what is read replaces them in place (lists keep answering
    /// meanwhile, and the index is not held twice): each goal as the bucket holds it now, and
    /// the goals it no longer holds removed.
    async fn load(
        &self,
        goals: &kv::Store,
        stream: &stream::Stream,
        filter: &str,
        again: bool,
    ) -> Result<(consumer::pull::Ordered, u64)> {
        let last = stream.clone().info().await.map_err(|e| js("goal index info", e))?.state.last_sequence;
        let mut messages = ordered(stream, filter.to_owned(), 1).await?;
        let mut next = 1;
        if again {
            self.forget_seqs();
        }
        // Read up to what was there at start before answering: a list never misses an old goal.
        while next <= last {
            match tokio::time::timeout(std::time::Duration::from_secs(10), messages.next()).await {
                Ok(Some(Ok(message))) => next = self.take(goals, &message).await.max(next),
                Ok(Some(Err(e))) => return Err(js("read the goal index", e)),
                Ok(None) | Err(_) => break,
            }
        }
        match (again, next > last) {
            (true, true) => self.sweep(),
            (true, false) => warn!(
                next,
                last, "the goal index was not read to its end again; goals the bucket lost stay listed"
            ),
            (false, _) => {}
        }
        Ok((messages, next))
    }

    /// Has the follower read the bucket again from its start, as at open, and hold what it reads
    /// then instead of what it held (in place, see `load`). After a reconnect the bucket may not
    /// be what the index read: a nats-server that was killed can come back without the last
    /// writes it had acknowledged (when no replica holds them), and gives their sequence numbers
    /// to new writes, which the index would take for older writes of their goals and ignore.
    pub fn reread(&self) {
        self.reread.notify_one();
    }
}

fn js(operation: &'static str, e: impl std::fmt::Display) -> Error {
    Error::JetStream { operation, reason: e.to_string() }
}

impl GoalIndex {
    /// Applies one message of the goals bucket (headers only); returns the sequence to read from
    /// next.
    async fn take(&self, goals: &kv::Store, message: &async_nats::jetstream::Message) -> u64 {
        let Ok(info) = message.info() else { return 0 };
        let seq = info.stream_sequence;
        let Some(goal_id) = message.subject.as_str().strip_prefix(goals.prefix.as_str()) else {
            return seq + 1;
        };
        let headers = message.headers.as_ref();
        let operation = headers.and_then(|h| h.get("KV-Operation")).map(|v| v.as_str());
        if matches!(operation, Some("DEL") | Some("PURGE")) {
            self.remove(goal_id, seq);
            return seq + 1;
        }
        match headers.and_then(from_headers) {
            Some(mut entry) => {
                entry.goal_id = goal_id.to_owned();
                self.apply(entry, seq);
            }
            // Written by an older release: the entry is read from the goal.
            None => match goals.entry(goal_id).await {
                Ok(Some(stored)) if stored.operation == kv::Operation::Put => {
                    match GoalState::decode(stored.value) {
                        Ok(state) => {
                            self.apply(entry_of(&state), stored.revision);
                        }
                        Err(e) => warn!(goal_id, error = %e, "an undecodable goal is not listed"),
                    }
                }
                Ok(_) => {}
                Err(e) => warn!(goal_id, error = %e, "cannot read a goal to index it"),
            },
        }
        seq + 1
    }
}

const STATUS: &str = "Hermes-Goal-Status";
const CREATED: &str = "Hermes-Goal-Created";
const TENANT: &str = "Hermes-Goal-Tenant";
const SESSION: &str = "Hermes-Goal-Session";

/// The headers a goal's write carries: its index entry (its id is the key).
pub fn headers(entry: &GoalIndexEntry) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(STATUS, entry.status.to_string().as_str());
    headers.insert(CREATED, entry.created_unix_ms.to_string().as_str());
    // Tenants are words and sessions dotted words: safe as header values.
    if !entry.tenant.is_empty() {
        headers.insert(TENANT, entry.tenant.as_str());
    }
    if !entry.session_id.is_empty() {
        headers.insert(SESSION, entry.session_id.as_str());
    }
    headers
}

/// The entry [`headers`] wrote (without the goal id), or `None` without them.
fn from_headers(headers: &async_nats::HeaderMap) -> Option<GoalIndexEntry> {
    let text = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
    Some(GoalIndexEntry {
        goal_id: String::new(),
        status: text(STATUS)?.parse().ok()?,
        created_unix_ms: text(CREATED)?.parse().ok()?,
        tenant: text(TENANT).unwrap_or_default(),
        session_id: text(SESSION).unwrap_or_default(),
        updated_unix_ms: 0,
    })
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
            headers_only: true,
            ..Default::default()
        })
        .await
        .map_err(|e| js("goal index consumer", e))?;
    consumer.messages().await.map_err(|e| js("goal index consumer", e))
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
    fn the_unfinished_goals_are_those_not_in_a_terminal_status() {
        use hermes_proto::GoalStatus::*;
        let index = GoalIndex::default();
        for (i, (id, status)) in [
            ("run", Running),
            ("done", Completed),
            ("sum", Summarizing),
            ("fail", Failed),
            ("plan", Planning),
        ]
        .into_iter()
        .enumerate()
        {
            index.apply(entry(id, "t", status as i32, i as u64, ""), i as u64 + 1);
        }
        assert_eq!(index.unfinished(), ["run", "sum", "plan"]);
        // A goal that ends leaves them.
        index.apply(entry("run", "t", Completed as i32, 0, ""), 10);
        assert_eq!(index.unfinished(), ["sum", "plan"]);
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
        assert!(index.apply(entry("a", "t", 3, 10, ""), 8), "a newer write in the same status");
        assert!(!index.apply(entry("a", "t", 2, 10, ""), 6), "an older entry replaced a newer one");
        assert!(!index.apply(entry("a", "t", 3, 10, ""), 7), "the same entry applied twice");
        let running = PageQuery { status: Some(2), ..Default::default() };
        assert!(index.page(&running, 10).is_empty());
        let done = PageQuery { tenant: Some("t"), status: Some(3), ..Default::default() };
        assert_eq!(ids(index.page(&done, 10)), ["a"]);
        assert_eq!(index.len(), 1);
        assert_eq!(changes.try_recv().unwrap().status, 2);
        assert_eq!(changes.try_recv().unwrap().status, 3);
        assert!(changes.try_recv().is_err(), "an ignored entry, or one in the same status, was announced");
        index.remove("a", 7);
        assert_eq!(index.len(), 1, "an older delete removed a newer goal");
        index.remove("a", 9);
        assert!(index.is_empty());
        assert!(index.page(&PageQuery::default(), 10).is_empty());
    }

    #[test]
    fn a_pass_holds_what_the_bucket_holds_now_and_keeps_what_is_newer_than_it() {
        use hermes_proto::GoalStatus::*;
        let index = GoalIndex::default();
        // Before the pass: a goal cancelled at 12, a write the server then lost (the bucket now
        // ends at 10); one the bucket lost altogether; one written again during the pass.
        index.apply(entry("cancelled", "t", Cancelled as i32, 1, ""), 12);
        index.apply(entry("lost", "t", Running as i32, 2, ""), 9);
        index.apply(entry("newer", "t", Planning as i32, 3, ""), 5);
        index.forget_seqs();
        // This replica writes a goal while the pass reads (at 13, past the bucket's end).
        assert!(index.apply(entry("newer", "t", Running as i32, 3, ""), 13));
        // The pass reads the goal as the bucket now holds it, at a lower sequence than the lost
        // write had: it replaces it.
        assert!(index.apply(entry("cancelled", "t", Completed as i32, 1, ""), 7));
        // An older write of a goal applied after the pass began does not replace it.
        assert!(!index.apply(entry("newer", "t", Planning as i32, 3, ""), 6));
        index.sweep();
        let all = PageQuery::default();
        assert_eq!(ids(index.page(&all, 10)), ["newer", "cancelled"], "the lost goal stays listed");
        let completed = PageQuery { status: Some(Completed as i32), ..Default::default() };
        assert_eq!(ids(index.page(&completed, 10)), ["cancelled"]);
        assert_eq!(index.unfinished(), ["newer"]);
    }

    #[test]
    fn the_headers_carry_the_entry() {
        let written = entry("", "team-a", 3, 1_700_000_000_123, "chat.1");
        let read = from_headers(&headers(&written)).unwrap();
        assert_eq!(GoalIndexEntry { updated_unix_ms: written.updated_unix_ms, ..read }, written);
        let unscoped = entry("", "", 2, 5, "");
        assert_eq!(
            from_headers(&headers(&unscoped)).unwrap(),
            GoalIndexEntry { updated_unix_ms: 0, ..unscoped }
        );
        assert!(
            from_headers(&async_nats::HeaderMap::new()).is_none(),
            "no headers: an older release's write"
        );
    }
}
