//! `code.python`: runs a Python snippet in a `python3` subprocess. It is off unless an agent's
//! config enables it, and its calls wait for a human's approval unless the config says otherwise.
//!
//! The sandbox, in layers:
//! - no network: the interpreter starts inside a new user and network namespace (`unshare
//!   --user --map-root-user --net`), where only a down loopback exists. Where the kernel does not
//!   allow unprivileged namespaces the tool refuses to run (`FAILED_PRECONDITION`) rather than
//!   run with the network;
//! - resource limits set by a small prelude before the snippet: address space (default 512 MiB),
//!   CPU seconds, file size (16 MiB), open files (64), no core dumps;
//! - a wall-clock timeout (default 10 s) that kills the process;
//! - a fresh scratch dir as the working and home directory, removed afterwards; an empty
//!   environment; `python3 -I` (no user site, no `PYTHON*` variables).
//!
//! It is not a security boundary against a determined attacker with a kernel exploit: the
//! snippet runs as the agent's user and can read files that user can read. Run agents that enable
//! it in their own container.

use std::process::Stdio;
use std::time::Duration;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::tool::{RetryPolicy, Tool, ToolContext, ToolError, parse_args, schema_of};
use hermes_core::ErrorCode;

/// Limits of `code.python`.
#[derive(Debug, Clone)]
pub struct CodePythonConfig {
    /// Calls wait for a human's approval.
    pub confirm: bool,
    pub timeout: Duration,
    /// Address-space limit in MiB.
    pub memory_mb: u64,
    pub python: String,
}

impl Default for CodePythonConfig {
    fn default() -> Self {
        Self { confirm: true, timeout: Duration::from_secs(10), memory_mb: 512, python: "python3".into() }
    }
}

/// Output kept per stream.
const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Sets the limits, then runs `snippet.py` as `__main__`.
const PRELUDE: &str = r#"
import resource, sys
mem = int(sys.argv[1]) * 1024 * 1024
cpu = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
sys.argv = ["snippet.py"]
source = open("snippet.py").read()
exec(compile(source, "snippet.py", "exec"), {"__name__": "__main__"})
"#;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// Python 3 source. Print the result; a printed JSON value is also returned parsed as `value`.
    code: String,
}

/// The `code.python` tool.
pub struct CodePython {
    config: CodePythonConfig,
    sandbox: tokio::sync::OnceCell<Result<(), String>>,
}

impl CodePython {
    pub fn new(config: CodePythonConfig) -> Self {
        Self { config, sandbox: tokio::sync::OnceCell::new() }
    }

    /// Whether a network namespace can be made here; checked once.
    async fn sandbox_available(&self) -> Result<(), ToolError> {
        let probe = self
            .sandbox
            .get_or_init(|| async {
                let status = tokio::process::Command::new("unshare")
                    .args(["--user", "--map-root-user", "--net", "true"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .output()
                    .await;
                match status {
                    Ok(out) if out.status.success() => Ok(()),
                    Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
                    Err(e) => Err(format!("cannot run `unshare`: {e}")),
                }
            })
            .await;
        probe.clone().map_err(|reason| ToolError {
            code: ErrorCode::FailedPrecondition,
            message: format!(
                "code.python refuses to run without network isolation, and this host cannot create a network namespace ({reason})"
            ),
        })
    }
}

impl Tool for CodePython {
    fn name(&self) -> &str {
        "code.python"
    }

    fn description(&self) -> &str {
        "Runs a short Python 3 snippet without network access, with memory and time limits, in an empty scratch dir; returns {exit_code, stdout, stderr, value}. Print what you need."
    }

    fn params_schema(&self) -> Value {
        schema_of::<Args>()
    }

    /// The subprocess has its own timer; this bound only adds the start-up margin.
    fn timeout(&self) -> Duration {
        self.config.timeout + Duration::from_secs(5)
    }

    /// A snippet may write files or print to the outside world through its result, so it is
    /// recorded in the ledger and not repeated on redelivery.
    fn side_effects(&self) -> bool {
        true
    }

    fn require_confirm(&self) -> bool {
        self.config.confirm
    }

    /// Never retried: a snippet that timed out would time out again.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy { attempts: 1, ..RetryPolicy::default() }
    }

    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args(args)?;
            self.sandbox_available().await?;
            let scratch = tempfile::Builder::new()
                .prefix("hermes-python-")
                .tempdir()
                .map_err(|e| ToolError::failed(format!("cannot make a scratch dir: {e}")))?;
            std::fs::write(scratch.path().join("snippet.py"), &args.code)
                .map_err(|e| ToolError::failed(format!("cannot write the snippet: {e}")))?;
            // A backstop behind the wall-clock timeout, which should always fire first.
            let cpu_secs = self.config.timeout.as_secs().max(1) + 2;
            let mut child = tokio::process::Command::new("unshare")
                .args(["--user", "--map-root-user", "--net", "--"])
                .arg(&self.config.python)
                .args(["-I", "-B", "-c", PRELUDE])
                .arg(self.config.memory_mb.to_string())
                .arg(cpu_secs.to_string())
                .current_dir(scratch.path())
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("HOME", scratch.path())
                .env("LANG", "C.UTF-8")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| ToolError::failed(format!("cannot start {}: {e}", self.config.python)))?;
            let stdout = read_capped(child.stdout.take());
            let stderr = read_capped(child.stderr.take());
            let waited = tokio::time::timeout(self.config.timeout, async {
                let (out, err) = tokio::join!(stdout, stderr);
                (child.wait().await, out, err)
            })
            .await;
            let Ok((status, stdout, stderr)) = waited else {
                return Err(ToolError {
                    code: ErrorCode::Timeout,
                    message: format!(
                        "the snippet ran longer than {} s and was killed",
                        self.config.timeout.as_secs()
                    ),
                });
            };
            let status = status.map_err(|e| ToolError::failed(format!("waiting for python: {e}")))?;
            let exit_code = status.code().unwrap_or(-1);
            let value = serde_json::from_str::<Value>(stdout.trim()).ok();
            let output = json!({"exit_code": exit_code, "stdout": stdout, "stderr": stderr, "value": value});
            if status.success() {
                Ok(output)
            } else {
                let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no error output");
                Err(ToolError::failed(format!("the snippet exited with {exit_code}: {last}")))
            }
        })
    }
}

/// Reads up to [`MAX_OUTPUT_BYTES`] and discards the rest, so a chatty snippet never blocks on a
/// full pipe.
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(reader: Option<R>) -> String {
    let Some(mut reader) = reader else { return String::new() };
    let mut buf = Vec::new();
    let _ = (&mut reader).take(MAX_OUTPUT_BYTES as u64).read_to_end(&mut buf).await;
    let _ = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
    String::from_utf8_lossy(&buf).into_owned()
}
