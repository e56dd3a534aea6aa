"""hermes-agents against a real `hermes up` (a nats-server, the dispatcher, the registry and one
Rust agent): the client's calls, a Python node between two Rust nodes, typed failures, kill -9 of
a Python worker mid-task with its side effect done once, and drain on SIGTERM.

Run by `make test` through scripts/check-python.sh (the binaries are built by then).
"""

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import hermes_agents as hermes
from hermes_agents import errors

ROOT = pathlib.Path(__file__).resolve().parents[3]
BIN = pathlib.Path(os.environ.get("HERMES_BIN_DIR", ROOT / "target" / "debug")) / "hermes"
HERE = pathlib.Path(__file__).resolve().parent

AGENTS = """
[defaults]
workspace = "{workspace}"

[[agent]]
id = "rust-1"
tools = ["math.evaluate", "text.template", "time.sleep", "fs.write"]
confirm = ["fs.write"]
"""


class Spans:
    """An OTLP/gRPC trace receiver: every span exported to it, with its service's name."""

    def __init__(self):
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.spans = []
        spans = self.spans

        class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                for resource in request.resource_spans:
                    service = next((a.value.string_value for a in resource.resource.attributes
                                    if a.key == "service.name"), "")
                    for scope in resource.scope_spans:
                        spans.extend((service, span) for span in scope.spans)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def of_trace(self, trace_id_hex):
        return [(service, span) for service, span in list(self.spans) if span.trace_id.hex() == trace_id_hex]


def nats_url(data_dir):
    """The URL, with its password, of the nats-server the `hermes up` on `data_dir` started."""
    out = subprocess.run([str(BIN), "nats-url", "--data-dir", str(data_dir)], capture_output=True, text=True,
                         timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"hermes nats-url: {out.stderr}")
    return out.stdout.strip()


def wait_for(check, timeout=30.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


#: One Rust agent that serves only `math.evaluate`, for stacks whose tests bring their own workers.
ANCHOR_AGENTS = """
[defaults]
workspace = "{workspace}"

[[agent]]
id = "anchor"
tools = ["math.evaluate"]
"""


def hermes_up(root, agents_text, *args, **env):
    """Starts `hermes up` on `root` (a temporary directory) with `agents_text` as its agents file
    (`{workspace}` filled in), no HTTP door and no model, plus `args` and `env`; waits until it
    serves. Returns the process and its ready line's words (`[3]` the gRPC address, `[5]` NATS)."""
    root = pathlib.Path(root)
    (root / "workspace").mkdir(exist_ok=True)
    agents = root / "agents.toml"
    agents.write_text(agents_text.format(workspace=root / "workspace"))
    up = subprocess.Popen(
        [str(BIN), "up", "--grpc-listen", "127.0.0.1:0", "--http-listen", "off", "--agents-config", str(agents),
         "--data-dir", str(root / "data"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=dict(os.environ, HERMES_LLM_PROVIDER="none", **env), cwd=root)
    for line in up.stdout:
        if line.startswith("hermes up: grpc"):
            return up, line.split()
    up.kill()
    raise RuntimeError("hermes up did not become ready")


def stop_up(up):
    """Stops a `hermes up` (SIGTERM, then SIGKILL after 20 s)."""
    up.terminate()
    try:
        up.wait(timeout=20)
    except subprocess.TimeoutExpired:
        up.kill()


class Stack(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        root = pathlib.Path(cls.dir.name)
        # Traces of the whole stack, the workers' included, go to one OTLP receiver.
        cls.spans = Spans()
        cls.otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{cls.spans.port}",
                    "OTEL_BSP_SCHEDULE_DELAY": "200"}
        cls.up, ready = hermes_up(root, AGENTS, HERMES_DISPATCHER__WEBHOOKS__ALLOW="127.0.0.1",
                                  HERMES_DISPATCHER__WEBHOOKS__SCHEDULE="0s,300ms,300ms", **cls.otel)
        cls.grpc = ready[3]
        # The local nats-server refuses anonymous clients: `hermes nats-url` gives its URL with
        # the password, as docs/python.md says.
        cls.nats = nats_url(root / "data")
        assert cls.nats.endswith("@" + ready[5].removeprefix("nats://")), (cls.nats, ready)
        cls.workers = {}
        cls.start_worker("py-1", TASKS="py.double,py.fail,py.nap,py.stamp,py.shape,py.measure")
        cls.client = hermes.Client(cls.grpc)
        wait_for(lambda: "py-1" in cls.agents(), what="py-1 in hermes agents")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        for proc in cls.workers.values():
            proc.kill()
            proc.wait()
        stop_up(cls.up)
        cls.spans.server.stop(None)
        cls.dir.cleanup()

    @classmethod
    def start_worker(cls, agent_id, stderr=subprocess.DEVNULL, **env):
        log = pathlib.Path(cls.dir.name) / "ship.log"
        environment = dict(os.environ, WORKER_ID=agent_id, NATS_URL=cls.nats, SHIP_LOG=str(log), **cls.otel,
                           **{k: str(v) for k, v in env.items()})
        cls.workers[agent_id] = subprocess.Popen([sys.executable, str(HERE / "worker_app.py")], env=environment,
                                                 stdout=subprocess.DEVNULL, stderr=stderr)
        return cls.workers[agent_id]

    @classmethod
    def agents(cls):
        """`hermes agents`, as a person would run it."""
        out = subprocess.run([str(BIN), "agents", "--server", cls.grpc], capture_output=True, text=True, timeout=30)
        return out.stdout

    def test_a_worker_joining_a_pool_with_other_consumer_settings_says_so(self):
        # py-1 created the pool's consumers with a 30 s ack wait; a worker that wants 7 s binds
        # to them as they are, and warns once, naming what is in effect.
        log = pathlib.Path(self.dir.name) / "py-ack.err"
        with open(log, "w") as err:
            worker = self.start_worker("py-ack", stderr=err, TASKS="py.double", ACK_WAIT_S="7")
        try:
            wait_for(lambda: "py-ack" in self.agents(), what="py-ack registered")
            warnings = [line for line in log.read_text().splitlines() if "exist with other settings" in line]
            self.assertEqual(len(warnings), 1, log.read_text())
            self.assertIn("ack_wait: 30.0 (wanted 7.0)", warnings[0])
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            del self.workers["py-ack"]

    def test_a_python_worker_is_listed_like_any_agent(self):
        listing = self.agents()
        row = next(line for line in listing.splitlines() if line.startswith("py-1 "))
        self.assertIn("python", row)
        self.assertIn("py.double", row)
        self.assertIn("rust-1", listing)

    def test_a_python_node_between_two_rust_nodes_passes_refs_through(self):
        plan = hermes.Plan(nodes=[
            hermes.Node("a", "math.evaluate", {"expression": "20 + 1"}),
            hermes.Node("b", "py.double", {"value": {"$ref": "a.value"}}),
            hermes.Node("c", "math.evaluate", {"expression": "x + 0.5", "variables": {"x": {"$ref": "b.value"}}}),
        ], output_node="c")
        goal_id = self.client.submit(plan)
        goal = self.client.wait(goal_id, timeout_s=60)
        self.assertEqual(goal.status, "completed", goal.error)
        self.assertEqual(goal.output["value"], 42.5)
        self.assertEqual(goal.node("b").agent_id, "py-1")
        self.assertEqual(goal.node("b").output, {"value": 42.0})
        self.assertEqual(goal.node("a").agent_id, "rust-1")
        # One trace: the Python worker's span sits in the goal's trace, under a span of Hermes's,
        # beside the Rust agent's.
        self.assertTrue(goal.trace_id)

        def python_span():
            return [s for service, s in self.spans.of_trace(goal.trace_id)
                    if service == "hermes-py-worker" and s.name == "task py.double"]

        (span,) = wait_for(python_span, what="the Python worker's span in the goal's trace")
        attributes = {a.key: a.value for a in span.attributes}
        self.assertEqual(attributes["node_id"].string_value, "b")

        def hermes_parent():
            # The Rust services export in batches too: wait for the parent's batch.
            return [s for service, s in self.spans.of_trace(goal.trace_id)
                    if service != "hermes-py-worker" and s.span_id == span.parent_span_id]

        (parent,) = wait_for(hermes_parent, what="the Python span's parent, a Hermes span of the same trace")
        self.assertTrue(parent.name)

    LINE = "row-{{ i }}-abcdefghijklmnopqrstuvwxyz0123456789\n"

    def large_outputs_plan(self):
        # A Rust node's 90 KB text, measured by a Python node into 180 KB, read by a Rust node.
        return hermes.Plan(nodes=[
            hermes.Node("big", "text.template", {"template": "{% for i in range(2000) %}" + self.LINE + "{% endfor %}"}),
            hermes.Node("py", "py.measure", {"text": {"$ref": "big.text"}}),
            hermes.Node("c", "text.template", {"template": "{{ lines }} {{ twice | length }} {{ twice[:6] }}",
                                               "values": {"lines": {"$ref": "py.lines"}, "twice": {"$ref": "py.twice"}}}),
        ], output_node="c")

    def test_large_outputs_travel_as_artifacts_between_rust_and_python_nodes(self):
        # The Rust node's 90 KB text is offloaded as an artifact; the Python node receives the
        # text itself, and its own 180 KB output is offloaded in turn, read back by a Rust node
        # both whole and at a path.
        goal = self.client.wait(self.client.submit(self.large_outputs_plan()), timeout_s=60)
        self.assertEqual(goal.status, "completed", goal.error)
        text_len = len("".join(self.LINE.replace("{{ i }}", str(i)) for i in range(2000)))
        self.assertGreater(text_len, 64 * 1024)
        self.assertEqual(goal.output["text"], f"2000 {2 * text_len} row-0-")
        for node in ("big", "py"):
            stub = goal.node(node).output
            self.assertTrue(stub["$artifact"].startswith("art-"), (node, stub))
            self.assertTrue(goal.node(node).raw.memory_ref, node)
        self.assertEqual(goal.node("py").agent_id, "py-1")
        self.assertEqual(goal.node("py").output["size_bytes"] > 2 * text_len, True)
        # The client reads them back through the goal: raw, and put in place of their stubs.
        reference = goal.node("py").output["$artifact"]
        measured = json.loads(self.client.artifact(goal.goal_id, reference))
        self.assertEqual((measured["lines"], len(measured["twice"])), (2000, 2 * text_len))
        self.assertEqual(self.client.resolve(goal.goal_id, {"m": goal.node("py").output}), {"m": measured})
        self.assertEqual(self.client.resolve(goal.goal_id, goal.node("big").output)["text"][:6], "row-0-")
        self.assertEqual(self.client.resolve(goal.goal_id, goal.output), goal.output)

        async def read_async():
            async with hermes.AsyncClient(self.grpc) as client:
                return await client.resolve(goal.goal_id, goal.node("py").output)

        self.assertEqual(asyncio.run(read_async()), measured)
        # Only through the goal that made it: another goal's artifact is not found.
        other = self.client.wait(self.client.submit({"nodes": [{"id": "n", "task_type": "math.evaluate",
                                                                "inputs": {"expression": "1"}}]}), timeout_s=60)
        with self.assertRaises(hermes.errors.NotFound):
            self.client.artifact(other.goal_id, reference)

    def test_a_goal_with_python_nodes_replays_from_its_record(self):
        # `hermes replay` runs the goal again in a fresh stack of its own, whose one agent serves
        # the built-in tools: with `--tools recorded` the record answers the Python node.
        plan = hermes.Plan(nodes=[
            hermes.Node("a", "math.evaluate", {"expression": "3 * 7"}),
            hermes.Node("b", "py.double", {"value": {"$ref": "a.value"}}),
            hermes.Node("c", "math.evaluate", {"expression": "x - 2", "variables": {"x": {"$ref": "b.value"}}}),
        ], output_node="c")
        goal = self.client.wait(self.client.submit(plan), timeout_s=60)
        self.assertEqual(goal.status, "completed", goal.error)

        def replay(goal_id, tools):
            return subprocess.run([str(BIN), "replay", goal_id, "--server", self.grpc, "--tools", tools,
                                   "--workspace", self.dir.name], capture_output=True, text=True, timeout=180,
                                  env=dict(os.environ, HERMES_LLM_PROVIDER="none"))

        recorded = replay(goal.goal_id, "recorded")
        self.assertEqual(recorded.returncode, 0, recorded.stdout + recorded.stderr)
        # Run live, the fresh stack has no agent serving the Python task type, and says so.
        live = replay(goal.goal_id, "live")
        self.assertNotEqual(live.returncode, 0, live.stdout)
        self.assertIn("unknown task type `py.double`", live.stderr)
        self.assertIn("--tools recorded", live.stderr)

        # Outputs kept as artifacts: the Python node's 180 KB is served from the record by
        # content (read through GetGoalArtifact), the Rust node after it reads the served output,
        # and both runs' outputs compare by content, though every artifact reference is new.
        large = self.client.wait(self.client.submit(self.large_outputs_plan()), timeout_s=60)
        self.assertEqual(large.status, "completed", large.error)
        self.assertTrue(large.node("py").raw.memory_ref)
        recorded = replay(large.goal_id, "recorded")
        self.assertEqual(recorded.returncode, 0, recorded.stdout + recorded.stderr)
        self.assertIn("no divergence", recorded.stdout)
        self.assertIn("1 tool calls served from the record", recorded.stdout)

    def test_exceptions_become_typed_results(self):
        plan = {"nodes": [{"id": "f", "task_type": "py.fail", "inputs": {"kind": "permanent"}}]}
        goal = self.client.wait(self.client.submit(plan), timeout_s=60)
        self.assertEqual(goal.status, "failed")
        self.assertEqual(goal.node("f").error["code"], "TOOL_ERROR")
        self.assertIn("ValueError: no such order", goal.node("f").error["message"])
        # A declared retryable exception is retried by the dispatcher, then fails as retryable.
        plan = {"nodes": [{"id": "t", "task_type": "py.fail", "inputs": {"kind": "transient"}, "max_retries": 1}]}
        goal = self.client.wait(self.client.submit(plan), timeout_s=60)
        self.assertEqual(goal.status, "failed")
        node = goal.node("t")
        self.assertEqual(node.error["code"], "UNAVAILABLE")
        self.assertEqual(node.attempt, 2)
        self.assertTrue(node.raw.error.retryable)

    def test_the_client_submits_watches_cancels_and_raises_typed_errors(self):
        plan = hermes.Plan.from_yaml(
            "nodes:\n  - {id: nap, task_type: time.sleep, inputs: {ms: 30000}}\n")
        key = f"py-client-{time.time()}"
        goal_id = self.client.submit(plan, idempotency_key=key)
        self.assertEqual(self.client.submit(plan, idempotency_key=key), goal_id)
        self.assertIn(goal_id, [g.goal_id for g in self.client.list(limit=50)])
        events = self.client.watch(goal_id)
        first = next(events)
        self.assertEqual((first.seq, first.kind), (1, "goal_accepted"))
        # Resuming after the first event gives exactly the events after it.
        resumed = next(self.client.watch(goal_id, after_seq=1))
        self.assertEqual(resumed.seq, 2)
        cancelled = self.client.cancel(goal_id, reason="test")
        self.assertEqual(cancelled.status, "cancelled")
        kinds = [e.kind for e in events]
        self.assertEqual(kinds[-1], "goal_cancelled")
        with self.assertRaises(errors.NotFound):
            self.client.get("g-does-not-exist")
        with self.assertRaises(errors.PlanInvalid) as bad:
            self.client.submit({"nodes": [{"id": "x", "task_type": "no.such-type", "inputs": {}}]})
        self.assertIn("no.such-type", str(bad.exception))
        with self.assertRaises(errors.InvalidArgument):
            self.client.submit()
        with self.assertRaises(errors.Timeout):
            self.client.wait(self.client.submit(plan), timeout_s=0.2)

    def test_a_callback_is_accepted_by_the_standardwebhooks_package(self):
        import http.server
        import threading

        from standardwebhooks import Webhook

        got = []

        class Receiver(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                got.append((dict(self.headers), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/hook"
            plan = hermes.Plan.from_yaml("nodes:\n  - {id: sum, task_type: math.evaluate, inputs: {expression: '6*7'}}\n")
            goal_id = self.client.submit(plan, callbacks=[url])
            self.assertEqual(len(goal_id.callback_secrets), 1)
            secret = goal_id.callback_secrets[0]
            wait_for(lambda: got, what="the webhook")
            headers, body = got[0]
            # The specification's reference verifier accepts it, and refuses a changed body.
            payload = Webhook(secret).verify(body, headers)
            self.assertEqual((payload["type"], payload["data"]["goal_id"]), ("goal.completed", goal_id))
            with self.assertRaises(Exception):
                Webhook(secret).verify(body.replace(b"completed", b"failed"), headers)
            self.assertTrue(hermes.webhooks.verify(secret, headers, body))
            self.assertFalse(hermes.webhooks.verify(secret, headers, body + b" "))
            wait_for(lambda: [d.state for d in self.client.webhook_deliveries(goal_id=goal_id)] == ["delivered"],
                     what="the delivery recorded as delivered")
            # A standing endpoint: made, listed without its secret, rotated, removed.
            created = self.client.create_webhook(url, events=["goal.failed"])
            self.assertTrue(created.secret.startswith("whsec_"))
            listed = self.client.list_webhooks()
            self.assertEqual([(e.id, list(e.secrets)) for e in listed], [(created.endpoint.id, [])])
            rotated = self.client.rotate_webhook_secret(created.endpoint.id)
            self.assertNotEqual(rotated.secret, created.secret)
            self.client.delete_webhook(created.endpoint.id)
            self.assertEqual(self.client.list_webhooks(), [])
            with self.assertRaises(errors.InvalidArgument):
                self.client.submit(plan, callbacks=["ftp://example.com/x"])
        finally:
            server.shutdown()
            server.server_close()

    def test_inputs_are_checked_against_the_workers_schema_and_outputs_against_its_own(self):
        # The dispatcher validates a node's inputs against the schema the worker published.
        with self.assertRaises(errors.PlanInvalid) as bad:
            self.client.submit({"nodes": [{"id": "d", "task_type": "py.double", "inputs": {"value": "ten"}}]})
        self.assertIn("value", str(bad.exception))
        good = self.client.wait(self.client.submit({"nodes": [{"id": "o", "task_type": "py.shape",
                                                               "inputs": {"total": 3}}]}), timeout_s=60)
        self.assertEqual(good.status, "completed", good.error)
        bad_output = self.client.wait(self.client.submit({"nodes": [{"id": "o", "task_type": "py.shape",
                                                                     "inputs": {"total": "three"}}]}), timeout_s=60)
        self.assertEqual(bad_output.node("o").error["code"], "TOOL_ERROR")
        self.assertIn("output.total is str, not number", bad_output.node("o").error["message"])

    def test_a_redelivered_side_effect_task_is_answered_from_the_ledger(self):
        import asyncio

        import nats

        from hermes_agents._proto.hermes.v1 import task_pb2

        log = pathlib.Path(self.dir.name) / "ship.log"
        goal_id = f"g-ledger-{int(time.time() * 1000)}"
        task = task_pb2.TaskMessage(goal_id=goal_id, node_id="s", task_id=f"{goal_id}.s.1", attempt=1,
                                    task_type="py.stamp", inputs_json='{"order": "o-99"}', result_token="t")

        async def publish_twice():
            # The same task, delivered twice (as a redelivery would): the second finds the claim.
            nc = await nats.connect(self.nats)
            js = nc.jetstream()
            for copy in ("a", "b"):
                await js.publish("hermes.task.pool.py.stamp", task.SerializeToString(),
                                 headers={"Nats-Msg-Id": f"{goal_id}-{copy}"})
                await asyncio.sleep(1.0)
            await nc.close()

        asyncio.run(publish_twice())
        wait_for(lambda: log.exists() and "stamp o-99" in log.read_text(), what="the stamp")
        time.sleep(2.0)
        self.assertEqual(log.read_text().count("stamp o-99"), 1, "the side effect happened twice")

    def test_approvals_are_decided_from_the_client(self):
        def write(path):
            return {"nodes": [{"id": "w", "task_type": "fs.write", "inputs": {"path": path, "content": "ok"}}]}

        def call_id(goal_id):
            for event in self.client.watch(goal_id):
                if event.kind == "approval_required":
                    return event.data["call_id"]
            raise AssertionError("no approval was asked for")

        approved = self.client.submit(write("approved.txt"))
        self.client.approve(approved, call_id(approved), note="fine")
        self.assertEqual(self.client.wait(approved, timeout_s=60).status, "completed")
        denied = self.client.submit(write("denied.txt"))
        self.client.deny(denied, call_id(denied), note="not today")
        goal = self.client.wait(denied, timeout_s=60)
        self.assertEqual(goal.status, "failed")
        self.assertEqual(goal.node("w").error["code"], "DENIED")
        self.assertIn("not today", goal.node("w").error["message"])
        workspace = pathlib.Path(self.dir.name) / "workspace"
        self.assertTrue((workspace / "approved.txt").exists())
        self.assertFalse((workspace / "denied.txt").exists())
        with self.assertRaises(errors.NotFound):
            self.client.approve(approved, "no-such-call")

    def test_the_async_client(self):
        async def run():
            async with hermes.AsyncClient(self.grpc) as client:
                goal_id = await client.submit({"nodes": [{"id": "d", "task_type": "py.double", "inputs": {"value": 4}}]})
                kinds = [e.kind async for e in client.watch(goal_id)]
                goal = await client.wait(goal_id, timeout_s=30)
                return kinds, goal

        kinds, goal = asyncio.run(run())
        self.assertEqual(goal.output, {"value": 8})
        self.assertEqual(kinds[0], "goal_accepted")
        self.assertEqual(kinds[-1], "goal_completed")

    def test_kill_9_mid_task_completes_elsewhere_with_the_side_effect_once(self):
        log = pathlib.Path(self.dir.name) / "ship.log"
        victim = self.start_worker("py-victim", TASKS="py.ship", SHIP_SLEEP_S=4, ACK_WAIT_S=3)
        wait_for(lambda: "py-victim" in self.agents(), what="py-victim registered")
        # py-1 does not serve py.ship; only py-victim does, so the task goes to it.
        goal_id = self.client.submit({"nodes": [{"id": "s", "task_type": "py.ship", "inputs": {"order": "o-17"}}]})
        wait_for(lambda: log.exists() and "o-17" in log.read_text(), what="the side effect")
        time.sleep(0.5)  # its outcome recorded; the task sleeps on
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.start_worker("py-rescue", TASKS="py.ship", SHIP_SLEEP_S=0, ACK_WAIT_S=3)
        goal = self.client.wait(goal_id, timeout_s=120)
        self.assertEqual(goal.status, "completed", goal.error)
        self.assertEqual(goal.node("s").agent_id, "py-rescue")
        lines = log.read_text().splitlines()
        self.assertEqual([line for line in lines if line.startswith("o-17 ")], ["o-17 by py-victim"],
                         "the side effect happened again")
        # The rescue's output is the victim's recorded outcome: the line it wrote.
        self.assertEqual(goal.output["line"], lines.index("o-17 by py-victim") + 1)

    def test_sighup_leaves_a_supervised_worker_serving(self):
        # SIGHUP asks a process to read its files again. The supervisor forwards it, and neither
        # it nor its worker ends (the signal's default action would have ended both).
        worker = self.start_worker("py-hup", TASKS="py.hup-nap")
        wait_for(lambda: "py-hup" in self.agents(), what="py-hup registered")
        goal_id = self.client.submit({"nodes": [{"id": "n", "task_type": "py.hup-nap", "inputs": {"ms": 1500}}]})
        wait_for(lambda: self.client.get(goal_id).node("n").status == "dispatched", what="the nap to be dispatched")
        worker.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        worker.send_signal(signal.SIGHUP)
        goal = self.client.wait(goal_id, timeout_s=60)
        self.assertEqual(goal.status, "completed", goal.error)
        self.assertEqual((goal.node("n").agent_id, goal.node("n").attempt), ("py-hup", 1))
        self.assertIsNone(worker.poll(), "the supervisor ended on SIGHUP")
        worker.send_signal(signal.SIGTERM)
        self.assertEqual(worker.wait(timeout=30), 0)

    def test_sigterm_drains_running_work_then_leaves(self):
        import socket
        import urllib.request

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        worker = self.start_worker("py-drain", TASKS="py.drain-nap", HERMES_METRICS_LISTEN=f"127.0.0.1:{port}")
        wait_for(lambda: "py-drain" in self.agents(), what="py-drain registered")
        # The chart's probes: /healthz answers 200 while the worker serves.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as health:
            self.assertEqual(health.status, 200)
        goal_id = self.client.submit({"nodes": [{"id": "n", "task_type": "py.drain-nap", "inputs": {"ms": 3000}}]})
        wait_for(lambda: self.client.get(goal_id).node("n").status == "dispatched", what="the nap to be dispatched")
        time.sleep(1.0)  # pulled and started: the nap takes 3 s
        worker.send_signal(signal.SIGTERM)
        goal = self.client.wait(goal_id, timeout_s=60)
        self.assertEqual(goal.status, "completed", goal.error)
        self.assertEqual(goal.node("n").agent_id, "py-drain")
        self.assertEqual(goal.node("n").attempt, 1)
        self.assertEqual(worker.wait(timeout=30), 0)
        wait_for(lambda: "py-drain" not in self.agents(), what="py-drain to leave the registry")

    def test_the_examples_run(self):
        examples = ROOT / "examples" / "python"
        worker = subprocess.Popen([sys.executable, str(examples / "worker.py")],
                                  env=dict(os.environ, HERMES_NATS_URL=self.nats), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: "py-words" in self.agents(), what="the example worker registered")
            out = subprocess.run([sys.executable, str(examples / "client.py"), "--server", self.grpc],
                                 capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("goal_completed", out.stdout)
            self.assertIn("completed: {'text': '11 words; most common:", out.stdout)
        finally:
            worker.terminate()
            worker.wait(timeout=30)
        # The HTTP tool example needs the network: it is only compiled here.
        import py_compile

        py_compile.compile(str(examples / "http_tool.py"), doraise=True)


if __name__ == "__main__":
    unittest.main()
