"""Whether the database commits synchronously to a standby: what a failover
can lose (docs/deployment.md, "Replication and failover").

A commit is on a standby before it returns when both hold (PostgreSQL docs,
"Synchronous Replication", and the ``synchronous_commit`` setting):
``synchronous_standby_names`` names at least one standby, and
``synchronous_commit`` is ``on``, ``remote_write`` or ``remote_apply``
(``local`` and ``off`` return before any standby has the commit). Otherwise
a failover to a standby loses what it had not received: payments the API
answered 201 for, settles, events the merchant was sent.

* ``read(conn)`` answers a ``CommitMode`` (one round trip).
* ``CommitModeLog`` is a pool ``configure`` hook (``vpay.base.db.make_pool``):
  every new connection reads the mode, and the process logs it (``database
  commit mode``, info) the first time and whenever it changes, e.g. after a
  failover to a server configured otherwise. ``vpay-server api`` and the
  worker use it, so each says at start what its database does.
* The worker's scrape reports it as ``vpay_database_synchronous_commit``
  (``vpay.money.gauges``), read from the database each time, so the gauge
  follows the primary through a failover.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import psycopg

from vpay.base.queries import Q

log = logging.getLogger("vpay.db")

SYNCHRONOUS_LEVELS = frozenset({"on", "remote_write", "remote_apply"})
"""``synchronous_commit`` values that wait for the synchronous standbys
(with ``synchronous_standby_names`` set). ``remote_write`` waits for the
standby's operating system to have the commit, not its disk: it survives the
primary's loss, not both hosts' at once."""


@dataclass(frozen=True)
class CommitMode:
    """The two settings as the session sees them."""

    synchronous_standby_names: str
    synchronous_commit: str

    @property
    def synchronous(self) -> bool:
        """Whether a commit returns only once a synchronous standby has it."""
        return bool(self.synchronous_standby_names.strip()) and self.synchronous_commit in SYNCHRONOUS_LEVELS

    def fields(self) -> dict[str, object]:
        """Log fields: ``synchronous`` and both settings."""
        return {"synchronous": self.synchronous, "synchronous_standby_names": self.synchronous_standby_names,
                "synchronous_commit": self.synchronous_commit}


def read(conn: psycopg.Connection) -> CommitMode:
    """The session's commit mode (``commit_mode``, sql/queries/replication.sql).
    Raises what the query raises (``psycopg.Error``). Leaves an autocommit
    connection idle; on a connection in a transaction, runs inside it."""
    names, level = conn.execute(Q["commit_mode"]).fetchone()
    return CommitMode(synchronous_standby_names=names or "", synchronous_commit=level or "")


class CommitModeLog:
    """A ``psycopg_pool`` ``configure`` hook: read the commit mode of each new
    connection and log it (``database commit mode``) when it differs from
    the last one this hook logged, the first time included. Never raises:
    a connection that cannot answer is not refused for a report (the
    failure is logged at debug, and the next connection tries again).
    Thread-safe (the pool opens connections from its own threads)."""

    def __init__(self, who: str):
        self.who = who
        self.last: CommitMode | None = None
        self._lock = threading.Lock()

    def __call__(self, conn: psycopg.Connection) -> None:
        try:
            mode = read(conn)
        except psycopg.Error as exc:
            log.debug("commit mode not read", extra={"error": f"{type(exc).__name__}: {exc}"[:300]})
            return
        with self._lock:
            if mode == self.last:
                return
            self.last = mode
        log.info("database commit mode", extra={"service": self.who, **mode.fields(),
                                                "failover_may_lose_commits": not mode.synchronous})
