"""Standard Webhooks signing: secrets, the payload bytes, the signature headers.

``webhook-id`` = the event id, ``webhook-timestamp`` = the attempt's Unix time
in seconds, ``webhook-signature`` = ``v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">``, made with the ``standardwebhooks`` library so
that any Standard Webhooks library verifies it. During a secret rotation both
secrets sign (space-separated). Source: Standard Webhooks, "Signature scheme"
and "Webhook headers".
"""

from __future__ import annotations

import base64
import json
import secrets as _secrets
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from standardwebhooks.webhooks import Webhook






USER_AGENT = "vpay-webhooks/1"



def new_secret() -> str:
    """A fresh endpoint secret: ``whsec_`` + base64 of 32 random bytes
    (Standard Webhooks: symmetric secrets are 24 to 64 random bytes,
    base64, prefixed ``whsec_``)."""
    return "whsec_" + base64.b64encode(_secrets.token_bytes(32)).decode("ascii")


def payload(event: Mapping[str, Any]) -> bytes:
    """The body POSTed for an event row (``id``, ``type``, ``created_at``,
    ``data``): compact JSON ``{"id", "type", "created", "data"}``, ASCII
    only (non-ASCII escaped), ``created`` as ISO 8601 UTC. The bytes that
    are signed are exactly the bytes sent."""
    created = event["created_at"]
    if isinstance(created, datetime):
        created = created.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    doc = {"id": event["id"], "type": event["type"], "created": created, "data": event["data"]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, sort_keys=False).encode("ascii")


def signature(msg_id: str, timestamp: int, body: bytes, secrets: Iterable[str]) -> str:
    """The ``webhook-signature`` header: one ``v1,<base64>`` per secret,
    space-separated (Standard Webhooks, "Webhook headers": a list, for
    rotation). ``timestamp`` is Unix seconds; ``body`` the exact bytes sent.
    Raises ``ValueError`` when no secret is given."""
    when = datetime.fromtimestamp(int(timestamp), tz=timezone.utc)
    text = body.decode("utf-8")
    sigs = [Webhook(s).sign(msg_id, when, text) for s in secrets if s]
    if not sigs:
        raise ValueError("no secret to sign with")
    return " ".join(sigs)


def signed_headers(msg_id: str, timestamp: int, body: bytes, secrets: Iterable[str]) -> dict[str, str]:
    """The request headers of one attempt: ``content-type``, ``user-agent``
    and the three Standard Webhooks headers."""
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": signature(msg_id, timestamp, body, secrets),
    }


