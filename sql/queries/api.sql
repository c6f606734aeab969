-- The HTTP API (vpay/api) and merchant keys (vpay/money/merchants.py).

-- name: insert_api_key
INSERT INTO merchant_api_keys (id, merchant_id, secret_sha256)
VALUES (%(id)s, %(merchant_id)s, %(secret_sha256)s)
RETURNING id, merchant_id, created_at;

-- name: find_api_key
SELECT merchant_id, secret_sha256 FROM merchant_api_keys
 WHERE id = %(id)s AND revoked_at IS NULL;

-- name: revoke_api_key
UPDATE merchant_api_keys SET revoked_at = now()
 WHERE id = %(id)s AND revoked_at IS NULL
RETURNING id, merchant_id;

-- name: list_merchants
SELECT m.id, m.name, m.created_at,
       coalesce(jsonb_agg(jsonb_build_object('id', k.id, 'created_at', k.created_at,
                                             'revoked_at', k.revoked_at)
                          ORDER BY k.created_at) FILTER (WHERE k.id IS NOT NULL),
                '[]'::jsonb) AS keys
  FROM merchants m LEFT JOIN merchant_api_keys k ON k.merchant_id = m.id
 GROUP BY m.id
 ORDER BY m.id;

-- name: merchant_exists
-- Whether a merchant id names a merchant (a filter by an unknown one is
-- "not found", not an empty list).
SELECT EXISTS (SELECT 1 FROM merchants WHERE id = %(id)s);

-- name: callback_find_charge
-- The callback route (design page, "Callbacks are hints"): the charge a
-- reference names, and where its poll job stands. Reads only. wait_seconds:
-- how long until the 10 s spacing after the last read allows another read
-- (0 when it already does).
SELECT c.id, c.status,
       greatest(0, extract(epoch FROM c.last_polled_at + make_interval(secs => %(spacing)s) - now()))::float8
           AS wait_seconds,
       j.id AS job_id,
       j.locked_at IS NOT NULL AS leased,
       j.run_at = 'infinity' AS dead_lettered,
       j.run_at <= now() + make_interval(secs => %(spacing)s) AS due_soon
  FROM charges c
  LEFT JOIN jobs j ON j.dedupe_key = 'poll:' || c.id
 WHERE c.rail = %(rail)s AND c.rail_reference = %(reference)s;

-- name: callback_pull_forward
-- Pull a parked poll forward: to now, or, when the rail was read within the
-- spacing (the ladder's first rung, 10 s), to that read + the spacing. The
-- spacing delays the read, never drops it (MoMo sends its callback once).
-- Every condition is re-checked on the row being updated, so a poll leased,
-- dead-lettered or rescheduled in the meantime is left alone.
UPDATE jobs
   SET run_at = greatest(now(), coalesce((SELECT c.last_polled_at FROM charges c
                                           WHERE c.id = %(charge_id)s), '-infinity')
                                + make_interval(secs => %(spacing)s))
 WHERE dedupe_key = 'poll:' || %(charge_id)s
   AND locked_at IS NULL
   AND run_at <> 'infinity'
   AND run_at > now() + make_interval(secs => %(spacing)s)
RETURNING id, run_at > now() AS spaced;

-- name: api_load_intent
-- One merchant's intent with the id of its latest charge; another merchant's
-- intent is simply not found.
SELECT i.*, (SELECT c.id FROM charges c WHERE c.payment_intent_id = i.id
              ORDER BY c.created_at DESC, c.id DESC LIMIT 1) AS latest_charge
  FROM payment_intents i
 WHERE i.id = %(id)s AND i.merchant_id = %(merchant_id)s;

-- name: idempotency_claim
-- Insert the "in progress" row, or take over one older than the 24 h window.
-- No row back: the key is held by a live record (read it with idempotency_find).
INSERT INTO idempotency_keys (merchant_id, key, request_sha256, payment_intent_id)
VALUES (%(merchant_id)s, %(key)s, %(request_sha256)s, %(payment_intent_id)s)
ON CONFLICT (merchant_id, key) DO UPDATE
   SET request_sha256 = EXCLUDED.request_sha256,
       payment_intent_id = EXCLUDED.payment_intent_id,
       status_code = NULL, response_body = NULL, completed_at = NULL,
       created_at = now(), locked_at = now()
 WHERE idempotency_keys.created_at < now() - make_interval(secs => %(keep)s)
RETURNING payment_intent_id;

-- name: idempotency_find
SELECT request_sha256, payment_intent_id, status_code, response_body, locked_at,
       locked_at < now() - make_interval(secs => %(stale)s) AS stale
  FROM idempotency_keys
 WHERE merchant_id = %(merchant_id)s AND key = %(key)s
   AND created_at >= now() - make_interval(secs => %(keep)s);

-- name: idempotency_take_over
-- A stale in-progress attempt (its request died): take it over, once. The
-- compare on locked_at makes two racing take-overs leave one winner.
UPDATE idempotency_keys SET locked_at = now()
 WHERE merchant_id = %(merchant_id)s AND key = %(key)s
   AND status_code IS NULL AND locked_at = %(locked_at)s
RETURNING payment_intent_id;

-- name: idempotency_complete
UPDATE idempotency_keys
   SET status_code = %(status_code)s, response_body = %(response_body)s, completed_at = now()
 WHERE merchant_id = %(merchant_id)s AND key = %(key)s
   AND payment_intent_id = %(payment_intent_id)s AND status_code IS NULL
RETURNING key;

-- name: idempotency_release
-- The attempt created nothing: forget the key so that a retry starts afresh.
DELETE FROM idempotency_keys
 WHERE merchant_id = %(merchant_id)s AND key = %(key)s
   AND payment_intent_id = %(payment_intent_id)s AND status_code IS NULL
RETURNING key;

-- name: delete_expired_idempotency_keys
-- Housekeeping (for the hourly sweep): Idempotency-Key records are kept 24 h.
DELETE FROM idempotency_keys WHERE created_at < now() - interval '24 hours';

-- Lists (vpay/api/lists.py): keyset pages on (created_at, id), newest first,
-- within one merchant, from the (merchant_id, created_at, id) indexes of
-- sql/0019_merchant_api.sql. Absent bounds come as ±infinity, absent filters
-- as every value, so each statement keeps one index range.

-- name: api_intent_cursor
SELECT id, created_at FROM payment_intents WHERE id = %(id)s AND merchant_id = %(merchant_id)s;

-- name: api_list_intents_older
SELECT i.*, (SELECT c.id FROM charges c WHERE c.payment_intent_id = i.id
              ORDER BY c.created_at DESC, c.id DESC LIMIT 1) AS latest_charge
  FROM payment_intents i
 WHERE i.merchant_id = %(merchant_id)s
   AND (i.created_at, i.id) < (%(t)s::timestamptz, %(id)s::text)
   AND i.created_at >= %(gte)s::timestamptz AND i.created_at <= %(lte)s::timestamptz
   AND i.status = ANY (%(statuses)s::text[])
 ORDER BY i.created_at DESC, i.id DESC
 LIMIT %(limit)s;

-- name: api_list_intents_newer
SELECT i.*, (SELECT c.id FROM charges c WHERE c.payment_intent_id = i.id
              ORDER BY c.created_at DESC, c.id DESC LIMIT 1) AS latest_charge
  FROM payment_intents i
 WHERE i.merchant_id = %(merchant_id)s
   AND (i.created_at, i.id) > (%(t)s::timestamptz, %(id)s::text)
   AND i.created_at >= %(gte)s::timestamptz AND i.created_at <= %(lte)s::timestamptz
   AND i.status = ANY (%(statuses)s::text[])
 ORDER BY i.created_at, i.id
 LIMIT %(limit)s;

-- name: api_event_cursor
SELECT id, created_at FROM events WHERE id = %(id)s AND merchant_id = %(merchant_id)s;

-- name: api_load_event
SELECT id, type, payment_intent_id, data, created_at FROM events
 WHERE id = %(id)s AND merchant_id = %(merchant_id)s;

-- name: api_list_events_older
-- delivered: NULL (every event), false (some delivery to an endpoint of the
-- merchant did not arrive: pending, retrying, skipped, gone or dead-lettered;
-- an event no endpoint was to receive has no delivery and is not listed),
-- true (every delivery arrived, and there was at least one).
SELECT e.id, e.type, e.payment_intent_id, e.data, e.created_at
  FROM events e
 WHERE e.merchant_id = %(merchant_id)s
   AND (e.created_at, e.id) < (%(t)s::timestamptz, %(id)s::text)
   AND e.created_at >= %(gte)s::timestamptz AND e.created_at <= %(lte)s::timestamptz
   AND e.type LIKE %(type_like)s
   AND (%(delivered)s::boolean IS NULL
        OR (%(delivered)s AND EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id)
            AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                             WHERE d.event_id = e.id AND d.status <> 'delivered'))
        OR (NOT %(delivered)s AND EXISTS (SELECT 1 FROM webhook_deliveries d
                                           WHERE d.event_id = e.id AND d.status <> 'delivered')))
 ORDER BY e.created_at DESC, e.id DESC
 LIMIT %(limit)s;

-- name: api_list_events_newer
SELECT e.id, e.type, e.payment_intent_id, e.data, e.created_at
  FROM events e
 WHERE e.merchant_id = %(merchant_id)s
   AND (e.created_at, e.id) > (%(t)s::timestamptz, %(id)s::text)
   AND e.created_at >= %(gte)s::timestamptz AND e.created_at <= %(lte)s::timestamptz
   AND e.type LIKE %(type_like)s
   AND (%(delivered)s::boolean IS NULL
        OR (%(delivered)s AND EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id)
            AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                             WHERE d.event_id = e.id AND d.status <> 'delivered'))
        OR (NOT %(delivered)s AND EXISTS (SELECT 1 FROM webhook_deliveries d
                                           WHERE d.event_id = e.id AND d.status <> 'delivered')))
 ORDER BY e.created_at, e.id
 LIMIT %(limit)s;

-- name: api_refund_cursor
SELECT r.id, r.created_at
  FROM refunds r JOIN charges c ON c.id = r.charge_id
  JOIN payment_intents i ON i.id = c.payment_intent_id
 WHERE r.id = %(id)s AND i.merchant_id = %(merchant_id)s;

-- name: api_load_refund
-- One merchant's refund (load_refund's columns); another merchant's is not found.
SELECT r.*, c.rail_reference AS charge_rail_reference, c.payer, c.payment_intent_id
  FROM refunds r JOIN charges c ON c.id = r.charge_id
  JOIN payment_intents i ON i.id = c.payment_intent_id
 WHERE r.id = %(id)s AND i.merchant_id = %(merchant_id)s;

-- name: api_list_refunds_older
-- A merchant's refunds, or one intent's (payment_intent: '' for all). Refunds
-- are few per charge; the walk is by the merchant's intents' charges.
SELECT r.*, c.payment_intent_id
  FROM refunds r JOIN charges c ON c.id = r.charge_id
  JOIN payment_intents i ON i.id = c.payment_intent_id
 WHERE i.merchant_id = %(merchant_id)s
   AND (%(payment_intent)s = '' OR i.id = %(payment_intent)s)
   AND (r.created_at, r.id) < (%(t)s::timestamptz, %(id)s::text)
   AND r.created_at >= %(gte)s::timestamptz AND r.created_at <= %(lte)s::timestamptz
 ORDER BY r.created_at DESC, r.id DESC
 LIMIT %(limit)s;

-- name: api_list_refunds_newer
SELECT r.*, c.payment_intent_id
  FROM refunds r JOIN charges c ON c.id = r.charge_id
  JOIN payment_intents i ON i.id = c.payment_intent_id
 WHERE i.merchant_id = %(merchant_id)s
   AND (%(payment_intent)s = '' OR i.id = %(payment_intent)s)
   AND (r.created_at, r.id) > (%(t)s::timestamptz, %(id)s::text)
   AND r.created_at >= %(gte)s::timestamptz AND r.created_at <= %(lte)s::timestamptz
 ORDER BY r.created_at, r.id
 LIMIT %(limit)s;

-- name: api_charge_to_refund
-- The charge a refund request names, among the merchant's: by its id, or an
-- intent's latest succeeded charge (the one that took the money), else its
-- latest charge (which create_refund then refuses as not succeeded).
SELECT c.id, c.rail, c.payment_intent_id
  FROM charges c JOIN payment_intents i ON i.id = c.payment_intent_id
 WHERE i.merchant_id = %(merchant_id)s
   AND (c.id = %(charge_id)s OR c.payment_intent_id = %(payment_intent_id)s)
 ORDER BY (c.status = 'succeeded') DESC, c.created_at DESC, c.id DESC
 LIMIT 1;
