//! Routing figures: route decision latency with 10,000 registered agents over 100 task types,
//! in-process and as a NATS request to a running registry, and the registry's memory per agent.

use std::time::{Duration, Instant};

use hermes_proto::{AgentHeartbeat, RouteQuery, RouteReply, RouteRequest, ToolSpec};
use hermes_registry::{Registry, RegistryConfig};
use prost::Message as _;
use tokio_util::sync::CancellationToken;

pub const TASK_TYPES: usize = 100;

fn heartbeat(i: usize) -> AgentHeartbeat {
    let task_type = format!("bench.type-{}", i % TASK_TYPES);
    AgentHeartbeat {
        agent_id: format!("agent-{i}"),
        pool: format!("pool-{}", i % 10),
        tools: vec![ToolSpec {
            name: task_type.clone(),
            description: "a benchmark tool that does nothing at all".into(),
            params_schema_json: r#"{"type":"object","properties":{"x":{"type":"number"}}}"#.into(),
            ..Default::default()
        }],
        task_types: vec![task_type],
        tags: vec!["bench".into()],
        max_concurrency: 16,
        version: "0.1.0".into(),
        sent_unix_ms: hermes_core::now_unix_ms(),
        ..Default::default()
    }
}

fn loaded_registry(agents: usize) -> Registry {
    let registry =
        Registry::new(RegistryConfig { heartbeat_ttl: Duration::from_secs(3600), ..Default::default() });
    for i in 0..agents {
        registry.apply_heartbeat(&format!("agent-{i}"), heartbeat(i)).expect("valid heartbeat");
    }
    registry
}

/// Bytes per agent held by one registry grown to each of `sizes` agents, measured from the
/// empty registry with the counting allocator, so the figures can be compared for linearity.
pub fn bytes_per_agent(sizes: &[usize]) -> Vec<(usize, f64)> {
    let registry =
        Registry::new(RegistryConfig { heartbeat_ttl: Duration::from_secs(3600), ..Default::default() });
    let base = counting::live_bytes();
    let mut registered = 0;
    let mut out = Vec::new();
    for &size in sizes {
        for i in registered..size {
            registry.apply_heartbeat(&format!("agent-{i}"), heartbeat(i)).expect("valid heartbeat");
        }
        registered = size;
        out.push((size, counting::live_bytes().saturating_sub(base) as f64 / size as f64));
    }
    out
}

/// mimalloc with a count of live bytes.
pub mod counting {
    #![allow(unsafe_code)]
    // SAFETY: every method forwards the caller's arguments unchanged to mimalloc, which upholds
    // the GlobalAlloc contract; the counter is a relaxed atomic that touches no memory it returns.

    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static LIVE: AtomicUsize = AtomicUsize::new(0);

    pub struct CountingMiMalloc;

    unsafe impl GlobalAlloc for CountingMiMalloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }

    /// Bytes currently allocated by the whole process.
    pub fn live_bytes() -> usize {
        LIVE.load(Ordering::Relaxed)
    }
}

fn percentiles(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99))
}

fn query(i: usize) -> RouteQuery {
    RouteQuery { task_type: format!("bench.type-{}", (i * 7) % TASK_TYPES), ..Default::default() }
}

/// In-process decision latency in µs (p50, p99) with `agents` registered.
pub fn decision_latency(agents: usize, samples: usize) -> (f64, f64) {
    let registry = loaded_registry(agents);
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        let start = Instant::now();
        let decision = registry.route(&query(i));
        out.push(start.elapsed().as_secs_f64() * 1e6);
        // Keep the table in steady state: the task finishes, as its result would report.
        registry.task_finished(&decision.agent_id);
    }
    percentiles(out)
}

/// Route request round trip over NATS to a running registry, in µs (p50, p99).
pub async fn request_latency(nats_url: &str, agents: usize, samples: usize) -> anyhow::Result<(f64, f64)> {
    let bus =
        hermes_core::Bus::connect(hermes_core::BusConfig::new(nats_url).with_name("bench-registry")).await?;
    let registry = loaded_registry(agents);
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(hermes_registry::run(bus.clone(), registry.clone(), shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = async_nats::connect(nats_url).await?;
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples + 100 {
        let body = RouteRequest { queries: vec![query(i)] }.encode_to_vec();
        let start = Instant::now();
        let reply = client.request(bus.topology().route(), body.into()).await?;
        let elapsed = start.elapsed().as_secs_f64() * 1e6;
        let reply = RouteReply::decode(reply.payload)?;
        anyhow::ensure!(!reply.decisions[0].agent_id.is_empty(), "no agent chosen");
        registry.task_finished(&reply.decisions[0].agent_id);
        if i >= 100 {
            out.push(elapsed);
        }
    }
    shutdown.cancel();
    let _ = run.await;
    Ok(percentiles(out))
}
