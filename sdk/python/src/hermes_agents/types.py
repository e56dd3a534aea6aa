"""The typed surface of the client: plans to submit, and goals, nodes and events as they come
back. Each returned object keeps the protobuf message it was read from in `raw`."""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field
from typing import Any

from hermes_agents._proto.hermes.v1 import event_pb2, goal_pb2, plan_pb2

TERMINAL = {"completed", "failed", "cancelled", "needs_input"}


@dataclass
class Node:
    """One step of a plan: a task type and its inputs, which may hold `{"$ref": "node.path"}`."""

    id: str
    task_type: str
    inputs: dict[str, Any] = field(default_factory=dict)
    depends_on: list[str] = field(default_factory=list)
    max_retries: int = 0
    timeout_ms: int = 0
    tags: list[str] = field(default_factory=list)
    secret_inputs: list[str] = field(default_factory=list)

    def to_proto(self) -> plan_pb2.TaskNode:
        return plan_pb2.TaskNode(
            id=self.id, task_type=self.task_type, inputs_json=json.dumps(self.inputs),
            depends_on=self.depends_on, max_retries=self.max_retries, timeout_ms=self.timeout_ms,
            tags=self.tags, secret_inputs=self.secret_inputs)


@dataclass
class Plan:
    """A DAG of nodes, built in code or loaded from the YAML or JSON shape `hermes submit` reads
    (`{nodes: [{id, task_type, inputs, depends_on}], output_node}`)."""

    nodes: list[Node]
    output_node: str = ""
    reasoning: str = ""

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "Plan":
        known = {"id", "task_type", "inputs", "depends_on", "max_retries", "timeout_ms", "tags", "secret_inputs"}
        nodes = []
        for raw in data.get("nodes") or []:
            unknown = set(raw) - known
            if unknown:
                raise ValueError(f"node {raw.get('id', '?')}: unknown fields {sorted(unknown)}")
            nodes.append(Node(**raw))
        return Plan(nodes=nodes, output_node=data.get("output_node", ""), reasoning=data.get("reasoning", ""))

    @staticmethod
    def from_yaml(path_or_text: str | pathlib.Path) -> "Plan":
        import yaml

        path = pathlib.Path(path_or_text)
        text = path.read_text() if path.suffix in (".yaml", ".yml", ".json") and path.exists() else str(path_or_text)
        data = yaml.safe_load(text)
        if not isinstance(data, dict):
            raise ValueError("a plan is a mapping with `nodes`")
        return Plan.from_dict(data)

    def to_proto(self) -> plan_pb2.TaskPlan:
        return plan_pb2.TaskPlan(nodes=[n.to_proto() for n in self.nodes], output_node=self.output_node,
                                 reasoning=self.reasoning)


def _json(text: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def status_word(enum, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix).lower()


@dataclass
class NodeView:
    node_id: str
    status: str
    attempt: int
    agent_id: str
    output: Any
    error: dict[str, Any] | None
    raw: goal_pb2.NodeState = field(repr=False)

    @staticmethod
    def of(node: goal_pb2.NodeState) -> "NodeView":
        error = {"code": node.error.code, "message": node.error.message} if node.HasField("error") else None
        return NodeView(node.node_id, status_word(goal_pb2.NodeStatus, node.status, "NODE_STATUS_"), node.attempt,
                        node.agent_id, _json(node.output_json), error, node)


@dataclass
class GoalView:
    """A goal as the dispatcher holds it: `status` is `running`, `completed`, `failed`, ..."""

    goal_id: str
    status: str
    output: Any
    error: dict[str, Any] | None
    nodes: list[NodeView]
    text: str
    trace_id: str
    raw: goal_pb2.Goal = field(repr=False)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def node(self, node_id: str) -> NodeView:
        return next(n for n in self.nodes if n.node_id == node_id)

    @staticmethod
    def of(goal: goal_pb2.Goal) -> "GoalView":
        error = {"code": goal.error.code, "message": goal.error.message} if goal.HasField("error") else None
        return GoalView(goal.goal_id, status_word(goal_pb2.GoalStatus, goal.status, "GOAL_STATUS_"),
                        _json(goal.output_json), error, [NodeView.of(n) for n in goal.nodes], goal.text,
                        goal.trace_id, goal)


@dataclass
class EventView:
    """One event of a goal: `kind` is the event's name in snake case (`node_succeeded`), `data`
    its fields as a dict."""

    seq: int
    goal_id: str
    kind: str
    data: dict[str, Any]
    raw: event_pb2.Event = field(repr=False)

    @property
    def terminal(self) -> bool:
        return self.kind in ("goal_completed", "goal_failed", "goal_cancelled", "goal_needs_input")

    @staticmethod
    def of(event: event_pb2.Event) -> "EventView":
        from google.protobuf import json_format

        kind = event.WhichOneof("kind") or ""
        data = json_format.MessageToDict(getattr(event, kind), preserving_proto_field_name=True) if kind else {}
        return EventView(event.seq, event.goal_id, kind, data, event)
