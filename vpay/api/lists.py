"""Stripe-shaped lists with cursor pagination, shared by every list route:
``{"object": "list", "data": [...], "has_more": bool, "url": …}``, newest
first.

Query parameters (docs/api.md, "Lists"): ``limit`` (1..100, default 10),
``starting_after`` / ``ending_before`` (an id of the list's own objects, not
both), ``created[gte]`` / ``created[lte]`` (Unix seconds or ISO 8601), and
the route's own filters. Anything else is 400 ``parameter_unknown``.

Pages are keyset pages on ``(created_at, id)`` (never OFFSET): the cursor's
row is read for its ``created_at``, and the next page is the rows strictly
older (``starting_after``) or newer (``ending_before``) than that pair, from
an index on ``(merchant_id, created_at, id)`` (sql/0019_merchant_api.sql).
So a row that exists when a walk starts is seen exactly once however many
rows are inserted during the walk, and a page costs the same on page 1 and
page 10 000. Absent bounds are given to the SQL as ``±infinity`` rather than
NULL, so the one statement keeps its index range whatever is filtered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable

import falcon
from psycopg.rows import dict_row

from vpay.api.errors import invalid, not_found
from vpay.base.queries import Q

MAX_LIMIT = 100
DEFAULT_LIMIT = 10
COMMON = ("limit", "starting_after", "ending_before", "created[gte]", "created[lte]")
_INFINITY_PAST = "-infinity"
_INFINITY_FUTURE = "infinity"
_ID = re.compile(r"^[a-z]{2,3}_[A-Za-z0-9]{1,64}$")


@dataclass(frozen=True)
class Page:
    """A checked page request: ``limit``; at most one cursor id
    (``after``: older than it, ``before``: newer than it); ``gte``/``lte``
    bounds on ``created_at`` (aware datetimes, or the SQL infinities); the
    route's own filters in ``filters`` (already checked)."""

    limit: int
    after: str | None
    before: str | None
    gte: Any
    lte: Any
    filters: dict[str, Any] = field(default_factory=dict)


def _single(req: falcon.Request, name: str) -> str | None:
    values = req.get_param_as_list(name)
    if not values:
        return None
    if len(values) > 1:
        raise invalid("parameter_invalid", f"{name} may be given once.", name)
    return values[0]


def parse_time(value: str, name: str) -> datetime:
    """``created[gte]``/``created[lte]``: Unix seconds (an integer, as Stripe
    takes it) or an ISO 8601 date-time with an offset. Raises 400
    ``parameter_invalid`` naming ``name``."""
    if re.fullmatch(r"-?[0-9]{1,12}", value):
        try:
            return datetime.fromtimestamp(int(value), tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            pass
    else:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed
    raise invalid("parameter_invalid", f"{name} must be Unix seconds or an ISO 8601 date-time "
                  "with an offset.", name)


def parse_page(req: falcon.Request, cursor_prefix: str,
               filters: dict[str, Callable[[str], Any]] | None = None) -> Page:
    """Read a list request's query. ``cursor_prefix`` is the id prefix of the
    listed objects (``pi``, ``evt``, ``re``); ``filters`` maps each of the
    route's own parameters to a checker that answers its value (or raises
    ``ApiError``). Raises 400 for an unknown parameter or a bad value."""
    filters = filters or {}
    for name in req.params:
        if name not in COMMON and name not in filters:
            raise invalid("parameter_unknown", f"Received unknown parameter: {name[:64]}", name[:64])
    raw_limit = _single(req, "limit")
    limit = DEFAULT_LIMIT
    if raw_limit is not None:
        if not re.fullmatch(r"[0-9]{1,4}", raw_limit) or not 1 <= int(raw_limit) <= MAX_LIMIT:
            raise invalid("parameter_invalid", f"limit must be a whole number from 1 to {MAX_LIMIT}.",
                          "limit")
        limit = int(raw_limit)
    after, before = _single(req, "starting_after"), _single(req, "ending_before")
    if after is not None and before is not None:
        raise invalid("parameter_invalid", "Give starting_after or ending_before, not both.",
                      "ending_before")
    for name, value in (("starting_after", after), ("ending_before", before)):
        if value is not None and not (_ID.match(value) and value.startswith(cursor_prefix + "_")):
            raise invalid("parameter_invalid", f"{name} must be the id of a listed object "
                          f"({cursor_prefix}_…).", name)
    gte_raw, lte_raw = _single(req, "created[gte]"), _single(req, "created[lte]")
    gte = parse_time(gte_raw, "created[gte]") if gte_raw is not None else _INFINITY_PAST
    lte = parse_time(lte_raw, "created[lte]") if lte_raw is not None else _INFINITY_FUTURE
    checked = {}
    for name, check in filters.items():
        value = _single(req, name)
        checked[name] = check(value) if value is not None else None
    return Page(limit, after, before, gte, lte, checked)


def one_of(name: str, allowed: Iterable[str]) -> Callable[[str], str]:
    """A filter checker: the value must be one of ``allowed``."""
    allowed = tuple(allowed)

    def check(value: str) -> str:
        if value not in allowed:
            raise invalid("parameter_invalid", f"{name} must be one of: {', '.join(allowed)}.", name)
        return value
    return check


@dataclass(frozen=True)
class Listing:
    """How one route lists: the named queries (``cursor``: the cursor row's
    ``created_at`` and ``id`` for this merchant; ``older``/``newer``: a keyset
    page each way), the noun for a missing cursor's message, and ``view``,
    a row to its JSON."""

    noun: str
    cursor: str
    older: str
    newer: str
    view: Callable[[dict[str, Any]], dict[str, Any]]
    missing_hint: str = ""


def run_page(conn, listing: Listing, page: Page, params: dict[str, Any], url: str) -> dict[str, Any]:
    """Answer one page as a list object. ``params`` are the route's query
    parameters beyond the page's own (the merchant, filters as SQL values).
    A cursor that names no object of this merchant is 404 ``resource_missing``
    (another merchant's id reads the same)."""
    base = params | {"gte": page.gte, "lte": page.lte, "limit": page.limit + 1}
    cursor_id = page.after or page.before
    with conn.cursor(row_factory=dict_row) as cur:
        if cursor_id is not None:
            row = cur.execute(Q[listing.cursor], params | {"id": cursor_id}).fetchone()
            if row is None:
                param = "starting_after" if page.after else "ending_before"
                raise not_found(f"No such {listing.noun}: {cursor_id}.{listing.missing_hint}", param)
            pair = {"t": row["created_at"], "id": row["id"]}
        else:
            pair = {"t": _INFINITY_FUTURE, "id": ""}
        if page.before is None and isinstance(page.lte, datetime):
            # Start the backward walk at created[lte] itself: (t, id) < (lte + 1 µs, '') is
            # created_at <= lte ('' sorts first), and the row bound is the one the index
            # scan starts from, so a window deep in the history reads only its own rows.
            bound = page.lte + timedelta(microseconds=1)
            if cursor_id is None or pair["t"] >= bound:
                pair = {"t": bound, "id": ""}
        if page.before is not None:
            rows = cur.execute(Q[listing.newer], base | pair).fetchall()
        else:
            rows = cur.execute(Q[listing.older], base | pair).fetchall()
    has_more = len(rows) > page.limit
    rows = rows[:page.limit]
    if page.before is not None:
        rows.reverse()  # fetched oldest first; a page is always newest first
    return {"object": "list", "url": url, "has_more": has_more, "data": [listing.view(r) for r in rows]}
