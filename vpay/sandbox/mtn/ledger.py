"""The MoMo sandbox's ledger: its transactions (request-to-pay and refunds,
one record shape), the state machine that moves them (success timers,
scripted reads, forced statuses), the status bodies and state views they are
shown as, and the callback a request-to-pay sends when it first ends.

Default behaviour: a payer in ``SANDBOX_FAILURES`` ends FAILED with its
reason at once; every other transaction is PENDING until
``success_after_seconds`` after it was accepted, then SUCCESSFUL (with a
``financialTransactionId``). A scripted transaction (``pending_reads`` or
``outcome``) moves at its status reads instead.

Callback: when a request-to-pay first becomes terminal (SUCCESSFUL or
FAILED, seen at a status read, by its success timer, at creation for the
sandbox failure payers, or through ``set_status``) and it was created with an
``X-Callback-Url``, the status body is sent once to that URL (``POST`` by
default, ``callback_method="PUT"`` possible; MoMo uses both) from a
background thread with a 5 s timeout: never retried, errors logged and
swallowed. A scripted transaction only becomes terminal at a status read,
so its callback follows that read. Refunds send no callback.

``reason`` on a FAILED status is a plain string by default (MTN's published
shape); ``reason_shape="object"`` gives ``{code, message}``.

The ``Ledger`` mixin needs the rail's ``_lock``/``_cond``, ``_txns``,
``_refunds``, ``_timers``, ``_seq``, ``_stopping``, ``_callbacks``,
``success_after_seconds``, ``reason_shape`` and ``callback_method``."""

from __future__ import annotations

import heapq
import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from vpay.sandbox.mtn.codes import COLLECTION, DEFAULT_DECLINE, DISBURSEMENT, FAILED, PENDING, REASON_MESSAGES, SUCCESSFUL, TERMINAL

log = logging.getLogger("vpay.sandbox.mtn")

_CALLBACK_TIMEOUT = 5.0


@dataclass
class _Txn:
    """One transaction as the rail holds it."""

    reference: str
    amount: str
    currency: str
    external_id: str | None  # optional in MTN's request body
    payer: dict[str, str]
    payer_message: str
    payee_note: str
    created_at: float
    callback_url: str | None
    # behaviour fixed at creation
    read_driven: bool
    pending_reads: int
    outcome: str
    outcome_reason: str | None
    status_errors: list[int]
    status_delay: float
    callback_enabled: bool
    # evolving state
    status: str = PENDING
    reason: str | None = None
    financial_transaction_id: str | None = None
    reads: int = 0
    normal_reads: int = 0
    forced: bool = False
    was_terminal: bool = False
    callback_sent: bool = False
    # a refund (Disbursement) instead of a request-to-pay; ``payer`` is then
    # the payee, and ``refund_of`` the refunded request-to-pay's reference
    kind: str = COLLECTION
    refund_of: str | None = None


class Ledger:
    """The state machine and views of the rail's transactions (lock held
    where a method says so)."""

    def _table_of(self, txn: _Txn) -> dict[str, _Txn]:
        return self._refunds if txn.kind == DISBURSEMENT else self._txns

    def _become(self, txn: _Txn, status: str, reason: str | None) -> Callable[[], None] | None:
        """(Lock held.) Set a state; return the callback sender if this is
        the first time the transaction is terminal and a callback is due."""
        txn.status = status
        txn.reason = reason if status == FAILED else None
        if status == SUCCESSFUL and txn.financial_transaction_id is None:
            txn.financial_transaction_id = str(secrets.randbelow(9 * 10**9) + 10**9)
        if status not in TERMINAL or txn.was_terminal:
            return None
        txn.was_terminal = True
        log.info("sandbox: %s is %s%s", txn.reference, status, f" ({txn.reason})" if txn.reason else "")
        if txn.callback_url and txn.callback_enabled and not txn.callback_sent:
            txn.callback_sent = True
            url, body, ref = txn.callback_url, self._status_body(txn), txn.reference
            return lambda: self._send_callback(ref, url, body)
        return None

    def _on_read(self, txn: _Txn) -> Callable[[], None] | None:
        """(Lock held.) A normal status read of ``txn``: a scripted
        transaction moves on; the callback sender, if one is due."""
        if txn.forced or txn.status in TERMINAL:
            return None
        if not txn.read_driven:
            return None  # timer-driven; the timer thread finalises
        txn.normal_reads += 1
        if txn.normal_reads <= txn.pending_reads or txn.outcome == PENDING:
            return None
        return self._become(txn, txn.outcome, txn.outcome_reason)

    # ------------------------------------------------------------ views (lock held)

    def _status_body(self, txn: _Txn) -> dict[str, Any]:
        """The status body MoMo answers for ``txn`` (a refund's names the
        party ``payee``)."""
        body: dict[str, Any] = {"amount": txn.amount, "currency": txn.currency}
        if txn.status == SUCCESSFUL and txn.financial_transaction_id:
            body["financialTransactionId"] = txn.financial_transaction_id
        if txn.external_id is not None:
            body["externalId"] = txn.external_id
        body.update({
            "payer": dict(txn.payer),
            "payerMessage": txn.payer_message,
            "payeeNote": txn.payee_note,
            "status": txn.status,
        })
        if txn.status == FAILED:
            code = txn.reason or DEFAULT_DECLINE
            body["reason"] = code if self.reason_shape == "string" else {
                "code": code, "message": REASON_MESSAGES.get(code, code)}
        if txn.kind == DISBURSEMENT:
            body["payee"] = body.pop("payer")
        return body

    def _state_of(self, txn: _Txn) -> dict[str, Any]:
        """What the control API shows of ``txn``."""
        state = {
            "reference": txn.reference,
            "status": txn.status,
            "reason": txn.reason,
            "financialTransactionId": txn.financial_transaction_id if txn.status == SUCCESSFUL else None,
            "amount": txn.amount,
            "currency": txn.currency,
            "externalId": txn.external_id,
            "payer": dict(txn.payer),
            "callbackUrl": txn.callback_url,
            "createdAt": txn.created_at,
            "reads": txn.reads,
            "forced": txn.forced,
            "callbackSent": txn.callback_sent,
        }
        if txn.kind == DISBURSEMENT:
            state["payee"] = state.pop("payer")
            state.pop("callbackUrl", None)
            state.pop("callbackSent", None)
            state["referenceIdToRefund"] = txn.refund_of
        return state

    # ------------------------------------------------------------ success timer

    def _schedule_success(self, txn: _Txn) -> None:
        """(Lock held, as ``_cond``.) ``txn`` becomes SUCCESSFUL
        ``success_after_seconds`` from now unless something ends it first."""
        due = time.monotonic() + self.success_after_seconds
        heapq.heappush(self._timers, (due, next(self._seq), txn.reference, txn))
        self._cond.notify_all()

    def _start_helpers(self) -> None:
        self._timer_thread = threading.Thread(target=self._timer_loop, name="momo-sandbox-timers", daemon=True)
        self._timer_thread.start()

    def _wake_helpers(self) -> None:
        # Bounded wait: stop() may run in a signal handler that interrupted a
        # thread holding the lock (the timer thread notices _stopping within
        # a second anyway).
        if self._cond.acquire(timeout=0.2):
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()

    def _helper_threads(self) -> tuple[threading.Thread | None, ...]:
        return (self._timer_thread,)

    def _timer_loop(self) -> None:
        while not self._stopping.is_set():
            with self._cond:
                if self._timers:
                    wait = self._timers[0][0] - time.monotonic()
                else:
                    wait = 1.0
                if wait > 0:
                    self._cond.wait(timeout=min(wait, 1.0))
            self._fire_due_timers()

    def _fire_due_timers(self) -> None:
        """Every due success timer ends its transaction now (callbacks sent
        after the lock is released)."""
        fires = []
        now = time.monotonic()
        with self._lock:
            while self._timers and self._timers[0][0] <= now:
                _, _, ref, txn = heapq.heappop(self._timers)
                if self._table_of(txn).get(ref) is not txn or txn.forced or txn.status != PENDING:
                    continue
                fire = self._become(txn, SUCCESSFUL, None)
                if fire:
                    fires.append(fire)
        for fire in fires:
            fire()

    # ------------------------------------------------------------ callbacks

    def _send_callback(self, ref: str, url: str, body: dict[str, Any]) -> None:
        """Send ``body`` to ``url`` once, from a background thread; the
        attempt lands in ``callbacks()``."""
        def run() -> None:
            entry: dict[str, Any] = {"reference": ref, "url": url, "method": self.callback_method,
                                     "status_code": None, "error": None, "at": time.time()}
            data = json.dumps(body).encode("utf-8")
            req = urllib.request.Request(url, data=data, method=self.callback_method,
                                         headers={"Content-Type": "application/json"})
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            try:
                with opener.open(req, timeout=_CALLBACK_TIMEOUT) as r:
                    entry["status_code"] = r.status
                log.info("sandbox: callback for %s delivered (%s)", ref, entry["status_code"])
            except urllib.error.HTTPError as exc:
                entry["status_code"] = exc.code
                log.warning("sandbox: callback for %s answered HTTP %s (not retried)", ref, exc.code)
            except Exception as exc:  # never retried, never raised
                entry["error"] = f"{type(exc).__name__}: {exc}"
                log.warning("sandbox: callback for %s failed: %s (not retried)", ref, entry["error"])
            with self._lock:
                self._callbacks.append(entry)

        threading.Thread(target=run, name=f"momo-sandbox-callback-{ref[:8]}", daemon=True).start()
