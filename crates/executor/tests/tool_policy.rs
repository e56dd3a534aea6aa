//! Tool timeouts, retries with backoff and the circuit breaker, with real tools built for the test.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use hermes_executor::tool::{BreakerState, RetryPolicy};
use hermes_executor::{Tool, ToolContext, ToolError, ToolRegistry};
use serde_json::{Value, json};

const POLICY: RetryPolicy = RetryPolicy {
    attempts: 3,
    backoff: Duration::from_millis(40),
    breaker_threshold: 5,
    breaker_cooldown: Duration::from_millis(300),
};

/// Hangs until its timeout, or fails, counting its runs.
struct Flaky {
    name: &'static str,
    hang: bool,
    runs: Arc<AtomicU32>,
}

impl Tool for Flaky {
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        "test tool"
    }
    fn params_schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn timeout(&self) -> Duration {
        Duration::from_millis(50)
    }
    fn retry_policy(&self) -> RetryPolicy {
        POLICY
    }
    fn run<'a>(&'a self, _args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let hang = self.hang;
        Box::pin(async move {
            if hang {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            Err(ToolError::failed("the backend said no"))
        })
    }
}

fn registry(tool: Flaky) -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    registry.register(Arc::new(tool)).unwrap();
    registry
}

fn ctx() -> ToolContext {
    ToolContext { workspace: std::env::temp_dir(), task: None }
}

#[tokio::test]
async fn a_hung_tool_times_out_and_is_retried_with_backoff() {
    let runs = Arc::new(AtomicU32::new(0));
    let tools = registry(Flaky { name: "test.hang", hang: true, runs: runs.clone() });
    let started = Instant::now();
    let err = tools.call("test.hang", json!({}), &ctx()).await.unwrap_err();
    assert_eq!(err.code.as_str(), "TIMEOUT");
    assert!(err.message.contains("did not finish within 50 ms"), "{}", err.message);
    assert_eq!(runs.load(Ordering::SeqCst), 3, "three tries");
    // 3 × 50 ms of timeouts plus 40 ms and 80 ms of backoff.
    assert!(started.elapsed() >= Duration::from_millis(270), "{:?}", started.elapsed());
}

#[tokio::test]
async fn five_failures_open_the_breaker_and_the_next_call_fails_fast() {
    let runs = Arc::new(AtomicU32::new(0));
    let tools = registry(Flaky { name: "test.fail", hang: false, runs: runs.clone() });
    for _ in 0..5 {
        let err = tools.call("test.fail", json!({}), &ctx()).await.unwrap_err();
        assert_eq!(err.code.as_str(), "TOOL_ERROR");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5, "TOOL_ERROR is not retried");
    assert_eq!(tools.breaker_state("test.fail"), Some(BreakerState::Open));
    let started = Instant::now();
    let err = tools.call("test.fail", json!({}), &ctx()).await.unwrap_err();
    assert!(err.message.contains("circuit breaker opened after 5 consecutive failures"), "{}", err.message);
    assert!(started.elapsed() < Duration::from_millis(20), "not fast: {:?}", started.elapsed());
    assert_eq!(runs.load(Ordering::SeqCst), 5, "the tool was not run while open");
    // After the cool-down one trial call goes through.
    tokio::time::sleep(Duration::from_millis(320)).await;
    assert_eq!(tools.breaker_state("test.fail"), Some(BreakerState::HalfOpen));
    let _ = tools.call("test.fail", json!({}), &ctx()).await;
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    assert_eq!(tools.breaker_state("test.fail"), Some(BreakerState::Open));
}

/// The breaker's state and the calls' outcomes are in the Prometheus metrics, scraped over HTTP.
#[tokio::test]
async fn breaker_state_and_call_outcomes_are_in_the_metrics() {
    let runs = Arc::new(AtomicU32::new(0));
    let mut tools = ToolRegistry::for_agent("metrics-agent");
    tools.register(Arc::new(Flaky { name: "test.metered", hang: false, runs })).unwrap();
    tools.export_breaker_metrics();
    let addr = hermes_core::metrics::serve("127.0.0.1:0".parse().unwrap(), Default::default()).await.unwrap();
    let scrape =
        || async move { reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap() };
    let closed = r#"hermes_tool_breaker_state{agent="metrics-agent",tool="test.metered"} 0"#;
    assert!(scrape().await.contains(closed), "{}", scrape().await);
    for _ in 0..6 {
        let _ = tools.call("test.metered", json!({}), &ctx()).await;
    }
    let text = scrape().await;
    assert!(
        text.contains(r#"hermes_tool_breaker_state{agent="metrics-agent",tool="test.metered"} 1"#),
        "{text}"
    );
    // Five failures ran the tool; the sixth was refused by the open breaker (also TOOL_ERROR).
    assert!(
        text.contains(
            r#"hermes_tool_calls_total{agent="metrics-agent",tool="test.metered",outcome="TOOL_ERROR"} 6"#
        ),
        "{text}"
    );
}
