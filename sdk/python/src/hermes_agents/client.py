"""The client: submit goals, follow them, cancel them, decide approvals and read the artifacts
goals produced, over the dispatcher's gRPC API. `Client` is synchronous, `AsyncClient` the same for asyncio. Errors come
as typed exceptions (`hermes_agents.errors`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Iterator

import grpc

from hermes_agents import artifacts, errors
from hermes_agents._proto.hermes.v1 import dispatcher_pb2, dispatcher_pb2_grpc, goal_pb2
from hermes_agents.types import EventView, GoalView, Plan
from hermes_agents.webhooks import Submitted

#: Errors after which `watch` reconnects and resumes from the last event it gave.
_RECONNECT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
              grpc.StatusCode.CANCELLED}


def _spec(plan: Plan | dict | None, text: str | None, idempotency_key: str, session: str, timeout_s: float | None,
          max_tokens: int, max_cost_usd: float, labels: dict[str, str] | None,
          callbacks: list | None = None) -> goal_pb2.GoalSpec:
    if (plan is None) == (text is None):
        raise errors.InvalidArgument("give a goal as exactly one of `plan` or `text`")
    if isinstance(plan, dict):
        plan = Plan.from_dict(plan)
    return goal_pb2.GoalSpec(
        text=text or "", plan=plan.to_proto() if plan else None, session_id=session,
        idempotency_key=idempotency_key, timeout_ms=int((timeout_s or 0) * 1000), labels=labels or {},
        max_tokens=max_tokens, max_cost_usd=max_cost_usd, callbacks=[_callback(c) for c in callbacks or ()])


def _callback(callback: str | dict) -> goal_pb2.Callback:
    """A callback given as its URL, or as `{"url", "events", "secret"}`."""
    if isinstance(callback, str):
        return goal_pb2.Callback(url=callback)
    return goal_pb2.Callback(url=callback["url"], events=list(callback.get("events", ())),
                             secret=callback.get("secret", ""))


def _submitted(reply) -> Submitted:
    return Submitted(reply.goal_id, reply.callback_secrets, reply.duplicate)


#: The requests of the webhook calls, shared by `Client` and `AsyncClient`.
_WEBHOOK_REQUESTS = {
    "create": lambda url, events=(), secret="": dispatcher_pb2.CreateWebhookRequest(
        url=url, events=list(events), secret=secret),
    "list": lambda: dispatcher_pb2.ListWebhooksRequest(),
    "id": lambda endpoint_id: dispatcher_pb2.WebhookRequest(id=endpoint_id),
    "deliveries": lambda goal_id="", endpoint_id="", limit=100: dispatcher_pb2.ListWebhookDeliveriesRequest(
        goal_id=goal_id, endpoint_id=endpoint_id, limit=limit),
    "delivery": lambda delivery_id: dispatcher_pb2.WebhookDeliveryRequest(id=delivery_id),
}


def _channel_args(server: str, tls: bool, root_certificates: bytes | None):
    target = server.removeprefix("http://").removeprefix("https://")
    secure = tls or server.startswith("https://")
    credentials = grpc.ssl_channel_credentials(root_certificates) if secure else None
    return target, credentials


class Client:
    """A synchronous client of a Hermes dispatcher.

    `server` is `host:port` (`https://host:port` for TLS); `token` an API token, sent as
    `authorization: Bearer <token>` when the dispatcher has auth on.
    """

    def __init__(self, server: str = "127.0.0.1:50051", token: str | None = None, tls: bool = False,
                 root_certificates: bytes | None = None):
        target, credentials = _channel_args(server, tls, root_certificates)
        self._channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
        self._stub = dispatcher_pb2_grpc.DispatcherStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout: float | None = 30.0):
        try:
            return method(request, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as e:
            raise errors.from_grpc(e) from None

    def submit(self, plan: Plan | dict | None = None, *, text: str | None = None, idempotency_key: str = "",
               session: str = "", timeout_s: float | None = None, max_tokens: int = 0, max_cost_usd: float = 0.0,
               labels: dict[str, str] | None = None, callbacks: list | None = None) -> Submitted:
        """Submits a goal, as a plan or as text, and returns its id. The same `idempotency_key`
        returns the first goal's id again instead of starting another. `callbacks` are webhook
        URLs (or `{"url", "events", "secret"}`) sent the goal's end and its waits for a person;
        the id's `callback_secrets` holds each one's signing secret, this once (docs/webhooks.md)."""
        spec = _spec(plan, text, idempotency_key, session, timeout_s, max_tokens, max_cost_usd, labels, callbacks)
        return _submitted(self._call(self._stub.SubmitGoal, dispatcher_pb2.SubmitGoalRequest(spec=spec)))

    def create_webhook(self, url: str, events=(), secret: str = ""):
        """Registers a standing webhook endpoint for your tenant's goals; returns the
        `CreateWebhookResponse` (`.endpoint`, and `.secret`, shown this once)."""
        return self._call(self._stub.CreateWebhook, _WEBHOOK_REQUESTS["create"](url, events, secret))

    def list_webhooks(self) -> list:
        """Your tenant's standing endpoints (`WebhookEndpoint`s, without secrets)."""
        return list(self._call(self._stub.ListWebhooks, _WEBHOOK_REQUESTS["list"]()).endpoints)

    def delete_webhook(self, endpoint_id: str):
        return self._call(self._stub.DeleteWebhook, _WEBHOOK_REQUESTS["id"](endpoint_id))

    def rotate_webhook_secret(self, endpoint_id: str):
        """A new signing secret (`.secret`, shown once); the previous one keeps signing beside it."""
        return self._call(self._stub.RotateWebhookSecret, _WEBHOOK_REQUESTS["id"](endpoint_id))

    def webhook_deliveries(self, goal_id: str = "", endpoint_id: str = "", limit: int = 100) -> list:
        """Deliveries (`WebhookDelivery`s, each with every attempt), newest first."""
        request = _WEBHOOK_REQUESTS["deliveries"](goal_id, endpoint_id, limit)
        return list(self._call(self._stub.ListWebhookDeliveries, request).deliveries)

    def resend_webhook_delivery(self, delivery_id: str):
        return self._call(self._stub.ResendWebhookDelivery, _WEBHOOK_REQUESTS["delivery"](delivery_id))

    def get(self, goal_id: str) -> GoalView:
        return GoalView.of(self._call(self._stub.GetGoal, dispatcher_pb2.GetGoalRequest(goal_id=goal_id)))

    def list(self, limit: int = 100, status: str | None = None) -> list[GoalView]:
        """The newest goals first; `status` keeps those in one status (`running`, `failed`, ...)."""
        reply = self._call(self._stub.ListGoals, dispatcher_pb2.ListGoalsRequest(limit=limit))
        goals = [GoalView.of(g) for g in reply.goals]
        return [g for g in goals if status is None or g.status == status]

    def cancel(self, goal_id: str, reason: str = "") -> GoalView:
        request = dispatcher_pb2.CancelGoalRequest(goal_id=goal_id, reason=reason)
        return GoalView.of(self._call(self._stub.CancelGoal, request))

    def approve(self, goal_id: str, call_id: str, note: str = ""):
        return self._decide(goal_id, call_id, True, note)

    def deny(self, goal_id: str, call_id: str, note: str = ""):
        return self._decide(goal_id, call_id, False, note)

    def _decide(self, goal_id: str, call_id: str, approve: bool, note: str):
        request = dispatcher_pb2.ApproveToolCallRequest(goal_id=goal_id, call_id=call_id, approve=approve, note=note)
        return self._call(self._stub.ApproveToolCall, request)

    def artifact(self, goal_id: str, reference: str, timeout_s: float = 120.0) -> bytes:
        """The whole content of an artifact the goal produced. An output over 64 KiB stands in
        the goal as a stub, `{"$artifact": "art-...", "size_bytes": N, ...}`, naming it. Another
        goal's artifact is `errors.NotFound`, as a missing one."""
        request = dispatcher_pb2.GoalArtifactRequest(goal_id=goal_id, ref=reference)
        try:
            chunks = self._stub.GetGoalArtifact(request, metadata=self._metadata, timeout=timeout_s)
            return b"".join(chunk.data for chunk in chunks)
        except grpc.RpcError as e:
            raise errors.from_grpc(e) from None

    def resolve(self, goal_id: str, value: Any) -> Any:
        """`value` (the goal's output, or a node's) with each artifact stub in it replaced by what
        it stands for: the artifact's JSON, or its text, at the stub's `path`."""
        loaded = {r: artifacts.content_value(self.artifact(goal_id, r)) for r in artifacts.stub_references(value)}
        return artifacts.substitute(value, loaded) if loaded else value

    def watch(self, goal_id: str, after_seq: int = 0, reconnects: int = 10) -> Iterator[EventView]:
        """The goal's events, oldest first, until its terminal event. A dropped connection is
        resumed from the last event given (`after_seq`), so no event is repeated or lost; after
        `reconnects` failures in a row the error is raised."""
        failures = 0
        while True:
            request = dispatcher_pb2.WatchGoalRequest(goal_id=goal_id, after_seq=after_seq)
            try:
                for event in self._stub.WatchGoal(request, metadata=self._metadata):
                    failures = 0
                    view = EventView.of(event)
                    if view.seq:
                        after_seq = view.seq
                    yield view
                    if view.terminal:
                        return
                return
            except grpc.RpcError as e:
                if e.code() not in _RECONNECT or failures >= reconnects:
                    raise errors.from_grpc(e) from None
                failures += 1
                time.sleep(min(0.2 * 2 ** failures, 5.0))

    def wait(self, goal_id: str, timeout_s: float = 300.0) -> GoalView:
        """Waits until the goal ends and returns it; `errors.Timeout` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            goal = self.get(goal_id)
            if goal.finished:
                return goal
            if time.monotonic() >= deadline:
                raise errors.Timeout(f"goal {goal_id} is still {goal.status} after {timeout_s} s")
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


class AsyncClient:
    """The asyncio flavour of `Client`, with the same methods as coroutines (and `watch` as an
    async iterator)."""

    def __init__(self, server: str = "127.0.0.1:50051", token: str | None = None, tls: bool = False,
                 root_certificates: bytes | None = None):
        target, credentials = _channel_args(server, tls, root_certificates)
        self._channel = (grpc.aio.secure_channel(target, credentials) if credentials
                         else grpc.aio.insecure_channel(target))
        self._stub = dispatcher_pb2_grpc.DispatcherStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, method, request, timeout: float | None = 30.0):
        try:
            return await method(request, metadata=self._metadata, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            raise errors.from_grpc(e) from None

    async def submit(self, plan: Plan | dict | None = None, *, text: str | None = None, idempotency_key: str = "",
                     session: str = "", timeout_s: float | None = None, max_tokens: int = 0,
                     max_cost_usd: float = 0.0, labels: dict[str, str] | None = None,
                     callbacks: list | None = None) -> Submitted:
        spec = _spec(plan, text, idempotency_key, session, timeout_s, max_tokens, max_cost_usd, labels, callbacks)
        return _submitted(await self._call(self._stub.SubmitGoal, dispatcher_pb2.SubmitGoalRequest(spec=spec)))

    async def create_webhook(self, url: str, events=(), secret: str = ""):
        return await self._call(self._stub.CreateWebhook, _WEBHOOK_REQUESTS["create"](url, events, secret))

    async def list_webhooks(self) -> list:
        return list((await self._call(self._stub.ListWebhooks, _WEBHOOK_REQUESTS["list"]())).endpoints)

    async def delete_webhook(self, endpoint_id: str):
        return await self._call(self._stub.DeleteWebhook, _WEBHOOK_REQUESTS["id"](endpoint_id))

    async def rotate_webhook_secret(self, endpoint_id: str):
        return await self._call(self._stub.RotateWebhookSecret, _WEBHOOK_REQUESTS["id"](endpoint_id))

    async def webhook_deliveries(self, goal_id: str = "", endpoint_id: str = "", limit: int = 100) -> list:
        request = _WEBHOOK_REQUESTS["deliveries"](goal_id, endpoint_id, limit)
        return list((await self._call(self._stub.ListWebhookDeliveries, request)).deliveries)

    async def resend_webhook_delivery(self, delivery_id: str):
        return await self._call(self._stub.ResendWebhookDelivery, _WEBHOOK_REQUESTS["delivery"](delivery_id))

    async def get(self, goal_id: str) -> GoalView:
        return GoalView.of(await self._call(self._stub.GetGoal, dispatcher_pb2.GetGoalRequest(goal_id=goal_id)))

    async def list(self, limit: int = 100, status: str | None = None) -> list[GoalView]:
        reply = await self._call(self._stub.ListGoals, dispatcher_pb2.ListGoalsRequest(limit=limit))
        goals = [GoalView.of(g) for g in reply.goals]
        return [g for g in goals if status is None or g.status == status]

    async def cancel(self, goal_id: str, reason: str = "") -> GoalView:
        request = dispatcher_pb2.CancelGoalRequest(goal_id=goal_id, reason=reason)
        return GoalView.of(await self._call(self._stub.CancelGoal, request))

    async def approve(self, goal_id: str, call_id: str, note: str = ""):
        request = dispatcher_pb2.ApproveToolCallRequest(goal_id=goal_id, call_id=call_id, approve=True, note=note)
        return await self._call(self._stub.ApproveToolCall, request)

    async def deny(self, goal_id: str, call_id: str, note: str = ""):
        request = dispatcher_pb2.ApproveToolCallRequest(goal_id=goal_id, call_id=call_id, approve=False, note=note)
        return await self._call(self._stub.ApproveToolCall, request)

    async def artifact(self, goal_id: str, reference: str, timeout_s: float = 120.0) -> bytes:
        """As `Client.artifact`."""
        request = dispatcher_pb2.GoalArtifactRequest(goal_id=goal_id, ref=reference)
        try:
            call = self._stub.GetGoalArtifact(request, metadata=self._metadata, timeout=timeout_s)
            return b"".join([chunk.data async for chunk in call])
        except grpc.RpcError as e:
            raise errors.from_grpc(e) from None

    async def resolve(self, goal_id: str, value: Any) -> Any:
        """As `Client.resolve`."""
        loaded = {r: artifacts.content_value(await self.artifact(goal_id, r))
                  for r in artifacts.stub_references(value)}
        return artifacts.substitute(value, loaded) if loaded else value

    async def watch(self, goal_id: str, after_seq: int = 0, reconnects: int = 10) -> AsyncIterator[EventView]:
        failures = 0
        while True:
            request = dispatcher_pb2.WatchGoalRequest(goal_id=goal_id, after_seq=after_seq)
            try:
                async for event in self._stub.WatchGoal(request, metadata=self._metadata):
                    failures = 0
                    view = EventView.of(event)
                    if view.seq:
                        after_seq = view.seq
                    yield view
                    if view.terminal:
                        return
                return
            except grpc.aio.AioRpcError as e:
                if e.code() not in _RECONNECT or failures >= reconnects:
                    raise errors.from_grpc(e) from None
                failures += 1
                await asyncio.sleep(min(0.2 * 2 ** failures, 5.0))

    async def wait(self, goal_id: str, timeout_s: float = 300.0) -> GoalView:
        deadline = time.monotonic() + timeout_s
        while True:
            goal = await self.get(goal_id)
            if goal.finished:
                return goal
            if time.monotonic() >= deadline:
                raise errors.Timeout(f"goal {goal_id} is still {goal.status} after {timeout_s} s")
            await asyncio.sleep(0.1)


