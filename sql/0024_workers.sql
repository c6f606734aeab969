-- Workers as rows (issue 25; vpay/engine/workers.py; docs/runbooks/dead-worker.md).
--
-- A worker registers its row when it starts (id = the worker id it writes in
-- jobs.locked_by), beats heartbeat_at from its heartbeat thread every
-- dead_after_seconds / 4, and sets stopped_at when it exits cleanly. A lease
-- whose holder's heartbeat is older than the holder's own dead_after_seconds
-- (VPAY_WORKER_DEAD_AFTER_SECONDS on that worker) is reaped then, by any
-- live worker's reaper, not at lease expiry; a holder with no row at all is
-- judged by the lease's expiry alone, as before. The hourly sweep deletes the
-- rows of workers dead or stopped for longer than a week
-- (workers.DEAD_WORKER_RETENTION_SECONDS).
CREATE TABLE workers (
    id                 text             PRIMARY KEY,
    host               text             NOT NULL,
    pid                integer          NOT NULL,
    lanes              text[]           NOT NULL,
    version            text             NOT NULL,
    started_at         timestamptz      NOT NULL DEFAULT now(),
    heartbeat_at       timestamptz      NOT NULL DEFAULT now(),
    -- the holder's own bound: a reaper never judges a worker by its own setting
    dead_after_seconds double precision NOT NULL CHECK (dead_after_seconds > 0),
    stopped_at         timestamptz
);

-- What a worker is now, judged in one place for the reaper, `workers list`,
-- `jobs list --stranded`, `jobs release`, the console and the metrics:
-- stopped (exited cleanly), live (heartbeat within its bound), dead.
CREATE VIEW worker_states AS
SELECT w.id, w.host, w.pid, w.lanes, w.version, w.started_at, w.heartbeat_at,
       w.dead_after_seconds, w.stopped_at,
       greatest(extract(epoch FROM now() - w.heartbeat_at)::float8, 0) AS heartbeat_age,
       CASE WHEN w.stopped_at IS NOT NULL THEN 'stopped'
            WHEN w.heartbeat_at >= now() - make_interval(secs => w.dead_after_seconds) THEN 'live'
            ELSE 'dead' END AS state
  FROM workers w;

-- Whether the worker holding a lease claimed at claimed_at is gone, and why
-- (NULL: live, or no row to judge by: the lease's expiry alone decides):
--   stopped   its worker exited cleanly;
--   restarted the lease was claimed before the holder's row was last
--             registered: an earlier process under the same id claimed it,
--             and a worker registers only at its start;
--   dead      its heartbeat is older than its own bound, and the database has
--             been up longer than that bound (after a restart nobody could beat).
-- Read by the reaper (queue.sql, reap_expired_leases), `jobs list --stranded`
-- and `jobs release` (operator.sql).
CREATE FUNCTION lease_holder_gone(holder text, claimed_at timestamptz) RETURNS text
    LANGUAGE sql STABLE AS $$
SELECT CASE WHEN w.stopped_at IS NOT NULL THEN 'stopped'
            WHEN claimed_at < w.started_at THEN 'restarted'
            WHEN w.state = 'dead'
                 AND pg_postmaster_start_time() < now() - make_interval(secs => w.dead_after_seconds)
                 THEN 'dead'
       END
  FROM worker_states w
 WHERE w.id = holder
$$;
