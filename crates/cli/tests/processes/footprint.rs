//! An idle agent is lean: `hermes agent` (its crash supervisor and its worker, as an operator
//! runs it) against a real nats-server, read from `/proc` once it serves. Transparent huge pages
//! are off in both processes (`hermes_executor::lean`: before that, a nearly empty heap sat on
//! whole 2 MiB pages, 26 MB of an idle release agent's 53 MB), and their anonymous memory, the
//! part the binary controls (heap, stacks, relocations), stays under a bound. The release
//! binary's whole RSS against its goal is `make bench`'s footprint row (docs/performance.md):
//! this test runs the debug build, whose code pages are several times larger.

use std::time::{Duration, Instant};

use hermes_test_util::process::{HermesProcess, anon_huge_pages_of, status_bytes, tree_of};

/// The idle agent's anonymous memory, supervisor and worker together. Measured: about 9 MB for
/// the release build and 15 MB for the debug one; with huge pages it was 31 MB (release).
const ANON_BOUND_BYTES: u64 = 24 * 1024 * 1024;

#[test]
fn an_idle_agent_holds_no_huge_pages_and_little_anonymous_memory() {
    let nats = hermes_test_util::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let workspace = dir.path().to_str().unwrap();
    let agent = HermesProcess::start_logged(
        env!("CARGO_BIN_EXE_hermes"),
        &["agent", "--nats-url", &nats.url(), "--agent-id", "footprint-1", "--workspace", workspace],
        &log,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("agent serving") {
        assert!(
            Instant::now() < deadline,
            "the agent did not serve within 60 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Settled: its first heartbeats and their mirror are behind it.
    std::thread::sleep(Duration::from_secs(2));
    let tree = tree_of(agent.pid());
    assert!(tree.len() >= 2, "a supervisor and its worker: {tree:?}");
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    let (mut rss, mut anon, mut huge) = (0, 0, 0);
    for &pid in &tree {
        let (r, a, h) = (status_bytes(pid, "VmRSS"), status_bytes(pid, "RssAnon"), anon_huge_pages_of(pid));
        eprintln!("pid {pid}: RSS {:.1} MB, anonymous {:.1} MB, on huge pages {:.1} MB", mb(r), mb(a), mb(h));
        (rss, anon, huge) = (rss + r, anon + a, huge + h);
    }
    eprintln!("idle agent (debug build): RSS {:.1} MB, anonymous {:.1} MB", mb(rss), mb(anon));
    assert_eq!(huge, 0, "an idle agent's heap is on transparent huge pages ({:.1} MB)", mb(huge));
    assert!(
        anon <= ANON_BOUND_BYTES,
        "an idle agent holds {:.1} MB of anonymous memory (bound {:.1} MB)",
        mb(anon),
        mb(ANON_BOUND_BYTES)
    );
}
