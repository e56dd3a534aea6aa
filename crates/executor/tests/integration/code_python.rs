//! `code.python` in a real bubblewrap sandbox: results, the scratch dir, and every escape it must
//! block (host files, writes outside the scratch dir, Unix sockets and the network, forking past
//! the memory limit, processes outliving the call), the time and memory limits, and its defaults
//! (off, and gated by approval). Where this host cannot build the sandbox, each test asserts the
//! `FAILED_PRECONDITION` refusal instead; the check for that is independent of the tool's own.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hermes_executor::tools::{CodePython, CodePythonConfig};
use hermes_executor::{AgentConfig, ToolContext, ToolRegistry, build_registry};
use serde_json::{Value, json};

fn registry(config: CodePythonConfig) -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    registry.register(std::sync::Arc::new(CodePython::new(config))).unwrap();
    registry
}

fn unconfirmed() -> CodePythonConfig {
    CodePythonConfig { confirm: false, timeout: Duration::from_secs(5), ..Default::default() }
}

fn ctx() -> ToolContext {
    ToolContext { workspace: std::env::temp_dir(), task: None }
}

/// Whether bubblewrap can make the sandbox's namespaces here: the same namespace flags as the
/// tool, run as an unprivileged host user when this process is root (as the tool does).
fn namespaces_allowed() -> bool {
    let mut probe = std::process::Command::new("bwrap");
    probe
        .args([
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--uid",
            "65534",
            "--gid",
            "65534",
            "--ro-bind",
            "/",
            "/",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        probe.uid(65534).gid(65534);
    }
    probe.status().is_ok_and(|s| s.success())
}

/// True where the sandbox works; elsewhere asserts that the tool refuses, and returns false.
/// With `HERMES_REQUIRE_SANDBOX` set (`make test` sets it, having installed bubblewrap), a
/// sandbox that cannot run fails the test instead: the refusal is tested on its own below.
async fn sandboxed(tools: &ToolRegistry) -> bool {
    if namespaces_allowed() {
        return true;
    }
    if std::env::var_os("HERMES_REQUIRE_SANDBOX").is_some_and(|v| !v.is_empty() && v != "0") {
        let said = match run(tools, "print(1)").await {
            Err(e) => e.to_string(),
            Ok(_) => "the namespace probe failed, although the tool ran".to_owned(),
        };
        panic!(
            "HERMES_REQUIRE_SANDBOX is set but bubblewrap cannot build the code.python sandbox on this \
             machine ({said}); install bubblewrap and allow unprivileged user namespaces, or skip these \
             tests explicitly with `make test HERMES_SKIP_SANDBOX=1`"
        );
    }
    let err = run(tools, "print(1)").await.unwrap_err();
    assert_eq!(err.code.as_str(), "FAILED_PRECONDITION", "{err}");
    assert!(err.message.contains("sandbox"), "{err}");
    false
}

async fn run(registry: &ToolRegistry, code: &str) -> Result<Value, hermes_executor::ToolError> {
    registry.call("code.python", json!({"code": code}), &ctx()).await
}

/// A name no other test or run uses.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("hermes-{what}-{}-{nanos}", std::process::id())
}

/// The host's processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(format!("{}: {cmdline}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// Waits up to 3 s for the processes holding `marker` to be gone; returns those left.
async fn left_behind(marker: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let found = processes_with(marker);
        if found.is_empty() || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The snippet's printed JSON value.
fn value(out: &Value) -> &Value {
    assert_eq!(out["exit_code"], 0, "{out}");
    assert!(!out["value"].is_null(), "{out}");
    &out["value"]
}

#[tokio::test]
async fn a_snippet_runs_isolated_in_a_scratch_dir_or_the_tool_refuses() {
    let tools = registry(unconfirmed());
    if !sandboxed(&tools).await {
        return;
    }
    let out = run(&tools, "import json\nprint(json.dumps({'total': sum(range(10))}))").await.unwrap();
    assert_eq!(out["exit_code"], 0);
    assert_eq!(out["value"]["total"], 45);

    // The working and home dir is the scratch dir, gone afterwards; the user is unprivileged and
    // the environment is empty.
    let marker = unique("scratch");
    let code = format!(
        "import os, json\nopen('{marker}.txt','w').write('x')\nprint(json.dumps([os.getcwd(), os.environ.get('HOME'), os.getuid(), os.getgid(), sorted(os.environ)]))"
    );
    let out = run(&tools, &code).await.unwrap();
    let value = value(&out);
    assert_eq!(value[0], "/tmp", "{value}");
    assert_eq!(value[1], "/tmp", "{value}");
    assert_eq!(value[2], 65534, "{value}");
    assert_eq!(value[3], 65534, "{value}");
    assert!(!value[4].to_string().contains("CARGO"), "{}", value[4]);
    let kept: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("hermes-python-"))
        .filter(|e| e.path().join(format!("{marker}.txt")).exists())
        .map(|e| e.path())
        .collect();
    assert!(kept.is_empty(), "scratch dirs left behind: {kept:?}");

    // An error exit is a tool error naming the exception.
    let err = run(&tools, "1/0").await.unwrap_err();
    assert!(err.code.as_str() == "TOOL_ERROR" && err.message.contains("ZeroDivisionError"), "{err}");
}

#[tokio::test]
async fn host_files_are_out_of_reach_and_writes_outside_the_scratch_dir_fail() {
    let tools = registry(unconfirmed());
    if !sandboxed(&tools).await {
        return;
    }
    // A file the agent's user can read, outside the scratch dir.
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("secret.txt");
    std::fs::write(&secret, "hunter2").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let workspace_file = std::env::current_dir().unwrap().join("Cargo.toml");
    assert!(workspace_file.exists());
    let reads = [
        "/etc/shadow".to_owned(),
        "/etc/passwd".to_owned(),
        "/root/.bashrc".to_owned(),
        secret.display().to_string(),
        workspace_file.display().to_string(),
    ];
    let code = format!(
        "import json\nseen = {{}}\nfor p in {reads:?}:\n    try:\n        seen[p] = 'read ' + open(p).read(20)\n    except OSError as e:\n        seen[p] = 'blocked'\nprint(json.dumps(seen))"
    );
    let out = run(&tools, &code).await.unwrap();
    for (path, outcome) in value(&out).as_object().unwrap() {
        assert_eq!(outcome, "blocked", "{path} was readable: {outcome}");
    }

    // Writes: every place but the scratch dir is read-only or absent. A path in the host's temp
    // dir lands in the scratch dir (mounted at /tmp) or nowhere, never on the host.
    let host_target = std::env::temp_dir().join(unique("escape"));
    let writes =
        ["/x", "/usr/x", "/etc/x", "/dev/x", "/dev/shm/x", "/proc/x", "/bin/x", "/lib/x"].map(str::to_owned);
    let code = format!(
        "import json, os\nseen = {{}}\nfor p in {writes:?}:\n    try:\n        open(p, 'w').write('x')\n        seen[p] = 'written'\n    except OSError as e:\n        seen[p] = 'blocked'\ntry:\n    open({host:?}, 'w').write('x')\nexcept OSError:\n    pass\nopen('here.txt', 'w').write('ok')\nseen['here'] = open('here.txt').read()\nprint(json.dumps(seen))",
        host = host_target.display().to_string(),
    );
    let out = run(&tools, &code).await.unwrap();
    let seen = value(&out).as_object().unwrap().clone();
    assert_eq!(seen["here"], "ok", "{seen:?}");
    for path in &writes {
        assert_eq!(seen[path.as_str()], "blocked", "{path} was writable");
    }
    assert!(!host_target.exists(), "the snippet wrote {}", host_target.display());
}

#[tokio::test]
async fn no_unix_socket_or_network_outside_can_be_reached() {
    use std::os::linux::net::SocketAddrExt;
    let tools = registry(unconfirmed());
    if !sandboxed(&tools).await {
        return;
    }
    // A TCP listener, a Unix socket file anyone may connect to, and an abstract Unix socket: the
    // host reaches each; the snippet reaches none.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let socket_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(socket_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket_path = socket_dir.path().join("outside.sock");
    let _unix = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(std::os::unix::net::UnixStream::connect(&socket_path).is_ok());
    let abstract_name = unique("abstract");
    let abstract_addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
    let _abstract = std::os::unix::net::UnixListener::bind_addr(&abstract_addr).unwrap();
    assert!(std::os::unix::net::UnixStream::connect_addr(&abstract_addr).is_ok());

    let code = format!(
        r#"import json, socket
targets = [
    ("tcp", socket.AF_INET, ("127.0.0.1", {port})),
    ("public", socket.AF_INET, ("192.0.2.1", 80)),
    ("unix", socket.AF_UNIX, {path:?}),
    ("abstract", socket.AF_UNIX, "\0" + {abstract_name:?}),
]
seen = {{}}
for name, family, address in targets:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(address)
        seen[name] = "connected"
    except OSError as e:
        seen[name] = "blocked"
seen["interfaces"] = sorted(n for _, n in socket.if_nameindex())
print(json.dumps(seen))
"#,
        path = socket_path.display().to_string(),
    );
    let out = run(&tools, &code).await.unwrap();
    let seen = value(&out);
    for name in ["tcp", "public", "unix", "abstract"] {
        assert_eq!(seen[name], "blocked", "{name}: {seen}");
    }
    assert_eq!(seen["interfaces"], json!(["lo"]), "{seen}");
}

#[tokio::test]
async fn the_snippet_cannot_fork_so_children_cannot_add_up_past_the_memory_limit() {
    let tools = registry(CodePythonConfig { memory_mb: 256, ..unconfirmed() });
    if !sandboxed(&tools).await {
        return;
    }
    // Three children of 200 MB each would hold 600 MB under a 256 MB limit per process.
    let code = r#"import json, os, threading
kids, refused = [], None
for i in range(3):
    try:
        pid = os.fork()
    except OSError as e:
        refused = e.errno
        break
    if pid == 0:
        try:
            block = bytearray(200 * 1024 * 1024)
        finally:
            os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
try:
    big = bytearray(300 * 1024 * 1024)
    parent = "allocated"
except MemoryError:
    parent = "MemoryError"
try:
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    thread = "started"
except RuntimeError:
    thread = "refused"
print(json.dumps({"forked": len(kids), "refused": refused, "parent": parent, "thread": thread}))
"#;
    let out = run(&tools, code).await.unwrap();
    let seen = value(&out);
    assert_eq!(seen["forked"], 0, "{seen}");
    assert_eq!(seen["refused"], 11, "fork must fail with EAGAIN: {seen}");
    assert_eq!(seen["parent"], "MemoryError", "{seen}");
    assert_eq!(seen["thread"], "refused", "{seen}");

    // A fork bomb stops at the first fork.
    let out = run(
        &tools,
        "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)",
    )
    .await
    .unwrap();
    assert_eq!(out["value"], 0, "{out}");
}

/// Forks up to `tries` detached children (new session, double fork), each an interpreter that
/// sleeps 100 s with `marker` on its command line and inherits stdout; prints how many started.
fn detached_children(tries: u32, marker: &str) -> String {
    format!(
        r#"import json, os, sys, time
started = 0
for i in range({tries}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        try:
            if os.fork() > 0:
                os._exit(0)
        except OSError:
            os._exit(1)
        sleeper = "import time; open('alive-%d', 'w').close(); time.sleep(100)" % i
        os.execv(sys.executable, [sys.executable, "-c", sleeper, {marker:?}])
    _, status = os.waitpid(pid, 0)
    if status != 0:
        break
    started += 1
deadline = time.time() + 4
while time.time() < deadline and sum(1 for f in os.listdir('.') if f.startswith('alive-')) < started:
    time.sleep(0.05)
alive = sum(1 for f in os.listdir('.') if f.startswith('alive-'))
print(json.dumps({{"started": started, "alive": alive}}), flush=True)
"#
    )
}

#[tokio::test]
async fn detached_children_neither_start_by_default_nor_outlive_the_call() {
    let tools = registry(unconfirmed());
    if !sandboxed(&tools).await {
        return;
    }
    // By default not one of 40 detached children starts.
    let marker = unique("detached");
    let out = run(&tools, &detached_children(40, &marker)).await.unwrap();
    assert_eq!(value(&out)["started"], 0, "{out}");
    assert!(processes_with(&marker).is_empty());

    // With room for three, they start, hold stdout open and sleep 100 s; the call still ends when
    // the snippet does, and none of them is left.
    let tools =
        registry(CodePythonConfig { max_processes: 3, timeout: Duration::from_secs(10), ..unconfirmed() });
    let marker = unique("detached");
    let started = Instant::now();
    let out = run(&tools, &detached_children(40, &marker)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(8), "the call waited {:?}", started.elapsed());
    let seen = value(&out);
    let count = seen["started"].as_u64().unwrap();
    assert!((1..=3).contains(&count), "{seen}");
    assert_eq!(seen["alive"], count, "{seen}");
    let left = left_behind(&marker).await;
    assert!(left.is_empty(), "processes outlived the call: {left:?}");
}

#[tokio::test]
async fn a_child_holding_stdout_does_not_stall_the_call() {
    let tools =
        registry(CodePythonConfig { max_processes: 1, timeout: Duration::from_secs(10), ..unconfirmed() });
    if !sandboxed(&tools).await {
        return;
    }
    let marker = unique("holder");
    let code = format!(
        r#"import os, sys
if os.fork() == 0:
    os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(100); print('late')", {marker:?}])
print("done", flush=True)
"#
    );
    let started = Instant::now();
    let out = run(&tools, &code).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(8), "the call waited {:?}", started.elapsed());
    assert_eq!(out["stdout"].as_str().unwrap().trim(), "done", "{out}");
    let left = left_behind(&marker).await;
    assert!(left.is_empty(), "processes outlived the call: {left:?}");
}

#[tokio::test]
async fn the_time_and_memory_limits_hold() {
    let tools =
        registry(CodePythonConfig { timeout: Duration::from_secs(1), memory_mb: 128, ..unconfirmed() });
    if !sandboxed(&tools).await {
        return;
    }
    let started = Instant::now();
    let err = run(&tools, "while True:\n    pass").await.unwrap_err();
    assert_eq!(err.code.as_str(), "TIMEOUT");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    let err = run(&tools, "x = bytearray(512 * 1024 * 1024)\nprint(len(x))").await.unwrap_err();
    assert!(err.message.contains("MemoryError"), "{err}");

    // The timeout kills every process of the snippet, a detached one too.
    let tools =
        registry(CodePythonConfig { timeout: Duration::from_secs(2), max_processes: 2, ..unconfirmed() });
    let marker = unique("timeout");
    let code = format!(
        r#"import os, sys, time
if os.fork() == 0:
    os.setsid()
    os.execv(sys.executable, [sys.executable, "-c", "import time; open('alive', 'w').close(); time.sleep(100)", {marker:?}])
while not os.path.exists('alive'):
    time.sleep(0.02)
print("spinning", flush=True)
while True:
    pass
"#
    );
    let err = run(&tools, &code).await.unwrap_err();
    assert_eq!(err.code.as_str(), "TIMEOUT", "{err}");
    let left = left_behind(&marker).await;
    assert!(left.is_empty(), "processes outlived the timeout: {left:?}");
}

/// A `bwrap` that is not there: the tool refuses, naming the package, and runs nothing.
#[tokio::test]
async fn refuses_when_bubblewrap_is_missing() {
    let missing = tempfile::tempdir().unwrap();
    for bwrap in
        [missing.path().join("bwrap").display().to_string(), format!("no-such-bwrap-{}", unique("x"))]
    {
        let tools = registry(CodePythonConfig { bwrap: bwrap.clone(), ..unconfirmed() });
        let err = run(&tools, "print('ran')").await.unwrap_err();
        assert_eq!(err.code.as_str(), "FAILED_PRECONDITION", "{bwrap}: {err}");
        assert!(
            err.message.contains("bubblewrap") && err.message.contains("not installed"),
            "{bwrap}: {err}"
        );
        // The refusal is remembered, and asked again it is the same.
        let again = run(&tools, "print('ran')").await.unwrap_err();
        assert_eq!(again.code.as_str(), "FAILED_PRECONDITION");
    }
}

/// A `bwrap` that cannot build the sandbox (one that fails the way bwrap does where user
/// namespaces are forbidden): the tool refuses with bwrap's own reason and runs nothing.
#[tokio::test]
async fn refuses_when_bubblewrap_cannot_build_a_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    // Open to uid 65534, which bwrap runs as when the tests run as root.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = dir.path().join("ran");
    let forbidden = dir.path().join("bwrap-forbidden");
    std::fs::write(
        &forbidden,
        format!(
            "#!/bin/sh\ntouch '{}'\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&forbidden, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tools = registry(CodePythonConfig { bwrap: forbidden.display().to_string(), ..unconfirmed() });
    let err = run(&tools, "print('ran')").await.unwrap_err();
    assert_eq!(err.code.as_str(), "FAILED_PRECONDITION", "{err}");
    assert!(
        err.message.contains("cannot build the sandbox") && err.message.contains("No permissions"),
        "{err}"
    );
    assert!(marker.exists(), "the check really ran the configured bwrap");
}

#[tokio::test]
async fn code_python_is_off_by_default_and_asks_for_approval_when_on() {
    let workspace = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::new("py", workspace.path());
    let default_tools = build_registry(&config, None).await.unwrap();
    assert!(!default_tools.contains("code.python"));
    config.tools = vec!["code.python".into()];
    let err = build_registry(&config, None).await.err().unwrap();
    assert!(err.to_string().contains("disabled"), "{err}");
    config.code_python = Some(CodePythonConfig::default());
    let tools = build_registry(&config, None).await.unwrap();
    let spec = tools.specs().into_iter().find(|s| s.name == "code.python").unwrap();
    assert!(spec.require_confirm && spec.side_effects);
    // Outside a task nobody can approve, so the call is denied without running.
    let err = run(&tools, "print(1)").await.unwrap_err();
    assert_eq!(err.code.as_str(), "DENIED");
}
