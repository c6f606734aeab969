-- The pollable state machine (vpay/money/pollable.py): the rows the worker polls to
-- their end, charges and refunds alike, written once. {table} is the
-- operation's state table (Pollable.table), filled in as a quoted identifier
-- by psycopg.sql, never from input. Every such table has id, status
-- (pending | succeeded | failed | unresolved), failure_code,
-- rail_transaction_id, created_at, submitted_at, settled_at, unresolved_at and
-- last_polled_at. Every transition is a compare-and-swap on the current
-- status: a second call, a racing worker or a re-run after a crash matches no
-- row, and no status ever moves backwards. Every "now" is Postgres's.

-- name: pollable_mark_submitted
-- The rail accepted the request: submitted_at is set once.
UPDATE {table} SET submitted_at = now()
 WHERE id = %(id)s AND submitted_at IS NULL
RETURNING id;

-- name: pollable_record_poll
-- A status read happened. When the rail knew the reference, the request was
-- submitted, whatever our own write of submitted_at managed before a crash.
UPDATE {table}
   SET last_polled_at = now(),
       submitted_at = CASE WHEN %(rail_knows)s THEN coalesce(submitted_at, now()) ELSE submitted_at END
 WHERE id = %(id)s;

-- name: pollable_settle
-- The settle compare-and-swap: only a live row (pending or unresolved) ends.
UPDATE {table}
   SET status = %(status)s,
       failure_code = %(failure_code)s,
       rail_transaction_id = %(rail_transaction_id)s,
       settled_at = now()
 WHERE id = %(id)s AND status IN ('pending', 'unresolved')
RETURNING *;

-- name: pollable_current
-- What a settle that matched no row finds instead (a contradiction or a no-op).
SELECT * FROM {table} WHERE id = %(id)s;

-- name: pollable_escalate
-- At the horizon a pending row becomes unresolved. %(id)s names one row (the
-- poll handler), or NULL for every overdue row (the hourly sweep: a row whose
-- poll job was dead-lettered is escalated too). The caller writes one alert
-- per row returned, in the same transaction.
UPDATE {table}
   SET status = 'unresolved', unresolved_at = now()
 WHERE (%(id)s::text IS NULL OR id = %(id)s::text) AND status = 'pending'
   AND created_at <= now() - make_interval(secs => %(horizon)s)
RETURNING *;
