//! What an idle agent holds. An agent pool runs many of them, so an idle one should cost little.
//!
//! The allocator (mimalloc) asks for transparent huge pages on the arenas it commits eagerly, so
//! with THP in `madvise` mode (Debian's default) a nearly empty heap was backed by whole 2 MiB
//! pages: 6 MB of an idle `hermes-executor`'s supervisor and 20 MB of its worker were
//! `AnonHugePages` (`/proc/<pid>/smaps`). [`lean`] turns THP off for the process first thing in
//! `main`, set in the binary itself rather than through the environment so that every way of
//! starting an agent gets it, and the flag is inherited by the supervised worker. An agent's heap
//! is small and short-lived per task, so huge pages buy it nothing. The binaries that run agents
//! are also linked with packed relative relocations (their `build.rs`), so the loader's
//! relocation table (over a megabyte) is not kept resident in both processes.
//!
//! The cost per slot (`max_concurrency`) is what a running task holds, not what an idle slot
//! reserves: an idle slot is a semaphore permit. docs/performance.md has the measures, and
//! `crates/cli/tests/processes/footprint.rs` holds an idle agent to its bound.

/// Turns transparent huge pages off for this process and the processes it starts. Call it first
/// in `main` of a binary that runs agents, before any thread starts. The heap the standard
/// library set up before `main` may already sit on a huge page, so a process that had to turn the
/// flag off starts itself again (`exec`, same arguments and environment); one that inherited the
/// flag (the supervised worker, or the process after that `exec`, which `HERMES_LEAN_RESTARTED`
/// marks so that it never happens twice) goes on at once. Where the
/// kernel refuses (not Linux, or a seccomp policy), the agent runs as before, only larger.
pub fn lean() {
    #[cfg(target_os = "linux")]
    {
        use nix::sys::prctl::{get_thp_disable, set_thp_disable};
        use std::os::unix::process::CommandExt as _;
        // Once at most, whatever the kernel reports after the exec: the marker goes with it.
        const RESTARTED: &str = "HERMES_LEAN_RESTARTED";
        if std::env::var_os(RESTARTED).is_some()
            || get_thp_disable().unwrap_or(true)
            || set_thp_disable(true).is_err()
        {
            return;
        }
        let Ok(exe) = std::env::current_exe() else { return };
        // Started through the dynamic loader (`ld-linux.so ./hermes-executor`), this process's
        // executable is the loader: going on as started is better than starting the loader.
        let is_loader = exe.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("ld-"));
        if is_loader {
            return;
        }
        let error =
            std::process::Command::new(exe).args(std::env::args_os().skip(1)).env(RESTARTED, "1").exec();
        // Still here: the exec failed, and this process goes on with what it has.
        eprintln!("cannot restart without transparent huge pages ({error}); going on as started");
    }
}
