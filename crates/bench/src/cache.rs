//! The tool-result cache's row (docs/agents.md "Cached tool results"): a single-node goal's
//! latency on a stack whose agents cache `math.evaluate`, when its call is a hit (the same
//! arguments as a goal before it) and when it is a miss (new arguments), beside the same goal on
//! the same shape of stack with no cache, measured just before it.

use std::time::Instant;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::{Completions, percentile, submit};

/// One run's p50s, in µs.
pub struct CachedGoals {
    pub hit_p50: f64,
    pub miss_p50: f64,
    /// New arguments each time, on a stack whose agents cache nothing.
    pub uncached_p50: f64,
    pub samples: usize,
}

pub async fn measure(nats_url: &str, samples: usize) -> anyhow::Result<CachedGoals> {
    let (_, uncached) = goals(nats_url, samples, false).await?;
    let (hits, misses) = goals(nats_url, samples, true).await?;
    Ok(CachedGoals { hit_p50: hits, miss_p50: misses, uncached_p50: uncached, samples })
}

/// The p50s (µs) of goals repeating one call and of goals with new arguments each, interleaved,
/// on a stack of two agents that cache `math.evaluate` or not.
async fn goals(nats_url: &str, samples: usize, cached: bool) -> anyhow::Result<(f64, f64)> {
    let workspace = tempfile::tempdir()?;
    let agents = (1..=2)
        .map(|i| {
            let mut c = hermes_executor::AgentConfig::new(format!("cache-{cached}-{i}"), workspace.path());
            if cached {
                c.cache_tools = [("math.evaluate".to_owned(), 0)].into();
            }
            c
        })
        .collect();
    let shutdown = CancellationToken::new();
    let config = hermes_cli::stack::StackConfig {
        nats_url: nats_url.into(),
        registry: Default::default(),
        agents,
        dispatcher: hermes_dispatcher::DispatcherConfig {
            grpc_listen: "127.0.0.1:0".parse()?,
            ..Default::default()
        },
        planner: None,
        memory: None,
        users: None,
    };
    let stack = hermes_cli::stack::Stack::start(config, shutdown.clone()).await?;
    let grpc = hermes_proto::dispatcher_client::DispatcherClient::connect(stack.grpc_url()).await?;
    let client = async_nats::connect(nats_url).await?;
    let done = Completions::start(&client).await?;
    // Other expressions than the core rows' goals (`{i} + 1`), which ran on the same server;
    // the uncached run's are not stored, so the cached run's are misses too.
    let goal = |expression: String| hermes_proto::GoalSpec {
        plan: Some(hermes_proto::TaskPlan {
            nodes: vec![hermes_proto::TaskNode {
                id: "n".into(),
                task_type: "math.evaluate".into(),
                inputs_json: serde_json::json!({ "expression": expression }).to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let timed = async |spec| -> anyhow::Result<f64> {
        let start = Instant::now();
        let id = submit(&grpc, spec).await?;
        tokio::time::timeout(std::time::Duration::from_secs(60), done.wait(id))
            .await
            .context("a cache row goal did not finish")?;
        Ok(start.elapsed().as_secs_f64() * 1e6)
    };
    let (mut hits, mut misses) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    timed(goal("7 * 6".into())).await?;
    for i in 0..samples + 20 {
        let hit = timed(goal("7 * 6".into())).await?;
        let miss = timed(goal(format!("{i} * 3 - 1"))).await?;
        if i >= 20 {
            hits.push(hit);
            misses.push(miss);
        }
    }
    stack.stop().await;
    Ok((percentile(&mut hits, 0.5), percentile(&mut misses, 0.5)))
}

pub fn rows(run: &CachedGoals) {
    let uncached_p50 = run.uncached_p50;
    println!(
        "\n{:<58} {:>12} {:>12} {:>10}",
        format!("cached tool results ({} goals each, 1 in flight)", run.samples),
        "p50 µs",
        "no cache",
        "ratio"
    );
    println!("{}", "-".repeat(95));
    let row = |name: &str, value: f64| {
        println!("{name:<58} {value:>12.1} {uncached_p50:>12.1} {:>9.2}x", value / uncached_p50)
    };
    row("single-node goal, its call a cache hit", run.hit_p50);
    row("single-node goal, its call a cache miss (stored after)", run.miss_p50);
    println!(
        "no cache = the same goals with new arguments on the same shape of stack, caching nothing.\n\
         math.evaluate itself takes microseconds, so the hit row shows the cache's own cost (one KV\n\
         read); a costly tool saves its run time on a hit."
    );
}
