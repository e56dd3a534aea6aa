//! The all-in-one stack: registry, executor agents and dispatcher in one process against one
//! NATS, sharing one cancellation token. `hermes up` runs it, and the end-to-end tests start it
//! in-process the same way.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use hermes_core::{Bus, BusConfig};
use hermes_dispatcher::{Dispatcher, DispatcherConfig};
use hermes_executor::{Agent, AgentConfig};
use hermes_proto::{CatalogReply, CatalogRequest};
use hermes_registry::RegistryConfig;
use prost::Message as _;
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
}

/// A running stack.
pub struct Stack {
    grpc_addr: SocketAddr,
    bus: Bus,
    shutdown: CancellationToken,
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
}

impl Stack {
    /// Starts every service and returns once the dispatcher accepts gRPC calls and the registry
    /// knows every local agent, so the first submitted plan validates.
    pub async fn start(config: StackConfig, shutdown: CancellationToken) -> anyhow::Result<Stack> {
        let bus = Bus::connect(BusConfig::new(&config.nats_url).with_name("hermes-up"))
            .await
            .context("failed to connect to NATS")?;
        let mut tasks = JoinSet::new();

        let registry_bus = bus.clone();
        let registry_token = shutdown.clone();
        let registry_config = config.registry.clone();
        tasks.spawn(async move {
            ("registry", hermes_registry::run(registry_bus, registry_config, registry_token).await)
        });

        let mut expected_types = Vec::new();
        for agent_config in config.agents {
            let id = agent_config.agent_id.clone();
            let agent = Agent::build(bus.clone(), agent_config)
                .await
                .with_context(|| format!("failed to start agent {id}"))?;
            expected_types.extend(agent.tool_registry().names().map(str::to_owned));
            let token = shutdown.clone();
            tasks.spawn(async move { ("executor", agent.run(token).await.map_err(anyhow::Error::from)) });
        }

        wait_for_catalog(&bus, &expected_types).await?;

        let dispatcher = Dispatcher::build(bus.clone(), config.dispatcher).await?;
        let grpc_addr = dispatcher.local_addr()?;
        let token = shutdown.clone();
        tasks.spawn(async move { ("dispatcher", dispatcher.run(token).await) });
        wait_for_port(grpc_addr).await?;
        info!(%grpc_addr, nats = %config.nats_url, "hermes stack ready");
        Ok(Stack { grpc_addr, bus, shutdown, tasks })
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
        let drain = async {
            while let Some(done) = self.tasks.join_next().await {
                if let Ok((name, Err(e))) = done {
                    warn!(service = name, error = %e, "service stopped with an error");
                }
            }
        };
        if tokio::time::timeout(grace, drain).await.is_err() {
            warn!("services did not drain within the grace period");
            self.tasks.abort_all();
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
