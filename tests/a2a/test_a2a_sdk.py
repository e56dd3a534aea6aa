"""Hermes's A2A 1.0 endpoint driven by an independent client: the official `a2a-sdk` package
(pinned in tests/a2a/requirements.txt), against a real `hermes up` with one agent.

It discovers the agent card, sends a message that becomes a goal and streams it to completion,
resubscribes after a disconnect, resumes after a `Last-Event-ID` with exactly the missing events,
cancels a second task, gets one task for a repeated message id, and answers an approval
(`TASK_STATE_INPUT_REQUIRED`) with a message.

Run by `make test` through scripts/check-a2a.sh (the binaries are built by then).
"""

import asyncio
import json
import os
import pathlib
import subprocess
import tempfile
import unittest
import uuid

import httpx
from google.protobuf import json_format, struct_pb2

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("HERMES_BIN_DIR", ROOT / "target" / "debug")) / "hermes"

AGENTS = """
[defaults]
workspace = "{workspace}"

[[agent]]
id = "a2a-1"
tools = ["time.sleep", "math.evaluate", "fs.write"]
confirm = ["fs.write"]
"""


def sleep_plan(ms):
    return {
        "nodes": [
            {"id": "nap", "task_type": "time.sleep", "inputs": {"ms": ms}},
            {"id": "sum", "task_type": "math.evaluate",
             "inputs": {"expression": "x + 1", "variables": {"x": 41}}, "depends_on": ["nap"]},
        ],
        "output_node": "sum",
    }


def plan_message(plan, message_id=None):
    value = json_format.ParseDict(plan, struct_pb2.Value())
    return Message(message_id=message_id or str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(data=value)])


def text_message(text, task_id):
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, task_id=task_id, parts=[Part(text=text)])


def as_dict(event):
    return json_format.MessageToDict(event)


def state_of(event):
    """The task state a stream response carries, or None (an artifact update)."""
    kind = event.WhichOneof("payload")
    if kind == "task":
        return event.task.status.state
    if kind == "status_update":
        return event.status_update.status.state
    return None


def hermes_seq(event):
    """The Hermes event seq behind a status update (0 for events outside the sequence)."""
    meta = as_dict(event).get("statusUpdate", {}).get("metadata", {}).get("hermesEvent", {})
    return int(meta.get("seq", "0"))


class A2aSdk(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.data = tempfile.TemporaryDirectory()
        workspace = pathlib.Path(cls.data.name) / "workspace"
        workspace.mkdir()
        agents = pathlib.Path(cls.data.name) / "agents.toml"
        agents.write_text(AGENTS.format(workspace=workspace))
        cls.up = subprocess.Popen(
            [str(BIN), "up", "--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--agents-config", str(agents), "--data-dir", str(pathlib.Path(cls.data.name) / "data")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, HERMES_LLM_PROVIDER="none"), cwd=cls.data.name,
        )
        http = None
        for line in cls.up.stdout:
            if line.startswith("hermes up: grpc"):
                http = line.split(" http ")[1].split()[0]
                break
        if http is None:
            cls.up.kill()
            raise RuntimeError("hermes up did not become ready")
        cls.base = f"http://{http}"

    @classmethod
    def tearDownClass(cls):
        cls.up.kill()
        cls.up.wait()
        cls.data.cleanup()

    def run_async(self, coroutine):
        return asyncio.run(asyncio.wait_for(coroutine, timeout=120))

    async def card_and_client(self, http, streaming=True):
        # The agent registers a moment after `hermes up` is ready: wait for its skills.
        for _ in range(100):
            card = await A2ACardResolver(http, self.base).get_agent_card()
            if "time.sleep" in [s.id for s in card.skills]:
                break
            await asyncio.sleep(0.1)
        client = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http)).create(card)
        return card, client

    def test_the_agent_card_lists_the_live_task_types_and_the_json_rpc_interface(self):
        async def go():
            async with httpx.AsyncClient(timeout=30) as http:
                card, _ = await self.card_and_client(http)
                skills = [s.id for s in card.skills]
                for task_type in ["plan", "time.sleep", "math.evaluate", "fs.write"]:
                    self.assertIn(task_type, skills)
                write = next(s for s in card.skills if s.id == "fs.write")
                self.assertIn("needs-approval", write.tags)
                self.assertTrue(card.capabilities.streaming)
                interface = card.supported_interfaces[0]
                self.assertEqual(interface.protocol_binding, "JSONRPC")
                self.assertEqual(interface.protocol_version, "1.0")
                self.assertEqual(interface.url, f"{self.base}/a2a")
        self.run_async(go())

    def test_a_message_becomes_a_goal_streamed_to_completion_with_its_output(self):
        async def go():
            async with httpx.AsyncClient(timeout=60) as http:
                _, client = await self.card_and_client(http)
                events = [e async for e in client.send_message(SendMessageRequest(message=plan_message(sleep_plan(500))))]
                self.assertEqual(events[0].WhichOneof("payload"), "task")
                task_id = events[0].task.id
                self.assertTrue(task_id.startswith("g-"))
                self.assertEqual(state_of(events[-1]), TaskState.TASK_STATE_COMPLETED)
                artifacts = [e.artifact_update.artifact for e in events if e.WhichOneof("payload") == "artifact_update"]
                self.assertEqual(len(artifacts), 1)
                output = json_format.MessageToDict(artifacts[0].parts[0].data)
                self.assertEqual(output, {"value": 42.0})
                seqs = [hermes_seq(e) for e in events if hermes_seq(e)]
                self.assertEqual(seqs, sorted(set(seqs)), "events repeated or out of order")
                # Every update is of this task.
                for e in events[1:]:
                    body = as_dict(e)
                    update = body.get("statusUpdate") or body.get("artifactUpdate")
                    self.assertEqual(update["taskId"], task_id)
                task = await client.get_task(GetTaskRequest(id=task_id))
                self.assertEqual(task.status.state, TaskState.TASK_STATE_COMPLETED)
                self.assertEqual(json_format.MessageToDict(task.artifacts[0].parts[0].data), {"value": 42.0})
        self.run_async(go())

    def test_resubscribe_after_a_disconnect_goes_on_to_the_end(self):
        async def go():
            async with httpx.AsyncClient(timeout=60) as http:
                _, client = await self.card_and_client(http)
                stream = client.send_message(SendMessageRequest(message=plan_message(sleep_plan(3000))))
                first = await anext(stream)
                await stream.aclose()  # the client drops the connection mid-goal
                task_id = first.task.id
                again = [e async for e in client.subscribe(SubscribeToTaskRequest(id=task_id))]
                self.assertEqual(again[0].WhichOneof("payload"), "task")
                self.assertEqual(again[0].task.id, task_id)
                self.assertEqual(again[0].task.status.state, TaskState.TASK_STATE_WORKING)
                snapshot_seq = int(as_dict(again[0])["task"]["metadata"]["hermes"]["eventSeq"])
                seqs = [hermes_seq(e) for e in again[1:] if hermes_seq(e)]
                self.assertTrue(all(s > snapshot_seq for s in seqs), (snapshot_seq, seqs))
                self.assertEqual(seqs, sorted(set(seqs)))
                self.assertEqual(state_of(again[-1]), TaskState.TASK_STATE_COMPLETED)
        self.run_async(go())

    def test_last_event_id_resumes_with_exactly_the_missing_events(self):
        async def go():
            async with httpx.AsyncClient(timeout=60) as http:
                _, client = await self.card_and_client(http)
                events = [e async for e in client.send_message(SendMessageRequest(message=plan_message(sleep_plan(10))))]
                task_id = events[0].task.id
                # The whole stream, from the start (Last-Event-ID 0 is "after nothing").
                whole = await self.raw_stream(http, task_id, last_event_id=0)
                ids = [i for i, _ in whole if i]
                self.assertEqual(ids, list(range(1, ids[-1] + 1)))
                cut = ids[len(ids) // 2]
                resumed = await self.raw_stream(http, task_id, last_event_id=cut)
                self.assertEqual([i for i, _ in resumed if i], [i for i in ids if i > cut])
        self.run_async(go())

    async def raw_stream(self, http, task_id, last_event_id):
        """SubscribeToTask over plain SSE: [(id, JSON-RPC response)]."""
        request = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task_id}}
        out, current = [], None
        headers = {"Last-Event-ID": str(last_event_id), "A2A-Version": "1.0"}
        async with http.stream("POST", f"{self.base}/a2a", json=request, headers=headers) as response:
            self.assertEqual(response.status_code, 200)
            self.assertIn("text/event-stream", response.headers["content-type"])
            async for line in response.aiter_lines():
                if line.startswith("id:"):
                    current = int(line[3:].strip())
                elif line.startswith("data:"):
                    out.append((current, json.loads(line[5:])))
                    current = None
        return out

    def test_a_second_task_is_cancelled_and_a_repeated_message_is_one_task(self):
        async def go():
            async with httpx.AsyncClient(timeout=60) as http:
                _, client = await self.card_and_client(http, streaming=False)
                message_id = str(uuid.uuid4())
                config = SendMessageConfiguration(return_immediately=True)
                sent = []
                for _ in range(2):
                    request = SendMessageRequest(message=plan_message(sleep_plan(30_000), message_id), configuration=config)
                    sent += [e async for e in client.send_message(request)]
                self.assertEqual(sent[0].task.id, sent[1].task.id, "one message id must give one task")
                task_id = sent[0].task.id
                cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
                self.assertEqual(cancelled.status.state, TaskState.TASK_STATE_CANCELED)
                task = await client.get_task(GetTaskRequest(id=task_id))
                self.assertEqual(task.status.state, TaskState.TASK_STATE_CANCELED)
                with self.assertRaises(TaskNotCancelableError):
                    await client.cancel_task(CancelTaskRequest(id=task_id))
                with self.assertRaises(TaskNotFoundError):
                    await client.get_task(GetTaskRequest(id="g-00000000000000000000000000000000"))
        self.run_async(go())

    def test_an_invalid_plan_is_refused_with_the_reason(self):
        async def go():
            async with httpx.AsyncClient(timeout=60) as http:
                _, client = await self.card_and_client(http, streaming=False)
                cyclic = {"nodes": [
                    {"id": "a", "task_type": "math.evaluate", "inputs": {"expression": "1"}, "depends_on": ["b"]},
                    {"id": "b", "task_type": "math.evaluate", "inputs": {"expression": "1"}, "depends_on": ["a"]},
                ]}
                with self.assertRaises(InvalidParamsError) as refused:
                    async for _ in client.send_message(SendMessageRequest(message=plan_message(cyclic))):
                        pass
                self.assertIn("cycle", str(refused.exception))
        self.run_async(go())

    def test_an_approval_is_input_required_and_a_reply_approves_it(self):
        async def go():
            async with httpx.AsyncClient(timeout=60) as http:
                _, client = await self.card_and_client(http)
                plan = {"nodes": [{"id": "w", "task_type": "fs.write",
                                   "inputs": {"path": "approved.txt", "content": "yes"}}]}
                events = [e async for e in client.send_message(SendMessageRequest(message=plan_message(plan)))]
                self.assertEqual(state_of(events[-1]), TaskState.TASK_STATE_INPUT_REQUIRED)
                task_id = events[0].task.id
                last = as_dict(events[-1])
                # The approval may already stand in the first event, the task itself.
                asked = (last.get("statusUpdate") or last.get("task"))["status"]["message"]
                self.assertIn("fs.write", asked["parts"][0]["text"])
                self.assertEqual(asked["parts"][1]["data"]["tool"], "fs.write")
                task = await client.get_task(GetTaskRequest(id=task_id))
                self.assertEqual(task.status.state, TaskState.TASK_STATE_INPUT_REQUIRED)
                # Anything but approve or deny is refused, naming the call.
                with self.assertRaises(InvalidParamsError) as refused:
                    async for _ in client.send_message(SendMessageRequest(message=text_message("maybe", task_id))):
                        pass
                self.assertIn("approve", str(refused.exception))
                replies = [e async for e in client.send_message(SendMessageRequest(message=text_message("approve", task_id)))]
                self.assertEqual(state_of(replies[-1]), TaskState.TASK_STATE_COMPLETED)
        self.run_async(go())


if __name__ == "__main__":
    unittest.main()
