-- Webhook fan-out and delivery (vpay/handlers/webhooks.py).

-- name: fanout_deliveries
-- One delivery job per enabled endpoint of the event's merchant; the dedupe
-- key makes a re-run create nothing new.
INSERT INTO jobs (kind, dedupe_key, payload)
SELECT 'deliver', 'deliver:' || e.id || ':' || w.id,
       jsonb_build_object('event_id', e.id, 'endpoint_id', w.id)
  FROM events e
  JOIN payment_intents i ON i.id = e.payment_intent_id
  JOIN webhook_endpoints w ON w.merchant_id = i.merchant_id AND w.enabled
 WHERE e.id = %(event_id)s
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id;
