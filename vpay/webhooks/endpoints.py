"""Webhook endpoints: registration (under the URL policy and the per-merchant limit), listing, enable/disable, deletion, secret rotation.

Every read and write of an endpoint's secret goes through this module (the
merchant API, the CLI and the demo call it), so that how secrets are kept
is decided in one place."""

from __future__ import annotations

import logging
from typing import Any, Callable
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import dict_row

from vpay.base import secretbox
from vpay.base.queries import Q
from vpay.money.ids import new_id
from vpay.webhooks.policy import allow_private, check_url
from vpay.webhooks.sealing import check_keys
from vpay.webhooks.signing import new_secret

log = logging.getLogger("vpay.webhooks.endpoints")

MAX_ENDPOINTS_PER_MERCHANT = 16
"""The most webhook endpoints one merchant may register (Stripe allows 16 per
account): every event is fanned out to each, so the limit bounds one
merchant's share of the webhooks lane. Counted under a lock on the merchant
row, so concurrent registrations cannot pass it together."""


class EndpointLimitReached(ValueError):
    """The merchant has ``MAX_ENDPOINTS_PER_MERCHANT`` endpoints already."""


def add_endpoint(conn: psycopg.Connection, merchant_id: str, url: str, *,
                 permit_private: bool | None = None,
                 resolver: Callable[[str, int], list[str]] | None = None,
                 enabled_events: list[str] | None = None, description: str | None = None,
                 limit: int | None = MAX_ENDPOINTS_PER_MERCHANT) -> dict[str, Any]:
    """Register ``url`` for ``merchant_id``; answer ``{id, merchant_id, url,
    enabled, enabled_events, description, created_at, secret}``. The secret
    is answered here and never again (``list_endpoints`` omits it).
    ``enabled_events``: the event types it receives (default ``["*"]``,
    every type; checking the names is the caller's). Raises ``UrlRefused``
    when the URL fails ``check_url`` (resolved now; ``permit_private``
    defaults to ``VPAY_WEBHOOKS_ALLOW_PRIVATE``), ``LookupError`` for an
    unknown merchant, ``EndpointLimitReached`` when the merchant has
    ``limit`` endpoints already (None: no limit). Nothing is written when it
    raises. The secret is stored sealed (``vpay.base.secretbox``;
    ``ConfigError`` without keys)."""
    allowed = allow_private() if permit_private is None else permit_private
    check_url(url, allow_private=allowed, resolver=resolver)
    secret = new_secret()
    sealed = _sealer(conn).seal(secret)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        if cur.execute(Q["webhook_endpoint_lock_merchant"], {"merchant_id": merchant_id}).fetchone() is None:
            raise LookupError(f"unknown merchant {merchant_id!r}")
        held = cur.execute(Q["webhook_endpoint_count"], {"merchant_id": merchant_id}).fetchone()
        if limit is not None and held["endpoints"] >= limit:
            raise EndpointLimitReached(f"merchant {merchant_id} has {held['endpoints']} webhook "
                                       f"endpoints; the limit is {limit}")
        row = cur.execute(Q["webhook_endpoint_insert"], {
            "id": new_id("we"), "merchant_id": merchant_id, "url": url, "secret": sealed,
            "enabled_events": list(enabled_events or ["*"]), "description": description}).fetchone()
    log.info("webhook endpoint added", extra={"endpoint_id": row["id"], "merchant_id": merchant_id,
                                              "host": urlsplit(url).hostname})
    return dict(row) | {"secret": secret}


def _sealer(conn: psycopg.Connection) -> secretbox.SecretBox:
    """The box a new secret is sealed with, once it has opened the newest
    stored secret (``sealing.check_keys``): a process started with other
    keys than the workers' would otherwise store secrets no worker can open
    (found by the fresh-clone review). Raises ``ConfigError`` (no keys) or
    ``secretbox.WrongKey``; nothing is written."""
    box = secretbox.default()
    check_keys(conn, box)
    return box


def list_endpoints(conn: psycopg.Connection, merchant_id: str | None = None) -> list[dict[str, Any]]:
    """Every endpoint (of ``merchant_id`` when given), without secrets:
    ``[{id, merchant_id, url, enabled, enabled_events, description,
    disabled_at, disabled_reason, rotating, previous_secret_expires_at,
    created_at}]`` ordered by merchant then creation."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["webhook_endpoint_list"], {"merchant_id": merchant_id}).fetchall()


def disable_endpoint(conn: psycopg.Connection, endpoint_id: str, reason: str) -> dict[str, Any] | None:
    """Stop deliveries to an endpoint; its pending deliveries end as
    ``skipped`` when they next run. Idempotent (the first reason is kept).
    Answers the endpoint (no secret), or None when unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["webhook_endpoint_disable"], {"id": endpoint_id, "reason": reason}).fetchone()
    if row is not None:
        log.warning("webhook endpoint disabled", extra={"endpoint_id": endpoint_id, "reason": reason})
    return row


def enable_endpoint(conn: psycopg.Connection, endpoint_id: str) -> dict[str, Any] | None:
    """Re-enable an endpoint; answer it with ``requeued``, the number of
    deliveries put back on the queue, or None when unknown. After a URL-policy
    hold (``hold_endpoint``) every delivery that waited is re-queued: those
    held, and events of the merchant since the hold that the fan-out passed
    by. After any other disable (an operator, a 410) deliveries that ended
    while it was disabled are not replayed: events from now on only."""
    with conn.transaction():
        requeued = len(conn.execute(Q["webhook_endpoint_requeue_held"], {"id": endpoint_id}).fetchall())
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(Q["webhook_endpoint_enable"], {"id": endpoint_id}).fetchone()
    if row is not None:
        log.info("webhook endpoint enabled", extra={"endpoint_id": endpoint_id, "requeued": requeued})
        row = dict(row) | {"requeued": requeued}
    return row


def redeliver(conn: psycopg.Connection, event_id: str, endpoint_id: str) -> int | None:
    """Send event ``event_id`` to endpoint ``endpoint_id`` again: its delivery
    pending and its ``deliver:`` job due now, the retry schedule restarted
    (``webhook_redeliver``). A delivery in flight is left to finish. Answers
    the job id, or None when the event is unknown, not the endpoint's
    merchant's, the endpoint disabled, or its job leased."""
    with conn.transaction():
        row = conn.execute(Q["webhook_redeliver"], {"event_id": event_id, "endpoint_id": endpoint_id}).fetchone()
    return row[0] if row else None


def hold_endpoint(conn: psycopg.Connection, endpoint_id: str, reason: str) -> bool:
    """Disable an endpoint whose URL the worker's policy refuses for good
    (``disabled_cause = 'url_policy'``) and raise one
    ``webhook_endpoint_disabled`` alert naming ``reason``, in one statement.
    Answers True for the call that disabled it; later calls (deliveries in
    flight at the same time) change nothing and answer False."""
    held = conn.execute(Q["webhook_endpoint_hold"], {"id": endpoint_id, "reason": reason[:500]}).fetchone()
    if held is not None:
        log.warning("webhook endpoint disabled: its URL is refused by this worker's policy",
                    extra={"endpoint_id": endpoint_id, "reason": reason})
    return held is not None


def held_by_policy(conn: psycopg.Connection, endpoint_id: str) -> bool:
    """Whether the endpoint is disabled by a URL-policy hold (its deliveries wait)."""
    row = conn.execute(Q["webhook_endpoint_disabled_cause"], {"id": endpoint_id}).fetchone()
    return row is not None and row[0] == "url_policy"


def get_endpoint(conn: psycopg.Connection, merchant_id: str, endpoint_id: str) -> dict[str, Any] | None:
    """One endpoint of ``merchant_id`` (``list_endpoints``' fields, no
    secret), or None: another merchant's reads like a missing one."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["webhook_endpoint_get"], {"id": endpoint_id, "merchant_id": merchant_id}).fetchone()


def delete_endpoint(conn: psycopg.Connection, merchant_id: str, endpoint_id: str) -> bool:
    """Remove an endpoint of ``merchant_id`` with its secrets and delivery
    records; answers whether it existed. Queued deliveries to it end without
    a request (the deliver handler finds no endpoint)."""
    gone = conn.execute(Q["webhook_endpoint_delete"], {"id": endpoint_id, "merchant_id": merchant_id}).fetchone()
    if gone is not None:
        log.info("webhook endpoint deleted", extra={"endpoint_id": endpoint_id, "merchant_id": merchant_id})
    return gone is not None


def rotate_secret(conn: psycopg.Connection, endpoint_id: str,
                  overlap_seconds: float = 24 * 3600.0, *,
                  merchant_id: str | None = None) -> dict[str, Any] | None:
    """Give an endpoint a new secret; answer ``{id, merchant_id, url,
    enabled, enabled_events, description, previous_secret_expires_at,
    created_at, secret}`` (the new secret, shown once), or None when unknown
    (or, with ``merchant_id``, not that merchant's). For ``overlap_seconds`` (default 24 h) the
    old secret keeps signing next to the new one, so a receiver can switch
    without failing a delivery (Standard Webhooks, "Webhook headers");
    0 revokes the old secret at once. Raises ``ValueError`` when negative.
    The new secret is stored sealed; the old one stays as it was stored."""
    if overlap_seconds < 0:
        raise ValueError("overlap_seconds must be >= 0")
    secret = new_secret()
    sealed = _sealer(conn).seal(secret)
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["webhook_endpoint_rotate_secret"], {
            "id": endpoint_id, "secret": sealed, "overlap": float(overlap_seconds),
            "merchant_id": merchant_id}).fetchone()
    if row is None:
        return None
    log.info("webhook secret rotated", extra={"endpoint_id": endpoint_id,
                                              "overlap_seconds": overlap_seconds})
    return dict(row) | {"secret": secret}
