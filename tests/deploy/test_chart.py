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
VALUES_FILES = ["minimal-values.yaml", "external-nats-values.yaml", "autoscaled-pools-values.yaml"]
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
                    sorted(pool_consumer(t) for t in pool["taskTypes"]),
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
        self.assertIn('fn tasks_stream(&self) -> String {\n        self.stream_name("TASKS")', source)

    def test_secrets_and_external_nats_are_wired(self):
        docs, _ = render(load_values("external-nats-values.yaml"))
        deployments = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
        for dep in deployments.values():
            spec = dep["spec"]["template"]["spec"]
            env = env_of(spec["containers"][0])
            self.assertEqual(env["HERMES_NATS_URL"], {"secretKeyRef": {"name": "hermes-nats", "key": "url"}})
            self.assertEqual(env["HERMES_NATS_CREDS"], "/etc/hermes/nats/hermes.creds")
            self.assertEqual(env["HERMES_NATS_REPLICAS"], "3")
            self.assertEqual(env["OTEL_EXPORTER_OTLP_ENDPOINT"], "http://otel-collector.observability.svc:4317")
            volumes = {v["name"]: v for v in spec["volumes"]}
            self.assertEqual(volumes["nats-creds"]["secret"]["secretName"], "hermes-nats-creds")
        planner_env = env_of(deployments["hermes-planner"]["spec"]["template"]["spec"]["containers"][0])
        self.assertEqual(planner_env["HERMES_LLM_API_KEY"], {"secretKeyRef": {"name": "hermes-llm", "key": "api-key"}})
        self.assertEqual(len(by_kind(docs, "ServiceMonitor")), 1)
        self.assertEqual(len(by_kind(docs, "NetworkPolicy")), 2)
        pdbs = {d["metadata"]["name"] for d in by_kind(docs, "PodDisruptionBudget")}
        self.assertTrue({"hermes-dispatcher", "hermes-registry", "hermes-planner", "hermes-pool-general"} <= pdbs)
        service = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "hermes-dispatcher")
        self.assertEqual(service["spec"]["type"], "LoadBalancer")

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
        # The dispatcher refuses 0.0.0.0 with auth off unless told that is meant.
        self.assertEqual(settings.get("HERMES_ALLOW_UNAUTHENTICATED"), "true")
        closed = dict(values, dispatcher=dict(values.get("dispatcher", {}), allowUnauthenticated=False))
        closed_settings = {}
        for config in config_maps(render(closed)[0]).values():
            closed_settings.update(config)
        self.assertNotIn("HERMES_ALLOW_UNAUTHENTICATED", closed_settings)
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


if __name__ == "__main__":
    unittest.main()
