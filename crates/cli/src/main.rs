//! `hermes`: `hermes up` runs the whole stack in one process for development; every other
//! command is a gRPC client of a dispatcher (`--server`, env `HERMES_SERVER`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use hermes_proto::event::Kind;
use hermes_proto::{
    CancelGoalRequest, GetGoalRequest, Goal, GoalSpec, GoalStatus, ListGoalsRequest, NodeStatus,
    SubmitGoalRequest, WatchGoalRequest,
};
use tonic::transport::Channel;

#[derive(Parser, Debug)]
#[command(name = "hermes", version, about = "Hermes: a distributed orchestrator for AI agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug, Clone)]
struct ServerArg {
    /// Dispatcher gRPC address; `https://host:port` speaks TLS.
    #[arg(long, env = "HERMES_SERVER", default_value = "127.0.0.1:50051", global = true)]
    server: String,
    /// API token, sent as `authorization: Bearer <token>` when the dispatcher has auth on
    /// (docs/security.md).
    #[arg(long, env = "HERMES_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// CA certificate (PEM) to trust for an `https://` server, instead of the system's roots.
    #[arg(long, env = "HERMES_CA_FILE", global = true)]
    ca_file: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for a server that requires one (mTLS), with --key-file.
    #[arg(long, env = "HERMES_CERT_FILE", global = true, requires = "key_file")]
    cert_file: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "HERMES_KEY_FILE", global = true, requires = "cert_file")]
    key_file: Option<std::path::PathBuf>,
}

/// Where `hermes replay` gets its model answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ReplayModelArg {
    Recorded,
    Live,
}

/// `hermes eval ...`.
#[derive(Subcommand, Debug)]
enum EvalCommand {
    /// The runs stored by earlier `hermes eval` runs, oldest first.
    Show {
        #[arg(long, default_value = ".hermes/evals")]
        store: PathBuf,
    },
}

/// `hermes dlq ...`.
#[derive(Subcommand, Debug)]
enum CacheCommand {
    /// Cached results by tool: live entries and their bytes, calls in flight, expired entries.
    Stats {
        /// Only this tool's.
        #[arg(long)]
        tool: Option<String>,
    },
    /// Removes cached results: every tool's, or one's.
    Clear {
        /// Only this tool's.
        #[arg(long)]
        tool: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum DlqCommand {
    /// List dead letters, oldest first.
    List {
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show one dead letter with its payload decoded.
    Show { sequence: u64 },
    /// Publish a dead letter again on its original subject and remove it from the DLQ.
    Replay { sequence: u64 },
}

/// `hermes webhooks ...` (docs/webhooks.md).
#[derive(Subcommand, Debug)]
enum WebhooksCommand {
    /// Register a standing endpoint for your tenant's goals; prints its signing secret, once.
    Add {
        url: String,
        /// An event type to send (repeat for several): goal.completed, goal.failed,
        /// goal.cancelled, goal.needs_input, approval.expired. None: all of them.
        #[arg(long = "event")]
        events: Vec<String>,
        /// A signing secret to use (`whsec_...`); none: one is made.
        #[arg(long, default_value = "")]
        secret: String,
    },
    /// List your tenant's standing endpoints.
    List,
    /// Remove a standing endpoint.
    Remove { id: String },
    /// Give an endpoint a new signing secret (printed once); the previous one keeps signing
    /// beside it until the next rotation.
    Rotate { id: String },
    /// Deliveries with their attempts, newest first.
    Deliveries {
        /// Only this goal's.
        #[arg(long, default_value = "")]
        goal: String,
        /// Only this endpoint's.
        #[arg(long, default_value = "")]
        endpoint: String,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// One JSON object a line instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Send a delivered or dead-lettered delivery again.
    Resend { id: String },
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run every service in this process (development mode); `hermes up --help` lists its
    /// settings.
    #[command(disable_help_flag = true)]
    Up {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Run a planner in this process (the same as the `hermes-planner` binary).
    #[command(disable_help_flag = true)]
    Planner {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Run executor agents in this process (the same as the `hermes-executor` binary).
    #[command(disable_help_flag = true)]
    Agent {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Print the NATS URL, with its password, of the nats-server a running `hermes up` started,
    /// for processes that join its bus (a Python worker: `HERMES_NATS_URL=$(hermes nats-url)`).
    NatsUrl {
        /// The running `hermes up`'s data dir.
        #[arg(long, env = "HERMES_DATA_DIR", default_value = ".hermes")]
        data_dir: std::path::PathBuf,
    },
    /// Make an issuer key for agents' NATS identities (`deploy/nats/identities.conf`): prints the
    /// seed for `hermes-registry` (`HERMES_IDENTITIES_ISSUER_SEED`, a secret) and its public key
    /// for the nats-server (`HERMES_IDENTITIES_ISSUER`).
    IdentitiesIssuer,
    /// Make an agent token for agent `id`'s NATS identity: prints the token (the agent's NATS
    /// password, as the user `agent_<id>`) and the `[[agent]]` entry for the API tokens file.
    AgentToken {
        /// The agent's id (`--agent-id` of `hermes agent`).
        id: String,
    },
    /// List live agents with their load.
    Agents {
        #[command(flatten)]
        server: ServerArg,
    },
    /// Submit a goal: text (needs a planner) or `--plan FILE`.
    Submit {
        /// The goal in plain language.
        text: Option<String>,
        /// A plan file (YAML or JSON).
        #[arg(long)]
        plan: Option<PathBuf>,
        /// Print live progress and the final output; exit non-zero if the goal fails. When stdin
        /// is a terminal, calls waiting for approval are offered as a y/n question.
        #[arg(long)]
        watch: bool,
        /// With --watch, ask y/n for approvals even when stdin is not a terminal (answers are
        /// read line by line from stdin).
        #[arg(long, requires = "watch")]
        interactive: bool,
        #[arg(long, default_value = "")]
        idempotency_key: String,
        #[arg(long, default_value = "")]
        session: String,
        /// Whole-goal timeout in seconds (0: the server default).
        #[arg(long, default_value_t = 0)]
        timeout_secs: u64,
        /// Token budget: the goal fails with BUDGET_EXCEEDED past this many LLM tokens (0: none).
        #[arg(long, default_value_t = 0)]
        max_tokens: u64,
        /// Cost budget in US dollars, at the dispatcher's configured prices (0: none).
        #[arg(long, default_value_t = 0.0)]
        max_cost_usd: f64,
        /// A webhook URL sent the goal's end and its waits for approval, signed (repeat for
        /// several; docs/webhooks.md). Each one's signing secret is printed once.
        #[arg(long = "callback")]
        callbacks: Vec<String>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Outbound webhooks: standing endpoints and deliveries.
    Webhooks {
        #[command(subcommand)]
        command: WebhooksCommand,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Dead letters: messages that could not be processed.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
        #[command(flatten)]
        server: ServerArg,
    },
    /// The audit trail, oldest first: who submitted, cancelled, approved, denied or replayed
    /// what, when, from where, and how it ended (operators; their own tenant's records).
    Audit {
        /// Records after this sequence number (page with the last SEQ shown).
        #[arg(long, default_value_t = 0)]
        after: u64,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// One JSON object a line instead of the table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: ServerArg,
    },
    /// The tool-result cache (operators): entries by tool, or clear them.
    Cache {
        #[command(subcommand)]
        command: CacheCommand,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Show memory: sessions, artifacts, semantic search.
    Memory {
        #[command(subcommand)]
        command: hermes_cli::memory_cmd::MemoryCommand,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Approve a tool call that waits for confirmation.
    Approve {
        goal_id: String,
        call_id: String,
        #[arg(long, default_value = "")]
        note: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Deny a tool call that waits for confirmation.
    Deny {
        goal_id: String,
        call_id: String,
        #[arg(long, default_value = "")]
        note: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Print a goal's output (or a node's, with --node), with the artifacts that large outputs
    /// stand for read in place of their stubs: text as it is, anything else as JSON.
    Output {
        goal_id: String,
        /// A node's output instead of the goal's.
        #[arg(long)]
        node: Option<String>,
        /// Write it to this file instead of stdout.
        #[arg(short, long)]
        output: Option<std::path::PathBuf>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Show a goal.
    Get {
        goal_id: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Run an eval suite (YAML) against the stack at --server, or `hermes eval show` the runs
    /// stored before (docs/evaluation.md). Exits non-zero when a case fails or regresses.
    #[command(args_conflicts_with_subcommands = true)]
    Eval {
        #[command(subcommand)]
        command: Option<EvalCommand>,
        /// The suite file.
        suite: Option<PathBuf>,
        /// Write the run as JSON here (what --baseline reads).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write JUnit XML here, for CI.
        #[arg(long)]
        junit: Option<PathBuf>,
        /// An earlier run's JSON: cases whose success rate fell are regressions (and fail the run).
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Where runs are stored for `hermes eval show`.
        #[arg(long, default_value = ".hermes/evals")]
        store: PathBuf,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Run a finished goal again in a fresh stack, its recorded model answers served in place of a
    /// model, and compare the runs; exits 1 on a divergence (docs/evaluation.md).
    Replay {
        goal_id: String,
        /// The replay's agents' workspace (where the goal's files are).
        #[arg(long, default_value = ".")]
        workspace: PathBuf,
        /// `live`: tools run again. `recorded`: tools with side effects or that reach the network
        /// are answered from the record and never run, and so are task types the replay's agent
        /// lacks (a Python worker's, another pool's, an MCP server's).
        #[arg(long, value_enum, default_value_t = hermes_cli::replay_cmd::Tools::Live)]
        tools: hermes_cli::replay_cmd::Tools,
        /// `recorded`: the record answers every model request. `live`: the configured model
        /// (`--llm-*`, or the `HERMES_LLM_*` variables `hermes up` reads) answers, and each answer
        /// that differs from the record is a divergence.
        #[arg(long, value_enum, default_value_t = ReplayModelArg::Recorded)]
        model: ReplayModelArg,
        /// `openai` or `local` (the embedded model), for `--model live`.
        #[arg(long, env = "HERMES_LLM_PROVIDER")]
        llm_provider: Option<String>,
        /// The OpenAI-compatible base URL, for `--model live`.
        #[arg(long, env = "HERMES_LLM_BASE_URL")]
        llm_base_url: Option<String>,
        /// The model's name, for `--model live`.
        #[arg(long, env = "HERMES_LLM_MODEL")]
        llm_model: Option<String>,
        /// Run the goal again in this running stack (a dispatcher address, with the same
        /// token and TLS settings as `--server`) instead of a fresh one: its own model and tools
        /// answer, and the runs are compared.
        #[arg(long, conflicts_with_all = ["tools", "model"])]
        against: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// A goal's timeline: steps, agents, tools, durations and tokens (see docs/observability.md).
    Trace {
        goal_id: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Follow a goal's events from the start until it ends.
    Watch {
        goal_id: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Cancel a goal.
    Cancel {
        goal_id: String,
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// List recent goals.
    List {
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        server: ServerArg,
    },
}

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // A child started to run one isolated tool job (a template render) does only that.
    hermes_executor::isolate::serve_if_child();
    let cli = Cli::parse();
    // The service commands run through the service runtime, like the service binaries.
    let service_args = |name: &str, args: Vec<std::ffi::OsString>| {
        std::iter::once(std::ffi::OsString::from(name)).chain(args).collect::<Vec<_>>()
    };
    match cli.command {
        // Processes that run agents run as the child of a crash supervisor, so a task that
        // crashes them is counted and quarantined (see `hermes_executor::supervise`).
        Command::Up { args } => {
            hermes_executor::supervise::supervise_unless_child("hermes");
            hermes_executor::isolate::enable();
            hermes_runtime::main_with_args::<hermes_cli::up::UpService>(service_args("hermes up", args))
        }
        Command::Agent { args } => {
            // A lean idle agent (`hermes_executor::lean`), for this process and its worker.
            hermes_executor::lean::lean();
            hermes_executor::supervise::supervise_unless_child("hermes");
            hermes_executor::isolate::enable();
            hermes_runtime::main_with_args::<hermes_executor::service::ExecutorService>(service_args(
                "hermes agent",
                args,
            ))
        }
        Command::Planner { args } => {
            hermes_runtime::main_with_args::<hermes_planner::service::PlannerService>(service_args(
                "hermes planner",
                args,
            ))
        }
        _ => {}
    }
    hermes_executor::isolate::enable();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Submit {
            text,
            plan,
            watch,
            interactive,
            idempotency_key,
            session,
            timeout_secs,
            max_tokens,
            max_cost_usd,
            callbacks,
            server,
        } => {
            let plan = match (&text, &plan) {
                (Some(_), Some(_)) => bail!("give either goal text or --plan, not both"),
                (None, None) => bail!("give goal text or --plan FILE"),
                (_, Some(path)) => Some(hermes_cli::plan_file::load_plan(path)?),
                (Some(_), None) => None,
            };
            let mut client = connect(&server).await?;
            let spec = GoalSpec {
                text: text.unwrap_or_default(),
                plan,
                session_id: session,
                idempotency_key,
                timeout_ms: timeout_secs * 1000,
                max_tokens,
                max_cost_usd,
                callbacks: callbacks
                    .iter()
                    .map(|url| hermes_proto::Callback { url: url.clone(), ..Default::default() })
                    .collect(),
                ..Default::default()
            };
            let mut request = tonic::Request::new(SubmitGoalRequest { spec: Some(spec) });
            // A caller inside a trace (TRACEPARENT, as CI systems and otel-cli set it) makes the
            // goal's trace part of it.
            if let Some(parent) =
                std::env::var("TRACEPARENT").ok().and_then(|v| hermes_core::trace::TraceContext::parse(&v))
                && let Ok(value) = parent.to_header().parse()
            {
                request.metadata_mut().insert(hermes_core::trace::TRACEPARENT, value);
            }
            let reply = client.submit_goal(request).await.map_err(status_error)?.into_inner();
            if reply.duplicate {
                println!("goal {} (already submitted with this idempotency key)", reply.goal_id);
            } else {
                println!("goal {}", reply.goal_id);
            }
            for (url, secret) in callbacks.iter().zip(&reply.callback_secrets) {
                println!("callback {url} signing secret {secret} (shown once)");
            }
            if watch {
                use std::io::IsTerminal as _;
                let ask = interactive || std::io::stdin().is_terminal();
                return watch_goal(&mut client, &reply.goal_id, ask).await;
            }
            Ok(0)
        }
        Command::Up { .. } | Command::Planner { .. } | Command::Agent { .. } => {
            bail!("service commands are run by main, not here")
        }
        Command::NatsUrl { data_dir } => {
            println!("{}", hermes_cli::nats::local_url(&data_dir.join("nats"))?);
            Ok(0)
        }
        Command::IdentitiesIssuer => {
            let issuer = nkeys::KeyPair::new_account();
            println!("HERMES_IDENTITIES_ISSUER_SEED={}", issuer.seed()?);
            println!("HERMES_IDENTITIES_ISSUER={}", issuer.public_key());
            eprintln!(
                "the seed goes to hermes-registry only (keep it secret); the public key to the nats-server (identities.conf)"
            );
            Ok(0)
        }
        Command::AgentToken { id } => {
            hermes_core::topology::validate_agent_id(&id)?;
            let token: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
            use sha2::Digest as _;
            let sha: String =
                sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
            println!("{token}");
            eprintln!(
                "add to the API tokens file:\n\n[[agent]]\nid = \"{id}\"\nsha256 = \"{sha}\"\n\nthe agent connects as nats://agent_{id}:<token>@<nats host>:4222"
            );
            Ok(0)
        }
        Command::Agents { server } => {
            let credentials = hermes_cli::api_client::Credentials::bearer(server.token.as_deref())?;
            let mut client = hermes_cli::api_client::registry(channel(&server).await?, credentials);
            let agents = client
                .list_agents(hermes_proto::ListAgentsRequest {})
                .await
                .map_err(status_error)?
                .into_inner()
                .agents;
            println!(
                "{:<20} {:<10} {:>9} {:<13} {:>8} {:>8} {:>9}  TASK TYPES",
                "AGENT", "POOL", "LOAD/MAX", "HEALTH", "SUCCESS", "LAT MS", "ASSIGNED"
            );
            for info in agents {
                let hb = info.heartbeat.clone().unwrap_or_default();
                let state = if hb.draining { " (draining)" } else { "" };
                // The routing view's latency (its slowest task type) where it has one.
                let latency = info.latency_ms.values().copied().reduce(f64::max).unwrap_or(hb.latency_ms);
                println!(
                    "{:<20} {:<10} {:>9} {:<13} {:>7.0}% {:>8.1} {:>9}  {}{state}",
                    hb.agent_id,
                    hb.pool,
                    format!("{}/{}", info.load, hb.max_concurrency),
                    hermes_cli::agent_health(&info, hermes_core::now_unix_ms()),
                    hb.success_rate * 100.0,
                    latency,
                    info.assigned,
                    hb.task_types.join(",")
                );
            }
            Ok(0)
        }
        Command::Audit { after, limit, json, server } => {
            let mut client = connect(&server).await?;
            let records = client
                .list_audit(hermes_proto::ListAuditRequest { limit, after_seq: after })
                .await
                .map_err(status_error)?
                .into_inner()
                .records;
            if json {
                for r in &records {
                    println!("{}", serde_json::to_string(r)?);
                }
            } else {
                println!(
                    "{:>6}  {:<24} {:<16} {:<10} {:<18} {:<10} {:<44} ORIGIN",
                    "SEQ", "AT", "PRINCIPAL", "TENANT", "ACTION", "OUTCOME", "TARGET"
                );
                for r in &records {
                    println!(
                        "{:>6}  {:<24} {:<16} {:<10} {:<18} {:<10} {:<44} {}",
                        r.seq,
                        hermes_cli::format_time(r.at_unix_ms),
                        r.principal,
                        if r.tenant.is_empty() { "-" } else { &r.tenant },
                        r.action,
                        r.outcome,
                        r.target,
                        r.origin
                    );
                }
            }
            Ok(0)
        }
        Command::Webhooks { command, server } => webhooks(connect(&server).await?, command).await,
        Command::Dlq { command, server } => {
            let mut client = connect(&server).await?;
            match command {
                DlqCommand::List { limit } => {
                    let list = client
                        .list_dead_letters(hermes_proto::ListDeadLettersRequest { limit })
                        .await
                        .map_err(status_error)?
                        .into_inner()
                        .dead_letters;
                    println!("{:>6}  {:<22} {:<40} REASON", "SEQ", "KIND", "ORIGINAL SUBJECT");
                    for d in list {
                        println!(
                            "{:>6}  {:<22} {:<40} {}",
                            d.sequence, d.subject, d.original_subject, d.reason
                        );
                    }
                }
                DlqCommand::Show { sequence } => {
                    let d = client
                        .get_dead_letter(hermes_proto::DeadLetterRequest { sequence })
                        .await
                        .map_err(status_error)?
                        .into_inner();
                    println!(
                        "sequence  {}\nsubject   {}\nfrom      {} ({})",
                        d.sequence, d.subject, d.original_subject, d.origin
                    );
                    println!("reason    {}\nbytes     {}\n\n{}", d.reason, d.size_bytes, d.decoded);
                }
                DlqCommand::Replay { sequence } => {
                    let r = client
                        .replay_dead_letter(hermes_proto::DeadLetterRequest { sequence })
                        .await
                        .map_err(status_error)?
                        .into_inner();
                    println!("replayed {sequence} to {} (stream sequence {})", r.subject, r.sequence);
                }
            }
            Ok(0)
        }
        Command::Cache { command, server } => {
            let mut client = connect(&server).await?;
            match command {
                CacheCommand::Stats { tool } => {
                    let tools = client
                        .tool_cache_stats(hermes_proto::ToolCacheRequest { tool: tool.unwrap_or_default() })
                        .await
                        .map_err(status_error)?
                        .into_inner()
                        .tools;
                    println!(
                        "{:<32} {:>8} {:>12} {:>8} {:>8}",
                        "TOOL", "ENTRIES", "BYTES", "PENDING", "EXPIRED"
                    );
                    for t in tools {
                        println!(
                            "{:<32} {:>8} {:>12} {:>8} {:>8}",
                            t.tool, t.entries, t.bytes, t.pending, t.expired
                        );
                    }
                }
                CacheCommand::Clear { tool } => {
                    let removed = client
                        .clear_tool_cache(hermes_proto::ToolCacheRequest { tool: tool.unwrap_or_default() })
                        .await
                        .map_err(status_error)?
                        .into_inner()
                        .removed;
                    println!("removed {removed} cached result(s)");
                }
            }
            Ok(0)
        }
        Command::Memory { command, server } => {
            hermes_cli::memory_cmd::run(connect_memory(&server).await?, command).await
        }
        Command::Approve { goal_id, call_id, note, server } => {
            decide(&server, goal_id, call_id, true, note).await
        }
        Command::Deny { goal_id, call_id, note, server } => {
            decide(&server, goal_id, call_id, false, note).await
        }
        Command::Output { goal_id, node, output, server } => {
            let mut client = connect(&server).await?;
            let goal = hermes_cli::api_client::get_goal(&mut client, &goal_id).await?;
            let text = match &node {
                Some(id) => {
                    let node = goal.nodes.iter().find(|n| &n.node_id == id);
                    let node = node.with_context(|| format!("goal {goal_id} has no node `{id}`"))?;
                    node.output_json.clone()
                }
                None => goal.output_json.clone(),
            };
            if text.is_empty() {
                let whose = node.map(|n| format!("node `{n}` of ")).unwrap_or_default();
                bail!("{whose}goal {goal_id} has no output ({})", status_name(goal.status).to_lowercase());
            }
            let rendered = match hermes_cli::api_client::resolve_output(&mut client, &goal_id, &text).await? {
                serde_json::Value::String(text) => text,
                other => serde_json::to_string_pretty(&other)? + "\n",
            };
            match output {
                Some(path) => std::fs::write(&path, rendered)
                    .with_context(|| format!("cannot write {}", path.display()))?,
                None => print!("{rendered}"),
            }
            Ok(0)
        }
        Command::Get { goal_id, server } => {
            let mut client = connect(&server).await?;
            let goal = client.get_goal(GetGoalRequest { goal_id }).await.map_err(status_error)?.into_inner();
            print_goal(&goal);
            Ok(0)
        }
        Command::Eval { command: Some(EvalCommand::Show { store }), .. } => {
            print!("{}", hermes_cli::eval_cmd::show(&store)?);
            Ok(0)
        }
        Command::Eval { command: None, suite, json, junit, baseline, store, server } => {
            use hermes_cli::eval_cmd::{EvalReport, Suite};
            let suite_path =
                suite.context("give a suite file: hermes eval SUITE.yaml (or hermes eval show)")?;
            let (suite, specs) = Suite::load(&suite_path)?;
            let baseline: Option<EvalReport> = match baseline {
                Some(path) => {
                    let bytes =
                        std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
                    Some(
                        serde_json::from_slice(&bytes)
                            .with_context(|| format!("{} is not an eval run", path.display()))?,
                    )
                }
                None => None,
            };
            let client = connect(&server).await?;
            let mut report = hermes_cli::eval_cmd::run(&client, &suite, &specs).await?;
            if let Some(baseline) = &baseline {
                report.compare(baseline);
            }
            print!("{}", report.table());
            let stored = hermes_cli::eval_cmd::store(&report, &store)?;
            println!("stored: {}", stored.display());
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_vec_pretty(&report)?)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            if let Some(path) = junit {
                std::fs::write(&path, report.junit())
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            Ok(if report.passed { 0 } else { 1 })
        }
        Command::Replay {
            goal_id,
            workspace,
            tools,
            model,
            llm_provider,
            llm_base_url,
            llm_model,
            against,
            server,
        } => {
            let mut original = connect(&server).await?;
            let mut against = match against {
                Some(address) => Some(connect(&ServerArg { server: address, ..server.clone() }).await?),
                None => None,
            };
            let live_model = match model {
                ReplayModelArg::Recorded => None,
                ReplayModelArg::Live => {
                    let settings = hermes_llm::config::LlmSettings {
                        provider: llm_provider,
                        base_url: llm_base_url,
                        model: llm_model,
                        ..Default::default()
                    };
                    let model = settings.planner_model().context("--model live")?;
                    Some(model.context("--model live needs a model: set --llm-base-url and --llm-model, or --llm-provider local")?)
                }
            };
            let options = hermes_cli::replay_cmd::Options { workspace, tools, live_model };
            hermes_cli::replay_cmd::run(&mut original, &goal_id, &options, against.as_mut()).await
        }
        Command::Trace { goal_id, server } => {
            let mut client = connect(&server).await?;
            hermes_cli::trace_cmd::run(&mut client, &goal_id).await
        }
        Command::Watch { goal_id, server } => {
            use std::io::IsTerminal as _;
            let mut client = connect(&server).await?;
            watch_goal(&mut client, &goal_id, std::io::stdin().is_terminal()).await
        }
        Command::Cancel { goal_id, reason, server } => {
            let mut client = connect(&server).await?;
            let goal = client
                .cancel_goal(CancelGoalRequest { goal_id, reason })
                .await
                .map_err(status_error)?
                .into_inner();
            print_goal(&goal);
            Ok(0)
        }
        Command::List { limit, server } => {
            let mut client = connect(&server).await?;
            let goals =
                client.list_goals(ListGoalsRequest { limit }).await.map_err(status_error)?.into_inner().goals;
            println!("{:<36}  {:<10}  {:>5}  created", "GOAL", "STATUS", "NODES");
            for goal in goals {
                println!(
                    "{:<36}  {:<10}  {:>5}  {}",
                    goal.goal_id,
                    status_name(goal.status),
                    goal.nodes.len(),
                    goal.created_unix_ms
                );
            }
            Ok(0)
        }
    }
}

async fn decide(
    server: &ServerArg,
    goal_id: String,
    call_id: String,
    approve: bool,
    note: String,
) -> anyhow::Result<i32> {
    let mut client = connect(server).await?;
    let request = hermes_proto::ApproveToolCallRequest { goal_id, call_id: call_id.clone(), approve, note };
    let reply = client.approve_tool_call(request).await.map_err(status_error)?.into_inner();
    let verdict = match (reply.approved, reply.timed_out) {
        (true, _) => "approved",
        (false, true) => "denied (timed out)",
        (false, false) => "denied",
    };
    println!("call {call_id}: {verdict}");
    Ok(if reply.approved == approve { 0 } else { 1 })
}

async fn channel(args: &ServerArg) -> anyhow::Result<Channel> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let server = &args.server;
    let url = if server.contains("://") { server.to_owned() } else { format!("http://{server}") };
    let mut endpoint = Channel::from_shared(url.clone())
        .with_context(|| format!("bad server address {server}"))?
        .connect_timeout(Duration::from_secs(5));
    if url.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        match &args.ca_file {
            Some(ca) => {
                let pem =
                    std::fs::read(ca).with_context(|| format!("cannot read --ca-file {}", ca.display()))?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            None => tls = tls.with_native_roots(),
        }
        if let (Some(cert), Some(key)) = (&args.cert_file, &args.key_file) {
            let cert =
                std::fs::read(cert).with_context(|| format!("cannot read --cert-file {}", cert.display()))?;
            let key =
                std::fs::read(key).with_context(|| format!("cannot read --key-file {}", key.display()))?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint.tls_config(tls).context("bad TLS settings")?;
    } else if args.ca_file.is_some() || args.cert_file.is_some() {
        anyhow::bail!("--ca-file and --cert-file need an https:// --server");
    }
    endpoint
        .connect()
        .await
        .with_context(|| format!("cannot reach the dispatcher at {server}; is `hermes up` running?"))
}

async fn connect(server: &ServerArg) -> anyhow::Result<hermes_cli::api_client::Client> {
    let credentials = hermes_cli::api_client::Credentials::bearer(server.token.as_deref())?;
    Ok(hermes_cli::api_client::client(channel(server).await?, credentials))
}

/// The Memory API at `server` (the dispatcher's port under `hermes up`), with its token.
async fn connect_memory(server: &ServerArg) -> anyhow::Result<hermes_cli::api_client::MemoryApi> {
    let credentials = hermes_cli::api_client::Credentials::bearer(server.token.as_deref())?;
    Ok(hermes_cli::api_client::memory(channel(server).await?, credentials))
}

use hermes_cli::api_client::status_error;

/// How long `watch_goal` keeps trying to resume a dropped stream.
const RESUME_FOR: Duration = Duration::from_secs(120);

/// Whether a watch that failed with `status` is worth resuming: the connection or the server
/// went away, not the request.
fn resumable(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled)
}

/// Opens the goal's event stream after `after_seq`; while the dispatcher is unreachable (a
/// restart), tries again for [`RESUME_FOR`].
async fn open_watch(
    client: &mut hermes_cli::api_client::Client,
    goal_id: &str,
    after_seq: u64,
) -> anyhow::Result<tonic::Streaming<hermes_proto::Event>> {
    let deadline = tokio::time::Instant::now() + RESUME_FOR;
    loop {
        let request = WatchGoalRequest { goal_id: goal_id.to_owned(), after_seq };
        match client.watch_goal(request).await {
            Ok(stream) => return Ok(stream.into_inner()),
            Err(status) if resumable(&status) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(status) => return Err(status_error(status)),
        }
    }
}

/// Prints the goal's events until it ends. A stream that drops (the connection, or the
/// dispatcher restarting) is resumed after the last numbered event seen, so no step is missed
/// or printed twice. With `ask`, each approval request is put to the user as a y/n question (oldest
/// first), answered from stdin; a decision made elsewhere (another terminal, a timeout) withdraws
/// the question.
async fn watch_goal(
    client: &mut hermes_cli::api_client::Client,
    goal_id: &str,
    ask: bool,
) -> anyhow::Result<i32> {
    let mut events = open_watch(client, goal_id, 0).await?;
    let mut last_seq = 0u64;
    let mut dropped_at: Option<tokio::time::Instant> = None;
    let mut answers = if ask { Some(stdin_lines()) } else { None };
    let mut pending: std::collections::VecDeque<(String, String)> = Default::default();
    let mut start = None;
    loop {
        let event = tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => event,
                // The stream ended or failed before the goal did: resume after the last event.
                dropped @ (None | Some(Err(_))) => {
                    if let Some(Err(status)) = &dropped
                        && !resumable(status)
                    {
                        return Err(status_error(status.clone()));
                    }
                    let since = *dropped_at.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > RESUME_FOR {
                        break;
                    }
                    eprintln!("the event stream dropped; resuming after event {last_seq}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    events = open_watch(client, goal_id, last_seq).await?;
                    continue;
                }
            },
            Some(line) = async { answers.as_mut()?.recv().await }, if !pending.is_empty() => {
                let verdict = match line.trim().to_ascii_lowercase().as_str() {
                    "y" | "yes" => Some(true),
                    "n" | "no" => Some(false),
                    _ => None,
                };
                let Some(approve) = verdict else {
                    println!("answer y or n: approve {}? [y/n]", pending[0].1);
                    continue;
                };
                let (call_id, _) = pending.pop_front().unwrap_or_default();
                let note = if approve { "" } else { "denied at the terminal" };
                let request = hermes_proto::ApproveToolCallRequest {
                    goal_id: goal_id.to_owned(),
                    call_id,
                    approve,
                    note: note.to_owned(),
                };
                if let Err(e) = client.approve_tool_call(request).await {
                    println!("could not record the decision: {}", e.message());
                }
                if let Some((_, tool)) = pending.front() {
                    println!("approve {tool}? [y/n]");
                }
                continue;
            }
        };
        dropped_at = None;
        if event.seq > 0 {
            last_seq = event.seq;
        }
        let t0 = *start.get_or_insert(event.at_unix_ms);
        let at = format!("[+{:>7.3}s]", event.at_unix_ms.saturating_sub(t0) as f64 / 1000.0);
        match event.kind {
            Some(Kind::GoalAccepted(_)) => println!("{at} accepted"),
            Some(Kind::PlanCreated(p)) => {
                let groups: Vec<String> = p.groups.iter().map(|g| g.node_ids.join(", ")).collect();
                println!(
                    "{at} plan: {} nodes in {} parallel groups: [{}]",
                    p.plan.map(|p| p.nodes.len()).unwrap_or(0),
                    groups.len(),
                    groups.join("] -> [")
                );
            }
            Some(Kind::TaskDispatched(d)) => {
                let to = if d.agent_id.is_empty() { "pool".to_owned() } else { d.agent_id.clone() };
                println!("{at} dispatched {} ({}) attempt {} -> {to}", d.node_id, d.task_type, d.attempt)
            }
            Some(Kind::TaskSucceeded(s)) => {
                let cached = hermes_cli::cached_note(s.cached, s.cached_age_ms);
                println!("{at} succeeded  {} on {} in {} ms{cached}", s.node_id, s.agent_id, s.elapsed_ms)
            }
            Some(Kind::TaskFailed(f)) => {
                let e = f.error.unwrap_or_default();
                println!("{at} failed     {} on {}: {}: {}", f.node_id, f.agent_id, e.code, e.message)
            }
            Some(Kind::TaskRetrying(r)) => {
                let why = r.error.map(|e| e.message).unwrap_or_default();
                println!("{at} retrying   {} (attempt {}): {why}", r.node_id, r.next_attempt)
            }
            Some(Kind::GoalCompleted(c)) => {
                println!("{at} completed");
                print_output(&c.output_json);
                return Ok(0);
            }
            Some(Kind::GoalFailed(f)) => {
                let e = f.error.unwrap_or_default();
                let at_node =
                    if e.node_id.is_empty() { String::new() } else { format!(" at node {}", e.node_id) };
                println!("{at} goal failed{at_node}: {}: {}", e.code, e.message);
                return Ok(1);
            }
            Some(Kind::GoalCancelled(c)) => {
                println!("{at} cancelled: {}", c.reason);
                return Ok(1);
            }
            Some(Kind::PlanRequested(p)) if p.failed_node_id.is_empty() => println!("{at} planning"),
            Some(Kind::PlanRequested(p)) => println!("{at} replanning after {} failed", p.failed_node_id),
            Some(Kind::PlanPatched(p)) => {
                println!("{at} replanned: removed [{}], added [{}]", p.removed.join(", "), p.added.join(", "))
            }
            Some(Kind::ToolCalled(c)) => {
                let outcome = if c.ok { "ok".to_owned() } else { c.error_code.clone() };
                println!(
                    "{at}   {} step {}: {} {} -> {outcome} in {} ms{}",
                    c.node_id,
                    c.step,
                    c.tool,
                    c.arguments_json,
                    c.elapsed_ms,
                    hermes_cli::cached_note(c.cached, c.cached_age_ms)
                )
            }
            Some(Kind::ModelWaiting(w)) => println!("{at} {}", hermes_cli::model_waiting_line(&w)),
            Some(Kind::ApprovalRequired(a)) => {
                println!("{at} approval needed for {} on node {}: {}", a.tool, a.node_id, a.arguments_json);
                println!("             hermes approve {goal_id} {}   (or: hermes deny ...)", a.call_id);
                if ask && !pending.iter().any(|(id, _)| *id == a.call_id) {
                    let what = format!("{} on node {}", a.tool, a.node_id);
                    if pending.is_empty() {
                        println!("approve {what}? [y/n]");
                    }
                    pending.push_back((a.call_id, what));
                }
            }
            Some(Kind::ApprovalDecided(d)) => {
                let verdict = if d.approved {
                    "approved"
                } else if d.timed_out {
                    "timed out"
                } else {
                    "denied"
                };
                println!("{at} {verdict}: {}", d.call_id);
                pending.retain(|(id, _)| *id != d.call_id);
            }
            Some(Kind::GoalNeedsInput(n)) => {
                println!("{at} needs input: {}", n.explanation);
                return Ok(1);
            }
            None => {}
        }
    }
    bail!("the event stream ended before the goal did")
}

/// Lines of stdin, read on a thread of their own so the event stream keeps printing.
fn stdin_lines() -> tokio::sync::mpsc::Receiver<String> {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Prints an output: a summarized answer with its sources, a top-level `text` as text, anything
/// else as pretty JSON.
fn print_output(output_json: &str) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(output_json) else {
        println!("\n{output_json}");
        return;
    };
    if let Some(answer) = v.get("answer").and_then(|a| a.as_str()) {
        println!("\n{answer}");
        let cited: Vec<&str> =
            v["cited_nodes"].as_array().into_iter().flatten().filter_map(|c| c.as_str()).collect();
        if !cited.is_empty() {
            println!("\nsources: {}", cited.join(", "));
        }
        for conflict in v["conflicts"].as_array().into_iter().flatten().filter_map(|c| c.as_str()) {
            println!("conflict: {conflict}");
        }
        return;
    }
    match v.get("text").and_then(|t| t.as_str()) {
        Some(text) => println!("\n{text}"),
        None => println!("\n{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
    }
}

fn status_name(status: i32) -> &'static str {
    match GoalStatus::try_from(status).unwrap_or(GoalStatus::Unspecified) {
        GoalStatus::Pending => "PENDING",
        GoalStatus::Running => "RUNNING",
        GoalStatus::Completed => "COMPLETED",
        GoalStatus::Failed => "FAILED",
        GoalStatus::Cancelled => "CANCELLED",
        GoalStatus::Planning => "PLANNING",
        GoalStatus::NeedsInput => "NEEDS_INPUT",
        GoalStatus::Replanning => "REPLANNING",
        GoalStatus::Summarizing => "SUMMARIZING",
        GoalStatus::Unspecified => "UNKNOWN",
    }
}

fn print_goal(goal: &Goal) {
    println!("goal    {}", goal.goal_id);
    println!("status  {}", status_name(goal.status));
    if let Some(e) = &goal.error {
        println!("error   {}: {}", e.code, e.message);
    }
    let tokens = goal.tokens.unwrap_or_default();
    let budget = if goal.max_tokens > 0 { format!(" (budget {})", goal.max_tokens) } else { String::new() };
    println!("tokens  {} in / {} out{budget}", tokens.input_tokens, tokens.output_tokens);
    if goal.cost_usd > 0.0 || goal.max_cost_usd > 0.0 {
        let budget = if goal.max_cost_usd > 0.0 {
            format!(" (budget ${:.4})", goal.max_cost_usd)
        } else {
            String::new()
        };
        println!("cost    ${:.4}{budget}", goal.cost_usd);
    }
    println!("nodes:");
    for node in &goal.nodes {
        let status = NodeStatus::try_from(node.status).map(|s| s.as_str_name()).unwrap_or("?");
        println!(
            "  {:<20} {:<22} attempt {} agent {:<10} {} ms",
            node.node_id,
            status.trim_start_matches("NODE_STATUS_"),
            node.attempt,
            node.agent_id,
            node.elapsed_ms
        );
    }
    if !goal.output_json.is_empty() {
        print_output(&goal.output_json);
    }
}

/// `hermes webhooks ...`.
async fn webhooks(
    mut client: hermes_cli::api_client::Client,
    command: WebhooksCommand,
) -> anyhow::Result<i32> {
    use hermes_proto::{
        CreateWebhookRequest, ListWebhookDeliveriesRequest, WebhookDeliveryRequest, WebhookRequest,
    };
    let show = |endpoint: &hermes_proto::WebhookEndpoint| {
        let events = if endpoint.events.is_empty() { "all".to_owned() } else { endpoint.events.join(",") };
        let state = if endpoint.disabled {
            format!("disabled: {}", endpoint.disabled_reason)
        } else {
            "active".into()
        };
        println!("{:<20} {:<40} {:<30} {state}", endpoint.id, endpoint.url, events);
    };
    match command {
        WebhooksCommand::Add { url, events, secret } => {
            let reply = client
                .create_webhook(CreateWebhookRequest { url, events, secret })
                .await
                .map_err(status_error)?
                .into_inner();
            let endpoint = reply.endpoint.unwrap_or_default();
            println!("webhook {} for {}", endpoint.id, endpoint.url);
            println!("signing secret {} (shown once: keep it where your receiver reads it)", reply.secret);
        }
        WebhooksCommand::List => {
            let list =
                client.list_webhooks(hermes_proto::ListWebhooksRequest {}).await.map_err(status_error)?;
            println!("{:<20} {:<40} {:<30} STATE", "ID", "URL", "EVENTS");
            list.into_inner().endpoints.iter().for_each(show);
        }
        WebhooksCommand::Remove { id } => {
            let endpoint =
                client.delete_webhook(WebhookRequest { id }).await.map_err(status_error)?.into_inner();
            println!("removed webhook {} ({})", endpoint.id, endpoint.url);
        }
        WebhooksCommand::Rotate { id } => {
            let reply =
                client.rotate_webhook_secret(WebhookRequest { id }).await.map_err(status_error)?.into_inner();
            let endpoint = reply.endpoint.unwrap_or_default();
            println!(
                "webhook {}: new signing secret {} (shown once; the previous one still signs)",
                endpoint.id, reply.secret
            );
        }
        WebhooksCommand::Deliveries { goal, endpoint, limit, json } => {
            let deliveries = client
                .list_webhook_deliveries(ListWebhookDeliveriesRequest {
                    goal_id: goal,
                    endpoint_id: endpoint,
                    limit,
                })
                .await
                .map_err(status_error)?
                .into_inner()
                .deliveries;
            if json {
                for d in &deliveries {
                    println!("{}", serde_json::to_string(d)?);
                }
                return Ok(0);
            }
            println!("{:<60} {:<18} {:<14} {:>8}  LAST", "DELIVERY", "EVENT", "STATE", "ATTEMPTS");
            for d in deliveries {
                let last = d
                    .attempts
                    .last()
                    .map(|a| match a.status {
                        0 => format!("{} ({} ms)", a.error, a.latency_ms),
                        status => format!("{status} ({} ms)", a.latency_ms),
                    })
                    .unwrap_or_default();
                println!("{:<60} {:<18} {:<14} {:>8}  {last}", d.id, d.event_type, d.state, d.attempts.len());
            }
        }
        WebhooksCommand::Resend { id } => {
            let d =
                client.resend_webhook_delivery(WebhookDeliveryRequest { id }).await.map_err(status_error)?;
            println!("sending {} again", d.into_inner().id);
        }
    }
    Ok(0)
}
