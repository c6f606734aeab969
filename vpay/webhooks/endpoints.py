"""Webhook endpoints: registration (under the URL policy), listing, enable/disable, secret rotation."""

from __future__ import annotations

import logging
from typing import Any, Callable
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import dict_row

from ..ids import new_id
from ..queries import Q


from .policy import allow_private, check_url
from .signing import new_secret

log = logging.getLogger("vpay.webhooks.endpoints")




def add_endpoint(conn: psycopg.Connection, merchant_id: str, url: str, *,
                 permit_private: bool | None = None,
                 resolver: Callable[[str, int], list[str]] | None = None) -> dict[str, Any]:
    """Register ``url`` for ``merchant_id``; answer ``{id, merchant_id, url,
    enabled, created_at, secret}``. The secret is answered here and never
    again (``list_endpoints`` omits it). Raises ``UrlRefused`` when the URL
    fails ``check_url`` (resolved now; ``permit_private`` defaults to
    ``VPAY_WEBHOOKS_ALLOW_PRIVATE``), ``LookupError`` for an unknown
    merchant. Nothing is written when it raises."""
    allowed = allow_private() if permit_private is None else permit_private
    check_url(url, allow_private=allowed, resolver=resolver)
    secret = new_secret()
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(Q["webhook_endpoint_insert"], {
                "id": new_id("we"), "merchant_id": merchant_id, "url": url,
                "secret": secret}).fetchone()
    except psycopg.errors.ForeignKeyViolation:
        raise LookupError(f"unknown merchant {merchant_id!r}") from None
    log.info("webhook endpoint added", extra={"endpoint_id": row["id"], "merchant_id": merchant_id,
                                              "host": urlsplit(url).hostname})
    return dict(row) | {"secret": secret}


def list_endpoints(conn: psycopg.Connection, merchant_id: str | None = None) -> list[dict[str, Any]]:
    """Every endpoint (of ``merchant_id`` when given), without secrets:
    ``[{id, merchant_id, url, enabled, disabled_at, disabled_reason,
    rotating, created_at}]`` ordered by merchant then creation."""
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
    """Re-enable an endpoint for events from now on (deliveries that ended
    while it was disabled are not replayed). None when unknown."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["webhook_endpoint_enable"], {"id": endpoint_id}).fetchone()
    if row is not None:
        log.info("webhook endpoint enabled", extra={"endpoint_id": endpoint_id})
    return row


def rotate_secret(conn: psycopg.Connection, endpoint_id: str,
                  overlap_seconds: float = 24 * 3600.0) -> dict[str, Any] | None:
    """Give an endpoint a new secret; answer ``{id, merchant_id, url,
    enabled, previous_secret_expires_at, secret}`` (the new secret, shown
    once), or None when unknown. For ``overlap_seconds`` (default 24 h) the
    old secret keeps signing next to the new one, so a receiver can switch
    without failing a delivery (Standard Webhooks, "Webhook headers");
    0 revokes the old secret at once. Raises ``ValueError`` when negative."""
    if overlap_seconds < 0:
        raise ValueError("overlap_seconds must be >= 0")
    secret = new_secret()
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["webhook_endpoint_rotate_secret"], {
            "id": endpoint_id, "secret": secret, "overlap": float(overlap_seconds)}).fetchone()
    if row is None:
        return None
    log.info("webhook secret rotated", extra={"endpoint_id": endpoint_id,
                                              "overlap_seconds": overlap_seconds})
    return dict(row) | {"secret": secret}
