//! A model provider with limits, for the fleet-wide limiter's tests and bench: an
//! OpenAI-compatible Chat Completions server that answers every request with the same content
//! after a delay, counts requests in flight (and the most seen at once), answers 429 to a request
//! over its concurrency limit, and can be told to answer the next request 429 with a
//! `Retry-After`, as a provider asking for a cooldown does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};

#[derive(Default)]
struct Counters {
    limit: AtomicUsize,
    delay_ms: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    served: AtomicUsize,
    over_limit: AtomicUsize,
    /// Seconds of `Retry-After` for the next request, answered 429 (0: none).
    throttle_next: AtomicU64,
    /// Arrival of each request, and whether it was answered 429 on purpose.
    arrivals: Mutex<Vec<(Instant, bool)>>,
}

/// The running server; stops when dropped.
pub struct LimitedProvider {
    addr: SocketAddr,
    counters: Arc<Counters>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LimitedProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct InFlight(Arc<Counters>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl LimitedProvider {
    /// A provider taking `limit` requests at once, each answered after `delay`.
    pub async fn start(limit: usize, delay: Duration) -> LimitedProvider {
        let counters = Arc::new(Counters::default());
        counters.limit.store(limit, Ordering::SeqCst);
        counters.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/chat/completions", post(complete))
            .with_state(counters.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind provider");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        LimitedProvider { addr, counters, task }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn set_delay(&self, delay: Duration) {
        self.counters.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Requests taken at once from now on; more are answered 429.
    pub fn set_limit(&self, limit: usize) {
        self.counters.limit.store(limit, Ordering::SeqCst);
    }

    /// The next request is answered 429 with `Retry-After: <secs>`.
    pub fn throttle_next(&self, secs: u64) {
        self.counters.throttle_next.store(secs, Ordering::SeqCst);
    }

    /// The most requests it held at once.
    pub fn max_in_flight(&self) -> usize {
        self.counters.max_in_flight.load(Ordering::SeqCst)
    }

    pub fn reset_max_in_flight(&self) {
        self.counters.max_in_flight.store(self.counters.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// Requests answered 200.
    pub fn served(&self) -> usize {
        self.counters.served.load(Ordering::SeqCst)
    }

    /// Requests answered 429 because they went over the concurrency limit.
    pub fn over_limit(&self) -> usize {
        self.counters.over_limit.load(Ordering::SeqCst)
    }

    /// When each request arrived, and whether it was the one answered 429 on purpose.
    pub fn arrivals(&self) -> Vec<(Instant, bool)> {
        self.counters.arrivals.lock().unwrap().clone()
    }
}

async fn complete(State(counters): State<Arc<Counters>>, Json(_body): Json<Value>) -> Response {
    let throttle = counters.throttle_next.swap(0, Ordering::SeqCst);
    counters.arrivals.lock().unwrap().push((Instant::now(), throttle > 0));
    if throttle > 0 {
        let body = Json(json!({"error": {"message": "slow down"}}));
        return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", throttle.to_string())], body)
            .into_response();
    }
    let now = counters.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _guard = InFlight(counters.clone());
    counters.max_in_flight.fetch_max(now, Ordering::SeqCst);
    if now > counters.limit.load(Ordering::SeqCst) {
        counters.over_limit.fetch_add(1, Ordering::SeqCst);
        let body = Json(json!({"error": {"message": "too many requests at once"}}));
        return (StatusCode::TOO_MANY_REQUESTS, body).into_response();
    }
    tokio::time::sleep(Duration::from_millis(counters.delay_ms.load(Ordering::SeqCst))).await;
    counters.served.fetch_add(1, Ordering::SeqCst);
    Json(json!({
        "id": "chatcmpl-limited",
        "object": "chat.completion",
        "model": "limited",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }))
    .into_response()
}
