"""``POST|PUT /provider/{code}/callback``: a rail's callback is a hint, never
a fact (design page, "Callbacks are hints").

The adapter's ``parse_callback`` yields identifiers only (``CallbackIds`` has
no status field) and this module reads nothing else: the body's ``status``
is never looked at. The reference is the ``ref`` query parameter we put in
the ``X-Callback-Url`` we gave the rail. Then, for the charge it names:

* its poll job is parked further out than the ladder's first rung (10 s),
  unleased and not dead-lettered → ``run_at = now()`` (pulled forward);
* it has no poll job (e.g. it is terminal) → one is enqueued, due now
  (``ON CONFLICT DO NOTHING``); for a terminal charge that poll makes one
  verification read (``vpay.handlers.poll``);
* otherwise (leased, dead-lettered, due within 10 s) → nothing.

Spacing: a charge whose status was read within the last 10 s
(``charges.last_polled_at``) is read again no sooner than that read + 10 s,
so a callback arriving just after the worker's read, or a second callback,
cannot buy an extra read at once ("an unauthenticated caller cannot spend a
rail request on a poll that was about to happen anyway"). The spacing
delays the read, never drops it: the parked poll is moved to last read +
10 s (action ``spaced``), or the missing one enqueued for then. MoMo sends
its callback once; dropping it would leave a settled payment waiting for
its poll's next rung, up to 15 min (issue "Isolation", input 4).

Orange (``{code}`` = ``orange``): the notification's only proof of origin is
its ``notif_token`` (design/rails.md, "Orange Money Web Payment"). Before the
reference is acted on, the SHA-256 hex of the token received is compared in
constant time (``hmac.compare_digest``) with the one stored at submission
(``charges.notif_token_sha256``). A missing or wrong token is treated exactly
like an unknown reference: nothing written, the same 202 bytes and headers,
logged at info (``notif_token mismatch``). The token is never logged.

A lost submission answer (M-Pesa, docs/flows/mpesa.md "A lost answer"):
the callback may carry the identifier the rail assigned and its status read
needs (``CallbackIds.status_keys``: Daraja's ``CheckoutRequestID``). It is
stored in ``charges.rail_data`` by ``charges.adopt_status_keys`` only for a
live, unconfirmed charge whose one request may have left and that holds
none yet, and only when no other charge holds it; never a status. A forged
identifier can then only make the read answer NOT_FOUND (nothing settles;
the horizon and the statement decide), never point the read at another
charge's payment.

Apart from that identifier, only ``jobs`` is ever written (no status,
intent or event), and one ``rail_callbacks`` row per callback read: the
rail, the reference, the charge if any and the action
(``unknown_reference`` and ``token_refused`` too), for the console's
payment timeline; never the body or a token. The answer is
202 with the same bytes and headers whether or not the reference names a
charge (no oracle for "does this charge exist"); a miss is logged at info.
Unknown ``{code}`` → 404; unreadable input → 400 with a generic message;
a body over 64 KiB → 413, unread.
"""

from __future__ import annotations

import hmac
import logging
import threading

import falcon
import psycopg
from psycopg.rows import dict_row

from vpay.engine import queue
from vpay.money.charges import FIRST_POLL_SECONDS, adopt_status_keys, notif_token_sha256
from vpay.base.queries import Q
from vpay.rails import KNOWN_RAILS
from vpay.rails.port import MalformedCallback, RailError
from vpay.api.errors import dump, invalid, not_found
from vpay.api.wire import MAX_BODY_BYTES, answer, read_body

log = logging.getLogger("vpay.api.callbacks")

ACCEPTED_BODY = dump({"received": True})
"""The one answer to every readable callback, hit or miss."""

PROOF_RAILS = frozenset({"orange"})
"""Rails whose callbacks carry a token to check against the stored hash."""
_NO_DIGEST = "0" * 64  # compared against when nothing is stored: the same work either way


def proof_matches(conn: psycopg.Connection, rail: str, reference: str, token: str | None) -> bool | None:
    """Whether ``token`` (Orange's ``notif_token``) is the one stored, as a
    hash, for the charge ``reference`` names: ``None`` when the reference
    names no charge, ``False`` for a missing or wrong token or a charge with
    no stored hash. The SHA-256 hex strings are compared with
    ``hmac.compare_digest`` whatever the case, so the timing does not tell
    the cases apart. Reads only."""
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(Q["callback_notif_token"], {"rail": rail, "reference": reference}).fetchone()
    stored = (found or {}).get("notif_token_sha256") or _NO_DIGEST
    given = notif_token_sha256(token) if token else _NO_DIGEST
    same = hmac.compare_digest(given.encode(), stored.encode())
    if found is None:
        return None
    return same and token is not None and found["notif_token_sha256"] is not None


def apply_hint(conn: psycopg.Connection, rail: str, reference: str,
               spacing: float = FIRST_POLL_SECONDS) -> tuple[str | None, str]:
    """Act on a callback's reference: ``(charge_id or None, action)`` where
    action is ``unknown_reference``, ``pulled_forward``, ``enqueued``,
    ``polled_recently``, ``leased``, ``dead_lettered``, ``due_soon`` or
    ``raced`` (the job changed between the read and the write), or
    ``spaced`` (pulled forward to the last read + ``spacing``, the read was
    too recent for now). Writes only ``jobs`` (see the module docstring)."""
    params = {"rail": rail, "reference": reference, "spacing": float(spacing)}
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(Q["callback_find_charge"], params).fetchone()
    if found is None:
        return None, "unknown_reference"
    charge_id = found["id"]
    if found["job_id"] is None:
        enqueued = queue.enqueue(conn, "poll", f"poll:{charge_id}", {"charge_id": charge_id},
                                 delay=found["wait_seconds"] or 0.0)
        return charge_id, "enqueued" if enqueued else "raced"
    for flag in ("leased", "dead_lettered", "due_soon"):
        if found[flag]:
            return charge_id, flag
    pulled = conn.execute(Q["callback_pull_forward"],
                          {"charge_id": charge_id, "spacing": float(spacing)}).fetchone()
    if pulled is None:
        return charge_id, "raced"
    return charge_id, "spaced" if pulled[1] else "pulled_forward"


def record(conn: psycopg.Connection, rail: str, reference: str, charge_id: str | None, action: str) -> None:
    """One ``rail_callbacks`` row (the console's timeline). Best effort: the
    hint is already acted on, and the rail gets the same answer whether or
    not the row was written (a failure is logged)."""
    try:
        conn.execute(Q["rail_callback_insert"], {"rail": rail, "reference": reference,
                                                 "charge_id": charge_id, "action": action})
    except psycopg.Error as exc:
        log.warning("callback not recorded", extra={"rail": rail, "error": type(exc).__name__})


class CallbackResource:
    """The callback route of one API worker process. ``rails(code)`` builds
    the adapter (``RailError`` when that rail is not configured)."""

    def __init__(self, db, rails):
        self.db = db
        self.rails = rails
        # Rails whose unconfigured-callback warning this process has logged:
        # anyone can post to the route, so each rail is logged once, not per request.
        self._warned: set[str] = set()
        self._warned_lock = threading.Lock()

    def on_post(self, req: falcon.Request, resp: falcon.Response, code: str) -> None:
        if code not in KNOWN_RAILS:
            raise not_found("Unknown rail.")
        try:
            rail = self.rails(code)
        except RailError:
            with self._warned_lock:
                first = code not in self._warned
                self._warned.add(code)
            if first:
                log.warning("callback for a rail that is not configured", extra={"rail": code})
            raise not_found("Unknown rail.") from None
        body = read_body(req, MAX_BODY_BYTES)
        query = {k: v for k, v in req.params.items()}
        try:
            ids = rail.parse_callback(query, body)
        except (MalformedCallback, ValueError, RecursionError):
            # Generic on purpose: which part was wrong is in our log, not the answer.
            log.info("unreadable callback", extra={"rail": code, "bytes": len(body)})
            raise invalid("callback_unreadable", "The callback could not be read.") from None
        hints = {k: v for k, v in ids.hints.items() if k != "notif_token"}  # a secret: never logged
        with self.db.connection() as conn:
            proof = (proof_matches(conn, code, ids.rail_reference, ids.hints.get("notif_token"))
                     if code in PROOF_RAILS else True)
            if proof is False:  # exactly like an unknown reference: no job written, same answer
                record(conn, code, ids.rail_reference, None, "token_refused")
                log.info("notif_token mismatch", extra={
                    "rail": code, "rail_reference": ids.rail_reference,
                    "token_present": "notif_token" in ids.hints, "hints": hints})
                answer(resp, 202, ACCEPTED_BODY)
                return
            adopted = (adopt_status_keys(conn, code, ids.rail_reference, dict(ids.status_keys))
                       if proof is not None and ids.status_keys else None)
            charge_id, action = (None, "unknown_reference") if proof is None else \
                apply_hint(conn, code, ids.rail_reference)
            record(conn, code, ids.rail_reference, charge_id, action)
        if charge_id is None:
            log.info("callback for an unknown reference",
                     extra={"rail": code, "rail_reference": ids.rail_reference,
                            "hints": hints})
        else:
            log.info("callback hint", extra={"rail": code, "rail_reference": ids.rail_reference,
                                             "charge_id": charge_id, "action": action,
                                             "status_key_adopted": adopted is not None,
                                             "hints": hints})
        answer(resp, 202, ACCEPTED_BODY)

    on_put = on_post
