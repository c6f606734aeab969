-- The money state machine (vpay/money.py). Every transition is a
-- compare-and-swap on the current status: a second call, a racing worker or a
-- re-run after a crash matches no row, and no status ever moves backwards.

-- name: insert_intent
INSERT INTO payment_intents (id, merchant_id, amount, currency, status, next_action, description)
VALUES (%(id)s, %(merchant_id)s, %(amount)s, %(currency)s, 'processing',
        jsonb_build_object('type', 'mobile_money_prompt',
                           'expires_at', to_char((now() + make_interval(secs => %(ttl)s)) AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        %(description)s)
RETURNING *;

-- name: insert_charge
INSERT INTO charges (id, payment_intent_id, rail, rail_reference, payer, amount, currency)
VALUES (%(id)s, %(payment_intent_id)s, %(rail)s, %(rail_reference)s, %(payer)s, %(amount)s, %(currency)s)
RETURNING *;

-- name: insert_event
INSERT INTO events (id, type, payment_intent_id, data)
VALUES (%(id)s, %(type)s, %(payment_intent_id)s, %(data)s)
RETURNING id, type, payment_intent_id, data, created_at;

-- name: load_charge
-- Ages come from the database's clock, never a worker's.
SELECT c.*,
       EXTRACT(EPOCH FROM now() - c.created_at)::float8 AS age_seconds,
       i.merchant_id, i.status AS intent_status
  FROM charges c JOIN payment_intents i ON i.id = c.payment_intent_id
 WHERE c.id = %(id)s;

-- name: mark_submitted
UPDATE charges SET submitted_at = now()
 WHERE id = %(id)s AND submitted_at IS NULL
RETURNING id;

-- name: record_poll
-- A status read happened. When the rail knew the reference, the charge was
-- submitted, whatever our own write of submitted_at managed before a crash.
UPDATE charges
   SET last_polled_at = now(),
       submitted_at = CASE WHEN %(rail_knows)s THEN coalesce(submitted_at, now()) ELSE submitted_at END
 WHERE id = %(id)s;

-- name: settle_charge
UPDATE charges
   SET status = %(status)s,
       failure_code = %(failure_code)s,
       rail_transaction_id = %(rail_transaction_id)s,
       settled_at = now()
 WHERE id = %(id)s AND status IN ('pending', 'unresolved')
RETURNING *;

-- name: settle_intent
UPDATE payment_intents
   SET status = %(status)s, next_action = NULL, updated_at = now()
 WHERE id = %(id)s AND status IN ('requires_confirmation', 'processing')
RETURNING *;

-- name: escalate_charges
-- At the horizon a pending charge becomes unresolved, with one alert (the
-- unique index on alerts makes a second one a no-op). %(id)s names one
-- charge (the poll handler), or NULL for every overdue charge (the hourly
-- sweep: a charge whose poll job was dead-lettered is escalated too).
WITH escalated AS (
    UPDATE charges
       SET status = 'unresolved', unresolved_at = now()
     WHERE (%(id)s::text IS NULL OR id = %(id)s::text) AND status = 'pending'
       AND created_at <= now() - make_interval(secs => %(horizon)s)
    RETURNING *
), alerted AS (
    INSERT INTO alerts (kind, charge_id, details)
    SELECT 'charge_unresolved', e.id,
           jsonb_build_object('payment_intent', e.payment_intent_id, 'rail', e.rail,
                              'rail_reference', e.rail_reference, 'amount', e.amount,
                              'currency', e.currency, 'created_at', e.created_at)
      FROM escalated e
    ON CONFLICT DO NOTHING
)
SELECT * FROM escalated;

-- name: insert_alert
INSERT INTO alerts (kind, charge_id, details)
VALUES (%(kind)s, %(charge_id)s, %(details)s)
ON CONFLICT DO NOTHING
RETURNING id;

-- name: expire_prompt
UPDATE charges
   SET prompt_expired_at = now()
 WHERE id = %(id)s AND prompt_expired_at IS NULL AND status IN ('pending', 'unresolved')
   AND created_at <= now() - make_interval(secs => %(ttl)s)
RETURNING *;

-- name: clear_next_action
UPDATE payment_intents SET next_action = NULL, updated_at = now()
 WHERE id = %(id)s
RETURNING *;

-- name: load_intent
SELECT * FROM payment_intents WHERE id = %(id)s;

-- name: charges_of_intent
SELECT * FROM charges WHERE payment_intent_id = %(id)s ORDER BY created_at;

-- name: events_of_intent
SELECT id, type, data, created_at FROM events WHERE payment_intent_id = %(id)s ORDER BY created_at, id;

-- name: scan_live
-- The backstop: live charges nothing has touched for a while and that have
-- no poll job get one. Unresolved charges poll hourly, pending ones at once.
-- A poll's lane is its charge's rail (vpay.lanes.lane_for).
INSERT INTO jobs (kind, lane, dedupe_key, payload, run_at)
SELECT 'poll', c.rail, 'poll:' || c.id, jsonb_build_object('charge_id', c.id), now()
  FROM charges c
 WHERE c.status IN ('pending', 'unresolved')
   AND coalesce(c.last_polled_at, c.created_at) < now() - make_interval(secs => %(untouched)s)
   AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.dedupe_key = 'poll:' || c.id)
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING payload ->> 'charge_id';
