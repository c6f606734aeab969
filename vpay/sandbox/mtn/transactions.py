"""The MoMo sandbox's transaction calls, written once for every kind of
transaction (a Collection request-to-pay, a Disbursement refund: ``Kind``,
one per product module):

    POST {base}{kind.path}                -> 202, empty body
        needs the product's Bearer token and subscription key, X-Target-Environment,
        X-Reference-Id (UUIDv4, the transaction's id) and a JSON body; 409
        RESOURCE_ALREADY_EXIST for a duplicate X-Reference-Id
    GET  {base}{kind.path}/{referenceId}  -> 200 status body (even for FAILED);
        404 RESOURCE_NOT_FOUND

A kind says how its body is checked, what is checked before the rail takes
the call, which payer's script applies, how a transaction is built and how
it starts (FAILED at once, or the success timer); the scripted errors and
delays of its calls are its script options under ``call_prefix`` and
``status_prefix`` (``scripts.py``).

The ``Transactions`` mixin needs ``Auth`` (``_product_checks``,
``_check_currency``) and ``Ledger``."""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from vpay.sandbox.server import Answer
from vpay.sandbox.mtn.codes import AMOUNT_RE, FAILED, SUCCESSFUL, UUID4_RE, _error, _error_for_http
from vpay.sandbox.mtn.ledger import _Txn
from vpay.sandbox.mtn.scripts import _Script

log = logging.getLogger("vpay.sandbox.mtn")

MAX_MESSAGE = 160


@dataclass(frozen=True)
class Kind:
    """One kind of MoMo transaction and the hooks its calls differ by
    (``rail`` is the ``SandboxRail``; ``context`` a dict the hooks share)."""

    name: str                 # in log lines: "request-to-pay", "refund"
    product: str              # COLLECTION | DISBURSEMENT: whose credentials
    path: str                 # "/collection/v1_0/requesttopay"
    table: str                # the rail's attribute holding them: "_txns"
    call_prefix: str          # script options of the create call: "rtp_"
    status_prefix: str        # script options of its status reads: ""
    noun: str                 # "status read of <noun><ref>": "" or "refund "
    parse_body: Callable[[bytes], "dict[str, Any] | Answer"]
    # after the body and currency checks, before the rail takes it: a refusal or a context
    prepare: Callable[[Any, Any, dict[str, Any]], "dict[str, Any] | Answer"]
    # (lock held) the script that applies, and more context
    script_for: Callable[[Any, dict[str, Any]], "tuple[_Script | None, dict[str, Any]]"]
    # (lock held) build the transaction
    new: Callable[[Any, str, dict[str, Any], "_Script | None", dict[str, Any]], _Txn]
    # (lock held) start it: FAILED at once or the success timer; a callback sender or None
    open: Callable[[Any, _Txn, dict[str, Any]], "Callable[[], None] | None"]
    # the log line of an accepted call
    accepted: Callable[[str, dict[str, Any]], str]


def new_txn(kind: Kind, ref: str, body: dict[str, Any], script: _Script | None, *,
            payer: dict[str, str], default_reason: str | None, fallback_reason: str,
            callback_url: str | None = None, callback_enabled: bool = False,
            refund_of: str | None = None) -> _Txn:
    """A transaction of ``kind`` from its request ``body`` and ``script``.
    Without a scripted outcome it ends FAILED when ``default_reason`` is set
    (a sandbox failure payer), else SUCCESSFUL; a FAILED outcome's reason is
    the script's, else ``default_reason``, else ``fallback_reason``."""
    def scripted(option: str) -> Any:
        return getattr(script, kind.status_prefix + option) if script else None

    read_driven = scripted("pending_reads") is not None or scripted("outcome") is not None
    outcome = scripted("outcome") or (FAILED if default_reason else SUCCESSFUL)
    outcome_reason = None
    if outcome == FAILED:
        outcome_reason = scripted("reason") or default_reason or fallback_reason
    return _Txn(
        reference=ref,
        amount=body["amount"],
        currency=body["currency"],
        external_id=body.get("externalId"),
        payer=payer,
        payer_message=body.get("payerMessage", ""),
        payee_note=body.get("payeeNote", ""),
        created_at=time.time(),
        callback_url=callback_url,
        read_driven=read_driven,
        pending_reads=scripted("pending_reads") or 0,
        outcome=outcome,
        outcome_reason=outcome_reason,
        status_errors=list(scripted("status_errors") or []),
        status_delay=scripted("status_delay_seconds") or 0.0,
        callback_enabled=callback_enabled,
        kind=kind.product,
        refund_of=refund_of,
    )


def parse_money_body(raw: bytes, extra: Callable[[dict[str, Any]], str | None]) -> dict[str, Any] | Answer:
    """The checks every transaction body shares (``amount`` as a positive
    decimal string, ``currency``, ``externalId`` a string when present,
    messages of at most 160 characters), then ``extra(body)``: an error
    text, or None. A 400 ``BAD_REQUEST`` answer for the first problem."""
    def bad(msg: str) -> Answer:
        return _error(400, "BAD_REQUEST", msg)

    try:
        body = json.loads(raw) if raw.strip() else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return bad("Body is not valid JSON")
    if not isinstance(body, dict):
        return bad("Body must be a JSON object")
    amount = body.get("amount")
    if not isinstance(amount, str) or not AMOUNT_RE.match(amount) or float(amount) <= 0:
        return bad("amount must be a positive decimal number in a string")
    currency = body.get("currency")
    if not isinstance(currency, str) or not re.fullmatch(r"[A-Z]{3}", currency):
        return bad("currency must be an ISO 4217 code")
    # Optional: MTN's published schema requires none of the body's fields,
    # and the client libraries send externalId only when given.
    if "externalId" in body and not isinstance(body["externalId"], str):
        return bad("externalId must be a string")
    problem = extra(body)
    if problem:
        return bad(problem)
    for name in ("payerMessage", "payeeNote"):
        v = body.get(name)
        if v is not None and (not isinstance(v, str) or len(v) > MAX_MESSAGE):
            return bad(f"{name} must be a string of at most {MAX_MESSAGE} characters")
    return body


class Transactions:
    """``POST {kind.path}`` and ``GET {kind.path}/{ref}`` for every kind."""

    def _create(self, kind: Kind, headers: Any, raw: bytes) -> Answer:
        """Take a transaction of ``kind`` (see the module docstring)."""
        err = self._product_checks(headers, kind.product)
        if err:
            return err
        ref = headers.get("X-Reference-Id") or ""
        if not UUID4_RE.match(ref):
            return _error(400, "BAD_REQUEST", "X-Reference-Id must be a UUID version 4")
        parsed = kind.parse_body(raw)
        if isinstance(parsed, Answer):
            return parsed
        err = self._check_currency(parsed["currency"])
        if err:
            return err
        context = kind.prepare(self, headers, parsed)
        if isinstance(context, Answer):
            return context
        table = getattr(self, kind.table)
        fire = None
        with self._cond:
            script, more = kind.script_for(self, parsed)
            context.update(more)
            # A kind without a delay option for its call has no such attribute.
            delay = getattr(script, kind.call_prefix + "delay_seconds", 0.0) if script else 0.0
            refused = getattr(script, kind.call_prefix + "errors") if script else []
            if refused:
                code = refused.pop(0)
                resp = _error_for_http(code)
                log.info("sandbox: %s %s answered %s without recording (scripted)", kind.name, ref, code)
            elif ref in table:
                resp = _error(409, "RESOURCE_ALREADY_EXIST")
            else:
                txn = kind.new(self, ref, parsed, script, context)
                table[ref] = txn
                fire = kind.open(self, txn, context)
                lost = getattr(script, kind.call_prefix + "record_then_error") if script else []
                if lost:
                    code = lost.pop(0)
                    resp = _error_for_http(code)
                    log.info("sandbox: %s %s recorded but answered %s (scripted)", kind.name, ref, code)
                else:
                    resp = Answer(202)
                    log.info("sandbox: %s", kind.accepted(ref, parsed))
        if fire:
            resp.after.append(fire)
        if delay:
            self._stopping.wait(delay)
        return resp

    def _read(self, kind: Kind, headers: Any, ref: str) -> Answer:
        """The status of transaction ``ref`` of ``kind``: scripted delays and
        errors first, then the status body (a scripted transaction moves on)."""
        err = self._product_checks(headers, kind.product)
        if err:
            return err
        table = getattr(self, kind.table)
        with self._lock:
            txn = table.get(ref)
            if txn is None:
                return _error(404, "RESOURCE_NOT_FOUND")
            txn.reads += 1
            delay = txn.status_delay
        if delay:
            self._stopping.wait(delay)
        self._fire_due_timers()  # a due success timer wins over a racing read
        with self._lock:
            if table.get(ref) is not txn:
                return _error(404, "RESOURCE_NOT_FOUND")
            if txn.status_errors:
                code = txn.status_errors.pop(0)
                log.info("sandbox: status read of %s%s answered %s (scripted)", kind.noun, ref, code)
                return _error_for_http(code)
            fire = self._on_read(txn)
            resp = Answer(200, self._status_body(txn))
        if fire:
            resp.after.append(fire)
        return resp

