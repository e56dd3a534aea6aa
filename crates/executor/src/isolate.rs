//! Where CPU-bound and interpreter-like tool work runs, so that no input can take the agent down
//! or starve it.
//!
//! Two places, by how much an input can hurt:
//! - [`cpu`]: a dedicated thread with a large stack (64 MiB), off the async workers, so progress
//!   acks, heartbeats and other goals' tasks keep flowing while one tool grinds. For work whose
//!   input is already bounded (expressions, CSV, large outputs).
//! - [`run`]: a child process (the agent's own executable, re-run in a job mode) with an
//!   heap limit (`RLIMIT_DATA`), a CPU-time limit and a wall-clock deadline that kills it. For work
//!   whose memory or time no input bound can cap (template rendering): a memory bomb or a stack
//!   overflow kills the child, never the agent, and the call fails with a typed error naming the
//!   limit. The timeout is really enforced: the child is killed, not abandoned.
//!
//! Isolation needs the executable to serve jobs: binaries call [`serve_if_child`] first thing in
//! `main` and then [`enable`]. A program that embeds the executor as a library without doing so
//! (tests, say) runs jobs on a [`cpu`] thread instead, with the jobs' own input and output caps
//! but no memory limit; [`enabled`] tells which.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use hermes_core::ErrorCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::tool::ToolError;

/// Stack of the threads that run tool work.
pub const WORK_STACK_BYTES: usize = 64 * 1024 * 1024;
/// The environment variable naming the job a child runs.
const JOB_ENV: &str = "HERMES_ISOLATED_JOB";
const MEMORY_ENV: &str = "HERMES_ISOLATED_MEMORY_MB";
const CPU_ENV: &str = "HERMES_ISOLATED_CPU_SECS";
/// Most bytes read back from a child.
const MAX_CHILD_OUTPUT: u64 = 16 * 1024 * 1024;

/// What an isolated job may use.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Memory the job may allocate beyond what the process has mapped at start, in MiB.
    pub memory_mb: u64,
    /// Wall-clock bound; the child is killed when it passes.
    pub timeout: Duration,
}

/// A pure job: JSON in, JSON out. It runs in a child process, so it must not need the agent's
/// state.
type Job = fn(Value) -> Result<Value, ToolError>;

/// The jobs a child can run, by name.
fn job(name: &str) -> Option<Job> {
    match name {
        "text.template" => Some(crate::tools::render_job),
        "test.spin" => Some(crate::tools::spin_job),
        _ => None,
    }
}

static EXECUTABLE: OnceLock<PathBuf> = OnceLock::new();

/// Marks this executable as able to serve jobs (it calls [`serve_if_child`] at start), so that
/// [`run`] isolates them in child processes.
pub fn enable() {
    if let Ok(exe) = std::env::current_exe() {
        let _ = EXECUTABLE.set(exe);
    }
}

/// Whether [`run`] uses child processes.
pub fn enabled() -> bool {
    EXECUTABLE.get().is_some()
}

/// When this process was started as a job's child, runs the job and exits; otherwise returns at
/// once. Call it first in `main`, before any runtime or telemetry starts.
pub fn serve_if_child() {
    let Ok(name) = std::env::var(JOB_ENV) else { return };
    let code = match serve(&name) {
        Ok(()) => 0,
        Err(message) => {
            let _ = writeln!(std::io::stderr(), "{message}");
            2
        }
    };
    std::process::exit(code);
}

/// Why a job's child could not run it.
#[derive(Debug, thiserror::Error)]
enum ChildError {
    #[error("unknown isolated job `{0}`")]
    UnknownJob(String),
    #[error("setrlimit {0}: {1}")]
    Limit(&'static str, nix::Error),
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    #[error("input: {0}")]
    Input(#[from] serde_json::Error),
    #[error("the job panicked")]
    Panicked,
}

fn serve(name: &str) -> Result<(), ChildError> {
    let job = job(name).ok_or_else(|| ChildError::UnknownJob(name.to_owned()))?;
    let number = |key: &str| std::env::var(key).ok().and_then(|v| v.parse::<u64>().ok());
    let memory_mb = number(MEMORY_ENV).unwrap_or(256);
    let cpu_secs = number(CPU_ENV).unwrap_or(30);
    // RLIMIT_DATA bounds the heap (brk and private anonymous mappings) without counting the
    // executable's file mappings, which are large and unused here. It counts what the process
    // holds already and the work thread's stack: the job gets `memory_mb` on top of those.
    let held_kb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmData:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    let limit = held_kb * 1024 + (WORK_STACK_BYTES as u64) + memory_mb * 1024 * 1024;
    use nix::sys::resource::{Resource, setrlimit};
    setrlimit(Resource::RLIMIT_DATA, limit, limit).map_err(|e| ChildError::Limit("DATA", e))?;
    setrlimit(Resource::RLIMIT_CPU, cpu_secs, cpu_secs).map_err(|e| ChildError::Limit("CPU", e))?;
    setrlimit(Resource::RLIMIT_CORE, 0, 0).map_err(|e| ChildError::Limit("CORE", e))?;
    let mut input = Vec::new();
    std::io::stdin()
        .take(MAX_CHILD_OUTPUT)
        .read_to_end(&mut input)
        .map_err(|e| ChildError::Io("stdin", e))?;
    let input: Value = serde_json::from_slice(&input)?;
    let outcome = std::thread::Builder::new()
        .stack_size(WORK_STACK_BYTES)
        .spawn(move || job(input))
        .map_err(|e| ChildError::Io("cannot start the work thread", e))?
        .join()
        .map_err(|_| ChildError::Panicked)?;
    let reply = match outcome {
        Ok(value) => json!({"ok": value}),
        Err(e) => json!({"error": {"code": e.code.as_str(), "message": e.message}}),
    };
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &reply).map_err(|e| ChildError::Io("stdout", e.into()))?;
    stdout.flush().map_err(|e| ChildError::Io("stdout", e))
}

/// Runs `f` on a dedicated thread with a [`WORK_STACK_BYTES`] stack, off the async workers. A
/// panic in `f` becomes an `INTERNAL` error.
pub async fn cpu<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ToolError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("hermes-tool-work".into())
        .stack_size(WORK_STACK_BYTES)
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| ToolError {
            code: ErrorCode::Unavailable,
            message: format!("cannot start a work thread: {e}"),
        })?;
    rx.await.map_err(|_| ToolError {
        code: ErrorCode::Internal,
        message: "the tool's work thread panicked".into(),
    })
}

/// Runs the job `name` on `input` in a child process under `limits` (see the module doc), or on
/// a [`cpu`] thread where isolation is not enabled.
pub async fn run(name: &'static str, input: Value, limits: Limits) -> Result<Value, ToolError> {
    let job = job(name).ok_or_else(|| ToolError::failed(format!("no isolated job `{name}`")))?;
    let Some(exe) = EXECUTABLE.get() else {
        return match tokio::time::timeout(limits.timeout, cpu(move || job(input))).await {
            Ok(result) => result?,
            Err(_) => Err(timed_out(name, limits)),
        };
    };
    let mut child = tokio::process::Command::new(exe)
        .env_clear()
        .env(JOB_ENV, name)
        // mimalloc reserves a 1 GiB arena up front, which the heap limit would count; the child
        // takes memory from the OS as it goes instead.
        .env("MIMALLOC_ARENA_RESERVE", "0")
        .env(MEMORY_ENV, limits.memory_mb.to_string())
        .env(CPU_ENV, (limits.timeout.as_secs() + 1).to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ToolError {
            code: ErrorCode::Unavailable,
            message: format!("cannot start an isolated process for `{name}`: {e}"),
        })?;
    let input = serde_json::to_vec(&input).unwrap_or_default();
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let work = async {
        if let Some(mut pipe) = stdin.take() {
            // A child that died at once closes its end; its exit status says why.
            let _ = pipe.write_all(&input).await;
        }
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(pipe) = stdout.as_mut() {
                let _ = pipe.take(MAX_CHILD_OUTPUT).read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(pipe) = stderr.as_mut() {
                let _ = pipe.take(64 * 1024).read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        (child.wait().await, out, err)
    };
    let (status, out, err) = match tokio::time::timeout(limits.timeout, work).await {
        Ok(done) => done,
        Err(_) => {
            let _ = child.kill().await;
            return Err(timed_out(name, limits));
        }
    };
    let status = status.map_err(|e| ToolError::failed(format!("waiting for `{name}`: {e}")))?;
    if !status.success() {
        return Err(crashed(name, status, &err, limits));
    }
    let reply: Value = serde_json::from_slice(&out)
        .map_err(|e| ToolError::failed(format!("`{name}` returned unreadable output: {e}")))?;
    if let Some(value) = reply.get("ok") {
        return Ok(value.clone());
    }
    let error = reply.get("error").cloned().unwrap_or_default();
    Err(ToolError {
        code: error
            .get("code")
            .and_then(Value::as_str)
            .and_then(ErrorCode::parse)
            .unwrap_or(ErrorCode::ToolError),
        message: error.get("message").and_then(Value::as_str).unwrap_or("no message").to_owned(),
    })
}

/// A job past its deadline: the input is too expensive, and would be again, so the error is
/// `LIMIT_EXCEEDED` (not retried, not a dependency fault) rather than a retryable `TIMEOUT`.
fn timed_out(name: &str, limits: Limits) -> ToolError {
    ToolError {
        code: ErrorCode::LimitExceeded,
        message: format!(
            "`{name}` did not finish within its limit of {} ms and was stopped",
            limits.timeout.as_millis()
        ),
    }
}

/// Why a child died, as the caller's error: the input made it exceed a limit.
fn crashed(name: &str, status: std::process::ExitStatus, stderr: &[u8], limits: Limits) -> ToolError {
    use std::os::unix::process::ExitStatusExt;
    let said = String::from_utf8_lossy(stderr);
    let last = said.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let why = match status.signal() {
        Some(6) if last.contains("alloc") || last.contains("memory") => {
            format!("it ran out of memory (limit {} MiB)", limits.memory_mb)
        }
        Some(6) => format!("it aborted ({last})"),
        Some(11) | Some(7) => "it overflowed its stack or faulted".to_owned(),
        Some(24) => "it used up its CPU time".to_owned(),
        Some(9) => format!("it was killed (memory limit {} MiB, or by the system)", limits.memory_mb),
        Some(signal) => format!("it died of signal {signal}"),
        None => {
            return ToolError::failed(format!(
                "the isolated process for `{name}` exited with {}: {last}",
                status.code().unwrap_or(-1)
            ));
        }
    };
    ToolError {
        code: ErrorCode::LimitExceeded,
        message: format!(
            "`{name}` was stopped because {why}; the agent is unaffected. Make the input smaller or simpler"
        ),
    }
}
