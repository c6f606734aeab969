-- The merchant API (issue 24): lists with cursor pagination, events by
-- merchant, refunds under an Idempotency-Key, endpoints with enabled_events.

-- Events carry their merchant, so that GET /v1/events walks one index range
-- per merchant instead of joining every intent. The trigger fills it from the
-- event's intent, so no writer of events has to know about it.
ALTER TABLE events ADD COLUMN merchant_id text REFERENCES merchants (id);
UPDATE events e SET merchant_id = i.merchant_id
  FROM payment_intents i WHERE i.id = e.payment_intent_id AND e.merchant_id IS NULL;
ALTER TABLE events ALTER COLUMN merchant_id SET NOT NULL;

CREATE FUNCTION events_merchant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.merchant_id IS NULL THEN
        SELECT merchant_id INTO NEW.merchant_id FROM payment_intents WHERE id = NEW.payment_intent_id;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER events_merchant BEFORE INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION events_merchant();

-- Keyset pagination, newest first, on (created_at, id) within one merchant.
CREATE INDEX events_merchant_page ON events (merchant_id, created_at, id);
CREATE INDEX payment_intents_merchant_page ON payment_intents (merchant_id, created_at, id);
DROP INDEX payment_intents_merchant;  -- a prefix of the one above
CREATE INDEX refunds_page ON refunds (charge_id, created_at, id);

-- POST /v1/refunds takes an Idempotency-Key too: the record then names the
-- refund it creates (re_…) in the same column as an intent's id.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_payment_intent_id_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_payment_intent_id_check
    CHECK (payment_intent_id ~ '^(pi|re)_[A-Za-z0-9]+$');

-- The event types an endpoint receives; '*' is every type (the default).
ALTER TABLE webhook_endpoints
    ADD COLUMN enabled_events text[] NOT NULL DEFAULT '{*}'
        CHECK (cardinality(enabled_events) BETWEEN 1 AND 16),
    ADD COLUMN description text CHECK (length(description) <= 160);
CREATE INDEX webhook_endpoints_merchant_all ON webhook_endpoints (merchant_id, created_at, id);
