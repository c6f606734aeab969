-- What a rail hands back at submission (vpay/money/charges.py record_submission),
-- the one send of a rail that cannot take a request twice and the identifier a
-- callback may supply for it (charges.claim_the_one_send, adopt_status_keys),
-- and the callback route's proof check (vpay/api/callbacks.py).

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

-- name: claim_the_one_send
-- A rail that cannot take a request-to-pay twice (Rail.resend_safe False:
-- M-Pesa's STK Push has no key of ours): before the one send, mark that it
-- may leave (rail_data.request_sent_at, the database's clock), committed
-- BEFORE the rail is called, so a kill during the call or right after the
-- rail accepted still shows it. A compare-and-swap: a charge already marked,
-- confirmed or ended matches no row, and nothing is sent.
UPDATE charges
   SET rail_data = rail_data || jsonb_build_object('request_sent_at', now()::text)
 WHERE id = %(id)s
   AND status IN ('pending', 'unresolved')
   AND submitted_at IS NULL
   AND NOT rail_data ? 'request_sent_at'
RETURNING id;

-- name: forget_unsent_request
-- The send marked by claim_the_one_send surely never reached the rail (no
-- token, no connection, a paused rail) or the rail refused it outright: it
-- may be sent again. Only while the charge is unconfirmed.
UPDATE charges
   SET rail_data = rail_data - 'request_sent_at'
 WHERE id = %(id)s
   AND submitted_at IS NULL
RETURNING id;

-- name: adopt_status_keys
-- A callback names the identifier the rail assigned (M-Pesa's
-- CheckoutRequestID) for a charge whose submission answer was lost: keep it
-- as the key of the status read. Never a status. Only for a live charge of
-- that rail whose request may have left (request_sent_at), that is not
-- confirmed, that holds none of these keys yet (the first one wins; a
-- forged one makes the read answer NOT_FOUND and settles nothing), and
-- whose identifiers no other charge of the rail holds (so a callback cannot
-- point this charge's read at another charge's payment). The caller holds
-- an advisory lock on the identifier, so two charges cannot adopt one at once.
UPDATE charges c
   SET rail_data = c.rail_data || %(keys)s
 WHERE c.rail = %(rail)s
   AND c.rail_reference = %(reference)s
   AND c.status IN ('pending', 'unresolved')
   AND c.submitted_at IS NULL
   AND c.rail_data ? 'request_sent_at'
   AND NOT c.rail_data ?| %(names)s::text[]
   AND NOT EXISTS (SELECT 1 FROM charges o
                    WHERE o.rail = c.rail AND o.id <> c.id AND o.rail_data @> %(keys)s)
RETURNING c.id;

-- name: lock_status_keys
-- Serialises adopt_status_keys on one identifier (its NOT EXISTS cannot see
-- another transaction's uncommitted adoption). Held to the end of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended(%(lock)s, 29));
