//! The dispatcher: it owns the gRPC API and the goal lifecycle. A submitted plan is validated,
//! stored in KV, and its ready nodes are published as tasks; results are consumed from the one
//! shared results consumer and applied to the goal by compare-and-set, which dispatches the nodes
//! that became ready and completes the goal. Every transition is also an event on
//! `hermes.event.<goal_id>`, which WatchGoal replays.
//!
//! All state is in JetStream, so any dispatcher replica can apply any result.
//!
//! The layers, each calling only the ones below it:
//! - the doors, `grpc.rs` and [`http`] (with A2A under it): they map their wire to the caller
//!   gate's operations and its answers back, and import neither the goal service nor the bus;
//! - the caller gate (`gate.rs`): a `Caller` built once per request (authenticated first), and
//!   each operation as bus readiness, role, tenant, the call, the caller's view, and the audit
//!   record, in one place for every door; beside it the [`workers`] (results, plans, timers,
//!   takeover, DLQ, summaries, queue depth; each owns its state);
//! - [`GoalService`] (`goals.rs`): the goal lifecycle, submit, get, list, watch, cancel,
//!   approvals and the apply methods the workers call; every change is
//!   [`GoalService::transition`], a compare-and-set. It knows no caller;
//! - the effects publisher (`effects.rs`), which publishes what a committed transition produced
//!   and reaches the workers through channel handles, with `routing.rs` for where tasks go;
//! - [`engine`]: the pure transitions, one file per kind, and [`store`]: the goal bucket.
//!
//! [`service`] is the process: its settings and the runtime's `Service`.

pub use hermes_core::access;
mod a2a_view;
pub mod audit;
mod config;
pub mod console;
mod dead_letters;
mod effects;
pub mod engine;
mod fanout;
mod gate;
pub mod goal_index;
mod goals;
mod grpc;
pub mod http;
mod metrics;
pub mod quota;
pub mod records;
mod routing;
pub mod service;
pub mod store;
mod view;
pub mod watchers;
pub mod webhooks;
pub mod workers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hermes_core::bus::ConsumerSpec;
use tracing::info;

pub use crate::config::{DispatcherConfig, MAX_GOAL_TEXT_BYTES, WebhookConfig};
use crate::effects::FollowupInbox;
pub use crate::goals::{GoalService, Submitted};
pub use crate::workers::summaries::Summarizer;

/// What [`start`] started.
pub struct Started {
    pub service: Arc<GoalService>,
    /// Where the HTTP API listens, when it is on.
    pub http_addr: Option<SocketAddr>,
}

/// With auth off, anyone who reaches the API may submit, read and cancel every goal: refuses
/// to listen anywhere but on loopback then, unless `allow_unauthenticated` says a proxy in front
/// authenticates.
fn refuse_open_doors(config: &DispatcherConfig) -> anyhow::Result<()> {
    if config.access.current().enabled() || config.allow_unauthenticated {
        return Ok(());
    }
    let doors =
        std::iter::once(("gRPC", config.grpc_listen)).chain(config.http.as_ref().map(|h| ("HTTP", h.listen)));
    for (door, addr) in doors {
        if !addr.ip().is_loopback() {
            anyhow::bail!(
                "refusing to serve the {door} API on {addr} with auth off: anyone who reaches it could submit, read, cancel and approve every goal. \
                 Set dispatcher.api_tokens_file (HERMES_API_TOKENS_FILE; docs/security.md), listen on 127.0.0.1, \
                 or set dispatcher.allow_unauthenticated (HERMES_ALLOW_UNAUTHENTICATED=true) when a proxy in front authenticates"
            );
        }
    }
    Ok(())
}

/// Starts the dispatcher on `cx`, which must be connected: binds the gRPC port (unless a service
/// composed before it did), the results and plan-result consumers, spawns the workers as named
/// tasks and adds the `hermes.v1.Dispatcher` API to the context's gRPC server. Fails fast with a
/// clear error.
pub async fn start(config: DispatcherConfig, cx: &mut hermes_runtime::Context) -> anyhow::Result<Started> {
    use anyhow::Context as _;
    let bus = cx.bus().cloned().context("connect before starting the dispatcher")?;
    refuse_open_doors(&config)?;
    let listen = config.grpc_listen;
    cx.grpc_listen(listen, config.grpc_max_message_bytes, hermes_runtime::GRPC_LIMIT_SETTING).await?;
    cx.grpc_tls(config.grpc_tls.clone())?;
    if config.access.current().enabled() {
        cx.grpc_guard(access::guard(config.access.clone()))?;
    }
    let http_listener = match &config.http {
        Some(http) => Some((http::bind(http).await?, http.clone())),
        None => None,
    };
    let topology = bus.topology().clone();
    let results = bus
        .durable_consumer(ConsumerSpec {
            stream: topology.results_stream(),
            name: topology.results_consumer().to_owned(),
            filter_subject: topology.all_results(),
            ack_wait: workers::results::RESULT_ACK_WAIT,
            max_deliver: workers::APPLY_MAX_DELIVER,
            max_ack_pending: 20_000,
        })
        .await
        .context("cannot bind the results consumer")?;
    let plan_results = bus
        .durable_consumer(ConsumerSpec {
            stream: topology.plans_stream(),
            name: topology.plan_results_consumer().to_owned(),
            filter_subject: topology.plan_result(),
            ack_wait: Duration::from_secs(30),
            max_deliver: workers::APPLY_MAX_DELIVER,
            max_ack_pending: 10_000,
        })
        .await
        .context("cannot bind the plan results consumer")?;
    let webhooks = webhooks::Webhooks::open(bus.clone()).await.context("cannot open the webhooks bucket")?;
    let webhook_deliveries = bus
        .durable_consumer(ConsumerSpec {
            stream: topology.webhooks_stream(),
            name: topology.webhooks_consumer().to_owned(),
            filter_subject: topology.all_webhooks(),
            ack_wait: workers::webhooks::WEBHOOK_ACK_WAIT,
            // A delivery waits out its schedule as the delay of a nak: it is delivered as often
            // as it is tried, and dead-lettered by the worker when its schedule runs out.
            max_deliver: -1,
            // Deliveries waiting for their next attempt count as pending.
            max_ack_pending: 100_000,
        })
        .await
        .context("cannot bind the webhooks consumer")?;
    let sender = workers::webhooks::Sender::new(webhooks.clone(), &config.webhooks)?;
    let mirror = webhooks.clone();
    cx.spawn_loop("webhook-endpoints", move |stop| mirror.mirror(stop));
    let (followups, inbox) = effects::Followups::channel();
    let FollowupInbox { deadlines, summaries, unserved, unsent } = inbox;
    let audit = audit::Audit::open(bus.clone()).await.context("cannot open the audit stream")?;
    let tokens = config.access.current();
    let quotas = quota::Quotas::open(&bus, tokens.quotas.clone(), tokens.enabled())
        .await
        .context("cannot open the tenants' quota bucket")?;
    // Before the API serves: a tenant's lane is known to the agents before its first task is in it.
    hermes_core::lanes::publish(&bus, &tokens.tenant_weights())
        .await
        .context("cannot write the tenants' lanes")?;
    let records = records::Records::open(bus.clone(), config.record_model_exchanges)
        .await
        .context("cannot open the records stream")?;
    // Read whole before the API serves, so a list never misses an older goal.
    let index =
        goal_index::GoalIndex::open(&bus, cx.shutdown()).await.context("cannot open the goal index")?;
    let (i, b) = (index.clone(), bus.clone());
    cx.spawn_loop("approval-changes", move |stop| i.follow_approvals(b, stop));
    let access = config.access.clone();
    // Tasks carry the memory service's proof of their tenant, signed with this key.
    let task_key = hermes_core::task_token::TaskKey::open(&bus)
        .await
        .context("cannot open the tasks' memory-token key")?;
    let parts = goals::GoalParts { followups, quotas, records: records.clone(), webhooks, index, task_key };
    let service = Arc::new(GoalService::new(bus.clone(), config, parts));
    // The tokens file read again (SIGHUP) brings its tenants' quotas and weights with it.
    access.reload_on_hangup(cx.shutdown());
    let (mut reloads, reloaded) = (access.subscribe(), service.clone());
    let b = bus.clone();
    cx.spawn_loop("api-tokens", move |stop| async move {
        // `subscribe` took the tokens in force as seen: every reload after it is applied.
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = reloads.changed() => if changed.is_err() { return },
            }
            let tokens = reloads.borrow_and_update().clone();
            reloaded.quotas().set(tokens.quotas.clone());
            if let Err(e) = hermes_core::lanes::publish(&b, &tokens.tenant_weights()).await {
                tracing::warn!(error = %e, "cannot write the tenants' lanes after the tokens file was read again");
            }
        }
    });
    let gate = Arc::new(gate::Gate::new(service.clone(), audit, records, access));
    // The routing view is loaded before the API serves, so the first tasks go to live agents.
    let agents = service.agents().clone();
    let (loaded, _) = agents.rebuild_from_kv(&bus).await;
    tracing::debug!(agents = loaded, "routing view loaded");
    let b = bus.clone();
    cx.spawn("agents", move |stop| hermes_registry::follow(b, agents, stop));
    // Drained in reverse: the API stops first, the results consumer (which hands back what it
    // pulled but did not start) last.
    let s = service.clone();
    cx.spawn_loop("results", move |stop| workers::results::run(s, results, stop));
    let s = service.clone();
    cx.spawn_loop("takeover", move |stop| workers::takeover::run(s, unserved, stop));
    let s = service.clone();
    cx.spawn_loop("summaries", move |stop| workers::summaries::run(s, summaries, stop));
    let s = service.clone();
    cx.spawn_loop("plans", move |stop| workers::plans::run(s, plan_results, stop));
    let s = service.clone();
    cx.spawn_loop("dlq", move |stop| workers::dlq::run(s, stop));
    let s = service.clone();
    cx.spawn_loop("agent-reports", move |stop| workers::reports::run(s, stop));
    let s = service.clone();
    cx.spawn_loop("timers", move |stop| workers::timers::run(s, deadlines, unsent, stop));
    let b = bus.clone();
    cx.spawn_loop("webhooks", move |stop| workers::webhooks::run(sender, b, webhook_deliveries, stop));
    let b = bus.clone();
    cx.spawn_loop("queue-depth", move |stop| workers::queue_depth::run(b, stop));
    let api = grpc::server(gate.clone(), cx.shutdown(), cx.grpc_max_message_bytes());
    cx.grpc("hermes.v1.Dispatcher")?.add_service(api);
    let http_addr = match http_listener {
        Some((listener, http)) => {
            let addr = listener.local_addr()?;
            let router = http::router(gate, cx.shutdown(), &http);
            // Open event streams end when the drain starts (the shutdown token), so the server
            // can finish.
            let tls = match &http.tls {
                // Followed: new connections get the files as they are then (TlsFiles::follow).
                Some(tls) => Some(tls.follow(&[b"h2", b"http/1.1"], cx.shutdown())?),
                None => None,
            };
            cx.spawn("http", move |stop| async move {
                let service = router.into_make_service_with_connect_info::<SocketAddr>();
                match tls {
                    Some(config) => {
                        use axum::serve::ListenerExt as _;
                        let listener = hermes_core::tls::TlsListener::new(listener, config)?.tap_io(|_| {});
                        axum::serve(listener, service).with_graceful_shutdown(stop.cancelled_owned()).await?
                    }
                    None => {
                        axum::serve(listener, service).with_graceful_shutdown(stop.cancelled_owned()).await?
                    }
                }
                Ok(())
            });
            Some(addr)
        }
        None => None,
    };
    info!(grpc = ?cx.grpc_addr(), http = ?http_addr, "dispatcher started");
    Ok(Started { service, http_addr })
}
