-- A rail's backpressure pause shared by every process (table rail_pauses,
-- sql/0026_rail_pauses.sql; vpay/rails/pauses.py). Every "now" is the
-- database's, so replicas whose clocks differ agree on when a pause ends.

-- name: rail_pause_extend
-- Pause %(rail)s for %(seconds)s from now (the caller has capped them at its
-- max pause), unless a pause already in force ends later: a pause only
-- extends. Answers the row in force afterwards (ours or the longer one).
INSERT INTO rail_pauses AS p (rail, paused_until, reason, set_by, set_at)
VALUES (%(rail)s, now() + make_interval(secs => %(seconds)s::float8), %(reason)s, %(set_by)s, now())
ON CONFLICT (rail) DO UPDATE
   SET paused_until = excluded.paused_until, reason = excluded.reason,
       set_by = excluded.set_by, set_at = excluded.set_at
 WHERE p.paused_until < excluded.paused_until
RETURNING rail, paused_until, reason, set_by;

-- name: rail_pauses_in_force
-- The pauses in force now (at most one row per rail), with the seconds left
-- on the database's clock: what each process's gate copies.
SELECT rail, paused_until, reason, set_by,
       extract(epoch FROM paused_until - now())::float8 AS seconds_left
  FROM rail_pauses
 WHERE paused_until > now();

-- name: rail_pauses_list
-- Every rail's last pause, in force or over (`vpay-server rails list`).
SELECT rail, paused_until, paused_until > now() AS in_force,
       greatest(extract(epoch FROM paused_until - now()), 0)::float8 AS seconds_left,
       reason, set_by, set_at
  FROM rail_pauses
 ORDER BY rail;
