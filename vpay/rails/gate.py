"""Rail backpressure: one gate per rail adapter, shared by every thread of the process.

A rail that answers HTTP 429 or 503 with ``Retry-After`` (delta-seconds or an
HTTP date; design/rails.md, "Rail errors that mean our configuration is
wrong") is asking for less traffic. Reading other charges at once, as each
claim loop would on its own, is the opposite. So the adapter that got the
answer closes its ``RailGate`` for that long, capped at ``max_pause``
seconds (a rail cannot switch us off for a day with one header), and every
call through that adapter instance raises ``RailPaused`` before sending
anything until the pause is over. The adapter instance is shared by all the
claim loops of a worker (``vpay.handlers.registry.Context.rail``), so the
pause holds across the whole worker process; the job handlers reschedule
paused work to the end of the pause (``vpay.handlers.registry.handle``).

Visible: one ``rail paused`` log line (warning) per pause or extension, and
``rail_paused_until`` (per rail, ISO 8601 UTC, or null) in the worker's gauge
line.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Callable

from vpay.rails.port import RailPaused

log = logging.getLogger("vpay.rail_gate")

DEFAULT_MAX_PAUSE_SECONDS = 300.0
"""The longest pause one ``Retry-After`` can impose (``VPAY_<RAIL>_MAX_PAUSE_SECONDS``)."""


class RailGate:
    """The pause state of one rail (``rail`` is its code). Thread-safe.
    ``clock`` is monotonic seconds (tests may pass their own)."""

    def __init__(self, rail: str, max_pause: float = DEFAULT_MAX_PAUSE_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.rail = rail
        self.max_pause = float(max_pause)
        self._clock = clock
        self._lock = threading.Lock()
        self._until: float | None = None   # per clock
        self._wall_until: datetime | None = None
        self._reason = ""

    def check(self) -> None:
        """Raise ``RailPaused`` while a pause lasts; otherwise return."""
        with self._lock:
            if self._until is None:
                return
            left = self._until - self._clock()
            if left <= 0:
                self._until = self._wall_until = None
                log.info("rail resumed", extra={"rail": self.rail})
                return
            reason = self._reason
        raise RailPaused(self.rail, left, reason)

    def pause(self, seconds: float, reason: str) -> float:
        """Close the gate for ``seconds`` (capped at ``max_pause``), or keep
        a longer pause already in force. Answers the seconds left."""
        wanted = min(max(float(seconds), 0.0), self.max_pause)
        with self._lock:
            now = self._clock()
            until = now + wanted
            if self._until is not None and self._until >= until:
                return self._until - now
            self._until = until
            self._wall_until = datetime.now(timezone.utc) + timedelta(seconds=wanted)
            self._reason = reason
            wall = self._wall_until
        log.warning("rail paused", extra={"rail": self.rail, "seconds": round(wanted, 3),
                                          "asked_seconds": round(float(seconds), 3),
                                          "paused_until": wall.isoformat(), "reason": reason})
        return wanted

    def paused_until(self) -> str | None:
        """The end of the pause in force, ISO 8601 UTC, or None."""
        with self._lock:
            if self._until is None or self._until <= self._clock():
                return None
            return self._wall_until.isoformat() if self._wall_until else None
