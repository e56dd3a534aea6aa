"""deploy/ checked against the real binaries: every service of docker-compose.yml runs a binary
the image contains, with variables that binary's settings really read (`--print-env` lists every
name the config pipeline maps to a setting) and flags it really takes (its `--help`), each
documented; every port it publishes is bound to 127.0.0.1 (NATS publishes none) and its API
requires a tokens file and a token; the variables the Helm chart sets are held to the same
rule; and the production NATS configuration parses with the pinned nats-server
(`nats-server -t`).

HERMES_BIN_DIR names the directory with the built binaries (scripts/check-deploy.sh sets it).
Run by `make test` through scripts/check-deploy.sh.
"""

import os
import pathlib
import re
import subprocess
import tempfile
import unittest

import helm_python as helm
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("HERMES_BIN_DIR", ROOT / "target" / "debug"))
NATS_SERVER = os.environ.get("HERMES_NATS_SERVER_BIN", str(ROOT / ".tools" / "bin" / "nats-server"))
# Read outside the settings (the model client reads the key from the variable `llm.api_key_env`
# names), or by the OpenTelemetry SDK and the log filter; each must still be documented.
SHARED_ENV = {
    "HERMES_LLM_API_KEY",
    "RUST_LOG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_RESOURCE_ATTRIBUTES",
}


def docs_text():
    parts = [(ROOT / "README.md").read_text()]
    parts += [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(parts)


_HELP = {}


def help_text(binary, *sub):
    key = (binary, sub)
    if key not in _HELP:
        path = BIN_DIR / binary
        out = subprocess.run([str(path), *sub, "--help"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"{path} {' '.join(sub)} --help failed: {out.stderr}")
        _HELP[key] = out.stdout
    return _HELP[key]


_ENV = {}


def reads(binary, sub, var):
    """Whether `binary` reads `var`: a setting's variable of a service binary, or a flag's
    variable of a `hermes` client command."""
    if binary == "hermes" and sub and sub[0] not in ("up", "agent", "planner"):
        # `[env: VAR=value]`, or `[env: VAR]` for a flag whose value is hidden (`--token`)
        text = help_text(binary, *sub)
        return f"[env: {var}=" in text or f"[env: {var}]" in text
    key = (binary, sub)
    if key not in _ENV:
        path = BIN_DIR / binary
        out = subprocess.run([str(path), *sub, "--print-env"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"{path} {' '.join(sub)} --print-env failed: {out.stderr}")
        _ENV[key] = set(out.stdout.split())
    return var in _ENV[key]


def image_binaries():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    found = re.search(r"for bin in ([a-z\- ]+); do", dockerfile)
    assert found, "the Dockerfile's binary list"
    return found.group(1).split()


class Compose(unittest.TestCase):
    def setUp(self):
        self.compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
        self.docs = docs_text()

    def hermes_services(self):
        for name, service in self.compose["services"].items():
            if service.get("image", "").startswith("hermes:"):
                yield name, service

    def test_the_image_holds_every_binary_the_workspace_builds(self):
        built = {p.name for p in BIN_DIR.iterdir() if p.name.startswith("hermes") and os.access(p, os.X_OK) and p.is_file()}
        built.discard("hermes-bench")
        self.assertEqual(set(image_binaries()), built)

    def test_every_service_runs_a_real_binary_with_real_variables(self):
        binaries = set(image_binaries())
        services = dict(self.hermes_services())
        self.assertTrue({"dispatcher", "registry", "planner", "memory"} <= set(services))
        pools = [s for s in services.values() if s["command"][0] == "hermes-executor"]
        self.assertGreaterEqual(len(pools), 2, "two executor pools")
        self.assertEqual(len({p["environment"]["HERMES_AGENT_POOL"] for p in pools}), len(pools))
        for name, service in services.items():
            binary = (service.get("entrypoint") or service["command"])[0]
            sub = ("submit",) if binary == "hermes" else ()
            with self.subTest(service=name):
                self.assertIn(binary, binaries)
                text = help_text(binary, *sub)
                for var in service.get("environment", {}):
                    if var in SHARED_ENV:
                        continue
                    self.assertTrue(reads(binary, sub, var), f"{binary} does not read {var}")
                for arg in service["command"][1:]:
                    if arg.startswith("--"):
                        self.assertIn(arg.split("=")[0], text)

    def test_every_variable_is_documented(self):
        for name, service in self.compose["services"].items():
            for var in service.get("environment", {}):
                with self.subTest(service=name, var=var):
                    self.assertTrue(f"`{var}`" in self.docs, f"{var} is not in README.md or docs/")

    def published(self):
        """(service, host address, host port, container port) of every published port, short
        syntax (`[HOST_IP:]HOST:CONTAINER[/PROTO]`) or long (`host_ip`, `published`, `target`)."""
        for name, service in self.compose["services"].items():
            for port in service.get("ports", []):
                if isinstance(port, dict):
                    yield name, port.get("host_ip", ""), str(port.get("published", "")), str(port["target"])
                    continue
                parts = str(port).split("/")[0].rsplit(":", 2)
                if len(parts) == 3:
                    yield name, parts[0].strip("[]"), parts[1], parts[2]
                else:
                    yield name, "", parts[0] if len(parts) == 2 else "", parts[-1]

    def test_every_published_port_is_bound_to_loopback_and_nats_is_not_published(self):
        ports = list(self.published())
        self.assertTrue(ports, "the dispatcher's API and the metrics are published")
        for name, host, published, target in ports:
            with self.subTest(service=name, port=f"{host}:{published}:{target}"):
                self.assertEqual(host, "127.0.0.1", "a published port binds 127.0.0.1, not every interface")
                self.assertTrue(published, "a fixed host port, not a random one on every interface")
        self.assertNotIn("nats", {name for name, *_ in ports}, "NATS has no users: it stays on the project network")
        self.assertNotIn("network_mode", self.compose["services"]["nats"])

    def test_the_published_api_requires_tokens(self):
        services = self.compose["services"]
        dispatcher = services["dispatcher"]
        env = dispatcher["environment"]
        self.assertNotIn("HERMES_ALLOW_UNAUTHENTICATED", env)
        self.assertNotIn("HERMES_DISPATCHER_ALLOW_UNAUTHENTICATED", env)
        secrets = self.compose.get("secrets", {})
        self.assertIn("api-tokens", secrets)
        self.assertRegex(secrets["api-tokens"]["file"], r"^\$\{[A-Z_]+:\?[^}]+\}$", "the tokens file is required, not defaulted")
        for name, var in [("dispatcher", "HERMES_DISPATCHER_API_TOKENS_FILE"), ("registry", "HERMES_API_TOKENS_FILE"), ("memory", "HERMES_API_TOKENS_FILE")]:
            with self.subTest(service=name):
                self.assertIn("api-tokens", services[name].get("secrets", []))
                self.assertEqual(services[name]["environment"][var], "/run/secrets/api-tokens")
        self.assertRegex(services["cli"]["environment"]["HERMES_TOKEN"], r"^\$\{HERMES_TOKEN:\?[^}]+\}$")

    def test_services_reach_nats_by_its_service_name_and_mount_what_exists(self):
        for name, service in self.hermes_services():
            env = service.get("environment", {})
            if "HERMES_NATS_URL" in env:
                self.assertEqual(env["HERMES_NATS_URL"], "nats://nats:4222", name)
            for volume in service.get("volumes", []):
                source = volume.split(":")[0]
                if source.startswith("."):
                    self.assertTrue((ROOT / "deploy" / source).resolve().exists(), source)


class ChartEnvironment(unittest.TestCase):
    def test_every_variable_the_chart_sets_is_read_by_its_binary_and_documented(self):
        docs = docs_text()
        for values_file in sorted(p.name for p in (ROOT / "helm" / "hermes" / "ci").glob("*-values.yaml")):
            values = yaml.safe_load((ROOT / "helm" / "hermes" / "ci" / values_file).read_text())
            files = helm.Chart.load(str(ROOT / "helm" / "hermes")).render(values, name="hermes", namespace="agents")
            docs_objs = [d for p, t in files.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]
            maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs_objs if d["kind"] == "ConfigMap"}
            for dep in (d for d in docs_objs if d["kind"] == "Deployment"):
                container = dep["spec"]["template"]["spec"]["containers"][0]
                binary = container["command"][0]
                names = [e["name"] for e in container.get("env", [])]
                for ref in container.get("envFrom", []):
                    names += list(maps[ref["configMapRef"]["name"]])
                user_env = set()
                for source in (values.get(k, {}) for k in ["dispatcher", "registry", "memory", "planner"]):
                    user_env |= set(source.get("env", {}))
                for var in names:
                    with self.subTest(values=values_file, deployment=dep["metadata"]["name"], var=var):
                        if var in user_env:
                            continue  # the values file's own extra env
                        if var not in SHARED_ENV:
                            self.assertTrue(reads(binary, (), var), f"{binary} does not read {var}")
                        self.assertTrue(f"`{var}`" in docs, f"{var} is not in README.md or docs/")


class NatsConfig(unittest.TestCase):
    ENV = {
        "NATS_SERVER_NAME": "nats-0",
        "NATS_SYS_PASSWORD": "p0",
        "HERMES_DISPATCHER_NATS_PASSWORD": "p1",
        "HERMES_REGISTRY_NATS_PASSWORD": "p2",
        "HERMES_PLANNER_NATS_PASSWORD": "p3",
        "HERMES_MEMORY_NATS_PASSWORD": "p4",
        "HERMES_AGENT_NATS_PASSWORD": "p5",
    }

    def check(self, path):
        return subprocess.run(
            [NATS_SERVER, "-t", "-c", str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, **self.ENV},
            cwd=path.parent,
            timeout=60,
        )

    def test_the_cluster_config_parses_and_fsyncs_every_write(self):
        path = ROOT / "deploy" / "nats" / "cluster.conf"
        out = self.check(path)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("is valid", out.stdout + out.stderr)
        self.assertRegex(path.read_text(), r"(?m)^\s*sync_interval:\s*always\s*$")

    def test_a_broken_config_is_caught(self):
        text = (ROOT / "deploy" / "nats" / "cluster.conf").read_text().replace("jetstream {", "jetstream {{", 1)
        with tempfile.TemporaryDirectory() as dir:
            path = pathlib.Path(dir) / "cluster.conf"
            path.write_text(text)
            (pathlib.Path(dir) / "accounts.conf").write_text((ROOT / "deploy" / "nats" / "accounts.conf").read_text())
            self.assertNotEqual(self.check(path).returncode, 0)

    def test_every_service_has_a_user_with_permissions(self):
        accounts = (ROOT / "deploy" / "nats" / "accounts.conf").read_text()
        for user in ["dispatcher", "registry", "planner", "memory", "agent"]:
            self.assertRegex(accounts, rf"user: {user}\n\s*password: \$HERMES_{user.upper()}_NATS_PASSWORD\n\s*permissions")


if __name__ == "__main__":
    unittest.main()
