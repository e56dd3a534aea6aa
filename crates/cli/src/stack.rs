//! The all-in-one stack: registry, executor agents and dispatcher in one process against one
//! NATS. Each service runs under a child of one cancellation token, so the whole stack stops
//! together, and tests can also stop or restart one service. `hermes up` runs it, and the
//! end-to-end tests start it in-process the same way. The registry's gRPC API is served on the
//! dispatcher's port.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use hermes_core::{Bus, BusConfig};
use hermes_dispatcher::{Dispatcher, DispatcherConfig};
use hermes_executor::{Agent, AgentConfig};
use hermes_proto::{CatalogReply, CatalogRequest};
use hermes_registry::{Registry, RegistryConfig, RegistryGrpc};
use prost::Message as _;
use std::collections::HashMap;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What to run.
#[derive(Debug, Clone)]
pub struct StackConfig {
    pub nats_url: String,
    pub registry: RegistryConfig,
    pub agents: Vec<AgentConfig>,
    pub dispatcher: DispatcherConfig,
    /// Runs a planner in the stack; goals given as text need one.
    pub planner: Option<hermes_planner::PlannerConfig>,
    /// Runs the memory service in the stack, its gRPC API on the dispatcher's port.
    pub memory: Option<hermes_memory::MemoryConfig>,
}

/// A running stack.
pub struct Stack {
    grpc_addr: SocketAddr,
    bus: Bus,
    shutdown: CancellationToken,
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
    registry: Registry,
    registry_config: RegistryConfig,
    registry_run: (CancellationToken, tokio::task::JoinHandle<anyhow::Result<()>>),
    agents: HashMap<String, (CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Stack {
    /// Starts every service and returns once the dispatcher accepts gRPC calls and the registry
    /// knows every local agent, so the first submitted plan validates.
    pub async fn start(config: StackConfig, shutdown: CancellationToken) -> anyhow::Result<Stack> {
        let bus = Bus::connect(BusConfig::new(&config.nats_url).with_name("hermes-up"))
            .await
            .context("failed to connect to NATS")?;
        let mut tasks = JoinSet::new();
        let registry = Registry::new(config.registry.clone());
        let registry_run = spawn_registry(&bus, &registry, &shutdown);
        let mut stack_agents = HashMap::new();
        let mut expected_types = Vec::new();
        for agent_config in config.agents {
            let (id, types, handle) = spawn_agent(&bus, agent_config, &shutdown).await?;
            expected_types.extend(types);
            stack_agents.insert(id, handle);
        }
        wait_for_catalog(&bus, &expected_types).await?;

        let mut dispatcher_config = config.dispatcher;
        if let Some(planner) = config.planner {
            dispatcher_config.planner = true;
            let (bus, token) = (bus.clone(), shutdown.child_token());
            tasks.spawn(async move { ("planner", hermes_planner::run(bus, planner, token).await) });
        }
        let mut dispatcher = Dispatcher::build(bus.clone(), dispatcher_config).await?;
        dispatcher
            .extra_services()
            .add_service(RegistryGrpc::new(registry.clone(), shutdown.clone()).into_service());
        if let Some(memory_config) = config.memory {
            let token = shutdown.child_token();
            let memory = hermes_memory::Memory::open(bus.clone(), memory_config, token.clone())
                .await
                .context("failed to start the memory service")?;
            dispatcher
                .extra_services()
                .add_service(hermes_memory::grpc::MemoryGrpc::new(memory.clone()).into_service());
            tasks.spawn(async move { ("memory", hermes_memory::run(memory, token).await) });
        }
        let grpc_addr = dispatcher.local_addr()?;
        let mut stack = Stack {
            grpc_addr,
            bus,
            shutdown: shutdown.clone(),
            tasks,
            registry,
            registry_config: config.registry,
            registry_run,
            agents: stack_agents,
        };
        let token = shutdown.child_token();
        stack.tasks.spawn(async move { ("dispatcher", dispatcher.run(token).await) });
        wait_for_port(grpc_addr).await?;
        info!(%grpc_addr, nats = %config.nats_url, "hermes stack ready");
        Ok(stack)
    }

    /// Starts one more agent in this process.
    pub async fn add_agent(&mut self, config: AgentConfig) -> anyhow::Result<()> {
        let (id, types, handle) = spawn_agent(&self.bus, config, &self.shutdown).await?;
        self.agents.insert(id, handle);
        wait_for_catalog(&self.bus, &types).await
    }

    /// Shuts one agent down gracefully (drain, then deregister) and waits for it.
    pub async fn stop_agent(&mut self, agent_id: &str) {
        if let Some((token, handle)) = self.agents.remove(agent_id) {
            token.cancel();
            let _ = handle.await;
        }
    }

    /// Stops the registry and starts a fresh one, as a pod restart would. The new one rebuilds
    /// its table from the heartbeats mirrored in KV. The gRPC API keeps serving the old table.
    pub async fn restart_registry(&mut self) {
        let (token, handle) = std::mem::replace(
            &mut self.registry_run,
            (CancellationToken::new(), tokio::spawn(async { Ok(()) })),
        );
        token.cancel();
        let _ = handle.await;
        self.registry = Registry::new(self.registry_config.clone());
        self.registry_run = spawn_registry(&self.bus, &self.registry, &self.shutdown);
    }

    /// The in-process registry's live table.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The dispatcher's gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Waits until a service stops on its own (an error) or the token is cancelled, then drains
    /// every service within `grace`.
    pub async fn wait(mut self, grace: Duration) -> anyhow::Result<()> {
        let first = tokio::select! {
            _ = self.shutdown.cancelled() => None,
            Some(done) = self.tasks.join_next() => Some(done),
        };
        self.shutdown.cancel();
        let mut failure = None;
        if let Some(Ok((name, Err(e)))) = first {
            failure = Some(e.context(format!("{name} stopped")));
        }
        let agents: Vec<_> = self.agents.drain().map(|(_, (_, handle))| handle).collect();
        let registry = self.registry_run.1;
        let drain = async {
            while let Some(done) = self.tasks.join_next().await {
                if let Ok((name, Err(e))) = done {
                    warn!(service = name, error = %e, "service stopped with an error");
                }
            }
            for agent in agents {
                let _ = agent.await;
            }
            if let Ok(Err(e)) = registry.await {
                warn!(service = "registry", error = %e, "service stopped with an error");
            }
        };
        if tokio::time::timeout(grace, drain).await.is_err() {
            warn!("services did not drain within the grace period");
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Cancels and drains.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.wait(Duration::from_secs(10)).await;
    }
}

fn spawn_registry(
    bus: &Bus,
    registry: &Registry,
    shutdown: &CancellationToken,
) -> (CancellationToken, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let token = shutdown.child_token();
    let run = hermes_registry::run(bus.clone(), registry.clone(), token.clone());
    (token, tokio::spawn(run))
}

type AgentHandle = (CancellationToken, tokio::task::JoinHandle<()>);

async fn spawn_agent(
    bus: &Bus,
    config: AgentConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<(String, Vec<String>, AgentHandle)> {
    let id = config.agent_id.clone();
    let agent =
        Agent::build(bus.clone(), config).await.with_context(|| format!("failed to start agent {id}"))?;
    let types = agent.tool_registry().names().map(str::to_owned).collect();
    let token = shutdown.child_token();
    let run_token = token.clone();
    let agent_id = id.clone();
    let handle = tokio::spawn(async move {
        if let Err(e) = agent.run(run_token).await {
            warn!(agent = %agent_id, error = %e, "agent stopped with an error");
        }
    });
    Ok((id, types, (token, handle)))
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
