-- Endpoint back-off (vpay/webhooks/backoff.py): a webhook endpoint that is
-- timing out is backed off as a whole. Only webhook_endpoints is written.

-- name: endpoint_backoff_gate
-- Before a POST: how long this delivery must wait (0 = go), and whether it
-- is the probe. A healthy endpoint (no timeout in a row) has no row here:
-- go. A suspect one whose back-off has passed is taken by the first delivery
-- that asks: its back-off moves forward by %(probe_seconds)s (one attempt's
-- deadline), so the endpoint's other deliveries keep waiting while the probe
-- runs. The row lock makes two deliveries asking at once one probe and one waiter.
WITH old AS (
    SELECT id, backoff_until FROM webhook_endpoints
     WHERE id = %(endpoint_id)s AND timeouts_in_row > 0
       FOR UPDATE
), probe AS (
    UPDATE webhook_endpoints w
       SET backoff_until = now() + make_interval(secs => %(probe_seconds)s)
      FROM old
     WHERE w.id = old.id AND (old.backoff_until IS NULL OR old.backoff_until <= now())
    RETURNING w.id
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM probe) THEN 0
            ELSE greatest(0, extract(epoch FROM old.backoff_until - now()))::float8 END AS wait_seconds,
       EXISTS (SELECT 1 FROM probe) AS probe,
       old.backoff_until
  FROM old;

-- name: endpoint_timed_out
-- An attempt timed out: one more in a row, and the endpoint waits
-- %(base_seconds)s x 2^(timeouts before this one), at most %(cap_seconds)s.
UPDATE webhook_endpoints
   SET timeouts_in_row = timeouts_in_row + 1,
       backoff_until = now() + make_interval(secs => least(%(cap_seconds)s,
                                                         %(base_seconds)s * power(2, least(timeouts_in_row, 20))))
 WHERE id = %(endpoint_id)s
RETURNING timeouts_in_row, backoff_until,
          extract(epoch FROM backoff_until - now())::float8 AS backoff_seconds;

-- name: endpoint_answered
-- The endpoint answered (any status) or refused at once: not timing out.
UPDATE webhook_endpoints
   SET timeouts_in_row = 0, backoff_until = NULL
 WHERE id = %(endpoint_id)s AND (timeouts_in_row <> 0 OR backoff_until IS NOT NULL)
RETURNING id;
