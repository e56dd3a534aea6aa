//! How many goal event streams (gRPC `WatchGoal`, SSE, WebSocket) each client holds open. The
//! streams share the dispatcher's one reader of goal events (see `fanout`), but each still holds
//! a connection, a task and a cursor, so without a cap one client could take them all. A client
//! over its cap gets `LIMIT_EXCEEDED` (gRPC `RESOURCE_EXHAUSTED`, HTTP 429) naming the cap;
//! closing a stream frees its place. Beside the per-client cap a global one
//! (`dispatcher.max_watches`) bounds them all, so many clients together cannot exhaust the
//! dispatcher either.
//!
//! A client is its peer IP address until the API authenticates callers.

use std::sync::Arc;

use dashmap::DashMap;
use hermes_core::Error;

/// Open streams by client, under a cap.
#[derive(Debug)]
pub struct WatchLimits {
    per_client: usize,
    total: usize,
    open: DashMap<String, usize>,
    all: std::sync::atomic::AtomicUsize,
}

/// One open stream's place; dropping it frees the place.
#[derive(Debug)]
pub struct WatchPermit {
    limits: Arc<WatchLimits>,
    client: String,
}

impl WatchLimits {
    /// Caps of `per_client` streams for each client and `total` for all of them together.
    pub fn new(per_client: usize, total: usize) -> Arc<WatchLimits> {
        Arc::new(WatchLimits {
            per_client: per_client.max(1),
            total: total.max(1),
            open: DashMap::new(),
            all: Default::default(),
        })
    }

    /// A place for one more stream of `client`, or `LIMIT_EXCEEDED` when it holds its cap or
    /// the dispatcher holds its global one.
    pub fn acquire(self: &Arc<Self>, client: &str) -> Result<WatchPermit, Error> {
        use std::sync::atomic::Ordering;
        let mut open = self.open.entry(client.to_owned()).or_insert(0);
        if *open >= self.per_client {
            return Err(Error::LimitExceeded(format!(
                "this client already has {} goal event streams open, its limit (dispatcher.max_watches_per_client); close one first",
                self.per_client
            )));
        }
        // Taken under the client's entry lock, so the two counts move together.
        if self
            .all
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.total).then_some(n + 1))
            .is_err()
        {
            // Leave no empty entry behind for a client that never got a place.
            drop(open);
            self.open.remove_if(client, |_, open| *open == 0);
            return Err(Error::LimitExceeded(format!(
                "the dispatcher already has {} goal event streams open, its limit (dispatcher.max_watches); try again later",
                self.total
            )));
        }
        *open += 1;
        Ok(WatchPermit { limits: self.clone(), client: client.to_owned() })
    }

    /// Streams open across all clients.
    pub fn total_open(&self) -> usize {
        self.all.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Streams `client` holds open.
    pub fn open(&self, client: &str) -> usize {
        self.open.get(client).map(|n| *n).unwrap_or(0)
    }
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        let emptied = match self.limits.open.get_mut(&self.client) {
            Some(mut open) => {
                *open = open.saturating_sub(1);
                *open == 0
            }
            None => false,
        };
        self.limits.all.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        if emptied {
            self.limits.open.remove_if(&self.client, |_, open| *open == 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_its_cap_and_no_more_and_a_closed_stream_frees_a_place() {
        let limits = WatchLimits::new(2, 100);
        let a = limits.acquire("10.0.0.1").unwrap();
        let _b = limits.acquire("10.0.0.1").unwrap();
        let refused = limits.acquire("10.0.0.1").unwrap_err();
        assert_eq!(refused.code(), hermes_core::ErrorCode::LimitExceeded);
        assert!(refused.to_string().contains("limit (dispatcher.max_watches_per_client)"), "{refused}");
        // Another client is not affected.
        let _other = limits.acquire("10.0.0.2").unwrap();
        drop(a);
        assert_eq!(limits.open("10.0.0.1"), 1);
        let _c = limits.acquire("10.0.0.1").unwrap();
        assert_eq!(limits.open("10.0.0.1"), 2);
    }

    #[test]
    fn the_global_cap_bounds_all_clients_together() {
        let limits = WatchLimits::new(2, 3);
        let _a = limits.acquire("10.0.0.1").unwrap();
        let b = limits.acquire("10.0.0.2").unwrap();
        let _c = limits.acquire("10.0.0.3").unwrap();
        let refused = limits.acquire("10.0.0.4").unwrap_err();
        assert_eq!(refused.code(), hermes_core::ErrorCode::LimitExceeded);
        assert!(refused.to_string().contains("(dispatcher.max_watches)"), "{refused}");
        // A refusal takes no place, from the client or the total.
        assert_eq!(limits.open("10.0.0.4"), 0);
        assert_eq!(limits.total_open(), 3);
        drop(b);
        let _d = limits.acquire("10.0.0.4").unwrap();
        assert_eq!(limits.total_open(), 3);
    }
}
