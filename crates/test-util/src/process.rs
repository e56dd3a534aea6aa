//! Hermes binaries as child processes, the way an operator runs them: [`HermesUp`] starts
//! `hermes up`, waits for its ready line and hands out its gRPC address; it can be killed with
//! SIGKILL, stopped and continued, and is killed when dropped. Tests pass the binary's path
//! (`env!("CARGO_BIN_EXE_hermes")`), which only the crate that builds it knows.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A binary this workspace builds, for tests in a crate other than the one that builds it
/// (`env!("CARGO_BIN_EXE_<name>")` only exists there): `HERMES_BIN_DIR/<name>` when that is set,
/// else `<name>` in the profile dir the running test binary was built into
/// (`target/debug/deps/<test>` → `target/debug/<name>`). Panics saying how to build it when it is
/// not there.
pub fn built_binary(name: &str) -> PathBuf {
    let dir = match std::env::var_os("HERMES_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().and_then(Path::parent).map(Path::to_path_buf))
            .expect("the test binary's dir"),
    };
    let path = dir.join(name);
    assert!(path.is_file(), "{} is not built: run `cargo build --bins` (make test does)", path.display());
    path
}

/// How to start `hermes up`.
pub struct HermesUpBuilder {
    command: Command,
    ready_within: Duration,
}

/// A running `hermes up`, killed on drop.
pub struct HermesUp {
    child: Child,
    /// Its gRPC address, `127.0.0.1:<port>`.
    pub grpc: String,
}

impl HermesUp {
    /// `hermes up` from `binary` with its data under `data_dir`, on a free gRPC port. Without
    /// [`HermesUpBuilder::nats_url`] it starts its own nats-server.
    pub fn builder(binary: impl AsRef<Path>, data_dir: &Path) -> HermesUpBuilder {
        let mut command = Command::new(binary.as_ref());
        let grpc = format!("127.0.0.1:{}", crate::free_port());
        command.args(["up", "--grpc-listen", &grpc, "--data-dir"]).arg(data_dir);
        command.env_remove("HERMES_NATS_URL").stdout(Stdio::piped()).stderr(Stdio::null());
        HermesUpBuilder { command, ready_within: Duration::from_secs(60) }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `kill -9`, and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP to the process and its descendants (its supervised worker): it stays, frozen.
    pub fn sigstop(&self) {
        for pid in tree_of(self.pid()) {
            signal(pid, "STOP");
        }
    }

    /// SIGCONT after [`HermesUp::sigstop`].
    pub fn sigcont(&self) {
        for pid in tree_of(self.pid()) {
            signal(pid, "CONT");
        }
    }

    /// Resident memory of the process and its children (the supervised worker, isolated jobs),
    /// in bytes.
    pub fn rss(&self) -> u64 {
        tree_of(self.pid()).into_iter().map(rss_of).sum()
    }
}

impl Drop for HermesUp {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl HermesUpBuilder {
    /// Uses the nats-server at `url` instead of starting one.
    pub fn nats_url(mut self, url: &str) -> Self {
        self.command.args(["--nats-url", url]);
        self
    }

    pub fn arg(mut self, arg: impl AsRef<std::ffi::OsStr>) -> Self {
        self.command.arg(arg);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.command.env(key, value);
        self
    }

    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.command.current_dir(dir);
        self
    }

    /// Writes the process's stderr (logs, the supervisor's crash reports) to `path`.
    pub fn stderr_file(mut self, path: &Path) -> Self {
        let file = std::fs::File::create(path).expect("stderr file");
        self.command.stderr(file);
        self
    }

    /// Starts it and waits for `hermes up: grpc ...` on its stdout.
    pub fn start(mut self) -> HermesUp {
        let grpc = self
            .command
            .get_args()
            .skip_while(|a| *a != "--grpc-listen")
            .nth(1)
            .and_then(|a| a.to_str())
            .expect("a --grpc-listen address")
            .to_owned();
        let child = spawn_ready(&mut self.command, "hermes up: grpc", "hermes up", self.ready_within);
        HermesUp { child, grpc }
    }
}

/// Spawns `command` and waits for a stdout line starting with `ready`; panics naming `what` when
/// it exits first or `within` passes. Later stdout is drained so the child never blocks on it.
fn spawn_ready(command: &mut Command, ready: &str, what: &str, within: Duration) -> Child {
    let mut child = command.spawn().unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100))
            && line.starts_with(ready)
        {
            return child;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited at start: {status}");
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{what} did not become ready within {within:?}");
}

/// How to start `hermes agent`.
pub struct HermesAgentBuilder {
    command: Command,
    id: String,
}

/// A running `hermes agent` process, killed on drop.
pub struct HermesAgent {
    child: Child,
    pub id: String,
}

impl HermesAgent {
    /// `hermes agent --agent-id <id>` from `binary` (the `hermes` binary) against `nats_url`.
    pub fn builder(binary: impl AsRef<Path>, nats_url: &str, id: &str) -> HermesAgentBuilder {
        let mut command = Command::new(binary.as_ref());
        command.args(["agent", "--nats-url", nats_url, "--agent-id", id]);
        command.stdout(Stdio::piped()).stderr(Stdio::null());
        HermesAgentBuilder { command, id: id.to_owned() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, for a graceful drain.
    pub fn sigterm(&self) {
        signal(self.pid(), "TERM");
    }

    /// `kill -9`, and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit, for at most `within`; `None` if it is still running.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for HermesAgent {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl HermesAgentBuilder {
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.command.args(args);
        self
    }

    /// Starts it and waits until it serves (`hermes agent <id>: serving ...` on its stdout).
    pub fn start(mut self) -> HermesAgent {
        let ready = format!("hermes agent {}: serving", self.id);
        let child = spawn_ready(&mut self.command, &ready, "hermes agent", Duration::from_secs(60));
        HermesAgent { child, id: self.id }
    }
}

/// Resident bytes of process `pid` (0 when it is gone).
pub fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// `pid` and its descendants.
pub fn tree_of(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        let children =
            std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap_or_default();
        all.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        i += 1;
    }
    all
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status();
    assert!(status.is_ok_and(|s| s.success()), "kill -{name} {pid}");
}

/// Waits until `done` holds, checking every 20 ms; panics naming `what` after `timeout`.
pub async fn wait_until(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The repository root, from a crate's manifest dir two levels down (`crates/<name>`).
pub fn repo_root_from(manifest_dir: &str) -> PathBuf {
    Path::new(manifest_dir).join("../..").canonicalize().expect("repo root")
}
