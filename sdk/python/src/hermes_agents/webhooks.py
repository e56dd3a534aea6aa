"""Webhooks (docs/webhooks.md): a goal's callbacks and a tenant's standing endpoints are sent the
goal's end and its waits for a person, signed as the Standard Webhooks specification says.

`verify` checks a request your receiver got, with the standard library only; the `standardwebhooks`
package's `Webhook(secret).verify(body, headers)` accepts the same requests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Mapping

#: The event types a webhook is sent for.
EVENT_TYPES = ("goal.completed", "goal.failed", "goal.cancelled", "goal.needs_input", "approval.expired")


def verify(secret: str, headers: Mapping[str, str], body: bytes, tolerance_s: int = 300) -> bool:
    """Whether `body` with `headers` (`webhook-id`, `webhook-timestamp`, `webhook-signature`; any
    case) was signed with `secret` (`whsec_...`) less than `tolerance_s` seconds ago. Check the raw
    body as received, before parsing it."""
    headers = {k.lower(): v for k, v in headers.items()}
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"))
        msg_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
        if abs(time.time() - int(timestamp)) > tolerance_s:
            return False
    except (KeyError, ValueError):
        return False
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, s.split(",", 1)[1])
               for s in headers.get("webhook-signature", "").split(" ") if s.startswith("v1,"))


class Submitted(str):
    """A submitted goal's id (a `str`), with the signing secret of each callback it named, in
    order, in `callback_secrets` (empty on a repeat of an earlier submit: secrets are shown once)."""

    callback_secrets: list[str]

    def __new__(cls, goal_id: str, callback_secrets=(), duplicate: bool = False):
        self = super().__new__(cls, goal_id)
        self.callback_secrets = list(callback_secrets)
        self.duplicate = duplicate
        return self
