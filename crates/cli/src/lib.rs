//! Wiring shared by the `hermes` command and the end-to-end tests: the all-in-one [`stack`], the
//! local nats-server launcher, and the plan file format.

pub mod api_client;
pub mod eval_cmd;
pub mod memory_cmd;
pub mod nats;
pub mod plan_file;
pub mod replay_cmd;
pub mod stack;
pub mod trace_cmd;
pub mod up;

/// `, cached, age 42 s` for a result that came from the tool-result cache; empty otherwise.
pub fn cached_note(cached: bool, age_ms: u64) -> String {
    if cached { format!(", cached, age {} s", age_ms / 1000) } else { String::new() }
}

/// An agent's routing health in a few words, for `hermes agents`: `ok`, `cool-off 12s`,
/// `probing`, `late` (docs/routing.md, "Latency and health"); `ok` from a view that says nothing.
pub fn agent_health(info: &hermes_proto::AgentInfo, now_unix_ms: u64) -> String {
    match info.health.as_str() {
        "" => "ok".to_owned(),
        "cool-off" => {
            let left = info.cool_off_until_unix_ms.saturating_sub(now_unix_ms).div_ceil(1000);
            format!("cool-off {left}s")
        }
        other => other.to_owned(),
    }
}

/// A `ModelWaiting` event in words.
pub fn model_waiting_line(w: &hermes_proto::ModelWaiting) -> String {
    if w.waiting {
        format!("{:<14} waiting for model slot of {} ({})", w.node_id, w.model, w.reason.replace('_', " "))
    } else {
        format!("{:<14} got a model slot of {} after {} ms", w.node_id, w.model, w.waited_ms)
    }
}

/// `ms` since the Unix epoch as UTC, `2026-12-02T05:19:40.123Z`.
pub fn format_time(ms: u64) -> String {
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn times_are_utc_dates() {
        assert_eq!(super::format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::format_time(1_796_188_780_123), "2026-12-02T05:19:40.123Z");
        assert_eq!(super::format_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
