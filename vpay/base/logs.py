"""JSON logs (python-json-logger), one object per line, with the running
job's fields on every line.

``VPAY_LOG_LEVEL`` (default ``INFO``; ``DEBUG``, ``WARNING``, ``ERROR``)
sets the level of every command; ``vpay-server --log-level`` overrides it.

The job context: the worker's loop wraps each job in ``job_context(job,
worker_id)``, which sets a ``contextvars.ContextVar``; ``JobFields``, a
filter on the one handler, copies its fields onto every record logged while
it is set, from any module (rail adapters, handlers, the money state
machine) without passing them by hand. A field the call gives in ``extra=``
wins over the context's. A context variable is per thread, so the loops of
one worker never see each other's job.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator, Mapping

from pythonjsonlogger.json import JsonFormatter

PAYLOAD_IDS = ("charge_id", "refund_id", "event_id", "endpoint_id")
"""Identifiers copied from a job's payload into its log context, when present."""

_context: ContextVar[Mapping[str, Any]] = ContextVar("vpay_log_context", default={})


def job_fields(job: Any, worker_id: str) -> dict[str, Any]:
    """The fields every line of ``job`` carries: ``worker_id``, ``job_id``,
    ``kind``, ``lane``, ``dedupe_key`` and the payload's ids (``charge_id``,
    ``refund_id``, ``event_id``, ``endpoint_id``) that it has."""
    fields = {"worker_id": worker_id, "job_id": job.id, "kind": job.kind,
              "lane": job.lane, "dedupe_key": job.dedupe_key}
    if None in fields.values():  # as context(): a None is no field
        fields = {k: v for k, v in fields.items() if v is not None}
    payload = job.payload
    if payload and isinstance(payload, Mapping):
        for k in PAYLOAD_IDS:
            value = payload.get(k)
            if isinstance(value, (str, int)):
                fields[k] = value
    return fields


@contextmanager
def context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (``None`` values skipped) to every line logged by this
    thread until the block ends; nests (inner fields win)."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


class job_context:
    """``with job_context(job, worker_id):`` is ``context(**job_fields(job,
    worker_id))``: the loop's fields for every line of one job. A class, not
    a generator: the loop enters one per job, and this costs a third of
    ``context``'s generator and merges (issue #15, CPU per job)."""

    __slots__ = ("_fields", "_token")

    def __init__(self, job: Any, worker_id: str):
        self._fields = job_fields(job, worker_id)

    def __enter__(self) -> None:
        outer = _context.get()
        self._token = _context.set({**outer, **self._fields} if outer else self._fields)

    def __exit__(self, *exc: Any) -> None:
        _context.reset(self._token)


def current() -> dict[str, Any]:
    """The fields in force in this thread (a copy)."""
    return dict(_context.get())


class JobFields(logging.Filter):
    """Copies the context's fields onto each record that does not already
    carry them (``extra=`` wins). Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if key not in record.__dict__:
                setattr(record, key, value)
        return True


class JsonLines(JsonFormatter):
    """python-json-logger's ``JsonFormatter`` whose ``time`` has its seconds
    part made once a second, not once a line: ``time.localtime`` and
    ``time.strftime`` were a quarter of a line's formatting in a busy worker
    (issue 30). The text is ``logging.Formatter.formatTime``'s, to the
    millisecond; a ``datefmt`` given is formatted as ``logging`` does."""

    _second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt:
            return super().formatTime(record, datefmt)
        second, text = self._second  # one tuple: each thread reads a whole pair
        if second != int(record.created):
            second = int(record.created)
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = (second, text)
        return self.default_msec_format % (text, record.msecs) if self.default_msec_format else text


def setup(level: str | None = None, stream=None) -> None:
    """Route every logger to ``stream`` as JSON with ``time``, ``level``,
    ``logger`` and ``message``; ``extra=`` fields and the job context's
    fields become keys.

    Services (the worker, the API) log on stdout, where journald reads it;
    one-shot commands that print data (``payments create``, ``migrate``) log
    on stderr (the default) so that their stdout stays parseable JSON.
    ``level`` defaults to the current root level, else INFO."""
    root = logging.getLogger()
    if level is None:
        level = logging.getLevelName(root.level) if root.handlers else "INFO"
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLines(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
    ))
    handler.addFilter(JobFields())
    root.handlers[:] = [handler]
    # No field of ours names the thread or the process: each record need not
    # look them up (the logging HOWTO, "Optimization"; a worker writes about
    # seven lines per settled payment, issue 30). The caller's frame is still
    # found: ``stack_info=True`` needs it.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root.setLevel(level)
    for noisy in ("pgserver", "urllib3", "psycopg.pool"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# ---- no log line before its commit --------------------------------------------
#
# A line saying "charge settled" must never be written for a change that was
# rolled back (issue 26): a function that writes inside a transaction it may
# not own (pollable.settle inside a statement import, an operator's resolve)
# logs through ``after_commit``, and the outermost block is ``committed``.

import weakref  # noqa: E402  (kept with the code that needs it)

_after_commit: "weakref.WeakKeyDictionary[Any, list[Any]]" = weakref.WeakKeyDictionary()


def _idle(conn: Any) -> bool:
    from psycopg.pq import TransactionStatus
    return conn.info.transaction_status == TransactionStatus.IDLE


def after_commit(conn: Any, fn: Any) -> None:
    """Call ``fn()`` (a log line) once ``conn``'s open transaction has
    committed: now when none is open (an autocommit connection after its
    block), else when the outermost ``committed`` block around it commits;
    never if it rolls back (or if that block is a bare ``conn.transaction()``:
    lost, never early)."""
    if _idle(conn):
        fn()
    else:
        _after_commit.setdefault(conn, []).append(fn)


@contextmanager
def committed(conn: Any) -> Iterator[Any]:
    """``conn.transaction()`` that runs the ``after_commit`` calls made
    inside it once the outermost such block committed; a nested block that
    rolls back (a savepoint) drops the calls made inside it."""
    outer = _idle(conn)
    if outer:
        _after_commit.pop(conn, None)  # left by a bare block: never known to have committed
    mark = len(_after_commit.get(conn, ()))
    try:
        with conn.transaction() as tx:
            yield tx
    except BaseException:
        if outer:
            _after_commit.pop(conn, None)
        else:
            del _after_commit.get(conn, [])[mark:]
        raise
    if outer:
        for fn in _after_commit.pop(conn, ()):
            fn()
