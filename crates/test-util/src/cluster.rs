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
    pub fn start(size: usize) -> NatsCluster {
        let binary = nats_server_binary().unwrap_or_else(|e| panic!("{e}"));
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
        let mut cluster = NatsCluster { binary, nodes };
        for i in 0..size {
            cluster.spawn(i);
        }
        for i in 0..size {
            cluster.wait_listening(i);
        }
        cluster.wait_meta_leader(Duration::from_secs(30));
        cluster
    }

    /// Every server's client URL, comma-separated: what Hermes's `nats.url` takes.
    pub fn urls(&self) -> String {
        self.nodes.iter().map(|n| format!("nats://127.0.0.1:{}", n.port)).collect::<Vec<_>>().join(",")
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
    pub fn wait_meta_leader(&self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let leaders: Vec<Option<String>> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].child.is_some())
                .map(|i| self.meta_leader_seen_by(i))
                .collect();
            if let Some(Some(first)) = leaders.first()
                && leaders.iter().all(|l| l.as_ref() == Some(first))
            {
                return first.clone();
            }
            assert!(
                Instant::now() < deadline,
                "the cluster elected no meta leader within {timeout:?}: {leaders:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
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
        let deadline = Instant::now() + Duration::from_secs(15);
        let port = self.nodes[i].port;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(Ok(Some(status))) = self.nodes[i].child.as_mut().map(|c| c.try_wait()) {
                panic!("nats-server {} exited: {status}; log:\n{}", self.nodes[i].name, self.log(i));
            }
            assert!(
                Instant::now() < deadline,
                "nats-server {} did not listen within 15 s",
                self.nodes[i].name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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
