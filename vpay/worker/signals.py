"""SIGTERM/SIGINT to a drain, without ever raising from a signal handler.

rails.md, "Operations": an exception landing inside psycopg's commit would
leave the commit's outcome unknown, so the handler only sets flags. The first
signal asks for a drain (``stop``); a second skips the rest of the grace
(``hurry``). Only the main thread receives signals, and the main thread never
blocks inside ``Event.wait`` on these events (it polls ``is_set``), so the
handler can never deadlock on an Event's internal lock.
"""

from __future__ import annotations

import enum
import signal
import threading
import time


class Drain(enum.IntEnum):
    """How a worker ended; the value is its exit code (contract: exit codes)."""

    CLEAN = 0       # every in-flight job finished within the grace
    TIMED_OUT = 1   # the grace ran out (or a second signal), or jobs whose outcome could not
                    # be written were still leased, or the worker id was taken over by another
                    # process: leases were released (or, the database away, left to the reaper)
    CRASHED = 70    # a claim loop died (EX_SOFTWARE): "anything else is a crash"


class ShutdownSignals:
    """Flags set by SIGTERM/SIGINT. ``stop`` is set by the first signal,
    ``hurry`` by the second; ``received_at`` is the ``time.monotonic()`` of
    the first (the grace clock starts there, design page "SIGTERM and the
    drain")."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.hurry = threading.Event()
        self.received_at: float | None = None
        self.signal_name: str | None = None

    def _on_signal(self, signum: int, _frame) -> None:
        if self.stop.is_set():
            self.hurry.set()
            return
        self.received_at = time.monotonic()
        self.signal_name = signal.Signals(signum).name
        self.stop.set()

    def request(self, reason: str) -> None:
        """Ask for a drain from inside the process, as a first signal would
        (``signal_name`` is ``reason``): the worker id was taken over
        (vpay/worker/presence.py). Only sets flags; any thread. Nothing when
        a drain was already asked for."""
        if self.stop.is_set():
            return
        self.received_at = time.monotonic()
        self.signal_name = reason
        self.stop.set()

    def install(self) -> "ShutdownSignals":
        """Register for SIGTERM and SIGINT. Call from the main thread."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        return self
