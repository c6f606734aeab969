-- A charge's settle waits for the charge's row BEFORE it reads anything
-- (issue 30, review of the one-statement settle). One statement reads the
-- whole database as of its start: when charge_settle's compare-and-swap
-- waited on the charge's row (another transaction held it), the rest of the
-- statement still saw the database from before the wait: an endpoint
-- enabled meanwhile got no delivery, an intent moved meanwhile was written
-- into the event as it was. This function takes the charge's row lock, then
-- the intent's (the order every settle took them in before), and only then
-- runs the settle as a statement of its own, which in READ COMMITTED reads
-- the database as of after the waits. Still one round trip for the worker.
-- The arguments and the row are charge_settle's (sql/queries/money.sql);
-- no row when the charge is not live (the compare-and-swap lost).
CREATE FUNCTION vpay_charge_settle(
    p_id text, p_status text, p_failure_code text, p_rail_transaction_id text, p_polled boolean,
    p_intent_status text, p_event_id text, p_event_type text, p_failure_kind text)
RETURNS TABLE (id text, payment_intent_id text, status text, failure_code text,
               events bigint, deliveries bigint, refused boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_intent text;
BEGIN
    SELECT c.payment_intent_id INTO v_intent
      FROM charges c WHERE c.id = p_id AND c.status IN ('pending', 'unresolved')
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- not live (or unknown): the caller reads what is there
    END IF;
    PERFORM 1 FROM payment_intents i WHERE i.id = v_intent FOR UPDATE;
    RETURN QUERY
    WITH charge AS (
        UPDATE charges
           SET status = p_status, failure_code = p_failure_code,
               rail_transaction_id = p_rail_transaction_id, settled_at = now(),
               last_polled_at = CASE WHEN p_polled THEN now() ELSE last_polled_at END,
               submitted_at = CASE WHEN p_polled THEN coalesce(submitted_at, now()) ELSE submitted_at END
         WHERE charges.id = p_id AND charges.status IN ('pending', 'unresolved')
        RETURNING *
    ), moved AS (
        UPDATE payment_intents i
           SET status = p_intent_status, next_action = NULL, updated_at = now()
          FROM charge
         WHERE i.id = charge.payment_intent_id AND i.status IN ('requires_confirmation', 'processing')
        RETURNING i.*
    ), intent AS (
        SELECT * FROM moved
        UNION ALL
        SELECT i.* FROM payment_intents i JOIN charge ON i.id = charge.payment_intent_id
         WHERE NOT EXISTS (SELECT 1 FROM moved)
    ), event AS (
        INSERT INTO events (id, type, payment_intent_id, data)
        SELECT p_event_id, p_event_type, i.id, jsonb_build_object(
            'object', jsonb_build_object(
                'id', i.id, 'object', 'payment_intent', 'amount', i.amount, 'currency', i.currency,
                'status', i.status, 'next_action', i.next_action, 'description', i.description,
                'merchant', i.merchant_id, 'created', iso_8601(i.created_at),
                'updated', iso_8601(i.updated_at)),
            'charge', jsonb_build_object(
                'id', c.id, 'payment_intent_id', c.payment_intent_id, 'rail', c.rail,
                'rail_reference', c.rail_reference, 'payer', c.payer, 'amount', c.amount,
                'currency', c.currency, 'status', c.status, 'failure_code', c.failure_code,
                'rail_transaction_id', c.rail_transaction_id, 'created_at', iso_8601(c.created_at),
                'submitted_at', iso_8601(c.submitted_at), 'settled_at', iso_8601(c.settled_at),
                'unresolved_at', iso_8601(c.unresolved_at),
                'prompt_expired_at', iso_8601(c.prompt_expired_at),
                'last_polled_at', iso_8601(c.last_polled_at)))
            || CASE WHEN c.status = 'failed'
                    THEN jsonb_build_object('failure_code', c.failure_code, 'failure_kind', p_failure_kind)
                    ELSE '{}'::jsonb END
          FROM charge c, intent i
        ON CONFLICT ON CONSTRAINT events_pkey DO NOTHING
        RETURNING events.id, events.type
    ), targets AS (
        SELECT e.id AS event_id, w.id AS endpoint_id, w.merchant_id
          FROM event e, intent i
          JOIN webhook_endpoints w ON w.merchant_id = i.merchant_id AND w.enabled
         WHERE '*' = ANY (w.enabled_events) OR e.type = ANY (w.enabled_events)
    ), recorded AS (
        INSERT INTO webhook_deliveries AS d (event_id, endpoint_id)
        SELECT t.event_id, t.endpoint_id FROM targets t
        ON CONFLICT ON CONSTRAINT webhook_deliveries_pkey DO NOTHING
        RETURNING d.event_id, d.endpoint_id
    ), delivering AS (
        INSERT INTO jobs AS j (kind, lane, dedupe_key, payload, fair_key)
        SELECT 'deliver', 'webhooks', 'deliver:' || r.event_id || ':' || r.endpoint_id,
               jsonb_build_object('event_id', r.event_id, 'endpoint_id', r.endpoint_id), t.merchant_id
          FROM recorded r JOIN targets t ON t.event_id = r.event_id AND t.endpoint_id = r.endpoint_id
        ON CONFLICT (dedupe_key) DO NOTHING
        RETURNING 1
    ), before AS (
        SELECT e.type, e.payment_intent_id FROM events e WHERE e.id = p_event_id
    )
    SELECT c.id, c.payment_intent_id, c.status, c.failure_code,
           (SELECT count(*) FROM event), (SELECT count(*) FROM delivering),
           CASE WHEN b.type IS NOT NULL AND (b.type <> p_event_type OR b.payment_intent_id <> c.payment_intent_id)
                THEN vpay_refuse('event id ' || p_event_id || ' of ' || p_event_type || ' on '
                                 || c.payment_intent_id || ' is taken by ' || b.type || ' on '
                                 || b.payment_intent_id) END
      FROM charge c LEFT JOIN before b ON true;
END
$$;
