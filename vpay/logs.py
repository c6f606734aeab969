"""JSON logs on stdout (python-json-logger), one object per line."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter


def setup(level: str = "INFO") -> None:
    """Route every logger to stdout as JSON with ``time``, ``level``,
    ``logger`` and ``message``; ``extra=`` fields become keys."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("pgserver", "urllib3", "psycopg.pool"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
