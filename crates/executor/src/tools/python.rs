//! `code.python`: runs a Python snippet in a `python3` subprocess inside a bubblewrap (`bwrap`)
//! sandbox. It is off unless an agent's config enables it, and its calls wait for a human's
//! approval unless the config says otherwise.
//!
//! The sandbox, in layers:
//! - namespaces: bwrap puts the interpreter in new user, PID, mount, network, IPC and UTS
//!   namespaces (`--die-with-parent`, `--new-session`, all capabilities dropped). The network
//!   namespace holds only its own loopback, so nothing outside can be reached: no TCP or UDP,
//!   no abstract Unix sockets (they are per network namespace);
//! - a minimal, read-only root: a fresh root holding only `/usr` (and the `/bin`, `/lib`, ...
//!   links or directories), the few `/etc` files the dynamic linker and Python read, the
//!   interpreter's own prefix when it lies outside `/usr`, a `/proc` of its PID namespace and a
//!   minimal `/dev`, all read-only. The only writable place is the call's scratch dir, mounted at
//!   `/tmp` and used as the working and home dir, removed afterwards. Nothing else of the host's
//!   file system is there: no `/home`, `/root`, `/etc/shadow`, workspace, or socket file;
//! - an unprivileged user: the snippet runs as uid/gid 65534 in its namespace. When the agent
//!   runs as root, bwrap itself is started as uid/gid 65534, so the sandbox maps to an
//!   unprivileged host user too (for root the kernel does not enforce `RLIMIT_NPROC`);
//! - limits set by a small prelude before the snippet: address space (`memory_mb`, default 512
//!   MiB), CPU seconds, file size (16 MiB), open files (64), no core dumps, and `RLIMIT_NPROC`.
//!   The process limit is counted per user namespace, where the sandbox's init (bwrap) and the
//!   interpreter already count two, so the limit is `2 + max_processes`: by default the snippet
//!   cannot fork, start a process or a thread at all, so it cannot multiply the memory limit or
//!   fork-bomb. (cgroups are not used: there is no delegated cgroup v2 tree to rely on.);
//! - every process dies with the call: the interpreter is the first child of the PID
//!   namespace's init, and when it exits, or when the wall-clock timeout (default 10 s) kills
//!   bwrap, the kernel kills whatever else is left in the namespace. The call waits for the
//!   interpreter's exit, not for the end of its output, so a child holding stdout cannot stall it;
//! - an empty environment and `python3 -I -B` (no user site, no `PYTHON*` variables).
//!
//! Where `bwrap` is missing or cannot build the sandbox (unprivileged user namespaces are
//! forbidden, for example), the tool refuses with `FAILED_PRECONDITION` naming the reason; it
//! never runs with less isolation. The sandbox is checked once, with a real run that must fail
//! to fork.
//!
//! What it does not protect against: a kernel exploit (there is no seccomp filter, and the
//! snippet talks to the host kernel); reading what lies in `/usr` and in the interpreter's
//! prefix, and the host-wide files of `/proc` (`/proc/cpuinfo`, `/proc/meminfo`, ...); filling
//! the disk under the scratch dir with many files within the time limit; the memory limit is per
//! process (address space, not resident memory), so with `max_processes` above 0 the snippet can
//! use up to `(1 + max_processes) * memory_mb`; and whatever the snippet prints is returned to
//! the caller. Run agents that enable it in their own container.

use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::tool::{RetryPolicy, Tool, ToolContext, ToolError, parse_args, schema_of};
use hermes_core::ErrorCode;

/// Why the sandbox cannot run here: the tool then refuses with `FAILED_PRECONDITION` naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SandboxUnavailable(String);

impl From<String> for SandboxUnavailable {
    fn from(reason: String) -> Self {
        Self(reason)
    }
}

/// Limits of `code.python`.
#[derive(Debug, Clone)]
pub struct CodePythonConfig {
    /// Calls wait for a human's approval.
    pub confirm: bool,
    pub timeout: Duration,
    /// Address-space limit in MiB, per process.
    pub memory_mb: u64,
    /// Processes or threads the snippet may start besides itself (default 0: none).
    pub max_processes: u32,
    /// The interpreter: a path, or a name looked up in `/usr/bin` first, then in `PATH`.
    pub python: String,
    /// bubblewrap: a path, or a name looked up in `PATH` first, then in `/usr/bin`.
    pub bwrap: String,
}

impl Default for CodePythonConfig {
    fn default() -> Self {
        Self {
            confirm: true,
            timeout: Duration::from_secs(10),
            memory_mb: 512,
            max_processes: 0,
            python: "python3".into(),
            bwrap: "bwrap".into(),
        }
    }
}

/// Output kept per stream.
const MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Where the scratch dir is mounted inside the sandbox; also the working and home dir.
const SCRATCH: &str = "/tmp";

/// The uid and gid inside the sandbox, and the host uid bwrap runs as when the agent is root.
const SANDBOX_ID: u32 = 65534;

/// Tasks of the sandbox's user namespace before the snippet starts any: bwrap as the PID
/// namespace's init, and the interpreter.
const BASE_TASKS: u64 = 2;

/// After the interpreter exits, how long output still in the pipes may take to arrive. The PID
/// namespace is gone by then, so the pipes close at once; this only bounds the wait.
const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// Bound on the one-off sandbox check and on asking an interpreter outside `/usr` where it lives.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// Sets the limits, then runs `snippet.py` as `__main__`.
const PRELUDE: &str = r#"
import resource, sys
mem = int(sys.argv[1]) * 1024 * 1024
cpu = int(sys.argv[2])
nproc = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
sys.argv = ["snippet.py"]
source = open("snippet.py").read()
exec(compile(source, "snippet.py", "exec"), {"__name__": "__main__"})
"#;

/// The sandbox check: with no extra processes allowed the fork must fail, the only network
/// interface must be the namespace's loopback, the process must be one of the first of a PID
/// namespace of its own (bubblewrap's init is 1), and its user namespace must map one user, not
/// the host's whole range. A stand-in for bubblewrap that dropped the namespaces but kept the
/// limits would pass the first two and fail the last two.
const PROBE: &str = r#"
import os, socket
names = sorted(name for _, name in socket.if_nameindex())
try:
    pid = os.fork()
except OSError:
    forked = False
else:
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    forked = True
try:
    uid_map = open("/proc/self/uid_map").read().split()
except OSError:
    uid_map = ["unreadable"]
if forked:
    print("the process limit does not hold in the sandbox")
elif names != ["lo"]:
    print("the sandbox sees network interfaces", names)
elif os.getpid() > 8:
    print("the sandbox has no PID namespace of its own: its pid is", os.getpid())
elif len(uid_map) != 3 or uid_map[2] != "1":
    print("the sandbox has no user namespace of one user: its uid_map is", uid_map)
else:
    print("isolated")
"#;

/// Files of `/etc` the dynamic linker and Python read; bound read-only where they exist, with
/// every `/etc/python3*` entry.
const ETC_FILES: &[&str] =
    &["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime"];

/// Top-level entries that are links into `/usr` on a merged-`/usr` system, directories otherwise.
const TOP_LEVEL: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// Python 3 source. Print the result; a printed JSON value is also returned parsed as `value`.
    code: String,
}

/// How the sandbox is built on this host; found and checked once.
#[derive(Debug, Clone)]
struct Sandbox {
    bwrap: PathBuf,
    /// The interpreter, at the same path inside and outside.
    python: PathBuf,
    /// Symlinks to recreate in the sandbox's root: (path, target).
    links: Vec<(PathBuf, PathBuf)>,
    /// Host paths bound read-only at the same place, besides `/usr`.
    ro_binds: Vec<PathBuf>,
    /// The host uid and gid bwrap runs as, when the agent's own is root.
    run_as: Option<u32>,
}

impl Sandbox {
    /// Located, then checked with one real run.
    async fn ready(config: &CodePythonConfig) -> Result<Self, SandboxUnavailable> {
        let sandbox = Self::locate(config).await?;
        sandbox.check(config).await?;
        Ok(sandbox)
    }

    /// Finds bwrap and the interpreter and lays out the root; checks nothing yet.
    async fn locate(config: &CodePythonConfig) -> Result<Self, SandboxUnavailable> {
        let bwrap = locate_bwrap(&config.bwrap)?;
        let mut links = Vec::new();
        let mut ro_binds = Vec::new();
        for top in TOP_LEVEL {
            let path = Path::new(top);
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    let target = std::fs::read_link(path).map_err(|e| format!("cannot read {top}: {e}"))?;
                    links.push((path.to_path_buf(), target));
                }
                Ok(meta) if meta.is_dir() => ro_binds.push(path.to_path_buf()),
                _ => {}
            }
        }
        for file in ETC_FILES {
            if Path::new(file).exists() {
                ro_binds.push(PathBuf::from(file));
            }
        }
        if let Ok(entries) = std::fs::read_dir("/etc") {
            let mut python_dirs: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path())
                .collect();
            python_dirs.sort();
            ro_binds.extend(python_dirs);
        }
        let (python, prefixes) = locate_python(&config.python).await?;
        for prefix in prefixes {
            if !ro_binds.contains(&prefix) {
                ro_binds.push(prefix);
            }
        }
        let inside = python.starts_with("/usr")
            || ro_binds.iter().any(|b| python.starts_with(b))
            || links.iter().any(|(l, _)| python.starts_with(l));
        if !inside {
            return Err(SandboxUnavailable(format!(
                "the interpreter {} lies outside /usr and outside its own prefix, so the sandbox cannot hold it",
                python.display()
            )));
        }
        let run_as = agent_is_root().then_some(SANDBOX_ID);
        Ok(Self { bwrap, python, links, ro_binds, run_as })
    }

    /// A fresh scratch dir, owned by the sandbox's host user when that is not the agent's.
    fn scratch(&self) -> Result<tempfile::TempDir, SandboxUnavailable> {
        let scratch = tempfile::Builder::new()
            .prefix("hermes-python-")
            .tempdir()
            .map_err(|e| format!("cannot make a scratch dir: {e}"))?;
        if let Some(id) = self.run_as {
            std::os::unix::fs::chown(scratch.path(), Some(id), Some(id))
                .map_err(|e| format!("cannot hand the scratch dir to uid {id}: {e}"))?;
        }
        Ok(scratch)
    }

    /// Writes the code the prelude runs, readable by the sandbox's host user.
    fn write_snippet(&self, scratch: &Path, code: &str) -> Result<(), SandboxUnavailable> {
        let path = scratch.join("snippet.py");
        std::fs::write(&path, code).map_err(|e| format!("cannot write the snippet: {e}"))?;
        if let Some(id) = self.run_as {
            std::os::unix::fs::chown(&path, Some(id), Some(id))
                .map_err(|e| format!("cannot hand the snippet to uid {id}: {e}"))?;
        }
        Ok(())
    }

    /// bwrap running the prelude, then `snippet.py` of `scratch`, under these limits.
    fn command(&self, scratch: &Path, memory_mb: u64, cpu_secs: u64, nproc: u64) -> tokio::process::Command {
        let mut args: Vec<OsString> = [
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--uid",
            "65534",
            "--gid",
            "65534",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        for (link, target) in &self.links {
            args.push("--symlink".into());
            args.push(target.into());
            args.push(link.into());
        }
        for path in &self.ro_binds {
            args.push("--ro-bind".into());
            args.push(path.into());
            args.push(path.into());
        }
        for arg in ["--proc", "/proc", "--dev", "/dev", "--bind"] {
            args.push(arg.into());
        }
        args.push(scratch.into());
        for arg in [SCRATCH, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SCRATCH, "--"] {
            args.push(arg.into());
        }
        args.push(self.python.as_os_str().to_owned());
        for arg in ["-I", "-B", "-c", PRELUDE] {
            args.push(arg.into());
        }
        args.push(memory_mb.to_string().into());
        args.push(cpu_secs.to_string().into());
        args.push(nproc.to_string().into());

        let mut command = tokio::process::Command::new(&self.bwrap);
        command
            .args(args)
            .current_dir("/")
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", SCRATCH)
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(id) = self.run_as {
            command.uid(id).gid(id);
        }
        command
    }

    /// One real run that must report `isolated`.
    async fn check(&self, config: &CodePythonConfig) -> Result<(), SandboxUnavailable> {
        let scratch = self.scratch()?;
        self.write_snippet(scratch.path(), PROBE)?;
        // At least 256 MiB, so that a tiny `memory_mb` is not mistaken for a broken sandbox.
        let memory_mb = config.memory_mb.max(256);
        let mut command = self.command(scratch.path(), memory_mb, PROBE_TIMEOUT.as_secs(), BASE_TASKS);
        let out = match tokio::time::timeout(PROBE_TIMEOUT, command.output()).await {
            Err(_) => {
                return Err(SandboxUnavailable(format!(
                    "the sandbox check did not finish in {} s",
                    PROBE_TIMEOUT.as_secs()
                )));
            }
            Ok(Err(e)) => {
                return Err(SandboxUnavailable(format!("cannot run {}: {e}", self.bwrap.display())));
            }
            Ok(Ok(out)) => out,
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && stdout.trim() == "isolated" {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        // bwrap's own error, or the check's finding; the last lines say it.
        let said = if stderr.trim().is_empty() { stdout.trim() } else { stderr.trim() };
        let lines: Vec<&str> = said.lines().collect();
        let reason = if lines.is_empty() {
            format!("it exited with {}", out.status)
        } else {
            lines[lines.len().saturating_sub(3)..].join("; ")
        };
        Err(SandboxUnavailable(format!("bwrap cannot build the sandbox here: {reason}")))
    }
}

/// The interpreter to run and the prefixes to bind for it. A bare name is taken from `/usr/bin`
/// when it is there (the system Python needs nothing but `/usr`), else from `PATH`; an
/// interpreter outside `/usr` is asked once, outside the sandbox, for its executable and prefixes
/// (that resolves pyenv shims and virtualenvs).
async fn locate_python(name: &str) -> Result<(PathBuf, Vec<PathBuf>), SandboxUnavailable> {
    let found = if name.contains('/') {
        std::path::absolute(name).map_err(|e| format!("cannot resolve the interpreter {name}: {e}"))?
    } else {
        let system = Path::new("/usr/bin").join(name);
        if is_executable(&system) {
            system
        } else {
            find_in_path(name).ok_or_else(|| format!("the interpreter `{name}` is not installed"))?
        }
    };
    if !is_executable(&found) {
        return Err(SandboxUnavailable(format!(
            "the interpreter {} is not an executable file",
            found.display()
        )));
    }
    if found.starts_with("/usr") {
        return Ok((found, Vec::new()));
    }
    let query = "import sys\nfor p in (sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):\n    print(p)";
    let mut command = tokio::process::Command::new(&found);
    command.args(["-I", "-c", query]).stdin(Stdio::null()).kill_on_drop(true);
    let out = match tokio::time::timeout(PROBE_TIMEOUT, command.output()).await {
        Err(_) => {
            return Err(SandboxUnavailable(format!("{} did not answer where it lives", found.display())));
        }
        Ok(Err(e)) => return Err(SandboxUnavailable(format!("cannot run {}: {e}", found.display()))),
        Ok(Ok(out)) => out,
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(SandboxUnavailable(format!("{} failed to start: {}", found.display(), stderr.trim())));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines().map(str::trim);
    let executable = PathBuf::from(lines.next().unwrap_or_default());
    if !executable.is_absolute() {
        return Err(SandboxUnavailable(format!("{} does not know its own executable", found.display())));
    }
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for line in lines {
        let prefix = PathBuf::from(line);
        // `/` would expose the whole host; `/usr` is bound anyway.
        if prefix.is_absolute()
            && prefix != Path::new("/")
            && !prefix.starts_with("/usr")
            && !prefixes.contains(&prefix)
        {
            prefixes.push(prefix);
        }
    }
    Ok((executable, prefixes))
}

/// bubblewrap as configured: a path must be an executable file; a bare name is looked up in
/// `PATH`, then in `/usr/bin`.
fn locate_bwrap(configured: &str) -> Result<PathBuf, SandboxUnavailable> {
    let found = if configured.contains('/') {
        Some(PathBuf::from(configured)).filter(|p| is_executable(p))
    } else {
        let system = Some(Path::new("/usr/bin").join(configured)).filter(|p| is_executable(p));
        find_in_path(configured).or(system)
    };
    found.ok_or_else(|| {
        SandboxUnavailable(format!(
            "bubblewrap (`{configured}`) is not installed; install the `bubblewrap` package (`make tools` does, as root)"
        ))
    })
}

/// The first executable file called `name` in the agent's `PATH`.
fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_absolute() && is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether this process runs as root (`/proc/self` belongs to the effective uid).
fn agent_is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The `code.python` tool.
pub struct CodePython {
    config: CodePythonConfig,
    sandbox: tokio::sync::OnceCell<Result<Sandbox, SandboxUnavailable>>,
}

impl CodePython {
    pub fn new(config: CodePythonConfig) -> Self {
        Self { config, sandbox: tokio::sync::OnceCell::new() }
    }

    /// The sandbox, once it has been built and checked here with one real run; checked once.
    async fn sandbox_available(&self) -> Result<&Sandbox, ToolError> {
        let probe = self.sandbox.get_or_init(|| Sandbox::ready(&self.config)).await;
        match probe {
            Ok(sandbox) => Ok(sandbox),
            Err(reason) => Err(ToolError {
                code: ErrorCode::FailedPrecondition,
                message: format!("code.python refuses to run outside its sandbox: {reason}"),
            }),
        }
    }
}

impl Tool for CodePython {
    fn name(&self) -> &str {
        "code.python"
    }

    fn description(&self) -> &str {
        "Runs a short Python 3 snippet in a sandbox: no network, no files but an empty scratch dir (its working dir), no subprocesses or threads, with memory and time limits; returns {exit_code, stdout, stderr, value}. Print what you need."
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
            let sandbox = self.sandbox_available().await?;
            let scratch = sandbox.scratch().map_err(|e| ToolError::failed(e.to_string()))?;
            sandbox
                .write_snippet(scratch.path(), &args.code)
                .map_err(|e| ToolError::failed(e.to_string()))?;
            // A backstop behind the wall-clock timeout, which should always fire first.
            let cpu_secs = self.config.timeout.as_secs().max(1) + 2;
            let nproc = BASE_TASKS + u64::from(self.config.max_processes);
            let mut child =
                sandbox.command(scratch.path(), self.config.memory_mb, cpu_secs, nproc).spawn().map_err(
                    |e| ToolError::failed(format!("cannot start {}: {e}", sandbox.bwrap.display())),
                )?;

            let mut stdout_buf = Vec::new();
            let mut stderr_buf = Vec::new();
            let status = {
                let reading = futures::future::join(
                    read_capped(child.stdout.take(), &mut stdout_buf),
                    read_capped(child.stderr.take(), &mut stderr_buf),
                );
                tokio::pin!(reading);
                let deadline = tokio::time::sleep(self.config.timeout);
                tokio::pin!(deadline);
                let mut read_done = false;
                // The interpreter's exit ends the call, not the end of its output.
                let status = loop {
                    tokio::select! {
                        status = child.wait() => break Some(status),
                        _ = &mut reading, if !read_done => read_done = true,
                        () = &mut deadline => break None,
                    }
                };
                if status.is_some() && !read_done {
                    let _ = tokio::time::timeout(OUTPUT_GRACE, &mut reading).await;
                }
                status
            };
            let Some(status) = status else {
                // Killing bwrap kills the PID namespace's init (`--die-with-parent`), and with it
                // every process of the snippet.
                let _ = child.kill().await;
                return Err(ToolError {
                    code: ErrorCode::Timeout,
                    message: format!(
                        "the snippet ran longer than {} s and was killed",
                        self.config.timeout.as_secs()
                    ),
                });
            };
            let status = status.map_err(|e| ToolError::failed(format!("waiting for python: {e}")))?;
            let stdout = String::from_utf8_lossy(&stdout_buf).into_owned();
            let stderr = String::from_utf8_lossy(&stderr_buf).into_owned();
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

/// Appends up to [`MAX_OUTPUT_BYTES`] to `buf` and discards the rest, so a chatty snippet never
/// blocks on a full pipe. What it read stays in `buf` if the future is dropped early.
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(reader: Option<R>, buf: &mut Vec<u8>) {
    let Some(mut reader) = reader else { return };
    let mut chunk = [0u8; 8192];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let room = MAX_OUTPUT_BYTES.saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
    }
}
