"""The MoMo sandbox's control API, for tests and demos: script payers, force
or forget transactions and refunds, read the logs, reset. Each HTTP endpoint
(no authentication: loopback clients only, see ``server.is_loopback_client``)
has a Python twin:

* ``PUT|DELETE /_sandbox/payers/{msisdn}`` / ``script(payer, **opts)``
  (``scripts.py``), ``GET /_sandbox/payers`` / ``scripts()``.
* ``PUT /_sandbox/transactions/{ref}`` ``{"status", "reason"}`` /
  ``set_status(ref, status, reason=None)``: force a transaction's state for
  ever (e.g. make the rail contradict a settled charge).
* ``GET /_sandbox/transactions[/{ref}]`` / ``transactions()``, ``transaction(ref)``.
* ``DELETE /_sandbox/transactions/{ref}`` / ``forget(ref)``: the rail forgets it (404).
* ``GET|PUT|DELETE /_sandbox/refunds[/{ref}]`` / ``refunds()``, ``refund(ref)``,
  ``set_refund_status(ref, status, reason=None)``, ``forget_refund(ref)``: the
  same for refunds.
* ``GET /_sandbox/requests`` / ``requests_log()``: every MoMo request received
  (not control requests) as ``{method, path, reference, status_code, at}``;
  ``count(method=None, path_prefix=None, reference=None)`` counts them.
* ``GET /_sandbox/callbacks`` / ``callbacks()``: callbacks attempted.
* ``POST /_sandbox/reset`` / ``reset()``: forget transactions, refunds,
  scripts and logs (issued tokens stay valid).

The ``Control`` mixin needs ``Ledger`` and the rail's tables and logs."""

from __future__ import annotations

import json
import logging
import urllib.parse
from typing import Any, Mapping

from vpay.sandbox.server import Answer
from vpay.sandbox.mtn.codes import DEFAULT_DECLINE, DEFAULT_REFUND_FAILURE, FAILED, _error
from vpay.sandbox.mtn.ledger import _Txn
from vpay.sandbox.mtn.scripts import _check_forced, _parse_script

log = logging.getLogger("vpay.sandbox.mtn")


def _json_object(raw: bytes, allow_empty: bool = False) -> dict[str, Any]:
    if not raw.strip():
        if allow_empty:
            return {}
        raise ValueError("a JSON object body is required")
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("body must be a JSON object")
    return obj


class Control:
    """The Python control API and its HTTP twin ``_control``."""

    # ------------------------------------------------------------ scripts

    def script(self, payer: str, **opts: Any) -> dict[str, Any]:
        """Script the behaviour of ``payer``'s future transactions (options:
        ``vpay.sandbox.mtn.scripts``). No options = back to the default.
        Returns the normalised script. Raises ValueError on a bad option."""
        return self._set_script(payer, opts)

    def _set_script(self, payer: str, opts: Mapping[str, Any]) -> dict[str, Any]:
        s = _parse_script(opts)
        with self._lock:
            if opts:
                self._scripts[payer] = s
            else:
                self._scripts.pop(payer, None)
        log.info("sandbox: payer %s scripted: %s", payer, dict(opts) or "default behaviour")
        return s.as_dict()

    def scripts(self) -> dict[str, dict[str, Any]]:
        """Every payer's script, by MSISDN."""
        with self._lock:
            return {p: s.as_dict() for p, s in self._scripts.items()}

    # ------------------------------------------------------------ transactions and refunds

    def set_status(self, ref: str, status: str, reason: str | None = None, *,
                   amount: str | None = None) -> dict[str, Any]:
        """Force transaction ``ref`` to ``status`` for ever (reads, timers and
        scripts no longer change it); ``amount`` (a major-units string) makes
        the status body report another amount than was asked for. May fire the
        callback if the transaction was never terminal before. Raises KeyError
        for an unknown reference."""
        return self._force(self._txns, "", ref, status, reason, amount, DEFAULT_DECLINE)

    def set_refund_status(self, ref: str, status: str, reason: str | None = None, *,
                          amount: str | None = None) -> dict[str, Any]:
        """Force refund ``ref`` to ``status`` for ever (e.g. make the rail
        contradict a settled refund); ``amount`` (a major-units string, any
        text) makes the status body report it instead of the refund's. Raises
        KeyError for an unknown reference."""
        return self._force(self._refunds, "refund ", ref, status, reason, amount, DEFAULT_REFUND_FAILURE)

    def _force(self, table: dict[str, _Txn], noun: str, ref: str, status: str, reason: str | None,
               amount: str | None, default_reason: str) -> dict[str, Any]:
        """Force ``table[ref]`` to ``status`` (a FAILED one with ``reason``,
        else ``default_reason``); fire the callback if one is due; its state.
        Raises KeyError for an unknown reference, ValueError for bad arguments."""
        _check_forced(status, reason)
        reason = (reason or default_reason) if status == FAILED else None
        with self._lock:
            txn = table[ref]
            txn.forced = True
            if amount is not None:
                txn.amount = amount
            fire = self._become(txn, status, reason)
            state = self._state_of(txn)
        log.info("sandbox: %s%s forced to %s %s", noun, ref, status, reason or "")
        if fire:
            fire()
        return state

    def forget(self, ref: str) -> bool:
        """The rail forgets ``ref`` (status reads answer 404). True if it existed."""
        with self._lock:
            return self._txns.pop(ref, None) is not None

    def forget_refund(self, ref: str) -> bool:
        """The rail forgets refund ``ref`` (status reads answer 404). True if it existed."""
        with self._lock:
            return self._refunds.pop(ref, None) is not None

    def transactions(self) -> list[dict[str, Any]]:
        """Current state of every transaction, oldest first."""
        return self._states(self._txns)

    def transaction(self, ref: str) -> dict[str, Any] | None:
        """One transaction's state by its X-Reference-Id, or None."""
        return self._state(self._txns, ref)

    def refunds(self) -> list[dict[str, Any]]:
        """Current state of every refund, oldest first."""
        return self._states(self._refunds)

    def refund(self, ref: str) -> dict[str, Any] | None:
        """One refund's state by its X-Reference-Id, or None."""
        return self._state(self._refunds, ref)

    def _states(self, table: dict[str, _Txn]) -> list[dict[str, Any]]:
        self._fire_due_timers()
        with self._lock:
            return [self._state_of(t) for t in table.values()]

    def _state(self, table: dict[str, _Txn], ref: str) -> dict[str, Any] | None:
        self._fire_due_timers()
        with self._lock:
            t = table.get(ref)
            return None if t is None else self._state_of(t)

    # ------------------------------------------------------------ logs

    def requests_log(self) -> list[dict[str, Any]]:
        """Every MoMo request received, in arrival order: ``{method, path,
        reference, status_code, at}`` (``status_code`` None while in flight,
        ``at`` = arrival, epoch seconds)."""
        with self._lock:
            return [dict(e) for e in self._log]

    def count(self, method: str | None = None, path_prefix: str | None = None,
              reference: str | None = None) -> int:
        """How many logged MoMo requests match all the given filters."""
        with self._lock:
            return sum(
                1 for e in self._log
                if (method is None or e["method"] == method.upper())
                and (path_prefix is None or e["path"].startswith(path_prefix))
                and (reference is None or e["reference"] == reference)
            )

    def callbacks(self) -> list[dict[str, Any]]:
        """Callbacks attempted: ``{reference, url, method, status_code, error, at}``."""
        with self._lock:
            return [dict(e) for e in self._callbacks]

    def reset(self) -> None:
        """Forget transactions, refunds, scripts, request and callback logs.
        Issued tokens stay valid."""
        with self._cond:
            self._txns.clear()
            self._refunds.clear()
            self._scripts.clear()
            self._log.clear()
            self._callbacks.clear()
            self._timers.clear()
            self._cond.notify_all()
        log.info("sandbox: reset")

    # ------------------------------------------------------------ HTTP

    def _control(self, method: str, path: str, raw: bytes) -> Answer:
        """``/_sandbox/*`` (the caller checked the client is loopback)."""
        parts = [urllib.parse.unquote(p) for p in path.split("/")[2:] if p]
        listings = {"requests": self.requests_log, "callbacks": self.callbacks,
                    "transactions": self.transactions, "payers": self.scripts, "refunds": self.refunds}
        # /_sandbox/transactions/{ref} and /_sandbox/refunds/{ref}: read, force, forget
        records = {"transactions": (self.transaction, self.set_status, self.forget),
                   "refunds": (self.refund, self.set_refund_status, self.forget_refund)}
        try:
            if parts == ["reset"] and method == "POST":
                self.reset()
                return Answer(204)
            if len(parts) == 1 and parts[0] in listings and method == "GET":
                return Answer(200, listings[parts[0]]())
            if len(parts) == 2 and parts[0] in records:
                ref, (read, force, forget) = parts[1], records[parts[0]]
                if method == "GET":
                    state = read(ref)
                    return Answer(200, state) if state else _error(404, "RESOURCE_NOT_FOUND")
                if method == "PUT":
                    opts = _json_object(raw)
                    extra = set(opts) - {"status", "reason"}
                    if extra:
                        raise ValueError(f"unknown field(s): {', '.join(sorted(extra))}")
                    try:
                        return Answer(200, force(ref, opts.get("status"), opts.get("reason")))
                    except KeyError:
                        return _error(404, "RESOURCE_NOT_FOUND")
                if method == "DELETE":
                    return Answer(204) if forget(ref) else _error(404, "RESOURCE_NOT_FOUND")
            if len(parts) == 2 and parts[0] == "payers":
                if method == "PUT":
                    opts = _json_object(raw, allow_empty=True)
                    return Answer(200, {"payer": parts[1], "script": self._set_script(parts[1], opts)})
                if method == "DELETE":
                    self._set_script(parts[1], {})
                    return Answer(204)
        except ValueError as exc:
            return _error(400, "BAD_REQUEST", str(exc))
        return _error(404, "RESOURCE_NOT_FOUND", f"No sandbox control endpoint {method} {path}")
