//! The [`Service`] abstraction and the one runner every binary's `main` calls.
//!
//! A run goes: parse the command line, load the settings ([`crate::config`]), install logging
//! and trace export, watch for signals, serve metrics, let the service start its tasks on a
//! [`Context`] (connecting to NATS and adding gRPC services), serve one gRPC server for all of
//! them (health, reflection v1 and v1alpha, the message limit), then wait. On the first SIGTERM
//! or SIGINT, or when a task fails, the tasks are drained in the reverse order of their start,
//! the gRPC server first, each under the drain timeout; a second signal exits at once. Telemetry
//! is flushed last, under a timeout.

use std::ffi::OsString;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use hermes_core::Bus;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{self, CONFIG_FILE_ENV, ConfigError, Sources};
use crate::settings::{NatsSettings, ServiceSettings};

/// One Hermes service: what it is called and how it starts.
pub trait Service: 'static {
    /// The binary's name: the connection name, the telemetry service name and the log prefix.
    const NAME: &'static str;
    /// One line for `--help`.
    const ABOUT: &'static str;
    /// The service name in traces (`OTEL_SERVICE_NAME` overrides it).
    const TELEMETRY_NAME: &'static str = Self::NAME;
    type Settings: ServiceSettings;

    /// Starts the service's work on `cx`: connect ([`Context::connect`]), spawn named tasks
    /// ([`Context::spawn`]) and add gRPC services ([`Context::grpc`]). Returns once started; the
    /// runner then waits and drains.
    fn start(settings: Self::Settings, cx: &mut Context) -> impl Future<Output = anyhow::Result<()>>;
}

/// What the command line asked for.
pub enum Invocation<S> {
    /// Run with these settings.
    Run(S),
    /// Printed what was asked (`--print-config`, `--print-env`, `--help`); exit with this code.
    Exit(i32),
}

/// The command line of a service with settings `S`: `--config FILE`, `--print-config`, and one
/// flag for each setting, named after its key (see [`crate::config`]).
pub fn command<S: crate::Settings>(name: &'static str, about: &'static str) -> clap::Command {
    let mut command = clap::Command::new(name)
        .about(about)
        .version(env!("CARGO_PKG_VERSION"))
        .arg(
            clap::Arg::new("config")
                .long("config")
                .value_name("FILE")
                .value_parser(clap::value_parser!(std::path::PathBuf))
                .help(format!("A settings file (TOML) [env: {CONFIG_FILE_ENV}]")),
        )
        .arg(
            clap::Arg::new("print-config")
                .long("print-config")
                .action(clap::ArgAction::SetTrue)
                .help("Print the effective settings (secrets masked) and exit"),
        )
        .arg(
            clap::Arg::new("print-env")
                .long("print-env")
                .action(clap::ArgAction::SetTrue)
                .hide(true)
                .help("Print every environment variable the settings read, one a line, and exit"),
        )
        .next_help_heading("Settings (each also a key of the settings file and a HERMES_ variable)");
    for key in config::keys::<S>() {
        let mut help = S::describe(&key.path).map(str::to_owned).unwrap_or_default();
        if !help.is_empty() {
            help.push(' ');
        }
        help.push_str(&format!("[key: {}] [env: {}]", key.path, key.env()));
        let aliases: Vec<String> = S::aliases()
            .iter()
            .filter(|(_, path)| *path == key.path)
            .map(|(alias, _)| alias.replace('_', "-"))
            .collect();
        if let Some(first) = aliases.first() {
            help.push_str(&format!(" [also: HERMES_{}]", first.replace('-', "_").to_ascii_uppercase()));
        }
        if !key.default.is_empty() {
            help.push_str(&format!(" [default: {}]", key.default));
        }
        let value_name = if key.list {
            "LIST"
        } else if key.switch {
            "BOOL"
        } else {
            "VALUE"
        };
        let mut arg =
            clap::Arg::new(key.flat()).long(key.flag()).aliases(aliases).value_name(value_name).help(help);
        arg = match key.switch {
            true => arg.num_args(0..=1).default_missing_value("true"),
            false => arg.num_args(1),
        };
        command = command.arg(arg);
    }
    command
}

/// Parses `args` (with the program name first) and loads the settings, or prints what was asked.
pub fn parse<S: crate::Settings>(
    name: &'static str,
    about: &'static str,
    args: impl IntoIterator<Item = OsString>,
) -> Result<Invocation<S>, ConfigError> {
    let matches = match command::<S>(name, about).try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return Ok(Invocation::Exit(code));
        }
    };
    let keys = config::keys::<S>();
    if matches.get_flag("print-env") {
        for key in &keys {
            println!("{}\n{}", key.env(), key.env_nested());
        }
        for (alias, _) in S::aliases() {
            println!("HERMES_{}", alias.to_ascii_uppercase());
        }
        return Ok(Invocation::Exit(0));
    }
    let mut sources = Sources::from_env();
    sources.file = matches
        .get_one::<std::path::PathBuf>("config")
        .cloned()
        .or_else(|| std::env::var_os(CONFIG_FILE_ENV).filter(|v| !v.is_empty()).map(Into::into));
    for key in &keys {
        let id = key.flat();
        if matches.value_source(&id) == Some(clap::parser::ValueSource::CommandLine)
            && let Some(value) = matches.get_one::<String>(&id)
        {
            sources.flags.push((id, value.clone()));
        }
    }
    let settings: S = config::load(&sources)?;
    if matches.get_flag("print-config") {
        print!("{}", config::to_masked_toml(&settings));
        return Ok(Invocation::Exit(0));
    }
    Ok(Invocation::Run(settings))
}

/// The exit code of a service that could not load its settings, could not start, or failed
/// (0: stopped cleanly; 130: a second signal).
pub const EXIT_ERROR: i32 = 2;

/// A binary's whole `main`: parse, load, run `S` on a multi-threaded runtime, exit.
pub fn main<S: Service>() -> ! {
    main_with_args::<S>(std::env::args_os())
}

/// [`main`] with the command line given (`hermes agent ...` passes its own).
pub fn main_with_args<S: Service>(args: impl IntoIterator<Item = OsString>) -> ! {
    let settings = match parse::<S::Settings>(S::NAME, S::ABOUT, args) {
        Ok(Invocation::Run(settings)) => settings,
        Ok(Invocation::Exit(code)) => std::process::exit(code),
        Err(e) => {
            eprintln!("{}: {e}", S::NAME);
            std::process::exit(EXIT_ERROR);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{}: cannot start the async runtime: {e}", S::NAME);
            std::process::exit(EXIT_ERROR);
        }
    };
    let result = runtime.block_on(run::<S>(settings));
    // Tasks that ignored their drain deadline are not waited for.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("{}: {e:#}", S::NAME);
            std::process::exit(EXIT_ERROR);
        }
    }
}

/// Runs `S` until a signal or a task failure, drains it, and flushes telemetry.
pub async fn run<S: Service>(settings: S::Settings) -> anyhow::Result<()> {
    let telemetry = hermes_core::telemetry::init(S::TELEMETRY_NAME);
    // The first SIGTERM or SIGINT cancels it; a second exits at once.
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    let result = async {
        let mut cx = Context::new(S::NAME, settings.drain_timeout(), shutdown.clone());
        if let Some(addr) = settings.metrics_listen() {
            let token = CancellationToken::new();
            hermes_core::metrics::serve_if(Some(addr), token.clone()).await?;
            let served = token.clone();
            cx.push(
                "metrics",
                token,
                tokio::spawn(async move {
                    served.cancelled().await;
                    Ok(())
                }),
            );
        }
        S::start(settings, &mut cx).await?;
        cx.run().await
    }
    .await;
    // Telemetry last: spans of the drain are exported too.
    let flush = tokio::task::spawn_blocking(move || drop(telemetry));
    if tokio::time::timeout(Duration::from_secs(5), flush).await.is_err() {
        eprintln!("{}: telemetry did not flush within 5 s", S::NAME);
    }
    result
}

/// A task the runner drains.
struct Task {
    name: &'static str,
    token: CancellationToken,
    handle: JoinHandle<anyhow::Result<()>>,
}

/// The gRPC server a service's [`Context::grpc`] calls build up.
type Grpc = hermes_core::grpc::Server;

/// What a starting [`Service`] builds on: the NATS connection, named tasks and the gRPC server.
pub struct Context {
    name: &'static str,
    bus: Option<Bus>,
    shutdown: CancellationToken,
    drain_timeout: Duration,
    tasks: Vec<Task>,
    grpc: Option<Grpc>,
    /// The gRPC server's address once [`Context::serve`] started it.
    served_grpc: Option<SocketAddr>,
}

impl Context {
    /// An empty context; `shutdown` starts the drain when cancelled.
    pub fn new(name: &'static str, drain_timeout: Duration, shutdown: CancellationToken) -> Self {
        Context { name, bus: None, shutdown, drain_timeout, tasks: Vec::new(), grpc: None, served_grpc: None }
    }

    /// Connects to NATS (once; later calls return the same connection).
    pub async fn connect(&mut self, nats: &NatsSettings) -> anyhow::Result<Bus> {
        if let Some(bus) = &self.bus {
            return Ok(bus.clone());
        }
        let bus = Bus::connect(nats.bus_config(self.name))
            .await
            .with_context(|| format!("failed to connect to NATS at {}", nats.url))?;
        self.bus = Some(bus.clone());
        Ok(bus)
    }

    /// The connection, once [`Context::connect`] made it.
    pub fn bus(&self) -> Option<&Bus> {
        self.bus.as_ref()
    }

    /// Makes `bus` the connection that the services started next get from [`Context::bus`], and
    /// returns the one before: `hermes up` starts each in-process service on its own NATS user.
    pub fn use_bus(&mut self, bus: Bus) -> Option<Bus> {
        self.bus.replace(bus)
    }

    /// The process-wide shutdown token: cancelled on the first signal or a task's failure.
    /// Long-lived streams (gRPC watches) end on it; workers should use their own task token.
    pub fn shutdown(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Spawns a named task. It gets its own token, cancelled when its turn to drain comes
    /// (tasks drain in reverse order of spawning); it should then finish what it started and
    /// return. A task that fails before shutdown shuts the process down with its error.
    pub fn spawn<F, Fut>(&mut self, name: &'static str, task: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let token = CancellationToken::new();
        let span = tracing::info_span!("task", service = self.name, task = name);
        let handle = tokio::spawn(tracing::Instrument::instrument(task(token.clone()), span));
        self.push(name, token, handle);
    }

    /// [`Context::spawn`] for a worker loop that returns nothing (it logs its own errors).
    pub fn spawn_loop<F, Fut>(&mut self, name: &'static str, task: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.spawn(name, move |token| {
            let work = task(token);
            async move {
                work.await;
                Ok(())
            }
        });
    }

    fn push(&mut self, name: &'static str, token: CancellationToken, handle: JoinHandle<anyhow::Result<()>>) {
        self.tasks.push(Task { name, token, handle });
    }

    /// Binds the gRPC server's port, unless an earlier call did (services composed in one
    /// process share the first one's), and returns its address. `max_message_bytes` is the
    /// largest request decoded; `setting` names where it is set, for the over-limit error.
    pub async fn grpc_listen(
        &mut self,
        addr: SocketAddr,
        max_message_bytes: usize,
        setting: &'static str,
    ) -> anyhow::Result<SocketAddr> {
        if let Some(addr) = self.grpc_addr() {
            return Ok(addr);
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for gRPC on {addr}"))?;
        let local = listener.local_addr()?;
        self.grpc = Some(Grpc {
            listener,
            routes: tonic::service::RoutesBuilder::default(),
            names: Vec::new(),
            max_message_bytes,
            setting,
            tls: None,
            guard: None,
        });
        Ok(local)
    }

    /// Checks every gRPC request with `guard` before its service sees it (the dispatcher guards
    /// the services composed beside it, which check no credentials themselves).
    pub fn grpc_guard(&mut self, guard: hermes_core::grpc::Guard) -> anyhow::Result<()> {
        let grpc = self.grpc.as_mut().context("grpc_listen must come before grpc_guard")?;
        grpc.guard = Some(guard);
        Ok(())
    }

    /// Guards the gRPC services that check no credentials themselves (the Registry and Memory
    /// APIs, served on their own) with the API tokens of `file` (`hermes_core::access::guard`);
    /// empty: none, with a warning when the server listens beyond loopback, since any caller
    /// reaching it is then trusted with the tenant it names.
    /// The file is read again on SIGHUP (`hermes_core::access::Tokens`); its tokens are returned.
    pub fn grpc_api_tokens(
        &mut self,
        file: &str,
    ) -> anyhow::Result<std::sync::Arc<hermes_core::access::Tokens>> {
        let tokens = hermes_core::access::Tokens::from_setting(file)?;
        if tokens.current().enabled() {
            tokens.reload_on_hangup(self.shutdown());
            self.grpc_guard(hermes_core::access::guard(tokens.clone()))?;
            return Ok(tokens);
        }
        if let Some(addr) = self.grpc_addr().filter(|a| !a.ip().is_loopback()) {
            tracing::warn!(
                %addr,
                "serving gRPC beyond loopback with no API tokens (api_tokens_file, HERMES_API_TOKENS_FILE): any caller that reaches the port is served, the Memory API in whatever tenant it names; keep it internal (docs/security.md)"
            );
        }
        Ok(tokens)
    }

    /// Serves gRPC over TLS with `tls` (mTLS when it names client CAs), unless an earlier call
    /// set TLS (services composed in one process share the first one's server). Call it after
    /// [`Context::grpc_listen`].
    pub fn grpc_tls(&mut self, tls: Option<hermes_core::tls::TlsFiles>) -> anyhow::Result<()> {
        let grpc = self.grpc.as_mut().context("grpc_listen must come before grpc_tls")?;
        if grpc.tls.is_none() {
            grpc.tls = tls;
        }
        Ok(())
    }

    /// The gRPC server's address, once bound.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.served_grpc.or_else(|| self.grpc.as_ref().and_then(|g| g.listener.local_addr().ok()))
    }

    /// The largest gRPC request the server decodes; services build their servers with it.
    pub fn grpc_max_message_bytes(&self) -> usize {
        self.grpc.as_ref().map_or(hermes_core::grpc::DEFAULT_MAX_MESSAGE_BYTES, |g| g.max_message_bytes)
    }

    /// The routes of the gRPC server, to add the service named `name` (reported by health);
    /// `None` until [`Context::grpc_listen`].
    pub fn grpc(&mut self, name: &'static str) -> anyhow::Result<&mut tonic::service::RoutesBuilder> {
        let grpc = self.grpc.as_mut().context("grpc_listen must come before adding gRPC services")?;
        grpc.names.push(name);
        Ok(&mut grpc.routes)
    }

    /// Starts serving gRPC, when a service added any routes; later calls do nothing. The server
    /// is the last task, so it is the first drained.
    pub fn serve(&mut self) -> anyhow::Result<()> {
        let Some(grpc) = self.grpc.take() else { return Ok(()) };
        let token = CancellationToken::new();
        let addr = grpc.listener.local_addr()?;
        info!(%addr, services = ?grpc.names, tls = grpc.tls.is_some(), mtls = grpc.tls.as_ref().is_some_and(|t| t.mutual()), "serving gRPC");
        let served = token.clone();
        self.served_grpc = Some(addr);
        self.push(
            "grpc",
            token,
            tokio::spawn(async move {
                hermes_core::grpc::serve(grpc, served).await?;
                Ok(())
            }),
        );
        Ok(())
    }

    /// Serves gRPC (see [`Context::serve`]), waits for the shutdown token or a task's failure,
    /// then drains every task in reverse order of spawning, each within the drain timeout. A task
    /// that ends cleanly before shutdown is just gone (an agent stopped on its own); one that
    /// fails shuts the rest down and its error is returned.
    pub async fn run(mut self) -> anyhow::Result<()> {
        self.serve()?;
        let mut failure = None;
        loop {
            let ended = futures_first(&mut self.tasks);
            tokio::select! {
                _ = self.shutdown.cancelled() => break,
                (index, result) = ended => {
                    let task = self.tasks.remove(index);
                    match result {
                        Ok(Ok(())) => info!(task = task.name, "task finished"),
                        Ok(Err(e)) => {
                            failure = Some(e.context(format!("{} stopped", task.name)));
                            break;
                        }
                        Err(e) => {
                            failure = Some(anyhow::anyhow!("{} panicked: {e}", task.name));
                            break;
                        }
                    }
                }
            }
        }
        self.shutdown.cancel();
        info!(service = self.name, tasks = self.tasks.len(), "draining");
        while let Some(mut task) = self.tasks.pop() {
            task.token.cancel();
            match tokio::time::timeout(self.drain_timeout, &mut task.handle).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => {
                    warn!(task = task.name, error = %format!("{e:#}"), "task stopped with an error")
                }
                Ok(Err(e)) => warn!(task = task.name, error = %e, "task panicked"),
                Err(_) => {
                    warn!(
                        task = task.name,
                        timeout_s = self.drain_timeout.as_secs(),
                        "task did not drain in time; stopped"
                    );
                    task.handle.abort();
                }
            }
        }
        info!(service = self.name, "stopped");
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The first task to end: its index and result.
async fn futures_first(tasks: &mut [Task]) -> (usize, Result<anyhow::Result<()>, tokio::task::JoinError>) {
    if tasks.is_empty() {
        return std::future::pending().await;
    }
    std::future::poll_fn(|cx| {
        for (index, task) in tasks.iter_mut().enumerate() {
            if let std::task::Poll::Ready(result) = std::pin::Pin::new(&mut task.handle).poll(cx) {
                return std::task::Poll::Ready((index, result));
            }
        }
        std::task::Poll::Pending
    })
    .await
}
