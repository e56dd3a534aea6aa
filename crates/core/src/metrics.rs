//! Prometheus metrics. One registry per process ([`global`]); services add their metrics to it
//! and may register a hook that refreshes gauges computed from their state at scrape time (a
//! circuit breaker's state, tasks in flight). [`serve`] exposes it as text on `/metrics` when a
//! service is given a listen address (`--metrics-listen`, `HERMES_METRICS_LISTEN`).
//!
//! The catalogue, with what each series means, is in `docs/observability.md`. Every process
//! registers all of it; a series appears once the process has something to report in it.

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Label pairs of a metric series.
pub type Labels = Vec<(String, String)>;

type Refresher = Box<dyn Fn() + Send + Sync>;

/// A histogram family with the duration buckets every Hermes histogram uses (5 ms to ~5.5 min).
pub type Durations = Family<Labels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 17))
}

/// The process's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    refreshers: Mutex<Vec<Refresher>>,
    /// Tool calls by agent, tool and outcome (`ok` or the error code).
    pub tool_calls: Family<Labels, Counter>,
    /// Circuit breaker state by agent and tool: 0 closed, 1 open, 2 half-open.
    pub breaker_state: Family<Labels, Gauge>,
    /// Tasks finished by agent, task type and status (`succeeded`, `failed`).
    pub tasks: Family<Labels, Counter>,
    /// Tasks running now, by agent.
    pub tasks_in_flight: Family<Labels, Gauge>,
    /// Task run time on the agent, by agent, task type and status.
    pub task_duration: Durations,
    /// Goals by outcome: `accepted` when submitted, then `completed`, `failed`, `cancelled` or
    /// `needs_input` when they end (dispatcher).
    pub goals: Family<Labels, Counter>,
    /// Node attempts finished, from dispatch to result, by task type and status (dispatcher).
    pub node_duration: Durations,
    /// Node attempts scheduled again after a retryable failure, by task type (dispatcher).
    pub retries: Family<Labels, Counter>,
    /// Messages moved to the dead-letter stream, by kind of message.
    pub dead_letters: Family<Labels, Counter>,
    /// Messages waiting on a task consumer, by task type and consumer (`pool` or an agent id).
    pub queue_pending: Family<Labels, Gauge>,
    /// Messages delivered on a task consumer and not yet acknowledged, same labels.
    pub queue_ack_pending: Family<Labels, Gauge>,
    /// Live agents serving a task type (registry).
    pub agents_online: Family<Labels, Gauge>,
    /// Live agents by pool (registry).
    pub pool_agents: Family<Labels, Gauge>,
    /// LLM calls by provider, model and outcome (`ok` or the error code).
    pub llm_calls: Family<Labels, Counter>,
    /// LLM tokens by provider, model and direction (`input`, `output`).
    pub llm_tokens: Family<Labels, Counter>,
    /// LLM call latency by provider and model.
    pub llm_duration: Durations,
    /// Webhook delivery attempts by outcome (`delivered`, `failed`, `gone`, `refused`).
    pub webhook_attempts: Family<Labels, Counter>,
    /// Webhook deliveries waiting in the stream, to be sent or sent again.
    pub webhook_queue: Gauge,
    /// Time model calls waited for the fleet's limits, by model and reason (`concurrency`,
    /// `requests_per_minute`, `tokens_per_minute`, `cooldown`); calls that did not wait are
    /// observed as 0 under `none`.
    pub model_wait: Durations,
    /// Slots of a model's fleet-wide concurrency limit in use, as this process last saw them.
    pub model_slots_in_use: Family<Labels, Gauge>,
    /// Throttles by model and kind: `provider` (a 429 or 503 from the provider, which sets a
    /// fleet-wide cooldown when it says `Retry-After`), `waited` (a call that had to wait).
    pub model_throttles: Family<Labels, Counter>,
    /// Tool-result cache lookups by tool and outcome (`hit`, `miss`, `shared`: a concurrent
    /// identical call's result, `stored`, `too_large`).
    pub tool_cache: Family<Labels, Counter>,
    /// Calls refused for their credentials (no token, an unknown one), by door, every one of
    /// them (the audit trail keeps a bounded share).
    pub auth_failures: Family<Labels, Counter>,
}

/// The process-wide metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::default();
        let metrics = Metrics {
            registry: Mutex::new(Registry::default()),
            refreshers: Mutex::new(Vec::new()),
            tool_calls: Family::default(),
            breaker_state: Family::default(),
            tasks: Family::default(),
            tasks_in_flight: Family::default(),
            task_duration: Durations::new_with_constructor(duration_histogram),
            goals: Family::default(),
            node_duration: Durations::new_with_constructor(duration_histogram),
            retries: Family::default(),
            dead_letters: Family::default(),
            queue_pending: Family::default(),
            queue_ack_pending: Family::default(),
            agents_online: Family::default(),
            pool_agents: Family::default(),
            llm_calls: Family::default(),
            llm_tokens: Family::default(),
            llm_duration: Durations::new_with_constructor(duration_histogram),
            webhook_attempts: Family::default(),
            webhook_queue: Gauge::default(),
            model_wait: Durations::new_with_constructor(duration_histogram),
            model_slots_in_use: Family::default(),
            model_throttles: Family::default(),
            tool_cache: Family::default(),
            auth_failures: Family::default(),
        };
        let m = &metrics;
        registry.register("hermes_tool_calls", "Tool calls by agent, tool and outcome", m.tool_calls.clone());
        registry.register(
            "hermes_tool_breaker_state",
            "Circuit breaker state by agent and tool: 0 closed, 1 open, 2 half-open",
            m.breaker_state.clone(),
        );
        registry.register("hermes_tasks", "Tasks finished by agent, task type and status", m.tasks.clone());
        registry.register("hermes_tasks_in_flight", "Tasks running now, by agent", m.tasks_in_flight.clone());
        registry.register(
            "hermes_task_duration_seconds",
            "Task run time on the agent by agent, task type and status",
            m.task_duration.clone(),
        );
        registry.register("hermes_goals", "Goals accepted and ended, by status", m.goals.clone());
        registry.register(
            "hermes_node_duration_seconds",
            "Node attempts from dispatch to result, by task type and status",
            m.node_duration.clone(),
        );
        registry.register("hermes_task_retries", "Node attempts retried, by task type", m.retries.clone());
        registry.register(
            "hermes_dead_letters",
            "Messages moved to the DLQ, by kind",
            m.dead_letters.clone(),
        );
        registry.register(
            "hermes_queue_pending",
            "Task messages not yet delivered, by task type and consumer",
            m.queue_pending.clone(),
        );
        registry.register(
            "hermes_queue_ack_pending",
            "Task messages delivered and not yet acknowledged, by task type and consumer",
            m.queue_ack_pending.clone(),
        );
        registry.register("hermes_agents_online", "Live agents by task type", m.agents_online.clone());
        registry.register("hermes_pool_agents", "Live agents by pool", m.pool_agents.clone());
        registry.register(
            "hermes_llm_calls",
            "LLM calls by provider, model and outcome",
            m.llm_calls.clone(),
        );
        registry.register(
            "hermes_llm_tokens",
            "LLM tokens by provider, model and direction",
            m.llm_tokens.clone(),
        );
        registry.register(
            "hermes_llm_call_duration_seconds",
            "LLM call latency by provider and model",
            m.llm_duration.clone(),
        );
        registry.register(
            "hermes_webhook_attempts",
            "Webhook delivery attempts by outcome",
            m.webhook_attempts.clone(),
        );
        registry.register(
            "hermes_webhook_queue",
            "Webhook deliveries waiting to be sent",
            m.webhook_queue.clone(),
        );
        registry.register(
            "hermes_model_wait_seconds",
            "Time model calls waited for the fleet's limits, by model and reason",
            m.model_wait.clone(),
        );
        registry.register(
            "hermes_model_slots_in_use",
            "Slots of a model's fleet-wide concurrency limit in use",
            m.model_slots_in_use.clone(),
        );
        registry.register(
            "hermes_model_throttles",
            "Model calls throttled, by model and kind (provider, waited)",
            m.model_throttles.clone(),
        );
        registry.register(
            "hermes_tool_cache",
            "Tool-result cache lookups by tool and outcome",
            m.tool_cache.clone(),
        );
        registry.register(
            "hermes_auth_failures",
            "Calls refused for their credentials, by door",
            m.auth_failures.clone(),
        );
        *m.registry.lock().unwrap_or_else(|p| p.into_inner()) = registry;
        metrics
    })
}

/// Labels from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

impl Metrics {
    /// Runs `refresh` before every scrape (to set gauges from live state).
    pub fn on_scrape(&self, refresh: impl Fn() + Send + Sync + 'static) {
        self.refreshers.lock().unwrap_or_else(|p| p.into_inner()).push(Box::new(refresh));
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        for refresh in self.refreshers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            refresh();
        }
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        if encode(&mut text, &registry).is_err() {
            text.clear();
        }
        text
    }
}

/// Serves `/metrics` when `addr` is given (`--metrics-listen`), saying where on stdout.
pub async fn serve_if(addr: Option<SocketAddr>, shutdown: CancellationToken) -> std::io::Result<()> {
    if let Some(addr) = addr {
        let bound = serve(addr, shutdown)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot serve metrics on {addr}: {e}")))?;
        println!("metrics on http://{bound}/metrics");
    }
    Ok(())
}

/// Seconds in a histogram observation, from milliseconds.
pub fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Serves `/metrics` on `addr` until `shutdown`, and `/healthz` (200 while the process serves;
/// the liveness and readiness probe of services without a gRPC port); returns the bound address (port 0 picks one).
pub async fn serve(addr: SocketAddr, shutdown: CancellationToken) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" })).route(
        "/metrics",
        axum::routing::get(|| async {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                global().render(),
            )
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await;
    });
    Ok(local)
}
