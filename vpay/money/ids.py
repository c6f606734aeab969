"""Identifiers: ``pi_…``, ``ch_…``, ``evt_…``, ``we_…`` and rail references.

Most ids are random (``new_id``). An event's id is not: it is a pure function
of the transition it reports (``event_id``), so that a transition written
twice on two timelines of the database (a failover to an asynchronous
standby that had not received the first write, then the worker settling the
charge again) reaches the merchant under the one id they deduplicate on
(docs/webhooks.md, rule 1; docs/deployment.md, "Replication and failover").
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

ID_LENGTH = 24
"""Characters after the prefix: base62, ~142.9 bits (62**24 ≈ 2**142.9)."""

EVENT_ID_DOMAIN = b"vpay.event.v1"
"""Domain separation of ``event_id``'s hash. Changing it changes every event
id computed from then on: a transition written before the change and again
after it would reach the merchant under two ids. Never change it."""


def new_id(prefix: str, length: int = ID_LENGTH) -> str:
    """A random id like ``ch_3kQ9…`` (base62, ~142 bits for 24 characters)."""
    return prefix + "_" + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def event_id(subject_id: str, event_type: str, step: str = "") -> str:
    """The id of the event reporting one transition: ``evt_`` and
    ``ID_LENGTH`` base62 characters of SHA-256 over ``EVENT_ID_DOMAIN``,
    ``subject_id`` (the charge's ``ch_…`` or the refund's ``re_…``),
    ``event_type`` and ``step`` (what tells two transitions of one subject
    with the same type apart: ``expired`` for the prompt expiry's
    ``payment_intent.processing``, ``""`` otherwise), NUL-separated.

    The same arguments always give the same id, in every process and
    release. A plain hash, not a keyed one: the inputs are ids the merchant
    sees anyway, an event is readable only by its own merchant
    (``GET /v1/events/{id}``), and a key would be one more secret that must
    be the same on every host and never rotate. Collisions between
    different transitions: ~2**-71 at 2**36 events (birthday bound).
    Raises ``ValueError`` for an empty ``subject_id`` or ``event_type``, or a
    NUL in any part (the separator)."""
    parts = (subject_id, event_type, step)
    if not subject_id or not event_type or any("\0" in p for p in parts):
        raise ValueError("event_id needs a subject id and an event type, without NUL characters")
    digest = hashlib.sha256(b"\0".join([EVENT_ID_DOMAIN, *(p.encode("utf-8") for p in parts)])).digest()
    n = int.from_bytes(digest, "big") % (62 ** ID_LENGTH)  # bias < 2**-113: none to speak of
    chars = []
    for _ in range(ID_LENGTH):
        n, r = divmod(n, 62)
        chars.append(_ALPHABET[r])
    return "evt_" + "".join(reversed(chars))


def new_rail_reference() -> str:
    """A fresh UUIDv4: MoMo's ``X-Reference-Id`` becomes the rail's resource id."""
    return str(uuid.uuid4())
