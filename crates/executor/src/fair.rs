//! The order in which an agent takes work from its consumers: what was routed to it first, then
//! the plain pool and the tenants' lanes by weighted fair queuing (stride scheduling).
//!
//! Each flow (a tenant's lanes, one per task type; the plain pool is the flow `""` of weight 1)
//! has a pass. A slot that frees up takes the next task of the flow with the smallest pass among
//! those with a task waiting, and that flow's pass grows by `1 / weight`, so while several flows
//! have work each gets its weight's share of the slots. A flow that had nothing waiting starts
//! again at the pass of the last task taken (the virtual time): it cannot save up a burst by
//! being idle, nor is it pushed behind the flows that kept busy.
//!
//! The merge holds at most one task per consumer while it waits for a slot (the consumers' own
//! pulls hold no more than the agent's concurrency each), and says whether pooled work was left
//! waiting at the last take: the agent's heartbeat carries it (`backlogged`; a heartbeat goes at
//! once when it turns true), and routing sends such an agent no more directed work, which would
//! otherwise pass the lanes by.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::mpsc;

/// A consumer's messages.
pub(crate) type Source<T> = Pin<Box<dyn Stream<Item = T> + Send>>;

/// The flow of the plain pool (tasks without a tenant).
pub(crate) const PLAIN_POOL: &str = "";

/// A lane that appeared, or a tenant whose weight changed.
pub(crate) enum Change<T> {
    /// Another consumer of `flow` (a tenant's lane of one task type).
    Add {
        flow: String,
        weight: f64,
        source: Source<T>,
    },
    Weight {
        flow: String,
        weight: f64,
    },
}

struct Entry<T> {
    /// `None`: the agent's directed work, taken before any flow.
    flow: Option<String>,
    source: Source<T>,
    peeked: Option<T>,
    /// When `peeked` was taken from the consumer.
    held_since: Option<tokio::time::Instant>,
}

struct Clock {
    weight: f64,
    pass: f64,
    /// The entry the flow was last served from: its consumers (one per task type) take turns.
    last: usize,
}

/// The merged stream of an agent's consumers (see the module's documentation). Errors from a
/// consumer pass through at once; a consumer that ends is dropped.
pub(crate) struct FairMerge<T> {
    entries: Vec<Entry<T>>,
    clocks: HashMap<String, Clock>,
    changes: Option<mpsc::UnboundedReceiver<Change<T>>>,
    /// The pass of the last task taken.
    now: f64,
    /// Where the search for the smallest pass starts, so consumers of one flow take turns.
    rotor: usize,
    backlogged: Arc<AtomicBool>,
    /// Told when `backlogged` turns true, so the agent can say so before its next heartbeat.
    rose: Arc<tokio::sync::Notify>,
    /// A pooled task held this long is taken next, whatever its flow's pass: the server
    /// delivers it again after the consumer's AckWait, and a low weight must not make a task
    /// run twice. `None`: no bound.
    max_hold: Option<std::time::Duration>,
}

impl<T> FairMerge<T> {
    pub(crate) fn new(
        changes: mpsc::UnboundedReceiver<Change<T>>,
        backlogged: Arc<AtomicBool>,
        rose: Arc<tokio::sync::Notify>,
    ) -> Self {
        FairMerge {
            entries: Vec::new(),
            clocks: HashMap::new(),
            changes: Some(changes),
            now: 0.0,
            rotor: 0,
            backlogged,
            rose,
            max_hold: None,
        }
    }

    /// Bounds how long a pooled task may wait here for its turn ([`FairMerge::max_hold`]).
    pub(crate) fn hold_at_most(mut self, max_hold: std::time::Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Adds the agent's directed consumer.
    pub(crate) fn directed(&mut self, source: Source<T>) {
        self.entries.push(Entry { flow: None, source, peeked: None, held_since: None });
    }

    /// Adds a consumer of `flow`, or sets its weight (the latest one given wins).
    pub(crate) fn pooled(&mut self, flow: &str, weight: f64, source: Source<T>) {
        self.weigh(flow, weight);
        self.entries.push(Entry { flow: Some(flow.to_owned()), source, peeked: None, held_since: None });
    }

    fn weigh(&mut self, flow: &str, weight: f64) {
        let now = self.now;
        self.clocks.entry(flow.to_owned()).or_insert(Clock { weight, pass: now, last: 0 }).weight = weight;
    }

    fn apply(&mut self, change: Change<T>) {
        match change {
            Change::Add { flow, weight, source } => self.pooled(&flow, weight, source),
            Change::Weight { flow, weight } => self.weigh(&flow, weight),
        }
    }

    /// The entry to take from next, among those with a task waiting.
    fn choose(&mut self) -> Option<usize> {
        if let Some(directed) = self.entries.iter().position(|e| e.flow.is_none() && e.peeked.is_some()) {
            return Some(directed);
        }
        // A task held too long goes first, the oldest of them; its flow pays for it as usual.
        if let Some(max_hold) = self.max_hold {
            let overdue = (self.entries.iter().enumerate())
                .filter(|(_, e)| e.flow.is_some() && e.peeked.is_some())
                .filter_map(|(i, e)| e.held_since.filter(|at| at.elapsed() >= max_hold).map(|at| (i, at)))
                .min_by_key(|(_, at)| *at);
            if let Some((i, _)) = overdue {
                let flow = self.entries[i].flow.as_deref().expect("a pooled entry");
                let clock = self.clocks.get_mut(flow).expect("every flow has a clock");
                clock.pass = clock.pass.max(self.now) + 1.0 / clock.weight;
                return Some(i);
            }
        }
        let n = self.entries.len();
        let mut best: Option<(usize, f64)> = None;
        for k in 0..n {
            let i = (self.rotor + k) % n;
            let entry = &self.entries[i];
            let (Some(flow), Some(_)) = (&entry.flow, &entry.peeked) else { continue };
            let clock = self.clocks.get_mut(flow).expect("every flow has a clock");
            // A flow that was idle starts at the virtual time, not where it stopped.
            clock.pass = clock.pass.max(self.now);
            if best.is_none_or(|(_, pass)| clock.pass < pass) {
                best = Some((i, clock.pass));
            }
        }
        let (found, pass) = best?;
        let flow = self.entries[found].flow.clone().expect("a pooled entry");
        let clock = self.clocks.get_mut(&flow).expect("every flow has a clock");
        // The flow's next consumer with a task, after the one it was last served from.
        let i = (1..=n)
            .map(|k| (clock.last + k) % n)
            .find(|&i| {
                self.entries[i].flow.as_deref() == Some(flow.as_str()) && self.entries[i].peeked.is_some()
            })
            .unwrap_or(found);
        self.now = pass;
        clock.pass = pass + 1.0 / clock.weight;
        clock.last = i;
        self.rotor = found + 1;
        Some(i)
    }
}

impl<M, E> Stream for FairMerge<Result<M, E>>
where
    M: Unpin,
    E: Unpin,
{
    type Item = Result<M, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        while let Some(changes) = &mut this.changes {
            match changes.poll_recv(cx) {
                Poll::Ready(Some(change)) => this.apply(change),
                Poll::Ready(None) => this.changes = None,
                Poll::Pending => break,
            }
        }
        let mut ended = Vec::new();
        for (i, entry) in this.entries.iter_mut().enumerate() {
            if entry.peeked.is_some() {
                continue;
            }
            match entry.source.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    entry.peeked = Some(Ok(message));
                    entry.held_since = Some(tokio::time::Instant::now());
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => ended.push(i),
                Poll::Pending => {}
            }
        }
        for i in ended.into_iter().rev() {
            this.entries.remove(i);
        }
        if let Some(i) = this.choose() {
            let taken = this.entries[i].peeked.take();
            let waiting = this.entries.iter().any(|e| e.flow.is_some() && e.peeked.is_some());
            if waiting && !this.backlogged.swap(true, Ordering::Relaxed) {
                this.rose.notify_one();
            }
            if !waiting {
                this.backlogged.store(false, Ordering::Relaxed);
            }
            return Poll::Ready(taken);
        }
        this.backlogged.store(false, Ordering::Relaxed);
        if this.entries.is_empty() && this.changes.is_none() {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;

    type Item = Result<String, String>;

    fn endless(name: &'static str) -> Source<Item> {
        Box::pin(futures::stream::iter((0..).map(move |i| Ok(format!("{name}{i}")))))
    }

    fn merge() -> (FairMerge<Item>, mpsc::UnboundedSender<Change<Item>>, Arc<AtomicBool>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let backlogged = Arc::new(AtomicBool::new(false));
        (FairMerge::new(rx, backlogged.clone(), Arc::default()), tx, backlogged)
    }

    async fn take(merge: &mut FairMerge<Item>, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(merge.next().await.unwrap().unwrap());
        }
        out
    }

    fn count(taken: &[String], prefix: &str) -> usize {
        taken.iter().filter(|t| t.starts_with(prefix)).count()
    }

    #[tokio::test]
    async fn backlogged_flows_share_the_slots_by_weight() {
        let (mut merge, _tx, backlogged) = merge();
        merge.pooled("gold", 3.0, endless("g"));
        merge.pooled("tin", 1.0, endless("t"));
        merge.pooled(PLAIN_POOL, 1.0, endless("p"));
        let taken = take(&mut merge, 500).await;
        assert_eq!((count(&taken, "g"), count(&taken, "t"), count(&taken, "p")), (300, 100, 100));
        assert!(backlogged.load(Ordering::Relaxed), "work was left waiting");
        // Any window is close to 3:1:1 too, not only the whole run.
        let window = &taken[100..150];
        assert!((29..=31).contains(&count(window, "g")), "{window:?}");
    }

    #[tokio::test]
    async fn a_flows_consumers_of_several_task_types_share_its_weight() {
        let (mut merge, _tx, _) = merge();
        merge.pooled("a", 1.0, endless("a-x"));
        merge.pooled("a", 1.0, endless("a-y"));
        merge.pooled("b", 1.0, endless("b"));
        let taken = take(&mut merge, 100).await;
        assert_eq!(count(&taken, "b"), 50, "tenant b is not outweighed by a's two task types");
        assert_eq!(count(&taken, "a-x"), 25);
    }

    #[tokio::test]
    async fn directed_work_comes_first_and_a_lane_that_appears_joins_at_the_current_pass() {
        let (mut merge, tx, _) = merge();
        merge.pooled("old", 1.0, endless("o"));
        merge.directed(Box::pin(futures::stream::iter(vec![Ok("d0".to_owned()), Ok("d1".to_owned())])));
        let first = take(&mut merge, 12).await;
        assert_eq!(&first[..2], ["d0", "d1"], "directed work first");
        // A lane that appears after 10 of the old one's tasks gets half from now on, not a
        // burst making up for the 10 it did not ask for.
        tx.send(Change::Add { flow: "new".into(), weight: 1.0, source: endless("n") }).unwrap();
        let next = take(&mut merge, 20).await;
        assert!((10..=11).contains(&count(&next, "n")), "{next:?}");
        // A weight that changes applies to what comes next.
        tx.send(Change::Weight { flow: "new".into(), weight: 4.0 }).unwrap();
        let after = take(&mut merge, 50).await;
        assert!((39..=41).contains(&count(&after, "n")), "{after:?}");
    }

    /// A weight of 1 beside one of 1000 would leave the light flow's held task waiting past the
    /// consumer's AckWait; held for `max_hold`, it goes next.
    #[tokio::test(start_paused = true)]
    async fn a_task_held_too_long_goes_next_whatever_its_weight() {
        let (merge, _tx, _) = merge();
        let mut merge = merge.hold_at_most(std::time::Duration::from_secs(15));
        merge.pooled("heavy", 1000.0, endless("h"));
        merge.pooled("light", 1.0, endless("l"));
        let first = take(&mut merge, 3).await;
        assert_eq!(count(&first, "l"), 1, "{first:?}");
        let soon = take(&mut merge, 50).await;
        assert_eq!(count(&soon, "l"), 0, "{soon:?}");
        tokio::time::advance(std::time::Duration::from_secs(16)).await;
        let later = take(&mut merge, 1).await;
        assert_eq!(later, ["l1"], "the light flow's held task, overdue, goes first");
    }

    #[tokio::test]
    async fn an_error_passes_through_and_an_ended_consumer_is_dropped() {
        let (mut merge, tx, backlogged) = merge();
        merge.pooled(
            "a",
            1.0,
            Box::pin(futures::stream::iter(vec![Err("lost".to_owned()), Ok("a0".into())])),
        );
        assert_eq!(merge.next().await.unwrap(), Err("lost".to_owned()));
        assert_eq!(merge.next().await.unwrap(), Ok("a0".to_owned()));
        assert!(!backlogged.load(Ordering::Relaxed));
        drop(tx);
        assert!(merge.next().await.is_none(), "no consumer and no lane to come: the merge ends");
    }
}
