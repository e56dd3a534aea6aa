//! [`NatsCluster`]: three (or more) nats-servers clustered over loopback routes, each with
//! JetStream, its own store dir and a monitoring port, for tests and chaos scenarios that kill,
//! freeze and restart single servers under Hermes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, nats_server_binary};

/// One server of a [`NatsCluster`].
struct Node {
    name: String,
    child: Option<Child>,
    port: u16,
    cluster_port: u16,
    monitor_port: u16,
    store: tempfile::TempDir,
}

/// A JetStream cluster of nats-server processes on loopback, killed when dropped.
pub struct NatsCluster {
    binary: PathBuf,
    nodes: Vec<Node>,
}

impl NatsCluster {
    /// Starts `size` servers (`n0`, `n1`, ...) routed to each other, and waits until each
    /// listens and the JetStream meta group has a leader that every server knows.
    ///
    /// A server can die right after it starts listening for clients, when its route port was
    /// taken between [`free_port`] and its bind; the others then elect a leader without it. Such
    /// a start is thrown away, with the dead server's log on stderr, and tried again on fresh
    /// ports and store dirs, three times at most.
    pub fn start(size: usize) -> NatsCluster {
        let binary = nats_server_binary().unwrap_or_else(|e| panic!("{e}"));
        let mut failures = Vec::new();
        for attempt in 1..=3 {
            match NatsCluster::try_start(&binary, size) {
                Ok(cluster) => return cluster,
                Err(failure) => {
                    eprintln!("a {size}-server cluster did not start (attempt {attempt} of 3): {failure}");
                    failures.push(failure);
                }
            }
        }
        panic!("a {size}-server nats cluster did not start in 3 attempts:\n{}", failures.join("\n"));
    }

    fn try_start(binary: &Path, size: usize) -> Result<NatsCluster, String> {
        let nodes = (0..size)
            .map(|i| Node {
                name: format!("n{i}"),
                child: None,
                port: free_port(),
                cluster_port: free_port(),
                monitor_port: free_port(),
                store: tempfile::tempdir().expect("temp store dir"),
            })
            .collect();
        let mut cluster = NatsCluster { binary: binary.to_owned(), nodes };
        for i in 0..size {
            cluster.spawn(i);
        }
        for i in 0..size {
            cluster.try_wait_listening(i)?;
        }
        cluster.try_wait_meta_leader(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Every server's client URL, comma-separated: what Hermes's `nats.url` takes.
    pub fn urls(&self) -> String {
        self.nodes.iter().map(|n| format!("nats://127.0.0.1:{}", n.port)).collect::<Vec<_>>().join(",")
    }

    /// Server `i`'s client URL alone: a client that talks only to it.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].port)
    }

    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Server `i`'s name (`n<i>`), as JetStream names leaders.
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The index of the server named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// `kill -9` server `i`, keeping its store dir, as a crashed pod.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again on its ports and store dir, and waits until it listens.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_listening(i);
    }

    /// SIGSTOP server `i`: it keeps its sockets but answers nothing, as a paused VM.
    pub fn freeze(&self, i: usize) {
        self.signal(i, "STOP");
    }

    /// SIGCONT after [`NatsCluster::freeze`].
    pub fn thaw(&self, i: usize) {
        self.signal(i, "CONT");
    }

    /// The JetStream meta leader's name, as server `i` (or, when it does not answer, any other)
    /// reports it; `None` while there is none.
    pub fn meta_leader(&self) -> Option<String> {
        (0..self.nodes.len()).find_map(|i| self.meta_leader_seen_by(i))
    }

    /// The meta leader server `i` names (`/jsz`), if it answers and knows one.
    fn meta_leader_seen_by(&self, i: usize) -> Option<String> {
        let jsz = self.monitor(i, "/jsz")?;
        jsz["meta_cluster"]["leader"].as_str().filter(|l| !l.is_empty()).map(str::to_owned)
    }

    /// Waits until every running server names the same meta leader.
    pub fn wait_meta_leader(&mut self, timeout: Duration) -> String {
        self.try_wait_meta_leader(timeout).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`NatsCluster::wait_meta_leader`], failing early, with its log, when a server has exited.
    fn try_wait_meta_leader(&mut self, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            for i in 0..self.nodes.len() {
                self.check_alive(i)?;
            }
            let leaders: Vec<Option<String>> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].child.is_some())
                .map(|i| self.meta_leader_seen_by(i))
                .collect();
            if let Some(Some(first)) = leaders.first()
                && leaders.iter().all(|l| l.as_ref() == Some(first))
            {
                return Ok(first.clone());
            }
            if Instant::now() >= deadline {
                let unaware: Vec<String> = (0..self.nodes.len())
                    .filter(|&i| self.nodes[i].child.is_some() && self.meta_leader_seen_by(i).is_none())
                    .map(|i| format!("log of {}:\n{}", self.nodes[i].name, self.log_tail(i)))
                    .collect();
                return Err(format!(
                    "the cluster elected no meta leader within {timeout:?}: {leaders:?}\n{}",
                    unaware.join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// An error naming server `i` and its log when it was started and has exited since.
    fn check_alive(&mut self, i: usize) -> Result<(), String> {
        match self.nodes[i].child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(status))) => Err(format!(
                "nats-server {} exited: {status}; log:\n{}",
                self.nodes[i].name,
                self.log_tail(i)
            )),
            _ => Ok(()),
        }
    }

    /// A monitoring endpoint of server `i` (`/varz`, `/jsz`, ...) as JSON; `None` when it does
    /// not answer within a second.
    pub fn monitor(&self, i: usize, path: &str) -> Option<serde_json::Value> {
        monitor(self.nodes[i].monitor_port, path)
    }

    fn signal(&self, i: usize, name: &str) {
        let pid = self.nodes[i].child.as_ref().expect("the server runs").id();
        let status = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{name} {pid}");
    }

    fn spawn(&mut self, i: usize) {
        let routes: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| format!("nats://127.0.0.1:{}", n.cluster_port))
            .collect();
        let node = &self.nodes[i];
        let child = Command::new(&self.binary)
            .args(["-a", "127.0.0.1", "-p", &node.port.to_string(), "-m", &node.monitor_port.to_string()])
            .args(["-n", &node.name, "-js", "-sd"])
            .arg(node.store.path())
            .args([
                "--cluster_name",
                "hermes",
                "--cluster",
                &format!("nats://127.0.0.1:{}", node.cluster_port),
            ])
            .args(["--routes", &routes.join(",")])
            .arg("-l")
            .arg(log_path(node.store.path()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        self.nodes[i].child = Some(child);
    }

    fn wait_listening(&mut self, i: usize) {
        self.try_wait_listening(i).unwrap_or_else(|e| panic!("{e}"));
    }

    fn try_wait_listening(&mut self, i: usize) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let port = self.nodes[i].port;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            self.check_alive(i)?;
            if Instant::now() >= deadline {
                return Err(format!("nats-server {} did not listen within 15 s", self.nodes[i].name));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The last 40 lines of server `i`'s log.
    fn log_tail(&self, i: usize) -> String {
        let log = self.log(i);
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Server `i`'s log.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(log_path(self.nodes[i].store.path())).unwrap_or_default()
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            // A frozen server ignores SIGKILL's reaping until it runs again.
            if self.nodes[i].child.is_some() {
                let _ = Command::new("kill")
                    .args(["-CONT", &self.nodes[i].child.as_ref().unwrap().id().to_string()])
                    .status();
            }
            self.kill(i);
        }
    }
}

fn log_path(store: &Path) -> PathBuf {
    store.join("server.log")
}

/// `GET http://127.0.0.1:<port><path>` as JSON, by hand (HTTP/1.0, so the server closes).
pub fn monitor(port: u16, path: &str) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    serde_json::from_str(body).ok()
}
