"""Every rail call counted, timed and logged in one place: the ``rail_call``
decorator the adapters put on each port method (docs/observability.md,
``vpay_rail_requests_total``, ``vpay_rail_request_seconds``), and stored as
one ``rail_calls`` row when the process has set a recorder (the console's
payment timeline reads them): each API worker process writes its call at
once (``database_recorder``, in ``vpay.cli.api``: one request-to-pay per
payment, the request waited on the rail anyway); the worker writes them in
batches (``BatchedRecorder``, in ``vpay.cli.worker``: one statement for every
call of the last ``FLUSH_SECONDS``, instead of a round trip per status read;
issue 30)."""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from typing import Callable

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import PoolTimeout

from vpay.base.metrics import RAIL_REQUESTS, RAIL_SECONDS
from vpay.rails.port import RailPaused

rail_log = logging.getLogger("vpay.rails")

_recorder: Callable[[dict], None] | None = None


def set_recorder(recorder: Callable[[dict], None] | None) -> None:
    """Give every rail call of this process to ``recorder(call)`` (None: stop).
    ``call`` is ``{rail, operation, reference, charge_id, refund_id,
    http_status, answer, reason, latency_ms, paused_seconds}``
    (``paused_seconds``: the pause a 429/503 with Retry-After imposed, else None).
    A recorder replaced that has a ``close`` (``BatchedRecorder``) is closed:
    what it still held is written first."""
    global _recorder
    old, _recorder = _recorder, recorder
    if old is not None and old is not recorder and hasattr(old, "close"):
        old.close()


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


FLUSH_SECONDS = 0.5
"""How long a rail call's row may wait in a ``BatchedRecorder`` before it is
written (seconds): the console's timeline shows a worker's call at most this
much (plus one write) after it returned; a worker killed with ``kill -9``
loses at most this much of its record (a drain writes it all)."""

MAX_PENDING = 10_000
"""Rows a ``BatchedRecorder`` holds while the database is away: past it the
oldest is dropped (logged, ``dropped``), so an outage cannot grow the
worker's memory. At 10,000 a worker's busiest rail lane (a few hundred reads
a second) keeps about half a minute of its record."""

MAX_BATCH = 1_000
"""Rows per statement of a ``BatchedRecorder`` write."""


def storable(call: dict) -> dict:
    """``call`` with every text made storable in a Postgres ``text`` column:
    a NUL byte (which ``text`` refuses) becomes U+FFFD and a lone surrogate
    (which UTF-8 cannot encode) becomes ``?``. A rail's reason or reference is
    the rail's text, not ours: one bad byte in it must not fail the batch
    that carries the other calls' rows."""
    def clean(value):
        if not isinstance(value, str):
            return value
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    return {k: clean(v) for k, v in call.items()}


class BatchedRecorder:
    """A recorder (``set_recorder``) that writes ``rail_calls`` rows in
    batches through ``pool``: a call is queued (no database work on the
    rail's path), and a thread of its own, started by the first call, writes
    what is queued every ``flush_seconds`` (``FLUSH_SECONDS``), in one
    statement per ``MAX_BATCH`` rows (``rail_calls_insert_batch``; each row's
    ``created_at`` is the database's clock at the call). Best effort, like
    ``database_recorder``: a batch the database refuses (an error it
    answered) is logged and dropped; through an outage (no connection, no
    answer) rows are kept and written when it answers, at most
    ``max_pending`` (``MAX_PENDING``), the oldest dropped first. ``close()``
    writes what is left (the drain); thread-safe. ``clock``: monotonic
    seconds (tests may pass their own). Raises ``ValueError`` for a
    ``flush_seconds`` not above 0 or a ``max_pending`` below 1."""

    def __init__(self, pool, *, flush_seconds: float = FLUSH_SECONDS, max_pending: int = MAX_PENDING,
                 clock: Callable[[], float] = time.monotonic):
        if not flush_seconds > 0 or max_pending < 1:
            raise ValueError("flush_seconds must be > 0 and max_pending >= 1")
        self.pool = pool
        self.flush_seconds = float(flush_seconds)
        self.max_pending = int(max_pending)
        self._clock = clock
        self.dropped = 0
        """Rows dropped so far: past ``max_pending``, or in a refused batch."""
        self._rows: collections.deque[tuple[float, dict]] = collections.deque()
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one write at a time: the thread's or a flush()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._overflowing = False

    def __call__(self, call: dict) -> None:
        row = (self._clock(), storable(call))
        with self._lock:
            if self._closed:
                return
            self._rows.append(row)
            over = len(self._rows) > self.max_pending
            if over:
                self._rows.popleft()
                self.dropped += 1
            first_over, self._overflowing = over and not self._overflowing, over
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rail-calls", daemon=True)
                self._thread.start()
        if first_over:
            rail_log.warning("rail calls not recorded: too many waiting for the database",
                             extra={"max_pending": self.max_pending})

    def pending(self) -> int:
        """Rows queued and not yet written."""
        with self._lock:
            return len(self._rows)

    def flush(self, timeout: float = 2.0) -> int:
        """Write what is queued now; answers the rows written. ``timeout``
        bounds the wait for a pooled connection. Never raises."""
        from vpay.base.queries import Q

        with self._writing:
            with self._lock:
                rows = list(self._rows)
                self._rows.clear()
            written = 0
            while rows:
                batch, rows = rows[:MAX_BATCH], rows[MAX_BATCH:]
                now = self._clock()
                calls = [{"paused_seconds": None, **call, "age": max(0.0, now - at)} for at, call in batch]
                try:
                    with self.pool.connection(timeout=timeout) as conn:
                        conn.execute(Q["rail_calls_insert_batch"], {"calls": Jsonb(calls)})
                    written += len(batch)
                except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
                    self._keep(batch + rows)  # the database is away: written when it answers
                    rail_log.warning("rail calls not recorded yet: database unavailable",
                                     extra={"rows": len(batch) + len(rows), "error": type(exc).__name__})
                    break
                except Exception as exc:  # noqa: BLE001 - the record is secondary to the calls
                    with self._lock:
                        self.dropped += len(batch)
                    rail_log.warning("rail calls not recorded", extra={"rows": len(batch),
                                                                       "error": type(exc).__name__})
            return written

    def _keep(self, rows: list[tuple[float, dict]]) -> None:
        with self._lock:
            self._rows.extendleft(reversed(rows))
            while len(self._rows) > self.max_pending:
                self._rows.popleft()
                self.dropped += 1

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and write what is left (at most ``timeout`` seconds
        waiting for the thread, for a write in flight, and for a connection:
        a write that hangs is left to its daemon thread, and what it holds is
        not recorded). Calls after it are not recorded."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout)
        # A write stuck on a database that stopped answering (no reply, no
        # error) holds _writing: the drain must not wait on it for ever.
        if not self._writing.acquire(timeout=timeout):
            rail_log.warning("rail calls not recorded: a write still waits on the database",
                             extra={"rows": self.pending()})
            return
        self._writing.release()
        self.flush(timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_seconds)
            with self._lock:
                closed = self._closed
                self._overflowing = False
            if closed:
                return
            if self.pending():
                self.flush()


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


