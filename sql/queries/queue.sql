-- The durable job queue (vpay/engine/queue.py). Every "now" is the database's.
-- Every write that ends a lease matches (id, locked_by, lease_token): the
-- fencing token is new at each claim, so a worker whose lease was reaped
-- cannot overwrite whoever holds the job now, even a later claim of its own.

-- name: enqueue
-- The lane comes from vpay.lanes.lane_for (queue.enqueue computes it).
INSERT INTO jobs (kind, lane, dedupe_key, payload, run_at)
VALUES (%(kind)s, %(lane)s, %(dedupe_key)s, %(payload)s, now() + make_interval(secs => %(delay)s))
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id;

-- name: claim_lane
-- The oldest due job of one lane that is within its merchant's share (round
-- 0); when none is due, the oldest of the lowest round (rebalance_lane;
-- sql/0015_fair_claims.sql). Each probe is an ordered index scan inside the
-- lane (jobs_claimable_lane, then jobs_over_share) that stops at the first
-- row SKIP LOCKED can take; no sort, other lanes' rows never read, and
-- coalesce runs the second probe only when the first finds nothing.
-- Jobs of a party at its share in this worker are skipped: %(skip)s holds
-- 'lane/kind/merchant' keys (vpay/engine/timeshare.py; usually empty, a
-- filter on the rows the scan reads). When the lane has nothing due for us, the loop
-- borrows: the oldest due job among the heads of the lanes in %(lent)s (one
-- ordered probe per lane, as claim_lanes reads placed rows: round 0 first,
-- then the placed rows; empty: none), so its own lane always comes first
-- (issue 30, lending idle loops). The lent lanes are read as 8 fixed slots
-- (queue.LENT_LANES_MAX; an empty slot is NULL, or '' when nothing is lent:
-- vpay/engine/queue.py keeps the parameters' types; its probe reads nothing),
-- not unnest(): the planner guesses 10 rows for unnest of a parameter and 0
-- for an empty literal, so its generic plan looked dearer than a custom one
-- and every claim was planned afresh (Postgres CPU per no-op job doubled in
-- bench/peers.py). With fixed slots both plans are the same, and the
-- prepared statement keeps its generic plan.
-- With the claim, an optional fenced finish of the job the loop has just
-- done (id, worker, token): one statement, so one round trip per job while a
-- loop has work (issue #15). id 0 (no job has it) or NULL: just a claim (the
-- DELETE matches nothing; vpay/engine/queue.py sends 0 and the nil UUID).
-- The finished job is leased, so the claim cannot take it again. The new
-- lease's token is the caller's (a fresh random UUID): a claim whose answer
-- never arrives (the connection died after the commit)
-- can then be found and handed back by it (release), instead of sitting
-- leased to a live worker that does not know it holds it until the lease
-- runs out (vpay/worker/loop.py, Worker._hand_back).
-- The finish runs before the claim: the outer side of the final join is
-- read first, and OFFSET 0 keeps it from being folded into the select list
-- (computed after the join). A finish that waits for a row lock then holds
-- no claimed row, so loops cannot deadlock on each other's finish and claim
-- (seen in the benches: three loops in a cycle, each held 1 s, the
-- deadlock_timeout, until one failed).
-- Always one row: finished (false with no job to finish, or when the lease
-- was no longer ours: lost; the claim happens anyway), the job's columns (all
-- NULL when nothing is due), late_by (seconds past its run_at), fair_key
-- (the job's party) and next_due_in.
WITH finished AS (
    -- the optional fenced finish: matches nothing for id 0 or NULL
    DELETE FROM jobs
     WHERE id = %(id)s::bigint AND locked_by = %(worker)s AND lease_token = %(token)s::uuid
    RETURNING id
), claimed AS (
    UPDATE jobs
       SET attempts = attempts + 1,
           locked_by = %(worker)s,
           locked_at = now(),
           lease_expires_at = now() + make_interval(secs => %(lease)s),
           lease_token = %(new_token)s::uuid,
           share_round = 0
     WHERE id = coalesce(
                 (SELECT id FROM jobs
                   WHERE lane = %(lane)s AND locked_at IS NULL AND run_at <> 'infinity'
                     AND share_round = 0 AND run_at <= now()
                     AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                   ORDER BY run_at LIMIT 1 FOR UPDATE SKIP LOCKED),
                 (SELECT id FROM jobs
                   WHERE lane = %(lane)s AND locked_at IS NULL AND run_at <> 'infinity'
                     AND share_round > 0 AND run_at <= now()
                     AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                   ORDER BY share_round, run_at LIMIT 1 FOR UPDATE SKIP LOCKED),
                 -- borrowed: only when our own lane has nothing due for us
                 (SELECT head.id
                    FROM (SELECT (%(lent)s::text[])[i] FROM generate_series(1, 8) AS slot(i)) AS lent(lane)
                   CROSS JOIN LATERAL (
                         SELECT id, run_at FROM jobs
                          WHERE lane = lent.lane AND locked_at IS NULL AND run_at <> 'infinity'
                            AND share_round = 0 AND run_at <= now()
                            AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                          -- "lane," is the lane index's order: never a walk of
                          -- jobs_claimable through other lanes' backlogs
                          ORDER BY lane, run_at LIMIT 1 FOR UPDATE SKIP LOCKED) AS head
                   ORDER BY head.run_at LIMIT 1),
                 (SELECT head.id
                    FROM (SELECT (%(lent)s::text[])[i] FROM generate_series(1, 8) AS slot(i)) AS lent(lane)
                   CROSS JOIN LATERAL (
                         SELECT id, share_round, run_at FROM jobs
                          WHERE lane = lent.lane AND locked_at IS NULL AND run_at <> 'infinity'
                            AND share_round > 0 AND run_at <= now()
                            AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                          ORDER BY lane, share_round, run_at LIMIT 1 FOR UPDATE SKIP LOCKED) AS head
                   ORDER BY head.share_round, head.run_at LIMIT 1))
    RETURNING id, kind, lane, dedupe_key, payload, attempts, failures, lease_token, run_at, created_at,
              extract(epoch FROM now() - run_at)::float8 AS late_by, fair_key
)
SELECT done.finished, claimed.*,
       -- only when nothing was claimed: seconds until the next job of our
       -- own lane is due that we may take (NULL: none scheduled), so the
       -- loop sleeps until then; borrowed lanes wake it by notification
       CASE WHEN claimed.id IS NULL THEN
            extract(epoch FROM least(
                (SELECT min(run_at) FROM jobs WHERE lane = %(lane)s AND locked_at IS NULL
                    AND run_at <> 'infinity' AND share_round = 0
                    AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))),
                -- placed rows are due: any one says so (another claim holds it)
                (SELECT run_at FROM jobs WHERE lane = %(lane)s AND locked_at IS NULL
                    AND run_at <> 'infinity' AND share_round > 0 AND run_at <= now()
                    AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                  LIMIT 1)) - now())::float8
       END AS next_due_in
  -- finish first, then claim (header of claim_lane)
  FROM (SELECT EXISTS (SELECT 1 FROM finished) AS finished OFFSET 0) AS done
  LEFT JOIN claimed ON true;

-- name: claim_lanes
-- The same fair choice across several lanes (a loop that shares lanes: fewer
-- loops than lanes), with the same optional fenced finish (id 0: just a
-- claim), party skips and borrowed lanes as claim_lane. jobs_claimable
-- (run_at) walks due rows in order and filters on the lane; an ordered scan
-- of (lane, run_at) cannot serve lane = ANY(...) ORDER BY run_at. For placed
-- rows, each lane's head is one ordered probe (its row stays locked for this
-- statement's moment, so a sibling skips it) and the lowest head is taken.
-- The same one row as claim_lane.
WITH finished AS (
    -- the optional fenced finish: matches nothing for id 0 or NULL
    DELETE FROM jobs
     WHERE id = %(id)s::bigint AND locked_by = %(worker)s AND lease_token = %(token)s::uuid
    RETURNING id
), claimed AS (
    UPDATE jobs
       SET attempts = attempts + 1,
           locked_by = %(worker)s,
           locked_at = now(),
           lease_expires_at = now() + make_interval(secs => %(lease)s),
           lease_token = %(new_token)s::uuid,
           share_round = 0
     WHERE id = coalesce(
                 (SELECT id FROM jobs
                   WHERE lane = ANY(%(lanes)s) AND locked_at IS NULL AND run_at <> 'infinity'
                     AND share_round = 0 AND run_at <= now()
                     AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                   ORDER BY run_at LIMIT 1 FOR UPDATE SKIP LOCKED),
                 -- the head of each lane's placed rows (an ordered probe each), then
                 -- the lowest of those: never a sort of a whole placed backlog
                 (SELECT head.id
                    FROM unnest(%(lanes)s::text[]) AS served(lane)
                   CROSS JOIN LATERAL (
                         SELECT id, share_round, run_at FROM jobs
                          WHERE lane = served.lane AND locked_at IS NULL AND run_at <> 'infinity'
                            AND share_round > 0 AND run_at <= now()
                            AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                          ORDER BY share_round, run_at LIMIT 1 FOR UPDATE SKIP LOCKED) AS head
                   ORDER BY head.share_round, head.run_at LIMIT 1),
                 -- borrowed: only when our own lanes have nothing due for us
                 (SELECT head.id
                    FROM (SELECT (%(lent)s::text[])[i] FROM generate_series(1, 8) AS slot(i)) AS lent(lane)
                   CROSS JOIN LATERAL (
                         SELECT id, run_at FROM jobs
                          WHERE lane = lent.lane AND locked_at IS NULL AND run_at <> 'infinity'
                            AND share_round = 0 AND run_at <= now()
                            AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                          -- "lane," is the lane index's order: never a walk of
                          -- jobs_claimable through other lanes' backlogs
                          ORDER BY lane, run_at LIMIT 1 FOR UPDATE SKIP LOCKED) AS head
                   ORDER BY head.run_at LIMIT 1),
                 (SELECT head.id
                    FROM (SELECT (%(lent)s::text[])[i] FROM generate_series(1, 8) AS slot(i)) AS lent(lane)
                   CROSS JOIN LATERAL (
                         SELECT id, share_round, run_at FROM jobs
                          WHERE lane = lent.lane AND locked_at IS NULL AND run_at <> 'infinity'
                            AND share_round > 0 AND run_at <= now()
                            AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                          ORDER BY lane, share_round, run_at LIMIT 1 FOR UPDATE SKIP LOCKED) AS head
                   ORDER BY head.share_round, head.run_at LIMIT 1))
    RETURNING id, kind, lane, dedupe_key, payload, attempts, failures, lease_token, run_at, created_at,
              extract(epoch FROM now() - run_at)::float8 AS late_by, fair_key
)
SELECT done.finished, claimed.*,
       -- only when nothing was claimed: seconds until the next job of our
       -- own lanes is due that we may take (NULL: none scheduled), so the
       -- loop sleeps until then; borrowed lanes wake it by notification
       CASE WHEN claimed.id IS NULL THEN
            extract(epoch FROM least(
                (SELECT min(run_at) FROM jobs WHERE lane = ANY(%(lanes)s) AND locked_at IS NULL
                    AND run_at <> 'infinity' AND share_round = 0
                    AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))),
                -- placed rows are due: any one says so (another claim holds it)
                (SELECT run_at FROM jobs WHERE lane = ANY(%(lanes)s) AND locked_at IS NULL
                    AND run_at <> 'infinity' AND share_round > 0 AND run_at <= now()
                    AND (fair_key IS NULL OR lane || '/' || kind || '/' || fair_key <> ALL(%(skip)s::text[]))
                  LIMIT 1)) - now())::float8
       END AS next_due_in
  -- finish first, then claim (header of claim_lane)
  FROM (SELECT EXISTS (SELECT 1 FROM finished) AS finished OFFSET 0) AS done
  LEFT JOIN claimed ON true;

-- name: unclaim
-- Give back a job just claimed, without running it: its party was already
-- at its share in this worker when the claim came back (two loops claimed
-- for the same party at once; vpay/engine/timeshare.py). Fenced on the
-- lease like every write that ends one; the claim's attempt is given back
-- (nothing was tried), the failure streak and run_at are left alone, so the
-- job keeps its place and is claimable at once (the wake trigger tells an
-- idle loop, whose claim skips that party while it is at its share).
UPDATE jobs
   SET attempts = greatest(attempts - 1, 0),
       locked_by = NULL, locked_at = NULL, lease_token = NULL, lease_expires_at = NULL,
       ended_token = %(token)s
 WHERE id = %(id)s AND locked_by = %(worker)s AND lease_token = %(token)s
RETURNING id;

-- name: finish
DELETE FROM jobs
 WHERE id = %(id)s AND locked_by = %(worker)s AND lease_token = %(token)s
RETURNING id;

-- name: reschedule
-- An Outcome was reached: the failure streak ends. A job deferred without
-- doing its work (spent = false) gets back the attempt its claim counted.
UPDATE jobs
   SET run_at = now() + make_interval(secs => %(delay)s),
       attempts = CASE WHEN %(spent)s THEN attempts ELSE greatest(attempts - 1, 0) END,
       locked_by = NULL, locked_at = NULL, lease_token = NULL, lease_expires_at = NULL,
       ended_token = %(token)s, failures = 0, share_round = 0,
       last_error = %(note)s
 WHERE id = %(id)s AND locked_by = %(worker)s AND lease_token = %(token)s
RETURNING id;

-- name: retry_failed
-- The handler raised: count the streak, keep the error text.
UPDATE jobs
   SET run_at = now() + make_interval(secs => %(delay)s),
       locked_by = NULL, locked_at = NULL, lease_token = NULL, lease_expires_at = NULL,
       ended_token = %(token)s, failures = failures + 1, share_round = 0,
       last_error = %(error)s
 WHERE id = %(id)s AND locked_by = %(worker)s AND lease_token = %(token)s
RETURNING id;

-- name: park
WITH parked AS (
    UPDATE jobs
       SET run_at = 'infinity',
           locked_by = NULL, locked_at = NULL, lease_token = NULL, lease_expires_at = NULL,
           ended_token = %(token)s, share_round = 0,
           last_error = %(reason)s
     WHERE id = %(id)s AND locked_by = %(worker)s AND lease_token = %(token)s
    RETURNING id, kind, dedupe_key, payload, attempts, last_error
), alert AS (
    INSERT INTO alerts (kind, charge_id, details)
    SELECT 'job_dead_lettered',
           (SELECT c.id FROM charges c WHERE c.id = parked.payload ->> 'charge_id'),
           jsonb_build_object('job_id', parked.id, 'kind', parked.kind,
                              'dedupe_key', parked.dedupe_key, 'attempts', parked.attempts,
                              'reason', parked.last_error)
      FROM parked
)
SELECT id FROM parked;

-- name: job_lease
-- What a job's row says after a lease-ending write whose answer was lost:
-- no row (finished), or the lease whose holder's own write last ended a
-- lease on it (sql/0016_ended_token.sql).
SELECT ended_token FROM jobs WHERE id = %(id)s;

-- name: renew
-- A live worker keeps the leases it holds (every lease / 3): only a dead
-- worker's leases run out, however long a handler takes. The rows are locked
-- in id order, as release locks them, so two statements over many of one
-- worker's rows never wait on each other in a cycle (the reaper never waits).
WITH mine AS (
    SELECT id FROM jobs
     WHERE locked_at IS NOT NULL  -- implied, and it lets the leased index serve: no scan of the backlog
       AND locked_by = %(worker)s AND lease_token = ANY(%(tokens)s)
     ORDER BY id
       FOR UPDATE
)
UPDATE jobs
   SET lease_expires_at = now() + make_interval(secs => %(lease)s)
-- ANY(ARRAY(...)): an index probe per locked row, never a join planned as a scan
 WHERE jobs.id = ANY (ARRAY(SELECT id FROM mine))
RETURNING jobs.id;

-- name: release
-- Drain timed out, or a claim's answer was lost: hand back the leases this
-- process holds under these tokens, due now, so another loop or worker
-- claims them at once instead of after the lease.
-- Rows locked in id order, as renew locks them.
WITH mine AS (
    SELECT id FROM jobs
     WHERE locked_at IS NOT NULL  -- implied, and it lets the leased index serve: no scan of the backlog
       AND locked_by = %(worker)s AND lease_token = ANY(%(tokens)s)
     ORDER BY id
       FOR UPDATE
)
UPDATE jobs
   SET locked_by = NULL, locked_at = NULL, lease_token = NULL, lease_expires_at = NULL,
       share_round = 0
-- ANY(ARRAY(...)): an index probe per locked row, never a join planned as a scan
 WHERE jobs.id = ANY (ARRAY(SELECT id FROM mine))
RETURNING jobs.id;

-- name: reap_expired_leases
-- One statement: the expiry is re-checked on the row it locks, so a lease
-- renewed by a new claim in the meantime is left alone, and a job finished
-- (deleted) in the meantime is not resurrected. Each lease is judged by its
-- own expiry (the claimer's lease), never by the reaper's. A job whose leases keep
-- expiring (its handler kills the process) is parked after max_failures.
-- A lease whose holder is gone (lease_holder_gone, sql/0024_workers.sql) is
-- reaped too, before its expiry: its worker stopped, or restarted under the
-- same id; or, when the caller may judge heartbeats (%(by_heartbeat)s: its
-- own worker has reached the database steadily for the bound), its holder's
-- heartbeat is older than the holder's own bound; never the caller's own
-- worker (%(reaper)s) by its heartbeat: it is running this.
-- The reaper never waits for a row lock (SKIP LOCKED): a row another
-- statement holds (the heartbeat's renew, a finish, an admin command) is
-- left for the next pass, so the reaper, which writes many rows in no order
-- of its owner's, can never be one side of a deadlock.
WITH expired AS (
    -- what the row says once locked (a row re-claimed meanwhile is judged by
    -- its new holder: the conditions are re-checked on the version locked)
    SELECT id, CASE WHEN lease_expires_at < now() THEN 'expired'
                    ELSE lease_holder_gone(locked_by, locked_at) END AS why
      FROM jobs
     WHERE locked_at IS NOT NULL
       AND (lease_expires_at < now()
            OR CASE lease_holder_gone(locked_by, locked_at)
                    WHEN 'stopped' THEN true
                    WHEN 'restarted' THEN true
                    WHEN 'dead' THEN %(by_heartbeat)s AND locked_by IS DISTINCT FROM %(reaper)s::text
                    ELSE false END)
       FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE jobs
       SET locked_by = NULL, locked_at = NULL, lease_token = NULL, lease_expires_at = NULL,
           failures = failures + 1, share_round = 0,
           run_at = CASE WHEN failures + 1 >= %(max_failures)s THEN 'infinity'::timestamptz
                         ELSE now() END,
           last_error = CASE WHEN failures + 1 >= %(max_failures)s
                             THEN format('dead-lettered: lease expired %%s times in a row without an outcome (last held by %%s)',
                                         failures + 1, locked_by)
                             WHEN (SELECT e.why FROM expired e WHERE e.id = jobs.id) = 'expired'
                             THEN format('lease expired (held by %%s since %%s)', locked_by, locked_at)
                             ELSE format('lease reaped: holder %%s (held by %%s since %%s; last heartbeat %%s)',
                                         (SELECT e.why FROM expired e WHERE e.id = jobs.id), locked_by, locked_at,
                                         (SELECT w.heartbeat_at FROM workers w WHERE w.id = jobs.locked_by))
                        END
     WHERE jobs.id = ANY (ARRAY(SELECT id FROM expired))
    RETURNING jobs.id, kind, lane, dedupe_key, payload, attempts, run_at, last_error,
              (SELECT e.why FROM expired e WHERE e.id = jobs.id) AS why
), alert AS (
    INSERT INTO alerts (kind, charge_id, details)
    SELECT 'job_dead_lettered',
           (SELECT c.id FROM charges c WHERE c.id = reaped.payload ->> 'charge_id'),
           jsonb_build_object('job_id', reaped.id, 'kind', reaped.kind,
                              'dedupe_key', reaped.dedupe_key, 'attempts', reaped.attempts,
                              'reason', reaped.last_error)
      FROM reaped
     WHERE reaped.run_at = 'infinity'
)
SELECT id, kind, lane, dedupe_key, run_at = 'infinity' AS parked, why FROM reaped;

-- name: rebalance_lane
-- Fair queueing inside a lane (vpay/engine/fairness.py; sql/0015_fair_claims.sql).
-- Reads the lane's due, unclaimed backlog once and places each job that is
-- not yet placed (share_round 0) into a round:
--   * a merchant with no backlog yet keeps its oldest jobs in round 0 (within
--     its share: claimed first, by age), %(share)s less those of its jobs the
--     lane is running now; its others start at the round being served;
--   * a merchant with a backlog keeps %(share)s in round 0, besides its jobs
--     already past the age (see below), and queues the others behind its
--     last round.
-- Claims serve round 0 first, then round by round, by age inside a round: a
-- merchant new to the queue waits for one job per round of each backlogged
-- merchant, never for a whole burst. Round 0 could keep the rounds waiting
-- for ever while one-job merchants keep arriving faster than the lane reads
-- (overload), so the lowest round, once its oldest job is %(age)s seconds past
-- due, goes back to round 0 (aged): each pass serves every backlog at least
-- one more job. Placed jobs otherwise keep their round until claimed (every
-- write that ends a lease sets it back to 0), so a job is written at most
-- twice per time it is due (placed, then aged).
-- Only jobs still due and unclaimed, in the round this pass read, are written
-- (a job claimed and rescheduled while the pass ran, or placed by another
-- worker's pass, is left alone); rows are locked with SKIP LOCKED, so a claim
-- in flight is never waited for. Answers one row per job written, with its
-- new round (0: aged).
WITH due AS (
    SELECT id, fair_key, run_at, share_round FROM jobs
     WHERE lane = %(lane)s AND locked_at IS NULL AND run_at <> 'infinity'
       AND share_round = 0 AND run_at <= now() AND fair_key IS NOT NULL
    UNION ALL
    SELECT id, fair_key, run_at, share_round FROM jobs
     WHERE lane = %(lane)s AND locked_at IS NULL AND run_at <> 'infinity'
       AND share_round > 0 AND run_at <= now() AND fair_key IS NOT NULL
), backlog AS (
    SELECT fair_key, max(share_round) AS last_round FROM due GROUP BY fair_key
), running AS (
    -- jobs being worked on use their merchant's share too
    SELECT fair_key, count(*) AS n FROM jobs
     WHERE locked_at IS NOT NULL AND lane = %(lane)s AND fair_key IS NOT NULL
     GROUP BY fair_key
), serving AS (
    SELECT min(share_round) FILTER (WHERE share_round > 0) AS next_round FROM due
), aged AS (
    SELECT d.id, d.share_round AS seen, 0 AS round
      FROM due d JOIN serving ON d.share_round = serving.next_round
     WHERE (SELECT min(run_at) FROM due WHERE share_round = serving.next_round)
           < now() - make_interval(secs => %(age)s)
), fresh AS (
    SELECT d.id, b.last_round,
           row_number() OVER (PARTITION BY d.fair_key ORDER BY d.run_at, d.id)
             - CASE WHEN b.last_round = 0 THEN greatest(%(share)s - coalesce(r.n, 0), 0)
                    ELSE %(share)s END AS step
      FROM due d JOIN backlog b ON b.fair_key = d.fair_key
                 LEFT JOIN running r ON r.fair_key = d.fair_key
     WHERE d.share_round = 0
       -- an aged job (past the age, of a merchant with a backlog) stays in round 0
       AND NOT (b.last_round > 0 AND d.run_at < now() - make_interval(secs => %(age)s))
), placed AS (
    -- the round being served: the lowest placed one (0 when none)
    SELECT f.id, 0 AS seen,
           greatest(f.last_round, coalesce(serving.next_round, 1) - 1) + f.step AS round
      FROM fresh f, serving
     WHERE f.step > 0
), targets AS (
    SELECT id, seen, round FROM placed
    UNION ALL
    SELECT id, seen, round FROM aged
), locked AS (
    SELECT j.id, t.round FROM jobs j JOIN targets t ON t.id = j.id
     WHERE j.locked_at IS NULL AND j.run_at <= now() AND j.share_round = t.seen
       FOR UPDATE OF j SKIP LOCKED
)
UPDATE jobs j
   SET share_round = locked.round
  FROM locked
 WHERE j.id = locked.id
RETURNING j.id, j.share_round;

-- name: depth
SELECT count(*) FILTER (WHERE locked_at IS NULL AND run_at <= now() AND run_at <> 'infinity') AS due,
       count(*) FILTER (WHERE locked_at IS NOT NULL) AS leased,
       count(*) FILTER (WHERE run_at = 'infinity') AS dead
  FROM jobs;

-- name: depth_by_lane
-- The same counts per lane (the gauge's per-lane part).
SELECT lane,
       count(*) FILTER (WHERE locked_at IS NULL AND run_at <= now() AND run_at <> 'infinity') AS due,
       count(*) FILTER (WHERE locked_at IS NOT NULL) AS leased,
       count(*) FILTER (WHERE run_at = 'infinity') AS dead
  FROM jobs
 GROUP BY lane;
