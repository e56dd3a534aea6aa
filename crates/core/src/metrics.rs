//! Prometheus metrics. One registry per process ([`global`]); services add their metrics to it
//! and may register a hook that refreshes gauges computed from their state at scrape time (a
//! circuit breaker's state, tasks in flight). [`serve`] exposes it as text on `/metrics` when a
//! service is given a listen address (`--metrics-listen`, `HERMES_METRICS_LISTEN`).
//!
//! Built so far: the executor's tool, task and breaker metrics (`docs/agents.md`). The rest of
//! the catalogue (goals, queue depth, LLM tokens) belongs to the observability work.

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Label pairs of a metric series.
pub type Labels = Vec<(String, String)>;

type Refresher = Box<dyn Fn() + Send + Sync>;

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
}

/// The process-wide metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::default();
        let tool_calls = Family::<Labels, Counter>::default();
        let breaker_state = Family::<Labels, Gauge>::default();
        let tasks = Family::<Labels, Counter>::default();
        let tasks_in_flight = Family::<Labels, Gauge>::default();
        registry.register("hermes_tool_calls", "Tool calls by agent, tool and outcome", tool_calls.clone());
        registry.register(
            "hermes_tool_breaker_state",
            "Circuit breaker state by agent and tool: 0 closed, 1 open, 2 half-open",
            breaker_state.clone(),
        );
        registry.register("hermes_tasks", "Tasks finished by agent, task type and status", tasks.clone());
        registry.register("hermes_tasks_in_flight", "Tasks running now, by agent", tasks_in_flight.clone());
        Metrics {
            registry: Mutex::new(registry),
            refreshers: Mutex::new(Vec::new()),
            tool_calls,
            breaker_state,
            tasks,
            tasks_in_flight,
        }
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

/// Serves `/metrics` on `addr` until `shutdown`; returns the bound address (port 0 picks one).
pub async fn serve(addr: SocketAddr, shutdown: CancellationToken) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = axum::Router::new().route(
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
