-- The money state machine (vpay/money/charges.py). Every transition is a
-- compare-and-swap on the current status: a second call, a racing worker or a
-- re-run after a crash matches no row, and no status ever moves backwards.
-- What charges share with refunds (submitted, polled, settled, escalated) is
-- in pollable.sql.

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
-- The event and, in the same statement, its fanout:<event_id> job (lane
-- webhooks, vpay/engine/lanes.py), but only when the intent's merchant has an
-- enabled webhook endpoint at this moment: an event nobody can receive gets
-- no job (docs/webhooks.md, "Who gets an event"; issue #15). An endpoint
-- added later receives the events written after it, as before.
-- The id is the transition's (vpay.money.ids.event_id): an id that exists
-- already is the same transition written before, so nothing is written and
-- nothing answered (no second fan-out); the caller reads the row that
-- exists (existing_event). The compare-and-swap of every transition makes
-- this impossible on one timeline of the database (charges.emit_event).
WITH event AS (
    INSERT INTO events (id, type, payment_intent_id, data)
    VALUES (%(id)s, %(type)s, %(payment_intent_id)s, %(data)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING id, type, payment_intent_id, data, created_at
), fanout AS (
    INSERT INTO jobs (kind, lane, dedupe_key, payload)
    SELECT 'fanout', 'webhooks', 'fanout:' || event.id, jsonb_build_object('event_id', event.id)
      FROM event
     WHERE EXISTS (SELECT 1
                     FROM payment_intents i
                     JOIN webhook_endpoints w ON w.merchant_id = i.merchant_id AND w.enabled
                    WHERE i.id = event.payment_intent_id)
    ON CONFLICT (dedupe_key) DO NOTHING
)
SELECT id, type, payment_intent_id, data, created_at FROM event;

-- name: existing_event
-- The event insert_event found already written under its id.
SELECT id, type, payment_intent_id, data, created_at FROM events WHERE id = %(id)s;

-- name: load_charge
-- Ages come from the database's clock, never a worker's.
SELECT c.*,
       EXTRACT(EPOCH FROM now() - c.created_at)::float8 AS age_seconds,
       i.merchant_id, i.status AS intent_status
  FROM charges c JOIN payment_intents i ON i.id = c.payment_intent_id
 WHERE c.id = %(id)s;

-- name: settle_intent
UPDATE payment_intents
   SET status = %(status)s, next_action = NULL, updated_at = now()
 WHERE id = %(id)s AND status IN ('requires_confirmation', 'processing')
RETURNING *;

-- name: insert_alert
-- charge_unresolved is unique per charge, refund_unresolved per refund, and
-- an open rail_contradiction per row and answer (the alerts_* indexes).
INSERT INTO alerts (kind, charge_id, refund_id, details)
VALUES (%(kind)s, %(charge_id)s, %(refund_id)s, %(details)s)
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

-- name: job_rail
-- The rail of a rail kind's charge or refund, for its lane.
SELECT coalesce((SELECT rail FROM charges WHERE id = %(charge_id)s),
                (SELECT rail FROM refunds WHERE id = %(refund_id)s)) AS rail;
