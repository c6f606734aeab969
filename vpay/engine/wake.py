"""Waking claim loops on commit: Postgres LISTEN/NOTIFY, routed by lane.

Design: docs/design/rails.md, "Waking on commit"; issue #15. The shape:

* The database notifies channel ``vpay_jobs`` with the job's lane as the
  payload whenever a job becomes due now: inserted due, or moved to due and
  unleased (a pull-forward, a release, a reap); the trigger is in
  ``sql/0014_jobs_wake.sql``, so every writer of ``jobs`` is covered.
  ``NOTIFY`` is delivered at commit, and identical payloads of one
  transaction are collapsed: a batch of a thousand jobs is one wake-up.
* One ``Listener`` thread per worker process holds its own session-level
  autocommit connection (never one of the pool's: a pooled connection is
  handed to others, and ``LISTEN`` belongs to the session), to the session
  URL (``VPAY_SESSION_DATABASE_URL``, default ``VPAY_DATABASE_URL``): behind
  a transaction-pooling bouncer, Postgres itself or a session-mode pool,
  since a ``LISTEN`` through transaction pooling never delivers (the worker
  refuses to start so: vpay/base/pooling.py). It hands each notification to
  the ``Waker``.
* The ``Waker`` wakes ONE idle claim loop serving that lane. A loop that
  then claims a job wakes one more idle sibling (``spread``), so a backlog
  spreads to as many loops as it keeps busy, at the price of one empty claim
  per burst; a notification that finds no loop of its lane idle is kept as
  *pending* for the lane and consumed by the next loop about to sleep (so a
  notification that lands between a loop's empty claim and its sleep is not
  lost). That is the debounce: however many notifications a lane gets, each
  idle loop is woken at most once, and loops busy with that lane are left
  alone (they claim again as they finish). A notification never wakes a
  loop that neither serves its lane nor may borrow from it. A pending
  notification older than the loop's last claim (``claiming``) does not
  make it claim again: a notification arrives after its commit, so that
  claim already saw the job, and found it taken (issue 30: a loop that
  finished its job with a claim that found nothing then claimed once more,
  for a deliver job notified while it ran).
* Borrowers (issue 30, lending idle loops: vpay/engine/timeshare.py): when
  no loop of the lane is idle, a notification or a ``spread`` wakes an idle
  loop of another lane that may borrow from it now (``lendable``), and a
  loop about to sleep claims for a pending lane it may borrow from. Its claim
  takes its own lanes' jobs first; borrowed lanes' jobs that fall due with
  time reach borrowers only this way (their sleep is timed by their own
  lanes), so borrowers join a backlog as it spreads, not at every due job.
  A borrower never consumes a lent lane's pending notification (it claims
  again for one newer than its last claim): its claim skips the parties
  it may not take, so only the lane's own loops end a lane's pending.
* The listener makes the woken loop's first claim itself, on its own
  connection, before waking it (``Waker.claim_for``; the worker passes the
  claim), and the loop starts from that answer: a job to run, or the seconds
  until its lanes' next job is due. On the wake path that is one thread and
  one connection fewer than the loop claiming for itself: no handover to a
  second thread before the claim, no pool checkout, and no liveness check of
  a pooled connection that sat idle (issue #15: commit-to-claim p99 at the
  default flags; docs/performance.md). The claim is the same statement with
  the same worker id and lease, so nothing downstream can tell who made it.
* The idle sleep stays as the fallback (a listener reconnecting misses what
  is sent meanwhile), jittered so that the loops do not sleep in step; and
  after the listener (re)connects, every idle loop claims once.
* A listener whose connection dies without a word (a NAT, a firewall, a
  relay that stops forwarding) is found and replaced within a named bound,
  ``VPAY_LISTENER_DEAD_AFTER_SECONDS`` (default 30 s): TCP keepalives, a ping
  with its own deadline while nothing is heard, a bounded reconnection
  (``vpay.engine.liveness``). Logged (one WARNING per replacement) and
  counted (``vpay_listener_reconnects_total{cause}``).

Nothing here asserts anything about the queue: a wake-up only makes a loop
claim sooner, and a claim finds what is due or nothing.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import psycopg

from vpay.base import metrics
from vpay.base.db import session_connect
from vpay.engine.liveness import Liveness, ListenerUnresponsive, ping

log = logging.getLogger("vpay.worker")

CHANNEL = "vpay_jobs"
"""The NOTIFY channel; payload: the lane of a job that became due now."""

DOWN_WARNING_SECONDS = 300.0
"""A listener that cannot listen for this long logs one WARNING (INFO
before): shorter outages are the database's, and the claim loops say so."""



def jittered(seconds: float) -> float:
    """An idle sleep drawn from [seconds / 2, seconds]: never longer than
    ``--idle-sleep``, and loops that went idle together drift apart."""
    return seconds * random.uniform(0.5, 1.0)


class Waker:
    """Routes wake-ups to claim loops. ``groups[slot]`` is the lanes claim
    loop ``slot`` serves. ``lendable(lanes)`` (default: none) answers the
    lanes a loop serving ``lanes`` may borrow from now; it is called under
    the waker's lock and must not call back. Thread-safe; every method is
    O(loops)."""

    def __init__(self, groups: Sequence[Iterable[str]],
                 lendable: Callable[[tuple[str, ...]], frozenset[str]] | None = None):
        self._lendable = lendable
        self._lanes = [tuple(g) for g in groups]
        self._groups = [frozenset(g) for g in self._lanes]
        self._events = [threading.Event() for _ in self._groups]
        self._idle: list[int] = []        # idle slots, longest idle first
        # lane -> the notification count when it was last notified while
        # none of its loops was idle; slot -> the count when it last claimed
        self._pending: dict[str, int] = {}
        self._notified = 0
        self._claimed = [0] * len(self._groups)
        self._claiming: set[int] = set()  # slots the listener is claiming for (claim_for)
        self._answers: dict[int, Any] = {}  # slot -> what the listener claimed for it
        self._lock = threading.Condition()
        self.wakeups = [0] * len(self._groups)  # per slot, for tests and the gauge

    def _idle_for(self, lane: str | None, exclude: int | None = None) -> int | None:
        # An idle loop of the lane first (longest idle first), else an idle
        # loop that may borrow from it now.
        for slot in self._idle:
            if slot != exclude and (lane is None or lane in self._groups[slot]):
                return slot
        if lane is not None and self._lendable is not None:
            for slot in self._idle:
                if slot != exclude and lane in self._lendable(self._lanes[slot]):
                    return slot
        return None

    def _wake_one(self, lane: str | None, exclude: int | None = None) -> int | None:
        slot = self._idle_for(lane, exclude)
        if slot is None:
            return None
        self._idle.remove(slot)
        self.wakeups[slot] += 1
        self._events[slot].set()
        return slot

    def notify(self, lane: str) -> None:
        """A job of ``lane`` became due: wake one idle loop serving it (or,
        none being idle, one that may borrow from it), or keep the lane
        pending for the next loop of it that goes idle. A borrower woken
        leaves the lane pending too: its claim may skip the job."""
        with self._lock:
            slot = self._wake_one(lane)
            if (slot is None or lane not in self._groups[slot]) and any(lane in g for g in self._groups):
                self._keep(lane)

    def _keep(self, lane: str) -> None:
        self._notified += 1
        self._pending[lane] = self._notified

    def claiming(self, slot: int) -> None:
        """Loop ``slot`` is about to claim (its own claim, or the claim
        written with its last job's outcome): what is pending so far is seen
        by that claim. Unlocked: a stale count only means one claim more."""
        self._claimed[slot] = self._notified

    def claim_for(self, lane: str, claim: Callable[[tuple[str, ...]], Any]) -> bool:
        """A job of ``lane`` became due: take the idle loop ``notify`` would
        wake out of the idle list (a borrower when no loop of the lane is
        idle), run ``claim(the lanes it serves)`` on the
        calling thread (the listener's), and wake the loop with the answer,
        which it ``take``s instead of claiming itself. Answers whether a loop
        was found; when none was, the lane is kept pending, as ``notify``
        does. When ``claim`` raises, the loop is woken with no answer (it
        claims for itself) and the exception propagates. A loop whose sleep
        ends meanwhile (its timeout, the drain) waits for this answer."""
        with self._lock:
            slot = self._idle_for(lane)
            if slot is None:
                if any(lane in g for g in self._groups):
                    self._keep(lane)
                return False
            self._idle.remove(slot)
            self._claiming.add(slot)
            if lane not in self._groups[slot]:
                # A borrower's claim may skip this job (a party it leaves
                # alone): the lane stays pending for its own loops, one of
                # which may be in a claim that began before this commit.
                self._keep(lane)
            self._claimed[slot] = self._notified
        answer = None
        try:
            answer = claim(self._lanes[slot])
        finally:
            with self._lock:
                self._claiming.discard(slot)
                if answer is not None:
                    self._answers[slot] = answer
                self.wakeups[slot] += 1
                self._events[slot].set()
                self._lock.notify_all()
        return True

    def take(self, slot: int) -> Any:
        """What the listener claimed for loop ``slot`` as it woke it
        (``claim_for``), once; ``None`` when it claimed nothing for it."""
        with self._lock:
            return self._answers.pop(slot, None)

    def spread(self, slot: int, lane: str | None = None) -> None:
        """Loop ``slot`` claimed a job of ``lane``: wake one idle loop of
        that lane, or one that may borrow from it (there may be more where
        that came from). ``lane`` ``None``: one idle loop sharing a lane
        with ``slot``."""
        if not self._idle:
            # Unlocked look, once per claimed job: nobody to wake. A loop
            # that goes idle just after would have missed a locked look too.
            return
        with self._lock:
            for each in (self._groups[slot] if lane is None else (lane,)):
                if self._wake_one(each, exclude=slot) is not None:
                    return

    def wake_all(self) -> None:
        """Every idle loop claims once (the listener has just (re)connected
        and may have missed notifications)."""
        with self._lock:
            while self._wake_one(None) is not None:
                pass

    def sleep(self, slot: int, timeout: float, stop: threading.Event | None = None) -> bool:
        """Loop ``slot`` found nothing: sleep up to ``timeout`` seconds or
        until woken (or ``stop`` is set). Answers at once, ``True``, when one
        of its lanes, or of the lanes it may borrow from, is pending with a
        notification newer than the loop's last claim (``claiming``: one it
        might have missed). After
        it, ``take(slot)`` says whether the listener claimed for it."""
        with self._lock:
            mine = self._pending.keys() & self._groups[slot]
            if mine:
                # consumed: one newer than this loop's last claim makes it
                # claim again; the others that claim already saw
                if max(self._pending.pop(lane) for lane in mine) > self._claimed[slot]:
                    return True
            elif self._pending and self._lendable is not None:
                # Looked at, never consumed: a borrower's claim may leave a
                # lent lane's jobs alone (a party it skips), so the lane
                # stays pending for its own loops (a lost wake-up otherwise:
                # fresh-clone review of issue 30). Newer than this loop's
                # last claim, it claims again once.
                lent = self._pending.keys() & self._lendable(self._lanes[slot])
                if lent and max(self._pending[lane] for lane in lent) > self._claimed[slot]:
                    return True
            event = self._events[slot]
            event.clear()
            self._idle.append(slot)
        woken = event.wait(timeout)
        with self._lock:
            if slot in self._idle:
                self._idle.remove(slot)
            # Taken out of the idle list by the listener, which is claiming
            # for this loop right now: its answer is the loop's next job,
            # whatever woke the loop (its timeout, the drain).
            while slot in self._claiming:
                self._lock.wait()
                woken = True
        return woken

    def stop(self) -> None:
        """Wake every loop (the drain: nobody sleeps through a signal)."""
        with self._lock:
            for slot, event in enumerate(self._events):
                if slot in self._idle:
                    self._idle.remove(slot)
                event.set()


class Listener(threading.Thread):
    """``LISTEN vpay_jobs`` on a connection of its own, handing lanes to
    ``waker``; reconnects with backoff (0.5 s doubling to 10 s) for as long
    as the worker runs, and after each (re)connection wakes every idle loop
    once. With ``claim(conn, lanes)`` (the worker's), each notification is
    ``Waker.claim_for``: the listener claims on ``conn`` for the loop it
    wakes; without, ``Waker.notify``. ``connected`` is set while listening;
    ``connections`` counts successful connects (tests), ``notifications``
    the notifications received (the gauge line: proof that wake-ups arrive
    through the session URL). ``url`` is the session URL
    (``VPAY_SESSION_DATABASE_URL``). ``liveness`` bounds how long a
    connection that stopped answering is kept (``vpay.engine.liveness``;
    default 30 s)."""

    def __init__(self, url: str, waker: Waker, halt: threading.Event, worker_id: str = "",
                 claim: Callable[[psycopg.Connection, tuple[str, ...]], Any] | None = None,
                 liveness: Liveness | None = None):
        super().__init__(name="listener", daemon=True)
        self.url = url
        self.liveness = liveness or Liveness()
        self.waker = waker
        self.claim = claim
        self.halt = halt
        self.worker_id = worker_id
        self.connected = threading.Event()
        self.connections = 0
        self.notifications = 0
        self.backend_pid: int | None = None
        self._listening_since: float | None = None
        self._cause = ""  # why the last connection ended: unresponsive, lost
        self._down_since: float | None = None

    def snapshot(self) -> dict:
        """For the gauge line: ``listening`` (connected now), ``connections``
        (successful connects since boot), ``notifications`` (received since boot)."""
        return {"listening": self.connected.is_set(), "connections": self.connections,
                "notifications": self.notifications}

    def run(self) -> None:
        backoff = 0.5
        down_since: float | None = None
        warned = False
        while not self.halt.is_set():
            try:
                self._listen()  # returns when the worker halts
                backoff, down_since, warned = 0.5, None, False
            except psycopg.Error as exc:
                metrics.database_error("listener")
                self.connected.clear()
                now = time.monotonic()
                if self._listening_since is not None:  # it was listening: a new outage
                    # the first retry comes soon, whatever the last outage
                    # cost: the replacement bound counts on it
                    down_since, warned, backoff = now, False, 0.5
                    self._cause = "unresponsive" if isinstance(exc, ListenerUnresponsive) else "lost"
                    self._down_since = now
                self._listening_since = None
                down_since = down_since or now
                if isinstance(exc, ListenerUnresponsive):
                    # Not the database's outage (the claim loops say nothing):
                    # this connection went silent. Once per replacement.
                    log.warning("listener unresponsive; replacing it", extra={
                        "worker_id": self.worker_id, "error": str(exc),
                        "dead_after_seconds": self.liveness.dead_after, "retry_in": backoff})
                else:
                    # INFO while the outage is short: the claim loops log the
                    # database's absence, and the idle sleep covers the wake-ups.
                    # A listener down for long (LISTEN refused, a transaction-mode
                    # bouncer in the way) is worth one WARNING.
                    long_down = now - down_since >= DOWN_WARNING_SECONDS
                    level = logging.WARNING if long_down and not warned else logging.INFO
                    warned = warned or long_down
                    log.log(level, "listener lost its connection; loops fall back to the idle sleep",
                            extra={"worker_id": self.worker_id, "error": str(exc)[:300],
                                   "down_seconds": round(now - down_since, 1), "retry_in": backoff})
                self.halt.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _listen(self) -> None:
        live = self.liveness
        params = live.params(self.url)
        timeout = params.pop("connect_timeout")
        with session_connect(self.url, f"vpay-listener {self.worker_id}", timeout=timeout, **params) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self.backend_pid = conn.info.backend_pid
            self._listening_since = time.monotonic()
            self.connections += 1
            self.connected.set()
            if self.connections > 1:
                cause = self._cause or "lost"
                metrics.listener_reconnected(cause)
                log.info("listener reconnected", extra={
                    "worker_id": self.worker_id, "cause": cause,
                    "down_seconds": round(time.monotonic() - (self._down_since or time.monotonic()), 1)})
            self.waker.wake_all()  # claim once before waiting: we may have missed some
            heard = time.monotonic()
            while not self.halt.is_set():
                # Back from the first batch, so a claim runs at once (not
                # inside the generator, which holds the connection; what
                # arrives meanwhile is kept by psycopg for the next call).
                lanes = [note.payload for note in conn.notifies(timeout=1.0, stop_after=1)]
                if not lanes and time.monotonic() - heard >= live.ping_every:
                    # Nothing heard for a while: a quiet queue, or a dead
                    # connection. A ping with its own deadline tells them
                    # apart (raises ListenerUnresponsive; liveness.py).
                    lanes = ping(conn, live.ping_timeout)
                self.notifications += len(lanes)
                for lane in lanes:
                    self._hand_on(conn, lane)
                if lanes:
                    heard = time.monotonic()
        self.connected.clear()

    def _hand_on(self, conn: psycopg.Connection, lane: str) -> None:
        """A job of ``lane`` became due: wake a loop, claiming for it on
        ``conn`` when the worker gave a claim."""
        if self.claim is None:
            self.waker.notify(lane)
            return
        try:
            self.waker.claim_for(lane, lambda lanes: self.claim(conn, lanes))
        except psycopg.Error as exc:
            if conn.broken or conn.closed:
                raise  # reconnect; the loop it was for claims itself
            metrics.database_error("listener")
            # The connection is fine (a read-only server, a
            # statement error): the woken loop claims itself.
            log.info("listener's claim failed; the loop claims itself",
                     extra={"worker_id": self.worker_id, "error": str(exc)[:300]})
