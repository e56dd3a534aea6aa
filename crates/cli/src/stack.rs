//! The all-in-one stack: registry, executor agents, planner, memory and dispatcher in one process
//! against one NATS, each a named task of one [`hermes_runtime::Context`], so the whole stack
//! drains together in reverse order of start, and tests can also stop or restart one agent or the
//! registry. `hermes up` runs it on the runner's context, and the end-to-end tests start it
//! in-process the same way. The registry's and memory's gRPC APIs are served on the dispatcher's
//! port.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use hermes_core::Bus;
use hermes_dispatcher::DispatcherConfig;
use hermes_executor::{Agent, AgentConfig};
use hermes_proto::{CatalogReply, CatalogRequest};
use hermes_registry::{Registry, RegistryConfig};
use prost::Message as _;
use std::collections::HashMap;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What to run.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// Credentials and all; prints without them.
    pub nats_url: hermes_core::secret::SecretUrl,
    pub registry: RegistryConfig,
    pub agents: Vec<AgentConfig>,
    pub dispatcher: DispatcherConfig,
    /// Runs a planner in the stack; goals given as text need one.
    pub planner: Option<hermes_planner::PlannerConfig>,
    /// Runs the memory service in the stack, its gRPC API on the dispatcher's port.
    pub memory: Option<hermes_memory::MemoryConfig>,
    /// Each service on its own NATS user and each agent on its own identity (`hermes up`'s own
    /// server); `None`: every service on the context's connection.
    pub users: Option<crate::nats::LocalUsers>,
}

/// A running stack.
pub struct Stack {
    cx: hermes_runtime::Context,
    parts: StackParts,
    bus: Bus,
    shutdown: CancellationToken,
}

/// What [`Stack::start_on`] started on a context: handles on the pieces tests stop and restart.
pub struct StackParts {
    grpc_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    registry: Registry,
    registry_config: RegistryConfig,
    registry_bus: Bus,
    registry_run: Stoppable,
    /// Whether the agents have identities of their own (then no agent can be added later).
    identities: bool,
    agents: HashMap<String, Stoppable>,
}

impl StackParts {
    /// The gRPC address (the dispatcher's, which also carries the registry's and memory's APIs).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The HTTP API's address, when it is on.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }
}

/// A task of the context that can also be stopped alone: `stop` ends it, `done` says it ended.
struct Stoppable {
    stop: CancellationToken,
    done: CancellationToken,
}

impl Stoppable {
    /// Spawns `run` on `cx` under `name`; it is stopped by its drain turn or by [`Stoppable::stop`].
    fn spawn<F, Fut>(cx: &mut hermes_runtime::Context, name: &'static str, run: F) -> Stoppable
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let (stop, done) = (CancellationToken::new(), CancellationToken::new());
        let task = run(stop.clone());
        let (stopper, finished) = (stop.clone(), done.clone());
        cx.spawn(name, move |drain| async move {
            let _ended = finished.drop_guard();
            tokio::pin!(task);
            tokio::select! {
                result = &mut task => result,
                _ = drain.cancelled() => {
                    stopper.cancel();
                    task.await
                }
            }
        });
        Stoppable { stop, done }
    }

    async fn stop(self) {
        self.halt().await;
    }

    async fn halt(&self) {
        self.stop.cancel();
        self.done.cancelled().await;
    }
}

impl Stack {
    /// Connects to `config.nats_url`, starts every service and returns once the dispatcher
    /// accepts gRPC calls and the registry knows every local agent, so the first submitted plan
    /// validates.
    pub async fn start(config: StackConfig, shutdown: CancellationToken) -> anyhow::Result<Stack> {
        let mut cx = hermes_runtime::Context::new("hermes-up", Duration::from_secs(10), shutdown.clone());
        let nats = hermes_runtime::NatsSettings { url: config.nats_url.clone(), ..Default::default() };
        let bus = cx.connect(&nats).await?;
        let parts = Self::start_on(config, &mut cx).await?;
        cx.serve()?;
        wait_for_port(parts.grpc_addr).await?;
        Ok(Stack { cx, parts, bus, shutdown })
    }

    /// Starts every service of `config` on `cx`, which must be connected: the registry, the
    /// agents, the planner, memory and the dispatcher, with one gRPC server on the dispatcher's
    /// address. `hermes up` runs this on the runner's context.
    pub async fn start_on(
        config: StackConfig,
        cx: &mut hermes_runtime::Context,
    ) -> anyhow::Result<StackParts> {
        let bus = cx.bus().cloned().context("connect before starting the stack")?;
        // With users, the context's connection is the dispatcher's: it made the streams and
        // buckets, which the other services' users may only look up.
        let users = config.users.clone();
        let dispatcher = config.dispatcher;
        let grpc_addr = cx
            .grpc_listen(
                dispatcher.grpc_listen,
                dispatcher.grpc_max_message_bytes,
                hermes_runtime::GRPC_LIMIT_SETTING,
            )
            .await?;
        cx.grpc_tls(dispatcher.grpc_tls.clone())?;
        let registry_bus = match &users {
            Some(users) => {
                // Buckets a deployment's dispatcher makes when it starts, which agents' users may
                // only open: here the agents start first.
                hermes_core::lanes::bucket(&bus).await?;
                hermes_core::tool_cache::bucket(&bus).await?;
                connect_as(users.url("registry")?, "registry").await?
            }
            None => bus.clone(),
        };
        let registry = hermes_registry::start(config.registry.clone(), cx)?;
        let registry_run = spawn_registry(cx, &registry_bus, &registry);
        // Agents reach the ledger and artifacts of their identities through memory: without it
        // in the stack they share the context's connection.
        let identities = match (&users, config.memory.is_some()) {
            (Some(users), true) => {
                let file = dispatcher.access.clone();
                Some(issue_identities(cx, &registry_bus, &registry, users, &config.agents, file).await?)
            }
            _ => None,
        };
        let mut agents = HashMap::new();
        let mut expected_types = Vec::new();
        for agent_config in config.agents {
            let agent_bus = match (&users, &identities) {
                (Some(users), Some(tokens)) => {
                    let token = &tokens[&agent_config.agent_id];
                    connect_as(users.agent_url(&agent_config.agent_id, token), "agent").await?
                }
                _ => bus.clone(),
            };
            let (id, types, handle) = spawn_agent(cx, &agent_bus, agent_config).await?;
            expected_types.extend(types);
            agents.insert(id, handle);
        }
        wait_for_catalog(&bus, &expected_types).await?;
        let mut dispatcher = dispatcher;
        if let Some(planner) = config.planner {
            dispatcher.planner = true;
            if let Some(users) = &users {
                cx.use_bus(connect_as(users.url("planner")?, "planner").await?);
            }
            hermes_planner::service::PlannerService::start_with(planner, cx)?;
        }
        if let Some(memory) = config.memory {
            if let Some(users) = &users {
                cx.use_bus(connect_as(users.url("memory")?, "memory").await?);
            }
            hermes_memory::service::MemoryService::start_config(memory, cx).await?;
        }
        cx.use_bus(bus);
        let started = hermes_dispatcher::start(dispatcher, cx).await?;
        let http_addr = started.http_addr;
        info!(%grpc_addr, http = ?http_addr, nats = %config.nats_url, own_users = users.is_some(), "hermes stack ready");
        Ok(StackParts {
            grpc_addr,
            http_addr,
            registry,
            registry_config: config.registry,
            registry_bus,
            registry_run,
            identities: identities.is_some(),
            agents,
        })
    }

    /// Starts one more agent in this process (not with agents' own identities, which the
    /// registry issues only to the agents the stack started with).
    pub async fn add_agent(&mut self, config: AgentConfig) -> anyhow::Result<()> {
        if self.parts.identities {
            bail!("this stack's agents have identities of their own: start agents with it, not later");
        }
        let (id, types, handle) = spawn_agent(&mut self.cx, &self.bus, config).await?;
        self.parts.agents.insert(id, handle);
        wait_for_catalog(&self.bus, &types).await
    }

    /// Shuts one agent down gracefully (drain, then deregister) and waits for it.
    pub async fn stop_agent(&mut self, agent_id: &str) {
        if let Some(agent) = self.parts.agents.remove(agent_id) {
            agent.stop().await;
        }
    }

    /// Stops the registry and starts a fresh one, as a pod restart would. The new one rebuilds
    /// its table from the heartbeats mirrored in KV. The gRPC API keeps serving the old table.
    pub async fn restart_registry(&mut self) {
        let fresh = Registry::new(self.parts.registry_config.clone());
        let run = spawn_registry(&mut self.cx, &self.parts.registry_bus, &fresh);
        let old = std::mem::replace(&mut self.parts.registry_run, run);
        old.stop().await;
        self.parts.registry = fresh;
    }

    /// Stops the registry's NATS side, as a registry outage would: nothing answers catalogue or
    /// route requests and no agent is announced offline until [`Stack::restart_registry`].
    pub async fn stop_registry(&mut self) {
        self.parts.registry_run.halt().await;
    }

    /// The in-process registry's live table.
    pub fn registry(&self) -> &Registry {
        &self.parts.registry
    }

    /// The dispatcher's gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.parts.grpc_addr
    }

    /// The HTTP API's base URL (`http://127.0.0.1:PORT`), when it is on.
    pub fn http_url(&self) -> Option<String> {
        self.parts.http_addr.map(|a| format!("http://{a}"))
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.parts.grpc_addr)
    }

    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Waits until a service fails or the token is cancelled, then drains every service in
    /// reverse order of start, each within the context's drain timeout.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.cx.run().await
    }

    /// Cancels and drains.
    pub async fn stop(self) {
        self.shutdown.cancel();
        if let Err(e) = self.wait().await {
            warn!(error = %format!("{e:#}"), "the stack stopped with an error");
        }
    }
}

/// A connection of its own for service `service`, on `url` (a service's user, or an agent's
/// identity).
async fn connect_as(url: hermes_core::secret::SecretUrl, service: &str) -> anyhow::Result<Bus> {
    let config = hermes_core::BusConfig::new(url.clone()).with_name(format!("hermes-up {service}"));
    Bus::connect(config).await.with_context(|| format!("{service} cannot connect to NATS at {url}"))
}

/// Makes a token for each agent of `agents` and has the registry issue them their identities:
/// it answers the server's authorization requests (the auth callout) from now on. Agents of the
/// API tokens file (`[[agent]]` entries) are admitted too, so one started apart joins as itself.
async fn issue_identities(
    cx: &mut hermes_runtime::Context,
    registry_bus: &Bus,
    registry: &Registry,
    users: &crate::nats::LocalUsers,
    agents: &[AgentConfig],
    file: std::sync::Arc<hermes_core::access::Tokens>,
) -> anyhow::Result<HashMap<String, String>> {
    let tokens: HashMap<String, String> =
        agents.iter().map(|a| (a.agent_id.clone(), crate::nats::random_hex())).collect();
    let settings = hermes_registry::identities::IdentitySettings {
        issuer_seed: users.issuer_seed.clone(),
        ..Default::default()
    };
    let identities =
        hermes_registry::identities::Identities::new(&settings, file, registry_bus.topology().clone())?
            .context("the local server's identities issuer")?
            .with_local_agents(&tokens)
            .with_registry(registry.clone());
    let requests = hermes_registry::identities::listen(registry_bus).await?;
    let bus = registry_bus.clone();
    cx.spawn("identities", move |stop| {
        hermes_registry::identities::serve_requests(bus, identities, requests, stop)
    });
    Ok(tokens)
}

fn spawn_registry(cx: &mut hermes_runtime::Context, bus: &Bus, registry: &Registry) -> Stoppable {
    let (bus, registry) = (bus.clone(), registry.clone());
    Stoppable::spawn(cx, "registry", move |stop| hermes_registry::run(bus, registry, stop))
}

async fn spawn_agent(
    cx: &mut hermes_runtime::Context,
    bus: &Bus,
    config: AgentConfig,
) -> anyhow::Result<(String, Vec<String>, Stoppable)> {
    let id = config.agent_id.clone();
    let agent =
        Agent::build(bus.clone(), config).await.with_context(|| format!("failed to start agent {id}"))?;
    let types = agent.tool_registry().names().map(str::to_owned).collect();
    let agent_id = id.clone();
    let handle = Stoppable::spawn(cx, "agent", move |stop| async move {
        agent.run(stop).await.with_context(|| format!("agent {agent_id} failed"))
    });
    Ok((id, types, handle))
}

async fn wait_for_catalog(bus: &Bus, expected: &[String]) -> anyhow::Result<()> {
    let subject = bus.topology().catalog();
    for _ in 0..200 {
        let reply = tokio::time::timeout(
            Duration::from_millis(500),
            bus.client().request(subject.clone(), CatalogRequest {}.encode_to_vec().into()),
        )
        .await;
        if let Ok(Ok(reply)) = reply
            && let Ok(catalog) = CatalogReply::decode(reply.payload)
            && expected.iter().all(|t| catalog.entries.iter().any(|e| &e.task_type == t))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the registry did not list the local agents' task types within 10 s")
}

async fn wait_for_port(addr: SocketAddr) -> anyhow::Result<()> {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("the dispatcher did not accept connections on {addr}")
}
