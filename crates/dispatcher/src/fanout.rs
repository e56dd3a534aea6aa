//! One reader of goal events per dispatcher, fanned out in-process to every watcher.
//!
//! Every goal event stream (gRPC `WatchGoal`, SSE, WebSocket) reads from a [`Feed`]: the goal's
//! events in stream order, shared by all of this dispatcher's watchers of that goal. The
//! [`EventHub`] fills the feeds:
//!
//! - **Live events** come from one ordered JetStream consumer on all goal events, started at the
//!   first watch. It hands each event to the feed of its goal, if this dispatcher has one; events
//!   of goals nobody here watches are skipped without being decoded.
//! - **History** is read once per feed, when its first watcher arrives, by direct message gets by
//!   subject and sequence: no consumer at all.
//!
//! So the server-side cost of watching is one consumer per dispatcher however many watchers and
//! goals there are, and a goal's history is read once however many watchers replay it.
//!
//! No event is lost between the history and the live tail: a feed is registered before its
//! history is read, so every event published after the read began is also handed to it live,
//! and the two are merged by stream sequence, which also removes the overlap. If the live reader
//! fails, every feed fails with `UNAVAILABLE` and is dropped; watchers resume from their last
//! `seq` on a fresh feed, so a failure costs a reconnect, never an event.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use dashmap::DashMap;
use futures::StreamExt;
use hermes_core::{Bus, Error, Result};
use hermes_proto::Event;
use tokio::sync::{OnceCell, watch};
use tracing::{debug, warn};

/// How long the live reader waits before reading again after a failure.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The dispatcher's live reader of goal events and the feeds it fills.
pub struct EventHub {
    bus: Bus,
    feeds: Arc<DashMap<String, FeedEntry>>,
    live: OnceCell<()>,
}

struct FeedEntry {
    feed: Arc<Feed>,
    watchers: usize,
}

/// One goal's events, in stream order, shared by its watchers on this dispatcher.
pub struct Feed {
    state: Mutex<FeedState>,
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct FeedState {
    /// False until the history is read; watchers wait for it.
    loaded: bool,
    events: Vec<Arc<Event>>,
    /// The stream sequence of the newest event in `events`.
    last_stream_seq: u64,
    /// Live events that came while the history was being read, by the stream sequence of the
    /// message that holds them (one message holds a transition's events).
    early: BTreeMap<u64, Vec<Arc<Event>>>,
    failed: Option<String>,
}

/// A watcher's hold on a feed: while any exists the feed is kept and filled.
pub struct FeedLease {
    feeds: Arc<DashMap<String, FeedEntry>>,
    goal_id: String,
    pub feed: Arc<Feed>,
}

impl EventHub {
    pub fn new(bus: Bus) -> Self {
        Self { bus, feeds: Arc::new(DashMap::new()), live: OnceCell::new() }
    }

    /// A lease on `goal_id`'s feed, starting the live reader and reading the goal's history the
    /// first time. The feed may still be loading; [`Feed::next`] waits for it.
    pub async fn subscribe(&self, goal_id: &str) -> Result<FeedLease> {
        self.live.get_or_try_init(|| self.start_live()).await?;
        let mut first = false;
        let feed = {
            let mut entry = self.feeds.entry(goal_id.to_owned()).or_insert_with(|| {
                first = true;
                FeedEntry {
                    feed: Arc::new(Feed { state: Mutex::default(), changed: watch::channel(0).0 }),
                    watchers: 0,
                }
            });
            entry.watchers += 1;
            entry.feed.clone()
        };
        let lease = FeedLease { feeds: self.feeds.clone(), goal_id: goal_id.to_owned(), feed: feed.clone() };
        if first {
            // Read in a task of its own, so that the first watcher leaving does not strand the
            // others on a half-read history.
            let (bus, feeds, goal_id) = (self.bus.clone(), self.feeds.clone(), goal_id.to_owned());
            tokio::spawn(async move {
                if let Err(e) = load_history(&bus, &goal_id, &feed).await {
                    warn!(goal_id, error = %e, "reading a goal's event history failed");
                    feed.fail(e.to_string());
                    feeds.remove_if(&goal_id, |_, entry| Arc::ptr_eq(&entry.feed, &feed));
                }
            });
        }
        Ok(lease)
    }

    /// Creates the one consumer on all goal events, from the next event on, and spawns the task
    /// that hands its events to the feeds.
    async fn start_live(&self) -> Result<()> {
        let stream = events_stream(&self.bus).await?;
        let next = stream.cached_info().state.last_sequence + 1;
        let messages = live_messages(&stream, &self.bus, next).await?;
        let feeds = self.feeds.clone();
        let prefix = self.bus.topology().event("");
        tokio::spawn(run_live(stream, self.bus.clone(), feeds, prefix, messages, next));
        Ok(())
    }
}

async fn events_stream(bus: &Bus) -> Result<async_nats::jetstream::stream::Stream> {
    bus.jetstream()
        .get_stream(bus.topology().events_stream())
        .await
        .map_err(|e| unavailable("events stream", &e))
}

async fn live_messages(
    stream: &async_nats::jetstream::stream::Stream,
    bus: &Bus,
    from_seq: u64,
) -> Result<pull::Ordered> {
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: bus.topology().all_events(),
            deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: from_seq },
            ..Default::default()
        })
        .await
        .map_err(|e| unavailable("events consumer", &e))?;
    consumer.messages().await.map_err(|e| unavailable("events", &e))
}

/// The live reader: hands each event to its goal's feed. On a failure every feed fails (their
/// watchers resume on fresh feeds) and reading starts again after the last event seen.
async fn run_live(
    stream: async_nats::jetstream::stream::Stream,
    bus: Bus,
    feeds: Arc<DashMap<String, FeedEntry>>,
    prefix: String,
    mut messages: pull::Ordered,
    mut next: u64,
) {
    loop {
        while let Some(message) = messages.next().await {
            let error = match message {
                Ok(msg) => {
                    let Ok(info) = msg.info() else { continue };
                    next = info.stream_sequence + 1;
                    let Some(goal_id) = msg.subject.as_str().strip_prefix(prefix.as_str()) else { continue };
                    let Some(feed) = feeds.get(goal_id).map(|entry| entry.feed.clone()) else { continue };
                    // Events are written only by dispatchers; skip anything else.
                    if let Ok(events) = hermes_core::events::decode(&msg.payload) {
                        feed.push(info.stream_sequence, events.into_iter().map(Arc::new).collect());
                    }
                    continue;
                }
                Err(e) => e.to_string(),
            };
            warn!(error, "the live reader of goal events failed; its watchers resume");
            break;
        }
        for entry in feeds.iter() {
            entry.feed.fail("the dispatcher's reader of goal events failed; resume from the last seq".into());
        }
        feeds.clear();
        loop {
            tokio::time::sleep(RETRY_AFTER).await;
            match live_messages(&stream, &bus, next).await {
                Ok(fresh) => {
                    messages = fresh;
                    break;
                }
                Err(e) => debug!(error = %e, "the live reader of goal events is still down"),
            }
        }
    }
}

/// Reads the goal's stored events one by one, by subject and sequence, into the feed, then
/// merges the live events that came meanwhile.
async fn load_history(bus: &Bus, goal_id: &str, feed: &Feed) -> Result<()> {
    use async_nats::jetstream::stream::RawMessageErrorKind;
    let stream = events_stream(bus).await?;
    let subject = bus.topology().event(goal_id);
    let mut history = Vec::new();
    let mut seq = 1;
    loop {
        match stream.get_first_raw_message_by_subject(&subject, seq).await {
            Ok(msg) => {
                seq = msg.sequence + 1;
                if let Ok(events) = hermes_core::events::decode(&msg.payload) {
                    history.push((msg.sequence, events.into_iter().map(Arc::new).collect()));
                }
            }
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
            Err(e) => return Err(unavailable("goal event history", &e)),
        }
    }
    feed.loaded(history);
    Ok(())
}

fn unavailable(what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::Unavailable(format!("{what}: {e}"))
}

impl Feed {
    fn lock(&self) -> MutexGuard<'_, FeedState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|version| *version += 1);
    }

    /// A live message's events: kept aside while the history loads, appended after.
    fn push(&self, stream_seq: u64, events: Vec<Arc<Event>>) {
        {
            let mut state = self.lock();
            if !state.loaded {
                state.early.insert(stream_seq, events);
                return;
            }
            if stream_seq <= state.last_stream_seq {
                return;
            }
            state.events.extend(events);
            state.last_stream_seq = stream_seq;
        }
        self.notify();
    }

    fn loaded(&self, history: Vec<(u64, Vec<Arc<Event>>)>) {
        {
            let mut state = self.lock();
            let early = std::mem::take(&mut state.early);
            for (stream_seq, events) in history.into_iter().chain(early) {
                if stream_seq > state.last_stream_seq {
                    state.events.extend(events);
                    state.last_stream_seq = stream_seq;
                }
            }
            state.loaded = true;
        }
        self.notify();
    }

    fn fail(&self, reason: String) {
        self.lock().failed.get_or_insert(reason);
        self.notify();
    }

    /// The event at `index` in stream order, waiting for it; `UNAVAILABLE` once the feed failed.
    pub async fn next(&self, index: usize) -> Result<Arc<Event>> {
        let mut changed = self.changed.subscribe();
        loop {
            changed.borrow_and_update();
            {
                let state = self.lock();
                if state.loaded
                    && let Some(event) = state.events.get(index)
                {
                    return Ok(event.clone());
                }
                if let Some(reason) = &state.failed {
                    return Err(Error::Unavailable(reason.clone()));
                }
            }
            if changed.changed().await.is_err() {
                return Err(Error::Unavailable("the goal's event feed closed".into()));
            }
        }
    }
}

impl Drop for FeedLease {
    fn drop(&mut self) {
        let emptied = match self.feeds.get_mut(&self.goal_id) {
            Some(mut entry) if Arc::ptr_eq(&entry.feed, &self.feed) => {
                entry.watchers = entry.watchers.saturating_sub(1);
                entry.watchers == 0
            }
            _ => false,
        };
        if emptied {
            self.feeds.remove_if(&self.goal_id, |_, entry| entry.watchers == 0);
        }
    }
}
