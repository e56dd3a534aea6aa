//! The tool-result cache against a real nats-server: a hit, a miss, expiry, tenants kept apart,
//! single flight under 50 concurrent identical calls, a failure cached for nobody, and the
//! refusal to cache tools with side effects or that need confirmation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use hermes_core::bus::BusConfig;
use hermes_core::{Bus, ErrorCode};
use hermes_executor::tool::{TaskScope, Tool, ToolContext, ToolError, ToolRegistry};
use hermes_test_util::NatsServer;
use serde_json::{Value, json};

/// Counts its runs; slow enough that concurrent calls overlap; fails on `{"fail": true}`.
struct Counted {
    runs: Arc<AtomicU32>,
}

impl Tool for Counted {
    fn name(&self) -> &str {
        "test.counted"
    }
    fn description(&self) -> &str {
        "Returns its input doubled, counting runs."
    }
    fn params_schema(&self) -> Value {
        json!({"type": "object", "properties": {"n": {"type": "number"}, "fail": {"type": "boolean"}}})
    }
    fn cache_ttl(&self) -> Option<Duration> {
        Some(Duration::from_secs(60))
    }
    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(300)).await;
            if args["fail"] == json!(true) {
                return Err(ToolError { code: ErrorCode::ToolError, message: "asked to fail".into() });
            }
            Ok(json!({"doubled": args["n"].as_f64().unwrap_or(0.0) * 2.0}))
        })
    }
}

struct Effectful;

impl Tool for Effectful {
    fn name(&self) -> &str {
        "test.effectful"
    }
    fn description(&self) -> &str {
        "Changes something."
    }
    fn params_schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn side_effects(&self) -> bool {
        true
    }
    fn cache_ttl(&self) -> Option<Duration> {
        Some(Duration::from_secs(60))
    }
    fn run<'a>(&'a self, _args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async { Ok(json!({})) })
    }
}

/// Answers from a model, as `agent.run` and `text.summarize` do.
struct Modeled;

impl Tool for Modeled {
    fn name(&self) -> &str {
        "test.modeled"
    }
    fn description(&self) -> &str {
        "Asks a model."
    }
    fn params_schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn calls_model(&self) -> bool {
        true
    }
    fn run<'a>(&'a self, _args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async { Ok(json!({})) })
    }
}

fn context(bus: &Bus, tenant: &str, goal: &str) -> ToolContext {
    ToolContext {
        workspace: std::env::temp_dir(),
        task: Some(TaskScope {
            bus: bus.clone(),
            goal_id: goal.into(),
            node_id: "n".into(),
            attempt: 1,
            task_id: format!("{goal}.n.1"),
            result_token: String::new(),
            tenant: tenant.into(),
            memory_token: String::new(),
            agent_id: "a".into(),
            calls: Default::default(),
            approval_timeout: Duration::from_secs(1),
            cancel: Default::default(),
            tokens: Default::default(),
        }),
    }
}

fn registry(runs: &Arc<AtomicU32>, ttl_secs: u64) -> ToolRegistry {
    let mut registry = ToolRegistry::for_agent("a");
    registry.register(Arc::new(Counted { runs: runs.clone() })).unwrap();
    registry.enable_cache(&BTreeMap::from([("test.counted".to_owned(), ttl_secs)])).unwrap();
    registry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cached_result_is_reused_per_tenant_until_it_expires() {
    let nats = NatsServer::start();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let tools = registry(&runs, 2);
    let acme = context(&bus, "acme", "g1");

    let (first, hit) = tools.call_reporting("test.counted", json!({"n": 2}), &acme).await;
    assert_eq!(first.unwrap(), json!({"doubled": 4.0}));
    assert!(hit.is_none(), "a first call is a miss");
    // The same arguments written another way are the same call: a hit, with its age.
    let (again, hit) =
        tools.call_reporting("test.counted", json!({"n": 2.0}), &context(&bus, "acme", "g2")).await;
    assert_eq!(again.unwrap(), json!({"doubled": 4.0}));
    assert!(hit.is_some_and(|h| h.age < Duration::from_secs(2)), "{hit:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Other arguments miss.
    let (other, hit) = tools.call_reporting("test.counted", json!({"n": 3}), &acme).await;
    assert_eq!((other.unwrap(), hit), (json!({"doubled": 6.0}), None));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Another tenant never sees acme's entry.
    let (theirs, hit) =
        tools.call_reporting("test.counted", json!({"n": 2}), &context(&bus, "globex", "g3")).await;
    assert_eq!((theirs.unwrap(), hit), (json!({"doubled": 4.0}), None));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let stats = hermes_core::tool_cache::stats(&bus, Some("acme"), None).await.unwrap();
    assert_eq!(stats["test.counted"].entries, 2, "{stats:?}");
    // A failure is cached for nobody.
    for _ in 0..2 {
        let (failed, hit) = tools.call_reporting("test.counted", json!({"fail": true}), &acme).await;
        assert!(failed.is_err() && hit.is_none());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    // Past its TTL the entry is a miss, and the tool runs again.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (expired, hit) = tools.call_reporting("test.counted", json!({"n": 2}), &acme).await;
    assert_eq!((expired.unwrap(), hit), (json!({"doubled": 4.0}), None));
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    // Clearing one tenant's entries leaves the other's.
    assert!(hermes_core::tool_cache::clear(&bus, Some("acme"), Some("test.counted")).await.unwrap() >= 2);
    let left = hermes_core::tool_cache::stats(&bus, None, None).await.unwrap();
    // globex's entry stays (expired by now, as its TTL passed too).
    assert_eq!(left["test.counted"].entries + left["test.counted"].expired, 1, "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_identical_concurrent_calls_run_the_tool_once() {
    let nats = NatsServer::start();
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    // Two registries: two agents (they share nothing but the bucket).
    let (one, two) = (registry(&runs, 60), registry(&runs, 60));
    let calls = (0..50).map(|i| {
        let tools = if i % 2 == 0 { one.clone() } else { two.clone() };
        let ctx = context(&bus, "acme", &format!("g{i}"));
        tokio::spawn(async move { tools.call_reporting("test.counted", json!({"n": 21}), &ctx).await })
    });
    let results = futures::future::join_all(calls).await;
    let mut hits = 0;
    for result in results {
        let (output, hit) = result.unwrap();
        assert_eq!(output.unwrap(), json!({"doubled": 42.0}));
        hits += usize::from(hit.is_some());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one run for 50 identical calls");
    assert_eq!(hits, 49);
}

#[test]
fn tools_with_side_effects_or_confirmation_are_refused_by_name() {
    let mut registry = ToolRegistry::for_agent("a");
    registry.register(Arc::new(Effectful)).unwrap();
    registry.register(Arc::new(Counted { runs: Default::default() })).unwrap();
    let err = registry.enable_cache(&BTreeMap::from([("test.effectful".to_owned(), 0)])).unwrap_err();
    assert!(
        err.to_string().contains("cannot cache the results of `test.effectful`: it has side effects"),
        "{err}"
    );
    registry.register(Arc::new(Modeled)).unwrap();
    let err = registry.enable_cache(&BTreeMap::from([("test.modeled".to_owned(), 60)])).unwrap_err();
    assert!(err.to_string().contains("answers from a model"), "{err}");
    let err = registry.enable_cache(&BTreeMap::from([("test.unknown".to_owned(), 0)])).unwrap_err();
    assert!(err.to_string().contains("no such tool"), "{err}");
    registry.require_confirm(&["test.counted".to_owned()]).unwrap();
    let err = registry.enable_cache(&BTreeMap::from([("test.counted".to_owned(), 30)])).unwrap_err();
    assert!(err.to_string().contains("need confirmation"), "{err}");
    // `*` takes only tools that declare a TTL and may be cached.
    let mut plain = ToolRegistry::for_agent("b");
    for tool in hermes_executor::tools::builtin_tools() {
        plain.register(tool).unwrap();
    }
    plain.enable_cache(&BTreeMap::from([("*".to_owned(), 0)])).unwrap();
    let cached: Vec<&String> = plain.cached_tools().keys().collect();
    assert_eq!(cached, ["math.evaluate", "table.aggregate", "text.template"]);
    let err = plain.enable_cache(&BTreeMap::from([("fs.write".to_owned(), 60)])).unwrap_err();
    assert!(err.to_string().contains("side effects"), "{err}");
    assert!(hermes_executor::config::cache_ttls(&["x=abc".into()]).is_err());
}
