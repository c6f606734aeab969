"""``Idempotency-Key`` for the creating routes (``POST /v1/payment_intents``,
``POST /v1/refunds``), written once (docs/api.md, "Idempotency").

Per merchant, kept 24 h (table ``idempotency_keys``; one key space for both
routes, the request's fingerprint names its route). The same key and the
same body replay the first answer byte for byte (``Idempotent-Replayed:
true``); the same key with another body is 409 ``idempotency_key_reused``.
Before creating, an "in progress" row is inserted in its own transaction;
the table's primary key makes one of two concurrent requests the owner and
the other gets 409 ``idempotency_key_in_use`` at once (``Retry-After: 1``;
it does not wait). Requests that fail validation store nothing.

The in-progress row names the created object's id (``pi_…``, ``re_…``)
before it exists, so a request that died half-way is recovered: once its
attempt is older than ``STALE_SECONDS`` (far beyond any request's duration),
the next request with the key takes it over and answers from the object if
it was committed, or creates it under that same id if it was not. A key
never creates two objects.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from typing import Any, Callable

import falcon
from psycopg.rows import dict_row

from vpay.api.errors import IDEMPOTENCY, ApiError, dump, invalid
from vpay.api.wire import answer
from vpay.base.queries import Q
from vpay.money.ids import new_id

log = logging.getLogger("vpay.api.idempotency")

KEEP_SECONDS = 24 * 3600
"""Idempotency-Key records are honoured for 24 h from their first use."""
STALE_SECONDS = 300
"""An in-progress attempt older than this is presumed dead: a request is
bounded well below it (rail calls are bounded at about 30 s each)."""
IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")


def header_key(req: falcon.Request) -> str | None:
    """The request's ``Idempotency-Key``, or None. Raises 400
    ``idempotency_key_invalid`` for one that is not 1-255 printable ASCII
    characters without spaces."""
    key = req.get_header("Idempotency-Key")
    if key is not None and not IDEMPOTENCY_KEY.match(key):
        raise invalid("idempotency_key_invalid", "Idempotency-Key must be 1 to 255 printable "
                      "ASCII characters without spaces.")
    return key


def fingerprint(route: str, doc: Any) -> str:
    """sha256 hex of the route and the body's canonical JSON: the same key
    with another body, or on another route, is a reuse."""
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(route.encode() + b"\n" + canonical.encode()).hexdigest()


def _in_use() -> ApiError:
    return ApiError(409, IDEMPOTENCY, "idempotency_key_in_use",
                    "Another request with this Idempotency-Key is in progress; retry shortly.",
                    headers={"Retry-After": "1"})


def run(db, resp: falcon.Response, *, merchant_id: str, key: str, request_sha256: str,
        prefix: str, load: Callable[[Any, str], dict[str, Any] | None],
        create: Callable[[str], dict[str, Any]], status: int = 201) -> None:
    """Answer a creating request under ``key``. ``prefix`` is the created
    object's id prefix (``pi``, ``re``); ``load(conn, id)`` reads the
    merchant's object or None; ``create(id)`` creates it under that id and
    answers its JSON (raising ``ApiError`` for a refusal: nothing is then
    recorded and the key is forgotten)."""
    ident = {"merchant_id": merchant_id, "key": key}
    owned: tuple[str, bool] | None = None  # (object id, fresh)
    for _ in range(3):  # a record may expire or be swept between two reads
        with db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            claimed = cur.execute(Q["idempotency_claim"], ident | {
                "request_sha256": request_sha256, "payment_intent_id": new_id(prefix),
                "keep": KEEP_SECONDS}).fetchone()
            if claimed is not None:
                owned = (claimed["payment_intent_id"], True)
                break
            found = cur.execute(Q["idempotency_find"], ident | {
                "keep": KEEP_SECONDS, "stale": STALE_SECONDS}).fetchone()
            if found is None:
                continue
            if found["request_sha256"] != request_sha256:
                raise ApiError(409, IDEMPOTENCY, "idempotency_key_reused",
                               "Keys for idempotent requests can only be used with the same "
                               "parameters they were first used with.")
            if found["status_code"] is not None:
                answer(resp, found["status_code"], found["response_body"].encode("utf-8"),
                       {"Idempotent-Replayed": "true"})
                return
            if not found["stale"]:
                raise _in_use()
            taken = cur.execute(Q["idempotency_take_over"], ident | {
                "locked_at": found["locked_at"]}).fetchone()
            if taken is None:
                raise _in_use()
            log.warning("idempotency: taking over a stale attempt",
                        extra={"merchant": merchant_id, "object_id": found["payment_intent_id"]})
            owned = (found["payment_intent_id"], False)
            break
    if owned is None:
        raise _in_use()
    object_id, fresh = owned
    body = dump(_run_owned(db, merchant_id, key, object_id, fresh, load, create))
    try:
        with db.connection() as conn:
            conn.execute(Q["idempotency_complete"], ident | {
                "payment_intent_id": object_id, "status_code": status,
                "response_body": body.decode("utf-8")})
    except Exception:  # the object exists; a retry after STALE_SECONDS recovers the record
        log.exception("idempotency: could not record the answer",
                      extra={"merchant": merchant_id, "object_id": object_id})
    answer(resp, status, body)


def _run_owned(db, merchant_id: str, key: str, object_id: str, fresh: bool,
               load: Callable[[Any, str], dict[str, Any] | None],
               create: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Create under ``object_id`` unless it exists. On failure, forget the
    key if nothing was committed; if the object exists, answer it."""
    ident = {"merchant_id": merchant_id, "key": key, "payment_intent_id": object_id}
    if not fresh:
        with db.connection() as conn:
            existing = load(conn, object_id)
        if existing is not None:
            return existing
    try:
        return create(object_id)
    except Exception as exc:
        try:
            with db.connection() as conn:
                existing = load(conn, object_id)
                if existing is None:
                    conn.execute(Q["idempotency_release"], ident)
        except Exception:
            log.exception("idempotency: outcome unknown; the key stays in progress",
                          extra={"merchant": merchant_id, "object_id": object_id})
            raise exc from None
        if existing is None:
            raise
        log.warning("object created but its request failed afterwards; answering the object",
                    extra={"merchant": merchant_id, "object_id": object_id,
                           "error": type(exc).__name__})
        return existing
