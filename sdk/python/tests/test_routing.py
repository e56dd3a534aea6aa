"""Routing by latency and health against a real `hermes up` (docs/routing.md, "Latency and
health"): three Python workers serve `py.work`; one is made slow and one made to fail with its
own `INTERNAL` errors mid-run. Traffic leaves both within a few seconds (the failing one cools
off, `hermes agents` says so), and comes back to both once they are well again.
"""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import hermes_agents as hermes
from test_stack import ANCHOR_AGENTS, BIN, HERE, hermes_up, nats_url, stop_up, wait_for


WORKERS = ("steady", "slowed", "failing")


class RoutingHealth(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        root = pathlib.Path(cls.dir.name)
        cls.up, ready = hermes_up(root, ANCHOR_AGENTS)
        cls.grpc = ready[3]
        nats = nats_url(root / "data")
        cls.client = hermes.Client(cls.grpc)
        cls.behaviour = {}
        cls.workers = []
        for worker in WORKERS:
            cls.behaviour[worker] = root / f"{worker}.behaviour"
            cls.behaviour[worker].write_text("ok")
            env = dict(os.environ, WORKER_ID=worker, NATS_URL=nats, TASKS="py.work", MAX_CONCURRENCY="4",
                       BEHAVIOUR_FILE=str(cls.behaviour[worker]))
            cls.workers.append(subprocess.Popen([sys.executable, str(HERE / "worker_app.py")], env=env,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                start_new_session=True))
        for worker in WORKERS:
            wait_for(lambda w=worker: w in cls.agents(), timeout=60, what=f"{worker} registered")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        for proc in cls.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stop_up(cls.up)
        cls.dir.cleanup()

    @classmethod
    def agents(cls):
        out = subprocess.run([str(BIN), "agents", "--server", cls.grpc], capture_output=True, text=True, timeout=30)
        return out.stdout

    def first_attempts(self, goals):
        """(submitted at, agent) of each node's first attempt, from the goals' events."""
        routed = []
        for submitted, goal in goals:
            for event in self.client.watch(goal):
                if event.kind == "task_dispatched" and event.data.get("attempt", 1) == 1:
                    routed.append((submitted, event.data.get("agent_id", "")))
        return routed

    def traffic(self, seconds, until=None):
        """Submits a goal of four `py.work` nodes every 0.25 s for `seconds` (or until `until`,
        given where the goals so far went, says stop); returns where their first attempts went,
        by seconds since the start."""
        start = time.monotonic()
        goals = []
        while time.monotonic() - start < seconds:
            plan = {"nodes": [{"id": f"w{i}", "task_type": "py.work", "inputs": {"n": i}} for i in range(4)]}
            goals.append((time.monotonic() - start, self.client.submit(plan)))
            time.sleep(0.25)
            if until is not None and len(goals) % 8 == 0 and until(self.first_attempts(goals[-8:])):
                break
        return self.first_attempts(goals)

    def test_traffic_leaves_a_slow_and_a_failing_worker_and_comes_back(self):
        warm = self.traffic(3.0)
        self.assertEqual({a for _, a in warm}, set(WORKERS), warm)

        self.behaviour["slowed"].write_text("slow")
        self.behaviour["failing"].write_text("fail")
        sick = self.traffic(4.5)
        # Within a few seconds: the failing worker is in cool-off (5 s), the slow one shunned.
        settled = [a for t, a in sick if t >= 2.0]
        self.assertGreater(len(settled), 20, sick)
        self.assertEqual(settled.count("failing"), 0, settled)
        self.assertLessEqual(settled.count("slowed"), len(settled) // 10, settled)
        listing = self.agents()
        failing_line = next(line for line in listing.splitlines() if line.startswith("failing"))
        self.assertIn("cool-off", failing_line, listing)

        # Well again: its cool-off over, one probe brings the failing worker back; the slow one's
        # latency fades (over about 10 s) until it is worth sending to again.
        self.behaviour["slowed"].write_text("ok")
        self.behaviour["failing"].write_text("ok")
        back = self.traffic(40.0, until=lambda recent: {"slowed", "failing"} <= {a for _, a in recent})
        recent = [a for _, a in back[-32:]]
        self.assertIn("failing", recent, back)
        self.assertIn("slowed", recent, back)
        self.assertIn("ok", next(line for line in self.agents().splitlines() if line.startswith("failing")))


if __name__ == "__main__":
    unittest.main()
