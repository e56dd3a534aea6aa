"""A task's ledger entries and artifacts, as `hermes_core::broker`, `task_kv` and `artifacts` reach
them: in the buckets themselves, or through the memory service for a worker that connects as its
own NATS identity (`agent_<id>`, docs/security.md, "Per-agent NATS identities").

Such a worker may not touch the `hermes_ledger` bucket or the `hermes_artifacts` object store:
their subjects name keys and objects, not goals or tenants, so no permission could confine it to
its own tasks'. It asks the memory service instead (`<prefix>.memory.rpc.<method>`), sending the
`memory_token` of the task it works for; the service does the operation only on that task's goal's
entries and artifacts. Requests that reach no memory replica are sent again for up to
`BROKER_PATIENCE_S` (a request that reached no one is safe to repeat, whatever it does).
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
import uuid
from dataclasses import dataclass

from hermes_agents import errors
from hermes_agents._proto.hermes.v1 import memory_pb2
from hermes_agents.artifacts import Artifacts, _digest

log = logging.getLogger("hermes_agents.broker")

#: The prefix of the NATS users that are agents' own identities, as `hermes_core::broker`.
AGENT_IDENTITY_PREFIX = "agent_"
#: Reply headers of a failed memory request.
ERROR_CODE_HEADER = "Hermes-Error-Code"
ERROR_MESSAGE_HEADER = "Hermes-Error-Message"
#: How long one brokered request waits for its answer (`hermes_core::broker::BROKER_TIMEOUT`).
BROKER_TIMEOUT_S = 15.0
#: How long a request is sent again while no memory replica runs (`BROKER_PATIENCE`).
BROKER_PATIENCE_S = 30.0


def is_agent_identity(user: str | None) -> bool:
    """Whether a NATS user is an agent's own identity (`agent_<id>`)."""
    return bool(user) and user.startswith(AGENT_IDENTITY_PREFIX) and len(user) > len(AGENT_IDENTITY_PREFIX)


def url_credentials(url: str) -> tuple[str, str | None] | None:
    """The user a NATS URL names and its password (None without one), from the first of a
    cluster's comma-separated URLs that names a user, as `hermes_core::bus::url_credentials`."""
    for one in url.split(","):
        parsed = urllib.parse.urlsplit(one.strip())
        if parsed.username:
            password = None if parsed.password is None else urllib.parse.unquote(parsed.password)
            return urllib.parse.unquote(parsed.username), password
    return None


def url_user(url: str) -> str | None:
    """The user a NATS URL connects as with a password; a lone token names no user."""
    credentials = url_credentials(url)
    return credentials[0] if credentials and credentials[1] is not None else None


def password_reader(path: str):
    """A callable nats-py calls for the password at every connect: the file's content, so a
    token renewed in place (a Kubernetes projected service-account token) is the one sent."""
    def read() -> str:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()

    try:
        read()  # a missing file stops the start, naming it
    except OSError as e:
        raise errors.InvalidArgument(f"cannot read the NATS password file {path}: {e}") from None
    return read


def piece_bytes(max_payload: int) -> int:
    """The content bytes one brokered message carries under a server's `max_payload`, as
    `hermes_core::broker::piece_bytes`."""
    most = 512 * 1024
    if not max_payload:
        return most
    return max(4 * 1024, min(most, max_payload - 16 * 1024))


class TaskBroker:
    """One task's way to its goal's ledger entries and artifacts through the memory service."""

    def __init__(self, nc, prefix: str, token: str):
        self._nc = nc
        self._prefix = prefix
        self.token = token

    async def call(self, method: str, request, reply_type):
        """Sends `request` to memory's `method` and decodes its `reply_type` answer; an error
        reply raises the typed error it names. Sent again while no replica is running."""
        import nats.errors

        subject = f"{self._prefix}.memory.rpc.{method}"
        body = request.SerializeToString()
        deadline = time.monotonic() + BROKER_PATIENCE_S
        pause = 0.1
        while True:
            try:
                reply = await self._nc.request(subject, body, timeout=BROKER_TIMEOUT_S)
                break
            except nats.errors.NoRespondersError:
                if time.monotonic() >= deadline:
                    raise errors.Unavailable(f"the memory service (no replica has been running for "
                                             f"{BROKER_PATIENCE_S:g} s)") from None
                log.warning("no memory service replica is running; asking `%s` again", method)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                raise errors.Timeout(f"memory `{method}` did not answer within {BROKER_TIMEOUT_S:g} s") from None
        headers = reply.headers or {}
        code = headers.get(ERROR_CODE_HEADER)
        if code:
            raise errors.from_code(code, headers.get(ERROR_MESSAGE_HEADER, ""))
        return reply_type.FromString(reply.data)

    def piece_bytes(self) -> int:
        return piece_bytes(getattr(self._nc, "max_payload", 0) or 0)


@dataclass
class Entry:
    """A ledger entry: its value, revision, whether it is live (not a delete marker) and when it
    was written."""

    value: bytes
    revision: int
    live: bool
    written_unix_ms: int


class BucketLedger:
    """The ledger bucket itself, for a worker on the shared `agent` user or a pool's user."""

    def __init__(self, kv):
        self._kv = kv

    async def entry(self, key: str) -> Entry | None:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            entry = await self._kv.get(key)
        except KeyDeletedError as e:
            return Entry(b"", getattr(getattr(e, "entry", None), "revision", 0) or 0, False, 0)
        except KeyNotFoundError:
            return None
        if entry.operation is not None:
            return Entry(b"", entry.revision, False, 0)
        created = getattr(entry, "created", None)
        written = int(created.timestamp() * 1000) if created else 0
        return Entry(entry.value or b"", entry.revision, True, written)

    async def get(self, key: str) -> bytes | None:
        entry = await self.entry(key)
        return entry.value if entry and entry.live else None

    async def create(self, key: str, value: bytes) -> bool:
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            await self._kv.create(key, value)
            return True
        except KeyWrongLastSequenceError:
            return False

    async def replace(self, key: str, value: bytes, revision: int) -> None:
        await self._kv.update(key, value, last=revision)

    async def put(self, key: str, value: bytes) -> None:
        await self._kv.put(key, value)

    async def remove(self, key: str) -> None:
        await self._kv.delete(key)


class BrokeredLedger:
    """The ledger entries of one task's goal, through the memory service."""

    def __init__(self, broker: TaskBroker):
        self._broker = broker

    async def _ask(self, op: int, key: str, value: bytes = b"", revision: int = 0) -> memory_pb2.LedgerReply:
        request = memory_pb2.LedgerRequest(task_token=self._broker.token, op=op, key=key, value=value,
                                           revision=revision)
        return await self._broker.call("ledger", request, memory_pb2.LedgerReply)

    async def entry(self, key: str) -> Entry | None:
        reply = await self._ask(memory_pb2.LEDGER_OP_ENTRY, key)
        if not reply.found:
            return None
        return Entry(reply.value, reply.revision, reply.live, reply.written_unix_ms)

    async def get(self, key: str) -> bytes | None:
        reply = await self._ask(memory_pb2.LEDGER_OP_GET, key)
        return reply.value if reply.found else None

    async def create(self, key: str, value: bytes) -> bool:
        return (await self._ask(memory_pb2.LEDGER_OP_CREATE, key, value)).created

    async def replace(self, key: str, value: bytes, revision: int) -> None:
        await self._ask(memory_pb2.LEDGER_OP_REPLACE, key, value, revision)

    async def put(self, key: str, value: bytes) -> None:
        await self._ask(memory_pb2.LEDGER_OP_PUT, key, value)

    async def remove(self, key: str) -> None:
        await self._ask(memory_pb2.LEDGER_OP_REMOVE, key)


class BrokeredArtifacts(Artifacts):
    """One task's goal's artifacts, through the memory service: read a piece of chunks at a time
    and checked against size and digest, stored in one request or in parts the commit joins.
    Another goal's artifact is not found."""

    def __init__(self, broker: TaskBroker):
        super().__init__(None, "")
        self._broker = broker

    def _request(self, reference: str, cursor: int = 0) -> memory_pb2.TaskArtifactRequest:
        return memory_pb2.TaskArtifactRequest(task_token=self._broker.token, ref=reference, cursor=cursor)

    async def info(self, reference: str) -> dict:
        """The artifact's size, digest and goal, shaped as the object store's info."""
        reply = await self._broker.call("artifact_info", self._request(reference), memory_pb2.TaskArtifactInfo)
        return {"name": reply.info.ref, "size": reply.info.size_bytes, "digest": reply.digest,
                "metadata": {"goal_id": reply.info.goal_id, "content_type": reply.info.content_type,
                             "tenant": reply.info.tenant}}

    async def get(self, reference: str) -> bytes:
        info = await self.info(reference)
        size = int(info["size"])
        data = bytearray()
        cursor = 0
        while len(data) < size:
            piece = await self._broker.call("artifact_read", self._request(reference, cursor),
                                            memory_pb2.TaskArtifactPiece)
            data += piece.data
            if piece.end or not piece.data:
                break
            cursor = piece.cursor
        if len(data) != size or (info["digest"] and info["digest"].upper() != _digest(bytes(data)).upper()):
            raise errors.Unavailable(f"artifact `{reference}` changed or was cut short while it was read "
                                     f"({len(data)} of {size} bytes)")
        return bytes(data)

    async def put(self, data: bytes, content_type: str, goal_id: str, tenant: str = "") -> dict:
        """Stores `data` as the task's goal's (the token's goal and tenant, whatever is passed)."""
        token = self._broker.token
        commit = memory_pb2.TaskArtifactCommit(task_token=token, content_type=content_type)
        piece = self._broker.piece_bytes()
        if len(data) <= piece:
            commit.data = data
        else:
            commit.upload = uuid.uuid4().hex
            for index, start in enumerate(range(0, len(data), piece)):
                part = memory_pb2.TaskArtifactPart(task_token=token, upload=commit.upload, index=index,
                                                   data=data[start:start + piece])
                await self._broker.call("artifact_part", part, memory_pb2.MemoryRef)
                commit.parts = index + 1
        stored = await self._broker.call("artifact_commit", commit, memory_pb2.MemoryRef)
        return {"$artifact": stored.ref, "size_bytes": stored.size_bytes, "content_type": stored.content_type,
                "preview": stored.preview}

