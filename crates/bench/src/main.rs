//! `make bench`: one table from one run against one nats-server. The floor is a raw JetStream
//! task round trip written here (publish task -> durable pull consumer -> ack -> publish result ->
//! consume result); Hermes figures are reported as ratios to it, because absolute numbers on a
//! shared 2-core machine are noisy.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::{self, consumer, stream};
use futures::StreamExt;
use hermes_cli::stack::{Stack, StackConfig};
use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::event::Kind;
use hermes_proto::{GoalSpec, SubmitGoalRequest, TaskNode, TaskPlan};
use tokio::sync::{Mutex, Semaphore, oneshot};
use tokio_util::sync::CancellationToken;

mod cache;
mod console;
mod context;
mod fairness;
mod footprint;
mod limits;
mod lists;
mod memory;
mod routing;
mod routing_sim;
mod watchers;

// The same allocator as the `hermes` binaries (mimalloc), counting live bytes for the
// registry's memory figure.
#[global_allocator]
static GLOBAL: routing::counting::CountingMiMalloc = routing::counting::CountingMiMalloc;

/// How much each row measures: `HERMES_BENCH_SCALE=smoke` runs every row small, for `make test`.
struct Scale {
    latency_samples: usize,
    throughput_tasks: usize,
    in_flight: usize,
    fan_out: usize,
    /// Nodes of the chain row, each depending on the one before.
    chain: usize,
    /// Nodes of the goal whose console page is timed.
    console_nodes: usize,
    /// Goals the footprint row's dispatcher runs before its memory is measured again.
    footprint_goals: usize,
    routing_agents: usize,
    registry_sizes: &'static [usize],
    memory_vectors: &'static [usize],
    /// Collection sizes of the HNSW rows, the threshold they pass, and queries per size.
    graph_vectors: &'static [usize],
    graph_threshold: usize,
    graph_queries: usize,
    /// Documents of the snapshot rows (written through the KV bucket).
    snapshot_docs: usize,
    /// Goal event watchers per run; the first is the baseline.
    watchers: &'static [usize],
    /// Goals one tenant floods the fairness row with, and the other tenant's samples.
    fairness: (usize, usize),
    /// Goals timed for each of the cache row's hit and miss.
    cache_samples: usize,
    /// The limiter row: callers at once, calls in all, and the model's `max_concurrent`.
    limiter: (usize, usize, u32),
    /// The routing simulator's fleet.
    routing_sim: routing_sim::Fleet,
    local_model: bool,
}

const FULL: Scale = Scale {
    latency_samples: 500,
    throughput_tasks: 10_000,
    in_flight: 1000,
    fan_out: 1000,
    chain: 50,
    console_nodes: 2000,
    footprint_goals: 10_000,
    routing_agents: 10_000,
    registry_sizes: &[10_000, 20_000, 40_000],
    memory_vectors: &[10_000, 100_000],
    graph_vectors: &[100_000, 1_000_000],
    graph_threshold: hermes_memory::vectors::GRAPH_THRESHOLD,
    graph_queries: 200,
    snapshot_docs: 100_000,
    watchers: &[1, 1_000, 10_000],
    fairness: (10_000, 100),
    cache_samples: 200,
    limiter: (32, 5_000, 8),
    routing_sim: routing_sim::Fleet { agents: 1000, slots: 4, seconds: 30, utilisation: 0.5 },
    local_model: true,
};

const SMOKE: Scale = Scale {
    latency_samples: 20,
    throughput_tasks: 200,
    in_flight: 50,
    fan_out: 50,
    chain: 5,
    console_nodes: 50,
    footprint_goals: 100,
    routing_agents: 200,
    registry_sizes: &[200, 400],
    memory_vectors: &[500],
    graph_vectors: &[2_000],
    graph_threshold: 1_000,
    graph_queries: 20,
    snapshot_docs: 2_000,
    watchers: &[1, 40],
    fairness: (200, 10),
    cache_samples: 10,
    limiter: (8, 100, 4),
    routing_sim: routing_sim::Fleet { agents: 100, slots: 4, seconds: 12, utilisation: 0.5 },
    local_model: false,
};

fn scale() -> &'static Scale {
    match std::env::var("HERMES_BENCH_SCALE").as_deref() {
        Ok("smoke") => &SMOKE,
        _ => &FULL,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::var("HERMES_BENCH_ROWS").is_ok_and(|r| r == "context") {
        // The context-trimming claim alone: no nats-server, no stack (docs/evaluation.md).
        context::rows(&context::measure(20).await?);
        return Ok(());
    }
    if std::env::var("HERMES_BENCH_ROWS").is_ok_and(|r| r == "hnsw") {
        // The HNSW graph's rows alone, no nats-server needed (for tuning its parameters).
        return graph_rows();
    }
    let nats = hermes_test_util::NatsServer::start();
    println!("hermes bench: nats-server {} (one server for every row)\n", nats.url());

    if std::env::var("HERMES_BENCH_ROWS").is_ok_and(|r| r == "routing") {
        // The routing simulator alone: no nats-server, no stack (docs/routing.md).
        return simulated_routing_rows();
    }
    if std::env::var("HERMES_BENCH_ROWS").is_ok_and(|r| r == "fairness") {
        // A tenant's goals alone and under another tenant's flood, alone.
        let (flood, samples) = scale().fairness;
        fairness::rows(&fairness::measure(&nats.url(), flood, samples).await?);
        return Ok(());
    }
    if std::env::var("HERMES_BENCH_ROWS").is_ok_and(|r| r == "lists") {
        // The goal index's pages at 10k and 1M goals, alone.
        return goal_list_rows(&nats.url()).await;
    }
    if std::env::var("HERMES_BENCH_ROWS").is_ok_and(|r| r == "memory") {
        // Semantic memory's rows alone: the exact scan, the HNSW graph, snapshots, upserts.
        return memory_rows(&nats.url()).await;
    }
    if std::env::var("HERMES_BENCH_ROWS").is_ok_and(|r| r == "limits") {
        // The tool cache's and the model limiter's rows alone, each with its own baseline.
        return limit_rows(&nats.url()).await.map(|_| ());
    }
    let client = async_nats::connect(nats.url()).await?;
    let floor_lat = floor_latency(&client).await?;
    let floor_in = messages_in(&nats);
    let floor_meter = CpuMeter::start(&nats);
    let floor_tput = floor_throughput(&client).await?;
    let floor_cpu = floor_meter.per(scale().throughput_tasks);
    let floor_ops = (messages_in(&nats) - floor_in) / scale().throughput_tasks as f64;
    if peers_only() {
        return peer_rows(&nats, floor_lat, floor_tput).await;
    }
    // Before the stack starts: its registry would share the route queue group with this one.
    // The engine's rows alone go without them.
    let engine_only = core_only() || std::env::var("HERMES_BENCH_REPEAT").is_ok();
    let (route_local, route_nats, memory) = match engine_only {
        true => ((0.0, 0.0), (0.0, 0.0), Vec::new()),
        false => (
            routing::decision_latency(scale().routing_agents, 2 * scale().routing_agents),
            routing::request_latency(&nats.url(), scale().routing_agents, 2_000.min(scale().routing_agents))
                .await?,
            routing::bytes_per_agent(scale().registry_sizes),
        ),
    };

    let workspace = tempfile::tempdir()?;
    let dispatcher = hermes_dispatcher::DispatcherConfig {
        grpc_listen: "127.0.0.1:0".parse()?,
        http: Some(hermes_dispatcher::http::HttpConfig {
            listen: "127.0.0.1:0".parse()?,
            max_body_bytes: hermes_dispatcher::http::DEFAULT_MAX_BODY_BYTES,
            cors_allow_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            tls: None,
            console: Default::default(),
        }),
        // The fan-out rows open every watcher from this one client.
        max_watches_per_client: 20_000,
        max_watches: 40_000,
        ..Default::default()
    };
    let shutdown = CancellationToken::new();
    let stack = start_stack(&nats.url(), workspace.path(), "bench", 512, dispatcher, &shutdown).await?;
    let grpc = DispatcherClient::connect(stack.grpc_url()).await?;
    let completions = Completions::start(&client).await?;

    if let Ok(repeat) = std::env::var("HERMES_BENCH_REPEAT") {
        // Engine rows alone, again and again, in the order given (`throughput:1,fan-out:5`): for a
        // profile of one, its spread, or how one row leaves the stack for the next.
        let mut sequence = Vec::new();
        for step in repeat.split(',') {
            let (row, runs) = step.split_once(':').unwrap_or((step, "10"));
            let runs: usize =
                runs.parse().context("HERMES_BENCH_REPEAT is ROW[:COUNT], or several joined by commas")?;
            sequence.extend(std::iter::repeat_n(row.trim().to_owned(), runs));
        }
        for row in &sequence {
            match row.as_str() {
                "fan-out" => {
                    let (meter, messages) = (CpuMeter::start(&nats), messages_in(&nats));
                    let wall = fan_out_wall(&grpc, &completions).await?;
                    let nodes = scale().fan_out;
                    let (cpu, messages) = (meter.per(nodes), (messages_in(&nats) - messages) / nodes as f64);
                    let floor_ms = nodes as f64 / floor_tput * 1000.0;
                    println!(
                        "fan-out {wall:.1} ms, {:.2}x the floor's {floor_ms:.1} ms; a node: {messages:.1} \
                         messages in, CPU {:.0} µs (server {:.0}) against a floor task's {:.0} µs (server {:.0})",
                        wall / floor_ms,
                        cpu.total(),
                        cpu.server,
                        floor_cpu.total(),
                        floor_cpu.server,
                    );
                }
                "throughput" => {
                    let meter = CpuMeter::start(&nats);
                    let rate = goal_throughput(&grpc, &completions).await?;
                    let cpu = meter.per(scale().throughput_tasks);
                    println!(
                        "throughput {rate:.0} goals/s, {:.2}x the floor's {floor_tput:.0}; CPU a goal {:.0} µs \
                         (server {:.0}), {:.1}x the floor's {:.0} µs a task (server {:.0})",
                        rate / floor_tput,
                        cpu.total(),
                        cpu.server,
                        cpu.total() / floor_cpu.total(),
                        floor_cpu.total(),
                        floor_cpu.server,
                    );
                }
                "latency" => {
                    let (p50, _, submit) = goal_latency(&grpc, &completions).await?;
                    println!(
                        "goal p50 {p50:.0} µs ({submit:.0} µs to submit), {:.2}x the floor's {:.0} µs",
                        p50 / floor_lat.0,
                        floor_lat.0
                    );
                }
                other => {
                    anyhow::bail!("HERMES_BENCH_REPEAT: no row {other:?} (fan-out, throughput, latency)")
                }
            }
        }
        stack.stop().await;
        return Ok(());
    }
    let goal_lat = goal_latency(&grpc, &completions).await?;
    let tap = match std::env::var("HERMES_BENCH_WIRETAP") {
        Ok(_) => Some(Wiretap::start(&client).await?),
        Err(_) => None,
    };
    let goal_in = messages_in(&nats);
    let goal_meter = CpuMeter::start(&nats);
    let goal_tput = goal_throughput(&grpc, &completions).await?;
    let goal_cpu = goal_meter.per(scale().throughput_tasks);
    let goal_ops = (messages_in(&nats) - goal_in) / scale().throughput_tasks as f64;
    if let Some(tap) = tap {
        tap.print(scale().throughput_tasks).await;
    }
    // One wide goal is one sample of a noisy machine (the floor's rate is an average over
    // 10,000 tasks): the row is the median of a few.
    let mut fan_outs = Vec::with_capacity(FAN_OUT_RUNS);
    for _ in 0..FAN_OUT_RUNS {
        fan_outs.push(fan_out_wall(&grpc, &completions).await?);
    }
    let fan_out = percentile(&mut fan_outs, 0.5);
    let chain = chain_wall(&grpc, &completions).await?;
    let core = Core {
        floor_lat,
        floor_tput,
        floor_ops,
        floor_cpu,
        goal_lat,
        goal_tput,
        goal_ops,
        goal_cpu,
        fan_out,
        chain,
    };
    if core_only() {
        stack.stop().await;
        core.rows();
        return Ok(());
    }
    let http = stack.http_url().context("the bench stack serves HTTP")?;
    let console = console::goal_page(&grpc, &completions, &http, scale().console_nodes).await?;
    let mut watch_runs = Vec::new();
    for &n in scale().watchers {
        match open_files_allow(n) {
            Ok(()) => watch_runs.push(watchers::fan_out(&stack.grpc_url(), &http, n).await?),
            Err(why) => println!("{n} watchers: not measured ({why})"),
        }
    }
    stack.stop().await;
    let (flood, samples) = scale().fairness;
    let fair = fairness::measure(&nats.url(), flood, samples).await?;
    let footprint = footprint::measure(scale().footprint_goals, scale().in_flight).await?;
    let context_tokens = context::measure(20).await?;

    core.rows();
    watch_rows(&watch_runs);
    fairness::rows(&fair);
    limit_rows(&nats.url()).await?;
    footprint::rows(&footprint);
    context::rows(&context_tokens);
    let nodes = scale().console_nodes;
    match console {
        Ok(times) => {
            println!(
                "\n{:<58} {:>12.0}",
                format!("console: {nodes}-node Goal page interactive (ms)"),
                times.interactive_ms
            );
            println!("{:<58} {:>12.0}", "  of which the page's own first render (ms)", times.render_ms);
            println!("target: under 2000 ms (hash change to a node's details open, headless Chromium).");
        }
        Err(why) => println!("\nconsole: {nodes}-node Goal page: not measured ({why})"),
    }
    let agents = scale().routing_agents;
    println!("\n{:<58} {:>12} {:>12}", format!("routing, {agents} agents over 100 task types"), "p50", "p99");
    println!("{}", "-".repeat(84));
    println!("{:<58} {:>12.1} {:>12.1}", "route decision, in-process (µs)", route_local.0, route_local.1);
    println!(
        "{:<58} {:>12.1} {:>12.1}",
        "route request over NATS, 1 in flight (µs)", route_nats.0, route_nats.1
    );
    let steps: Vec<String> =
        memory.iter().map(|(total, per)| format!("{per:.0} B/agent at {total}")).collect();
    println!("registry memory: {} (a flat figure = linear growth)", steps.join(", "));
    println!("target: route p99 under 1 ms; memory linear in agents.");
    simulated_routing_rows()?;
    memory_rows(&nats.url()).await?;
    goal_list_rows(&nats.url()).await?;
    if scale().local_model {
        local_model_rows();
    }
    // A watcher left without its goal's end is a broken guarantee, not a slow figure.
    if let Some(run) = watch_runs.iter().find(|r| r.finished < r.watchers) {
        anyhow::bail!(
            "{} of {} watchers did not get their goal's terminal event",
            run.watchers - run.finished,
            run.watchers
        );
    }
    Ok(())
}

/// The routing simulator's table: the old policy and the new on the same fleet and arrivals.
/// A task sent to an agent in cool-off is a broken guarantee, not a slow figure.
fn simulated_routing_rows() -> anyhow::Result<()> {
    let fleet = scale().routing_sim;
    let old = routing_sim::run(&fleet, hermes_registry::Policy::Scored);
    let new = routing_sim::run(&fleet, hermes_registry::Policy::Balanced);
    routing_sim::rows(&fleet, &old, &new);
    if new.in_cool_off > 0 {
        anyhow::bail!("the balanced policy sent {} tasks to agents in cool-off", new.in_cool_off);
    }
    Ok(())
}

/// The tool cache's row and the fleet model limiter's, each against its own baseline.
async fn limit_rows(nats_url: &str) -> anyhow::Result<()> {
    let cached = cache::measure(nats_url, scale().cache_samples).await?;
    cache::rows(&cached);
    let (callers, calls, limit) = scale().limiter;
    let limiter = limits::measure(nats_url, callers, calls, limit, Duration::ZERO).await?;
    limits::rows(&limiter);
    // A limit passed is a broken guarantee, not a slow figure.
    if limiter.max_in_flight > limit as usize || limiter.over_limit > 0 {
        anyhow::bail!(
            "the fleet limiter let {} calls run at once (limit {limit}); the mock refused {}",
            limiter.max_in_flight,
            limiter.over_limit
        );
    }
    Ok(())
}

/// The fan-out table: each run's figures, with the delays as ratios to the first run's (one
/// watcher alone).
fn watch_rows(runs: &[watchers::FanOut]) {
    let Some(alone) = runs.first() else { return };
    println!(
        "\n{:<58} {:>12} {:>12} {:>10}",
        "goal event watchers on one dispatcher (half SSE, half gRPC)", "value", "1 watcher", "ratio"
    );
    println!("{}", "-".repeat(95));
    for run in runs {
        let n = run.watchers;
        row(&format!("{n} watchers: first event p50 (ms)"), run.first_event_p50_ms, alone.first_event_p50_ms);
        row(&format!("{n} watchers: first event p99 (ms)"), run.first_event_p99_ms, alone.first_event_p99_ms);
        row(
            &format!("{n} watchers: live event to the last of them (ms)"),
            run.live_event_to_all_ms,
            alone.live_event_to_all_ms,
        );
        row(&format!("{n} watchers: another goal end to end (ms)"), run.other_goal_ms, alone.other_goal_ms);
        println!("{:<58} {:>12.0}", format!("{n} watchers: live bytes per watcher"), run.bytes_per_watcher);
        println!(
            "{:<58} {:>12}",
            format!("{n} watchers: got the terminal event"),
            format!("{}/{n}", run.finished)
        );
    }
    println!("bytes per watcher count both ends (the bench's clients and the dispatcher share a process).");
}

/// Whether the open-file limit leaves room for `watchers` streams: an SSE stream holds two
/// sockets here (client and server share the process), half of the watchers are SSE.
fn open_files_allow(watchers: usize) -> Result<(), String> {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok());
    match soft {
        Some(limit) if limit < watchers + 1024 => {
            Err(format!("the open-file limit is {limit}; `ulimit -n {}` first", watchers + 1024))
        }
        _ => Ok(()),
    }
}

/// Goal lists through the goal index: 10k and 1M goals (smoke: 2k and 10k).
async fn goal_list_rows(nats_url: &str) -> anyhow::Result<()> {
    match std::env::var("HERMES_BENCH_SCALE").is_ok_and(|s| s == "smoke") {
        true => lists::rows(nats_url, &[2_000, 10_000], &[1_000, 2_000]).await,
        false => lists::rows(nats_url, &[10_000, 1_000_000], &[10_000, 1_000_000]).await,
    }
}

/// Semantic memory: exact search against a flat scan, upsert against raw KV puts.
async fn memory_rows(nats_url: &str) -> anyhow::Result<()> {
    println!(
        "\n{:<58} {:>12} {:>12} {:>8}",
        "semantic memory (384-dim, top-5, exact)", "p50 ms", "p99 ms", "p50 x"
    );
    for &n in scale().memory_vectors {
        let (p50, p99, floor50, floor99) = memory::search_latency(n, 200);
        println!("{:<58} {:>12.2} {:>12.2}", format!("flat-array scan floor, {n} vectors"), floor50, floor99);
        println!(
            "{:<58} {:>12.2} {:>12.2} {:>8.2}",
            format!("VectorIndex::search, {n} vectors"),
            p50,
            p99,
            p50 / floor50.max(1e-9)
        );
    }
    graph_rows()?;
    let snap = memory::snapshot_run(nats_url, scale().snapshot_docs, scale().graph_threshold).await?;
    println!("\n{:<58} {:>12} {:>12}", format!("vector snapshot, {} documents", snap.n), "s", "");
    println!("{:<58} {:>12.0}", "Vectors::upsert into the collection (documents/s)", snap.upsert_rate);
    println!(
        "{:<58} {:>12.2} {:>9.0} MB",
        "snapshot written to the object store",
        snap.write_s,
        snap.bytes as f64 / 1e6
    );
    println!(
        "{:<58} {:>12.2} {:>12}",
        "restart from the snapshot (messages replayed)", snap.from_snapshot_s, snap.replayed
    );
    println!(
        "{:<58} {:>12.2}",
        "restart without it (the stream read, the graph rebuilt)", snap.from_stream_s
    );
    let bus = hermes_core::Bus::connect(hermes_core::BusConfig::new(nats_url)).await?;
    let (ours, floor) = memory::upsert_throughput(&bus, 2_000.min(10 * scale().throughput_tasks)).await?;
    println!("{:<58} {:>12.0}", "raw KV put floor (values/s)", floor);
    println!(
        "{:<58} {:>12.0} {:>21.2}",
        "Vectors::upsert, batches of 100 (documents/s)",
        ours,
        ours / floor.max(1e-9)
    );
    #[cfg(feature = "local")]
    match memory::embedding_throughput().await {
        Some(rate) => println!("{:<58} {:>12.1}", "local MiniLM embeddings (texts/s, batch 128)", rate),
        None => println!("local MiniLM embeddings: not measured (run `make models`)"),
    }
    Ok(())
}

/// The HNSW graph's rows at each size of `graph_vectors` (`HERMES_BENCH_GRAPH_VECTORS=N,M`
/// overrides them, `HERMES_BENCH_HNSW=connectivity,expansion_add,expansion_search` the graph's
/// parameters, and `HERMES_BENCH_EF=A,B,...` adds the recall and latency of other search
/// expansions on the same graph): recall@10 against the exact top 10, latency alone, under load and filtered, the
/// flat scan of the same vectors, and the build and add rates.
fn graph_rows() -> anyhow::Result<()> {
    let sizes: Vec<usize> = match std::env::var("HERMES_BENCH_GRAPH_VECTORS") {
        Ok(list) => list.split(',').map(|n| n.trim().parse()).collect::<Result<_, _>>()?,
        Err(_) => scale().graph_vectors.to_vec(),
    };
    let mut options = hermes_memory::vectors::VectorOptions {
        graph_threshold: scale().graph_threshold,
        ..Default::default()
    };
    if let Ok(params) = std::env::var("HERMES_BENCH_HNSW") {
        let params: Vec<usize> = params.split(',').map(|n| n.trim().parse()).collect::<Result<_, _>>()?;
        anyhow::ensure!(params.len() == 3, "HERMES_BENCH_HNSW=connectivity,expansion_add,expansion_search");
        (options.connectivity, options.expansion_add, options.expansion_search) =
            (params[0], params[1], params[2]);
    }
    let efs: Vec<usize> = match std::env::var("HERMES_BENCH_EF") {
        Ok(list) => list.split(',').map(|n| n.trim().parse()).collect::<Result<_, _>>()?,
        Err(_) => Vec::new(),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for n in sizes {
        let run = memory::graph_run(n, scale().graph_queries, options.clone(), &efs);
        let o = &run.options;
        println!(
            "\n{:<58} {:>12} {:>12} {:>8}",
            format!(
                "HNSW, {n} clustered vectors (M {}, ef_add {}, ef {})",
                o.connectivity, o.expansion_add, o.expansion_search
            ),
            "p50 ms",
            "p99 ms",
            "p50 x"
        );
        println!("{:<58} {:>12.3} {:>12.3}", "flat-array scan of the same (exact)", run.floor.0, run.floor.1);
        let row = |name: String, (p50, p99): (f64, f64)| {
            println!("{:<58} {:>12.3} {:>12.3} {:>8.3}", name, p50, p99, p50 / run.floor.0.max(1e-9));
        };
        row("HNSW search, top 10".into(), run.search);
        row(format!("HNSW search, top 10, {cores} other threads searching"), run.loaded);
        row("HNSW search, top 10, a filter 1 in 10 match".into(), run.filtered);
        row("HNSW search, top 10, a filter 1 in 100 match".into(), run.selective);
        row("HNSW search, top 10, a filter 1 in 10,000 match (scanned)".into(), run.rare);
        println!("{:<58} {:>12.3}", "HNSW recall@10 against the exact top 10", run.recall);
        for (ef, recall, p50, p99) in &run.sweep {
            println!(
                "{:<58} {:>12.3} {:>12.3} {:>8.3}",
                format!("  with ef {ef}: p50, p99 (ms), recall@10"),
                p50,
                p99,
                recall
            );
        }
        println!(
            "{:<58} {:>12.0} {:>10.1} s",
            format!("HNSW build from the vectors, {cores} threads (vectors/s)"),
            n as f64 / run.build_s,
            run.build_s
        );
        println!("{:<58} {:>12.0}", "HNSW add to the built graph, one at a time (vectors/s)", run.add_rate);
        println!("{:<58} {:>12.0}", "HNSW graph memory, vectors included (MB)", run.graph_bytes as f64 / 1e6);
        println!("{:<58} {:>12}", "HNSW distance kernels (usearch)", run.acceleration);
    }
    Ok(())
}

/// Tokens per second of the embedded model, reading a prompt and writing schema-constrained JSON.
#[cfg(feature = "local")]
fn local_model_rows() {
    use hermes_llm::{ChatRequest, Message};
    let path =
        std::env::var("HERMES_SMOLLM2_MODEL").unwrap_or_else(|_| hermes_llm::local::SMOLLM2_PATH.to_owned());
    let model = match hermes_llm::local::LocalChat::load(&hermes_llm::local::LocalConfig::new(&path)) {
        Ok(m) => m,
        Err(e) => {
            println!("\nlocal model: not measured ({e})");
            return;
        }
    };
    let schema = serde_json::json!({"type": "object", "properties": {
        "reasoning": {"type": "string"},
        "steps": {"type": "array", "items": {"type": "string"}}
    }, "required": ["reasoning", "steps"], "additionalProperties": false});
    let mut prompt_rates = Vec::new();
    let mut output_rates = Vec::new();
    for goal in ["Plan a trip to Lisbon", "Summarise April sales by category", "Check the weather, then pack"]
    {
        let request = ChatRequest {
            messages: vec![Message::system("You plan tasks. Answer in JSON."), Message::user(goal)],
            response_schema: Some(("plan".into(), schema.clone())),
            ..Default::default()
        };
        if let Ok((_, t)) = model.generate(&request) {
            prompt_rates.push(t.prompt_tokens_per_s);
            output_rates.push(t.output_tokens_per_s);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "\nlocal model (SmolLM2-135M Q4_1, CPU, JSON-constrained): prompt {:.1} tok/s, generation {:.1} tok/s (mean of {} runs)",
        mean(&prompt_rates),
        mean(&output_rates),
        output_rates.len()
    );
}

#[cfg(not(feature = "local"))]
fn local_model_rows() {
    println!("\nlocal model: not measured (built without the `local` feature; `make bench` turns it on)");
}

/// Messages clients published into the server so far (`/varz` `in_msgs`; JetStream API calls,
/// acks and KV operations included): the bench's "NATS operations".
fn messages_in(nats: &hermes_test_util::NatsServer) -> f64 {
    nats.monitor("/varz").and_then(|v| v["in_msgs"].as_f64()).unwrap_or(f64::NAN)
}

/// The core rows: the JetStream floor and Hermes's goals over it, measured in one run.
struct Core {
    floor_lat: (f64, f64),
    floor_tput: f64,
    floor_ops: f64,
    floor_cpu: Cpu,
    goal_lat: (f64, f64, f64),
    goal_tput: f64,
    goal_ops: f64,
    goal_cpu: Cpu,
    fan_out: f64,
    chain: f64,
}

impl Core {
    fn rows(&self) {
        println!("{:<58} {:>12} {:>12} {:>10}", "measure", "value", "floor", "ratio");
        println!("{}", "-".repeat(95));
        row("task round trip p50, 1 in flight (µs)", self.floor_lat.0, self.floor_lat.0);
        row("task round trip p99, 1 in flight (µs)", self.floor_lat.1, self.floor_lat.1);
        let in_flight = scale().in_flight;
        row(&format!("tasks/s, {in_flight} in flight"), self.floor_tput, self.floor_tput);
        row("hermes single-node goal p50 via gRPC, 1 in flight (µs)", self.goal_lat.0, self.floor_lat.0);
        row("hermes single-node goal p99 via gRPC, 1 in flight (µs)", self.goal_lat.1, self.floor_lat.1);
        row("  of which SubmitGoal returned, p50 (µs)", self.goal_lat.2, self.floor_lat.0);
        row(
            &format!("hermes tasks/s, {in_flight} single-node goals in flight"),
            self.goal_tput,
            self.floor_tput,
        );
        row("NATS messages into the server per goal (per task for the floor)", self.goal_ops, self.floor_ops);
        // Both rows are CPU-bound on a small machine: what a goal costs in CPU against what a
        // floor task costs bounds the goals/s ratio from above (docs/performance.md).
        row(
            "CPU per goal in the throughput row, all processes (µs)",
            self.goal_cpu.total(),
            self.floor_cpu.total(),
        );
        row("  of which nats-server (µs)", self.goal_cpu.server, self.floor_cpu.server);
        let width = scale().fan_out;
        let floor_fan_out_ms = width as f64 / self.floor_tput * 1000.0;
        row(
            &format!("hermes {width}-node fan-out goal wall time, median of {FAN_OUT_RUNS} (ms)"),
            self.fan_out,
            floor_fan_out_ms,
        );
        let depth = scale().chain;
        row(
            &format!("hermes {depth}-deep chain, per hop (ms)"),
            self.chain / depth as f64,
            self.floor_lat.0 / 1000.0,
        );
        println!(
            "\nratio = value / floor. For the fan-out, the floor is {width} tasks at the floor's rate; for the\n\
             chain, one task round trip (p50) per hop."
        );
        println!(
            "targets (docs/performance.md): single-node goal p50 <= 2.5x the floor's round trip; >= 10000\n\
             goals/s and >= 0.25 of the floor's rate; a 1000-node fan-out <= 2x the floor's time for 1000 tasks."
        );
    }
}

/// CPU time a row costs per unit of work, in µs: the nats-server's, and this process's (the
/// bench's client, the floor's worker or the whole Hermes stack with its agents).
#[derive(Debug, Clone, Copy)]
struct Cpu {
    server: f64,
    clients: f64,
}

impl Cpu {
    fn total(&self) -> f64 {
        self.server + self.clients
    }
}

/// CPU used by the server and by this process from [`CpuMeter::start`] on.
struct CpuMeter {
    server_pid: u32,
    server: f64,
    clients: f64,
}

impl CpuMeter {
    fn start(nats: &hermes_test_util::NatsServer) -> CpuMeter {
        let server_pid = nats.pid();
        CpuMeter {
            server_pid,
            server: hermes_test_util::process::cpu_seconds_of(server_pid),
            clients: hermes_test_util::process::cpu_seconds_of(std::process::id()),
        }
    }

    /// µs of CPU since the start, for each of `units` tasks or goals.
    fn per(&self, units: usize) -> Cpu {
        let used = |now: f64, then: f64| (now - then) * 1e6 / units as f64;
        Cpu {
            server: used(hermes_test_util::process::cpu_seconds_of(self.server_pid), self.server),
            clients: used(hermes_test_util::process::cpu_seconds_of(std::process::id()), self.clients),
        }
    }
}

/// `HERMES_BENCH_ROWS=core`: only the floor's and the goals' rows (latency, throughput, messages
/// per goal, fan-out, chain), for measuring a change to the engine quickly.
fn core_only() -> bool {
    std::env::var("HERMES_BENCH_ROWS").is_ok_and(|r| r == "core")
}

/// `HERMES_BENCH_ROWS=peers`: only the shapes `make bench-peers` sets beside Celery.
fn peers_only() -> bool {
    std::env::var("HERMES_BENCH_ROWS").is_ok_and(|r| r == "peers")
}

/// The single-task and in-flight rows alone, as one `PEER hermes {...}` line for
/// `scripts/bench-peers.sh`, with the floor measured in the same run.
async fn peer_rows(
    nats: &hermes_test_util::NatsServer,
    floor_lat: (f64, f64),
    floor_tput: f64,
) -> anyhow::Result<()> {
    let workspace = tempfile::tempdir()?;
    let dispatcher =
        hermes_dispatcher::DispatcherConfig { grpc_listen: "127.0.0.1:0".parse()?, ..Default::default() };
    let shutdown = CancellationToken::new();
    let stack = start_stack(&nats.url(), workspace.path(), "bench", 512, dispatcher, &shutdown).await?;
    let grpc = DispatcherClient::connect(stack.grpc_url()).await?;
    let client = async_nats::connect(nats.url()).await?;
    let completions = Completions::start(&client).await?;
    let goal_lat = goal_latency(&grpc, &completions).await?;
    let goal_tput = goal_throughput(&grpc, &completions).await?;
    stack.stop().await;
    let line = serde_json::json!({
        "floor_p50_us": floor_lat.0,
        "floor_p99_us": floor_lat.1,
        "floor_tasks_per_s": floor_tput,
        "hermes_p50_us": goal_lat.0,
        "hermes_p99_us": goal_lat.1,
        "hermes_tasks_per_s": goal_tput,
        "in_flight": scale().in_flight,
        "tasks": scale().throughput_tasks,
    });
    println!("PEER hermes {line}");
    Ok(())
}

fn row(name: &str, value: f64, floor: f64) {
    println!("{name:<58} {value:>12.1} {floor:>12.1} {:>9.2}x", value / floor);
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

async fn floor_streams(
    client: &async_nats::Client,
    name: &str,
) -> anyhow::Result<(jetstream::Context, consumer::PullConsumer, consumer::PullConsumer)> {
    let js = jetstream::new(client.clone());
    let mk = |suffix: &str| stream::Config {
        name: format!("{name}_{suffix}"),
        subjects: vec![format!("{}.{}.>", name.to_lowercase(), suffix.to_lowercase())],
        retention: stream::RetentionPolicy::WorkQueue,
        ..Default::default()
    };
    let tasks = js.create_stream(mk("TASKS")).await?;
    let results = js.create_stream(mk("RESULTS")).await?;
    let cfg = |n: &str| consumer::pull::Config {
        durable_name: Some(n.to_owned()),
        ack_policy: consumer::AckPolicy::Explicit,
        max_ack_pending: 20_000,
        ..Default::default()
    };
    let task_consumer = tasks.create_consumer(cfg("worker")).await?;
    let result_consumer = results.create_consumer(cfg("collector")).await?;
    Ok((js, task_consumer, result_consumer))
}

/// A worker that acks each task and publishes its result, awaiting the ack, like an agent.
fn spawn_floor_worker(js: jetstream::Context, tasks: consumer::PullConsumer, results_subject: String) {
    tokio::spawn(async move {
        let mut messages = tasks.stream().max_messages_per_batch(1000).messages().await.expect("pull");
        let permits = Arc::new(Semaphore::new(1000));
        while let Some(Ok(msg)) = messages.next().await {
            let permit = permits.clone().acquire_owned().await.expect("permit");
            let js = js.clone();
            let subject = results_subject.clone();
            tokio::spawn(async move {
                let _permit = permit;
                if let Ok(ack) = js.publish(subject, msg.payload.clone()).await {
                    let _ = ack.await;
                }
                let _ = msg.ack().await;
            });
        }
    });
}

async fn floor_latency(client: &async_nats::Client) -> anyhow::Result<(f64, f64)> {
    let (js, tasks, results) = floor_streams(client, "FLOORLAT").await?;
    spawn_floor_worker(js.clone(), tasks, "floorlat.results.x".into());
    let mut collected = results.stream().max_messages_per_batch(1).messages().await?;
    let mut samples = Vec::with_capacity(scale().latency_samples);
    for i in 0..scale().latency_samples + 50 {
        let start = Instant::now();
        js.publish("floorlat.tasks.x", format!("{i}").into()).await?.await?;
        let msg = collected.next().await.context("result stream ended")??;
        msg.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        if i >= 50 {
            samples.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok((percentile(&mut samples, 0.5), percentile(&mut samples, 0.99)))
}

async fn floor_throughput(client: &async_nats::Client) -> anyhow::Result<f64> {
    let (js, tasks, results) = floor_streams(client, "FLOORTPUT").await?;
    spawn_floor_worker(js.clone(), tasks, "floortput.results.x".into());
    let window = Arc::new(Semaphore::new(scale().in_flight));
    let start = Instant::now();
    let collector_window = window.clone();
    let collector = tokio::spawn(async move {
        let mut messages = results.stream().max_messages_per_batch(1000).messages().await.expect("pull");
        for _ in 0..scale().throughput_tasks {
            let msg = messages.next().await.expect("result").expect("result");
            let _ = msg.ack().await;
            collector_window.add_permits(1);
        }
    });
    let mut acks = futures::stream::FuturesUnordered::new();
    for i in 0..scale().throughput_tasks {
        window.acquire().await?.forget();
        acks.push(std::future::IntoFuture::into_future(
            js.publish("floortput.tasks.x", format!("{i}").into()).await?,
        ));
        while acks.len() > scale().in_flight {
            acks.next().await;
        }
    }
    while acks.next().await.is_some() {}
    collector.await?;
    Ok(scale().throughput_tasks as f64 / start.elapsed().as_secs_f64())
}

/// The in-process stack a table measures: two agents `<name>-1` and `<name>-2` with `slots`
/// tasks each, every built-in tool, and `dispatcher`.
async fn start_stack(
    nats_url: &str,
    workspace: &std::path::Path,
    name: &str,
    slots: u32,
    dispatcher: hermes_dispatcher::DispatcherConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<Stack> {
    let agents = (1..=2)
        .map(|i| {
            let mut c = hermes_executor::AgentConfig::new(format!("{name}-{i}"), workspace);
            c.max_concurrency = slots;
            c
        })
        .collect();
    let config = StackConfig {
        nats_url: nats_url.into(),
        registry: Default::default(),
        agents,
        dispatcher,
        planner: None,
        memory: None,
        users: None,
    };
    Stack::start(config, shutdown.clone()).await
}

/// Goal completions observed on the events subjects, keyed by goal id.
#[derive(Clone)]
struct Completions {
    waiters: Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>,
    early: Arc<Mutex<std::collections::HashSet<String>>>,
}

impl Completions {
    async fn start(client: &async_nats::Client) -> anyhow::Result<Completions> {
        let mut sub = client.subscribe("hermes.event.>").await?;
        let this = Completions { waiters: Default::default(), early: Default::default() };
        let inner = this.clone();
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let Ok(events) = hermes_core::events::decode(&msg.payload) else { continue };
                for event in events {
                    if matches!(event.kind, Some(Kind::GoalCompleted(_)) | Some(Kind::GoalFailed(_))) {
                        // The waiters stay locked until an early end is noted: `wait` takes the
                        // same locks in the same order, so it sees either its waiter served or
                        // the early end (before, an end could fall between its two looks).
                        let mut waiters = inner.waiters.lock().await;
                        match waiters.remove(&event.goal_id) {
                            Some(tx) => {
                                let _ = tx.send(());
                            }
                            None => {
                                inner.early.lock().await.insert(event.goal_id);
                            }
                        }
                    }
                }
            }
        });
        Ok(this)
    }

    async fn wait(&self, goal_id: String) {
        let (tx, rx) = oneshot::channel();
        {
            let mut waiters = self.waiters.lock().await;
            if self.early.lock().await.remove(&goal_id) {
                return;
            }
            waiters.insert(goal_id, tx);
        }
        let _ = rx.await;
    }
}

fn one_node_goal(i: usize) -> GoalSpec {
    GoalSpec {
        plan: Some(TaskPlan {
            nodes: vec![TaskNode {
                id: "n".into(),
                task_type: "math.evaluate".into(),
                inputs_json: serde_json::json!({"expression": format!("{i} + 1")}).to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn submit(
    grpc: &DispatcherClient<tonic::transport::Channel>,
    spec: GoalSpec,
) -> anyhow::Result<String> {
    let mut grpc = grpc.clone();
    Ok(grpc.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await?.into_inner().goal_id)
}

async fn goal_latency(
    grpc: &DispatcherClient<tonic::transport::Channel>,
    done: &Completions,
) -> anyhow::Result<(f64, f64, f64)> {
    let mut samples = Vec::with_capacity(scale().latency_samples);
    let mut submits = Vec::with_capacity(scale().latency_samples);
    for i in 0..scale().latency_samples + 50 {
        let start = Instant::now();
        let id = submit(grpc, one_node_goal(i)).await?;
        let submitted = start.elapsed();
        done.wait(id).await;
        if i >= 50 {
            samples.push(start.elapsed().as_secs_f64() * 1e6);
            submits.push(submitted.as_secs_f64() * 1e6);
        }
    }
    Ok((percentile(&mut samples, 0.5), percentile(&mut samples, 0.99), percentile(&mut submits, 0.5)))
}

async fn goal_throughput(
    grpc: &DispatcherClient<tonic::transport::Channel>,
    done: &Completions,
) -> anyhow::Result<f64> {
    run_goals(grpc, done, scale().throughput_tasks, scale().in_flight).await
}

/// Runs `goals` single-node goals, `in_flight` at a time, each to its end; returns goals per
/// second.
async fn run_goals(
    grpc: &DispatcherClient<tonic::transport::Channel>,
    done: &Completions,
    goals: usize,
    in_flight: usize,
) -> anyhow::Result<f64> {
    let window = Arc::new(Semaphore::new(in_flight));
    let start = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for i in 0..goals {
        let permit = window.clone().acquire_owned().await?;
        let (grpc, done) = (grpc.clone(), done.clone());
        running.spawn(async move {
            let _permit = permit;
            let id = submit(&grpc, one_node_goal(i)).await?;
            tokio::time::timeout(Duration::from_secs(120), done.wait(id))
                .await
                .context("goal did not finish")?;
            anyhow::Ok(())
        });
        while let Some(r) = running.try_join_next() {
            r??;
        }
    }
    while let Some(r) = running.join_next().await {
        r??;
    }
    Ok(goals as f64 / start.elapsed().as_secs_f64())
}

/// How many times the core rows run the fan-out; its row is their median.
const FAN_OUT_RUNS: usize = 3;

async fn fan_out_wall(
    grpc: &DispatcherClient<tonic::transport::Channel>,
    done: &Completions,
) -> anyhow::Result<f64> {
    let nodes = (0..scale().fan_out)
        .map(|i| TaskNode {
            id: format!("n{i}"),
            task_type: "math.evaluate".into(),
            inputs_json: serde_json::json!({"expression": format!("{i} * 2")}).to_string(),
            ..Default::default()
        })
        .collect();
    let spec = GoalSpec { plan: Some(TaskPlan { nodes, ..Default::default() }), ..Default::default() };
    let start = Instant::now();
    let id = submit(grpc, spec).await?;
    tokio::time::timeout(Duration::from_secs(300), done.wait(id)).await.context("fan-out did not finish")?;
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

/// Wall time (ms) of a goal whose nodes form one chain, each depending on the one before and
/// reading its output through a `$ref`.
async fn chain_wall(
    grpc: &DispatcherClient<tonic::transport::Channel>,
    done: &Completions,
) -> anyhow::Result<f64> {
    let nodes = (0..scale().chain)
        .map(|i| {
            let inputs = if i == 0 {
                serde_json::json!({"expression": "1"})
            } else {
                let previous = format!("n{}.value", i - 1);
                serde_json::json!({"expression": "x + 1", "variables": {"x": {"$ref": previous}}})
            };
            TaskNode {
                id: format!("n{i}"),
                task_type: "math.evaluate".into(),
                inputs_json: inputs.to_string(),
                ..Default::default()
            }
        })
        .collect();
    let spec = GoalSpec { plan: Some(TaskPlan { nodes, ..Default::default() }), ..Default::default() };
    let start = Instant::now();
    let id = submit(grpc, spec).await?;
    tokio::time::timeout(Duration::from_secs(300), done.wait(id))
        .await
        .context("the chain did not finish")?;
    Ok(start.elapsed().as_secs_f64() * 1000.0)
}

/// `HERMES_BENCH_WIRETAP=1`: counts every message published during the throughput row by the
/// kind of subject it went to, so the operations per goal can be told apart.
struct Wiretap {
    counts: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Wiretap {
    async fn start(client: &async_nats::Client) -> anyhow::Result<Wiretap> {
        let mut all = client.subscribe(">").await?;
        client.flush().await?;
        let counts: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>> = Default::default();
        let inner = counts.clone();
        let task = tokio::spawn(async move {
            while let Some(msg) = all.next().await {
                let kind = subject_kind(msg.subject.as_str());
                *inner.lock().unwrap_or_else(|p| p.into_inner()).entry(kind).or_default() += 1;
            }
        });
        Ok(Wiretap { counts, task })
    }

    async fn print(self, goals: usize) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.task.abort();
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner()).clone();
        println!("\nmessages per goal during the throughput row, by subject (HERMES_BENCH_WIRETAP):");
        let mut rows: Vec<_> = counts.into_iter().collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.1));
        for (kind, n) in rows {
            println!("  {:>8.2}  {kind}", n as f64 / goals as f64);
        }
    }
}

/// A subject with its ids left out: `hermes.event.g-1` is `hermes.event.*`; JetStream API calls
/// keep their verb and stream, acks are `$JS.ACK`.
fn subject_kind(subject: &str) -> String {
    if subject.starts_with("$JS.ACK.") {
        return "$JS.ACK (acks, naks, progress)".into();
    }
    if subject.starts_with("_INBOX") {
        return "_INBOX (replies)".into();
    }
    let parts: Vec<&str> = subject.split('.').collect();
    let keep = if subject.starts_with("$JS.API.") {
        4
    } else if subject.starts_with("$KV.") || !subject.starts_with("hermes.task.") {
        2
    } else {
        4
    };
    let mut kind = parts.iter().take(keep).copied().collect::<Vec<_>>().join(".");
    if parts.len() > keep {
        kind.push_str(".*");
    }
    kind
}
