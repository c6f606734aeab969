-- The refund state machine (vpay/refunds.py). Like money.sql: every
-- transition is a compare-and-swap on the current status, so a second call,
-- a racing worker or a re-run after a crash matches no row, and no status
-- ever moves backwards. Amounts are minor units; every "now" is Postgres's.

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

-- name: mark_refund_submitted
UPDATE refunds SET submitted_at = now()
 WHERE id = %(id)s AND submitted_at IS NULL
RETURNING id;

-- name: record_refund_poll
-- A status read happened. When the rail knew the reference, the refund was
-- submitted, whatever our own write of submitted_at managed before a crash.
UPDATE refunds
   SET last_polled_at = now(),
       submitted_at = CASE WHEN %(rail_knows)s THEN coalesce(submitted_at, now()) ELSE submitted_at END
 WHERE id = %(id)s;

-- name: settle_refund
UPDATE refunds
   SET status = %(status)s,
       failure_code = %(failure_code)s,
       rail_transaction_id = %(rail_transaction_id)s,
       settled_at = now()
 WHERE id = %(id)s AND status IN ('pending', 'unresolved')
RETURNING *;

-- name: escalate_refund
UPDATE refunds
   SET status = 'unresolved', unresolved_at = now()
 WHERE id = %(id)s AND status = 'pending'
   AND created_at <= now() - make_interval(secs => %(horizon)s)
RETURNING *;

-- name: insert_refund_alert
-- refund_unresolved is unique per refund (alerts_one_unresolved_per_refund).
INSERT INTO alerts (kind, charge_id, refund_id, details)
VALUES (%(kind)s, %(charge_id)s, %(refund_id)s, %(details)s)
ON CONFLICT DO NOTHING
RETURNING id;

-- name: refunds_of_charge
SELECT * FROM refunds WHERE charge_id = %(charge_id)s ORDER BY created_at, id;

-- name: events_of_refund
SELECT id, type, created_at FROM events
 WHERE payment_intent_id = %(payment_intent_id)s AND data -> 'refund' ->> 'id' = %(refund_id)s
 ORDER BY created_at, id;
