-- The refund state machine (vpay/money/refunds.py). Like money.sql: every
-- transition is a compare-and-swap on the current status, so a second call,
-- a racing worker or a re-run after a crash matches no row, and no status
-- ever moves backwards. Amounts are minor units; every "now" is Postgres's.
-- What refunds share with charges (submitted, polled, settled, escalated) is
-- in pollable.sql.

-- name: lock_charge_for_refund
-- Taken first in the create transaction: concurrent creates for one charge
-- queue here, so each one's sum of earlier refunds is current.
SELECT c.*, i.merchant_id
  FROM charges c JOIN payment_intents i ON i.id = c.payment_intent_id
 WHERE c.id = %(charge_id)s
   FOR UPDATE OF c;

-- name: refunded_amount
-- What a charge has given back or may still give back: every refund that has
-- not failed (pending and unresolved ones may yet move money).
SELECT coalesce(sum(amount), 0)::bigint AS refunded
  FROM refunds
 WHERE charge_id = %(charge_id)s AND status <> 'failed';

-- name: insert_refund
INSERT INTO refunds (id, charge_id, rail, rail_reference, amount, currency, reason)
VALUES (%(id)s, %(charge_id)s, %(rail)s, %(rail_reference)s, %(amount)s, %(currency)s, %(reason)s)
RETURNING *;

-- name: load_refund
-- A refund with what the rail port needs from its charge (the collection's
-- reference and payer). Ages come from the database's clock.
SELECT r.*,
       EXTRACT(EPOCH FROM now() - r.created_at)::float8 AS age_seconds,
       c.rail_reference AS charge_rail_reference, c.payer, c.payment_intent_id
  FROM refunds r JOIN charges c ON c.id = r.charge_id
 WHERE r.id = %(id)s;

-- name: refunds_of_charge
SELECT * FROM refunds WHERE charge_id = %(charge_id)s ORDER BY created_at, id;

-- name: events_of_refund
SELECT id, type, created_at FROM events
 WHERE payment_intent_id = %(payment_intent_id)s AND data -> 'refund' ->> 'id' = %(refund_id)s
 ORDER BY created_at, id;
