-- Secrets at rest: sealing and re-sealing webhook endpoint secrets
-- (vpay/webhooks/sealing.py, `vpay-server secrets rotate`).

-- name: secrets_page
-- One page of endpoints after %(after)s, in id order: the rotation's cursor.
SELECT id, secret, previous_secret
  FROM webhook_endpoints
 WHERE id > %(after)s
 ORDER BY id
 LIMIT %(limit)s;

-- name: secrets_reseal
-- Compare-and-swap on the values read: a secret rotated meanwhile (by
-- `webhooks rotate-secret`) is left as it now is, already sealed under the
-- newest key.
UPDATE webhook_endpoints
   SET secret = %(secret)s, previous_secret = %(previous)s
 WHERE id = %(id)s
   AND secret = %(old_secret)s
   AND previous_secret IS NOT DISTINCT FROM %(old_previous)s;

-- name: secrets_plaintext_count
-- Endpoints with a secret still stored in plaintext (from before 0018).
SELECT count(*)
  FROM webhook_endpoints
 WHERE secret NOT LIKE 'fernet:%%' OR previous_secret NOT LIKE 'fernet:%%';

-- name: secrets_sample
-- The newest stored sealed secrets (at most %(n)s), to check at boot that
-- the keys open them.
SELECT id, secret FROM webhook_endpoints WHERE secret LIKE 'fernet:%%' ORDER BY created_at DESC LIMIT %(n)s;
