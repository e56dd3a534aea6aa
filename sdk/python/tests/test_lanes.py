"""Tenants' lanes against a real `hermes up` with API tokens (docs/security.md, "Fair dispatch"):
a tenant's tasks that no worker had a free slot for wait in the tenant's own lane of the pool,
and a Python worker, which learns the tenants from the lanes bucket, serves them.
"""

import concurrent.futures
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

import hermes_agents as hermes
from test_stack import ANCHOR_AGENTS, BIN, HERE, hermes_up, nats_url, stop_up, wait_for


TOKEN = "token-of-team-py"

TOKENS = f"""
[[token]]
name = "py"
sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"
tenant = "team-py"
roles = ["submitter", "viewer"]

[[tenant]]
name = "team-py"
weight = 2
"""


class Lanes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        root = pathlib.Path(cls.dir.name)
        tokens = root / "tokens.toml"
        tokens.write_text(TOKENS)
        cls.up, ready = hermes_up(root, ANCHOR_AGENTS, "--dispatcher-api-tokens-file", str(tokens))
        cls.grpc = ready[3]
        cls.client = hermes.Client(cls.grpc, token=TOKEN)
        env = dict(os.environ, WORKER_ID="py-lanes", NATS_URL=nats_url(root / "data"), TASKS="py.nap",
                   MAX_CONCURRENCY="1")
        cls.worker = subprocess.Popen([sys.executable, str(HERE / "worker_app.py")], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def listed():
            out = subprocess.run([str(BIN), "agents", "--server", cls.grpc, "--token", TOKEN], capture_output=True,
                                 text=True, timeout=30)
            return "py-lanes" in out.stdout

        wait_for(listed, timeout=60, what="py-lanes registered")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.worker.kill()
        cls.worker.wait()
        stop_up(cls.up)
        cls.dir.cleanup()

    def test_a_python_worker_serves_its_tenants_lane(self):
        plan = {"nodes": [{"id": "nap", "task_type": "py.nap", "inputs": {"ms": 300}}]}
        # One slot: the first goal's task goes to the worker, the others wait in team-py's lane.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            goals = list(pool.map(lambda _: self.client.submit(plan), range(4)))
        subjects = []
        for goal in goals:
            self.assertEqual(self.client.wait(goal, timeout_s=60).status, "completed", goal)
            for event in self.client.watch(goal):
                if event.kind == "task_dispatched":
                    subjects.append((event.data.get("subject", ""), event.data.get("agent_id", "")))
        self.assertIn(("hermes.task.lane.team-py.py.nap", ""), subjects, subjects)


if __name__ == "__main__":
    unittest.main()
