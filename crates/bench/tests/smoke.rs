//! `make bench` at smoke scale, so that `make test` keeps every row of it running: the binary
//! must finish and print each table, the fan-out rows with every watcher having got its goal's
//! terminal event.

use std::process::Command;

#[test]
fn the_bench_runs_every_row_at_smoke_scale() {
    let output = Command::new(env!("CARGO_BIN_EXE_hermes-bench"))
        .env("HERMES_BENCH_SCALE", "smoke")
        .output()
        .expect("the bench starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the bench failed:\n{stdout}\n{stderr}");
    for row in [
        "task round trip p50",
        "hermes single-node goal p50 via gRPC",
        "hermes tasks/s, 50 single-node goals in flight",
        "hermes 50-node fan-out goal wall time",
        "hermes 5-deep chain, per hop (ms)",
        "idle agent (hermes-executor)",
        "dispatcher after 100 goals, retained in KV",
        "40 watchers: first event p50 (ms)",
        "40 watchers: live event to the last of them (ms)",
        "40 watchers: another goal end to end (ms)",
        "route decision, in-process",
        "VectorIndex::search, 500 vectors",
        "newest failed of a tenant, 10000 goals",
        "newest, 2000 goals stored",
        "HNSW recall@10 against the exact top 10",
        "restart from the snapshot (messages replayed)",
        "while another tenant floods 200 goals (ms)",
        "single-node goal, its call a cache hit",
        "single-node goal, its call a cache miss (stored after)",
        "calls/s, max_concurrent = 4 (mock answers at once)",
        "calls the mock refused over its limit",
        "goal latency p99 (ms)",
        "tasks sent to an agent in cool-off",
        // `make test` installs Chromium first, so the console row is measured, not skipped.
        "console: 50-node Goal page interactive (ms)",
    ] {
        assert!(stdout.contains(row), "no `{row}` row in:\n{stdout}");
    }
    let terminal = stdout.lines().find(|l| l.starts_with("40 watchers: got the terminal event")).unwrap();
    assert!(terminal.trim_end().ends_with("40/40"), "{terminal}");
    // The bench fails on its own when the limiter lets too many by; the slots must be used too.
    let held = stdout.lines().find(|l| l.starts_with("most calls the mock held at once")).unwrap();
    assert!(held.trim_end().ends_with("/4") && !held.contains(" 0/4"), "{held}");
}

/// `HERMES_BENCH_REPEAT` (one engine row alone, for a profile of it) runs each row it names, and
/// names the rows it has when given another.
#[test]
fn one_engine_row_repeats_alone() {
    let run = |repeat: &str| {
        Command::new(env!("CARGO_BIN_EXE_hermes-bench"))
            .env("HERMES_BENCH_SCALE", "smoke")
            .env("HERMES_BENCH_REPEAT", repeat)
            .output()
            .expect("the bench starts")
    };
    for (repeat, line, count) in
        [("fan-out:2", "fan-out ", 2), ("throughput:1", "throughput ", 1), ("latency", "goal p50 ", 10)]
    {
        let output = run(repeat);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{repeat}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        let rows = stdout.lines().filter(|l| l.starts_with(line) && l.contains("x the floor's")).count();
        assert_eq!(rows, count, "{repeat}:\n{stdout}");
        assert!(!stdout.contains("route decision"), "{repeat} ran other rows:\n{stdout}");
    }
    let output = run("chain:1");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no row \"chain\" (fan-out, throughput, latency)"), "{stderr}");
}
