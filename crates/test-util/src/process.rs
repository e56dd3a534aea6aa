//! Hermes binaries as child processes, the way an operator runs them. [`HermesUp`] starts
//! `hermes up`, waits for its ready line and hands out its gRPC address; [`HermesAgent`] starts
//! `hermes agent`; [`HermesProcess::start`] any other subcommand. Each can be killed with SIGKILL,
//! sent SIGTERM, stopped and continued, restarted with the same command, and is killed when
//! dropped. Tests pass the binary's path
//! (`env!("CARGO_BIN_EXE_hermes")`), which only the crate that builds it knows.

use std::ffi::{OsStr, OsString};
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

/// How to start (and start again) a process of the `hermes` binary: its arguments, environment,
/// working directory, where its stderr goes, and the stdout line that says it is ready.
#[derive(Clone)]
struct Recipe {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    current_dir: Option<PathBuf>,
    /// Appended to, across restarts.
    stderr: Option<PathBuf>,
    /// The start of the ready line, or `None` to not wait.
    ready: Option<String>,
    what: &'static str,
    ready_within: Duration,
}

impl Recipe {
    fn new(program: &Path, what: &'static str, args: &[&str]) -> Recipe {
        Recipe {
            program: program.to_path_buf(),
            args: args.iter().map(OsString::from).collect(),
            env: Vec::new(),
            current_dir: None,
            stderr: None,
            ready: None,
            what,
            ready_within: Duration::from_secs(60),
        }
    }

    fn spawn(&self) -> Child {
        let mut command = Command::new(&self.program);
        command.args(&self.args).env_remove("HERMES_NATS_URL");
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(dir) = &self.current_dir {
            command.current_dir(dir);
        }
        let stderr = match &self.stderr {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new().create(true).append(true).open(path).expect("stderr file"),
            ),
            None => Stdio::null(),
        };
        command.stderr(stderr);
        match &self.ready {
            Some(ready) => {
                command.stdout(Stdio::piped());
                spawn_ready(&mut command, ready, self.what, self.ready_within, self.stderr.as_deref())
            }
            None => command
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{} does not start: {e}", self.what)),
        }
    }
}

/// A running process of the `hermes` binary, killed on drop. [`HermesUp`] and [`HermesAgent`]
/// are this with their address or id.
pub struct HermesProcess {
    child: Child,
    recipe: Recipe,
}

impl HermesProcess {
    /// Any `hermes` subcommand, e.g. `["planner", "--nats-url", url]`, not waiting for a ready
    /// line: for processes that print none.
    pub fn start(binary: impl AsRef<Path>, args: &[&str]) -> HermesProcess {
        let recipe = Recipe::new(binary.as_ref(), "hermes", args);
        HermesProcess { child: recipe.spawn(), recipe }
    }

    /// Like [`HermesProcess::start`], with the process's stderr (its JSON log lines) written to
    /// `stderr`, emptied first.
    pub fn start_logged(binary: impl AsRef<Path>, args: &[&str], stderr: &Path) -> HermesProcess {
        std::fs::File::create(stderr).expect("stderr file");
        let mut recipe = Recipe::new(binary.as_ref(), "hermes", args);
        recipe.stderr = Some(stderr.to_path_buf());
        HermesProcess { child: recipe.spawn(), recipe }
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

    /// SIGTERM, for a graceful drain.
    pub fn sigterm(&self) {
        signal(self.pid(), "TERM");
    }

    /// SIGSTOP to the process and its descendants (its supervised worker): it stays, frozen.
    /// (A stop cannot be forwarded, so the whole tree is signalled.)
    pub fn sigstop(&self) {
        for pid in tree_of(self.pid()) {
            signal(pid, "STOP");
        }
    }

    /// SIGCONT after [`HermesProcess::sigstop`].
    pub fn sigcont(&self) {
        for pid in tree_of(self.pid()) {
            signal(pid, "CONT");
        }
    }

    /// `kill -9`, then the same command again (same arguments, ports and data dir), waiting for
    /// its ready line: a crash and restart of the pod.
    pub fn restart(&mut self) {
        self.kill9();
        self.child = self.recipe.spawn();
    }

    /// Resident memory of the process and its children (the supervised worker, isolated jobs),
    /// in bytes.
    pub fn rss(&self) -> u64 {
        tree_of(self.pid()).into_iter().map(rss_of).sum()
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

impl Drop for HermesProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// How to start `hermes up`.
pub struct HermesUpBuilder {
    recipe: Recipe,
    grpc: String,
}

/// A running `hermes up`, killed on drop; the [`HermesProcess`] methods apply.
pub struct HermesUp {
    process: HermesProcess,
    /// Its gRPC address, `127.0.0.1:<port>`.
    pub grpc: String,
}

impl HermesUp {
    /// `hermes up` from `binary` with its data under `data_dir`, on a free gRPC port. Without
    /// [`HermesUpBuilder::nats_url`] it starts its own nats-server.
    pub fn builder(binary: impl AsRef<Path>, data_dir: &Path) -> HermesUpBuilder {
        let grpc = format!("127.0.0.1:{}", crate::free_port());
        let mut recipe = Recipe::new(
            binary.as_ref(),
            "hermes up",
            &["up", "--grpc-listen", &grpc, "--http-listen", "127.0.0.1:0", "--data-dir"],
        );
        recipe.args.push(data_dir.into());
        recipe.ready = Some("hermes up: grpc".into());
        HermesUpBuilder { recipe, grpc }
    }
}

impl HermesUp {
    /// The process and its gRPC address, for a caller that keeps `hermes up`s beside other
    /// Hermes processes.
    pub fn into_parts(self) -> (HermesProcess, String) {
        (self.process, self.grpc)
    }
}

impl std::ops::Deref for HermesUp {
    type Target = HermesProcess;
    fn deref(&self) -> &HermesProcess {
        &self.process
    }
}

impl std::ops::DerefMut for HermesUp {
    fn deref_mut(&mut self) -> &mut HermesProcess {
        &mut self.process
    }
}

impl HermesUpBuilder {
    /// Uses the nats-server at `url` instead of starting one.
    pub fn nats_url(self, url: &str) -> Self {
        self.args(["--nats-url", url])
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.recipe.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.recipe.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.recipe.env.push((key.into(), value.as_ref().to_owned()));
        self
    }

    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.recipe.current_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Writes the process's stderr (logs, the supervisor's crash reports) to `path`, emptied
    /// first and appended to by restarts.
    pub fn stderr_file(mut self, path: &Path) -> Self {
        std::fs::File::create(path).expect("stderr file");
        self.recipe.stderr = Some(path.to_path_buf());
        self
    }

    /// How long to wait for the ready line (60 s by default; loading a model takes longer).
    pub fn ready_within(mut self, within: Duration) -> Self {
        self.recipe.ready_within = within;
        self
    }

    /// Starts it and waits for `hermes up: grpc ...` on its stdout.
    pub fn start(self) -> HermesUp {
        let child = self.recipe.spawn();
        HermesUp { process: HermesProcess { child, recipe: self.recipe }, grpc: self.grpc }
    }
}

/// Spawns `command` and waits for a stdout line starting with `ready`; panics naming `what` when
/// it exits first or `within` passes. Later stdout is drained so the child never blocks on it.
fn spawn_ready(
    command: &mut Command,
    ready: &str,
    what: &str,
    within: Duration,
    stderr: Option<&Path>,
) -> Child {
    // What the process logged, for a panic: the last lines of its stderr file, when it has one.
    let logged = || match stderr.and_then(|p| std::fs::read_to_string(p).ok()) {
        Some(text) => {
            let lines: Vec<&str> = text.lines().collect();
            format!("; the end of its stderr:\n{}", lines[lines.len().saturating_sub(20)..].join("\n"))
        }
        None => String::new(),
    };
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
            panic!("{what} exited at start: {status}{}", logged());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{what} did not become ready within {within:?}{}", logged());
}

/// How to start `hermes agent`.
pub struct HermesAgentBuilder {
    recipe: Recipe,
    id: String,
}

/// A running `hermes agent` process, killed on drop; the [`HermesProcess`] methods apply.
pub struct HermesAgent {
    process: HermesProcess,
    pub id: String,
}

impl HermesAgent {
    /// `hermes agent --agent-id <id>` from `binary` (the `hermes` binary) against `nats_url`.
    pub fn builder(binary: impl AsRef<Path>, nats_url: &str, id: &str) -> HermesAgentBuilder {
        let mut recipe = Recipe::new(
            binary.as_ref(),
            "hermes agent",
            &["agent", "--nats-url", nats_url, "--agent-id", id],
        );
        recipe.ready = Some(format!("hermes agent {id}: serving"));
        HermesAgentBuilder { recipe, id: id.to_owned() }
    }
}

impl std::ops::Deref for HermesAgent {
    type Target = HermesProcess;
    fn deref(&self) -> &HermesProcess {
        &self.process
    }
}

impl std::ops::DerefMut for HermesAgent {
    fn deref_mut(&mut self) -> &mut HermesProcess {
        &mut self.process
    }
}

impl HermesAgentBuilder {
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.recipe.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.recipe.args.push(arg.as_ref().to_owned());
        self
    }

    /// An environment variable for the process (e.g. `HERMES_NATS_REPLICAS`).
    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.recipe.env.push((key.into(), value.as_ref().to_owned()));
        self
    }

    /// Appends the process's stderr (its log) to `path` instead of discarding it.
    pub fn stderr_file(mut self, path: &Path) -> Self {
        self.recipe.stderr = Some(path.to_path_buf());
        self
    }

    /// Starts it and waits until it serves (`hermes agent <id>: serving ...` on its stdout).
    pub fn start(self) -> HermesAgent {
        let child = self.recipe.spawn();
        HermesAgent { process: HermesProcess { child, recipe: self.recipe }, id: self.id }
    }
}

/// Resident bytes of process `pid` (0 when it is gone).
pub fn rss_of(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS")
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `RssAnon`, `RssFile`), in bytes; 0 when the
/// process or the field is gone.
pub fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    kb_field(&status, field) * 1024
}

/// CPU seconds `pid` has used so far, all its threads, user and system (`utime` and `stime` of
/// `/proc/<pid>/stat`, counted in the kernel's fixed 100 ticks a second); 0 when it is gone.
pub fn cpu_seconds_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name, in parentheses, may hold spaces: the fields count from after it.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // After the name: state is field 3, so utime (14) and stime (15) are the 12th and 13th.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// The anonymous memory of `pid` that transparent huge pages back (`AnonHugePages` of
/// `/proc/<pid>/smaps_rollup`), in bytes.
pub fn anon_huge_pages_of(pid: u32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    kb_field(&rollup, "AnonHugePages") * 1024
}

fn kb_field(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|rest| rest.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// `pid` and its descendants.
pub fn tree_of(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        // Each thread lists the children it started: a process that spawns from a worker thread
        // (chromedriver, a tokio runtime) has them under that thread, not the main one.
        let threads = std::fs::read_dir(format!("/proc/{parent}/task")).into_iter().flatten().flatten();
        for thread in threads {
            let children = std::fs::read_to_string(thread.path().join("children")).unwrap_or_default();
            all.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
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
