"""A Python worker on its own NATS identity (docs/security.md, "Per-agent NATS identities"):
`hermes up` with an `[[agent]]` entry in its API tokens file, and the worker connecting as
`agent_<id>` with that entry's token. Such a worker may not touch the ledger bucket or the
artifact store; it reaches its tasks' entries and artifacts through the memory service with each
task's token. A goal passes large outputs between Rust and Python nodes, a side effect runs
once, a task that crashes the worker twice is quarantined, and the bucket itself is refused.
"""

import asyncio
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

import hermes_agents as hermes
from test_stack import BIN, HERE, hermes_up, stop_up, wait_for


TOKEN = "token-of-team-id"
AGENT = "py-id"

AGENTS = """
[defaults]
workspace = "{workspace}"

[[agent]]
id = "rust-id"
tools = ["math.evaluate", "text.template"]
"""

LINE = "row-{{ i }}-" + "x" * 40 + "\n"


class Identity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        root = pathlib.Path(cls.dir.name)
        out = subprocess.run([str(BIN), "agent-token", AGENT], capture_output=True, text=True, timeout=30,
                             check=True)
        agent_token = out.stdout.strip()
        entry = out.stderr.split("\n\n")[1]
        assert entry.startswith("[[agent]]"), out.stderr
        tokens = root / "tokens.toml"
        tokens.write_text(f"""
[[token]]
name = "ops"
sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"
tenant = "team-id"
roles = ["submitter", "viewer"]

{entry}
""")
        cls.up, ready = hermes_up(root, AGENTS, "--dispatcher-api-tokens-file", str(tokens))
        cls.grpc = ready[3]
        cls.client = hermes.Client(cls.grpc, token=TOKEN)
        lock = (root / "data" / "nats" / "hermes-up.lock").read_text()
        port = next(line.split()[1] for line in lock.splitlines() if line.startswith("port "))
        cls.url = f"nats://agent_{AGENT}:{agent_token}@127.0.0.1:{port}"
        cls.log = root / "ship.log"
        cls.stderr = (root / "worker.log").open("w")
        # The password from a file read at every connect, as a pod's token is (the chart's way).
        password = root / "password"
        password.write_text(agent_token + "\n")
        env = dict(os.environ, WORKER_ID=AGENT, NATS_URL=f"nats://agent_{AGENT}@127.0.0.1:{port}",
                   HERMES_NATS_PASSWORD_FILE=str(password), SHIP_LOG=str(cls.log),
                   TASKS="py.measure,py.ship,test.abort", MAX_CONCURRENCY="1", ACK_WAIT_S="5")
        cls.worker = subprocess.Popen([sys.executable, str(HERE / "worker_app.py")], env=env,
                                      stdout=subprocess.DEVNULL, stderr=cls.stderr)

        def listed():
            out = subprocess.run([str(BIN), "agents", "--server", cls.grpc, "--token", TOKEN], capture_output=True,
                                 text=True, timeout=30)
            return AGENT in out.stdout

        wait_for(listed, timeout=60, what=f"{AGENT} registered")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.worker.kill()
        cls.worker.wait()
        cls.stderr.close()
        stop_up(cls.up)
        cls.dir.cleanup()

    def worker_log(self):
        return (pathlib.Path(self.dir.name) / "worker.log").read_text()

    def test_large_outputs_and_a_side_effect_go_through_the_memory_service(self):
        # A Rust node's 280 KB text reaches the Python node through memory, and its 560 KB output
        # is stored through memory in two parts (over 512 KiB) and read back by a Rust node; the
        # side effect's step is recorded in the goal's ledger entries through memory, once.
        plan = hermes.Plan(nodes=[
            hermes.Node("big", "text.template", {"template": "{% for i in range(6000) %}" + LINE + "{% endfor %}"}),
            hermes.Node("py", "py.measure", {"text": {"$ref": "big.text"}}),
            hermes.Node("c", "text.template", {"template": "{{ lines }} {{ twice | length }} {{ twice[:6] }}",
                                               "values": {"lines": {"$ref": "py.lines"}, "twice": {"$ref": "py.twice"}}}),
            hermes.Node("ship", "py.ship", {"order": {"$ref": "c.text"}}),
        ], output_node="ship")
        goal = self.client.wait(self.client.submit(plan), timeout_s=90)
        self.assertEqual(goal.status, "completed", (goal.error, self.worker_log()))
        text_len = len("".join(LINE.replace("{{ i }}", str(i)) for i in range(6000)))
        self.assertGreater(2 * text_len, 512 * 1024)
        self.assertEqual(goal.node("c").output["text"], f"6000 {2 * text_len} row-0-")
        self.assertEqual(goal.node("py").agent_id, AGENT)
        stub = goal.node("py").output
        self.assertTrue(stub["$artifact"].startswith("art-"), stub)
        self.assertGreater(stub["size_bytes"], 2 * text_len)
        # Stored as the goal's, in its tenant: the client reads it back through the goal.
        self.assertEqual(self.client.resolve(goal.goal_id, stub)["lines"], 6000)
        self.assertEqual(goal.output["agent"], AGENT)
        self.assertEqual(self.log.read_text().count(f"6000 {2 * text_len} row-0- by {AGENT}"), 1)
        self.assertNotIn("permissions violation", self.worker_log().lower())

    def test_the_ledger_bucket_and_the_artifact_store_are_refused_to_the_identity(self):
        import nats

        async def reach():
            refused = []

            async def error_cb(e):
                refused.append(str(e))

            nc = await nats.connect(self.url, inbox_prefix=f"_INBOX_agent_{AGENT}", error_cb=error_cb)
            js = nc.jetstream(timeout=2)
            outcomes = {}
            for what, attempt in (("the ledger bucket", lambda: js.key_value("hermes_ledger")),
                                  ("the artifact store", lambda: js.object_store("hermes_artifacts"))):
                try:
                    await attempt()
                    outcomes[what] = "reached"
                except Exception as e:  # noqa: BLE001 - any refusal will do; a reach fails the test
                    outcomes[what] = type(e).__name__
            await nc.close()
            return outcomes, refused

        outcomes, refused = asyncio.run(reach())
        self.assertNotIn("reached", outcomes.values(), outcomes)
        self.assertTrue(any("permissions violation" in r.lower() for r in refused), refused)

    def test_a_task_that_crashes_the_worker_twice_is_quarantined(self):
        # Its crash markers are counted through memory with the task's token, which the
        # supervisor was told with the task.
        goal = self.client.wait(self.client.submit({"nodes": [{"id": "s", "task_type": "test.abort", "inputs": {}}]}),
                                timeout_s=120)
        self.assertEqual(goal.status, "failed")
        error = goal.node("s").error
        self.assertEqual(error["code"], "POISON_MESSAGE", (error, self.worker_log()))
        self.assertIn("crashed its consumer", error["message"])
        self.assertIsNone(self.worker.poll(), "the worker's supervisor exited")
        self.assertNotIn("cannot count a crash", self.worker_log())


if __name__ == "__main__":
    unittest.main()
