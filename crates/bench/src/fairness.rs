//! The fairness rows: one tenant's single-node goals, end to end, alone and while another
//! tenant floods the same agents with goals, on a stack with API tokens (so goals carry their
//! tenants and wait in their tenants' lanes of the pool).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::{GoalSpec, SubmitGoalRequest, TaskNode, TaskPlan};
use tokio_util::sync::CancellationToken;

use crate::{Completions, percentile};

const FLOOD_TOKEN: &str = "bench-flood";
const CALM_TOKEN: &str = "bench-calm";
/// How long each goal's one task takes: long enough that the flood queues.
const TASK_MS: u64 = 10;

/// What the rows show.
pub struct Fairness {
    pub flood: usize,
    /// End to end p50 and p99, and the p50 and p99 of the part after SubmitGoal returned (the
    /// dispatch, the wait for an agent and the run), in ms.
    pub alone: Latency,
    pub under_flood: Latency,
    /// How long the flood took to drain, for scale.
    pub flood_wall_ms: f64,
}

fn tokens() -> String {
    let roles = ["submitter", "viewer"];
    // Each tenant has a lane of its own (hermes_core::lanes).
    hermes_test_util::api_token("flood", FLOOD_TOKEN, "flood", &roles)
        + &hermes_test_util::api_token("calm", CALM_TOKEN, "calm", &roles)
}

fn nap_goal() -> GoalSpec {
    GoalSpec {
        plan: Some(TaskPlan {
            nodes: vec![TaskNode {
                id: "n".into(),
                task_type: "time.sleep".into(),
                inputs_json: serde_json::json!({"ms": TASK_MS}).to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn submit(grpc: &DispatcherClient<tonic::transport::Channel>, token: &str) -> anyhow::Result<String> {
    let mut request = tonic::Request::new(SubmitGoalRequest { spec: Some(nap_goal()) });
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse()?);
    Ok(grpc.clone().submit_goal(request).await?.into_inner().goal_id)
}

/// Percentiles of one tenant's goals, in ms.
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub after_submit_p50: f64,
    pub after_submit_p99: f64,
}

/// `samples` of the calm tenant's goals one after the other.
async fn calm_latency(
    grpc: &DispatcherClient<tonic::transport::Channel>,
    done: &Completions,
    samples: usize,
) -> anyhow::Result<Latency> {
    let (mut total, mut after) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for _ in 0..samples {
        let start = Instant::now();
        let id = submit(grpc, CALM_TOKEN).await?;
        let submitted = Instant::now();
        tokio::time::timeout(Duration::from_secs(120), done.wait(id))
            .await
            .context("a calm goal did not end")?;
        total.push(start.elapsed().as_secs_f64() * 1e3);
        after.push(submitted.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Latency {
        p50: percentile(&mut total, 0.5),
        p99: percentile(&mut total, 0.99),
        after_submit_p50: percentile(&mut after, 0.5),
        after_submit_p99: percentile(&mut after, 0.99),
    })
}

pub async fn measure(nats_url: &str, flood: usize, samples: usize) -> anyhow::Result<Fairness> {
    let client = async_nats::connect(nats_url).await?;
    let done = Completions::start(&client).await?;
    let workspace = tempfile::tempdir()?;
    let access = hermes_dispatcher::access::Access::parse(&tokens())?;
    let dispatcher = hermes_dispatcher::DispatcherConfig {
        grpc_listen: "127.0.0.1:0".parse()?,
        access: hermes_dispatcher::access::Tokens::fixed(access),
        ..Default::default()
    };
    let shutdown = CancellationToken::new();
    let stack = crate::start_stack(nats_url, workspace.path(), "fair", 16, dispatcher, &shutdown).await?;
    let grpc = DispatcherClient::connect(stack.grpc_url()).await?;
    let alone = calm_latency(&grpc, &done, samples).await?;

    // The flood: every goal submitted as fast as 64 submitters go, then followed to its end.
    let started = Instant::now();
    let flooding = {
        let (grpc, done) = (grpc.clone(), done.clone());
        tokio::spawn(async move {
            let window = Arc::new(tokio::sync::Semaphore::new(64));
            let mut running = tokio::task::JoinSet::new();
            for _ in 0..flood {
                let permit = window.clone().acquire_owned().await?;
                let grpc = grpc.clone();
                let submitted = async move {
                    let _permit = permit;
                    submit(&grpc, FLOOD_TOKEN).await
                };
                running.spawn(submitted);
            }
            let mut ids = Vec::with_capacity(flood);
            while let Some(id) = running.join_next().await {
                ids.push(id??);
            }
            for id in ids {
                tokio::time::timeout(Duration::from_secs(300), done.wait(id))
                    .await
                    .context("a flood goal did not end")?;
            }
            anyhow::Ok(started.elapsed())
        })
    };
    // Measure once the flood is queued behind the agents' slots.
    let queued_for = Duration::from_millis((flood as u64 * TASK_MS / 32 / 4).clamp(50, 2_000));
    tokio::time::sleep(queued_for).await;
    let under_flood = calm_latency(&grpc, &done, samples).await?;
    let flood_wall = flooding.await??;
    stack.stop().await;
    Ok(Fairness { flood, alone, under_flood, flood_wall_ms: flood_wall.as_secs_f64() * 1e3 })
}

pub fn rows(f: &Fairness) {
    println!(
        "\n{:<58} {:>12} {:>12} {:>10}",
        format!("fairness: one tenant's goal ({TASK_MS} ms task), 2 agents x 16"),
        "p50",
        "p99",
        "p99 ratio"
    );
    println!("{}", "-".repeat(95));
    let (a, u) = (&f.alone, &f.under_flood);
    println!("{:<58} {:>12.1} {:>12.1} {:>9.2}x", "alone, end to end (ms)", a.p50, a.p99, 1.0);
    println!(
        "{:<58} {:>12.1} {:>12.1} {:>9.2}x",
        format!("while another tenant floods {} goals (ms)", f.flood),
        u.p50,
        u.p99,
        u.p99 / a.p99
    );
    println!(
        "{:<58} {:>12.1} {:>12.1} {:>9.2}x",
        "  of which after SubmitGoal returned, alone (ms)", a.after_submit_p50, a.after_submit_p99, 1.0
    );
    println!(
        "{:<58} {:>12.1} {:>12.1} {:>9.2}x",
        "  of which after SubmitGoal returned, under the flood (ms)",
        u.after_submit_p50,
        u.after_submit_p99,
        u.after_submit_p99 / a.after_submit_p99
    );
    println!(
        "the flood took {:.0} ms to drain; without lanes a goal submitted into it waits for the rest of it.",
        f.flood_wall_ms
    );
}
