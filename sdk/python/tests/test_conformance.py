"""The conformance suite: one set of behavioural tests, run against the Rust executor (`hermes
agent`) and against the Python worker, each in a `hermes up` of its own whose only agent of the
task type under test (`time.sleep`, which both serve) is the kind being tested. Wherever the two
differ, the Python side is the bug.

- routing by capability and load: two agents of the kind share four tasks;
- cancellation: a cancelled goal's task stops and frees its agent at once;
- a malformed task message goes to the DLQ;
- drain on SIGTERM: the running task completes, the agent exits 0 and leaves the registry;
- crash quarantine: a task that aborts its agent's process (`test.abort`) fails its node
  `POISON_MESSAGE` and goes to the DLQ, and the restarted agent serves other goals;
- failover after kill -9: a killed agent's task completes on another agent (last: the killed
  agent stays in the registry until its TTL).

Side effects exactly once are tested for each kind in its own terms: `ctx.once` in
test_stack.py, the ledger of the Rust tools in tests/tests/e2e (ledger_kill).
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


def sleep_plan(ms):
    return {"nodes": [{"id": "s", "task_type": "time.sleep", "inputs": {"ms": ms}}]}


class Conformance:
    """The tests; a subclass says how to start an agent of its kind."""

    kind = ""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        root = pathlib.Path(cls.dir.name)
        cls.up, ready = hermes_up(root, ANCHOR_AGENTS)
        cls.grpc = ready[3]
        cls.nats = nats_url(root / "data")
        cls.client = hermes.Client(cls.grpc)
        cls.agents_started = []

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        for proc in cls.agents_started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stop_up(cls.up)
        cls.dir.cleanup()

    def agent(self, agent_id, max_concurrency=2):
        """Starts an agent of this kind serving `time.sleep`, in a process group of its own, and
        waits until the registry lists it."""
        proc = self.start(agent_id, max_concurrency)
        self.agents_started.append(proc)
        wait_for(lambda: agent_id in self.listing(), timeout=60, what=f"{agent_id} registered")
        return proc

    def listing(self):
        out = subprocess.run([str(BIN), "agents", "--server", self.grpc], capture_output=True, text=True, timeout=30)
        return out.stdout

    def node(self, goal_id):
        return self.client.get(goal_id).node("s")

    def routed_to(self, goal_id):
        """The agent the node's first attempt was routed to, from its `task_dispatched` event."""
        for event in self.client.watch(goal_id):
            if event.kind == "task_dispatched":
                return event.data.get("agent_id", "")
        return ""

    def test_1_routing_by_capability_and_load(self):
        self.agent(f"{self.kind}-a")
        self.agent(f"{self.kind}-b")
        goals = [self.client.submit(sleep_plan(1500)) for _ in range(4)]
        done = [self.client.wait(g, timeout_s=60) for g in goals]
        self.assertTrue(all(g.status == "completed" for g in done), [g.error for g in done])
        ran_on = [g.node("s").agent_id for g in done]
        # Only agents that serve time.sleep, never the anchor; and the load is shared.
        self.assertEqual(set(ran_on), {f"{self.kind}-a", f"{self.kind}-b"}, ran_on)
        self.stop(f"{self.kind}-a", f"{self.kind}-b")

    def test_2_a_cancelled_goal_frees_its_agent(self):
        self.agent(f"{self.kind}-c", max_concurrency=1)
        goal_id = self.client.submit(sleep_plan(30000))
        wait_for(lambda: self.node(goal_id).status == "dispatched", what="the long sleep dispatched")
        time.sleep(1.0)
        self.assertEqual(self.client.cancel(goal_id).status, "cancelled")
        # One slot: the next task runs only once the cancelled one stopped.
        started = time.monotonic()
        quick = self.client.wait(self.client.submit(sleep_plan(100)), timeout_s=60)
        self.assertEqual(quick.status, "completed", quick.error)
        self.assertEqual(quick.node("s").agent_id, f"{self.kind}-c")
        self.assertLess(time.monotonic() - started, 15, "the cancelled task kept its slot")
        self.stop(f"{self.kind}-c")

    def test_6_failover_after_kill_9(self):
        victim = self.agent(f"{self.kind}-victim")
        goal_id = self.client.submit(sleep_plan(4000))
        self.assertEqual(self.routed_to(goal_id), f"{self.kind}-victim")
        time.sleep(1.5)  # pulled and running: the sleep takes 4 s
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        killed = time.monotonic()
        self.assertNotEqual(self.client.get(goal_id).status, "completed", "the sleep ended before the kill")
        self.agent(f"{self.kind}-rescue")
        goal = self.client.wait(goal_id, timeout_s=120)
        self.assertEqual(goal.status, "completed", goal.error)
        self.assertEqual(goal.node("s").agent_id, f"{self.kind}-rescue")
        self.assertGreater(time.monotonic() - killed, 3, "completed before the kill")
        self.stop(f"{self.kind}-rescue")

    def test_3_a_malformed_task_goes_to_the_dlq(self):
        import asyncio

        import nats

        self.agent(f"{self.kind}-poison")

        async def publish():
            nc = await nats.connect(self.nats)
            js = nc.jetstream()
            await js.publish("hermes.task.pool.time.sleep", b"\xff\xfe not a TaskMessage",
                             headers={"Nats-Msg-Id": f"poison-{self.kind}"})
            await nc.close()

        asyncio.run(publish())

        def dead_letter():
            out = subprocess.run([str(BIN), "dlq", "list", "--server", self.grpc], capture_output=True, text=True,
                                 timeout=30).stdout
            return [line for line in out.splitlines() if "hermes.task.pool.time.sleep" in line]

        (line,) = wait_for(dead_letter, what="the malformed task in the DLQ")
        self.assertIn("hermes.dlq.task", line)
        self.stop(f"{self.kind}-poison")

    def test_4_drain_on_sigterm(self):
        agent = self.agent(f"{self.kind}-drain")
        goal_id = self.client.submit(sleep_plan(6000))
        self.assertEqual(self.routed_to(goal_id), f"{self.kind}-drain")
        # Pulled and running by now (the sleep takes 6 s): a task routed to an agent that drains
        # before pulling it is handed back, which is another test's matter.
        time.sleep(2.5)
        # A signal to the group reaches a supervised agent twice (directly and forwarded by its
        # supervisor), and a terminal's Ctrl-C does too: a repeat this close is one request.
        os.killpg(agent.pid, signal.SIGTERM)
        time.sleep(0.2)
        os.killpg(agent.pid, signal.SIGTERM)
        goal = self.client.wait(goal_id, timeout_s=60)
        self.assertEqual(goal.status, "completed", goal.error)
        self.assertEqual((goal.node("s").agent_id, goal.node("s").attempt), (f"{self.kind}-drain", 1))
        self.assertEqual(agent.wait(timeout=60), 0)
        wait_for(lambda: f"{self.kind}-drain" not in self.listing(), what="the agent to leave the registry")

    def test_5_a_task_that_crashes_its_agent_is_quarantined(self):
        agent = self.agent(f"{self.kind}-crash", max_concurrency=1)
        goal = self.client.wait(self.client.submit({"nodes": [{"id": "s", "task_type": "test.abort", "inputs": {}}]}),
                                timeout_s=120)
        self.assertEqual(goal.status, "failed")
        error = goal.node("s").error
        self.assertEqual(error["code"], "POISON_MESSAGE", error)
        self.assertIn("crashed its consumer", error["message"])
        # The supervisor restarted the agent, which still serves.
        self.assertIsNone(agent.poll(), "the agent's supervisor exited")
        quick = self.client.wait(self.client.submit(sleep_plan(100)), timeout_s=60)
        self.assertEqual(quick.status, "completed", quick.error)
        self.assertEqual(quick.node("s").agent_id, f"{self.kind}-crash")
        self.stop(f"{self.kind}-crash")

    def stop(self, *agent_ids):
        """Stops agents with SIGTERM, so later tests do not share their work."""
        for proc in list(self.agents_started):
            if proc.poll() is None and proc.args_id in agent_ids:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
        wait_for(lambda: not any(a in self.listing() for a in agent_ids), timeout=60, what="the agents to leave")


class RustExecutor(Conformance, unittest.TestCase):
    kind = "rust"

    def start(self, agent_id, max_concurrency):
        workspace = pathlib.Path(self.dir.name) / "workspace"
        proc = subprocess.Popen(
            [str(BIN), "agent", "--nats-url", self.nats, "--agent-id", agent_id, "--agent-tools", "time.sleep,test.abort",
             "--agent-workspace", str(workspace), "--agent-heartbeat-ms", "1000", "--agent-ack-wait-secs", "5",
             "--agent-max-concurrency", str(max_concurrency)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env=dict(os.environ, HERMES_TEST_TOOLS="1"))
        proc.args_id = agent_id
        return proc


class PythonWorker(Conformance, unittest.TestCase):
    kind = "python"

    def start(self, agent_id, max_concurrency):
        env = dict(os.environ, WORKER_ID=agent_id, NATS_URL=self.nats, TASKS="time.sleep,test.abort", ACK_WAIT_S="5",
                   MAX_CONCURRENCY=str(max_concurrency), SHIP_LOG=str(pathlib.Path(self.dir.name) / "ship.log"))
        proc = subprocess.Popen([sys.executable, str(HERE / "worker_app.py")], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        proc.args_id = agent_id
        return proc


if __name__ == "__main__":
    unittest.main()
