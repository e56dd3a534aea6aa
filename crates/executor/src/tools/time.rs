//! `time.now` and `time.add`, in UTC, RFC 3339.

use chrono::{DateTime, Duration as ChronoDuration, SecondsFormat, Utc};
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::tool::{Tool, ToolContext, ToolError, parse_args, schema_of};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NowArgs {}

pub struct TimeNow;

impl Tool for TimeNow {
    fn name(&self) -> &'static str {
        "time.now"
    }

    fn description(&self) -> &'static str {
        "Returns the current time as {rfc3339, unix_ms}, in UTC."
    }

    fn params_schema(&self) -> Value {
        schema_of::<NowArgs>()
    }

    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let _: NowArgs = parse_args(args)?;
            Ok(describe(Utc::now()))
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct AddArgs {
    /// An RFC 3339 timestamp, e.g. `2026-04-30T12:00:00Z`.
    time: String,
    #[serde(default)]
    days: i64,
    #[serde(default)]
    hours: i64,
    #[serde(default)]
    minutes: i64,
    #[serde(default)]
    seconds: i64,
}

pub struct TimeAdd;

impl Tool for TimeAdd {
    fn name(&self) -> &'static str {
        "time.add"
    }

    fn description(&self) -> &'static str {
        "Adds days, hours, minutes and seconds (each may be negative) to an RFC 3339 time; returns {rfc3339, unix_ms}."
    }

    fn params_schema(&self) -> Value {
        schema_of::<AddArgs>()
    }

    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: AddArgs = parse_args(args)?;
            add(&args).map(describe)
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SleepArgs {
    /// How long to wait, in milliseconds (at most 60000).
    #[schemars(range(max = 60000))]
    ms: u64,
}

/// Longest `time.sleep`.
const MAX_SLEEP_MS: u64 = 60_000;

pub struct TimeSleep;

impl Tool for TimeSleep {
    fn name(&self) -> &'static str {
        "time.sleep"
    }

    fn description(&self) -> &'static str {
        "Waits the given number of milliseconds (at most 60000), then returns {slept_ms}. Use it to pace steps."
    }

    fn params_schema(&self) -> Value {
        schema_of::<SleepArgs>()
    }

    fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(MAX_SLEEP_MS + 1000)
    }

    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: SleepArgs = parse_args(args)?;
            if args.ms > MAX_SLEEP_MS {
                return Err(ToolError::invalid_argument(format!("ms must be at most {MAX_SLEEP_MS}")));
            }
            tokio::time::sleep(std::time::Duration::from_millis(args.ms)).await;
            Ok(json!({ "slept_ms": args.ms }))
        })
    }
}

fn add(args: &AddArgs) -> Result<DateTime<Utc>, ToolError> {
    let start = DateTime::parse_from_rfc3339(&args.time)
        .map_err(|e| ToolError::invalid_argument(format!("time `{}` is not RFC 3339: {e}", args.time)))?
        .with_timezone(&Utc);
    let overflow = || ToolError::invalid_argument("the offset is out of range");
    let offset = [
        ChronoDuration::try_days(args.days),
        ChronoDuration::try_hours(args.hours),
        ChronoDuration::try_minutes(args.minutes),
        ChronoDuration::try_seconds(args.seconds),
    ]
    .into_iter()
    .try_fold(ChronoDuration::zero(), |acc, d| acc.checked_add(&d?))
    .ok_or_else(overflow)?;
    start.checked_add_signed(offset).ok_or_else(overflow)
}

fn describe(time: DateTime<Utc>) -> Value {
    json!({
        "rfc3339": time.to_rfc3339_opts(SecondsFormat::Millis, true),
        "unix_ms": time.timestamp_millis(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_mixed_offsets() {
        let args =
            AddArgs { time: "2026-04-30T12:00:00Z".into(), days: 1, hours: -2, minutes: 30, seconds: 0 };
        let out = describe(add(&args).unwrap());
        assert_eq!(out["rfc3339"], "2026-05-01T10:30:00.000Z");
    }

    #[test]
    fn rejects_bad_times_and_overflow() {
        let bad = AddArgs { time: "yesterday".into(), days: 0, hours: 0, minutes: 0, seconds: 0 };
        assert!(add(&bad).is_err());
        let huge =
            AddArgs { time: "2026-04-30T12:00:00Z".into(), days: i64::MAX, hours: 0, minutes: 0, seconds: 0 };
        assert!(add(&huge).is_err());
    }
}
