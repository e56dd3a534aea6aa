//! Finding or starting the nats-server for `hermes up`: `HERMES_NATS_URL` when it is set and
//! reachable, otherwise a local child process on a free port with its store under `.hermes/`.
//!
//! The child dies with its parent: it is started through util-linux `setpriv --pdeathsig KILL`,
//! so the kernel kills it when `hermes up` dies, even by `kill -9` or an abort. One store dir has
//! one server: `hermes up` holds an exclusive lock on `hermes-up.lock` in it for its whole life
//! (released by the kernel when the process dies) and records its own pid and the server's there.
//! A second `hermes up` on the same dir is refused naming the holder's pid, and so is a start
//! while a server recorded by an earlier run is still alive.
//!
//! The server listens on 127.0.0.1 only and refuses anonymous clients. It runs the users a
//! deployment does ([`LocalUsers`]): `deploy/nats/accounts.conf`, each service's user with a
//! password made at this start, and `deploy/nats/identities.conf`, so each in-process agent
//! connects as its own identity (`agent_<id>`), issued by the in-process registry. Beside them,
//! the operator's user `hermes` may do anything in the `HERMES` account: its random password is
//! made at the first start and kept in the store dir (`auth.conf`, mode 0600), for the processes
//! that join this stack's bus (`hermes nats-url`). A store an earlier release made (its streams
//! in the global account) keeps that release's one user, so nothing stored in it is lost.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use hermes_core::bus::check_server_version;
use tokio::process::{Child, Command};

/// A nats-server child that is killed when dropped.
pub struct LocalNats {
    child: Child,
    /// Its URL with the operator's credentials; prints without them.
    pub url: hermes_core::secret::SecretUrl,
    /// The services' users and the agents' identities' issuer; `None` on a store an earlier
    /// release made, whose services share the operator's user.
    pub users: Option<LocalUsers>,
    /// The file holding its one user's password (mode 0600), in the store dir.
    pub credentials: PathBuf,
    /// The store dir's lock, held while the server runs.
    _lock: std::fs::File,
}

/// The lock file in a store dir.
const LOCK_FILE: &str = "hermes-up.lock";
/// The server's config, with its one user and password, in a store dir.
const AUTH_FILE: &str = "auth.conf";
/// The one NATS user of a local server.
pub const LOCAL_USER: &str = "hermes";

/// The local server's password: read from its config in the store dir, or made (32 random bytes,
/// hex) and written there with mode 0600 the first time, so it stays across restarts and a
/// process that may read the dir can join (`nats://hermes:<password>@127.0.0.1:<port>`).
fn local_password(data_dir: &Path) -> anyhow::Result<(String, PathBuf)> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = data_dir.join(AUTH_FILE);
    if let Some(password) = read_password(&path) {
        // Whatever happened to its mode since, it is the server's secret.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", path.display()))?;
        return Ok((password, path));
    }
    let password = random_hex();
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    write!(
        file,
        "# Written by `hermes up`: the one user of its local nats-server. Anonymous clients are refused.\n\
         # Keep this file private (mode 0600); delete it to have a new password made at the next start.\n\
         authorization {{\n  user: \"{LOCAL_USER}\"\n  password: \"{password}\"\n}}\n"
    )
    .with_context(|| format!("cannot write {}", path.display()))?;
    Ok((password, path))
}

/// The password a local server's config at `path` holds, when it is one `hermes up` made.
fn read_password(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let password = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("password:").map(|p| p.trim().trim_matches('"').to_owned()))?;
    (password.len() >= 32 && password.chars().all(|c| c.is_ascii_hexdigit())).then_some(password)
}

/// The client URL, with its credentials, of the local nats-server that a running `hermes up`
/// started on the store dir `data_dir` (`<--data-dir>/nats`): what a process joins that stack's
/// bus with, a Python worker say (`hermes nats-url`). An error says why there is none.
pub fn local_url(data_dir: &Path) -> anyhow::Result<String> {
    use std::io::Read;
    let path = data_dir.join(LOCK_FILE);
    let not_running = || {
        format!(
            "no `hermes up` is running on {}: start one (a `hermes up` given a reachable HERMES_NATS_URL uses that server; use that URL)",
            data_dir.display()
        )
    };
    let mut file = std::fs::File::open(&path).with_context(not_running)?;
    match file.try_lock_shared() {
        // Nobody holds it: no `hermes up` runs there.
        Ok(()) => bail!(not_running()),
        Err(std::fs::TryLockError::WouldBlock) => {}
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("cannot lock {}", path.display()));
        }
    }
    let mut recorded = String::new();
    file.read_to_string(&mut recorded).with_context(|| format!("cannot read {}", path.display()))?;
    let port = recorded
        .lines()
        .find_map(|l| l.strip_prefix("port ").and_then(|p| p.trim().parse::<u16>().ok()))
        .with_context(|| {
            format!("{} names no port yet: the nats-server is still starting", path.display())
        })?;
    let auth = data_dir.join(AUTH_FILE);
    let password = read_password(&auth).with_context(|| format!("{} holds no password", auth.display()))?;
    Ok(format!("nats://{LOCAL_USER}:{password}@127.0.0.1:{port}"))
}

/// Whether the process `pid` is alive and is a nats-server serving `data_dir`.
fn live_server(pid: u32, data_dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    cmdline.contains("nats-server") && cmdline.contains(&*data_dir.to_string_lossy())
}

/// Takes the store dir's lock, or says who holds the dir.
fn lock_store(data_dir: &Path) -> anyhow::Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    let path = data_dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let mut recorded = String::new();
    let _ = file.read_to_string(&mut recorded);
    let pid_of = |role: &str| {
        recorded.lines().find_map(|l| l.strip_prefix(role).and_then(|p| p.trim().parse::<u32>().ok()))
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder =
                pid_of("hermes ").map(|p| format!("pid {p}")).unwrap_or_else(|| "another process".into());
            bail!(
                "{} is in use by another `hermes up` ({holder}); stop it first, or use another --data-dir",
                data_dir.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("cannot lock {}", path.display()));
        }
    }
    if let Some(pid) = pid_of("nats ")
        && live_server(pid, data_dir)
    {
        bail!(
            "a nats-server (pid {pid}) left by an earlier run still serves {}; stop it (`kill {pid}`) before starting another on the same store",
            data_dir.display()
        );
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "hermes {}", std::process::id())?;
    Ok(file)
}

/// Records the server's pid, client port and monitoring port (loopback HTTP: `/varz`, `/connz`)
/// in the lock file.
fn record_server(lock: &mut std::fs::File, pid: u32, port: u16, monitor: u16) -> std::io::Result<()> {
    use std::io::Write;
    writeln!(lock, "nats {pid}\nport {port}\nmonitor {monitor}")?;
    lock.flush()
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

/// The users of `hermes up`'s own server, as a deployment has them: a password for each service's
/// user of `deploy/nats/accounts.conf`, made at this start, and the account key the in-process
/// registry signs agents' identities with (`deploy/nats/identities.conf`).
#[derive(Clone)]
pub struct LocalUsers {
    port: u16,
    passwords: Vec<(&'static str, String)>,
    /// The seed (`SA...`) of the key the server trusts the registry's identities from.
    pub issuer_seed: String,
}

impl std::fmt::Debug for LocalUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalUsers").field("port", &self.port).finish_non_exhaustive()
    }
}

/// The services' users of accounts.conf, and the variables their passwords are read from.
const SERVICE_USERS: [(&str, &str); 5] = [
    ("dispatcher", "HERMES_DISPATCHER_NATS_PASSWORD"),
    ("registry", "HERMES_REGISTRY_NATS_PASSWORD"),
    ("planner", "HERMES_PLANNER_NATS_PASSWORD"),
    ("memory", "HERMES_MEMORY_NATS_PASSWORD"),
    ("agent", "HERMES_AGENT_NATS_PASSWORD"),
];
/// The variable the operator's password is read from.
const OPERATOR_PASSWORD_ENV: &str = "HERMES_UP_NATS_PASSWORD";

impl LocalUsers {
    fn new(port: u16) -> LocalUsers {
        let passwords = SERVICE_USERS.iter().map(|(user, _)| (*user, random_hex())).collect();
        let issuer = nkeys::KeyPair::new_account();
        LocalUsers { port, passwords, issuer_seed: issuer.seed().expect("a new key has its seed") }
    }

    /// The URL service `user` (`dispatcher`, `registry`, `planner`, `memory`) connects with.
    pub fn url(&self, user: &str) -> anyhow::Result<hermes_core::secret::SecretUrl> {
        let (_, password) = self
            .passwords
            .iter()
            .find(|(u, _)| *u == user)
            .with_context(|| format!("hermes up's server has no user `{user}`"))?;
        Ok(format!("nats://{user}:{password}@127.0.0.1:{}", self.port).into())
    }

    /// The URL agent `id` connects with as its own identity, presenting `token`.
    pub fn agent_url(&self, id: &str, token: &str) -> hermes_core::secret::SecretUrl {
        format!("nats://{}{id}:{token}@127.0.0.1:{}", hermes_core::broker::AGENT_IDENTITY_PREFIX, self.port)
            .into()
    }

    /// The environment the server reads the users' secrets from.
    fn env(&self, operator_password: &str) -> Vec<(String, String)> {
        let issuer = nkeys::KeyPair::from_seed(&self.issuer_seed).expect("our own seed").public_key();
        let mut env: Vec<(String, String)> = SERVICE_USERS
            .iter()
            .zip(&self.passwords)
            .map(|((_, var), (_, password))| ((*var).to_owned(), password.clone()))
            .collect();
        env.push(("NATS_SYS_PASSWORD".into(), random_hex()));
        env.push(("HERMES_IDENTITIES_ISSUER".into(), issuer));
        env.push((OPERATOR_PASSWORD_ENV.into(), operator_password.to_owned()));
        env
    }
}

/// 32 random bytes, hex.
pub(crate) fn random_hex() -> String {
    (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect()
}

/// The accounts, users and identities a deployment's server runs, as `hermes up`'s server runs
/// them: accounts.conf with the operator's user added to the `HERMES` account, and
/// identities.conf, which the operator's user bypasses as the services' users do.
fn users_config() -> anyhow::Result<String> {
    const ACCOUNTS: &str = include_str!("../../../deploy/nats/accounts.conf");
    const IDENTITIES: &str = include_str!("../../../deploy/nats/identities.conf");
    let account = ACCOUNTS.find("HERMES {").context("accounts.conf has no HERMES account")?;
    let users = account
        + ACCOUNTS[account..].find("users: [").context("the HERMES account has no users")?
        + "users: [".len();
    let operator = format!(
        "\n      {{ user: {LOCAL_USER}, password: ${OPERATOR_PASSWORD_ENV} }}  # hermes up's operator: anything in HERMES\n"
    );
    let accounts = format!("{}{operator}{}", &ACCOUNTS[..users], &ACCOUNTS[users..]);
    let services = "auth_users: [dispatcher, registry, planner, memory]";
    anyhow::ensure!(IDENTITIES.contains(services), "identities.conf names other service users");
    let identities = IDENTITIES
        .replace(services, &format!("auth_users: [dispatcher, registry, planner, memory, {LOCAL_USER}]"));
    Ok(format!("{accounts}\n{identities}"))
}

/// Whether the store in `data_dir` was made by a release whose one user was in the global
/// account: its streams are under `jetstream/$G`, where the users' account would not see them.
fn legacy_store(data_dir: &Path) -> bool {
    let jetstream = data_dir.join("jetstream");
    let has_streams = |account: &str| {
        std::fs::read_dir(jetstream.join(account).join("streams")).is_ok_and(|mut d| d.next().is_some())
    };
    has_streams("$G") && !has_streams("HERMES")
}

/// The server's config in a store dir: the users, and JetStream encryption when asked for.
const SERVER_FILE: &str = "server.conf";
/// The environment variable the server reads its store's encryption secret from; the secret
/// itself is never written to disk.
const STORE_SECRET_ENV: &str = "HERMES_STORE_SECRET";

/// Writes the server's config: the users (or, on a `legacy` store, `auth.conf`'s one user), and
/// with `encrypt` a JetStream block that encrypts the store (ChaCha20-Poly1305) with the key the
/// server reads from its environment. Every secret comes from the environment.
fn server_config(data_dir: &Path, legacy: bool, encrypt: bool) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = data_dir.join(SERVER_FILE);
    let mut text =
        "# Written by `hermes up` at every start; the secrets come from its environment.\n".to_owned();
    match legacy {
        true => text.push_str(&format!("include \"{AUTH_FILE}\"\n")),
        false => text.push_str(&users_config()?),
    }
    if encrypt {
        text.push_str(&format!("jetstream {{\n  cipher: chachapoly\n  key: ${STORE_SECRET_ENV}\n}}\n"));
    }
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", path.display()))?;
    Ok(path)
}

/// Starts a JetStream-enabled server on a free loopback port with its store in `data_dir`,
/// encrypted with `store_secret` when one is given.
pub async fn start_local(data_dir: &Path, store_secret: Option<&str>) -> anyhow::Result<LocalNats> {
    if let Some(secret) = store_secret
        && secret.chars().count() < 16
    {
        bail!("store_secret (HERMES_STORE_SECRET) must be at least 16 characters; 32 random ones are better");
    }
    let binary = find_server_binary()?;
    check_binary_version(&binary).await?;
    std::fs::create_dir_all(data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
    let data_dir =
        data_dir.canonicalize().with_context(|| format!("cannot resolve {}", data_dir.display()))?;
    let mut lock = lock_store(&data_dir)?;
    let (password, credentials) = local_password(&data_dir)?;
    let legacy = legacy_store(&data_dir);
    let config = server_config(&data_dir, legacy, store_secret.is_some())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let monitor = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let users = (!legacy).then(|| LocalUsers::new(port));
    let users_env = users.as_ref().map(|u| u.env(&password)).unwrap_or_default();
    // The parent-death signal follows the thread that forks: this runs on the thread that drives
    // `hermes up` (its main thread), which lives as long as the process.
    let setpriv = Path::new("/usr/bin/setpriv");
    if !setpriv.exists() {
        bail!(
            "{} (util-linux) is missing: hermes up needs it so its nats-server dies with it",
            setpriv.display()
        );
    }
    let child = Command::new(setpriv)
        .args(["--pdeathsig", "KILL", "--"])
        .arg(&binary)
        .arg("-c")
        .arg(&config)
        .env_remove(STORE_SECRET_ENV)
        .envs(store_secret.map(|secret| (STORE_SECRET_ENV, secret)))
        .envs(users_env)
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-m", &monitor.to_string(), "-js", "-sd"])
        .arg(&data_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    if let Some(pid) = child.id() {
        record_server(&mut lock, pid, port, monitor)?;
    }
    let url = format!("nats://{LOCAL_USER}:{password}@127.0.0.1:{port}");
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(LocalNats { child, url: url.into(), users, credentials, _lock: lock });
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("nats-server did not start listening on port {port} within 5 s")
}

/// Whether a NATS server answers at `url`.
pub async fn reachable(url: &hermes_core::secret::SecretUrl) -> bool {
    let url = url.expose();
    let connect = async_connect(url);
    matches!(tokio::time::timeout(Duration::from_secs(2), connect).await, Ok(true))
}

/// Whether any server of `url` (one URL or a comma-separated cluster) takes a TCP connection.
async fn async_connect(url: &str) -> bool {
    for url in hermes_core::bus::server_urls(url) {
        let url = hermes_core::secret::redact_url(&url);
        let hostport = url.trim_start_matches("nats://").trim_start_matches("tls://").to_owned();
        if tokio::net::TcpStream::connect(hostport).await.is_ok() {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_server_runs_the_deployments_users_and_the_operator_beside_them() {
        let config = users_config().unwrap();
        for user in ["user: dispatcher", "user: registry", "user: planner", "user: memory", "user: hermes,"] {
            assert!(config.contains(user), "{user}");
        }
        assert!(config.contains("auth_users: [dispatcher, registry, planner, memory, hermes]"));
        let users = LocalUsers::new(4222);
        assert!(users.url("memory").unwrap().expose().starts_with("nats://memory:"));
        assert!(users.url("nobody").is_err());
        let env = users.env("operator-secret");
        for var in ["HERMES_DISPATCHER_NATS_PASSWORD", "NATS_SYS_PASSWORD", "HERMES_IDENTITIES_ISSUER"] {
            assert!(env.iter().any(|(k, v)| k == var && !v.is_empty()), "{var}");
        }
        assert!(env.contains(&(OPERATOR_PASSWORD_ENV.to_owned(), "operator-secret".to_owned())));
    }

    #[test]
    fn a_store_with_streams_only_in_the_global_account_keeps_its_one_user() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!legacy_store(dir.path()), "a new store");
        std::fs::create_dir_all(dir.path().join("jetstream/$G/streams/KV_hermes_goals")).unwrap();
        assert!(legacy_store(dir.path()), "an earlier release's store");
        std::fs::create_dir_all(dir.path().join("jetstream/HERMES/streams/KV_hermes_goals")).unwrap();
        assert!(!legacy_store(dir.path()), "a store of this release");
    }

    #[test]
    fn the_local_password_is_made_once_private_and_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (first, path) = local_password(dir.path()).unwrap();
        assert_eq!(first.len(), 64);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (again, _) = local_password(dir.path()).unwrap();
        assert_eq!(first, again);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // A damaged file gets a new password.
        std::fs::write(&path, "authorization { user: hermes }").unwrap();
        let (fresh, _) = local_password(dir.path()).unwrap();
        assert_ne!(fresh, first);
    }
}
