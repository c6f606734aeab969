-- Webhook endpoints, fan-out and delivery (vpay/webhooks.py,
-- vpay/handlers/webhooks.py). Every "now" is the database's.

-- name: fanout_deliveries
-- One delivery per enabled endpoint of the event's merchant that receives the
-- event's type (enabled_events): a
-- webhook_deliveries row and its deliver:<event_id>:<endpoint_id> job, in one
-- statement. The delivery row's primary key makes a re-run create nothing
-- new, even after the deliver jobs have finished (issue: fan-out, idempotent).
WITH targets AS (
    SELECT e.id AS event_id, w.id AS endpoint_id
      FROM events e
      JOIN payment_intents i ON i.id = e.payment_intent_id
      JOIN webhook_endpoints w ON w.merchant_id = i.merchant_id AND w.enabled
     WHERE e.id = %(event_id)s
       -- enabled_events: '*' (the default) or the event types it receives
       AND ('*' = ANY (w.enabled_events) OR e.type = ANY (w.enabled_events))
), recorded AS (
    INSERT INTO webhook_deliveries (event_id, endpoint_id)
    SELECT event_id, endpoint_id FROM targets
    ON CONFLICT (event_id, endpoint_id) DO NOTHING
    RETURNING event_id, endpoint_id
)
-- deliver jobs belong to the webhooks lane (vpay.lanes.lane_for).
INSERT INTO jobs (kind, lane, dedupe_key, payload)
SELECT 'deliver', 'webhooks', 'deliver:' || event_id || ':' || endpoint_id,
       jsonb_build_object('event_id', event_id, 'endpoint_id', endpoint_id)
  FROM recorded
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id;

-- name: webhook_attempt_start
-- What one delivery attempt needs, and the endpoint's back-off gate, in one
-- statement (issue 30; the rules: vpay/webhooks/backoff.py). No row when the
-- event or the endpoint is gone. The previous secret is returned only while
-- its overlap lasts; now_epoch is the database's clock, for webhook-timestamp.
-- The gate: a healthy endpoint (no timeout in a row), or a disabled one, goes
-- (wait_seconds 0). A suspect one whose back-off has passed is taken by the
-- first delivery that asks: its back-off moves forward by %(probe_seconds)s
-- (one attempt's deadline), so its other deliveries keep waiting while this
-- probe runs. The row lock makes two deliveries asking at once one probe and
-- one waiter.
WITH attempt AS (
    SELECT e.id AS event_id, e.type, e.data, e.created_at,
           w.id AS endpoint_id, w.url, w.enabled, w.disabled_cause, w.secret,
           CASE WHEN w.previous_secret_expires_at > now() THEN w.previous_secret END AS previous_secret,
           floor(EXTRACT(EPOCH FROM clock_timestamp()))::bigint AS now_epoch
      FROM events e, webhook_endpoints w
     WHERE e.id = %(event_id)s AND w.id = %(endpoint_id)s
), old AS (
    SELECT w.id, w.backoff_until
      FROM webhook_endpoints w JOIN attempt a ON a.endpoint_id = w.id AND a.enabled
     WHERE w.timeouts_in_row > 0
       FOR UPDATE OF w
), probe AS (
    UPDATE webhook_endpoints w
       SET backoff_until = now() + make_interval(secs => %(probe_seconds)s)
      FROM old
     WHERE w.id = old.id AND (old.backoff_until IS NULL OR old.backoff_until <= now())
    RETURNING w.id
)
SELECT attempt.*,
       CASE WHEN old.id IS NULL OR EXISTS (SELECT 1 FROM probe) THEN 0
            ELSE greatest(0, extract(epoch FROM old.backoff_until - now()))::float8 END AS wait_seconds,
       EXISTS (SELECT 1 FROM probe) AS probe
  FROM attempt LEFT JOIN old ON true;

-- name: webhook_attempt_end
-- The outcome of one attempt on the delivery's row (created here if the
-- deliver job was enqueued some other way), and what the attempt says about
-- the endpoint, in one statement (issue 30; vpay/webhooks/backoff.py).
-- %(said)s: 'timed_out', one more timeout in a row, and the endpoint waits
-- %(base_seconds)s x 2^(timeouts before this one), at most %(cap_seconds)s;
-- 'answered' (an answer, whatever its status, or a quick refusal), a
-- back-off is cleared; NULL (no attempt was made: the endpoint disabled),
-- nothing. Answers the back-off set (timeouts_in_row, backoff_until,
-- backoff_seconds) or whether one was cleared.
WITH timed_out AS (
    UPDATE webhook_endpoints
       SET timeouts_in_row = timeouts_in_row + 1,
           backoff_until = now() + make_interval(secs => least(%(cap_seconds)s,
                                                             %(base_seconds)s * power(2, least(timeouts_in_row, 20))))
     WHERE %(said)s::text = 'timed_out' AND id = %(endpoint_id)s
    RETURNING timeouts_in_row, backoff_until,
              extract(epoch FROM backoff_until - now())::float8 AS backoff_seconds
), answered AS (
    UPDATE webhook_endpoints
       SET timeouts_in_row = 0, backoff_until = NULL
     WHERE %(said)s::text = 'answered' AND id = %(endpoint_id)s
       AND (timeouts_in_row <> 0 OR backoff_until IS NOT NULL)
    RETURNING id
), recorded AS (
    INSERT INTO webhook_deliveries (event_id, endpoint_id, status, attempts, last_status_code,
                                    last_error, delivered_at)
    VALUES (%(event_id)s, %(endpoint_id)s, %(status)s, %(attempts)s, %(status_code)s, %(error)s,
            CASE WHEN %(status)s = 'delivered' THEN now() END)
    ON CONFLICT (event_id, endpoint_id) DO UPDATE
       SET status = EXCLUDED.status,
           attempts = GREATEST(webhook_deliveries.attempts, EXCLUDED.attempts),
           last_status_code = EXCLUDED.last_status_code,
           last_error = EXCLUDED.last_error,
           updated_at = now(),
           delivered_at = COALESCE(webhook_deliveries.delivered_at, EXCLUDED.delivered_at)
)
SELECT t.timeouts_in_row, t.backoff_until, t.backoff_seconds,
       EXISTS (SELECT 1 FROM answered) AS cleared
  FROM (SELECT 1) one LEFT JOIN timed_out t ON true;

-- name: webhook_endpoint_insert
INSERT INTO webhook_endpoints (id, merchant_id, url, secret, enabled_events, description)
VALUES (%(id)s, %(merchant_id)s, %(url)s, %(secret)s, %(enabled_events)s, %(description)s)
RETURNING id, merchant_id, url, enabled, enabled_events, description, created_at;

-- name: webhook_endpoint_lock_merchant
-- Taken before counting a merchant's endpoints, so that two concurrent
-- registrations cannot both pass the per-merchant limit. The count is its own
-- statement (webhook_endpoint_count): a count in this one would read the
-- snapshot taken before the lock was granted, and miss the endpoint the
-- registration that held the lock just committed.
SELECT m.id FROM merchants m WHERE m.id = %(merchant_id)s FOR UPDATE;

-- name: webhook_endpoint_count
-- A merchant's endpoints, read after webhook_endpoint_lock_merchant (a fresh
-- snapshot under READ COMMITTED: every registration that held the lock
-- before us is counted).
SELECT count(*) AS endpoints FROM webhook_endpoints WHERE merchant_id = %(merchant_id)s;

-- name: webhook_endpoint_get
-- One endpoint of one merchant, never its secret.
SELECT id, merchant_id, url, enabled, enabled_events, description, disabled_at, disabled_reason,
       previous_secret_expires_at > now() AS rotating, previous_secret_expires_at, created_at
  FROM webhook_endpoints
 WHERE id = %(id)s AND merchant_id = %(merchant_id)s;

-- name: webhook_endpoint_delete
-- Its deliveries go with it (ON DELETE CASCADE); a deliver job still queued
-- finds no endpoint and ends (handlers/webhooks.py, "event or endpoint gone").
DELETE FROM webhook_endpoints WHERE id = %(id)s AND merchant_id = %(merchant_id)s
RETURNING id;

-- name: webhook_endpoint_list
-- Never the secrets.
SELECT id, merchant_id, url, enabled, enabled_events, description, disabled_at, disabled_reason,
       previous_secret_expires_at > now() AS rotating, previous_secret_expires_at, created_at
  FROM webhook_endpoints
 WHERE %(merchant_id)s::text IS NULL OR merchant_id = %(merchant_id)s
 ORDER BY merchant_id, created_at, id;

-- name: webhook_endpoint_disable
-- Idempotent: disabling a disabled endpoint keeps its first reason.
UPDATE webhook_endpoints
   SET enabled = false,
       disabled_at = COALESCE(disabled_at, now()),
       disabled_reason = COALESCE(disabled_reason, %(reason)s)
 WHERE id = %(id)s
RETURNING id, merchant_id, url, enabled, disabled_at, disabled_reason, created_at;

-- name: webhook_endpoint_enable
UPDATE webhook_endpoints
   SET enabled = true, disabled_at = NULL, disabled_reason = NULL
 WHERE id = %(id)s
RETURNING id, merchant_id, url, enabled, disabled_at, disabled_reason, created_at;

-- name: webhook_endpoint_rotate_secret
-- With an overlap, the old secret keeps signing (alongside the new one) until
-- previous_secret_expires_at; with none, it stops at once.
UPDATE webhook_endpoints
   SET previous_secret = CASE WHEN %(overlap)s > 0 THEN secret END,
       previous_secret_expires_at = CASE WHEN %(overlap)s > 0
                                         THEN now() + make_interval(secs => %(overlap)s) END,
       secret = %(secret)s
 WHERE id = %(id)s AND (%(merchant_id)s::text IS NULL OR merchant_id = %(merchant_id)s)
RETURNING id, merchant_id, url, enabled, enabled_events, description, previous_secret_expires_at,
          created_at;
