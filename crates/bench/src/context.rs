//! The design's context-trimming claim (docs/evaluation.md): one 20-step `agent.run` loop (the
//! executor's own `run_loop`, its real OpenAI-compatible client) driven by the scripted model,
//! which reads the four CSVs of `examples/data` in turn and then answers. The scripted server
//! counts each request's tokens (four characters of its messages and tools a token), and the loop
//! sums them, once with context management on and once off (`manage_context`). The window is
//! 32,768 tokens both times, so neither run is trimmed for lack of room.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use hermes_executor::agent_loop::{Budget, LoopSettings, run_loop};
use hermes_executor::{ToolContext, ToolRegistry};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use serde_json::json;

/// Input tokens of the whole loop with context management on, and off.
pub(crate) struct ContextTokens {
    pub steps: usize,
    pub managed: u64,
    pub unmanaged: u64,
}

pub(crate) async fn measure(steps: usize) -> anyhow::Result<ContextTokens> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/data");
    let managed = input_tokens(steps, true, &data).await?;
    let unmanaged = input_tokens(steps, false, &data).await?;
    Ok(ContextTokens { steps, managed, unmanaged })
}

async fn input_tokens(steps: usize, manage_context: bool, data: &Path) -> anyhow::Result<u64> {
    const FILES: [&str; 4] = ["sales.csv", "expenses.csv", "inventory.csv", "employees.csv"];
    let llm = ScriptedLlm::start().await;
    for step in 0..steps {
        let call = json!({"path": FILES[step % FILES.len()]}).to_string();
        llm.push("agent", ScriptedResponse::tool_call("fs__read", &call).with_counted_usage());
    }
    llm.push("agent", ScriptedResponse::content("Read all four files.").with_counted_usage());
    let mut config = hermes_llm::OpenAiConfig::new(llm.base_url(), "agent");
    config.context_window = 32_768;
    let model = hermes_llm::OpenAiChat::new(config)?;
    let mut registry = ToolRegistry::for_agent("bench");
    registry.register(Arc::new(hermes_executor::tools::FsRead))?;
    let settings = LoopSettings { manage_context, ..Default::default() };
    let ctx = ToolContext { workspace: data.to_path_buf(), task: None };
    let budget = Budget { max_steps: steps as u32 + 1, max_tokens: u64::MAX };
    let instruction = "Read sales.csv, expenses.csv, inventory.csv and employees.csv in turn, five times over, then say so.";
    let output = run_loop(&model, &registry, &ctx, &settings, instruction, &[], budget)
        .await
        .map_err(|e| anyhow::anyhow!("the {steps}-step loop failed: {e}"))?;
    let made = output["steps"].as_array().map_or(0, Vec::len);
    anyhow::ensure!(made == steps, "the loop made {made} tool calls, not {steps}");
    output["tokens"]["input"].as_u64().context("the loop reports its input tokens")
}

/// The row, beside the claim.
pub(crate) fn rows(tokens: &ContextTokens) {
    println!(
        "\n{:<58} {:>12} {:>12} {:>10}",
        format!("claim: {}-step agent.run, input tokens", tokens.steps),
        "managed",
        "unmanaged",
        "ratio"
    );
    println!(
        "{:<58} {:>12} {:>12} {:>9.2}x",
        "  context management on / off",
        tokens.managed,
        tokens.unmanaged,
        tokens.managed as f64 / tokens.unmanaged as f64
    );
    println!("the design's claim: 48k tokens down to 21k (0.44x) on a long task; see docs/evaluation.md.");
}
