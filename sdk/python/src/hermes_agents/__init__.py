"""hermes-agents: Hermes from Python (docs/python.md).

- `Client` and `AsyncClient` submit goals (plans or text), follow them, cancel them and decide
  approvals over the dispatcher's gRPC API.
- `Worker` is a Hermes agent written in Python: its task types join the same pools as the Rust
  executor's, under the same delivery rules.
- `webhooks.verify` checks a webhook Hermes sent (docs/webhooks.md).
"""

from hermes_agents import errors, webhooks
from hermes_agents.client import AsyncClient, Client
from hermes_agents.errors import HermesError, RetryableToolError
from hermes_agents.types import EventView, GoalView, Node, NodeView, Plan
from hermes_agents.worker import TaskContext, Worker

__all__ = ["AsyncClient", "Client", "EventView", "GoalView", "HermesError", "Node", "NodeView", "Plan",
           "RetryableToolError", "TaskContext", "Worker", "errors", "webhooks"]
__version__ = "0.1.0"
