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
-- The event and, in the same statement, one delivery per enabled endpoint of
-- its intent's merchant that receives its type (enabled_events: '*', the
-- default, or the types listed): a webhook_deliveries row and its
-- deliver:<event_id>:<endpoint_id> job (lane webhooks, vpay/engine/lanes.py;
-- fair_key the merchant). The deliveries are born with the event, in its
-- transaction (docs/webhooks.md, "Who gets an event"; issue 30: no fan-out
-- job between them). An endpoint enabled later receives the events written
-- after it. The same targets as charge_settle's: keep the two alike.
-- The id is the transition's (vpay.money.ids.event_id): an id that exists
-- already is the same transition written before, so nothing is written and
-- nothing answered (no second delivery); the caller reads the row that
-- exists (existing_event). The compare-and-swap of every transition makes
-- this impossible on one timeline of the database (charges.emit_event).
WITH event AS (
    INSERT INTO events (id, type, payment_intent_id, data)
    VALUES (%(id)s, %(type)s, %(payment_intent_id)s, %(data)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING id, type, payment_intent_id, data, created_at
), targets AS (
    SELECT event.id AS event_id, w.id AS endpoint_id, w.merchant_id
      FROM event
      JOIN payment_intents i ON i.id = event.payment_intent_id
      JOIN webhook_endpoints w ON w.merchant_id = i.merchant_id AND w.enabled
     WHERE '*' = ANY (w.enabled_events) OR event.type = ANY (w.enabled_events)
), recorded AS (
    INSERT INTO webhook_deliveries (event_id, endpoint_id)
    SELECT event_id, endpoint_id FROM targets
    ON CONFLICT (event_id, endpoint_id) DO NOTHING
    RETURNING event_id, endpoint_id
), delivering AS (
    INSERT INTO jobs (kind, lane, dedupe_key, payload, fair_key)
    SELECT 'deliver', 'webhooks', 'deliver:' || r.event_id || ':' || r.endpoint_id,
           jsonb_build_object('event_id', r.event_id, 'endpoint_id', r.endpoint_id), t.merchant_id
      FROM recorded r JOIN targets t USING (event_id, endpoint_id)
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

-- name: charge_settle
-- A charge's settle in ONE round trip (issue 30; vpay.money.charges, CHARGES's
-- settle_in_one): vpay_charge_settle (sql/0028_settle_locks_first.sql) waits
-- for the charge's row and its intent's, then, reading the database as of
-- after those waits, runs the compare-and-swap on the charge (only a live one
-- ends; %(polled)s: a status read said so, and the read is stamped as
-- pollable_record_poll would), its intent following (unless it moved on its
-- own, e.g. canceled: kept, the merchant is still told), the one event of the
-- transition under its id (ON CONFLICT DO NOTHING: the same transition
-- written before, e.g. on another timeline: no second event, no second
-- delivery) with data as intent_view / charge_view write it (iso_8601,
-- sql/0027), and its deliveries with their deliver jobs, as insert_event's
-- (keep the two alike). No row when the CAS matched nothing: the caller reads
-- what is there (pollable_current). A row whose event id is taken by another
-- type or intent (only a hash collision could) fails the whole statement:
-- vpay_refuse, SQLSTATE VP001.
SELECT id, payment_intent_id, status, failure_code, events, deliveries, refused
  FROM vpay_charge_settle(%(id)s, %(status)s, %(failure_code)s, %(rail_transaction_id)s, %(polled)s,
                          %(intent_status)s, %(event_id)s, %(event_type)s, %(failure_kind)s);

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
