"""Every rail call counted, timed and logged in one place: the ``rail_call``
decorator the adapters put on each port method (docs/observability.md,
``vpay_rail_requests_total``, ``vpay_rail_request_seconds``), and stored as
one ``rail_calls`` row when the process has set a recorder (the worker and
each API worker process do: ``set_recorder(database_recorder(pool))`` in
``vpay.cli.worker`` and ``vpay.cli.api``; the console's payment timeline
reads them)."""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable

from vpay.base.metrics import RAIL_REQUESTS, RAIL_SECONDS
from vpay.rails.port import RailPaused

rail_log = logging.getLogger("vpay.rails")

_recorder: Callable[[dict], None] | None = None


def set_recorder(recorder: Callable[[dict], None] | None) -> None:
    """Give every rail call of this process to ``recorder(call)`` (None: stop).
    ``call`` is ``{rail, operation, reference, charge_id, refund_id,
    http_status, answer, reason, latency_ms, paused_seconds}``
    (``paused_seconds``: the pause a 429/503 with Retry-After imposed, else None)."""
    global _recorder
    _recorder = recorder


def database_recorder(pool) -> Callable[[dict], None]:
    """A recorder writing one ``rail_calls`` row per call through ``pool``
    (autocommit). Best effort: a row that cannot be written is logged and
    dropped; the rail's answer never waits on it for more than 2 s, and a
    failure to record never fails the call."""
    from vpay.base.queries import Q

    def record(call: dict) -> None:
        try:
            with pool.connection(timeout=2.0) as conn:
                conn.execute(Q["rail_call_insert"], {"paused_seconds": None, **call})
        except Exception as exc:  # noqa: BLE001 - the record is secondary to the call
            rail_log.warning("rail call not recorded", extra={"error": type(exc).__name__})
    return record


CALL_IDS = ("charge_id", "refund_id", "rail_reference", "charge_rail_reference")
"""Identifiers of a rail call's request copied onto its ``rail call`` line."""


def rail_call(operation: str) -> Callable:
    """Decorate a ``Rail`` port method (``request_to_pay``, ``status``,
    ``refund``, ``refund_status``): count it in ``vpay_rail_requests_total``
    with the port's answer (``accepted``, ``rejected``, ``pending``,
    ``succeeded``, ``failed``, ``not_found``, ``no_answer``; ``error`` when
    the method raised), time it in ``vpay_rail_request_seconds``, and log one
    structured line: ``rail``, ``operation``, ``http_status``, ``answer``,
    ``reason``, ``seconds``, ``sent``. The job's fields (``job_id``,
    ``charge_id``, ...) come from the log context (``vpay.base.logs``).

    An answer made without a request (``http_status`` None and not
    ``no_answer``: an unsupported currency, Orange's refusal to refund) is
    logged with ``sent`` false and not counted as a request; so is a call
    refused by a paused rail (``RailPaused``: answer ``paused``). From the
    call's argument (a ``ChargeRequest`` / ``RefundRequest``) only its
    identifiers are logged (``CALL_IDS``: ``charge_id`` / ``refund_id``,
    ``rail_reference``, a refund's ``charge_rail_reference``), so no credential or token can be; this line is the
    adapters' one record of a call's answer (they log only what it lacks:
    a no-answer's detail, a token refused, a retry, a configuration refusal)."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            started = time.monotonic()
            result, answer, paused = None, "error", None
            try:
                result = fn(self, *args, **kwargs)
                answer = getattr(getattr(result, "kind", None), "value", "error")
                return result
            except RailPaused as exc:
                # The rail asked for less traffic (vpay.rails.gate): logged and
                # counted by the gate, not as a request of this call. The
                # answer that asked for it is stored (the console's "rails
                # paused"); a call the gate held back sent nothing.
                answer, paused = "paused", exc
                raise
            finally:
                seconds = time.monotonic() - started
                http_status = getattr(result, "http_status", None)
                sent = http_status is not None or answer in ("no_answer", "error")
                if sent:
                    RAIL_REQUESTS.labels(self.code, operation, answer).inc()
                    RAIL_SECONDS.labels(self.code, operation).observe(seconds)
                rail_log.log(logging.WARNING if answer in ("no_answer", "error") else logging.INFO,
                             "rail call", extra={
                                 "rail": self.code, "operation": operation, "answer": answer,
                                 "http_status": http_status, "reason": getattr(result, "reason", None),
                                 "seconds": round(seconds, 3), "sent": sent,
                                 **_call_ids(args)})
                asked = getattr(paused, "http_status", None)
                if (sent or asked) and _recorder is not None:
                    ids = _call_ids(args)
                    _recorder({"rail": self.code, "operation": operation,
                               "reference": ids.get("rail_reference"), "charge_id": ids.get("charge_id"),
                               "refund_id": ids.get("refund_id"), "http_status": asked or http_status,
                               "answer": answer,
                               "reason": paused.reason if asked else getattr(result, "reason", None),
                               "latency_ms": int(seconds * 1000),
                               "paused_seconds": paused.seconds if asked else None})
        return call
    return wrap


def _call_ids(args: tuple) -> dict[str, str]:
    """``CALL_IDS`` of a rail method's request (its first argument), those it has."""
    request = args[0] if args else None
    return {k: v for k in CALL_IDS if isinstance(v := getattr(request, k, None), str)}


