//! The crash supervisor: processes that run agents (`hermes up`, `hermes agent`,
//! `hermes-executor`) run as a child of a small supervisor that tells a crash from a kill.
//!
//! A task can crash the process that runs it: an abort, a stack overflow, an allocation failure,
//! the kernel's OOM killer. Redelivered, it would crash the next process too, for ever. Only the
//! parent of a process sees why it died, so the binary re-runs itself as its own child
//! (`HERMES_SUPERVISED=1`, started through `setpriv --pdeathsig KILL`, so it dies with the
//! supervisor) and waits for it:
//! - the child exits on its own (a normal exit, a drain after SIGTERM, which the supervisor
//!   forwards): the supervisor exits with its code;
//! - the child dies of SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS or SIGKILL (the OOM
//!   killer; a SIGKILL an operator sends to the supervisor instead takes both down and counts as
//!   nothing): the supervisor starts a new child and tells it which process instance crashed
//!   (`HERMES_CRASHED_INSTANCE`).
//!
//! The new child's agents then count a crash on every task that instance had in flight (the
//! crash markers, see the executor's crate docs); a task counted twice is quarantined to the DLQ.
//! So a `kill -9` of a whole agent, a node drained or a pod deleted is never mistaken for a
//! poison message. `HERMES_NO_SUPERVISOR=1` runs the process unsupervised (crashes are then not
//! counted, and the process manager's restart applies).

use std::process::ExitStatus;
use std::time::Duration;

/// Set in the supervised child.
pub const SUPERVISED_ENV: &str = "HERMES_SUPERVISED";
/// This process's instance id, given by the supervisor; agents record it in crash markers.
pub const INSTANCE_ENV: &str = "HERMES_PROCESS_INSTANCE";
/// The instance that crashed before this one started.
pub const CRASHED_ENV: &str = "HERMES_CRASHED_INSTANCE";
/// `1`: run without a supervisor.
pub const NO_SUPERVISOR_ENV: &str = "HERMES_NO_SUPERVISOR";

/// This process's instance id: the supervisor's choice, or a fresh one when unsupervised.
pub fn process_instance() -> &'static str {
    static INSTANCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(|| {
        std::env::var(INSTANCE_ENV)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string())
    })
}

/// The instance that crashed just before this process started, if the supervisor said so.
pub fn crashed_instance() -> Option<String> {
    std::env::var(CRASHED_ENV).ok().filter(|v| !v.is_empty())
}

/// The signal that killed a child, when it is one a crash produces.
fn crash_signal(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal().filter(|s| matches!(s, 4 | 6 | 7 | 8 | 9 | 11 | 31))
}

/// Becomes the supervisor of this binary, unless this process is the supervised child (or
/// supervision is off): then it returns at once. The supervisor never returns; it exits with the
/// child's exit code. Call it first in `main`, before any runtime starts; `name` prefixes its
/// messages.
pub fn supervise_unless_child(name: &str) {
    if std::env::var_os(SUPERVISED_ENV).is_some() || std::env::var(NO_SUPERVISOR_ENV).is_ok_and(|v| v == "1")
    {
        return;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{name}: cannot start the supervisor ({e}); running unsupervised");
            return;
        }
    };
    let code = runtime.block_on(supervise(name));
    std::process::exit(code);
}

async fn supervise(name: &str) -> i32 {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("{name}: cannot find its own executable; exiting");
        return 2;
    };
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        eprintln!("{name}: cannot handle signals; exiting");
        return 2;
    };
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    let mut crashed: Option<String> = None;
    let mut backoff = Duration::from_millis(200);
    loop {
        let instance = uuid::Uuid::new_v4().simple().to_string();
        // The child dies with the supervisor (the kernel sends it SIGKILL), so a `kill -9` of the
        // supervisor leaves nothing running and is not a crash.
        let mut command = if setpriv.exists() {
            let mut c = tokio::process::Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--"]).arg(&exe);
            c
        } else {
            tokio::process::Command::new(&exe)
        };
        command.args(&args).env(SUPERVISED_ENV, "1").env(INSTANCE_ENV, &instance);
        match &crashed {
            Some(previous) => command.env(CRASHED_ENV, previous),
            None => command.env_remove(CRASHED_ENV),
        };
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!("{name}: cannot start its worker process: {e}");
                return 2;
            }
        };
        let forward = |child: &tokio::process::Child, sig: nix::sys::signal::Signal| {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
            }
        };
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                _ = term.recv() => forward(&child, nix::sys::signal::Signal::SIGTERM),
                _ = int.recv() => forward(&child, nix::sys::signal::Signal::SIGINT),
            }
        };
        let status = match status {
            Ok(status) => status,
            Err(e) => {
                eprintln!("{name}: lost its worker process: {e}");
                return 2;
            }
        };
        match crash_signal(status) {
            Some(signal) => {
                eprintln!(
                    "{name}: the worker process crashed (signal {signal}); starting a new one; the tasks it was running count one crash each"
                );
                crashed = Some(instance);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            None => return status.code().unwrap_or(1),
        }
    }
}
