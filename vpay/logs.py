"""JSON logs on stdout (python-json-logger), one object per line."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter


def setup(level: str | None = None, stream=None) -> None:
    """Route every logger to ``stream`` as JSON with ``time``, ``level``,
    ``logger`` and ``message``; ``extra=`` fields become keys.

    Services (the worker, the API) log on stdout, where journald reads it;
    one-shot commands that print data (``payments create``, ``migrate``) log
    on stderr (the default) so that their stdout stays parseable JSON.
    ``level`` defaults to the current root level, else INFO."""
    root = logging.getLogger()
    if level is None:
        level = logging.getLevelName(root.level) if root.handlers else "INFO"
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
    ))
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("pgserver", "urllib3", "psycopg.pool"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
