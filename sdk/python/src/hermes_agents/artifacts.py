"""Artifacts: payloads too large to travel inline, kept by reference in the `hermes_artifacts`
JetStream object store, exactly as `hermes_core::artifacts` keeps them (docs/protocol.md):

- an output over 64 KiB is stored in 32 KiB chunks and travels as a stub,
  `{"$artifact": "art-...", "size_bytes": N, "content_type": "application/json", "preview": "..."}`,
  and the result's `memory_ref` names it;
- a `$ref` to such an output reaches a task as `{"$artifact": ref, "path": [...]}`, and the
  worker replaces it with the value it stands for before the function runs;
- a task resolves only its own goal's artifacts, and the resolved inputs are bounded before
  anything is loaded: each stub counts with its artifact's full size.

nats-py's object store does not read or write an object's `metadata` map, where the goal, the
content type and the preview live, so the meta message is read and written here directly (the
object store's layout: chunks on `$O.<bucket>.C.<nuid>`, the meta, rolled up, on
`$O.<bucket>.M.<base64url(name)>`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from hermes_agents import errors

#: `hermes_core::artifacts::DEFAULT_INLINE_LIMIT`: larger outputs become artifacts.
INLINE_LIMIT = 64 * 1024
#: `hermes_core::artifacts::CHUNK_SIZE`.
CHUNK_SIZE = 32 * 1024
#: `hermes_core::artifacts::MAX_RESOLVED_INPUT_BYTES`.
MAX_RESOLVED_INPUT_BYTES = 96 * 1024 * 1024
#: The stub key naming an artifact.
ARTIFACT_KEY = "$artifact"
PREVIEW_CHARS = 200
_STUB_KEYS = frozenset({"path", "size_bytes", "content_type", "preview", ARTIFACT_KEY})
_REFERENCE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def _digest(data: bytes) -> str:
    """The object store's digest of `data`, as its meta records it."""
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


def stub_reference(value: Any) -> str | None:
    """The artifact a stub names, when `value` is one: an object with a string `$artifact` and no
    keys but the stub's."""
    if isinstance(value, dict) and isinstance(value.get(ARTIFACT_KEY), str) and set(value) <= _STUB_KEYS:
        return value[ARTIFACT_KEY]
    return None


def _collect(value: Any, out: list[str]) -> None:
    reference = stub_reference(value)
    if reference is not None:
        out.append(reference)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, out)
    elif isinstance(value, list):
        for item in value:
            _collect(item, out)


def stub_references(value: Any) -> list[str]:
    """The artifacts the stubs anywhere in `value` name, each once, in order."""
    references: list[str] = []
    _collect(value, references)
    return list(dict.fromkeys(references))


def content_value(data: bytes) -> Any:
    """What an artifact's content stands for: the stored JSON, or its text when it is not JSON."""
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def _lookup(value: Any, path: list[str]) -> tuple[bool, Any]:
    for segment in path:
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            return False, None
    return True, value


def substitute(value: Any, loaded: dict[str, Any]) -> Any:
    """`value` with every stub replaced by the content `loaded` holds for its artifact, at the
    stub's `path` (`errors.InvalidArgument` when the path is not there)."""
    reference = stub_reference(value)
    if reference is not None:
        path = [str(p) for p in value.get("path") or []]
        found, content = _lookup(loaded[reference], path)
        if not found:
            raise errors.InvalidArgument(f"path {'.'.join(path)} not found in artifact `{reference}`")
        return content
    if isinstance(value, dict):
        return {k: substitute(v, loaded) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, loaded) for v in value]
    return value


class Artifacts:
    """The artifact store of one deployment, over a connected JetStream context."""

    def __init__(self, js, bucket: str):
        self._js = js
        self.bucket = bucket
        self._stream = f"OBJ_{bucket}"

    def _meta_subject(self, reference: str) -> str:
        return f"$O.{self.bucket}.M.{base64.urlsafe_b64encode(reference.encode()).decode()}"

    async def info(self, reference: str) -> dict:
        """The object's info as stored (name, size, nuid, digest, metadata...)."""
        from nats.js.errors import NotFoundError

        if not _REFERENCE.match(reference):
            raise errors.InvalidArgument(f"`{reference}` is not an artifact reference")
        try:
            msg = await self._js.get_last_msg(self._stream, self._meta_subject(reference))
        except NotFoundError:
            raise errors.NotFound(f"artifact `{reference}` not found") from None
        info = json.loads(msg.data or b"{}")
        if info.get("deleted"):
            raise errors.NotFound(f"artifact `{reference}` not found")
        return info

    async def get(self, reference: str) -> bytes:
        """The whole content of an artifact, checked against its digest."""
        info = await self.info(reference)
        size = int(info.get("size") or 0)
        if size == 0:
            return b""
        sub = await self._js.subscribe(f"$O.{self.bucket}.C.{info['nuid']}", ordered_consumer=True)
        data = bytearray()
        try:
            async for msg in sub.messages:
                data += msg.data
                if msg.metadata.num_pending == 0 or len(data) >= size:
                    break
        finally:
            await sub.unsubscribe()
        if len(data) != size or (info.get("digest") and info["digest"].upper() != _digest(data).upper()):
            raise errors.Unavailable(f"artifact `{reference}` is damaged: its content does not match its digest")
        return bytes(data)

    async def put(self, data: bytes, content_type: str, goal_id: str, tenant: str = "") -> dict:
        """Stores `data` for `goal_id`, kept for the bucket's retention, and returns its stub."""
        reference = f"art-{uuid.uuid4().hex}"
        nuid = uuid.uuid4().hex
        chunk_subject = f"$O.{self.bucket}.C.{nuid}"
        chunks = 0
        for start in range(0, len(data), CHUNK_SIZE):
            await self._js.publish(chunk_subject, data[start:start + CHUNK_SIZE])
            chunks += 1
        preview = data[:PREVIEW_CHARS * 4].decode(errors="replace")[:PREVIEW_CHARS]
        info = {
            "name": reference,
            "bucket": self.bucket,
            "nuid": nuid,
            "size": len(data),
            "chunks": chunks,
            "mtime": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            "digest": _digest(data),
            "options": {"max_chunk_size": CHUNK_SIZE},
            "metadata": {
                "content_type": content_type,
                "goal_id": goal_id,
                "created_unix_ms": str(int(time.time() * 1000)),
                "expires_unix_ms": "0",
                "preview": preview,
                "tenant": tenant,
            },
        }
        try:
            await self._js.publish(self._meta_subject(reference), json.dumps(info).encode(),
                                   headers={"Nats-Rollup": "sub"})
        except Exception:
            await self._js.purge_stream(self._stream, subject=chunk_subject)
            raise
        return {ARTIFACT_KEY: reference, "size_bytes": len(data), "content_type": content_type, "preview": preview}

    async def offload_json(self, text: str, goal_id: str, tenant: str = "") -> tuple[str, str | None]:
        """`text` as it is when it fits inline; otherwise stored, and its stub and reference."""
        data = text.encode()
        if len(data) <= INLINE_LIMIT:
            return text, None
        stub = await self.put(data, "application/json", goal_id, tenant)
        return json.dumps(stub), stub[ARTIFACT_KEY]

    async def resolve(self, value: Any, goal_id: str, max_bytes: int = MAX_RESOLVED_INPUT_BYTES) -> Any:
        """Replaces every artifact stub in `value` with the value it stands for (the stored JSON,
        or its text when it is not JSON), at the stub's `path`. Only `goal_id`'s artifacts
        resolve (`DENIED` otherwise), and over `max_bytes` in all the inputs are refused
        (`INVALID_ARGUMENT`) before anything is loaded."""
        references: list[str] = []
        _collect(value, references)
        if not references:
            return value
        sizes: dict[str, int] = {}
        total = 0
        for reference in references:
            if reference not in sizes:
                info = await self.info(reference)
                owner = (info.get("metadata") or {}).get("goal_id", "")
                if owner != goal_id:
                    raise errors.Denied(f"artifact `{reference}` belongs to another goal; a goal resolves only "
                                        "its own artifacts")
                sizes[reference] = int(info.get("size") or 0)
            total += sizes[reference]
            if total > max_bytes:
                raise errors.InvalidArgument(
                    f"the inputs would take over {max_bytes} bytes once their {len(references)} artifact "
                    "reference(s) are resolved (each counts with its artifact's full size); pass fewer or "
                    "smaller references")
        loaded = {reference: content_value(await self.get(reference)) for reference in sizes}
        return substitute(value, loaded)
