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
        "while another tenant floods 200 goals (ms)",
        // `make test` installs Chromium first, so the console row is measured, not skipped.
        "console: 50-node Goal page interactive (ms)",
    ] {
        assert!(stdout.contains(row), "no `{row}` row in:\n{stdout}");
    }
    let terminal = stdout.lines().find(|l| l.starts_with("40 watchers: got the terminal event")).unwrap();
    assert!(terminal.trim_end().ends_with("40/40"), "{terminal}");
}
