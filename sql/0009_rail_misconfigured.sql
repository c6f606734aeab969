-- Configuration is not a decline (issue 12): a rail answer that blames OUR
-- configuration (credentials, callback host, target environment, currency
-- setup, subscription) raises a `rail_misconfigured` alert, never a payer
-- decline. details: {rail, code, operation, http_status, ...}.
--
-- The kind list is the contract's whole list (design/contract.md, "Tables"),
-- so that whichever branch's migration re-creates this constraint last keeps
-- every kind the others need.
ALTER TABLE alerts DROP CONSTRAINT IF EXISTS alerts_kind_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check CHECK (kind IN (
    'charge_unresolved', 'rail_contradiction', 'job_dead_lettered', 'refund_unresolved',
    'rail_misconfigured', 'webhook_endpoint_disabled', 'missing_from_statement',
    'unknown_rail_transaction'));

-- One open alert per (rail, code): every charge polled while the
-- configuration is wrong hits the same cause, and must not flood the table.
-- Once an operator acknowledges it, the cause happening again opens a new one.
CREATE UNIQUE INDEX alerts_one_open_misconfiguration
    ON alerts ((details ->> 'rail'), (details ->> 'code'))
    WHERE kind = 'rail_misconfigured' AND acknowledged_at IS NULL;
