"""The worker loop and the worker command, against a real Postgres."""

from __future__ import annotations

import socket
import threading

import psycopg
import pytest

from support import wait_until
from vpay import handlers
from vpay.engine import queue
from vpay.worker.loop import Worker, WorkerConfig
from vpay.worker.signals import ShutdownSignals


def _worker(pool, wid="w1", concurrency=1) -> Worker:
    ctx = handlers.Context(pool=pool, worker_id=wid)
    return Worker(pool, ctx, WorkerConfig(worker_id=wid, concurrency=concurrency), ShutdownSignals())


@pytest.fixture
def test_handlers(monkeypatch):
    from vpay.handlers import testing  # noqa: F401 (registers the test.* kinds)
    yield


def test_handler_exception_is_retried_with_its_text_kept(db, pool, test_handlers):
    queue.enqueue(db, "test.raise", "r")
    w = _worker(pool)
    w._run(queue.claim(db, "w1"))
    row = db.execute("SELECT failures, last_error, run_at > now(), locked_by FROM jobs").fetchone()
    assert row[0] == 1 and "RuntimeError: test.raise on attempt 1" in row[1]
    assert row[2] is True and row[3] is None
    assert w.gauge.snapshot()["failed"] == 1


def test_consecutive_failures_are_bounded_then_parked_with_an_alert(db, pool, test_handlers):
    queue.enqueue(db, "test.raise", "r")
    db.execute("UPDATE jobs SET failures = %s", (queue.MAX_FAILURES - 1,))
    w = _worker(pool)
    w._run(queue.claim(db, "w1"))
    row = db.execute("SELECT run_at = 'infinity', last_error FROM jobs").fetchone()
    assert row[0] is True and "consecutive failures" in row[1]
    assert db.execute("SELECT kind FROM alerts").fetchall() == [("job_dead_lettered",)]


def test_unknown_kind_is_dead_lettered(db, pool):
    queue.enqueue(db, "no.such.kind", "x")
    _worker(pool)._run(queue.claim(db, "w1"))
    assert db.execute("SELECT run_at = 'infinity' FROM jobs").fetchone() == (True,)


def test_outcome_after_the_lease_was_taken_over_counts_as_lost(db, pool, test_handlers):
    queue.enqueue(db, "test.retry", "x", {"delay": 60})
    job = queue.claim(db, "w1")
    db.execute("UPDATE jobs SET locked_at = now() - interval '1 hour', "
               "lease_expires_at = now() - interval '1 hour' + interval '300 seconds'")
    queue.reap_expired_leases(db)
    other = queue.claim(db, "w2")
    w = _worker(pool)
    w._run(job)
    assert w.gauge.snapshot()["lost"] == 1
    assert db.execute("SELECT locked_by, lease_token FROM jobs").fetchone() == ("w2", other.lease_token)


def test_a_job_whose_rail_is_not_configured_waits_and_is_never_parked(db, pool, merchant, monkeypatch):
    from vpay.money import charges
    for var in [v for v in __import__("os").environ if v.startswith("VPAY_MTN_")]:
        monkeypatch.delenv(var)
    created = charges.create_payment(db, merchant_id=merchant, amount=100, currency="EUR", rail="mtn",
                                   payer="256770000001")
    db.execute("DELETE FROM jobs WHERE kind <> 'poll'")
    db.execute("UPDATE jobs SET run_at = now(), failures = %s WHERE kind = 'poll'", (queue.MAX_FAILURES - 1,))
    w = _worker(pool)
    job = queue.claim(db, "w1")
    assert job.kind == "poll"
    w._run(job)
    row = db.execute("SELECT run_at <> 'infinity', run_at > now() + interval '250 seconds', failures, last_error "
                     "FROM jobs WHERE dedupe_key = %s", (f"poll:{created.charge['id']}",)).fetchone()
    assert row[:3] == (True, True, 0) and row[3].startswith("rail not configured")
    assert db.execute("SELECT count(*) FROM alerts").fetchone()[0] == 0


class _CutOnClaimAnswer:
    """A TCP proxy to the test's Postgres that, once ``armed``, drops the
    connection instead of forwarding the server's answer to a claim
    statement (its RowDescription names ``finished``): the statement has
    committed (autocommit; the answer is flushed after the commit), its
    caller sees the connection die. A network blip, a bouncer restart."""

    def __init__(self, url: str):
        parts = psycopg.conninfo.conninfo_to_dict(url)
        host, port = parts.get("host") or "/tmp", int(parts.get("port") or 5432)
        self.target = ((socket.AF_UNIX, f"{host}/.s.PGSQL.{port}") if host.startswith("/")
                       else (socket.AF_INET, (host, port)))
        self.armed = threading.Event()
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = psycopg.conninfo.make_conninfo(url, host="127.0.0.1", port=self.listener.getsockname()[1],
                                                  sslmode="disable", gssencmode="disable")
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(self.target[0], socket.SOCK_STREAM)
            server.connect(self.target[1])
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src, dst, from_server):
        try:
            while data := src.recv(65536):
                if from_server and self.armed.is_set() and b"finished\x00" in data:
                    self.armed.clear()
                    self.cuts += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.listener.close()


def test_a_finish_and_claim_whose_answer_is_lost_neither_reports_lost_nor_strands_the_next_job(
        db, db_url, test_handlers):
    # The loop writes a Done with the claim of its next job (one statement).
    # When that statement commits but its answer never arrives, the retry
    # (a plain finish) finds the job gone: the outcome was kept, yet it is
    # counted and logged as a lost lease; and the next job, claimed for this
    # live worker, is run by nobody and renewed by nobody until its lease
    # runs out and the reaper counts a failure against it.
    from vpay.base import db as vdb
    queue.enqueue(db, "test.noop", "a", lane="housekeeping")
    queue.enqueue(db, "test.noop", "b", lane="housekeeping")
    db.execute("UPDATE jobs SET run_at = now() - interval '1 minute' WHERE dedupe_key = 'a'")
    proxy = _CutOnClaimAnswer(db_url)
    pool = vdb.make_pool(proxy.url, max_size=4)
    try:
        w = _worker(pool)
        job = queue.claim(db, "w1", 300.0, ["housekeeping"])
        assert job.dedupe_key == "a"
        proxy.armed.set()
        assert w._run(job, ("housekeeping",)) is None
        assert proxy.cuts == 1
    finally:
        pool.close()
        proxy.close()
    assert db.execute("SELECT count(*) FROM jobs WHERE dedupe_key = 'a'").fetchone()[0] == 0  # kept
    stranded = db.execute("SELECT locked_by FROM jobs WHERE dedupe_key = 'b'").fetchone()
    lost = w.gauge.snapshot()["lost"]
    assert (lost, stranded) == (0, (None,)), \
        "lost counts a kept outcome / the next job stays leased to a live worker not running it"


def test_a_claim_whose_answer_is_lost_is_handed_back_by_its_token(db, db_url, test_handlers):
    # The sibling of the finish+claim above: a loop's (or the listener's)
    # plain claim commits and its answer never arrives. The claim was made
    # under a lease token the worker chose, so it is handed back by it:
    # claimable at once, not leased to a live worker that does not know it.
    from vpay.base import db as vdb
    queue.enqueue(db, "test.noop", "b", lane="housekeeping")
    proxy = _CutOnClaimAnswer(db_url)
    pool = vdb.make_pool(proxy.url, max_size=4)
    try:
        w = _worker(pool)
        proxy.armed.set()
        with pytest.raises(psycopg.OperationalError):
            with pool.connection() as conn:
                w._claim_on(conn, ("housekeeping",))
        assert proxy.cuts == 1
        assert not w.leases.unanswered  # released at once: the database answered the hand-back
    finally:
        pool.close()
        proxy.close()
    # attempts 1: the claim did commit before its answer was cut
    assert db.execute("SELECT locked_by, lease_token, attempts FROM jobs WHERE dedupe_key = 'b'"
                      ).fetchone() == (None, None, 1)


def test_a_write_whose_answer_was_lost_is_kept_when_the_row_shows_it_made_and_only_then(db, pool):
    # The retry after an attempt that may have committed (no answer): the
    # lost attempt's reschedule is in the row, so the retry's fenced write
    # matches nothing, and the outcome counts as kept (retried), not lost.
    from vpay.engine.outcome import Done, RetryAfter
    queue.enqueue(db, "test.count", "r", lane="housekeeping")
    w = _worker(pool)
    job = queue.claim(db, "w1", 300.0, ["housekeeping"])
    assert queue.reschedule(db, job, 0, None)  # what the lost attempt committed (due at once)
    assert w.outcomes.write_retrying(job, RetryAfter(60), None, True) is True
    assert w.gauge.snapshot()["retried"] == 1
    # Still ours once another worker has claimed the job since: the row names
    # the lease whose holder ended it.
    assert queue.claim(db, "w2", 300.0, ["housekeeping"]) is not None
    assert w.outcomes.write_retrying(job, RetryAfter(60), None, True) is True
    assert w.gauge.snapshot()["retried"] == 2
    # A finish leaves no row to ask: after errors the server answered (each
    # attempt rolled back), a row gone is another's doing, and nothing is
    # counted; after a lost answer, gone is our finish.
    queue.enqueue(db, "test.count", "f", lane="housekeeping")
    gone = queue.claim(db, "w1", 300.0, ["housekeeping"])
    db.execute("DELETE FROM jobs WHERE id = %s", (gone.id,))
    assert w.outcomes.write_retrying(gone, Done(), None, False) is False
    assert w.outcomes.write_retrying(gone, Done(), None, True) is True
    assert w.gauge.snapshot()["done"] == 1


def _finish_with_faults(db, pool, monkeypatch, faults):
    """Claim a job, then ``OutcomeWriter.apply`` a ``Done`` whose n-th call of
    ``queue.finish`` runs ``faults[n](conn, job, real_finish)`` (the real
    finish from there on). Answers ``(kept, calls, worker)``."""
    from vpay.engine.outcome import Done
    queue.enqueue(db, "test.count", "f", lane="housekeeping")
    w = _worker(pool)
    job = queue.claim(db, "w1", 300.0, ["housekeeping"])
    real, calls = queue.finish, []

    def faulty(conn, j):
        calls.append(j.id)
        if len(calls) <= len(faults):
            return faults[len(calls) - 1](conn, j, real)
        return real(conn, j)
    monkeypatch.setattr(queue, "finish", faulty)
    kept, _ = w.outcomes.apply(job, Done(), None)
    return kept, calls, w


def test_a_retrys_own_lost_answer_counts_even_after_a_first_error_the_server_answered(db, pool, monkeypatch):
    # The first attempt is refused (rolled back); the first retry commits and
    # loses its answer; the second retry matches nothing. The write was made.
    def refused(conn, j, real):
        raise psycopg.errors.DeadlockDetected("deadlock detected")

    def committed_then_cut(conn, j, real):
        assert real(conn, j)
        raise psycopg.OperationalError("server closed the connection unexpectedly")
    kept, calls, w = _finish_with_faults(db, pool, monkeypatch, [refused, committed_then_cut])
    assert len(calls) == 3 and kept is True
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    assert w.gauge.snapshot()["done"] == 1 and w.gauge.snapshot()["lost"] == 0


def test_a_finish_whose_lease_was_lost_is_not_counted_done_after_a_pool_timeout(db, pool, monkeypatch):
    # A checkout that timed out sent nothing: it is no lost answer. The lease
    # was reaped and another worker finished the job meanwhile; our retry
    # matches nothing, and that is a lost lease, not our finish.
    from psycopg_pool import PoolTimeout
    from vpay.worker.outcomes import answer_lost
    assert not answer_lost(PoolTimeout("couldn't get a connection after 30.00 sec"))

    def finished_elsewhere_then_timed_out(conn, j, real):
        db.execute("DELETE FROM jobs WHERE id = %s", (j.id,))  # reaped, and finished by another
        raise PoolTimeout("couldn't get a connection after 30.00 sec")
    kept, calls, w = _finish_with_faults(db, pool, monkeypatch, [finished_elsewhere_then_timed_out])
    assert len(calls) == 2 and kept is False
    assert w.gauge.snapshot()["done"] == 0


@pytest.mark.parametrize("write", ["reschedule", "retry_failed", "park"])
def test_a_lost_answer_whose_lease_was_reaped_meanwhile_counts_as_lost_not_kept(db, pool, write):
    # Unleased is not enough: the reaper leaves the row unleased too. The row
    # records whose own write ended a lease (ended_token), and only that
    # lease's write counts as made.
    queue.enqueue(db, "test.count", "r", lane="housekeeping")
    job = queue.claim(db, "w1", 300.0, ["housekeeping"])
    db.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 s'")
    assert [r["id"] for r in queue.reap_expired_leases(db)] == [job.id]
    assert queue.write_was_made(db, job, finished=False) is False
    # An earlier lease's own write is not this one's either.
    again = queue.claim(db, "w1", 300.0, ["housekeeping"])
    assert queue.reschedule(db, again, 0, None)
    assert queue.write_was_made(db, job, finished=False) is False
    assert queue.write_was_made(db, again, finished=False) is True
    # Each lease-ending write of a holder is recognised as its own.
    third = queue.claim(db, "w1", 300.0, ["housekeeping"])
    writes = {"reschedule": lambda j: queue.reschedule(db, j, 60),
              "retry_failed": lambda j: queue.retry_failed(db, j, 60, "boom"),
              "park": lambda j: queue.park(db, j, "x")}
    assert writes[write](third)
    assert queue.write_was_made(db, third, finished=False) is True
    assert queue.write_was_made(db, again, finished=False) is False


def test_a_claim_the_server_refused_is_not_handed_back(db, db_url, pool):
    # Read-only (a demoted primary): the server answered, the claim was
    # rolled back, so no token is kept to hand back (none would pile up for
    # the length of the outage).
    from vpay.worker.outcomes import answer_lost
    w = _worker(pool)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = on")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as refused:
            w._claim_on(conn, ("housekeeping",))
    assert not answer_lost(refused.value) and not w.leases.unanswered
    assert answer_lost(psycopg.OperationalError("server closed the connection unexpectedly"))


def test_tokens_kept_while_the_database_is_away_are_bounded_and_handed_back_by_the_heartbeat(
        db, pool, monkeypatch):
    from vpay.worker import leases as vleases
    queue.enqueue(db, "test.count", "s", lane="housekeeping")
    token = queue.new_lease_token()
    assert queue.claim_or_next_due(db, "w1", 300.0, ["housekeeping"], token=token)[0] is not None
    ctx = handlers.Context(pool=pool, worker_id="w1")
    w = Worker(pool, ctx, WorkerConfig(worker_id="w1", concurrency=1, lease=0.9), ShutdownSignals())
    # the database away: every hand-back attempt fails, and the tokens stay
    release = w.leases.release_unanswered
    monkeypatch.setattr(w.leases, "release_unanswered", lambda: None)
    w.leases.hand_back(token)
    for _ in range(vleases.MAX_UNANSWERED):
        w.leases.hand_back(queue.new_lease_token())
    assert len(w.leases.unanswered) == vleases.MAX_UNANSWERED and token not in w.leases.unanswered  # oldest dropped
    monkeypatch.setattr(w.leases, "release_unanswered", release)
    w.leases.unanswered = {token: None}
    beat = w.heartbeat
    beat.start()  # every lease / 3 = 0.3 s
    try:
        wait_until(lambda: db.execute("SELECT locked_by FROM jobs WHERE dedupe_key = 's'").fetchone()
                   == (None,), timeout=10)
    finally:
        w._halt.set()
        beat.join(5)
    assert not w.leases.unanswered


@pytest.mark.parametrize("committed", [True, False])
def test_a_hand_back_over_the_share_whose_answer_was_lost_does_not_run_the_job(db, pool, monkeypatch, committed):
    # Review of issue 30: the hand-back (unclaim) committed, its answer lost
    # with the connection, and the loop ran the job anyway while it was due
    # for every other worker. Now it is not run; if the hand-back had not
    # committed, the lease goes back by its token when the database answers.
    queue.enqueue(db, "test.count", "over-share", lane="housekeeping")
    w = _worker(pool)
    job = queue.claim(db, w.config.worker_id, 300.0, ["housekeeping"])
    real_unclaim = queue.unclaim

    def lost(conn, j):
        if committed:
            real_unclaim(conn, j)
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(queue, "unclaim", lost)
    monkeypatch.setattr(w.timeshare, "admit", lambda *a, force=False, **k: force)  # the party is at its share
    assert w._admit(job) is False  # not run; handed back by its token (at once: the database answers)
    assert db.execute("SELECT locked_by, run_at <= now() FROM jobs WHERE dedupe_key = 'over-share'").fetchone() \
        == (None, True)
