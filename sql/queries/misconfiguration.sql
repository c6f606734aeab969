-- name: insert_misconfiguration_alert
-- One open rail_misconfigured alert per (rail, code)
-- (sql/0009_rail_misconfigured.sql): a second one is a no-op.
INSERT INTO alerts (kind, charge_id, refund_id, details)
VALUES ('rail_misconfigured', %(charge_id)s, %(refund_id)s, %(details)s)
ON CONFLICT DO NOTHING
RETURNING id;

-- name: open_misconfiguration_codes
-- The rail's codes of the open rail_misconfigured alerts for one rail, newest first.
SELECT details ->> 'code' AS code
  FROM alerts
 WHERE kind = 'rail_misconfigured' AND acknowledged_at IS NULL AND details ->> 'rail' = %(rail)s
 ORDER BY id DESC;
