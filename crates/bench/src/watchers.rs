//! Goal event fan-out: many watchers of one goal, half Server-Sent Events and half gRPC
//! `WatchGoal`, on one dispatcher. Measured: each watcher's delay to its first event (the goal's
//! history, replayed), the delay from one live event (a cancel) to the last watcher's having it,
//! the memory the watchers hold, and a second client's goal watched end to end meanwhile. The
//! baseline is one watcher alone, measured the same way in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::{CancelGoalRequest, GoalSpec, TaskNode, TaskPlan, WatchGoalRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Barrier;
use tonic::transport::Channel;

use crate::routing::counting;

/// gRPC watch streams per HTTP/2 connection (the server allows 200 at once on one).
const STREAMS_PER_CHANNEL: usize = 100;

/// One run's figures.
pub struct FanOut {
    pub watchers: usize,
    pub first_event_p50_ms: f64,
    pub first_event_p99_ms: f64,
    /// From the cancel to the last watcher's reading the terminal event.
    pub live_event_to_all_ms: f64,
    /// Live bytes the open watchers hold (client and server sides, both in this process).
    pub bytes_per_watcher: f64,
    /// A second goal, submitted and watched to its end while the watchers are open.
    pub other_goal_ms: f64,
    /// Watchers that got the terminal event (must be all of them).
    pub finished: usize,
}

/// `watchers` streams on one long goal, half SSE (`http`) and half gRPC (`grpc`), then a cancel.
pub async fn fan_out(grpc_url: &str, http: &str, watchers: usize) -> anyhow::Result<FanOut> {
    let mut grpc = DispatcherClient::connect(grpc_url.to_owned()).await?;
    let goal_id = grpc
        .submit_goal(hermes_proto::SubmitGoalRequest { spec: Some(sleeping_goal()) })
        .await?
        .into_inner()
        .goal_id;
    let addr = http.trim_start_matches("http://").to_owned();
    let sse = watchers / 2;
    let mut channels = Vec::new();
    for _ in 0..(watchers - sse).div_ceil(STREAMS_PER_CHANNEL) {
        channels.push(DispatcherClient::new(Channel::from_shared(grpc_url.to_owned())?.connect().await?));
    }
    let before = counting::live_bytes();
    // Every watcher reports its first event, then waits at the barrier for the measurement.
    let all_open = Arc::new(Barrier::new(watchers + 1));
    let mut running = tokio::task::JoinSet::new();
    for i in 0..watchers {
        let all_open = all_open.clone();
        if i < sse {
            let (addr, path) = (addr.clone(), format!("/v1/goals/{goal_id}/events"));
            running.spawn(async move { sse_watch(&addr, &path, all_open).await });
        } else {
            let client = channels[(i - sse) / STREAMS_PER_CHANNEL].clone();
            let goal_id = goal_id.clone();
            running.spawn(async move { grpc_watch(client, goal_id, all_open).await });
        }
    }
    tokio::time::timeout(Duration::from_secs(300), all_open.wait())
        .await
        .context("the watchers did not all get their first event")?;
    let bytes_per_watcher = counting::live_bytes().saturating_sub(before) as f64 / watchers as f64;

    let other_started = Instant::now();
    let other = grpc
        .submit_goal(hermes_proto::SubmitGoalRequest { spec: Some(crate::one_node_goal(7)) })
        .await?
        .into_inner()
        .goal_id;
    let events: Vec<_> = grpc
        .watch_goal(WatchGoalRequest { goal_id: other, after_seq: 0 })
        .await?
        .into_inner()
        .collect()
        .await;
    anyhow::ensure!(events.iter().all(Result::is_ok), "the second client's watch failed");
    let other_goal_ms = other_started.elapsed().as_secs_f64() * 1000.0;

    let cancelled = Instant::now();
    grpc.cancel_goal(CancelGoalRequest { goal_id, reason: "bench".into() }).await?;
    let mut first = Vec::with_capacity(watchers);
    let mut finished = 0;
    while let Some(done) = tokio::time::timeout(Duration::from_secs(300), running.join_next())
        .await
        .context("the watchers did not all end")?
    {
        let (first_ms, ended) = done??;
        first.push(first_ms);
        finished += usize::from(ended);
    }
    let live_event_to_all_ms = cancelled.elapsed().as_secs_f64() * 1000.0;
    Ok(FanOut {
        watchers,
        first_event_p50_ms: crate::percentile(&mut first, 0.5),
        first_event_p99_ms: crate::percentile(&mut first, 0.99),
        live_event_to_all_ms,
        bytes_per_watcher,
        other_goal_ms,
        finished,
    })
}

/// A goal that runs until it is cancelled.
fn sleeping_goal() -> GoalSpec {
    let node = TaskNode {
        id: "nap".into(),
        task_type: "time.sleep".into(),
        inputs_json: serde_json::json!({"ms": 60_000}).to_string(),
        ..Default::default()
    };
    GoalSpec { plan: Some(TaskPlan { nodes: vec![node], ..Default::default() }), ..Default::default() }
}

/// An SSE stream over a plain HTTP/1.1 connection: the delay to its first `data:` line, and
/// whether the stream went on to its end (the server closes it after the terminal event).
async fn sse_watch(addr: &str, path: &str, all_open: Arc<Barrier>) -> anyhow::Result<(f64, bool)> {
    let started = Instant::now();
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    conn.write_all(request.as_bytes()).await?;
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut first = None;
    loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if first.is_none() && contains(&seen, b"\ndata:") {
            first = Some(started.elapsed().as_secs_f64() * 1000.0);
            all_open.wait().await;
        }
        // Chunked transfer: the last chunk ends the stream.
        if seen.ends_with(b"\r\n0\r\n\r\n") {
            break;
        }
        if seen.len() > 64 * 1024 {
            seen.drain(..seen.len() - 1024);
        }
    }
    let ended = contains(&seen, b"goalCancelled");
    Ok((first.context("the SSE stream ended before any event")?, ended))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn grpc_watch(
    mut client: DispatcherClient<Channel>,
    goal_id: String,
    all_open: Arc<Barrier>,
) -> anyhow::Result<(f64, bool)> {
    use hermes_proto::event::Kind;
    let started = Instant::now();
    let mut stream = client.watch_goal(WatchGoalRequest { goal_id, after_seq: 0 }).await?.into_inner();
    let mut first = None;
    let mut ended = false;
    while let Some(event) = stream.next().await {
        let event = event?;
        if first.is_none() {
            first = Some(started.elapsed().as_secs_f64() * 1000.0);
            all_open.wait().await;
        }
        ended = matches!(event.kind, Some(Kind::GoalCancelled(_)));
    }
    Ok((first.context("the watch ended before any event")?, ended))
}
