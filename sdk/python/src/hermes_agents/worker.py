"""Python workers: a `Worker` is a full Hermes agent, written in Python. It obeys the same
protocol as the Rust executor (docs/protocol.md, docs/python.md):

- it registers with `AgentHeartbeat`s on `hermes.registry.heartbeat.<agent_id>`, mirrored into
  the `hermes_agents` bucket, with its task types and their JSON Schemas, so the planner sees
  them and the dispatcher validates inputs against them;
- it binds the same durable consumers on `HERMES_TASKS` as the Rust executor, with the same
  names, AckWait and MaxDeliver: each task type's pool (`pool_<type>`), each tenant's lane of it
  as the lanes bucket names the tenants (`lane_<type>__<tenant>`), and its directed consumer
  (`agent_<id>`);
- it sends progress acks while a task runs, publishes the `TaskResult` (with the attempt's result
  token, deduplicated by task id) before it acks, and abandons tasks of cancelled goals;
- inputs that reference artifacts (other nodes' large outputs) are resolved before the function
  runs, and an output over 64 KiB is offloaded as an artifact (`hermes_agents.artifacts`);
- a malformed task message goes to the DLQ;
- a task that crashed its process twice is quarantined to the DLQ (`run()` supervises the
  process, see `hermes_agents.supervise`; the crash markers are the Rust executor's);
- steps with side effects run once across redeliveries and attempts through `TaskContext.once`,
  recorded in the `hermes_ledger` bucket;
- connected as its own NATS identity (`agent_<id>` with its agent token, docs/security.md), it
  reaches the ledger and the artifacts only through the memory service, with each task's
  `memory_token` (`hermes_agents.broker`), and reads replies under its own inbox prefix;
- on SIGTERM it drains: it takes no new work, finishes what it runs, and leaves the registry;
- each task is a span in the goal's trace, exported over OTLP when configured (`_Tracing`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from hermes_agents import broker, errors, supervise
from hermes_agents.artifacts import Artifacts
from hermes_agents._proto.hermes.v1 import agent_pb2, common_pb2, task_pb2

log = logging.getLogger("hermes_agents.worker")

#: How often the worker reads the lanes bucket for tenants it does not serve yet.
LANES_POLL_S = 2.0
#: A pending ledger claim younger than this may still be running in another delivery.
PENDING_GRACE_S = 45.0
#: Crashes with one node in flight after which its task is quarantined, as
#: `hermes_executor::CRASH_QUARANTINE_DEATHS`.
CRASH_QUARANTINE_DEATHS = 2


def _now_ms() -> int:
    return int(time.time() * 1000)


def _retryable(code: str) -> bool:
    return code in ("UNAVAILABLE", "TIMEOUT", "LIMIT_EXCEEDED")


def _failed(result: task_pb2.TaskResult, code: str, message: str,
            retryable: bool | None = None) -> task_pb2.TaskResult:
    """Marks `result` failed with `code`, retryable as the code is unless `retryable` says."""
    result.status = task_pb2.TASK_STATUS_FAILED
    result.error.CopyFrom(common_pb2.Error(code=code, message=message, node_id=result.node_id,
                                           retryable=_retryable(code) if retryable is None else retryable))
    return result


@dataclass
class TaskSpec:
    """One task type a worker serves."""

    task_type: str
    fn: Callable[..., Any]
    description: str
    input_schema: dict
    output_schema: dict | None
    timeout_s: float
    side_effects: bool
    retry_on: tuple[type[BaseException], ...]
    wants_context: bool


@dataclass
class TaskContext:
    """What a running task knows about itself; a task function receives it when it declares a
    parameter named `ctx`."""

    goal_id: str
    node_id: str
    task_id: str
    attempt: int
    task_type: str
    tenant: str
    worker: "Worker" = field(repr=False)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _steps: int = field(default=0, repr=False)
    #: The task's proof of its goal and tenant, for the memory service (an identity's ledger).
    _memory_token: str = field(default="", repr=False)

    async def once(self, name: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Runs a step with side effects at most once for this node, across redeliveries, agents
        and attempts. Its outcome is recorded in the ledger under the node, the step's position
        and `name`; a later delivery that reaches the same step gets the recorded outcome back
        instead of running it again. A step that started and never recorded an outcome (its
        worker was killed in it) is not repeated: it fails as outcome unknown."""
        index = self._steps
        self._steps += 1
        key = f"{self.goal_id}.{self.node_id}.step{index}.{uuid.uuid5(uuid.NAMESPACE_URL, name).hex}"
        ledger = self.worker._task_ledger(self._memory_token)
        return await self.worker._ledger_once(ledger, key, self.attempt, name, fn, args, kwargs)


def nats_tls(ca_file: str | None, cert_file: str | None, key_file: str | None):
    """The TLS context of a NATS connection, as the Rust services' `nats.tls.*`: `ca_file` the CAs
    the server's certificate must chain to (else the system's), `cert_file` and `key_file` a client
    certificate for a server that verifies clients. None when none is set (plaintext); any makes
    TLS required. A certificate without its key (or the reverse) is `InvalidArgument`."""
    import ssl

    if not (ca_file or cert_file or key_file):
        return None
    if bool(cert_file) != bool(key_file):
        raise errors.InvalidArgument(
            "nats.tls: a client certificate needs its key, and a key its certificate: set both "
            "HERMES_NATS_TLS_CERT_FILE and HERMES_NATS_TLS_KEY_FILE")
    context = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context


#: How often a worker looks at its NATS TLS files for a change (as `hermes_core::reload`).
TLS_FOLLOW_S = 10.0


class TlsFollower:
    """Follows a connection's NATS TLS files, as the Rust services' `NatsTls::follow`: files that
    changed, parse and hold a certificate that matches its key are taken by reconnecting with a
    new context (nats-py reads `options["tls"]` at every connect); anything else is refused and
    logged (`nats_tls_reload_failed`), and the connection goes on as it was."""

    def __init__(self, nc, ca_file: str | None, cert_file: str | None, key_file: str | None):
        self._nc = nc
        self._files = (ca_file, cert_file, key_file)
        self._taken = self._contents()

    def _contents(self):
        out = []
        for path in self._files:
            try:
                out.append(open(path, "rb").read() if path else None)
            except OSError:
                out.append(b"")
        return tuple(out)

    async def look(self) -> bool:
        """Takes the files when they changed and are good; whether a reconnect was started."""
        contents = self._contents()
        if contents == self._taken:
            return False
        try:
            context = nats_tls(*self._files)
        except Exception as e:  # noqa: BLE001 - any bad file: keep the connection as it is
            log.error("the NATS TLS files changed but cannot be taken; the connection keeps the ones before "
                      "(event nats_tls_reload_failed): %s", e)
            return False
        self._taken = contents
        self._nc.options["tls"] = context
        log.info("NATS TLS files changed; reconnecting with them (event nats_tls_reloaded)")
        await self._nc.force_reconnect()
        return True

    async def follow(self, hangup: asyncio.Event) -> None:
        """Looks every `TLS_FOLLOW_S`, or at once when `hangup` is set (SIGHUP)."""
        while True:
            try:
                await asyncio.wait_for(hangup.wait(), TLS_FOLLOW_S)
            except asyncio.TimeoutError:
                pass
            hangup.clear()
            await self.look()


def _is_word(text: str) -> bool:
    """1-64 characters of [A-Za-z0-9_-]: an agent id, a tenant (`hermes_core::ids`, `Word`)."""
    return 0 < len(text) <= 64 and all(c.isascii() and (c.isalnum() or c in "-_") for c in text)


def _speaks_tls(nc) -> bool:
    """Whether a nats-py connection runs over TLS."""
    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    return writer is not None and writer.get_extra_info("ssl_object") is not None


class Worker:
    """A Hermes agent in Python. Declare task types with `@worker.task(...)`, then `run()`.

    Unset arguments come from the environment the Helm chart gives executor pods:
    `HERMES_AGENT_ID`, `HERMES_AGENT_POOL`, `HERMES_NATS_URL`, `HERMES_AGENT_MAX_CONCURRENCY`,
    `HERMES_AGENT_TAGS`, `HERMES_NATS_CREDS`, `HERMES_NATS_INBOX_PREFIX`,
    `HERMES_NATS_TLS_CA_FILE`, `HERMES_NATS_TLS_CERT_FILE` and `HERMES_NATS_TLS_KEY_FILE` (TLS
    to NATS, as the Rust services' `nats.tls.*`), `HERMES_NATS_PASSWORD_FILE` (the password of
    the URL's user, read at every connect: a pod's own identity, as `nats.password_file`), and
    `HERMES_METRICS_LISTEN`, where `/healthz` is served.

    ```python
    worker = Worker(agent_id="py-1", pool="python", nats_url="nats://127.0.0.1:4222")

    @worker.task("web.search", timeout=30)
    async def search(query: str, top_k: int = 5) -> dict:
        ...

    worker.run()
    ```
    """

    def __init__(self, agent_id: str | None = None, pool: str | None = None, nats_url: str | None = None,
                 max_concurrency: int | None = None, tags: list[str] | None = None, prefix: str = "hermes",
                 heartbeat_s: float = 10.0, ack_wait_s: float = 30.0, max_deliver: int = 5,
                 nats_options: dict[str, Any] | None = None, health_listen: str | None = None):
        # Unset arguments come from the variables the Helm chart's executor pools set, as for
        # the Rust executor (docs/python.md, "Deployment").
        env = os.environ.get
        agent_id = agent_id or env("HERMES_AGENT_ID", "")
        pool = pool or env("HERMES_AGENT_POOL", "default")
        nats_url = nats_url or env("HERMES_NATS_URL", "nats://127.0.0.1:4222")
        max_concurrency = max_concurrency or int(env("HERMES_AGENT_MAX_CONCURRENCY", "8"))
        if tags is None:
            tags = [t for t in env("HERMES_AGENT_TAGS", "").split(",") if t]
        nats_options = dict(nats_options or {})
        if env("HERMES_NATS_CREDS"):
            nats_options.setdefault("user_credentials", env("HERMES_NATS_CREDS"))
        if env("HERMES_NATS_INBOX_PREFIX"):
            nats_options.setdefault("inbox_prefix", env("HERMES_NATS_INBOX_PREFIX"))
        tls = nats_tls(env("HERMES_NATS_TLS_CA_FILE"), env("HERMES_NATS_TLS_CERT_FILE"), env("HERMES_NATS_TLS_KEY_FILE"))
        #: The TLS files the worker follows (from the environment; a context passed in is not).
        self._tls_files = None
        if tls is not None and "tls" not in nats_options:
            nats_options["tls"] = tls
            self._tls_files = (env("HERMES_NATS_TLS_CA_FILE"), env("HERMES_NATS_TLS_CERT_FILE"),
                               env("HERMES_NATS_TLS_KEY_FILE"))
        if env("HERMES_NATS_PASSWORD_FILE"):
            # The URL names the user (`nats://agent_<id>@host`); the password is the file's,
            # read at every connect (a pod's service-account token, renewed in place).
            user = (broker.url_credentials(nats_url) or (None, None))[0]
            if not user:
                raise errors.InvalidArgument("HERMES_NATS_PASSWORD_FILE goes with a NATS URL that names a user "
                                             "and no password (nats://agent_<id>@host:4222)")
            nats_options.setdefault("user", user)
            nats_options.setdefault("password", broker.password_reader(env("HERMES_NATS_PASSWORD_FILE")))
        self.health_listen = health_listen or env("HERMES_METRICS_LISTEN")
        if not _is_word(agent_id):
            raise errors.InvalidArgument(f"agent_id `{agent_id}` must be 1-64 characters of [A-Za-z0-9_-]")
        if max_concurrency < 1:
            raise errors.InvalidArgument("max_concurrency must be at least 1")
        self.agent_id = agent_id
        self.pool = pool
        self.nats_url = nats_url
        self.max_concurrency = max_concurrency
        self.tags = list(tags or [])
        self.prefix = prefix
        self.heartbeat_s = heartbeat_s
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        self.nats_options = nats_options or {}
        #: Whether the worker connects as its own NATS identity (`agent_<id>`); set by `serve`.
        self.identity = False
        self.tasks: dict[str, TaskSpec] = {}
        self._running: dict[str, tuple[str, asyncio.Task]] = {}
        self._in_flight = 0
        self._success_rate = 1.0
        self._latency_ms = 0.0
        self._seen = 0
        self._started_ms = _now_ms()
        self._stopping: asyncio.Event | None = None

    # ---- declaring task types -------------------------------------------------------------

    def task(self, task_type: str, *, description: str = "", input_schema: dict | None = None,
             output_schema: dict | None = None, timeout: float = 60.0, side_effects: bool = False,
             retry_on: tuple[type[BaseException], ...] = ()) -> Callable:
        """Declares a task type served by the decorated function, async or plain (a plain one runs
        in a thread pool). Its inputs arrive as keyword arguments; without `input_schema` one is
        derived from the signature. An output that does not match `output_schema` (`type`,
        `required`, `properties`, `items`) fails the task. An exception fails the task as
        `TOOL_ERROR`; one of `retry_on`, or `errors.RetryableToolError`, fails it retryably; a
        `HermesError` keeps its code. With `side_effects`, a function without a `ctx` parameter
        is claimed whole in the ledger; one with it claims its steps with `ctx.once`."""
        if not _valid_task_type(task_type):
            raise errors.InvalidArgument(
                f"task type `{task_type}` must be 1-64 characters of dot-separated segments of [a-z0-9-], "
                "each starting with a letter or digit, like `web.search`")

        def register(fn: Callable) -> Callable:
            schema = input_schema or _schema_of(fn)
            self.tasks[task_type] = TaskSpec(
                task_type=task_type, fn=fn, description=description or (inspect.getdoc(fn) or task_type),
                input_schema=schema, output_schema=output_schema, timeout_s=timeout, side_effects=side_effects,
                retry_on=tuple(retry_on), wants_context="ctx" in inspect.signature(fn).parameters)
            return fn

        return register

    # ---- names, as hermes_core::topology -----------------------------------------------------

    def _subject(self, *parts: str) -> str:
        return ".".join((self.prefix, *parts))

    def _stream(self, what: str) -> str:
        return f"{self.prefix.upper().replace('-', '_')}_{what}"

    def _bucket(self, what: str) -> str:
        return f"{self.prefix.replace('-', '_')}_{what}"

    def consumers(self) -> list[tuple[str, str]]:
        """The (durable name, filter subject) pairs this worker binds, as the Rust executor does."""
        out = []
        for task_type in sorted(self.tasks):
            flat = task_type.replace(".", "_")
            out.append((f"pool_{flat}", self._subject("task", "pool", task_type)))
        out.append((f"agent_{self.agent_id}", self._subject("task", "direct", self.agent_id, ">")))
        return out

    def lane_consumers(self, tenant: str) -> list[tuple[str, str]]:
        """The (durable name, filter subject) pairs of `tenant`'s lanes of this worker's task types,
        as `hermes_core::topology::Topology::lane_consumer` names them."""
        return [(f"lane_{task_type.replace('.', '_')}__{tenant}", self._subject("task", "lane", tenant, task_type))
                for task_type in sorted(self.tasks)]

    # ---- running ---------------------------------------------------------------------------

    def run(self) -> None:
        """Serves until SIGTERM or SIGINT, then drains and leaves the registry.

        The program runs supervised: it starts itself again as a child and waits for it, so a
        task that crashes the process is counted and, after two crashes, quarantined instead of
        crashing every worker it reaches (`hermes_agents.supervise`). The code before `run()`
        therefore runs in both processes. `HERMES_NO_SUPERVISOR=1` runs it unsupervised."""
        if supervise.should_supervise():
            sys.exit(supervise.supervise(f"hermes worker {self.agent_id}"))
        asyncio.run(self.serve())

    async def _differences(self, durable: str, wanted) -> list[str]:
        """The settings the existing consumer `durable` has other than `wanted`, each as
        `name: in effect (wanted)`. One consumer serves a whole pool, so the first to create it set
        them, and a worker started later binds to it as it is (as the Rust executor does)."""
        try:
            info = await self._js.consumer_info(self._stream("TASKS"), durable)
        except Exception as e:  # noqa: BLE001 - only a warning is at stake
            log.debug("cannot read consumer %s: %s", durable, e)
            return []
        settings = (("ack_wait", info.config.ack_wait, wanted.ack_wait),
                    ("max_deliver", info.config.max_deliver, wanted.max_deliver),
                    ("max_ack_pending", info.config.max_ack_pending, wanted.max_ack_pending),
                    ("filter_subject", info.config.filter_subject, wanted.filter_subject))
        return [f"{name}: {have} (wanted {want})" for name, have, want in settings if have != want]

    async def serve(self, stop: asyncio.Event | None = None) -> None:
        """Serves until `stop` is set (or SIGTERM/SIGINT when it is not given), then drains."""
        import nats

        if not self.tasks:
            raise errors.InvalidArgument("the worker declares no task types")
        self._stopping = stop or asyncio.Event()
        self._tracing = _Tracing(self.agent_id)
        if stop is None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stopping.set)
        # On its own identity (`agent_<id>`), the worker reads replies only under its own inbox
        # prefix, and reaches the ledger and the artifacts through the memory service.
        user = broker.url_user(self.nats_url) or (self.nats_options.get("user") if callable(
            self.nats_options.get("password")) else None)
        self.identity = broker.is_agent_identity(user)
        if self.identity and user != f"{broker.AGENT_IDENTITY_PREFIX}{self.agent_id}":
            # The server would refuse every consumer and heartbeat of another id, one at a time.
            raise errors.InvalidArgument(f"the NATS URL's user `{user}` is another agent's identity; agent "
                                         f"`{self.agent_id}` connects as `{broker.AGENT_IDENTITY_PREFIX}{self.agent_id}`")
        options = dict(self.nats_options)
        if user:
            options.setdefault("inbox_prefix", f"_INBOX_{user}")
        self._nc = await nats.connect(self.nats_url, name=f"hermes-worker-{self.agent_id}", **options)
        if self.nats_options.get("tls") is not None and not _speaks_tls(self._nc):
            # nats-py upgrades only when the server asks for TLS; with TLS configured a server
            # that does not (or someone between that says it does not) is refused, as in Rust.
            await self._nc.close()
            raise errors.Unavailable("nats.tls is set, but the connection to NATS is not TLS: refused")
        self._js = self._nc.jetstream()
        self._agents_kv = await self._js.key_value(self._bucket("agents"))
        self._ledger = None if self.identity else broker.BucketLedger(await self._js.key_value(self._bucket("ledger")))
        self._artifacts = None if self.identity else Artifacts(self._js, self._bucket("artifacts"))
        crashed = supervise.crashed_tasks()
        if crashed:
            counted = await self._count_crashes(crashed)
            log.warning("the previous worker process crashed with %d task(s) in flight; %d counted one crash",
                        len(crashed), counted)
        self._slots = asyncio.Semaphore(self.max_concurrency)
        subs = []
        differing = []
        for durable, subject in self.consumers():
            subs.append(await self._pull_subscribe(durable, subject))
            differs = await self._differences(durable, self._consumer_config(durable, subject))
            if differs:
                differing.append(f"{durable}: {', '.join(differs)}")
        if differing:
            log.warning("%d consumer(s) this worker pulls from exist with other settings than its own, and keep them "
                        "(first %s): change them on the server (`nats consumer edit`), or delete them while nothing "
                        "is pending", len(differing), differing[0])
        cancels = await self._nc.subscribe(self._subject("cancel", "*"), cb=self._on_cancel)
        health = await self._serve_health() if self.health_listen else None
        await self._beat()
        heartbeat = asyncio.create_task(self._heartbeats())
        pullers = [asyncio.create_task(self._pull(sub)) for sub in subs]
        lanes = asyncio.create_task(self._follow_lanes(subs, pullers))
        tls = None
        # SIGHUP means "read your files again" (the TLS files, when there are any), never "stop":
        # its default action would end the worker. Left alone when the program that embeds the
        # worker owns the signals (it passed `stop`) and there is nothing to read again.
        hangup = asyncio.Event()
        if stop is None or self._tls_files is not None:
            try:
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hangup.set)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread: poll only
                pass
        if self._tls_files is not None:
            tls = asyncio.create_task(TlsFollower(self._nc, *self._tls_files).follow(hangup))
        log.info("worker %s serving %s", self.agent_id, sorted(self.tasks))
        await self._stopping.wait()
        # Drain: no new work (the registry routes nothing to a draining agent), finish in flight.
        log.info("worker %s draining", self.agent_id)
        await self._beat(draining=True)
        lanes.cancel()
        await asyncio.gather(lanes, return_exceptions=True)
        await asyncio.gather(*pullers, return_exceptions=True)
        running = [task for _, task in self._running.values()]
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        heartbeat.cancel()
        if tls is not None:
            tls.cancel()
        await self._beat(deregister=True)
        try:
            await self._agents_kv.delete(self.agent_id)
        except Exception as e:  # noqa: BLE001 - leaving is best effort, the TTL covers it
            log.warning("cannot remove %s from the agents bucket: %s", self.agent_id, e)
        if health is not None:
            health.close()
        await cancels.unsubscribe()
        for sub in subs:
            await sub.unsubscribe()
        # Every result was published and every task acked (both confirmed) before this point, so
        # closing loses nothing (`drain` of a pull subscription waits on its queue forever).
        await self._nc.flush()
        await self._nc.close()
        self._tracing.shutdown()
        log.info("worker %s drained and deregistered", self.agent_id)

    async def _serve_health(self):
        """`GET /healthz` on `health_listen` (the chart's probes): 200 while connected and not
        draining, else 503. Anything else is 404."""
        host, _, port = self.health_listen.rpartition(":")

        async def answer(reader, writer):
            try:
                request = (await reader.readline()).decode(errors="replace").split()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                if len(request) >= 2 and request[1] == "/healthz":
                    ok = self._nc.is_connected and not self._stopping.is_set()
                    status, body = ("200 OK", "ok\n") if ok else ("503 Service Unavailable", "draining\n")
                else:
                    status, body = "404 Not Found", "not found\n"
                writer.write(f"HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n"
                             f"connection: close\r\n\r\n{body}".encode())
                await writer.drain()
            finally:
                writer.close()

        return await asyncio.start_server(answer, host or "0.0.0.0", int(port))

    def _heartbeat(self, draining: bool = False, deregister: bool = False) -> agent_pb2.AgentHeartbeat:
        tools = [agent_pb2.ToolSpec(name=t.task_type, description=t.description,
                                    params_schema_json=json.dumps(t.input_schema), side_effects=t.side_effects)
                 for t in self.tasks.values()]
        return agent_pb2.AgentHeartbeat(
            agent_id=self.agent_id, pool=self.pool, task_types=sorted(self.tasks), tools=tools, tags=self.tags,
            in_flight=self._in_flight, max_concurrency=self.max_concurrency, version="python-0.1.0",
            started_unix_ms=self._started_ms, success_rate=self._success_rate, latency_ms=self._latency_ms,
            sent_unix_ms=_now_ms(), draining=draining, deregister=deregister,
            heartbeat_period_ms=int(self.heartbeat_s * 1000))

    async def _beat(self, draining: bool = False, deregister: bool = False) -> None:
        beat = self._heartbeat(draining, deregister).SerializeToString()
        await self._nc.publish(self._subject("registry", "heartbeat", self.agent_id), beat)
        if not deregister:
            try:
                await self._agents_kv.put(self.agent_id, beat)
            except Exception as e:  # noqa: BLE001 - the core heartbeat is what keeps it alive
                log.warning("heartbeat mirror failed: %s", e)
        await self._nc.flush()

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self._beat()
            except Exception as e:  # noqa: BLE001 - keep beating
                log.warning("heartbeat failed: %s", e)

    async def _on_cancel(self, msg) -> None:
        goal_id = msg.subject.rsplit(".", 1)[-1]
        for task_id, (goal, task) in list(self._running.items()):
            if goal == goal_id:
                log.info("goal %s cancelled; abandoning task %s", goal_id, task_id)
                task.cancel()

    def _consumer_config(self, durable: str, subject: str):
        """The settings of a task consumer this worker binds, as the Rust executor's."""
        from nats.js.api import AckPolicy, ConsumerConfig

        return ConsumerConfig(durable_name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT,
                              ack_wait=self.ack_wait_s, max_deliver=self.max_deliver, max_ack_pending=20_000)

    async def _pull_subscribe(self, durable: str, subject: str):
        """Binds (creating it if needed) the task consumer `durable` on `subject`."""
        return await self._js.pull_subscribe(subject, durable=durable, stream=self._stream("TASKS"),
                                             config=self._consumer_config(durable, subject))

    async def _follow_lanes(self, subs: list, pullers: list) -> None:
        """Pulls from each tenant's lane as the lanes bucket names the tenant (`hermes_core::lanes`).
        The lanes are served in turn with the pool, each a puller of its own: this worker does not
        weigh tenants (the Rust executor does)."""
        import nats.js.errors

        followed: set[str] = set()
        lanes_kv = None
        while not self._stopping.is_set():
            try:
                if lanes_kv is None:
                    lanes_kv = await self._js.key_value(self._bucket("lanes"))
                try:
                    tenants = await lanes_kv.keys()
                except nats.js.errors.NoKeysError:
                    tenants = []
                for tenant in sorted(set(tenants) - followed):
                    # A key that is no tenant (a word of [A-Za-z0-9_-]) names no lane: skipped once.
                    if not _is_word(tenant):
                        log.warning("the lanes bucket holds %r, which is no tenant; skipped", tenant)
                        followed.add(tenant)
                        continue
                    # All of the tenant's task types, or none: a failure is tried again whole.
                    new = []
                    try:
                        for durable, subject in self.lane_consumers(tenant):
                            new.append(await self._pull_subscribe(durable, subject))
                    except Exception as e:  # noqa: BLE001 - tried again at the next poll
                        log.warning("cannot serve tenant %s's lane yet: %s", tenant, e)
                        for sub in new:
                            await sub.unsubscribe()
                        continue
                    for sub in new:
                        subs.append(sub)
                        pullers.append(asyncio.create_task(self._pull(sub)))
                    followed.add(tenant)
                    log.info("worker %s serving tenant %s's lane", self.agent_id, tenant)
            except Exception as e:  # noqa: BLE001 - no lanes bucket yet, or a sick server: try again
                log.debug("cannot read the lanes: %s", e)
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=LANES_POLL_S)
            except asyncio.TimeoutError:
                pass

    async def _pull(self, sub) -> None:
        import nats.errors

        while not self._stopping.is_set():
            # Pull only with a free slot, so tasks this worker cannot start stay with others.
            while self._slots.locked() and not self._stopping.is_set():
                await asyncio.sleep(0.02)
            if self._stopping.is_set():
                return
            try:
                messages = await sub.fetch(1, timeout=2.0)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                continue
            except Exception as e:  # noqa: BLE001 - a sick server: wait and pull again
                log.warning("pull failed: %s", e)
                await asyncio.sleep(1.0)
                continue
            for msg in messages:
                await self._slots.acquire()
                asyncio.create_task(self._handle(msg))

    async def _handle(self, msg) -> None:
        try:
            try:
                task = task_pb2.TaskMessage.FromString(msg.data)
            except Exception as e:  # noqa: BLE001 - any decode failure is a malformed message
                await self._dead_letter(msg, f"undecodable TaskMessage: {e}")
                return
            with self._tracing.span(task, (msg.headers or {}).get("traceparent")) as traceparent:
                crashes = await self._crash_marker(task, msg)
                if crashes is not None and crashes >= CRASH_QUARANTINE_DEATHS:
                    await self._quarantine(task, msg, crashes, traceparent)
                    return
                self._in_flight += 1
                started = time.monotonic()
                runner = asyncio.current_task()
                self._running[task.task_id] = (task.goal_id, runner)
                try:
                    with supervise.running(self._supervised(task)):
                        result = await self._run(task, msg)
                finally:
                    self._running.pop(task.task_id, None)
                    self._in_flight -= 1
                if crashes is not None:
                    asyncio.create_task(self._clear_crash_marker(task))
                elapsed_ms = int((time.monotonic() - started) * 1000)
                self._record(result.status == task_pb2.TASK_STATUS_SUCCEEDED, elapsed_ms)
                result.elapsed_ms = elapsed_ms
                if result.HasField("error"):
                    self._tracing.failed(result.error.code, result.error.message)
                try:
                    await self._publish_result(task, msg, result, traceparent)
                except Exception as e:  # noqa: BLE001 - not acked: delivered again
                    log.warning("cannot publish the result of %s: %s; asking for redelivery", task.task_id, e)
                    await msg.nak(delay=1)
                    return
                await msg.ack_sync()
        except Exception as e:  # noqa: BLE001 - never lose the loop
            log.exception("task handling failed: %s", e)
        finally:
            self._slots.release()

    async def _dead_letter(self, msg, reason: str) -> None:
        origin = f"{msg.metadata.stream}:{msg.metadata.sequence.stream}"
        headers = {"Nats-Msg-Id": f"dlq:{origin}", "Hermes-Dlq-Reason": reason[:200],
                   "Hermes-Dlq-Subject": msg.subject, "Hermes-Dlq-Origin": origin}
        try:
            await self._js.publish(self._subject("dlq", "task"), msg.data, headers=headers)
            await msg.term()
            log.warning("malformed task message %s moved to the dlq: %s", origin, reason)
        except Exception as e:  # noqa: BLE001 - left unacked, dead-lettered on a later delivery
            log.warning("cannot dead-letter %s: %s", origin, e)

    # ---- crash markers, as the Rust executor's (`crash_marker`, `count_crashes`) ---------------

    @staticmethod
    def _crash_key(task: task_pb2.TaskMessage) -> str:
        return f"inflight.{task.goal_id}.{task.node_id}"

    def _supervised(self, task: task_pb2.TaskMessage) -> str:
        """What the supervisor is told a running task is: its crash marker's key, then (on an
        identity, which reaches the ledger only with it) the task's memory token after a space."""
        key = self._crash_key(task)
        return f"{key} {task.memory_token}" if self.identity and task.memory_token else key

    def _task_ledger(self, token: str):
        """The ledger as a task with `token` reaches it: the bucket, or its goal's entries through
        the memory service on an identity."""
        if self._ledger is not None:
            return self._ledger
        return broker.BrokeredLedger(broker.TaskBroker(self._nc, self.prefix, token))

    def _task_artifacts(self, token: str) -> Artifacts:
        """The artifacts as a task with `token` reaches them (see `_task_ledger`)."""
        if self._artifacts is not None:
            return self._artifacts
        return broker.BrokeredArtifacts(broker.TaskBroker(self._nc, self.prefix, token))

    @staticmethod
    def _marker_crashes(value: bytes | None) -> int:
        try:
            return int((json.loads(value or b"{}") or {}).get("crashes", 0))
        except (ValueError, TypeError, AttributeError):
            return 0

    async def _crash_marker(self, task: task_pb2.TaskMessage, msg) -> int | None:
        """The crashes counted on the task's node so far, or None when it has no marker. A marker
        `{crashes, node}` exists only once a process crashed while running the node (its
        supervisor knew it ran, and the next process counted it), so only a redelivery or a later
        attempt reads one; a first delivery reads nothing."""
        if msg.metadata.num_delivered <= 1 and task.attempt <= 1:
            return None
        try:
            value = await self._task_ledger(task.memory_token).get(self._crash_key(task))
        except Exception as e:  # noqa: BLE001 - unreadable: none counted
            log.warning("cannot read the crash marker: %s", e)
            return None
        return None if value is None else self._marker_crashes(value)

    async def _clear_crash_marker(self, task: task_pb2.TaskMessage) -> None:
        """Clears a marker once its task ran to an outcome: a lost clear costs at most one
        miscounted death on a later redelivery."""
        try:
            await self._task_ledger(task.memory_token).remove(self._crash_key(task))
        except Exception as e:  # noqa: BLE001 - see above
            log.warning("cannot clear the crash marker: %s", e)

    async def _count_crashes(self, crashed: list[str]) -> int:
        """Counts one crash on each task the supervisor said the crashed process had in flight
        (each its crash marker's key, with its memory token after a space on an identity)."""
        counted = 0
        for told in crashed:
            key, _, token = told.partition(" ")
            node = key.removeprefix("inflight.")
            if node == key:
                log.warning("the supervisor handed over %s, which is not a crash marker", key)
                continue
            ledger = self._task_ledger(token)
            try:
                entry = await ledger.entry(key)
                live = entry if entry is not None and entry.live else None
                crashes = (self._marker_crashes(live.value) if live else 0) + 1
                marker = json.dumps({"crashes": crashes, "node": node}).encode()
                if live:
                    await ledger.replace(key, marker, live.revision)
                else:
                    await ledger.put(key, marker)
                counted += 1
                log.warning("a task was in flight when its process crashed: %s, %d crash(es)", key, crashes)
            except Exception as e:  # noqa: BLE001 - the others are still counted
                log.warning("cannot count a crash on %s: %s", key, e)
        return counted

    async def _quarantine(self, task: task_pb2.TaskMessage, msg, deaths: int, traceparent: str | None) -> None:
        """Moves a task that crashed its consumer to the DLQ and fails its node `POISON_MESSAGE`,
        so the workers serving its type stay up for every other goal."""
        reason = f"crashed its consumer: task {task.task_id} was in flight when {deaths} agent processes died"
        log.warning("%s; moving it to the dlq", reason)
        result = _failed(self._result(task), "POISON_MESSAGE", reason)
        try:
            await self._publish_result(task, msg, result, traceparent)
        except Exception as e:  # noqa: BLE001 - not settled: delivered again
            log.warning("cannot publish the quarantined task's result: %s; asking for redelivery", e)
            await msg.nak(delay=1)
            return
        await self._clear_crash_marker(task)
        await self._dead_letter(msg, reason)

    def _record(self, ok: bool, elapsed_ms: int) -> None:
        value = 1.0 if ok else 0.0
        if self._seen == 0:
            self._success_rate, self._latency_ms = value, float(elapsed_ms)
        else:
            self._success_rate += 0.1 * (value - self._success_rate)
            self._latency_ms += 0.1 * (elapsed_ms - self._latency_ms)
        self._seen += 1

    def _result(self, task: task_pb2.TaskMessage) -> task_pb2.TaskResult:
        """A result of `task` by this worker, started now, its outcome still to set."""
        return task_pb2.TaskResult(goal_id=task.goal_id, node_id=task.node_id, task_id=task.task_id,
                                   attempt=task.attempt, agent_id=self.agent_id, started_unix_ms=_now_ms(),
                                   task_type=task.task_type)

    async def _run(self, task: task_pb2.TaskMessage, msg) -> task_pb2.TaskResult:
        result = self._result(task)

        def fail(code: str, message: str, retryable: bool | None = None) -> task_pb2.TaskResult:
            return _failed(result, code, message, retryable)

        spec = self.tasks.get(task.task_type)
        if spec is None:
            return fail("INVALID_ARGUMENT", f"this worker has no task type `{task.task_type}`")
        if task.deadline_unix_ms and _now_ms() >= task.deadline_unix_ms:
            return fail("TIMEOUT", "the task's deadline passed before it started")
        try:
            inputs = json.loads(task.inputs_json) if task.inputs_json.strip() else {}
        except ValueError as e:
            return fail("INVALID_ARGUMENT", f"inputs are not valid JSON: {e}")
        # Inputs that reference artifacts (large outputs of other nodes, or the whole inputs, which
        # the dispatcher offloads when they are large) get their content here. Only the goal's own
        # artifacts resolve, and the total is bounded before anything loads.
        if isinstance(inputs, dict):
            try:
                inputs = await self._task_artifacts(task.memory_token).resolve(inputs, task.goal_id)
            except Exception as e:  # noqa: BLE001 - every failure fails the task, typed
                typed = isinstance(e, (errors.InvalidArgument, errors.NotFound, errors.Denied))
                return fail(e.code if typed else "UNAVAILABLE",
                            f"cannot resolve the inputs' artifacts: {getattr(e, 'message', e)}")
        if not isinstance(inputs, dict):
            return fail("INVALID_ARGUMENT", "inputs must be a JSON object")
        ctx = TaskContext(goal_id=task.goal_id, node_id=task.node_id, task_id=task.task_id, attempt=task.attempt,
                          task_type=task.task_type, tenant=task.tenant, worker=self,
                          _memory_token=task.memory_token)
        call = self._call(spec, inputs, ctx)
        work = asyncio.ensure_future(call)
        period = self.ack_wait_s / 3
        try:
            while True:
                done, _ = await asyncio.wait({work}, timeout=period)
                if done:
                    break
                try:
                    await msg.in_progress()
                except Exception as e:  # noqa: BLE001 - the next tick tries again
                    log.warning("progress ack failed: %s", e)
            output = work.result()
        except asyncio.CancelledError:
            work.cancel()
            return fail("CANCELLED", "the goal was cancelled")
        except asyncio.TimeoutError:
            return fail("TIMEOUT", f"`{task.task_type}` did not finish within {spec.timeout_s:g} s")
        except errors.HermesError as e:
            return fail(e.code, e.message, e.retryable)
        except spec.retry_on as e:  # type: ignore[misc]
            return fail("UNAVAILABLE", f"{type(e).__name__}: {e}", True)
        except Exception as e:  # noqa: BLE001 - a task's exception fails the task, typed
            return fail("TOOL_ERROR", f"{type(e).__name__}: {e}", False)
        try:
            text = json.dumps(output)
        except (TypeError, ValueError) as e:
            return fail("TOOL_ERROR", f"the output is not JSON: {e}")
        if spec.output_schema is not None:
            problems = _check(output, spec.output_schema, "output")
            if problems:
                return fail("TOOL_ERROR", f"the output does not match its output_schema: {'; '.join(problems)}", False)
        # Over the inline limit the output travels as an artifact and the result carries its stub.
        try:
            artifacts = self._task_artifacts(task.memory_token)
            text, reference = await artifacts.offload_json(text, task.goal_id, task.tenant)
        except Exception as e:  # noqa: BLE001 - retryable: the store may be back on the next attempt
            return fail("UNAVAILABLE", f"cannot store the large output: {e}")
        result.status = task_pb2.TASK_STATUS_SUCCEEDED
        result.output_json = text
        result.memory_ref = reference or ""
        return result

    async def _call(self, spec: TaskSpec, inputs: dict, ctx: TaskContext) -> Any:
        if spec.side_effects and not spec.wants_context:
            # A task with side effects and no steps of its own is one call, claimed whole in the
            # ledger as a Rust tool's (`{goal}.{node}.0.{hash of type and inputs}`): a redelivery
            # or a later attempt gets its recorded outcome, and one after a worker died in the
            # call fails as outcome unknown instead of running it again.
            digest = uuid.uuid5(uuid.NAMESPACE_URL, f"{spec.task_type}\n{json.dumps(inputs, sort_keys=True)}").hex
            key = f"{ctx.goal_id}.{ctx.node_id}.0.{digest}"
            ledger = self._task_ledger(ctx._memory_token)
            return await self._ledger_once(ledger, key, ctx.attempt, spec.task_type, self._invoke, (spec, inputs, ctx),
                                           {})
        return await self._invoke(spec, inputs, ctx)

    async def _invoke(self, spec: TaskSpec, inputs: dict, ctx: TaskContext) -> Any:
        kwargs = dict(inputs)
        if spec.wants_context:
            kwargs["ctx"] = ctx
        if inspect.iscoroutinefunction(spec.fn):
            return await asyncio.wait_for(spec.fn(**kwargs), spec.timeout_s)
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        call = functools.partial(context.run, spec.fn, **kwargs)
        return await asyncio.wait_for(loop.run_in_executor(None, call), spec.timeout_s)

    async def _publish_result(self, task: task_pb2.TaskMessage, msg, result: task_pb2.TaskResult,
                              traceparent: str | None) -> None:
        result.result_token = task.result_token
        result.routed = msg.subject.startswith(self._subject("task", "direct", self.agent_id, ""))
        headers = {"Nats-Msg-Id": f"result:{task.task_id}"}
        if traceparent:
            headers["traceparent"] = traceparent
        await self._js.publish(self._subject("result", task.goal_id), result.SerializeToString(), headers=headers)

    async def _ledger_once(self, ledger, key: str, attempt: int, name: str, fn: Callable[..., Any], args,
                           kwargs) -> Any:
        """`TaskContext.once`: the ledger entries are the Rust executor's (`{"attempt", "pending",
        "claim"}`, then `{"attempt", "ok"}` or `{"attempt", "error"}`), in `ledger` (the bucket, or
        the task's goal's entries through the memory service)."""
        claim = uuid.uuid4().hex
        pending = json.dumps({"attempt": attempt, "pending": True, "claim": claim}).encode()
        deadline = time.monotonic() + PENDING_GRACE_S + 15
        while True:
            if await ledger.create(key, pending):
                break
            entry = await ledger.entry(key)
            if entry is None or not entry.live:
                if time.monotonic() >= deadline:
                    raise errors.Unavailable(f"step `{name}`: cannot claim its ledger entry")
                continue  # removed meanwhile: claim it again
            recorded = json.loads(entry.value or b"null") or {}
            if "ok" in recorded:
                log.info("step %s already done; reusing its recorded outcome", name)
                return recorded["ok"]
            if "error" in recorded:
                error = recorded["error"]
                if recorded.get("attempt", 0) >= attempt:
                    raise errors.from_code(error.get("code", "TOOL_ERROR"), error.get("message", ""))
                await ledger.replace(key, pending, entry.revision)
                break
            age = time.time() - entry.written_unix_ms / 1000 if entry.written_unix_ms else PENDING_GRACE_S
            if age >= PENDING_GRACE_S or time.monotonic() >= deadline:
                raise errors.ToolError(f"step `{name}` was started by an earlier delivery (attempt "
                                       f"{recorded.get('attempt')}) whose outcome is unknown; not repeating a side effect")
            await asyncio.sleep(1.0)
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        except errors.HermesError as e:
            await ledger.put(key, json.dumps({"attempt": attempt, "error": {"code": e.code, "message": e.message}}).encode())
            raise
        except Exception as e:  # noqa: BLE001 - recorded, then raised to fail the task
            await ledger.put(key, json.dumps({"attempt": attempt, "error": {"code": "TOOL_ERROR", "message": f"{type(e).__name__}: {e}"}}).encode())
            raise
        await ledger.put(key, json.dumps({"attempt": attempt, "ok": value}).encode())
        return value


class _Tracing:
    """The worker's spans, exported over OTLP/gRPC like the Rust services' when
    `OTEL_EXPORTER_OTLP_ENDPOINT` is set and the `otel` extra is installed: each task is a span
    `task <type>` in the goal's trace, the child of the `traceparent` its task message carried,
    and its result carries this span's context on. Without either, nothing is exported and the
    incoming context is passed on as it came."""

    def __init__(self, agent_id: str):
        self.tracer = None
        if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            return
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the `otel` extra is not installed "
                        "(pip install 'hermes-agents[otel]'); no spans are exported")
            return
        name = os.environ.get("OTEL_SERVICE_NAME", "hermes-py-worker")
        self.provider = TracerProvider(resource=Resource.create({"service.name": name, "hermes.agent": agent_id}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer("hermes_agents")

    def span(self, task, parent: str | None):
        """A context manager for the task's span; yields the traceparent its result carries."""
        import contextlib

        if self.tracer is None:
            return contextlib.nullcontext(_child_traceparent(parent) if parent else None)
        return self._span(task, parent)

    @staticmethod
    def _inject() -> str | None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        return carrier.get("traceparent")

    def _span(self, task, parent: str | None):
        import contextlib

        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        @contextlib.contextmanager
        def span():
            context = TraceContextTextMapPropagator().extract({"traceparent": parent} if parent else {})
            attributes = {"goal_id": task.goal_id, "node_id": task.node_id, "task_id": task.task_id,
                          "task_type": task.task_type, "attempt": task.attempt}
            with self.tracer.start_as_current_span(f"task {task.task_type}", context=context, kind=SpanKind.CONSUMER,
                                                   attributes=attributes) as current:
                yield self._inject()

        return span()

    def failed(self, code: str, message: str) -> None:
        if self.tracer is None:
            return
        from opentelemetry.trace import get_current_span
        from opentelemetry.trace.status import Status, StatusCode

        span = get_current_span()
        span.set_status(Status(StatusCode.ERROR, message))
        span.set_attribute("error.type", code)

    def shutdown(self) -> None:
        if self.tracer is not None:
            self.provider.shutdown()


def _valid_task_type(task_type: str) -> bool:
    """As `hermes_core::topology::validate_task_type`: `.` maps to `_` in consumer names, so
    underscores are not allowed."""
    def segment(s: str) -> bool:
        return bool(s) and (s[0].islower() or s[0].isdigit()) and all(
            c.isascii() and (c.islower() or c.isdigit() or c == "-") for c in s)

    return 0 < len(task_type) <= 64 and all(segment(s) for s in task_type.split("."))


def _child_traceparent(parent: str) -> str:
    """The traceparent of a span of this worker's under `parent`: the same trace, a new span id."""
    parts = parent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32:
        return parent
    return f"{parts[0]}-{parts[1]}-{os.urandom(8).hex()}-{parts[3]}"


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def _is(value: Any, kind: str) -> bool:
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "null": value is None,
    }.get(kind, True)


def _check(value: Any, schema: dict, where: str) -> list[str]:
    """The problems of `value` against the subset of JSON Schema an `output_schema` may use:
    `type` (one or a list), `required`, `properties` and `items`, checked recursively."""
    problems = []
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_is(value, k) for k in kinds):
            return [f"{where} is {type(value).__name__}, not {' or '.join(kinds)}"]
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                problems.append(f"{where}.{name} is missing")
        for name, sub in schema.get("properties", {}).items():
            if name in value and isinstance(sub, dict):
                problems.extend(_check(value[name], sub, f"{where}.{name}"))
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problems.extend(_check(item, schema["items"], f"{where}[{i}]"))
    return problems


def _schema_of(fn: Callable) -> dict:
    """A JSON Schema for a function's keyword parameters, from their annotations and defaults."""
    properties: dict[str, Any] = {}
    required = []
    hints = {}
    try:
        import typing

        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: untyped parameters
        pass
    for name, param in inspect.signature(fn).parameters.items():
        if name == "ctx" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        kind = _JSON_TYPES.get(getattr(hints.get(name), "__origin__", None) or hints.get(name))
        properties[name] = {"type": kind} if kind else {}
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


