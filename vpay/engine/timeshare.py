"""A fair share in time inside a lane, and idle loops lent to other lanes
(issue 30, "Speed II"; docs/flows/reconciler.md, "A fair share in time" and
"Lending idle loops").

Lanes split a worker's claim loops by lane, and fairness inside a lane
(``vpay.engine.fairness``) orders a lane's due jobs by merchant; both count
jobs, not time. Ten status reads that trickle until their 20 s deadline held
both ``mtn`` loops while another merchant's reads waited; and a loop whose
own lanes had nothing due idled beside a lane with a 500-read backlog. This
module keeps, per worker process, what those two rules need, and answers
each claim with what it may take (``plan``):

* **The party share.** A *party* is one kind of work for one merchant
  (``party_of``: the job's kind and ``jobs.fair_key``, e.g.
  ``deliver/m_shop``; ``None`` for housekeeping): a merchant's fan-outs,
  which are fast, vouch nothing for its deliveries, which may hang. In each
  lane, the jobs of one
  party this worker runs at once are at most ``cap(lane)`` =
  ``max(1, floor(party_share x the lane's own loops))`` (``--party-share``,
  default ``PARTY_SHARE`` 0.5: one of ``mtn``'s two default loops), unless
  the party is **known fast** there: a job of it ended there within
  ``PARTY_MEMORY_SECONDS`` in less than ``SLOW_CALL_SECONDS``, none ended
  slower within that memory, and none of it is running there past
  ``SLOW_CALL_SECONDS`` now. A party not seen yet is not known fast: it gets
  its share until its first job ends fast. So a party whose reads are slow
  (or may be) holds at most its share of the lane's loops, while a party
  whose reads come back fast may use every loop free (a loop it holds is
  free again within ``SLOW_CALL_SECONDS``: that is a fair share in time).
  The claim skips parties at their share (``skip``: ``"lane/kind/merchant"``
  keys);
  a claim that raced a sibling past the share is handed back unrun
  (``admit`` answers ``False``; the queue's ``unclaim``).
* **Lending.** A loop whose own lanes have nothing due claims from the
  other lanes this worker serves (``lent``), one job at a time: its own
  lanes come first at every claim, so each lane keeps its guaranteed loops,
  and a loop that borrowed is held by a hanging peer for at most one call,
  bounded by that call's deadline. A lane is **slow**, and not lent to,
  while a job of it has run past ``SLOW_CALL_SECONDS`` and for
  ``LANE_COOLDOWN_SECONDS`` after one ended so. Inside a lane lent to, a
  borrower takes no job of a party that is not known fast and already has a
  job running here, nor of a party with a slow job remembered (its share
  for borrowers is 0): a merchant whose first delivery is hanging, or whose
  first read of a burst is not back yet, keeps its jobs to the lane's own
  loops until it is known fast, so lending cannot put every idle loop on a
  peer that is about to hang. Rail lanes whose rail is not configured here
  (``passive``: they ride on the housekeeping loop) are never lent to, nor
  is a lane given an exact count with ``--lane-concurrency`` (``fixed``):
  that count is how an operator limits the calls a worker makes to a rail
  (docs/runbooks/worker-queue.md, "A paused rail"), and borrowers would
  exceed it. ``--no-lend`` turns lending off.

Everything here is per process and in memory (a restart forgets who was
fast); the database is never asked. Thread-safe: one lock, held for
microseconds (no I/O under it). Times are ``clock()`` seconds (monotonic).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Callable

from vpay.engine import lanes as _lanes

PARTY_SHARE = 0.5
"""Default ``--party-share`` (``VPAY_WORKER_PARTY_SHARE``): the fraction of
a lane's own loops the jobs of one party not known fast may hold at once."""

SLOW_CALL_SECONDS = 1.0
"""A job that ran this long or longer is slow: its party is not known fast
in its lane for ``PARTY_MEMORY_SECONDS``, and its lane is not lent to for
``LANE_COOLDOWN_SECONDS``. One second: a known-fast party holding every loop
frees one within about this, so another party's read waits about this at
most (the issue's goal: another merchant's first-read lateness p99 <= 2 s)."""

PARTY_MEMORY_SECONDS = 300.0
"""How long a party's last slow job keeps it from being known fast, and how
long a fast one vouches for it. Longer than the poll ladder's 120 s rungs,
so a merchant whose reads trickle is still remembered when they fall due
again. Bounds this module's memory too: a party not seen for this long is
forgotten."""

LANE_COOLDOWN_SECONDS = 60.0
"""A lane with a job slower than ``SLOW_CALL_SECONDS`` is not lent to until
this long after that job ended (and never while one is running past it)."""

SKIP_SEPARATOR = "/"
"""``skip`` keys are ``lane/kind/merchant`` (``lane + "/" + party``): lane
and kind names have no ``/``, so a merchant id may."""


def party_of(kind: str, merchant: str | None) -> str | None:
    """The party of a job of ``kind`` working for ``merchant``
    (``jobs.fair_key``): ``"kind/merchant"``, or ``None`` for a job that
    works for nobody (housekeeping), which is never capped."""
    return None if merchant is None else f"{kind}{SKIP_SEPARATOR}{merchant}"


class TimeShareError(ValueError):
    """A party share or lending setting that cannot be used; the message is
    one line, fit for ``refuse()`` (exit 78)."""


def parse_party_share(text: str | None, source: str = "--party-share") -> float:
    """``"0.5"`` → 0.5. ``None`` or blank: ``PARTY_SHARE``. Raises
    ``TimeShareError`` unless it is a finite number above 0 and at most 1
    (1: a party may hold all of a lane's own loops, the rule off). ``source``
    names where ``text`` came from in the error."""
    if text is None or not text.strip():
        return PARTY_SHARE
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 1):
        raise TimeShareError(f"{source} must be a fraction above 0 and at most 1 (e.g. 0.5: half "
                             f"of a lane's loops), got {text.strip()!r}")
    return value


def parse_lend(text: str | None, source: str = "VPAY_WORKER_LEND") -> bool:
    """``on``/``off`` (also ``true``/``false``, ``1``/``0``, ``yes``/``no``,
    any case) → ``True``/``False``; ``None`` or blank: on. Raises
    ``TimeShareError`` for anything else: a typo must not silently keep or
    drop lending."""
    if text is None or not text.strip():
        return True
    value = text.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise TimeShareError(f"{source} must be on or off, got {text.strip()!r}")


def share_cap(share: float, loops: int) -> int:
    """Jobs one party not known fast may run at once in a lane with
    ``loops`` loops of its own: ``max(1, floor(share x loops))`` (a small
    epsilon keeps 0.5 x 4 at 2 under floating point). Never 0: a party is
    always served."""
    return max(1, math.floor(share * loops + 1e-9))


class TimeShare:
    """One worker process's party shares and lending (module docstring).

    ``loops``: the lanes of each claim loop (``lanes.split``). ``share``:
    the party share (0 < share <= 1). ``lend``: lending on. ``passive``:
    rail lanes not configured here, and ``fixed``: lanes given an exact
    count of loops (``--lane-concurrency``), never lent to. ``fair``: lanes whose
    jobs carry a party (default ``lanes.FAIR_LANES``); jobs of other lanes are
    never capped. ``slow``, ``memory``, ``cooldown`` default to
    ``SLOW_CALL_SECONDS``, ``PARTY_MEMORY_SECONDS``, ``LANE_COOLDOWN_SECONDS``;
    ``clock`` is for tests. Raises ``TimeShareError`` for a share outside
    (0, 1]."""

    def __init__(self, loops: Sequence[Iterable[str]], share: float = PARTY_SHARE, lend: bool = True,
                 passive: Iterable[str] = (), fixed: Iterable[str] = (),
                 fair: Iterable[str] | None = None,
                 slow: float = SLOW_CALL_SECONDS, memory: float = PARTY_MEMORY_SECONDS,
                 cooldown: float = LANE_COOLDOWN_SECONDS, clock: Callable[[], float] = time.monotonic):
        if not (math.isfinite(share) and 0 < share <= 1):
            raise TimeShareError(f"party share {share!r}: a fraction above 0 and at most 1")
        groups = [tuple(g) for g in loops]
        own: dict[str, int] = {}
        for group in groups:
            for lane in group:
                own[lane] = own.get(lane, 0) + 1
        self.share = share
        self.lend = lend
        self.slow = slow
        self.memory = memory
        self.cooldown = cooldown
        self.fair = frozenset(_lanes.FAIR_LANES if fair is None else fair)
        self.caps = {lane: share_cap(share, n) for lane, n in own.items()}
        """Per lane served: the most jobs of one party not known fast run at once."""
        closed = set(passive) | set(fixed)
        order = {lane: i for i, lane in enumerate(_lanes.LANES)}
        self.lendable_lanes = tuple(sorted((lane for lane in own if lane not in closed),
                                           key=lambda lane: (order.get(lane, len(order)), lane)))
        """Lanes a loop of another lane may borrow from, in priority order."""
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[Any, tuple[str, str | None, float]] = {}  # job id -> (lane, party, started)
        self._counts: dict[tuple[str, str], int] = {}  # (lane, party) -> jobs running
        self._parties: dict[tuple[str, str], list[float | None]] = {}  # -> [last fast end, last slow end]
        self._slow: dict[tuple[str, str], float] = {}  # (lane, party) -> its last slow end, within memory
        self._lane_slow: dict[str, float] = {}  # lane -> when its last slow job ended
        self._forget_at = clock() + memory
        self.unclaimed = 0
        """Claims handed back unrun because their party was at its share."""

    # ---- what a claim may take ------------------------------------------------

    def plan(self, own: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(lent, skip)`` for a claim by a loop whose own lanes are
        ``own``: ``lent``, the other lanes it may borrow from now (empty with
        lending off); ``skip``, the ``"lane/kind/merchant"`` keys of the
        parties at their share in ``own`` and ``lent``
        (``queue.claim_or_next_due``)."""
        own = tuple(own)
        with self._lock:
            now = self._clock()
            lent = self._lent(own, now)
            if not self._counts and not (lent and self._slow):
                return lent, ()
            own_set = set(own)
            skip = [f"{lane}{SKIP_SEPARATOR}{party}"
                    for (lane, party), n in self._counts.items()
                    if lane in own_set and n >= self.caps.get(lane, 1)
                    and not self._known_fast(lane, party, now)]
            if lent:
                skip += [f"{lane}{SKIP_SEPARATOR}{party}" for lane, party in self._borrowers_skip(lent, now)]
        return lent, tuple(skip)

    def _borrowers_skip(self, lent: tuple[str, ...], now: float) -> list[tuple[str, str]]:
        # A borrower's share of a party not known fast is 0 while that party
        # has a job running here, and while a slow job of it is remembered.
        out = [(lane, party) for (lane, party) in self._counts
               if lane in lent and not self._known_fast(lane, party, now)]
        for key, slow in list(self._slow.items()):
            if now - slow >= self.memory:
                del self._slow[key]
            elif key[0] in lent and key not in self._counts:
                out.append(key)
        return out

    def lendable(self, own: Iterable[str]) -> frozenset[str]:
        """The lanes a loop whose own lanes are ``own`` may borrow from now
        (for the waker: which idle loops a job of a lane may wake)."""
        own = tuple(own)
        with self._lock:
            return frozenset(self._lent(own, self._clock()))

    def _lent(self, own: tuple[str, ...], now: float) -> tuple[str, ...]:
        if not self.lend:
            return ()
        return tuple(lane for lane in self.lendable_lanes
                     if lane not in own and not self._lane_is_slow(lane, now))

    def _lane_is_slow(self, lane: str, now: float) -> bool:
        ended = self._lane_slow.get(lane)
        if ended is not None and now - ended < self.cooldown:
            return True
        return any(l == lane and now - started >= self.slow for l, _p, started in self._running.values())

    def _known_fast(self, lane: str, party: str, now: float) -> bool:
        seen = self._parties.get((lane, party))
        if seen is None:
            return False
        fast, slow = seen
        if fast is None or now - fast >= self.memory:
            return False
        if slow is not None and now - slow < self.memory:
            return False
        return not any(l == lane and p == party and now - started >= self.slow
                       for l, p, started in self._running.values())

    # ---- jobs running ---------------------------------------------------------

    def admit(self, job_id: Any, lane: str, party: str | None, borrowed: bool = False,
              force: bool = False) -> bool:
        """A loop claimed job ``job_id`` of ``lane`` for ``party``
        (``borrowed``: the loop does not serve ``lane``, it borrowed the
        job): count it as running and answer ``True``, unless it would take
        ``party`` past its share in ``lane`` (a sibling's claim raced this
        one; a borrower's share of a party not known fast is 0 while that
        party has a job running or a slow one remembered), when nothing is
        counted and ``False`` answers that the job must be handed back unrun.
        ``force``: count it whatever the share (the hand-back failed, so the
        job runs)."""
        key_party = party if lane in self.fair else None
        with self._lock:
            now = self._clock()
            if key_party is not None and not force and not self._known_fast(lane, key_party, now):
                n = self._counts.get((lane, key_party), 0)
                if borrowed:
                    seen = self._parties.get((lane, key_party))
                    over = n >= 1 or (seen is not None and seen[1] is not None
                                      and now - seen[1] < self.memory)
                else:
                    over = n >= self.caps.get(lane, 1)
                if over:
                    self.unclaimed += 1
                    return False
            self._running[job_id] = (lane, key_party, now)
            if key_party is not None:
                self._counts[(lane, key_party)] = self._counts.get((lane, key_party), 0) + 1
        return True

    def done(self, job_id: Any, lane: str, party: str | None, seconds: float) -> None:
        """Job ``job_id`` (of ``lane``, for ``party``) ran ``seconds`` and
        its loop is free: it no longer counts, and its time is remembered
        (``seconds >= SLOW_CALL_SECONDS``: slow). A job never admitted (a
        test running one by hand) is only remembered."""
        key_party = party if lane in self.fair else None
        with self._lock:
            now = self._clock()
            if self._running.pop(job_id, None) is not None and key_party is not None:
                n = self._counts.get((lane, key_party), 0) - 1
                if n > 0:
                    self._counts[(lane, key_party)] = n
                else:
                    self._counts.pop((lane, key_party), None)
            slow = seconds >= self.slow
            if slow:
                self._lane_slow[lane] = now
            if key_party is not None:
                seen = self._parties.setdefault((lane, key_party), [None, None])
                seen[1 if slow else 0] = now
                if slow:
                    self._slow[(lane, key_party)] = now
            if now >= self._forget_at:
                self._forget(now)

    def _forget(self, now: float) -> None:
        # Once per memory: parties neither fast nor slow within it are as
        # good as unseen, so memory stays bounded by the parties of one period.
        self._parties = {key: seen for key, seen in self._parties.items()
                         if any(t is not None and now - t < self.memory for t in seen)}
        self._slow = {key: t for key, t in self._slow.items() if now - t < self.memory}
        self._lane_slow = {lane: t for lane, t in self._lane_slow.items() if now - t < self.cooldown}
        self._forget_at = now + self.memory

    def running(self) -> int:
        """Jobs counted as running (tests, the gauge)."""
        with self._lock:
            return len(self._running)

    def remembered(self) -> int:
        """Parties remembered (tests: the memory stays bounded)."""
        with self._lock:
            return len(self._parties)
