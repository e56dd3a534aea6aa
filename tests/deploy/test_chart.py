"""The Helm chart, checked offline: rendered and linted with the Helm library (PyPI
`helm-python-sdk`), every manifest validated against the Kubernetes schemas (PyPI
`kubernetes-validate`, strict), the chart's invariants asserted on the rendered objects, and
values that break the schema or the chart's rules rejected with the field named.

Run by `make test` through scripts/check-deploy.sh.
"""

import copy
import pathlib
import unittest

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "hermes"
VALUES_FILES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.30.0"
# Custom resources the Kubernetes schemas do not know; their invariants are asserted below.
CUSTOM_KINDS = {"ScaledObject", "ServiceMonitor"}
# The one lint finding an offline check cannot avoid: the optional NATS chart is fetched by
# `helm dependency build`, which needs the network.
OFFLINE_LINT = "chart directory is missing these dependencies: nats"


def load_values(name):
    return yaml.safe_load((CHART / "ci" / name).read_text())


def render(values):
    chart = helm.Chart.load(str(CHART))
    chart.validate_schema(values)
    files = chart.render(values, name="hermes", namespace="agents", is_install=True)
    docs = []
    for path, text in sorted(files.items()):
        if not path.endswith(".yaml"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs, files


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def config_maps(docs):
    return {d["metadata"]["name"]: d.get("data", {}) for d in by_kind(docs, "ConfigMap")}


def pool_consumer(task_type):
    return "pool_" + task_type.replace(".", "_")


def pool_consumers(task_type, tenants):
    """Every consumer of a task type's pool: the plain one and each listed tenant's lane
    (crates/core/src/topology.rs lane_consumer)."""
    flat = task_type.replace(".", "_")
    return [pool_consumer(task_type)] + [f"lane_{flat}__{tenant}" for tenant in tenants]


def deployment(docs, name):
    return next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == name)


def settings_of(docs, dep):
    """What reaches a Deployment's container: its ConfigMaps' data and its env."""
    container = dep["spec"]["template"]["spec"]["containers"][0]
    maps = config_maps(docs)
    settings = {}
    for ref in container.get("envFrom", []):
        settings.update(maps[ref["configMapRef"]["name"]])
    settings.update(env_of(container))
    return settings


def secret_refs(dep):
    """Every Secret a Deployment's pods can read, as {(name, key or None for a whole volume)}."""
    spec = dep["spec"]["template"]["spec"]
    refs = set()
    for container in spec["containers"]:
        for e in container.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.add((ref["name"], ref["key"]))
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                refs.add((source["secretRef"]["name"], None))
    for volume in spec.get("volumes", []):
        secrets = [(s["secretName"], s.get("items")) for s in [volume.get("secret")] if s]
        secrets += [(s["secret"]["name"], s["secret"].get("items")) for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
        for name, items in secrets:
            if not items:
                refs.add((name, None))
            for item in items or []:
                refs.add((name, item["key"]))
    return refs


def mounted_file(dep, path):
    """The (Secret, key) a file path in a Deployment's container comes from, through a read-only
    mount of a secret or projected volume; None when no mount holds it."""
    spec = dep["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in spec["containers"][0].get("volumeMounts", []):
        directory = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(directory) or not mount.get("readOnly"):
            continue
        name = path.removeprefix(directory)
        volume = volumes[mount["name"]]
        sources = [{"secret": {"name": volume["secret"]["secretName"], **volume["secret"]}}] if "secret" in volume else volume.get("projected", {}).get("sources", [])
        for source in sources:
            for item in source.get("secret", {}).get("items", []):
                if item["path"] == name:
                    return (source["secret"]["name"], item["key"])
    return None


# The NATS user each Deployment of a render connects as (deploy/nats/accounts.conf).
def nats_user_of(dep_name):
    return "agent" if dep_name.startswith("hermes-pool-") else dep_name.removeprefix("hermes-")


WITH_TOKENS = {"auth": {"apiTokensSecret": {"name": "hermes-api-tokens", "key": "tokens.toml"}}}


def nats_talk(port, user, password, *lines, until=b"PONG", server=None, log=None):
    """Connects to the nats-server on `port` (waiting up to 10 s for it to listen; failing with
    its `log` if the `server` process exited first) as `user`, sends `lines` and a PING, and
    returns what it answered up to `until` or an -ERR."""
    import json, socket, time
    deadline = time.time() + 10
    while True:
        if server is not None and server.poll() is not None:
            raise AssertionError(f"nats-server refused the config: {log.read_text()[-2000:] if log else ''}")
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            if time.time() >= deadline:
                raise AssertionError("nats-server did not start") from None
            time.sleep(0.1)
    with sock:
        sock.recv(4096)
        hello = {"user": user, "pass": password, "verbose": False, "headers": True} if user else {"verbose": False}
        sock.sendall(("CONNECT " + json.dumps(hello) + "\r\n" + "".join(l + "\r\n" for l in lines) + "PING\r\n").encode())
        reply = b""
        while until not in reply and b"-ERR" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
        return reply.decode()


class RenderLintValidate(unittest.TestCase):
    def test_every_values_file_lints_renders_and_validates_strictly(self):
        for name in VALUES_FILES:
            with self.subTest(values=name):
                values = load_values(name)
                report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
                problems = [
                    m for m in report["messages"] if m["severity"] >= 2 and m["error"] != OFFLINE_LINT
                ]
                self.assertEqual(problems, [], f"lint findings for {name}")
                docs, _ = render(values)
                self.assertGreater(len(docs), 10)
                for doc in docs:
                    if doc["kind"] in CUSTOM_KINDS:
                        continue
                    try:
                        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        self.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {e.message} at {list(e.path)}")

    def test_the_http_api_answers_to_its_service_names_the_ingress_host_and_allowed_hosts(self):
        values = load_values("minimal-values.yaml")
        values.setdefault("dispatcher", {})
        values["dispatcher"]["ingress"] = {"enabled": True, "host": "hermes.example.internal"}
        values["dispatcher"]["allowedHosts"] = [".corp.example"]
        docs, _ = render(values)
        settings = settings_of(docs, deployment(docs, "hermes-dispatcher"))
        hosts = settings["HERMES_HTTP_ALLOWED_HOSTS"].split(",")
        for host in [
            "hermes-dispatcher",
            "hermes-dispatcher.agents",
            "hermes-dispatcher.agents.svc",
            "hermes-dispatcher.agents.svc.cluster.local",
            "hermes.example.internal",
            ".corp.example",
        ]:
            self.assertIn(host, hosts)
        self.assertNotIn("*", hosts, "the chart must not answer to any host by default")

    def test_notes_show_how_to_submit_a_first_goal(self):
        _, files = render(load_values("minimal-values.yaml"))
        notes = files["hermes/templates/NOTES.txt"]
        self.assertIn("port-forward svc/hermes-dispatcher 50051:50051", notes)
        self.assertIn("hermes submit --plan examples/plans/first-goal.yaml --watch", notes)
        self.assertTrue((ROOT / "examples" / "plans" / "first-goal.yaml").exists())


class Invariants(unittest.TestCase):
    def test_every_pool_renders_a_deployment_serving_its_task_types(self):
        for name in VALUES_FILES:
            values = load_values(name)
            merged = helm.Chart.load(str(CHART)).merge_values(values)
            docs, _ = render(values)
            deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
            maps = config_maps(docs)
            for pool in merged["executorPools"]:
                with self.subTest(values=name, pool=pool["name"]):
                    dep_name = f"hermes-pool-{pool['name']}"
                    self.assertIn(dep_name, deployments)
                    spec = deployments[dep_name]["spec"]["template"]["spec"]
                    container = spec["containers"][0]
                    self.assertEqual(container["command"], ["hermes-executor"])
                    data = maps[container["envFrom"][0]["configMapRef"]["name"]]
                    self.assertEqual(data["HERMES_AGENT_TOOLS"], ",".join(pool["taskTypes"]))
                    self.assertEqual(data["HERMES_AGENT_POOL"], pool["name"])
                    self.assertEqual(data["HERMES_AGENT_MAX_CONCURRENCY"], str(pool["maxConcurrency"]))
                    env = env_of(container)
                    self.assertEqual(env["HERMES_AGENT_ID"], {"fieldRef": {"fieldPath": "metadata.name"}})
                    self.assertEqual(spec["terminationGracePeriodSeconds"], pool["drainSeconds"])
                    if pool["autoscaling"]["mode"] == "none":
                        self.assertEqual(deployments[dep_name]["spec"]["replicas"], pool["replicas"])
                    else:
                        # The autoscaler owns the replica count; a fixed one would fight it on upgrades.
                        self.assertNotIn("replicas", deployments[dep_name]["spec"])

    def test_every_container_has_probes_resources_and_a_locked_down_context(self):
        for name in VALUES_FILES:
            docs, _ = render(load_values(name))
            for dep in by_kind(docs, "Deployment"):
                for container in dep["spec"]["template"]["spec"]["containers"]:
                    with self.subTest(values=name, deployment=dep["metadata"]["name"]):
                        self.assertIn("readinessProbe", container)
                        self.assertIn("livenessProbe", container)
                        self.assertTrue(container["resources"]["requests"])
                        self.assertTrue(container["resources"]["limits"])
                        self.assertFalse(container["securityContext"]["allowPrivilegeEscalation"])
                        env = env_of(container)
                        self.assertIn("HERMES_NATS_URL", env)
                        self.assertIn("HERMES_METRICS_LISTEN", env)

    def test_grpc_services_use_grpc_health_probes(self):
        docs, _ = render(load_values("external-nats-values.yaml"))
        ports = {"hermes-dispatcher": 50051, "hermes-registry": 50052, "hermes-memory": 50053}
        deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
        for dep_name, port in ports.items():
            container = deployments[dep_name]["spec"]["template"]["spec"]["containers"][0]
            self.assertEqual(container["readinessProbe"]["grpc"]["port"], port, dep_name)
            self.assertEqual(container["livenessProbe"]["grpc"]["port"], port, dep_name)
        planner = deployments["hermes-planner"]["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(planner["readinessProbe"]["httpGet"]["path"], "/healthz")

    def test_keda_scaled_objects_target_each_task_type_s_pool_consumer(self):
        values = load_values("autoscaled-pools-values.yaml")
        docs, _ = render(values)
        scaled = {d["metadata"]["name"]: d for d in by_kind(docs, "ScaledObject")}
        hpas = {d["metadata"]["name"]: d for d in by_kind(docs, "HorizontalPodAutoscaler")}
        self.assertEqual(set(scaled), {"hermes-pool-llm", "hermes-pool-data"})
        self.assertEqual(set(hpas), {"hermes-pool-compute"})
        for pool in values["executorPools"]:
            scaling = pool["autoscaling"]
            if scaling["mode"] != "keda":
                continue
            obj = scaled[f"hermes-pool-{pool['name']}"]["spec"]
            with self.subTest(pool=pool["name"]):
                self.assertEqual(obj["scaleTargetRef"]["name"], f"hermes-pool-{pool['name']}")
                self.assertEqual(obj["minReplicaCount"], scaling["minReplicas"])
                self.assertGreaterEqual(obj["minReplicaCount"], 1)
                self.assertEqual(obj["maxReplicaCount"], scaling["maxReplicas"])
                # A consumer KEDA cannot read holds the pool at its minimum instead of the maximum.
                self.assertEqual(obj["fallback"]["replicas"], scaling["minReplicas"])
                triggers = obj["triggers"]
                self.assertEqual(
                    sorted(t["metadata"]["consumer"] for t in triggers),
                    sorted(c for t in pool["taskTypes"] for c in pool_consumers(t, values["auth"]["tenants"])),
                )
                for trigger in triggers:
                    self.assertEqual(trigger["type"], "nats-jetstream")
                    self.assertEqual(trigger["metricType"], "AverageValue")
                    meta = trigger["metadata"]
                    self.assertEqual(meta["stream"], "HERMES_TASKS")
                    self.assertEqual(meta["natsServerMonitoringEndpoint"], "nats-headless.nats.svc:8222")
                    self.assertEqual(meta["lagThreshold"], str(scaling["lagThreshold"]))
        hpa = hpas["hermes-pool-compute"]["spec"]
        self.assertEqual(hpa["metrics"][0]["resource"]["name"], "cpu")
        self.assertEqual((hpa["minReplicas"], hpa["maxReplicas"]), (2, 8))

    def test_pool_consumer_names_match_the_topology(self):
        # The Rust topology names pool consumers `pool_<task type with . as _>`
        # (crates/core/src/topology.rs); KEDA must read the same consumer.
        source = (ROOT / "crates" / "core" / "src" / "topology.rs").read_text()
        self.assertIn('format!("pool_{}", task_type.replace(\'.\', "_"))', source)
        self.assertIn('format!("lane_{}__{tenant}", task_type.replace(\'.\', "_"))', source)
        self.assertIn('fn tasks_stream(&self) -> String {\n        self.stream_name("TASKS")', source)

    def test_secrets_and_external_nats_are_wired(self):
        docs, _ = render(load_values("external-nats-values.yaml"))
        deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
        self.assertEqual(
            set(deployments), {"hermes-dispatcher", "hermes-registry", "hermes-memory", "hermes-planner", "hermes-pool-general"}
        )
        for dep_name, dep in deployments.items():
            spec = dep["spec"]["template"]["spec"]
            env = env_of(spec["containers"][0])
            user = nats_user_of(dep_name)
            self.assertEqual(env["HERMES_NATS_URL"], {"secretKeyRef": {"name": f"hermes-nats-{user}", "key": "url"}}, dep_name)
            # A password URL names its user, from which Hermes takes the inbox prefix itself.
            self.assertNotIn("HERMES_NATS_CREDS", env, dep_name)
            self.assertNotIn("HERMES_NATS_INBOX_PREFIX", env, dep_name)
            self.assertEqual(env["HERMES_NATS_REPLICAS"], "3")
            self.assertEqual(env["OTEL_EXPORTER_OTLP_ENDPOINT"], "http://otel-collector.observability.svc:4317")
        planner_env = env_of(deployments["hermes-planner"]["spec"]["template"]["spec"]["containers"][0])
        self.assertEqual(planner_env["HERMES_LLM_API_KEY"], {"secretKeyRef": {"name": "hermes-llm", "key": "api-key"}})
        self.assertEqual(len(by_kind(docs, "ServiceMonitor")), 1)
        self.assertEqual(
            {d["metadata"]["name"] for d in by_kind(docs, "NetworkPolicy")}, {"hermes-default", "hermes-dispatcher", "hermes-egress"}
        )
        pdbs = {d["metadata"]["name"] for d in by_kind(docs, "PodDisruptionBudget")}
        self.assertTrue({"hermes-dispatcher", "hermes-registry", "hermes-planner", "hermes-pool-general"} <= pdbs)
        service = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "hermes-dispatcher")
        self.assertEqual(service["spec"]["type"], "LoadBalancer")

    def test_nats_tls_reaches_every_pod_that_connects_to_nats(self):
        values = load_values("external-nats-values.yaml")
        values["natsTls"] = {"secretName": "hermes-nats-tls", "clientCertificate": True}
        docs, _ = render(values)
        deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
        for dep_name, dep in deployments.items():
            with self.subTest(deployment=dep_name):
                spec = dep["spec"]["template"]["spec"]
                container = spec["containers"][0]
                env = env_of(container)
                self.assertEqual(env["HERMES_NATS_TLS_CA_FILE"], "/etc/hermes/nats-tls/ca.crt")
                self.assertEqual(env["HERMES_NATS_TLS_CERT_FILE"], "/etc/hermes/nats-tls/tls.crt")
                self.assertEqual(env["HERMES_NATS_TLS_KEY_FILE"], "/etc/hermes/nats-tls/tls.key")
                volume = next(v for v in spec["volumes"] if v["name"] == "nats-tls")
                self.assertEqual(volume["secret"]["secretName"], "hermes-nats-tls")
                self.assertEqual({i["key"] for i in volume["secret"]["items"]}, {"ca.crt", "tls.crt", "tls.key"})
                mount = next(m for m in container["volumeMounts"] if m["name"] == "nats-tls")
                self.assertEqual((mount["mountPath"], mount["readOnly"]), ("/etc/hermes/nats-tls", True))
        # The CA alone: TLS without a client certificate.
        values["natsTls"] = {"secretName": "hermes-nats-tls"}
        docs, _ = render(values)
        env = env_of(deployment(docs, "hermes-dispatcher")["spec"]["template"]["spec"]["containers"][0])
        self.assertIn("HERMES_NATS_TLS_CA_FILE", env)
        self.assertNotIn("HERMES_NATS_TLS_CERT_FILE", env)
        # Off by default.
        docs, _ = render(load_values("external-nats-values.yaml"))
        env = env_of(deployment(docs, "hermes-dispatcher")["spec"]["template"]["spec"]["containers"][0])
        self.assertNotIn("HERMES_NATS_TLS_CA_FILE", env)

    def test_dispatcher_timeouts_and_limits_reach_its_environment(self):
        values = load_values("minimal-values.yaml")
        values.setdefault("dispatcher", {}).update({"goalTimeoutSecs": 1234, "nodeTimeoutSecs": 56, "grpcMaxMessageBytes": 8388608})
        docs, _ = render(values)
        dispatcher = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "hermes-dispatcher")
        container = dispatcher["spec"]["template"]["spec"]["containers"][0]
        env = env_of(container)
        # The chart puts the dispatcher's settings in its ConfigMap or its env; either way they
        # must reach the container.
        settings = dict(env)
        for config in config_maps(docs).values():
            settings.update(config)
        self.assertEqual(settings.get("HERMES_GOAL_TIMEOUT_SECS"), "1234")
        self.assertEqual(settings.get("HERMES_NODE_TIMEOUT_SECS"), "56")
        self.assertEqual(settings.get("HERMES_GRPC_MAX_MESSAGE_BYTES"), "8388608")

    def test_the_http_api_gets_a_port_a_service_port_and_an_optional_ingress(self):
        values = load_values("minimal-values.yaml")
        docs, _ = render(values)
        dispatcher = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "hermes-dispatcher")
        container = dispatcher["spec"]["template"]["spec"]["containers"][0]
        self.assertIn({"name": "http", "containerPort": 8080}, container["ports"])
        settings = dict(env_of(container))
        for config in config_maps(docs).values():
            settings.update(config)
        self.assertEqual(settings.get("HERMES_HTTP_LISTEN"), "0.0.0.0:8080")
        service = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "hermes-dispatcher")
        self.assertIn("http", [p["name"] for p in service["spec"]["ports"]])
        self.assertEqual(by_kind(docs, "Ingress"), [], "no Ingress unless asked for")

        values["dispatcher"] = dict(values.get("dispatcher", {}), ingress={"enabled": True, "className": "nginx", "host": "hermes.agents.internal", "tls": [{"secretName": "hermes-tls", "hosts": ["hermes.agents.internal"]}]})
        docs, _ = render(values)
        (ingress,) = by_kind(docs, "Ingress")
        kubernetes_validate.validate(ingress, KUBE_VERSION, strict=True)
        rule = ingress["spec"]["rules"][0]
        self.assertEqual(rule["host"], "hermes.agents.internal")
        backend = rule["http"]["paths"][0]["backend"]["service"]
        self.assertEqual(backend, {"name": "hermes-dispatcher", "port": {"name": "http"}})
        self.assertEqual(ingress["spec"]["ingressClassName"], "nginx")

        values["dispatcher"]["httpPort"] = 0
        docs, _ = render(values)
        settings = {}
        for config in config_maps(docs).values():
            settings.update(config)
        self.assertEqual(settings.get("HERMES_HTTP_LISTEN"), "off")
        self.assertEqual(by_kind(docs, "Ingress"), [])

    def test_a_pool_s_own_api_key_secret_wins(self):
        docs, _ = render(load_values("autoscaled-pools-values.yaml"))
        dep = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "hermes-pool-llm")
        env = env_of(dep["spec"]["template"]["spec"]["containers"][0])
        self.assertEqual(env["HERMES_LLM_API_KEY"], {"secretKeyRef": {"name": "hermes-llm-agents", "key": "api-key"}})
        data = config_maps(docs)["hermes-pool-llm"]
        self.assertEqual(data["HERMES_AGENT_MODEL"], "qwen2.5-32b-instruct")

    def test_a_pool_may_run_its_own_image_and_command(self):
        values = copy.deepcopy(load_values("autoscaled-pools-values.yaml"))
        values["executorPools"][0].update(
            name="python", taskTypes=["web.search"], image="registry.internal/py-workers:1.4",
            command=["python", "-m", "workers.search"])
        docs, _ = render(values)
        deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
        python = deployments["hermes-pool-python"]["spec"]["template"]["spec"]["containers"][0]
        kubernetes_validate.validate(deployments["hermes-pool-python"], KUBE_VERSION, strict=True)
        self.assertEqual(python["image"], "registry.internal/py-workers:1.4")
        self.assertEqual(python["command"], ["python", "-m", "workers.search"])
        env = env_of(python)
        self.assertIn("HERMES_AGENT_ID", env)
        self.assertIn("HERMES_NATS_URL", env)
        # The other pools keep the chart's image and the Rust executor.
        others = [d for name, d in deployments.items() if name.startswith("hermes-pool-") and name != "hermes-pool-python"]
        for other in others:
            container = other["spec"]["template"]["spec"]["containers"][0]
            self.assertEqual(container["command"], ["hermes-executor"])
            self.assertNotEqual(container["image"], "registry.internal/py-workers:1.4")


class SafeByDefault(unittest.TestCase):
    """The chart is safe by default: API auth whenever the dispatcher listens beyond loopback
    (always, in a pod), every Deployment on NATS as its own user, and NetworkPolicies on."""

    def test_api_tokens_are_mounted_from_their_secret_for_the_services_with_an_api(self):
        docs, _ = render(load_values("minimal-values.yaml"))
        dispatcher = deployment(docs, "hermes-dispatcher")
        settings = settings_of(docs, dispatcher)
        self.assertEqual(settings["HERMES_DISPATCHER_API_TOKENS_FILE"], "/etc/hermes/auth/tokens.toml")
        # Auth is on: nothing may also tell it to serve without.
        self.assertNotIn("HERMES_DISPATCHER_ALLOW_UNAUTHENTICATED", settings)
        self.assertNotIn("HERMES_ALLOW_UNAUTHENTICATED", settings)
        # The registry and memory check the same tokens on their own gRPC ports.
        for name in ("hermes-registry", "hermes-memory"):
            with self.subTest(deployment=name):
                self.assertEqual(
                    settings_of(docs, deployment(docs, name))["HERMES_API_TOKENS_FILE"], "/etc/hermes/auth/tokens.toml"
                )
        guarded = {"hermes-dispatcher", "hermes-registry", "hermes-memory"}
        for name in guarded:
            spec = deployment(docs, name)["spec"]["template"]["spec"]
            volumes = {v["name"]: v for v in spec["volumes"]}
            with self.subTest(deployment=name):
                self.assertEqual(
                    volumes["api-tokens"]["secret"],
                    {"secretName": "hermes-api-tokens", "items": [{"key": "tokens.toml", "path": "tokens.toml"}]},
                )
                mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
                self.assertEqual(mounts["api-tokens"], {"name": "api-tokens", "mountPath": "/etc/hermes/auth", "readOnly": True})
        for dep in by_kind(docs, "Deployment"):
            if dep["metadata"]["name"] not in guarded:
                with self.subTest(deployment=dep["metadata"]["name"]):
                    self.assertNotIn("hermes-api-tokens", {name for name, _ in secret_refs(dep)})
        # The key the Secret keeps the file under is the operator's; the path is fixed.
        docs, _ = render({"auth": {"apiTokensSecret": {"name": "api", "key": "hermes.toml"}}})
        volumes = {v["name"]: v for v in deployment(docs, "hermes-dispatcher")["spec"]["template"]["spec"]["volumes"]}
        self.assertEqual(volumes["api-tokens"]["secret"]["items"], [{"key": "hermes.toml", "path": "tokens.toml"}])

    def test_tokens_win_over_allow_unauthenticated(self):
        docs, _ = render({**WITH_TOKENS, "dispatcher": {"allowUnauthenticated": True}})
        settings = settings_of(docs, deployment(docs, "hermes-dispatcher"))
        self.assertEqual(settings["HERMES_DISPATCHER_API_TOKENS_FILE"], "/etc/hermes/auth/tokens.toml")
        self.assertNotIn("HERMES_DISPATCHER_ALLOW_UNAUTHENTICATED", settings)

    def test_serving_without_tokens_takes_an_explicit_allow_unauthenticated(self):
        docs, _ = render({"dispatcher": {"allowUnauthenticated": True}})
        dispatcher = deployment(docs, "hermes-dispatcher")
        settings = settings_of(docs, dispatcher)
        self.assertEqual(settings["HERMES_DISPATCHER_ALLOW_UNAUTHENTICATED"], "true")
        self.assertNotIn("HERMES_DISPATCHER_API_TOKENS_FILE", settings)
        for name in ("hermes-dispatcher", "hermes-registry", "hermes-memory"):
            dep = deployment(docs, name)
            with self.subTest(deployment=name):
                self.assertNotIn("HERMES_API_TOKENS_FILE", settings_of(docs, dep))
                self.assertNotIn("api-tokens", {v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]})

    def test_the_default_values_do_not_render_an_open_api(self):
        chart = helm.Chart.load(str(CHART))
        self.assertFalse(chart.merge_values({})["dispatcher"]["allowUnauthenticated"])
        with self.assertRaises(helm.HelmError) as caught:
            chart.render({}, name="hermes", namespace="agents")
        message = str(caught.exception)
        self.assertIn("auth.apiTokensSecret.name", message)
        self.assertIn("dispatcher.allowUnauthenticated=true", message)

    def test_each_deployment_reads_only_its_own_nats_secret(self):
        cases = {
            # User and password in a URL per service.
            "external-nats-values.yaml": lambda user, pool: {(f"hermes-nats-{user}", "url")},
            # A credentials file per service, and a pool with a user of its own.
            "nats-credentials-values.yaml": lambda user, pool: {
                ("hermes-nats-agent-research" if pool == "research" else f"hermes-nats-{user}", "nats.creds")
            },
        }
        for name, expected in cases.items():
            values = load_values(name)
            docs, _ = render(values)
            nats_secrets = set()
            for dep in by_kind(docs, "Deployment"):
                dep_name = dep["metadata"]["name"]
                pool = dep_name.removeprefix("hermes-pool-") if dep_name.startswith("hermes-pool-") else None
                with self.subTest(values=name, deployment=dep_name):
                    others = {("hermes-llm", "api-key"), ("hermes-llm-agents", "api-key"), ("hermes-api-tokens", "tokens.toml")}
                    own = secret_refs(dep) - others
                    self.assertEqual(own, expected(nats_user_of(dep_name), pool))
                    nats_secrets |= own
            # No two services share one: every Deployment but the pools has a Secret of its own.
            services = [d for d in by_kind(docs, "Deployment") if not d["metadata"]["name"].startswith("hermes-pool-")]
            self.assertEqual(len({frozenset(secret_refs(d)) for d in services}), len(services))

    def test_a_credentials_file_gets_its_user_s_inbox_prefix(self):
        docs, _ = render(load_values("nats-credentials-values.yaml"))
        expected = {
            "hermes-dispatcher": "_INBOX_dispatcher",
            "hermes-registry": "_INBOX_registry",
            "hermes-memory": "_INBOX_memory",
            "hermes-pool-tools": "_INBOX_agent",
            "hermes-pool-research": "_INBOX_agent_research",
        }
        for dep_name, prefix in expected.items():
            with self.subTest(deployment=dep_name):
                dep = deployment(docs, dep_name)
                spec = dep["spec"]["template"]["spec"]
                env = env_of(spec["containers"][0])
                # A credentials file names no user Hermes could take the prefix from.
                self.assertEqual(env["HERMES_NATS_INBOX_PREFIX"], prefix)
                self.assertEqual(env["HERMES_NATS_CREDS"], "/etc/hermes/nats/nats.creds")
                self.assertEqual(env["HERMES_NATS_URL"], "tls://nats.nats.svc:4222")
                mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
                self.assertEqual(mounts["nats-creds"], {"name": "nats-creds", "mountPath": "/etc/hermes/nats", "readOnly": True})
        self.assertTrue(all(p in (ROOT / "deploy" / "nats" / "accounts.conf").read_text() for p in ["_INBOX_dispatcher.>", "_INBOX_agent.>"]))

    def test_without_nats_secrets_every_deployment_uses_the_plain_url(self):
        docs, _ = render(load_values("minimal-values.yaml"))
        for dep in by_kind(docs, "Deployment"):
            with self.subTest(deployment=dep["metadata"]["name"]):
                env = env_of(dep["spec"]["template"]["spec"]["containers"][0])
                self.assertEqual(env["HERMES_NATS_URL"], "nats://nats:4222")
                self.assertFalse({"HERMES_NATS_CREDS", "HERMES_NATS_INBOX_PREFIX"} & set(env))
                self.assertEqual({n for n, _ in secret_refs(dep)} - {"hermes-api-tokens"}, set())

    def test_the_bundled_nats_has_the_production_users_and_an_encrypted_store(self):
        """nats.enabled: the chart's Secret holds a password for each user of accounts.conf, each
        service's URL and the store key; every Deployment connects as its own user; the NATS
        chart's values mount accounts.conf, include it, and take every variable it names and the
        store key from that Secret. Then the pinned nats-server runs the accounts and the store
        block of those values with the Secret's passwords: each service's URL connects,
        anonymous and another user's password are refused, and the store is encrypted."""
        import base64, json, os, re, socket, subprocess, tempfile, time
        values = {**WITH_TOKENS, "nats": {"enabled": True}}
        docs, _ = render(values)
        (secret,) = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == "hermes-nats-hermes"]
        self.assertEqual(secret["metadata"]["annotations"], {"helm.sh/resource-policy": "keep"}, "the store key outlives an uninstall")
        data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        accounts = (ROOT / "deploy" / "nats" / "accounts.conf").read_text()
        self.assertEqual(config_maps(docs)["hermes-nats-hermes"]["accounts.conf"].strip(), accounts.strip())
        passwords = [data[f"{u}-password"] for u in ["sys", "dispatcher", "registry", "planner", "memory", "agent"]]
        self.assertEqual(len(set(passwords)), len(passwords))
        self.assertTrue(all(len(p) >= 32 for p in passwords + [data["jetstream-key"]]))
        for dep in by_kind(docs, "Deployment"):
            user = nats_user_of(dep["metadata"]["name"])
            with self.subTest(deployment=dep["metadata"]["name"]):
                env = env_of(dep["spec"]["template"]["spec"]["containers"][0])
                self.assertEqual(env["HERMES_NATS_URL"], {"secretKeyRef": {"name": "hermes-nats-hermes", "key": f"{user}-url"}})
                self.assertTrue(data[f"{user}-url"].startswith(f"nats://{user}:{data[user + '-password']}@hermes-nats:4222"))

        # The NATS chart's values (rendered by that chart, which this offline check does not have).
        nats = yaml.safe_load((CHART / "values.yaml").read_text())["nats"]
        merge = nats["config"]["merge"]
        self.assertEqual(merge["00$include"], "../hermes-nats/accounts.conf")
        self.assertEqual(nats["container"]["patch"], [{"op": "add", "path": "/volumeMounts/-", "value": {"name": "hermes-nats", "mountPath": "/etc/hermes-nats", "readOnly": True}}])
        (volume,) = [p["value"] for p in nats["podTemplate"]["patch"]]
        self.assertEqual(volume["configMap"]["name"], {"$tplYaml": "{{ .Release.Name }}-nats-hermes"})
        env = nats["container"]["env"]
        named = set(re.findall(r"password:\s*\$([A-Z_]+)", accounts)) | {"JETSTREAM_ENCRYPTION_KEY"}
        self.assertEqual(set(env), named, "every variable accounts.conf and the store block use, and only those")
        for var, ref in env.items():
            ref = ref["valueFrom"]["secretKeyRef"]
            self.assertEqual(ref["name"], {"$tplYaml": "{{ .Release.Name }}-nats-hermes"}, var)
            self.assertIn(ref["key"], data, var)
        self.assertEqual((merge["jetstream"]["cipher"], merge["jetstream"]["key"]), ("chachapoly", "<< $JETSTREAM_ENCRYPTION_KEY >>"))
        self.assertFalse(nats["natsBox"]["enabled"], "nats-box would connect anonymously")

        server = os.environ.get("HERMES_NATS_SERVER_BIN", str(ROOT / ".tools" / "bin" / "nats-server"))
        with tempfile.TemporaryDirectory() as dir:
            dir = pathlib.Path(dir)
            (dir / "accounts.conf").write_text(accounts)
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            marker = "canary-" + base64.b16encode(os.urandom(8)).decode()
            (dir / "nats.conf").write_text(
                f"include ./accounts.conf\nlisten: 127.0.0.1:{port}\n"
                f"jetstream {{ store_dir: {json.dumps(str(dir / 'store'))}, cipher: {merge['jetstream']['cipher']}, key: $JETSTREAM_ENCRYPTION_KEY }}\n"
            )
            by_var = {var: data[ref["valueFrom"]["secretKeyRef"]["key"]] for var, ref in env.items()}
            proc = subprocess.Popen([server, "-c", str(dir / "nats.conf")], env={**os.environ, **by_var}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                def talk(user, password, *lines, until=b"PONG"):
                    return nats_talk(port, user, password, *lines, until=until)
                for user in ["dispatcher", "registry", "planner", "memory", "agent"]:
                    url = data[f"{user}-url"]
                    password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
                    self.assertIn("PONG", talk(user, password), user)
                self.assertIn("Authorization Violation", talk(None, None))
                self.assertIn("Authorization Violation", talk("dispatcher", data["agent-password"]))
                # A stored message: the dispatcher makes a stream and publishes the marker to it.
                create = json.dumps({"name": "HERMES_EVENTS", "subjects": ["hermes.event.>"], "storage": "file"})
                body = f"PUB $JS.API.STREAM.CREATE.HERMES_EVENTS _INBOX_dispatcher.x {len(create)}\r\n{create}"
                created = talk("dispatcher", data["dispatcher-password"], "SUB _INBOX_dispatcher.x 1", body, until=b"stream_create_response")
                self.assertIn('"did_create":true', created)
                published = f"PUB hermes.event.check {len(marker)}\r\n{marker}"
                self.assertIn("PONG", talk("dispatcher", data["dispatcher-password"], published))
                time.sleep(0.3)
            finally:
                proc.terminate()
                proc.wait(timeout=10)
            blocks = list((dir / "store").rglob("HERMES_EVENTS/msgs/*.blk"))
            stored = b"".join(p.read_bytes() for p in blocks)
            self.assertGreater(len(stored), len(marker), "the message is stored")
            self.assertNotIn(marker.encode(), stored, "the store is encrypted")

    def test_identities_make_each_pool_pod_its_own_agent(self):
        """identities.enabled: each pool's pod connects as agent_<pod name> with a token the
        kubelet makes for it; the registry admits exactly the pools' service accounts, with the
        cluster's keys fetched through the API; the bundled NATS includes identities.conf. The
        pinned nats-server loads accounts.conf and identities.conf as the NATS values include
        them, and still lets a service in."""
        import os, socket, subprocess, tempfile
        values = load_values("identities-values.yaml")
        docs, _ = render(values)
        deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
        accounts = {d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")}
        for pool in ("general", "compute"):
            with self.subTest(pool=pool):
                spec = deployments[f"hermes-pool-{pool}"]["spec"]["template"]["spec"]
                self.assertEqual(spec["serviceAccountName"], f"hermes-pool-{pool}")
                self.assertIn(f"hermes-pool-{pool}", accounts)
                container = spec["containers"][0]
                names = [e["name"] for e in container["env"]]
                self.assertEqual(names.count("HERMES_NATS_URL"), 1)
                self.assertLess(names.index("HERMES_AGENT_ID"), names.index("HERMES_NATS_URL"), "$(HERMES_AGENT_ID) expands")
                env = env_of(container)
                self.assertEqual(env["HERMES_NATS_URL"], "nats://agent_$(HERMES_AGENT_ID)@hermes-nats:4222")
                self.assertEqual(env["HERMES_NATS_PASSWORD_FILE"], "/var/run/secrets/hermes/nats-identity/token")
                volume = next(v for v in spec["volumes"] if v["name"] == "nats-identity")
                self.assertEqual(volume["projected"]["sources"],
                                 [{"serviceAccountToken": {"path": "token", "audience": "hermes-nats", "expirationSeconds": 3600}}])
                mount = next(m for m in container["volumeMounts"] if m["name"] == "nats-identity")
                self.assertEqual(mount["mountPath"], "/var/run/secrets/hermes/nats-identity")
        registry = deployments["hermes-registry"]
        settings = settings_of(docs, registry)
        self.assertEqual(settings["HERMES_IDENTITIES_KUBERNETES_SERVICE_ACCOUNTS"], "agents/hermes-pool-general,agents/hermes-pool-compute")
        self.assertEqual(settings["HERMES_IDENTITIES_KUBERNETES_ISSUER"], "https://kubernetes.default.svc.cluster.local")
        self.assertEqual(settings["HERMES_IDENTITIES_KUBERNETES_AUDIENCE"], "hermes-nats")
        self.assertEqual(settings["HERMES_IDENTITIES_KUBERNETES_JWKS_URL"], "https://kubernetes.default.svc/openid/v1/jwks")
        self.assertEqual(settings["HERMES_IDENTITIES_ISSUER_SEED"], {"secretKeyRef": {"name": "hermes-identities", "key": "seed"}})
        spec = registry["spec"]["template"]["spec"]
        kube = next(v for v in spec["volumes"] if v["name"] == "kube")["projected"]["sources"]
        self.assertEqual(kube[0], {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}})
        self.assertEqual(kube[1]["configMap"]["name"], "kube-root-ca.crt")
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "kube")["mountPath"]
        self.assertEqual(settings["HERMES_IDENTITIES_KUBERNETES_CA_FILE"], f"{mount}/ca.crt")
        self.assertEqual(settings["HERMES_IDENTITIES_KUBERNETES_TOKEN_FILE"], f"{mount}/token")
        for name in ("hermes-dispatcher", "hermes-memory"):
            self.assertNotIn("HERMES_IDENTITIES_KUBERNETES_ISSUER", settings_of(docs, deployments[name]), name)
        # The services keep their own users.
        env = env_of(deployments["hermes-dispatcher"]["spec"]["template"]["spec"]["containers"][0])
        self.assertEqual(env["HERMES_NATS_URL"], {"secretKeyRef": {"name": "hermes-nats-hermes", "key": "dispatcher-url"}})
        policy = next(d for d in by_kind(docs, "NetworkPolicy") if d["metadata"]["name"] == "hermes-kubernetes-api")
        self.assertEqual(policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"], "registry")
        self.assertEqual({p["port"] for p in policy["spec"]["egress"][0]["ports"]}, {443, 6443})
        identities = (ROOT / "deploy" / "nats" / "identities.conf").read_text()
        self.assertEqual(config_maps(docs)["hermes-nats-hermes"]["identities.conf"].strip(), identities.strip())
        self.assertEqual(values["nats"]["config"]["merge"]["01$include"], "../hermes-nats/identities.conf")

        # An external server: the pods' user goes into its URL; a pool may stay on a user.
        external = copy.deepcopy(values)
        del external["nats"]
        external["externalNats"] = {"url": "nats://nats-0.nats:4222,nats://nats-1.nats:4222"}
        python = dict(copy.deepcopy(external["executorPools"][0]), name="python", taskTypes=["py.measure"], identity=False,
                      nats={"urlSecret": {"name": "hermes-nats-python", "key": "url"}})
        external["executorPools"].append(python)
        external["externalNats"]["users"] = {u: {"urlSecret": {"name": f"hermes-nats-{u}", "key": "url"}}
                                             for u in ("dispatcher", "registry", "memory", "planner")}
        docs, _ = render(external)
        general = env_of(deployment(docs, "hermes-pool-general")["spec"]["template"]["spec"]["containers"][0])
        self.assertEqual(general["HERMES_NATS_URL"], "nats://agent_$(HERMES_AGENT_ID)@nats-0.nats:4222,nats://nats-1.nats:4222")
        python = env_of(deployment(docs, "hermes-pool-python")["spec"]["template"]["spec"]["containers"][0])
        self.assertEqual(python["HERMES_NATS_URL"], {"secretKeyRef": {"name": "hermes-nats-python", "key": "url"}})
        self.assertNotIn("HERMES_NATS_PASSWORD_FILE", python)
        self.assertEqual(settings_of(docs, deployment(docs, "hermes-registry"))["HERMES_IDENTITIES_KUBERNETES_SERVICE_ACCOUNTS"],
                         "agents/hermes-pool-general,agents/hermes-pool-compute")

        # The pinned nats-server takes both files as the values include them.
        hermes = pathlib.Path(os.environ.get("HERMES_BIN_DIR", ROOT / "target" / "debug")) / "hermes"
        out = subprocess.run([str(hermes), "identities-issuer"], capture_output=True, text=True, check=True)
        issuer = next(l.split("=", 1)[1] for l in out.stdout.splitlines() if l.startswith("HERMES_IDENTITIES_ISSUER="))
        server = os.environ.get("HERMES_NATS_SERVER_BIN", str(ROOT / ".tools" / "bin" / "nats-server"))
        accounts_conf = (ROOT / "deploy" / "nats" / "accounts.conf").read_text()
        with tempfile.TemporaryDirectory() as dir:
            dir = pathlib.Path(dir)
            (dir / "accounts.conf").write_text(accounts_conf)
            (dir / "identities.conf").write_text(identities)
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            (dir / "nats.conf").write_text(f"include ./accounts.conf\ninclude ./identities.conf\nlisten: 127.0.0.1:{port}\n")
            variables = {v: "password-of-" + v.lower() for v in ("NATS_SYS_PASSWORD", "HERMES_DISPATCHER_NATS_PASSWORD",
                         "HERMES_REGISTRY_NATS_PASSWORD", "HERMES_PLANNER_NATS_PASSWORD", "HERMES_MEMORY_NATS_PASSWORD",
                         "HERMES_AGENT_NATS_PASSWORD")}
            log = dir / "nats.log"
            with log.open("wb") as sink:
                proc = subprocess.Popen([server, "-c", str(dir / "nats.conf")], env={**os.environ, **variables,
                                        "HERMES_IDENTITIES_ISSUER": issuer}, stdout=subprocess.DEVNULL, stderr=sink)
            try:
                reply = nats_talk(port, "dispatcher", variables["HERMES_DISPATCHER_NATS_PASSWORD"], server=proc, log=log)
                self.assertIn("PONG", reply, "a service user is let in beside the callout")
            finally:
                proc.terminate()
                proc.wait(timeout=10)

    def test_network_policies_are_on_by_default(self):
        docs, _ = render(WITH_TOKENS)
        policies = {d["metadata"]["name"]: d for d in by_kind(docs, "NetworkPolicy")}
        self.assertEqual(set(policies), {"hermes-default", "hermes-dispatcher", "hermes-egress"})
        for policy in policies.values():
            kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
        base = policies["hermes-default"]["spec"]
        release = {"app.kubernetes.io/name": "hermes", "app.kubernetes.io/instance": "hermes"}
        self.assertEqual(base["podSelector"], {"matchLabels": release})
        self.assertEqual(set(base["policyTypes"]), {"Ingress", "Egress"})
        # Ingress besides the dispatcher's API: only from the release's own pods (no metrics
        # scrapes without networkPolicy.metricsFrom).
        for rule in base["ingress"]:
            self.assertEqual(rule["from"], [{"podSelector": {"matchLabels": release}}])
        egress_ports = {(p["port"], p["protocol"]) for rule in base["egress"] for p in rule["ports"]}
        self.assertTrue({(53, "UDP"), (53, "TCP"), (4222, "TCP")} <= egress_ports)
        api = policies["hermes-dispatcher"]["spec"]
        self.assertEqual(api["podSelector"]["matchLabels"]["app.kubernetes.io/component"], "dispatcher")
        self.assertEqual({p["port"] for p in api["ingress"][0]["ports"]}, {50051, 8080})
        self.assertNotIn("from", api["ingress"][0], "the API is open to any peer by default, guarded by its tokens")
        out = policies["hermes-egress"]["spec"]
        self.assertEqual(out["policyTypes"], ["Egress"])
        self.assertEqual(out["podSelector"]["matchExpressions"], [{"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["registry"]}])
        self.assertEqual(out["egress"], [{"ports": [{"port": 443, "protocol": "TCP"}]}])

    def test_network_policy_peers_and_the_model_s_port_are_used(self):
        docs, _ = render(load_values("external-nats-values.yaml"))
        policies = {d["metadata"]["name"]: d["spec"] for d in by_kind(docs, "NetworkPolicy")}
        monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        metrics = [r for r in policies["hermes-default"]["ingress"] if r["ports"] == [{"port": 9090, "protocol": "TCP"}]]
        self.assertEqual([r["from"] for r in metrics], [monitoring])
        nats = [r for r in policies["hermes-default"]["egress"] if r["ports"] == [{"port": 4222, "protocol": "TCP"}]]
        self.assertEqual(nats[0]["to"], [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "nats"}}}])
        otlp = [r for r in policies["hermes-default"]["egress"] if r["ports"] == [{"port": 4317, "protocol": "TCP"}]]
        self.assertEqual(len(otlp), 1, "the OTLP collector's port")
        self.assertEqual(policies["hermes-dispatcher"]["ingress"][0]["from"], [{"namespaceSelector": {"matchLabels": {"hermes.dev/client": "true"}}}])
        (rule,) = policies["hermes-egress"]["egress"]
        # llm.baseUrl is http://llm-gateway.ai.svc:8000/v1.
        self.assertEqual({p["port"] for p in rule["ports"]}, {443, 8000})
        self.assertEqual(rule["to"], [{"ipBlock": {"cidr": "10.0.0.0/8"}}])
        docs, _ = render({**WITH_TOKENS, "networkPolicy": {"enabled": False}})
        self.assertEqual(by_kind(docs, "NetworkPolicy"), [])


GRPC_TLS = ("HERMES_GRPC_TLS_CERT_FILE", "HERMES_GRPC_TLS_KEY_FILE", "HERMES_GRPC_TLS_CLIENT_CA_FILE")
HTTP_TLS = ("HERMES_DISPATCHER_HTTP_TLS_CERT_FILE", "HERMES_DISPATCHER_HTTP_TLS_KEY_FILE", "HERMES_DISPATCHER_HTTP_TLS_CLIENT_CA_FILE")


def with_tls(**tls):
    return {**WITH_TOKENS, "tls": {"secretName": "hermes-tls", **tls}}


def service(docs, name):
    return next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == name)


def app_protocols(docs, name):
    return {p["name"]: p.get("appProtocol") for p in service(docs, name)["spec"]["ports"]}


class Tls(unittest.TestCase):
    """TLS from Secrets: each server's certificate, key and client CAs mounted read-only where
    its settings point, on the doors the values name; probes, Service ports and the Ingress follow."""

    def assert_serves_tls(self, docs, dep_name, settings_names, mutual):
        dep = deployment(docs, dep_name)
        settings = settings_of(docs, dep)
        cert, key, ca = settings_names
        # Each file the settings name is a key of the Secret, through a read-only mount.
        self.assertEqual(mounted_file(dep, settings[cert]), ("hermes-tls", "tls.crt"), dep_name)
        self.assertEqual(mounted_file(dep, settings[key]), ("hermes-tls", "tls.key"), dep_name)
        if mutual:
            self.assertEqual(mounted_file(dep, settings[ca]), ("hermes-tls", "ca.crt"), dep_name)
        else:
            self.assertNotIn(ca, settings, dep_name)

    def assert_plain(self, docs, dep_name, settings_names):
        settings = settings_of(docs, deployment(docs, dep_name))
        self.assertFalse(set(settings_names) & set(settings), dep_name)

    def test_every_door_serves_tls_from_the_secret_with_mtls(self):
        docs, _ = render(load_values("tls-values.yaml"))
        for dep_name in ["hermes-dispatcher", "hermes-registry", "hermes-memory"]:
            with self.subTest(deployment=dep_name):
                self.assert_serves_tls(docs, dep_name, GRPC_TLS, mutual=True)
                spec = deployment(docs, dep_name)["spec"]["template"]["spec"]
                (volume,) = [v for v in spec["volumes"] if v["name"] == "tls"]
                # Only the three keys, and the key readable by the owner and the pod's fsGroup only.
                self.assertEqual(volume["projected"]["defaultMode"], 0o440)
                self.assertEqual(
                    secret_refs(deployment(docs, dep_name)) - {("hermes-api-tokens", "tokens.toml")},
                    {("hermes-tls", "tls.crt"), ("hermes-tls", "tls.key"), ("hermes-tls", "ca.crt")},
                )
                # The kubelet's grpc probe speaks no TLS: the plain metrics port's /healthz.
                container = spec["containers"][0]
                for probe in ["readinessProbe", "livenessProbe"]:
                    self.assertNotIn("grpc", container[probe])
                    self.assertEqual(container[probe]["httpGet"], {"path": "/healthz", "port": "metrics"})
                self.assertEqual(app_protocols(docs, dep_name)["grpc"], "https")
                self.assertIsNone(app_protocols(docs, dep_name)["metrics"])
        self.assert_serves_tls(docs, "hermes-dispatcher", HTTP_TLS, mutual=True)
        self.assertEqual(app_protocols(docs, "hermes-dispatcher")["http"], "https")
        # Pods that serve nothing but metrics get neither the Secret nor the settings.
        for dep_name in ["hermes-pool-general"]:
            dep = deployment(docs, dep_name)
            self.assertNotIn("hermes-tls", {n for n, _ in secret_refs(dep)})
            self.assert_plain(docs, dep_name, GRPC_TLS + HTTP_TLS)
        # The Ingress re-encrypts: ingress-nginx is told the backend speaks HTTPS.
        (ingress,) = by_kind(docs, "Ingress")
        annotations = ingress["metadata"]["annotations"]
        self.assertEqual(annotations["nginx.ingress.kubernetes.io/backend-protocol"], "HTTPS")
        self.assertEqual(annotations["nginx.ingress.kubernetes.io/proxy-ssl-secret"], "agents/hermes-ingress-client")

    def test_the_doors_follow_their_toggles(self):
        # The defaults: the dispatcher's gRPC and HTTP, not the internal services, no mTLS.
        docs, files = render({**with_tls(), "dispatcher": {"ingress": {"enabled": True}}})
        self.assert_serves_tls(docs, "hermes-dispatcher", GRPC_TLS, mutual=False)
        self.assert_serves_tls(docs, "hermes-dispatcher", HTTP_TLS, mutual=False)
        for dep_name in ["hermes-registry", "hermes-memory"]:
            with self.subTest(deployment=dep_name):
                self.assert_plain(docs, dep_name, GRPC_TLS)
                spec = deployment(docs, dep_name)["spec"]["template"]["spec"]
                self.assertNotIn("tls", {v["name"] for v in spec["volumes"]})
                self.assertIn("grpc", spec["containers"][0]["readinessProbe"])
                self.assertEqual(app_protocols(docs, dep_name)["grpc"], "grpc")
        (ingress,) = by_kind(docs, "Ingress")
        self.assertEqual(ingress["metadata"]["annotations"], {"nginx.ingress.kubernetes.io/backend-protocol": "HTTPS"})
        notes = files["hermes/templates/NOTES.txt"]
        self.assertIn("--server https://localhost:50051", notes)
        self.assertIn("a renewal needs no restart", notes)
        self.assertNotIn("rollout restart", notes)

        # HTTP plain (TLS terminated by the Ingress), gRPC over TLS.
        docs, _ = render({**with_tls(http=False), "dispatcher": {"ingress": {"enabled": True, "annotations": {"a": "b"}}}})
        self.assert_serves_tls(docs, "hermes-dispatcher", GRPC_TLS, mutual=False)
        self.assert_plain(docs, "hermes-dispatcher", HTTP_TLS)
        self.assertEqual(app_protocols(docs, "hermes-dispatcher"), {"grpc": "https", "http": "http", "metrics": None})
        (ingress,) = by_kind(docs, "Ingress")
        self.assertEqual(ingress["metadata"]["annotations"], {"a": "b"})

        # gRPC plain keeps its grpc probes; the values' own annotation wins over the chart's.
        docs, _ = render({**with_tls(grpc=False), "dispatcher": {"ingress": {"enabled": True, "annotations": {"nginx.ingress.kubernetes.io/backend-protocol": "GRPCS"}}}})
        self.assert_plain(docs, "hermes-dispatcher", GRPC_TLS)
        self.assert_serves_tls(docs, "hermes-dispatcher", HTTP_TLS, mutual=False)
        container = deployment(docs, "hermes-dispatcher")["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(container["readinessProbe"]["grpc"]["port"], 50051)
        (ingress,) = by_kind(docs, "Ingress")
        self.assertEqual(ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"], "GRPCS")

        # No HTTP API, no HTTP TLS.
        docs, _ = render({**with_tls(), "dispatcher": {"httpPort": 0}})
        self.assert_plain(docs, "hermes-dispatcher", HTTP_TLS)
        self.assert_serves_tls(docs, "hermes-dispatcher", GRPC_TLS, mutual=False)

        # A client CA Secret of its own, under its own key, lands at the one path the settings name.
        docs, _ = render(with_tls(internal=True, clientCaSecret={"name": "clients-ca", "key": "bundle.pem"}))
        for dep_name in ["hermes-dispatcher", "hermes-registry", "hermes-memory"]:
            dep = deployment(docs, dep_name)
            settings = settings_of(docs, dep)
            self.assertEqual(mounted_file(dep, settings["HERMES_GRPC_TLS_CLIENT_CA_FILE"]), ("clients-ca", "bundle.pem"), dep_name)
        # Without an fsGroup (null removes the default) the files keep the default mode, which the
        # pod's user can read.
        docs, _ = render({**with_tls(), "podSecurityContext": {"fsGroup": None}})
        (volume,) = [v for v in deployment(docs, "hermes-dispatcher")["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
        self.assertNotIn("defaultMode", volume["projected"])

    def test_without_a_secret_every_door_is_plaintext(self):
        docs, files = render(load_values("minimal-values.yaml"))
        for dep in by_kind(docs, "Deployment"):
            with self.subTest(deployment=dep["metadata"]["name"]):
                self.assert_plain(docs, dep["metadata"]["name"], GRPC_TLS + HTTP_TLS)
                self.assertNotIn("tls", {v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]})
        self.assertEqual(app_protocols(docs, "hermes-dispatcher"), {"grpc": "grpc", "http": "http", "metrics": None})
        self.assertIn("--server 127.0.0.1:50051", files["hermes/templates/NOTES.txt"])
        self.assertIn("The API serves plaintext", files["hermes/templates/NOTES.txt"])

    def test_the_settings_are_the_binaries(self):
        # The names the chart sets are those the binaries read (tests/deploy/test_config.py runs
        # every ci values file, tls-values.yaml among them, against `--print-env`).
        self.assertIn("tls-values.yaml", VALUES_FILES)


class Rejections(unittest.TestCase):
    def assert_rejected(self, values, *fragments):
        chart = helm.Chart.load(str(CHART))
        with self.assertRaises(helm.HelmError) as caught:
            chart.validate_schema(values)
            chart.render(values, name="hermes", namespace="agents")
        message = str(caught.exception)
        for fragment in fragments:
            self.assertIn(fragment, message)
        return message

    def pool(self, **changes):
        values = copy.deepcopy(load_values("autoscaled-pools-values.yaml"))
        values["executorPools"][0].update(changes)
        return values

    def test_schema_errors_name_the_field(self):
        self.assert_rejected(self.pool(replicas="two"), "executorPools", "replicas")
        self.assert_rejected(self.pool(taskTypes=["Math Evaluate"]), "executorPools", "taskTypes")
        self.assert_rejected(self.pool(name="Has_Caps"), "executorPools", "name")
        self.assert_rejected(self.pool(maxConcurrency=0), "maxConcurrency")
        self.assert_rejected(self.pool(autoscaling={"mode": "sometimes"}), "autoscaling", "mode")
        self.assert_rejected({"dispatcher": {"replicas": -1}}, "dispatcher", "replicas")
        self.assert_rejected({"dispatcher": {"resources": {"limits": {"cpu": "lots"}}}}, "dispatcher", "cpu")
        self.assert_rejected({"streamReplicas": 2}, "streamReplicas")
        self.assert_rejected({"executorPool": []}, "executorPool")
        self.assert_rejected({"externalNats": {"url": "http://nats:4222"}}, "externalNats", "url")
        self.assert_rejected({"auth": {"tenants": ["team a"]}}, "auth", "tenants")
        no_resources = self.pool()
        del no_resources["executorPools"][0]["resources"]
        self.assert_rejected(no_resources, "executorPools", "resources")

    def test_rules_across_values_fail_with_what_to_change(self):
        values = self.pool()
        values["executorPools"][1]["name"] = values["executorPools"][0]["name"]
        self.assert_rejected(values, 'the pool name "compute" is used twice')
        values = self.pool(taskTypes=["agent.run"])
        values["llm"]["model"] = ""
        self.assert_rejected(values, "executorPools[compute]: agent.run needs a model")
        self.assert_rejected({"planner": {"enabled": True}}, "planner.enabled needs a model")
        values = self.pool(autoscaling={"mode": "hpa", "minReplicas": 5, "maxReplicas": 2})
        self.assert_rejected(values, "minReplicas is above maxReplicas")

    def test_an_open_api_is_refused_with_both_ways_out(self):
        for values in [{}, {"dispatcher": {"allowUnauthenticated": False}}, {"auth": {"apiTokensSecret": {"name": ""}}}]:
            with self.subTest(values=values):
                self.assert_rejected(
                    values,
                    "the dispatcher's API would listen on 0.0.0.0 without authentication",
                    "set auth.apiTokensSecret.name",
                    "dispatcher.allowUnauthenticated=true",
                )

    def test_nats_credentials_are_per_service_or_refused(self):
        users = lambda names: {u: {"urlSecret": {"name": f"nats-{u}"}} for u in names}
        # Some services with credentials, others silently anonymous.
        message = self.assert_rejected(
            {**WITH_TOKENS, "externalNats": {"users": users(["dispatcher", "agent"])}},
            "NATS credentials are set for dispatcher, executorPools[general] but not for registry, memory",
        )
        self.assertNotIn("planner", message, "the planner does not run by default and needs no user")
        # A pool with a user of its own does not make the services' credentials optional.
        pool = dict(load_values("nats-credentials-values.yaml")["executorPools"][1], taskTypes=["http.fetch"])
        self.assert_rejected({**WITH_TOKENS, "executorPools": [pool]}, "NATS credentials are set for executorPools[research] but not for dispatcher, registry, memory")
        # One Secret key for two users makes them one user again.
        same = {u: {"urlSecret": {"name": "nats", "key": "url"}} for u in ["dispatcher", "registry", "memory", "agent"]}
        self.assert_rejected({**WITH_TOKENS, "externalNats": {"users": same}}, "dispatcher and registry use the same Secret key nats/url")
        # The keys that gave every Deployment one user fail, naming the new ones.
        for old in ["urlSecret", "credentialsSecret"]:
            self.assert_rejected({**WITH_TOKENS, "externalNats": {old: {"name": "hermes-nats"}}}, f"externalNats.{old} gave every Deployment the same NATS user", f"externalNats.users.<dispatcher|registry|planner|memory|agent>.{old}")
        self.assert_rejected({**WITH_TOKENS, "externalNats": {"url": "nats://hermes:secret@nats:4222"}}, "externalNats.url carries credentials")
        self.assert_rejected(
            {**WITH_TOKENS, "nats": {"enabled": True}, "externalNats": {"users": users(["dispatcher", "registry", "memory", "agent"])}},
            "externalNats.users.agent, externalNats.users.dispatcher",
            "nats.enabled is true",
        )
        # Every Deployment with its own, several keys of one Secret included, renders.
        shared_secret = {u: {"urlSecret": {"name": "hermes-nats", "key": u}} for u in ["dispatcher", "registry", "memory", "agent"]}
        render({**WITH_TOKENS, "externalNats": {"users": shared_secret}})

    def test_tls_values_that_would_be_ignored_are_refused(self):
        self.assert_rejected({**WITH_TOKENS, "tls": {"clientCaSecret": {"name": "hermes-tls"}}}, "tls.clientCaSecret (mTLS) needs", "tls.secretName")
        self.assert_rejected(with_tls(grpc=False, http=False), "tls.secretName is set but no server uses it")
        self.assert_rejected({**with_tls(grpc=False), "dispatcher": {"httpPort": 0}}, "tls.secretName is set but no server uses it")
        self.assert_rejected(with_tls(internl=True), "tls", "internl")
        self.assert_rejected(with_tls(grpc="yes"), "tls", "grpc")
        render(with_tls(grpc=False, http=False, internal=True))

    def test_identities_need_an_issuer_and_the_pools_own_service_accounts(self):
        values = load_values("identities-values.yaml")
        values["identities"]["issuerSecret"] = ""
        self.assert_rejected(values, "identities.issuerSecret", "hermes identities-issuer")
        values = load_values("identities-values.yaml")
        values["serviceAccount"] = {"create": False}
        self.assert_rejected(values, "serviceAccount.create=true")
        values = load_values("identities-values.yaml")
        values["identities"]["tokenExpirationSeconds"] = 60
        self.assert_rejected(values, "tokenExpirationSeconds")
        values = load_values("identities-values.yaml")
        for pool in values["executorPools"]:
            pool["identity"] = False
        self.assert_rejected(values, "every pool has identity: false")

    def test_network_policy_rules_fail_with_what_to_change(self):
        self.assert_rejected({**WITH_TOKENS, "serviceMonitor": {"enabled": True}}, "set networkPolicy.metricsFrom")
        self.assert_rejected({**WITH_TOKENS, "networkPolicy": {"allowedClients": {"matchLabels": {"a": "b"}}}}, "networkPolicy.apiFrom")
        self.assert_rejected({**WITH_TOKENS, "networkPolicy": {"egressCidrs": ["10.0.0.0/8"]}}, "networkPolicy.egress.to")
        self.assert_rejected({**WITH_TOKENS, "networkPolicy": {"apiFrom": [{"namespaceSelectr": {}}]}}, "networkPolicy", "apiFrom")
        self.assert_rejected({**WITH_TOKENS, "networkPolicy": {"egress": {"ports": ["https"]}}}, "networkPolicy", "ports")


if __name__ == "__main__":
    unittest.main()
