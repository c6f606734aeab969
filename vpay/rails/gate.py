"""Rail backpressure: one gate per rail adapter, shared by every thread of the
process, and through the database by every process of the deployment.

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

Fleet-wide (issue 25): the rail asked the deployment, not one process. When
the process has shared its pauses (``share_pauses``, done by ``vpay-worker``
and each ``vpay-server api`` process with ``vpay.rails.pauses.DatabasePauses``),
a gate also writes each pause it closes to the board (table
``rail_pauses``: a pause there only extends) and, on every ``check``,
honours the board's pause of its rail, from a copy at most
``vpay.rails.pauses.REFRESH_SECONDS`` old, capped at its own ``max_pause``
from now. A board that cannot be read or written leaves the gate as it
was: the process's own pauses still hold.

Visible: one ``rail paused`` log line (warning) per pause or extension this
process got from the rail, one ``rail paused by another process`` line per
pause adopted from the board, ``rail_paused_until`` (per rail, ISO 8601 UTC,
or null) in the worker's gauge line; the board itself in
``vpay_rail_paused_seconds{rail}``, the console's overview and
``vpay-server rails list``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable, Protocol

from vpay.rails.port import RailPaused

log = logging.getLogger("vpay.rail_gate")

DEFAULT_MAX_PAUSE_SECONDS = 300.0
"""The longest pause one ``Retry-After`` can impose (``VPAY_<RAIL>_MAX_PAUSE_SECONDS``)."""

ADOPT_SLACK_SECONDS = 0.5
"""A pause on the board that ends no later than this after the gate's own is
the gate's own pause read back (the database's clock and ours differ by a
round trip): not adopted, not logged again."""


@dataclass(frozen=True)
class SharedPause:
    """A pause on the board, as a process's copy holds it: ``seconds_left``
    from now (the database's clock when read, aged by the time since),
    ``paused_until`` (the row's, UTC), ``reason`` and ``set_by`` (the process
    that got the rail's answer)."""

    rail: str
    seconds_left: float
    paused_until: datetime
    reason: str
    set_by: str


class PauseBoard(Protocol):
    """Where a process's gates share their pauses (``vpay.rails.pauses``)."""

    def publish(self, rail: str, seconds: float, reason: str) -> None:
        """Pause ``rail`` for ``seconds`` fleet-wide, unless a longer pause is
        in force. Best effort: never raises."""

    def in_force(self, rail: str) -> SharedPause | None:
        """The board's pause of ``rail`` in force now, or None. Never raises."""


_board: PauseBoard | None = None


def share_pauses(board: PauseBoard | None) -> None:
    """Make every ``RailGate`` of this process publish the pauses it closes
    to ``board`` and honour the board's (None: this process alone)."""
    global _board
    _board = board


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
        self._adopted: tuple[datetime, str] | None = None  # the board's row last looked at

    def check(self) -> None:
        """Raise ``RailPaused`` while a pause lasts (this process's own, or
        the board's); otherwise return."""
        board = _board
        if board is not None:
            shared = board.in_force(self.rail)
            if shared is not None:
                self._adopt(shared)
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

    def _adopt(self, shared: SharedPause) -> None:
        """Close the gate until the board's pause ends (capped at
        ``max_pause`` from now), unless it is already closed as long."""
        key = (shared.paused_until, shared.set_by)
        with self._lock:
            if key == self._adopted:
                return  # looked at already: extending again on every refresh would drift
            self._adopted = key
            wanted = min(max(shared.seconds_left, 0.0), self.max_pause)
            now = self._clock()
            if self._until is not None and self._until + ADOPT_SLACK_SECONDS >= now + wanted:
                return
            self._until = now + wanted
            self._wall_until = datetime.now(timezone.utc) + timedelta(seconds=wanted)
            self._reason = f"{shared.reason} (set by {shared.set_by})"
            wall = self._wall_until
        log.warning("rail paused by another process", extra={
            "rail": self.rail, "seconds": round(wanted, 3), "paused_until": wall.isoformat(),
            "reason": shared.reason, "set_by": shared.set_by})

    def pause(self, seconds: float, reason: str) -> float:
        """Close the gate for ``seconds`` (capped at ``max_pause``), or keep
        a longer pause already in force. Answers the seconds left. A pause
        that extends the gate is published to the board, when there is one."""
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
        board = _board
        if board is not None:
            board.publish(self.rail, wanted, reason)
        return wanted

    def paused_until(self) -> str | None:
        """The end of the pause in force, ISO 8601 UTC, or None."""
        with self._lock:
            if self._until is None or self._until <= self._clock():
                return None
            return self._wall_until.isoformat() if self._wall_until else None
