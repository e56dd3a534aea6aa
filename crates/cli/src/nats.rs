//! Finding or starting the nats-server for `hermes up`: `HERMES_NATS_URL` when it is set and
//! reachable, otherwise a local child process on a free port with its store under `.hermes/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use hermes_core::bus::check_server_version;
use tokio::process::{Child, Command};

/// A nats-server child that is killed when dropped.
pub struct LocalNats {
    child: Child,
    pub url: String,
}

impl Drop for LocalNats {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Finds the server binary: `HERMES_NATS_SERVER_BIN`, the project's `.tools/bin/nats-server`
/// (installed by `make tools`), or `nats-server` on PATH.
pub fn find_server_binary() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var("HERMES_NATS_SERVER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let local = Path::new(".tools/bin/nats-server");
    if local.exists() {
        return Ok(local.to_path_buf());
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join("nats-server")).find(|p| p.exists()))
        .context("no nats-server found: run `make tools` to install the pinned one into .tools/bin, set HERMES_NATS_SERVER_BIN, or point HERMES_NATS_URL at a running server")
}

/// Checks `nats-server --version` and refuses servers older than 2.10 (Debian ships 2.9.10).
pub async fn check_binary_version(binary: &Path) -> anyhow::Result<String> {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .await
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let version = text
        .split_whitespace()
        .find(|w| w.starts_with('v') && w[1..].starts_with(|c: char| c.is_ascii_digit()))
        .map(|w| w.trim_start_matches('v').to_owned())
        .with_context(|| format!("cannot read a version from `{} --version`: {text}", binary.display()))?;
    check_server_version(&version).with_context(|| {
        format!("{} is too old; run `make tools` for the pinned 2.15 server", binary.display())
    })?;
    Ok(version)
}

/// Starts a JetStream-enabled server on a free loopback port with its store in `data_dir`.
pub async fn start_local(data_dir: &Path) -> anyhow::Result<LocalNats> {
    let binary = find_server_binary()?;
    check_binary_version(&binary).await?;
    std::fs::create_dir_all(data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new(&binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(data_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let url = format!("nats://127.0.0.1:{port}");
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(LocalNats { child, url });
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("nats-server did not start listening on port {port} within 5 s")
}

/// Whether a NATS server answers at `url`.
pub async fn reachable(url: &str) -> bool {
    let connect = async_connect(url);
    matches!(tokio::time::timeout(Duration::from_secs(2), connect).await, Ok(true))
}

async fn async_connect(url: &str) -> bool {
    let hostport = url.trim_start_matches("nats://").split(',').next().unwrap_or_default().to_owned();
    tokio::net::TcpStream::connect(hostport).await.is_ok()
}
