//! Fault-injection tools for Hermes' own tests, registered only when `HERMES_TEST_TOOLS=1` is in
//! the agent's environment (never by default):
//! - `test.abort`: aborts the agent process, as a stack overflow or an allocator failure would;
//!   the crash quarantine must move its task to the DLQ after at most two deaths.
//! - `test.spin`: burns CPU for `seconds` in an isolated child (like `text.template`), appending
//!   a line to `test-spin-runs.log` in the workspace each time it starts, so a test can count
//!   runs; its `timeout_ms` must stop it.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::{Value, json};

use crate::tool::{RetryPolicy, Tool, ToolContext, ToolError};

/// The environment variable that enables these tools.
pub const TEST_TOOLS_ENV: &str = "HERMES_TEST_TOOLS";

/// Whether the test tools are enabled in this process.
pub fn test_tools_enabled() -> bool {
    std::env::var(TEST_TOOLS_ENV).is_ok_and(|v| v == "1")
}

pub struct TestAbort;

impl Tool for TestAbort {
    fn name(&self) -> &str {
        "test.abort"
    }
    fn description(&self) -> &str {
        "Test only: aborts the agent process."
    }
    fn params_schema(&self) -> Value {
        json!({"type": "object"})
    }
    fn run<'a>(&'a self, _args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            tracing::error!(event = "test_abort", "test.abort: aborting the process");
            std::process::abort()
        })
    }
}

pub struct TestSpin;

const SPIN_LIMIT: Duration = Duration::from_secs(3);

impl Tool for TestSpin {
    fn name(&self) -> &str {
        "test.spin"
    }
    fn description(&self) -> &str {
        "Test only: burns CPU for `seconds`, stopped after 3 s."
    }
    fn params_schema(&self) -> Value {
        json!({"type": "object", "properties": {"seconds": {"type": "number", "minimum": 0}}, "required": ["seconds"]})
    }
    fn timeout(&self) -> Duration {
        SPIN_LIMIT + Duration::from_secs(2)
    }
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy { attempts: 1, ..Default::default() }
    }
    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            use std::io::Write;
            let log = ctx.workspace.join("test-spin-runs.log");
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| ToolError::failed(format!("{}: {e}", log.display())))?;
            let _ = writeln!(file, "run");
            let limits = crate::isolate::Limits { memory_mb: 64, timeout: SPIN_LIMIT };
            crate::isolate::run("test.spin", args, limits).await
        })
    }
}

/// The isolated job of `test.spin`.
pub(crate) fn spin_job(input: Value) -> Result<Value, ToolError> {
    let seconds = input.get("seconds").and_then(Value::as_f64).unwrap_or(0.0).clamp(0.0, 3600.0);
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut spins: u64 = 0;
    while Instant::now() < until {
        spins = std::hint::black_box(spins.wrapping_add(1));
    }
    Ok(json!({"spins": spins}))
}
