//! Test harnesses. [`scripted::ScriptedLlm`] is an OpenAI-compatible server that replays a
//! script. [`NatsServer`] runs a real nats-server with JetStream on a free port and a
//! temporary store dir, and kills it when dropped, the way the async-nats test harness does.

pub mod fuzz;
pub mod process;
pub mod scripted;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A nats-server child process owned by a test.
pub struct NatsServer {
    child: Child,
    port: u16,
    store: tempfile::TempDir,
    binary: PathBuf,
}

impl NatsServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> NatsServer {
        let binary = nats_server_binary().unwrap_or_else(|e| panic!("{e}"));
        let store = tempfile::tempdir().expect("temp store dir");
        let port = free_port();
        let child = spawn(&binary, port, store.path());
        let server = NatsServer { child, port, store, binary };
        server.wait_ready();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server with SIGKILL, keeping its store dir, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port and store dir.
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn(&self.binary, self.port, self.store.path());
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("nats-server did not listen on port {} within 15 s", self.port);
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(binary: &Path, port: u16, store: &Path) -> Child {
    Command::new(binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()))
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// No nats-server to test against.
#[derive(Debug, Clone, Copy)]
pub struct NoNatsServer;

impl std::fmt::Display for NoNatsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "nats-server not found: run `make tools` (installs the pinned server into .tools/bin) or set HERMES_NATS_SERVER_BIN",
        )
    }
}

impl std::error::Error for NoNatsServer {}

/// Finds the nats-server to test against: `HERMES_NATS_SERVER_BIN`, else the project-local
/// `.tools/bin/nats-server` that `make tools` installs, else `nats-server` on PATH.
pub fn nats_server_binary() -> Result<PathBuf, NoNatsServer> {
    if let Ok(path) = std::env::var("HERMES_NATS_SERVER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let local = workspace.join(".tools/bin/nats-server");
    if local.exists() {
        return Ok(local);
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join("nats-server")).find(|p| p.exists()))
        .ok_or(NoNatsServer)
}
