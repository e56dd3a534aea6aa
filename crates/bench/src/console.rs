//! The web console's row: how long the Goal page of a 2,000-node goal takes to become
//! interactive in a real headless Chromium (docs/console.md), from the hash change to a node's
//! details open. Not measured (and said so) where Chromium is not installed.

use std::time::{Duration, Instant};

use anyhow::Context;
use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::{GoalSpec, TaskNode, TaskPlan};
use hermes_test_util::browser::Browser;
use serde_json::json;

use crate::{Completions, submit};

/// What the console row measured: the page interactive and its own render time (ms).
pub(crate) struct ConsoleTimes {
    pub interactive_ms: f64,
    pub render_ms: f64,
}

/// A goal of `nodes` nodes (one root, the rest each reading its output) is run to the end, then
/// its page is opened from the Goals page; `Ok(Err(why))` when no browser could start.
pub(crate) async fn goal_page(
    grpc: &DispatcherClient<tonic::transport::Channel>,
    done: &Completions,
    http: &str,
    nodes: usize,
) -> anyhow::Result<Result<ConsoleTimes, String>> {
    let browser = match Browser::start().await {
        Ok(browser) => browser,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let plan = (0..nodes)
        .map(|i| {
            let inputs = match i {
                0 => json!({"expression": "1"}),
                _ => json!({"expression": "x + 1", "variables": {"x": {"$ref": "root.value"}}}),
            };
            TaskNode {
                id: if i == 0 { "root".into() } else { format!("n{i:04}") },
                task_type: "math.evaluate".into(),
                inputs_json: inputs.to_string(),
                ..Default::default()
            }
        })
        .collect();
    let spec = GoalSpec { plan: Some(TaskPlan { nodes: plan, ..Default::default() }), ..Default::default() };
    let id = submit(grpc, spec).await?;
    tokio::time::timeout(Duration::from_secs(300), done.wait(id.clone()))
        .await
        .context("the goal did not finish")?;

    let wait = Duration::from_secs(60);
    browser.goto(&format!("{http}/#/goals")).await;
    browser.wait_until("return document.body.dataset.ready === 'goals'", wait, "the Goals page").await;
    let start = Instant::now();
    browser.script(&format!("location.hash = '#/goal/{id}'"), json!([])).await;
    browser.wait_until("return document.body.dataset.ready === 'goal'", wait, "the Goal page").await;
    let last = format!("g[data-node='n{:04}']", nodes - 1);
    browser.wait_for(&last, wait).await.click().await;
    browser.wait_for("#node-inputs", wait).await;
    let interactive_ms = start.elapsed().as_secs_f64() * 1000.0;
    let render_ms = browser
        .script("return Number(document.body.dataset.renderMs)", json!([]))
        .await
        .as_f64()
        .unwrap_or(f64::NAN);
    browser.close().await;
    Ok(Ok(ConsoleTimes { interactive_ms, render_ms }))
}
