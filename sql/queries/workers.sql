-- Workers as rows (vpay/engine/workers.py; sql/0024_workers.sql). Every "now"
-- is the database's.

-- name: worker_register
-- A worker's start: its row, live from now. An id already known (a restart
-- under the same --worker-id) is taken over: started_at moves on, so the
-- leases its earlier process claimed are "restarted" (lease_holder_gone).
-- started_at is kept when given: the process registering again after its row
-- was pruned is the same process.
INSERT INTO workers AS w (id, host, pid, lanes, version, started_at, heartbeat_at, dead_after_seconds)
VALUES (%(id)s, %(host)s, %(pid)s, %(lanes)s, %(version)s,
        coalesce(%(started_at)s::timestamptz, now()), now(), %(dead_after)s)
ON CONFLICT (id) DO UPDATE
   SET host = excluded.host, pid = excluded.pid, lanes = excluded.lanes, version = excluded.version,
       started_at = excluded.started_at, heartbeat_at = now(),
       dead_after_seconds = excluded.dead_after_seconds, stopped_at = NULL
RETURNING started_at;

-- name: worker_register_again
-- The same process registering again (its row was pruned, or marked stopped
-- under it): as worker_register, but only while the row, if any, still names
-- this process (host, pid). No row answered: another process holds the id
-- now, and its row is left as it is.
INSERT INTO workers AS w (id, host, pid, lanes, version, started_at, heartbeat_at, dead_after_seconds)
VALUES (%(id)s, %(host)s, %(pid)s, %(lanes)s, %(version)s,
        coalesce(%(started_at)s::timestamptz, now()), now(), %(dead_after)s)
ON CONFLICT (id) DO UPDATE
   SET lanes = excluded.lanes, version = excluded.version, started_at = excluded.started_at,
       heartbeat_at = now(), dead_after_seconds = excluded.dead_after_seconds, stopped_at = NULL
 WHERE w.host = excluded.host AND w.pid = excluded.pid
RETURNING started_at;

-- name: worker_beat
-- The heartbeat, only while the row names this process (host, pid) and is
-- not stopped. Always one row: whether it was beaten, and whom the row
-- names now (NULL: no row), so that a beat that changed nothing tells a row
-- gone from a row another process took over.
WITH beaten AS (
  UPDATE workers SET heartbeat_at = now()
   WHERE id = %(id)s AND host = %(host)s AND pid = %(pid)s AND stopped_at IS NULL
  RETURNING id)
SELECT EXISTS (SELECT 1 FROM beaten) AS beaten, w.host, w.pid
  FROM (SELECT 1) AS one
  LEFT JOIN workers w ON w.id = %(id)s;

-- name: worker_stop
-- A clean exit: only the row of this process (host, pid), never the row of
-- another process that took the id over meanwhile.
UPDATE workers SET stopped_at = now()
 WHERE id = %(id)s AND host = %(host)s AND pid = %(pid)s AND stopped_at IS NULL
RETURNING id;

-- name: workers_list
-- Every worker the table knows, live first; leases: jobs leased to its id now
-- (through jobs_leased: only leased rows are read).
SELECT s.id, s.host, s.pid, s.lanes, s.version, s.started_at, s.heartbeat_at, s.heartbeat_age,
       s.dead_after_seconds, s.stopped_at, s.state, coalesce(l.n, 0) AS leases
  FROM worker_states s
  LEFT JOIN (SELECT locked_by, count(*) AS n FROM jobs
              WHERE locked_at IS NOT NULL GROUP BY locked_by) l ON l.locked_by = s.id
 WHERE (%(state)s::text IS NULL OR s.state = %(state)s)
 ORDER BY s.state <> 'live', s.id
 LIMIT %(limit)s;

-- name: workers_live
SELECT count(*) FROM worker_states WHERE state = 'live';

-- name: workers_prune
-- Retention (the hourly sweep): rows of workers dead or stopped for longer
-- than the retention, unless a lease still names them.
DELETE FROM workers w
 WHERE coalesce(w.stopped_at, w.heartbeat_at) < now() - make_interval(secs => %(retention)s)
   AND (w.stopped_at IS NOT NULL
        OR w.heartbeat_at < now() - make_interval(secs => w.dead_after_seconds))
   AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.locked_at IS NOT NULL AND j.locked_by = w.id)
RETURNING w.id;

-- name: worker_claimant
-- Who holds a worker id now, before a new process takes it over: the row's
-- host and pid, and its state (live or dead by its own bound, or stopped).
SELECT host, pid, state, heartbeat_age FROM worker_states WHERE id = %(id)s;
