//! The fleet-wide model limiter's row: model calls per second through the governor
//! (`[llm.limits]`, docs/llm.md) against the same OpenAI-compatible mock called directly, in one
//! run, and the most calls the mock saw at once (which must not pass the limit).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hermes_llm::governor::{Governor, LimitSettings, ModelLimits};
use hermes_llm::openai::{OpenAiChat, OpenAiConfig};
use hermes_llm::{ChatModel, ChatRequest, Message};
use hermes_test_util::provider::LimitedProvider;

/// One run's figures.
pub struct Limiter {
    pub callers: usize,
    pub limit: u32,
    pub calls: usize,
    /// Calls per second straight to the mock, no limits installed.
    pub direct_per_s: f64,
    /// Calls per second with every call admitted through the governor.
    pub limited_per_s: f64,
    /// The most calls the mock held at once while limited.
    pub max_in_flight: usize,
    /// Calls the mock refused for going over its own limit (0 unless the limiter let too many by).
    pub over_limit: usize,
}

/// `calls` chat calls from `callers` tasks at once, against a mock answering after `delay` and
/// refusing more than `limit` at once, first with no limits, then through a governor holding
/// the model to `limit` in flight.
pub async fn measure(
    nats_url: &str,
    callers: usize,
    calls: usize,
    limit: u32,
    delay: Duration,
) -> anyhow::Result<Limiter> {
    // The mock takes every direct call (the direct run is the ceiling, not a test of the mock).
    let provider = LimitedProvider::start(callers, delay).await;
    let mut config = OpenAiConfig::new(provider.base_url(), "bench-model");
    config.max_concurrency = callers;
    config.max_retries = 0;
    let model = Arc::new(OpenAiChat::new(config)?);

    hermes_llm::governor::install(None);
    let direct_per_s = run_calls(&model, callers, calls).await?;

    let bus = hermes_core::Bus::connect(hermes_core::BusConfig::new(nats_url)).await?;
    let settings = LimitSettings {
        models: [(
            "bench-model".to_owned(),
            ModelLimits { max_concurrent: Some(limit), ..Default::default() },
        )]
        .into(),
        ..Default::default()
    };
    let governor = Governor::start(&bus, &settings).await?;
    hermes_llm::governor::install(governor);
    provider.set_limit(limit as usize);
    provider.reset_max_in_flight();
    let limited = run_calls(&model, callers, calls).await;
    hermes_llm::governor::install(None);
    Ok(Limiter {
        callers,
        limit,
        calls,
        direct_per_s,
        limited_per_s: limited?,
        max_in_flight: provider.max_in_flight(),
        over_limit: provider.over_limit(),
    })
}

async fn run_calls(model: &Arc<OpenAiChat>, callers: usize, calls: usize) -> anyhow::Result<f64> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (model, next) = (model.clone(), next.clone());
        running.spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < calls {
                let request = ChatRequest {
                    messages: vec![Message::user("ping")],
                    max_tokens: Some(8),
                    ..Default::default()
                };
                model.chat(request).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = running.join_next().await {
        r??;
    }
    Ok(calls as f64 / start.elapsed().as_secs_f64())
}

pub fn rows(run: &Limiter) {
    let (callers, limit, calls) = (run.callers, run.limit, run.calls);
    println!(
        "\n{:<58} {:>12} {:>12} {:>10}",
        format!("model calls through the fleet limiter ({calls} calls, {callers} callers)"),
        "value",
        "direct",
        "ratio"
    );
    println!("{}", "-".repeat(95));
    println!(
        "{:<58} {:>12.0} {:>12.0} {:>9.2}x",
        format!("calls/s, max_concurrent = {limit} (mock answers at once)"),
        run.limited_per_s,
        run.direct_per_s,
        run.limited_per_s / run.direct_per_s.max(1e-9)
    );
    println!(
        "{:<58} {:>12}",
        "most calls the mock held at once while limited",
        format!("{}/{limit}", run.max_in_flight)
    );
    println!("{:<58} {:>12}", "calls the mock refused over its limit", run.over_limit);
    println!(
        "direct = the same calls with no limits installed. Every limited call is two compare-and-set\n\
         writes of one KV entry (admit, release), so the rate is bounded by the bus, not the model."
    );
}
