//! The crash supervisor: processes that run agents (`hermes up`, `hermes agent`,
//! `hermes-executor`) run as a child of a small supervisor that tells a crash from a kill.
//!
//! A task can crash the process that runs it: an abort, a stack overflow, an allocation failure,
//! the kernel's OOM killer. Redelivered, it would crash the next process too, for ever. Only the
//! parent of a process sees why it died, so the binary re-runs itself as its own child
//! (`HERMES_SUPERVISED=1`, started through `setpriv --pdeathsig KILL`, so it dies with the
//! supervisor) and waits for it:
//! - the child exits on its own (a normal exit, a drain after SIGTERM, which the supervisor
//!   forwards, as it forwards SIGINT and SIGHUP): the supervisor exits with its code;
//! - the child dies of SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS or SIGKILL (the OOM
//!   killer; a SIGKILL an operator sends to the supervisor instead takes both down and counts as
//!   nothing): the supervisor starts a new child and hands it the tasks the crashed one ran.
//!
//! The supervisor knows which tasks the child had in flight without any write to the bus: the child
//! tells it on a pipe it inherits (`HERMES_SUPERVISOR_TASKS_FD`), one line when a task starts
//! (`+key`) and one when it ends (`-key`), a few microseconds each. When the child crashes, the
//! supervisor reads the pipe to its end and hands the keys still in flight to the next child in a
//! memory file (`HERMES_CRASHED_TASKS_FD`); that child counts one crash on each in the ledger's
//! crash markers before it takes any task ([`crashed_tasks`]), and a task counted twice is
//! quarantined to the DLQ. So a `kill -9` of a whole agent, a node drained or a pod deleted is
//! never mistaken for a poison message, and a task that runs normally costs no ledger write.
//! `HERMES_NO_SUPERVISOR=1` runs the process unsupervised (crashes are then not counted, and the
//! process manager's restart applies).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::process::ExitStatus;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::unistd::pipe;
use tokio::io::AsyncBufReadExt as _;

/// Set in the supervised child.
pub const SUPERVISED_ENV: &str = "HERMES_SUPERVISED";
/// `1`: run without a supervisor.
pub const NO_SUPERVISOR_ENV: &str = "HERMES_NO_SUPERVISOR";
/// The child's end of the pipe on which it tells the supervisor which tasks it runs.
pub const TASKS_FD_ENV: &str = "HERMES_SUPERVISOR_TASKS_FD";
/// A memory file holding the keys of the tasks the previous child had in flight when it crashed,
/// one per line.
pub const CRASHED_TASKS_FD_ENV: &str = "HERMES_CRASHED_TASKS_FD";

/// The pipe to the supervisor, in a supervised child: taken from the environment once, and closed
/// on exec, so the processes a tool starts do not hold it.
fn tasks_pipe() -> Option<&'static Mutex<File>> {
    static PIPE: OnceLock<Option<Mutex<File>>> = OnceLock::new();
    PIPE.get_or_init(|| inherited(TASKS_FD_ENV, std::fs::OpenOptions::new().write(true)).map(Mutex::new))
        .as_ref()
}

/// The file the descriptor named by `env` refers to, opened again (closed on exec, as Rust opens
/// files) through `/proc/self/fd`, and the inherited descriptor closed; `None` when the variable
/// is unset or names no open descriptor.
fn inherited(env: &str, options: &std::fs::OpenOptions) -> Option<File> {
    let fd: RawFd = std::env::var(env).ok()?.parse().ok()?;
    if fd < 3 {
        return None;
    }
    let file = options.open(format!("/proc/self/fd/{fd}")).ok()?;
    let _ = nix::unistd::close(fd);
    Some(file)
}

/// Tells the supervisor that the task keyed `key` runs in this process, until the returned guard
/// is dropped. `None` when the process is not supervised (its crashes are not counted) or the key
/// cannot be told (a newline in it, or over a pipe's atomic write).
pub fn running(key: &str) -> Option<Running> {
    tell('+', key).then(|| Running { key: key.to_owned() })
}

/// A task the supervisor knows runs here; dropping it tells the supervisor it ended.
#[derive(Debug)]
pub struct Running {
    key: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        tell('-', &self.key);
    }
}

/// Writes one line to the supervisor. A line under `PIPE_BUF` is written whole, whatever other
/// task writes at the same time.
fn tell(sign: char, key: &str) -> bool {
    const PIPE_BUF: usize = 4096;
    let Some(pipe) = tasks_pipe() else { return false };
    if key.contains('\n') || key.len() + 2 > PIPE_BUF {
        return false;
    }
    let line = format!("{sign}{key}\n");
    let mut pipe = pipe.lock().unwrap_or_else(|p| p.into_inner());
    pipe.write_all(line.as_bytes()).is_ok()
}

/// The keys of the tasks the previous process had in flight when it crashed, as its supervisor
/// handed them over; empty when it did not crash. The first call takes them: a process counts
/// its predecessor's crashes once, whichever of its agents starts first.
pub fn crashed_tasks() -> Vec<String> {
    predecessor().lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_default()
}

/// The keys [`crashed_tasks`] hands out, read from the memory file the first time.
fn predecessor() -> &'static Mutex<Option<Vec<String>>> {
    static CRASHED: OnceLock<Mutex<Option<Vec<String>>>> = OnceLock::new();
    CRASHED.get_or_init(|| {
        let keys = inherited(CRASHED_TASKS_FD_ENV, std::fs::OpenOptions::new().read(true)).map(|mut file| {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            text.lines().filter(|k| !k.is_empty()).map(str::to_owned).collect()
        });
        Mutex::new(keys)
    })
}

/// What the supervisor knows of its child's tasks: the keys in flight, in the order they started.
#[derive(Default)]
struct InFlight {
    started: u64,
    keys: HashMap<String, u64>,
}

impl InFlight {
    fn apply(&mut self, line: &[u8]) {
        let Ok(line) = std::str::from_utf8(line) else { return };
        let line = line.trim_end_matches('\n');
        if let Some(key) = line.strip_prefix('+') {
            self.started += 1;
            self.keys.insert(key.to_owned(), self.started);
        } else if let Some(key) = line.strip_prefix('-') {
            self.keys.remove(key);
        }
    }

    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<(&String, &u64)> = self.keys.iter().collect();
        keys.sort_by_key(|(_, started)| **started);
        keys.into_iter().map(|(key, _)| key.clone()).collect()
    }
}

/// The supervisor's end of the child's pipe, read in its own runtime (no thread of its own: the
/// supervisor is meant to stay small).
struct TasksPipe {
    lines: tokio::io::BufReader<tokio::net::unix::pipe::Receiver>,
    line: Vec<u8>,
    open: bool,
    in_flight: InFlight,
}

impl TasksPipe {
    fn new(read: OwnedFd) -> std::io::Result<Self> {
        let receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(read)?;
        Ok(Self {
            lines: tokio::io::BufReader::new(receiver),
            line: Vec::new(),
            open: true,
            in_flight: InFlight::default(),
        })
    }

    /// Reads one line and applies it; the pipe is closed once every writer has gone. Safe to
    /// cancel: a line read in part stays in `line` for the next call.
    async fn read_line(&mut self) {
        match self.lines.read_until(b'\n', &mut self.line).await {
            Ok(0) | Err(_) => self.open = false,
            Ok(_) if self.line.ends_with(b"\n") => {
                self.in_flight.apply(&self.line);
                self.line.clear();
            }
            Ok(_) => {}
        }
    }

    /// The keys in flight when the child died, once the pipe is read to its end (or after two
    /// seconds, should something else still hold its writing end).
    async fn at_exit(mut self) -> Vec<String> {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while self.open {
                self.read_line().await;
            }
        })
        .await;
        if !self.line.is_empty() {
            self.in_flight.apply(&self.line);
        }
        self.in_flight.keys()
    }
}

/// A memory file holding `keys`, one per line, for the next child (not closed on exec).
fn crashed_tasks_file(keys: &[String]) -> std::io::Result<OwnedFd> {
    let fd = memfd_create("hermes-crashed-tasks", MFdFlags::empty())?;
    let mut file = File::from(fd);
    for key in keys {
        writeln!(file, "{key}")?;
    }
    file.seek(std::io::SeekFrom::Start(0))?;
    Ok(file.into())
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
    if std::env::var_os(SUPERVISED_ENV).is_some() {
        // Taken now, before anything can start a process that would inherit them.
        tasks_pipe();
        predecessor();
        return;
    }
    if std::env::var(NO_SUPERVISOR_ENV).is_ok_and(|v| v == "1") {
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
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()), signal(SignalKind::hangup()))
    else {
        eprintln!("{name}: cannot handle signals; exiting");
        return 2;
    };
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    let mut crashed: Option<OwnedFd> = None;
    let mut backoff = Duration::from_millis(200);
    loop {
        // The child's pipe: its writing end is inherited, its reading end stays here.
        let (read, write) = match pipe() {
            Ok(ends) => ends,
            Err(e) => {
                eprintln!("{name}: cannot open a pipe to its worker process: {e}");
                return 2;
            }
        };
        if let Err(e) = fcntl(&read, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)) {
            eprintln!("{name}: cannot keep its pipe from its worker process: {e}");
            return 2;
        }
        // The child dies with the supervisor (the kernel sends it SIGKILL), so a `kill -9` of the
        // supervisor leaves nothing running and is not a crash.
        let mut command = if setpriv.exists() {
            let mut c = tokio::process::Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--"]).arg(&exe);
            c
        } else {
            tokio::process::Command::new(&exe)
        };
        command.args(&args).env(SUPERVISED_ENV, "1").env(TASKS_FD_ENV, write.as_raw_fd().to_string());
        match &crashed {
            Some(file) => command.env(CRASHED_TASKS_FD_ENV, file.as_raw_fd().to_string()),
            None => command.env_remove(CRASHED_TASKS_FD_ENV),
        };
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                eprintln!("{name}: cannot start its worker process: {e}");
                return 2;
            }
        };
        // Only the child holds the writing end now, so the pipe ends when the child does.
        drop(write);
        crashed = None;
        let mut tasks = match TasksPipe::new(read) {
            Ok(tasks) => tasks,
            Err(e) => {
                eprintln!("{name}: cannot read its pipe from its worker process: {e}");
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
                () = tasks.read_line(), if tasks.open => {}
                _ = term.recv() => forward(&child, nix::sys::signal::Signal::SIGTERM),
                _ = int.recv() => forward(&child, nix::sys::signal::Signal::SIGINT),
                // "Read your files again" (the API tokens): the worker's to act on. One that does
                // not handle it ends, and so does the supervisor, as before it was forwarded.
                _ = hup.recv() => forward(&child, nix::sys::signal::Signal::SIGHUP),
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
                let keys = tasks.at_exit().await;
                eprintln!(
                    "{name}: the worker process crashed (signal {signal}) with {} task(s) in flight; starting a new one, which counts one crash on each",
                    keys.len()
                );
                match crashed_tasks_file(&keys) {
                    Ok(file) => crashed = Some(file),
                    Err(e) => {
                        eprintln!("{name}: cannot hand the crashed tasks to the new worker process: {e}")
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            None => return status.code().unwrap_or(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_supervisor_keeps_what_is_still_running_in_the_order_it_started() {
        let mut in_flight = InFlight::default();
        for line in
            ["+inflight.g1.a\n", "+inflight.g1.b\n", "+inflight.g2.a\n", "-inflight.g1.a\n", "garbage\n"]
        {
            in_flight.apply(line.as_bytes());
        }
        // A line cut off by the crash ends the list without a newline.
        in_flight.apply(b"+inflight.g3.a");
        in_flight.apply(&[b'+', 0xff, b'\n']);
        assert_eq!(in_flight.keys(), ["inflight.g1.b", "inflight.g2.a", "inflight.g3.a"]);
    }

    #[test]
    fn crashed_tasks_travel_in_a_memory_file_one_per_line() {
        let keys = vec!["inflight.g1.a".to_owned(), "inflight.g2.b".to_owned()];
        let mut file = File::from(crashed_tasks_file(&keys).unwrap());
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "inflight.g1.a\ninflight.g2.b\n");
    }
}
