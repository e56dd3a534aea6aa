//! Test harnesses. [`scripted::ScriptedLlm`] is an OpenAI-compatible server that replays a
//! script. [`NatsServer`] runs a real nats-server with JetStream on a port the server picks
//! (`-p -1`, read back from its ports file) and a temporary store dir, and kills it when dropped,
//! the way the async-nats test harness does.

pub mod browser;
pub mod cluster;
pub mod fuzz;
pub mod oidc;
pub mod process;
pub mod provider;
pub mod receiver;
pub mod scripted;
pub mod tls;

pub use cluster::NatsCluster;

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
    /// A config file (`-c`), for servers with accounts and users.
    config: Option<PathBuf>,
    /// The monitoring port (`/varz`, `/jsz`): see [`NatsServer::monitor`].
    monitor_port: u16,
}

impl NatsServer {
    /// Starts a server on a port of its own choosing and waits until it accepts connections.
    /// The server picks the port (`-p -1`), so two tests can never race for one.
    pub fn start() -> NatsServer {
        let binary = nats_server_binary().unwrap_or_else(|e| panic!("{e}"));
        let store = tempfile::tempdir().expect("temp store dir");
        let ports = tempfile::tempdir().expect("temp ports dir");
        let child = spawn(&binary, "-1", "-1", store.path(), Some(ports.path()), None);
        let mut server = NatsServer { child, port: 0, store, binary, config: None, monitor_port: 0 };
        server.port = server.read_port(ports.path());
        server.wait_ready();
        server
    }

    /// Starts a server with `config` (nats-server's config syntax: accounts, users and their
    /// permissions) on a port of its own choosing. Its log goes to [`NatsServer::log`], where
    /// tests find the permission violations the server reported.
    pub fn start_with_config(config: &str) -> NatsServer {
        let binary = nats_server_binary().unwrap_or_else(|e| panic!("{e}"));
        let store = tempfile::tempdir().expect("temp store dir");
        let ports = tempfile::tempdir().expect("temp ports dir");
        let path = store.path().join("server.conf");
        std::fs::write(&path, config).expect("write the server config");
        let child = spawn(&binary, "-1", "-1", store.path(), Some(ports.path()), Some(&path));
        let mut server = NatsServer { child, port: 0, store, binary, config: Some(path), monitor_port: 0 };
        server.port = server.read_port(ports.path());
        server.wait_ready();
        server
    }

    /// The server's log (for servers started with a config).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.store.path().join("server.log")).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, for its CPU time and memory (`process::cpu_seconds_of`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A monitoring endpoint (`/varz`: `in_msgs`, `out_msgs`, ...) as JSON; `None` when it does
    /// not answer.
    pub fn monitor(&self, path: &str) -> Option<serde_json::Value> {
        cluster::monitor(self.monitor_port, path)
    }

    /// The server's store dir (JetStream's files under `jetstream/`): a test that copies it
    /// while the server is down and puts the copy back later makes a crash that lost writes.
    pub fn store_dir(&self) -> &Path {
        self.store.path()
    }

    /// Kills the server with SIGKILL, keeping its store dir, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port and store dir, as a restarted pod would.
    pub fn restart(&mut self) {
        self.kill();
        self.child = spawn(
            &self.binary,
            &self.port.to_string(),
            &self.monitor_port.to_string(),
            self.store.path(),
            None,
            self.config.as_deref(),
        );
        self.wait_ready();
    }

    /// The client port from the `<name>_<pid>.ports` file the server writes once it listens:
    /// `{"nats": ["nats://127.0.0.1:PORT"], "monitoring": [...]}` (the monitoring port is kept).
    fn read_port(&mut self, dir: &Path) -> u16 {
        let suffix = format!("_{}.ports", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            let file = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .find(|e| e.file_name().to_str().is_some_and(|name| name.ends_with(&suffix)));
            let ports = file
                .and_then(|f| std::fs::read_to_string(f.path()).ok())
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok());
            let port_of = |ports: &serde_json::Value, kind: &str| -> Option<u16> {
                ports[kind].get(0)?.as_str()?.rsplit(':').next()?.parse().ok()
            };
            if let Some(ports) = ports
                && let Some(port) = port_of(&ports, "nats")
            {
                self.monitor_port = port_of(&ports, "monitoring").unwrap_or(0);
                return port;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("nats-server exited before it listened: {status}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("nats-server wrote no ports file within 15 s");
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

fn spawn(
    binary: &Path,
    port: &str,
    monitor_port: &str,
    store: &Path,
    ports_dir: Option<&Path>,
    config: Option<&Path>,
) -> Child {
    let mut command = Command::new(binary);
    if let Some(config) = config {
        command.arg("-c").arg(config).arg("-l").arg(store.join("server.log"));
    }
    command.args(["-a", "127.0.0.1", "-p", port, "-m", monitor_port, "-js", "-sd"]).arg(store);
    if let Some(dir) = ports_dir {
        command.arg("--ports_file_dir").arg(dir);
    }
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()))
}

/// The lowest port of the kernel's ephemeral range (`ip_local_port_range`; Linux's default
/// where it cannot be read).
fn ephemeral_low() -> u64 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A port on 127.0.0.1 that was free a moment ago, for a server a test starts next.
///
/// It is drawn at random below the kernel's ephemeral range (`ip_local_port_range`), not from
/// it: the local end of any outgoing connection, made by any process between this call and the
/// server's bind, comes from that range and would otherwise be able to take it. Where the range
/// leaves too little room below it, the kernel picks.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    const FLOOR: u64 = 10_000;
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let ephemeral_low = ephemeral_low();
    if ephemeral_low >= FLOOR + 4_096 {
        let span = ephemeral_low - FLOOR;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()));
        let seed = u64::from(std::process::id()).wrapping_mul(2_654_435_761) ^ nanos;
        for _ in 0..64 {
            let draw = DRAWS.fetch_add(1, Ordering::Relaxed);
            let port = FLOOR + seed.wrapping_add(draw.wrapping_mul(7_919)) % span;
            if let Ok(port) = u16::try_from(port)
                && TcpListener::bind(("127.0.0.1", port)).is_ok()
            {
                return port;
            }
        }
    }
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

/// One `[[token]]` entry of an API tokens file (docs/security.md): `token`'s SHA-256, bound to
/// `tenant` with `roles`.
pub fn api_token(name: &str, token: &str, tenant: &str, roles: &[&str]) -> String {
    use sha2::Digest;
    let sha: String = sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let roles: Vec<String> = roles.iter().map(|r| format!("\"{r}\"")).collect();
    format!(
        "[[token]]\nname = \"{name}\"\nsha256 = \"{sha}\"\ntenant = \"{tenant}\"\nroles = [{}]\n\n",
        roles.join(", ")
    )
}

/// A small deterministic generator (xorshift64), for benches and tests whose runs must be
/// comparable or rerun from a printed seed. Not for anything that needs real randomness.
#[derive(Debug, Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    /// The next 64 bits. A seed of 0 stays 0: seed with something else.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_counts_what_a_process_spends() {
        // Busy until this process's CPU time has grown by a tenth of a second: a reading that
        // never moves (a misread field) fails at the wall-clock limit instead.
        let me = std::process::id();
        let before = process::cpu_seconds_of(me);
        let limit = Instant::now() + Duration::from_secs(20);
        let mut spin = 0u64;
        while process::cpu_seconds_of(me) - before < 0.1 {
            assert!(Instant::now() < limit, "20 s of spinning did not show 0.1 s of CPU");
            for i in 0..100_000u64 {
                spin = std::hint::black_box(spin.wrapping_add(i));
            }
        }
        // A process that is gone reads as none.
        assert_eq!(process::cpu_seconds_of(u32::MAX), 0.0);
    }

    #[test]
    fn free_ports_are_bindable_and_outside_the_ephemeral_range() {
        let low = ephemeral_low();
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        for &port in &ports {
            TcpListener::bind(("127.0.0.1", port)).expect("a free port binds");
            if low >= 14_096 {
                assert!(
                    (10_000..low).contains(&u64::from(port)),
                    "{port} is in the ephemeral range from {low}"
                );
            }
        }
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert!(distinct.len() > 40, "50 draws gave only {} ports", distinct.len());
    }

    #[test]
    fn servers_pick_their_own_ports_and_restart_on_them() {
        let mut a = NatsServer::start();
        let b = NatsServer::start();
        assert_ne!(a.port(), 0);
        assert_ne!(a.port(), b.port());
        let port = a.port();
        a.restart();
        assert_eq!(a.port(), port);
        std::net::TcpStream::connect(("127.0.0.1", port)).expect("the restarted server listens");
    }
}
