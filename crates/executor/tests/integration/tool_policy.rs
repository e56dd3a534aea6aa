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

/// How a [`Flaky`] tool fails.
#[derive(Clone, Copy, PartialEq)]
enum Fail {
    /// Hangs past its timeout (a dependency fault).
    Hang,
    /// Its dependency is down (`UNAVAILABLE`, a dependency fault).
    Unavailable,
    /// Rejects the request (`TOOL_ERROR` on the input: the caller's problem).
    BadInput,
}

/// Fails the way it was told, counting its runs. With `{"target": ...}` in its arguments each
/// target has its own breaker.
struct Flaky {
    name: &'static str,
    fail: Fail,
    policy: RetryPolicy,
    runs: Arc<AtomicU32>,
}

impl Flaky {
    fn new(name: &'static str, fail: Fail, runs: &Arc<AtomicU32>) -> Self {
        Self { name, fail, policy: POLICY, runs: runs.clone() }
    }
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
        self.policy
    }
    fn breaker_target(&self, args: &Value) -> Option<String> {
        args.get("target").and_then(Value::as_str).map(str::to_owned)
    }
    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let fail = self.fail;
        Box::pin(async move {
            if args.get("ok").is_some() {
                return Ok(json!({"ok": true}));
            }
            match fail {
                Fail::Hang => {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Err(ToolError::failed("unreachable"))
                }
                Fail::Unavailable => Err(ToolError {
                    code: hermes_core::ErrorCode::Unavailable,
                    message: "the backend is down".into(),
                }),
                Fail::BadInput => Err(ToolError::failed("the expression does not parse")),
            }
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
    let tools = registry(Flaky::new("test.hang", Fail::Hang, &runs));
    let started = Instant::now();
    let err = tools.call("test.hang", json!({}), &ctx()).await.unwrap_err();
    assert_eq!(err.code.as_str(), "TIMEOUT");
    assert!(err.message.contains("did not finish within 50 ms"), "{}", err.message);
    assert_eq!(runs.load(Ordering::SeqCst), 3, "three tries");
    // 3 × 50 ms of timeouts plus 40 ms and 80 ms of backoff.
    assert!(started.elapsed() >= Duration::from_millis(270), "{:?}", started.elapsed());
}

/// Bad requests are the caller's problem: twenty of them, of every kind, leave the breaker closed
/// and the tool available to the next caller.
#[tokio::test]
async fn invalid_input_never_opens_the_breaker() {
    let runs = Arc::new(AtomicU32::new(0));
    let tools = registry(Flaky::new("test.picky", Fail::BadInput, &runs));
    for _ in 0..20 {
        let err = tools.call("test.picky", json!({}), &ctx()).await.unwrap_err();
        assert_eq!(err.code.as_str(), "TOOL_ERROR");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 20, "TOOL_ERROR is not retried");
    assert_eq!(tools.breaker_state("test.picky"), Some(BreakerState::Closed));
    // Arguments failing the schema never reach the tool and count for nothing either.
    let mut strict = ToolRegistry::default();
    strict.register(Arc::new(Strict)).unwrap();
    for _ in 0..20 {
        let err = strict.call("test.strict", json!({"n": "not a number"}), &ctx()).await.unwrap_err();
        assert_eq!(err.code.as_str(), "INVALID_ARGUMENT");
    }
    assert_eq!(strict.breaker_state("test.strict"), Some(BreakerState::Closed));
    let out = tools.call("test.picky", json!({"ok": true}), &ctx()).await.unwrap();
    assert_eq!(out["ok"], true);
}

/// Five timeouts open the breaker; the next call fails fast with UNAVAILABLE without running the
/// tool, and after the cool-down one trial call decides.
#[tokio::test]
async fn five_timeouts_open_the_breaker_and_the_next_call_fails_fast() {
    let runs = Arc::new(AtomicU32::new(0));
    let mut hang = Flaky::new("test.slow", Fail::Hang, &runs);
    hang.policy.attempts = 1;
    let tools = registry(hang);
    for i in 0..5 {
        assert_eq!(tools.breaker_state("test.slow"), Some(BreakerState::Closed), "after {i} timeouts");
        let err = tools.call("test.slow", json!({}), &ctx()).await.unwrap_err();
        assert_eq!(err.code.as_str(), "TIMEOUT");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    assert_eq!(tools.breaker_state("test.slow"), Some(BreakerState::Open));
    let started = Instant::now();
    let err = tools.call("test.slow", json!({}), &ctx()).await.unwrap_err();
    assert_eq!(err.code.as_str(), "UNAVAILABLE");
    assert!(err.message.contains("circuit breaker opened after 5 consecutive"), "{}", err.message);
    assert!(started.elapsed() < Duration::from_millis(20), "not fast: {:?}", started.elapsed());
    assert_eq!(runs.load(Ordering::SeqCst), 5, "the tool was not run while open");
    // After the cool-down one trial call goes through.
    tokio::time::sleep(Duration::from_millis(320)).await;
    assert_eq!(tools.breaker_state("test.slow"), Some(BreakerState::HalfOpen));
    let _ = tools.call("test.slow", json!({}), &ctx()).await;
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    assert_eq!(tools.breaker_state("test.slow"), Some(BreakerState::Open));
    // A success closes it again.
    tokio::time::sleep(Duration::from_millis(320)).await;
    tools.call("test.slow", json!({"ok": true}), &ctx()).await.unwrap();
    assert_eq!(tools.breaker_state("test.slow"), Some(BreakerState::Closed));
}

/// Each target has its own breaker: a dead host does not make the tool unavailable for others.
#[tokio::test]
async fn breakers_are_per_target() {
    let runs = Arc::new(AtomicU32::new(0));
    let mut down = Flaky::new("test.remote", Fail::Unavailable, &runs);
    down.policy.attempts = 1;
    let tools = registry(down);
    for _ in 0..5 {
        let err = tools.call("test.remote", json!({"target": "a.test"}), &ctx()).await.unwrap_err();
        assert_eq!(err.code.as_str(), "UNAVAILABLE");
    }
    assert_eq!(tools.breaker_state_for("test.remote", "a.test"), Some(BreakerState::Open));
    assert_eq!(tools.breaker_state_for("test.remote", "b.test"), Some(BreakerState::Closed));
    let err = tools.call("test.remote", json!({"target": "a.test"}), &ctx()).await.unwrap_err();
    assert!(err.message.contains("for `a.test`"), "{}", err.message);
    let out = tools.call("test.remote", json!({"target": "b.test", "ok": true}), &ctx()).await.unwrap();
    assert_eq!(out["ok"], true);
    assert_eq!(runs.load(Ordering::SeqCst), 6, "the open target's call did not run");
}

/// A tool with a typed parameter, to fail its schema.
struct Strict;

impl Tool for Strict {
    fn name(&self) -> &'static str {
        "test.strict"
    }
    fn description(&self) -> &'static str {
        "test tool"
    }
    fn params_schema(&self) -> Value {
        json!({"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]})
    }
    fn run<'a>(&'a self, _args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async { Ok(json!({})) })
    }
}

/// The breaker's state and the calls' outcomes are in the Prometheus metrics, scraped over HTTP.
#[tokio::test]
async fn breaker_state_and_call_outcomes_are_in_the_metrics() {
    let runs = Arc::new(AtomicU32::new(0));
    let mut tools = ToolRegistry::for_agent("metrics-agent");
    let mut down = Flaky::new("test.metered", Fail::Unavailable, &runs);
    down.policy.attempts = 1;
    tools.register(Arc::new(down)).unwrap();
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
    // Five failures ran the tool; the sixth was refused by the open breaker (also UNAVAILABLE).
    assert!(
        text.contains(
            r#"hermes_tool_calls_total{agent="metrics-agent",tool="test.metered",outcome="UNAVAILABLE"} 6"#
        ),
        "{text}"
    );
}
