-- What a rail hands back at submission (vpay/money/charges.py record_submission) and
-- the callback route's proof check (vpay/api/callbacks.py).

-- name: record_submission
-- The rail accepted the request and handed back data its status query needs
-- (Orange: pay_token, payment_url) and, maybe, the hash of a callback proof
-- (Orange: notif_token). submitted_at is set here too, in the same row write,
-- so a charge is never "submitted" without the data to ask about it.
UPDATE charges
   SET rail_data = rail_data || %(rail_data)s,
       notif_token_sha256 = coalesce(%(notif_token_sha256)s, notif_token_sha256),
       submitted_at = coalesce(submitted_at, now())
 WHERE id = %(id)s
RETURNING id, payment_intent_id;

-- name: redirect_next_action
-- A redirect rail (Orange Money Web Payment): the payer confirms on the
-- rail's page, so the intent's next action points there. Only while the
-- intent is processing and its prompt has not expired (next_action cleared);
-- expires_at is kept from the prompt's.
UPDATE payment_intents
   SET next_action = jsonb_build_object('type', 'redirect_to_url', 'url', %(url)s::text,
                                        'expires_at', next_action -> 'expires_at'),
       updated_at = now()
 WHERE id = %(id)s AND status = 'processing' AND next_action IS NOT NULL
RETURNING id;

-- name: callback_notif_token
-- The stored notif_token hash of the charge a reference names (NULL when the
-- charge has none); no row when the reference names no charge. Reads only.
SELECT id, notif_token_sha256
  FROM charges
 WHERE rail = %(rail)s AND rail_reference = %(reference)s;
