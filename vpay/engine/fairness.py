"""Fairness inside a lane: one merchant's burst holds up nobody else's polls.

Issue #11 ("Isolation"), docs/flows/reconciler.md ("Fairness inside a
lane"), sql/0015_fair_claims.sql. Lanes keep a trickling rail or a hanging
endpoint from holding other lanes; inside one lane, claims are oldest first,
so 500 payments created at once by merchant S (or 500 callbacks pulling S's
polls forward) would put 500 due status reads ahead of merchant C's next one.

The rule is fair queueing by rounds (start-time fair queueing, with the
lane's current round as the virtual clock): each merchant keeps a share,
backlogs are served one job per merchant per round, and nothing waits while
a loop is free.

* every job records the merchant it works for (``jobs.fair_key``, filled by
  a trigger on insert; ``NULL`` for housekeeping);
* when a claim finds its lane **behind** (the job it took was due more than
  ``BEHIND_SECONDS`` ago), the claiming worker **rebalances** the lane
  (``rebalance_lane``): each due job not yet placed gets a round
  (``jobs.share_round``). A merchant with no backlog keeps its oldest
  ``SHARE`` in round 0, less its jobs the lane is running now, and starts
  the rest at the round the lane is serving; a merchant with a backlog keeps
  ``SHARE`` in round 0 (besides its jobs aged back there) and queues the
  others behind its last round;
* a claim takes the oldest due job of round 0 first, then the lowest round
  (oldest first inside it), and sets the job's round back to 0: a
  rescheduled poll starts within its share again;
* so that round 0 cannot keep the rounds waiting for ever (one-job merchants
  arriving faster than the lane reads), a pass puts the lowest round back in
  round 0 once its oldest job is ``ROUND_AGE_SECONDS`` past due.

So a merchant not involved in a burst waits, at worst, for the jobs already
running and one job per round of each backlogged merchant, never for the
whole burst. Each process rebalances a lane at most once per
``PASS_INTERVAL``; a pass reads the lane's due backlog once and writes only
the jobs it places or ages (each at most twice per time it is due). A lane
that keeps up never rebalances.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import psycopg

from vpay.base.queries import Q
from vpay.engine import lanes as _lanes

def fair_lanes() -> tuple[str, ...]:
    """Lanes whose jobs work for one party each (``jobs.fair_key``), as
    registered (``vpay.engine.lanes.register_lane(fair=True)``): in the money
    domain the rail lanes (status reads, re-sends, refund reads) and webhook
    deliveries. Housekeeping jobs have no party and are never rebalanced."""
    return _lanes.FAIR_LANES

SHARE = 1
"""Due jobs a merchant without a backlog keeps in round 0 (served by age,
before any round) when its lane is behind. One: a merchant not in a burst
gets its next job read after at most one job of each backlogged merchant
(plus those already running)."""

BEHIND_SECONDS = 0.25
"""A claimed job due more than this many seconds before its claim means
the lane is behind: a rebalance is due. A lane that keeps up (claims within
the wake-up's few milliseconds) never pays for one."""

ROUND_AGE_SECONDS = 10.0
"""Seconds past due after which the lowest round goes back to round 0 at the
next pass. Round 0 (each merchant's share, and every job due since the last
pass) is served before any round; without this, one-job merchants arriving
faster than the lane reads (overload) would keep a backlog's rounds waiting
for ever. With it, every pass while the lane is behind serves each backlog
at least one more job."""

PASS_INTERVAL = 0.5
"""Seconds between two rebalances of one lane by one process, at least.
Bounds the pass's cost (one read of the lane's due backlog) while a
backlog lasts; jobs that fall due between passes queue by age."""


class Rebalancer:
    """Decides when a worker process rebalances a lane, and does it.

    ``share``, ``behind``, ``interval`` and ``age`` default to ``SHARE``,
    ``BEHIND_SECONDS``, ``PASS_INTERVAL`` and ``ROUND_AGE_SECONDS``;
    ``clock`` (seconds, monotonic) is for tests. Raises ``ValueError`` for a
    share below 1 or a negative age. Thread-safe: of several claim loops that
    find their lane behind at once, one rebalances."""

    def __init__(self, share: int = SHARE, behind: float = BEHIND_SECONDS,
                 interval: float = PASS_INTERVAL, age: float = ROUND_AGE_SECONDS,
                 lanes: tuple[str, ...] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if share < 1:
            raise ValueError(f"share {share}: each merchant keeps at least 1 due job in place")
        if not age >= 0:
            raise ValueError(f"age {age}: seconds, at least 0")
        self.share = share
        self.age = age
        self.behind = behind
        self.interval = interval
        self.lanes = frozenset(fair_lanes() if lanes is None else lanes)
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def take_turn(self, lane: str, late_by: float) -> bool:
        """Whether the caller should rebalance ``lane`` now, having claimed a
        job of it ``late_by`` seconds after it was due. True at most once per
        ``interval`` per lane (the turn is taken by answering True)."""
        if lane not in self.lanes or late_by <= self.behind:
            return False
        now = self._clock()
        with self._lock:
            last = self._last.get(lane)
            if last is not None and now - last < self.interval:
                return False
            self._last[lane] = now
        return True

    def rebalance(self, conn: psycopg.Connection, lane: str) -> tuple[int, int]:
        """One pass over ``lane`` (``rebalance_lane``) on ``conn`` (autocommit):
        answers ``(placed, aged)``: due jobs it placed in a round beyond their
        merchant's share, and jobs of the lowest round it put back in round 0
        because they had waited ``age`` seconds. Raises ``psycopg.Error`` on a
        database error (nothing is half-written: one statement)."""
        rows = conn.execute(Q["rebalance_lane"], {"lane": lane, "share": self.share,
                                                 "age": self.age}).fetchall()
        placed = sum(1 for _id, round_ in rows if round_ > 0)
        return placed, len(rows) - placed
